//! Reading processes from /proc. A process is identified by pid *and* start
//! time: pids are reused, and killing a stranger that inherited a pid we
//! recorded must never happen.

use std::path::Path;

/// One process as /proc shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcInfo {
    pub pid: i32,
    pub ppid: i32,
    /// Real uid (first field of `Uid:` in /proc/<pid>/status).
    pub uid: u32,
    /// The executable's name as the kernel keeps it (15 bytes at most).
    pub comm: String,
    /// State letter: R, S, D (uninterruptible), Z (zombie), T, ...
    pub state: char,
    /// Start time in clock ticks after boot (field 22 of /proc/<pid>/stat).
    pub start_time: u64,
}

/// A recorded process identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProcId {
    pub pid: i32,
    pub start_time: u64,
}

impl ProcInfo {
    pub fn id(&self) -> ProcId {
        ProcId { pid: self.pid, start_time: self.start_time }
    }

    /// Neither running nor able to run: a zombie or stuck in the kernel.
    pub fn is_stuck(&self) -> bool {
        matches!(self.state, 'Z' | 'D')
    }
}

/// Parses `/proc/<pid>/stat`. The command name is in parentheses and may
/// itself contain spaces and parentheses, so fields are counted after the
/// *last* `)`.
pub fn parse_stat(stat: &str) -> Option<(String, char, i32, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?.to_string();
    let rest: Vec<&str> = stat.get(close + 1..)?.split_whitespace().collect();
    // rest[0] is field 3 (state); field N is rest[N - 3].
    let state = rest.first()?.chars().next()?;
    let ppid: i32 = rest.get(1)?.parse().ok()?;
    let start_time: u64 = rest.get(19)?.parse().ok()?;
    Some((comm, state, ppid, start_time))
}

/// The session id of a `/proc/<pid>/stat` line (field 6).
pub fn parse_session(stat: &str) -> Option<i32> {
    stat.get(stat.rfind(')')? + 1..)?.split_whitespace().nth(3)?.parse().ok()
}

/// The session `pid` belongs to; `None` when it is gone.
pub fn session(pid: i32) -> Option<i32> {
    parse_session(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn parse_uid(status: &str) -> Option<u32> {
    status.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// Reads one process; `None` when it is gone (or unreadable).
pub fn read(pid: i32) -> Option<ProcInfo> {
    read_in(Path::new("/proc"), pid)
}

fn read_in(proc_root: &Path, pid: i32) -> Option<ProcInfo> {
    let dir = proc_root.join(pid.to_string());
    let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
    let (comm, state, ppid, start_time) = parse_stat(&stat)?;
    let uid = parse_uid(&std::fs::read_to_string(dir.join("status")).ok()?)?;
    Some(ProcInfo { pid, ppid, uid, comm, state, start_time })
}

/// Every process on the node.
pub fn all() -> Vec<ProcInfo> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(read)
        .collect()
}

/// The process with this identity, if it still exists (same pid, same start).
pub fn find(id: ProcId) -> Option<ProcInfo> {
    read(id.pid).filter(|p| p.start_time == id.start_time)
}

/// Sends `signal` to exactly the process `id`, never to a stranger that
/// inherited its pid: the pid is pinned with a pidfd first, the start time
/// is checked while the pidfd is held, and the signal goes through the pidfd
/// (a pid reused after pidfd_open cannot receive it). Returns whether the
/// signal was sent. Kernels without pidfd (< 5.3) fall back to kill(2) after
/// the identity check, the best they allow.
pub fn signal_exact(id: ProcId, signal: i32) -> bool {
    // SAFETY: plain system calls on integers; the fd is closed below.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, id.pid, 0) } as i32;
    if fd < 0 {
        let nosys = std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS);
        return nosys && find(id).is_some() && unsafe { libc::kill(id.pid, signal) } == 0;
    }
    let sent = find(id).is_some()
        && unsafe { libc::syscall(libc::SYS_pidfd_send_signal, fd, signal, std::ptr::null::<libc::siginfo_t>(), 0) } == 0;
    unsafe { libc::close(fd) };
    sent
}

/// The executable a process runs (`/proc/<pid>/exe`), `None` when gone or
/// unreadable. Unlike the command name, a user cannot choose it freely.
pub fn exe(pid: i32) -> Option<std::path::PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/exe")).ok()
}

/// Each descriptor in `fd_dir` (`/proc/<pid>/fd`) and what its link names
/// (`/dev/nvidia0`, `socket:[123]`, `anon_inode:[io_uring]`). A descriptor
/// closed while the directory is read is left out. The listing's own
/// descriptor, when a process reads its own, is closed on return: a caller
/// that reads more of each descriptor afterwards (held.rs, its flags) walks
/// the directory itself.
pub fn fd_links(fd_dir: &Path) -> std::io::Result<Vec<(String, String)>> {
    Ok(std::fs::read_dir(fd_dir)?
        .flatten()
        .filter_map(|e| Some((e.file_name().to_string_lossy().into_owned(), std::fs::read_link(e.path()).ok()?.to_string_lossy().into_owned())))
        .collect())
}

/// The value of `name` in a process's environment (root can read any).
pub fn environ_var(pid: i32, name: &str) -> Option<String> {
    let data = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    environ_lookup(&data, name)
}

/// Looks `name` up in NUL-separated `KEY=VALUE` data.
pub fn environ_lookup(data: &[u8], name: &str) -> Option<String> {
    data.split(|b| *b == 0).find_map(|kv| {
        let kv = std::str::from_utf8(kv).ok()?;
        kv.strip_prefix(name)?.strip_prefix('=').map(String::from)
    })
}

/// A process held by a pidfd and its start time: the checkpoint agent pins
/// the dumped tree's root from its checks to CRIU (security review F8), and
/// a bounded driver call stops waiting once its process ended.
pub struct Pinned {
    pidfd: std::os::fd::OwnedFd,
    id: ProcId,
}

/// Why a process could not be pinned, or is no longer the pinned one: the
/// agent refuses to dump a tree whose root it cannot hold still (F8), and a
/// bounded driver call only asks whether its process is gone.
#[derive(Debug, thiserror::Error)]
pub enum PinError {
    /// No /proc entry when it was to be pinned.
    #[error("pid {pid} has ended")]
    Ended { pid: i32 },
    /// The kernel gave no pidfd (ESRCH: ended meanwhile; EMFILE; ENOSYS).
    #[error("pidfd_open({pid}): {source}")]
    PidfdOpen { pid: i32, source: std::io::Error },
    /// Exited, or its pid now names another process (another start time).
    #[error("pid {pid} ended after it was checked: nothing was dumped")]
    EndedAfterCheck { pid: i32 },
}

impl Pinned {
    pub fn new(pid: i32) -> Result<Pinned, PinError> {
        let id = read(pid).ok_or(PinError::Ended { pid })?.id();
        // SAFETY: pidfd_open returns a new descriptor we own, or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
        if fd < 0 {
            return Err(PinError::PidfdOpen { pid, source: std::io::Error::last_os_error() });
        }
        // SAFETY: fd was just returned by the kernel and is ours alone.
        let pidfd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let pinned = Pinned { pidfd, id };
        // Opened after the read: the pid may have been reused in between.
        pinned.still_there()?;
        Ok(pinned)
    }

    /// The pinned pid.
    pub fn pid(&self) -> i32 {
        self.id.pid
    }

    /// Sends `signal` through the pidfd: it reaches the pinned process or
    /// nothing (never one that got its pid later). Whether it was sent.
    pub fn signal(&self, signal: i32) -> bool {
        use std::os::fd::AsRawFd;
        // SAFETY: a plain system call on a descriptor we own.
        unsafe { libc::syscall(libc::SYS_pidfd_send_signal, self.pidfd.as_raw_fd(), signal, std::ptr::null::<libc::siginfo_t>(), 0) == 0 }
    }

    /// The process is alive (its pidfd is not readable: a pidfd turns
    /// readable when its process exits, and its pid cannot be reused before
    /// that) and the pid's start time is the checked one.
    pub fn still_there(&self) -> Result<(), PinError> {
        use std::os::fd::AsRawFd;
        let mut poll = libc::pollfd { fd: self.pidfd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one pollfd we own, no wait.
        let exited = unsafe { libc::poll(&mut poll, 1, 0) } != 0;
        let same = read(self.id.pid).is_some_and(|p| p.start_time == self.id.start_time);
        if exited || !same {
            return Err(PinError::EndedAfterCheck { pid: self.id.pid });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_is_the_sixth_field_after_the_name() {
        assert_eq!(parse_session("7 (a) b) S 1 70 71 0 -1"), Some(71));
        assert_eq!(parse_session("7 (x) S 1"), None);
        let me = std::process::id() as i32;
        assert_eq!(session(me), Some(unsafe { libc::getsid(0) }));
    }

    #[test]
    fn stat_lines_with_awkward_names_parse() {
        let stat = "4242 (nvidia-cuda-mps) S 1 4242 4242 0 -1 4194624 100 0 0 0 1 2 0 0 20 0 3 0 987654 1000 200 0";
        assert_eq!(parse_stat(stat), Some(("nvidia-cuda-mps".into(), 'S', 1, 987654)));
        let odd = "7 (a) b (c) Z 3 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 55 0 0";
        assert_eq!(parse_stat(odd), Some(("a) b (c".into(), 'Z', 3, 55)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn our_own_process_is_found_by_identity() {
        let me = read(std::process::id() as i32).expect("reading /proc/self");
        assert_eq!(me.uid, unsafe { libc::getuid() });
        assert_eq!(find(me.id()).map(|p| p.pid), Some(me.pid));
        let stale = ProcId { pid: me.pid, start_time: me.start_time + 1 };
        assert_eq!(find(stale), None, "a reused pid must not match");
        assert!(all().iter().any(|p| p.pid == me.pid));
    }

    #[test]
    fn signals_reach_only_the_exact_process() {
        let mut child = std::process::Command::new("/bin/sleep").arg("30").spawn().unwrap();
        let info = read(child.id() as i32).unwrap();
        let stale = ProcId { pid: info.pid, start_time: info.start_time + 1 };
        assert!(!signal_exact(stale, libc::SIGKILL), "a reused pid must not be signalled");
        assert!(child.try_wait().unwrap().is_none());
        assert_eq!(exe(info.pid).unwrap().file_name().unwrap(), "sleep");
        assert!(signal_exact(info.id(), libc::SIGKILL));
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&child.wait().unwrap()), Some(libc::SIGKILL));
        assert!(!signal_exact(info.id(), libc::SIGKILL), "a reaped process is gone");
    }

    #[test]
    fn environ_values_are_looked_up_exactly() {
        let data = b"A=1\0CUDA_MPS_PIPE_DIRECTORY=/run/x/pipe\0CUDA_MPS_PIPE_DIRECTORY_X=no\0";
        assert_eq!(environ_lookup(data, "CUDA_MPS_PIPE_DIRECTORY").as_deref(), Some("/run/x/pipe"));
        assert_eq!(environ_lookup(data, "CUDA_MPS"), None);
        assert_eq!(environ_lookup(data, "B"), None);
    }

    /// Each kind says the words the agent's failures carried before.
    #[test]
    fn pin_errors_say_todays_words() {
        let cases = [
            (PinError::Ended { pid: 42 }, "pid 42 has ended"),
            (PinError::PidfdOpen { pid: 42, source: std::io::Error::from_raw_os_error(libc::EMFILE) }, "pidfd_open(42): Too many open files (os error 24)"),
            (PinError::EndedAfterCheck { pid: 42 }, "pid 42 ended after it was checked: nothing was dumped"),
        ];
        for (e, text) in cases {
            assert_eq!(e.to_string(), text, "{e:?}");
        }
    }

    /// A pid with no process is Ended; a pinned process that exits is
    /// EndedAfterCheck.
    #[test]
    fn a_pinned_process_that_ends_is_no_longer_there() {
        let mut child = std::process::Command::new("/bin/sleep").arg("30").spawn().unwrap();
        let pid = child.id() as i32;
        let pinned = Pinned::new(pid).unwrap();
        pinned.still_there().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        let err = pinned.still_there().unwrap_err();
        assert!(matches!(err, PinError::EndedAfterCheck { pid: p } if p == pid), "{err:?}");
        // pid_max is at most 2^22 (PID_MAX_LIMIT): no process has pid i32::MAX.
        let err = Pinned::new(i32::MAX).err().unwrap();
        assert!(matches!(err, PinError::Ended { pid: i32::MAX }), "{err:?}");
    }

    #[test]
    fn stuck_states() {
        let p = |state| ProcInfo { pid: 1, ppid: 0, uid: 0, comm: String::new(), state, start_time: 0 };
        assert!(p('Z').is_stuck() && p('D').is_stuck());
        assert!(!p('S').is_stuck() && !p('R').is_stuck());
    }
}
