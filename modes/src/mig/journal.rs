//! The per-job MIG journal, `<runtime_dir>/mig/job-<id>.json` (root-only):
//! what the prolog has made so far, saved *before* each change (with the
//! change it is about to make as `pending`) and after it. A prolog killed
//! half-way, or a job state lost, still leaves the epilog (or the next
//! prolog on those GPUs) a list of exactly what to destroy, and nothing of
//! anyone else's.

use crate::grant::MigGrant;
use crate::persist::{parse_versioned, write_json, StateError};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub const JOURNAL_VERSION: u32 = 1;

/// A change in flight: the instance may exist without being listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PendingCreate {
    pub gpu: u32,
    pub profile_id: u32,
    pub start: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigJournal {
    pub version: u32,
    pub job_id: u32,
    pub grant: MigGrant,
    pub pending: Option<PendingCreate>,
}

pub fn journal_dir(runtime_dir: &Path) -> PathBuf {
    runtime_dir.join("mig")
}

fn journal_path(runtime_dir: &Path, job_id: u32) -> PathBuf {
    journal_dir(runtime_dir).join(format!("job-{job_id}.json"))
}

impl MigJournal {
    pub fn new(job_id: u32, uid: u32) -> MigJournal {
        MigJournal { version: JOURNAL_VERSION, job_id, grant: MigGrant { uid, gpus: Vec::new() }, pending: None }
    }

    pub fn save(&self, runtime_dir: &Path) -> Result<(), StateError> {
        let dir = journal_dir(runtime_dir);
        crate::fsutil::ensure_runtime_subdir(runtime_dir, &dir).map_err(|source| StateError::Io { path: dir.clone(), source })?;
        write_json(&journal_path(runtime_dir, self.job_id), self)
    }

    pub fn load(runtime_dir: &Path, job_id: u32) -> Result<Option<MigJournal>, StateError> {
        let path = journal_path(runtime_dir, job_id);
        match std::fs::read(&path) {
            Ok(text) => parse_versioned(&text, &path, JOURNAL_VERSION).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(StateError::Io { path, source }),
        }
    }

    pub fn remove(runtime_dir: &Path, job_id: u32) -> Result<(), StateError> {
        let path = journal_path(runtime_dir, job_id);
        crate::fsutil::remove_if_present(&path).map(|_| ()).map_err(|source| StateError::Io { path, source })
    }

    /// Jobs with a journal on this node.
    pub fn jobs(runtime_dir: &Path) -> Vec<u32> {
        let Ok(entries) = std::fs::read_dir(journal_dir(runtime_dir)) else { return Vec::new() };
        let mut jobs: Vec<u32> = entries
            .filter_map(|e| e.ok()?.file_name().to_str()?.strip_prefix("job-")?.strip_suffix(".json")?.parse().ok())
            .collect();
        jobs.sort_unstable();
        jobs
    }

    /// Whether the journal touches any of `gpus`.
    pub fn touches(&self, gpus: &[u32]) -> bool {
        self.grant.gpus.iter().any(|g| gpus.contains(&g.gpu)) || self.pending.as_ref().is_some_and(|p| gpus.contains(&p.gpu))
    }
}

/// `<runtime>/mig/gpu-<N>.mig-on`: slurm-gpu-mode switched MIG on for
/// jobs on GPU N. The job that switched it on may end before another that
/// made instances on the same GPU meanwhile; its epilog cannot switch MIG
/// off then, so the duty stays with the GPU: whichever epilog leaves it
/// without instances switches MIG off and removes the mark. (Found by
/// tests/tests/fault_prolog_race.rs: two jobs' epilogs in that order left
/// MIG on.)
fn switched_on_path(runtime_dir: &Path, gpu: u32) -> PathBuf {
    journal_dir(runtime_dir).join(format!("gpu-{gpu}.mig-on"))
}

/// Marks GPU `gpu` as switched to MIG by slurm-gpu-mode (before the switch).
pub fn mark_switched_on(runtime_dir: &Path, gpu: u32, job_id: u32) -> Result<(), StateError> {
    let dir = journal_dir(runtime_dir);
    crate::fsutil::ensure_runtime_subdir(runtime_dir, &dir).map_err(|source| StateError::Io { path: dir.clone(), source })?;
    let path = switched_on_path(runtime_dir, gpu);
    crate::fsutil::write_atomic(&path, format!("switched on for job {job_id}\n").as_bytes(), 0o600)
        .map_err(|source| StateError::Io { path, source })
}

/// Whether slurm-gpu-mode switched GPU `gpu` to MIG and nobody switched it back.
pub fn switched_on(runtime_dir: &Path, gpu: u32) -> bool {
    std::fs::symlink_metadata(switched_on_path(runtime_dir, gpu)).is_ok()
}

pub fn clear_switched_on(runtime_dir: &Path, gpu: u32) -> Result<(), StateError> {
    let path = switched_on_path(runtime_dir, gpu);
    crate::fsutil::remove_if_present(&path).map(|_| ()).map_err(|source| StateError::Io { path, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journals_round_trip_list_and_go() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(MigJournal::load(dir.path(), 5).unwrap(), None);
        let mut j = MigJournal::new(5, 1000);
        j.pending = Some(PendingCreate { gpu: 1, profile_id: 9, start: 4 });
        j.save(dir.path()).unwrap();
        MigJournal::new(12, 1000).save(dir.path()).unwrap();
        assert_eq!(MigJournal::load(dir.path(), 5).unwrap(), Some(j.clone()));
        assert_eq!(MigJournal::jobs(dir.path()), vec![5, 12]);
        assert!(j.touches(&[1]) && !j.touches(&[0]));
        use std::os::unix::fs::MetadataExt;
        assert_eq!(std::fs::metadata(journal_dir(dir.path())).unwrap().mode() & 0o777, 0o700);
        MigJournal::remove(dir.path(), 5).unwrap();
        MigJournal::remove(dir.path(), 5).unwrap();
        assert_eq!(MigJournal::jobs(dir.path()), vec![12]);
    }
}
