//! The node's MPS daemons: one record per daemon, shared by the prologs and
//! epilogs of the jobs that use it, under per-GPU locks.
//!
//! A daemon serves one user on one GPU set (MPS serves one user per GPU at a
//! time). Records live in root-owned `<runtime_dir>/mps-daemons/<key>.json`;
//! the daemon's own directories are `<runtime_dir>/mps/<key>/{pipe,log}`,
//! owned by the user, mode 0700.

use crate::compute_mode::ComputeMode;
use crate::procfs::ProcId;
use crate::persist::{parse_versioned, write_json, StateError};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Version 2: `daemon` may be absent (an intent record written before the
/// daemon is spawned). Version 1 records still load.
pub const REGISTRY_VERSION: u32 = 2;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonRecord {
    pub version: u32,
    pub key: String,
    pub uid: u32,
    pub gid: u32,
    /// NVML indices (not Slurm's: `gpu::slurm_index`), ascending.
    pub gpus: Vec<u32>,
    /// Their UUIDs, same order (what the daemon's CUDA_VISIBLE_DEVICES holds).
    pub gpu_uuids: Vec<String>,
    /// `None` in the intent record saved before the daemon is spawned: a
    /// prolog killed mid-start then leaves a record that says where to look
    /// (processes serving `pipe_dir`) instead of an unknown daemon.
    pub daemon: Option<ProcId>,
    pub pipe_dir: PathBuf,
    pub log_dir: PathBuf,
    /// Jobs using the daemon; it is stopped when the last one ends.
    pub jobs: Vec<u32>,
    /// Compute modes found before the first job changed them; the epilog of
    /// the last job puts these back. Empty when nothing was changed.
    pub saved_compute_modes: Vec<(u32, ComputeMode)>,
}

/// `<uid>-<gpu>_<gpu>...`: one daemon per user and GPU set.
pub fn daemon_key(uid: u32, gpus: &[u32]) -> String {
    let mut sorted = gpus.to_vec();
    sorted.sort_unstable();
    let set: Vec<String> = sorted.iter().map(u32::to_string).collect();
    format!("{uid}-{}", set.join("_"))
}

pub fn registry_dir(runtime_dir: &Path) -> PathBuf {
    runtime_dir.join("mps-daemons")
}

/// Root-owned parent of every daemon's directory.
pub fn daemons_parent(runtime_dir: &Path) -> PathBuf {
    runtime_dir.join("mps")
}

/// The directory holding a daemon's `pipe/` and `log/`.
pub fn daemon_dir(runtime_dir: &Path, key: &str) -> PathBuf {
    daemons_parent(runtime_dir).join(key)
}

/// Creates `<runtime>/mps/<key>/{pipe,log}` for the daemon's user, mode 0700,
/// without a window in which the user could redirect root's chown (audit
/// item C1: see [`crate::fsutil::create_user_tree`]). Returns (pipe, log).
pub fn create_daemon_dirs(runtime_dir: &Path, key: &str, uid: u32, gid: u32) -> std::io::Result<(PathBuf, PathBuf)> {
    let parent = daemons_parent(runtime_dir);
    let (root_uid, root_gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    // Users must reach their own pipe directory through it: 0755, root's;
    // and so must the runtime directory above it, checked first (it is
    // never followed if it is a symlink: tests/planted_paths.rs).
    crate::fsutil::ensure_private_dir(runtime_dir, root_uid, root_gid, 0o755)?;
    crate::fsutil::ensure_private_dir(&parent, root_uid, root_gid, 0o755)?;
    crate::fsutil::create_user_tree(&parent, key, &["pipe", "log"], uid, gid, 0o700)?;
    let dir = daemon_dir(runtime_dir, key);
    Ok((dir.join("pipe"), dir.join("log")))
}

fn record_path(runtime_dir: &Path, key: &str) -> PathBuf {
    registry_dir(runtime_dir).join(format!("{key}.json"))
}

impl DaemonRecord {
    pub fn save(&self, runtime_dir: &Path) -> Result<(), StateError> {
        let dir = registry_dir(runtime_dir);
        // Root-only: the records name users' daemons and directories.
        crate::fsutil::ensure_runtime_subdir(runtime_dir, &dir).map_err(|source| StateError::Io { path: dir.clone(), source })?;
        write_json(&record_path(runtime_dir, &self.key), self)
    }

    pub fn remove(runtime_dir: &Path, key: &str) -> Result<(), StateError> {
        let path = record_path(runtime_dir, key);
        crate::fsutil::remove_if_present(&path).map(|_| ()).map_err(|source| StateError::Io { path, source })
    }

    pub fn load(runtime_dir: &Path, key: &str) -> Result<Option<DaemonRecord>, StateError> {
        let path = record_path(runtime_dir, key);
        match std::fs::read(&path) {
            Ok(text) => Self::parse(&text, &path).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(StateError::Io { path, source }),
        }
    }

    /// Parses a record of this version or of version 1 (whose daemon was
    /// always known).
    fn parse(text: &[u8], path: &Path) -> Result<DaemonRecord, StateError> {
        match parse_versioned::<DaemonRecord>(text, path, REGISTRY_VERSION) {
            Err(StateError::Version { found: 1, .. }) => {
                let mut v1: serde_json::Value = parse_versioned(text, path, 1)?;
                v1["version"] = REGISTRY_VERSION.into();
                serde_json::from_value(v1).map_err(|e| StateError::Corrupt { path: path.to_path_buf(), detail: e.to_string() })
            }
            other => other,
        }
    }

    /// Every record on the node. An unreadable record is an error: a daemon
    /// we cannot account for must not be ignored.
    pub fn all(runtime_dir: &Path) -> Result<Vec<DaemonRecord>, StateError> {
        let dir = registry_dir(runtime_dir);
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(StateError::Io { path: dir, source }),
        };
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(key) = name.strip_suffix(".json") {
                if let Some(rec) = DaemonRecord::load(runtime_dir, key)? {
                    out.push(rec);
                }
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    /// The UUID of `gpu`, or its index when unknown (for messages).
    pub fn gpu_label(&self, gpu: u32) -> String {
        self.gpus
            .iter()
            .position(|g| *g == gpu)
            .and_then(|i| self.gpu_uuids.get(i).cloned())
            .unwrap_or_else(|| gpu.to_string())
    }
}

/// A record for tests of other modules and crates: the daemon `daemon`,
/// directories under `runtime_dir`, nothing to restore.
#[doc(hidden)]
pub fn test_record_for(uid: u32, gpus: &[u32], jobs: &[u32], daemon: ProcId, runtime_dir: &Path) -> DaemonRecord {
    let key = daemon_key(uid, gpus);
    let dir = daemon_dir(runtime_dir, &key);
    DaemonRecord {
        version: REGISTRY_VERSION,
        key,
        uid,
        gid: uid,
        gpus: gpus.to_vec(),
        gpu_uuids: gpus.iter().map(|g| format!("GPU-{g}")).collect(),
        daemon: Some(daemon),
        pipe_dir: dir.join("pipe"),
        log_dir: dir.join("log"),
        jobs: jobs.to_vec(),
        saved_compute_modes: Vec::new(),
    }
}

/// A record for tests (here and in gpu-mode-core's MPS tests): GPU `g` has
/// UUID `GPU-g`, pipe directory `/p`.
#[doc(hidden)]
pub fn test_record(uid: u32, gpus: &[u32], jobs: &[u32]) -> DaemonRecord {
    DaemonRecord {
        version: REGISTRY_VERSION,
        key: daemon_key(uid, gpus),
        uid,
        gid: uid,
        gpus: gpus.to_vec(),
        gpu_uuids: gpus.iter().map(|g| format!("GPU-{g}")).collect(),
        daemon: Some(ProcId { pid: 99, start_time: 5 }),
        pipe_dir: "/p".into(),
        log_dir: "/l".into(),
        jobs: jobs.to_vec(),
        saved_compute_modes: vec![(0, ComputeMode::Default)],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(key: &str, uid: u32, gpus: &[u32], jobs: &[u32]) -> DaemonRecord {
        let r = test_record(uid, gpus, jobs);
        assert_eq!(r.key, key, "test keys follow daemon_key");
        r
    }

    #[test]
    fn keys_name_user_and_sorted_gpu_set() {
        assert_eq!(daemon_key(1001, &[3, 1]), "1001-1_3");
        assert_eq!(daemon_key(0, &[0]), "0-0");
    }

    #[test]
    fn records_round_trip_and_list() {
        let dir = tempfile::tempdir().unwrap();
        assert!(DaemonRecord::all(dir.path()).unwrap().is_empty());
        let a = record("7-0", 7, &[0], &[1, 2]);
        let b = record("8-1_2", 8, &[1, 2], &[3]);
        a.save(dir.path()).unwrap();
        b.save(dir.path()).unwrap();
        assert_eq!(DaemonRecord::load(dir.path(), "7-0").unwrap(), Some(a.clone()));
        assert_eq!(DaemonRecord::all(dir.path()).unwrap(), vec![a, b.clone()]);
        assert_eq!(b.gpu_label(2), "GPU-2");
        assert_eq!(b.gpu_label(5), "5");
        DaemonRecord::remove(dir.path(), "7-0").unwrap();
        DaemonRecord::remove(dir.path(), "7-0").unwrap();
        assert_eq!(DaemonRecord::all(dir.path()).unwrap(), vec![b]);
    }

    #[test]
    fn a_version_1_record_still_loads() {
        let dir = tempfile::tempdir().unwrap();
        let rec = record("7-0", 7, &[0], &[1]);
        rec.save(dir.path()).unwrap();
        let path = registry_dir(dir.path()).join("7-0.json");
        let mut v1: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        v1["version"] = 1.into();
        std::fs::write(&path, serde_json::to_vec(&v1).unwrap()).unwrap();
        assert_eq!(DaemonRecord::load(dir.path(), "7-0").unwrap(), Some(rec));
        v1["version"] = 3.into();
        std::fs::write(&path, serde_json::to_vec(&v1).unwrap()).unwrap();
        let err = DaemonRecord::load(dir.path(), "7-0").unwrap_err().to_string();
        assert!(err.contains("format version 3"), "{err}");
    }

    #[test]
    fn a_corrupt_record_is_an_error_not_ignored() {
        let dir = tempfile::tempdir().unwrap();
        record("7-0", 7, &[0], &[1]).save(dir.path()).unwrap();
        std::fs::write(registry_dir(dir.path()).join("7-0.json"), b"{").unwrap();
        let err = DaemonRecord::all(dir.path()).unwrap_err().to_string();
        assert!(err.contains("7-0.json is corrupt"), "{err}");
    }
}
