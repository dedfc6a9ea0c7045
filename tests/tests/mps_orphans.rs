//! The node checker's view of MPS: a daemon no live job owns is an orphan;
//! a job's daemon is not. Uses the simulated MPS binaries directly.

use gpu_mode_core::mps::find_orphans;
use gpu_mode_core::mps::orphans::{mps_binaries, Blame};
use gpu_mode_tests::Artifacts;
use std::process::Command;

#[test]
fn a_stray_daemon_is_an_orphan_and_goes_away_with_quit() {
    let sim = Artifacts::locate().unwrap().sim.expect("sim binaries built");
    let dir = tempfile::tempdir().unwrap();
    let runtime = dir.path().join("run");
    let pipe = dir.path().join("stray-pipe");
    let run = |args: &[&str], stdin: &str| {
        let mut cmd = Command::new(&sim.mps_control);
        cmd.args(args)
            .env_clear()
            .env("CUDA_MPS_PIPE_DIRECTORY", &pipe)
            .env("CUDA_MPS_LOG_DIRECTORY", dir.path().join("log"));
        gpu_mode_core::command::run_with_timeout(cmd, Some(stdin.as_bytes()), std::time::Duration::from_secs(10)).unwrap()
    };
    assert!(run(&["-d"], "").status.success());
    let pid: i32 = std::fs::read_to_string(pipe.join("nvidia-cuda-mps-control.pid")).unwrap().trim().parse().unwrap();
    let bins = mps_binaries(&sim.mps_control);
    let orphans = find_orphans(&runtime, &bins).unwrap();
    let stray = orphans.iter().find(|o| o.pid == pid).expect("the stray daemon must be reported");
    assert!(stray.why.starts_with("not started by slurm-gpu-mode"), "{}", stray.why);
    // Root's: the node's problem (a user's own would only warn).
    assert_eq!(stray.blame, Blame::Node);
    assert_eq!(stray.pipe_dir.as_deref(), Some(pipe.to_str().unwrap()));
    run(&[], "quit\n");
    for _ in 0..100 {
        if !find_orphans(&runtime, &bins).unwrap().iter().any(|o| o.pid == pid) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    panic!("the daemon was still reported after quit");
}

/// Audit item M3: a process merely *named* like MPS is not MPS. Before the
/// fix, a user could fail the node checker (and drain the node) by running
/// any program under the name nvidia-cuda-mps-control.
#[test]
fn a_program_named_like_mps_is_not_an_orphan() {
    let sim = Artifacts::locate().unwrap().sim.expect("sim binaries built");
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("nvidia-cuda-mps-control");
    std::fs::copy("/bin/sleep", &fake).unwrap();
    let mut child = spawn_fresh_copy(&fake);
    let pid = child.id() as i32;
    std::thread::sleep(std::time::Duration::from_millis(100));
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
    assert_eq!(comm.trim(), "nvidia-cuda-mps", "the impostor must look like MPS by name");
    let orphans = find_orphans(&dir.path().join("run"), &mps_binaries(&sim.mps_control)).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(!orphans.iter().any(|o| o.pid == pid), "{orphans:?}");
}

/// Runs a just-copied program. Another test thread of this binary that forks
/// while the copy's write descriptor is open gives its child that descriptor
/// until the child's exec, and exec of the copy meanwhile fails with ETXTBSY
/// (seen once in CI): retried for a while.
fn spawn_fresh_copy(program: &std::path::Path) -> std::process::Child {
    for _ in 0..100 {
        match Command::new(program).arg("30").spawn() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => std::thread::sleep(std::time::Duration::from_millis(20)),
            other => return other.unwrap(),
        }
    }
    panic!("{} stayed busy (ETXTBSY) for 2 s", program.display());
}
