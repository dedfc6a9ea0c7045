//! `gpu-mode-status`: one screen for the admin on a node (docs/admin.md).
//! [`records`] reads this project's records; [`gather`] adds what NVML and
//! Slurm say; [`StatusReport`] renders a table or JSON, and its
//! `problems` decide the exit code (0: consistent, 1: something needs the
//! admin).

pub mod records;
mod render;

use crate::config::Config;
use crate::drain::{NodeStatus, Scontrol};
use crate::gpu::{ComputeMode, GpuOps, NvmlGpus};
use records::Records;
use serde::Serialize;

/// Bump when a JSON field changes meaning or is removed.
pub const STATUS_VERSION: u32 = 1;

/// Exit codes of `gpu-mode-status`.
pub const EXIT_OK: i32 = 0;
pub const EXIT_NEEDS_ADMIN: i32 = 1;
pub const EXIT_USAGE: i32 = 2;

/// One GPU as NVML shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuFacts {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    /// `default`, `exclusive_process`, `prohibited`; `None` when unreadable.
    pub compute_mode: Option<String>,
    /// MIG mode now; `None` on GPUs without MIG or when unreadable.
    pub mig: Option<bool>,
    /// Why a read failed.
    pub error: Option<String>,
}

/// A job on a GPU, for the GPU table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuJob {
    pub job: u32,
    pub mode: String,
    pub user: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuRow {
    #[serde(flatten)]
    pub gpu: GpuFacts,
    pub jobs: Vec<GpuJob>,
}

/// The node in Slurm (`scontrol show node`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SlurmNode {
    pub state: String,
    pub reason: String,
    /// Drained or down with a `gpu-mode:` reason: ours to explain.
    pub drained_by_us: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StatusReport {
    pub version: u32,
    pub node: Option<String>,
    /// No problems: exit 0.
    pub healthy: bool,
    pub gpus: Vec<GpuRow>,
    /// NVML could not be opened (the GPU table is then empty).
    pub gpu_error: Option<String>,
    pub slurm: Option<SlurmNode>,
    /// scontrol failed or no node name is known (not a problem of ours).
    pub slurm_error: Option<String>,
    #[serde(flatten)]
    pub records: Records,
    /// The node checker's last checkpoint readiness verdict (`None`: none
    /// written yet). Shown, not a problem: a node that cannot checkpoint is
    /// flagged, and sites without checkpoint jobs need not care.
    pub checkpoint_readiness: Option<crate::preempt::readiness::Verdict>,
}

impl StatusReport {
    pub fn exit_code(&self) -> i32 {
        if self.healthy {
            EXIT_OK
        } else {
            EXIT_NEEDS_ADMIN
        }
    }
}

/// Puts the pieces together and lists the problems: the records' own, NVML
/// not opening or a GPU unreadable, and the node drained with one of our
/// reasons. Pure, so the decisions are table-tested.
pub fn assemble(node: Option<String>, records: Records, gpus: Result<Vec<GpuFacts>, String>, slurm: Result<NodeStatus, String>) -> StatusReport {
    let mut records = records;
    let (gpus, gpu_error) = match gpus {
        Ok(g) => (g, None),
        Err(e) => (Vec::new(), Some(e)),
    };
    if let Some(e) = &gpu_error {
        records.problems.push(format!("NVML: {e}"));
    }
    for g in gpus.iter().filter(|g| g.error.is_some()) {
        records.problems.push(format!("GPU {}: {}", g.index, g.error.as_deref().unwrap_or_default()));
    }
    let rows = gpus
        .into_iter()
        .map(|gpu| {
            let jobs = records
                .jobs
                .iter()
                .filter(|j| j.gpus.contains(&gpu.index))
                .map(|j| GpuJob { job: j.job, mode: j.mode.clone(), user: j.user.clone() })
                .collect();
            GpuRow { gpu, jobs }
        })
        .collect();
    let (slurm, slurm_error) = match slurm {
        Ok(s) => {
            let drained_by_us = s.is_drained_or_down() && s.reason_is_ours();
            if drained_by_us {
                records.problems.push(format!("node is {} by gpu-mode: {}", s.state, s.reason));
            }
            (Some(SlurmNode { state: s.state, reason: s.reason, drained_by_us }), None)
        }
        Err(e) => (None, Some(e)),
    };
    StatusReport {
        version: STATUS_VERSION,
        node,
        healthy: records.problems.is_empty(),
        gpus: rows,
        gpu_error,
        slurm,
        slurm_error,
        records,
        checkpoint_readiness: None,
    }
}

/// The whole status of this node: records, NVML, Slurm.
pub fn gather(cfg: &Config, node: Option<String>) -> StatusReport {
    let records = records::gather(cfg);
    let gpus = NvmlGpus::from_config(cfg).map_err(|e| e.to_string()).and_then(|ops| read_gpus(&ops));
    let slurm = match &node {
        Some(n) => Scontrol::new(&cfg.slurm.scontrol).show_node(n).map(|t| NodeStatus::parse(&t)).map_err(|e| e.to_string()),
        None => Err("no node name (pass --node, or run where SLURMD_NODENAME or the host name is the node's)".into()),
    };
    let mut report = assemble(node, records, gpus, slurm);
    report.checkpoint_readiness = crate::preempt::readiness::read(&crate::preempt::readiness::path(&cfg.runtime_dir));
    report
}

/// Every GPU NVML sees; a GPU whose reads fail is listed with the error.
pub fn read_gpus(ops: &dyn GpuOps) -> Result<Vec<GpuFacts>, String> {
    let count = ops.count().map_err(|e| e.to_string())?;
    Ok((0..count).map(|i| read_gpu(ops, i)).collect())
}

fn read_gpu(ops: &dyn GpuOps, index: u32) -> GpuFacts {
    let mut g = GpuFacts { index, uuid: String::new(), name: String::new(), compute_mode: None, mig: None, error: None };
    match ops.inventory(index) {
        Ok(inv) => (g.uuid, g.name) = (inv.uuid, inv.name),
        Err(e) => g.error = Some(e.to_string()),
    }
    match ops.modes(index) {
        Ok(m) => {
            g.compute_mode = Some(compute_mode_name(m.compute).into());
            g.mig = m.mig.map(|mig| mig.current);
        }
        Err(e) => {
            g.error.get_or_insert(e.to_string());
        }
    }
    g
}

fn compute_mode_name(m: ComputeMode) -> &'static str {
    match m {
        ComputeMode::Default => "default",
        ComputeMode::ExclusiveThread => "exclusive_thread",
        ComputeMode::Prohibited => "prohibited",
        ComputeMode::ExclusiveProcess => "exclusive_process",
    }
}

#[cfg(test)]
mod tests;
