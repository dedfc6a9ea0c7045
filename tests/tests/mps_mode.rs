//! `--gpu-mode=mps` on a real Slurm with the simulated NVML and MPS: per-user
//! daemons and private directories, compute mode set and restored, sharing
//! and conflicts, and clean teardown.

use gpu_mode_tests::shared::cluster;
use gpu_mode_tests::Cluster;
use std::os::unix::process::CommandExt;

fn c() -> &'static Cluster {
    cluster("mps_mode", 4)
}

/// MPS processes of the simulated daemons still running for this cluster.
fn mps_processes() -> Vec<String> {
    let sim = c().dir.join("sim").display().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let pid = e.ok()?.file_name().to_str()?.parse::<u32>().ok()?;
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let zombie = state.rsplit(')').next()?.trim_start().starts_with('Z');
            (cmd.starts_with(&sim) && !zombie).then_some(format!("{pid} {cmd}"))
        })
        .collect()
}

#[test]
fn two_users_get_separate_private_daemons_and_the_compute_mode_is_restored() {
    // Each job reports its pipe directory and daemon, then waits for the
    // test to look at it from outside.
    let script = "#!/bin/sh\necho $CUDA_MPS_PIPE_DIRECTORY $(cat $CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid) $CUDA_VISIBLE_DEVICES > $HOME_OUT.$SLURM_JOB_ID\nsleep 4\necho threads=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE\n";
    let out_dir = c().dir.join("out");
    let script = script.replace("$HOME_OUT", &out_dir.join("mps").display().to_string());
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| c().sbatch_wait(Some("gmtest1"), &["--gpu-mode=mps:threads=30", "--gres=gpu:1"], &script));
        let b = s.spawn(|| c().sbatch_wait(Some("gmtest2"), &["--gpu-mode=mps", "--gres=gpu:1"], &script));
        // While both run: check from outside.
        c().wait_until("both jobs to report", || {
            std::fs::read_dir(&out_dir).unwrap().filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("mps.")).count() >= 2
        });
        let reports: Vec<String> = std::fs::read_dir(&out_dir)
            .unwrap()
            .filter_map(|e| {
                let e = e.ok()?;
                e.file_name().to_string_lossy().starts_with("mps.").then(|| std::fs::read_to_string(e.path()).unwrap())
            })
            .collect();
        let fields: Vec<Vec<&str>> = reports.iter().map(|r| r.split_whitespace().collect()).collect();
        assert_eq!(fields.len(), 2, "{reports:?}");
        assert_ne!(fields[0][0], fields[1][0], "two users must get two pipe directories");
        assert_ne!(fields[0][1], fields[1][1], "two users must get two daemons");
        assert_ne!(fields[0][2], fields[1][2], "the jobs must be on different GPUs");
        for f in &fields {
            assert!(f[2].starts_with("GPU-"), "tasks see the daemon's GPU by UUID: {f:?}");
        }
        // Each daemon runs as its user; neither user can open the other's pipe directory.
        for f in &fields {
            let owner = std::fs::metadata(f[0]).map(|m| std::os::unix::fs::MetadataExt::uid(&m)).unwrap();
            let stranger = if owner == gpu_mode_tests::users::lookup("gmtest1").unwrap().uid { "gmtest2" } else { "gmtest1" };
            let u = gpu_mode_tests::users::lookup(stranger).unwrap();
            let out = std::process::Command::new("/bin/ls").arg(f[0]).uid(u.uid).gid(u.gid).output().unwrap();
            assert!(!out.status.success(), "{stranger} listed {}", f[0]);
            assert!(String::from_utf8_lossy(&out.stderr).contains("Permission denied"));
            let daemon_uid = std::fs::read_to_string(format!("/proc/{}/status", f[1]))
                .unwrap()
                .lines()
                .find_map(|l| l.strip_prefix("Uid:").map(|v| v.split_whitespace().next().unwrap().parse::<u32>().unwrap()))
                .unwrap();
            assert_eq!(daemon_uid, owner, "the daemon must run as the job's user");
        }
        // Both GPUs are in exclusive-process mode while the daemons run.
        let exclusive = (0..4).filter(|g| c().sim_compute_mode(*g).unwrap() == 3).count();
        assert_eq!(exclusive, 2, "compute mode must be EXCLUSIVE_PROCESS on the two jobs' GPUs");
        (a.join().unwrap().unwrap(), b.join().unwrap().unwrap())
    });
    assert_eq!(a.exit_code, 0, "{}", a.output);
    assert_eq!(b.exit_code, 0, "{}", b.output);
    assert_eq!(a.output.trim(), "threads=30");
    assert_eq!(b.output.trim(), "threads=");
    c().wait_until("the epilogs to stop both daemons", || mps_processes().is_empty());
    for g in 0..4 {
        assert_eq!(c().sim_compute_mode(g).unwrap(), 0, "GPU {g}: compute mode not restored");
    }
    for job in [a.id, b.id] {
        let lines = c().hook_log_lines(job);
        assert!(lines.iter().any(|l| l.contains("action=epilog") && l.contains("stopped") && l.contains("outcome=ok")), "{lines:?}");
    }
    assert!(std::fs::read_dir(c().runtime_dir().join("mps")).unwrap().next().is_none(), "daemon directories left behind");
}

#[test]
fn jobs_of_one_user_share_a_daemon_and_other_users_are_refused_without_a_drain() {
    // Slurm gives each gres/gpu job its own GPUs, so sharing (gres/mps,
    // shards, oversubscription) is driven by running the helpers as slurmd
    // would, for made-up jobs on GPU 3.
    let ok = |o: &std::process::Output| assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    ok(&c().run_hook("prolog", 9001, "gmtest1", "3", "mps").unwrap());
    ok(&c().run_hook("prolog", 9002, "gmtest1", "3", "mps:threads=50").unwrap());
    let state = |job: u32| gpu_mode_core::state::JobState::load(&c().runtime_dir(), job).unwrap();
    assert_eq!(state(9001).grant, state(9002).grant, "one user's jobs on one GPU share a daemon");
    assert_eq!(state(9002).task_env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "50");
    // Another user on the same GPU: refused, named, node left alone.
    ok(&c().run_hook("prolog", 9003, "gmtest2", "3", "mps").unwrap());
    let refusal = state(9003).refusal.expect("the other user's job must be refused");
    assert!(refusal.starts_with("GPU GPU-") && refusal.contains("another user's MPS daemon (job 9001,9002)"), "{refusal}");
    let (node_state, _) = c().node_state().unwrap();
    assert!(!node_state.contains("DRAIN"), "{node_state}");
    ok(&c().run_hook("epilog", 9003, "gmtest2", "3", "mps").unwrap());
    // The first epilog keeps the daemon for the second job; the last one stops it.
    let daemons = || gpu_mode_core::mps::DaemonRecord::all(&c().runtime_dir()).unwrap();
    ok(&c().run_hook("epilog", 9001, "gmtest1", "3", "mps").unwrap());
    assert_eq!(daemons().iter().map(|d| d.jobs.clone()).collect::<Vec<_>>(), vec![vec![9002]]);
    ok(&c().run_hook("epilog", 9002, "gmtest1", "3", "mps").unwrap());
    assert!(daemons().is_empty());
    assert_eq!(c().sim_compute_mode(3).unwrap(), 0);
    // Idempotent: a second epilog finds nothing and succeeds.
    let again = c().run_hook("epilog", 9002, "gmtest1", "3", "mps").unwrap();
    ok(&again);
}

#[test]
fn an_mps_job_without_gpus_is_refused_with_a_clear_message() {
    let job = c().sbatch_wait(Some("gmtest1"), &["--gpu-mode=mps"], "#!/bin/sh\necho ran\n").unwrap();
    assert_ne!(job.exit_code, 0);
    assert!(job.output.contains("--gpu-mode=mps needs GPUs: request them with --gres=gpu:N"), "{}", job.output);
}
