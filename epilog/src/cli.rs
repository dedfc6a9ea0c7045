//! The command line of `gpu-mode-epilog`. slurmd runs it with no arguments;
//! `--config` is for tests and sites that keep the config elsewhere. The
//! definition is here so that the man page comes from it (`gpu-mode-man`).

use clap::{Arg, Command};
use std::path::PathBuf;

pub fn command() -> Command {
    Command::new("gpu-mode-epilog")
        .version(env!("CARGO_PKG_VERSION"))
        .about("Slurm Epilog= for slurm-gpu-mode: undoes what the prolog did")
        .long_about("Run by slurmd as root (Epilog=) when a job ends. It works from the job state the prolog wrote: stops the job's MPS daemon, restores the compute mode, removes the state, and optionally runs the node checks ([health] after_epilog). A second run finds no state and does nothing. See gpu-mode(8).")
        .arg(
            Arg::new("config")
                .long("config")
                .value_name("PATH")
                .value_parser(clap::value_parser!(PathBuf))
                .help("Site configuration (default /etc/slurm-gpu-mode/config.toml)"),
        )
        .after_long_help(crate::HOOK_NOTES)
}

/// `--config`, if given.
pub fn config(matches: &clap::ArgMatches) -> Option<PathBuf> {
    matches.get_one::<PathBuf>("config").cloned()
}
