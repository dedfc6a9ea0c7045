//! The simulated C API against NVML's documented behaviour (nvml.h): return
//! codes, the size-query protocol, init reference counting, MIG rules, and
//! nvml-sim-ctl driving the same state from another process.

use nvml_sim::api::*;
use nvml_sim::model::code;
use nvml_wrapper_sys::bindings::*;
use std::ffi::c_char;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::ptr::null_mut;
use std::sync::{Mutex, MutexGuard};

static SERIAL: Mutex<()> = Mutex::new(());

struct Node {
    _dir: tempfile::TempDir,
    state: PathBuf,
    _lock: MutexGuard<'static, ()>,
}

impl Node {
    /// A fresh node from `fixture`, with NVML initialized on it.
    fn new(fixture: &str) -> Node {
        let lock = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state.json");
        nvml_sim::store::create(&state, &nvml_sim::fixtures_dir().join(fixture)).unwrap();
        std::env::set_var("GPU_MODE_SIM_STATE", &state);
        unsafe {
            while nvmlShutdown() == code::SUCCESS {}
            assert_eq!(nvmlInit_v2(), code::SUCCESS);
        }
        Node { _dir: dir, state, _lock: lock }
    }

    fn ctl(&self, args: &[&str]) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_nvml-sim-ctl")).args(args).env("GPU_MODE_SIM_STATE", &self.state).output().unwrap()
    }
}

fn device(i: u32) -> nvmlDevice_t {
    let mut d = null_mut();
    assert_eq!(unsafe { nvmlDeviceGetHandleByIndex_v2(i, &mut d) }, code::SUCCESS);
    d
}

#[test]
fn init_needs_a_node_and_is_reference_counted() {
    let _node = Node::new("node-1x-h200.toml");
    unsafe {
        assert_eq!(nvmlInit_v2(), code::SUCCESS);
        assert_eq!(nvmlShutdown(), code::SUCCESS);
        assert_eq!(nvmlShutdown(), code::SUCCESS);
        let mut n = 0;
        assert_eq!(nvmlDeviceGetCount_v2(&mut n), code::UNINITIALIZED, "after the last shutdown");
        assert_eq!(nvmlShutdown(), code::UNINITIALIZED);
        std::env::set_var("GPU_MODE_SIM_STATE", "/nonexistent/state.json");
        assert_eq!(nvmlInit_v2(), code::DRIVER_NOT_LOADED);
        std::env::remove_var("GPU_MODE_SIM_STATE");
        assert_eq!(nvmlInit_v2(), code::DRIVER_NOT_LOADED);
    }
}

#[test]
fn handles_strings_and_sizes() {
    let _node = Node::new("node-4x-h200.toml");
    unsafe {
        let mut n = 0;
        assert_eq!(nvmlDeviceGetCount_v2(&mut n), code::SUCCESS);
        assert_eq!(n, 4);
        let mut d = null_mut();
        assert_eq!(nvmlDeviceGetHandleByIndex_v2(4, &mut d), code::INVALID_ARGUMENT);
        let mut small = [0 as c_char; 4];
        assert_eq!(nvmlDeviceGetName(device(3), small.as_mut_ptr(), 4), code::INSUFFICIENT_SIZE);
        let mut name = [0 as c_char; 96];
        assert_eq!(nvmlDeviceGetName(device(3), name.as_mut_ptr(), 96), code::SUCCESS);
        assert_eq!(std::ffi::CStr::from_ptr(name.as_ptr()).to_str().unwrap(), "NVIDIA H200");
        assert_eq!(nvmlDeviceGetName(null_mut(), name.as_mut_ptr(), 96), code::INVALID_ARGUMENT);
    }
}

#[test]
fn process_list_follows_the_size_query_protocol() {
    let node = Node::new("node-1x-h100.toml");
    assert!(node.ctl(&["process", "add", "77", "--mem-mib", "100"]).status.success());
    assert!(node.ctl(&["process", "add", "78"]).status.success());
    unsafe {
        let mut count = 0;
        assert_eq!(nvmlDeviceGetComputeRunningProcesses_v3(device(0), &mut count, null_mut()), code::INSUFFICIENT_SIZE);
        assert_eq!(count, 2);
        let mut infos = [std::mem::zeroed::<nvmlProcessInfo_t>(); 2];
        assert_eq!(nvmlDeviceGetComputeRunningProcesses_v3(device(0), &mut count, infos.as_mut_ptr()), code::SUCCESS);
        assert_eq!((infos[0].pid, infos[0].usedGpuMemory), (77, 100 << 20));
        assert_eq!(infos[0].gpuInstanceId, u32::MAX, "not a MIG process");
    }
}

#[test]
fn mig_follows_nvml_rules() {
    let node = Node::new("node-1x-h100.toml");
    let d = device(0);
    unsafe {
        let mut status = 0;
        let (mut cur, mut pend) = (9, 9);
        // Held by a process: pending, and the activation says why.
        assert!(node.ctl(&["process", "add", "5"]).status.success());
        assert_eq!(nvmlDeviceSetMigMode(d, 1, &mut status), code::SUCCESS);
        assert_eq!(status, code::IN_USE);
        assert_eq!(nvmlDeviceGetMigMode(d, &mut cur, &mut pend), code::SUCCESS);
        assert_eq!((cur, pend), (0, 1));
        // A reset applies it once nothing holds the GPU.
        assert_eq!(node.ctl(&["reset"]).status.code(), Some(1), "reset refused while a process runs");
        assert!(node.ctl(&["process", "clear"]).status.success());
        assert!(node.ctl(&["reset"]).status.success());
        assert_eq!(nvmlDeviceGetMigMode(d, &mut cur, &mut pend), code::SUCCESS);
        assert_eq!((cur, pend), (1, 1));

        // Profile info by enum; create by id. The 3g enum (2) is not an id here.
        let mut info: nvmlGpuInstanceProfileInfo_t = std::mem::zeroed();
        assert_eq!(nvmlDeviceGetGpuInstanceProfileInfo(d, NVML_GPU_INSTANCE_PROFILE_3_SLICE, &mut info), code::SUCCESS);
        assert_eq!((info.id, info.sliceCount, info.instanceCount), (9, 3, 2));
        let mut gi = null_mut();
        assert_eq!(nvmlDeviceCreateGpuInstance(d, NVML_GPU_INSTANCE_PROFILE_3_SLICE, &mut gi), code::INVALID_ARGUMENT);

        // Possible placements: a NULL array asks for the count.
        let mut count = 0;
        assert_eq!(nvmlDeviceGetGpuInstancePossiblePlacements_v2(d, 9, null_mut(), &mut count), code::SUCCESS);
        assert_eq!(count, 2);

        let bad = nvmlGpuInstancePlacement_t { start: 2, size: 4 };
        assert_eq!(nvmlDeviceCreateGpuInstanceWithPlacement(d, 9, &bad, &mut gi), code::INVALID_ARGUMENT);
        let at4 = nvmlGpuInstancePlacement_t { start: 4, size: 4 };
        assert_eq!(nvmlDeviceCreateGpuInstanceWithPlacement(d, 9, &at4, &mut gi), code::SUCCESS);
        assert_eq!(nvmlDeviceCreateGpuInstanceWithPlacement(d, 9, &at4, &mut gi.clone()), code::INSUFFICIENT_RESOURCES);
        let mut ci = null_mut();
        assert_eq!(nvmlGpuInstanceCreateComputeInstance(gi, NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, &mut ci), code::SUCCESS);
        assert_eq!(nvmlGpuInstanceDestroy(gi), code::IN_USE, "compute instances first");
        assert_eq!(nvmlDeviceSetMigMode(d, 0, &mut status), code::IN_USE, "instances exist");

        let mut mig = null_mut();
        assert_eq!(nvmlDeviceGetMigDeviceHandleByIndex(d, 0, &mut mig), code::SUCCESS);
        let mut uuid = [0 as c_char; 96];
        assert_eq!(nvmlDeviceGetUUID(mig, uuid.as_mut_ptr(), 96), code::SUCCESS);
        assert!(std::ffi::CStr::from_ptr(uuid.as_ptr()).to_str().unwrap().starts_with("MIG-"));
        assert_eq!(nvmlDeviceGetMigDeviceHandleByIndex(d, 1, &mut mig), code::NOT_FOUND);

        assert_eq!(nvmlComputeInstanceDestroy(ci), code::SUCCESS);
        assert_eq!(nvmlGpuInstanceDestroy(gi), code::SUCCESS);
    }
}

#[test]
fn faults_from_the_control_command() {
    let node = Node::new("node-2x-h200.toml");
    let d1 = device(1);
    for args in [
        &["inject", "ecc", "3", "--gpu", "1"][..],
        &["inject", "pcie", "x8", "--gpu", "1"],
        &["inject", "persistence", "off", "--gpu", "1"],
        &["inject", "remap", "failed", "--gpu", "1"],
        &["inject", "thermal", "--gpu", "1"],
    ] {
        let out = node.ctl(args);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    unsafe {
        let mut v = 0u64;
        assert_eq!(nvmlDeviceGetTotalEccErrors(d1, 1, 0, &mut v), code::SUCCESS);
        assert_eq!(v, 3);
        let mut w = 0;
        assert_eq!(nvmlDeviceGetCurrPcieLinkWidth(d1, &mut w), code::SUCCESS);
        assert_eq!(w, 8);
        let mut p = 1;
        assert_eq!(nvmlDeviceGetPersistenceMode(d1, &mut p), code::SUCCESS);
        assert_eq!(p, 0);
        let (mut c, mut u, mut pend, mut fail) = (0, 0, 0, 0);
        assert_eq!(nvmlDeviceGetRemappedRows(d1, &mut c, &mut u, &mut pend, &mut fail), code::SUCCESS);
        assert_eq!(fail, 1);
        let mut reasons = 0;
        assert_eq!(nvmlDeviceGetCurrentClocksEventReasons(d1, &mut reasons), code::SUCCESS);
        assert_eq!(reasons & 0x60, 0x60);
    }
    assert!(node.ctl(&["inject", "lost", "--gpu", "1"]).status.success());
    let mut d = null_mut();
    assert_eq!(unsafe { nvmlDeviceGetHandleByIndex_v2(1, &mut d) }, code::GPU_IS_LOST);
    assert_eq!(unsafe { nvmlDeviceGetHandleByIndex_v2(0, &mut d) }, code::SUCCESS);
    assert!(node.ctl(&["clear"]).status.success());
    assert_eq!(unsafe { nvmlDeviceGetHandleByIndex_v2(1, &mut d) }, code::SUCCESS);
    assert_eq!(node.ctl(&["inject", "bogus"]).status.code(), Some(2));
}

#[test]
fn event_wait_times_out_then_sees_an_injected_xid() {
    let node = Node::new("node-1x-h200.toml");
    unsafe {
        let mut set = null_mut();
        assert_eq!(nvmlEventSetCreate(&mut set), code::SUCCESS);
        assert_eq!(nvmlDeviceRegisterEvents(device(0), nvmlEventTypeXidCriticalError as u64, set), code::SUCCESS);
        let mut data: nvmlEventData_t = std::mem::zeroed();
        assert_eq!(nvmlEventSetWait_v2(set, &mut data, 20), code::TIMEOUT);
        assert!(node.ctl(&["inject", "xid", "94"]).status.success());
        assert_eq!(nvmlEventSetWait_v2(set, &mut data, 1000), code::SUCCESS);
        assert_eq!((data.eventType, data.eventData), (nvmlEventTypeXidCriticalError as u64, 94));
        assert_eq!(nvmlEventSetFree(set), code::SUCCESS);
        assert_eq!(nvmlEventSetFree(set), code::INVALID_ARGUMENT);
    }
}

#[test]
fn state_file_is_json_another_process_can_read() {
    let node = Node::new("node-1x-h100.toml");
    let shown = node.ctl(&["show"]);
    let state: nvml_sim::NodeState = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(state.gpus[0].model.name, "NVIDIA H100 80GB HBM3");
    assert!(Path::new(&node.state).exists());
}
