//! GPU count: the configured number, NVML's count and the NVIDIA GPUs on the
//! PCI bus (sysfs, vendor 0x10de, display/3D class) must agree. A GPU that
//! the driver lost still shows in sysfs; one the bus lost shows in neither.

use super::{Check, CheckResult, Ctx, Status};
use std::path::Path;

pub struct GpuCount;

const NAME: &str = "gpu_count";

/// NVIDIA GPUs under `<sysfs_root>/bus/pci/devices`: vendor 0x10de and PCI
/// class VGA (0x0300xx) or 3D controller (0x0302xx); NVSwitches (0x0680xx)
/// and audio functions are not GPUs.
pub fn sysfs_gpu_count(sysfs_root: &Path) -> Result<u32, String> {
    let dir = sysfs_root.join("bus/pci/devices");
    let entries = std::fs::read_dir(&dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    let read = |p: &Path, f: &str| std::fs::read_to_string(p.join(f)).map(|s| s.trim().to_ascii_lowercase()).unwrap_or_default();
    let count = entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            let p = e.path();
            read(&p, "vendor") == "0x10de" && { let c = read(&p, "class"); c.starts_with("0x0300") || c.starts_with("0x0302") }
        })
        .count();
    Ok(count as u32)
}

impl Check for GpuCount {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&self, ctx: &Ctx) -> Vec<CheckResult> {
        let nvml = ctx.nvml.as_ref().map(|n| n.gpus.len() as u32).ok();
        let sysfs = sysfs_gpu_count(&ctx.config.sysfs_root);
        vec![judge(ctx.config.expected_gpus, nvml, sysfs)]
    }
}

/// The verdict from the three counts (`expected` 0: not configured).
pub fn judge(expected: u32, nvml: Option<u32>, sysfs: Result<u32, String>) -> CheckResult {
    let fail = |m: String| CheckResult::new(NAME, None, Status::Fail, m);
    let Some(nvml) = nvml else {
        return CheckResult::new(NAME, None, Status::Skipped, "NVML unavailable (see the driver check)");
    };
    if expected != 0 && nvml != expected {
        return fail(format!("NVML sees {nvml} GPU(s), the config expects {expected}"));
    }
    match sysfs {
        Ok(pci) if pci != nvml => fail(format!("{pci} NVIDIA GPU(s) on the PCI bus but NVML sees {nvml}")),
        Ok(_) => CheckResult::new(NAME, None, Status::Ok, format!("{nvml} GPU(s) (NVML and PCI agree)")),
        Err(e) => CheckResult::new(NAME, None, Status::Warn, format!("{nvml} GPU(s) in NVML; PCI not compared: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_judged() {
        type Case = (u32, Option<u32>, Result<u32, String>, Status, &'static str);
        let cases: &[Case] = &[
            (0, Some(2), Ok(2), Status::Ok, "2 GPU(s) (NVML and PCI agree)"),
            (8, Some(8), Ok(8), Status::Ok, "8 GPU(s)"),
            (8, Some(7), Ok(8), Status::Fail, "NVML sees 7 GPU(s), the config expects 8"),
            (0, Some(1), Ok(2), Status::Fail, "2 NVIDIA GPU(s) on the PCI bus but NVML sees 1"),
            (0, Some(2), Err("no sysfs".into()), Status::Warn, "2 GPU(s) in NVML; PCI not compared: no sysfs"),
            (4, None, Ok(4), Status::Skipped, "NVML unavailable"),
        ];
        for (expected, nvml, sysfs, status, text) in cases {
            let r = judge(*expected, *nvml, sysfs.clone());
            assert_eq!(r.status, *status, "{r:?}");
            assert!(r.message.starts_with(text), "{r:?}");
        }
    }

    #[test]
    fn sysfs_counts_only_nvidia_gpus() {
        let dir = tempfile::tempdir().unwrap();
        let devs = dir.path().join("bus/pci/devices");
        for (name, vendor, class) in [
            ("0000:3b:00.0", "0x10de", "0x030200"),
            ("0000:3c:00.0", "0x10DE", "0x030000"),
            ("0000:3c:00.1", "0x10de", "0x040300"),
            ("0000:05:00.0", "0x10de", "0x068000"),
            ("0000:06:00.0", "0x8086", "0x030000"),
        ] {
            std::fs::create_dir_all(devs.join(name)).unwrap();
            std::fs::write(devs.join(name).join("vendor"), format!("{vendor}\n")).unwrap();
            std::fs::write(devs.join(name).join("class"), format!("{class}\n")).unwrap();
        }
        assert_eq!(sysfs_gpu_count(dir.path()).unwrap(), 2);
        assert!(sysfs_gpu_count(&dir.path().join("none")).unwrap_err().contains("cannot list"));
    }
}
