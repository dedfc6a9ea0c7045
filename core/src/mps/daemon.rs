//! Starting one MPS control daemon as the job's user, finding its processes,
//! and stopping them: `quit`, then SIGTERM, then SIGKILL, each bounded.

use super::control::{Control, LOG_VAR, PIPE_VAR};
use super::MpsError;
use crate::privdrop::{spawn_as, Identity};
use crate::procfs::{self, ProcId, ProcInfo};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

/// The daemon writes its pid here, in its pipe directory.
pub const PID_FILE: &str = "nvidia-cuda-mps-control.pid";
/// The kernel keeps 15 bytes of a command name: the control daemon and the
/// servers both show as this.
pub const MPS_COMM: &str = "nvidia-cuda-mps";

/// What a daemon needs to start.
pub struct DaemonSpec<'a> {
    pub program: &'a Path,
    pub who: &'a Identity,
    /// CUDA_VISIBLE_DEVICES for the daemon: GPU UUIDs, so the daemon, its
    /// servers and the clients agree on which GPUs are meant.
    pub devices: &'a [String],
    pub pipe_dir: &'a Path,
    pub log_dir: &'a Path,
}

/// Starts `nvidia-cuda-mps-control -d` as the user with a minimal environment
/// and waits (bounded) until it answers. Returns the daemon's identity.
pub fn start(spec: &DaemonSpec, timeout: Duration) -> Result<ProcId, MpsError> {
    let deadline = Instant::now() + timeout;
    let env: BTreeMap<String, String> = [
        ("CUDA_VISIBLE_DEVICES".to_string(), spec.devices.join(",")),
        (PIPE_VAR.to_string(), spec.pipe_dir.display().to_string()),
        (LOG_VAR.to_string(), spec.log_dir.display().to_string()),
    ]
    .into();
    let mut child = spawn_as(spec.program, &["-d"], &env, spec.who).map_err(MpsError::Spawn)?;
    // `-d` forks the daemon and returns; a non-zero exit means no daemon.
    let status = loop {
        if let Some(s) = child.try_wait().map_err(|e| MpsError::Start(e.to_string()))? {
            break s;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(MpsError::Start(format!("`{} -d` did not return within {:?}", spec.program.display(), timeout)));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    if !status.success() {
        return Err(MpsError::Start(format!(
            "`{} -d` exited with {status}; see {}/control.log",
            spec.program.display(),
            spec.log_dir.display()
        )));
    }
    let id = wait_for_pid(spec, deadline)?;
    let control = Control { program: spec.program, pipe_dir: spec.pipe_dir, log_dir: spec.log_dir };
    control.wait_ready(deadline.saturating_duration_since(Instant::now()))?;
    Ok(id)
}

/// Reads the daemon's pid file and checks the process is an MPS daemon of
/// the right user, so a stale or forged file cannot make us track a stranger.
fn wait_for_pid(spec: &DaemonSpec, deadline: Instant) -> Result<ProcId, MpsError> {
    let path = spec.pipe_dir.join(PID_FILE);
    loop {
        let pid = std::fs::read_to_string(&path).ok().and_then(|t| t.trim().parse::<i32>().ok());
        if let Some(p) = pid.and_then(procfs::read) {
            if p.comm.starts_with(MPS_COMM) && p.uid == spec.who.uid {
                return Ok(p.id());
            }
            return Err(MpsError::Start(format!(
                "{} names pid {} ({}, uid {}), not an MPS daemon of uid {}",
                path.display(),
                p.pid,
                p.comm,
                p.uid,
                spec.who.uid
            )));
        }
        if Instant::now() >= deadline {
            return Err(MpsError::Start(format!("no live daemon pid in {}", path.display())));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The daemon (if still alive as the same process) and every MPS server it
/// started: children of the daemon, or MPS processes whose environment names
/// the daemon's pipe directory (servers outlive a killed daemon).
pub fn processes(daemon: ProcId, pipe_dir: &Path, all: &[ProcInfo]) -> Vec<ProcInfo> {
    let pipe = pipe_dir.to_string_lossy();
    all.iter()
        .filter(|p| p.comm.starts_with(MPS_COMM))
        .filter(|p| {
            p.id() == daemon
                || p.ppid == daemon.pid
                || procfs::environ_var(p.pid, PIPE_VAR).is_some_and(|v| v == pipe)
        })
        .cloned()
        .collect()
}

/// Whether a process still counts as present. A zombie whose parent is init
/// has ended and only waits to be reaped (containers reap late); any other
/// zombie, or a process in uninterruptible sleep, is a survivor.
pub fn still_present(p: &ProcInfo) -> bool {
    !(p.state == 'Z' && p.ppid == 1)
}

/// What the stop sequence left behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopOutcome {
    /// Processes still there after quit, SIGTERM and SIGKILL.
    pub survivors: Vec<ProcInfo>,
    /// Whether the daemon acted on `quit` before the timeout.
    pub quit_worked: bool,
    /// Processes that needed a signal.
    pub signalled: Vec<i32>,
}

/// Stops a daemon and its servers: `quit` through the control socket, then
/// SIGTERM, then SIGKILL to whatever is left, each step bounded.
pub fn stop(control: &Control, daemon: ProcId, quit_timeout: Duration, kill_timeout: Duration) -> StopOutcome {
    let mut tracked: Vec<ProcInfo> = processes(daemon, control.pipe_dir, &procfs::all());
    let _ = control.send(&["quit".to_string()], quit_timeout);
    let quit_worked = wait_gone(&mut tracked, control.pipe_dir, daemon, quit_timeout);
    let mut signalled = Vec::new();
    for signal in [libc::SIGTERM, libc::SIGKILL] {
        if tracked.is_empty() {
            break;
        }
        for p in &tracked {
            // Only signal the very process we tracked (same start time).
            if procfs::find(p.id()).is_some() {
                unsafe { libc::kill(p.pid, signal) };
                signalled.push(p.pid);
            }
        }
        wait_gone(&mut tracked, control.pipe_dir, daemon, kill_timeout);
    }
    signalled.sort_unstable();
    signalled.dedup();
    StopOutcome { survivors: tracked, quit_worked, signalled }
}

/// Waits until every tracked process is gone; keeps tracking servers that
/// appear meanwhile. Returns whether all went within `timeout`.
fn wait_gone(tracked: &mut Vec<ProcInfo>, pipe_dir: &Path, daemon: ProcId, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        let now = procfs::all();
        for p in processes(daemon, pipe_dir, &now) {
            if !tracked.iter().any(|t| t.id() == p.id()) {
                tracked.push(p);
            }
        }
        tracked.retain_mut(|t| match now.iter().find(|p| p.id() == t.id()) {
            Some(p) => {
                *t = p.clone();
                still_present(p)
            }
            None => false,
        });
        if tracked.is_empty() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pid: i32, ppid: i32, state: char, comm: &str) -> ProcInfo {
        ProcInfo { pid, ppid, uid: 1000, comm: comm.into(), state, start_time: 100 + pid as u64 }
    }

    #[test]
    fn survivors_are_live_or_stuck_processes_but_not_zombies_awaiting_init() {
        let cases = [
            (p(10, 1, 'S', MPS_COMM), true),
            (p(10, 1, 'D', MPS_COMM), true),
            (p(10, 55, 'Z', MPS_COMM), true),
            (p(10, 1, 'Z', MPS_COMM), false),
        ];
        for (proc_, want) in cases {
            assert_eq!(still_present(&proc_), want, "{proc_:?}");
        }
    }

    #[test]
    fn processes_match_the_daemon_and_its_children_only() {
        let daemon = ProcId { pid: 10, start_time: 110 };
        let all = vec![
            p(10, 1, 'S', MPS_COMM),           // the daemon
            p(11, 10, 'S', MPS_COMM),          // its server
            p(12, 10, 'S', "python3"),         // a client forked by nobody we own
            p(13, 1, 'S', MPS_COMM),           // another daemon
            ProcInfo { start_time: 999, ..p(10, 1, 'S', MPS_COMM) }, // pid reused
        ];
        let got: Vec<i32> = processes(daemon, Path::new("/nonexistent/pipe"), &all).iter().map(|p| p.pid).collect();
        assert_eq!(got, vec![10, 11]);
    }
}
