//! Where the time of one checkpoint or restore went: its phases in order,
//! each with its start (ms after the timeline's origin) and duration. The
//! origin of a checkpoint is the preemption signal as the wrapper saw it, so
//! "GPU memory free" and "image durable" read straight off the timeline; a
//! restore's origin is its request. Phases may overlap (the image's
//! writeback runs while CRIU dumps): the starts tell.
//!
//! Recorded in the manifest, returned to `gpu-mode-run` (which prints it on
//! the job's stderr) and printed by `gpu-mode-preempt-bench`.

use serde::{Deserialize, Serialize};
use std::time::Instant;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PhaseTime {
    pub name: String,
    /// When it began, ms after the origin.
    pub start_ms: f64,
    pub ms: f64,
}

impl PhaseTime {
    pub fn end_ms(&self) -> f64 {
        self.start_ms + self.ms
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    pub phases: Vec<PhaseTime>,
}

impl Timeline {
    /// The phase called `name`, if it ran.
    pub fn phase(&self, name: &str) -> Option<&PhaseTime> {
        self.phases.iter().find(|p| p.name == name)
    }

    /// When the phase `name` ended, ms after the origin.
    pub fn end_of(&self, name: &str) -> Option<f64> {
        self.phase(name).map(PhaseTime::end_ms)
    }

    /// The last moment of any phase: the whole operation, from the origin.
    pub fn end_ms(&self) -> f64 {
        self.phases.iter().map(PhaseTime::end_ms).fold(0.0, f64::max)
    }

    /// `request 0.002, checks 0.004, …, manifest 0.006 s`: one line for a
    /// job's output; an overlapping phase is marked `(with criu-dump)`.
    pub fn render(&self) -> String {
        let mut parts = Vec::with_capacity(self.phases.len());
        for (i, p) in self.phases.iter().enumerate() {
            let overlapped = self.phases[..i].iter().rev().find(|q| p.start_ms + 0.5 < q.end_ms() && q.ms > 0.0);
            let with = overlapped.map_or(String::new(), |q| format!(" (with {})", q.name));
            parts.push(format!("{} {:.3}{with}", p.name, p.ms / 1e3));
        }
        format!("{} s", parts.join(", "))
    }
}

/// Records phases against one origin while an operation runs.
#[derive(Debug, Clone)]
pub struct Stopwatch {
    origin: Instant,
    /// ms between the origin and `origin` (the signal came before the request).
    lead_ms: f64,
    timeline: Timeline,
}

impl Stopwatch {
    /// A stopwatch started now. `lead_ms` is how long before now the origin
    /// was (for a checkpoint: request receipt minus the signal), recorded as
    /// a first phase called `lead_name`; `None`: the origin is now.
    pub fn new(lead_name: &str, lead_ms: Option<f64>) -> Stopwatch {
        let mut s = Stopwatch { origin: Instant::now(), lead_ms: 0.0, timeline: Timeline::default() };
        if let Some(lead) = lead_ms {
            // A wall clock stepped backwards is no negative phase.
            s.lead_ms = lead.max(0.0);
            s.timeline.phases.push(PhaseTime { name: lead_name.to_string(), start_ms: 0.0, ms: s.lead_ms });
        }
        s
    }

    /// ms after the origin at `at`.
    pub fn offset(&self, at: Instant) -> f64 {
        self.lead_ms + at.saturating_duration_since(self.origin).as_secs_f64() * 1e3
    }

    /// Records a phase that ran from `start` to `end`.
    pub fn record(&mut self, name: &str, start: Instant, end: Instant) {
        let start_ms = self.offset(start);
        let ms = end.saturating_duration_since(start).as_secs_f64() * 1e3;
        self.timeline.phases.push(PhaseTime { name: name.to_string(), start_ms, ms });
    }

    /// Records a phase that ran from `start` until now.
    pub fn since(&mut self, name: &str, start: Instant) {
        self.record(name, start, Instant::now());
    }

    /// Runs `f` as the phase `name`.
    pub fn time<T>(&mut self, name: &str, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = f();
        self.since(name, start);
        out
    }

    pub fn timeline(&self) -> &Timeline {
        &self.timeline
    }

    pub fn finish(self) -> Timeline {
        self.timeline
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn phase(name: &str, start_ms: f64, ms: f64) -> PhaseTime {
        PhaseTime { name: name.into(), start_ms, ms }
    }

    #[test]
    fn phases_are_placed_after_the_lead_and_in_order() {
        let mut s = Stopwatch::new("request", Some(40.0));
        s.time("checks", || std::thread::sleep(Duration::from_millis(5)));
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_millis(5));
        s.since("cuda-checkpoint", t0);
        let t = s.finish();
        let names: Vec<&str> = t.phases.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["request", "checks", "cuda-checkpoint"]);
        assert_eq!(t.phases[0].start_ms, 0.0);
        assert!(t.phases[1].start_ms >= 40.0 && t.phases[1].ms >= 5.0, "{t:?}");
        assert!(t.phases[2].start_ms >= t.phases[1].end_ms(), "{t:?}");
        assert_eq!(t.end_of("cuda-checkpoint"), Some(t.phases[2].end_ms()));
        assert_eq!(t.end_ms(), t.phases[2].end_ms());
        assert_eq!(t.end_of("criu-dump"), None);
    }

    #[test]
    fn no_lead_phase_without_a_signal() {
        let t = Stopwatch::new("request", None).finish();
        assert!(t.phases.is_empty());
        let t = Stopwatch::new("request", Some(-3.0)).finish();
        assert_eq!(t.phases, [phase("request", 0.0, 0.0)], "a clock step backwards is a phase of 0");
    }

    #[test]
    fn the_rendered_line_names_every_phase_and_marks_overlaps() {
        let t = Timeline {
            phases: vec![
                phase("request", 0.0, 2.0),
                phase("criu-dump", 2.0, 4000.0),
                phase("writeback", 2.5, 3990.0),
                phase("fsync", 4002.0, 300.0),
            ],
        };
        assert_eq!(
            t.render(),
            "request 0.002, criu-dump 4.000, writeback 3.990 (with criu-dump), fsync 0.300 s"
        );
        assert_eq!(t.end_ms(), 4302.0);
    }
}
