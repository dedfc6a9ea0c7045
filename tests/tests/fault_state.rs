//! Fault matrix (docs/faults.md), job state rows: the state file of a
//! running MPS job found corrupt, truncated, or written by a future version.
//! Steps started after it fail with a message naming the file; the epilog
//! removes it, drains the node naming it (a node whose state files rot, or
//! whose helpers were downgraded under a running job, needs a look), and
//! still undoes what the job's mode made (each mode searches its own
//! records, as for a lost state): nothing is left behind.

use gpu_mode_tests::shared::cluster;
use gpu_mode_tests::Cluster;
use std::sync::Mutex;
use std::time::Duration;

static TURN: Mutex<()> = Mutex::new(());
const WAIT: Duration = Duration::from_secs(60);

fn c() -> &'static Cluster {
    cluster("fault_state", 1)
}

/// (case, how the file is damaged, what the messages say).
fn damage(original: &[u8]) -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let mut future: serde_json::Value = serde_json::from_slice(original).unwrap();
    future["version"] = 3.into();
    vec![
        ("corrupt", b"{\"version\": 2, \"job_id\": \x00\x01 garbage".to_vec(), "is corrupt"),
        ("truncated", original[..original.len() / 2].to_vec(), "is corrupt"),
        ("future version", serde_json::to_vec(&future).unwrap(), "has format version 3, this build reads version 2"),
    ]
}

/// Runs an MPS job, damages its state file while it runs (case `i` of
/// [`damage`]), lets it finish; returns (case, what the messages say, job).
fn run_case(i: usize) -> (&'static str, &'static str, u32, gpu_mode_tests::JobResult) {
    let then = "srun -n1 printenv SLURM_GPU_MODE\necho step-exit=$?";
    let job = c().start_held_job("gmtest1", &["--gpu-mode=mps", "--gres=gpu:1"], then).unwrap();
    let path = gpu_mode_core::state::state_path(&c().runtime_dir(), job.id);
    let original = std::fs::read(&path).unwrap();
    let (case, bytes, says) = damage(&original).swap_remove(i);
    std::fs::write(&path, bytes).unwrap();
    job.release();
    (case, says, job.id, c().wait_finished(job.id, WAIT).unwrap())
}

#[test]
fn a_damaged_state_fails_later_steps_drains_naming_the_file_and_leaves_nothing() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    for i in 0..3 {
        let (case, says, job, done) = run_case(i);
        // The user: the step after the damage fails, naming the file.
        assert!(!done.output.contains("step-exit=0"), "{case}: the step ran: {}", done.output);
        assert!(done.output.contains(says) && done.output.contains(&format!("{job}.json")), "{case}: the step's message: {}", done.output);
        // The admin: a drain naming the file, and the epilog's line.
        let (_, reason) = c().wait_drained(WAIT).unwrap();
        assert!(reason.starts_with("gpu-mode: epilog: unreadable job state removed: state file") && reason.contains(says), "{case}: {reason}");
        let lines = c().hook_log_lines(job);
        assert!(lines.iter().any(|l| l.contains("action=epilog") && l.ends_with("outcome=failed")), "{case}: {lines:#?}");
        assert!(!gpu_mode_core::state::JobState::is_live(&c().runtime_dir(), job), "{case}: the state was not removed");
        // Without a grant to go by, each mode searched its own records: the
        // MPS daemon is gone too (the line says what was undone).
        assert!(reason.contains("undone: mps daemon") || lines.iter().any(|l| l.contains("undone: mps daemon")), "{case}: {lines:#?}");
        let left = c().leftovers(None);
        assert!(left.is_clean(), "{case}: left behind:\n{}", left.summary());
        assert_eq!(c().sim_compute_mode(0).unwrap(), 0, "{case}: compute mode not restored");
        c().resume_node().unwrap();
    }
}
