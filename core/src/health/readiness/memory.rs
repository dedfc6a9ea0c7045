//! `ckpt_memory`: the driver's checkpoint copies a job's GPU memory into
//! host memory before CRIU dumps it (cuda_ckpt, `checkpoint::host_room`),
//! so a node whose RAM is smaller than its GPU memory cannot checkpoint a
//! job that fills a GPU (an H200 node with 125 GiB of RAM and a 139 GiB
//! GPU: seen on the lent machines). A warning with the numbers: jobs that
//! use less still checkpoint.

use super::super::{Check, CheckResult, Ctx, Status};
use super::{gib, gpu_memories};

pub const NAME: &str = "ckpt_memory";

pub struct HostMemory;

impl Check for HostMemory {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&self, ctx: &Ctx) -> Vec<CheckResult> {
        super::judged(ctx, NAME, |f| judge(&f.host_memory, &gpu_memories(ctx)))
    }
}

/// MemTotal of /proc/meminfo, bytes.
pub fn probe() -> Result<u64, String> {
    let text = std::fs::read_to_string("/proc/meminfo").map_err(|e| format!("/proc/meminfo: {e}"))?;
    text.lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
        .map(|kib| kib << 10)
        .ok_or_else(|| "/proc/meminfo has no MemTotal line".into())
}

/// `gpus`: (NVML index, memory bytes) of each GPU.
pub fn judge(host: &Result<u64, String>, gpus: &[(u32, u64)]) -> CheckResult {
    let host = match host {
        Ok(h) => *h,
        Err(e) => return CheckResult::new(NAME, None, Status::Warn, format!("cannot read the host memory: {e}")),
    };
    let Some(&(gpu, largest)) = gpus.iter().max_by_key(|g| g.1) else {
        return CheckResult::new(NAME, None, Status::Skipped, "no GPU memory to compare with (see the driver check)");
    };
    let all: u64 = gpus.iter().map(|g| g.1).sum();
    if host < largest {
        return CheckResult::new(
            NAME,
            None,
            Status::Warn,
            format!(
                "host memory {} is less than GPU {gpu}'s {}: a job that fills the GPU cannot be checkpointed (the driver copies GPU memory into host memory first); \
                 fix: more host memory, or checkpoint jobs here keep their GPU memory well below {}",
                gib(host),
                gib(largest),
                gib(host)
            ),
        )
        .bounding();
    }
    if host < all {
        return CheckResult::new(
            NAME,
            None,
            Status::Warn,
            format!(
                "host memory {} is less than the {} GPUs' {}: a job that fills all of them cannot be checkpointed (the driver copies GPU memory into host memory first); \
                 fix: more host memory, or checkpoint jobs here use fewer GPUs or less of each",
                gib(host),
                gpus.len(),
                gib(all)
            ),
        )
        .bounding();
    }
    CheckResult::new(NAME, None, Status::Ok, format!("host memory {} holds all {} GPUs' {}", gib(host), gpus.len(), gib(all)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn host_memory_must_hold_what_the_driver_copies() {
        let h200 = 139 * GIB + GIB / 2;
        let cases: Vec<(Result<u64, String>, Vec<(u32, u64)>, Status, &str)> = vec![
            (Ok(2048 * GIB), vec![(0, h200), (1, h200)], Status::Ok, "host memory 2048.0 GiB holds all 2 GPUs' 279.0 GiB"),
            (
                Ok(125 * GIB),
                vec![(0, h200)],
                Status::Warn,
                "host memory 125.0 GiB is less than GPU 0's 139.5 GiB: a job that fills the GPU cannot be checkpointed (the driver copies GPU memory into host memory first); \
                 fix: more host memory, or checkpoint jobs here keep their GPU memory well below 125.0 GiB",
            ),
            (
                Ok(200 * GIB),
                vec![(0, h200), (1, h200)],
                Status::Warn,
                "host memory 200.0 GiB is less than the 2 GPUs' 279.0 GiB: a job that fills all of them cannot be checkpointed (the driver copies GPU memory into host memory first); \
                 fix: more host memory, or checkpoint jobs here use fewer GPUs or less of each",
            ),
            (Ok(125 * GIB), vec![], Status::Skipped, "no GPU memory to compare with (see the driver check)"),
            (Err("/proc/meminfo: gone".into()), vec![(0, h200)], Status::Warn, "cannot read the host memory: /proc/meminfo: gone"),
        ];
        for (host, gpus, status, text) in cases {
            let got = judge(&host, &gpus);
            assert_eq!((got.status, got.message.as_str()), (status, text), "{host:?} {gpus:?}");
            // Less host memory than the GPUs bounds the jobs, it does not stop them.
            assert_eq!(got.bounds_only, text.contains("is less than"), "{host:?} {gpus:?}");
        }
    }

    #[test]
    fn this_hosts_memory_is_read() {
        assert!(probe().unwrap() > 64 << 20);
    }
}
