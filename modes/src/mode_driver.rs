//! The interface of a `--gpu-mode`: what a mode checks, prepares, records
//! and undoes ([`ModeDriver`]), with what it works with and returns. Below
//! the modes (crate::modes), which implement it, and the lifecycle, which
//! loops over it.

use crate::config::Config;
use crate::failure::Failure;
use crate::gpu::LazyGpus;
use crate::grant::GrantRecord;
use crate::job_env::JobEnv;
use std::collections::BTreeMap;

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
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Grant {
    pub record: GrantRecord,
    /// Variables every task of the job gets.
    pub task_env: BTreeMap<String, String>,
    /// Variables whose value depends on the task: the task with node-local
    /// id `i` (SLURM_LOCALID) gets `values[i % values.len()]`.
    pub per_task_env: BTreeMap<String, Vec<String>>,
    /// For the prolog's log line.
    pub detail: Option<String>,
    /// What the mode did, for the node's metrics: the verb that runs the
    /// mode records them (modes never write the metrics themselves).
    pub events: Vec<crate::metrics::Event>,
}

/// What an epilog step undid.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Released {
    /// Whether there was anything of the job's to undo.
    pub found: bool,
    /// For the epilog's log line.
    pub detail: Option<String>,
    /// As [`Grant::events`].
    pub events: Vec<crate::metrics::Event>,
}

impl Released {
    pub fn nothing() -> Released {
        Released::default()
    }

    pub fn did(detail: impl Into<String>) -> Released {
        Released { found: true, detail: Some(detail.into()), events: Vec::new() }
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
}
