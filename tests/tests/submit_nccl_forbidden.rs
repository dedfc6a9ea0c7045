//! A site that forbids NCCL's portable-transport mode (issue 38,
//! `[preempt] nccl_portable = "forbid"`): sbatch refuses
//! `--gpu-mode=checkpoint:nccl=portable` before the job is queued, naming
//! the setting; a job that reaches the node anyway (a submit host with
//! another config) is refused by the prolog, without a drain; plain
//! checkpoint jobs and `nccl=native` run.

use gpu_mode_tests::forbidden::Forbidden;
use gpu_mode_tests::shared::cluster_with;

fn forbidden() -> Forbidden<'static> {
    let cluster = cluster_with("submit_nccl_forbidden", 1, |s| s.extra_gpu_mode_config = "nccl_portable = \"forbid\"\n".into());
    Forbidden { cluster, value: "checkpoint:nccl=portable", setting: "preempt.nccl_portable = \"forbid\"" }
}

#[test]
fn sbatch_refuses_the_portable_mode_naming_the_setting() {
    forbidden().sbatch_refuses_naming_the_setting();
}

#[test]
fn native_and_plain_checkpoint_jobs_run() {
    forbidden().allowed_values_run(&["checkpoint", "checkpoint:nccl=native"], "#!/bin/sh\necho nccl=$GPU_MODE_CKPT_NCCL\n", "nccl=native");
}

#[test]
fn the_prolog_refuses_what_the_node_forbids_without_a_drain() {
    forbidden().the_prolog_refuses_without_a_drain(9301);
}
