//! The textfile: every family of [`crate::metrics::FAMILIES`] with HELP and TYPE,
//! counters and histograms from the store, gauges from the node's records.
//! Families with no series yet still get their HELP/TYPE lines, and the
//! gauges always write every label value (zeros included), so dashboards
//! show 0 rather than "no data".

use crate::metrics::exposition::{label_set, FamilyWriter, Kind};
use crate::metrics::store::{HistogramState, Store};
use crate::metrics::{self as families, FAMILIES};
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
                let mut series = zero_series(f.name);
                series.extend(counters.counters.get(f.name).into_iter().flatten().map(|(l, v)| (l.clone(), *v)));
                for (labels, v) in &series {
                    w.sample(labels, *v);
                }
            }
            Kind::Histogram => {
                let mut series = zero_histograms(f.name, f.buckets.len());
                series.extend(counters.histograms.get(f.name).into_iter().flatten().map(|(l, h)| (l.clone(), h.clone())));
                for h in series.values() {
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

/// The series of a counter that exist before their first event, at 0:
/// rate() and increase() miss a series' first increment otherwise (a
/// series that appears at 1 has no earlier sample), and dashboards show 0
/// rather than "no data". Only label sets known in advance; reasons and
/// profiles appear with their first event.
fn zero_series(family: &str) -> BTreeMap<String, f64> {
    let outcomes: &[&str] = match family {
        families::PROLOG_RUNS => &["ok", "refused", "failed"],
        families::EPILOG_RUNS | families::CHECKPOINTS | families::RESTORES => &["ok", "failed"],
        families::CHECKPOINT_BYTES => return BTreeMap::from([(String::new(), 0.0)]),
        _ => return BTreeMap::new(),
    };
    let modes: &[&str] = if matches!(family, families::PROLOG_RUNS | families::EPILOG_RUNS) { MODE_KINDS } else { &[""] };
    let mut out = BTreeMap::new();
    for mode in modes {
        for outcome in outcomes {
            let mut labels: Vec<(&str, String)> = Vec::new();
            if !mode.is_empty() {
                labels.push(("mode", mode.to_string()));
            }
            labels.push(("outcome", outcome.to_string()));
            out.insert(label_set(&labels), 0.0);
        }
    }
    out
}

/// The phase histograms' series at 0, one per phase of the timings records
/// (read by field name, as the observations are).
fn zero_histograms(family: &str, bounds: usize) -> BTreeMap<String, HistogramState> {
    use crate::preempt::manifest::DumpTimings;
    let phases = match family {
        families::CHECKPOINT_PHASE => families::phase_names(&DumpTimings::default()),
        families::RESTORE_PHASE => families::phase_names(&crate::preempt::protocol::RestoreSummary::default()),
        _ => Vec::new(),
    };
    phases
        .into_iter()
        .map(|phase| {
            let labels = vec![("phase".to_string(), phase)];
            let key = label_set(&[("phase", labels[0].1.clone())]);
            (key, HistogramState { labels, counts: vec![0; bounds + 1], sum: 0.0 })
        })
        .collect()
}

/// family → rendered label set → value.
fn gauges(r: &Records) -> BTreeMap<&'static str, Vec<(String, f64)>> {
    let by = |key: &'static str, values: &[&str], count: &dyn Fn(&str) -> usize| -> Vec<(String, f64)> {
        values.iter().map(|v| (label_set(&[(key, v.to_string())]), count(v) as f64)).collect()
    };
    let plain = |v: f64| vec![(String::new(), v)];
    BTreeMap::from([
        ("gpu_mode_jobs", by("mode", MODE_KINDS, &|m| r.jobs.iter().filter(|j| j.mode_kind() == m).count())),
        (
            "gpu_mode_mps_daemons",
            by("running", &["true", "false"], &|v| r.mps_daemons.iter().filter(|d| d.running.to_string() == v).count()),
        ),
        ("gpu_mode_mig_instances", plain(r.mig_instances.len() as f64)),
        ("gpu_mode_checkpoint_agents", plain(r.agents.len() as f64)),
        ("gpu_mode_checkpoint_images", by("state", IMAGE_STATES, &|s| r.images.iter().filter(|i| i.state == s).count())),
        ("gpu_mode_checkpoint_images_bytes", plain(r.images.iter().map(|i| i.bytes).sum::<u64>() as f64)),
        ("gpu_mode_problems", plain(r.problems.len() as f64)),
    ])
}
