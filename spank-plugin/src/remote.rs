//! slurmstepd side (remote context). The job state is root's alone (mode
//! 0600 in a 0700 directory), so it is read in `task_init_privileged`, which
//! slurmstepd runs as root in each task process after fork; what it found is
//! kept in the plugin and applied in `task_init`, in the same process just
//! before exec (after Slurm's own GPU variables are set, so ours win), or the
//! task fails there with the prolog's refusal. Jobs that did not ask for a
//! mode are not touched at all, not even by reading the config.

use crate::args::PluginArgs;
use crate::options;
use gpu_mode_base::config::Config;
use gpu_mode_base::job_env::JOB_MODE_VAR;
use gpu_mode_base::drain::Scontrol;
use gpu_mode_base::skipped_prolog;
use gpu_mode_base::state::{JobState, JobStatus, StateError};
use crate::spank::Spank;
use std::error::Error;

/// What `task_init_privileged` found for this task: nothing to do, the
/// state to apply, or the error to fail the task with.
#[derive(Debug, Default)]
pub enum Pending {
    #[default]
    NotAsked,
    Apply(Box<JobState>),
    Fail(String),
    /// No job state (the prolog did not run); `batch`: in the batch step.
    Missing { message: String, batch: bool },
}

/// As root: reads the job's state if the job asked for a mode.
pub fn task_init_privileged(spank: &mut Spank, args: &PluginArgs) -> Result<Pending, Box<dyn Error>> {
    let asked = options::gpu_mode_value(spank)?.is_some() || spank.getenv(JOB_MODE_VAR)?.is_some();
    if !asked {
        return Ok(Pending::NotAsked);
    }
    let job_id = spank.job_id()?;
    let runtime = runtime_dir(args);
    Ok(match JobState::load(&runtime, job_id) {
        Ok(state) => {
            // The root-side step for each task (only MPS has one: move the
            // daemon into the job's cgroup); logged, never fatal.
            if let Some(line) = gpu_mode_base::mps_daemons::task_privileged(&runtime, job_id, &state.grant) {
                crate::spank::log_verbose(&line);
            }
            Pending::Apply(Box::new(state))
        }
        Err(e @ StateError::Missing { .. }) => {
            Pending::Missing { message: e.to_string(), batch: spank.step_id().is_ok_and(|s| s == crate::spank::BATCH_STEP_ID) }
        }
        Err(e) => Pending::Fail(e.to_string()),
    })
}

/// The checkpoint signal to hold back in this task (ignored and blocked,
/// gpu_mode_base::signal_state::hold), so that one sent before
/// gpu-mode-run took it (`--signal=B:` of a job preempted as it starts)
/// never ends the batch shell; gpu-mode-run is told (GPU_MODE_SIGNAL_HELD)
/// and gives the application the signal's default state: the batch step of
/// a job whose prolog recorded one.
fn held_signal(spank: &Spank, state: &JobState) -> Option<i32> {
    let batch = spank.step_id().is_ok_and(|s| s == crate::spank::BATCH_STEP_ID);
    let recorded = state.task_env.get(gpu_mode_base::job_env::TASK_SIGNAL_VAR).map(String::as_str);
    batch.then(|| gpu_mode_base::signal_state::recorded_signal(recorded)).flatten()
}

/// No state: the prolog did not run for this job here. A requeued batch
/// job that Slurm restarted without its prolog is requeued once more
/// (gpu_mode_base::skipped_prolog), as the job's user (owners may requeue
/// their jobs; the restart count is in the task's environment only from
/// here on, and the SPANK item reads 0 for a batch step on 22.05); anything
/// else fails with `message`.
fn missing_state(spank: &Spank, args: &PluginArgs, message: &str, batch: bool) -> String {
    let restart = spank.getenv("SLURM_RESTART_COUNT").ok().flatten().and_then(|v| v.parse().ok());
    match (spank.job_id(), restart) {
        (Ok(job_id), Some(r)) if skipped_prolog::should_requeue(Some(r), batch) => {
            let scontrol = Config::load_or_salvage(args.config.as_deref()).0.slurm.scontrol;
            skipped_prolog::requeue(&Scontrol::new(&scontrol), job_id, r, message)
        }
        _ => message.to_string(),
    }
}

/// Where the job states are: the plugstack argument, else the site config
/// (salvaged if it does not load: only runtime_dir matters here).
fn runtime_dir(args: &PluginArgs) -> std::path::PathBuf {
    match &args.runtime_dir {
        Some(dir) => dir.clone(),
        None => Config::load_or_salvage(args.config.as_deref()).0.runtime_dir,
    }
}

/// As the user, just before exec: sets the task's variables or fails it.
pub fn task_init(spank: &mut Spank, args: &PluginArgs, pending: &Pending) -> Result<(), Box<dyn Error>> {
    let state = match pending {
        Pending::NotAsked => return Ok(()),
        Pending::Fail(msg) => return Err(msg.clone().into()),
        Pending::Missing { message, batch } => return Err(missing_state(spank, args, message, *batch).into()),
        Pending::Apply(state) => state,
    };
    // Slurm sets the task's node-local id before this callback.
    let local_id = spank.getenv("SLURM_LOCALID")?.and_then(|v| v.parse().ok()).unwrap_or(0);
    for (name, value) in task_env(state, local_id)? {
        // gres/mps gives the job its GPU share in this variable: keep it.
        if gpu_mode_base::job_env::KEEP_IF_SET.contains(&name) && spank.getenv(name)?.is_some() {
            continue;
        }
        spank.setenv(name, value, true)?;
    }
    if let Some(sig) = held_signal(spank, state) {
        // Here, the last hook before exec: slurmstepd resets the task's
        // signals after task_init_privileged (22.05's _unblock_signals in
        // mgr.c), so a hold made there would not reach the batch script.
        if let Err(e) = gpu_mode_base::signal_state::hold(sig) {
            crate::spank::log_verbose(&format!("gpu-mode: cannot hold back the checkpoint signal {sig} in the batch step: {e}"));
        }
        spank.setenv(gpu_mode_base::signal_state::HELD_SIGNAL_VAR, &sig.to_string(), true)?;
    }
    Ok(())
}

/// The variables to set in the task with node-local id `local_id`, or the
/// prolog's refusal as an error.
pub fn task_env(state: &JobState, local_id: u32) -> Result<Vec<(&str, &str)>, StateError> {
    if let Some(reason) = &state.refusal {
        return Err(StateError::Refused { job_id: state.job_id, reason: reason.clone() });
    }
    if state.status != JobStatus::Ready {
        return Err(StateError::Unfinished { job_id: state.job_id });
    }
    let common = state.task_env.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    let per_task = state
        .per_task_env
        .iter()
        .filter_map(|(k, values)| Some((k.as_str(), gpu_mode_base::grant::per_task_value(values, local_id)?)));
    Ok(common.chain(per_task).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(refusal: Option<&str>) -> JobState {
        JobState {
            version: gpu_mode_base::state::STATE_VERSION,
            status: JobStatus::Ready,
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
            per_task_env: [("CUDA_VISIBLE_DEVICES".to_string(), vec!["MIG-a".to_string(), "MIG-b".to_string()])].into(),
            grant: gpu_mode_base::grant::GrantRecord::None,
        }
    }

    #[test]
    fn task_env_comes_from_the_state_or_fails_with_the_refusal() {
        assert_eq!(task_env(&state(None), 0).unwrap(), vec![("A", "1"), ("CUDA_VISIBLE_DEVICES", "MIG-a")]);
        assert_eq!(task_env(&state(None), 3).unwrap(), vec![("A", "1"), ("CUDA_VISIBLE_DEVICES", "MIG-b")]);
        let err = task_env(&state(Some("GPU 0 has no 7g.80gb profile")), 0).unwrap_err().to_string();
        assert_eq!(err, "job 4 cannot run on this node: GPU 0 has no 7g.80gb profile");
        let unfinished = JobState { status: JobStatus::Preparing, ..state(None) };
        let err = task_env(&unfinished, 0).unwrap_err().to_string();
        assert!(err.contains("did not finish preparing"), "{err}");
    }
}
