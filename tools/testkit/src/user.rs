//! Running part of a test as an unprivileged user. CI runs as root, so a
//! case that only a plain user meets (a file it cannot read, a directory it
//! cannot write) would never run there: the test forks, and the child
//! becomes the user before it does the work.

/// `nobody`: a uid that owns nothing a test could depend on.
pub const NOBODY: u32 = 65534;

/// How a forked child ended, from its exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildEnd {
    /// The work returned.
    Done,
    /// The work panicked (its message went to standard error).
    Panicked,
    /// setgroups, setgid or setuid failed: the work did not run.
    NotBecome,
    /// Another exit code or a signal (wait status as `waitpid` gave it).
    Other(i32),
}

/// Forks a child that drops to `uid`/`gid` with no supplementary groups,
/// runs `work` and leaves with `_exit` (never returning into the test
/// harness); returns its pid for [`wait`]. Whoever calls it must be root.
///
/// The child of a multi-threaded process may only rely on what fork keeps
/// consistent: glibc's malloc is, so file system calls and formatting are
/// fine; locks another thread held at the fork are not.
pub fn fork_as(uid: u32, gid: u32, work: impl FnOnce()) -> libc::pid_t {
    // SAFETY: fork has no preconditions; the child leaves with _exit below.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid > 0 {
        return pid;
    }
    // SAFETY: plain system calls on values; the empty group list is valid.
    let became = unsafe { libc::setgroups(0, std::ptr::null()) == 0 && libc::setgid(gid) == 0 && libc::setuid(uid) == 0 };
    let code = if !became {
        3
    } else if std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).is_ok() {
        0
    } else {
        1
    };
    // SAFETY: ends the child without running the parent's cleanup.
    unsafe { libc::_exit(code) }
}

/// Waits for a child of [`fork_as`].
pub fn wait(pid: libc::pid_t) -> ChildEnd {
    let mut status = 0;
    // SAFETY: status is a valid out-pointer.
    let r = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(r, pid, "waitpid({pid}): {}", std::io::Error::last_os_error());
    match (libc::WIFEXITED(status), libc::WEXITSTATUS(status)) {
        (true, 0) => ChildEnd::Done,
        (true, 1) => ChildEnd::Panicked,
        (true, 3) => ChildEnd::NotBecome,
        _ => ChildEnd::Other(status),
    }
}

/// Runs `work` as `nobody` and panics unless it returned: as a forked
/// child when this process is root, else right here (a plain user already).
pub fn as_nobody(what: &str, work: impl FnOnce()) {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        work();
        return;
    }
    let end = wait(fork_as(NOBODY, NOBODY, work));
    assert_eq!(end, ChildEnd::Done, "{what}, run as uid {NOBODY}: its panic, if any, is above");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }

    #[test]
    fn the_child_runs_as_the_user_and_its_end_is_told_apart() {
        if !is_root() {
            crate::skipped("testkit::user", "needs root to become another user");
            return;
        }
        let cases: &[(&str, fn(), ChildEnd)] = &[
            ("returns as nobody", || assert_eq!(unsafe { (libc::getuid(), libc::getgid(), libc::getgroups(0, std::ptr::null_mut())) }, (NOBODY, NOBODY, 0)), ChildEnd::Done),
            ("panics", || panic!("on purpose"), ChildEnd::Panicked),
            ("exits 7", || unsafe { libc::_exit(7) }, ChildEnd::Other(7 << 8)),
        ];
        for (name, work, want) in cases {
            assert_eq!(wait(fork_as(NOBODY, NOBODY, work)), *want, "{name}");
        }
    }

    #[test]
    fn as_nobody_fails_when_the_work_fails() {
        if !is_root() {
            crate::skipped("testkit::user", "needs root to become another user");
            return;
        }
        let r = std::panic::catch_unwind(|| as_nobody("a failing check", || panic!("on purpose")));
        assert!(r.is_err(), "a panic in the child must fail the caller");
        as_nobody("a passing check", || assert_eq!(unsafe { libc::geteuid() }, NOBODY));
    }
}
