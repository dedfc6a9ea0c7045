//! `gpu-mode-status`: one screen for the admin (docs/admin.md). Thin: the
//! gathering and rendering are `gpu_mode_core::status`.

use clap::Parser;
use gpu_mode_core::log::stderr_line;
use gpu_mode_core::drain::node_name;
use gpu_mode_core::status::{gather, EXIT_USAGE};
use gpu_mode_status::cli::Cli;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let cfg = match gpu_mode_core::cli::load_config("gpu-mode-status", cli.site.config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            stderr_line(&e);
            return ExitCode::from(EXIT_USAGE as u8);
        }
    };
    let node = match cli.explicit_node() {
        Ok(n) => node_name(n),
        Err(e) => {
            stderr_line(&format!("gpu-mode-status: {e}"));
            return ExitCode::from(EXIT_USAGE as u8);
        }
    };
    let report = gather(&cfg, node);
    print!("{}", if cli.json { report.to_json() } else { report.to_table() });
    ExitCode::from(report.exit_code() as u8)
}
