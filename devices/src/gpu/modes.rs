//! Compute, persistence and MIG modes: readings, setters, and the "leave as
//! is" settings that let a site (or a shared test machine) forbid changes.

use super::{wrap, GpuError, GpuOps, NvmlGpus};
use nvml_wrapper::enum_wrappers::device::ComputeMode as NvmlComputeMode;
use serde::{Deserialize, Serialize};

/// A plain record type (the MPS daemon records keep the modes to restore):
/// gpu-mode-base's; what NVML calls it is converted here.
pub use gpu_mode_base::compute_mode::ComputeMode;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigModes {
    pub current: bool,
    /// The mode after the next GPU reset.
    pub pending: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuModes {
    pub compute: ComputeMode,
    pub persistence: bool,
    /// `None` on GPUs without MIG.
    pub mig: Option<MigModes>,
}

/// The outcome of nvmlDeviceSetMigMode.
#[derive(Debug, Clone, PartialEq)]
pub enum MigModeChange {
    /// The driver reset the GPU and the new mode is current.
    Applied,
    /// The mode is pending until a GPU reset; why it could not be applied now.
    Pending { reason: String },
}

/// The settings live with the rest of the configuration (a leaf); what
/// they mean for a GPU is here.
pub use crate::config::{ComputeModeSetting, MigModeSetting};

/// What an `apply_*` function did.
#[derive(Debug, Clone, PartialEq)]
pub enum Applied<T> {
    /// The setting says leave as is: nothing was read or written.
    Left,
    /// Already as wanted: nothing written.
    Unchanged,
    Changed { from: T, to: T },
}

/// The compute mode a setting asks for (`None`: leave it as it is). A free
/// function: the setting is configuration's (gpu-mode-base), the compute
/// mode the GPU's.
pub fn setting_target(setting: ComputeModeSetting) -> Option<ComputeMode> {
    match setting {
        ComputeModeSetting::ExclusiveProcess => Some(ComputeMode::ExclusiveProcess),
        ComputeModeSetting::Default => Some(ComputeMode::Default),
        ComputeModeSetting::Prohibited => Some(ComputeMode::Prohibited),
        ComputeModeSetting::Leave => None,
    }
}

/// Sets `gpu`'s compute mode as `setting` says, writing only if it differs.
pub fn apply_compute_mode(ops: &dyn GpuOps, gpu: u32, setting: ComputeModeSetting) -> Result<Applied<ComputeMode>, GpuError> {
    let Some(want) = setting_target(setting) else { return Ok(Applied::Left) };
    let from = ops.modes(gpu)?.compute;
    if from == want {
        return Ok(Applied::Unchanged);
    }
    ops.set_compute_mode(gpu, want)?;
    Ok(Applied::Changed { from, to: want })
}

/// What [`apply_mig_mode`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum MigApplied {
    /// Current and pending mode were already as wanted.
    Unchanged,
    Changed(MigModeChange),
}

/// Turns MIG on or off on `gpu` if `setting` allows; with `Leave`, a GPU not
/// already in the wanted mode is an error the prolog turns into a refusal.
pub fn apply_mig_mode(ops: &dyn GpuOps, gpu: u32, setting: MigModeSetting, enable: bool) -> Result<MigApplied, GpuError> {
    let mig = ops.modes(gpu)?.mig.ok_or_else(|| GpuError::Refused {
        gpu: super::GpuLabel(Some(gpu)),
        detail: "this GPU has no MIG mode".into(),
    })?;
    if mig.current == enable && mig.pending == enable {
        return Ok(MigApplied::Unchanged);
    }
    if setting == MigModeSetting::Leave {
        let want = if enable { "on" } else { "off" };
        return Err(GpuError::Refused {
            gpu: super::GpuLabel(Some(gpu)),
            detail: format!("MIG would need to be switched {want}, but [gpu] mig_mode = \"leave\""),
        });
    }
    Ok(MigApplied::Changed(ops.set_mig_mode(gpu, enable)?))
}

fn from_nvml(m: NvmlComputeMode) -> ComputeMode {
    match m {
        NvmlComputeMode::Default => ComputeMode::Default,
        NvmlComputeMode::ExclusiveThread => ComputeMode::ExclusiveThread,
        NvmlComputeMode::Prohibited => ComputeMode::Prohibited,
        NvmlComputeMode::ExclusiveProcess => ComputeMode::ExclusiveProcess,
    }
}

fn to_nvml(m: ComputeMode) -> NvmlComputeMode {
    match m {
        ComputeMode::Default => NvmlComputeMode::Default,
        ComputeMode::ExclusiveThread => NvmlComputeMode::ExclusiveThread,
        ComputeMode::Prohibited => NvmlComputeMode::Prohibited,
        ComputeMode::ExclusiveProcess => NvmlComputeMode::ExclusiveProcess,
    }
}

impl NvmlGpus {
    pub(super) fn read_modes(&self, gpu: u32) -> Result<GpuModes, GpuError> {
        let d = self.device(gpu)?;
        let mig = match d.mig_mode() {
            Ok(m) => Some(MigModes { current: m.current == 1, pending: m.pending == 1 }),
            Err(e) => match GpuError::from_wrapper("nvmlDeviceGetMigMode", Some(gpu), e) {
                e if e.is_not_supported() => None,
                e => return Err(e),
            },
        };
        Ok(GpuModes {
            compute: from_nvml(wrap("nvmlDeviceGetComputeMode", gpu, d.compute_mode())?),
            persistence: wrap("nvmlDeviceGetPersistenceMode", gpu, d.is_in_persistent_mode())?,
            mig,
        })
    }

    pub(super) fn write_compute_mode(&self, gpu: u32, mode: ComputeMode) -> Result<(), GpuError> {
        let mut d = self.device(gpu)?;
        wrap("nvmlDeviceSetComputeMode", gpu, d.set_compute_mode(to_nvml(mode)))
    }

    pub(super) fn write_mig_mode(&self, gpu: u32, enable: bool) -> Result<MigModeChange, GpuError> {
        let d = self.device(gpu)?;
        let activation = wrap("nvmlDeviceSetMigMode", gpu, d.set_mig_mode(enable))?;
        if activation == nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_SUCCESS {
            return Ok(MigModeChange::Applied);
        }
        let reason = GpuError::from_code("nvmlDeviceSetMigMode activation", Some(gpu), activation).to_string();
        Ok(MigModeChange::Pending { reason })
    }
}
