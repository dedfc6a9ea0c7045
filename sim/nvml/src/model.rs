//! The simulated node: fixtures (static facts per GPU model), the mutable
//! state every process shares, and the rules NVML enforces on it (MIG
//! placement, pending mode changes, resets refused while the GPU is held).
//!
//! Everything here is plain Rust with no FFI, so the rules are unit-tested
//! directly; `api.rs` only translates C calls into these methods.

use serde::{Deserialize, Serialize};
use std::path::Path;

/// NVML return codes used by the simulation (values from nvml.h).
pub mod code {
    pub use nvml_wrapper_sys::bindings::{
        nvmlReturn_enum_NVML_ERROR_ALREADY_INITIALIZED as ALREADY_INITIALIZED,
        nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED as DRIVER_NOT_LOADED,
        nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST as GPU_IS_LOST,
        nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES as INSUFFICIENT_RESOURCES,
        nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE as INSUFFICIENT_SIZE,
        nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT as INVALID_ARGUMENT,
        nvmlReturn_enum_NVML_ERROR_IN_USE as IN_USE, nvmlReturn_enum_NVML_ERROR_NOT_FOUND as NOT_FOUND,
        nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED as NOT_SUPPORTED,
        nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED as RESET_REQUIRED,
        nvmlReturn_enum_NVML_ERROR_TIMEOUT as TIMEOUT,
        nvmlReturn_enum_NVML_ERROR_UNINITIALIZED as UNINITIALIZED,
        nvmlReturn_enum_NVML_ERROR_UNKNOWN as UNKNOWN, nvmlReturn_enum_NVML_SUCCESS as SUCCESS,
    };
}

/// An NVML return code other than success.
pub type NvmlCode = u32;

/// Memory slices of a MIG-capable GPU; placements are counted in these.
pub const MEMORY_SLICES: u32 = 8;
/// Compute slices of a MIG-capable GPU.
pub const COMPUTE_SLICES: u32 = 7;

/// Static facts of one GPU model, read from a model fixture
/// (`fixtures/h100-80gb.toml` ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuModel {
    pub name: String,
    /// Total framebuffer memory as NVML reports it, MiB.
    pub memory_total_mib: u64,
    /// Memory the driver reserves (MemoryInfo_v2 `reserved`), MiB.
    pub memory_reserved_mib: u64,
    pub compute_capability: [i32; 2],
    pub pcie_max_gen: u32,
    pub pcie_max_width: u32,
    pub temperature_c: u32,
    pub slowdown_temp_c: u32,
    pub shutdown_temp_c: u32,
    pub power_usage_mw: u32,
    pub power_limit_mw: u32,
    /// Page retirement (pre-Ampere style ECC handling). Hopper reports
    /// NOT_SUPPORTED for it (seen on a real H200) and uses row remapping.
    #[serde(default)]
    pub page_retirement: bool,
    /// NVML_GPU_FABRIC_STATE_*; `None`: the fabric query is not supported.
    #[serde(default)]
    pub fabric_state: Option<u8>,
    /// Empty for GPUs without MIG.
    #[serde(default)]
    pub mig_profiles: Vec<MigProfile>,
}

/// One GPU-instance profile as NVML's profile info reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigProfile {
    /// The NVML_GPU_INSTANCE_PROFILE_* enum used to query the profile.
    pub profile: u32,
    /// The id that create/list take (not the enum).
    pub id: u32,
    pub name: String,
    pub slices: u32,
    pub instance_count: u32,
    pub memory_mb: u64,
    pub sms: u32,
    pub copy_engines: u32,
    /// Memory-slice offsets where an instance may start.
    pub placement_starts: Vec<u32>,
    /// Memory slices an instance occupies.
    pub placement_size: u32,
}

/// A node fixture: driver facts and the GPUs, by model file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeFixture {
    pub driver_version: String,
    pub nvml_version: String,
    /// CUDA driver version as NVML encodes it (13000 = 13.0).
    pub cuda_driver_version: i32,
    pub gpus: Vec<GpuGroup>,
    #[serde(default)]
    pub faults: Vec<FixtureFault>,
}

/// `count` GPUs of the model in file `model` (relative to the fixture).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuGroup {
    pub model: String,
    #[serde(default = "one")]
    pub count: u32,
    /// The group's device minor numbers (/dev/nvidia<minor>), in NVML
    /// order; unset: each GPU's NVML index. Real nodes can differ, e.g.
    /// when the driver numbers devices in another order than PCI.
    #[serde(default)]
    pub minors: Option<Vec<u32>>,
}

fn one() -> u32 {
    1
}

/// A fault present from the start, as written in a node fixture.
// No deny_unknown_fields here: serde does not support it with `flatten`.
#[derive(Debug, Clone, Deserialize)]
pub struct FixtureFault {
    pub gpu: u32,
    #[serde(flatten)]
    pub fault: Fault,
}

/// Faults that fixtures and `nvml-sim-ctl inject` can put on a GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "fault", rename_all = "kebab-case")]
pub enum Fault {
    /// An XID event delivered through event sets (48, 79, 94 ...).
    Xid { xid: u64 },
    /// Uncorrectable (double-bit) ECC errors, volatile and aggregate.
    Ecc { count: u64 },
    /// Pages retired for double-bit errors; `pending` retirement until reset.
    RetiredPages { count: u32, pending: bool },
    /// An uncorrectable row remap waiting for a reset.
    RemapPending,
    /// Row remapping failed: the GPU needs replacing.
    RemapFailed,
    /// The GPU fell off the bus: every call on it returns GPU_IS_LOST.
    Lost,
    /// The GPU needs a reset: calls on it return RESET_REQUIRED.
    NeedsReset,
    PersistenceOff,
    /// The PCIe link trained at a lower width (x8 unless given).
    PcieWidth { width: u32 },
    /// Temperature over the slowdown threshold, thermal clock event reasons.
    Thermal,
    /// Another client (DCGM, nvidia_drm ...) holds the GPU: MIG changes and
    /// resets are refused.
    MigInUse,
    /// The next GPU-instance creation after `after` more succeed fails with
    /// NVML_ERROR_UNKNOWN (a driver failing half-way through a layout).
    MigCreateFails { after: u32 },
}

/// A process on a GPU, as running-compute-processes reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimProcess {
    pub pid: u32,
    pub used_mib: u64,
    /// MIG instance the process runs in, when MIG is on.
    pub gpu_instance: Option<u32>,
    pub compute_instance: Option<u32>,
    /// A real process's pid: the driver forgets it once the process is gone
    /// (made-up pids of fixtures stay until cleared).
    #[serde(default)]
    pub live: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComputeInstance {
    pub id: u32,
    pub profile_id: u32,
    pub slices: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuInstance {
    pub id: u32,
    pub profile_id: u32,
    pub start: u32,
    pub size: u32,
    pub slices: u32,
    pub compute_instances: Vec<ComputeInstance>,
}

/// Fault counters and flags of one GPU.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Health {
    pub lost: bool,
    pub needs_reset: bool,
    pub ecc_volatile: u64,
    pub ecc_aggregate: u64,
    pub retired_pages: u32,
    pub retired_pending: bool,
    pub remapped_correctable: u32,
    pub remapped_uncorrectable: u32,
    pub remap_pending: bool,
    pub remap_failed: bool,
    pub thermal: bool,
    pub pcie_width: Option<u32>,
    pub pcie_replays: u32,
    pub held_by_client: bool,
    /// GPU-instance creations that still succeed before one fails.
    #[serde(default)]
    pub mig_creates_left: Option<u32>,
}

/// One GPU's mutable state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuState {
    pub model: GpuModel,
    pub uuid: String,
    pub pci_bus_id: String,
    pub minor: u32,
    /// NVML_COMPUTEMODE_* value.
    pub compute_mode: u32,
    pub persistence: bool,
    pub mig_current: bool,
    pub mig_pending: bool,
    pub instances: Vec<GpuInstance>,
    pub processes: Vec<SimProcess>,
    pub health: Health,
}

/// An XID event for event sets. Like NVML, an event set sees only events
/// raised after it was created, except `recurring` ones (from fixtures),
/// which every new event set receives once: a fault that keeps firing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct XidEvent {
    pub seq: u64,
    pub gpu: u32,
    pub xid: u64,
    #[serde(default)]
    pub recurring: bool,
}

/// The whole node, as stored in the shared state file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeState {
    pub driver_version: String,
    pub nvml_version: String,
    pub cuda_driver_version: i32,
    pub gpus: Vec<GpuState>,
    pub events: Vec<XidEvent>,
    pub next_event_seq: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum FixtureError {
    #[error("cannot read fixture {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("fixture {path}: {detail}")]
    Invalid { path: String, detail: String },
}

/// Typical PCI bus numbers of an 8-GPU HGX board, so bus ids look real.
const BUS_NUMBERS: [u32; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];

impl GpuModel {
    pub fn load(path: &Path) -> Result<GpuModel, FixtureError> {
        let text = read(path)?;
        toml::from_str(&text).map_err(|e| invalid(path, e))
    }

    pub fn profile_by_enum(&self, profile: u32) -> Option<&MigProfile> {
        self.mig_profiles.iter().find(|p| p.profile == profile)
    }

    pub fn profile_by_id(&self, id: u32) -> Option<&MigProfile> {
        self.mig_profiles.iter().find(|p| p.id == id)
    }

    pub fn mig_capable(&self) -> bool {
        !self.mig_profiles.is_empty()
    }
}

fn read(path: &Path) -> Result<String, FixtureError> {
    std::fs::read_to_string(path).map_err(|source| FixtureError::Read { path: path.display().to_string(), source })
}

fn invalid(path: &Path, e: impl std::fmt::Display) -> FixtureError {
    FixtureError::Invalid { path: path.display().to_string(), detail: e.to_string().trim().replace('\n', " ") }
}

impl NodeState {
    /// Builds the initial state from a node fixture and the model files it names.
    pub fn from_fixture(path: &Path) -> Result<NodeState, FixtureError> {
        let fixture: NodeFixture = toml::from_str(&read(path)?).map_err(|e| invalid(path, e))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut gpus = Vec::new();
        for group in &fixture.gpus {
            let model = GpuModel::load(&dir.join(&group.model))?;
            let minors = group.minors.clone().unwrap_or_else(|| (0..group.count).map(|i| gpus.len() as u32 + i).collect());
            if minors.len() != group.count as usize {
                return Err(invalid(path, format!("{} minors for {} GPUs of {}", minors.len(), group.count, group.model)));
            }
            for minor in minors {
                let index = gpus.len() as u32;
                gpus.push(GpuState { minor, ..GpuState::new(model.clone(), index) });
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        if let Some(g) = gpus.iter().find(|g| !seen.insert(g.minor)) {
            return Err(invalid(path, format!("minor {} is given to two GPUs", g.minor)));
        }
        let mut state = NodeState {
            driver_version: fixture.driver_version,
            nvml_version: fixture.nvml_version,
            cuda_driver_version: fixture.cuda_driver_version,
            gpus,
            events: Vec::new(),
            next_event_seq: 1,
        };
        for f in fixture.faults {
            state.inject(f.gpu, &f.fault).map_err(|c| invalid(path, format!("fault on GPU {}: code {c}", f.gpu)))?;
        }
        state.events.iter_mut().for_each(|e| e.recurring = true);
        Ok(state)
    }

    pub fn gpu(&self, index: u32) -> Result<&GpuState, NvmlCode> {
        self.gpus.get(index as usize).ok_or(code::INVALID_ARGUMENT)
    }

    pub fn gpu_mut(&mut self, index: u32) -> Result<&mut GpuState, NvmlCode> {
        self.gpus.get_mut(index as usize).ok_or(code::INVALID_ARGUMENT)
    }

    /// Applies a fault to GPU `index`.
    pub fn inject(&mut self, index: u32, fault: &Fault) -> Result<(), NvmlCode> {
        if let Fault::Xid { xid } = fault {
            self.gpu(index)?;
            let seq = self.next_event_seq;
            self.next_event_seq += 1;
            self.events.push(XidEvent { seq, gpu: index, xid: *xid, recurring: false });
            return Ok(());
        }
        self.gpu_mut(index)?.inject(fault);
        Ok(())
    }

    /// A node reboot: processes and clients are gone, a pending MIG mode
    /// becomes current, and MIG instances are lost (the mode is kept:
    /// NVIDIA keeps it in the GPU; layouts live in the driver).
    pub fn reboot(&mut self) {
        for g in &mut self.gpus {
            g.processes.clear();
            g.health.held_by_client = false;
            let _ = g.reset();
        }
    }

    /// Removes every fault of GPU `index` (or all GPUs), like a repaired node.
    pub fn clear(&mut self, index: Option<u32>) -> Result<(), NvmlCode> {
        match index {
            Some(i) => self.gpu_mut(i)?.clear_faults(),
            None => self.gpus.iter_mut().for_each(GpuState::clear_faults),
        }
        self.events.retain(|e| index.is_some_and(|i| e.gpu != i));
        Ok(())
    }
}

impl GpuState {
    pub fn new(model: GpuModel, index: u32) -> GpuState {
        let seed = model.name.bytes().fold(0x811c_9dc5u32, |h, b| (h ^ b as u32).wrapping_mul(0x0100_0193));
        GpuState {
            uuid: format!("GPU-{seed:08x}-{index:04x}-4000-8000-{:012x}", 0x5100_0000u64 + index as u64),
            pci_bus_id: format!("00000000:{:02X}:00.0", BUS_NUMBERS[index as usize % BUS_NUMBERS.len()]),
            minor: index,
            compute_mode: 0,
            persistence: true,
            mig_current: false,
            mig_pending: false,
            instances: Vec::new(),
            processes: Vec::new(),
            health: Health::default(),
            model,
        }
    }

    fn inject(&mut self, fault: &Fault) {
        let h = &mut self.health;
        match *fault {
            Fault::Xid { .. } => {}
            Fault::Ecc { count } => {
                h.ecc_volatile += count;
                h.ecc_aggregate += count;
            }
            Fault::RetiredPages { count, pending } => {
                h.retired_pages += count;
                h.retired_pending |= pending;
            }
            Fault::RemapPending => {
                h.remapped_uncorrectable += 1;
                h.remap_pending = true;
            }
            Fault::RemapFailed => h.remap_failed = true,
            Fault::Lost => h.lost = true,
            Fault::NeedsReset => h.needs_reset = true,
            Fault::PersistenceOff => self.persistence = false,
            Fault::PcieWidth { width } => {
                h.pcie_width = Some(width);
                h.pcie_replays += 100;
            }
            Fault::Thermal => h.thermal = true,
            Fault::MigInUse => h.held_by_client = true,
            Fault::MigCreateFails { after } => h.mig_creates_left = Some(after),
        }
    }

    fn clear_faults(&mut self) {
        self.health = Health::default();
        self.persistence = true;
    }

    /// The error every call on this GPU returns, if it is lost or needs a reset.
    pub fn access_error(&self) -> Option<NvmlCode> {
        if self.health.lost {
            Some(code::GPU_IS_LOST)
        } else if self.health.needs_reset {
            Some(code::RESET_REQUIRED)
        } else {
            None
        }
    }

    /// Something holds the GPU: a process or another client.
    pub fn is_held(&self) -> bool {
        !self.processes.is_empty() || self.health.held_by_client
    }

    /// nvmlDeviceSetMigMode: the new mode is pending; the driver then tries a
    /// reset to apply it, which is refused (activation IN_USE) while the GPU
    /// is held. Disabling while GPU instances exist is refused outright.
    pub fn set_mig_mode(&mut self, enable: bool) -> Result<NvmlCode, NvmlCode> {
        if !self.model.mig_capable() {
            return Err(code::NOT_SUPPORTED);
        }
        if !enable && !self.instances.is_empty() {
            return Err(code::IN_USE);
        }
        self.mig_pending = enable;
        Ok(self.reset().err().unwrap_or(code::SUCCESS))
    }

    /// A GPU reset (`nvidia-smi -r`): refused while the GPU is held; applies a
    /// pending MIG mode, clears volatile counters and pending remaps and
    /// retirements, and destroys MIG instances (layouts do not survive it).
    pub fn reset(&mut self) -> Result<(), NvmlCode> {
        if self.is_held() {
            return Err(code::IN_USE);
        }
        self.mig_current = self.mig_pending;
        self.instances.clear();
        let h = &mut self.health;
        h.ecc_volatile = 0;
        h.needs_reset = false;
        h.retired_pending = false;
        if h.remap_pending {
            h.remap_pending = false;
            h.remapped_uncorrectable = h.remapped_uncorrectable.saturating_sub(1);
        }
        Ok(())
    }

    /// nvmlDeviceSetComputeMode. EXCLUSIVE_THREAD (1) was removed by NVIDIA.
    pub fn set_compute_mode(&mut self, mode: u32) -> Result<(), NvmlCode> {
        match mode {
            0 | 2 | 3 => {
                self.compute_mode = mode;
                Ok(())
            }
            1 => Err(code::NOT_SUPPORTED),
            _ => Err(code::INVALID_ARGUMENT),
        }
    }

    fn require_mig(&self) -> Result<(), NvmlCode> {
        if self.mig_current {
            Ok(())
        } else {
            Err(code::NOT_SUPPORTED)
        }
    }

    fn profile(&self, id: u32) -> Result<&MigProfile, NvmlCode> {
        self.model.profile_by_id(id).ok_or(code::INVALID_ARGUMENT)
    }

    fn occupied(&self) -> u32 {
        self.instances.iter().fold(0, |m, gi| m | slice_mask(gi.start, gi.size))
    }

    fn compute_slices_used(&self) -> u32 {
        self.instances.iter().map(|gi| gi.slices).sum()
    }

    /// Placements still free for profile `id`, as
    /// nvmlDeviceGetGpuInstancePossiblePlacements_v2 lists them: (start, size).
    pub fn free_placements(&self, id: u32) -> Result<Vec<(u32, u32)>, NvmlCode> {
        let p = self.profile(id)?;
        let full = self.instances.iter().filter(|gi| gi.profile_id == id).count() as u32 >= p.instance_count
            || self.compute_slices_used() + p.slices > COMPUTE_SLICES;
        if full {
            return Ok(Vec::new());
        }
        let occupied = self.occupied();
        Ok(p.placement_starts
            .iter()
            .filter(|&&s| occupied & slice_mask(s, p.placement_size) == 0)
            .map(|&s| (s, p.placement_size))
            .collect())
    }

    /// nvmlDeviceCreateGpuInstance(WithPlacement): `placement` None takes the
    /// first free one. A placement the profile never allows is INVALID_ARGUMENT;
    /// an allowed but taken one, or a full GPU, is INSUFFICIENT_RESOURCES.
    pub fn create_gpu_instance(&mut self, id: u32, placement: Option<u32>) -> Result<u32, NvmlCode> {
        self.require_mig()?;
        match self.health.mig_creates_left {
            Some(0) => {
                self.health.mig_creates_left = None;
                return Err(code::UNKNOWN);
            }
            Some(n) => self.health.mig_creates_left = Some(n - 1),
            None => {}
        }
        let p = self.profile(id)?.clone();
        if let Some(start) = placement {
            if !p.placement_starts.contains(&start) {
                return Err(code::INVALID_ARGUMENT);
            }
        }
        let free = self.free_placements(id)?;
        let start = match placement {
            Some(s) => free.iter().find(|f| f.0 == s).map(|f| f.0),
            None => free.first().map(|f| f.0),
        }
        .ok_or(code::INSUFFICIENT_RESOURCES)?;
        let gi_id = (1..).find(|n| self.instances.iter().all(|gi| gi.id != *n)).unwrap_or(1);
        self.instances.push(GpuInstance {
            id: gi_id,
            profile_id: id,
            start,
            size: p.placement_size,
            slices: p.slices,
            compute_instances: Vec::new(),
        });
        Ok(gi_id)
    }

    pub fn gpu_instance(&self, gi: u32) -> Result<&GpuInstance, NvmlCode> {
        self.instances.iter().find(|g| g.id == gi).ok_or(code::INVALID_ARGUMENT)
    }

    fn gpu_instance_mut(&mut self, gi: u32) -> Result<&mut GpuInstance, NvmlCode> {
        self.instances.iter_mut().find(|g| g.id == gi).ok_or(code::INVALID_ARGUMENT)
    }

    /// nvmlGpuInstanceDestroy: refused while compute instances exist in it.
    pub fn destroy_gpu_instance(&mut self, gi: u32) -> Result<(), NvmlCode> {
        if !self.gpu_instance(gi)?.compute_instances.is_empty() {
            return Err(code::IN_USE);
        }
        self.instances.retain(|g| g.id != gi);
        Ok(())
    }

    /// nvmlGpuInstanceCreateComputeInstance with a compute-instance profile id
    /// (CI profile ids equal their NVML_COMPUTE_INSTANCE_PROFILE_* enum).
    pub fn create_compute_instance(&mut self, gi: u32, ci_profile: u32) -> Result<u32, NvmlCode> {
        let slices = ci_profile_slices(ci_profile).ok_or(code::INVALID_ARGUMENT)?;
        let g = self.gpu_instance_mut(gi)?;
        if slices > g.slices {
            return Err(code::INVALID_ARGUMENT);
        }
        let used: u32 = g.compute_instances.iter().map(|c| c.slices).sum();
        if used + slices > g.slices {
            return Err(code::INSUFFICIENT_RESOURCES);
        }
        let id = (0..).find(|n| g.compute_instances.iter().all(|c| c.id != *n)).unwrap_or(0);
        g.compute_instances.push(ComputeInstance { id, profile_id: ci_profile, slices });
        Ok(id)
    }

    /// nvmlComputeInstanceDestroy: refused while a process runs in it.
    pub fn destroy_compute_instance(&mut self, gi: u32, ci: u32) -> Result<(), NvmlCode> {
        let busy = self.processes.iter().any(|p| p.gpu_instance == Some(gi) && p.compute_instance == Some(ci));
        let g = self.gpu_instance_mut(gi)?;
        if !g.compute_instances.iter().any(|c| c.id == ci) {
            return Err(code::INVALID_ARGUMENT);
        }
        if busy {
            return Err(code::IN_USE);
        }
        g.compute_instances.retain(|c| c.id != ci);
        Ok(())
    }

    /// MIG devices (GI, CI) in the order MigDeviceHandleByIndex enumerates them.
    pub fn mig_devices(&self) -> Vec<(u32, u32)> {
        let mut list: Vec<(u32, u32)> =
            self.instances.iter().flat_map(|g| g.compute_instances.iter().map(move |c| (g.id, c.id))).collect();
        list.sort_unstable();
        list
    }

    /// The UUID of MIG device (gi, ci): stable for a given GPU and instance.
    pub fn mig_uuid(&self, gi: u32, ci: u32) -> String {
        let tail = &self.uuid["GPU-".len()..self.uuid.len() - 4];
        format!("MIG-{tail}{gi:02x}{ci:02x}")
    }

    pub fn clocks_event_reasons(&self) -> u64 {
        if self.health.thermal {
            0x20 | 0x40 // SW and HW thermal slowdown
        } else if self.processes.is_empty() {
            0x1 // GPU idle, as seen on an idle H200
        } else {
            0
        }
    }

    pub fn temperature(&self) -> u32 {
        if self.health.thermal {
            self.model.slowdown_temp_c + 2
        } else {
            self.model.temperature_c
        }
    }

    pub fn pcie_width(&self) -> u32 {
        self.health.pcie_width.unwrap_or(self.model.pcie_max_width)
    }
}

/// Slices per NVML_COMPUTE_INSTANCE_PROFILE_* value (1, 2, 3, 4, 7, 8, 6 slices).
pub fn ci_profile_slices(profile: u32) -> Option<u32> {
    [1, 2, 3, 4, 7, 8, 6].get(profile as usize).copied()
}

fn slice_mask(start: u32, size: u32) -> u32 {
    ((1u32 << size) - 1) << start
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixtures() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
    }

    fn h100() -> GpuState {
        let mut g = GpuState::new(GpuModel::load(&fixtures().join("h100-80gb.toml")).unwrap(), 0);
        assert_eq!(g.set_mig_mode(true), Ok(code::SUCCESS));
        g
    }

    const ID_7G: u32 = 0;
    const ID_4G: u32 = 5;
    const ID_3G: u32 = 9;
    const ID_2G: u32 = 14;
    const ID_1G: u32 = 19;

    #[test]
    fn placement_rules_follow_nvidia() {
        let g = h100();
        let starts = |id| g.free_placements(id).unwrap().iter().map(|p| p.0).collect::<Vec<_>>();
        assert_eq!(starts(ID_4G), [0]);
        assert_eq!(starts(ID_3G), [0, 4]);
        assert_eq!(starts(ID_2G), [0, 2, 4]);
        assert_eq!(starts(ID_1G), [0, 1, 2, 3, 4, 5, 6]);
        assert_eq!(starts(ID_7G), [0]);
    }

    #[test]
    fn creation_outcomes() {
        // (instances created first, then the one tried, expected result)
        type Create = (u32, Option<u32>);
        let cases: &[(&[Create], Create, Result<(), NvmlCode>)] = &[
            (&[], (ID_4G, Some(4)), Err(code::INVALID_ARGUMENT)),
            (&[], (ID_3G, Some(2)), Err(code::INVALID_ARGUMENT)),
            (&[(ID_3G, Some(0))], (ID_3G, Some(4)), Ok(())),
            // Two 3g take all 8 memory slices: NVIDIA's 3-3 layout has no room left.
            (&[(ID_3G, None), (ID_3G, None)], (ID_1G, None), Err(code::INSUFFICIENT_RESOURCES)),
            (&[(ID_3G, Some(4)), (ID_2G, Some(0))], (ID_1G, None), Ok(())),
            (&[(ID_7G, None)], (ID_1G, None), Err(code::INSUFFICIENT_RESOURCES)),
            (&[(ID_1G, Some(0))], (ID_4G, None), Err(code::INSUFFICIENT_RESOURCES)),
            (&[(ID_4G, None)], (ID_3G, Some(4)), Ok(())),
            (&[(ID_4G, None), (ID_3G, None)], (ID_1G, None), Err(code::INSUFFICIENT_RESOURCES)),
            (&[(ID_2G, None), (ID_2G, None), (ID_2G, None)], (ID_2G, None), Err(code::INSUFFICIENT_RESOURCES)),
            (&[], (2, None), Err(code::INVALID_ARGUMENT)), // the 3g enum is not a profile id
        ];
        for (before, (id, placement), want) in cases {
            let mut g = h100();
            for (b_id, b_place) in before.iter() {
                g.create_gpu_instance(*b_id, *b_place).unwrap();
            }
            let got = g.create_gpu_instance(*id, *placement).map(|_| ());
            assert_eq!(&got, want, "after {before:?}, create {id} at {placement:?}");
        }
    }

    #[test]
    fn seven_1g_instances_fill_an_h100() {
        let mut g = h100();
        for _ in 0..7 {
            g.create_gpu_instance(ID_1G, None).unwrap();
        }
        assert_eq!(g.create_gpu_instance(ID_1G, None), Err(code::INSUFFICIENT_RESOURCES));
        assert!(g.free_placements(ID_1G).unwrap().is_empty());
    }

    #[test]
    fn mig_needs_mig_mode() {
        let mut g = GpuState::new(GpuModel::load(&fixtures().join("h100-80gb.toml")).unwrap(), 0);
        assert_eq!(g.create_gpu_instance(ID_1G, None), Err(code::NOT_SUPPORTED));
    }

    #[test]
    fn mode_change_stays_pending_while_held_until_reset() {
        let mut g = GpuState::new(GpuModel::load(&fixtures().join("h200-141gb.toml")).unwrap(), 0);
        g.processes.push(SimProcess { pid: 7, used_mib: 1, gpu_instance: None, compute_instance: None, live: false });
        assert_eq!(g.set_mig_mode(true), Ok(code::IN_USE));
        assert!(!g.mig_current && g.mig_pending);
        assert_eq!(g.reset(), Err(code::IN_USE));
        g.processes.clear();
        g.inject(&Fault::MigInUse);
        assert_eq!(g.reset(), Err(code::IN_USE), "a client holding the GPU refuses the reset too");
        g.health.held_by_client = false;
        assert_eq!(g.reset(), Ok(()));
        assert!(g.mig_current);
    }

    #[test]
    fn a_reboot_keeps_the_mig_mode_and_loses_the_layout() {
        let mut s = NodeState::from_fixture(&fixtures().join("node-2x-h200.toml")).unwrap();
        s.gpus[0].set_mig_mode(true).unwrap();
        s.gpus[0].create_gpu_instance(19, None).unwrap();
        s.gpus[1].processes.push(SimProcess { pid: 7, used_mib: 1, gpu_instance: None, compute_instance: None, live: false });
        assert_eq!(s.gpus[1].set_mig_mode(true), Ok(code::IN_USE), "pending while the process holds it");
        s.reboot();
        assert!(s.gpus.iter().all(|g| g.mig_current && g.instances.is_empty() && g.processes.is_empty()));
    }

    #[test]
    fn destroy_order_is_compute_then_gpu_instance() {
        let mut g = h100();
        let gi = g.create_gpu_instance(ID_3G, None).unwrap();
        let ci = g.create_compute_instance(gi, 2).unwrap();
        assert_eq!(g.destroy_gpu_instance(gi), Err(code::IN_USE));
        assert_eq!(g.set_mig_mode(false), Err(code::IN_USE));
        g.destroy_compute_instance(gi, ci).unwrap();
        g.destroy_gpu_instance(gi).unwrap();
        assert!(g.instances.is_empty());
    }

    #[test]
    fn compute_instance_must_fit_its_gpu_instance() {
        let mut g = h100();
        let gi = g.create_gpu_instance(ID_2G, None).unwrap();
        assert_eq!(g.create_compute_instance(gi, 2), Err(code::INVALID_ARGUMENT), "3-slice CI in a 2g GI");
        g.create_compute_instance(gi, 1).unwrap();
        assert_eq!(g.create_compute_instance(gi, 0), Err(code::INSUFFICIENT_RESOURCES));
    }

    #[test]
    fn a100_has_no_mig_on_a_model_without_profiles() {
        let mut model = GpuModel::load(&fixtures().join("a100-40gb.toml")).unwrap();
        model.mig_profiles.clear();
        assert_eq!(GpuState::new(model, 0).set_mig_mode(true), Err(code::NOT_SUPPORTED));
    }

    #[test]
    fn node_fixtures_load_with_their_gpu_counts() {
        for (file, count, name) in [
            ("node-1x-h100.toml", 1, "NVIDIA H100 80GB HBM3"),
            ("node-2x-h200.toml", 2, "NVIDIA H200"),
            ("node-4x-h200.toml", 4, "NVIDIA H200"),
            ("node-8x-a100.toml", 8, "NVIDIA A100-SXM4-40GB"),
        ] {
            let s = NodeState::from_fixture(&fixtures().join(file)).unwrap();
            assert_eq!(s.gpus.len(), count, "{file}");
            assert!(s.gpus.iter().all(|g| g.model.name == name), "{file}");
            let uuids: std::collections::BTreeSet<_> = s.gpus.iter().map(|g| &g.uuid).collect();
            assert_eq!(uuids.len(), count, "{file}: UUIDs must be distinct");
        }
    }

    #[test]
    fn fixture_minors_differ_from_indices_and_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let model = fixtures().join("h200-141gb.toml");
        let fixture = |minors: &str| {
            let path = dir.path().join("node.toml");
            let text = format!(
                "driver_version = \"1\"\nnvml_version = \"1\"\ncuda_driver_version = 13000\n[[gpus]]\nmodel = {model:?}\ncount = 3\n{minors}"
            );
            std::fs::write(&path, text).unwrap();
            NodeState::from_fixture(&path).map_err(|e| e.to_string())
        };
        let minors = |s: NodeState| s.gpus.iter().map(|g| g.minor).collect::<Vec<_>>();
        assert_eq!(minors(fixture("").unwrap()), vec![0, 1, 2]);
        assert_eq!(minors(fixture("minors = [1, 2, 0]").unwrap()), vec![1, 2, 0]);
        assert!(fixture("minors = [1, 2]").unwrap_err().contains("2 minors for 3 GPUs"));
        assert!(fixture("minors = [1, 2, 1]").unwrap_err().contains("minor 1 is given to two GPUs"));
    }

    #[test]
    fn fixture_faults_are_applied() {
        let s = NodeState::from_fixture(&fixtures().join("node-2x-h200-faulty.toml")).unwrap();
        assert!(s.gpus[1].health.remap_pending);
        assert_eq!(s.gpus[1].health.ecc_volatile, 2);
        assert_eq!(s.events.len(), 1);
        assert_eq!((s.events[0].gpu, s.events[0].xid), (1, 79));
    }
}
