//! A single-node Slurm cluster on localhost that the project owns: munged,
//! slurmctld and slurmd on private ports, state and socket directories, with
//! the built plugin in plugstack.conf and the built binaries as
//! Prolog/Epilog. No system services, no systemd. Works with Slurm installed
//! from Debian's packages or unpacked under a prefix (`GPU_MODE_SLURM_PREFIX`),
//! as on the GPU machines.
//!
//! Teardown: [`Cluster`] stops everything on drop, and [`Cluster::start`]
//! first kills whatever a previous run left in the same directory (a test
//! binary killed by a timeout cannot run its destructors).

pub mod accounting_db;
pub mod artifacts;
pub mod bench;
pub mod churn;
pub mod ckpt_jobs;
pub mod conf;
pub mod forbidden;
pub mod jobs;
pub mod leftovers;
pub mod netns;
pub mod process;
pub mod shared;
pub mod users;

use anyhow::{anyhow, bail, Context, Result};
use std::path::{Path, PathBuf};
use std::os::unix::process::CommandExt;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub use artifacts::Artifacts;
pub use accounting_db::AccountingDb;
pub use conf::{ClusterSpec, Preemption, SlurmInstall};

/// A running cluster. Drop stops it.
pub struct Cluster {
    pub spec: ClusterSpec,
    pub install: SlurmInstall,
    pub dir: PathBuf,
    stopped: AtomicBool,
}

/// A finished batch job.
#[derive(Debug, Clone)]
pub struct JobResult {
    pub id: u32,
    /// sbatch --wait's exit code: the job's exit code.
    pub exit_code: i32,
    /// The job's stdout+stderr (its --output file).
    pub output: String,
}

impl Cluster {
    /// Writes the configuration into `spec.dir`, starts the daemons and waits
    /// until the node is idle.
    pub fn start(spec: ClusterSpec) -> Result<Cluster> {
        Cluster::write(&spec)?;
        Cluster::start_written(spec)
    }

    /// Stops what a previous run left in `spec.dir` and writes the
    /// configuration there, starting nothing (installed mode: the Ansible
    /// role edits it before [`Cluster::start_written`]).
    pub fn write(spec: &ClusterSpec) -> Result<()> {
        if unsafe { libc::geteuid() } != 0 {
            bail!("the local Slurm cluster must be started as root (it runs slurmd and munged)");
        }
        let install = SlurmInstall::detect()?;
        process::stop_daemons_in(&spec.dir);
        if spec.dir.exists() {
            std::fs::remove_dir_all(&spec.dir).with_context(|| format!("removing stale {}", spec.dir.display()))?;
        }
        conf::write_all(spec, &install).context("writing the cluster configuration")
    }

    /// Starts the daemons on the configuration already in `spec.dir` and
    /// waits until the node is idle.
    pub fn start_written(spec: ClusterSpec) -> Result<Cluster> {
        let install = SlurmInstall::detect()?;
        let dir = spec.dir.clone();
        if !dir.join("slurm.conf").is_file() {
            bail!("{} has no slurm.conf: write the cluster first", dir.display());
        }
        let cluster = Cluster { spec, install, dir, stopped: AtomicBool::new(false) };
        cluster.start_daemons()?;
        Ok(cluster)
    }

    fn start_daemons(&self) -> Result<()> {
        let d = &self.dir;
        self.daemon(
            &self.install.munged(),
            &[
                &format!("--socket={}", d.join("munge/munge.socket").display()),
                &format!("--key-file={}", d.join("munge/munge.key").display()),
                &format!("--pid-file={}", d.join("munge/munged.pid").display()),
                &format!("--log-file={}", d.join("log/munged.log").display()),
                &format!("--seed-file={}", d.join("munge/munged.seed").display()),
                "--force",
            ],
        )?;
        process::wait_for_path(&d.join("munge/munge.socket"), Duration::from_secs(10))
            .context("munged did not create its socket")?;
        let conf = d.join("slurm.conf");
        if let Some(db) = &self.spec.accounting_db {
            accounting_db::start(self, db)?;
        }
        if let Some(net) = self.spec.node_net() {
            net.create()?;
        }
        self.daemon(&self.install.sbin("slurmctld"), &["-f", conf.to_str().unwrap()])?;
        match self.spec.node_net() {
            None => self.daemon(&self.install.sbin("slurmd"), &["-N", &self.spec.node_name, "-f", conf.to_str().unwrap()])?,
            Some(net) => {
                for (i, node) in self.spec.node_names().iter().enumerate() {
                    let nd = self.spec.node_dir(node);
                    let binds = [(nd.join("sim"), d.join("sim")), (nd.join("run"), d.join("run"))];
                    let mut cmd = Command::new(self.install.sbin("slurmd"));
                    cmd.args(["-N", node, "-f", conf.to_str().unwrap()]).envs(self.install.daemon_env()).stdin(Stdio::null());
                    let _ns = net.enter(i, &mut cmd, &binds)?;
                    let out = process::output_with_timeout(cmd, Duration::from_secs(30))?;
                    if !out.status.success() {
                        bail!("slurmd -N {node} failed ({}): {}\n{}", out.status, String::from_utf8_lossy(&out.stderr), self.logs_tail());
                    }
                }
            }
        }
        self.wait_node_idle(Duration::from_secs(60))
    }

    /// Starts a daemon that forks into the background, and checks it did.
    fn daemon(&self, program: &Path, args: &[&str]) -> Result<()> {
        self.daemon_with_env(program, args, &[])
    }

    /// [`Cluster::daemon`] with `env` added (slurmdbd finds slurmdbd.conf
    /// beside `SLURM_CONF`).
    pub(crate) fn daemon_with_env(&self, program: &Path, args: &[&str], env: &[(&str, &str)]) -> Result<()> {
        let out = Command::new(program)
            .args(args)
            .envs(self.install.daemon_env())
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("cannot run {}", program.display()))?;
        if !out.status.success() {
            bail!(
                "{} {} failed ({}): {}{}\n{}",
                program.display(),
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                self.logs_tail()
            );
        }
        Ok(())
    }

    fn wait_node_idle(&self, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        for node in self.spec.node_names() {
            let mut last = String::new();
            loop {
                if let Ok((state, _)) = self.node_state_of(&node) {
                    if state.starts_with("IDLE") {
                        break;
                    }
                    last = state;
                }
                if start.elapsed() > timeout {
                    bail!("node {node} not idle after {:?} (last state {last:?})\n{}", timeout, self.logs_tail());
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        }
        Ok(())
    }

    /// The node's state and reason, from `scontrol show node`.
    pub fn node_state(&self) -> Result<(String, String)> {
        self.node_state_of(&self.spec.node_name)
    }

    /// [`Cluster::node_state`] of one node of a two-node cluster.
    pub fn node_state_of(&self, node: &str) -> Result<(String, String)> {
        let out = self.client("scontrol", &["show", "node", node]).run_as_root()?;
        if !out.status.success() {
            bail!("scontrol show node failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let status = gpu_mode_core::drain::NodeStatus::parse(&String::from_utf8_lossy(&out.stdout));
        Ok((status.state, status.reason))
    }

    /// Brings a drained node back (tests that drain on purpose call this).
    pub fn resume_node(&self) -> Result<()> {
        let out = self
            .client("scontrol", &["update", &format!("NodeName={}", self.spec.node_name), "State=RESUME"])
            .run_as_root()?;
        if !out.status.success() {
            bail!("resume failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        self.wait_node_idle(Duration::from_secs(30))
    }

    /// A Slurm client command (sbatch, srun, ...) with this cluster's config.
    pub fn client(&self, name: &str, args: &[&str]) -> ClientCommand {
        let mut cmd = Command::new(self.install.bin(name));
        cmd.args(args)
            .env_clear()
            .env("SLURM_CONF", self.dir.join("slurm.conf"))
            // Jobs inherit it: their own srun must be this install's.
            .env("PATH", format!("{}:/usr/local/bin:/usr/bin:/bin", self.install.bin("").display()))
            .envs(self.install.client_env())
            .current_dir("/tmp")
            .stdin(Stdio::null());
        ClientCommand { cmd, timeout: Duration::from_secs(120) }
    }

    /// Submits `script` with sbatch --wait as `user` (None = root) and returns
    /// the finished job. `args` go before the script.
    pub fn sbatch_wait(&self, user: Option<&str>, args: &[&str], script: &str) -> Result<JobResult> {
        let out_dir = self.dir.join("out");
        let script_path = out_dir.join(format!("job-{}.sh", unique_suffix()));
        std::fs::write(&script_path, script)?;
        let output_arg = format!("--output={}/%j.out", out_dir.display());
        let mut all: Vec<&str> = vec!["--parsable", "--wait", &output_arg];
        all.extend_from_slice(args);
        let script_arg = script_path.to_str().unwrap().to_string();
        all.push(&script_arg);
        let out = self.client("sbatch", &all).run_as(user)?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let id: u32 = stdout
            .lines()
            .next()
            .and_then(|l| l.split(';').next())
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| anyhow!("sbatch gave no job id: {}{}", stdout, String::from_utf8_lossy(&out.stderr)))?;
        let output = std::fs::read_to_string(out_dir.join(format!("{id}.out"))).unwrap_or_default();
        Ok(JobResult { id, exit_code: out.status.code().unwrap_or(-1), output })
    }

    /// The structured lines the prolog/epilog wrote for `job_id`.
    pub fn hook_log_lines(&self, job_id: u32) -> Vec<String> {
        let text = std::fs::read_to_string(self.dir.join("log/hooks.log")).unwrap_or_default();
        let needle = format!(" job={job_id} ");
        text.lines().filter(|l| l.contains(&needle)).map(String::from).collect()
    }

    /// Polls `f` every 100 ms for 10 s; a test failure with the logs if it
    /// never holds.
    pub fn wait_until(&self, what: &str, mut f: impl FnMut() -> bool) {
        for _ in 0..100 {
            if f() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("timed out waiting for {what}\n{}", self.logs_tail());
    }

    /// Makes slurmd's next prolog on this cluster exit 0 at once without
    /// running gpu-mode-prolog (the hook wrapper removes the request).
    pub fn skip_next_prolog(&self) -> Result<()> {
        std::fs::write(self.dir.join("hooks/prolog-skip-once"), "")?;
        Ok(())
    }

    /// The gpu-mode runtime directory the helpers use.
    pub fn runtime_dir(&self) -> PathBuf {
        self.dir.join("run")
    }

    /// The Prometheus textfile the helpers render (`[metrics] textfile`).
    pub fn metrics_textfile(&self) -> PathBuf {
        self.dir.join("textfile/gpu-mode.prom")
    }

    /// Runs `nvml-sim-ctl` on this cluster's simulated GPUs.
    pub fn sim_ctl(&self, args: &[&str]) -> Result<String> {
        let sim = self.spec.artifacts.sim.as_ref().ok_or_else(|| anyhow!("no simulated GPUs in this cluster"))?;
        let out = Command::new(&sim.nvml_ctl)
            .args(args)
            .env("GPU_MODE_SIM_STATE", self.dir.join("sim/nvml-state.json"))
            .output()?;
        if !out.status.success() {
            bail!("nvml-sim-ctl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `cuda-sim-ctl ARGS`: faults of the simulated CUDA driver (hang, fail,
    /// delay a call; clear).
    pub fn cuda_sim_ctl(&self, args: &[&str]) -> Result<String> {
        let out = Command::new(self.sim_program("cuda-sim-ctl")?)
            .args(args)
            .env("GPU_MODE_SIM_STATE", self.dir.join("sim/nvml-state.json"))
            .output()?;
        if !out.status.success() {
            bail!("cuda-sim-ctl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Lets the test users' programs hold simulated GPU memory
    /// (`cuda-sim-counter`): the simulated NVML state becomes writable by
    /// all and the simulated CUDA driver's folder shared. Returns the line a
    /// job script needs (`export GPU_MODE_SIM_STATE=...`).
    pub fn share_sim_with_users(&self) -> Result<String> {
        use std::os::unix::fs::PermissionsExt;
        let state = self.dir.join("sim/nvml-state.json");
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o666))?;
        let cuda = self.dir.join("sim/nvml-state.json.cuda");
        std::fs::create_dir_all(&cuda)?;
        std::fs::set_permissions(&cuda, std::fs::Permissions::from_mode(0o1777))?;
        Ok(format!("export GPU_MODE_SIM_STATE={}\n", state.display()))
    }

    /// A program of the simulation (`cuda-sim-counter`, `cuda-sim-ctl`).
    pub fn sim_program(&self, name: &str) -> Result<PathBuf> {
        let sim = self.spec.artifacts.sim.as_ref().ok_or_else(|| anyhow!("no simulated GPUs in this cluster"))?;
        Ok(sim.beside(name))
    }

    /// A simulated GPU's compute mode as NVML numbers it (0 default,
    /// 3 exclusive process).
    pub fn sim_compute_mode(&self, gpu: usize) -> Result<u64> {
        self.sim_gpu(gpu)?["compute_mode"].as_u64().ok_or_else(|| anyhow!("no compute_mode for GPU {gpu}"))
    }

    /// The simulated GPU at NVML index `gpu`, as `nvml-sim-ctl show` prints it.
    pub fn sim_gpu(&self, gpu: usize) -> Result<serde_json::Value> {
        let mut state: serde_json::Value = serde_json::from_str(&self.sim_ctl(&["show"])?)?;
        Ok(state["gpus"][gpu].take())
    }

    /// Runs a built helper (prolog, epilog) by hand with a Slurm-like
    /// environment for a made-up job, as slurmd would run it.
    pub fn run_hook(&self, hook: &str, job: u32, user: &str, gpus: &str, mode: &str) -> Result<Output> {
        let u = users::lookup(user)?;
        let mut cmd = Command::new(self.dir.join("hooks").join(hook));
        cmd.env_clear()
            .env("SLURM_JOB_ID", job.to_string())
            .env("SLURM_JOB_UID", u.uid.to_string())
            .env("SLURM_JOB_GID", u.gid.to_string())
            .env("SLURM_JOB_USER", user)
            .env("SLURMD_NODENAME", &self.spec.node_name)
            .env("SLURM_JOB_GPUS", gpus)
            .env("SPANK_GPU_MODE", mode);
        process::output_with_timeout(cmd, Duration::from_secs(60))
    }

    /// Makes the simulated MPS daemons misbehave (see sim/mps): `text` is
    /// the content of their `mps-sim.toml`.
    pub fn set_mps_behaviour(&self, text: &str) -> Result<()> {
        std::fs::write(self.dir.join("sim/mps-sim.toml"), text)?;
        Ok(())
    }

    /// slurmctld/slurmd/hook log tails, for failure messages.
    pub fn logs_tail(&self) -> String {
        let mut files: Vec<String> = ["slurmctld.log", "slurmd.log", "hooks.log", "munged.log"].map(String::from).to_vec();
        if self.spec.second_node.is_some() {
            files.extend(self.spec.node_names().iter().map(|n| format!("slurmd-{n}.log")));
        }
        if self.spec.accounting_db.is_some() {
            files.extend(["slurmdbd.log", "mariadbd.log"].map(String::from));
        }
        files
            .iter()
            .map(|f| {
                let text = std::fs::read_to_string(self.dir.join("log").join(f)).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(15)..].join("\n");
                format!("--- {f} ---\n{tail}")
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Stops slurmd (SIGTERM, as systemd would; the jobs' slurmstepds run
    /// on) and waits until it is gone.
    pub fn stop_slurmd(&self) -> Result<()> {
        let pid_file = self.dir.join("slurmd.pid");
        let pid: i32 = std::fs::read_to_string(&pid_file)?.trim().parse()?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM)?;
        let start = Instant::now();
        while std::path::Path::new(&format!("/proc/{pid}")).exists() && !is_zombie(pid) {
            if start.elapsed() > Duration::from_secs(30) {
                bail!("slurmd {pid} did not stop");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Starts slurmd again (after [`Cluster::stop_slurmd`]) and waits until
    /// the node answers: idle, mixed or allocated (jobs may be running).
    pub fn start_slurmd(&self) -> Result<()> {
        let conf = self.dir.join("slurm.conf");
        self.daemon(&self.install.sbin("slurmd"), &["-N", &self.spec.node_name, "-f", conf.to_str().unwrap()])?;
        let start = Instant::now();
        loop {
            if let Ok((state, _)) = self.node_state() {
                if !state.contains("DOWN") && !state.contains("NOT_RESPONDING") && !state.contains('*') {
                    return Ok(());
                }
            }
            if start.elapsed() > Duration::from_secs(60) {
                bail!("slurmd did not come back\n{}", self.logs_tail());
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Cancels every job, then stops slurmd, slurmctld and munged.
    pub fn stop(&self) {
        if self.stopped.swap(true, Ordering::SeqCst) {
            return;
        }
        let _ = self.client("scancel", &["--full", "--partition", "debug"]).timeout(Duration::from_secs(10)).run_as_root();
        if self.spec.preemption.is_some() {
            let _ = self.client("scancel", &["--full", "--partition", "low,high"]).timeout(Duration::from_secs(10)).run_as_root();
        }
        process::stop_daemons_in(&self.dir);
        // Checkpoint agents run in sessions of their own (not the job's),
        // and a restored tree is its agent's child: neither goes with slurmd.
        process::stop_agents_in(&self.dir);
        if let Some(net) = self.spec.node_net() {
            net.remove();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What `scontrol show job` says of a job: its `Key=Value` fields.
#[derive(Debug, Clone, Default)]
pub struct JobInfo(pub std::collections::BTreeMap<String, String>);

impl JobInfo {
    pub fn get(&self, key: &str) -> &str {
        self.0.get(key).map_or("", String::as_str)
    }

    /// `JobState` (PENDING, RUNNING, COMPLETED, FAILED, ...).
    pub fn state(&self) -> &str {
        self.get("JobState")
    }

    pub fn restarts(&self) -> u32 {
        self.get("Restarts").parse().unwrap_or(0)
    }

    /// Parses `scontrol show job -o` (one line; values hold no `=`-words
    /// of their own except where a value contains spaces, which are joined
    /// back to the key before them).
    pub fn parse(line: &str) -> JobInfo {
        let mut map = std::collections::BTreeMap::new();
        let mut last: Option<String> = None;
        for word in line.split_whitespace() {
            match word.split_once('=') {
                Some((k, v)) if !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == ':' || c == '/') => {
                    map.insert(k.to_string(), v.to_string());
                    last = Some(k.to_string());
                }
                _ => {
                    if let Some(k) = &last {
                        let v: &mut String = map.get_mut(k).unwrap();
                        v.push(' ');
                        v.push_str(word);
                    }
                }
            }
        }
        JobInfo(map)
    }
}

impl Cluster {
    /// Submits `script` with sbatch (no --wait) as `user` (None = root), with
    /// `env` added to the environment sbatch passes to the job, and returns
    /// the job id. Output goes to `out/<id>.out`, appended across requeues.
    pub fn submit(&self, user: Option<&str>, args: &[&str], script: &str, env: &[(String, String)]) -> Result<u32> {
        let out_dir = self.dir.join("out");
        let script_path = out_dir.join(format!("job-{}.sh", unique_suffix()));
        std::fs::write(&script_path, script)?;
        let output_arg = format!("--output={}/%j.out", out_dir.display());
        let mut all: Vec<&str> = vec!["--parsable", &output_arg];
        all.extend_from_slice(args);
        let script_arg = script_path.to_str().unwrap().to_string();
        all.push(&script_arg);
        let mut cmd = self.client("sbatch", &all);
        for (k, v) in env {
            cmd = cmd.env(k, v);
        }
        let out = cmd.run_as(user)?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        jobs::parsable_job_id(&stdout)
            .ok_or_else(|| anyhow!("sbatch {} failed: {}{}", args.join(" "), stdout, String::from_utf8_lossy(&out.stderr)))
    }

    /// `scontrol show job -o <id>`.
    pub fn job(&self, id: u32) -> Result<JobInfo> {
        let out = self.client("scontrol", &["show", "job", "-o", &id.to_string()]).run_as_root()?;
        if !out.status.success() {
            bail!("scontrol show job {id}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(JobInfo::parse(String::from_utf8_lossy(&out.stdout).trim()))
    }

    /// Polls job `id` every 200 ms until `f` holds; an error with the job,
    /// its output and the logs after `timeout`.
    pub fn wait_job(&self, id: u32, what: &str, timeout: Duration, mut f: impl FnMut(&JobInfo) -> bool) -> Result<JobInfo> {
        let start = Instant::now();
        let mut last = JobInfo::default();
        while start.elapsed() < timeout {
            if let Ok(info) = self.job(id) {
                if f(&info) {
                    return Ok(info);
                }
                last = info;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        bail!(
            "job {id}: timed out after {timeout:?} waiting for {what} (state {} restarts {} reason {})\n--- output ---\n{}\n{}",
            last.state(),
            last.restarts(),
            last.get("Reason"),
            self.job_output(id),
            self.logs_tail()
        )
    }

    /// A job's output file (`submit`'s `out/<id>.out`).
    pub fn job_output(&self, id: u32) -> String {
        std::fs::read_to_string(self.dir.join("out").join(format!("{id}.out"))).unwrap_or_default()
    }

    /// What a job needs in its environment to run simulated CUDA programs
    /// (sim/cuda) on this cluster's simulated GPUs; pass it to [`Cluster::submit`].
    pub fn sim_job_env(&self) -> Vec<(String, String)> {
        vec![("GPU_MODE_SIM_STATE".to_string(), self.dir.join("sim/nvml-state.json").display().to_string())]
    }
}

/// A client command with a timeout, run as root or as a test user.
pub struct ClientCommand {
    cmd: Command,
    timeout: Duration,
}

impl ClientCommand {
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }

    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.cmd.env(k, v);
        self
    }

    pub fn run_as_root(self) -> Result<Output> {
        self.run_as(None)
    }

    /// Runs as `user` (uid/gid/groups set by std's Command, no shell, no su).
    pub fn run_as(mut self, user: Option<&str>) -> Result<Output> {
        if let Some(name) = user {
            let u = users::lookup(name)?;
            self.cmd.uid(u.uid).gid(u.gid).env("USER", name).env("HOME", "/tmp");
        }
        process::output_with_timeout(self.cmd, self.timeout)
    }
}

pub(crate) fn unique_suffix() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!("{}-{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst))
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z')))
        .unwrap_or(true)
}
