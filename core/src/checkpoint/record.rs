//! The checkpoint record: which processes were checkpointed, their start
//! times (to detect pid reuse) and GPU footprints (to check free memory before
//! restore). Kept as JSON under `<runtime_dir>/checkpoint/`, root-only.

use super::driver::GpuUuid;
use crate::fsutil;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Footprint {
    pub gpu: GpuUuid,
    pub bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProcessRecord {
    pub pid: i32,
    pub start_time: u64,
    pub footprint: Vec<Footprint>,
}

impl ProcessRecord {
    pub fn bytes(&self) -> u64 {
        self.footprint.iter().map(|f| f.bytes).sum()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CheckpointRecord {
    pub target: String,
    pub created_unix: u64,
    pub processes: Vec<ProcessRecord>,
}

impl CheckpointRecord {
    pub fn path(dir: &Path, key: &str) -> PathBuf {
        dir.join(format!("{key}.json"))
    }

    pub fn save(&self, dir: &Path) -> Result<PathBuf, String> {
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        fsutil::ensure_private_dir(dir, uid, gid, 0o700).map_err(|e| format!("{}: {e}", dir.display()))?;
        let path = Self::path(dir, &self.target);
        let text = serde_json::to_vec_pretty(self).map_err(|e| e.to_string())?;
        fsutil::write_atomic(&path, &text, 0o600).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(path)
    }

    /// `Ok(None)` when there is no record for `key`.
    pub fn load(dir: &Path, key: &str) -> Result<Option<CheckpointRecord>, String> {
        let path = Self::path(dir, key);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| e.to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }

    pub fn remove(dir: &Path, key: &str) -> std::io::Result<bool> {
        fsutil::remove_if_present(&Self::path(dir, key))
    }
}
