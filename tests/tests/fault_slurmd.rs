//! Fault matrix (docs/faults.md): slurmd restarted while an MPS job runs,
//! and slurmd down when the job ends (restarted after it). The job's steps
//! run on (slurmstepd is its own process); the epilog runs once slurmd is
//! back and the job has ended, and it undoes everything: the state file is
//! the whole memory it needs.

use gpu_mode_tests::shared::cluster;
use gpu_mode_tests::Cluster;
use std::sync::Mutex;
use std::time::Duration;

static TURN: Mutex<()> = Mutex::new(());
const WAIT: Duration = Duration::from_secs(90);

fn c() -> &'static Cluster {
    cluster("fault_slurmd", 1)
}

/// An MPS job that waits for the test; it says `done-<tag>` at its end.
fn waiting_job(tag: &str) -> gpu_mode_tests::jobs::HeldJob {
    c().start_held_job("gmtest1", &["--gpu-mode=mps", "--gres=gpu:1"], &format!("echo done-{tag}")).unwrap()
}

fn assert_clean(what: &str, job: u32, output: &str) {
    let lines = c().hook_log_lines(job);
    let epilogs: Vec<&String> = lines.iter().filter(|l| l.contains("action=epilog")).collect();
    assert_eq!(epilogs.len(), 1, "{what}: one epilog: {lines:#?}");
    assert!(epilogs[0].ends_with("outcome=ok") && epilogs[0].contains("stopped"), "{what}: {}", epilogs[0]);
    let left = c().leftovers(None);
    assert!(left.is_clean(), "{what}: left behind:\n{}", left.summary());
    assert_eq!(c().sim_compute_mode(0).unwrap(), 0, "{what}");
    let (state, reason) = c().node_state().unwrap();
    assert!(!state.contains("DRAIN"), "{what}: {state} {reason}");
    assert!(output.contains("done-"), "{what}: {output}");
}

#[test]
fn slurmd_restarted_mid_job_the_job_runs_on_and_the_epilog_cleans_up() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let job = waiting_job("mid");
    c().stop_slurmd().unwrap();
    c().start_slurmd().unwrap();
    job.release();
    let done = c().wait_finished(job.id, WAIT).unwrap();
    assert_eq!(done.exit_code, 0, "{}", done.output);
    assert_clean("restarted mid-job", job.id, &done.output);
}

#[test]
fn slurmd_down_when_the_job_ends_runs_the_epilog_when_it_is_back() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let job = waiting_job("down");
    c().stop_slurmd().unwrap();
    job.release();
    // The batch script ends while slurmd is away; nothing cleans up yet.
    c().wait_until("the job's script to end", || job.finished.exists());
    std::thread::sleep(Duration::from_secs(2));
    assert!(gpu_mode_core::state::JobState::is_live(&c().runtime_dir(), job.id), "the state is the epilog's to remove");
    c().start_slurmd().unwrap();
    let done = c().wait_finished(job.id, WAIT).unwrap();
    assert_clean("down at the job's end", job.id, &done.output);
}
