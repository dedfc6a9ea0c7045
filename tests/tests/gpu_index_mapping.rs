//! Slurm's GPU index is a position in gres.conf, not NVML's index. On a node
//! where gres.conf lists the device files out of NVML's order, an MPS job
//! must get the GPUs Slurm gave it: the prolog maps index → gres.conf file →
//! minor → NVML GPU, and the epilog undoes the same GPUs.
//!
//! This node: gres.conf lists nvidia2, nvidia0, nvidia1 (Slurm's GPUs 0, 1,
//! 2), and the simulated GPUs have minors 1, 2, 0 (NVML's GPUs 0, 1, 2). So
//! Slurm's 0 is NVML's 1, Slurm's 1 is NVML's 2 and Slurm's 2 is NVML's 0.

use gpu_mode_tests::shared::cluster_with;
use gpu_mode_tests::Cluster;

const GRES_ORDER: [u32; 3] = [2, 0, 1];
const SIM_MINORS: [u32; 3] = [1, 2, 0];

fn c() -> &'static Cluster {
    cluster_with("gpu_index_mapping", 3, |spec| {
        spec.gres_device_order = Some(GRES_ORDER.to_vec());
        spec.sim_minors = Some(SIM_MINORS.to_vec());
    })
}

/// The NVML index of Slurm's GPU `slurm`, worked out from the node's layout.
fn nvml_index(slurm: u32) -> u32 {
    let minor = GRES_ORDER[slurm as usize];
    SIM_MINORS.iter().position(|&m| m == minor).unwrap() as u32
}

#[test]
fn an_mps_job_gets_the_gpus_slurm_gave_it_and_the_epilog_undoes_those() {
    let c = c();
    let report = c.dir.join("out/mapping.report");
    let script = format!(
        "#!/bin/sh\necho $SLURM_JOB_GPUS $SLURM_GPU_MODE_GPUS $CUDA_VISIBLE_DEVICES > {}\nsleep 3\n",
        report.display()
    );
    let job = std::thread::scope(|s| {
        let job = s.spawn(|| c.sbatch_wait(Some("gmtest1"), &["--gpu-mode=mps", "--gres=gpu:2"], &script));
        c.wait_until("the job to report", || report.exists());
        // While it runs: the two GPUs Slurm gave it, as NVML numbers them, are
        // in exclusive-process mode, and only those.
        let text = std::fs::read_to_string(&report).unwrap();
        let fields: Vec<&str> = text.split_whitespace().collect();
        assert_eq!(fields.len(), 3, "{text:?}");
        let slurm: Vec<u32> = fields[0].split(',').map(|g| g.parse().unwrap()).collect();
        let in_slurm_order: Vec<u32> = slurm.iter().map(|&g| nvml_index(g)).collect();
        let mut nvml = in_slurm_order.clone();
        nvml.sort_unstable();
        let uuids: Vec<String> = nvml.iter().map(|&g| c.sim_gpu(g as usize).unwrap()["uuid"].as_str().unwrap().to_string()).collect();
        assert_eq!(fields[2], uuids.join(","), "the MPS daemon must serve NVML GPUs {nvml:?} (Slurm's {slurm:?})");
        let listed = in_slurm_order.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        assert_eq!(fields[1], listed, "SLURM_GPU_MODE_GPUS must be NVML's indices of Slurm's GPUs {slurm:?}");
        for g in 0..3u32 {
            let want = if nvml.contains(&g) { 3 } else { 0 };
            assert_eq!(c.sim_compute_mode(g as usize).unwrap(), want, "compute mode of NVML GPU {g}");
        }
        let locks = std::fs::read_dir(c.runtime_dir().join("locks")).unwrap();
        let mut locks: Vec<String> = locks.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        locks.sort();
        assert_eq!(locks, nvml.iter().map(|g| format!("gpu{g}.lock")).collect::<Vec<_>>(), "locks are taken by NVML index");
        job.join().unwrap().unwrap()
    });
    assert_eq!(job.exit_code, 0, "{}\n{}", job.output, c.logs_tail());
    let prolog = c.hook_log_lines(job.id).into_iter().find(|l| l.contains("action=prolog")).expect("a prolog line");
    assert!(prolog.contains("are NVML GPUs") && prolog.contains("outcome=ok"), "{prolog}");
    // The epilog stops the daemon of those GPUs and restores their compute mode.
    c.wait_until("the epilog to stop the daemon", || {
        gpu_mode_core::mps::DaemonRecord::all(&c.runtime_dir()).unwrap().is_empty()
    });
    for g in 0..3 {
        assert_eq!(c.sim_compute_mode(g).unwrap(), 0, "NVML GPU {g}: compute mode not restored");
    }
    let epilog = c.hook_log_lines(job.id).into_iter().find(|l| l.contains("action=epilog")).expect("an epilog line");
    assert!(epilog.contains("stopped") && epilog.contains("outcome=ok"), "{epilog}");
}
