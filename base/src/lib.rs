//! The bottom three layers of slurm-gpu-mode (docs/architecture.md, "Layers"),
//! a crate of their own so that Cargo keeps them from reaching up:
//!
//! * base: file, process and privilege helpers (`fsutil`, `command`,
//!   `procfs`, `privdrop`, `runtime`, `persist`, `gpu_lock`,
//!   `watchdog`), the option grammar (`gpu_mode`: what `--gpu-mode` may say), drains (`drain`,
//!   `skipped_prolog`), failures (`failure`), signal names and the
//!   application's signal state (`signal`, `signal_state`);
//! * configuration: `config` (plain sections) and `log`;
//! * the job: its environment (`job_env`, `gres`), its state (`state`), what a
//!   mode gave it (`grant`), the checkpoint submission check (`submit`) and
//!   the metric families and events (`metrics`); the MPS daemons' records and
//!   the task step that moves a job's daemon into its cgroup (`mps_daemons`,
//!   with that cgroup work in `mps_daemons::cgroup`), and the GPU compute mode
//!   those records keep (`compute_mode`).
//!
//! `gpu-mode-core` re-exports every module at its old path.

pub mod command;
pub mod compute_mode;
pub mod config;
pub mod drain;
pub mod failure;
pub mod fsutil;
pub mod gpu_lock;
pub mod gpu_mode;
pub mod grant;
pub mod gres;
pub mod hostlist;
pub mod job_env;
pub mod log;
pub mod metrics;
pub mod mps_daemons;
pub mod persist;
pub mod privdrop;
pub mod procfs;
pub mod runtime;
pub mod signal;
pub mod signal_state;
pub mod skipped_prolog;
pub mod state;
pub mod submit;
pub mod watchdog;

pub use config::Config;
pub use gpu_mode::GpuMode;
