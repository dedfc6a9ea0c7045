//! A simulated libnvidia-ml. Built as a cdylib, it exports the NVML C functions
//! that slurm-gpu-mode's GPU layer calls, with NVML's signatures and return
//! codes, so the production code path (nvml-wrapper loading a libnvidia-ml)
//! runs unchanged on machines without GPUs: point the site config's
//! `[nvml] library` at `libnvml_sim.so`.
//!
//! The node lives in a JSON state file (`GPU_MODE_SIM_STATE`) shared by all
//! processes under an flock; it is created from a TOML node fixture
//! (`GPU_MODE_SIM_FIXTURE`, see `fixtures/`). `nvml-sim-ctl` injects faults
//! into it, adds processes and resets GPUs.

pub mod api;
pub mod model;
pub mod store;

pub use model::{Fault, NodeState};

/// Directory of the fixtures shipped with this crate.
pub fn fixtures_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}
