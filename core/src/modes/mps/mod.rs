//! `--gpu-mode=mps`: one MPS control daemon per job user and GPU set.
//!
//! * [`setup`] (prolog): lock the GPUs, refuse GPUs another user's daemon
//!   holds, reuse the user's daemon for the same GPUs or start one (compute
//!   mode first, then the daemon as the user, then the `mps:` parameters),
//!   and return what the job's tasks need. Any failure undoes every step.
//! * [`teardown`] (epilog): drop the job from its daemon; the last job stops
//!   it (`quit`, SIGTERM, SIGKILL), restores the compute modes and removes
//!   the directories. A survivor is a node fault with the drain reason
//!   `MPS zombie pid <p> (job <j>, GPU <uuid>)`.
//! * [`orphans`] (node checker): MPS processes no live job owns.

pub mod control;
pub mod daemon;
mod driver;
pub mod orphans;
pub mod registry;
pub mod setup;
pub mod teardown;

pub use driver::MpsDriver;
pub use orphans::{find_orphans, OrphanMps};
pub use registry::{daemon_key, DaemonRecord};
pub use setup::{setup, MpsJob};
pub use teardown::{teardown, TeardownOutcome};

use std::path::PathBuf;

pub use crate::job_env::KEEP_IF_SET;

#[derive(Debug, thiserror::Error)]
pub enum MpsError {
    #[error(transparent)]
    Spawn(#[from] crate::privdrop::SpawnError),
    #[error("MPS daemon did not start: {0}")]
    Start(String),
    #[error(transparent)]
    Command(crate::command::CommandError),
    #[error("MPS control ({pipe_dir}) refused \"{commands}\": {detail}")]
    Control { pipe_dir: PathBuf, commands: String, detail: String },
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

/// Puts the MPS daemon `key` of `job_id` into the job's extern step cgroup
/// (audit item M9; see [`crate::cgroup`]). Runs as root in a process of the
/// job (the plugin's task_init_privileged), which tells where the job's
/// cgroup is. Errors are for the log: the job runs either way.
pub fn adopt_into_job(runtime_dir: &std::path::Path, job_id: u32, key: &str) -> Result<Adoption, String> {
    let Some(rec) = DaemonRecord::load(runtime_dir, key).map_err(|e| e.to_string())? else { return Ok(Adoption::NoDaemon) };
    if rec.jobs != [job_id] {
        return Ok(Adoption::Shared);
    }
    let of = daemon::DaemonId { daemon: rec.daemon, uid: rec.uid, pipe_dir: &rec.pipe_dir };
    let pids: Vec<i32> = daemon::processes(of, &crate::procfs::all()).iter().map(|p| p.pid).collect();
    if pids.is_empty() {
        return Ok(Adoption::NoDaemon);
    }
    let own = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| format!("/proc/self/cgroup: {e}"))?;
    let into = crate::cgroup::extern_step_procs(&own, std::path::Path::new("/sys/fs/cgroup"), job_id);
    if into.is_empty() {
        return Ok(Adoption::NotContained);
    }
    let errors = crate::cgroup::move_pids(&into, &pids);
    if errors.is_empty() {
        Ok(Adoption::Moved { pids, into })
    } else {
        Err(errors.join("; "))
    }
}
