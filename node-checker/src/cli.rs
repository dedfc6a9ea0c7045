//! The command line of `gpu-mode-node-checker`, in a library so that its man
//! page is generated from the same definition (`gpu-mode-man`).

use clap::{Args, CommandFactory, Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "gpu-mode-node-checker", about = "GPU health checks; drains and resumes the Slurm node", args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub check: CheckArgs,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the checks (the default).
    Check(CheckArgs),
    /// Print the GPUs' inventory, modes and health readings (read-only).
    Inventory {
        #[arg(long)]
        json: bool,
        #[arg(long)]
        config: Option<PathBuf>,
        /// How long to listen for XID events.
        #[arg(long, default_value_t = 200)]
        xid_wait_ms: u64,
    },
    /// Load the site configuration and report whether it is valid (exit 0,
    /// or 2 naming the problem). Touches no GPU: for config management,
    /// e.g. Ansible's template validate.
    CheckConfig {
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// After a repair: forget this boot's XIDs, accept the current ECC counts.
    Ack {
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

#[derive(Args, Clone, Default)]
pub struct CheckArgs {
    /// JSON instead of a table (schema: docs/node-checker.md).
    #[arg(long)]
    pub json: bool,
    /// Also run the CUDA checks on idle GPUs.
    #[arg(long)]
    pub deep: bool,
    /// Report only; never drain or resume.
    #[arg(long)]
    pub no_drain: bool,
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Slurm node name (default: SLURMD_NODENAME).
    #[arg(long)]
    pub node: Option<String>,
    /// Run only this check.
    #[arg(long)]
    pub only: Option<String>,
}

/// The clap command, for the man page.
pub fn command() -> clap::Command {
    Cli::command()
}
