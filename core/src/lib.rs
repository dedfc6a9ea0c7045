//! slurm-gpu-mode's shared logic. The SPANK plugin, the prolog, the epilog and
//! the node checker are thin shells over this crate, so unit tests reach
//! everything that decides anything.

pub mod checkpoint;
pub mod command;
pub mod config;
pub mod criu;
pub mod drain;
pub mod fsutil;
pub mod gpu;
pub mod gpu_lock;
pub mod gres;
pub mod health;
pub mod hostlist;
pub mod job_env;
pub mod lifecycle;
pub mod log;
pub mod mode;
pub mod mps;
pub mod preempt;
pub mod privdrop;
pub mod procfs;
pub mod state;
pub mod watchdog;

pub use config::Config;
pub use mode::GpuMode;
