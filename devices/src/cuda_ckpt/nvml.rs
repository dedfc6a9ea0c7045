//! The little NVML that checkpointing needs: which GPU memory each process
//! holds (its footprint, recorded at checkpoint) and each GPU's free memory
//! (checked before restore). Kept in this one file, behind [`GpuInfo`], so it
//! can be swapped for the project's full NVML layer later.

use super::driver::{GpuUuid, UuidError};
use std::ffi::{c_char, c_uint, CStr};
use std::path::{Path, PathBuf};

/// One process's memory on one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuProcess {
    pub gpu: GpuUuid,
    pub pid: i32,
    pub used_bytes: u64,
}

/// Why NVML could not be loaded or could not tell a GPU's memory: the
/// checkpoint's footprint and the restore's free-memory check carry it.
#[derive(Debug, thiserror::Error)]
pub enum GpuInfoError {
    #[error("cannot load NVML from {path}: {source}")]
    Load { path: PathBuf, source: libloading::Error },
    /// An NVML too old for the _v3 process query, or not NVML.
    #[error("NVML in {path} lacks {symbol}")]
    MissingSymbol { path: PathBuf, symbol: &'static str },
    /// `text` is nvmlErrorString's.
    #[error("{call} failed: {text} ({code})")]
    Call { call: &'static str, text: String, code: u32 },
    #[error(transparent)]
    Uuid(#[from] UuidError),
    #[error("NVML does not report pid {pid}'s memory on {gpu} (container without pid access?)")]
    MemoryUnreported { pid: u32, gpu: GpuUuid },
    #[error("no GPU {gpu} on this node")]
    NoGpu { gpu: GpuUuid },
    /// The thread that asked NVML (beside the driver's lock) panicked.
    #[error("NVML query thread panicked")]
    Panicked,
}

pub trait GpuInfo: Sync {
    /// Every compute process on every GPU of the node.
    fn compute_processes(&self) -> Result<Vec<GpuProcess>, GpuInfoError>;
    /// Free memory of the GPU with this UUID.
    fn free_bytes(&self, gpu: GpuUuid) -> Result<u64, GpuInfoError>;
}

type Device = *mut std::ffi::c_void;
type Ret = c_uint;

#[repr(C)]
struct Memory {
    total: u64,
    free: u64,
    used: u64,
}

// nvmlProcessInfo_t of NVML 11.x-13.x (the _v3 query's element).
#[repr(C)]
#[derive(Clone, Copy)]
struct ProcessInfo {
    pid: c_uint,
    used_gpu_memory: u64,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

const NVML_ERROR_INSUFFICIENT_SIZE: Ret = 7;
// NVML reports "not available" as all ones.
const NVML_VALUE_NOT_AVAILABLE: u64 = u64::MAX;

pub struct Nvml {
    _lib: libloading::Library,
    count: unsafe extern "C" fn(*mut c_uint) -> Ret,
    by_index: unsafe extern "C" fn(c_uint, *mut Device) -> Ret,
    uuid: unsafe extern "C" fn(Device, *mut c_char, c_uint) -> Ret,
    memory: unsafe extern "C" fn(Device, *mut Memory) -> Ret,
    processes: unsafe extern "C" fn(Device, *mut c_uint, *mut ProcessInfo) -> Ret,
    error_string: unsafe extern "C" fn(Ret) -> *const c_char,
}

// SAFETY: NVML is thread-safe; the struct only holds function pointers.
unsafe impl Sync for Nvml {}
unsafe impl Send for Nvml {}

impl Nvml {
    /// Loads `library` (default libnvidia-ml.so.1) and calls nvmlInit_v2.
    pub fn load(library: Option<&Path>) -> Result<Nvml, GpuInfoError> {
        let path = library.map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("libnvidia-ml.so.1"));
        let lib = unsafe { libloading::Library::new(&path) }
            .map_err(|source| GpuInfoError::Load { path: path.clone(), source })?;
        macro_rules! sym {
            ($name:literal) => {
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                    .map_err(|_| GpuInfoError::MissingSymbol { path: path.clone(), symbol: $name })?
            };
        }
        let init: unsafe extern "C" fn() -> Ret = sym!("nvmlInit_v2");
        let nvml = Nvml {
            count: sym!("nvmlDeviceGetCount_v2"),
            by_index: sym!("nvmlDeviceGetHandleByIndex_v2"),
            uuid: sym!("nvmlDeviceGetUUID"),
            memory: sym!("nvmlDeviceGetMemoryInfo"),
            processes: sym!("nvmlDeviceGetComputeRunningProcesses_v3"),
            error_string: sym!("nvmlErrorString"),
            _lib: lib,
        };
        nvml.check("nvmlInit_v2", unsafe { init() })?;
        Ok(nvml)
    }

    fn check(&self, call: &'static str, ret: Ret) -> Result<(), GpuInfoError> {
        if ret == 0 {
            return Ok(());
        }
        let text = unsafe { CStr::from_ptr((self.error_string)(ret)) }.to_string_lossy().into_owned();
        Err(GpuInfoError::Call { call, text, code: ret })
    }

    fn devices(&self) -> Result<Vec<(GpuUuid, Device)>, GpuInfoError> {
        let mut n: c_uint = 0;
        self.check("nvmlDeviceGetCount_v2", unsafe { (self.count)(&mut n) })?;
        (0..n).map(|i| self.device(i)).collect()
    }

    fn device(&self, index: c_uint) -> Result<(GpuUuid, Device), GpuInfoError> {
        let mut dev: Device = std::ptr::null_mut();
        self.check("nvmlDeviceGetHandleByIndex_v2", unsafe { (self.by_index)(index, &mut dev) })?;
        let mut buf = [0 as c_char; 96];
        self.check("nvmlDeviceGetUUID", unsafe { (self.uuid)(dev, buf.as_mut_ptr(), buf.len() as c_uint) })?;
        let text = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned();
        Ok((GpuUuid::parse(&text)?, dev))
    }

    fn device_processes(&self, dev: Device) -> Result<Vec<ProcessInfo>, GpuInfoError> {
        let empty = ProcessInfo { pid: 0, used_gpu_memory: 0, gpu_instance_id: 0, compute_instance_id: 0 };
        let mut list = vec![empty; 64];
        loop {
            let mut n = list.len() as c_uint;
            let ret = unsafe { (self.processes)(dev, &mut n, list.as_mut_ptr()) };
            if ret == NVML_ERROR_INSUFFICIENT_SIZE {
                // Processes came and went: grow and ask again.
                list = vec![empty; n as usize + 16];
                continue;
            }
            self.check("nvmlDeviceGetComputeRunningProcesses_v3", ret)?;
            list.truncate(n as usize);
            return Ok(list);
        }
    }
}

impl GpuInfo for Nvml {
    fn compute_processes(&self) -> Result<Vec<GpuProcess>, GpuInfoError> {
        let mut out = Vec::new();
        for (gpu, dev) in self.devices()? {
            for p in self.device_processes(dev)? {
                if p.used_gpu_memory == NVML_VALUE_NOT_AVAILABLE {
                    return Err(GpuInfoError::MemoryUnreported { pid: p.pid, gpu });
                }
                out.push(GpuProcess { gpu, pid: p.pid as i32, used_bytes: p.used_gpu_memory });
            }
        }
        Ok(out)
    }

    fn free_bytes(&self, gpu: GpuUuid) -> Result<u64, GpuInfoError> {
        let (_, dev) = self.devices()?.into_iter().find(|(u, _)| *u == gpu).ok_or(GpuInfoError::NoGpu { gpu })?;
        let mut mem = Memory { total: 0, free: 0, used: 0 };
        self.check("nvmlDeviceGetMemoryInfo", unsafe { (self.memory)(dev, &mut mem) })?;
        Ok(mem.free)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_process_record_has_nvml_s_layout() {
        assert_eq!(std::mem::size_of::<super::ProcessInfo>(), 24);
        assert_eq!(std::mem::size_of::<super::Memory>(), 24);
    }

    #[test]
    fn a_missing_library_is_named() {
        let err = super::Nvml::load(Some(std::path::Path::new("/nonexistent/libnvidia-ml.so.1"))).err().unwrap();
        assert!(matches!(err, super::GpuInfoError::Load { .. }), "{err:?}");
        assert!(err.to_string().starts_with("cannot load NVML from /nonexistent/libnvidia-ml.so.1: "), "{err}");
    }
}
