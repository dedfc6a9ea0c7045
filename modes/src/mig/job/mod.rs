//! `--gpu-mode=mig:<layout>`: the job's MIG instances on each of its GPUs.
//!
//! Slurm 22.05 has no dynamic MIG, so a job holds whole GPUs
//! (`--gres=gpu:N`) and partitions each of them into its layout:
//! [`setup`] in the prolog (plan every GPU, then create with explicit
//! placements, journalling each step in [`journal`]), [`teardown`] in the
//! epilog (destroy exactly what the job made). [`layout`] resolves a request
//! against a GPU model's profile table, [`placement`] finds where it goes.

/// The MIG domain's parts this mode uses (crate::mig), at their old paths.
pub use super::{journal, layout, placement};
pub mod setup;
pub mod teardown;

use crate::config::Config;
use crate::failure::{Failure, Fault};
use crate::gpu::NvmlGpus;
use crate::gpu_mode::MigRequest;
use crate::grant::GrantRecord;
use crate::mode_driver::{Grant, ModeDriver, PrepareCtx, Released};
use crate::watchdog;
use journal::MigJournal;

/// The MIG part of a job's grant: plain data (crate::grant).
pub use crate::grant::{GrantedInstance, MigGpuGrant, MigGrant};

/// Every task's list of the job's MIG devices (for programs that pick their
/// own); each task's CUDA_VISIBLE_DEVICES holds one of them.
pub const TASK_MIG_UUIDS_VAR: &str = "SLURM_GPU_MODE_MIG_UUIDS";

pub struct MigDriver<'a> {
    pub request: Option<&'a MigRequest>,
}

impl ModeDriver for MigDriver<'_> {
    fn name(&self) -> &'static str {
        "mig"
    }

    fn check(&self, ctx: &PrepareCtx) -> Result<(), Failure> {
        if let Some(MigRequest::Layout(name)) = self.request {
            if !ctx.cfg.mig.layouts.contains_key(name) {
                let known: Vec<&str> = ctx.cfg.mig.layouts.keys().map(String::as_str).collect();
                let known = if known.is_empty() { "none".to_string() } else { known.join(", ") };
                return Err(Failure::Job(format!("MIG layout \"{name}\" is not defined on node {} (defined: {known})", ctx.env.node)));
            }
        }
        Ok(())
    }

    fn prepare(&self, ctx: &PrepareCtx) -> Result<Grant, Failure> {
        let request = self.request.ok_or_else(|| Failure::node(Fault::Mig, "mig: prepare without a request"))?;
        let ops = {
            let _step = watchdog::step("nvml: open");
            ctx.nvml.get().map_err(|e| Failure::node(Fault::Nvml, format!("NVML: {e}")))?
        };
        let _step = watchdog::step("mig: setup");
        let journal = setup::setup(ctx.cfg, ctx.env, ctx.gpus, request, ops)?;
        let events = made_events(crate::metrics::MIG_CREATED, &journal.grant);
        Ok(Grant { events, ..grant_of(journal.grant) })
    }

    fn release(&self, cfg: &Config, job_id: u32, grant: &GrantRecord) -> Result<Released, Failure> {
        let GrantRecord::Mig(grant) = grant else { return Ok(Released::nothing()) };
        let journal = MigJournal { version: journal::JOURNAL_VERSION, job_id, grant: grant.clone(), pending: None };
        let done = with_nvml(cfg, |ops| teardown::release_locked(cfg, &journal, ops))?;
        Ok(Released { events: made_events(crate::metrics::MIG_DESTROYED, &journal.grant), ..describe(done) })
    }

    fn release_lost(&self, cfg: &Config, job_id: u32) -> Result<Released, Failure> {
        let journal = MigJournal::load(&cfg.runtime_dir, job_id).map_err(|e| Failure::node(Fault::Mig, format!("mig: {e}")))?;
        match journal {
            None => Ok(Released::nothing()),
            Some(j) => {
                let done = with_nvml(cfg, |ops| teardown::release_locked(cfg, &j, ops))?;
                Ok(Released { events: made_events(crate::metrics::MIG_DESTROYED, &j.grant), ..describe(done) })
            }
        }
    }
}

/// The instances made for the job (not those found there), counted by
/// profile, for the verb that runs the mode to record.
fn made_events(family: &'static str, grant: &MigGrant) -> Vec<crate::metrics::Event> {
    let mut by_profile: std::collections::BTreeMap<&str, f64> = Default::default();
    for i in grant.gpus.iter().flat_map(|g| &g.instances).filter(|i| i.made) {
        *by_profile.entry(i.profile.as_str()).or_default() += 1.0;
    }
    by_profile.into_iter().map(|(p, n)| crate::metrics::Event::Add { family, labels: vec![("profile", p.to_string())], by: n }).collect()
}

/// The job state's grant and the tasks' variables: each task one MIG
/// device (by node-local id, round-robin), every task the whole list.
fn grant_of(grant: MigGrant) -> Grant {
    let uuids: Vec<String> = grant.gpus.iter().flat_map(|g| g.instances.iter().map(|i| i.uuid.clone())).collect();
    let detail = grant
        .gpus
        .iter()
        .map(|g| {
            let list: Vec<String> = g.instances.iter().map(|i| format!("{}@{}", i.profile, i.placement_start)).collect();
            format!("GPU {}: {}", g.gpu_uuid, list.join(","))
        })
        .collect::<Vec<_>>()
        .join("; ");
    Grant {
        task_env: [(TASK_MIG_UUIDS_VAR.to_string(), uuids.join(","))].into(),
        per_task_env: [("CUDA_VISIBLE_DEVICES".to_string(), uuids)].into(),
        record: GrantRecord::Mig(grant),
        detail: Some(format!("mig {detail}")),
        events: Vec::new(),
    }
}

fn with_nvml<T>(cfg: &Config, f: impl FnOnce(&dyn crate::gpu::GpuOps) -> Result<T, Failure>) -> Result<T, Failure> {
    let ops = {
        let _step = watchdog::step("nvml: open");
        NvmlGpus::from_config(cfg).map_err(|e| Failure::node(Fault::Nvml, format!("mig: NVML: {e}")))?
    };
    let _step = watchdog::step("mig: teardown");
    f(&ops)
}

fn describe(t: teardown::Teardown) -> Released {
    let mut text = format!("mig: {} instance(s) destroyed", t.destroyed);
    if !t.killed.is_empty() {
        text.push_str(&format!("; killed the job's leftover pids {:?}", t.killed));
    }
    if !t.switched_off.is_empty() {
        text.push_str(&format!("; MIG switched off on {}", t.switched_off.join(",")));
    }
    Released::did(text)
}
