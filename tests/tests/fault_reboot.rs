//! Fault matrix (docs/faults.md): the node rebooted under a running MIG job.
//! A reboot ends the job without an epilog, loses every MIG instance (the
//! mode is kept: `nvml-sim-ctl reboot`) and, with /run a tmpfs, the runtime
//! directory. The boot unit (`gpu-mode-mig apply --boot`) puts the baseline
//! back before slurmd starts; what the epilog finds afterwards must agree:
//! no stale journal, no instance outside the baseline, nothing for the node
//! checker to call stale. Also with the runtime directory kept (a site that
//! puts it on disk): the job's leftover state and journal name instances
//! that are gone, and the epilog Slurm runs for the lost job cleans them.
//!
//! Baseline: GPU 0 in MIG mode with one 3g.71gb; GPU 1 without MIG.

use gpu_mode_tests::Cluster;
use std::os::unix::fs::PermissionsExt;
use std::sync::Mutex;
use std::time::Duration;

static TURN: Mutex<()> = Mutex::new(());
const WAIT: Duration = Duration::from_secs(90);

const BASELINE: &str = "version: v1\nmig-configs:\n  base:\n    - devices: [0]\n      mig-enabled: true\n      mig-devices:\n        \"3g.71gb\": 1\n    - devices: [1]\n      mig-enabled: false\n";

fn c() -> &'static Cluster {
    let c = gpu_mode_tests::shared::cluster_with("fault_reboot", 2, |spec| {
        let d = spec.dir.display();
        spec.extra_gpu_mode_config = format!(
            "[mig]\nbaseline = \"base\"\nbaseline_config = \"{d}/mig/mig-parted.yaml\"\nsystemctl = \"{d}/mig/systemctl\"\n\
             nvidia_smi = \"{d}/mig/nvidia-smi\"\nservices = []\nlayout_services = []\n"
        );
    });
    stand_ins(c);
    c
}

/// The mig-parted file, a systemctl that does nothing (no services are
/// named) and an nvidia-smi whose GPU reset resets the simulated GPU.
fn stand_ins(c: &Cluster) {
    let m = c.dir.join("mig");
    if m.join("nvidia-smi").exists() {
        return;
    }
    std::fs::create_dir_all(&m).unwrap();
    std::fs::write(m.join("mig-parted.yaml"), BASELINE).unwrap();
    let ctl = c.spec.artifacts.sim.as_ref().unwrap().nvml_ctl.display().to_string();
    let sim = format!("GPU_MODE_SIM_STATE={} {ctl}", c.dir.join("sim/nvml-state.json").display());
    let exec = |name: &str, text: String| {
        std::fs::write(m.join(name), text).unwrap();
        std::fs::set_permissions(m.join(name), std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    exec("systemctl", "#!/bin/sh\nexit 0\n".into());
    exec(
        "nvidia-smi",
        format!("#!/bin/sh\n[ \"$1\" = --gpu-reset ] && [ \"$2\" = -i ] || exit 2\nfor id in $(echo \"$3\" | tr , ' '); do {sim} reset --gpu \"$id\" || exit 1; done\n"),
    );
    mig_tool(c, &["apply"]);
}

fn mig_tool(c: &Cluster, args: &[&str]) -> String {
    let out = c.mig_tool(args).unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "gpu-mode-mig {args:?}: {text}");
    text
}

fn layout(c: &Cluster, gpu: usize) -> (bool, Vec<(u64, u64)>) {
    c.sim_mig_layout(gpu).unwrap()
}

/// Every process of the job, slurmstepd included: what a reboot ends.
fn kill_job(c: &Cluster, job: u32) {
    let var = format!("SLURM_JOB_ID={job}");
    let conf = format!("SLURM_CONF={}", c.dir.join("slurm.conf").display());
    for p in gpu_mode_core::procfs::all() {
        let env = std::fs::read(format!("/proc/{}/environ", p.pid)).unwrap_or_default();
        let mine = env.split(|b| *b == 0).any(|v| v == var.as_bytes());
        let stepd = p.comm.starts_with("slurmstepd") && env.split(|b| *b == 0).any(|v| v == conf.as_bytes());
        if mine || stepd {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p.pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// A MIG job on GPU 1 (not in the baseline's MIG mode: its prolog switches
/// it on), running until the "reboot".
fn running_mig_job(c: &Cluster, tag: &str) -> u32 {
    let ready = c.dir.join(format!("out/{tag}-ready"));
    let script = format!("#!/bin/sh\ntouch {}\nsleep 300\n", ready.display());
    // GPU 0 is the baseline's; the job asks for both so it gets GPU 1 too,
    // and its layout goes where it fits.
    let job = c.sbatch(Some("gmtest1"), &["--gpu-mode=mig:1g.18gbx2", "--gres=gpu:2"], &script).unwrap();
    c.wait_until("the MIG job to start", || ready.exists());
    job
}

/// What the boot does: everything killed, slurmd gone, instances lost,
/// maybe the runtime directory too; then the boot unit, then slurmd.
fn reboot(c: &Cluster, job: u32, wipe_runtime: bool) -> String {
    // The records were written in an earlier boot: this machine cannot
    // reboot, so the stamp says what a real reboot would make it mean.
    std::fs::write(gpu_mode_core::runtime::boot_id_path(&c.runtime_dir()), "the-boot-before\n").unwrap();
    c.stop_slurmd().unwrap();
    kill_job(c, job);
    c.sim_ctl(&["reboot"]).unwrap();
    if wipe_runtime {
        std::fs::remove_dir_all(c.runtime_dir()).unwrap();
    }
    let boot = mig_tool(c, &["apply", "--boot", "--node", &c.spec.node_name]);
    assert!(boot.contains("outcome=ok"), "{boot}");
    // slurmctld learns of a reboot from the node's boot time, which this
    // one cannot change: it is told the way it would conclude, the node
    // went down (its jobs are requeued or failed), then slurmd registers.
    let node = format!("NodeName={}", c.spec.node_name);
    let out = c.client("scontrol", &["update", &node, "State=DOWN", "Reason=rebooted"]).run_as_root().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // ReturnToService=2: the node is back in service when slurmd registers.
    c.start_slurmd().unwrap();
    boot
}

fn assert_agree(c: &Cluster, what: &str) {
    let (on, gpu0) = layout(c, 0);
    assert!(on && gpu0.len() == 1 && gpu0[0].0 == 9, "{what}: GPU 0 is the baseline's (one 3g.71gb): {gpu0:?}");
    assert_eq!(layout(c, 1), (false, vec![]), "{what}: GPU 1 is the baseline's");
    mig_tool(c, &["assert"]);
    let r = c.check_results("mig").unwrap();
    assert!(r.iter().all(|(s, _)| s == "ok" || s == "skipped"), "{what}: the node checker calls something stale: {r:?}");
    let run = c.runtime_dir();
    for sub in ["jobs", "mig"] {
        let left: Vec<_> = std::fs::read_dir(run.join(sub)).map(|d| d.flatten().map(|e| e.file_name()).collect()).unwrap_or_default();
        assert!(left.is_empty(), "{what}: left in {sub}/: {left:?}");
    }
    let (state, reason) = c.node_state().unwrap();
    assert!(!state.contains("DRAIN"), "{what}: {state} {reason}");
}

/// After the reboot: the job Slurm requeued (or failed) is cancelled
/// before it can start again, and an epilog, if Slurm runs one for it,
/// found nothing to do.
fn settle(c: &Cluster, job: u32) -> String {
    let info = c.wait_job_info(job, WAIT, "an end or a requeue", |j| j.is_final() || j.state == "PENDING").unwrap();
    let _ = c.client("scancel", &[&job.to_string()]).run_as_root();
    std::thread::sleep(Duration::from_secs(2));
    let lines = c.hook_log_lines(job);
    assert!(lines.iter().filter(|l| l.contains("action=epilog")).all(|l| l.ends_with("outcome=skipped")), "{lines:#?}");
    info.state
}

#[test]
fn after_a_reboot_that_empties_the_runtime_dir_the_boot_unit_and_the_epilog_agree() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let c = c();
    let job = running_mig_job(c, "wiped");
    assert!(layout(c, 1).0, "the job switched GPU 1 to MIG");
    let boot = reboot(c, job, true);
    assert!(boot.contains("action=boot-records") && boot.contains("no boot-id stamp"), "{boot}");
    let state = settle(c, job);
    assert_agree(c, &format!("runtime dir wiped (job {state})"));
}

/// A site whose runtime directory survives a reboot: the job's state, MIG
/// journal and mark would say it still holds its GPUs (the baseline then
/// refused to touch them: "held by job(s)"), so the boot unit removes the
/// records of the boot before (found by this test).
#[test]
fn after_a_reboot_that_keeps_the_runtime_dir_the_boot_unit_clears_the_lost_jobs_records() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let c = c();
    let job = running_mig_job(c, "kept");
    let boot = reboot(c, job, false);
    assert!(boot.contains("action=boot-records") && boot.contains(&format!("jobs/{job}.json")) && boot.contains(&format!("mig/job-{job}.json")), "{boot}");
    let state = settle(c, job);
    assert_agree(c, &format!("runtime dir kept (job {state})"));
}
