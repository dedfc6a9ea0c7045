//! Submit side: srun (local context), sbatch and salloc (allocator context).
//! Validates the value before the job is queued and hands it to the node side
//! through the job control environment (the Prolog/Epilog see SPANK_GPU_MODE).
//! No I/O here for most jobs: srun must never wait on us. A checkpoint
//! submission alone reads the command line, the batch script's `#SBATCH`
//! lines and the site config's `[preempt]` section.

use crate::args::PluginArgs;
use crate::options;
use gpu_mode_base::job_env::{JOB_CONTROL_VAR, JOB_MODE_VAR};
use gpu_mode_base::gpu_mode::{CheckpointParams, GpuMode};
use crate::spank::{Context, Spank};
use std::error::Error;

pub fn init_post_opt(spank: &mut Spank, args: &PluginArgs) -> Result<(), Box<dyn Error>> {
    let Some(value) = options::gpu_mode_value(spank)? else {
        return Ok(());
    };
    let mode = options::validate(&value)?;
    let in_allocation = spank.context()? == Context::Local && std::env::var_os("SLURM_JOB_ID").is_some();
    if in_allocation {
        // A step of an existing job: the prolog already ran with the job's mode.
        let job_mode = std::env::var(JOB_MODE_VAR).ok();
        return check_step_mode(&mode, job_mode.as_deref()).map_err(Into::into);
    }
    if let GpuMode::Checkpoint(params) = &mode {
        for advice in checkpoint_submission(args, params)? {
            gpu_mode_base::log::stderr_line(&advice);
        }
    }
    spank.job_control_setenv(JOB_CONTROL_VAR, mode.to_string(), true)?;
    Ok(())
}

/// A checkpoint job must be requeued and signalled on preemption, or its
/// checkpoint is useless: checked before the job is queued, with the exact
/// sbatch line to use (gpu_mode_base::submit); and its `nccl=` and `pool=`
/// must be ones the site allows (`preempt.nccl_portable`,
/// `preempt.host_pool`; the prolog checks again with the node's config).
fn checkpoint_submission(args: &PluginArgs, params: &CheckpointParams) -> Result<Vec<String>, String> {
    use gpu_mode_base::submit::{checkpoint_submit_check, script_path, SubmitSite};
    let argv: Vec<String> = std::fs::read("/proc/self/cmdline")
        .map(|b| b.split(|c| *c == 0).filter(|w| !w.is_empty()).map(|w| String::from_utf8_lossy(w).into_owned()).collect())
        .unwrap_or_default();
    let env: std::collections::BTreeMap<String, String> = std::env::vars().collect();
    // The script's #SBATCH lines count too; a large file is not a script.
    let script = script_path(&argv).and_then(|p| {
        use std::io::Read;
        let mut text = String::new();
        std::fs::File::open(p).ok()?.take(1 << 20).read_to_string(&mut text).ok()?;
        Some(text)
    });
    let site = gpu_mode_base::Config::load_or_salvage(args.config.as_deref()).0.preempt;
    site.nccl_transport(params.nccl)?;
    site.host_pool(params.pool)?;
    checkpoint_submit_check(&argv, &env, script.as_deref(), &SubmitSite::from_config(&site))
}

/// The mode is per job. A step may repeat the job's mode (srun inherits it
/// through the environment inside sbatch) but not change or add one.
pub fn check_step_mode(step: &GpuMode, job_value: Option<&str>) -> Result<(), String> {
    let job = job_value.map(GpuMode::parse).transpose().ok().flatten();
    match job {
        Some(job) if &job == step => Ok(()),
        Some(job) => Err(format!(
            "--gpu-mode={step} differs from this job's --gpu-mode={job}: the mode is set per job, at sbatch/salloc/srun allocation time"
        )),
        None => Err(format!(
            "--gpu-mode={step} was given to a step of a job allocated without --gpu-mode: give it to sbatch/salloc (or a standalone srun) instead"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_may_repeat_but_not_change_the_job_mode() {
        let mps = GpuMode::parse("mps:threads=5").unwrap();
        assert!(check_step_mode(&mps, Some("mps:threads=5")).is_ok());
        let err = check_step_mode(&mps, Some("checkpoint")).unwrap_err();
        assert!(err.contains("differs from this job's --gpu-mode=checkpoint"), "{err}");
        let err = check_step_mode(&mps, None).unwrap_err();
        assert!(err.contains("allocated without --gpu-mode"), "{err}");
    }
}
