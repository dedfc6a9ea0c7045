//! A site that forbids NCCL's portable-transport mode (issue 38,
//! `[preempt] nccl_portable = "forbid"`): sbatch refuses
//! `--gpu-mode=checkpoint:nccl=portable` before the job is queued, naming
//! the setting; a job that reaches the node anyway (a submit host with
//! another config) is refused by the prolog, without a drain; plain
//! checkpoint jobs and `nccl=native` run.

use gpu_mode_tests::shared::cluster_with;
use gpu_mode_tests::Cluster;

fn c() -> &'static Cluster {
    cluster_with("submit_nccl_forbidden", 1, |s| s.extra_gpu_mode_config = "nccl_portable = \"forbid\"\n".into())
}

const SETTING: &str = "preempt.nccl_portable = \"forbid\"";

#[test]
fn sbatch_refuses_the_portable_mode_naming_the_setting() {
    let out = c()
        .client("sbatch", &["--parsable", "--gpu-mode=checkpoint:nccl=portable", "--signal=B:USR1@60", "--requeue", "--wrap", "true"])
        .run_as(Some("gmtest1"))
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && out.stdout.is_empty(), "queued: {stderr}");
    assert!(stderr.contains("--gpu-mode=checkpoint:nccl=portable is not allowed on this cluster") && stderr.contains(SETTING), "{stderr}");
}

#[test]
fn native_and_plain_checkpoint_jobs_run() {
    for value in ["checkpoint", "checkpoint:nccl=native"] {
        let arg = format!("--gpu-mode={value}");
        let job = c().sbatch_wait(None, &[&arg, "--signal=B:USR1@60", "--requeue", "--gres=gpu:1"], "#!/bin/sh\necho nccl=$GPU_MODE_CKPT_NCCL\n").unwrap();
        assert_eq!((job.exit_code, job.output.trim()), (0, "nccl=native"), "{value}: {}", c().logs_tail());
    }
}

#[test]
fn the_prolog_refuses_what_the_node_forbids_without_a_drain() {
    let job = 9301;
    let out = c().run_hook("prolog", job, "gmtest1", "0", "checkpoint:nccl=portable").unwrap();
    assert_eq!(out.status.code(), Some(0), "a refusal is not a node fault: {}", String::from_utf8_lossy(&out.stderr));
    let state = gpu_mode_core::state::JobState::load(&c().runtime_dir(), job).unwrap();
    let refusal = state.refusal.clone().unwrap_or_else(|| panic!("accepted: {state:?}"));
    assert!(refusal.contains(SETTING), "{refusal}");
    let out = c().run_hook("epilog", job, "gmtest1", "0", "checkpoint:nccl=portable").unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let (state, reason) = c().node_state().unwrap();
    assert!(!state.contains("DRAIN") && !state.contains("DOWN"), "node {state} {reason}");
}
