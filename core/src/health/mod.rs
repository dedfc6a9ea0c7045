//! gpu-mode-node-checker's GPU health checks (issue 5), gpud style: one file
//! per check, each behind [`Check`], each returning one [`CheckResult`] per
//! GPU (or one for the node). Checks are pure functions of a [`Ctx`] taken
//! once per run ([`snapshot`]), so NVML is read once and every check can be
//! unit-tested from a fake. What the results mean for the node (drain,
//! resume, nothing) is [`policy::decide`], also pure; [`run`] wires NVML,
//! scontrol, the cursor file and the outputs together.

pub mod clocks;
/// `[health]`: configuration's (crate::config::health); this path stays.
pub use crate::config::health as config;
pub mod count;
pub mod cursor;
pub mod deep;
pub mod driver;
pub mod fabric;
pub mod kmsg;
pub mod leftovers;
pub mod memory;
pub mod mig;
pub mod mps;
pub mod netlocks;
pub mod output;
pub mod pcie;
pub mod persistence;
pub mod policy;
pub mod readiness;
pub mod snapshot;
pub mod xid;

#[cfg(test)]
mod fake;

pub use policy::{decide, Action};
pub use output::Report;
pub use snapshot::{Ctx, GpuSnap};

use crate::gpu::HealthReadings;
use serde::{Deserialize, Serialize};

/// Every check by name (configuration's, which `health.disabled` is checked against).
pub use crate::config::health::CHECK_NAMES;

/// A result's verdict. Ordered from best to worst so `max` is the worst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Ok,
    /// The check does not apply here (no fabric, MIG off, GPU busy for --deep).
    Skipped,
    /// Worth a look; never drains.
    Warn,
    /// The node must not take jobs.
    Fail,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Skipped => "skipped",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// One verdict of one check about one GPU (`gpu: None`: the node).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckResult {
    pub check: String,
    pub gpu: Option<u32>,
    pub status: Status,
    /// One line a person can act on; for `fail` it is the drain reason's detail.
    pub message: String,
    /// A warning that bounds what the node can do rather than saying it
    /// cannot (a checkpoint readiness finding about size: host memory or
    /// free space below the largest GPU's memory; smaller jobs are fine).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub bounds_only: bool,
}

impl CheckResult {
    pub fn new(check: &str, gpu: Option<u32>, status: Status, message: impl Into<String>) -> CheckResult {
        CheckResult { check: check.to_string(), gpu, status, message: message.into(), bounds_only: false }
    }

    /// This result as one that bounds, not forbids (see `bounds_only`).
    pub fn bounding(mut self) -> CheckResult {
        self.bounds_only = true;
        self
    }
}

/// One health check.
pub trait Check {
    fn name(&self) -> &'static str;
    /// Never panics on odd readings: anything unexpected becomes a result.
    fn run(&self, ctx: &Ctx) -> Vec<CheckResult>;
}

/// The quick checks, in [`CHECK_NAMES`] order (the deep check runs apart),
/// the checkpoint readiness checks last.
pub fn quick_checks() -> Vec<Box<dyn Check + Send + Sync>> {
    let gpu_checks: Vec<Box<dyn Check + Send + Sync>> = vec![
        Box::new(driver::Driver),
        Box::new(count::GpuCount),
        Box::new(memory::Memory),
        Box::new(xid::Xid),
        Box::new(pcie::PcieLink),
        Box::new(clocks::Clocks),
        Box::new(persistence::Persistence),
        Box::new(fabric::Fabric),
        Box::new(mps::Mps),
        Box::new(netlocks::NetLocks),
        Box::new(leftovers::Leftovers),
        Box::new(mig::StaleMig),
    ];
    gpu_checks.into_iter().chain(readiness::checks()).collect()
}

/// Runs `check` and turns a panic inside it into a failed result: the
/// checker runs as root under slurmd and must report, never crash.
pub fn run_guarded(check: &(dyn Check + Send + Sync), ctx: &Ctx) -> Vec<CheckResult> {
    let name = check.name();
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check.run(ctx))) {
        Ok(results) => results,
        Err(p) => {
            let what = p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned());
            vec![CheckResult::new(name, None, Status::Fail, format!("check crashed: {}", what.unwrap_or_default()))]
        }
    }
}

/// Per-GPU results of a check, `skipped` for the node when NVML gave no GPUs
/// (the driver check says why).
pub fn per_gpu(ctx: &Ctx, name: &str, mut f: impl FnMut(&GpuSnap, &HealthReadings) -> CheckResult) -> Vec<CheckResult> {
    match &ctx.nvml {
        Err(_) => vec![CheckResult::new(name, None, Status::Skipped, "NVML unavailable (see the driver check)")],
        Ok(n) if n.gpus.is_empty() => vec![CheckResult::new(name, None, Status::Skipped, "no GPUs")],
        Ok(n) => n
            .gpus
            .iter()
            .map(|g| match &g.health {
                None => CheckResult::new(name, Some(g.index), Status::Skipped, "GPU unreadable (see the driver check)"),
                Some(h) => f(g, h),
            })
            .collect(),
    }
}

/// The worst of several (status, text) findings as one result; `ok_text`
/// when there are none.
pub fn combine(name: &str, gpu: Option<u32>, findings: Vec<(Status, String)>, ok_text: String) -> CheckResult {
    let worst = findings.iter().map(|f| f.0).max().unwrap_or(Status::Ok);
    if findings.is_empty() {
        return CheckResult::new(name, gpu, Status::Ok, ok_text);
    }
    // The worst findings first, so the drain reason leads with them.
    let mut sorted = findings;
    sorted.sort_by_key(|f| std::cmp::Reverse(f.0));
    let text: Vec<String> = sorted.into_iter().map(|f| f.1).collect();
    CheckResult::new(name, gpu, worst, text.join("; "))
}
