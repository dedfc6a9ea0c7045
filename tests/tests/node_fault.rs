//! A node-level fault in the prolog: it drains the node with its own precise
//! `gpu-mode:` reason (which Slurm's generic "Prolog error" does not replace),
//! exits non-zero, and Slurm requeues the job held. Its own cluster: the fault
//! is a broken runtime directory, which would disturb other tests.

use gpu_mode_tests::{Artifacts, Cluster, ClusterSpec};
use std::time::{Duration, Instant};

#[test]
fn a_prolog_node_fault_drains_with_our_reason_and_requeues_the_job_held() {
    gpu_mode_tests::users::ensure_test_users().unwrap();
    let cluster = Cluster::start(ClusterSpec::new("node_fault", 1, Artifacts::locate().unwrap())).unwrap();
    // runtime_dir below a regular file: the prolog cannot write job state.
    let blocker = cluster.dir.join("blocker");
    std::fs::write(&blocker, b"").unwrap();
    let conf = cluster.dir.join("gpu-mode.toml");
    let text = std::fs::read_to_string(&conf).unwrap();
    let broken = text.replace(&format!("\"{}\"", cluster.runtime_dir().display()), &format!("\"{}/run\"", blocker.display()));
    assert_ne!(text, broken, "failed to point runtime_dir at the blocker");
    std::fs::write(&conf, broken).unwrap();

    let out = cluster
        .client("sbatch", &["--parsable", "--gpu-mode=mps", "--gres=gpu:1", "--wrap", "true"])
        .run_as(Some("gmtest1"))
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let job = String::from_utf8_lossy(&out.stdout).trim().to_string();

    let start = Instant::now();
    let (state, reason) = loop {
        let (state, reason) = cluster.node_state().unwrap();
        if state.contains("DRAIN") || start.elapsed() > Duration::from_secs(60) {
            break (state, reason);
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    assert!(state.contains("DRAIN"), "node not drained: {state}\n{}", cluster.logs_tail());
    assert!(
        reason.starts_with("gpu-mode: prolog: cannot write job state"),
        "drain reason {reason:?} is not ours\n{}",
        cluster.logs_tail()
    );

    // Slurm requeues a job whose prolog failed, held.
    let start = Instant::now();
    let show = loop {
        let out = cluster.client("scontrol", &["show", "job", &job]).run_as_root().unwrap();
        let show = String::from_utf8_lossy(&out.stdout).to_string();
        if show.contains("JobState=PENDING") || start.elapsed() > Duration::from_secs(30) {
            break show;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    assert!(show.contains("JobState=PENDING"), "{show}");
    assert!(show.contains("Priority=0") || show.contains("held"), "job not held: {show}");
}
