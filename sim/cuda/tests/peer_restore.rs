//! A simulated rank that shared its memory with peers (NCCL's P2P over CUDA
//! IPC) is restored as the r580 driver restores it: the checkpoint
//! succeeds, the restore returns CUDA_ERROR_NOT_SUPPORTED (801) and leaves
//! it checkpointed, the unlock returns CUDA_ERROR_ILLEGAL_STATE (401). The
//! same rank in the portable mode (NCCL_P2P_DISABLE=1) comes back.

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

fn state(pid: i32) -> i32 {
    let mut s = -1;
    assert_eq!(unsafe { cuCheckpointProcessGetState(pid, &mut s) }, 0);
    s
}

/// A simulated NCCL rank with `NCCL_P2P_DISABLE` as given (unset: `None`).
fn start_rank(dir: &Path, name: &str, p2p_disable: Option<&str>) -> (Child, i32) {
    let ready = dir.join(format!("{name}.ready"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cuda-sim-counter"));
    cmd.args(["--steps", "100000", "--interval-ms", "5", "--mib", "1", "--hold", "nccl-thread", "--ready"])
        .arg(&ready)
        .env_remove("NCCL_P2P_DISABLE")
        .stdout(std::fs::File::create(dir.join(format!("{name}.out"))).unwrap())
        .stderr(Stdio::inherit());
    if let Some(v) = p2p_disable {
        cmd.env("NCCL_P2P_DISABLE", v);
    }
    let child = cmd.spawn().unwrap();
    wait_for("the rank's first step", || ready.exists());
    let pid = child.id() as i32;
    (child, pid)
}

fn checkpoint(pid: i32) {
    let mut lock = LockArgs { timeout_ms: 5000, reserved0: 0, reserved1: [0; 7] };
    assert_eq!(unsafe { cuCheckpointProcessLock(pid, &mut lock) }, 0);
    assert_eq!(unsafe { cuCheckpointProcessCheckpoint(pid, std::ptr::null_mut()) }, 0);
    assert_eq!(state(pid), codes::state::CHECKPOINTED);
}

#[test]
fn a_rank_that_used_p2p_checkpoints_but_does_not_restore() {
    let tmp = tempfile::tempdir().unwrap();
    // The only test in this binary: the environment is the simulated node.
    cuda_sim::gpus::simulated_node(tmp.path(), "node-2x-h200.toml").unwrap();
    assert_eq!(unsafe { cuInit(0) }, 0);

    let (mut p2p, p2p_pid) = start_rank(tmp.path(), "p2p", None);
    let (mut portable, portable_pid) = start_rank(tmp.path(), "portable", Some("1"));
    let said = |name: &str| std::fs::read_to_string(tmp.path().join(format!("{name}.out"))).unwrap();
    assert!(said("p2p").contains("nccl transport p2p"), "{}", said("p2p"));
    assert!(said("portable").contains("nccl transport portable"), "{}", said("portable"));

    for pid in [p2p_pid, portable_pid] {
        checkpoint(pid);
    }
    let restore = |pid| unsafe { cuCheckpointProcessRestore(pid, std::ptr::null_mut()) };
    let unlock = |pid| unsafe { cuCheckpointProcessUnlock(pid, std::ptr::null_mut()) };
    assert_eq!(restore(p2p_pid), codes::NOT_SUPPORTED);
    assert_eq!(state(p2p_pid), codes::state::CHECKPOINTED, "a refused restore leaves the rank checkpointed");
    assert_eq!(unlock(p2p_pid), codes::ILLEGAL_STATE);
    assert_eq!(restore(p2p_pid), codes::NOT_SUPPORTED, "and refused again");

    assert_eq!(restore(portable_pid), codes::SUCCESS);
    assert_eq!(unlock(portable_pid), codes::SUCCESS);
    assert_eq!(state(portable_pid), codes::state::RUNNING);
    let steps = |name: &str| said(name).lines().filter(|l| l.starts_with("step ")).count();
    let (before, stuck) = (steps("portable"), steps("p2p"));
    std::thread::sleep(Duration::from_millis(200));
    assert!(steps("portable") > before, "the portable rank counts on");
    assert_eq!(steps("p2p"), stuck, "the P2P rank makes no GPU call: the job would hang");
    for c in [&mut p2p, &mut portable] {
        let _ = c.kill();
        let _ = c.wait();
    }
}
