//! Jobs that the tests watch while they run: submitted without waiting,
//! looked at through scontrol, waited for with a bound.

use crate::{Cluster, JobResult};
use anyhow::{anyhow, bail, Result};
use std::time::{Duration, Instant};

/// What `scontrol show job` says of a job (the fields the tests read).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobInfo {
    /// PENDING, RUNNING, COMPLETED, FAILED, CANCELLED ...
    pub state: String,
    /// `ExitCode=a:b`: the exit code and the signal.
    pub exit_code: String,
    pub reason: String,
    /// `Restarts=N`.
    pub restarts: u32,
    /// The whole `show job` text, for failure messages.
    pub raw: String,
}

impl JobInfo {
    pub fn parse(text: &str) -> JobInfo {
        let field = |k: &str| -> String {
            text.split_whitespace().find_map(|w| w.strip_prefix(&format!("{k}="))).unwrap_or("").to_string()
        };
        JobInfo {
            state: field("JobState"),
            exit_code: field("ExitCode"),
            reason: field("Reason"),
            restarts: field("Restarts").parse().unwrap_or(0),
            raw: text.to_string(),
        }
    }

    /// Ended, whatever way.
    pub fn is_final(&self) -> bool {
        matches!(self.state.as_str(), "COMPLETED" | "FAILED" | "CANCELLED" | "TIMEOUT" | "NODE_FAIL" | "OUT_OF_MEMORY" | "BOOT_FAIL" | "DEADLINE" | "PREEMPTED")
    }
}

impl Cluster {
    /// Submits a batch script as `user` (None = root) and returns its job id
    /// at once. Output goes to `<dir>/out/<id>.out`.
    pub fn sbatch(&self, user: Option<&str>, args: &[&str], script: &str) -> Result<u32> {
        let out_dir = self.dir.join("out");
        let path = out_dir.join(format!("job-{}.sh", crate::unique_suffix()));
        std::fs::write(&path, script)?;
        let output = format!("--output={}/%j.out", out_dir.display());
        let path_arg = path.display().to_string();
        let mut all: Vec<&str> = vec!["--parsable", &output];
        all.extend_from_slice(args);
        all.push(&path_arg);
        let out = self.client("sbatch", &all).run_as(user)?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        parsable_job_id(&stdout).ok_or_else(|| anyhow!("sbatch gave no job id: {stdout}{}", String::from_utf8_lossy(&out.stderr)))
    }

    /// `scontrol show job <id>`.
    pub fn job_info(&self, id: u32) -> Result<JobInfo> {
        let out = self.client("scontrol", &["show", "job", &id.to_string()]).run_as_root()?;
        if !out.status.success() {
            bail!("scontrol show job {id}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(JobInfo::parse(&String::from_utf8_lossy(&out.stdout)))
    }

    /// Waits until `f` holds for the job, at most `timeout`.
    pub fn wait_job_info(&self, id: u32, timeout: Duration, what: &str, f: impl Fn(&JobInfo) -> bool) -> Result<JobInfo> {
        let start = Instant::now();
        loop {
            let info = self.job_info(id)?;
            if f(&info) {
                return Ok(info);
            }
            if start.elapsed() > timeout {
                bail!("job {id}: no {what} after {timeout:?} (state {}):\n{}\n{}", info.state, info.raw, self.logs_tail());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits for the job to end and for its epilog's line in the hook log
    /// (the epilog runs after the job is seen ending); returns the result.
    pub fn wait_finished(&self, id: u32, timeout: Duration) -> Result<JobResult> {
        let info = self.wait_job_info(id, timeout, "end", JobInfo::is_final)?;
        self.wait_epilog(id, timeout)?;
        let output = std::fs::read_to_string(self.dir.join("out").join(format!("{id}.out"))).unwrap_or_default();
        let code = info.exit_code.split(':').next().and_then(|c| c.parse().ok()).unwrap_or(-1);
        Ok(JobResult { id, exit_code: code, output })
    }

    /// Waits for an `action=epilog` line of job `id` in the hook log.
    pub fn wait_epilog(&self, id: u32, timeout: Duration) -> Result<Vec<String>> {
        let start = Instant::now();
        loop {
            let lines = self.hook_log_lines(id);
            if lines.iter().any(|l| l.contains("action=epilog")) {
                return Ok(lines);
            }
            if start.elapsed() > timeout {
                bail!("job {id}: no epilog line after {timeout:?}: {lines:#?}\n{}", self.logs_tail());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until the node is drained; returns (state, reason).
    pub fn wait_drained(&self, timeout: Duration) -> Result<(String, String)> {
        let start = Instant::now();
        loop {
            let (state, reason) = self.node_state()?;
            if state.contains("DRAIN") {
                return Ok((state, reason));
            }
            if start.elapsed() > timeout {
                bail!("node not drained after {timeout:?} (state {state})\n{}", self.logs_tail());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The batch job's processes on this node: the pids of its step
    /// processes' direct children named `comm` (e.g. "sleep").
    pub fn job_processes(&self, id: u32, comm: &str) -> Vec<i32> {
        let var = format!("SLURM_JOB_ID={id}");
        gpu_mode_core::procfs::all()
            .into_iter()
            .filter(|p| p.comm == comm)
            .filter(|p| {
                std::fs::read(format!("/proc/{}/environ", p.pid))
                    .map(|e| e.split(|b| *b == 0).any(|v| v == var.as_bytes()))
                    .unwrap_or(false)
            })
            .map(|p| p.pid)
            .collect()
    }
}

/// A batch job that has started and waits for the test to let it end:
/// its script touches a "ready" file, waits for a "go" file, runs `then`.
pub struct HeldJob {
    pub id: u32,
    go: std::path::PathBuf,
    /// Touched by the script after `then`: its body is over.
    pub finished: std::path::PathBuf,
}

impl HeldJob {
    /// Lets the job's script go on.
    pub fn release(&self) {
        std::fs::write(&self.go, b"").expect("writing the go file");
    }
}

impl Cluster {
    /// Submits a job that starts, then waits for [`HeldJob::release`] and
    /// runs `then` (shell lines); returns once its script is running.
    pub fn start_held_job(&self, user: &str, args: &[&str], then: &str) -> Result<HeldJob> {
        let tag = crate::unique_suffix();
        let file = |what: &str| self.dir.join("out").join(format!("held-{tag}.{what}"));
        let (ready, go, finished) = (file("ready"), file("go"), file("finished"));
        let script = format!(
            "#!/bin/sh\ntouch {}\nwhile [ ! -e {} ]; do sleep 0.1; done\n{then}\ntouch {}\n",
            ready.display(),
            go.display(),
            finished.display()
        );
        let id = self.sbatch(Some(user), args, &script)?;
        let start = Instant::now();
        while !ready.exists() {
            if start.elapsed() > Duration::from_secs(60) {
                bail!("job {id} did not start within 60 s\n{}", self.logs_tail());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(HeldJob { id, go, finished })
    }

    /// Cancels every job and puts a drained node back in service (what a
    /// fault test does when it ends, passed or failed).
    pub fn cancel_all_and_resume(&self) {
        let _ = self.client("scancel", &["--full", "--partition", "debug"]).run_as_root();
        if self.node_state().is_ok_and(|(s, _)| s.contains("DRAIN")) {
            let _ = self.resume_node();
        }
    }

    /// (MIG on, [(profile id, start)] sorted) of simulated GPU `gpu`.
    pub fn sim_mig_layout(&self, gpu: usize) -> Result<(bool, Vec<(u64, u64)>)> {
        let g = self.sim_gpu(gpu)?;
        let mut l: Vec<(u64, u64)> = g["instances"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|i| (i["profile_id"].as_u64().unwrap_or(0), i["start"].as_u64().unwrap_or(0)))
            .collect();
        l.sort_by_key(|x| x.1);
        Ok((g["mig_current"].as_bool().unwrap_or(false), l))
    }

    /// `gpu-mode-node-checker check --only <check> --no-drain --json` on
    /// this cluster: (status, message) of each result.
    pub fn check_results(&self, only: &str) -> Result<Vec<(String, String)>> {
        let out = std::process::Command::new(&self.spec.artifacts.node_checker)
            .args(["check", "--only", only, "--no-drain", "--json", "--config", self.dir.join("gpu-mode.toml").to_str().unwrap()])
            .env_clear()
            .env("GPU_MODE_SIM_STATE", self.dir.join("sim/nvml-state.json"))
            .output()?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .map_err(|e| anyhow!("{e}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))?;
        let text = |r: &serde_json::Value, k: &str| r[k].as_str().unwrap_or("").to_string();
        Ok(v["results"].as_array().into_iter().flatten().map(|r| (text(r, "status"), text(r, "message"))).collect())
    }

    /// `gpu-mode-mig <args> --config <this cluster's>` on the simulated GPUs.
    pub fn mig_tool(&self, args: &[&str]) -> Result<std::process::Output> {
        self.tool("gpu-mode-mig", args)
    }

    /// `<program> <args> --config <this cluster's>`, a tool built beside the
    /// prolog, on the simulated GPUs, with this cluster's scontrol.
    pub fn tool(&self, program: &str, args: &[&str]) -> Result<std::process::Output> {
        let exe = self.spec.artifacts.prolog.with_file_name(program);
        let mut cmd = std::process::Command::new(exe);
        cmd.args(args)
            .args(["--config", self.dir.join("gpu-mode.toml").to_str().unwrap()])
            .env_clear()
            .env("GPU_MODE_SIM_STATE", self.dir.join("sim/nvml-state.json"))
            .env("SLURM_CONF", self.dir.join("slurm.conf"))
            .envs(self.install.client_env());
        crate::process::output_with_timeout(cmd, Duration::from_secs(60))
    }
}

/// The job id `sbatch --parsable` prints (`<id>` or `<id>;<cluster>`).
pub fn parsable_job_id(stdout: &str) -> Option<u32> {
    stdout.lines().next()?.split(';').next()?.trim().parse().ok()
}
