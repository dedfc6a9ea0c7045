//! A [`GpuOps`] double for unit tests: GPUs with given minor numbers and
//! UUIDs `GPU-nvml<index>`. Reads it does not model fail; nothing panics.

use super::*;

pub struct FakeGpus {
    /// Minor number of each GPU, by NVML index.
    pub minors: Vec<u32>,
    /// GPUs whose reads fail as a lost GPU would.
    pub lost: Vec<u32>,
}

impl FakeGpus {
    pub fn with_minors(minors: &[u32]) -> FakeGpus {
        FakeGpus { minors: minors.to_vec(), lost: Vec::new() }
    }

    fn check(&self, call: &'static str, gpu: u32) -> Result<(), GpuError> {
        if self.lost.contains(&gpu) {
            return Err(GpuError::GpuLost { call, gpu: GpuLabel(Some(gpu)) });
        }
        if gpu as usize >= self.minors.len() {
            return Err(GpuError::Nvml { call, gpu: GpuLabel(Some(gpu)), kind: ErrorKind::InvalidArgument });
        }
        Ok(())
    }
}

fn unmodelled<T>(call: &'static str, gpu: Option<u32>) -> Result<T, GpuError> {
    Err(GpuError::Refused { gpu: GpuLabel(gpu), detail: format!("{call} is not modelled by FakeGpus") })
}

impl GpuOps for FakeGpus {
    fn driver(&self) -> Result<DriverVersions, GpuError> {
        unmodelled("driver", None)
    }
    fn count(&self) -> Result<u32, GpuError> {
        Ok(self.minors.len() as u32)
    }
    fn inventory(&self, gpu: u32) -> Result<GpuInventory, GpuError> {
        self.check("nvmlDeviceGetUUID", gpu)?;
        Ok(GpuInventory {
            index: gpu,
            uuid: format!("GPU-nvml{gpu}"),
            pci_bus_id: format!("00000000:{gpu:02X}:00.0"),
            pci_device_id: 0x2335_10de,
            pci_subsystem_id: 0x16c1_10de,
            minor_number: self.minors[gpu as usize],
            name: "Fake GPU".into(),
            memory_total_mib: 1024,
            compute_capability: "9.0".into(),
        })
    }
    fn minor_number(&self, gpu: u32) -> Result<u32, GpuError> {
        self.check("nvmlDeviceGetMinorNumber", gpu)?;
        Ok(self.minors[gpu as usize])
    }
    fn modes(&self, gpu: u32) -> Result<GpuModes, GpuError> {
        unmodelled("modes", Some(gpu))
    }
    fn mig_profiles(&self, gpu: u32) -> Result<Vec<MigProfile>, GpuError> {
        unmodelled("mig_profiles", Some(gpu))
    }
    fn mig_instances(&self, gpu: u32) -> Result<Vec<MigInstance>, GpuError> {
        unmodelled("mig_instances", Some(gpu))
    }
    fn health(&self, gpu: u32) -> Result<HealthReadings, GpuError> {
        unmodelled("health", Some(gpu))
    }
    fn processes(&self, gpu: u32) -> Result<Vec<GpuProcess>, GpuError> {
        unmodelled("processes", Some(gpu))
    }
    fn wait_xid_events(&self, _window: Duration) -> Result<Vec<XidEvent>, GpuError> {
        unmodelled("wait_xid_events", None)
    }
    fn set_compute_mode(&self, gpu: u32, _mode: ComputeMode) -> Result<(), GpuError> {
        unmodelled("set_compute_mode", Some(gpu))
    }
    fn set_mig_mode(&self, gpu: u32, _enable: bool) -> Result<MigModeChange, GpuError> {
        unmodelled("set_mig_mode", Some(gpu))
    }
    fn create_mig_instance(&self, gpu: u32, _profile_id: u32, _placement: Option<u32>) -> Result<MigInstance, GpuError> {
        unmodelled("create_mig_instance", Some(gpu))
    }
    fn destroy_mig_instance(&self, gpu: u32, _gpu_instance: u32) -> Result<(), GpuError> {
        unmodelled("destroy_mig_instance", Some(gpu))
    }
}
