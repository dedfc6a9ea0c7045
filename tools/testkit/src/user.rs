//! Running part of a test as an unprivileged user. CI runs as root, so a
//! case that only a plain user meets (a file it cannot read, a directory it
//! cannot write) would never run there: the test runs that part on a thread
//! that has become the user.
//!
//! Linux keeps credentials per thread; the C library's `setuid` changes
//! every thread of the process, the raw system calls only the caller. So a
//! thread that makes them is that user for every file system check while
//! the rest of the test process stays root, and no fork is needed (a child
//! forked from a test process whose other threads hold locks, e.g. while
//! printing a panic, can deadlock on them).

/// `nobody`: a uid that owns nothing a test could depend on.
pub const NOBODY: u32 = 65534;

/// Makes the calling thread, and it alone, `uid`/`gid` with no
/// supplementary groups (real, effective and saved ids: it cannot go back).
/// Needs root; the error names the call that failed.
pub fn become_user(uid: u32, gid: u32) -> Result<(), String> {
    let call = |name: &str, r: libc::c_long| if r == 0 { Ok(()) } else { Err(format!("{name}: {}", std::io::Error::last_os_error())) };
    // SAFETY: plain system calls on values; the empty group list is valid.
    unsafe {
        call("setgroups", libc::syscall(libc::SYS_setgroups, 0usize, std::ptr::null::<libc::gid_t>()))?;
        call("setresgid", libc::syscall(libc::SYS_setresgid, gid, gid, gid))?;
        call("setresuid", libc::syscall(libc::SYS_setresuid, uid, uid, uid))
    }
}

/// Runs `work` as `nobody`, and panics as it did: on a thread that became
/// nobody when this process is root, else right here (a plain user already).
pub fn as_nobody(what: &str, work: impl FnOnce() + Send) {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        work();
        return;
    }
    let joined = std::thread::scope(|s| {
        s.spawn(|| {
            become_user(NOBODY, NOBODY).unwrap_or_else(|e| panic!("{what}: cannot become uid {NOBODY}: {e}"));
            work();
        })
        .join()
    });
    if let Err(panic) = joined {
        std::panic::resume_unwind(panic);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }

    /// The calling thread's (uid, euid, gid, supplementary group count).
    fn ids() -> (u32, u32, u32, i32) {
        // SAFETY: plain queries; getgroups with size 0 only counts.
        unsafe { (libc::getuid(), libc::geteuid(), libc::getgid(), libc::getgroups(0, std::ptr::null_mut())) }
    }

    #[test]
    fn only_the_thread_becomes_nobody_and_its_panic_reaches_the_caller() {
        if !is_root() {
            crate::skipped("testkit::user", "needs root to become another user");
            return;
        }
        let root = ids();
        as_nobody("the ids", || assert_eq!(ids(), (NOBODY, NOBODY, NOBODY, 0)));
        assert_eq!(ids(), root, "the caller stays root");
        let private = std::env::temp_dir().join(format!("testkit-user-{}", std::process::id()));
        std::fs::write(&private, b"root's").unwrap();
        std::fs::set_permissions(&private, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        as_nobody("a root-only file", || {
            let err = std::fs::read(&private).unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied);
        });
        std::fs::remove_file(&private).unwrap();
        let r = std::panic::catch_unwind(|| as_nobody("a failing check", || panic!("on purpose")));
        assert!(r.is_err(), "a panic of the work must fail the caller");
    }

    #[test]
    fn becoming_a_user_needs_root() {
        if is_root() {
            // Root can: shown above. Without root it fails, seen in a thread
            // that first became nobody.
            std::thread::spawn(|| {
                become_user(NOBODY, NOBODY).unwrap();
                assert!(become_user(0, 0).unwrap_err().starts_with("setgroups: "));
            })
            .join()
            .unwrap();
        } else {
            assert!(become_user(0, 0).is_err());
        }
    }
}
