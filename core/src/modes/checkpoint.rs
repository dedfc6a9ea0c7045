//! `--gpu-mode=checkpoint`: checkpoint on preemption, restore on requeue.
//! Today the prolog only records the mode (tasks see `SLURM_GPU_MODE`);
//! the checkpoint agent and image cleanup slot in here.

use crate::config::Config;
use crate::failure::Failure;
use crate::modes::{Grant, GrantRecord, ModeDriver, PrepareCtx, Released};

pub struct CheckpointDriver;

impl ModeDriver for CheckpointDriver {
    fn name(&self) -> &'static str {
        "checkpoint"
    }

    fn prepare(&self, _ctx: &PrepareCtx) -> Result<Grant, Failure> {
        Ok(Grant { record: GrantRecord::Checkpoint, ..Grant::default() })
    }

    fn release(&self, _cfg: &Config, _job_id: u32, _grant: &GrantRecord) -> Result<Released, Failure> {
        Ok(Released::nothing())
    }

    fn release_lost(&self, _cfg: &Config, _job_id: u32) -> Result<Released, Failure> {
        Ok(Released::nothing())
    }
}
