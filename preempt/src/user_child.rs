//! Work done as the job's user from the multi-threaded root agent: in a
//! forked child that takes the user's uid, gids and groups and drops every
//! capability, so the kernel checks each step against the user's rights
//! (the held-files check, the job's /dev/shm objects).
//!
//! Hand-written: no crate runs a closure as another user without changing
//! the caller's own credentials, which a multi-threaded root process must not
//! do (setresuid in one thread is applied to all by glibc).

use crate::privdrop::Identity;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

/// Why work as the job's user gave no answer; the callers refuse what it
/// was to check or do (a restored tree, the job's /dev/shm objects).
#[derive(Debug, thiserror::Error)]
pub enum UserChildError {
    #[error("pipe: {0}")]
    Pipe(nix::errno::Errno),
    #[error("fork: {0}")]
    Fork(nix::errno::Errno),
    #[error("waitpid: {0}")]
    Wait(nix::errno::Errno),
    /// Killed past its bound (and reaped, unless stuck in the kernel).
    #[error("the work as the job's user did not finish within {} s", bound.as_secs())]
    Timeout { bound: Duration },
    /// setgroups, setresgid, setresuid, capset or prctl failed in the child
    /// (exit 2), or the child died otherwise.
    #[error("the work as uid {uid} could not take the user's identity ({status:?})")]
    Identity { uid: u32, status: nix::sys::wait::WaitStatus },
    #[error("the child's answer: {0}")]
    Answer(std::io::Error),
}

/// Takes `who`'s identity with no capabilities at all (uid 0 keeps its
/// capabilities through setresuid: they are cleared explicitly).
fn become_user(groups: &[libc::gid_t], uid: u32, gid: u32) -> bool {
    #[repr(C)]
    struct CapHeader {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    struct CapData {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    // SAFETY: async-signal-safe system calls with buffers we own.
    unsafe {
        if libc::setgroups(groups.len(), groups.as_ptr()) != 0 || libc::setresgid(gid, gid, gid) != 0 || libc::setresuid(uid, uid, uid) != 0
        {
            return false;
        }
        let header = CapHeader { version: 0x2008_0522, pid: 0 };
        let data = [CapData { effective: 0, permitted: 0, inheritable: 0 }, CapData { effective: 0, permitted: 0, inheritable: 0 }];
        libc::syscall(libc::SYS_capset, &header as *const CapHeader, data.as_ptr()) == 0
    }
}

/// In the child, before it takes the user's identity: closes every
/// descriptor it inherited from the agent but `kept` (sorted, no duplicates),
/// with close_range(2) over the gaps between them; where that fails (a kernel
/// before 5.9: ENOSYS, or a seccomp filter) with close(2) on each descriptor
/// below `open_max`.
fn close_inherited(kept: &[RawFd], open_max: u32) {
    let close_gap = |first: u32, last: u32| {
        // SAFETY: closes descriptors only this child uses; no memory is touched.
        if unsafe { libc::syscall(libc::SYS_close_range, first, last, 0) } != 0 {
            for fd in first..last.min(open_max.saturating_sub(1)).saturating_add(1) {
                // SAFETY: as above; EBADF for a descriptor not open is fine.
                unsafe { libc::close(fd as RawFd) };
            }
        }
    };
    let mut first = 0u32;
    for &fd in kept {
        let fd = fd as u32;
        if fd > first {
            close_gap(first, fd - 1);
        }
        first = fd + 1;
    }
    close_gap(first, u32::MAX);
}

/// Makes the child not dumpable: the user cannot ptrace it nor open its
/// /proc files (fd, mem, environ) while it runs as them. Set again after
/// the identity changes, which sets it to `fs.suid_dumpable` (1 on a site
/// that debugs set-uid programs).
fn not_dumpable() -> bool {
    // SAFETY: prctl with plain integer arguments.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) == 0 }
}

/// The bound of [`close_inherited`]'s fallback: the descriptor limit.
fn open_max() -> u32 {
    const MOST: u64 = 1 << 20;
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit into a struct we own.
    let cur = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 { lim.rlim_cur } else { MOST };
    cur.min(MOST) as u32
}

/// In the child: reports step `index` and its outcome (an errno, or 0) to
/// the parent. At most one answer per run is read.
pub(crate) fn answer(w: RawFd, index: u32, errno: i32) {
    let mut buf = [0u8; 8];
    buf[..4].copy_from_slice(&index.to_le_bytes());
    buf[4..].copy_from_slice(&errno.to_le_bytes());
    // SAFETY: write of a local buffer to the pipe the child owns.
    unsafe { libc::write(w, buf.as_ptr().cast(), 8) };
}

/// The calling thread's errno (in the child, where nothing allocates).
pub(crate) fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// Runs `body` as `who` in a forked child and returns the one answer it gave
/// ([`answer`]: a step's index and errno), or `None`. `body` must only make
/// system calls on memory prepared before the fork (no allocation, no
/// locks); past `bound` the child is killed and the run refused. The child
/// keeps stdin, stdout, stderr, the answer's pipe and `keep` (the
/// descriptors `body` uses) and closes every other descriptor of the agent's
/// before it takes the user's identity; it is not dumpable (issue 37).
pub(crate) fn run_as_user(who: &Identity, bound: Duration, keep: &[RawFd], body: impl FnOnce(RawFd)) -> Result<Option<(u32, i32)>, UserChildError> {
    let (read_end, write_end) = nix::unistd::pipe().map_err(UserChildError::Pipe)?;
    let groups: Vec<libc::gid_t> = who.groups.clone();
    let mut kept: Vec<RawFd> = [0, 1, 2, write_end.as_raw_fd()].into_iter().chain(keep.iter().copied()).filter(|fd| *fd >= 0).collect();
    kept.sort_unstable();
    kept.dedup();
    let open_max = open_max();
    // SAFETY: the child runs only system calls on memory prepared before the
    // fork (the caller's promise for `body`) and leaves with _exit.
    match unsafe { nix::unistd::fork() }.map_err(UserChildError::Fork)? {
        nix::unistd::ForkResult::Child => {
            let ready = not_dumpable() && {
                close_inherited(&kept, open_max);
                become_user(&groups, who.uid, who.gid) && not_dumpable()
            };
            let code = if ready {
                body(write_end.as_raw_fd());
                0
            } else {
                2
            };
            // SAFETY: leaves the child without running the parent's destructors.
            unsafe { libc::_exit(code) }
        }
        nix::unistd::ForkResult::Parent { child } => {
            drop(write_end);
            let status = wait_bounded(child, bound)?;
            if !matches!(status, nix::sys::wait::WaitStatus::Exited(_, 0)) {
                return Err(UserChildError::Identity { uid: who.uid, status });
            }
            // The child wrote at most 8 bytes (within any pipe's buffer) and is gone.
            let mut buf = Vec::new();
            std::io::Read::read_to_end(&mut std::fs::File::from(read_end), &mut buf).map_err(UserChildError::Answer)?;
            Ok((buf.len() == 8).then(|| {
                let i = u32::from_le_bytes(buf[..4].try_into().unwrap_or_default());
                (i, i32::from_le_bytes(buf[4..].try_into().unwrap_or_default()))
            }))
        }
    }
}

/// Waits for the child for at most `bound`; past it, kills it.
fn wait_bounded(child: nix::unistd::Pid, bound: Duration) -> Result<nix::sys::wait::WaitStatus, UserChildError> {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    let start = std::time::Instant::now();
    loop {
        match waitpid(child, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(nix::errno::Errno::EINTR) => {}
            Ok(status) => return Ok(status),
            Err(e) => return Err(UserChildError::Wait(e)),
        }
        if start.elapsed() >= bound {
            let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
            // Reaped if it goes at once; a child stuck in the kernel (a hung
            // network mount) must not hang the agent with it.
            for _ in 0..100 {
                if !matches!(waitpid(child, Some(WaitPidFlag::WNOHANG)), Ok(WaitStatus::StillAlive)) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            return Err(UserChildError::Timeout { bound });
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;
    use std::process::Command;

    #[test]
    // wait_bounded kills and reaps the child itself.
    #[allow(clippy::zombie_processes)]
    fn a_child_that_does_not_finish_is_killed_and_refuses() {
        let child = Command::new("/bin/sleep").arg("30").spawn().unwrap();
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let start = std::time::Instant::now();
        let err = wait_bounded(pid, Duration::from_millis(200)).unwrap_err();
        assert!(matches!(err, UserChildError::Timeout { .. }), "{err:?}");
        assert_eq!(err.to_string(), "the work as the job's user did not finish within 0 s");
        assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
        assert!(crate::procfs::read(child.id() as i32).is_none(), "the child was killed and reaped");
    }

    #[test]
    fn the_body_runs_with_the_users_ids_and_no_capabilities() {
        if !gpu_mode_testkit::root_or_skip("setresuid") {
            return;
        }
        let who = Identity { uid: 65534, gid: 65534, groups: vec![65534] };
        let dir = tempfile::tempdir().unwrap();
        // Open to all: the refusal below is the file's own mode's.
        std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let root_only = std::ffi::CString::new(dir.path().join("root-only").into_os_string().into_encoded_bytes()).unwrap();
        std::fs::write(dir.path().join("root-only"), b"x").unwrap();
        std::fs::set_permissions(dir.path().join("root-only"), std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        // SAFETY: getters and open/close in the child on a CString made before the fork.
        let ids = run_as_user(&who, Duration::from_secs(5), &[], |w| unsafe { answer(w, libc::geteuid(), libc::getegid() as i32) }).unwrap();
        assert_eq!(ids, Some((65534, 65534)));
        let open = run_as_user(&who, Duration::from_secs(5), &[], |w| unsafe {
            let fd = libc::open(root_only.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            answer(w, 0, if fd < 0 { errno() } else { 0 });
        })
        .unwrap();
        assert_eq!(open, Some((0, libc::EACCES)), "root's 0600 file is closed to the user: no capability was kept");
    }

    /// What the child is asked about itself.
    #[derive(Clone, Copy)]
    enum Ask {
        /// 0 when the descriptor is open, else fcntl's errno.
        Fd(RawFd),
        /// prctl(PR_GET_DUMPABLE).
        Dumpable,
    }

    /// Issue 37: the child of the root agent, once it is the user's, holds
    /// none of the agent's descriptors (sockets, image directories, the
    /// metrics lock) but those its body is given, and is not dumpable: the
    /// user can neither ptrace it nor open its /proc files while it runs.
    #[test]
    fn the_child_holds_only_the_descriptors_it_is_given_and_is_not_dumpable() {
        if !gpu_mode_testkit::root_or_skip("setresuid") {
            return;
        }
        let who = Identity { uid: 65534, gid: 65534, groups: vec![65534] };
        // The agent's: one opened next to the descriptor the body is given,
        // one far above every kept one (the ranges between kept descriptors
        // and up to the end).
        let below = std::fs::File::open("/dev/null").unwrap();
        let given = std::fs::File::open("/dev/null").unwrap();
        // SAFETY: F_DUPFD_CLOEXEC of a descriptor we own; the new one is owned below.
        let above = unsafe { std::os::fd::OwnedFd::from_raw_fd(libc::fcntl(below.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 900)) };
        assert!(above.as_raw_fd() >= 900);
        let cases = [
            ("a descriptor of the agent's", Ask::Fd(below.as_raw_fd()), (0, libc::EBADF)),
            ("one far above the kept ones", Ask::Fd(above.as_raw_fd()), (0, libc::EBADF)),
            ("the one the body is given", Ask::Fd(given.as_raw_fd()), (0, 0)),
            ("stderr", Ask::Fd(2), (0, 0)),
            // The identity change alone sets it to fs.suid_dumpable: 0 by
            // default, 1 where a site debugs set-uid programs (there it failed
            // before: "PR_GET_DUMPABLE: Some((1, 1)), not (1, 0)").
            ("PR_GET_DUMPABLE", Ask::Dumpable, (1, 0)),
        ];
        let wrong: Vec<String> = cases
            .into_iter()
            .filter_map(|(name, ask, want)| {
                // SAFETY: fcntl and prctl in the child, on nothing allocated.
                let got = run_as_user(&who, Duration::from_secs(5), &[given.as_raw_fd()], |w| unsafe {
                    match ask {
                        Ask::Fd(fd) => answer(w, 0, if libc::fcntl(fd, libc::F_GETFD) < 0 { errno() } else { 0 }),
                        Ask::Dumpable => answer(w, 1, libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0)),
                    }
                })
                .unwrap();
                (got != Some(want)).then(|| format!("{name}: {got:?}, not {want:?}"))
            })
            .collect();
        assert!(wrong.is_empty(), "{wrong:#?}");
    }
}
