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
/// The MIG mode: the MIG domain's per-job part (crate::mig::job).
pub use crate::mig::job as mig;
pub mod mps;

pub use crate::failure::Failure;
/// What a mode gave a job is plain data below the modes (crate::grant):
/// the job state and the plugin read it without the modes.
pub use crate::grant::{per_task_value, GrantRecord};
/// The interface every mode implements (crate::mode_driver), below them.
pub use crate::mode_driver::{Grant, ModeDriver, PrepareCtx, Released};

use crate::gpu_mode::GpuMode;

/// The driver for a job's mode (with its parameters).
pub fn driver_for(mode: &GpuMode) -> Box<dyn ModeDriver + '_> {
    match mode {
        GpuMode::Mps(params) => Box::new(mps::MpsDriver { params: Some(params) }),
        GpuMode::Mig(request) => Box::new(mig::MigDriver { request: Some(request) }),
        GpuMode::Checkpoint(params) => Box::new(checkpoint::CheckpointDriver { params: Some(params) }),
    }
}

/// The driver that undoes `grant`; `None` when there is nothing to undo.
pub fn driver_of(grant: &GrantRecord) -> Option<Box<dyn ModeDriver>> {
    match grant {
        GrantRecord::None => None,
        GrantRecord::Mps { .. } => Some(Box::new(mps::MpsDriver { params: None })),
        GrantRecord::Mig(_) => Some(Box::new(mig::MigDriver { request: None })),
        GrantRecord::Checkpoint { .. } => Some(Box::new(checkpoint::CheckpointDriver { params: None })),
    }
}

/// Every mode, for the epilog's search when no grant says what a job holds.
pub fn all_drivers() -> Vec<Box<dyn ModeDriver>> {
    vec![
        Box::new(mps::MpsDriver { params: None }),
        Box::new(mig::MigDriver { request: None }),
        Box::new(checkpoint::CheckpointDriver { params: None }),
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
