//! Epilog side of `--gpu-mode=mps`. Idempotent: a job with no daemon (second
//! run, after a reboot that emptied /run) finds nothing and succeeds.

use super::control::Control;
use super::daemon::{self, StopOutcome};
use super::registry::{daemon_dir, DaemonRecord};
use crate::config::Config;
use crate::gpu::{GpuOps, NvmlGpus};
use crate::gpu_lock::GpuLocks;
use crate::failure::{Failure, Fault};
use crate::privdrop::Identity;
use crate::watchdog;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TeardownOutcome {
    /// The job had no daemon (or it is already gone).
    NoDaemon,
    /// Other jobs still use the daemon; it keeps running.
    Released { key: String, remaining: Vec<u32> },
    /// The job was the last: the daemon is stopped and everything undone.
    /// `unreaped`: (zombie, parent) pairs its processes left, ended and
    /// holding nothing, waiting for a parent that is not ours to reap them.
    /// `already_gone`: nothing of it was running any more (killed or
    /// crashed during the job); only its files and record were left.
    Stopped { key: String, quit_worked: bool, signalled: Vec<i32>, unreaped: Vec<(i32, i32)>, already_gone: bool },
}

/// Drops `job_id` from its daemon and stops the daemon if it was the last
/// job. `key` is the daemon the job state names; without it (state lost) the
/// registry is searched for the job.
pub fn teardown(cfg: &Config, job_id: u32, key: Option<&str>) -> Result<TeardownOutcome, Failure> {
    let node = |what: &str, e: &dyn std::fmt::Display| Failure::node(Fault::Mps, format!("mps: {what}: {e}"));
    let Some(found) = find_record(cfg, job_id, key).map_err(|e| node("reading the daemon registry", &e))? else {
        return Ok(TeardownOutcome::NoDaemon);
    };
    let _locks = GpuLocks::acquire(&cfg.runtime_dir, &found.gpus, Duration::from_millis(cfg.mps.lock_timeout_ms))
        .map_err(|e| node("locking GPUs", &e))?;
    // Re-read under the lock: another job's epilog may have changed it.
    let Some(mut rec) = DaemonRecord::load(&cfg.runtime_dir, &found.key).map_err(|e| node("reading the daemon registry", &e))?
    else {
        return Ok(TeardownOutcome::NoDaemon);
    };
    rec.jobs.retain(|&j| j != job_id && crate::runtime::job_is_live(&cfg.runtime_dir, j));
    let daemon_alive = rec.daemon.and_then(crate::procfs::find).is_some();
    if !rec.jobs.is_empty() && daemon_alive {
        rec.save(&cfg.runtime_dir).map_err(|e| node("saving the daemon registry", &e))?;
        return Ok(TeardownOutcome::Released { key: rec.key, remaining: rec.jobs });
    }
    let gpus;
    let ops: Option<&dyn GpuOps> = if rec.saved_compute_modes.is_empty() {
        None
    } else {
        let _step = watchdog::step("nvml: open");
        gpus = NvmlGpus::from_config(cfg).map_err(|e| node("opening NVML to restore compute modes", &e))?;
        Some(&gpus)
    };
    let out = dismantle(cfg, &rec, job_id, ops)?;
    Ok(TeardownOutcome::Stopped {
        key: rec.key,
        quit_worked: out.quit_worked,
        signalled: out.signalled,
        unreaped: out.unreaped,
        already_gone: out.already_gone,
    })
}

fn find_record(cfg: &Config, job_id: u32, key: Option<&str>) -> Result<Option<DaemonRecord>, crate::persist::StateError> {
    match key {
        Some(k) => DaemonRecord::load(&cfg.runtime_dir, k),
        None => Ok(DaemonRecord::all(&cfg.runtime_dir)?.into_iter().find(|r| r.jobs.contains(&job_id))),
    }
}

/// Stops the daemon and its servers, restores the compute modes, removes the
/// directories and the record. A process that survives SIGKILL (stuck in
/// the kernel) becomes the drain reason `MPS zombie pid <p> (job <j>, GPU
/// <uuid>)`; an ended process its parent has not reaped is no survivor. The
/// caller holds the GPU locks.
pub fn dismantle(cfg: &Config, rec: &DaemonRecord, job_id: u32, ops: Option<&dyn GpuOps>) -> Result<StopOutcome, Failure> {
    let who = Identity::of_user_or_bare(rec.uid, rec.gid);
    let control = Control { program: &cfg.mps.control, pipe_dir: &rec.pipe_dir, log_dir: &rec.log_dir, who: &who };
    let out = daemon::stop(
        &control,
        rec.daemon,
        Duration::from_millis(cfg.mps.quit_timeout_ms),
        Duration::from_millis(cfg.mps.kill_timeout_ms),
    );
    let mut errors = Vec::new();
    for &(gpu, mode) in &rec.saved_compute_modes {
        let restored = match ops {
            Some(ops) => ops.set_compute_mode(gpu, mode).map_err(|e| e.to_string()),
            None => Err("no NVML handle".to_string()),
        };
        if let Err(e) = restored {
            errors.push(format!("cannot restore compute mode {mode:?} of GPU {}: {e}", rec.gpu_label(gpu)));
        }
    }
    let dir = daemon_dir(&cfg.runtime_dir, &rec.key);
    if let Err(e) = crate::fsutil::remove_tree_if_present(&dir) {
        errors.push(format!("cannot remove {}: {e}", dir.display()));
    }
    if let Err(e) = DaemonRecord::remove(&cfg.runtime_dir, &rec.key) {
        errors.push(e.to_string());
    }
    if let Some(p) = out.survivors.first() {
        let gpus: Vec<String> = rec.gpus.iter().map(|g| rec.gpu_label(*g)).collect();
        return Err(Failure::Drain(Fault::MpsZombie, format!("MPS zombie pid {} (job {job_id}, GPU {})", p.pid, gpus.join(","))));
    }
    if !errors.is_empty() {
        return Err(Failure::node(Fault::Mps, format!("mps teardown: {}", errors.join("; "))));
    }
    Ok(out)
}
