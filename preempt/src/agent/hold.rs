//! The hold the user cannot lift (security review N1, third item). CRIU
//! restores the tree as the job's user and, asked to leave it stopped,
//! used to leave it stopped by SIGSTOP: any process of the same user could
//! resume it with SIGCONT before the agent had checked it. Now CRIU runs
//! this agent's own binary as its action script (`--action-script`). At
//! `pre-resume` every restored task is still stopped under CRIU's ptrace,
//! which SIGCONT does not lift; the script ([`script_main`]) asks the agent
//! over its socket (`Request::Hold`) whether the tree may run, and the
//! agent checks the tree then ([`Agent::hold_request`]): pinned by pidfds,
//! with the strays of its session. A refusal kills the tree first and
//! fails the script, and a failed (or killed) `pre-resume` script aborts
//! CRIU's restore (packaging/criu/0006). Only CRIU's own child running the
//! agent's binary is heard: a process of the user cannot answer for it.

use super::restore::RestoredCheckError;
use super::server::Peer;
use super::Agent;
use crate::criu::TargetCgroup;
use crate::manifest::Manifest;
use crate::procfs;
use crate::protocol::{self, Request, Response};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Set by CRIU for its action scripts: the stage it is at.
pub const ACTION_ENV: &str = "CRTOOLS_SCRIPT_ACTION";
/// Set by the agent in CRIU's environment: its socket, for the script.
pub use crate::criu::HOLD_SOCKET_ENV as SOCKET_ENV;
/// The stage at which the script holds the restore.
const HOLD_ACTION: &str = "pre-resume";
/// How long the script waits for the agent's verdict (its checks take
/// milliseconds; CRIU's own timeout bounds the whole restore anyway).
const HOLD_WAIT: Duration = Duration::from_secs(120);

/// Where a restore holds, for the agent: the action script (the agent's
/// own binary) and the CRIU that must be its parent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldSettings {
    pub script: PathBuf,
    pub criu: PathBuf,
}

/// The action script's side, run by CRIU as the job's user with the
/// agent's binary: every stage but `pre-resume` passes at once; at
/// `pre-resume` the agent's answer decides (0: proceed). Anything else,
/// no socket, no answer in time, is a failure, which aborts the restore.
pub fn script_main(action: &str, socket: Option<&std::ffi::OsStr>) -> i32 {
    if action != HOLD_ACTION {
        return 0;
    }
    let Some(socket) = socket else {
        eprintln!("gpu-mode hold: no {SOCKET_ENV}: the restore is not let go");
        return 1;
    };
    match ask(Path::new(socket)) {
        Ok(Response::Proceed) => 0,
        Ok(Response::Error { message }) => {
            eprintln!("gpu-mode hold: {message}");
            1
        }
        Ok(other) => {
            eprintln!("gpu-mode hold: unexpected answer {other:?}");
            1
        }
        Err(e) => {
            eprintln!("gpu-mode hold: {e}");
            1
        }
    }
}

fn ask(socket: &Path) -> std::io::Result<Response> {
    let stream = std::os::unix::net::UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(HOLD_WAIT))?;
    protocol::send(&mut stream.try_clone()?, &Request::Hold)?;
    protocol::receive::<Response>(&mut std::io::BufReader::new(stream))?
        .ok_or_else(|| std::io::Error::other("the agent closed the connection without an answer"))
}

/// A restore waiting at CRIU's `pre-resume` for the agent's checks.
pub(super) struct Pending {
    pub root: i32,
    pub manifest: Manifest,
    pub cgroup: TargetCgroup,
    /// The image's pages files, which the tree may hold mapped (held.rs).
    pub pages: crate::held::ImagePages,
    pub settings: HoldSettings,
    /// The checks' outcome, once the script asked: the tree pinned, or why
    /// it was refused (and killed).
    pub outcome: Option<Result<Vec<procfs::Pinned>, RestoredCheckError>>,
}

/// Why a `Request::Hold` is not answered with a verdict.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HoldRefused {
    #[error("no restore of this agent is waiting at its hold: refused")]
    NoneWaiting,
    #[error("the restore's hold was already answered: refused")]
    Answered,
    /// The caller is not CRIU's child running the agent's binary.
    #[error("pid {pid} is not the action script of this agent's CRIU ({why}): refused")]
    NotTheScript { pid: i32, why: String },
}

/// Whether `pid` is the script CRIU started for this agent: it runs the
/// agent's binary (`settings.script`), its parent runs `settings.criu`,
/// and that parent is this agent's child. A process of the job's user can
/// be none of these (the restored tasks, the agent's other children of
/// that uid, are still held by CRIU when the script runs).
pub(super) fn is_the_script(pid: i32, settings: &HoldSettings) -> Result<(), String> {
    let me = std::process::id() as i32;
    let same_file = |a: &Path, b: &Path| {
        use std::os::unix::fs::MetadataExt;
        matches!((std::fs::metadata(a), std::fs::metadata(b)), (Ok(x), Ok(y)) if (x.dev(), x.ino()) == (y.dev(), y.ino()))
    };
    let parent = procfs::read(pid).ok_or("gone")?.ppid;
    if !same_file(Path::new(&format!("/proc/{pid}/exe")), &settings.script) {
        return Err(format!("it does not run {}", settings.script.display()));
    }
    if !same_file(Path::new(&format!("/proc/{parent}/exe")), &settings.criu) {
        return Err(format!("its parent {parent} does not run {}", settings.criu.display()));
    }
    if procfs::read(parent).is_none_or(|p| p.ppid != me) {
        return Err(format!("its parent {parent} is not this agent's child"));
    }
    Ok(())
}

impl Agent {
    /// `Request::Hold` from CRIU's action script: the restored tree, still
    /// held by CRIU, is pinned and checked now; a refusal kills it before
    /// the answer. The restore's thread reads the outcome when CRIU ends.
    pub(super) fn hold_request(&self, peer: Peer) -> Response {
        let mut slot = self.hold.lock().unwrap_or_else(|p| p.into_inner());
        let verdict = match slot.as_mut() {
            None => Err(HoldRefused::NoneWaiting),
            Some(p) if p.outcome.is_some() => Err(HoldRefused::Answered),
            Some(p) => match is_the_script(peer.pid, &p.settings) {
                Err(why) => Err(HoldRefused::NotTheScript { pid: peer.pid, why }),
                Ok(()) => Ok(p),
            },
        };
        let p = match verdict {
            Ok(p) => p,
            Err(refused) => {
                let message = refused.to_string();
                self.refused(peer.uid, "restore-hold", super::RefusalKind::Unauthorized, &message);
                return Response::Error { message };
            }
        };
        let (tree, checked) = self.pin_and_check(p.root, &p.manifest, &p.cgroup, &p.pages);
        let answer = match &checked {
            Ok(()) => Response::Proceed,
            Err(e) => {
                for t in &tree {
                    t.signal(libc::SIGKILL);
                }
                Response::Error { message: format!("{e}; the restored processes were killed") }
            }
        };
        p.outcome = Some(checked.map(|_| tree));
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The script passes every stage but pre-resume, and fails there
    /// without a socket or an agent.
    #[test]
    fn the_script_holds_only_at_pre_resume_and_fails_without_an_agent() {
        for action in ["pre-restore", "post-restore", "setup-namespaces", "post-setup-namespaces", "post-resume", "network-lock"] {
            assert_eq!(script_main(action, None), 0, "{action}");
        }
        assert_eq!(script_main("pre-resume", None), 1);
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(script_main("pre-resume", Some(dir.path().join("none.sock").as_os_str())), 1);
    }

    /// Only CRIU's child running the agent's binary is the script: this
    /// test process's own child (not run by CRIU) is not.
    #[test]
    fn a_process_that_is_not_criu_s_child_running_the_agent_is_not_the_script() {
        let mut child = std::process::Command::new("/bin/sleep").arg("5").spawn().unwrap();
        let settings = HoldSettings { script: "/bin/sleep".into(), criu: "/opt/slurm-gpu-mode/criu/bin/criu".into() };
        let err = is_the_script(child.id() as i32, &settings).unwrap_err();
        assert!(err.contains("does not run /opt/slurm-gpu-mode/criu/bin/criu"), "{err}");
        let other = HoldSettings { script: "/bin/true".into(), ..settings };
        assert!(is_the_script(child.id() as i32, &other).unwrap_err().contains("it does not run /bin/true"));
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(is_the_script(i32::MAX, &other).unwrap_err(), "gone");
    }
}
