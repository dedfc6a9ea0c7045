//! The command line of `gpu-mode-status`, in a library so that its man page
//! is generated from the same definition (`gpu-mode-man`).

use clap::{CommandFactory, Parser};
use gpu_mode_core::cli::SiteArgs;

#[derive(Parser)]
#[command(
    name = "gpu-mode-status",
    about = "What slurm-gpu-mode has on this node: each GPU with its jobs and modes, MPS daemons, MIG instances, checkpoint agents, images kept and why, the last drain it set",
    after_long_help = "Reads only: the runtime directory's records, NVML and `scontrol show node`. Run as root (the records are root's). \
The node: --node, else SLURMD_NODENAME, else the short host name.\n\n\
Exit codes: 0 nothing needs the admin; 1 something does (listed under PROBLEMS: the node drained with a gpu-mode: reason, an MPS daemon, MIG journal or agent socket that outlived its job, a prolog that never finished, NVML or a GPU unreadable, an unreadable record); 2 usage or config error.\n\n\
JSON schema: docs/admin.md."
)]
pub struct Cli {
    /// JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// `--config`, `--node` (this tool's fallback to the short host name is
    /// in the long help).
    #[command(flatten)]
    pub site: SiteArgs,
}

pub fn command() -> clap::Command {
    Cli::command()
}

impl Cli {
    /// The `--node` given, checked (`SiteArgs::explicit_node`).
    pub fn explicit_node(&self) -> Result<Option<&str>, String> {
        self.site.explicit_node()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_mode_testkit::table::check_row;

    /// What main acts on: (json, config, node) or the usage error's part.
    type Outcome = Result<(bool, Option<&'static str>, Option<&'static str>), &'static str>;

    fn parse(argv: &[&str]) -> Result<(bool, Option<String>, Option<String>), String> {
        let cli = Cli::try_parse_from(std::iter::once("gpu-mode-status").chain(argv.iter().copied())).map_err(|e| e.to_string())?;
        let node = cli.explicit_node()?.map(String::from);
        Ok((cli.json, cli.site.config.map(|p| p.display().to_string()), node))
    }

    #[test]
    fn the_command_line_decides_output_config_and_node() {
        let cases: &[(&[&str], Outcome)] = &[
            (&[], Ok((false, None, None))),
            (&["--json"], Ok((true, None, None))),
            (&["--config", "/etc/gm.toml", "--node", "gpu-01.a_b"], Ok((false, Some("/etc/gm.toml"), Some("gpu-01.a_b")))),
            (&["--node", "gpu 01"], Err("--node \"gpu 01\" is not a Slurm node name")),
            (&["--node", "n1;reboot"], Err("--node \"n1;reboot\" is not a Slurm node name")),
            (&["--node", ""], Err("--node \"\" is not a Slurm node name")),
            (&["--verbose"], Err("unexpected argument '--verbose'")),
            (&["--config"], Err("a value is required for '--config <CONFIG>'")),
        ];
        for (argv, want) in cases {
            let want = want.map(|(json, config, node)| (json, config.map(String::from), node.map(String::from)));
            check_row(&format!("{argv:?}"), parse(argv), want);
        }
    }
}
