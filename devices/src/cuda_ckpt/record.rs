//! The checkpoint record: which processes a checkpoint touched and how far
//! each got, their start times (to detect pid reuse) and GPU footprints (to
//! check free memory before restore). Kept as JSON under
//! `<runtime_dir>/checkpoint/`, root-only, rewritten atomically at each step.
//!
//! It is written before the first process is locked and before every step
//! that changes processes, naming the step about to run (`locking`,
//! `checkpointing`). So whatever stops a checkpoint half-way (a failed write,
//! a kill, a call that never returns), the record on disk names every process
//! that may be locked or checkpointed, and `restore` can bring them back.

use super::driver::GpuUuid;
use super::parallel::Phase;
use crate::fsutil;
use std::path::{Path, PathBuf};

/// The format written now. Version 1 (no `version` field) was written only
/// after a complete checkpoint; it loads as `complete`, every process
/// `checkpointed`.
pub const RECORD_VERSION: u32 = 2;

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Footprint {
    pub gpu: GpuUuid,
    pub bytes: u64,
}

/// How far the checkpoint as a whole got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordStatus {
    /// A checkpoint is running, or stopped before it finished or was undone
    /// (killed, or the record could not be updated).
    InProgress,
    /// Every process is checkpointed: `restore` brings the job back.
    Complete,
    /// The checkpoint failed and every process it touched runs again.
    RolledBack,
    /// The checkpoint failed and some processes could not be put back:
    /// `restore` recovers them.
    RollbackIncomplete,
}

/// How far one process got. `locking`/`checkpointing` are written before the
/// step runs: the process may be in either state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessPhase {
    /// In scope, not touched yet.
    Found,
    Locking,
    Locked,
    Checkpointing,
    Checkpointed,
    /// Touched, then put back to running by a rollback.
    Running,
    /// A driver call on it did not return (see `unanswered`): its state is
    /// unknown until the driver is asked again.
    Unknown,
}

impl ProcessPhase {
    /// Whether the process may be locked or checkpointed.
    pub fn touched(self) -> bool {
        !matches!(self, ProcessPhase::Found | ProcessPhase::Running)
    }

    pub fn name(self) -> &'static str {
        match self {
            ProcessPhase::Found => "found",
            ProcessPhase::Locking => "locking",
            ProcessPhase::Locked => "locked",
            ProcessPhase::Checkpointing => "checkpointing",
            ProcessPhase::Checkpointed => "checkpointed",
            ProcessPhase::Running => "running",
            ProcessPhase::Unknown => "unknown",
        }
    }
}

impl RecordStatus {
    pub fn name(self) -> &'static str {
        match self {
            RecordStatus::InProgress => "in_progress",
            RecordStatus::Complete => "complete",
            RecordStatus::RolledBack => "rolled_back",
            RecordStatus::RollbackIncomplete => "rollback_incomplete",
        }
    }
}

fn version_1() -> u32 {
    1
}
fn complete() -> RecordStatus {
    RecordStatus::Complete
}
fn checkpointed() -> ProcessPhase {
    ProcessPhase::Checkpointed
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProcessRecord {
    pub pid: i32,
    pub start_time: u64,
    pub footprint: Vec<Footprint>,
    #[serde(default = "checkpointed")]
    pub phase: ProcessPhase,
    /// The call that did not return, when `phase` is `unknown`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unanswered: Option<String>,
}

impl ProcessRecord {
    pub fn bytes(&self) -> u64 {
        self.footprint.iter().map(|f| f.bytes).sum()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CheckpointRecord {
    #[serde(default = "version_1")]
    pub version: u32,
    pub target: String,
    pub created_unix: u64,
    #[serde(default = "complete")]
    pub status: RecordStatus,
    pub processes: Vec<ProcessRecord>,
}

/// Why a checkpoint record could not be written or read. The callers add
/// which record and what it means for the processes (CheckpointError::Record).
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The record directory could not be made root's and private.
    #[error("{dir}: {source}")]
    Dir { dir: PathBuf, source: std::io::Error },
    #[error("{0}")]
    Encode(serde_json::Error),
    #[error("{path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    /// Reading an existing record (a missing one is `Ok(None)`).
    #[error("{0}")]
    Read(std::io::Error),
    #[error("{0}")]
    Corrupt(serde_json::Error),
    /// Written by a newer gpu-mode-cuda-ckpt: named as such rather than as
    /// whatever field fails to parse.
    #[error("record format version {version} is newer than this gpu-mode-cuda-ckpt reads (up to {RECORD_VERSION}): use the version that wrote it")]
    Newer { version: u32 },
}

/// Only the version, read first so a newer format is named as such rather
/// than as whatever field fails to parse.
#[derive(serde::Deserialize)]
struct Header {
    #[serde(default = "version_1")]
    version: u32,
}

impl CheckpointRecord {
    pub fn path(dir: &Path, key: &str) -> PathBuf {
        dir.join(format!("{key}.json"))
    }

    pub fn save(&self, dir: &Path) -> Result<PathBuf, RecordError> {
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        fsutil::ensure_private_dir(dir, uid, gid, 0o700).map_err(|source| RecordError::Dir { dir: dir.to_path_buf(), source })?;
        let path = Self::path(dir, &self.target);
        let text = serde_json::to_vec_pretty(self).map_err(RecordError::Encode)?;
        if let Err(source) = fsutil::write_atomic(&path, &text, 0o600) {
            return Err(RecordError::Write { path, source });
        }
        Ok(path)
    }

    /// `Ok(None)` when there is no record for `key`.
    pub fn load(dir: &Path, key: &str) -> Result<Option<CheckpointRecord>, RecordError> {
        let path = Self::path(dir, key);
        match std::fs::read(&path) {
            Ok(bytes) => Self::parse(&bytes).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(RecordError::Read(e)),
        }
    }

    fn parse(bytes: &[u8]) -> Result<CheckpointRecord, RecordError> {
        let header: Header = serde_json::from_slice(bytes).map_err(RecordError::Corrupt)?;
        if header.version > RECORD_VERSION {
            return Err(RecordError::Newer { version: header.version });
        }
        serde_json::from_slice(bytes).map_err(RecordError::Corrupt)
    }

    pub fn remove(dir: &Path, key: &str) -> std::io::Result<bool> {
        fsutil::remove_if_present(&Self::path(dir, key))
    }

    /// Sets the phase of each of `pids`.
    pub fn mark(&mut self, pids: &[i32], phase: ProcessPhase) {
        for p in self.processes.iter_mut().filter(|p| pids.contains(&p.pid)) {
            p.phase = phase;
        }
    }

    /// Records the outcome of a step: `done` where it succeeded, `failed`
    /// where the driver refused, `unknown` where it did not answer.
    pub fn settle(&mut self, step: &Phase, done: ProcessPhase, failed: ProcessPhase) {
        for run in &step.runs {
            if let Some(p) = self.processes.iter_mut().find(|p| p.pid == run.pid) {
                p.phase = if run.result.is_ok() { done } else { failed };
            }
        }
        self.note_unanswered(step);
    }

    /// Marks `unknown`, naming the call, each process whose call in `step`
    /// did not answer. Returns whether there was any.
    pub fn note_unanswered(&mut self, step: &Phase) -> bool {
        let mut any = false;
        for run in &step.runs {
            let Err(e) = &run.result else { continue };
            if let Some(p) = self.processes.iter_mut().find(|p| p.pid == run.pid).filter(|_| e.unanswered()) {
                p.phase = ProcessPhase::Unknown;
                p.unanswered = Some(e.to_string());
                any = true;
            }
        }
        any
    }

    pub fn pids_in(&self, phase: ProcessPhase) -> Vec<i32> {
        self.processes.iter().filter(|p| p.phase == phase).map(|p| p.pid).collect()
    }

    pub fn any_touched(&self) -> bool {
        self.processes.iter().any(|p| p.phase.touched())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_1_record_loads_as_a_complete_checkpoint() {
        let v1 = r#"{"target":"pid-7","created_unix":5,"processes":[{"pid":7,"start_time":9,"footprint":[]}]}"#;
        let r = CheckpointRecord::parse(v1.as_bytes()).unwrap();
        assert_eq!((r.version, r.status), (1, RecordStatus::Complete));
        assert_eq!(r.processes[0].phase, ProcessPhase::Checkpointed);
    }

    #[test]
    fn a_newer_record_is_refused_by_its_version() {
        let v9 = r#"{"version":9,"target":"pid-7","shape":"new"}"#;
        let err = CheckpointRecord::parse(v9.as_bytes()).unwrap_err();
        assert!(matches!(err, RecordError::Newer { version: 9 }), "{err:?}");
        let err = err.to_string();
        assert!(err.contains("record format version 9 is newer than this gpu-mode-cuda-ckpt reads (up to 2)"), "{err}");
        assert!(err.ends_with("(up to 2): use the version that wrote it"), "{err}");
    }
}
