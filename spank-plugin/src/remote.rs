//! slurmstepd side (remote context): in each task before exec, set the
//! environment the prolog decided (job state), or fail the task with the
//! prolog's refusal. Jobs that did not ask for a mode are not touched at all, not even
//! by reading the config.

use crate::args::PluginArgs;
use crate::options;
use gpu_mode_core::config::Config;
use gpu_mode_core::job_env::JOB_MODE_VAR;
use gpu_mode_core::state::{JobState, StateError};
use slurm_spank::SpankHandle;
use std::error::Error;

pub fn task_init(spank: &mut SpankHandle, args: &PluginArgs) -> Result<(), Box<dyn Error>> {
    let asked = options::gpu_mode_value(spank)?.is_some() || spank.getenv(JOB_MODE_VAR)?.is_some();
    if !asked {
        return Ok(());
    }
    let cfg = Config::load(args.config.as_deref())?;
    let job_id = spank.job_id()?;
    let state = JobState::load(&cfg.runtime_dir, job_id)?;
    for (name, value) in task_env(&state)? {
        // gres/mps gives the job its GPU share in this variable: keep it.
        if gpu_mode_core::mps::KEEP_IF_SET.contains(&name) && spank.getenv(name)?.is_some() {
            continue;
        }
        spank.setenv(name, value, true)?;
    }
    Ok(())
}

/// The variables to set in every task, or the prolog's refusal as an error.
pub fn task_env(state: &JobState) -> Result<Vec<(&str, &str)>, StateError> {
    if let Some(reason) = &state.refusal {
        return Err(StateError::Refused { job_id: state.job_id, reason: reason.clone() });
    }
    Ok(state.task_env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(refusal: Option<&str>) -> JobState {
        JobState {
            version: gpu_mode_core::state::STATE_VERSION,
            job_id: 4,
            uid: 1,
            gid: 1,
            user: "u".into(),
            node: "n".into(),
            mode: "mps".into(),
            gpus: vec![0],
            task_env: [("A".to_string(), "1".to_string())].into(),
            refusal: refusal.map(String::from),
            created_unix: 0,
            mps_daemon: None,
        }
    }

    #[test]
    fn task_env_comes_from_the_state_or_fails_with_the_refusal() {
        assert_eq!(task_env(&state(None)).unwrap(), vec![("A", "1")]);
        let err = task_env(&state(Some("GPU 0 has no 7g.80gb profile"))).unwrap_err().to_string();
        assert_eq!(err, "job 4 cannot run on this node: GPU 0 has no 7g.80gb profile");
    }
}
