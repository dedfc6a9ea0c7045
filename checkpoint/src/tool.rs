//! `gpu-mode-cuda-ckpt`: CUDA checkpoint/restore of one process or of every
//! CUDA process of a Slurm job on this node. All logic lives in
//! gpu_mode_core::cuda_ckpt; this is argument parsing and printing, for the
//! binary and for its old name, `gpu-mode-checkpoint` (one word per
//! concept: "checkpoint" is the mode), which warns and runs the same.

use crate::cli::{Cli, Verb};
use crate::{describe_checkpoint, describe_restore, describe_state};
use clap::Parser;
use gpu_mode_core::cuda_ckpt::{Checkpointer, CudaDriver, DeviceMap, Nvml, ProcFs, Settings, Target};
use gpu_mode_core::log::{ActionLine, Outcome};
use gpu_mode_core::Config;
use std::sync::Arc;

/// The tool's name.
pub const NAME: &str = "gpu-mode-cuda-ckpt";
/// Its name until this release, still installed beside it for one.
pub const OLD_NAME: &str = "gpu-mode-checkpoint";

/// What the old name says before it does what the new one does.
pub fn old_name_warning() -> String {
    format!("{OLD_NAME}: warning: this tool is now {NAME}; the old name goes in a later release")
}

/// The whole program: parse, run, print; exits.
pub fn main() -> ! {
    let cli = Cli::parse();
    let cfg = match Config::load(cli.config.as_deref()) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("{NAME}: {e}");
            std::process::exit(2);
        }
    };
    let (action, target) = match &cli.verb {
        Verb::Checkpoint(w) => ("checkpoint", w.target()),
        Verb::Restore { which, .. } => ("restore", which.target()),
        Verb::State(w) => ("state", w.target()),
    };
    let line = ActionLine::new(action).field("target", &target);
    match run(&cli, &cfg, &target) {
        Ok(text) => {
            println!("{text}");
            if action != "state" {
                line.outcome(Outcome::Ok).emit(&cfg.log);
            }
        }
        Err(e) => {
            line.field("error", format!("{e:#}")).outcome(Outcome::Failed).emit(&cfg.log);
            if !cfg.log.stderr {
                eprintln!("{NAME}: {e:#}");
            }
            if cli.json {
                println!("{}", serde_json::json!({ "error": format!("{e:#}") }));
            }
            std::process::exit(1);
        }
    }
    std::process::exit(0)
}

fn run(cli: &Cli, cfg: &Config, target: &Target) -> anyhow::Result<String> {
    let driver = CudaDriver::load(cfg.cuda_ckpt.cuda_library.as_deref())?;
    let nvml = Nvml::load(cfg.nvml_library().as_deref()).map_err(anyhow::Error::msg)?;
    let host = ProcFs { device_prefixes: cfg.cuda_ckpt.device_paths.clone(), ..ProcFs::default() };
    let ckpt = Checkpointer::new(Arc::new(driver), &host, &nvml, Settings::from_config(cfg));
    let json = |v: serde_json::Result<String>| v.map_err(anyhow::Error::from);
    Ok(match &cli.verb {
        Verb::Checkpoint(_) => {
            let r = ckpt.checkpoint(target)?;
            if cli.json { json(serde_json::to_string_pretty(&r))? } else { describe_checkpoint(&r) }
        }
        Verb::Restore { device_map, .. } => {
            let map = match device_map {
                Some(text) => DeviceMap::parse(text).map_err(|e| anyhow::anyhow!("--device-map: {e}"))?,
                None => DeviceMap::default(),
            };
            let r = ckpt.restore(target, &map)?;
            if cli.json { json(serde_json::to_string_pretty(&r))? } else { describe_restore(&r) }
        }
        Verb::State(_) => {
            let r = ckpt.state(target)?;
            if cli.json { json(serde_json::to_string_pretty(&r))? } else { describe_state(&r) }
        }
    })
}
