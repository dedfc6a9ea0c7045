//! The `gpu_mode` SPANK plugin. This file only routes each callback by context
//! (as pyxis does): option handling lives in `options`, plugstack arguments in
//! `args`, submit-side work (srun, sbatch, salloc) in `local`, and
//! slurmstepd-side work in `remote`. Every callback runs inside
//! slurm-spank's `catch_unwind`, so a panic becomes an error return, never an
//! unwind across the FFI boundary into srun or slurmstepd.

pub mod args;
pub mod local;
pub mod options;
pub mod remote;

use slurm_spank::{spank_log, Context, LogLevel, Plugin, SpankHandle, SPANK_PLUGIN};
use std::error::Error;

// 0x160500: built for Slurm 22.05; Slurm checks major.minor only.
SPANK_PLUGIN!(b"gpu_mode", 0x160500, GpuModePlugin);

#[derive(Default)]
struct GpuModePlugin {
    args: args::PluginArgs,
    /// Found as root in task_init_privileged, applied in task_init: both
    /// run in the same forked task process.
    pending: remote::Pending,
}

unsafe impl Plugin for GpuModePlugin {
    fn init(&mut self, spank: &mut SpankHandle) -> Result<(), Box<dyn Error>> {
        self.args = args::PluginArgs::parse(&spank.plugin_argv()?)?;
        match spank.context()? {
            Context::Local | Context::Allocator | Context::Remote => options::register(spank),
            Context::Slurmd | Context::JobScript => Ok(()),
        }
    }

    fn init_post_opt(&mut self, spank: &mut SpankHandle) -> Result<(), Box<dyn Error>> {
        match spank.context()? {
            Context::Local | Context::Allocator => local::init_post_opt(spank, &self.args),
            _ => Ok(()),
        }
    }

    /// Runs as root in each task process after fork: reads the root-only
    /// job state. Never fails the task itself: errors wait for task_init.
    fn task_init_privileged(&mut self, spank: &mut SpankHandle) -> Result<(), Box<dyn Error>> {
        if let Context::Remote = spank.context()? {
            self.pending = remote::task_init_privileged(spank, &self.args).unwrap_or_else(|e| remote::Pending::Fail(e.to_string()));
        }
        Ok(())
    }

    /// Runs in each task process before exec. A failure here ends only that
    /// task (exit 1), which is how a refused job must fail: the same failure
    /// in user_init is a batch launch failure, and Slurm drains the node for it.
    fn task_init(&mut self, spank: &mut SpankHandle) -> Result<(), Box<dyn Error>> {
        match spank.context()? {
            Context::Remote => remote::task_init(spank, &self.pending),
            _ => Ok(()),
        }
    }

    /// slurm-spank's default installs a global tracing subscriber; we log
    /// through Slurm directly and keep srun free of that work.
    fn setup(&self, _spank: &mut SpankHandle) -> Result<(), Box<dyn Error>> {
        Ok(())
    }

    /// Errors go through slurm_error, which srun/sbatch/salloc print as
    /// `error: ...` and slurmstepd writes to the job's stderr and slurmd's log.
    fn report_error(&self, error: &dyn Error) {
        spank_log(LogLevel::Error, &format!("gpu-mode: {error}"));
    }
}
