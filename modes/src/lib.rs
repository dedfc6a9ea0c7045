//! slurm-gpu-mode's modes, over the devices and preemption and below health,
//! observation and the verbs (docs/architecture.md, "Crates"): the interface
//! a mode implements ([`mode_driver`], layer L3), one module per mode behind
//! it ([`modes`]: MPS, checkpoint, the dispatch; `modes::mig` is [`mig`]'s
//! per-job mode) and MIG as one domain ([`mig`]: placement, layouts, journal,
//! the per-job mode, the node baseline).
//!
//! Cargo keeps this crate from reaching up: it cannot name the node checks,
//! the metrics' rendering, the admin's status or the prolog and epilog.

// The base, device and preemption modules at the paths these files name them
// by (`crate::fsutil`), not re-exported: gpu-mode-core re-exports them itself.
use gpu_mode_base::{
    command, config, drain, failure, fsutil, gpu_lock, gpu_mode, grant, job_env, log, metrics, persist, privdrop, procfs, runtime,
    state, watchdog,
};
use gpu_mode_devices::{cuda_ckpt, gpu};
use gpu_mode_preempt as preempt;

pub mod mig;
pub mod mode_driver;
pub mod modes;

/// MPS, at the path the other modes name it by.
pub use modes::mps;
