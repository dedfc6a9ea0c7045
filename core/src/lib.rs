//! slurm-gpu-mode's shared logic. The SPANK plugin, the prolog, the epilog and
//! the node checker are thin shells over this crate, so unit tests reach
//! everything that decides anything.

pub mod cgroup;
pub mod checkpoint;
pub mod command;
pub mod config;
pub mod criu;
pub mod drain;
pub mod failure;
pub mod fsutil;
pub mod gpu;
pub mod gpu_lock;
pub mod grant;
pub mod gres;
pub mod health;
pub mod hostlist;
pub mod job_env;
pub mod lifecycle;
pub mod log;
pub mod metrics;
pub mod mig_baseline;
pub mod mode;
pub mod mode_driver;
pub mod modes;
pub mod node_check;
pub mod observe;
pub mod persist;
pub mod preempt;
pub mod privdrop;
pub mod procfs;
pub mod runtime;
pub mod signal;
pub mod signal_state;
pub mod skipped_prolog;
pub mod state;
pub mod submit;
pub mod status;
pub mod watchdog;

pub use config::Config;
/// MPS lives with the other modes; this keeps its old path.
pub use modes::mps;
pub use mode::GpuMode;
