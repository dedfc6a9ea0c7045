//! The command line of `gpu-mode-prolog`. slurmd runs it with no arguments;
//! `--config` is for tests and sites that keep the config elsewhere. The
//! definition is here so that the man page comes from it (`gpu-mode-man`).

use clap::{Arg, Command};
use std::path::PathBuf;

pub fn command() -> Command {
    Command::new("gpu-mode-prolog")
        .version(env!("CARGO_PKG_VERSION"))
        .about("Slurm Prolog= for slurm-gpu-mode: prepares the job's GPU mode")
        .long_about("Run by slurmd as root (Prolog=, with PrologFlags=Alloc) when a job is allocated. For a job submitted with --gpu-mode (SPANK_GPU_MODE in the environment), it maps Slurm's GPU indices to NVML's, prepares the mode (MPS daemon, compute mode; MIG and checkpoint are recorded) and writes the job state that the SPANK plugin applies to every task. Jobs without --gpu-mode are left alone. See gpu-mode(8).")
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
