//! What the GPUs are: identity, memory, compute capability, driver versions,
//! and the processes running on them.

use super::{wrap, GpuError, NvmlGpus};
use nvml_wrapper::enums::device::UsedGpuMemory;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverVersions {
    pub driver: String,
    pub nvml: String,
    /// CUDA version the driver supports, e.g. "13.0".
    pub cuda: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInventory {
    pub index: u32,
    pub uuid: String,
    pub pci_bus_id: String,
    /// PCI device and vendor id as one number, device in the high half
    /// (0x233010DE: an H100 SXM5), as NVML's pciDeviceId and mig-parted's
    /// `device-filter` write it. 0 in reports recorded before it was read.
    #[serde(default)]
    pub pci_device_id: u32,
    /// PCI subsystem device and vendor id, the same way (NVML's pciSubSystemId).
    #[serde(default)]
    pub pci_subsystem_id: u32,
    /// N of /dev/nvidiaN.
    pub minor_number: u32,
    pub name: String,
    pub memory_total_mib: u64,
    pub compute_capability: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuProcess {
    pub pid: u32,
    /// `None` where the driver does not report it.
    pub used_memory_mib: Option<u64>,
    /// The MIG instance the process runs in, when MIG is on.
    pub gpu_instance: Option<u32>,
    pub compute_instance: Option<u32>,
}

/// NVML encodes CUDA 13.0 as 13000.
fn cuda_version(encoded: i32) -> String {
    format!("{}.{}", encoded / 1000, (encoded % 1000) / 10)
}

impl NvmlGpus {
    pub(super) fn driver_versions(&self) -> Result<DriverVersions, GpuError> {
        let node = |call, e| GpuError::from_wrapper(call, None, e);
        Ok(DriverVersions {
            driver: self.nvml.sys_driver_version().map_err(|e| node("nvmlSystemGetDriverVersion", e))?,
            nvml: self.nvml.sys_nvml_version().map_err(|e| node("nvmlSystemGetNVMLVersion", e))?,
            cuda: cuda_version(self.nvml.sys_cuda_driver_version().map_err(|e| node("nvmlSystemGetCudaDriverVersion_v2", e))?),
        })
    }

    pub(super) fn read_inventory(&self, gpu: u32) -> Result<GpuInventory, GpuError> {
        let d = self.device(gpu)?;
        let cc = wrap("nvmlDeviceGetCudaComputeCapability", gpu, d.cuda_compute_capability())?;
        let pci = wrap("nvmlDeviceGetPciInfo_v3", gpu, d.pci_info())?;
        Ok(GpuInventory {
            index: wrap("nvmlDeviceGetIndex", gpu, d.index())?,
            uuid: wrap("nvmlDeviceGetUUID", gpu, d.uuid())?,
            pci_bus_id: pci.bus_id,
            pci_device_id: pci.pci_device_id,
            pci_subsystem_id: pci.pci_sub_system_id.unwrap_or(0),
            minor_number: wrap("nvmlDeviceGetMinorNumber", gpu, d.minor_number())?,
            name: wrap("nvmlDeviceGetName", gpu, d.name())?,
            memory_total_mib: wrap("nvmlDeviceGetMemoryInfo_v2", gpu, d.memory_info())?.total / (1024 * 1024),
            compute_capability: format!("{}.{}", cc.major, cc.minor),
        })
    }

    pub(super) fn read_processes(&self, gpu: u32) -> Result<Vec<GpuProcess>, GpuError> {
        let d = self.device(gpu)?;
        let list = wrap("nvmlDeviceGetComputeRunningProcesses_v3", gpu, d.running_compute_processes())?;
        Ok(list
            .into_iter()
            .map(|p| GpuProcess {
                pid: p.pid,
                used_memory_mib: match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b / (1024 * 1024)),
                    UsedGpuMemory::Unavailable => None,
                },
                gpu_instance: p.gpu_instance_id,
                compute_instance: p.compute_instance_id,
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn cuda_versions_decode() {
        for (enc, want) in [(13000, "13.0"), (12080, "12.8"), (11040, "11.4")] {
            assert_eq!(super::cuda_version(enc), want);
        }
    }
}
