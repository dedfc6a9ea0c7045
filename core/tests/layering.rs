//! The layering of docs/architecture.md as a rule (issue 26): no module of
//! gpu-mode-core refers to one of a higher layer, every module is placed in
//! a layer, and no modules form a cycle. `scripts/modgraph.py --check` reads
//! the sources (its LAYERS table is the one rule); these tests run it on
//! gpu-mode-base, gpu-mode-devices and this crate, and on a planted crate
//! that breaks the rule.

use std::path::Path;
use std::process::{Command, Output};

fn modgraph_check(src: &Path) -> Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/modgraph.py");
    Command::new("python3").arg(script).arg(src).arg("--check").output().expect("python3 runs scripts/modgraph.py")
}

fn said(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// The three library crates: gpu-mode-base (the bottom three layers),
/// gpu-mode-devices (NVML, CRIU, the CUDA checkpoint verb) and gpu-mode-core;
/// Cargo keeps each from reaching up into the next, this keeps the layers
/// inside each.
#[test]
fn the_crates_keep_their_layering() {
    for src in ["../base/src", "../devices/src", "src"] {
        let out = modgraph_check(&Path::new(env!("CARGO_MANIFEST_DIR")).join(src));
        assert!(out.status.success(), "the layering of {src} is broken (see docs/architecture.md):\n{}", said(&out));
    }
}

#[test]
fn an_upward_reference_or_an_unplaced_module_fails_the_check() {
    let cases = [
        // fsutil (base) calling into lifecycle (node): upward.
        ("pub fn f() { crate::lifecycle::g() }", "lifecycle.rs", "fsutil (L0 base) -> lifecycle (L9 node)"),
        // A module no layer names.
        ("pub fn f() { crate::newthing::g() }", "newthing.rs", "unplaced modules ['newthing']"),
    ];
    for (fsutil, other, want) in cases {
        let dir = tempfile::tempdir().unwrap();
        let module = other.trim_end_matches(".rs");
        std::fs::write(dir.path().join("lib.rs"), format!("pub mod fsutil;\npub mod {module};\n")).unwrap();
        std::fs::write(dir.path().join("fsutil.rs"), fsutil).unwrap();
        std::fs::write(dir.path().join(other), "pub fn g() {}\n").unwrap();
        let out = modgraph_check(dir.path());
        assert!(!out.status.success() && said(&out).contains(want), "{want}:\n{}", said(&out));
    }
}
