//! `gpu-mode-node-checker`'s command line; the checks are `gpu_mode_core::health`.

pub mod cli;
