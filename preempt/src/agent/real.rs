//! The real backends of an agent, from the site config: CRIU's CLI, the CUDA
//! driver (or, where libcuda cannot be loaded, a driver that knows no CUDA
//! process, so CPU-only jobs still checkpoint and GPU holders are refused
//! with the loader's error), /proc, NVML; and the node's GPU facts.

use super::Backends;
use crate::cuda_ckpt::{CudaCkptDriver, CudaDriver, DriverError, GpuInfoError, GpuPair, GpuUuid, Nvml, ProcFs, ProcessState, UuidError};
use crate::criu::{CheckCache, CriuCli};
use crate::gpu::{GpuError, GpuOps, NvmlGpus};
use crate::manifest::GpuFacts;
use crate::Config;
use std::sync::Arc;
use std::time::Duration;

struct NoDriver(DriverError);

impl CudaCkptDriver for NoDriver {
    fn state(&self, _: i32) -> Result<ProcessState, DriverError> {
        Err(self.0.clone())
    }
    fn restore_thread_id(&self, _: i32) -> Result<i32, DriverError> {
        Err(self.0.clone())
    }
    fn lock(&self, _: i32, _: u32) -> Result<(), DriverError> {
        Err(self.0.clone())
    }
    fn checkpoint(&self, _: i32) -> Result<(), DriverError> {
        Err(self.0.clone())
    }
    fn restore(&self, _: i32, _: &[GpuPair]) -> Result<(), DriverError> {
        Err(self.0.clone())
    }
    fn unlock(&self, _: i32) -> Result<(), DriverError> {
        Err(self.0.clone())
    }
}

/// The backends and the driver's CUDA version (0 without a driver). Only
/// NVML's loading can fail: without libcuda the driver knows no process.
pub fn real_backends(cfg: &Config) -> Result<(Backends, i32), GpuInfoError> {
    let (driver, cuda_version): (Arc<dyn CudaCkptDriver>, i32) = match CudaDriver::load(cfg.cuda_ckpt.cuda_library.as_deref()) {
        Ok(d) => {
            let v = d.version();
            (Arc::new(d), v)
        }
        Err(e) => (Arc::new(NoDriver(e)), 0),
    };
    let nvml = Nvml::load(cfg.nvml_library().as_deref())?;
    let backends = Backends {
        criu: Arc::new(CriuCli {
            binary: cfg.preempt.criu.clone(),
            timeout: Duration::from_millis(cfg.preempt.criu_timeout_ms),
            check_cache: Some(CheckCache { path: cfg.runtime_dir.join(crate::criu::CHECK_CACHE_FILE) }),
            page_readers: cfg.preempt.restore_page_readers,
        }),
        driver,
        host: Arc::new(ProcFs { device_prefixes: cfg.cuda_ckpt.device_paths.clone(), ..ProcFs::default() }),
        gpus: Arc::new(nvml),
    };
    Ok((backends, cuda_version))
}

/// The GPUs with these NVML indices (UUID, model), and the driver version.
/// Every GPU's UUID on this node, in NVML order; empty when NVML cannot
/// tell (a restore then maps the job's GPUs only).
pub fn node_gpus(cfg: &Config) -> Vec<GpuUuid> {
    let Ok(nvml) = NvmlGpus::from_config(cfg) else { return Vec::new() };
    let count = crate::gpu::GpuOps::count(&nvml).unwrap_or(0);
    (0..count).filter_map(|i| GpuUuid::parse(&nvml.inventory(i).ok()?.uuid).ok()).collect()
}

/// Why the job's GPU facts are unknown; the agent then runs without them
/// (its log line says why).
#[derive(Debug, thiserror::Error)]
pub enum GpuFactsError {
    /// NVML could not be loaded or asked.
    #[error(transparent)]
    Gpu(#[from] GpuError),
    /// A GPU's UUID is one the driver cannot checkpoint (a MIG device).
    #[error(transparent)]
    Uuid(#[from] UuidError),
}

pub fn gpu_facts(cfg: &Config, indices: &[u32]) -> Result<(Vec<GpuFacts>, String), GpuFactsError> {
    let nvml = NvmlGpus::from_config(cfg)?;
    let driver = nvml.driver()?.driver;
    let facts = indices
        .iter()
        .map(|&i| {
            let inv = nvml.inventory(i)?;
            Ok(GpuFacts { uuid: GpuUuid::parse(&inv.uuid)?, name: inv.name })
        })
        .collect::<Result<_, GpuFactsError>>()?;
    Ok((facts, driver))
}
