//! `gpu-mode-prolog`: Slurm's Prolog= for slurm-gpu-mode. All logic lives in
//! gpu_mode_core::lifecycle; see docs/architecture.md.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(gpu_mode_core::lifecycle::hook_main(gpu_mode_core::lifecycle::Verb::Prolog, &args));
}
