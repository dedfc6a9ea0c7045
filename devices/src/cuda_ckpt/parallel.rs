//! Runs one step on every process at once, one thread each, and times it:
//! a job's total time should approach its slowest process, not the sum.

use super::driver::DriverError;
use std::time::Instant;

/// A step of the protocol, named in reports and timings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    Lock,
    Checkpoint,
    Restore,
    Unlock,
}

/// One process's run of a step.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StepRun {
    pub pid: i32,
    pub ms: f64,
    #[serde(serialize_with = "error_text")]
    pub result: Result<(), DriverError>,
}

fn error_text<S: serde::Serializer>(r: &Result<(), DriverError>, s: S) -> Result<S::Ok, S::Error> {
    match r {
        Ok(()) => s.serialize_none(),
        Err(e) => s.serialize_some(&e.to_string()),
    }
}

/// A step run on a set of processes: wall time and each one's time.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Phase {
    pub step: Step,
    pub wall_ms: f64,
    pub runs: Vec<StepRun>,
}

impl Phase {
    pub fn succeeded(&self) -> Vec<i32> {
        self.runs.iter().filter(|r| r.result.is_ok()).map(|r| r.pid).collect()
    }

    pub fn failures(&self) -> Vec<super::PidFailure> {
        self.runs
            .iter()
            .filter_map(|r| r.result.as_ref().err().map(|e| super::PidFailure { pid: r.pid, error: e.to_string() }))
            .collect()
    }
}

/// Runs `f` on every pid concurrently and waits for all.
pub fn run_all(step: Step, pids: &[i32], f: impl Fn(i32) -> Result<(), DriverError> + Sync) -> Phase {
    let start = Instant::now();
    let runs = std::thread::scope(|scope| {
        let handles: Vec<_> = pids
            .iter()
            .map(|&pid| {
                let f = &f;
                scope.spawn(move || {
                    let t = Instant::now();
                    let result = f(pid);
                    StepRun { pid, ms: super::ms(t.elapsed()), result }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a checkpoint worker thread panicked")).collect()
    });
    Phase { step, wall_ms: super::ms(start.elapsed()), runs }
}
