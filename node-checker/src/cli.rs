//! The command line of `gpu-mode-node-checker`, in a library so that its man
//! page is generated from the same definition (`gpu-mode-man`).

use clap::{Args, CommandFactory, Parser, Subcommand};
use gpu_mode_core::health::{CHECK_NAMES, Status};
use gpu_mode_core::cli::SiteArgs;
use gpu_mode_core::node_check::CheckOptions;
use std::path::PathBuf;

/// Exit codes (docs/node-checker.md): no check failed (warnings allowed).
pub const EXIT_OK: u8 = 0;
/// A check failed.
pub const EXIT_FAIL: u8 = 1;
/// Usage or config error.
pub const EXIT_USAGE: u8 = 2;
/// The drain or resume could not be applied.
pub const EXIT_ACTION: u8 = 3;

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
    #[command(flatten)]
    pub site: SiteArgs,
    /// Run only this check.
    #[arg(long)]
    pub only: Option<String>,
}

impl CheckArgs {
    /// The check run's options; an unknown `--only` (the message lists the
    /// checks) or a `--node` that is no Slurm node name is a usage error.
    pub fn options(&self) -> Result<CheckOptions, String> {
        if let Some(o) = self.only.as_deref().filter(|o| !CHECK_NAMES.contains(o)) {
            return Err(format!("no check named {o:?}; checks: {}", CHECK_NAMES.join(", ")));
        }
        let node = self.site.explicit_node()?.map(String::from);
        Ok(CheckOptions { deep: self.deep, drain: !self.no_drain, node, only: self.only.clone() })
    }
}

/// A check run's exit code: a drain or resume that failed first, then the
/// worst status (a warning is no failure).
pub fn exit_code(action_failed: bool, status: Status) -> u8 {
    match (action_failed, status) {
        (true, _) => EXIT_ACTION,
        (false, Status::Fail) => EXIT_FAIL,
        _ => EXIT_OK,
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

    /// What a command line comes to: the verb, then the check's options as
    /// `json deep drain node only`, or a verb's config path.
    fn outcome(argv: &[&str]) -> Result<String, String> {
        let cli = Cli::try_parse_from(std::iter::once("gpu-mode-node-checker").chain(argv.iter().copied())).map_err(|e| e.to_string())?;
        let config = |c: Option<PathBuf>| c.map_or("-".into(), |p| p.display().to_string());
        let check = |a: CheckArgs| -> Result<String, String> {
            let o = a.options()?;
            Ok(format!("check json={} deep={} drain={} node={:?} only={:?} config={}", a.json, o.deep, o.drain, o.node, o.only, config(a.site.config)))
        };
        match cli.command {
            None => check(cli.check),
            Some(Command::Check(a)) => check(a),
            Some(Command::Inventory { json, config: c, xid_wait_ms }) => Ok(format!("inventory json={json} wait={xid_wait_ms} config={}", config(c))),
            Some(Command::CheckConfig { config: c }) => Ok(format!("check-config config={}", config(c))),
            Some(Command::Ack { config: c }) => Ok(format!("ack config={}", config(c))),
        }
    }

    #[test]
    fn the_command_line_picks_the_verb_and_its_options() {
        // (argv, the outcome or a part of the usage error)
        let cases: &[(&[&str], Result<&str, &str>)] = &[
            (&[], Ok("check json=false deep=false drain=true node=None only=None config=-")),
            (&["--json", "--no-drain", "--only", "xid"], Ok("check json=true deep=false drain=false node=None only=Some(\"xid\") config=-")),
            (&["check", "--deep", "--node", "n7", "--config", "/etc/gm.toml"], Ok("check json=false deep=true drain=true node=Some(\"n7\") only=None config=/etc/gm.toml")),
            (&["--only", "deep"], Ok("check json=false deep=false drain=true node=None only=Some(\"deep\") config=-")),
            (&["--only", "gpu-count"], Err("no check named \"gpu-count\"; checks: driver, gpu_count, memory")),
            (&["check", "--only", "XID"], Err("no check named \"XID\"")),
            (&["--node", "n7 State=RESUME"], Err("--node \"n7 State=RESUME\" is not a Slurm node name")),
            (&["inventory"], Ok("inventory json=false wait=200 config=-")),
            (&["inventory", "--json", "--xid-wait-ms", "0", "--config", "/c.toml"], Ok("inventory json=true wait=0 config=/c.toml")),
            (&["inventory", "--xid-wait-ms", "soon"], Err("invalid value 'soon' for '--xid-wait-ms <XID_WAIT_MS>'")),
            (&["check-config", "--config", "/c.toml"], Ok("check-config config=/c.toml")),
            (&["ack"], Ok("ack config=-")),
            // The check's flags belong to the check, not to another verb.
            (&["--json", "ack"], Err("the subcommand 'ack' cannot be used with '--json'")),
            (&["ack", "--no-drain"], Err("unexpected argument '--no-drain'")),
            (&["repair"], Err("unrecognized subcommand 'repair'")),
        ];
        for (argv, want) in cases {
            check_row(&format!("{argv:?}"), outcome(argv), want.map(String::from));
        }
    }

    #[test]
    fn a_failed_drain_outranks_a_failed_check_and_warnings_pass() {
        let cases = [
            (false, Status::Ok, EXIT_OK),
            (false, Status::Skipped, EXIT_OK),
            (false, Status::Warn, EXIT_OK),
            (false, Status::Fail, EXIT_FAIL),
            (true, Status::Ok, EXIT_ACTION),
            (true, Status::Fail, EXIT_ACTION),
        ];
        for (action_failed, status, want) in cases {
            assert_eq!(exit_code(action_failed, status), want, "{action_failed} {status:?}");
        }
    }
}
