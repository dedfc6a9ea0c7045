//! Per-job state: the channel from the prolog (root, slurmd) to the plugin in
//! slurmstepd, and from the prolog to the epilog.
//!
//! One JSON file per job at `<runtime_dir>/jobs/<job id>.json`, written
//! atomically by the prolog, read by the plugin before tasks start, removed by
//! the epilog. The format carries a version; a reader refuses any other version
//! with a clear error rather than guessing.

use crate::fsutil;
use crate::grant::GrantRecord;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Bump when a field changes meaning or a required field is added.
/// Version 2 added `status`, `grant` (what the job's mode made, replacing
/// `mps_daemon`) and `per_task_env`; version 1 files still load (as `ready`,
/// their `mps_daemon` as an MPS grant).
pub const STATE_VERSION: u32 = 2;

/// Where the prolog is with a job. The prolog saves `preparing` before it
/// takes any lock or changes anything, so from then on the job counts as live
/// on this node (another job's epilog must not stop a daemon it is joining:
/// audit item M1), and a prolog killed half-way leaves a state the epilog
/// recognises and cleans up after.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    Preparing,
    Ready,
}

/// What the prolog decided for one job on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobState {
    pub version: u32,
    pub status: JobStatus,
    pub job_id: u32,
    pub uid: u32,
    pub gid: u32,
    pub user: String,
    pub node: String,
    /// The job's mode in canonical form (`GpuMode`'s Display).
    pub mode: String,
    /// NVML indices of the job's GPUs on this node (the prolog maps Slurm's:
    /// `gpu::slurm_index`); empty for a refused job.
    pub gpus: Vec<u32>,
    /// Environment the plugin sets in every task of the job.
    pub task_env: BTreeMap<String, String>,
    /// Environment that differs per task: the task with node-local id `i`
    /// gets `values[i % len]` (e.g. one MIG device each).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub per_task_env: BTreeMap<String, Vec<String>>,
    /// Set when the prolog could not give the job its mode on this node for a
    /// reason that is the job's, not the node's (e.g. a MIG profile this GPU
    /// lacks): the plugin fails the job's tasks with this message.
    pub refusal: Option<String>,
    /// Seconds since the epoch when the prolog wrote the state.
    pub created_unix: u64,
    /// What the job's mode made on this node, for the epilog to undo.
    #[serde(default)]
    pub grant: GrantRecord,
}




pub use crate::persist::{parse_versioned, write_json, StateError};
pub use crate::runtime::{jobs_dir, state_path};

impl JobState {
    /// Writes the state atomically (mode 0600: the plugin reads it as root in
    /// slurmstepd's task_init_privileged). Creates the root-owned directories
    /// on first use.
    pub fn save(&self, runtime_dir: &Path) -> Result<PathBuf, StateError> {
        let path = state_path(runtime_dir, self.job_id);
        let io = |source| StateError::Io { path: path.clone(), source };
        // The job states are root's alone.
        fsutil::ensure_runtime_subdir(runtime_dir, &jobs_dir(runtime_dir)).map_err(io)?;
        // Dates the records of this boot (runtime::clear_previous_boot).
        crate::runtime::stamp_boot_if_absent(runtime_dir);
        write_json(&path, self)?;
        Ok(path)
    }

    /// Reads a job's state; see [`StateError`] for each failure.
    pub fn load(runtime_dir: &Path, job_id: u32) -> Result<JobState, StateError> {
        let path = state_path(runtime_dir, job_id);
        let text = match std::fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(StateError::Missing { job_id, path })
            }
            Err(source) => return Err(StateError::Io { path, source }),
        };
        Self::parse(&text, &path, job_id)
    }

    /// Loads a job's state if present; `Ok(None)` when the job has none.
    pub fn load_if_present(runtime_dir: &Path, job_id: u32) -> Result<Option<JobState>, StateError> {
        match Self::load(runtime_dir, job_id) {
            Ok(s) => Ok(Some(s)),
            Err(StateError::Missing { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Parses the text of job `job_id`'s state file (`path` names it in
    /// errors): version 2, or version 1 converted. Public for the fuzzer
    /// and the round-trip properties: it is what every reader runs on bytes
    /// a crash or a disk fault may have mangled.
    pub fn parse(text: &[u8], path: &Path, job_id: u32) -> Result<JobState, StateError> {
        let state: JobState = match parse_versioned(text, path, STATE_VERSION) {
            Err(StateError::Version { found: 1, .. }) => {
                let mut v1: serde_json::Value = parse_versioned(text, path, 1)?;
                v1["version"] = STATE_VERSION.into();
                v1["status"] = "ready".into();
                if let Some(obj) = v1.as_object_mut() {
                    let grant = match obj.remove("mps_daemon") {
                        Some(serde_json::Value::String(key)) => serde_json::json!({ "kind": "mps", "daemon": key }),
                        _ => serde_json::json!({ "kind": "none" }),
                    };
                    obj.insert("grant".into(), grant);
                }
                crate::persist::from_value_named(v1).map_err(|detail| StateError::Corrupt { path: path.to_path_buf(), detail })?
            }
            other => other?,
        };
        if state.job_id != job_id {
            return Err(StateError::Corrupt {
                path: path.to_path_buf(),
                detail: format!("it names job {}, expected job {job_id}", state.job_id),
            });
        }
        Ok(state)
    }

    /// See [`crate::runtime::job_is_live`].
    pub fn is_live(runtime_dir: &Path, job_id: u32) -> bool {
        crate::runtime::job_is_live(runtime_dir, job_id)
    }

    /// Removes a job's state; absent state is success (idempotent epilog).
    pub fn remove(runtime_dir: &Path, job_id: u32) -> Result<bool, StateError> {
        let path = state_path(runtime_dir, job_id);
        fsutil::remove_if_present(&path).map_err(|source| StateError::Io { path, source })
    }
}

/// Live job states; unreadable ones are skipped (the prolog owns them).
pub fn live_jobs(runtime_dir: &Path) -> Vec<JobState> {
    let Ok(entries) = std::fs::read_dir(jobs_dir(runtime_dir)) else { return Vec::new() };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.strip_suffix(".json")?.parse::<u32>().ok())
        .filter_map(|id| JobState::load(runtime_dir, id).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(job_id: u32) -> JobState {
        JobState {
            version: STATE_VERSION,
            status: JobStatus::Ready,
            job_id,
            uid: 1000,
            gid: 1000,
            user: "alice".into(),
            node: "n1".into(),
            mode: "mps:threads=25".into(),
            gpus: vec![0, 3],
            task_env: [("SLURM_GPU_MODE".to_string(), "mps:threads=25".to_string())].into(),
            refusal: None,
            created_unix: 1_700_000_000,
            per_task_env: BTreeMap::new(),
            grant: GrantRecord::Mps { daemon: "1000-0_3".into() },
        }
    }

    #[test]
    fn save_then_load_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = sample(42).save(dir.path()).unwrap();
        assert_eq!(path, dir.path().join("jobs/42.json"));
        assert_eq!(JobState::load(dir.path(), 42).unwrap(), sample(42));
    }

    #[test]
    fn missing_state_is_a_clear_error_and_load_if_present_gives_none() {
        let dir = tempfile::tempdir().unwrap();
        let err = JobState::load(dir.path(), 7).unwrap_err().to_string();
        assert!(err.contains("job 7: no state file") && err.contains("PrologFlags=Alloc"), "{err}");
        assert_eq!(JobState::load_if_present(dir.path(), 7).unwrap(), None);
    }

    #[test]
    fn corrupt_and_foreign_state_files_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        sample(9).save(dir.path()).unwrap();
        let path = state_path(dir.path(), 9);
        let good = serde_json::to_value(sample(9)).unwrap();
        let with = |k: &str, v: serde_json::Value| {
            let mut x = good.clone();
            x[k] = v;
            serde_json::to_vec(&x).unwrap()
        };
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"{\"version\":1,\"job_id\":".to_vec(), "is corrupt"),
            (b"".to_vec(), "is corrupt"),
            (b"[]".to_vec(), "no integer \"version\""),
            (with("version", 3.into()), "format version 3"),
            (with("status", "done".into()), "unknown variant"),
            (with("job_id", 10.into()), "names job 10, expected job 9"),
            (with("gpus", "0,1".into()), "is corrupt: gpus: invalid type: string"),
            // The field is named (found by tests/state_properties.rs: a
            // mistyped field gave only "invalid type: null, expected a string").
            (with("node", serde_json::Value::Null), "is corrupt: node: invalid type: null"),
            (with("extra", 1.into()), "unknown field"),
        ];
        for (bytes, needle) in cases {
            std::fs::write(&path, &bytes).unwrap();
            let err = JobState::load(dir.path(), 9).unwrap_err().to_string();
            assert!(err.contains(needle), "{:?}: {err:?} lacks {needle:?}", String::from_utf8_lossy(&bytes));
            assert!(err.contains("9.json"), "{err}");
        }
    }

    #[test]
    fn a_version_1_state_loads_as_ready() {
        let dir = tempfile::tempdir().unwrap();
        sample(9).save(dir.path()).unwrap();
        let path = state_path(dir.path(), 9);
        let mut v1 = serde_json::to_value(sample(9)).unwrap();
        v1["version"] = 1.into();
        v1.as_object_mut().unwrap().remove("status");
        v1.as_object_mut().unwrap().remove("grant");
        v1["mps_daemon"] = "1000-0_3".into();
        std::fs::write(&path, serde_json::to_vec(&v1).unwrap()).unwrap();
        assert_eq!(JobState::load(dir.path(), 9).unwrap(), sample(9));
    }

    #[test]
    fn state_files_are_root_only_and_liveness_is_their_existence() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        assert!(!JobState::is_live(dir.path(), 5));
        let path = sample(5).save(dir.path()).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(jobs_dir(dir.path())).unwrap().mode() & 0o777, 0o700);
        assert!(JobState::is_live(dir.path(), 5));
        // A corrupt state still means the epilog has not run yet.
        std::fs::write(&path, b"{").unwrap();
        assert!(JobState::is_live(dir.path(), 5));
        JobState::remove(dir.path(), 5).unwrap();
        assert!(!JobState::is_live(dir.path(), 5));
    }

    #[test]
    fn remove_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        sample(5).save(dir.path()).unwrap();
        assert!(JobState::remove(dir.path(), 5).unwrap());
        assert!(!JobState::remove(dir.path(), 5).unwrap());
        assert!(!state_path(dir.path(), 5).exists());
    }
}
