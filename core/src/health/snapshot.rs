//! Everything the checks read, taken once per run: NVML (each GPU's
//! inventory, modes, health readings, MIG instances), processes, live jobs,
//! new kernel-log XIDs and the cursor kept between runs.

use super::cursor::Cursor;
use super::kmsg;
use super::config::HealthConfig;
use crate::gpu::{DriverVersions, GpuError, GpuInventory, GpuModes, GpuOps, HealthReadings, MigInstance, MigProfile};
use crate::mig_baseline::Baseline;
use crate::procfs::ProcInfo;
use crate::state::JobState;
use std::path::{Path, PathBuf};

/// One GPU as read at the start of the run.
#[derive(Debug, Clone, Default)]
pub struct GpuSnap {
    pub index: u32,
    pub inventory: Option<GpuInventory>,
    pub modes: Option<GpuModes>,
    pub health: Option<HealthReadings>,
    /// Only read while MIG is on.
    pub mig_instances: Vec<MigInstance>,
    pub mig_profiles: Vec<MigProfile>,
    /// Why the GPU could not be read completely (lost, needs reset, ...).
    pub error: Option<ReadError>,
}

/// A GPU read failure, kept with its kind so checks can name the fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadError {
    Lost(String),
    ResetRequired(String),
    Other(String),
}

impl From<&GpuError> for ReadError {
    fn from(e: &GpuError) -> Self {
        match e {
            GpuError::GpuLost { .. } => ReadError::Lost(e.to_string()),
            GpuError::ResetRequired { .. } => ReadError::ResetRequired(e.to_string()),
            _ => ReadError::Other(e.to_string()),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct NvmlSnap {
    pub driver: Option<DriverVersions>,
    pub gpus: Vec<GpuSnap>,
}

/// The inputs of every check.
pub struct Ctx<'a> {
    pub config: &'a HealthConfig,
    pub runtime_dir: PathBuf,
    /// NVML, or why it could not be initialized.
    pub nvml: Result<NvmlSnap, String>,
    pub processes: Vec<ProcInfo>,
    /// The node's MPS binaries ([`crate::mps::orphans::mps_binaries`]).
    pub mps_binaries: Vec<PathBuf>,
    /// Jobs whose state file exists: they hold their GPUs.
    pub live_jobs: Vec<JobState>,
    /// XIDs (new and remembered) and ECC baselines, updated for this run.
    pub cursor: Cursor,
    /// Why the kernel log could not be read, if it could not.
    pub kmsg_error: Option<String>,
    /// Why the cursor file could not be read (it was started afresh).
    pub cursor_error: Option<String>,
    /// The node's MIG baseline (`None`: none configured), or why it could
    /// not be read. The same definition `gpu-mode-mig` applies.
    pub mig_baseline: Result<Option<Baseline>, String>,
}

impl Ctx<'_> {
    /// Whether a live job lists `gpu`.
    pub fn job_holds(&self, gpu: u32) -> bool {
        self.live_jobs.iter().any(|j| j.gpus.contains(&gpu))
    }

    pub fn gpus(&self) -> &[GpuSnap] {
        self.nvml.as_ref().map(|n| n.gpus.as_slice()).unwrap_or(&[])
    }
}

/// Reads one GPU; a failure stops at the first fatal error and is kept.
pub fn read_gpu(ops: &dyn GpuOps, gpu: u32) -> GpuSnap {
    let mut s = GpuSnap { index: gpu, ..GpuSnap::default() };
    let result = (|| -> Result<(), GpuError> {
        s.inventory = Some(ops.inventory(gpu)?);
        let modes = ops.modes(gpu)?;
        s.modes = Some(modes);
        s.health = Some(ops.health(gpu)?);
        if modes.mig.is_some_and(|m| m.current) {
            s.mig_instances = ops.mig_instances(gpu)?;
            s.mig_profiles = ops.mig_profiles(gpu)?;
        }
        Ok(())
    })();
    s.error = result.err().as_ref().map(ReadError::from);
    s
}

/// Reads NVML: the driver, then every GPU.
pub fn read_nvml(ops: &dyn GpuOps) -> Result<NvmlSnap, String> {
    let count = ops.count().map_err(|e| e.to_string())?;
    let driver = ops.driver().ok();
    Ok(NvmlSnap { driver, gpus: (0..count).map(|g| read_gpu(ops, g)).collect() })
}

/// Live job states; unreadable ones are skipped (the prolog owns them).
pub fn live_jobs(runtime_dir: &Path) -> Vec<JobState> {
    let Ok(entries) = std::fs::read_dir(crate::state::jobs_dir(runtime_dir)) else { return Vec::new() };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.strip_suffix(".json")?.parse::<u32>().ok())
        .filter_map(|id| JobState::load(runtime_dir, id).ok())
        .collect()
}

/// Where a snapshot reads from, besides NVML: the checker's section of the
/// config, the two node paths it needs, and the node's MIG baseline (read
/// by the caller from the site config: health never sees the whole config).
pub struct Sources<'a> {
    pub health: &'a HealthConfig,
    pub runtime_dir: &'a Path,
    /// nvidia-cuda-mps-control (the MPS binaries are it and its sibling).
    pub mps_control: &'a Path,
    pub mig_baseline: Result<Option<Baseline>, String>,
}

/// Takes the snapshot: `nvml` is what opening NVML gave.
pub fn take<'a>(src: &Sources<'a>, nvml: Result<&dyn GpuOps, String>) -> Ctx<'a> {
    let h = src.health;
    let nvml = nvml.and_then(read_nvml);
    let state_dir = h.state_dir(src.runtime_dir);
    let (mut cursor, cursor_error) = match Cursor::load(&state_dir) {
        Ok(c) => (c, None),
        Err(e) => (Cursor::default(), Some(e)),
    };
    let boot = kmsg::boot_id();
    let kmsg_error = match kmsg::read_records(&h.kmsg_path) {
        Ok(records) => {
            let buses: Vec<(u32, String)> = nvml_buses(&nvml);
            cursor.absorb(&boot, &records, &buses, h);
            None
        }
        Err(e) => {
            cursor.start_boot(&boot);
            Some(e)
        }
    };
    if let Ok(n) = &nvml {
        for g in &n.gpus {
            if let (Some(inv), Some(v)) = (&g.inventory, g.health.as_ref().and_then(|h| h.ecc_uncorrected_volatile)) {
                cursor.observe_ecc(&inv.uuid, v);
            }
        }
    }
    Ctx {
        config: h,
        runtime_dir: src.runtime_dir.to_path_buf(),
        nvml,
        processes: crate::procfs::all(),
        live_jobs: live_jobs(src.runtime_dir),
        mps_binaries: crate::mps::orphans::mps_binaries(src.mps_control),
        cursor,
        kmsg_error,
        cursor_error,
        mig_baseline: src.mig_baseline.clone(),
    }
}

fn nvml_buses(nvml: &Result<NvmlSnap, String>) -> Vec<(u32, String)> {
    let Ok(n) = nvml else { return Vec::new() };
    n.gpus.iter().filter_map(|g| Some((g.index, g.inventory.as_ref()?.pci_bus_id.clone()))).collect()
}
