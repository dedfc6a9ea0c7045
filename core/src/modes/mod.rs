//! One home per `--gpu-mode`. Each mode is a [`ModeDriver`]: what it checks
//! on this node, what it prepares in the prolog and records in the job state
//! (its [`GrantRecord`]), what the job's tasks get, and how the epilog undoes
//! it. The prolog and epilog ([`crate::lifecycle`]) are loops over a driver
//! and never branch on the mode; the plugin asks the driver what a task gets.
//!
//! Modes sit below the lifecycle: they return [`Failure`] (a leaf) and never
//! import `lifecycle`.
//!
//! * [`mps`]: a per-user, per-GPU-set MPS daemon.
//! * [`mig`]: the job's MIG instances on each of its GPUs.
//! * [`checkpoint`]: checkpoint on preemption, restore on requeue.

pub mod checkpoint;
pub mod mig;
pub mod mps;

pub use crate::failure::Failure;
/// What a mode gave a job is plain data below the modes (crate::grant):
/// the job state and the plugin read it without the modes.
pub use crate::grant::{per_task_value, GrantRecord};

use crate::config::Config;
use crate::gpu::LazyGpus;
use crate::job_env::JobEnv;
use crate::mode::GpuMode;
use std::collections::BTreeMap;
use std::path::Path;

/// What a mode works with in the prolog.
pub struct PrepareCtx<'a> {
    pub cfg: &'a Config,
    pub env: &'a JobEnv,
    /// The job's GPUs as NVML numbers them (never Slurm's indices).
    pub gpus: &'a [u32],
    /// NVML, opened when a mode first needs it.
    pub nvml: &'a LazyGpus<'a>,
}

/// A mode's result in the prolog.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grant {
    pub record: GrantRecord,
    /// Variables every task of the job gets.
    pub task_env: BTreeMap<String, String>,
    /// Variables whose value depends on the task: the task with node-local
    /// id `i` (SLURM_LOCALID) gets `values[i % values.len()]`.
    pub per_task_env: BTreeMap<String, Vec<String>>,
    /// For the prolog's log line.
    pub detail: Option<String>,
}

/// What an epilog step undid.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Released {
    /// Whether there was anything of the job's to undo.
    pub found: bool,
    /// For the epilog's log line.
    pub detail: Option<String>,
}

impl Released {
    pub fn nothing() -> Released {
        Released::default()
    }

    pub fn did(detail: impl Into<String>) -> Released {
        Released { found: true, detail: Some(detail.into()) }
    }
}

/// One mode's lifecycle. Every step that changes the node has its undo:
/// `prepare` undoes its own partial work before it returns an error, and
/// `release`/`release_lost` undo a finished `prepare`, idempotently (twice,
/// after a slurmd restart, after a reboot that emptied /run).
pub trait ModeDriver {
    /// The mode's name in log lines and steps.
    fn name(&self) -> &'static str;

    /// Job refusals only this node can tell, before anything changes
    /// (a layout this node does not define, a profile its GPUs lack).
    fn check(&self, _ctx: &PrepareCtx) -> Result<(), Failure> {
        Ok(())
    }

    /// The prolog's work for the job.
    fn prepare(&self, ctx: &PrepareCtx) -> Result<Grant, Failure>;

    /// Undoes what `grant` records for `job_id`.
    fn release(&self, cfg: &Config, job_id: u32, grant: &GrantRecord) -> Result<Released, Failure>;

    /// Undoes what this mode holds for `job_id` when no grant says what
    /// (the state was lost, or the prolog died half-way): searches the
    /// mode's own records.
    fn release_lost(&self, cfg: &Config, job_id: u32) -> Result<Released, Failure>;

    /// Runs as root in each task process of the job, before privileges are
    /// dropped (the plugin's task_init_privileged). Returns a line for
    /// Slurm's log, if any. Must never fail the task.
    fn task_privileged(&self, _runtime_dir: &Path, _job_id: u32, _grant: &GrantRecord) -> Option<String> {
        None
    }
}

/// The driver for a job's mode (with its parameters).
pub fn driver_for(mode: &GpuMode) -> Box<dyn ModeDriver + '_> {
    match mode {
        GpuMode::Mps(params) => Box::new(mps::MpsDriver { params: Some(params) }),
        GpuMode::Mig(request) => Box::new(mig::MigDriver { request: Some(request) }),
        GpuMode::Checkpoint => Box::new(checkpoint::CheckpointDriver),
    }
}

/// The driver that undoes `grant`; `None` when there is nothing to undo.
pub fn driver_of(grant: &GrantRecord) -> Option<Box<dyn ModeDriver>> {
    match grant {
        GrantRecord::None => None,
        GrantRecord::Mps { .. } => Some(Box::new(mps::MpsDriver { params: None })),
        GrantRecord::Mig(_) => Some(Box::new(mig::MigDriver { request: None })),
        GrantRecord::Checkpoint { .. } => Some(Box::new(checkpoint::CheckpointDriver)),
    }
}

/// Every mode, for the epilog's search when no grant says what a job holds.
pub fn all_drivers() -> Vec<Box<dyn ModeDriver>> {
    vec![
        Box::new(mps::MpsDriver { params: None }),
        Box::new(mig::MigDriver { request: None }),
        Box::new(checkpoint::CheckpointDriver),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_grant_has_its_driver() {
        assert!(driver_of(&GrantRecord::None).is_none());
        assert_eq!(driver_of(&GrantRecord::Mps { daemon: "k".into() }).unwrap().name(), "mps");
        assert_eq!(driver_of(&GrantRecord::Checkpoint { restart_count: 0 }).unwrap().name(), "checkpoint");
        let names: Vec<&str> = all_drivers().iter().map(|d| d.name()).collect();
        assert_eq!(names, ["mps", "mig", "checkpoint"]);
    }
}
