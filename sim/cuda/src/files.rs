//! The simulation's shared directory: one folder per CUDA process (where the
//! checkpointer's requests and the process's answers meet), one folder per
//! GPU (the "device memory" files), and the fault file.
//!
//! ```text
//! <dir>/procs/<pid>/request.json    written by the caller (cuCheckpointProcess*)
//! <dir>/procs/<pid>/response.json   written by the process's driver thread
//! <dir>/procs/<pid>/state.json      the process's state, republished by it
//! <dir>/gpus/<uuid>/<pid>-<n>.mem   device memory of allocation n
//! <dir>/faults.json                 injected faults (cuda-sim-ctl)
//! ```
//!
//! Every file is written whole to a temporary name and renamed, so a reader
//! never sees half a message, and no descriptor stays open between calls (a
//! CRIU dump of the process must not find one).

use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The directory; when unset, `<GPU_MODE_SIM_STATE>.cuda` (next to the NVML
/// simulation's state file, so one variable describes the simulated node).
pub const DIR_ENV: &str = "GPU_MODE_CUDA_SIM_DIR";

/// A call from a checkpointer to a process's driver thread.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Call {
    State,
    RestoreThreadId,
    Lock { timeout_ms: u32 },
    Checkpoint,
    /// `(old uuid, new uuid)` pairs; empty: the GPUs it was checkpointed on.
    Restore { pairs: Vec<(String, String)> },
    Unlock,
}

impl Call {
    /// The driver's name of the call, as faults name it.
    pub fn name(&self) -> &'static str {
        match self {
            Call::State => "get_state",
            Call::RestoreThreadId => "get_restore_thread_id",
            Call::Lock { .. } => "lock",
            Call::Checkpoint => "checkpoint",
            Call::Restore { .. } => "restore",
            Call::Unlock => "unlock",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Request {
    pub id: u64,
    pub call: Call,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Response {
    pub id: u64,
    pub code: u32,
    /// The state (GetState) or thread id (GetRestoreThreadId).
    pub value: i64,
}

/// What a process publishes about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Published {
    pub pid: i32,
    /// From /proc/<pid>/stat: changes when CRIU restores the process, so a
    /// stale file of a dumped process is told apart from the live one.
    pub start_time: u64,
    pub state: i32,
    pub restore_tid: i32,
    /// (GPU uuid, bytes) of each allocation, wherever it is now.
    pub memory: Vec<(String, u64)>,
}

/// What an injected fault does to the calls it matches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// The call returns this CUDA error and changes nothing.
    Fail { code: u32 },
    /// The call never returns (a GPU stuck in the kernel).
    Hang,
    /// The call waits this long, then runs.
    DelayMs { ms: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    /// A call name as [`Call::name`] gives it.
    pub call: String,
    /// Only this process; every process when `None`.
    pub pid: Option<i32>,
    pub action: Action,
}

#[derive(Debug, Clone)]
pub struct SimDir {
    pub root: PathBuf,
}

impl SimDir {
    /// The directory the environment names, created world-writable with the
    /// sticky bit (like /tmp) so root checkpointers and user processes share it.
    /// Without `GPU_MODE_CUDA_SIM_DIR`, it is beside the simulated NVML's state
    /// file, found as the simulated NVML finds it: `GPU_MODE_SIM_STATE`, else
    /// its pointer file, which is all an installed package's prolog and the
    /// checkpoint agent it starts have (scripts/test-install.sh).
    pub fn from_env() -> Result<SimDir, String> {
        let root = match std::env::var_os(DIR_ENV).filter(|v| !v.is_empty()) {
            Some(dir) => PathBuf::from(dir),
            None => {
                let state = nvml_sim::store::state_path_from_env()
                    .map_err(|e| format!("{DIR_ENV} is not set, and {e}"))?;
                let mut s = state.into_os_string();
                s.push(".cuda");
                PathBuf::from(s)
            }
        };
        let dir = SimDir { root };
        for d in [dir.root.clone(), dir.root.join("procs"), dir.root.join("gpus")] {
            shared_dir(&d)?;
        }
        Ok(dir)
    }

    pub fn proc_dir(&self, pid: i32) -> PathBuf {
        self.root.join("procs").join(pid.to_string())
    }

    pub fn gpu_dir(&self, uuid: &str) -> PathBuf {
        self.root.join("gpus").join(uuid)
    }

    pub fn faults_path(&self) -> PathBuf {
        self.root.join("faults.json")
    }

    pub fn faults(&self) -> Vec<Fault> {
        read_json(&self.faults_path()).unwrap_or_default()
    }

    pub fn set_faults(&self, faults: &[Fault]) -> Result<(), String> {
        write_json(&self.faults_path(), &faults)
    }

    /// The first fault matching `call` on `pid`.
    pub fn fault_for(&self, call: &str, pid: i32) -> Option<Action> {
        self.faults().into_iter().find(|f| f.call == call && f.pid.is_none_or(|p| p == pid)).map(|f| f.action)
    }
}

/// Creates `dir` (mode 1777) if missing.
pub fn shared_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777)).map_err(|e| format!("chmod {}: {e}", dir.display()))
}

pub fn read_json<T: DeserializeOwned>(path: &Path) -> Option<T> {
    let bytes = std::fs::read(path).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Writes `value` to a temporary file beside `path` and renames it over
/// `path`: readers see the old or the new file, never a torn one. Mode 0666:
/// the other side (root or the user) replaces it next.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.{}.{}", std::process::id(), nanos()));
    let text = serde_json::to_vec(value).map_err(|e| e.to_string())?;
    let result = (|| {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o666).open(&tmp)?;
        f.write_all(&text)?;
        drop(f);
        std::fs::rename(&tmp, path)
    })();
    result.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot write {}: {e}", path.display())
    })
}

/// Nanoseconds since the epoch, as a cheap unique-enough id.
pub fn nanos() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// The start time (clock ticks since boot) of `pid`, field 22 of its stat.
pub fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    after.split_whitespace().nth(19)?.parse().ok()
}

/// The real uid of `pid`.
pub fn owner(pid: i32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("Uid:")?.split_whitespace().next()?.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_faults_match_by_call_and_pid() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = SimDir { root: tmp.path().to_path_buf() };
        let req = Request { id: 7, call: Call::Restore { pairs: vec![("GPU-a".into(), "GPU-b".into())] } };
        let path = tmp.path().join("request.json");
        write_json(&path, &req).unwrap();
        let back: Request = read_json(&path).unwrap();
        assert_eq!((back.id, back.call), (7, req.call));
        dir.set_faults(&[
            Fault { call: "checkpoint".into(), pid: Some(5), action: Action::Fail { code: 999 } },
            Fault { call: "lock".into(), pid: None, action: Action::Hang },
        ])
        .unwrap();
        assert_eq!(dir.fault_for("checkpoint", 5), Some(Action::Fail { code: 999 }));
        assert_eq!(dir.fault_for("checkpoint", 6), None);
        assert_eq!(dir.fault_for("lock", 6), Some(Action::Hang));
    }

    #[test]
    fn this_process_has_a_start_time_and_owner() {
        let me = std::process::id() as i32;
        assert!(start_time(me).is_some());
        assert_eq!(owner(me), Some(unsafe { libc::getuid() }));
    }
}
