//! `gpu-mode-node-checker`: GPU health checks for Slurm's HealthCheckProgram,
//! the epilog and people. Thin: the checks, the drain policy and the outputs
//! are `gpu_mode_core::health`. Usage and exit codes: docs/node-checker.md.
//!
//! Exit codes: 0 no check failed (warnings allowed), 1 a check failed,
//! 2 usage or config error, 3 the drain/resume could not be applied.

use clap::Parser;
use gpu_mode_core::node_check;
use gpu_mode_node_checker::cli::{exit_code, CheckArgs, Cli, Command, EXIT_FAIL, EXIT_USAGE};
use gpu_mode_core::log::{stderr_line, stdout_line};
use gpu_mode_core::Config;
use std::process::ExitCode;
use std::time::Duration;


fn load(config: Option<&std::path::Path>) -> Result<Config, ExitCode> {
    gpu_mode_core::cli::load_config("gpu-mode-node-checker", config).map_err(|e| {
        stderr_line(&e);
        ExitCode::from(EXIT_USAGE)
    })
}

fn check(a: CheckArgs) -> Result<ExitCode, ExitCode> {
    let config = load(a.site.config.as_deref())?;
    let opts = a.options().map_err(|e| {
        stderr_line(&format!("gpu-mode-node-checker: {e}"));
        ExitCode::from(EXIT_USAGE)
    })?;
    let report = node_check::check_node(&config, &opts).report;
    stdout_text(&if a.json { report.to_json() } else { report.to_table() });
    Ok(ExitCode::from(exit_code(report.action_error.is_some(), report.status)))
}

fn run(cli: Cli) -> Result<ExitCode, ExitCode> {
    match cli.command {
        None => check(cli.check),
        Some(Command::Check(a)) => check(a),
        Some(Command::Inventory { json, config, xid_wait_ms }) => {
            let config = load(config.as_deref())?;
            let out = gpu_mode_core::gpu::inventory_output(&config, json, Duration::from_millis(xid_wait_ms)).map_err(|e| {
                stderr_line(&format!("gpu-mode-node-checker inventory: {e}"));
                ExitCode::from(EXIT_FAIL)
            })?;
            stdout_text(&out);
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::CheckConfig { config }) => {
            load(config.as_deref())?;
            let path = config.unwrap_or_else(|| gpu_mode_core::config::DEFAULT_CONFIG_PATH.into());
            stdout_line(&format!("{}: valid", path.display()));
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Ack { config }) => {
            let config = load(config.as_deref())?;
            let msg = node_check::acknowledge(&config).map_err(|e| {
                stderr_line(&format!("gpu-mode-node-checker ack: {e}"));
                ExitCode::from(EXIT_FAIL)
            })?;
            stdout_line(&msg);
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Prints as `print!` would, but a closed stdout (slurmd stops reading a
/// HealthCheckProgram it killed) is no panic.
fn stdout_text(text: &str) {
    use std::io::Write as _;
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

fn main() -> ExitCode {
    run(Cli::parse()).unwrap_or_else(|code| code)
}
