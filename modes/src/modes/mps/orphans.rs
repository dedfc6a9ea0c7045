//! MPS daemons and servers that no live job owns: what the node checker
//! reports. One serving the default pipe directory /tmp/nvidia-mps is the
//! worst kind: every CUDA program on the node without its own pipe directory
//! connects to it.
//!
//! Who is at fault decides what it means (audit item M3). A process counts
//! as MPS only when it runs one of the node's MPS binaries (its
//! `/proc/<pid>/exe`, which a user cannot fake the way a command name can).
//! Left over by slurm-gpu-mode (its pipe directory is under our runtime
//! directory, or a record names it) or running as root: the node's fault.
//! Started by a user outside slurm-gpu-mode: that user's, reported but never
//! a reason to drain, or any user could drain nodes at will.

use super::control::PIPE_VAR;
use super::daemon::{self, DaemonId, MPS_COMM};
use super::registry::{daemons_parent, DaemonRecord};
use crate::procfs::{self, ProcInfo};
use crate::persist::StateError;
use std::path::{Path, PathBuf};

/// The pipe directory MPS uses when none is set.
pub const DEFAULT_PIPE_DIR: &str = "/tmp/nvidia-mps";
/// The MPS server binary, next to the control binary.
pub const SERVER_BINARY: &str = "nvidia-cuda-mps-server";

/// Whose fault an orphan is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blame {
    /// slurm-gpu-mode's own leftover, or root's: the node needs a look.
    Node,
    /// A user's own daemon, started outside slurm-gpu-mode.
    User,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrphanMps {
    pub pid: i32,
    pub uid: u32,
    pub state: char,
    /// The process's CUDA_MPS_PIPE_DIRECTORY; `None` means the default.
    pub pipe_dir: Option<String>,
    pub why: String,
    pub blame: Blame,
}

/// The MPS binaries of this node: the configured control daemon and the
/// server beside it, as given and with links resolved.
pub fn mps_binaries(control: &Path) -> Vec<PathBuf> {
    let server = control.with_file_name(SERVER_BINARY);
    let mut out = vec![control.to_path_buf(), server.clone()];
    out.extend([control, server.as_path()].iter().filter_map(|p| std::fs::canonicalize(p).ok()));
    out.sort();
    out.dedup();
    out
}

/// Whether `p` is a real MPS process: the right name and one of `binaries`.
fn is_mps(p: &ProcInfo, binaries: &[PathBuf]) -> bool {
    p.comm.starts_with(MPS_COMM) && procfs::exe(p.pid).is_some_and(|exe| binaries.contains(&exe))
}

/// Every MPS process on the node that no live job's daemon accounts for.
pub fn find_orphans(runtime_dir: &Path, binaries: &[PathBuf]) -> Result<Vec<OrphanMps>, StateError> {
    let records = DaemonRecord::all(runtime_dir)?;
    let all = procfs::all();
    let owned: Vec<i32> = records
        .iter()
        .filter(|r| r.jobs.iter().any(|j| crate::runtime::job_is_live(runtime_dir, *j)))
        .flat_map(|r| daemon::processes(DaemonId { daemon: r.daemon, uid: r.uid, pipe_dir: &r.pipe_dir }, &all))
        .map(|p| p.pid)
        .collect();
    Ok(all
        .iter()
        .filter(|p| daemon::still_present(p) && !owned.contains(&p.pid) && is_mps(p, binaries))
        .map(|p| describe(p, &records, runtime_dir))
        .collect())
}

fn describe(p: &ProcInfo, records: &[DaemonRecord], runtime_dir: &Path) -> OrphanMps {
    let pipe_dir = procfs::environ_var(p.pid, PIPE_VAR);
    let (why, ours) = why_orphan(pipe_dir.as_deref(), records, runtime_dir);
    let blame = if ours || p.uid == 0 { Blame::Node } else { Blame::User };
    OrphanMps { pid: p.pid, uid: p.uid, state: p.state, pipe_dir, why, blame }
}

/// Why an MPS process with this pipe directory (`None`: the default) is an
/// orphan, for the node checker's message, and whether it is ours.
pub fn why_orphan(pipe_dir: Option<&str>, records: &[DaemonRecord], runtime_dir: &Path) -> (String, bool) {
    let pipe = pipe_dir.unwrap_or(DEFAULT_PIPE_DIR);
    if let Some(r) = records.iter().find(|r| r.pipe_dir.to_string_lossy() == pipe) {
        (format!("daemon {} of ended job(s) {:?} is still running", r.key, r.jobs), true)
    } else if Path::new(pipe).starts_with(daemons_parent(runtime_dir)) {
        (format!("serves {pipe}, a slurm-gpu-mode pipe directory no record names"), true)
    } else if pipe == DEFAULT_PIPE_DIR {
        let why = format!("serves the default pipe directory {DEFAULT_PIPE_DIR}: it captures every CUDA program without its own");
        (why, false)
    } else {
        (format!("not started by slurm-gpu-mode (pipe directory {pipe})"), false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orphans_are_explained_and_blamed() {
        let rec = DaemonRecord {
            pipe_dir: "/run/g/mps/7-0/pipe".into(),
            jobs: vec![12],
            ..crate::mps::registry::test_record(7, &[0], &[12])
        };
        let records = [rec];
        let run = Path::new("/run/g");
        let cases = [
            (None, "serves the default pipe directory /tmp/nvidia-mps", false),
            (Some("/tmp/nvidia-mps"), "serves the default pipe directory", false),
            (Some("/run/g/mps/7-0/pipe"), "daemon 7-0 of ended job(s) [12] is still running", true),
            (Some("/run/g/mps/9-1/pipe"), "serves /run/g/mps/9-1/pipe, a slurm-gpu-mode pipe directory", true),
            (Some("/home/x/mps"), "not started by slurm-gpu-mode (pipe directory /home/x/mps)", false),
        ];
        for (pipe, want, ours) in cases {
            let (got, got_ours) = why_orphan(pipe, &records, run);
            assert!(got.starts_with(want), "{pipe:?}: {got}");
            assert_eq!(got_ours, ours, "{pipe:?}");
        }
    }

    #[test]
    fn a_process_only_named_like_mps_is_not_mps() {
        // This test process is not an MPS binary, whatever its name says.
        let me = procfs::read(std::process::id() as i32).unwrap();
        let named = ProcInfo { comm: MPS_COMM.into(), ..me.clone() };
        let exe = procfs::exe(me.pid).unwrap();
        assert!(!is_mps(&named, &mps_binaries(Path::new("/usr/bin/nvidia-cuda-mps-control"))));
        assert!(is_mps(&named, std::slice::from_ref(&exe)), "the right binary and name count");
        assert!(!is_mps(&me, &[exe]), "the right binary under another name does not");
        let bins = mps_binaries(Path::new("/opt/x/nvidia-cuda-mps-control"));
        assert!(bins.contains(&PathBuf::from("/opt/x/nvidia-cuda-mps-server")), "{bins:?}");
    }
}
