//! Audit item M9: the job's MPS daemon runs inside the job's cgroup. Slurm
//! makes the job's cgroup only after the Prolog, so the plugin moves the
//! daemon into the job's extern step when the first task starts (as
//! pam_slurm_adopt does); Slurm then kills it with the job, and the epilog
//! finds it gone and undoes the rest without a drain. Its own cluster:
//! proctrack/cgroup, task/cgroup and PrologFlags=Contain.

use gpu_mode_tests::{Artifacts, Cluster, ClusterSpec};

#[test]
fn the_mps_daemon_is_moved_into_the_jobs_extern_step() {
    gpu_mode_tests::users::ensure_test_users().unwrap();
    let mut spec = ClusterSpec::new("mps_cgroup", 1, Artifacts::locate().unwrap());
    spec.contain = true;
    let c = Cluster::start(spec).unwrap();
    // The task reports the cgroup of every MPS process serving its own pipe
    // directory (other clusters on the machine may run daemons of the same
    // test user).
    let script = "#!/bin/sh\nsleep 1\nfor p in $(pgrep -u \"$(id -u)\" nvidia-cuda-mps); do \
                  tr '\\0' '\\n' < /proc/$p/environ 2>/dev/null | grep -qx \"CUDA_MPS_PIPE_DIRECTORY=$CUDA_MPS_PIPE_DIRECTORY\" && \
                  echo \"mps $p $(grep -m1 -E 'freezer|^0::' /proc/$p/cgroup)\"; done\nexit 0\n";
    let job = c.sbatch_wait(Some("gmtest1"), &["--gpu-mode=mps", "--gres=gpu:1"], script).unwrap();
    assert_eq!(job.exit_code, 0, "{}\n{}", job.output, c.logs_tail());
    let lines: Vec<&str> = job.output.lines().filter(|l| l.starts_with("mps ")).collect();
    assert!(lines.len() >= 2, "daemon and server expected: {}", job.output);
    for l in &lines {
        assert!(l.contains(&format!("/job_{}/step_extern", job.id)), "not in the job's extern step: {l}\n{}", job.output);
    }
    let epilog = c.hook_log_lines(job.id).into_iter().find(|l| l.contains("action=epilog")).unwrap_or_default();
    assert!(epilog.contains("outcome=ok"), "{epilog}\n{}", c.logs_tail());
    let (state, reason) = c.node_state().unwrap();
    assert!(!state.contains("DRAIN"), "{state} {reason}\n{}", c.logs_tail());
    c.stop();
}
