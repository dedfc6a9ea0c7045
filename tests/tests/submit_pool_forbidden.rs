//! A site that forbids the host memory pool (issue 39,
//! `[preempt] host_pool = "forbid"`): sbatch refuses
//! `--gpu-mode=checkpoint:pool=on` before the job is queued, naming the
//! setting; a job that reaches the node anyway (a submit host with another
//! config) is refused by the prolog, without a drain; plain checkpoint jobs
//! and `pool=off` run, without a pool.

use gpu_mode_tests::forbidden::Forbidden;
use gpu_mode_tests::shared::cluster_with;

fn forbidden() -> Forbidden<'static> {
    let cluster = cluster_with("submit_pool_forbidden", 1, |s| s.extra_gpu_mode_config = "host_pool = \"forbid\"\n".into());
    Forbidden { cluster, value: "checkpoint:pool=on", setting: "preempt.host_pool = \"forbid\"" }
}

#[test]
fn sbatch_refuses_the_pool_naming_the_setting() {
    forbidden().sbatch_refuses_naming_the_setting();
}

#[test]
fn plain_and_pool_off_checkpoint_jobs_run_without_a_pool() {
    forbidden().allowed_values_run(&["checkpoint", "checkpoint:pool=off"], "#!/bin/sh\necho pool=$GPU_MODE_TASK_POOL\n", "pool=");
}

#[test]
fn the_prolog_refuses_what_the_node_forbids_without_a_drain() {
    forbidden().the_prolog_refuses_without_a_drain(9302);
}
