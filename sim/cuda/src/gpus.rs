//! The simulated GPUs are the NVML simulation's (`GPU_MODE_SIM_STATE`): their
//! UUIDs, their free memory, and the compute-process list where a simulated
//! CUDA process's device memory shows up (so NVML reports the footprint the
//! checkpoint records, and sees it go to zero while checkpointed).

use nvml_sim::model::SimProcess;
use nvml_sim::store;

const MIB: u64 = 1 << 20;

fn with_node<R>(f: impl FnOnce(&mut nvml_sim::NodeState) -> R) -> Result<R, String> {
    let path = store::state_path_from_env().map_err(|e| e.to_string())?;
    store::update(&path, f).map_err(|e| e.to_string())
}

/// Every GPU's UUID, in NVML order.
pub fn all() -> Result<Vec<String>, String> {
    with_node(|n| n.gpus.iter().map(|g| g.uuid.clone()).collect())
}

/// The GPUs this process may use: CUDA_VISIBLE_DEVICES (NVML indices or
/// UUIDs) applied to the node's list, like the real driver.
pub fn visible() -> Result<Vec<String>, String> {
    let all = all()?;
    let Ok(list) = std::env::var("CUDA_VISIBLE_DEVICES") else { return Ok(all) };
    let mut out = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let found = match item.parse::<usize>() {
            Ok(i) => all.get(i).cloned(),
            Err(_) => all.iter().find(|u| u.as_str() == item).cloned(),
        };
        // The driver stops at the first entry it cannot use.
        match found {
            Some(u) => out.push(u),
            None => break,
        }
    }
    Ok(out)
}

/// The CUDA driver version the node's fixture gives (13000 = 13.0).
pub fn cuda_version() -> Result<i32, String> {
    with_node(|n| n.cuda_driver_version)
}

/// Reserves `bytes` for `pid` on `uuid`: `Ok(false)` when the GPU lacks room.
pub fn take(uuid: &str, pid: i32, bytes: u64) -> Result<bool, String> {
    let mib = bytes.div_ceil(MIB);
    with_node(|n| {
        let Some(g) = n.gpus.iter_mut().find(|g| g.uuid == uuid) else { return Ok(false) };
        let used: u64 = g.processes.iter().map(|p| p.used_mib).sum();
        let free = (g.model.memory_total_mib - g.model.memory_reserved_mib).saturating_sub(used);
        if free < mib {
            return Ok(false);
        }
        match g.processes.iter_mut().find(|p| p.pid == pid as u32) {
            Some(p) => p.used_mib += mib,
            None => g.processes.push(SimProcess { pid: pid as u32, used_mib: mib, gpu_instance: None, compute_instance: None, live: true }),
        }
        Ok(true)
    })?
}

/// Releases `bytes` of `pid` on `uuid`; the process leaves the list at zero.
pub fn give_back(uuid: &str, pid: i32, bytes: u64) -> Result<(), String> {
    let mib = bytes.div_ceil(MIB);
    with_node(|n| {
        if let Some(g) = n.gpus.iter_mut().find(|g| g.uuid == uuid) {
            for p in g.processes.iter_mut().filter(|p| p.pid == pid as u32) {
                p.used_mib = p.used_mib.saturating_sub(mib);
            }
            g.processes.retain(|p| p.used_mib > 0);
        }
    })
}

/// Whether a GPU with this UUID exists on the node.
pub fn exists(uuid: &str) -> Result<bool, String> {
    with_node(|n| n.gpus.iter().any(|g| g.uuid == uuid))
}

/// Frees what dead simulated processes held, as the real driver does when a
/// process exits: their NVML entries and device-memory files. Only pids the
/// simulation knows (a folder under `procs/`) are touched, so processes a
/// test added to NVML by hand stay.
pub fn prune_dead(sim: &crate::files::SimDir) {
    let Ok(dir) = std::fs::read_dir(sim.root.join("procs")) else { return };
    let dead: Vec<u32> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
        .collect();
    if dead.is_empty() {
        return;
    }
    let uuids = with_node(|n| {
        for g in &mut n.gpus {
            g.processes.retain(|p| !dead.contains(&p.pid));
        }
        n.gpus.iter().map(|g| g.uuid.clone()).collect::<Vec<_>>()
    })
    .unwrap_or_default();
    for uuid in uuids {
        for f in std::fs::read_dir(sim.gpu_dir(&uuid)).into_iter().flatten().flatten() {
            let name = f.file_name().to_string_lossy().into_owned();
            let owner = name.split('-').next().and_then(|p| p.parse::<u32>().ok());
            if owner.is_some_and(|p| dead.contains(&p)) {
                let _ = std::fs::remove_file(f.path());
            }
        }
    }
}

/// Makes `dir/node.json` a simulated node of the NVML fixture `fixture`
/// and points this process's environment at it (so that cuInit and the
/// processes it starts find it); for tests whose binary has no other.
pub fn simulated_node(dir: &std::path::Path, fixture: &str) -> Result<std::path::PathBuf, String> {
    let state = dir.join("node.json");
    nvml_sim::store::create(&state, &nvml_sim::fixtures_dir().join(fixture)).map_err(|e| e.to_string())?;
    std::env::set_var(nvml_sim::store::STATE_ENV, &state);
    std::env::remove_var(crate::files::DIR_ENV);
    Ok(state)
}

