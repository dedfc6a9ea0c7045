//! `gpu-mode-prolog`: Slurm's Prolog= for slurm-gpu-mode. All logic lives in
//! gpu_mode_core::lifecycle (its command line in lifecycle::cli); see
//! docs/architecture.md.

use gpu_mode_core::lifecycle::{cli, run_hook, Verb};

fn main() {
    let matches = cli::command(Verb::Prolog).get_matches();
    std::process::exit(run_hook(Verb::Prolog, cli::config(&matches)));
}
