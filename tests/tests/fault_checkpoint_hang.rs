//! Fault matrix (docs/faults.md): a CUDA driver checkpoint call that hangs
//! (`cuda-sim-ctl hang checkpoint`: the call never returns, as on a GPU stuck
//! in the kernel). What the checkpoint core offers today, on a real
//! `--gpu-mode=checkpoint` job: `gpu-mode-cuda-ckpt` bounds the call by
//! `[cuda_ckpt] call_timeout_ms`, fails naming it, leaves the process it
//! could not vouch for alone (locked, not rolled back blindly), and drains
//! nothing; once the driver answers again, `restore` recovers the process
//! and the job finishes with its count intact. The same hang on the
//! preemption path (the agent's dump: the job requeued to start over, no
//! drain, the record removed by the epilog) is
//! `preempt_checkpoint.rs::a_hanging_driver_call_on_preemption_...`.

use gpu_mode_tests::shared::cluster_with;
use gpu_mode_tests::Cluster;
use std::process::Command;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(60);

fn c() -> &'static Cluster {
    let c = cluster_with("fault_checkpoint_hang", 1, |_| {});
    // Short bounds, in the [cuda_ckpt] section the harness writes (with
    // the simulated CUDA driver): Lock 1 s, every other call 1.5 s.
    let path = c.dir.join("gpu-mode.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    if !text.contains("call_timeout_ms = 1500") {
        let patched = text.replacen("[cuda_ckpt]\n", "[cuda_ckpt]\ncall_timeout_ms = 1500\n", 1).replacen("lock_timeout_ms = 2000\n", "lock_timeout_ms = 1000\n", 1);
        assert_ne!(patched, text, "the harness's [cuda_ckpt] section moved");
        std::fs::write(&path, patched).unwrap();
    }
    c
}

/// `gpu-mode-cuda-ckpt <verb> --pid P` as root, timed. (By pid, not
/// `--job`: job ids of this private cluster repeat other clusters' on a
/// shared machine, and the tool rightly refuses a job id two users share.)
fn checkpoint_tool(verb: &str, pid: i32) -> (i32, String, Duration) {
    let exe = c().spec.artifacts.prolog.with_file_name("gpu-mode-cuda-ckpt");
    let start = Instant::now();
    let out = Command::new(exe)
        .args([verb, "--pid", &pid.to_string(), "--config", c().dir.join("gpu-mode.toml").to_str().unwrap()])
        .env_clear()
        .env("GPU_MODE_SIM_STATE", c().dir.join("sim/nvml-state.json"))
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text, start.elapsed())
}

fn cuda_ctl(args: &[&str]) {
    c().cuda_sim_ctl(args).unwrap();
}

#[test]
fn a_hanging_checkpoint_call_is_bounded_drains_nothing_and_the_job_recovers() {
    let env = c().share_sim_with_users().unwrap();
    let counter = c().sim_program("cuda-sim-counter").unwrap();
    let ready = c().dir.join("out/hang-ready");
    let script = format!("#!/bin/sh\n{env}{} --steps 60 --interval-ms 50 --mib 16 --ready {}\n", counter.display(), ready.display());
    let job = c().sbatch(Some("gmtest1"), &["--gpu-mode=checkpoint", "--signal=B:USR1@60", "--requeue", "--gres=gpu:1"], &script).unwrap();
    c().wait_until("the CUDA program to start", || ready.exists());
    let pid: i32 = std::fs::read_to_string(&ready).unwrap().trim().parse().unwrap();
    cuda_ctl(&["hang", "checkpoint"]);
    let (code, text, took) = checkpoint_tool("checkpoint", pid);
    assert_ne!(code, 0, "{text}");
    assert!(text.contains("cuCheckpointProcessCheckpoint(pid") && text.contains("did not return within 1.5 s"), "{text}");
    // Lock (1 s + 1.5 s) and checkpoint (1.5 s) bounds, and a margin.
    assert!(took < Duration::from_secs(10), "the hang was not bounded: {took:?}");
    let (state, reason) = c().node_state().unwrap();
    assert!(!state.contains("DRAIN"), "a hung call of the manual tool drained: {state} {reason}");
    // The driver answers again: restore brings the locked process back.
    cuda_ctl(&["clear"]);
    let (code, text, _) = checkpoint_tool("restore", pid);
    assert_eq!(code, 0, "restore after the hang: {text}");
    let done = c().wait_finished(job, WAIT).unwrap();
    assert_eq!(done.exit_code, 0, "{}", done.output);
    assert!(done.output.contains("DONE count=60") && !done.output.contains("MISMATCH"), "{}", done.output);
    let left = c().leftovers(None);
    assert!(left.is_clean(), "left behind:\n{}", left.summary());
}
