//! MIG: the profile table, possible placements, existing GPU and compute
//! instances with their MIG device UUIDs, and creating/destroying instances.
//!
//! NVML's create call takes a profile's *id* (e.g. 9 for 3g.40gb on an H100),
//! not the NVML_GPU_INSTANCE_PROFILE_* enum it is queried by; both are kept.

use super::error::{ErrorKind, GpuLabel};
use super::modes::Applied;
use super::{raw, wrap, GpuError, GpuOps, NvmlGpus};
use nvml_wrapper_sys::bindings::{nvmlGpuInstance_t, NVML_COMPUTE_INSTANCE_PROFILE_COUNT, NVML_GPU_INSTANCE_PROFILE_COUNT};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigProfile {
    /// NVML_GPU_INSTANCE_PROFILE_* value the profile was queried by.
    pub profile: u32,
    /// The id create and list take.
    pub id: u32,
    /// NVIDIA's name without the "MIG " prefix, e.g. "3g.71gb".
    pub name: String,
    pub slices: u32,
    pub instance_count: u32,
    pub memory_mb: u64,
    pub sms: u32,
    pub copy_engines: u32,
    /// Memory-slice start offsets where an instance may be placed.
    pub placement_starts: Vec<u32>,
    pub placement_size: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComputeInstance {
    pub id: u32,
    pub profile_id: u32,
    /// `MIG-...`, what CUDA_VISIBLE_DEVICES takes.
    pub uuid: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigInstance {
    pub gpu_instance: u32,
    pub profile_id: u32,
    pub placement_start: u32,
    pub placement_size: u32,
    pub compute_instances: Vec<ComputeInstance>,
}

pub use crate::config::MigInstanceSetting;

fn refused(gpu: u32, detail: String) -> GpuError {
    GpuError::Refused { gpu: GpuLabel(Some(gpu)), detail }
}

/// Gives `gpu` instances of `profile_ids` (largest first, so small ones do not
/// block a large one's only placement). With `Leave`, succeeds only if the
/// instances already there are exactly those profiles. On a failed create,
/// the instances made so far are destroyed again.
pub fn apply_mig_layout(ops: &dyn GpuOps, gpu: u32, setting: MigInstanceSetting, profile_ids: &[u32]) -> Result<Vec<MigInstance>, GpuError> {
    let existing = ops.mig_instances(gpu)?;
    if setting == MigInstanceSetting::Leave {
        let mut have: Vec<u32> = existing.iter().map(|i| i.profile_id).collect();
        let mut want = profile_ids.to_vec();
        have.sort_unstable();
        want.sort_unstable();
        return if have == want {
            Ok(existing)
        } else {
            Err(refused(gpu, format!("MIG profiles {have:?} present, {want:?} wanted, and [gpu] mig_instances = \"leave\"")))
        };
    }
    let profiles = ops.mig_profiles(gpu)?;
    let slices = |id: &u32| profiles.iter().find(|p| p.id == *id).map_or(0, |p| p.slices);
    let mut order = profile_ids.to_vec();
    order.sort_by_key(|id| std::cmp::Reverse(slices(id)));
    let mut made = Vec::new();
    for id in order {
        match ops.create_mig_instance(gpu, id, None) {
            Ok(i) => made.push(i),
            Err(e) => {
                for i in &made {
                    let _ = ops.destroy_mig_instance(gpu, i.gpu_instance);
                }
                return Err(e);
            }
        }
    }
    Ok(made)
}

/// Destroys every MIG instance on `gpu` unless `setting` is `Leave`.
/// Returns how many there were.
pub fn clear_mig_instances(ops: &dyn GpuOps, gpu: u32, setting: MigInstanceSetting) -> Result<Applied<usize>, GpuError> {
    if setting == MigInstanceSetting::Leave {
        return Ok(Applied::Left);
    }
    let existing = ops.mig_instances(gpu)?;
    if existing.is_empty() {
        return Ok(Applied::Unchanged);
    }
    for i in &existing {
        ops.destroy_mig_instance(gpu, i.gpu_instance)?;
    }
    Ok(Applied::Changed { from: existing.len(), to: 0 })
}

/// Errors that mean "this profile/CI profile does not exist here": skipped
/// while walking NVML's enum ranges.
fn absent(e: &GpuError) -> bool {
    matches!(e.kind(), Some(ErrorKind::NotSupported | ErrorKind::InvalidArgument | ErrorKind::NotFound))
}

/// A name from slices and memory, for drivers without profile info v2.
fn fallback_name(slices: u32, memory_mb: u64) -> String {
    format!("{slices}g.{}gb", memory_mb.div_ceil(1024))
}

impl NvmlGpus {
    fn raw_device(&self, gpu: u32) -> Result<nvml_wrapper_sys::bindings::nvmlDevice_t, GpuError> {
        // SAFETY: the handle is only passed to NVML calls while `self` lives.
        Ok(unsafe { self.device(gpu)?.handle() })
    }

    fn profile(&self, gpu: u32, profile: u32) -> Result<MigProfile, GpuError> {
        let dev = self.raw_device(gpu)?;
        let info = match raw::profile_info_v2(&self.nvml, dev, gpu, profile)? {
            Some(info) => info,
            None => {
                let i = wrap("nvmlDeviceGetGpuInstanceProfileInfo", gpu, self.device(gpu)?.profile_info(profile))?;
                raw::ProfileRaw {
                    id: i.id,
                    name: None,
                    slices: i.slice_count,
                    instance_count: i.instance_count,
                    memory_mb: i.memory_size_mb,
                    sms: i.multiprocessor_count,
                    copy_engines: i.copy_engine_count,
                }
            }
        };
        let placements = match raw::possible_placements(&self.nvml, dev, gpu, info.id) {
            Err(GpuError::MissingSymbol { .. }) => Vec::new(),
            other => other?,
        };
        Ok(MigProfile {
            profile,
            id: info.id,
            name: info.name.unwrap_or_else(|| fallback_name(info.slices, info.memory_mb)),
            slices: info.slices,
            instance_count: info.instance_count,
            memory_mb: info.memory_mb,
            sms: info.sms,
            copy_engines: info.copy_engines,
            placement_starts: placements.iter().map(|p| p.0).collect(),
            placement_size: placements.first().map_or(0, |p| p.1),
        })
    }

    pub(super) fn read_mig_profiles(&self, gpu: u32) -> Result<Vec<MigProfile>, GpuError> {
        if self.read_modes(gpu)?.mig.is_none() {
            return Ok(Vec::new());
        }
        let mut list = Vec::new();
        for profile in 0..NVML_GPU_INSTANCE_PROFILE_COUNT {
            match self.profile(gpu, profile) {
                Ok(p) => list.push(p),
                Err(e) if absent(&e) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(list)
    }

    /// Compute-instance profiles valid in `gi`: (CI profile id, slices).
    fn compute_profiles(&self, gi: nvmlGpuInstance_t, gpu: u32) -> Result<Vec<(u32, u32)>, GpuError> {
        let mut list = Vec::new();
        for p in 0..NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
            match raw::compute_profile(&self.nvml, gi, gpu, p) {
                Ok(v) => list.push(v),
                Err(e) if absent(&e) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(list)
    }

    /// MIG device UUIDs by (GPU instance id, compute instance id).
    fn mig_uuids(&self, gpu: u32) -> Result<BTreeMap<(u32, u32), String>, GpuError> {
        let d = self.device(gpu)?;
        let max = wrap("nvmlDeviceGetMaxMigDeviceCount", gpu, d.mig_device_count())?;
        let mut map = BTreeMap::new();
        for i in 0..max {
            let mig = match d.mig_device_by_index(i) {
                Ok(m) => m,
                Err(nvml_wrapper::error::NvmlError::NotFound) => continue,
                Err(e) => return Err(GpuError::from_wrapper("nvmlDeviceGetMigDeviceHandleByIndex", Some(gpu), e)),
            };
            // SAFETY: the handle is used while `d` and `self` live.
            let ids = raw::mig_device_ids(&self.nvml, unsafe { mig.handle() }, gpu)?;
            map.insert(ids, wrap("nvmlDeviceGetUUID", gpu, mig.uuid())?);
        }
        Ok(map)
    }

    fn raw_gpu_instances(&self, gpu: u32) -> Result<Vec<raw::GpuInstanceRaw>, GpuError> {
        let dev = self.raw_device(gpu)?;
        let mut all = Vec::new();
        for p in self.read_mig_profiles(gpu)? {
            all.extend(raw::gpu_instances(&self.nvml, dev, gpu, p.id)?);
        }
        all.sort_by_key(|g| g.id);
        Ok(all)
    }

    pub(super) fn read_mig_instances(&self, gpu: u32) -> Result<Vec<MigInstance>, GpuError> {
        if !self.read_modes(gpu)?.mig.is_some_and(|m| m.current) {
            return Ok(Vec::new());
        }
        let uuids = self.mig_uuids(gpu)?;
        let mut list = Vec::new();
        for g in self.raw_gpu_instances(gpu)? {
            let mut cis = Vec::new();
            for (ci_profile, _) in self.compute_profiles(g.handle, gpu)? {
                for (_, id) in raw::compute_instances(&self.nvml, g.handle, gpu, ci_profile)? {
                    cis.push(ComputeInstance { id, profile_id: ci_profile, uuid: uuids.get(&(g.id, id)).cloned() });
                }
            }
            list.push(MigInstance {
                gpu_instance: g.id,
                profile_id: g.profile_id,
                placement_start: g.start,
                placement_size: g.size,
                compute_instances: cis,
            });
        }
        Ok(list)
    }

    /// The first possible placement of `profile` that no existing instance overlaps.
    fn free_placement(&self, gpu: u32, profile: &MigProfile) -> Result<Option<u32>, GpuError> {
        let taken: Vec<(u32, u32)> = self.raw_gpu_instances(gpu)?.iter().map(|g| (g.start, g.start + g.size)).collect();
        let overlaps = |s: u32| taken.iter().any(|&(a, b)| s < b && a < s + profile.placement_size);
        Ok(profile.placement_starts.iter().copied().find(|&s| !overlaps(s)))
    }

    pub(super) fn create_instance(&self, gpu: u32, profile_id: u32, placement: Option<u32>) -> Result<MigInstance, GpuError> {
        let profiles = self.read_mig_profiles(gpu)?;
        let profile = profiles.iter().find(|p| p.id == profile_id).ok_or_else(|| {
            let known: Vec<String> = profiles.iter().map(|p| format!("{} (id {})", p.name, p.id)).collect();
            refused(gpu, format!("no MIG profile with id {profile_id}; this GPU has {}", known.join(", ")))
        })?;
        let start = match placement {
            Some(s) if !profile.placement_starts.contains(&s) => {
                return Err(refused(gpu, format!("{} cannot start at slice {s}; allowed: {:?}", profile.name, profile.placement_starts)))
            }
            Some(s) => s,
            None => self.free_placement(gpu, profile)?.ok_or(GpuError::Nvml {
                call: "nvmlDeviceCreateGpuInstanceWithPlacement",
                gpu: GpuLabel(Some(gpu)),
                kind: ErrorKind::InsufficientResources,
            })?,
        };
        let dev = self.raw_device(gpu)?;
        let gi = raw::create_gpu_instance(&self.nvml, dev, gpu, profile_id, start, profile.placement_size)?;
        if let Err(e) = self.fill_with_compute_instance(gi, gpu, profile.slices) {
            let _ = raw::destroy_gpu_instance(&self.nvml, gi, gpu);
            return Err(e);
        }
        let id = raw::gpu_instance_info(&self.nvml, gi, gpu)?.id;
        let found = self.read_mig_instances(gpu)?.into_iter().find(|i| i.gpu_instance == id);
        found.ok_or_else(|| refused(gpu, format!("GPU instance {id} vanished right after its creation")))
    }

    /// One compute instance spanning the whole GPU instance.
    fn fill_with_compute_instance(&self, gi: nvmlGpuInstance_t, gpu: u32, slices: u32) -> Result<(), GpuError> {
        let profiles = self.compute_profiles(gi, gpu)?;
        let (ci_profile, _) = profiles
            .into_iter()
            .find(|&(_, s)| s == slices)
            .ok_or_else(|| refused(gpu, format!("no compute-instance profile of {slices} slices")))?;
        raw::create_compute_instance(&self.nvml, gi, gpu, ci_profile).map(|_| ())
    }

    pub(super) fn destroy_instance(&self, gpu: u32, gpu_instance: u32) -> Result<(), GpuError> {
        let gi = raw::gpu_instance_by_id(&self.nvml, self.raw_device(gpu)?, gpu, gpu_instance)?;
        for (ci_profile, _) in self.compute_profiles(gi, gpu)? {
            for (ci, _) in raw::compute_instances(&self.nvml, gi, gpu, ci_profile)? {
                raw::destroy_compute_instance(&self.nvml, ci, gpu)?;
            }
        }
        raw::destroy_gpu_instance(&self.nvml, gi, gpu)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn fallback_names_round_memory_up() {
        for (slices, mb, want) in [(1, 9984, "1g.10gb"), (3, 40448, "3g.40gb"), (7, 143360, "7g.140gb")] {
            assert_eq!(super::fallback_name(slices, mb), want);
        }
    }
}
