//! `gpu-mode-status`'s command line; the logic is `gpu_mode_core::status`.

pub mod cli;
