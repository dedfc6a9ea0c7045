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
