//! The simulated H100 and H200 must report what the real GPUs reported.
//! docs/validation/inventory-<gpu>.json is `gpu-mode-node-checker inventory
//! --json` from a real machine (docs/validation.md says which and when); this
//! runs the same command's code on the simulated fixture and compares the
//! facts that do not vary between boards of one model.

mod common;

use common::SimNode;
use gpu_mode_core::gpu::{node_report, GpuReport, NodeReport};
use std::path::Path;
use std::time::Duration;

fn real_report(file: &str) -> Option<NodeReport> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/validation").join(file);
    let text = std::fs::read_to_string(&path).ok()?;
    Some(serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

/// The facts of one GPU that must match, with volatile readings left out:
/// UUID, bus id, temperature, power, and clocks event reasons (the real H200
/// reported 0x0 and 0x1 in two reads a second apart).
fn model_facts(g: &GpuReport) -> String {
    let i = g.inventory.as_ref().expect("inventory");
    let m = g.modes.as_ref().expect("modes");
    let h = g.health.as_ref().expect("health");
    let pcie = h.pcie.as_ref().map(|p| (p.max_gen, p.max_width, p.current_width));
    format!(
        "name {} memory {} cc {}\nmodes {:?}\nprofiles {:#?}\npcie {:?} thresholds {:?}/{:?} fabric {:?} \
         retired pages {:?} remapped rows {:?} processes {:?}",
        i.name, i.memory_total_mib, i.compute_capability, m, g.mig_profiles, pcie, h.slowdown_temp_c,
        h.shutdown_temp_c, h.fabric_state, h.retired_pages_dbe, h.remapped_rows, h.processes,
    )
}

fn compare(fixture: &str, real: &NodeReport) {
    let node = SimNode::new(fixture);
    let sim = node_report(&node.gpus(), Duration::ZERO).unwrap();
    assert_eq!(sim.driver, real.driver, "driver versions");
    assert_eq!(sim.gpus.len(), real.gpus.len(), "GPU count ({fixture})");
    for (s, r) in sim.gpus.iter().zip(&real.gpus) {
        assert!(r.error.is_none(), "the real report has an error: {:?}", r.error);
        assert_eq!(model_facts(s), model_facts(r), "GPU {} of {fixture} differs from the real one", r.index);
    }
}

#[test]
fn simulated_h200_matches_the_real_h200s() {
    let real = real_report("inventory-h200.json").expect("docs/validation/inventory-h200.json is committed");
    compare("node-2x-h200.toml", &real);
}

#[test]
fn simulated_h100_matches_the_real_h100() {
    // Recorded on the nvidia-h100-x1 machine (docs/validation.md).
    match real_report("inventory-h100.json") {
        Some(real) => compare("node-1x-h100.toml", &real),
        None => panic!("docs/validation/inventory-h100.json is missing; see docs/validation.md"),
    }
}
