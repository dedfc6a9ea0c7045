//! Versioned JSON records written atomically: the job state, the MPS daemon
//! registry, MIG records. A leaf, so every module that keeps a record can
//! use it without importing the others.

use crate::fsutil;
use serde::Serialize;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("job {job_id}: no state file {path}: the gpu-mode prolog did not prepare this job on this node (is Prolog= set to gpu-mode-prolog with PrologFlags=Alloc?)")]
    Missing { job_id: u32, path: PathBuf },
    #[error("state file {path} is corrupt: {detail}")]
    Corrupt { path: PathBuf, detail: String },
    #[error("state file {path} has format version {found}, this build reads version {expected}: were the plugin and the helpers upgraded separately?")]
    Version { path: PathBuf, found: u64, expected: u32 },
    #[error("job {job_id} cannot run on this node: {reason}")]
    Refused { job_id: u32, reason: String },
    #[error("job {job_id}: the gpu-mode prolog did not finish preparing this job on this node (see the node's log)")]
    Unfinished { job_id: u32 },
    #[error("state file {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// Seconds since the epoch, as the records stamp it (0 if the clock is set
/// before 1970).
pub fn now_unix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Parses a JSON state file that carries a `version` field. The version is
/// read first, so a future format gives a version error, not a confusing
/// field error.
pub fn parse_versioned<T: serde::de::DeserializeOwned>(text: &[u8], path: &Path, expected: u32) -> Result<T, StateError> {
    let corrupt = |detail: String| StateError::Corrupt { path: path.to_path_buf(), detail };
    let value: serde_json::Value = serde_json::from_slice(text).map_err(|e| corrupt(e.to_string()))?;
    let found = value
        .get("version")
        .and_then(|v| v.as_u64())
        .ok_or_else(|| corrupt("no integer \"version\" field".into()))?;
    if found != expected as u64 {
        return Err(StateError::Version { path: path.to_path_buf(), found, expected });
    }
    from_value_named(value).map_err(corrupt)
}

/// `serde_json::from_value`, with the failing field's path in the error
/// (`grant.gpus[0].uuid: invalid type: null, expected a string`): from a
/// `Value` serde_json has no line or column to give, and an admin looking
/// at a corrupt file needs to know where.
pub fn from_value_named<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<T, String> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        if path == "." {
            e.into_inner().to_string()
        } else {
            format!("{path}: {}", e.into_inner())
        }
    })
}

/// Writes a state value as pretty JSON, atomically, mode 0600: state files
/// are root's (the plugin reads them in slurmstepd before it drops
/// privileges), so no user learns another job's directories or daemons.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), StateError> {
    let mut text = serde_json::to_vec_pretty(value).map_err(|e| StateError::Corrupt { path: path.to_path_buf(), detail: e.to_string() })?;
    text.push(b'\n');
    fsutil::write_atomic(path, &text, 0o600).map_err(|source| StateError::Io { path: path.to_path_buf(), source })
}
