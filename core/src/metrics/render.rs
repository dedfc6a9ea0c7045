//! The textfile: every family of [`super::FAMILIES`] with HELP and TYPE,
//! counters and histograms from the store, gauges from the node's records.
//! Families with no series yet still get their HELP/TYPE lines, and the
//! gauges always write every label value (zeros included), so dashboards
//! show 0 rather than "no data".

use super::exposition::{label_set, FamilyWriter, Kind};
use super::store::Store;
use super::FAMILIES;
use crate::status::records::Records;
use std::collections::BTreeMap;

const MODE_KINDS: &[&str] = &["mps", "mig", "checkpoint"];
const IMAGE_STATES: &[&str] = &["complete", "consumed", "partial"];

pub fn render(counters: &Store, records: &Records) -> String {
    let gauges = gauges(records);
    let mut out = String::new();
    for f in FAMILIES {
        let mut w = FamilyWriter::begin(&mut out, f.name, f.kind, f.help);
        match f.kind {
            Kind::Counter => {
                for (labels, v) in counters.counters.get(f.name).into_iter().flatten() {
                    w.sample(labels, *v);
                }
            }
            Kind::Histogram => {
                for h in counters.histograms.get(f.name).into_iter().flat_map(|m| m.values()) {
                    let labels: Vec<(&str, String)> = h.labels.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
                    w.histogram(&labels, f.buckets, &h.counts, h.sum);
                }
            }
            Kind::Gauge => {
                for (labels, v) in gauges.get(f.name).into_iter().flatten() {
                    w.sample(labels, *v);
                }
            }
        }
    }
    out
}

/// family → rendered label set → value.
fn gauges(r: &Records) -> BTreeMap<&'static str, Vec<(String, f64)>> {
    let by = |key: &'static str, values: &[&str], count: &dyn Fn(&str) -> usize| -> Vec<(String, f64)> {
        values.iter().map(|v| (label_set(&[(key, v.to_string())]), count(v) as f64)).collect()
    };
    let plain = |v: usize| vec![(String::new(), v as f64)];
    BTreeMap::from([
        ("gpu_mode_jobs", by("mode", MODE_KINDS, &|m| r.jobs.iter().filter(|j| j.mode_kind() == m).count())),
        (
            "gpu_mode_mps_daemons",
            by("running", &["true", "false"], &|v| r.mps_daemons.iter().filter(|d| d.running.to_string() == v).count()),
        ),
        ("gpu_mode_mig_instances", plain(r.mig_instances.len())),
        ("gpu_mode_checkpoint_agents", plain(r.agents.len())),
        ("gpu_mode_checkpoint_images", by("state", IMAGE_STATES, &|s| r.images.iter().filter(|i| i.state == s).count())),
        ("gpu_mode_checkpoint_images_bytes", vec![(String::new(), r.images.iter().map(|i| i.bytes as f64).sum())]),
        ("gpu_mode_problems", plain(r.problems.len())),
    ])
}
