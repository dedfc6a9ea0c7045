//! The agent's socket: `<socket_dir>/job-<J>.sock` in a root-owned 0711
//! directory (others may pass through, not list or create), the socket
//! owned by the job's user with mode 0600, and the peer's uid checked with
//! SO_PEERCRED on every connection (the file mode alone is not trusted).
//! One thread per connection; requests are a line each (protocol.rs).

use super::{Agent, FailureReason, RefusalKind, RequestError, RootState};
use crate::fsutil;
use crate::log::Outcome;
use crate::metrics::{self, Event};
use crate::accounting::EventKind;
use crate::protocol::{self, ExitInfo, ImageInfo, Request, Response};
use crate::socket_path;
use std::io::BufReader;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the agent looks at the job's processes.
const LIFE_CHECK: Duration = Duration::from_secs(1);
/// Connections of the job's user served at once. The wrapper needs one or
/// two (a restore keeps its own open until the tree ends); each is a thread
/// of a root process outside the job's cgroup, so a flood is refused here
/// rather than left to the node's thread limit. Root (the epilog) is not
/// counted: its `stop` always gets through.
const MAX_USER_CONNECTIONS: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitReason {
    Stopped,
    Deadline,
    JobGone,
    NeverStarted,
}

/// Binds the job's socket (see module docs). The directory must be root's:
/// the agent refuses one that someone else owns.
pub fn listen(socket_dir: &Path, job: u32, uid: u32, gid: u32) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let (me, my_gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    fsutil::ensure_private_dir(socket_dir, me, my_gid, 0o711)?;
    let path = socket_path(socket_dir, job);
    fsutil::remove_if_present(&path)?;
    let listener = UnixListener::bind(&path)?;
    // The directory is root's and not writable by others: these path
    // operations cannot be redirected. SO_PEERCRED covers the moment
    // between bind and chmod.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    std::os::unix::fs::chown(&path, Some(uid), Some(gid))?;
    Ok(listener)
}

/// The peer of a connection, from the kernel (SO_PEERCRED).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    pub pid: i32,
    pub uid: u32,
}

pub fn peer_of(stream: &UnixStream) -> std::io::Result<Peer> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred { pid: 0, uid: u32::MAX, gid: u32::MAX };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED fills a ucred of the given size.
    let rc = unsafe {
        libc::getsockopt(stream.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERCRED, (&mut cred as *mut libc::ucred).cast(), &mut len)
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(Peer { pid: cred.pid, uid: cred.uid })
}

/// A caller the agent does not serve (refusal kind `unauthorized`): the
/// answer's message and the refusal's log line, each the words of before.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unauthorized {
    /// Neither the job's user nor root.
    #[error("refused: this agent serves job {job} of uid {job_uid}; the caller (pid {pid}) is uid {uid}")]
    OtherUser { job: u32, job_uid: u32, pid: i32, uid: u32 },
    /// `stop` from anyone but root.
    #[error("refused: only root (the epilog) stops the agent")]
    Stop,
}

/// Only the job's user and root; only root may stop the agent.
pub fn authorize(peer: Peer, job_uid: u32, job: u32, req: &Request) -> Result<(), Unauthorized> {
    if peer.uid != job_uid && peer.uid != 0 {
        return Err(Unauthorized::OtherUser { job, job_uid, pid: peer.pid, uid: peer.uid });
    }
    if matches!(req, Request::Stop) && peer.uid != 0 {
        return Err(Unauthorized::Stop);
    }
    Ok(())
}

/// A request's reader with one deadline for the whole request: a read
/// timeout alone starts again with every byte, so a peer trickling its
/// request would hold the thread for good.
struct DeadlineReader {
    stream: UnixStream,
    deadline: Instant,
}

impl std::io::Read for DeadlineReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the request did not arrive in time"));
        }
        self.stream.set_read_timeout(Some(left))?;
        self.stream.read(buf)
    }
}

/// How often the accept loop looks at its reasons to exit while no peer comes.
const ACCEPT_TICK: Duration = Duration::from_millis(50);

/// Waits until a peer is there to accept, or `tick` has passed. A peer wakes
/// it at once: a checkpoint request, the first step after the signal, must
/// not wait out a sleep (it cost 25 ms on average, 50 at worst, between the
/// signal and the driver call).
fn wait_for_peer(listener: &UnixListener, tick: Duration) {
    use std::os::fd::AsRawFd;
    let mut fd = libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one pollfd we own, for the call's length. An error or EINTR
    // only ends the wait early; the accept that follows tells.
    unsafe { libc::poll(&mut fd, 1, tick.as_millis() as libc::c_int) };
}

/// When the agent should end, watched from the accept loop.
struct Life {
    seen: bool,
    last_seen: Instant,
    last_check: Option<Instant>,
}

impl Agent {
    /// Accepts connections until a reason to exit; returns it. Connection
    /// threads are detached: the caller exits the process afterwards.
    pub fn serve(self: &Arc<Self>, listener: UnixListener) -> std::io::Result<ExitReason> {
        listener.set_nonblocking(true)?;
        let mut life = Life { seen: false, last_seen: Instant::now(), last_check: None };
        loop {
            if let Some(reason) = self.exit_reason(&mut life) {
                self.report_unlogged_refusals();
                return Ok(reason);
            }
            match listener.accept() {
                Ok((stream, _)) => self.admit(stream),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => wait_for_peer(&listener, ACCEPT_TICK),
                Err(e) => {
                    self.log("agent-accept", Outcome::Failed, &e.to_string());
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    }

    fn exit_reason(&self, life: &mut Life) -> Option<ExitReason> {
        if self.stop.load(Ordering::SeqCst) {
            return Some(ExitReason::Stopped);
        }
        if self.params.deadline.is_some_and(|d| std::time::SystemTime::now() >= d) {
            return Some(ExitReason::Deadline);
        }
        if life.last_check.is_some_and(|t| t.elapsed() < LIFE_CHECK) {
            return None;
        }
        life.last_check = Some(Instant::now());
        // A scan that fails (processes of several users naming the job)
        // counts as "still there": never exit on doubt.
        let alive = self.host.job_processes(self.params.run.job).map_or(true, |(p, _)| !p.is_empty());
        let busy = self.op.try_lock().is_err() || !self.restored.lock().unwrap_or_else(|p| p.into_inner()).is_empty();
        if alive || busy {
            life.seen |= alive;
            life.last_seen = Instant::now();
            return None;
        }
        if life.seen && life.last_seen.elapsed() > self.settings.idle_exit {
            return Some(ExitReason::JobGone);
        }
        (!life.seen && self.started.elapsed() > self.settings.start_grace).then_some(ExitReason::NeverStarted)
    }

    /// A thread for the connection, unless the job's user has
    /// [`MAX_USER_CONNECTIONS`] open already: then one error line, closed.
    fn admit(self: &Arc<Self>, stream: UnixStream) {
        let counted = !peer_of(&stream).is_ok_and(|p| p.uid == 0);
        if counted && self.connections.fetch_add(1, Ordering::SeqCst) >= MAX_USER_CONNECTIONS {
            self.connections.fetch_sub(1, Ordering::SeqCst);
            // Never block the accept loop on a peer that does not read.
            let _ = stream.set_nonblocking(true);
            let message = format!("refused: {MAX_USER_CONNECTIONS} connections to job {}'s agent are open already", self.params.run.job);
            let _ = protocol::send(&mut &stream, &Response::Error { message });
            return;
        }
        let me = Arc::clone(self);
        let spawned = std::thread::Builder::new().spawn(move || {
            me.handle(stream);
            if counted {
                me.connections.fetch_sub(1, Ordering::SeqCst);
            }
        });
        if spawned.is_err() && counted {
            self.connections.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn handle(&self, stream: UnixStream) {
        let Ok(mut out) = stream.try_clone() else { return };
        let mut reader = BufReader::new(DeadlineReader { stream, deadline: Instant::now() + self.settings.request_wait });
        let reply = |out: &mut UnixStream, r: &Response| {
            let _ = protocol::send(out, r);
        };
        let peer = match peer_of(&out) {
            Ok(p) => p,
            Err(e) => return reply(&mut out, &Response::Error { message: format!("cannot identify the caller: {e}") }),
        };
        let req = match protocol::receive::<Request>(&mut reader) {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(e) => return reply(&mut out, &Response::Error { message: e.to_string() }),
        };
        // Before anything else: a request over budget costs nothing more.
        if let Err(over) = self.within_budget(peer.uid) {
            return reply(&mut out, &Response::Error { message: over.to_string() });
        }
        if let Err(refusal) = authorize(peer, self.params.run.uid, self.params.run.job, &req) {
            let message = refusal.to_string();
            self.refused(peer.uid, "agent-refused", RefusalKind::Unauthorized, &message);
            return reply(&mut out, &Response::Error { message });
        }
        match req {
            Request::Hello => reply(&mut out, &self.hello()),
            Request::Checkpoint { root_pid, signal_at_ms } => reply(&mut out, &self.checkpoint_request(peer, root_pid, signal_at_ms)),
            Request::Restore => self.restore_request(peer, &mut out),
            Request::Stop => {
                self.stop.store(true, Ordering::SeqCst);
                reply(&mut out, &Response::Stopping);
            }
            Request::Hold => reply(&mut out, &self.hold_request(peer)),
        }
    }

    /// What the wrapper needs to know first: is there an image to restore?
    /// A run staged on another node whose copy is under way is waited for
    /// here (Agent::locate), so the answer is final.
    fn hello(&self) -> Response {
        let (located, note) = self.locate();
        let image = located.map(|l| (l.restart, l.dir)).map(|(restart, dir)| match super::super::Manifest::load(&dir) {
            Ok(m) => ImageInfo { restart_count: m.restart_count, node: m.node, image_bytes: m.image_bytes, created_unix: m.created_unix },
            // Unreadable: the restore will say why, precisely.
            Err(_) => ImageInfo { restart_count: restart, node: "(manifest unreadable)".into(), image_bytes: 0, created_unix: 0 },
        });
        Response::Hello {
            job: self.params.run.job,
            restart_count: self.params.run.restart_count,
            image,
            criu: self.criu_status().clone(),
            note,
        }
    }

    pub(super) fn checkpoint_request(&self, peer: Peer, root: i32, signal_at_ms: Option<u64>) -> Response {
        let start = Instant::now();
        match self.checkpoint(peer, root, signal_at_ms) {
            Ok(summary) => {
                let detail = format!("{} bytes in {:.0} ms", summary.image_bytes, summary.timings.total_ms);
                self.log("checkpoint", Outcome::Ok, &detail);
                let mut events = vec![
                    Event::count(metrics::CHECKPOINTS, vec![("outcome", "ok".into())]),
                    Event::Add { family: metrics::CHECKPOINT_BYTES, labels: vec![], by: summary.image_bytes as f64 },
                ];
                events.extend(metrics::phase_events(metrics::CHECKPOINT_PHASE, &metrics::phases_of(&summary.timings)));
                self.count(&events);
                self.account(EventKind::Checkpoint, summary.timings.total_ms / 1000.0, Some(summary.image_bytes));
                Response::Checkpointed(summary)
            }
            Err(RequestError::Refused { kind, message }) => {
                self.refused(peer.uid, "checkpoint", kind, &message);
                Response::Error { message }
            }
            Err(e @ (RequestError::Failed { .. } | RequestError::NotHere(_) | RequestError::TreeLost { .. })) => {
                let lost = matches!(e, RequestError::TreeLost { .. });
                let message = e.to_string();
                self.log("checkpoint", Outcome::Failed, &message);
                self.count(&failure_events(metrics::CHECKPOINTS, metrics::CHECKPOINT_FAILURES, &e));
                self.account(EventKind::CheckpointFailed, start.elapsed().as_secs_f64(), None);
                if lost {
                    Response::TreeLost { message }
                } else {
                    Response::Error { message }
                }
            }
        }
    }

    /// Restores, answers `restored`, then waits for the tree and answers
    /// how it ended (or that it was dumped again). A restore's event is
    /// recorded after the answer: the application runs meanwhile.
    pub(super) fn restore_request(&self, peer: Peer, out: &mut UnixStream) {
        let start = Instant::now();
        let (pid, summary) = match self.restore(peer) {
            Ok(r) => r,
            Err(RequestError::Refused { kind, message }) => {
                self.refused(peer.uid, "restore", kind, &message);
                let _ = protocol::send(out, &Response::Error { message });
                return;
            }
            Err(e @ (RequestError::Failed { .. } | RequestError::NotHere(_) | RequestError::TreeLost { .. })) => {
                let movable = matches!(e, RequestError::NotHere(_));
                let message = e.to_string();
                self.log("restore", Outcome::Failed, &message);
                self.count(&failure_events(metrics::RESTORES, metrics::RESTORE_FAILURES, &e));
                // Before the answer: the job fails (or is requeued) on it,
                // and Slurm takes no update of a finished job.
                self.account(EventKind::RestoreFailed, start.elapsed().as_secs_f64(), None);
                let answer = if movable { Response::NotHere { message } } else { Response::Error { message } };
                let _ = protocol::send(out, &answer);
                return;
            }
        };
        self.log("restore", Outcome::Ok, &format!("pid {pid} from restart {}", summary.from_restart));
        let mut events = vec![Event::count(metrics::RESTORES, vec![("outcome", "ok".into())])];
        // The summary's `<phase>_ms` fields (check, criu_restore, cuda_restore, total).
        events.extend(metrics::phase_events(metrics::RESTORE_PHASE, &metrics::phases_of(&summary)));
        self.count(&events);
        let (seconds, bytes) = (summary.total_ms / 1000.0, summary.image_bytes);
        let _ = protocol::send(out, &Response::Restored { pid, summary });
        self.account(EventKind::Restore, seconds, Some(bytes));
        let end = self.wait_restored(pid);
        let _ = protocol::send(out, &end);
    }

    /// Waits for a restored root (the agent's child) and says how it ended.
    /// A SIGKILL during a dump of it is the dump, not the application's end.
    fn wait_restored(&self, pid: i32) -> Response {
        use nix::sys::wait::{waitpid, WaitStatus};
        let info = loop {
            match waitpid(nix::unistd::Pid::from_raw(pid), None) {
                Ok(WaitStatus::Exited(_, code)) => break ExitInfo { code: Some(code), signal: None },
                Ok(WaitStatus::Signaled(_, sig, _)) => break ExitInfo { code: None, signal: Some(sig as i32) },
                Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
                // Not our child any more: how it ended is unknown.
                Err(_) => break ExitInfo { code: None, signal: None },
            }
        };
        let start = Instant::now();
        while self.root_state(pid) == Some(RootState::Dumping) && start.elapsed() < self.settings.dump_wait {
            std::thread::sleep(Duration::from_millis(20));
        }
        let dumped = self.root_state(pid) == Some(RootState::Dumped);
        self.set_root(pid, None);
        if dumped {
            Response::Dumped
        } else {
            Response::Exited(info)
        }
    }
}

/// A failed checkpoint or restore: counted as failed, and by its reason
/// (the error's kind, never its text).
fn failure_events(total: &'static str, failures: &'static str, error: &RequestError) -> Vec<Event> {
    let reason = error.reason().unwrap_or(FailureReason::Other).label();
    vec![Event::count(total, vec![("outcome", "failed".into())]), Event::count(failures, vec![("reason", reason.to_string())])]
}
