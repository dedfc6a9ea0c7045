//! Options the admin's tools share (feature `cli`, so the plugin does not
//! link clap): the site config and the Slurm node, with one rule for node
//! names (`drain::is_node_name`), flattened into `gpu-mode-status` and
//! `gpu-mode-node-checker`.

use crate::config::Config;
use std::path::{Path, PathBuf};

/// The site config for an admin tool, its notices (a section that goes in a
/// later release) printed as `program`'s warnings on stderr. The error is
/// the line for stderr; the tool then exits with its usage code.
pub fn load_config(program: &str, path: Option<&Path>) -> Result<Config, String> {
    let cfg = Config::load(path).map_err(|e| format!("{program}: {e}"))?;
    for notice in &cfg.notices {
        crate::log::stderr_line(&format!("{program}: warning: {}: {notice}", cfg.path().display()));
    }
    Ok(cfg)
}

#[derive(clap::Args, Clone, Debug, Default)]
pub struct SiteArgs {
    /// Site configuration (default /etc/slurm-gpu-mode/config.toml).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Slurm node name (letters, digits, -_.); default: this node, as
    /// SLURMD_NODENAME names it.
    #[arg(long)]
    pub node: Option<String>,
}

impl SiteArgs {
    /// The `--node` given, if it could be a Slurm node name: it becomes an
    /// scontrol argument. The error is the usage line.
    pub fn explicit_node(&self) -> Result<Option<&str>, String> {
        crate::drain::explicit_node(self.node.as_deref())
    }
}
