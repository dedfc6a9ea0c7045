//! slurm-gpu-mode's shared logic. The prolog, the epilog and the node checker
//! are thin shells over this crate, so unit tests reach everything that
//! decides anything. Its bottom three layers (base helpers, configuration,
//! the job) are the crate `gpu-mode-base`, the devices (NVML, CRIU, the CUDA
//! checkpoint verb) the crate `gpu-mode-devices`, both re-exported here at
//! their old paths; this crate holds the modes, preemption, health,
//! observation and the verbs (docs/architecture.md, "Layers").

pub use gpu_mode_base::{
    command, compute_mode, config, drain, failure, fsutil, gpu_lock, gpu_mode, grant, gres, hostlist, job_env, log, metrics, mps_daemons, persist, privdrop, procfs,
    runtime, signal, signal_state, skipped_prolog, state, submit, watchdog,
};

/// The devices (crate `gpu-mode-devices`), at their old paths.
pub use gpu_mode_devices::{criu, cuda_ckpt, cuda_pattern, gpu};
pub mod health;
#[cfg(feature = "cli")]
pub mod cli;
pub mod lifecycle;
pub use gpu_mode_modes::mig;
/// The node MIG baseline, at its old path (crate::mig::baseline).
pub use mig::baseline as mig_baseline;
pub use gpu_mode_modes::mode_driver;
pub use gpu_mode_modes::modes;
pub mod node_check;
pub mod observe;
/// Checkpoint on preemption (crate `gpu-mode-preempt`), at its old path.
pub use gpu_mode_preempt as preempt;
pub mod status;

pub use config::Config;
/// MPS lives with the other modes; this keeps its old path.
pub use modes::mps;
pub use gpu_mode::GpuMode;
