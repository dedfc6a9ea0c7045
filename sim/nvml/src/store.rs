//! The shared state file. Every NVML call of every process (prolog, epilog,
//! checker, plugin, nvml-sim-ctl) reads it under an flock and writes it back
//! under the same lock, so they all see one node.

use crate::model::{code, NodeState, NvmlCode};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// Path of the state file; required.
pub const STATE_ENV: &str = "GPU_MODE_SIM_STATE";
/// Node fixture used to create the state file when it does not exist yet.
pub const FIXTURE_ENV: &str = "GPU_MODE_SIM_FIXTURE";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{STATE_ENV} is not set and {STATE_POINTER} names no state file: the simulated NVML has no node")]
    NoStatePath,
    #[error("state file {path} does not exist and {FIXTURE_ENV} is not set")]
    NoState { path: PathBuf },
    #[error("state file {path}: {detail}")]
    Io { path: PathBuf, detail: String },
    #[error(transparent)]
    Fixture(#[from] crate::model::FixtureError),
}

impl StoreError {
    /// How NVML reports a node it cannot find: no driver.
    pub fn code(&self) -> NvmlCode {
        match self {
            StoreError::NoStatePath | StoreError::NoState { .. } => code::DRIVER_NOT_LOADED,
            _ => code::UNKNOWN,
        }
    }
}

/// Names the state file where the environment cannot: programs that slurmd
/// starts with an environment of its own (an installed Prolog=, run without
/// the test harness's wrapper) find the simulated node through it. One per
/// machine, as there is one installed package (scripts/test-install.sh).
pub const STATE_POINTER: &str = "/run/gpu-mode-sim/state-path";

/// The state file named by the environment, else by [`STATE_POINTER`].
pub fn state_path_from_env() -> Result<PathBuf, StoreError> {
    if let Some(p) = std::env::var_os(STATE_ENV).filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    std::fs::read_to_string(STATE_POINTER)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .ok_or(StoreError::NoStatePath)
}

/// An flock held on an open state file; released when dropped (the file closes).
struct Locked {
    file: File,
    path: PathBuf,
}

impl Locked {
    fn open(path: &Path, create: bool) -> Result<Locked, StoreError> {
        let file = OpenOptions::new().read(true).write(true).create(create).truncate(false).open(path);
        let file = match file {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(StoreError::NoState { path: path.to_path_buf() })
            }
            Err(e) => return Err(io(path, e)),
        };
        // SAFETY: flock on a descriptor we own; blocks until the lock is ours.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(io(path, std::io::Error::last_os_error()));
        }
        Ok(Locked { file, path: path.to_path_buf() })
    }

    fn read(&mut self) -> Result<Option<NodeState>, StoreError> {
        let mut text = String::new();
        self.file.read_to_string(&mut text).map_err(|e| io(&self.path, e))?;
        if text.trim().is_empty() {
            return Ok(None);
        }
        serde_json::from_str(&text).map(Some).map_err(|e| io(&self.path, e))
    }

    fn write(&mut self, state: &NodeState) -> Result<(), StoreError> {
        let text = serde_json::to_string_pretty(state).map_err(|e| io(&self.path, e))?;
        let p = &self.path;
        self.file.set_len(0).map_err(|e| io(p, e))?;
        self.file.seek(SeekFrom::Start(0)).map_err(|e| io(p, e))?;
        self.file.write_all(text.as_bytes()).map_err(|e| io(p, e))
    }
}

fn io(path: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::Io { path: path.to_path_buf(), detail: e.to_string() }
}

/// Writes a fresh state built from `fixture` to `path`, replacing any.
pub fn create(path: &Path, fixture: &Path) -> Result<NodeState, StoreError> {
    let state = NodeState::from_fixture(fixture)?;
    let mut locked = Locked::open(path, true)?;
    locked.write(&state)?;
    Ok(state)
}

/// Runs `f` on the state under the lock and writes it back if `f` changed it.
/// A missing (or empty) state file is created from `GPU_MODE_SIM_FIXTURE` when
/// that is set, so the first process on a test node sets it up.
pub fn update<R>(path: &Path, f: impl FnOnce(&mut NodeState) -> R) -> Result<R, StoreError> {
    let fixture = std::env::var_os(FIXTURE_ENV).filter(|v| !v.is_empty()).map(PathBuf::from);
    let mut locked = Locked::open(path, fixture.is_some())?;
    let mut state = match (locked.read()?, &fixture) {
        (Some(s), _) => s,
        (None, Some(fx)) => NodeState::from_fixture(fx)?,
        (None, None) => return Err(StoreError::NoState { path: path.to_path_buf() }),
    };
    let before = state.clone();
    forget_ended_processes(&mut state);
    let result = f(&mut state);
    if state != before {
        locked.write(&state)?;
    }
    Ok(result)
}

/// As the driver does: a real process that ended (gone, or a zombie, which
/// has released everything) no longer holds its GPU.
fn forget_ended_processes(state: &mut NodeState) {
    let running = |pid: u32| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().next());
        matches!(state, Some(s) if s != "Z")
    };
    for g in &mut state.gpus {
        g.processes.retain(|p| !p.live || running(p.pid));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Fault;

    fn fixture() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/node-2x-h200.toml")
    }

    #[test]
    fn changes_persist_between_opens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        create(&path, &fixture()).unwrap();
        update(&path, |s| s.inject(1, &Fault::Lost)).unwrap().unwrap();
        assert!(update(&path, |s| s.gpus[1].health.lost).unwrap());
    }

    #[test]
    fn concurrent_writers_do_not_lose_updates() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        create(&path, &fixture()).unwrap();
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let p = path.clone();
                std::thread::spawn(move || {
                    for _ in 0..25 {
                        update(&p, |s| s.inject(0, &Fault::Ecc { count: 1 })).unwrap().unwrap();
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(update(&path, |s| s.gpus[0].health.ecc_aggregate).unwrap(), 100);
    }

    #[test]
    fn a_missing_state_without_fixture_is_no_driver() {
        let dir = tempfile::tempdir().unwrap();
        let err = Locked::open(&dir.path().join("none.json"), false).err().unwrap();
        assert_eq!(err.code(), code::DRIVER_NOT_LOADED);
    }
}
