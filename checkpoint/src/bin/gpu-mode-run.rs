//! `gpu-mode-run [--config PATH] [--linger SECONDS] [--] <application> [arguments...]`
//!
//! Runs the application of a `--gpu-mode=checkpoint` job so that a
//! preemption checkpoints it and the requeued job restores it
//! (gpu_mode_core::preempt::wrapper). Use it as the batch shell:
//! `exec gpu-mode-run ./train --epochs 90`. Exits with the application's
//! status (128 + signal when killed); 2 on a usage or config error.

use gpu_mode_core::preempt::wrapper::{run, RunOptions};
use gpu_mode_core::Config;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

/// Records the signal mask and ignored set this process inherited before
/// Rust's runtime ignores SIGPIPE (constructors run before `main`): the
/// application gets exactly these (gpu_mode_core::signal_state).
#[used]
#[link_section = ".init_array"]
static RECORD_INHERITED_SIGNALS: extern "C" fn() = gpu_mode_core::signal_state::record_at_load;

fn usage(msg: &str) -> ! {
    eprintln!("gpu-mode-run: {msg}");
    eprintln!("usage: gpu-mode-run [--config PATH] [--linger SECONDS] [--] <application> [arguments...]");
    std::process::exit(2);
}

fn main() {
    let mut args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let (mut config, mut linger) = (None, None);
    while let Some(first) = args.first().and_then(|a| a.to_str()).map(String::from) {
        match first.as_str() {
            "--" => {
                args.remove(0);
                break;
            }
            "--config" | "--linger" if args.len() >= 2 => {
                let v = args.remove(1);
                args.remove(0);
                if first == "--config" {
                    config = Some(PathBuf::from(v));
                } else {
                    let secs = v.to_str().and_then(|s| s.parse().ok()).unwrap_or_else(|| usage("--linger needs seconds"));
                    linger = Some(Duration::from_secs(secs));
                }
            }
            "-h" | "--help" => usage("runs a --gpu-mode=checkpoint job's application"),
            _ => break,
        }
    }
    let cfg = Config::load(config.as_deref()).unwrap_or_else(|e| usage(&e.to_string()));
    let mut opts = RunOptions::from_env(&cfg, args, &|k| std::env::var(k).ok()).unwrap_or_else(|e| usage(&e.to_string()));
    if let Some(l) = linger {
        opts.linger = l;
    }
    std::process::exit(run(&opts));
}
