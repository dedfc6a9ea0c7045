//! A simulated CUDA checkpoint driver, for CI machines without GPUs.
//!
//! As a cdylib (`libcuda_sim.so`) it exports what
//! `gpu_mode_core::cuda_ckpt::CudaDriver` loads from libcuda: cuInit,
//! cuDriverGetVersion, cuGetErrorName/String and the six
//! cuCheckpointProcess* calls, with the driver's states, rules and error
//! codes. As an rlib it is the process side: a program that links it
//! ([`process::Context`], e.g. `cuda-sim-counter`) holds "device memory" that
//! a checkpoint really moves into host memory and a restore puts back,
//! possibly onto another GPU. The GPUs are the NVML simulation's
//! (`GPU_MODE_SIM_STATE`), whose process list shows the memory in use.
//!
//! Processes and callers meet in a shared directory (`files.rs`); faults are
//! injected with `cuda-sim-ctl`. A checkpointed simulated process holds no
//! device file and no open descriptor of the simulation, so CRIU can dump it.

pub mod api;
pub mod codes;
pub mod files;
pub mod gpus;
pub mod process;
