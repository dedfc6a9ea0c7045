//! The command line of `gpu-mode-mig`, in a library so that a man page can
//! be generated from the same definition.

use clap::{Args, CommandFactory, Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "gpu-mode-mig",
    about = "The node's MIG baseline: apply, check, export and plan MIG layouts (mig-parted's config format or [mig.layouts])",
    after_help = "Without -c/-l the baseline is the site config's [mig] baseline. Exit codes: 0 ok, 1 the GPUs differ \
                  (assert) / apply refused or failed / a plan has problems, 2 usage, config or baseline file error, \
                  3 NVML could not be read. Docs: docs/mig.md."
)]
pub struct Cli {
    /// Site configuration (default /etc/slurm-gpu-mode/config.toml).
    #[arg(long, global = true)]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Make the GPUs match the baseline (changes nothing when they do).
    Apply {
        #[command(flatten)]
        baseline: Choice,
        /// Run as gpu-mode-mig-baseline.service does at boot: start stopped
        /// services without waiting (--no-block), drain the node with a
        /// "gpu-mode: MIG baseline ..." reason on failure, resume it from that
        /// reason on success, and succeed when no baseline is configured.
        #[arg(long)]
        boot: bool,
        /// Slurm node name for the drain (default: SLURMD_NODENAME, else the short host name).
        #[arg(long)]
        node: Option<String>,
    },
    /// Exit 0 when the GPUs match the baseline, 1 (saying how) when not. Read-only.
    Assert {
        #[command(flatten)]
        baseline: Choice,
    },
    /// Print what apply would do: mode changes, placements, services. Read-only.
    Plan {
        #[command(flatten)]
        baseline: Choice,
        /// Plan every config of the file (or every [mig.layouts] layout).
        #[arg(long, conflicts_with = "layout")]
        all: bool,
    },
    /// What the prolog would do for a job asking --gpu-mode=mig:<layout>,
    /// on each GPU (or the refusal the job would get), changing nothing.
    /// Read-only; MIG mode may be off (it plans as `mig_mode = "switch"`).
    JobPlan {
        /// The job's values, e.g. mig:3g.40gbx2 or mig:@half.
        #[arg(required = true)]
        values: Vec<String>,
    },
    /// Print the GPUs' current layout as a mig-parted config. Read-only.
    Export {
        /// The config's name in the output.
        #[arg(long, default_value = "current")]
        name: String,
    },
}

#[derive(Args, Clone, Default)]
pub struct Choice {
    /// A mig-parted config file (version: v1, mig-configs:).
    #[arg(short = 'c', long = "config-file", value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// The config in it to use, or @NAME for a [mig.layouts] layout.
    #[arg(short = 'l', long = "layout", value_name = "NAME")]
    pub layout: Option<String>,
}

/// The clap command, for the man page.
pub fn command() -> clap::Command {
    Cli::command()
}
