//! A stand-in for NVIDIA's MPS control daemon, close enough at the process
//! boundary that the production code cannot tell: same binary name, same
//! `-d` daemon mode, same environment (CUDA_MPS_PIPE_DIRECTORY,
//! CUDA_MPS_LOG_DIRECTORY; defaults /tmp/nvidia-mps and /var/log/nvidia-mps),
//! same files in the pipe directory (`control` socket,
//! `nvidia-cuda-mps-control.pid`), same client mode (commands on stdin, one
//! per line, answers on stdout), and a stand-in `nvidia-cuda-mps-server`
//! child. Not simulated: CUDA clients.
//!
//! Misbehaviour for tests comes from `mps-sim.toml` next to the executable
//! (the production code gives the daemon a minimal environment, so an
//! environment variable could not reach it):
//!
//! ```toml
//! quit = "exit"          # or "ignore": the daemon does not act on `quit`
//! on_sigterm = "exit"    # or "ignore"
//! unreaped = false       # true: the daemon's parent never reaps it, so once
//!                        # killed it stays <defunct> (as seen on real nodes)
//! ```

use serde::Deserialize;
use std::path::{Path, PathBuf};

pub const DEFAULT_PIPE_DIR: &str = "/tmp/nvidia-mps";
pub const DEFAULT_LOG_DIR: &str = "/var/log/nvidia-mps";
pub const PID_FILE: &str = "nvidia-cuda-mps-control.pid";
pub const SOCKET: &str = "control";

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Behaviour {
    pub quit: QuitBehaviour,
    pub on_sigterm: QuitBehaviour,
    pub unreaped: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QuitBehaviour {
    #[default]
    Exit,
    Ignore,
}

impl Behaviour {
    /// Reads `mps-sim.toml` beside the running executable; defaults if absent.
    pub fn load() -> Behaviour {
        let path = std::env::current_exe().ok().and_then(|e| Some(e.parent()?.join("mps-sim.toml")));
        path.and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|t| toml::from_str(&t).ok())
            .unwrap_or_default()
    }
}

pub fn pipe_dir() -> PathBuf {
    std::env::var_os("CUDA_MPS_PIPE_DIRECTORY").map(PathBuf::from).unwrap_or_else(|| DEFAULT_PIPE_DIR.into())
}

pub fn log_dir() -> PathBuf {
    std::env::var_os("CUDA_MPS_LOG_DIRECTORY").map(PathBuf::from).unwrap_or_else(|| DEFAULT_LOG_DIR.into())
}

/// Appends a line to `<log dir>/<file>` (best effort, like a daemon's log).
pub fn log(file: &str, line: &str) {
    use std::io::Write;
    let _ = std::fs::create_dir_all(log_dir());
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(log_dir().join(file)) {
        let _ = writeln!(f, "[sim] {line}");
    }
}

/// The sibling executable `name` (the server lives next to the control binary).
pub fn sibling(name: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.parent()?.join(name)))
        .unwrap_or_else(|| Path::new(name).to_path_buf())
}
