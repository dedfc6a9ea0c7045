//! Calls nvml-wrapper does not wrap (GPU/compute instances, placements v2,
//! profile info v2, remapped rows, fabric info, MIG device ids), made through
//! nvml-wrapper-sys's symbols of the library nvml-wrapper loaded.
//!
//! nvml-wrapper-sys's own methods `expect` the symbol and so panic when a
//! driver lacks it; here every symbol is looked up first and a missing one is
//! a [`GpuError::MissingSymbol`].

use super::error::{check, GpuError};
use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings::*;
use std::ffi::{c_uint, CStr};
use std::mem::zeroed;

/// The loaded function, or MissingSymbol naming it.
fn sym<'a, F>(loaded: &'a Result<F, impl Sized>, call: &'static str) -> Result<&'a F, GpuError> {
    loaded.as_ref().map_err(|_| GpuError::MissingSymbol { call })
}

/// Wraps one raw NVML call: `$f` is the NvmlLib field, the rest its arguments.
macro_rules! call {
    ($nvml:expr, $gpu:expr, $f:ident($($arg:expr),*)) => {{
        let f = sym(&$nvml.lib().$f, stringify!($f))?;
        // SAFETY: the symbol has NVML's signature (nvml-wrapper-sys's
        // bindings) and every pointer argument points to live, sized storage.
        check(stringify!($f), $gpu, unsafe { f($($arg),*) })
    }};
}

pub struct GpuInstanceRaw {
    pub handle: nvmlGpuInstance_t,
    pub id: u32,
    pub profile_id: u32,
    pub start: u32,
    pub size: u32,
}

pub struct ProfileRaw {
    pub id: u32,
    pub name: Option<String>,
    pub slices: u32,
    pub instance_count: u32,
    pub memory_mb: u64,
    pub sms: u32,
    pub copy_engines: u32,
}

/// Profile info v2 (has the name); `Ok(None)` when the driver lacks the call,
/// so the caller can fall back to nvml-wrapper's v1.
pub fn profile_info_v2(nvml: &Nvml, dev: nvmlDevice_t, gpu: u32, profile: u32) -> Result<Option<ProfileRaw>, GpuError> {
    if nvml.lib().nvmlDeviceGetGpuInstanceProfileInfoV.is_err() {
        return Ok(None);
    }
    // SAFETY: a plain C struct; all-zero is valid.
    let mut info: nvmlGpuInstanceProfileInfo_v2_t = unsafe { zeroed() };
    info.version = (std::mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>() as u32) | (2 << 24);
    call!(nvml, Some(gpu), nvmlDeviceGetGpuInstanceProfileInfoV(dev, profile, &mut info))?;
    // SAFETY: NVML NUL-terminates the name inside the array; zeroed otherwise.
    let name = unsafe { CStr::from_ptr(info.name.as_ptr()) }.to_string_lossy();
    Ok(Some(ProfileRaw {
        id: info.id,
        name: Some(name.trim_start_matches("MIG ").to_string()).filter(|n| !n.is_empty()),
        slices: info.sliceCount,
        instance_count: info.instanceCount,
        memory_mb: info.memorySizeMB,
        sms: info.multiprocessorCount,
        copy_engines: info.copyEngineCount,
    }))
}

/// Every placement of a profile, taken or not: (start, size) in memory slices.
pub fn possible_placements(nvml: &Nvml, dev: nvmlDevice_t, gpu: u32, profile_id: u32) -> Result<Vec<(u32, u32)>, GpuError> {
    let mut list = [nvmlGpuInstancePlacement_t { start: 0, size: 0 }; 16];
    let mut count = list.len() as c_uint;
    call!(nvml, Some(gpu), nvmlDeviceGetGpuInstancePossiblePlacements_v2(dev, profile_id, list.as_mut_ptr(), &mut count))?;
    Ok(list.iter().take(count as usize).map(|p| (p.start, p.size)).collect())
}

pub fn gpu_instances(nvml: &Nvml, dev: nvmlDevice_t, gpu: u32, profile_id: u32) -> Result<Vec<GpuInstanceRaw>, GpuError> {
    let mut handles: [nvmlGpuInstance_t; 8] = [std::ptr::null_mut(); 8];
    let mut count: c_uint = handles.len() as c_uint;
    call!(nvml, Some(gpu), nvmlDeviceGetGpuInstances(dev, profile_id, handles.as_mut_ptr(), &mut count))?;
    handles.iter().take(count as usize).map(|&h| gpu_instance_info(nvml, h, gpu)).collect()
}

pub fn gpu_instance_info(nvml: &Nvml, gi: nvmlGpuInstance_t, gpu: u32) -> Result<GpuInstanceRaw, GpuError> {
    // SAFETY: a plain C struct; all-zero is valid.
    let mut info: nvmlGpuInstanceInfo_t = unsafe { zeroed() };
    call!(nvml, Some(gpu), nvmlGpuInstanceGetInfo(gi, &mut info))?;
    Ok(GpuInstanceRaw {
        handle: gi,
        id: info.id,
        profile_id: info.profileId,
        start: info.placement.start,
        size: info.placement.size,
    })
}

pub fn gpu_instance_by_id(nvml: &Nvml, dev: nvmlDevice_t, gpu: u32, id: u32) -> Result<nvmlGpuInstance_t, GpuError> {
    let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
    call!(nvml, Some(gpu), nvmlDeviceGetGpuInstanceById(dev, id, &mut gi))?;
    Ok(gi)
}

pub fn create_gpu_instance(nvml: &Nvml, dev: nvmlDevice_t, gpu: u32, profile_id: u32, start: u32, size: u32) -> Result<nvmlGpuInstance_t, GpuError> {
    let placement = nvmlGpuInstancePlacement_t { start, size };
    let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
    call!(nvml, Some(gpu), nvmlDeviceCreateGpuInstanceWithPlacement(dev, profile_id, &placement, &mut gi))?;
    Ok(gi)
}

pub fn destroy_gpu_instance(nvml: &Nvml, gi: nvmlGpuInstance_t, gpu: u32) -> Result<(), GpuError> {
    call!(nvml, Some(gpu), nvmlGpuInstanceDestroy(gi))
}

/// Compute-instance profile (id, slices) for NVML_COMPUTE_INSTANCE_PROFILE_* `profile`.
pub fn compute_profile(nvml: &Nvml, gi: nvmlGpuInstance_t, gpu: u32, profile: u32) -> Result<(u32, u32), GpuError> {
    // SAFETY: a plain C struct; all-zero is valid.
    let mut info: nvmlComputeInstanceProfileInfo_t = unsafe { zeroed() };
    call!(nvml, Some(gpu), nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, profile, NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, &mut info))?;
    Ok((info.id, info.sliceCount))
}

pub fn create_compute_instance(nvml: &Nvml, gi: nvmlGpuInstance_t, gpu: u32, profile_id: u32) -> Result<nvmlComputeInstance_t, GpuError> {
    let mut ci: nvmlComputeInstance_t = std::ptr::null_mut();
    call!(nvml, Some(gpu), nvmlGpuInstanceCreateComputeInstance(gi, profile_id, &mut ci))?;
    Ok(ci)
}

/// Compute instances of one CI profile id: (handle, CI id).
pub fn compute_instances(nvml: &Nvml, gi: nvmlGpuInstance_t, gpu: u32, profile_id: u32) -> Result<Vec<(nvmlComputeInstance_t, u32)>, GpuError> {
    let mut handles: [nvmlComputeInstance_t; 8] = [std::ptr::null_mut(); 8];
    let mut count: c_uint = handles.len() as c_uint;
    call!(nvml, Some(gpu), nvmlGpuInstanceGetComputeInstances(gi, profile_id, handles.as_mut_ptr(), &mut count))?;
    let mut out = Vec::new();
    for &ci in handles.iter().take(count as usize) {
        // SAFETY: a plain C struct; all-zero is valid.
        let mut info: nvmlComputeInstanceInfo_t = unsafe { zeroed() };
        call!(nvml, Some(gpu), nvmlComputeInstanceGetInfo_v2(ci, &mut info))?;
        out.push((ci, info.id));
    }
    Ok(out)
}

pub fn destroy_compute_instance(nvml: &Nvml, ci: nvmlComputeInstance_t, gpu: u32) -> Result<(), GpuError> {
    call!(nvml, Some(gpu), nvmlComputeInstanceDestroy(ci))
}

/// (GPU instance id, compute instance id) of a MIG device handle.
pub fn mig_device_ids(nvml: &Nvml, mig: nvmlDevice_t, gpu: u32) -> Result<(u32, u32), GpuError> {
    let (mut gi, mut ci) = (0, 0);
    call!(nvml, Some(gpu), nvmlDeviceGetGpuInstanceId(mig, &mut gi))?;
    call!(nvml, Some(gpu), nvmlDeviceGetComputeInstanceId(mig, &mut ci))?;
    Ok((gi, ci))
}

/// (correctable, uncorrectable, pending, failed) remapped rows.
pub fn remapped_rows(nvml: &Nvml, dev: nvmlDevice_t, gpu: u32) -> Result<(u32, u32, bool, bool), GpuError> {
    let (mut corr, mut unc, mut pending, mut failed) = (0, 0, 0, 0);
    call!(nvml, Some(gpu), nvmlDeviceGetRemappedRows(dev, &mut corr, &mut unc, &mut pending, &mut failed))?;
    Ok((corr, unc, pending != 0, failed != 0))
}

/// NVML_GPU_FABRIC_STATE_* and the fabric status code.
pub fn fabric_state(nvml: &Nvml, dev: nvmlDevice_t, gpu: u32) -> Result<(u8, u32), GpuError> {
    // SAFETY: a plain C struct; all-zero is valid.
    let mut info: nvmlGpuFabricInfo_t = unsafe { zeroed() };
    call!(nvml, Some(gpu), nvmlDeviceGetGpuFabricInfo(dev, &mut info))?;
    Ok((info.state, info.status))
}
