//! The node's NVIDIA GPUs, through NVML (nvml-wrapper over libnvidia-ml).
//!
//! [`NvmlGpus::open`] loads the libnvidia-ml the config names (the system's by
//! default; `[nvml] library` chooses another). In CI that is the simulated
//! library of `sim/nvml`, so tests run this same code. The operations are the
//! [`GpuOps`] trait so that the prolog, epilog and node checker can be written
//! against it; the only production implementation is [`NvmlGpus`].
//!
//! Setters have "leave as is" settings ([`ComputeModeSetting::Leave`] ...,
//! config section `[gpu]`), applied by the `apply_*` functions of [`modes`]
//! and [`mig`], so code that changes GPUs can run on machines where it must not.

pub mod error;
pub mod health;
pub mod inventory;
pub mod mig;
pub mod modes;
mod raw;
pub mod report;
pub mod slurm_index;
#[cfg(any(test, feature = "fake"))]
pub mod fake;

pub use error::{ErrorKind, GpuError, GpuLabel};
pub use health::{HealthReadings, Pcie, RemappedRows, XidEvent};
pub use inventory::{DriverVersions, GpuInventory, GpuProcess};
pub use mig::{apply_mig_layout, clear_mig_instances, ComputeInstance, MigInstance, MigInstanceSetting, MigProfile};
pub use modes::{
    apply_compute_mode, apply_mig_mode, Applied, ComputeMode, ComputeModeSetting, GpuModes, MigApplied, MigModeChange,
    MigModeSetting, MigModes,
};
pub use report::{inventory_output, node_report, GpuReport, NodeReport};

use nvml_wrapper::{Device, Nvml};
use std::path::Path;
use std::time::Duration;

/// The library loaded when the config names none: the driver's runtime
/// library (the unversioned `libnvidia-ml.so` only comes with -dev packages).
pub const SYSTEM_NVML_LIBRARY: &str = "libnvidia-ml.so.1";

/// GPU operations the lifecycle code needs, by GPU index.
pub trait GpuOps {
    fn driver(&self) -> Result<DriverVersions, GpuError>;
    fn count(&self) -> Result<u32, GpuError>;
    fn inventory(&self, gpu: u32) -> Result<GpuInventory, GpuError>;
    /// N of /dev/nvidiaN, how gres.conf names the GPU (see [`slurm_index`]).
    fn minor_number(&self, gpu: u32) -> Result<u32, GpuError>;
    fn modes(&self, gpu: u32) -> Result<GpuModes, GpuError>;
    /// GPU-instance profiles; empty on GPUs without MIG.
    fn mig_profiles(&self, gpu: u32) -> Result<Vec<MigProfile>, GpuError>;
    /// Existing GPU instances with their compute instances and MIG UUIDs.
    fn mig_instances(&self, gpu: u32) -> Result<Vec<MigInstance>, GpuError>;
    fn health(&self, gpu: u32) -> Result<HealthReadings, GpuError>;
    fn processes(&self, gpu: u32) -> Result<Vec<GpuProcess>, GpuError>;
    /// XID events raised on any GPU during the next `window`.
    fn wait_xid_events(&self, window: Duration) -> Result<Vec<XidEvent>, GpuError>;
    fn set_compute_mode(&self, gpu: u32, mode: ComputeMode) -> Result<(), GpuError>;
    fn set_mig_mode(&self, gpu: u32, enable: bool) -> Result<MigModeChange, GpuError>;
    /// A GPU instance of `profile_id` (the profile's id, not NVML's enum) at
    /// `placement` (memory-slice start; the first free one when `None`), with
    /// one compute instance spanning it.
    fn create_mig_instance(&self, gpu: u32, profile_id: u32, placement: Option<u32>) -> Result<MigInstance, GpuError>;
    /// Destroys a GPU instance, its compute instances first.
    fn destroy_mig_instance(&self, gpu: u32, gpu_instance: u32) -> Result<(), GpuError>;
}

/// NVML opened on first use: a prolog needs it for some jobs only, and opens
/// it once for all the steps that do.
pub struct LazyGpus<'a> {
    open: Box<dyn Fn() -> Result<Box<dyn GpuOps>, GpuError> + 'a>,
    ops: std::cell::OnceCell<Box<dyn GpuOps>>,
}

impl<'a> LazyGpus<'a> {
    pub fn new(open: impl Fn() -> Result<Box<dyn GpuOps>, GpuError> + 'a) -> LazyGpus<'a> {
        LazyGpus { open: Box::new(open), ops: std::cell::OnceCell::new() }
    }

    /// The library `config` names, opened on first use.
    pub fn from_config(config: &'a crate::Config) -> LazyGpus<'a> {
        LazyGpus::new(move || Ok(Box::new(NvmlGpus::from_config(config)?)))
    }

    /// Opens on the first call; a failed open is tried again on the next.
    pub fn get(&self) -> Result<&dyn GpuOps, GpuError> {
        if let Some(ops) = self.ops.get() {
            return Ok(ops.as_ref());
        }
        let ops = (self.open)()?;
        Ok(self.ops.get_or_init(|| ops).as_ref())
    }
}

/// The node's GPUs through a loaded libnvidia-ml.
pub struct NvmlGpus {
    nvml: Nvml,
}

impl NvmlGpus {
    /// Loads `library` (the system's when `None`) and initializes NVML.
    pub fn open(library: Option<&Path>) -> Result<NvmlGpus, GpuError> {
        let path = library.map(|p| p.as_os_str()).unwrap_or(SYSTEM_NVML_LIBRARY.as_ref());
        let nvml = Nvml::builder().lib_path(path).init().map_err(|e| match GpuError::from_wrapper("nvmlInit_v2", None, e) {
            GpuError::LibraryMissing { detail, .. } => GpuError::LibraryMissing { library: path.to_string_lossy().into(), detail },
            other => other,
        })?;
        Ok(NvmlGpus { nvml })
    }

    /// Opens the library that `config` names (see [`crate::Config::nvml_library`]).
    pub fn from_config(config: &crate::Config) -> Result<NvmlGpus, GpuError> {
        NvmlGpus::open(config.nvml_library().as_deref())
    }

    fn device(&self, gpu: u32) -> Result<Device<'_>, GpuError> {
        self.nvml.device_by_index(gpu).map_err(|e| GpuError::from_wrapper("nvmlDeviceGetHandleByIndex_v2", Some(gpu), e))
    }
}

/// Maps nvml-wrapper's error for `call` on `gpu`.
fn wrap<T>(call: &'static str, gpu: u32, r: Result<T, nvml_wrapper::error::NvmlError>) -> Result<T, GpuError> {
    r.map_err(|e| GpuError::from_wrapper(call, Some(gpu), e))
}

impl GpuOps for NvmlGpus {
    fn driver(&self) -> Result<DriverVersions, GpuError> {
        self.driver_versions()
    }
    fn count(&self) -> Result<u32, GpuError> {
        self.nvml.device_count().map_err(|e| GpuError::from_wrapper("nvmlDeviceGetCount_v2", None, e))
    }
    fn inventory(&self, gpu: u32) -> Result<GpuInventory, GpuError> {
        self.read_inventory(gpu)
    }
    fn minor_number(&self, gpu: u32) -> Result<u32, GpuError> {
        wrap("nvmlDeviceGetMinorNumber", gpu, self.device(gpu)?.minor_number())
    }
    fn modes(&self, gpu: u32) -> Result<GpuModes, GpuError> {
        self.read_modes(gpu)
    }
    fn mig_profiles(&self, gpu: u32) -> Result<Vec<MigProfile>, GpuError> {
        self.read_mig_profiles(gpu)
    }
    fn mig_instances(&self, gpu: u32) -> Result<Vec<MigInstance>, GpuError> {
        self.read_mig_instances(gpu)
    }
    fn health(&self, gpu: u32) -> Result<HealthReadings, GpuError> {
        self.read_health(gpu)
    }
    fn processes(&self, gpu: u32) -> Result<Vec<GpuProcess>, GpuError> {
        self.read_processes(gpu)
    }
    fn wait_xid_events(&self, window: Duration) -> Result<Vec<XidEvent>, GpuError> {
        self.collect_xid_events(window)
    }
    fn set_compute_mode(&self, gpu: u32, mode: ComputeMode) -> Result<(), GpuError> {
        self.write_compute_mode(gpu, mode)
    }
    fn set_mig_mode(&self, gpu: u32, enable: bool) -> Result<MigModeChange, GpuError> {
        self.write_mig_mode(gpu, enable)
    }
    fn create_mig_instance(&self, gpu: u32, profile_id: u32, placement: Option<u32>) -> Result<MigInstance, GpuError> {
        self.create_instance(gpu, profile_id, placement)
    }
    fn destroy_mig_instance(&self, gpu: u32, gpu_instance: u32) -> Result<(), GpuError> {
        self.destroy_instance(gpu, gpu_instance)
    }
}
