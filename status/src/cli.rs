//! The command line of `gpu-mode-status`, in a library so that its man page
//! is generated from the same definition (`gpu-mode-man`).

use clap::{CommandFactory, Parser};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "gpu-mode-status",
    about = "What slurm-gpu-mode has on this node: each GPU with its jobs and modes, MPS daemons, MIG instances, checkpoint agents, images kept and why, the last drain it set",
    after_long_help = "Reads only: the runtime directory's records, NVML and `scontrol show node`. Run as root (the records are root's).\n\n\
Exit codes: 0 nothing needs the admin; 1 something does (listed under PROBLEMS: the node drained with a gpu-mode: reason, an MPS daemon, MIG journal or agent socket that outlived its job, a prolog that never finished, NVML or a GPU unreadable, an unreadable record); 2 usage or config error.\n\n\
JSON schema: docs/admin.md."
)]
pub struct Cli {
    /// JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Slurm node name (default: SLURMD_NODENAME, else the short host name).
    #[arg(long)]
    pub node: Option<String>,
}

pub fn command() -> clap::Command {
    Cli::command()
}
