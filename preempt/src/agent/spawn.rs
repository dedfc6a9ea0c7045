//! Starting and stopping a job's agent, for the prolog and the epilog.
//!
//! The prolog starts `preempt.agent` (an absolute path from the root-owned
//! config) with an argument vector, an empty environment, in a session of
//! its own (so the prolog's end does not take it along), and waits until its
//! socket exists. The epilog sends it `stop` as root.

use crate::job_env::JobRun;
use gpu_mode_base::gpu_mode::NcclTransport;
use crate::protocol::{self, Request, Response};
use crate::socket_path;
use crate::Config;
use std::io::BufReader;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The only variables the agent gets from the prolog's environment (which
/// is slurmd's, root's): the simulated GPU libraries find their node through
/// the first two (CI; the real driver ignores them, and only the root-owned
/// config decides which library is loaded); SLURM_CONF tells the scontrol of
/// the accounting record (accounting.rs) where a site keeps slurm.conf.
const PASSED_VARS: [&str; 3] = ["GPU_MODE_SIM_STATE", "GPU_MODE_CUDA_SIM_DIR", "SLURM_CONF"];

/// What the prolog knows and the agent needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentLaunch {
    pub run: JobRun,
    /// NVML indices of the job's GPUs, in allocation order (the job state's `gpus`).
    pub gpus: Vec<u32>,
    /// The agent exits by then at the latest (seconds since the epoch).
    pub deadline_unix: Option<u64>,
    /// The config file the prolog itself was given, if not the default.
    pub config: Option<PathBuf>,
    /// The job's NCCL transport, resolved by the prolog against the site
    /// (crate::nccl): passed as `--nccl portable`; native is the agent's
    /// default, the side that refuses NCCL ranks on r580.
    pub nccl: NcclTransport,
    /// The job gets a host memory pool (`pool=on` against
    /// `preempt.host_pool`, resolved by the prolog): passed as `--pool`;
    /// without it the agent sizes none.
    pub pool: bool,
    /// The job's nodes (job_env::job_nodes; empty: unknown). Passed as
    /// `--job-nodes a,b` only when several: the agent then refuses to
    /// checkpoint (one node's processes cannot restore the job).
    pub job_nodes: Vec<String>,
}

impl AgentLaunch {
    /// The agent's argument vector (gpu-mode-ckpt-agent's options).
    pub fn args(&self) -> Vec<String> {
        let mut a = vec![
            "--job".to_string(),
            self.run.job.to_string(),
            "--uid".into(),
            self.run.uid.to_string(),
            "--gid".into(),
            self.run.gid.to_string(),
            "--restart-count".into(),
            self.run.restart_count.to_string(),
            "--node".into(),
            self.run.node.clone(),
        ];
        if !self.gpus.is_empty() {
            a.push("--gpus".into());
            a.push(self.gpus.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(","));
        }
        if let Some(d) = self.deadline_unix {
            a.push("--deadline-unix".into());
            a.push(d.to_string());
        }
        if let Some(c) = &self.config {
            a.push("--config".into());
            a.push(c.display().to_string());
        }
        if self.nccl == NcclTransport::Portable {
            a.push("--nccl".into());
            a.push(self.nccl.as_str().into());
        }
        if self.pool {
            a.push("--pool".into());
        }
        if self.job_nodes.len() > 1 {
            a.push("--job-nodes".into());
            a.push(self.job_nodes.join(","));
        }
        a
    }
}

/// Why the prolog could not start a job's agent or the epilog could not
/// stop it. The prolog drains the node on any of them (Fault::CheckpointAgent)
/// and the epilog logs them; the variants tell a test, or a later caller,
/// which step failed without reading the words.
#[derive(Debug, thiserror::Error)]
pub enum AgentControlError {
    #[error("cannot start {program}: {source}")]
    Start { program: PathBuf, source: std::io::Error },
    /// The agent logs why before it exits: the message points there.
    #[error("{program} exited at start ({status}): see its log lines (journalctl -t slurm-gpu-mode)")]
    ExitedAtStart { program: PathBuf, status: ExitStatus },
    /// The agent was killed and reaped.
    #[error("{program} did not open {socket} within {secs} s")]
    SocketTimeout { program: PathBuf, socket: PathBuf, secs: u64 },
    /// Connecting to the agent's socket or sending it `stop`.
    #[error("{socket}: {source}")]
    Socket { socket: PathBuf, source: std::io::Error },
    /// Setting up the connected socket (its timeout, a second handle).
    #[error(transparent)]
    Stream(#[from] std::io::Error),
    #[error("job {job}'s agent answered {answer:?} to stop")]
    Answer { job: u32, answer: Option<Response> },
    /// Reading the agent's answer (its timeout included).
    #[error("job {job}'s agent: {source}")]
    Receive { job: u32, source: std::io::Error },
}

/// How often the prolog looks for the agent's socket and the epilog for its
/// removal. Every checkpoint job's prolog waits on this: at 20 ms its times
/// came in 20 ms steps (gpu-mode-hook-bench, docs/metrics.md "Hook cost").
const SOCKET_POLL: Duration = Duration::from_millis(5);

/// Starts the job's agent and waits (at most `wait`) for its socket.
/// Returns its pid.
pub fn spawn_agent(cfg: &Config, launch: &AgentLaunch, wait: Duration) -> Result<u32, AgentControlError> {
    let program = &cfg.preempt.agent;
    let socket = socket_path(&cfg.preempt.agent_socket_dir(&cfg.runtime_dir), launch.run.job);
    let _ = crate::fsutil::remove_if_present(&socket);
    let mut cmd = Command::new(program);
    cmd.args(launch.args()).env_clear().current_dir("/").stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    for var in PASSED_VARS {
        if let Some(v) = std::env::var_os(var) {
            cmd.env(var, v);
        }
    }
    // SAFETY: new_session only calls setsid, which is async-signal-safe.
    unsafe {
        cmd.pre_exec(crate::command::new_session);
    }
    let mut child = cmd.spawn().map_err(|source| AgentControlError::Start { program: program.clone(), source })?;
    let start = Instant::now();
    loop {
        if UnixStream::connect(&socket).is_ok() {
            return Ok(child.id());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(AgentControlError::ExitedAtStart { program: program.clone(), status });
        }
        if start.elapsed() > wait {
            let _ = child.kill();
            let _ = child.wait();
            return Err(AgentControlError::SocketTimeout { program: program.clone(), socket, secs: wait.as_secs() });
        }
        std::thread::sleep(SOCKET_POLL);
    }
}

/// Asks job `job`'s agent to exit (as root). `Ok(false)`: no agent was
/// listening (it ended with the job already).
pub fn stop_agent(cfg: &Config, job: u32, wait: Duration) -> Result<bool, AgentControlError> {
    let socket = socket_path(&cfg.preempt.agent_socket_dir(&cfg.runtime_dir), job);
    let stream = match UnixStream::connect(&socket) {
        Ok(s) => s,
        Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused) => {
            let _ = crate::fsutil::remove_if_present(&socket);
            return Ok(false);
        }
        Err(source) => return Err(AgentControlError::Socket { socket, source }),
    };
    stream.set_read_timeout(Some(wait))?;
    let mut out = stream.try_clone()?;
    if let Err(source) = protocol::send(&mut out, &Request::Stop) {
        return Err(AgentControlError::Socket { socket, source });
    }
    match protocol::receive::<Response>(&mut BufReader::new(stream)) {
        Ok(Some(Response::Stopping)) => {
            // The agent removes its socket as it exits. Wait for that (the
            // epilog must leave nothing, and a requeued run's new agent
            // must not have its socket removed by the old one), then remove
            // it if the agent was too slow.
            let deadline = Instant::now() + wait;
            while socket.exists() && Instant::now() < deadline {
                std::thread::sleep(SOCKET_POLL);
            }
            let _ = crate::fsutil::remove_if_present(&socket);
            Ok(true)
        }
        Ok(answer) => Err(AgentControlError::Answer { job, answer }),
        Err(source) => Err(AgentControlError::Receive { job, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in agent on job 5's socket: acks `stop`, then removes its
    /// socket after `remove_after` (never when `None`).
    fn agent(cfg: &Config, remove_after: Option<Duration>) -> PathBuf {
        let socket = socket_path(&cfg.preempt.agent_socket_dir(&cfg.runtime_dir), 5);
        std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let path = socket.clone();
        std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut out = stream.try_clone().unwrap();
            let _ = protocol::receive::<Request>(&mut BufReader::new(stream));
            protocol::send(&mut out, &Response::Stopping).unwrap();
            if let Some(d) = remove_after {
                std::thread::sleep(d);
                std::fs::remove_file(&path).unwrap();
            }
        });
        socket
    }

    #[test]
    fn stop_returns_once_the_agent_removed_its_socket_or_removes_it_itself() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config { runtime_dir: dir.path().join("run"), ..Config::default() };
        let socket = agent(&cfg, Some(Duration::from_millis(300)));
        let start = Instant::now();
        assert_eq!(stop_agent(&cfg, 5, Duration::from_secs(5)).map_err(|e| e.to_string()), Ok(true));
        assert!(!socket.exists() && start.elapsed() >= Duration::from_millis(300), "{:?}", start.elapsed());
        // An agent too slow to go: the socket is removed all the same.
        let socket = agent(&cfg, None);
        assert_eq!(stop_agent(&cfg, 5, Duration::from_millis(200)).map_err(|e| e.to_string()), Ok(true));
        assert!(!socket.exists());
    }

    #[test]
    fn the_agent_gets_an_argument_vector() {
        let l = AgentLaunch {
            run: JobRun { job: 7, restart_count: 2, uid: 1001, gid: 1001, node: "n1".into() },
            gpus: vec![1, 0],
            deadline_unix: Some(99),
            config: Some("/etc/x.toml".into()),
            nccl: NcclTransport::Native,
            pool: false,
            job_nodes: vec!["n1".into()],
        };
        assert_eq!(
            l.args().join(" "),
            "--job 7 --uid 1001 --gid 1001 --restart-count 2 --node n1 --gpus 1,0 --deadline-unix 99 --config /etc/x.toml"
        );
        let portable = AgentLaunch { nccl: NcclTransport::Portable, ..l.clone() };
        assert!(portable.args().join(" ").ends_with("--config /etc/x.toml --nccl portable"), "{:?}", portable.args());
        let pool = AgentLaunch { pool: true, ..l.clone() };
        assert!(pool.args().join(" ").ends_with("--config /etc/x.toml --pool"), "{:?}", pool.args());
        let both = AgentLaunch { nccl: NcclTransport::Portable, pool: true, ..l.clone() };
        assert!(both.args().join(" ").ends_with("--config /etc/x.toml --nccl portable --pool"), "{:?}", both.args());
        let two = AgentLaunch { job_nodes: vec!["n1".into(), "n2".into()], ..l };
        assert!(two.args().join(" ").ends_with("--config /etc/x.toml --job-nodes n1,n2"), "{:?}", two.args());
    }

    #[test]
    fn stopping_an_absent_agent_is_not_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = Config::default();
        cfg.preempt.agent_socket_dir = Some(dir.path().to_path_buf());
        assert_eq!(stop_agent(&cfg, 7, Duration::from_secs(1)).map_err(|e| e.to_string()), Ok(false));
    }

    #[test]
    fn a_missing_agent_binary_is_named() {
        let mut cfg = Config::default();
        cfg.preempt.agent = "/nonexistent/gpu-mode-ckpt-agent".into();
        let dir = tempfile::tempdir().unwrap();
        cfg.preempt.agent_socket_dir = Some(dir.path().to_path_buf());
        let l = AgentLaunch { run: JobRun { job: 1, restart_count: 0, uid: 0, gid: 0, node: "n".into() }, gpus: vec![], deadline_unix: None, config: None, nccl: NcclTransport::Native, pool: false, job_nodes: vec![] };
        let err = spawn_agent(&cfg, &l, Duration::from_secs(1)).unwrap_err();
        assert!(matches!(err, AgentControlError::Start { .. }), "{err:?}");
        assert!(err.to_string().contains("cannot start /nonexistent/gpu-mode-ckpt-agent"), "{err}");
    }

    /// Spawns the agent `program` of job 1, trying again while the script
    /// just written is still busy (ETXTBSY: another test forked meanwhile).
    fn spawn_program(program: &std::path::Path, socket_dir: &std::path::Path) -> Result<u32, AgentControlError> {
        let mut cfg = Config::default();
        cfg.preempt.agent = program.to_path_buf();
        cfg.preempt.agent_socket_dir = Some(socket_dir.to_path_buf());
        let l = AgentLaunch { run: JobRun { job: 1, restart_count: 0, uid: 0, gid: 0, node: "n".into() }, gpus: vec![], deadline_unix: None, config: None, nccl: NcclTransport::Native, pool: false, job_nodes: vec![] };
        for _ in 0..50 {
            match spawn_agent(&cfg, &l, Duration::from_millis(300)) {
                Err(AgentControlError::Start { source, .. }) if source.raw_os_error() == Some(libc::ETXTBSY) => std::thread::sleep(Duration::from_millis(10)),
                other => return other,
            }
        }
        spawn_agent(&cfg, &l, Duration::from_millis(300))
    }

    /// An agent that exits at once and one that never opens its socket: each
    /// its own variant, with the words the prolog's drain reason carried before.
    #[test]
    fn an_agent_that_exits_or_never_listens_is_told_apart() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let cases = [("exits", "exit 3", "exited at start (exit status: 3): see its log lines (journalctl -t slurm-gpu-mode)"), ("sleeps", "exec sleep 5", "did not open")];
        for (name, body, words) in cases {
            let program = dir.path().join(name);
            std::fs::write(&program, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
            let err = spawn_program(&program, dir.path()).unwrap_err();
            let text = err.to_string();
            match name {
                "exits" => assert!(matches!(err, AgentControlError::ExitedAtStart { .. }), "{err:?}"),
                _ => {
                    assert!(matches!(err, AgentControlError::SocketTimeout { secs: 0, .. }), "{err:?}");
                    let socket = socket_path(dir.path(), 1);
                    assert_eq!(text, format!("{} did not open {} within 0 s", program.display(), socket.display()));
                }
            }
            assert!(text.starts_with(&program.display().to_string()) && text.contains(words), "{text}");
        }
    }
}
