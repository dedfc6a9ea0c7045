//! Prometheus metrics for node_exporter's textfile collector (docs/metrics.md):
//! the families (the one list), the events the verbs produce, the counter
//! store and the exposition format. Keeping events and rendering the
//! textfile with the node's records is [`crate::observe`]'s, above the
//! status records it reads.

pub mod exposition;
pub mod store;

use exposition::Kind;
use serde::Serialize;
pub use store::Event;

/// `[metrics]`: configuration's (crate::config::MetricsConfig).
pub use crate::config::MetricsConfig;

/// One metric family: its name, type and help, and for histograms the
/// bucket bounds. The one list; docs/metrics.md documents each (a test
/// checks), the renderer writes HELP/TYPE from it.
pub struct Family {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
    pub buckets: &'static [f64],
}

/// Seconds: checkpoint phases range from milliseconds (a lock) to minutes
/// (CRIU writing tens of GiB).
const PHASE_BUCKETS: &[f64] = &[0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0];

const fn plain(name: &'static str, kind: Kind, help: &'static str) -> Family {
    Family { name, kind, help, buckets: &[] }
}

pub const PROLOG_RUNS: &str = "gpu_mode_prolog_runs_total";
pub const EPILOG_RUNS: &str = "gpu_mode_epilog_runs_total";
pub const MIG_CREATED: &str = "gpu_mode_mig_instances_created_total";
pub const MIG_DESTROYED: &str = "gpu_mode_mig_instances_destroyed_total";
pub const CHECKPOINTS: &str = "gpu_mode_checkpoints_total";
pub const CHECKPOINT_FAILURES: &str = "gpu_mode_checkpoint_failures_total";
pub const CHECKPOINT_PHASE: &str = "gpu_mode_checkpoint_phase_duration_seconds";
pub const CHECKPOINT_BYTES: &str = "gpu_mode_checkpoint_written_bytes_total";
pub const RESTORES: &str = "gpu_mode_restores_total";
pub const RESTORE_FAILURES: &str = "gpu_mode_restore_failures_total";
pub const RESTORE_PHASE: &str = "gpu_mode_restore_phase_duration_seconds";
pub const DRAINS: &str = "gpu_mode_drains_total";

pub static FAMILIES: &[Family] = &[
    plain(PROLOG_RUNS, Kind::Counter, "Prolog runs of jobs with a GPU mode, by mode kind and outcome (ok, refused: a job refusal, failed: a node fault)."),
    plain(EPILOG_RUNS, Kind::Counter, "Epilog runs of jobs with a GPU mode, by mode kind and outcome."),
    plain(MIG_CREATED, Kind::Counter, "MIG instances created for jobs, by profile."),
    plain(MIG_DESTROYED, Kind::Counter, "MIG instances destroyed after jobs, by profile."),
    plain(CHECKPOINTS, Kind::Counter, "Checkpoints (dumps) by the checkpoint agents, by outcome."),
    plain(CHECKPOINT_FAILURES, Kind::Counter, "Failed checkpoints by reason."),
    Family { name: CHECKPOINT_PHASE, kind: Kind::Histogram, help: "Duration of each phase of successful checkpoints (the manifest's timings).", buckets: PHASE_BUCKETS },
    plain(CHECKPOINT_BYTES, Kind::Counter, "Bytes of checkpoint images written."),
    plain(RESTORES, Kind::Counter, "Restores by the checkpoint agents, by outcome."),
    plain(RESTORE_FAILURES, Kind::Counter, "Failed restores by reason (refused requests are not counted)."),
    Family { name: RESTORE_PHASE, kind: Kind::Histogram, help: "Duration of each phase of successful restores.", buckets: PHASE_BUCKETS },
    plain(DRAINS, Kind::Counter, "Drains this project set on the node, by source (prolog, epilog, node-checker, mig-baseline) and reason."),
    plain("gpu_mode_jobs", Kind::Gauge, "Jobs with a GPU mode on the node now, by mode kind."),
    plain("gpu_mode_mps_daemons", Kind::Gauge, "MPS control daemons recorded now, by whether their process is running."),
    plain("gpu_mode_mig_instances", Kind::Gauge, "MIG instances recorded in jobs' journals now."),
    plain("gpu_mode_checkpoint_agents", Kind::Gauge, "Checkpoint agents listening (sockets) now."),
    plain("gpu_mode_checkpoint_images", Kind::Gauge, "Checkpoint images in the image store, by state (complete, consumed, partial)."),
    plain("gpu_mode_checkpoint_images_bytes", Kind::Gauge, "Bytes of the checkpoint images in the image store."),
    plain("gpu_mode_problems", Kind::Gauge, "Records that need the admin (gpu-mode status lists them)."),
];

/// Where a component that runs below the verbs (the checkpoint agent) sends
/// its events: the verb that runs it decides whether and how they are kept
/// (gpu-mode-ckpt-agent: [`recorder`] when `[metrics] textfile` is set).
#[derive(Clone)]
pub struct EventSink(std::sync::Arc<SinkFn>);

type SinkFn = dyn Fn(&[Event]) + Send + Sync;

impl EventSink {
    pub fn new(f: impl Fn(&[Event]) + Send + Sync + 'static) -> EventSink {
        EventSink(std::sync::Arc::new(f))
    }

    pub fn send(&self, events: &[Event]) {
        (self.0)(events)
    }
}

impl std::fmt::Debug for EventSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EventSink")
    }
}

pub fn family(name: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|f| f.name == name)
}

/// The `<phase>_ms` numbers of a timings record (the manifest's
/// `DumpTimings`, a restore summary) as `(phase, seconds)`. Read by field
/// name, so a phase added to the record is measured without a change here;
/// `total` is a phase too (the whole operation).
pub fn phases_of(timings: &impl Serialize) -> Vec<(String, f64)> {
    let Ok(serde_json::Value::Object(map)) = serde_json::to_value(timings) else { return Vec::new() };
    map.into_iter()
        .filter_map(|(k, v)| Some((k.strip_suffix("_ms")?.to_string(), v.as_f64()? / 1000.0)))
        .filter(|(_, s)| s.is_finite() && *s >= 0.0)
        .collect()
}

/// Every phase a timings record can have: its `<phase>_ms` fields, also
/// those without a value (`None`) in `record`.
pub fn phase_names(record: &impl Serialize) -> Vec<String> {
    let Ok(serde_json::Value::Object(map)) = serde_json::to_value(record) else { return Vec::new() };
    map.into_iter().filter(|(_, v)| v.is_number() || v.is_null()).filter_map(|(k, _)| Some(k.strip_suffix("_ms")?.to_string())).collect()
}

/// One histogram observation per phase.
pub fn phase_events(family: &'static str, phases: &[(String, f64)]) -> Vec<Event> {
    phases.iter().map(|(p, s)| Event::Observe { family, labels: vec![("phase", p.clone())], value: *s }).collect()
}

#[cfg(test)]
mod tests;
