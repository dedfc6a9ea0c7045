//! `--gpu-mode=mig:<layout>`: the job's MIG instances on each of its GPUs.

pub mod placement;

use crate::config::Config;
use crate::failure::Failure;
use crate::mode::MigRequest;
use crate::modes::{Grant, GrantRecord, ModeDriver, PrepareCtx, Released};
use serde::{Deserialize, Serialize};

/// What the prolog made (or, with `mig_instances = "leave"`, found) on each
/// of the job's GPUs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigGrant {
    pub gpus: Vec<MigGpuGrant>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigGpuGrant {
    /// NVML index.
    pub gpu: u32,
    pub gpu_uuid: String,
    pub instances: Vec<GrantedInstance>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantedInstance {
    pub gpu_instance: u32,
    pub compute_instance: u32,
    pub profile: String,
    pub profile_id: u32,
    pub placement_start: u32,
    pub placement_size: u32,
    /// `MIG-...`, what the job's tasks get.
    pub uuid: String,
    /// Made for this job (destroyed by its epilog), or found there.
    pub made: bool,
}

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

    fn prepare(&self, _ctx: &PrepareCtx) -> Result<Grant, Failure> {
        Ok(Grant { record: GrantRecord::Mig(MigGrant::default()), ..Grant::default() })
    }

    fn release(&self, _cfg: &Config, _job_id: u32, _grant: &GrantRecord) -> Result<Released, Failure> {
        Ok(Released::nothing())
    }

    fn release_lost(&self, _cfg: &Config, _job_id: u32) -> Result<Released, Failure> {
        Ok(Released::nothing())
    }
}
