//! `gpu-mode-epilog`: Slurm's Epilog= for slurm-gpu-mode. All logic lives in
//! gpu_mode_core::lifecycle; see docs/architecture.md.

fn main() {
    let matches = gpu_mode_epilog::cli::command().get_matches();
    let config = gpu_mode_epilog::cli::config(&matches);
    std::process::exit(gpu_mode_core::lifecycle::run_hook(gpu_mode_core::lifecycle::Verb::Epilog, config));
}
