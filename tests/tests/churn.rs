//! The churn in CI (issue 12): 100 jobs of four users in every mode on a
//! simulated 8-GPU node, some cancelled at random moments, checkpoint jobs
//! (real ones, CRIU included) some of which are preempted; nothing may be
//! left, nothing drained, no job may fail for a reason not injected, and
//! one checkpoint job is preempted and restored every run (on a node held
//! full first: `churn::full_node`), its count and exit code intact. The
//! figures are printed (`--nocapture`); `gpu-mode-churn` runs the 500-job
//! version (docs/faults.md has both). Needs CRIU like the preempt tests
//! (skipped, said through the testkit, without it unless
//! GPU_MODE_REQUIRE_CRIU).

use gpu_mode_tests::churn::{self, Options};
use gpu_mode_tests::{ckpt_jobs, Artifacts, Cluster};

#[test]
fn a_hundred_jobs_of_every_mode_leave_nothing_and_drain_nothing() {
    if !ckpt_jobs::criu_ready() {
        return;
    }
    gpu_mode_tests::users::ensure_test_users().unwrap();
    let cluster = Cluster::start(churn::spec("churn", Artifacts::locate().unwrap())).unwrap();
    let report = churn::run(&cluster, &Options::with_jobs(100)).unwrap();
    println!("{}", report.text());
    let problems = report.problems();
    assert!(problems.is_empty(), "{}\n{}", report.text(), problems.join("\n"));
    // The preemption on the full node: preempted, checkpointed in run 0,
    // restored in run 1, every step once, the application's exit code.
    assert!(report.full_node_problems.is_empty(), "{:#?}", report.full_node_problems);
    // What the run exercised, as the product logged it: its prolog and
    // epilog did the work of many modes, of every family.
    let worked = |f: &str| report.work_by_mode.iter().any(|(m, (p, e))| churn::product::family(m) == f && *p > 0 && *e > 0);
    assert!(report.work_by_mode.len() >= 10, "{}", report.text());
    assert!(["none", "mps", "mig", "checkpoint"].iter().all(|f| worked(f)), "{}", report.text());
    let jobs_with_prolog_work: usize = report.work_by_mode.values().map(|(p, _)| p).sum();
    assert!(jobs_with_prolog_work >= 80, "{}", report.text());
    // Cancels that hit running jobs: Slurm ended them CANCELLED, and the
    // product's epilog ran after each one's prolog.
    assert!(report.outcomes.get("CANCELLED").is_some_and(|n| *n >= 5) && report.cancelled_after_prolog >= 3, "{}", report.text());
    cluster.stop();
}
