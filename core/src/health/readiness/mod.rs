//! Checkpoint readiness (issue 40 item 2): whether this node can checkpoint
//! a `--gpu-mode=checkpoint` job, said before a job finds out at its
//! preemption. One check per prerequisite, each a file here with its probe
//! and its pure verdict: the kernel (`ckpt_kernel`), CRIU, its version,
//! patches and `criu check` (`ckpt_criu`), the capabilities CRIU runs with
//! (`ckpt_caps`), the image and staging directories (`ckpt_dirs`), host
//! memory against GPU memory (`ckpt_memory`), the driver branch
//! (`ckpt_driver`). A node that cannot checkpoint is flagged, never
//! drained: every verdict is `ok`, `skipped` or `warn`, and each warning
//! names the fix. The node checker then writes the verdict for the jobs'
//! wrapper and `gpu-mode-status` (preempt::readiness).

pub mod caps;
pub mod criu;
pub mod dirs;
pub mod driver;
pub mod kernel;
pub mod memory;

use super::{Check, CheckResult, Status};
use crate::preempt::readiness::{Item, Verdict, VERSION};
use std::path::{Path, PathBuf};

/// The readiness checks' names, in report order.
pub const NAMES: &[&str] = &[kernel::NAME, criu::NAME, caps::NAME, dirs::NAME, memory::NAME, driver::NAME];

/// The checks, in [`NAMES`] order.
pub fn checks() -> Vec<Box<dyn Check + Send + Sync>> {
    vec![Box::new(kernel::Kernel), Box::new(criu::Criu), Box::new(caps::Caps), Box::new(dirs::Dirs), Box::new(memory::HostMemory), Box::new(driver::Driver)]
}

/// What the probes read, from the site config's `[preempt]`.
#[derive(Debug, Clone)]
pub struct Inputs {
    pub criu: PathBuf,
    pub image_dir: PathBuf,
    pub staging_dir: Option<PathBuf>,
    /// Where a passed `criu check` is remembered for the boot (the agents'
    /// cache: a pass costs one CRIU run per boot, not one per epilog).
    pub criu_check_cache: PathBuf,
}

impl Inputs {
    pub fn from_config(cfg: &crate::Config) -> Inputs {
        Inputs {
            criu: cfg.preempt.criu.clone(),
            image_dir: cfg.preempt.image_dir.clone(),
            staging_dir: cfg.preempt.staging_dir.clone(),
            criu_check_cache: cfg.runtime_dir.join(crate::criu::CHECK_CACHE_FILE),
        }
    }
}

/// Everything the readiness checks judge besides NVML, read once per run.
#[derive(Debug)]
pub struct Facts {
    pub kernel_release: Result<String, String>,
    pub criu: criu::CriuFacts,
    pub caps: caps::CapsFacts,
    pub dirs: Vec<dirs::DirFacts>,
    /// MemTotal, bytes.
    pub host_memory: Result<u64, String>,
}

/// Runs the probes (CRIU, a spawn as `nobody`, a file in each directory).
pub fn gather(inputs: &Inputs) -> Facts {
    let criu = criu::probe(&inputs.criu, &inputs.criu_check_cache);
    let caps = caps::probe(&inputs.criu, criu.installed());
    Facts { kernel_release: kernel::probe(), criu, caps, dirs: dirs::probe(inputs), host_memory: memory::probe() }
}

/// The verdict file's items: each readiness result, ready unless it warns
/// (or fails).
pub fn verdict(results: &[CheckResult], now_unix: u64) -> Verdict {
    let items = results
        .iter()
        .filter(|r| NAMES.contains(&r.check.as_str()))
        .map(|r| Item { check: r.check.clone(), ready: r.status < Status::Warn, message: r.message.clone(), bounds_only: r.bounds_only })
        .collect();
    Verdict { version: VERSION, checked_unix: now_unix, items }
}

/// Writes the verdict under `runtime_dir` for the jobs' wrapper and
/// `gpu-mode-status`.
pub fn write_verdict(runtime_dir: &Path, results: &[CheckResult]) -> Result<(), String> {
    crate::preempt::readiness::write(runtime_dir, &verdict(results, crate::persist::now_unix()))
}

/// A number of bytes as GiB with one decimal, as the messages give them.
pub fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// The largest GPU's memory: (NVML index, bytes); `None` without GPUs.
pub fn largest_gpu(ctx: &super::Ctx) -> Option<(u32, u64)> {
    gpu_memories(ctx).into_iter().max_by_key(|g| g.1)
}

/// Each GPU's memory, (NVML index, bytes), for the GPUs NVML could read.
pub fn gpu_memories(ctx: &super::Ctx) -> Vec<(u32, u64)> {
    ctx.gpus().iter().filter_map(|g| Some((g.index, g.inventory.as_ref()?.memory_total_mib << 20))).collect()
}

/// A check's one result from the run's facts; skipped when the run has none
/// (a snapshot taken without `[preempt]`, as in the other checks' tests).
fn judged(ctx: &super::Ctx, name: &str, judge: impl FnOnce(&Facts) -> CheckResult) -> Vec<CheckResult> {
    match &ctx.readiness {
        Some(f) => vec![judge(f)],
        None => vec![CheckResult::new(name, None, Status::Skipped, "checkpoint readiness was not probed in this run")],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verdict_holds_the_readiness_results_only() {
        let results = vec![
            CheckResult::new("driver", None, Status::Fail, "GPU lost"),
            CheckResult::new(kernel::NAME, None, Status::Ok, "Linux 6.18"),
            CheckResult::new(criu::NAME, None, Status::Warn, "missing; fix: x"),
            CheckResult::new(driver::NAME, None, Status::Skipped, "NVML unavailable"),
        ];
        let v = verdict(&results, 7);
        let got: Vec<(&str, bool)> = v.items.iter().map(|i| (i.check.as_str(), i.ready)).collect();
        assert_eq!(got, vec![(kernel::NAME, true), (criu::NAME, false), (driver::NAME, true)]);
        assert_eq!((v.checked_unix, v.ready()), (7, false));
    }

    #[test]
    fn every_readiness_check_is_a_known_check_name() {
        for name in NAMES {
            assert!(super::super::CHECK_NAMES.contains(name), "{name} missing in CHECK_NAMES");
        }
        let names: Vec<&str> = checks().iter().map(|c| c.name()).collect();
        assert_eq!(names, NAMES);
    }
}
