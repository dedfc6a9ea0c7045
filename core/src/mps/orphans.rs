//! MPS daemons and servers that no live job owns: what the node checker
//! reports. One serving the default pipe directory /tmp/nvidia-mps is the
//! worst kind: every CUDA program on the node without its own pipe directory
//! connects to it.

use super::control::PIPE_VAR;
use super::daemon::{self, MPS_COMM};
use super::registry::DaemonRecord;
use crate::procfs::{self, ProcInfo};
use crate::state::{state_path, StateError};
use std::path::Path;

/// The pipe directory MPS uses when none is set.
pub const DEFAULT_PIPE_DIR: &str = "/tmp/nvidia-mps";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrphanMps {
    pub pid: i32,
    pub uid: u32,
    pub state: char,
    /// The process's CUDA_MPS_PIPE_DIRECTORY; `None` means the default.
    pub pipe_dir: Option<String>,
    pub why: String,
}

/// Every MPS process on the node that no live job's daemon accounts for.
pub fn find_orphans(runtime_dir: &Path) -> Result<Vec<OrphanMps>, StateError> {
    let records = DaemonRecord::all(runtime_dir)?;
    let live: Vec<&DaemonRecord> =
        records.iter().filter(|r| r.jobs.iter().any(|j| state_path(runtime_dir, *j).exists())).collect();
    let all = procfs::all();
    let owned: Vec<i32> = live
        .iter()
        .flat_map(|r| daemon::processes(r.daemon, &r.pipe_dir, &all))
        .map(|p| p.pid)
        .collect();
    Ok(all
        .iter()
        .filter(|p| p.comm.starts_with(MPS_COMM) && daemon::still_present(p) && !owned.contains(&p.pid))
        .map(|p| describe(p, &records))
        .collect())
}

fn describe(p: &ProcInfo, records: &[DaemonRecord]) -> OrphanMps {
    let pipe_dir = procfs::environ_var(p.pid, PIPE_VAR);
    let why = why_orphan(pipe_dir.as_deref(), records);
    OrphanMps { pid: p.pid, uid: p.uid, state: p.state, pipe_dir, why }
}

/// Why an MPS process with this pipe directory (`None`: the default) is an
/// orphan, for the node checker's message.
pub fn why_orphan(pipe_dir: Option<&str>, records: &[DaemonRecord]) -> String {
    let pipe = pipe_dir.unwrap_or(DEFAULT_PIPE_DIR);
    if pipe == DEFAULT_PIPE_DIR {
        format!("serves the default pipe directory {DEFAULT_PIPE_DIR}: it captures every CUDA program without its own")
    } else if let Some(r) = records.iter().find(|r| r.pipe_dir.to_string_lossy() == pipe) {
        format!("daemon {} of ended job(s) {:?} is still running", r.key, r.jobs)
    } else {
        format!("not started by slurm-gpu-mode (pipe directory {pipe})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orphans_are_explained() {
        let rec = DaemonRecord {
            pipe_dir: "/run/g/mps/7-0/pipe".into(),
            jobs: vec![12],
            ..crate::mps::registry::test_record(7, &[0], &[12])
        };
        let records = [rec];
        let cases = [
            (None, "serves the default pipe directory /tmp/nvidia-mps"),
            (Some("/tmp/nvidia-mps"), "serves the default pipe directory"),
            (Some("/run/g/mps/7-0/pipe"), "daemon 7-0 of ended job(s) [12] is still running"),
            (Some("/home/x/mps"), "not started by slurm-gpu-mode (pipe directory /home/x/mps)"),
        ];
        for (pipe, want) in cases {
            let got = why_orphan(pipe, &records);
            assert!(got.starts_with(want), "{pipe:?}: {got}");
        }
    }
}
