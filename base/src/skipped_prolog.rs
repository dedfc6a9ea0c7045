//! A requeued batch job that Slurm restarted without running the prolog.
//!
//! Seen with Slurm 22.05.8 in the churn (tests/src/churn.rs) under load:
//! requeued checkpoint jobs restarting on the same node, three of four,
//! started their batch script with no prolog; slurmd logged `reissued job
//! credential for job N` twice and launched the batch job before the prolog
//! request arrived. slurmd runs the prolog only for a job id it does not
//! remember (its credential state), and a requeued job keeps its id, so the
//! order of the two requests decides; in a quiet cluster (the preempt tests,
//! even with a 20 s epilog) the prolog ran every time. Nothing of the job's
//! mode is prepared then, and a checkpoint job would lose its restore.
//!
//! The plugin then requeues the job once more instead of failing it: that run
//! had nothing to undo, so its epilog is quick, and the next run gets its
//! prolog. Only the batch step of a job that was already requeued does this
//! (only a requeued job reuses its id, and only a batch job can be
//! requeued), and only up to [`MAX_RESTARTS`]: a node that never runs the
//! prolog (no `Prolog=`) fails the job's first run, as before, and never
//! loops.

use crate::drain::Scontrol;

/// Above this restart count the job fails instead (Slurm's own
/// `MaxBatchRequeue`, 5 by default, usually stops it first).
pub const MAX_RESTARTS: u32 = 16;

/// Whether a task that found no job state should have its job requeued:
/// the batch step (`batch_step`) of a run with `restart_count` > 0.
pub fn should_requeue(restart_count: Option<u32>, batch_step: bool) -> bool {
    batch_step && restart_count.is_some_and(|r| r > 0 && r <= MAX_RESTARTS)
}

/// Requeues `job` and returns the message the task fails with: what
/// happened and what was done, or, when the requeue failed, that and the
/// original error.
pub fn requeue(scontrol: &Scontrol, job: u32, restart_count: u32, missing: &str) -> String {
    let what = format!(
        "gpu-mode: Slurm started run {restart_count} of job {job} on this node without its prolog (slurmd skips it \
         at times for a requeued job)"
    );
    match scontrol.requeue(job) {
        Ok(()) => format!("{what}: the job is requeued to start again with its prolog"),
        Err(e) => format!("{what}, and requeueing it failed ({e}): {missing}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_requeued_batch_step_is_requeued_and_not_for_ever() {
        let rows = [
            (None, true, false),
            (Some(0), true, false),
            (Some(1), true, true),
            (Some(MAX_RESTARTS), true, true),
            (Some(MAX_RESTARTS + 1), true, false),
            (Some(1), false, false),
            (None, false, false),
        ];
        for (restart, batch, want) in rows {
            assert_eq!(should_requeue(restart, batch), want, "restart {restart:?} batch {batch}");
        }
    }

    fn scontrol(dir: &std::path::Path, body: &str) -> Scontrol {
        Scontrol::new(&gpu_mode_testkit::script(dir, "scontrol", body))
    }

    #[test]
    fn the_job_is_requeued_by_id_and_the_message_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        let s = scontrol(dir.path(), &format!("echo \"$@\" >> {}", log.display()));
        let msg = requeue(&s, 41, 2, "no state file");
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "requeue 41\n");
        assert!(msg.starts_with("gpu-mode: Slurm started run 2 of job 41 on this node without its prolog"), "{msg}");
        assert!(msg.ends_with(": the job is requeued to start again with its prolog"), "{msg}");
    }

    #[test]
    fn a_failed_requeue_keeps_the_original_error() {
        let dir = tempfile::tempdir().unwrap();
        let s = scontrol(dir.path(), "echo 'Job is no longer pending execution' >&2\nexit 1");
        let msg = requeue(&s, 41, 1, "job 41: no state file /run/x");
        assert!(msg.contains("and requeueing it failed (") && msg.contains("Job is no longer pending execution"), "{msg}");
        assert!(msg.ends_with(": job 41: no state file /run/x"), "{msg}");
    }
}
