//! Prolog side of `--gpu-mode=mig`: under the job's GPU locks, plan every
//! GPU first (MIG mode, profiles, placements: every job refusal happens here,
//! before anything changes), then switch MIG on where the plan says and
//! create each instance with its placement, journalling before each step.
//! A failure half-way destroys what this job made and is a node fault.

use super::journal::{MigJournal, PendingCreate};
use super::layout::{place_or_explain, requested, resolve, LayoutError};
use super::placement::{Occupied, Placed};
use super::teardown::{release_journal, undo};
use super::{GrantedInstance, MigGpuGrant};
use crate::config::Config;
use crate::failure::{Failure, Fault};
use crate::gpu::{GpuOps, MigInstance, MigInstanceSetting, MigModeChange, MigModeSetting};
use crate::gpu_lock::GpuLocks;
use crate::job_env::JobEnv;
use crate::gpu_mode::{MigProfileCount, MigRequest};
use std::time::Duration;

/// What one GPU needs for the job.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuPlan {
    pub gpu: u32,
    pub uuid: String,
    pub model: String,
    /// MIG mode must be switched on first (`[gpu] mig_mode = "switch"`).
    pub switch_on: bool,
    /// Instances to create, with their placements.
    pub create: Vec<Placed>,
    /// Instances already there that the job uses (`mig_instances = "leave"`).
    pub reuse: Vec<GrantedInstance>,
}

/// Makes the job's instances; returns the journal with everything made.
pub fn setup(cfg: &Config, env: &JobEnv, gpus: &[u32], request: &MigRequest, ops: &dyn GpuOps) -> Result<MigJournal, Failure> {
    if gpus.is_empty() {
        return Err(Failure::Job("--gpu-mode=mig needs GPUs: request whole GPUs with --gres=gpu:N or --gpus=N".into()));
    }
    let node = |what: &str, e: &dyn std::fmt::Display| Failure::node(Fault::Mig, format!("mig: {what}: {e}"));
    let list = requested(cfg, request).map_err(|e| Failure::Job(e.to_string()))?;
    let _locks = GpuLocks::acquire(&cfg.runtime_dir, gpus, Duration::from_millis(cfg.mps.lock_timeout_ms))
        .map_err(|e| node("locking GPUs", &e))?;
    clear_stale(cfg, gpus, ops)?;
    let plans = gpus.iter().map(|&g| plan_gpu(cfg, g, &list, ops)).collect::<Result<Vec<_>, _>>()?;
    let mut journal = MigJournal::new(env.job_id, env.uid);
    journal.save(&cfg.runtime_dir).map_err(|e| node("saving the MIG journal", &e))?;
    match apply(cfg, &plans, ops, &mut journal) {
        Ok(()) => Ok(journal),
        Err(e) => {
            let undone = undo(cfg, &journal, ops).err().map(|u| format!("; undo: {u}")).unwrap_or_default();
            let _ = MigJournal::remove(&cfg.runtime_dir, env.job_id);
            Err(match e {
                Failure::Job(msg) if undone.is_empty() => Failure::Job(msg),
                e => Failure::node(e.fault().unwrap_or(Fault::Mig), format!("mig: {e}{undone}")),
            })
        }
    }
}

/// Journals of jobs that ended without their epilog cleaning up (a crashed
/// prolog, a lost epilog) on these GPUs: their instances go first.
fn clear_stale(cfg: &Config, gpus: &[u32], ops: &dyn GpuOps) -> Result<(), Failure> {
    for job in MigJournal::jobs(&cfg.runtime_dir) {
        if crate::runtime::job_is_live(&cfg.runtime_dir, job) {
            continue;
        }
        let Ok(Some(j)) = MigJournal::load(&cfg.runtime_dir, job) else { continue };
        if j.touches(gpus) {
            release_journal(cfg, &j, ops)
                .map_err(|f| Failure::node(f.fault().unwrap_or(Fault::Mig), format!("mig: stale instances of job {job}: {f}")))?;
        }
    }
    Ok(())
}

/// One GPU's plan, or the job refusal that explains why it cannot be served.
pub fn plan_gpu(cfg: &Config, gpu: u32, list: &[MigProfileCount], ops: &dyn GpuOps) -> Result<GpuPlan, Failure> {
    let gpu_err = |e: crate::gpu::GpuError| Failure::node(Fault::Mig, format!("mig: GPU {gpu}: {e}"));
    let inv = ops.inventory(gpu).map_err(gpu_err)?;
    let label = format!("GPU {} ({})", inv.uuid, inv.name);
    let mig = ops.modes(gpu).map_err(gpu_err)?.mig.ok_or_else(|| Failure::Job(format!("{label} does not support MIG")))?;
    let switch_on = !mig.current;
    if switch_on && cfg.gpu.mig_mode == MigModeSetting::Leave {
        return Err(Failure::Job(format!(
            "{label} is not in MIG mode; an admin enables it with `nvidia-smi -i {} -mig 1` (or the node's MIG baseline), \
             or lets jobs switch it with [gpu] mig_mode = \"switch\"",
            inv.uuid
        )));
    }
    let table = ops.mig_profiles(gpu).map_err(gpu_err)?;
    let want = resolve(list, &table, &inv.name).map_err(|e| Failure::Job(format!("{label}: {e}")))?;
    let existing = if switch_on { Vec::new() } else { ops.mig_instances(gpu).map_err(gpu_err)? };
    let mut plan = GpuPlan { gpu, uuid: inv.uuid.clone(), model: inv.name.clone(), switch_on, create: Vec::new(), reuse: Vec::new() };
    if cfg.gpu.mig_instances == MigInstanceSetting::Leave {
        plan.reuse = reuse(cfg, gpu, &want, &existing).map_err(|e| Failure::Job(format!("{label}: {e}")))?;
    } else {
        let occupied = occupied(&existing, &table);
        plan.create = place_or_explain(&want, &table, &occupied, &inv.name).map_err(|e| Failure::Job(format!("{label}: {e}")))?;
    }
    Ok(plan)
}

/// What instances already on a GPU take (the baseline, or instances an admin
/// made): a job's layout is placed around them, never over them.
fn occupied(existing: &[MigInstance], table: &[crate::gpu::MigProfile]) -> Occupied {
    let slices = |id: u32| table.iter().find(|p| p.id == id).map_or(0, |p| p.slices);
    let mut per_profile: Vec<(u32, u32)> = Vec::new();
    for i in existing {
        match per_profile.iter_mut().find(|(id, _)| *id == i.profile_id) {
            Some((_, n)) => *n += 1,
            None => per_profile.push((i.profile_id, 1)),
        }
    }
    Occupied {
        ranges: existing.iter().map(|i| (i.placement_start, i.placement_size)).collect(),
        compute: existing.iter().map(|i| slices(i.profile_id)).sum(),
        per_profile,
    }
}

/// With `mig_instances = "leave"`: the existing instances that serve the
/// layout (not in use by another live job), or why there are none.
fn reuse(cfg: &Config, gpu: u32, want: &[(&crate::gpu::MigProfile, u32)], existing: &[MigInstance]) -> Result<Vec<GrantedInstance>, LayoutError> {
    let taken = instances_of_live_jobs(cfg, gpu);
    let mut out = Vec::new();
    for (p, n) in want {
        let free: Vec<&MigInstance> = existing
            .iter()
            .filter(|i| i.profile_id == p.id && !taken.contains(&i.gpu_instance))
            .take(*n as usize)
            .collect();
        if free.len() < *n as usize {
            return Err(LayoutError::TooFewFree { wanted: *n, profile: p.name.clone(), free: free.len() });
        }
        for i in free {
            out.push(granted(i, &p.name, false).ok_or(LayoutError::NoComputeInstance(i.gpu_instance))?);
        }
    }
    Ok(out)
}

/// GPU instance ids other live jobs hold on `gpu`.
fn instances_of_live_jobs(cfg: &Config, gpu: u32) -> Vec<u32> {
    MigJournal::jobs(&cfg.runtime_dir)
        .into_iter()
        .filter(|j| crate::runtime::job_is_live(&cfg.runtime_dir, *j))
        .filter_map(|j| MigJournal::load(&cfg.runtime_dir, j).ok().flatten())
        .flat_map(|j| j.grant.gpus.into_iter().filter(|g| g.gpu == gpu).flat_map(|g| g.instances))
        .map(|i| i.gpu_instance)
        .collect()
}

/// The grant entry of an instance and its (single) compute instance.
fn granted(i: &MigInstance, profile: &str, made: bool) -> Option<GrantedInstance> {
    let ci = i.compute_instances.first()?;
    Some(GrantedInstance {
        gpu_instance: i.gpu_instance,
        compute_instance: ci.id,
        profile: profile.to_string(),
        profile_id: i.profile_id,
        placement_start: i.placement_start,
        placement_size: i.placement_size,
        uuid: ci.uuid.clone()?,
        made,
    })
}

/// Carries out the plans, journalling before every change: the journal
/// always lists what exists plus the one change in flight (`pending`).
fn apply(cfg: &Config, plans: &[GpuPlan], ops: &dyn GpuOps, journal: &mut MigJournal) -> Result<(), Failure> {
    let save = |j: &MigJournal| j.save(&cfg.runtime_dir).map_err(|e| Failure::node(Fault::Mig, format!("saving the MIG journal: {e}")));
    for plan in plans {
        let gpu_err = |e: crate::gpu::GpuError| Failure::node(Fault::Mig, format!("GPU {}: {e}", plan.uuid));
        journal.grant.gpus.push(MigGpuGrant { gpu: plan.gpu, gpu_uuid: plan.uuid.clone(), instances: plan.reuse.clone(), enabled_mig: plan.switch_on });
        if plan.switch_on {
            save(journal)?;
            super::journal::mark_switched_on(&cfg.runtime_dir, plan.gpu, journal.job_id)
                .map_err(|e| Failure::node(Fault::Mig, format!("saving the MIG mark: {e}")))?;
            if let MigModeChange::Pending { reason } = ops.set_mig_mode(plan.gpu, true).map_err(gpu_err)? {
                return Err(Failure::Job(format!(
                    "GPU {} ({}) is not in MIG mode and cannot be switched now: {reason}; an admin enables it with `nvidia-smi -i {} -mig 1`",
                    plan.uuid, plan.model, plan.uuid
                )));
            }
        }
        for p in &plan.create {
            journal.pending = Some(PendingCreate { gpu: plan.gpu, profile_id: p.profile_id, start: p.start });
            save(journal)?;
            let made = ops.create_mig_instance(plan.gpu, p.profile_id, Some(p.start)).map_err(gpu_err)?;
            let entry = granted(&made, &p.name, true);
            if let Some(g) = journal.grant.gpus.last_mut() {
                // Listed even without a UUID, so the undo destroys it.
                g.instances.push(entry.clone().unwrap_or_else(|| GrantedInstance {
                    gpu_instance: made.gpu_instance,
                    compute_instance: 0,
                    profile: p.name.clone(),
                    profile_id: made.profile_id,
                    placement_start: made.placement_start,
                    placement_size: made.placement_size,
                    uuid: String::new(),
                    made: true,
                }));
            }
            journal.pending = None;
            if entry.is_none() {
                return Err(Failure::node(Fault::Mig, format!("GPU {}: MIG instance {} has no compute instance UUID", plan.uuid, made.gpu_instance)));
            }
        }
    }
    save(journal)
}
