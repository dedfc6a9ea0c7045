//! A [`GpuOps`] double with NVIDIA's MIG rules for the baseline's unit
//! tests: it drives the simulated NVML's own model (`nvml_sim::model`, a
//! dev-dependency), so placements, pending modes, resets refused while the
//! GPU is held and IN_USE on destroy behave as in the simulated library
//! and as the sim's README documents.

use super::services::{record::failed, ProgramError};
use crate::gpu::*;
use nvml_sim::model::{ci_profile_slices, code, GpuModel, GpuState, NvmlCode};
use std::cell::{Cell, RefCell};
use std::time::Duration;

pub struct FakeMig {
    pub gpus: RefCell<Vec<GpuState>>,
    /// Fail the n-th create call (0-based) with INSUFFICIENT_RESOURCES.
    pub fail_create: Cell<Option<usize>>,
    creates: Cell<usize>,
    /// Every changing call, e.g. `create 0 9@4`, `destroy 0 1`, `mode 0 on`.
    pub calls: RefCell<Vec<String>>,
}

impl FakeMig {
    /// `count` GPUs of a model from sim/nvml/fixtures (e.g. "h100-80gb").
    pub fn new(model: &str, count: u32) -> FakeMig {
        let m = GpuModel::load(&nvml_sim::fixtures_dir().join(format!("{model}.toml"))).expect("model fixture");
        FakeMig {
            gpus: RefCell::new((0..count).map(|i| GpuState::new(m.clone(), i)).collect()),
            fail_create: Cell::new(None),
            creates: Cell::new(0),
            calls: RefCell::new(Vec::new()),
        }
    }

    /// MIG on (through NVML's rules: nothing holds the GPU yet).
    pub fn mig_on(self, gpu: usize) -> FakeMig {
        self.gpus.borrow_mut()[gpu].set_mig_mode(true).expect("MIG on");
        self
    }

    /// Creates instances directly (not recorded): (profile id, start).
    pub fn with_instances(self, gpu: usize, list: &[(u32, u32)]) -> FakeMig {
        for (id, start) in list {
            let mut g = self.gpus.borrow_mut();
            let gi = g[gpu].create_gpu_instance(*id, Some(*start)).expect("instance");
            let slices = g[gpu].gpu_instance(gi).expect("gi").slices;
            g[gpu].create_compute_instance(gi, ci_profile(slices)).expect("ci");
        }
        self
    }

    /// `nvidia-smi --gpu-reset` on the fake: by PCI bus id; a refusal is
    /// a failed run of nvidia-smi, as on a node.
    pub fn reset(&self, ids: &[String]) -> Result<(), ProgramError> {
        let mut gpus = self.gpus.borrow_mut();
        let said = |output: String| failed("nvidia-smi", &format!("--gpu-reset -i {}", ids.join(",")), &output);
        for id in ids {
            let g = gpus.iter_mut().find(|g| &g.pci_bus_id == id).ok_or_else(|| said(format!("no GPU {id}")))?;
            g.reset().map_err(|c| said(format!("reset of {id} refused (code {c})")))?;
        }
        Ok(())
    }

    /// Profile ids and starts of GPU `gpu`'s instances, by start.
    pub fn layout(&self, gpu: usize) -> Vec<(u32, u32)> {
        let mut l: Vec<(u32, u32)> = self.gpus.borrow()[gpu].instances.iter().map(|i| (i.profile_id, i.start)).collect();
        l.sort_by_key(|x| x.1);
        l
    }

    fn with<T>(&self, gpu: u32, call: &'static str, f: impl FnOnce(&mut GpuState) -> Result<T, NvmlCode>) -> Result<T, GpuError> {
        let mut gpus = self.gpus.borrow_mut();
        let g = gpus.get_mut(gpu as usize).ok_or(GpuError::Nvml { call, gpu: GpuLabel(Some(gpu)), kind: ErrorKind::InvalidArgument })?;
        f(g).map_err(|c| error(call, gpu, c))
    }
}

fn ci_profile(slices: u32) -> u32 {
    (0..8).find(|p| ci_profile_slices(*p) == Some(slices)).unwrap_or(0)
}

fn error(call: &'static str, gpu: u32, c: NvmlCode) -> GpuError {
    let kind = match c {
        code::IN_USE => ErrorKind::InUse,
        code::INSUFFICIENT_RESOURCES => ErrorKind::InsufficientResources,
        code::INVALID_ARGUMENT => ErrorKind::InvalidArgument,
        code::NOT_SUPPORTED => ErrorKind::NotSupported,
        other => ErrorKind::Other(format!("code {other}")),
    };
    GpuError::Nvml { call, gpu: GpuLabel(Some(gpu)), kind }
}

fn unmodelled<T>(call: &str) -> Result<T, GpuError> {
    Err(GpuError::Refused { gpu: GpuLabel(None), detail: format!("{call} is not modelled by FakeMig") })
}

fn instance(g: &GpuState, gi: u32) -> Option<MigInstance> {
    let i = g.instances.iter().find(|i| i.id == gi)?;
    Some(MigInstance {
        gpu_instance: i.id,
        profile_id: i.profile_id,
        placement_start: i.start,
        placement_size: i.size,
        compute_instances: i
            .compute_instances
            .iter()
            .map(|c| ComputeInstance { id: c.id, profile_id: c.profile_id, uuid: Some(g.mig_uuid(i.id, c.id)) })
            .collect(),
    })
}

impl GpuOps for FakeMig {
    fn driver(&self) -> Result<DriverVersions, GpuError> {
        unmodelled("driver")
    }
    fn count(&self) -> Result<u32, GpuError> {
        Ok(self.gpus.borrow().len() as u32)
    }
    fn inventory(&self, gpu: u32) -> Result<GpuInventory, GpuError> {
        self.with(gpu, "nvmlDeviceGetUUID", |g| {
            Ok(GpuInventory {
                index: gpu,
                uuid: g.uuid.clone(),
                pci_bus_id: g.pci_bus_id.clone(),
                pci_device_id: if g.model.name.contains("H200") { 0x2335_10de } else { 0x2330_10de },
                pci_subsystem_id: 0x16c1_10de,
                minor_number: g.minor,
                name: g.model.name.clone(),
                memory_total_mib: g.model.memory_total_mib,
                compute_capability: "9.0".into(),
            })
        })
    }
    fn minor_number(&self, gpu: u32) -> Result<u32, GpuError> {
        self.with(gpu, "nvmlDeviceGetMinorNumber", |g| Ok(g.minor))
    }
    fn modes(&self, gpu: u32) -> Result<GpuModes, GpuError> {
        self.with(gpu, "nvmlDeviceGetMigMode", |g| {
            let mig = g.model.mig_capable().then_some(MigModes { current: g.mig_current, pending: g.mig_pending });
            Ok(GpuModes { compute: ComputeMode::Default, persistence: g.persistence, mig })
        })
    }
    fn mig_profiles(&self, gpu: u32) -> Result<Vec<MigProfile>, GpuError> {
        self.with(gpu, "nvmlDeviceGetGpuInstanceProfileInfoV", |g| {
            Ok(g.model
                .mig_profiles
                .iter()
                .map(|p| MigProfile {
                    profile: p.profile,
                    id: p.id,
                    name: p.name.clone(),
                    slices: p.slices,
                    instance_count: p.instance_count,
                    memory_mb: p.memory_mb,
                    sms: p.sms,
                    copy_engines: p.copy_engines,
                    placement_starts: p.placement_starts.clone(),
                    placement_size: p.placement_size,
                })
                .collect())
        })
    }
    fn mig_instances(&self, gpu: u32) -> Result<Vec<MigInstance>, GpuError> {
        self.with(gpu, "nvmlDeviceGetGpuInstances", |g| {
            let ids: Vec<u32> = if g.mig_current { g.instances.iter().map(|i| i.id).collect() } else { vec![] };
            Ok(ids.iter().filter_map(|id| instance(g, *id)).collect())
        })
    }
    fn health(&self, _gpu: u32) -> Result<HealthReadings, GpuError> {
        unmodelled("health")
    }
    fn processes(&self, gpu: u32) -> Result<Vec<GpuProcess>, GpuError> {
        self.with(gpu, "nvmlDeviceGetComputeRunningProcesses_v3", |g| {
            Ok(g.processes
                .iter()
                .map(|p| GpuProcess { pid: p.pid, used_memory_mib: Some(p.used_mib), gpu_instance: p.gpu_instance, compute_instance: p.compute_instance })
                .collect())
        })
    }
    fn wait_xid_events(&self, _window: Duration) -> Result<Vec<XidEvent>, GpuError> {
        unmodelled("wait_xid_events")
    }
    fn set_compute_mode(&self, _gpu: u32, _mode: ComputeMode) -> Result<(), GpuError> {
        unmodelled("set_compute_mode")
    }
    fn set_mig_mode(&self, gpu: u32, enable: bool) -> Result<MigModeChange, GpuError> {
        self.calls.borrow_mut().push(format!("mode {gpu} {}", if enable { "on" } else { "off" }));
        let activation = self.with(gpu, "nvmlDeviceSetMigMode", |g| g.set_mig_mode(enable))?;
        Ok(match activation {
            code::SUCCESS => MigModeChange::Applied,
            c => MigModeChange::Pending { reason: error("activation", gpu, c).to_string() },
        })
    }
    fn create_mig_instance(&self, gpu: u32, profile_id: u32, placement: Option<u32>) -> Result<MigInstance, GpuError> {
        self.calls.borrow_mut().push(format!("create {gpu} {profile_id}@{}", placement.map_or("-".into(), |p| p.to_string())));
        let n = self.creates.get();
        self.creates.set(n + 1);
        if self.fail_create.get() == Some(n) {
            return Err(error("nvmlDeviceCreateGpuInstanceWithPlacement", gpu, code::INSUFFICIENT_RESOURCES));
        }
        self.with(gpu, "nvmlDeviceCreateGpuInstanceWithPlacement", |g| {
            let gi = g.create_gpu_instance(profile_id, placement)?;
            let slices = g.gpu_instance(gi)?.slices;
            g.create_compute_instance(gi, ci_profile(slices))?;
            instance(g, gi).ok_or(code::UNKNOWN)
        })
    }
    fn destroy_mig_instance(&self, gpu: u32, gpu_instance: u32) -> Result<(), GpuError> {
        self.calls.borrow_mut().push(format!("destroy {gpu} {gpu_instance}"));
        self.with(gpu, "nvmlGpuInstanceDestroy", |g| {
            let cis: Vec<u32> = g.gpu_instance(gpu_instance)?.compute_instances.iter().map(|c| c.id).collect();
            for ci in cis {
                g.destroy_compute_instance(gpu_instance, ci)?;
            }
            g.destroy_gpu_instance(gpu_instance)
        })
    }
}
