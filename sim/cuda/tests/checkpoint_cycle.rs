//! The simulated driver's checkpoint cycle through its C API, against a real
//! `cuda-sim-counter` process: lock, checkpoint (device memory leaves the GPU
//! and NVML), restore onto the other GPU, unlock, and the count goes on.

use cuda_sim::api::*;
use cuda_sim::codes;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < Duration::from_secs(20), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn state(pid: i32) -> Result<i32, u32> {
    let mut s = -1;
    match unsafe { cuCheckpointProcessGetState(pid, &mut s) } {
        0 => Ok(s),
        code => Err(code),
    }
}

fn nvml_processes(state: &Path) -> Vec<(String, u32, u64)> {
    nvml_sim::store::update(state, |n| {
        n.gpus.iter().flat_map(|g| g.processes.iter().map(|p| (g.uuid.clone(), p.pid, p.used_mib))).collect()
    })
    .unwrap()
}

fn last_step(out: &Path) -> (u64, String) {
    let text = std::fs::read_to_string(out).unwrap_or_default();
    let line = text.lines().rev().find(|l| l.starts_with("step ")).unwrap_or("step 0 gpu -").to_string();
    let mut w = line.split_whitespace();
    (w.nth(1).unwrap().parse().unwrap(), w.nth(1).unwrap_or("-").to_string())
}

fn start_counter(dir: &Path) -> (Child, i32) {
    let ready = dir.join("ready");
    let child = Command::new(env!("CARGO_BIN_EXE_cuda-sim-counter"))
        .args(["--steps", "100000", "--interval-ms", "5", "--mib", "2", "--ready"])
        .arg(&ready)
        .stdout(std::fs::File::create(dir.join("out")).unwrap())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    wait_for("the counter's first step", || ready.exists());
    let pid = child.id() as i32;
    (child, pid)
}

fn uuid_bytes(text: &str) -> [u8; 16] {
    let hex: String = text.trim_start_matches("GPU-").chars().filter(|c| *c != '-').collect();
    let mut b = [0u8; 16];
    for (i, byte) in b.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
    }
    b
}

#[test]
fn checkpoint_restore_onto_another_gpu_and_faults() {
    let tmp = tempfile::tempdir().unwrap();
    // The only test in this binary: the environment is the simulated node.
    let state_file = cuda_sim::gpus::simulated_node(tmp.path(), "node-2x-h200.toml").unwrap();
    assert_eq!(unsafe { cuInit(0) }, 0);
    let gpus = cuda_sim::gpus::all().unwrap();
    let (mut child, pid) = start_counter(tmp.path());
    let out = tmp.path().join("out");

    assert_eq!(state(pid), Ok(0));
    assert_eq!(nvml_processes(&state_file), vec![(gpus[0].clone(), pid as u32, 2)]);
    let mut tid = 0;
    assert_eq!(unsafe { cuCheckpointProcessGetRestoreThreadId(pid, &mut tid) }, 0);
    assert!(tid > pid, "the driver thread is a thread of the process");

    let mut lock = LockArgs { timeout_ms: 2000, reserved0: 0, reserved1: [0; 7] };
    assert_eq!(unsafe { cuCheckpointProcessLock(pid, &mut lock) }, 0);
    assert_eq!(unsafe { cuCheckpointProcessCheckpoint(pid, std::ptr::null_mut()) }, 0);
    assert_eq!(state(pid), Ok(2));
    assert_eq!(nvml_processes(&state_file), vec![], "checkpointed memory is off the GPU");
    let held: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|p| p.display().to_string())
        .filter(|p| p.contains("/gpus/"))
        .collect();
    assert!(held.is_empty(), "no device file stays open: {held:?}");
    let frozen = last_step(&out).0;
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(last_step(&out).0, frozen, "a checkpointed process makes no progress");

    // Restore onto the other GPU; a map that misses a GPU is refused first.
    let mut wrong = [RawGpuPair { old_uuid: uuid_bytes(&gpus[1]), new_uuid: uuid_bytes(&gpus[0]) }];
    let mut args = RestoreArgs { gpu_pairs: wrong.as_mut_ptr(), gpu_pairs_count: 1, reserved: [0; 44], reserved1: 0 };
    assert_eq!(unsafe { cuCheckpointProcessRestore(pid, &mut args) }, codes::INVALID_VALUE);
    // So is one that names only the GPU holding its memory: the real driver
    // wants every GPU of the node (seen on 2×H200, driver 580).
    let mut one_way = [RawGpuPair { old_uuid: uuid_bytes(&gpus[0]), new_uuid: uuid_bytes(&gpus[1]) }];
    let mut args = RestoreArgs { gpu_pairs: one_way.as_mut_ptr(), gpu_pairs_count: 1, reserved: [0; 44], reserved1: 0 };
    assert_eq!(unsafe { cuCheckpointProcessRestore(pid, &mut args) }, codes::INVALID_VALUE);
    let mut pairs = [
        RawGpuPair { old_uuid: uuid_bytes(&gpus[0]), new_uuid: uuid_bytes(&gpus[1]) },
        RawGpuPair { old_uuid: uuid_bytes(&gpus[1]), new_uuid: uuid_bytes(&gpus[0]) },
    ];
    let mut args = RestoreArgs { gpu_pairs: pairs.as_mut_ptr(), gpu_pairs_count: 2, reserved: [0; 44], reserved1: 0 };
    assert_eq!(unsafe { cuCheckpointProcessRestore(pid, &mut args) }, 0);
    assert_eq!(state(pid), Ok(1));
    assert_eq!(nvml_processes(&state_file), vec![(gpus[1].clone(), pid as u32, 2)]);
    assert_eq!(unsafe { cuCheckpointProcessUnlock(pid, std::ptr::null_mut()) }, 0);
    wait_for("steps on the other GPU", || last_step(&out).0 > frozen + 3);
    assert_eq!(last_step(&out).1, gpus[1]);
    assert!(!std::fs::read_to_string(&out).unwrap().contains("MISMATCH"));

    // Wrong order and injected faults are the driver's errors.
    assert_eq!(unsafe { cuCheckpointProcessUnlock(pid, std::ptr::null_mut()) }, codes::ILLEGAL_STATE);
    let sim = cuda_sim::files::SimDir::from_env().unwrap();
    let fail = cuda_sim::files::Fault { call: "checkpoint".into(), pid: Some(pid), action: cuda_sim::files::Action::Fail { code: 999 } };
    sim.set_faults(&[fail]).unwrap();
    assert_eq!(unsafe { cuCheckpointProcessLock(pid, &mut lock) }, 0);
    assert_eq!(unsafe { cuCheckpointProcessCheckpoint(pid, std::ptr::null_mut()) }, codes::UNKNOWN);
    assert_eq!(state(pid), Ok(1), "a failed checkpoint leaves the process locked");
    assert_eq!(unsafe { cuCheckpointProcessUnlock(pid, std::ptr::null_mut()) }, 0);
    sim.set_faults(&[]).unwrap();

    // A process without the simulated driver is not a CUDA process.
    assert_eq!(state(std::process::id() as i32), Err(codes::NOT_INITIALIZED));
    let _ = child.kill();
    let _ = child.wait();
}
