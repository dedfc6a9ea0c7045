//! slurm-gpu-mode's devices, one module each, on top of `gpu-mode-base` and
//! below everything that decides what to do with them (`gpu-mode-core`: the
//! modes, preemption, health, the verbs; docs/architecture.md, "Crates"):
//!
//! * [`gpu`]: the node's GPUs through NVML (inventory, modes, MIG, health
//!   readings, Slurm's GPU indices), behind the `GpuOps` trait;
//! * [`criu`]: the CRIU binary (its version, checks, command lines, cgroups);
//! * [`cuda_ckpt`]: the CUDA driver's checkpoint verb on a job's processes;
//! * [`cuda_pattern`]: the memory test pattern kernels (deep check, test program).
//!
//! Cargo keeps this crate from reaching up: it cannot name a mode, the
//! preemption machinery or a verb.

// The base modules at the paths these files name them by (`crate::fsutil`),
// not re-exported: gpu-mode-core re-exports base itself.
use gpu_mode_base::{command, config, fsutil, gres, job_env, persist, privdrop, procfs, runtime, watchdog, Config};
#[cfg(test)]
use gpu_mode_base::drain;

pub mod criu;
pub mod cuda_ckpt;
pub mod cuda_pattern;
pub mod gpu;
