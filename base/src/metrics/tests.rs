use super::*;
use std::path::PathBuf;

#[test]
fn every_family_is_documented() {
    let doc = include_str!("../../../docs/metrics.md");
    for f in FAMILIES {
        assert!(doc.contains(&format!("`{}`", f.name)), "docs/metrics.md does not document {}", f.name);
    }
}

#[test]
fn reasons_become_a_few_fixed_labels() {
    let cases = [
        ("mig: GPU 0: NVML: not supported", "mig"),
        ("nvml: open did not finish within 300 s", "hang"),
        ("MPS zombie pid 4711 (job 3, GPU GPU-abc)", "mps_zombie"),
        ("MIG instance 3 on GPU GPU-1 busy (job 9)", "busy"),
        ("CUDA checkpoint failed: lock timed out", "cuda_checkpoint"),
        ("criu dump failed (exit 1): see dump.log", "criu"),
        ("cannot seal the images in /x: EIO", "seal"),
        ("no checkpoint image of job 5 in /var/lib/x", "no_image"),
        ("memory: GPU 1: row remap pending", "memory"),
        ("cannot write job state: disk full", "cannot_write_job_state"),
        ("a very long phrase that goes on and on: x", "other"),
        ("Something Odd happened to job 77", "other"),
        ("", "other"),
    ];
    for (detail, want) in cases {
        assert_eq!(reason_label(detail), want, "{detail}");
    }
}

#[test]
fn the_textfile_key_is_checked() {
    let health = PathBuf::from("/var/lib/node_exporter/gpu.prom");
    let cases = [
        (Some("/var/lib/node_exporter/gpu-mode.prom"), None),
        (None, None),
        (Some("gpu-mode.prom"), Some("metrics.textfile")),
        (Some("/var/lib/node_exporter/gpu-mode.txt"), Some("only files ending in .prom")),
        (Some("/var/lib/node_exporter/gpu.prom"), Some("name the same file")),
    ];
    for (textfile, want) in cases {
        let m = MetricsConfig { textfile: textfile.map(PathBuf::from) };
        match (m.validate(Some(&health)), want) {
            (Ok(()), None) => {}
            (Err(e), Some(w)) => assert!(e.contains(w), "{textfile:?}: {e}"),
            (got, _) => panic!("{textfile:?}: {got:?}"),
        }
    }
}

/// The shipped Grafana dashboard queries only metrics this code writes.
#[test]
fn the_dashboard_queries_only_families_we_write() {
    let dash: serde_json::Value = serde_json::from_str(include_str!("../../../packaging/grafana/gpu-mode-dashboard.json")).unwrap();
    let mut seen = 0;
    for target in dash["panels"].as_array().unwrap().iter().flat_map(|p| p["targets"].as_array().unwrap()) {
        let expr = target["expr"].as_str().unwrap();
        for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|w| w.starts_with("gpu_mode_")) {
            let name = ["_bucket", "_sum", "_count"].iter().find_map(|s| word.strip_suffix(s).filter(|n| family(n).is_some())).unwrap_or(word);
            assert!(family(name).is_some(), "the dashboard queries {word}, which no family writes: {expr}");
            seen += 1;
        }
    }
    assert!(seen >= 15, "only {seen} metric references found");
}
