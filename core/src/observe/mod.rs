//! Observing the node: keeping the metrics the verbs produce and rendering
//! them with what the node's records say (the textfile of docs/metrics.md).
//!
//! `metrics` below holds the families, the events and the counter store;
//! this module sits above `status` because the textfile's gauges are read
//! from the node's records ([`crate::status::records`]). The prolog, the
//! epilog, the checkpoint agent (through the [`recorder`] sink its binary
//! gives it), gpu-mode-mig and the node checker are short-lived or separate
//! processes, so counters live in a root-only state file, updated under a
//! flock; after each update the whole textfile is rendered and replaced
//! atomically in `[metrics] textfile`. Nothing is recorded when that key is
//! unset. A failure to record is logged, never turned into a job or node
//! failure: metrics must not take a node out of service.

pub mod render;

use crate::config::Config;
use crate::log::{ActionLine, Outcome};
use crate::metrics::{store, Event, EventSink, DRAINS};

/// A sink that [`record`]s into `cfg`'s textfile (the agent's binary
/// gives it to the agent, `metrics::EventSink`).
pub fn recorder(cfg: &Config) -> EventSink {
    let cfg = cfg.clone();
    EventSink::new(move |events| record(&cfg, events))
}

/// Records `events` and renders the textfile; a no-op without
/// `[metrics] textfile`. Failures are logged (action `metrics`).
pub fn record(cfg: &Config, events: &[Event]) {
    let Some(textfile) = &cfg.metrics.textfile else { return };
    if let Err(e) = record_and_render(cfg, textfile, events) {
        ActionLine::new("metrics").field("detail", e).outcome(Outcome::Failed).emit(&cfg.log);
    }
}

/// Renders the textfile again (gauges change without events: the node
/// checker calls this on each run).
pub fn refresh(cfg: &Config) {
    record(cfg, &[]);
}

fn record_and_render(cfg: &Config, textfile: &std::path::Path, events: &[Event]) -> Result<(), String> {
    let lock = store::StoreLock::acquire(&cfg.runtime_dir).map_err(|e| format!("cannot lock the counters: {e}"))?;
    let (counters, error) = store::update(&lock, &cfg.runtime_dir, events);
    let records = crate::status::records::gather(cfg);
    // Rendered under the lock: a slower writer cannot put older numbers back.
    let text = render::render(&counters, &records);
    crate::fsutil::write_atomic(textfile, text.as_bytes(), 0o644).map_err(|e| format!("writing {}: {e}", textfile.display()))?;
    error.map_or(Ok(()), Err)
}

/// A drain this project just set: remembered for `gpu-mode status` (always)
/// and counted (with metrics on) under `source` and `reason_label`, a fixed
/// word of the caller's (a `Fault`'s label, a check's name), never read off
/// the text. `reason` is the whole reason set.
pub fn drain_set(cfg: &Config, source: &'static str, reason_label: &'static str, reason: &str) {
    if let Err(e) = crate::drain::remember(&cfg.runtime_dir, reason) {
        ActionLine::new("metrics").field("detail", format!("cannot remember the drain: {e}")).outcome(Outcome::Failed).emit(&cfg.log);
    }
    record(cfg, &[Event::count(DRAINS, vec![("source", source.to_string()), ("reason", reason_label.to_string())])]);
}

#[cfg(test)]
mod tests;
