//! The Epilog verb: undo what the prolog did for the job and remove its state.
//! Idempotent: a second run, or a run after a reboot that lost /run, finds
//! nothing and succeeds.

use super::{Failure, Fault, Report};
use crate::config::Config;
use crate::job_env::JobEnv;
use crate::log::Outcome;
use crate::modes::{self, Released};
use crate::state::{JobState, JobStatus};

pub fn run(cfg: &Config, env: &JobEnv) -> Result<Report, Failure> {
    let result = undo_job(cfg, env);
    if cfg.health.after_epilog && !matches!(result, Err(Failure::Node(..) | Failure::Drain(..))) {
        // After every job, with or without a mode. The checker drains (and
        // logs) by itself: a failed check is the node's condition, already
        // reported, not a failure of this epilog.
        let _step = crate::watchdog::step("health check after epilog");
        let _ = crate::node_check::check_after_epilog(cfg, &env.node);
    }
    result
}

/// Undoes what the prolog did for the job, without the health checks.
pub fn undo_job(cfg: &Config, env: &JobEnv) -> Result<Report, Failure> {
    let loaded = {
        let _step = crate::watchdog::step("job state: load");
        JobState::load_if_present(&cfg.runtime_dir, env.job_id)
    };
    let state = match loaded {
        Ok(s) => s,
        // A corrupt state file cannot tell us what to undo: every mode
        // searches its own records instead, the file is removed so the next
        // run is clean, and it is reported as a node fault to be looked at.
        Err(e) => {
            let undone = release(cfg, env.job_id, None);
            let _ = JobState::remove(&cfg.runtime_dir, env.job_id);
            let undone = match undone {
                Ok(r) => r.detail.map(|d| format!("; undone: {d}")).unwrap_or_default(),
                Err(f) => format!("; undoing: {f}"),
            };
            return Err(Failure::node(Fault::JobState, format!("unreadable job state removed: {e}{undone}")));
        }
    };
    let mode = state.as_ref().map(|s| s.mode.clone()).or_else(|| env.mode_value.clone());
    let released = release(cfg, env.job_id, state.as_ref());
    if state.is_none() && matches!(released, Ok(Released { found: false, .. })) {
        return Ok(Report { outcome: Outcome::Skipped, mode, detail: None });
    }
    // The state goes last, and also when teardown failed: the node is then
    // drained, and the job must not look live to later jobs.
    let removed = JobState::remove(&cfg.runtime_dir, env.job_id);
    let detail = released?.detail;
    removed.map_err(|e| Failure::node(Fault::JobState, format!("cannot remove job state: {e}")))?;
    Ok(Report { outcome: Outcome::Ok, mode, detail })
}

/// Undoes what the job's mode made. A finished prolog's grant says what;
/// without one (no state, a state lost or left `preparing` by a prolog that
/// died) every mode searches its own records: nothing may outlive its job.
fn release(cfg: &Config, job_id: u32, state: Option<&JobState>) -> Result<Released, Failure> {
    if let Some(s) = state.filter(|s| s.status == JobStatus::Ready) {
        return match modes::driver_of(&s.grant) {
            Some(driver) => driver.release(cfg, job_id, &s.grant).inspect(|r| super::record_events(cfg, &r.events)),
            None => Ok(Released::nothing()),
        };
    }
    let mut found = Released::nothing();
    let mut first_error = None;
    for driver in modes::all_drivers() {
        match driver.release_lost(cfg, job_id).inspect(|r| super::record_events(cfg, &r.events)) {
            Ok(r) if r.found => {
                found.found = true;
                found.detail = [found.detail.take(), r.detail].into_iter().flatten().reduce(|a, b| format!("{a}; {b}"));
            }
            Ok(_) => {}
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    first_error.map_or(Ok(found), Err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::prolog;

    /// A checkpoint job (its prolog starts a stand-in agent).
    fn setup() -> (tempfile::TempDir, Config, JobEnv) {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = Config { runtime_dir: dir.path().join("run"), ..Config::default() };
        let _ = crate::modes::checkpoint::stand_in::install(&mut cfg, dir.path(), 8);
        let env = JobEnv {
            job_id: 8,
            uid: 1000,
            gid: 1000,
            user: "u".into(),
            node: "n".into(),
            slurm_gpus: vec![0],
            mode_value: Some("checkpoint".into()),
            restart_count: 0,
        };
        (dir, cfg, env)
    }

    #[test]
    fn removes_the_state_and_is_idempotent() {
        let (_d, cfg, env) = setup();
        prolog::run(&cfg, &env).unwrap();
        assert_eq!(run(&cfg, &env).unwrap().outcome, Outcome::Ok);
        assert_eq!(JobState::load_if_present(&cfg.runtime_dir, 8).unwrap(), None);
        let again = run(&cfg, &env).unwrap();
        assert_eq!(again.outcome, Outcome::Skipped);
        assert_eq!(again.mode.as_deref(), Some("checkpoint"));
    }

    #[test]
    fn a_corrupt_state_is_removed_and_reported() {
        let (_d, cfg, env) = setup();
        prolog::run(&cfg, &env).unwrap();
        std::fs::write(crate::state::state_path(&cfg.runtime_dir, 8), b"{oops").unwrap();
        match run(&cfg, &env) {
            Err(Failure::Node(fault, msg)) => assert!(fault == Fault::JobState && msg.contains("is corrupt"), "{fault:?} {msg}"),
            other => panic!("expected a node fault, got {other:?}"),
        }
        assert_eq!(run(&cfg, &env).unwrap().outcome, Outcome::Skipped);
    }
}
