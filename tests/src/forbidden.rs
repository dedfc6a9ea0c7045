//! A site setting that forbids a `--gpu-mode=checkpoint` option (`[preempt]
//! nccl_portable = "forbid"`, `host_pool = "forbid"`): what sbatch, the
//! prolog and the forms still allowed do; shared by submit_nccl_forbidden.rs
//! and submit_pool_forbidden.rs, each on a cluster of its own.

use crate::Cluster;

/// One forbidden option: the `--gpu-mode` value that asks for it and the
/// setting the refusals name.
pub struct Forbidden<'a> {
    pub cluster: &'a Cluster,
    pub value: &'a str,
    pub setting: &'a str,
}

impl Forbidden<'_> {
    /// sbatch refuses the value before the job is queued, naming the setting.
    pub fn sbatch_refuses_naming_the_setting(&self) {
        let arg = format!("--gpu-mode={}", self.value);
        let out =
            self.cluster.client("sbatch", &["--parsable", &arg, "--signal=B:USR1@60", "--requeue", "--wrap", "true"]).run_as(Some("gmtest1")).unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && out.stdout.is_empty(), "queued: {stderr}");
        let words = format!("{arg} is not allowed on this cluster");
        assert!(stderr.contains(&words) && stderr.contains(self.setting), "{stderr}");
    }

    /// Each of `values` runs; `script`'s output is `want`.
    pub fn allowed_values_run(&self, values: &[&str], script: &str, want: &str) {
        for value in values {
            let arg = format!("--gpu-mode={value}");
            let job = self.cluster.sbatch_wait(None, &[&arg, "--signal=B:USR1@60", "--requeue", "--gres=gpu:1"], script).unwrap();
            assert_eq!((job.exit_code, job.output.trim()), (0, want), "{value}: {}", self.cluster.logs_tail());
        }
    }

    /// A job that reaches the node anyway (a submit host with another config)
    /// is refused by the prolog of job `job`, naming the setting, and the
    /// node is not drained.
    pub fn the_prolog_refuses_without_a_drain(&self, job: u32) {
        let c = self.cluster;
        let out = c.run_hook("prolog", job, "gmtest1", "0", self.value).unwrap();
        assert_eq!(out.status.code(), Some(0), "a refusal is not a node fault: {}", String::from_utf8_lossy(&out.stderr));
        let state = gpu_mode_core::state::JobState::load(&c.runtime_dir(), job).unwrap();
        let refusal = state.refusal.clone().unwrap_or_else(|| panic!("accepted: {state:?}"));
        assert!(refusal.contains(self.setting), "{refusal}");
        let out = c.run_hook("epilog", job, "gmtest1", "0", self.value).unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
        let (state, reason) = c.node_state().unwrap();
        assert!(!state.contains("DRAIN") && !state.contains("DOWN"), "node {state} {reason}");
    }
}
