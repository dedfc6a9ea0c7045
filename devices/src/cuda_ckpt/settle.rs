//! What the epilog of a checkpoint job does with the checkpoint records
//! (`<runtime_dir>/checkpoint/*.json`) once the job's processes are gone.
//!
//! A record exists so that a locked or checkpointed process can be brought
//! back. When every process it names is gone (pid and start time), nothing
//! can be brought back: the record is stale and removed, whoever wrote it.
//! This is the usual end of a driver call that hung on the preemption path:
//! the watchdog gave up on it, the wrapper killed the application and
//! requeued the job, and the kill ended the call.
//!
//! A process of the ending job that is still alive while a driver call on it
//! never answered (phase `unknown`) is the other end: the call holds it in
//! the kernel, SIGKILL cannot finish, and the GPU it used is stuck. That is
//! the one case that makes the node need service (the caller drains).
//!
//! Anything else is left alone: a record of another job's live process, or
//! a live process of this job that a driver call did answer (someone may
//! still restore it with `gpu-mode-cuda-ckpt restore`), or a record that
//! cannot be read (named in the outcome, never guessed at).

use super::procs::ProcessHost;
use super::record::{CheckpointRecord, ProcessPhase};
use std::path::Path;

/// A process of the ending job held by a driver call that never returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StuckProcess {
    pub job: u32,
    pub pid: i32,
    /// The call, as the record names it (`cuCheckpointProcessLock(pid 7) did
    /// not return within 12 s`).
    pub call: String,
    /// The GPUs it held before the checkpoint (from the record's footprint).
    pub gpus: Vec<String>,
}

impl std::fmt::Display for StuckProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The cause first: a drain reason is cut at 200 bytes.
        let gpus = if self.gpus.is_empty() { "its GPU".to_string() } else { format!("GPU {}", self.gpus.join(",")) };
        write!(f, "{gpus} needs service: job {} ended but its pid {} is stuck: {}", self.job, self.pid, self.call)
    }
}

/// What [`settle_records`] found, by record key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settled {
    /// Records removed: every process they name is gone.
    pub removed: Vec<String>,
    /// Records left: a process they name is alive.
    pub kept: Vec<String>,
    /// Records that could not be read or removed, with why.
    pub unreadable: Vec<String>,
    pub stuck: Vec<StuckProcess>,
}

impl Settled {
    /// One line for the epilog's log, `None` when there was nothing to say.
    pub fn summary(&self) -> Option<String> {
        let mut parts = Vec::new();
        if !self.removed.is_empty() {
            parts.push(format!("stale checkpoint records removed: {}", self.removed.join(",")));
        }
        if !self.kept.is_empty() {
            parts.push(format!("checkpoint records of live processes kept: {}", self.kept.join(",")));
        }
        if !self.unreadable.is_empty() {
            parts.push(format!("checkpoint records left unread: {}", self.unreadable.join("; ")));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

/// Settles the records in `dir` at the end of `job` (see the module docs).
/// A missing directory is an empty one.
pub fn settle_records(dir: &Path, host: &dyn ProcessHost, job: u32) -> Settled {
    let mut out = Settled::default();
    let Ok(entries) = std::fs::read_dir(dir) else { return out };
    let mut keys: Vec<String> =
        entries.filter_map(|e| e.ok()?.file_name().to_str()?.strip_suffix(".json").map(str::to_string)).collect();
    keys.sort();
    // The job's processes still here after Slurm ended it: a /proc scan,
    // made only when a record has a live process with an unanswered call
    // (this runs in every epilog).
    let mut survivors: Option<Vec<i32>> = None;
    for key in keys {
        let record = match CheckpointRecord::load(dir, &key) {
            Ok(Some(r)) => r,
            // Removed meanwhile (another epilog, a restore).
            Ok(None) => continue,
            Err(e) => {
                out.unreadable.push(format!("{key}: {e}"));
                continue;
            }
        };
        let alive: Vec<_> = record.processes.iter().filter(|p| host.start_time(p.pid) == Some(p.start_time)).collect();
        if alive.is_empty() {
            match CheckpointRecord::remove(dir, &key) {
                Ok(_) => out.removed.push(key),
                Err(e) => out.unreadable.push(format!("{key}: cannot remove: {e}")),
            }
            continue;
        }
        for p in alive.iter().filter(|p| p.phase == ProcessPhase::Unknown) {
            let survivors = survivors.get_or_insert_with(|| host.job_processes(job).map(|(pids, _)| pids).unwrap_or_default());
            if !survivors.contains(&p.pid) {
                continue;
            }
            out.stuck.push(StuckProcess {
                job,
                pid: p.pid,
                call: p.unanswered.clone().unwrap_or_else(|| "a driver call did not return".into()),
                gpus: p.footprint.iter().map(|f| f.gpu.to_string()).collect(),
            });
        }
        out.kept.push(key);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda_ckpt::driver::GpuUuid;
    use crate::cuda_ckpt::procs::{FoundBy, HostError, NvidiaFile};
    use crate::cuda_ckpt::record::{Footprint, ProcessRecord, RecordStatus, RECORD_VERSION};
    use std::collections::BTreeMap;

    /// Live processes (pid → start time) and the ending job's survivors.
    struct Host {
        live: BTreeMap<i32, u64>,
        job: Vec<i32>,
    }

    impl ProcessHost for Host {
        fn job_processes(&self, _job: u32) -> Result<(Vec<i32>, FoundBy), HostError> {
            Ok((self.job.clone(), FoundBy::Cgroup))
        }
        fn with_descendants(&self, pid: i32) -> Vec<i32> {
            vec![pid]
        }
        fn nvidia_files(&self, _pid: i32) -> Result<Vec<NvidiaFile>, HostError> {
            Ok(Vec::new())
        }
        fn start_time(&self, pid: i32) -> Option<u64> {
            self.live.get(&pid).copied()
        }
    }

    fn record(key: &str, procs: &[(i32, u64, ProcessPhase)]) -> CheckpointRecord {
        CheckpointRecord {
            version: RECORD_VERSION,
            target: key.into(),
            created_unix: 1,
            status: RecordStatus::InProgress,
            processes: procs
                .iter()
                .map(|&(pid, start_time, phase)| ProcessRecord {
                    pid,
                    start_time,
                    footprint: vec![Footprint { gpu: GpuUuid([7; 16]), bytes: 8 << 20 }],
                    phase,
                    unanswered: (phase == ProcessPhase::Unknown).then(|| format!("cuCheckpointProcessLock(pid {pid}) did not return within 3 s")),
                })
                .collect(),
        }
    }

    fn keys(dir: &Path) -> Vec<String> {
        let mut k: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        k.sort();
        k
    }

    /// Each row: the record's processes, what is alive, the job's
    /// survivors → removed?, stuck pids.
    #[test]
    fn records_are_removed_kept_or_drained_by_who_is_still_alive() {
        use ProcessPhase::*;
        type Row = (&'static str, Vec<(i32, u64, ProcessPhase)>, Vec<(i32, u64)>, Vec<i32>, bool, Vec<i32>);
        let rows: Vec<Row> = vec![
            ("hung lock, app killed", vec![(10, 5, Unknown)], vec![], vec![], true, vec![]),
            ("pid reused by another process", vec![(10, 5, Unknown)], vec![(10, 99)], vec![10], true, vec![]),
            ("hung lock, app survives its job", vec![(10, 5, Unknown)], vec![(10, 5)], vec![10], false, vec![10]),
            ("hung call in another job's live process", vec![(10, 5, Unknown)], vec![(10, 5)], vec![], false, vec![]),
            ("locked process of this job, call answered", vec![(10, 5, Locked)], vec![(10, 5)], vec![10], false, vec![]),
            ("complete checkpoint, process gone", vec![(10, 5, Checkpointed), (11, 6, Checkpointed)], vec![], vec![], true, vec![]),
            ("one of two still alive", vec![(10, 5, Checkpointed), (11, 6, Unknown)], vec![(11, 6)], vec![11], false, vec![11]),
        ];
        for (name, procs, live, job, removed, stuck) in rows {
            let dir = tempfile::tempdir().unwrap();
            record("pid-10", &procs).save(dir.path()).unwrap();
            let host = Host { live: live.into_iter().collect(), job };
            let s = settle_records(dir.path(), &host, 42);
            assert_eq!(s.removed == ["pid-10"], removed, "{name}: {s:?}");
            assert_eq!(keys(dir.path()).is_empty(), removed, "{name}");
            assert_eq!(s.stuck.iter().map(|p| p.pid).collect::<Vec<_>>(), stuck, "{name}: {s:?}");
        }
    }

    #[test]
    fn a_stuck_process_names_its_call_and_gpu() {
        let dir = tempfile::tempdir().unwrap();
        record("pid-10", &[(10, 5, ProcessPhase::Unknown)]).save(dir.path()).unwrap();
        let host = Host { live: [(10, 5)].into(), job: vec![10] };
        let s = settle_records(dir.path(), &host, 42);
        let text = s.stuck[0].to_string();
        assert_eq!(
            text,
            "GPU GPU-07070707-0707-0707-0707-070707070707 needs service: job 42 ended but its pid 10 is stuck: \
             cuCheckpointProcessLock(pid 10) did not return within 3 s"
        );
        // As a drain reason, with the largest pids and job ids, it is not cut.
        let call = "cuCheckpointProcessLock(pid 4194304) did not return within 3600 s".to_string();
        let reason = format!("gpu-mode: epilog: {}", StuckProcess { job: 4_294_967_295, pid: 4_194_304, call, ..s.stuck[0].clone() });
        assert!(reason.len() <= crate::drain::MAX_REASON_LEN, "{} bytes: {reason}", reason.len());
    }

    #[test]
    fn unreadable_records_are_named_and_left_and_a_missing_dir_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pid-3.json"), b"{ not json").unwrap();
        std::fs::write(dir.path().join("pid-4.json"), br#"{"version":9}"#).unwrap();
        let host = Host { live: BTreeMap::new(), job: vec![] };
        let s = settle_records(dir.path(), &host, 1);
        assert_eq!(s.unreadable.len(), 2, "{s:?}");
        assert!(s.unreadable[1].contains("record format version 9 is newer"), "{s:?}");
        assert_eq!(keys(dir.path()), ["pid-3.json", "pid-4.json"]);
        assert!(s.summary().unwrap().contains("checkpoint records left unread: pid-3: "), "{:?}", s.summary());
        assert_eq!(settle_records(&dir.path().join("absent"), &host, 1), Settled::default());
        assert_eq!(Settled::default().summary(), None);
    }
}
