//! The plugin is loaded into every srun, sbatch, salloc and slurmstepd: it
//! builds on gpu-mode-base alone, never on the crates that drive NVML, the
//! CUDA driver, CRIU or YAML (issue 26; docs/architecture.md).

use std::process::Command;

const NEVER: &[&str] = &["gpu-mode-core", "nvml-wrapper", "nvml-wrapper-sys", "cudarc", "libloading", "serde-saphyr"];

#[test]
fn the_plugins_dependencies_hold_no_gpu_cuda_criu_or_yaml_crate() {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
    let out = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "--manifest-path", manifest, "-p", "gpu-mode-spank", "-e", "normal", "--prefix", "none"])
        .output()
        .expect("cargo tree runs");
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "cargo tree failed: {}", String::from_utf8_lossy(&out.stderr));
    let crates: Vec<&str> = tree.lines().filter_map(|l| l.split_whitespace().next()).collect();
    assert!(crates.contains(&"gpu-mode-base"), "{tree}");
    let found: Vec<&&str> = NEVER.iter().filter(|n| crates.contains(n)).collect();
    assert!(found.is_empty(), "the plugin depends on {found:?}:\n{tree}");
}
