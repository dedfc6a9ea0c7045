//! `gpu-mode-mig`'s command line; the logic is `gpu_mode_core::mig_baseline`.

pub mod cli;
