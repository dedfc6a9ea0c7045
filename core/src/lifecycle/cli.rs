//! The command line of `gpu-mode-prolog` and `gpu-mode-epilog` (feature
//! `cli`, so the plugin does not link clap). slurmd runs them with no
//! arguments; `--config` is for tests and sites that keep the config
//! elsewhere. The man pages are rendered from this definition (`gpu-mode-man`).

use super::Verb;
use clap::{Arg, ArgMatches, Command};
use std::path::PathBuf;

/// Environment and exit codes, for `--help` and the man page.
const ENVIRONMENT: &str = "Environment (set by slurmd): SLURM_JOB_ID, SLURM_JOB_UID, SLURM_JOB_GID, SLURM_JOB_USER, \
SLURMD_NODENAME, SLURM_JOB_GPUS, SPANK_GPU_MODE (the job's --gpu-mode, from the SPANK plugin).";

const NODE_FAULT: &str =
    "2 usage error; any other non-zero status is a node fault, after the node was drained with a \"gpu-mode:\" reason.";

pub fn command(verb: Verb) -> Command {
    let (name, about, long, ok) = match verb {
        Verb::Prolog => (
            "gpu-mode-prolog",
            "Slurm Prolog= for slurm-gpu-mode: prepares the job's GPU mode",
            "Run by slurmd as root (Prolog=, with PrologFlags=Alloc) when a job is allocated. For a job submitted \
             with --gpu-mode (SPANK_GPU_MODE in the environment), it maps Slurm's GPU indices to NVML's, prepares \
             the mode (MPS daemon, compute mode; MIG and checkpoint are recorded) and writes the job state that the \
             SPANK plugin applies to every task. Jobs without --gpu-mode are left alone. See gpu-mode(8).",
            "0 the job may run (also when it was refused: its tasks then fail with the reason);",
        ),
        Verb::Epilog => (
            "gpu-mode-epilog",
            "Slurm Epilog= for slurm-gpu-mode: undoes what the prolog did",
            "Run by slurmd as root (Epilog=) when a job ends. It works from the job state the prolog wrote: stops \
             the job's MPS daemon, restores the compute mode, removes the state, and optionally runs the node \
             checks ([health] after_epilog). A second run finds no state and does nothing. See gpu-mode(8).",
            "0 done (or nothing to do);",
        ),
    };
    Command::new(name)
        .about(about)
        .long_about(long)
        .arg(
            Arg::new("config")
                .long("config")
                .value_name("PATH")
                .value_parser(clap::value_parser!(PathBuf))
                .help("Site configuration (default /etc/slurm-gpu-mode/config.toml)"),
        )
        .after_long_help(format!("{ENVIRONMENT}\n\nExit status: {ok} {NODE_FAULT}"))
}

/// `--config`, if given.
pub fn config(matches: &ArgMatches) -> Option<PathBuf> {
    matches.get_one::<PathBuf>("config").cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hook_arguments() {
        let parse = |args: &[&str]| command(Verb::Prolog).try_get_matches_from(std::iter::once("gpu-mode-prolog").chain(args.iter().copied()));
        assert_eq!(config(&parse(&[]).unwrap()), None);
        assert_eq!(config(&parse(&["--config", "/c.toml"]).unwrap()), Some(PathBuf::from("/c.toml")));
        let err = parse(&["--config"]).unwrap_err();
        assert_eq!(err.exit_code(), super::super::EXIT_USAGE);
        assert!(err.to_string().contains("a value is required for '--config <PATH>'"), "{err}");
        assert!(parse(&["-x"]).unwrap_err().to_string().contains("unexpected argument '-x'"));
        assert_eq!(command(Verb::Epilog).get_name(), "gpu-mode-epilog");
    }
}
