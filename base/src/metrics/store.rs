//! The counters across hook runs: `<runtime_dir>/metrics/counters.json`
//! (root-only, 0600 in a 0700 directory). Prologs and epilogs of different
//! jobs run at the same time, so every update is read-modify-write under an
//! exclusive flock on `<runtime_dir>/metrics/lock`, and the file is replaced
//! atomically: no update is lost and no reader sees half a file. /run is
//! emptied at boot, so counters start again at zero then, which Prometheus'
//! rate() and increase() take as a counter reset.

use super::exposition::{label_set, Labels};
use crate::fsutil;
use crate::persist::{parse_versioned, write_json, StateError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub const STORE_VERSION: u32 = 1;

/// How long an update waits for another writer (each holds the lock for a
/// read, a small write and a render: milliseconds).
const LOCK_WAIT: Duration = Duration::from_secs(5);

/// One change to the counters.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Adds `by` to a counter.
    Add { family: &'static str, labels: Labels, by: f64 },
    /// One observation of a histogram (bounds from [`super::FAMILIES`]).
    Observe { family: &'static str, labels: Labels, value: f64 },
}

impl Event {
    pub fn count(family: &'static str, labels: Labels) -> Event {
        Event::Add { family, labels, by: 1.0 }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistogramState {
    pub labels: Vec<(String, String)>,
    /// Observations per bucket, not cumulative; one more than the bounds (+Inf).
    pub counts: Vec<u64>,
    pub sum: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Store {
    pub version: u32,
    /// family → rendered label set (`{a="x"}`) → value.
    pub counters: BTreeMap<String, BTreeMap<String, f64>>,
    /// family → rendered label set → state.
    pub histograms: BTreeMap<String, BTreeMap<String, HistogramState>>,
}

impl Default for Store {
    fn default() -> Self {
        Store { version: STORE_VERSION, counters: BTreeMap::new(), histograms: BTreeMap::new() }
    }
}

impl Store {
    pub fn apply(&mut self, event: &Event) {
        match event {
            Event::Add { family, labels, by } => {
                *self.counters.entry(family.to_string()).or_default().entry(label_set(labels)).or_default() += by;
            }
            Event::Observe { family, labels, value } => {
                let bounds = super::family(family).map_or(&[][..], |f| f.buckets);
                let h = self.histograms.entry(family.to_string()).or_default().entry(label_set(labels)).or_insert_with(|| HistogramState {
                    labels: labels.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
                    counts: vec![0; bounds.len() + 1],
                    sum: 0.0,
                });
                let bucket = bounds.iter().position(|b| value <= b).unwrap_or(bounds.len());
                if let Some(c) = h.counts.get_mut(bucket) {
                    *c += 1;
                }
                h.sum += value;
            }
        }
    }
}

pub fn metrics_dir(runtime_dir: &Path) -> PathBuf {
    runtime_dir.join("metrics")
}

fn store_path(runtime_dir: &Path) -> PathBuf {
    metrics_dir(runtime_dir).join("counters.json")
}

/// The exclusive lock over the counters; released on drop.
pub struct StoreLock {
    _file: File,
}

impl StoreLock {
    pub fn acquire(runtime_dir: &Path) -> Result<StoreLock, StateError> {
        let dir = metrics_dir(runtime_dir);
        let io = |source| StateError::Io { path: dir.clone(), source };
        fsutil::ensure_runtime_subdir(runtime_dir, &dir).map_err(io)?;
        // O_NOFOLLOW: a link left in the directory must not make root open what it names.
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(dir.join("lock"))
            .map_err(io)?;
        let deadline = Instant::now() + LOCK_WAIT;
        loop {
            // SAFETY: flock on a descriptor we own.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Ok(StoreLock { _file: file });
            }
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EWOULDBLOCK) || Instant::now() >= deadline {
                return Err(io(err));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// The counters as saved (all zero when none are). Readers that do not
/// update (status) need no lock: the file is replaced atomically.
pub fn load(runtime_dir: &Path) -> Result<Store, StateError> {
    let path = store_path(runtime_dir);
    match std::fs::read(&path) {
        Ok(text) => parse_versioned(&text, &path, STORE_VERSION),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Store::default()),
        Err(source) => Err(StateError::Io { path, source }),
    }
}

/// Applies `events` under the lock (held by the caller) and saves. A corrupt
/// file is started afresh (a counter reset, which Prometheus tolerates)
/// rather than blocking every later update; the error is returned beside
/// the store so the caller logs it.
pub fn update(_lock: &StoreLock, runtime_dir: &Path, events: &[Event]) -> (Store, Option<String>) {
    let (mut store, mut error) = match load(runtime_dir) {
        Ok(s) => (s, None),
        Err(e) => (Store::default(), Some(format!("{e}; counters restarted from zero"))),
    };
    for e in events {
        store.apply(e);
    }
    if !events.is_empty() {
        if let Err(e) = write_json(&store_path(runtime_dir), &store) {
            error = Some(e.to_string());
        }
    }
    (store, error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn labels(mode: &str) -> Labels {
        vec![("mode", mode.to_string()), ("outcome", "ok".to_string())]
    }

    #[test]
    fn counters_add_and_histograms_fall_into_their_bucket() {
        let mut s = Store::default();
        for e in [
            Event::count("gpu_mode_prolog_runs_total", labels("mps")),
            Event::count("gpu_mode_prolog_runs_total", labels("mps")),
            Event::count("gpu_mode_prolog_runs_total", labels("mig")),
            Event::Add { family: "gpu_mode_checkpoint_written_bytes_total", labels: vec![], by: 4096.0 },
        ] {
            s.apply(&e);
        }
        let runs = &s.counters["gpu_mode_prolog_runs_total"];
        assert_eq!((runs["{mode=\"mps\",outcome=\"ok\"}"], runs["{mode=\"mig\",outcome=\"ok\"}"]), (2.0, 1.0));
        assert_eq!(s.counters["gpu_mode_checkpoint_written_bytes_total"][""], 4096.0);
        let phase = || vec![("phase", "criu_dump".to_string())];
        let bounds = crate::metrics::family("gpu_mode_checkpoint_phase_duration_seconds").unwrap().buckets;
        // (value, bucket index it must land in)
        let cases = [(0.0, 0), (bounds[0], 0), (bounds[1], 1), (bounds[1] + 1e-9, 2), (1e9, bounds.len())];
        for (value, bucket) in cases {
            let mut s = Store::default();
            s.apply(&Event::Observe { family: "gpu_mode_checkpoint_phase_duration_seconds", labels: phase(), value });
            let h = &s.histograms["gpu_mode_checkpoint_phase_duration_seconds"]["{phase=\"criu_dump\"}"];
            assert_eq!(h.counts.iter().position(|c| *c == 1), Some(bucket), "{value}");
            assert_eq!((h.counts.iter().sum::<u64>(), h.sum), (1, value));
        }
    }

    /// Prologs of different jobs update at the same time: none may be lost.
    #[test]
    fn concurrent_updates_are_not_lost_and_the_file_is_root_only() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().to_path_buf();
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let run = run.clone();
                std::thread::spawn(move || {
                    for _ in 0..25 {
                        let lock = StoreLock::acquire(&run).unwrap();
                        let (_, err) = update(&lock, &run, &[Event::count("gpu_mode_prolog_runs_total", labels("mps"))]);
                        assert_eq!(err, None);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let s = load(&run).unwrap();
        assert_eq!(s.counters["gpu_mode_prolog_runs_total"]["{mode=\"mps\",outcome=\"ok\"}"], 200.0);
        let mode = |p: PathBuf| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode(metrics_dir(&run)), mode(store_path(&run))), (0o700, 0o600));
    }

    #[test]
    fn a_corrupt_file_restarts_the_counters_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let lock = StoreLock::acquire(dir.path()).unwrap();
        std::fs::write(store_path(dir.path()), b"{not json").unwrap();
        let (s, err) = update(&lock, dir.path(), &[Event::count("gpu_mode_drains_total", vec![("source", "prolog".into())])]);
        assert!(err.unwrap().contains("counters restarted from zero"));
        assert_eq!(s.counters["gpu_mode_drains_total"]["{source=\"prolog\"}"], 1.0);
        assert_eq!(load(dir.path()).unwrap(), s, "the fresh counters were saved");
    }
}
