//! The command line of `gpu-mode-cuda-ckpt`, in the library so that its
//! man page is generated from the same definition (`gpu-mode-man`).

use clap::{Args, CommandFactory, Parser, Subcommand};
use gpu_mode_core::cuda_ckpt::Target;
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "gpu-mode-cuda-ckpt", about = "CUDA checkpoint/restore of a process or a Slurm job's processes")]
pub struct Cli {
    /// Site configuration (default /etc/slurm-gpu-mode/config.toml).
    #[arg(long, global = true)]
    pub config: Option<PathBuf>,
    /// Print the report as JSON on stdout.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub verb: Verb,
}

#[derive(Subcommand)]
pub enum Verb {
    /// Lock, then checkpoint every process (GPU memory moves to host memory).
    Checkpoint(Which),
    /// Restore every process (optionally onto other GPUs), then unlock.
    Restore {
        #[command(flatten)]
        which: Which,
        /// OLD_UUID=NEW_UUID,... (GPU-… UUIDs; every checkpointed GPU must be mapped).
        #[arg(long)]
        device_map: Option<String>,
    },
    /// Each process's checkpoint state.
    State(Which),
}

#[derive(Args)]
#[group(required = true, multiple = false)]
pub struct Which {
    /// A process (with its descendants); repeat for several.
    #[arg(long, num_args = 1..)]
    pub pid: Vec<i32>,
    /// Every process of this Slurm job on this node.
    #[arg(long)]
    pub job: Option<u32>,
}

impl Which {
    pub fn target(&self) -> Target {
        match self.job {
            Some(job) => Target::Job(job),
            None => Target::Pids(self.pid.clone()),
        }
    }
}

/// The clap command, for the man page.
pub fn command() -> clap::Command {
    Cli::command()
}
