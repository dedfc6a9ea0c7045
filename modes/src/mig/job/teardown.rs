//! Epilog side of `--gpu-mode=mig`: destroy exactly the instances the job
//! made (matched by GPU instance id *and* profile and placement, since ids
//! are reused: never another job's or the baseline's), switch MIG off where
//! the job switched it on, remove the journal. Idempotent: an instance
//! already gone is done.
//!
//! An instance still busy after the job's processes were killed: the job's
//! leftover processes on it (its user's) are killed; if it still cannot be
//! destroyed the node is drained with
//! `gpu-mode: MIG instance <gi> on GPU <uuid> busy (job <j>)`.

use super::journal::{MigJournal, PendingCreate};
use super::{GrantedInstance, MigGpuGrant};
use crate::config::Config;
use crate::failure::{Failure, Fault};
use crate::gpu::{ErrorKind, GpuError, GpuOps, MigInstance};
use crate::gpu_lock::GpuLocks;
use std::time::{Duration, Instant};

/// What the epilog did on the job's GPUs, for its log line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Teardown {
    pub destroyed: usize,
    /// Processes of the job's user killed because they held an instance.
    pub killed: Vec<u32>,
    pub switched_off: Vec<String>,
}

/// Undoes the journal of job `j` (the caller holds the GPU locks or is the
/// prolog that wrote it) and removes the journal.
pub fn release_journal(cfg: &Config, j: &MigJournal, ops: &dyn GpuOps) -> Result<Teardown, Failure> {
    let done = undo(cfg, j, ops)?;
    MigJournal::remove(&cfg.runtime_dir, j.job_id).map_err(|e| Failure::node(Fault::Mig, format!("mig: {e}")))?;
    Ok(done)
}

/// Locks the journal's GPUs and releases it.
pub fn release_locked(cfg: &Config, j: &MigJournal, ops: &dyn GpuOps) -> Result<Teardown, Failure> {
    let mut gpus: Vec<u32> = j.grant.gpus.iter().map(|g| g.gpu).collect();
    gpus.extend(j.pending.as_ref().map(|p| p.gpu));
    let _locks = GpuLocks::acquire(&cfg.runtime_dir, &gpus, Duration::from_millis(cfg.mps.lock_timeout_ms))
        .map_err(|e| Failure::node(Fault::GpuLock, format!("mig: locking GPUs: {e}")))?;
    release_journal(cfg, j, ops)
}

/// Destroys what the journal lists as made, a pending create included, and
/// switches MIG off where the job switched it on. Every GPU is tried; the
/// first busy instance becomes the drain reason, other errors a node fault.
pub fn undo(cfg: &Config, j: &MigJournal, ops: &dyn GpuOps) -> Result<Teardown, Failure> {
    let mut done = Teardown::default();
    let mut busy: Option<String> = None;
    let mut errors: Vec<String> = Vec::new();
    for g in j.grant.gpus.iter().rev() {
        let pending = j.pending.as_ref().filter(|p| p.gpu == g.gpu);
        match undo_gpu(cfg, j, g, pending, ops, &mut done) {
            Ok(()) => {}
            Err(GpuUndo::Busy(gi)) => {
                busy.get_or_insert(format!("MIG instance {gi} on GPU {} busy (job {})", g.gpu_uuid, j.job_id));
            }
            Err(GpuUndo::Failed(e)) => errors.push(format!("GPU {}: {e}", g.gpu_uuid)),
        }
    }
    if let Some(reason) = busy {
        return Err(Failure::Drain(Fault::MigBusy, reason));
    }
    if !errors.is_empty() {
        return Err(Failure::node(Fault::Mig, format!("mig teardown: {}", errors.join("; "))));
    }
    Ok(done)
}

enum GpuUndo {
    Busy(u32),
    Failed(String),
}

impl From<GpuError> for GpuUndo {
    fn from(e: GpuError) -> Self {
        GpuUndo::Failed(e.to_string())
    }
}

fn undo_gpu(
    cfg: &Config,
    j: &MigJournal,
    g: &MigGpuGrant,
    pending: Option<&PendingCreate>,
    ops: &dyn GpuOps,
    done: &mut Teardown,
) -> Result<(), GpuUndo> {
    let mig_on = ops.modes(g.gpu)?.mig.is_some_and(|m| m.current);
    if mig_on {
        let existing = ops.mig_instances(g.gpu)?;
        for i in g.instances.iter().rev().filter(|i| i.made) {
            if let Some(there) = existing.iter().find(|e| same(e, i)) {
                destroy(cfg, j, g.gpu, there, ops, done)?;
            }
        }
        // A create the prolog did not live to record: the instance with that
        // profile at that placement, if it is not one the job listed.
        if let Some(p) = pending {
            let listed = |e: &MigInstance| g.instances.iter().any(|i| same(e, i));
            if let Some(there) = existing.iter().find(|e| e.profile_id == p.profile_id && e.placement_start == p.start && !listed(e)) {
                destroy(cfg, j, g.gpu, there, ops, done)?;
            }
        }
    }
    // This job switched MIG on, or an earlier job did and left the duty to
    // the GPU (journal::mark_switched_on): the last one out switches it off.
    let ours = g.enabled_mig || super::journal::switched_on(&cfg.runtime_dir, g.gpu);
    let clear = || super::journal::clear_switched_on(&cfg.runtime_dir, g.gpu).map_err(|e| GpuUndo::Failed(e.to_string()));
    if ours && mig_on && ops.mig_instances(g.gpu)?.is_empty() {
        ops.set_mig_mode(g.gpu, false)?;
        done.switched_off.push(g.gpu_uuid.clone());
        clear()?;
    } else if !mig_on {
        clear()?;
    }
    Ok(())
}

/// The instance the grant recorded, not a later one that reuses its id.
fn same(e: &MigInstance, i: &GrantedInstance) -> bool {
    e.gpu_instance == i.gpu_instance && e.profile_id == i.profile_id && e.placement_start == i.placement_start
}

/// Destroys one instance; while it is busy, kills the job user's processes
/// on it and tries again until the kill timeout.
fn destroy(cfg: &Config, j: &MigJournal, gpu: u32, inst: &MigInstance, ops: &dyn GpuOps, done: &mut Teardown) -> Result<(), GpuUndo> {
    let deadline = Instant::now() + Duration::from_millis(cfg.mps.kill_timeout_ms);
    loop {
        match ops.destroy_mig_instance(gpu, inst.gpu_instance) {
            Ok(()) => {
                done.destroyed += 1;
                return Ok(());
            }
            Err(e) if matches!(e.kind(), Some(ErrorKind::NotFound)) => return Ok(()),
            Err(e) if matches!(e.kind(), Some(ErrorKind::InUse)) => {
                done.killed.extend(kill_users_processes_on(gpu, inst.gpu_instance, j.grant.uid, ops)?);
                if Instant::now() >= deadline {
                    return Err(GpuUndo::Busy(inst.gpu_instance));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// SIGKILLs the processes of `uid` that run in GPU instance `gi` (pinned by
/// pidfd after an identity check); others' are never touched. Returns the
/// pids signalled.
fn kill_users_processes_on(gpu: u32, gi: u32, uid: u32, ops: &dyn GpuOps) -> Result<Vec<u32>, GpuUndo> {
    let mut killed = Vec::new();
    for p in ops.processes(gpu)?.iter().filter(|p| p.gpu_instance == Some(gi)) {
        let Some(info) = crate::procfs::read(p.pid as i32) else { continue };
        if info.uid == uid && info.uid != 0 && info.state != 'Z' && crate::procfs::signal_exact(info.id(), libc::SIGKILL) {
            killed.push(p.pid);
        }
    }
    Ok(killed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inst(gi: u32, profile_id: u32, start: u32) -> MigInstance {
        MigInstance { gpu_instance: gi, profile_id, placement_start: start, placement_size: 4, compute_instances: vec![] }
    }

    fn granted(gi: u32, profile_id: u32, start: u32) -> GrantedInstance {
        GrantedInstance {
            gpu_instance: gi,
            compute_instance: 0,
            profile: "3g.40gb".into(),
            profile_id,
            placement_start: start,
            placement_size: 4,
            uuid: "MIG-x".into(),
            made: true,
        }
    }

    #[test]
    fn a_reused_instance_id_is_not_the_jobs_instance() {
        assert!(same(&inst(1, 9, 0), &granted(1, 9, 0)));
        assert!(!same(&inst(1, 9, 4), &granted(1, 9, 0)), "same id, other placement: someone else's");
        assert!(!same(&inst(1, 5, 0), &granted(1, 9, 0)), "same id, other profile: someone else's");
    }
}
