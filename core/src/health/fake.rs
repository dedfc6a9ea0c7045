//! Test inputs: a healthy simulated H200 and a [`Fixture`] that builds a
//! [`Ctx`] from parts, so each check's table can change one thing at a time.

use super::cursor::Cursor;
use super::snapshot::{Ctx, GpuSnap, NvmlSnap};
use super::config::HealthConfig;
use crate::gpu::{ComputeMode, DriverVersions, GpuInventory, GpuModes, HealthReadings, Pcie};
use crate::procfs::ProcInfo;
use crate::state::JobState;
use std::path::PathBuf;

/// A GPU with nothing wrong: idle clocks, persistence on, full PCIe link.
pub fn healthy_gpu(index: u32) -> GpuSnap {
    GpuSnap {
        index,
        inventory: Some(GpuInventory {
            index,
            uuid: format!("GPU-{index}"),
            pci_bus_id: format!("00000000:{:02X}:00.0", 0x10 + index),
            pci_device_id: 0x2335_10de,
            pci_subsystem_id: 0x16c1_10de,
            minor_number: index,
            name: "NVIDIA H200".into(),
            memory_total_mib: 143771,
            compute_capability: "9.0".into(),
        }),
        modes: Some(GpuModes { compute: ComputeMode::Default, persistence: true, mig: None }),
        health: Some(HealthReadings {
            ecc_uncorrected_volatile: Some(0),
            ecc_uncorrected_aggregate: Some(0),
            retired_pages_dbe: Some(0),
            retired_pages_sbe: Some(0),
            retired_pages_pending: Some(false),
            clocks_event_reasons: Some(0x1),
            temperature_c: Some(31),
            slowdown_temp_c: Some(89),
            shutdown_temp_c: Some(95),
            pcie: Some(Pcie { current_gen: 5, max_gen: 5, current_width: 16, max_width: 16, replay_counter: 0 }),
            fabric_state: Some("completed".into()),
            ..HealthReadings::default()
        }),
        ..GpuSnap::default()
    }
}

pub fn process(pid: i32, ppid: i32, comm: &str) -> ProcInfo {
    ProcInfo { pid, ppid, uid: 0, comm: comm.into(), state: 'S', start_time: 1 }
}

pub fn job(id: u32, gpus: &[u32], mode: &str) -> JobState {
    JobState {
        version: crate::state::STATE_VERSION,
        status: crate::state::JobStatus::Ready,
        job_id: id,
        uid: 1000,
        gid: 1000,
        user: "alice".into(),
        node: "n1".into(),
        mode: mode.into(),
        gpus: gpus.to_vec(),
        task_env: Default::default(),
        refusal: None,
        created_unix: 0,
        per_task_env: Default::default(),
        grant: crate::modes::GrantRecord::None,
    }
}

/// The parts of a [`Ctx`]; `ctx()` borrows them.
pub struct Fixture {
    pub config: HealthConfig,
    pub runtime_dir: PathBuf,
    pub nvml_error: Option<String>,
    pub gpus: Vec<GpuSnap>,
    pub processes: Vec<ProcInfo>,
    pub jobs: Vec<JobState>,
    pub cursor: Cursor,
    pub mig_baseline: Result<Option<crate::mig_baseline::Baseline>, String>,
}

impl Fixture {
    /// Healthy GPUs; a running nvidia-persistenced; no jobs.
    pub fn new(gpus: Vec<GpuSnap>) -> Fixture {
        Fixture {
            config: HealthConfig::default(),
            runtime_dir: PathBuf::from("/nonexistent/runtime"),
            nvml_error: None,
            gpus,
            processes: vec![process(1, 0, "systemd"), process(900, 1, "nvidia-persiste")],
            jobs: Vec::new(),
            cursor: Cursor::default(),
            mig_baseline: Ok(None),
        }
    }

    pub fn ctx(&self) -> Ctx<'_> {
        let nvml = match &self.nvml_error {
            Some(e) => Err(e.clone()),
            None => Ok(NvmlSnap {
                driver: Some(DriverVersions { driver: "580.159.04".into(), nvml: "13".into(), cuda: "13.0".into() }),
                gpus: self.gpus.clone(),
            }),
        };
        Ctx {
            config: &self.config,
            runtime_dir: self.runtime_dir.clone(),
            nvml,
            processes: self.processes.clone(),
            live_jobs: self.jobs.clone(),
            mps_binaries: Vec::new(),
            cursor: self.cursor.clone(),
            kmsg_error: None,
            cursor_error: None,
            mig_baseline: self.mig_baseline.clone(),
            netlocks: None,
            readiness: None,
        }
    }
}
