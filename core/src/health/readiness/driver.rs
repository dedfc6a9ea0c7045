//! `ckpt_driver`: what the NVIDIA driver's branch lets a checkpoint job do
//! (NVIDIA's cuda-checkpoint notes; field notes §9): the checkpoint API
//! from r570; on r5xx NCCL jobs only in the portable transport mode
//! (`--gpu-mode=checkpoint:nccl=portable`); multi-process jobs
//! (`--launch-job`) from r590; CUDA IPC, which NCCL's own transports use,
//! from r610 (preempt::uncheckpointable). Informational from r570 on; a
//! warning below it.

use super::super::{Check, CheckResult, Ctx, Status};
use crate::preempt::uncheckpointable::{driver_major, NCCL_DRIVER_MAJOR};

pub const NAME: &str = "ckpt_driver";
/// The first branch with the CUDA driver's checkpoint API.
const API_MAJOR: u32 = 570;
/// The first branch with `--launch-job` (multi-process jobs).
const LAUNCH_JOB_MAJOR: u32 = 590;

pub struct Driver;

impl Check for Driver {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&self, ctx: &Ctx) -> Vec<CheckResult> {
        let driver = match &ctx.nvml {
            Ok(n) => n.driver.as_ref().map(|d| d.driver.clone()),
            Err(_) => None,
        };
        vec![judge(driver.as_deref())]
    }
}

pub fn judge(driver: Option<&str>) -> CheckResult {
    let Some(version) = driver.filter(|v| !v.is_empty()) else {
        return CheckResult::new(NAME, None, Status::Skipped, "driver version unknown (see the driver check)");
    };
    let major = driver_major(version);
    if major < API_MAJOR {
        return CheckResult::new(
            NAME,
            None,
            Status::Warn,
            format!("driver {version} has no CUDA checkpoint API (r{API_MAJOR} or newer); fix: install an NVIDIA driver of branch r{API_MAJOR} or newer"),
        );
    }
    let allows = if major >= NCCL_DRIVER_MAJOR {
        "single- and multi-process jobs (--launch-job), CUDA IPC and NCCL".to_string()
    } else if major >= LAUNCH_JOB_MAJOR {
        format!("single- and multi-process jobs (--launch-job); r5xx: NCCL jobs only in portable mode (--gpu-mode=checkpoint:nccl=portable); CUDA IPC from r{NCCL_DRIVER_MAJOR}")
    } else {
        format!(
            "single-process jobs; r5xx: NCCL jobs only in portable mode (--gpu-mode=checkpoint:nccl=portable); multi-process jobs (--launch-job) from r{LAUNCH_JOB_MAJOR}, CUDA IPC from r{NCCL_DRIVER_MAJOR}"
        )
    };
    CheckResult::new(NAME, None, Status::Ok, format!("driver {version} (r{major}): {allows}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_branch_says_what_it_allows() {
        let cases: &[(Option<&str>, Status, &str)] = &[
            (
                Some("580.159.04"),
                Status::Ok,
                "driver 580.159.04 (r580): single-process jobs; r5xx: NCCL jobs only in portable mode (--gpu-mode=checkpoint:nccl=portable); multi-process jobs (--launch-job) from r590, CUDA IPC from r610",
            ),
            (Some("570.86.15"), Status::Ok, "driver 570.86.15 (r570): single-process jobs; r5xx: NCCL jobs only in portable mode (--gpu-mode=checkpoint:nccl=portable); multi-process jobs (--launch-job) from r590, CUDA IPC from r610"),
            (Some("590.44.01"), Status::Ok, "driver 590.44.01 (r590): single- and multi-process jobs (--launch-job); r5xx: NCCL jobs only in portable mode (--gpu-mode=checkpoint:nccl=portable); CUDA IPC from r610"),
            (Some("610.10"), Status::Ok, "driver 610.10 (r610): single- and multi-process jobs (--launch-job), CUDA IPC and NCCL"),
            (Some("550.54.15"), Status::Warn, "driver 550.54.15 has no CUDA checkpoint API (r570 or newer); fix: install an NVIDIA driver of branch r570 or newer"),
            (Some(""), Status::Skipped, "driver version unknown (see the driver check)"),
            (None, Status::Skipped, "driver version unknown (see the driver check)"),
        ];
        for (driver, status, text) in cases {
            let got = judge(*driver);
            assert_eq!((got.status, got.message.as_str()), (*status, *text), "{driver:?}");
        }
    }
}
