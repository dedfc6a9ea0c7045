//! Threat-model boundary (docs/security.md): no shipped program passes text
//! to a shell. Every program is run by absolute path with an argument
//! vector, so user text (a mode value, a job's name, a path) can never be
//! parsed as shell syntax. This scans the non-test source of every crate
//! that ships (the plugin, the hooks, the node checker, the checkpoint and
//! MIG tools, core) for the ways a shell gets started; the behavioural side,
//! hostile values through the real hooks, is tests/tests/hostile_values.rs.

use std::path::{Path, PathBuf};

/// Crates whose code runs on nodes or submit hosts.
const SHIPPED: &[&str] = &["base/src", "core/src", "spank-plugin/src", "prolog/src", "epilog/src", "node-checker/src", "checkpoint/src", "mig-tool/src"];

/// Ways to get a shell, as they would be written in Rust.
const FORBIDDEN: &[&str] = &[
    "Command::new(\"sh\")",
    "Command::new(\"/bin/sh\")",
    "Command::new(\"/usr/bin/sh\")",
    "Command::new(\"bash\")",
    "Command::new(\"/bin/bash\")",
    "Command::new(\"/usr/bin/bash\")",
    "\"-c\"",
    "libc::system(",
    "libc::popen(",
    "libc::execl(",
    "execvp(",
    "\"sh -c",
];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            // Test-only programs live under src/bin too; they are named below.
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The file's code before its first `#[cfg(test)]`: test modules sit at the
/// end of each file (and may start a shell to play a fake program).
fn shipped_part(path: &Path) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    // Test-only files and the programs that only tests and benches run.
    if name == "tests.rs" || name.ends_with("_tests.rs") || name.contains("testprog") || name.contains("bench") {
        return None;
    }
    let text = std::fs::read_to_string(path).ok()?;
    Some(text.split("#[cfg(test)]").next().unwrap_or("").to_string())
}

#[test]
fn no_shipped_code_starts_a_shell() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for dir in SHIPPED {
        sources(&root.join(dir), &mut files);
    }
    assert!(files.len() > 50, "the scan found too few files ({}): are the paths right?", files.len());
    let mut found = Vec::new();
    for f in &files {
        let Some(code) = shipped_part(f) else { continue };
        for (i, line) in code.lines().enumerate() {
            let line_code = line.split("//").next().unwrap_or("");
            for pat in FORBIDDEN {
                if line_code.contains(pat) {
                    found.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
                }
            }
        }
    }
    assert!(found.is_empty(), "shipped code that starts a shell:\n{}", found.join("\n"));
}

#[test]
fn the_scan_sees_a_shell_where_there_is_one() {
    // The same scan over the test module of base/src/command.rs, which does
    // start /bin/sh to play a background program: proof the patterns match.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../base/src/command.rs");
    let text = std::fs::read_to_string(path).unwrap();
    let tests = text.split("#[cfg(test)]").nth(1).expect("command.rs has tests");
    assert!(FORBIDDEN.iter().any(|p| tests.contains(p)), "the patterns no longer match a real shell start");
}
