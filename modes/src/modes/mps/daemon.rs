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
pub use gpu_mode_base::mps_daemons::{processes, DaemonId, MPS_COMM};

/// What a daemon needs to start.
pub struct DaemonSpec<'a> {
    pub program: &'a Path,
    pub who: &'a Identity,
    /// CUDA_VISIBLE_DEVICES for the daemon: GPU UUIDs, so the daemon, its
    /// servers and the clients agree on which GPUs are meant.
    pub devices: &'a [String],
    /// Root-owned `<runtime>/mps`, and the daemon's directory name in it:
    /// the pid file is read by walking from there without following links.
    pub parent: &'a Path,
    pub key: &'a str,
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
    let control = Control { program: spec.program, pipe_dir: spec.pipe_dir, log_dir: spec.log_dir, who: spec.who };
    control.wait_ready(deadline.saturating_duration_since(Instant::now()))?;
    Ok(id)
}

/// The pid file holds a decimal pid: a few bytes are plenty.
const PID_FILE_MAX: usize = 32;

/// Reads the daemon's pid file and checks the process is an MPS daemon of
/// the right user, so a stale or forged file cannot make us track a stranger.
/// The file is in the user's directory: it is read without following links,
/// non-blocking and bounded (audit item H1), so a FIFO or a link to
/// /dev/zero there cannot hang or exhaust the prolog.
fn wait_for_pid(spec: &DaemonSpec, deadline: Instant) -> Result<ProcId, MpsError> {
    let path = spec.pipe_dir.join(PID_FILE);
    loop {
        let text = match crate::fsutil::read_user_file(spec.parent, &[spec.key, "pipe", PID_FILE], spec.who.uid, PID_FILE_MAX) {
            Ok(bytes) => Some(bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(MpsError::Start(format!("daemon pid file: {e}"))),
        };
        let pid = text.and_then(|t| String::from_utf8_lossy(&t).trim().parse::<i32>().ok());
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

/// Whether a process still counts as present. A zombie has ended: it holds
/// no GPU, no memory and no file, and only waits for its parent to reap it
/// (containers and a user's own non-reaping process reap late or never). It
/// is the user's leftover at worst, never a reason to drain (audit item M3).
/// Anything else, a process stuck in the kernel (D) included, is present.
pub fn still_present(p: &ProcInfo) -> bool {
    p.state != 'Z'
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
    /// Ended processes that wait for their parent to reap them, with the
    /// parent: (zombie pid, parent pid).
    pub unreaped: Vec<(i32, i32)>,
    /// Nothing of the daemon was running when the stop began (it was
    /// killed or crashed during the job): said in the epilog's line.
    pub already_gone: bool,
}

/// Stops a daemon and its servers: `quit` through the control socket, then
/// SIGTERM, then SIGKILL to whatever is left, each step bounded.
pub fn stop(control: &Control, daemon: Option<ProcId>, quit_timeout: Duration, kill_timeout: Duration) -> StopOutcome {
    let of = DaemonId { daemon, uid: control.who.uid, pipe_dir: control.pipe_dir };
    let mut tracked: Vec<ProcInfo> = processes(of, &procfs::all());
    let already_gone = daemon.is_some() && tracked.iter().all(|p| !still_present(p));
    let _ = control.send(&["quit".to_string()], quit_timeout);
    let mut zombies = Vec::new();
    let quit_worked = wait_gone(&mut tracked, &mut zombies, of, quit_timeout);
    let mut signalled = Vec::new();
    for signal in [libc::SIGTERM, libc::SIGKILL] {
        if tracked.is_empty() {
            break;
        }
        for p in &tracked {
            // Only the very process we tracked, pinned by a pidfd.
            if procfs::signal_exact(p.id(), signal) {
                signalled.push(p.pid);
            }
        }
        wait_gone(&mut tracked, &mut zombies, of, kill_timeout);
    }
    signalled.sort_unstable();
    signalled.dedup();
    // Zombies init will reap are nobody's leftovers; the others wait for a
    // parent of the user's that does not reap.
    let unreaped = zombies.iter().filter_map(|z| procfs::find(z.id()).map(|p| (p.pid, p.ppid))).filter(|&(_, ppid)| ppid != 1).collect();
    StopOutcome { survivors: tracked, quit_worked, signalled, unreaped, already_gone }
}

/// Waits until every tracked process is gone; keeps tracking servers that
/// appear meanwhile. Processes that became zombies move to `zombies`.
/// Returns whether all went within `timeout`.
fn wait_gone(tracked: &mut Vec<ProcInfo>, zombies: &mut Vec<ProcInfo>, of: DaemonId, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        let now = procfs::all();
        for p in processes(of, &now) {
            if !tracked.iter().any(|t| t.id() == p.id()) {
                tracked.push(p);
            }
        }
        tracked.retain_mut(|t| match now.iter().find(|p| p.id() == t.id()) {
            Some(p) if still_present(p) => {
                *t = p.clone();
                true
            }
            Some(p) => {
                if !zombies.iter().any(|z| z.id() == p.id()) {
                    zombies.push(p.clone());
                }
                false
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
    fn survivors_are_live_or_stuck_processes_never_zombies() {
        let cases = [
            (p(10, 1, 'S', MPS_COMM), true),
            (p(10, 1, 'D', MPS_COMM), true),
            // A zombie under a user's non-reaping process is not a survivor.
            (p(10, 55, 'Z', MPS_COMM), false),
            (p(10, 1, 'Z', MPS_COMM), false),
        ];
        for (proc_, want) in cases {
            assert_eq!(still_present(&proc_), want, "{proc_:?}");
        }
    }

    #[test]
    fn processes_match_the_daemon_and_its_children_only() {
        let daemon = ProcId { pid: 10, start_time: 110 };
        let of = DaemonId { daemon: Some(daemon), uid: 1000, pipe_dir: Path::new("/nonexistent/pipe") };
        let all = vec![
            p(10, 1, 'S', MPS_COMM),           // the daemon
            p(11, 10, 'S', MPS_COMM),          // its server
            p(12, 10, 'S', "python3"),         // a client forked by nobody we own
            p(13, 1, 'S', MPS_COMM),           // another daemon
            ProcInfo { start_time: 999, ..p(10, 1, 'S', MPS_COMM) }, // pid reused
            ProcInfo { uid: 0, ..p(14, 10, 'S', MPS_COMM) },          // not the user's
        ];
        let got: Vec<i32> = processes(of, &all).iter().map(|p| p.pid).collect();
        assert_eq!(got, vec![10, 11]);
    }

    /// Audit item H1: the user's daemon (here a stand-in that plants a FIFO
    /// as its pid file, as a hostile user could) must not hang the prolog.
    #[test]
    fn a_fifo_as_pid_file_fails_the_start_at_once_instead_of_hanging() {
        let dir = tempfile::tempdir().unwrap();
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        crate::fsutil::create_user_tree(dir.path(), "k", &["pipe", "log"], uid, gid, 0o700).unwrap();
        let program = dir.path().join("fake-control");
        let script = format!("#!/bin/sh\n/usr/bin/mkfifo \"$CUDA_MPS_PIPE_DIRECTORY/{PID_FILE}\"\nexit 0\n");
        std::fs::write(&program, script).unwrap();
        std::fs::set_permissions(&program, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let (parent, program2) = (dir.path().to_path_buf(), program.clone());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let who = Identity::of_user_or_bare(uid, gid);
            let (pipe, log) = (parent.join("k/pipe"), parent.join("k/log"));
            let spec = DaemonSpec { program: &program2, who: &who, devices: &[], parent: &parent, key: "k", pipe_dir: &pipe, log_dir: &log };
            let _ = tx.send(start(&spec, Duration::from_secs(3)).map(|_| ()).map_err(|e| e.to_string()));
        });
        let got = rx.recv_timeout(Duration::from_secs(10)).expect("the start hung on the FIFO");
        let err = got.unwrap_err();
        assert!(err.contains("is not a regular file"), "{err}");
    }

    #[test]
    fn children_of_a_reused_daemon_pid_are_not_adopted() {
        // The daemon (pid 10, started at 110) is gone; pid 10 now belongs to
        // another process of the same user whose child is an MPS process.
        let of = DaemonId { daemon: Some(ProcId { pid: 10, start_time: 110 }), uid: 1000, pipe_dir: Path::new("/nonexistent/pipe") };
        let all = vec![ProcInfo { start_time: 555, ..p(10, 1, 'S', "bash") }, p(11, 10, 'S', MPS_COMM)];
        assert!(processes(of, &all).is_empty());
        // An intent record (no daemon yet) adopts no child at all.
        let intent = DaemonId { daemon: None, ..of };
        assert!(processes(intent, &[p(10, 1, 'S', MPS_COMM), p(11, 10, 'S', MPS_COMM)]).is_empty());
    }
}
