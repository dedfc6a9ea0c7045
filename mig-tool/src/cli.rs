//! The command line of `gpu-mode-mig`, in a library so that a man page can
//! be generated from the same definition.

use clap::{Args, CommandFactory, Parser, Subcommand};
use gpu_mode_core::gpu_mode::{GpuMode, MigRequest};
use std::path::PathBuf;

/// Exit codes (the help's after_help): the GPUs differ (assert), apply
/// refused or failed, a plan has problems.
pub const EXIT_DIFFERS: u8 = 1;
/// Usage, config or baseline file error.
pub const EXIT_USAGE: u8 = 2;
/// NVML could not be read.
pub const EXIT_NVML: u8 = 3;

/// The `reason` label of the drain a failed boot apply sets
/// (`gpu_mode_drains_total{source="mig-baseline"}`): the failure's class,
/// as its exit code says, never words of its message.
pub fn drain_label(exit_code: u8) -> &'static str {
    match exit_code {
        EXIT_USAGE => "config",
        EXIT_NVML => "nvml",
        _ => "apply",
    }
}

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

impl Command {
    /// Whether a site config that does not load stops the verb before it
    /// starts: every verb but apply, which at boot must still drain the
    /// node saying why (it fails later with the same error).
    pub fn stops_on_config_error(&self) -> bool {
        !matches!(self, Command::Apply { .. })
    }
}

/// A `job-plan` value: a `--gpu-mode=mig:` value as the job would give it;
/// any other mode, or no valid mode, is a usage error.
pub fn job_request(value: &str) -> Result<MigRequest, String> {
    match GpuMode::parse(value) {
        Ok(GpuMode::Mig(r)) => Ok(r),
        Ok(_) => Err(format!("{value}: not a mig: value")),
        Err(e) => Err(e.to_string()),
    }
}

/// The clap command, for the man page.
pub fn command() -> clap::Command {
    Cli::command()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_mode_testkit::table::check_row;

    #[test]
    fn a_failed_apply_drains_with_its_class_as_the_label() {
        for (code, label) in [(EXIT_DIFFERS, "apply"), (EXIT_USAGE, "config"), (EXIT_NVML, "nvml")] {
            assert_eq!(drain_label(code), label, "exit code {code}");
        }
    }

    /// A command line as main reads it: the verb and what it acts on.
    fn outcome(argv: &[&str]) -> Result<String, String> {
        let cli = Cli::try_parse_from(std::iter::once("gpu-mode-mig").chain(argv.iter().copied())).map_err(|e| e.to_string())?;
        let config = cli.config.map_or("-".into(), |p| p.display().to_string());
        let choice = |c: Choice| format!("file={} layout={}", c.file.map_or("-".into(), |p| p.display().to_string()), c.layout.unwrap_or("-".into()));
        let stops = cli.command.stops_on_config_error();
        let verb = match cli.command {
            Command::Apply { baseline, boot, node } => format!("apply {} boot={boot} node={node:?}", choice(baseline)),
            Command::Assert { baseline } => format!("assert {}", choice(baseline)),
            Command::Plan { baseline, all } => format!("plan {} all={all}", choice(baseline)),
            Command::JobPlan { values } => format!("job-plan {}", values.join(" ")),
            Command::Export { name } => format!("export name={name}"),
        };
        Ok(format!("{verb} config={config} stops={stops}"))
    }

    #[test]
    fn the_command_line_picks_the_verb_and_its_baseline() {
        // (argv, the outcome or a part of the usage error)
        let cases: &[(&[&str], Result<&str, &str>)] = &[
            (&["apply"], Ok("apply file=- layout=- boot=false node=None config=- stops=false")),
            (&["apply", "--boot", "--node", "gpu07"], Ok("apply file=- layout=- boot=true node=Some(\"gpu07\") config=- stops=false")),
            (&["assert", "-c", "/etc/mig.yaml", "-l", "all-1g"], Ok("assert file=/etc/mig.yaml layout=all-1g config=- stops=true")),
            // --config is global: before or after the verb.
            (&["--config", "/a.toml", "plan", "-l", "@half"], Ok("plan file=- layout=@half all=false config=/a.toml stops=true")),
            (&["plan", "--all", "--config", "/a.toml"], Ok("plan file=- layout=- all=true config=/a.toml stops=true")),
            (&["plan", "--all", "-l", "half"], Err("the argument '--all' cannot be used with '--layout <NAME>'")),
            (&["job-plan", "mig:3g.40gbx2", "mig:@half"], Ok("job-plan mig:3g.40gbx2 mig:@half config=- stops=true")),
            (&["job-plan"], Err("the following required arguments were not provided")),
            (&["export"], Ok("export name=current config=- stops=true")),
            (&["export", "--name", "boot"], Ok("export name=boot config=- stops=true")),
            (&["export", "-l", "x"], Err("unexpected argument '-l'")),
            (&["assert", "--boot"], Err("unexpected argument '--boot'")),
            (&[], Err("Usage: gpu-mode-mig [OPTIONS] <COMMAND>")),
        ];
        for (argv, want) in cases {
            check_row(&format!("{argv:?}"), outcome(argv), want.map(String::from));
        }
    }

    #[test]
    fn job_plan_takes_mig_values_only() {
        let cases: &[(&str, Result<&str, &str>)] = &[
            ("mig:3g.40gbx2", Ok("mig:3g.40gbx2")),
            ("mig:@half", Ok("mig:@half")),
            ("mps", Err("mps: not a mig: value")),
            ("checkpoint", Err("checkpoint: not a mig: value")),
            ("mig:", Err("mig:")),
            ("3g.40gb", Err("unknown mode \"3g.40gb\"")),
        ];
        for (value, want) in cases {
            check_row(value, job_request(value).map(|r| GpuMode::Mig(r).to_string()), want.map(String::from));
        }
    }
}
