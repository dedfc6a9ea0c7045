//! The node's MPS daemons as records and processes: what the prolog, the
//! epilog and the node checker keep about each daemon ([`registry`]), which
//! processes are a daemon's ([`processes`]), and the one step done in each
//! task of an MPS job ([`task_privileged`]: the SPANK plugin moves the daemon
//! into the job's cgroup). Plain records and /proc and cgroup work, no NVML:
//! the plugin builds on it; starting and stopping daemons is
//! gpu-mode-core's `modes::mps`.

pub mod cgroup;
pub mod registry;

use crate::procfs::{ProcId, ProcInfo};
use registry::DaemonRecord;
use std::path::Path;

/// The kernel keeps 15 bytes of a command name: the control daemon and the
/// servers both show as this.
pub const MPS_COMM: &str = "nvidia-cuda-mps";
/// The daemon's pipe directory, in the environment of its clients and servers.
pub const PIPE_VAR: &str = "CUDA_MPS_PIPE_DIRECTORY";

/// Whose processes a daemon's are: the daemon (when known), its user, and
/// its pipe directory.
#[derive(Debug, Clone, Copy)]
pub struct DaemonId<'a> {
    pub daemon: Option<ProcId>,
    pub uid: u32,
    pub pipe_dir: &'a Path,
}

/// The daemon (if still alive as the same process) and every MPS server it
/// started: children of the daemon *process* (the parent's pid and start
/// time must match, so a reused pid adopts nothing: audit item M4), or MPS
/// processes whose environment names the daemon's pipe directory (servers
/// outlive a killed daemon; an intent record knows only this). All of them
/// run as the daemon's user.
pub fn processes(of: DaemonId, all: &[ProcInfo]) -> Vec<ProcInfo> {
    let pipe = of.pipe_dir.to_string_lossy();
    let is_daemon = |p: &ProcInfo| of.daemon == Some(p.id());
    let parent_is_daemon = |p: &ProcInfo| {
        of.daemon.is_some_and(|d| d.pid == p.ppid && all.iter().any(|q| q.id() == d))
    };
    all.iter()
        .filter(|p| p.comm.starts_with(MPS_COMM) && p.uid == of.uid)
        .filter(|p| is_daemon(p) || parent_is_daemon(p) || crate::procfs::environ_var(p.pid, PIPE_VAR).is_some_and(|v| v == pipe))
        .cloned()
        .collect()
}

/// What [`adopt_into_job`] did with a job's daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Adoption {
    /// Moved (daemon and servers) into the job's extern step.
    Moved { pids: Vec<i32>, into: Vec<std::path::PathBuf> },
    /// The daemon serves other jobs too: it must outlive this one.
    Shared,
    /// No extern step cgroup (no PrologFlags=Contain, or no cgroups).
    NotContained,
    /// No record or no process: nothing to move.
    NoDaemon,
}

/// Runs as root in each task process of an MPS job, before privileges are
/// dropped (the plugin's task_init_privileged): moves the job's daemon into
/// the job's cgroup (audit item M9): only there, in a process of the job, is
/// the job's cgroup known and does it exist. Returns a line for Slurm's log,
/// if any; best effort, the task runs either way. The only mode with work
/// in each task; the plugin calls it without the other modes.
pub fn task_privileged(runtime_dir: &std::path::Path, job_id: u32, grant: &crate::grant::GrantRecord) -> Option<String> {
    let crate::grant::GrantRecord::Mps { daemon: key } = grant else { return None };
    Some(match adopt_into_job(runtime_dir, job_id, key) {
        Ok(Adoption::Moved { pids, .. }) => {
            format!("gpu-mode: job {job_id}: MPS daemon {key} (pids {pids:?}) moved into the job's extern step cgroup")
        }
        Ok(Adoption::NotContained) => {
            format!("gpu-mode: job {job_id}: MPS daemon {key} stays outside the job's cgroup: no extern step (set PrologFlags=Contain)")
        }
        Ok(Adoption::Shared | Adoption::NoDaemon) => return None,
        Err(e) => format!("gpu-mode: job {job_id}: MPS daemon {key} could not be moved into the job's cgroup: {e}"),
    })
}

/// Why a job's MPS daemon could not be moved into its cgroup (logged by the
/// task step; the job runs either way).
#[derive(Debug, thiserror::Error)]
pub enum AdoptError {
    /// The daemon's record is unreadable.
    #[error(transparent)]
    Record(#[from] crate::persist::StateError),
    /// This process's own cgroup, which locates the job's, is unreadable.
    #[error("/proc/self/cgroup: {0}")]
    OwnCgroup(#[source] std::io::Error),
    /// Writing some pids into the cgroup failed: one text per failed write.
    #[error("{}", .0.join("; "))]
    Move(Vec<String>),
}

/// Puts the MPS daemon `key` of `job_id` into the job's extern step cgroup
/// (audit item M9; see [`cgroup`]). Runs as root in a process of the
/// job (the plugin's task_init_privileged), which tells where the job's
/// cgroup is. Errors are for the log: the job runs either way.
pub fn adopt_into_job(runtime_dir: &std::path::Path, job_id: u32, key: &str) -> Result<Adoption, AdoptError> {
    let Some(rec) = DaemonRecord::load(runtime_dir, key)? else { return Ok(Adoption::NoDaemon) };
    if rec.jobs != [job_id] {
        return Ok(Adoption::Shared);
    }
    let of = DaemonId { daemon: rec.daemon, uid: rec.uid, pipe_dir: &rec.pipe_dir };
    let pids: Vec<i32> = processes(of, &crate::procfs::all()).iter().map(|p| p.pid).collect();
    if pids.is_empty() {
        return Ok(Adoption::NoDaemon);
    }
    let own = std::fs::read_to_string("/proc/self/cgroup").map_err(AdoptError::OwnCgroup)?;
    let into = cgroup::extern_step_procs(&own, std::path::Path::new("/sys/fs/cgroup"), job_id);
    if into.is_empty() {
        return Ok(Adoption::NotContained);
    }
    let errors = cgroup::move_pids(&into, &pids);
    if errors.is_empty() {
        Ok(Adoption::Moved { pids, into })
    } else {
        Err(AdoptError::Move(errors))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No record: nothing to adopt; a corrupt one: the Record kind, whose
    /// words are the record's own (the task step logs them).
    #[test]
    fn adoption_without_a_record_or_with_a_corrupt_one() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(adopt_into_job(dir.path(), 7, "1001-0").unwrap(), Adoption::NoDaemon);
        let mut rec = registry::test_record(1001, &[0], &[7]);
        rec.key = "1001-0".into();
        rec.save(dir.path()).unwrap();
        let path = registry::registry_dir(dir.path()).join("1001-0.json");
        std::fs::write(&path, b"{").unwrap();
        let err = adopt_into_job(dir.path(), 7, "1001-0").unwrap_err();
        assert!(matches!(err, AdoptError::Record(crate::persist::StateError::Corrupt { .. })), "{err:?}");
        assert!(err.to_string().starts_with(&format!("state file {} is corrupt: ", path.display())), "{err}");
        assert_eq!(AdoptError::Move(vec!["a: EPERM".into(), "b: ESRCH".into()]).to_string(), "a: EPERM; b: ESRCH");
    }
}
