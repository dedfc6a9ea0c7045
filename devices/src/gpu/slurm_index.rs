//! Slurm's GPU indices → NVML's. The one place the prolog translates them:
//! everything that touches a GPU (MPS today, MIG later), the per-GPU locks
//! and the MPS registry use NVML indices; Slurm's stay for log lines.
//!
//! Slurm's index is a position in gres.conf's device list ([`crate::gres`]);
//! the device file /dev/nvidiaM has minor M, and NVML reports each GPU's
//! minor, so index → file → minor → NVML index. With `AutoDetect=nvml` (or
//! no device files) Slurm's order is NVML's and nothing is read from NVML.

use super::{GpuError, GpuOps};
use crate::config::Config;
use crate::gres::{read_gpu_order, GpuOrder, GresDevice, GresError};
use crate::job_env::{format_gpu_list, JobEnv};
use std::path::{Path, PathBuf};

/// A job's GPUs in both numberings, in the same order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobGpus {
    /// Slurm's indices (SLURM_JOB_GPUS), for messages.
    pub slurm: Vec<u32>,
    /// The same GPUs as NVML numbers them: what GPU operations take.
    pub nvml: Vec<u32>,
    /// How they were mapped, for the prolog's log line.
    pub how: String,
}

/// Why a job's Slurm GPU indices could not be mapped to NVML's. The prolog
/// drains the node with it (`GPU indices: ...`, [`Fault::GpuIndices`]), so
/// each text is written to survive Slurm's cut of a drain reason.
///
/// [`Fault::GpuIndices`]: crate::failure::Fault::GpuIndices
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    /// gres.conf could not be read or parsed.
    #[error(transparent)]
    Gres(#[from] GresError),
    /// NVML could not be opened or counted, so no minor could be read.
    #[error("NVML: {0}")]
    Nvml(#[source] GpuError),
    #[error("Slurm GPU index {index} is not in {}: it lists {count} GPU device files for this node", .path.display())]
    NotListed { index: u32, path: PathBuf, count: usize },
    /// No readable GPU has the device's minor, and some GPUs could not be
    /// read: their errors (texts, one per GPU) come first, since "the GPU is
    /// lost" must survive the drain reason's cut (docs/faults.md).
    #[error("{}: so Slurm GPU index {index} ({file}, {} line {line}) matches no GPU NVML can read", .unreadable.join("; "), .path.display())]
    Unreadable { unreadable: Vec<String>, index: u32, file: String, path: PathBuf, line: usize },
    /// Every GPU was read, and none has the device's minor.
    #[error("Slurm GPU index {index} is {file} ({} line {line}) but no GPU with minor {minor} is visible to NVML", .path.display())]
    NoMinor { index: u32, file: String, path: PathBuf, line: usize, minor: u32 },
}

/// Reads the node's gres.conf and maps the job's GPUs. `nvml` is asked for
/// only when minors must be read; a job without GPUs reads nothing.
pub fn resolve<'a>(
    cfg: &Config,
    env: &JobEnv,
    nvml: impl FnOnce() -> Result<&'a dyn GpuOps, GpuError>,
) -> Result<JobGpus, IndexError> {
    if env.slurm_gpus.is_empty() {
        return Ok(JobGpus::default());
    }
    let order = read_gpu_order(&cfg.slurm.gres_conf, &env.node)?;
    map_to_nvml(&order, &env.slurm_gpus, nvml)
}

/// Maps Slurm indices `slurm` in `order` to NVML indices.
pub fn map_to_nvml<'a>(
    order: &GpuOrder,
    slurm: &[u32],
    nvml: impl FnOnce() -> Result<&'a dyn GpuOps, GpuError>,
) -> Result<JobGpus, IndexError> {
    let (path, devices) = match order {
        GpuOrder::Nvml { reason } => {
            let how = format!("Slurm's GPU indices are NVML's ({reason})");
            return Ok(JobGpus { slurm: slurm.to_vec(), nvml: slurm.to_vec(), how });
        }
        GpuOrder::Files { path, devices } => (path, devices),
    };
    let minors = NvmlMinors::read(nvml().map_err(IndexError::Nvml)?)?;
    let nvml = slurm
        .iter()
        .map(|&index| {
            let device = devices
                .get(index as usize)
                .ok_or_else(|| IndexError::NotListed { index, path: path.clone(), count: devices.len() })?;
            minors.index_of(index, device, path)
        })
        .collect::<Result<Vec<u32>, IndexError>>()?;
    let how = format!("Slurm GPUs {} are NVML GPUs {} (minors from {})", format_gpu_list(slurm), format_gpu_list(&nvml), path.display());
    Ok(JobGpus { slurm: slurm.to_vec(), nvml, how })
}

/// Each NVML GPU's minor, and the GPUs whose minor could not be read.
struct NvmlMinors {
    /// (minor, NVML index)
    known: Vec<(u32, u32)>,
    unreadable: Vec<String>,
}

impl NvmlMinors {
    fn read(ops: &dyn GpuOps) -> Result<NvmlMinors, IndexError> {
        let count = ops.count().map_err(IndexError::Nvml)?;
        let mut minors = NvmlMinors { known: Vec::new(), unreadable: Vec::new() };
        // A GPU that cannot be read is only a problem if the job needs it:
        // it is named when a minor is not found.
        for gpu in 0..count {
            match ops.minor_number(gpu) {
                Ok(minor) => minors.known.push((minor, gpu)),
                Err(e) => minors.unreadable.push(e.to_string()),
            }
        }
        Ok(minors)
    }

    fn index_of(&self, slurm: u32, device: &GresDevice, path: &Path) -> Result<u32, IndexError> {
        if let Some(&(_, gpu)) = self.known.iter().find(|(minor, _)| *minor == device.minor) {
            return Ok(gpu);
        }
        let (index, file, path, line) = (slurm, device.file.clone(), path.to_path_buf(), device.line);
        if !self.unreadable.is_empty() {
            return Err(IndexError::Unreadable { unreadable: self.unreadable.clone(), index, file, path, line });
        }
        Err(IndexError::NoMinor { index, file, path, line, minor: device.minor })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::fake::FakeGpus;
    use crate::gres::parse_gpu_order;

    fn order(text: &str) -> GpuOrder {
        parse_gpu_order(text, Path::new("/etc/slurm/gres.conf"), "n1").unwrap()
    }

    fn map(text: &str, slurm: &[u32], gpus: &FakeGpus) -> Result<Vec<u32>, String> {
        map_typed(text, slurm, gpus).map_err(|e| e.to_string())
    }

    fn map_typed(text: &str, slurm: &[u32], gpus: &FakeGpus) -> Result<Vec<u32>, IndexError> {
        map_to_nvml(&order(text), slurm, || Ok(gpus as &dyn GpuOps)).map(|j| j.nvml)
    }

    #[test]
    fn slurm_indices_become_nvml_indices_through_minors() {
        // NVML GPU 0 is /dev/nvidia2, 1 is nvidia0, 2 is nvidia1 (minors
        // permuted against NVML's order, as the driver may number them).
        let gpus = FakeGpus::with_minors(&[2, 0, 1]);
        let in_order = "Name=gpu File=/dev/nvidia[0-2]";
        let reversed = "Name=gpu File=/dev/nvidia[2,1,0]";
        // (gres.conf, Slurm indices, NVML indices)
        let cases: &[(&str, &[u32], &[u32])] = &[
            (in_order, &[0], &[1]),
            (in_order, &[1], &[2]),
            (in_order, &[2], &[0]),
            (in_order, &[0, 2], &[1, 0]),
            (reversed, &[0], &[0]),
            (reversed, &[1, 2], &[2, 1]),
            // AutoDetect=nvml: Slurm already counts as NVML does
            ("AutoDetect=nvml\nName=gpu File=/dev/nvidia[2,1,0]", &[0, 2], &[0, 2]),
        ];
        for (text, slurm, want) in cases {
            assert_eq!(map(text, slurm, &gpus).as_deref(), Ok(*want), "{text:?} {slurm:?}");
        }
    }

    #[test]
    fn the_log_line_says_how() {
        let gpus = FakeGpus::with_minors(&[1, 0]);
        let j = map_to_nvml(&order("Name=gpu File=/dev/nvidia[0-1]"), &[0], || Ok(&gpus as &dyn GpuOps)).unwrap();
        assert_eq!(j.how, "Slurm GPUs 0 are NVML GPUs 1 (minors from /etc/slurm/gres.conf)");
        let j = map_to_nvml(&order("AutoDetect=nvml"), &[3], || panic!("NVML order must not open NVML")).unwrap();
        assert_eq!((j.slurm, j.nvml), (vec![3], vec![3]));
        assert!(j.how.starts_with("Slurm's GPU indices are NVML's (/etc/slurm/gres.conf line 1: AutoDetect=nvml"), "{}", j.how);
    }

    #[test]
    fn unmappable_indices_are_named_precisely() {
        let mut gpus = FakeGpus::with_minors(&[0, 1]);
        let text = "Name=gpu File=/dev/nvidia0\nName=gpu File=/dev/nvidia1\nName=gpu File=/dev/nvidia5";
        assert_eq!(
            map(text, &[2], &gpus).unwrap_err(),
            "Slurm GPU index 2 is /dev/nvidia5 (/etc/slurm/gres.conf line 3) but no GPU with minor 5 is visible to NVML"
        );
        assert_eq!(
            map(text, &[0, 3], &gpus).unwrap_err(),
            "Slurm GPU index 3 is not in /etc/slurm/gres.conf: it lists 3 GPU device files for this node"
        );
        // A GPU whose minor cannot be read is named when it matters, not before.
        gpus.lost = vec![1];
        assert_eq!(map(text, &[0], &gpus), Ok(vec![0]));
        let err = map(text, &[1], &gpus).unwrap_err();
        assert!(err.starts_with("nvmlDeviceGetMinorNumber on GPU 1: the GPU is lost"), "the cause comes first: {err}");
        assert!(err.contains("so Slurm GPU index 1 (/dev/nvidia1, /etc/slurm/gres.conf line 2) matches no GPU NVML can read"), "{err}");
        let err = map_to_nvml(&order(text), &[0], || Err(GpuError::DriverNotLoaded { call: "nvmlInit_v2" })).unwrap_err().to_string();
        assert!(err.starts_with("NVML: nvmlInit_v2: the NVIDIA driver is not loaded"), "{err}");
    }

    /// Each way a mapping fails is its own kind, carrying what it names.
    #[test]
    fn each_unmappable_index_is_its_own_kind() {
        let mut gpus = FakeGpus::with_minors(&[0, 1]);
        let text = "Name=gpu File=/dev/nvidia0\nName=gpu File=/dev/nvidia1\nName=gpu File=/dev/nvidia5";
        assert!(matches!(map_typed(text, &[2], &gpus), Err(IndexError::NoMinor { index: 2, minor: 5, line: 3, .. })));
        assert!(matches!(map_typed(text, &[3], &gpus), Err(IndexError::NotListed { index: 3, count: 3, .. })));
        gpus.lost = vec![1];
        match map_typed(text, &[1], &gpus) {
            Err(IndexError::Unreadable { unreadable, index: 1, line: 2, .. }) => assert_eq!(unreadable.len(), 1, "{unreadable:?}"),
            other => panic!("want Unreadable, got {other:?}"),
        }
        let opened = map_to_nvml(&order(text), &[0], || Err(GpuError::DriverNotLoaded { call: "nvmlInit_v2" }));
        assert!(matches!(opened, Err(IndexError::Nvml(GpuError::DriverNotLoaded { .. }))), "{opened:?}");
    }

    #[test]
    fn an_unreadable_gres_conf_is_the_gres_kind_with_its_own_text() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = Config::default();
        cfg.slurm.gres_conf = dir.path().to_path_buf(); // a directory: read fails with EISDIR
        let env = JobEnv { job_id: 1, uid: 1000, gid: 1000, user: "u".into(), node: "n1".into(), slurm_gpus: vec![0], mode_value: None, restart_count: 0 };
        let err = resolve(&cfg, &env, || panic!("gres.conf comes first")).unwrap_err();
        assert!(matches!(err, IndexError::Gres(GresError::Read { .. })), "{err:?}");
        assert!(err.to_string().starts_with(&format!("cannot read {}: ", dir.path().display())), "{err}");
    }
}
