//! The layering of docs/architecture.md as a rule (issue 26): no module of
//! gpu-mode-core refers to one of a higher layer, every module is placed in
//! a layer, and no modules form a cycle. `scripts/modgraph.py --check` reads
//! the sources (its LAYERS table is the one rule); these tests run it on
//! gpu-mode-base, gpu-mode-devices and this crate, and on a planted crate
//! that breaks the rule.

use std::path::Path;
use std::process::{Command, Output};

fn modgraph_check(src: &Path) -> Output {
    modgraph_check_with(src, &[])
}

fn modgraph_check_with(src: &Path, flags: &[&str]) -> Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/modgraph.py");
    Command::new("python3").arg(script).arg(src).arg("--check").args(flags).output().expect("python3 runs scripts/modgraph.py")
}

fn said(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// The five library crates: gpu-mode-base (the bottom three layers),
/// gpu-mode-devices (NVML, CRIU, the CUDA checkpoint verb), gpu-mode-preempt
/// (the layering's `preempt`, a crate of its own), gpu-mode-modes (the mode
/// interface, the modes, MIG) and gpu-mode-core; Cargo keeps each from
/// reaching up into the next, this keeps the layers inside each.
#[test]
fn the_crates_keep_their_layering() {
    let crates = [("../base/src", &[][..]), ("../devices/src", &[]), ("../preempt/src", &["--crate-is=preempt"]), ("../modes/src", &[]), ("src", &[])];
    for (src, flags) in crates {
        let out = modgraph_check_with(&Path::new(env!("CARGO_MANIFEST_DIR")).join(src), flags);
        assert!(out.status.success(), "the layering of {src} is broken (see docs/architecture.md):\n{}", said(&out));
    }
}

/// In a crate that is one module of the layering, a reference to a higher
/// layer is found as in gpu-mode-core.
#[test]
fn a_crate_that_is_one_module_is_held_to_that_modules_layer() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("lib.rs"), "pub mod agent;\n").unwrap();
    std::fs::write(dir.path().join("agent.rs"), "pub fn f() { crate::health::g(); crate::fsutil::h() }\n").unwrap();
    let out = modgraph_check_with(dir.path(), &["--crate-is=preempt"]);
    assert!(!out.status.success() && said(&out).contains("preempt (L5 mig/preempt) -> health (L7 health)"), "{}", said(&out));
    std::fs::write(dir.path().join("agent.rs"), "pub fn f() { crate::fsutil::h() }\n").unwrap();
    let out = modgraph_check_with(dir.path(), &["--crate-is=preempt"]);
    assert!(out.status.success(), "{}", said(&out));
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
