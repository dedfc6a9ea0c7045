//! The exported NVML C functions. Each one decodes its handles, runs a rule of
//! `model.rs` on the shared state under the file lock, and writes its outputs.
//! Signatures are nvml-wrapper-sys's (checked at compile time by the test at
//! the end), so nvml-wrapper loads this library as it loads libnvidia-ml.
//!
//! No panic may cross into the caller: every body runs inside [`guard`], which
//! turns a panic into NVML_ERROR_UNKNOWN.

// The names are NVML's; the pointer contracts are NVML's documented ones.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use crate::model::{code, ci_profile_slices, GpuState, NodeState, NvmlCode, MEMORY_SLICES};
use crate::store;
use nvml_wrapper_sys::bindings::*;

// Enum values under shorter names (bindgen prefixes them with the enum's name).
const UNCORRECTED: u32 = nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_UNCORRECTED;
const CORRECTED: u32 = nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_CORRECTED;
const VOLATILE: u32 = nvmlEccCounterType_enum_NVML_VOLATILE_ECC;
const AGGREGATE: u32 = nvmlEccCounterType_enum_NVML_AGGREGATE_ECC;
const RETIRED_FOR_DBE: u32 = nvmlPageRetirementCause_enum_NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR;
const SENSOR_GPU: u32 = nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU;
const THRESHOLD_SHUTDOWN: u32 = nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_SHUTDOWN;
const THRESHOLD_SLOWDOWN: u32 = nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_SLOWDOWN;
use std::collections::{BTreeSet, HashMap};
use std::ffi::{c_char, c_int, c_uint, c_ulonglong};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

type Ret = Result<(), NvmlCode>;

/// The state file chosen at nvmlInit and the init reference count.
static INIT: Mutex<Option<(PathBuf, u32)>> = Mutex::new(None);

fn guard(f: impl FnOnce() -> Ret) -> nvmlReturn_t {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => code::SUCCESS,
        Ok(Err(c)) => c,
        Err(_) => code::UNKNOWN,
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn state_path() -> Result<PathBuf, NvmlCode> {
    lock(&INIT).as_ref().map(|(p, _)| p.clone()).ok_or(code::UNINITIALIZED)
}

fn with_node<R>(f: impl FnOnce(&mut NodeState) -> Result<R, NvmlCode>) -> Result<R, NvmlCode> {
    let path = state_path()?;
    store::update(&path, f).map_err(report)?
}

/// The NVML code for a state-file problem. NVML callers only see the code,
/// so the cause goes to stderr where a test log keeps it.
fn report(e: store::StoreError) -> NvmlCode {
    eprintln!("nvml-sim: {e}");
    e.code()
}

// ---- handles ---------------------------------------------------------------
// Handles are opaque pointers to NVML's callers and never dereferenced, so
// they encode what they name: a kind tag, the GPU index, GI id and CI id.

#[derive(Debug, Clone, Copy, PartialEq)]
enum Handle {
    Device(u32),
    MigDevice(u32, u32, u32),
    GpuInstance(u32, u32),
    ComputeInstance(u32, u32, u32),
}

impl Handle {
    fn encode(self) -> usize {
        let (tag, gpu, gi, ci) = match self {
            Handle::Device(g) => (1, g, 0, 0),
            Handle::MigDevice(g, gi, ci) => (2, g, gi, ci),
            Handle::GpuInstance(g, gi) => (3, g, gi, 0),
            Handle::ComputeInstance(g, gi, ci) => (4, g, gi, ci),
        };
        (tag << 40) | ((gpu as usize) << 16) | ((gi as usize & 0xff) << 8) | (ci as usize & 0xff)
    }

    fn decode(raw: usize) -> Result<Handle, NvmlCode> {
        let gpu = ((raw >> 16) & 0xffff) as u32;
        let (gi, ci) = (((raw >> 8) & 0xff) as u32, (raw & 0xff) as u32);
        match raw >> 40 {
            1 => Ok(Handle::Device(gpu)),
            2 => Ok(Handle::MigDevice(gpu, gi, ci)),
            3 => Ok(Handle::GpuInstance(gpu, gi)),
            4 => Ok(Handle::ComputeInstance(gpu, gi, ci)),
            _ => Err(code::INVALID_ARGUMENT),
        }
    }

    fn gpu(self) -> u32 {
        match self {
            Handle::Device(g) | Handle::MigDevice(g, ..) | Handle::GpuInstance(g, _) | Handle::ComputeInstance(g, ..) => g,
        }
    }
}

fn device_handle(h: Handle) -> nvmlDevice_t {
    h.encode() as nvmlDevice_t
}

/// Runs `f` on the GPU a device handle (or MIG device handle) names,
/// failing as NVML does on a lost GPU or one that needs a reset.
fn with_gpu<R>(device: nvmlDevice_t, f: impl FnOnce(&mut GpuState, Handle) -> Result<R, NvmlCode>) -> Result<R, NvmlCode> {
    let h = Handle::decode(device as usize)?;
    if matches!(h, Handle::GpuInstance(..) | Handle::ComputeInstance(..)) {
        return Err(code::INVALID_ARGUMENT);
    }
    with_node(|node| {
        let gpu = node.gpu_mut(h.gpu())?;
        if let Some(c) = gpu.access_error() {
            return Err(c);
        }
        f(gpu, h)
    })
}

/// [`with_gpu`] for calls that only accept a full GPU, not a MIG device.
fn with_full_gpu<R>(device: nvmlDevice_t, f: impl FnOnce(&mut GpuState) -> Result<R, NvmlCode>) -> Result<R, NvmlCode> {
    with_indexed_gpu(device, |g, _| f(g))
}

/// [`with_full_gpu`] that also passes the GPU's NVML index, which handles
/// carry (the minor number is another number: /dev/nvidia<minor>).
fn with_indexed_gpu<R>(device: nvmlDevice_t, f: impl FnOnce(&mut GpuState, u32) -> Result<R, NvmlCode>) -> Result<R, NvmlCode> {
    with_gpu(device, |g, h| match h {
        Handle::Device(index) => f(g, index),
        _ => Err(code::NOT_SUPPORTED),
    })
}

fn with_gi<R>(gi: nvmlGpuInstance_t, f: impl FnOnce(&mut GpuState, u32, u32) -> Result<R, NvmlCode>) -> Result<R, NvmlCode> {
    match Handle::decode(gi as usize)? {
        Handle::GpuInstance(gpu, id) => with_full_gpu(device_handle(Handle::Device(gpu)), |g| {
            g.gpu_instance(id)?;
            f(g, gpu, id)
        }),
        _ => Err(code::INVALID_ARGUMENT),
    }
}

// ---- output helpers ----------------------------------------------------------

unsafe fn out<T>(p: *mut T, v: T) -> Ret {
    if p.is_null() {
        return Err(code::INVALID_ARGUMENT);
    }
    p.write(v);
    Ok(())
}

unsafe fn out_str(buf: *mut c_char, len: c_uint, s: &str) -> Ret {
    if buf.is_null() {
        return Err(code::INVALID_ARGUMENT);
    }
    if (len as usize) < s.len() + 1 {
        return Err(code::INSUFFICIENT_SIZE);
    }
    std::ptr::copy_nonoverlapping(s.as_ptr() as *const c_char, buf, s.len());
    buf.add(s.len()).write(0);
    Ok(())
}

fn fill_chars<const N: usize>(dst: &mut [c_char; N], s: &str) {
    for (d, b) in dst.iter_mut().zip(s.bytes().take(N - 1)) {
        *d = b as c_char;
    }
}

/// NVML's list protocol: with too small a `count`, report the size needed.
unsafe fn out_list<T: Copy>(count: *mut c_uint, array: *mut T, items: &[T]) -> Ret {
    if count.is_null() {
        return Err(code::INVALID_ARGUMENT);
    }
    let room = *count as usize;
    *count = items.len() as c_uint;
    if room < items.len() {
        return Err(code::INSUFFICIENT_SIZE);
    }
    if !items.is_empty() && array.is_null() {
        return Err(code::INVALID_ARGUMENT);
    }
    std::ptr::copy_nonoverlapping(items.as_ptr(), array, items.len());
    Ok(())
}

// ---- init and system -----------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    nvmlInitWithFlags(0)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    guard(|| {
        let path = store::state_path_from_env().map_err(report)?;
        // Reading the state now makes a missing node fail here, as a missing
        // driver fails nvmlInit, and creates the state from the fixture.
        store::update(&path, |_| ()).map_err(report)?;
        let mut init = lock(&INIT);
        let refs = init.as_ref().map_or(0, |(_, n)| *n);
        *init = Some((path, refs + 1));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    guard(|| {
        let mut init = lock(&INIT);
        match init.take() {
            None => Err(code::UNINITIALIZED),
            Some((p, n)) if n > 1 => {
                *init = Some((p, n - 1));
                Ok(())
            }
            Some(_) => Ok(()),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    let text: &'static [u8] = match result {
        code::SUCCESS => b"Success\0",
        code::UNINITIALIZED => b"Uninitialized\0",
        code::INVALID_ARGUMENT => b"Invalid Argument\0",
        code::NOT_SUPPORTED => b"Not Supported\0",
        code::DRIVER_NOT_LOADED => b"Driver Not Loaded\0",
        code::TIMEOUT => b"Timeout\0",
        code::GPU_IS_LOST => b"GPU is lost\0",
        code::RESET_REQUIRED => b"GPU requires reset\0",
        code::IN_USE => b"In use by another client\0",
        code::INSUFFICIENT_RESOURCES => b"Insufficient Resources\0",
        code::INSUFFICIENT_SIZE => b"Insufficient Size\0",
        code::NOT_FOUND => b"Not Found\0",
        _ => b"Unknown Error\0",
    };
    text.as_ptr() as *const c_char
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> nvmlReturn_t {
    guard(|| out_str(version, length, &with_node(|n| Ok(n.driver_version.clone()))?))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> nvmlReturn_t {
    guard(|| out_str(version, length, &with_node(|n| Ok(n.nvml_version.clone()))?))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(v: *mut c_int) -> nvmlReturn_t {
    guard(|| out(v, with_node(|n| Ok(n.cuda_driver_version))?))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(v: *mut c_int) -> nvmlReturn_t {
    nvmlSystemGetCudaDriverVersion_v2(v)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    guard(|| out(count, with_node(|n| Ok(n.gpus.len() as c_uint))?))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut nvmlDevice_t) -> nvmlReturn_t {
    guard(|| {
        with_node(|n| n.gpu(index)?.access_error().map_or(Ok(()), Err))?;
        out(device, device_handle(Handle::Device(index)))
    })
}

// ---- inventory -------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: nvmlDevice_t, index: *mut c_uint) -> nvmlReturn_t {
    guard(|| out(index, with_indexed_gpu(device, |_, index| Ok(index))?))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(device: nvmlDevice_t, minor: *mut c_uint) -> nvmlReturn_t {
    guard(|| out(minor, with_full_gpu(device, |g| Ok(g.minor))?))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(device: nvmlDevice_t, uuid: *mut c_char, length: c_uint) -> nvmlReturn_t {
    guard(|| {
        let text = with_gpu(device, |g, h| match h {
            Handle::MigDevice(_, gi, ci) => Ok(g.mig_uuid(gi, ci)),
            _ => Ok(g.uuid.clone()),
        })?;
        out_str(uuid, length, &text)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(device: nvmlDevice_t, name: *mut c_char, length: c_uint) -> nvmlReturn_t {
    guard(|| out_str(name, length, &with_full_gpu(device, |g| Ok(g.model.name.clone()))?))
}

fn pci_device_id(name: &str) -> u32 {
    match name {
        n if n.contains("H200") => 0x2335_10de,
        n if n.contains("H100") => 0x2330_10de,
        _ => 0x20b0_10de,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(device: nvmlDevice_t, pci: *mut nvmlPciInfo_t) -> nvmlReturn_t {
    guard(|| {
        let (bus_id, name) = with_full_gpu(device, |g| Ok((g.pci_bus_id.clone(), g.model.name.clone())))?;
        let bus = u32::from_str_radix(&bus_id[9..11], 16).map_err(|_| code::UNKNOWN)?;
        let mut info: nvmlPciInfo_t = std::mem::zeroed();
        fill_chars(&mut info.busId, &bus_id);
        fill_chars(&mut info.busIdLegacy, &bus_id[4..]);
        info.bus = bus;
        info.pciDeviceId = pci_device_id(&name);
        info.pciSubSystemId = 0x16c1_10de;
        out(pci, info)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(device: nvmlDevice_t, memory: *mut nvmlMemory_v2_t) -> nvmlReturn_t {
    guard(|| {
        if memory.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        let (total, reserved, used) = with_full_gpu(device, |g| {
            let used: u64 = g.processes.iter().map(|p| p.used_mib).sum();
            Ok((g.model.memory_total_mib, g.model.memory_reserved_mib, used))
        })?;
        let mib = 1024 * 1024;
        let m = &mut *memory;
        m.total = total * mib;
        m.reserved = reserved * mib;
        m.used = used * mib;
        m.free = (total - reserved).saturating_sub(used) * mib;
        Ok(())
    })
}

/// The v1 query (total/free/used, no reserved field), which the checkpoint
/// core's minimal NVML loads. Free memory is what the v2 query reports.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory: *mut nvmlMemory_t) -> nvmlReturn_t {
    if memory.is_null() {
        return code::INVALID_ARGUMENT;
    }
    let mut v2: nvmlMemory_v2_t = std::mem::zeroed();
    let ret = nvmlDeviceGetMemoryInfo_v2(device, &mut v2);
    if ret == code::SUCCESS {
        let m = &mut *memory;
        m.total = v2.total;
        m.free = v2.free;
        m.used = v2.used;
    }
    ret
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(device: nvmlDevice_t, major: *mut c_int, minor: *mut c_int) -> nvmlReturn_t {
    guard(|| {
        let [ma, mi] = with_full_gpu(device, |g| Ok(g.model.compute_capability))?;
        out(major, ma)?;
        out(minor, mi)
    })
}

// ---- modes -------------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeMode(device: nvmlDevice_t, mode: *mut nvmlComputeMode_t) -> nvmlReturn_t {
    guard(|| out(mode, with_full_gpu(device, |g| Ok(g.compute_mode))?))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceSetComputeMode(device: nvmlDevice_t, mode: nvmlComputeMode_t) -> nvmlReturn_t {
    guard(|| with_full_gpu(device, |g| g.set_compute_mode(mode)))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPersistenceMode(device: nvmlDevice_t, mode: *mut nvmlEnableState_t) -> nvmlReturn_t {
    guard(|| out(mode, with_full_gpu(device, |g| Ok(g.persistence as nvmlEnableState_t))?))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(device: nvmlDevice_t, current: *mut c_uint, pending: *mut c_uint) -> nvmlReturn_t {
    guard(|| {
        let (c, p) = with_full_gpu(device, |g| {
            if g.model.mig_capable() {
                Ok((g.mig_current as c_uint, g.mig_pending as c_uint))
            } else {
                Err(code::NOT_SUPPORTED)
            }
        })?;
        out(current, c)?;
        out(pending, p)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceSetMigMode(device: nvmlDevice_t, mode: c_uint, activation: *mut nvmlReturn_t) -> nvmlReturn_t {
    guard(|| {
        if mode > 1 {
            return Err(code::INVALID_ARGUMENT);
        }
        let status = with_full_gpu(device, |g| g.set_mig_mode(mode == 1))?;
        out(activation, status)
    })
}

// ---- MIG -----------------------------------------------------------------------------

const GPU_PROFILE_INFO_V2: u32 = (std::mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>() as u32) | (2 << 24);

fn profile_of(g: &GpuState, profile: c_uint) -> Result<crate::model::MigProfile, NvmlCode> {
    if !g.model.mig_capable() || profile >= NVML_GPU_INSTANCE_PROFILE_COUNT {
        return Err(if profile >= NVML_GPU_INSTANCE_PROFILE_COUNT { code::INVALID_ARGUMENT } else { code::NOT_SUPPORTED });
    }
    g.model.profile_by_enum(profile).cloned().ok_or(code::NOT_SUPPORTED)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(
    device: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_t,
) -> nvmlReturn_t {
    guard(|| {
        let p = with_full_gpu(device, |g| profile_of(g, profile))?;
        let mut i: nvmlGpuInstanceProfileInfo_t = std::mem::zeroed();
        i.id = p.id;
        i.sliceCount = p.slices;
        i.instanceCount = p.instance_count;
        i.multiprocessorCount = p.sms;
        i.copyEngineCount = p.copy_engines;
        i.memorySizeMB = p.memory_mb;
        out(info, i)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoV(
    device: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_v2_t,
) -> nvmlReturn_t {
    guard(|| {
        if info.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        if (*info).version != GPU_PROFILE_INFO_V2 {
            return Err(nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let p = with_full_gpu(device, |g| profile_of(g, profile))?;
        let i = &mut *info;
        i.id = p.id;
        i.sliceCount = p.slices;
        i.instanceCount = p.instance_count;
        i.multiprocessorCount = p.sms;
        i.copyEngineCount = p.copy_engines;
        i.memorySizeMB = p.memory_mb;
        fill_chars(&mut i.name, &format!("MIG {}", p.name));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    device: nvmlDevice_t,
    profile_id: c_uint,
    placements: *mut nvmlGpuInstancePlacement_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        // NVML lists every placement of the profile, taken or not.
        let list: Vec<nvmlGpuInstancePlacement_t> = with_full_gpu(device, |g| {
            let p = g.model.profile_by_id(profile_id).ok_or(code::INVALID_ARGUMENT)?;
            Ok(p.placement_starts.iter().map(|&s| nvmlGpuInstancePlacement_t { start: s, size: p.placement_size }).collect())
        })?;
        if placements.is_null() {
            return out(count, list.len() as c_uint);
        }
        out_list(count, placements, &list)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceRemainingCapacity(device: nvmlDevice_t, profile_id: c_uint, count: *mut c_uint) -> nvmlReturn_t {
    guard(|| {
        let n = with_full_gpu(device, |g| {
            // Count by creating on a scratch copy until the GPU is full.
            let mut scratch = g.clone();
            let mut n = 0;
            while scratch.create_gpu_instance(profile_id, None).is_ok() {
                n += 1;
            }
            Ok(n)
        })?;
        out(count, n)
    })
}

unsafe fn create_gi(device: nvmlDevice_t, profile_id: c_uint, start: Option<u32>, size: Option<u32>, gi: *mut nvmlGpuInstance_t) -> Ret {
    if gi.is_null() {
        return Err(code::INVALID_ARGUMENT);
    }
    let (gpu, id) = with_indexed_gpu(device, |g, index| {
        if let (Some(size), Some(p)) = (size, g.model.profile_by_id(profile_id)) {
            if size != p.placement_size || start.unwrap_or(0) >= MEMORY_SLICES {
                return Err(code::INVALID_ARGUMENT);
            }
        }
        let id = g.create_gpu_instance(profile_id, start)?;
        Ok((index, id))
    })?;
    out(gi, Handle::GpuInstance(gpu, id).encode() as nvmlGpuInstance_t)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstance(device: nvmlDevice_t, profile_id: c_uint, gi: *mut nvmlGpuInstance_t) -> nvmlReturn_t {
    guard(|| create_gi(device, profile_id, None, None, gi))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstanceWithPlacement(
    device: nvmlDevice_t,
    profile_id: c_uint,
    placement: *const nvmlGpuInstancePlacement_t,
    gi: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    guard(|| {
        let p = placement.as_ref().ok_or(code::INVALID_ARGUMENT)?;
        create_gi(device, profile_id, Some(p.start), Some(p.size), gi)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstances(
    device: nvmlDevice_t,
    profile_id: c_uint,
    gis: *mut nvmlGpuInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        if gis.is_null() || count.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        let list: Vec<nvmlGpuInstance_t> = with_indexed_gpu(device, |g, index| {
            if !g.mig_current {
                return Err(code::NOT_SUPPORTED);
            }
            let ids = g.instances.iter().filter(|gi| gi.profile_id == profile_id);
            Ok(ids.map(|gi| Handle::GpuInstance(index, gi.id).encode() as nvmlGpuInstance_t).collect())
        })?;
        // The caller sizes the array for the profile's instance count.
        std::ptr::copy_nonoverlapping(list.as_ptr(), gis, list.len());
        *count = list.len() as c_uint;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceById(device: nvmlDevice_t, id: c_uint, gi: *mut nvmlGpuInstance_t) -> nvmlReturn_t {
    guard(|| {
        let gpu = with_indexed_gpu(device, |g, index| {
            if !g.mig_current {
                return Err(code::NOT_SUPPORTED);
            }
            g.gpu_instance(id).map_err(|_| code::NOT_FOUND)?;
            Ok(index)
        })?;
        out(gi, Handle::GpuInstance(gpu, id).encode() as nvmlGpuInstance_t)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetInfo(gi: nvmlGpuInstance_t, info: *mut nvmlGpuInstanceInfo_t) -> nvmlReturn_t {
    guard(|| {
        let v = with_gi(gi, |g, gpu, id| {
            let i = g.gpu_instance(id)?;
            Ok(nvmlGpuInstanceInfo_t {
                device: device_handle(Handle::Device(gpu)),
                id,
                profileId: i.profile_id,
                placement: nvmlGpuInstancePlacement_t { start: i.start, size: i.size },
            })
        })?;
        out(info, v)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceDestroy(gi: nvmlGpuInstance_t) -> nvmlReturn_t {
    guard(|| with_gi(gi, |g, _, id| g.destroy_gpu_instance(id)))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
    gi: nvmlGpuInstance_t,
    profile: c_uint,
    eng_profile: c_uint,
    info: *mut nvmlComputeInstanceProfileInfo_t,
) -> nvmlReturn_t {
    guard(|| {
        if eng_profile != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED {
            return Err(code::NOT_SUPPORTED);
        }
        let slices = ci_profile_slices(profile).ok_or(code::INVALID_ARGUMENT)?;
        let v = with_gi(gi, |g, _, id| {
            let i = g.gpu_instance(id)?;
            if slices > i.slices {
                return Err(code::NOT_SUPPORTED);
            }
            let sms = g.model.profile_by_id(i.profile_id).map_or(0, |p| p.sms * slices / i.slices);
            let mut v: nvmlComputeInstanceProfileInfo_t = std::mem::zeroed();
            v.id = profile;
            v.sliceCount = slices;
            v.instanceCount = i.slices / slices;
            v.multiprocessorCount = sms;
            Ok(v)
        })?;
        out(info, v)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstance(
    gi: nvmlGpuInstance_t,
    profile_id: c_uint,
    ci: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    guard(|| {
        if ci.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        let (gpu, gi_id, id) = with_gi(gi, |g, gpu, gi_id| Ok((gpu, gi_id, g.create_compute_instance(gi_id, profile_id)?)))?;
        out(ci, Handle::ComputeInstance(gpu, gi_id, id).encode() as nvmlComputeInstance_t)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstances(
    gi: nvmlGpuInstance_t,
    profile_id: c_uint,
    cis: *mut nvmlComputeInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        if cis.is_null() || count.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        let list: Vec<nvmlComputeInstance_t> = with_gi(gi, |g, gpu, gi_id| {
            let i = g.gpu_instance(gi_id)?;
            let of_profile = i.compute_instances.iter().filter(|c| c.profile_id == profile_id);
            Ok(of_profile.map(|c| Handle::ComputeInstance(gpu, gi_id, c.id).encode() as nvmlComputeInstance_t).collect())
        })?;
        std::ptr::copy_nonoverlapping(list.as_ptr(), cis, list.len());
        *count = list.len() as c_uint;
        Ok(())
    })
}

fn decode_ci(ci: nvmlComputeInstance_t) -> Result<(u32, u32, u32), NvmlCode> {
    match Handle::decode(ci as usize)? {
        Handle::ComputeInstance(gpu, gi, ci) => Ok((gpu, gi, ci)),
        _ => Err(code::INVALID_ARGUMENT),
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlComputeInstanceDestroy(ci: nvmlComputeInstance_t) -> nvmlReturn_t {
    guard(|| {
        let (gpu, gi, ci) = decode_ci(ci)?;
        with_full_gpu(device_handle(Handle::Device(gpu)), |g| g.destroy_compute_instance(gi, ci))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo_v2(ci: nvmlComputeInstance_t, info: *mut nvmlComputeInstanceInfo_t) -> nvmlReturn_t {
    guard(|| {
        let (gpu, gi, ci) = decode_ci(ci)?;
        let v = with_full_gpu(device_handle(Handle::Device(gpu)), |g| {
            let c = g.gpu_instance(gi)?.compute_instances.iter().find(|c| c.id == ci).ok_or(code::INVALID_ARGUMENT)?;
            Ok(nvmlComputeInstanceInfo_t {
                device: device_handle(Handle::Device(gpu)),
                gpuInstance: Handle::GpuInstance(gpu, gi).encode() as nvmlGpuInstance_t,
                id: ci,
                profileId: c.profile_id,
                placement: nvmlComputeInstancePlacement_t { start: 0, size: c.slices },
            })
        })?;
        out(info, v)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(device: nvmlDevice_t, count: *mut c_uint) -> nvmlReturn_t {
    guard(|| out(count, with_full_gpu(device, |g| Ok(if g.model.mig_capable() { 7 } else { 0 }))?))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(device: nvmlDevice_t, index: c_uint, mig: *mut nvmlDevice_t) -> nvmlReturn_t {
    guard(|| {
        let (gpu, (gi, ci)) = with_indexed_gpu(device, |g, gpu| {
            if !g.mig_current {
                return Err(code::NOT_SUPPORTED);
            }
            Ok((gpu, *g.mig_devices().get(index as usize).ok_or(code::NOT_FOUND)?))
        })?;
        out(mig, device_handle(Handle::MigDevice(gpu, gi, ci)))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(device: nvmlDevice_t, is_mig: *mut c_uint) -> nvmlReturn_t {
    guard(|| out(is_mig, matches!(Handle::decode(device as usize)?, Handle::MigDevice(..)) as c_uint))
}

fn mig_ids(device: nvmlDevice_t) -> Result<(u32, u32), NvmlCode> {
    match Handle::decode(device as usize)? {
        Handle::MigDevice(_, gi, ci) => Ok((gi, ci)),
        _ => Err(code::NOT_SUPPORTED),
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(device: nvmlDevice_t, id: *mut c_uint) -> nvmlReturn_t {
    guard(|| out(id, mig_ids(device)?.0))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(device: nvmlDevice_t, id: *mut c_uint) -> nvmlReturn_t {
    guard(|| out(id, mig_ids(device)?.1))
}

// ---- health --------------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: nvmlDevice_t,
    error_type: nvmlMemoryErrorType_t,
    counter: nvmlEccCounterType_t,
    count: *mut c_ulonglong,
) -> nvmlReturn_t {
    guard(|| {
        let v = with_full_gpu(device, |g| {
            let h = &g.health;
            match (error_type, counter) {
                (UNCORRECTED, VOLATILE) => Ok(h.ecc_volatile),
                (UNCORRECTED, AGGREGATE) => Ok(h.ecc_aggregate),
                (CORRECTED, VOLATILE | AGGREGATE) => Ok(0),
                _ => Err(code::INVALID_ARGUMENT),
            }
        })?;
        out(count, v)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages_v2(
    device: nvmlDevice_t,
    cause: nvmlPageRetirementCause_t,
    count: *mut c_uint,
    addresses: *mut c_ulonglong,
    timestamps: *mut c_ulonglong,
) -> nvmlReturn_t {
    guard(|| {
        let n = with_full_gpu(device, |g| match g.model.page_retirement {
            false => Err(code::NOT_SUPPORTED),
            true => Ok(if cause == RETIRED_FOR_DBE { g.health.retired_pages } else { 0 }),
        })?;
        let addrs: Vec<c_ulonglong> = (0..n as u64).map(|i| 0x1000_0000 + i * 0x1000).collect();
        let times: Vec<c_ulonglong> = (0..n as u64).map(|i| 1_763_700_000_000_000 + i).collect();
        let room = if count.is_null() { 0 } else { *count };
        out_list(count, addresses, &addrs)?;
        if !timestamps.is_null() {
            *count = room;
            out_list(count, timestamps, &times)?;
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages(
    device: nvmlDevice_t,
    cause: nvmlPageRetirementCause_t,
    count: *mut c_uint,
    addresses: *mut c_ulonglong,
) -> nvmlReturn_t {
    nvmlDeviceGetRetiredPages_v2(device, cause, count, addresses, std::ptr::null_mut())
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPagesPendingStatus(device: nvmlDevice_t, pending: *mut nvmlEnableState_t) -> nvmlReturn_t {
    guard(|| {
        let v = with_full_gpu(device, |g| match g.model.page_retirement {
            false => Err(code::NOT_SUPPORTED),
            true => Ok(g.health.retired_pending as nvmlEnableState_t),
        })?;
        out(pending, v)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    device: nvmlDevice_t,
    corr: *mut c_uint,
    unc: *mut c_uint,
    pending: *mut c_uint,
    failure: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let h = with_full_gpu(device, |g| Ok(g.health.clone()))?;
        out(corr, h.remapped_correctable)?;
        out(unc, h.remapped_uncorrectable)?;
        out(pending, h.remap_pending as c_uint)?;
        out(failure, h.remap_failed as c_uint)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksEventReasons(device: nvmlDevice_t, reasons: *mut c_ulonglong) -> nvmlReturn_t {
    guard(|| out(reasons, with_full_gpu(device, |g| Ok(g.clocks_event_reasons()))?))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(device: nvmlDevice_t, reasons: *mut c_ulonglong) -> nvmlReturn_t {
    nvmlDeviceGetCurrentClocksEventReasons(device, reasons)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(device: nvmlDevice_t, sensor: nvmlTemperatureSensors_t, temp: *mut c_uint) -> nvmlReturn_t {
    guard(|| {
        if sensor != SENSOR_GPU {
            return Err(code::INVALID_ARGUMENT);
        }
        out(temp, with_full_gpu(device, |g| Ok(g.temperature()))?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperatureThreshold(
    device: nvmlDevice_t,
    kind: nvmlTemperatureThresholds_t,
    temp: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let v = with_full_gpu(device, |g| match kind {
            THRESHOLD_SHUTDOWN => Ok(g.model.shutdown_temp_c),
            THRESHOLD_SLOWDOWN => Ok(g.model.slowdown_temp_c),
            _ => Err(code::NOT_SUPPORTED),
        })?;
        out(temp, v)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(device: nvmlDevice_t, power: *mut c_uint) -> nvmlReturn_t {
    guard(|| out(power, with_full_gpu(device, |g| Ok(g.model.power_usage_mw))?))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEnforcedPowerLimit(device: nvmlDevice_t, limit: *mut c_uint) -> nvmlReturn_t {
    guard(|| out(limit, with_full_gpu(device, |g| Ok(g.model.power_limit_mw))?))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkGeneration(device: nvmlDevice_t, v: *mut c_uint) -> nvmlReturn_t {
    guard(|| out(v, with_full_gpu(device, |g| Ok(g.model.pcie_max_gen))?))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkGeneration(device: nvmlDevice_t, v: *mut c_uint) -> nvmlReturn_t {
    guard(|| out(v, with_full_gpu(device, |g| Ok(g.model.pcie_max_gen))?))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkWidth(device: nvmlDevice_t, v: *mut c_uint) -> nvmlReturn_t {
    guard(|| out(v, with_full_gpu(device, |g| Ok(g.pcie_width()))?))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkWidth(device: nvmlDevice_t, v: *mut c_uint) -> nvmlReturn_t {
    guard(|| out(v, with_full_gpu(device, |g| Ok(g.model.pcie_max_width))?))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPcieReplayCounter(device: nvmlDevice_t, v: *mut c_uint) -> nvmlReturn_t {
    guard(|| out(v, with_full_gpu(device, |g| Ok(g.health.pcie_replays))?))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfo(device: nvmlDevice_t, info: *mut nvmlGpuFabricInfo_t) -> nvmlReturn_t {
    guard(|| {
        let state = with_full_gpu(device, |g| g.model.fabric_state.ok_or(code::NOT_SUPPORTED))?;
        let mut v: nvmlGpuFabricInfo_t = std::mem::zeroed();
        v.state = state;
        v.status = code::SUCCESS;
        out(info, v)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    guard(|| {
        let list: Vec<nvmlProcessInfo_t> = with_full_gpu(device, |g| {
            Ok(g.processes
                .iter()
                .map(|p| nvmlProcessInfo_t {
                    pid: p.pid,
                    usedGpuMemory: p.used_mib * 1024 * 1024,
                    gpuInstanceId: p.gpu_instance.unwrap_or(u32::MAX),
                    computeInstanceId: p.compute_instance.unwrap_or(u32::MAX),
                })
                .collect())
        })?;
        out_list(count, infos, &list)
    })
}

// ---- events ------------------------------------------------------------------------------
// Event sets live in the calling process, as NVML's do; the events themselves
// come from the shared state, so an XID injected by nvml-sim-ctl reaches them.

const SUPPORTED_EVENTS: u64 = (nvmlEventTypeSingleBitEccError
    | nvmlEventTypeDoubleBitEccError
    | nvmlEventTypePState
    | nvmlEventTypeXidCriticalError
    | nvmlEventTypeClock) as u64;

#[derive(Default)]
struct EventSet {
    /// GPU index → registered event mask.
    registered: HashMap<u32, u64>,
    /// Events with a larger sequence number are new to this set.
    cursor: u64,
    delivered_recurring: BTreeSet<u64>,
}

static EVENT_SETS: Mutex<Option<HashMap<usize, EventSet>>> = Mutex::new(None);
static NEXT_SET: Mutex<usize> = Mutex::new(1);

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    guard(|| {
        let cursor = with_node(|n| Ok(n.next_event_seq - 1))?;
        let id = {
            let mut next = lock(&NEXT_SET);
            *next += 1;
            *next
        };
        lock(&EVENT_SETS).get_or_insert_with(HashMap::new).insert(id, EventSet { cursor, ..EventSet::default() });
        out(set, id as nvmlEventSet_t)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> nvmlReturn_t {
    guard(|| {
        let removed = lock(&EVENT_SETS).get_or_insert_with(HashMap::new).remove(&(set as usize));
        removed.map(|_| ()).ok_or(code::INVALID_ARGUMENT)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(device: nvmlDevice_t, types: *mut c_ulonglong) -> nvmlReturn_t {
    guard(|| out(types, with_full_gpu(device, |_| Ok(SUPPORTED_EVENTS))?))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(device: nvmlDevice_t, types: c_ulonglong, set: nvmlEventSet_t) -> nvmlReturn_t {
    guard(|| {
        if types & !SUPPORTED_EVENTS != 0 {
            return Err(code::NOT_SUPPORTED);
        }
        let gpu = with_indexed_gpu(device, |_, index| Ok(index))?;
        let mut sets = lock(&EVENT_SETS);
        let s = sets.get_or_insert_with(HashMap::new).get_mut(&(set as usize)).ok_or(code::INVALID_ARGUMENT)?;
        *s.registered.entry(gpu).or_insert(0) |= types;
        Ok(())
    })
}

/// The next XID for `set`, if one is waiting; marks it delivered.
fn next_event(set: usize) -> Result<Option<(u32, u64)>, NvmlCode> {
    let events = with_node(|n| Ok(n.events.clone()))?;
    let mut sets = lock(&EVENT_SETS);
    let s = sets.get_or_insert_with(HashMap::new).get_mut(&set).ok_or(code::INVALID_ARGUMENT)?;
    let wanted = |gpu: u32| s.registered.get(&gpu).is_some_and(|m| m & nvmlEventTypeXidCriticalError as u64 != 0);
    let found = events.iter().find(|e| {
        wanted(e.gpu) && (e.seq > s.cursor || (e.recurring && !s.delivered_recurring.contains(&e.seq)))
    });
    let Some(e) = found else { return Ok(None) };
    if e.recurring {
        s.delivered_recurring.insert(e.seq);
    } else {
        s.cursor = e.seq;
    }
    Ok(Some((e.gpu, e.xid)))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait_v2(set: nvmlEventSet_t, data: *mut nvmlEventData_t, timeout_ms: c_uint) -> nvmlReturn_t {
    guard(|| {
        if data.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        let deadline = Instant::now() + Duration::from_millis(timeout_ms as u64);
        loop {
            if let Some((gpu, xid)) = next_event(set as usize)? {
                return out(
                    data,
                    nvmlEventData_t {
                        device: device_handle(Handle::Device(gpu)),
                        eventType: nvmlEventTypeXidCriticalError as u64,
                        eventData: xid,
                        gpuInstanceId: u32::MAX,
                        computeInstanceId: u32::MAX,
                    },
                );
            }
            if Instant::now() >= deadline {
                return Err(code::TIMEOUT);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Compile-time check that every export has exactly the type nvml-wrapper-sys
    /// loads it as: `same` takes the loaded symbol's type from the first
    /// argument and requires the export to coerce to it.
    #[allow(dead_code, unused_must_use)]
    fn signatures_match_nvml_wrapper_sys(lib: &NvmlLib) {
        fn same<T, E>(_: &Result<T, E>, _: T) {}
        macro_rules! check {
            ($($f:ident),* $(,)?) => { $( same(&lib.$f, $f); )* };
        }
        check!(
            nvmlInit_v2, nvmlInitWithFlags, nvmlShutdown, nvmlErrorString, nvmlSystemGetDriverVersion,
            nvmlSystemGetNVMLVersion, nvmlSystemGetCudaDriverVersion_v2, nvmlSystemGetCudaDriverVersion,
            nvmlDeviceGetCount_v2, nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetIndex, nvmlDeviceGetMinorNumber,
            nvmlDeviceGetUUID, nvmlDeviceGetName, nvmlDeviceGetPciInfo_v3, nvmlDeviceGetMemoryInfo_v2, nvmlDeviceGetMemoryInfo,
            nvmlDeviceGetCudaComputeCapability, nvmlDeviceGetComputeMode, nvmlDeviceSetComputeMode,
            nvmlDeviceGetPersistenceMode, nvmlDeviceGetMigMode, nvmlDeviceSetMigMode,
            nvmlDeviceGetGpuInstanceProfileInfo, nvmlDeviceGetGpuInstanceProfileInfoV,
            nvmlDeviceGetGpuInstancePossiblePlacements_v2, nvmlDeviceGetGpuInstanceRemainingCapacity,
            nvmlDeviceCreateGpuInstance, nvmlDeviceCreateGpuInstanceWithPlacement, nvmlDeviceGetGpuInstances,
            nvmlDeviceGetGpuInstanceById, nvmlGpuInstanceGetInfo, nvmlGpuInstanceDestroy,
            nvmlGpuInstanceGetComputeInstanceProfileInfo, nvmlGpuInstanceCreateComputeInstance,
            nvmlGpuInstanceGetComputeInstances, nvmlComputeInstanceDestroy, nvmlComputeInstanceGetInfo_v2,
            nvmlDeviceGetMaxMigDeviceCount, nvmlDeviceGetMigDeviceHandleByIndex, nvmlDeviceIsMigDeviceHandle,
            nvmlDeviceGetGpuInstanceId, nvmlDeviceGetComputeInstanceId, nvmlDeviceGetTotalEccErrors,
            nvmlDeviceGetRetiredPages_v2, nvmlDeviceGetRetiredPages, nvmlDeviceGetRetiredPagesPendingStatus, nvmlDeviceGetRemappedRows,
            nvmlDeviceGetCurrentClocksEventReasons, nvmlDeviceGetCurrentClocksThrottleReasons,
            nvmlDeviceGetTemperature, nvmlDeviceGetTemperatureThreshold, nvmlDeviceGetPowerUsage,
            nvmlDeviceGetEnforcedPowerLimit, nvmlDeviceGetCurrPcieLinkGeneration, nvmlDeviceGetMaxPcieLinkGeneration,
            nvmlDeviceGetCurrPcieLinkWidth, nvmlDeviceGetMaxPcieLinkWidth, nvmlDeviceGetPcieReplayCounter,
            nvmlDeviceGetGpuFabricInfo, nvmlDeviceGetComputeRunningProcesses_v3, nvmlEventSetCreate,
            nvmlEventSetFree, nvmlDeviceGetSupportedEventTypes, nvmlDeviceRegisterEvents, nvmlEventSetWait_v2,
        );
    }

    #[test]
    fn handles_round_trip() {
        for h in [Handle::Device(3), Handle::MigDevice(7, 2, 1), Handle::GpuInstance(0, 13), Handle::ComputeInstance(5, 1, 0)] {
            assert_eq!(Handle::decode(h.encode()), Ok(h));
        }
        assert_eq!(Handle::decode(0), Err(code::INVALID_ARGUMENT));
    }

    #[test]
    fn a_panic_becomes_an_error_code() {
        assert_eq!(guard(|| panic!("boom")), code::UNKNOWN);
    }

    #[test]
    fn calls_before_init_are_uninitialized() {
        let mut n = 0;
        // SAFETY: valid out pointer.
        assert_eq!(unsafe { nvmlDeviceGetCount_v2(&mut n) }, code::UNINITIALIZED);
    }
}
