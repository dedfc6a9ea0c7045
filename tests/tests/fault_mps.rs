//! Fault matrix (docs/faults.md), MPS rows: the job's MPS control daemon
//! killed with SIGKILL mid-job; a CUDA client killed mid-kernel; the epilog
//! run twice. Each ends with the node in service and nothing left behind.
//! One simulated GPU, so every job lands on the same one; the tests take
//! turns (each checks the whole node at its end).

use gpu_mode_tests::shared::cluster;
use gpu_mode_tests::Cluster;
use std::sync::Mutex;
use std::time::Duration;

static TURN: Mutex<()> = Mutex::new(());

fn c() -> &'static Cluster {
    cluster("fault_mps", 1)
}

const WAIT: Duration = Duration::from_secs(60);

fn assert_clean_and_in_service(what: &str) {
    let left = c().leftovers(None);
    assert!(left.is_clean(), "{what}: left behind:\n{}", left.summary());
    let (state, reason) = c().node_state().unwrap();
    assert!(!state.contains("DRAIN"), "{what}: node drained: {state} {reason}");
    assert_eq!(c().sim_compute_mode(0).unwrap(), 0, "{what}: compute mode not restored");
}

fn state_of(job: u32) -> gpu_mode_core::state::JobState {
    gpu_mode_core::state::JobState::load(&c().runtime_dir(), job).unwrap()
}

/// The MPS daemon of a running job, from its record.
fn daemon_of(job: u32) -> i32 {
    let key = match state_of(job).grant {
        gpu_mode_core::modes::GrantRecord::Mps { daemon } => daemon,
        other => panic!("job {job} has no MPS grant: {other:?}"),
    };
    let rec = gpu_mode_core::mps::DaemonRecord::load(&c().runtime_dir(), &key).unwrap().expect("the daemon's record");
    rec.daemon.expect("a started daemon").pid
}

#[test]
fn the_mps_daemon_killed_mid_job_is_cleaned_up_by_the_epilog_without_a_drain() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let ready = c().dir.join("out/daemon-kill.ready");
    let script = format!("#!/bin/sh\ntouch {}\nsleep 3\necho after-kill pipe=$CUDA_MPS_PIPE_DIRECTORY\n", ready.display());
    let job = c().sbatch(Some("gmtest1"), &["--gpu-mode=mps", "--gres=gpu:1"], &script).unwrap();
    c().wait_until("the job to start", || ready.exists());
    let daemon = daemon_of(job);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(daemon), nix::sys::signal::Signal::SIGKILL).unwrap();
    let done = c().wait_finished(job, WAIT).unwrap();
    // The user's program runs on (a real CUDA client would get an MPS error).
    assert_eq!(done.exit_code, 0, "{}", done.output);
    assert!(done.output.contains("after-kill"), "{}", done.output);
    let lines = c().hook_log_lines(job);
    let epilog = lines.iter().find(|l| l.contains("action=epilog")).unwrap();
    assert!(epilog.ends_with("outcome=ok") && epilog.contains("mps daemon 1001-0 was already gone (killed or crashed during the job)"), "{epilog}");
    assert_clean_and_in_service("daemon killed");
}

#[test]
fn a_cuda_client_killed_mid_kernel_fails_its_job_only_and_the_next_job_gets_a_clean_gpu() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let env = c().share_sim_with_users().unwrap();
    let counter = c().sim_program("cuda-sim-counter").unwrap();
    let ready = c().dir.join("out/client-kill.ready");
    let script = format!(
        "#!/bin/sh\n{env}{} --steps 100000 --interval-ms 20 --mib 64 --ready {}\n",
        counter.display(),
        ready.display()
    );
    let job = c().sbatch(Some("gmtest1"), &["--gpu-mode=mps", "--gres=gpu:1"], &script).unwrap();
    c().wait_until("the client to hold GPU memory", || ready.exists());
    let pid: i32 = std::fs::read_to_string(&ready).unwrap().trim().parse().unwrap();
    let used = || c().sim_gpu(0).unwrap()["processes"].as_array().map_or(0, |p| p.len());
    assert_eq!(used(), 1, "the client holds the GPU");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
    let done = c().wait_finished(job, WAIT).unwrap();
    assert_eq!(done.exit_code, 137, "the job fails with its client's death: {}", done.output);
    assert_eq!(used(), 0, "the driver frees a dead process's memory");
    assert_clean_and_in_service("client killed");
    // The next job on the same GPU gets a new daemon and all of the memory.
    let script = format!("#!/bin/sh\n{env}{} --steps 5 --interval-ms 10 --mib 64\n", counter.display());
    let next = c().sbatch_wait(Some("gmtest2"), &["--gpu-mode=mps", "--gres=gpu:1"], &script).unwrap();
    assert_eq!(next.exit_code, 0, "{}", next.output);
    assert!(next.output.contains("DONE count=5"), "{}", next.output);
    c().wait_epilog(next.id, WAIT).unwrap();
    assert_clean_and_in_service("after the next job");
}

#[test]
fn the_epilog_run_twice_finds_nothing_the_second_time() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let job = c().sbatch_wait(Some("gmtest1"), &["--gpu-mode=mps:threads=50", "--gres=gpu:1"], "#!/bin/sh\ntrue\n").unwrap();
    assert_eq!(job.exit_code, 0, "{}", job.output);
    c().wait_epilog(job.id, WAIT).unwrap();
    for _ in 0..2 {
        let again = c().run_hook("epilog", job.id, "gmtest1", "0", "mps:threads=50").unwrap();
        assert_eq!(again.status.code(), Some(0), "{}", String::from_utf8_lossy(&again.stderr));
    }
    let lines = c().hook_log_lines(job.id);
    let epilogs: Vec<&String> = lines.iter().filter(|l| l.contains("action=epilog")).collect();
    assert_eq!(epilogs.len(), 3, "{lines:#?}");
    assert!(epilogs[0].ends_with("outcome=ok") && epilogs[1].ends_with("outcome=skipped") && epilogs[2].ends_with("outcome=skipped"), "{epilogs:#?}");
    assert_clean_and_in_service("epilog twice");
}
