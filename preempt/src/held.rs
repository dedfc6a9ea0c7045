//! What a restored process holds, checked as the job's user before it runs.
//!
//! CRIU restores a process's open files and file mappings by opening their
//! recorded paths as root, following symlinks, and checks only each file's
//! size and mode (criu/files-reg.c, `openat(mntns_root, path, flags)`). A
//! user who swaps a path for a symlink between the dump and the restore
//! (their home is theirs to change while the job waits) would get a
//! descriptor on any file of the same size and mode: another user's data,
//! or /etc/passwd opened for writing. No CRIU option opens files as the
//! task's user, so the agent restores the tree stopped (`--leave-stopped`)
//! and, before it lets it run, checks every descriptor and file mapping of
//! every restored process the way the kernel would for the user:
//!
//! * the inode: `faccessat2(fd, "", mode, AT_EMPTY_PATH | AT_EACCESS)` on a
//!   descriptor of the very file the process holds, in a child that has
//!   taken the user's uid, gids and groups and dropped every capability
//!   (ACLs count, as they would for the user's own open);
//! * the path: the file's path as /proc shows it must lead the user to the
//!   same inode (a file behind a directory the user cannot enter is not
//!   theirs to hold, even when its own mode would allow it). Deleted files
//!   and memfds have no path to check.
//!
//! Descriptors that are not files (sockets, pipes, anonymous inodes) are not
//! reopened by path and are not checked here. The working and root
//! directories are not either: every lookup from them is checked against
//! the process's own credentials again, so holding one grants nothing.
//!
//! Hand-written: no crate checks access as another user without changing the
//! caller's own credentials, which a multi-threaded root agent must not do.

use crate::privdrop::Identity;
use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

/// How long the user's check may take (a path on a hung FUSE or NFS mount
/// must not hang the agent): past it, the tree is refused.
const CHECK_BOUND: Duration = Duration::from_secs(10);

/// Why a restored tree may not run: a file its user may not hold, or one
/// the check could not look at (refused rather than let run unchecked).
#[derive(Debug, thiserror::Error)]
pub enum HeldError {
    #[error("cannot list pid {pid}'s descriptors: {source}")]
    Descriptors { pid: i32, source: std::io::Error },
    #[error("cannot read the flags of pid {pid}'s fd {fd}")]
    Flags { pid: i32, fd: String },
    #[error("cannot read pid {pid}'s mappings: {source}")]
    Mappings { pid: i32, source: std::io::Error },
    /// The held file could not be opened (O_PATH) or stat'ed as root.
    #[error("cannot check pid {pid}'s {what} ({path}): {source}")]
    Unprobed { pid: i32, what: String, path: String, source: std::io::Error },
    #[error("{path:?}: NUL in path")]
    NulInPath { path: String },
    /// The user's child that checks.
    #[error(transparent)]
    Child(#[from] crate::user_child::UserChildError),
    /// The child answered an index past the files (never expected).
    #[error("the check named no file")]
    NoFile,
    /// `errno`: the user's access, or EXDEV where the path now leads to
    /// another file than the one held.
    #[error("pid {pid} was restored holding {path} ({what}, {need}), which uid {uid} may not ({}): a path was swapped since the dump", refusal(*errno))]
    Refused { pid: i32, path: String, what: String, need: &'static str, uid: u32, errno: i32 },
}

fn refusal(errno: i32) -> String {
    if errno == libc::EXDEV {
        "its path now leads elsewhere".to_string()
    } else {
        std::io::Error::from_raw_os_error(errno).to_string()
    }
}

/// One file a process holds: a descriptor or a file mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub pid: i32,
    /// `fd 3`, `mapping 7f00-7f80`.
    pub what: String,
    /// Where /proc says the file is (may end in ` (deleted)`).
    pub path: String,
    /// `libc::R_OK`/`W_OK` bits the user must have.
    pub need: i32,
    /// An executable mapping: execute permission stands in for read (the
    /// kernel maps a program the user may run but not read).
    pub exec_ok: bool,
    /// A private file mapping (`p` in /proc/<pid>/maps): writes to it never
    /// reach the file.
    pub private_mapping: bool,
    /// Where to open the file itself: `/proc/<pid>/fd/3`, `/proc/<pid>/map_files/...`.
    source: String,
}

impl Held {
    /// Where the file itself can be opened.
    pub(crate) fn source(&self) -> &str {
        &self.source
    }
}

/// The access an open file's flags (octal, /proc/<pid>/fdinfo) ask for.
pub fn access_of_flags(flags: u32) -> i32 {
    if flags & libc::O_PATH as u32 != 0 {
        return 0;
    }
    match flags & libc::O_ACCMODE as u32 {
        0 => libc::R_OK,
        1 => libc::W_OK,
        _ => libc::R_OK | libc::W_OK,
    }
}

/// Whether a /proc link text names a file by path (not `socket:[...]`,
/// `pipe:[...]`, `anon_inode:...`).
fn is_path(link: &str) -> bool {
    link.starts_with('/')
}

fn deleted(path: &str) -> bool {
    path.ends_with(" (deleted)") || path.starts_with("/memfd:")
}

fn fd_flags(pid: i32, fd: &str) -> Option<u32> {
    let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).ok()?;
    u32::from_str_radix(info.lines().find_map(|l| l.strip_prefix("flags:"))?.trim(), 8).ok()
}

fn descriptors(pid: i32, out: &mut Vec<Held>) -> Result<(), HeldError> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/fd")).map_err(|source| HeldError::Descriptors { pid, source })?;
    for entry in dir.flatten() {
        let fd = entry.file_name().to_string_lossy().into_owned();
        let Ok(link) = std::fs::read_link(entry.path()) else { continue };
        let link = link.to_string_lossy().into_owned();
        if !is_path(&link) {
            continue;
        }
        let Some(flags) = fd_flags(pid, &fd) else { return Err(HeldError::Flags { pid, fd }) };
        out.push(Held {
            pid,
            what: format!("fd {fd}"),
            path: link,
            need: access_of_flags(flags),
            exec_ok: false,
            private_mapping: false,
            source: format!("/proc/{pid}/fd/{fd}"),
        });
    }
    Ok(())
}

/// One line of /proc/<pid>/maps as a held file, when it maps a file.
pub fn mapping_of_line(pid: i32, line: &str) -> Option<Held> {
    let mut f = line.split_whitespace();
    let (range, perms, _offset, _dev, inode) = (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
    let path = f.collect::<Vec<_>>().join(" ");
    if inode == "0" || !is_path(&path) {
        return None;
    }
    let shared_write = perms.contains('w') && perms.contains('s');
    let (start, end) = range.split_once('-')?;
    let (start, end) = (u64::from_str_radix(start, 16).ok()?, u64::from_str_radix(end, 16).ok()?);
    Some(Held {
        pid,
        what: format!("mapping {range}"),
        path,
        need: if shared_write { libc::R_OK | libc::W_OK } else { libc::R_OK },
        exec_ok: !shared_write && perms.contains('x'),
        private_mapping: perms.contains('p'),
        // maps pads addresses to 8 digits ("00400000", a non-PIE program
        // such as Ubuntu's python3), map_files names them unpadded
        // ("400000", fs/proc/base.c): the name is rebuilt, not copied.
        source: format!("/proc/{pid}/map_files/{start:x}-{end:x}"),
    })
}

fn mappings(pid: i32, out: &mut Vec<Held>) -> Result<(), HeldError> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|source| HeldError::Mappings { pid, source })?;
    out.extend(maps.lines().filter_map(|l| mapping_of_line(pid, l)));
    Ok(())
}

/// Every file the processes `pids` hold by descriptor or mapping.
pub fn held_files(pids: &[i32]) -> Result<Vec<Held>, HeldError> {
    let mut out = Vec::new();
    for &pid in pids {
        descriptors(pid, &mut out)?;
        mappings(pid, &mut out)?;
    }
    Ok(out)
}

/// One file prepared for the check in the child (no allocation after fork).
struct Probe {
    fd: OwnedFd,
    /// The path to look up as the user, or `None` (deleted, memfd).
    path: Option<CString>,
    dev: u64,
    ino: u64,
    need: i32,
    exec_ok: bool,
}

fn probe(h: &Held) -> Result<Probe, HeldError> {
    use std::os::unix::fs::OpenOptionsExt;
    let unprobed = |source| HeldError::Unprobed { pid: h.pid, what: h.what.clone(), path: h.path.clone(), source };
    // Cannot look at it: refuse rather than let it run unchecked.
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_PATH).open(&h.source).map_err(unprobed)?;
    let meta = file.metadata().map_err(unprobed)?;
    let path = (!deleted(&h.path)).then(|| CString::new(h.path.as_bytes())).transpose().map_err(|_| HeldError::NulInPath { path: h.path.clone() })?;
    Ok(Probe { fd: file.into(), path, dev: meta.dev(), ino: meta.ino(), need: h.need, exec_ok: h.exec_ok })
}

/// In the child, as the user: 0 when the user may hold it, else an errno.
fn user_may_hold(p: &Probe) -> i32 {
    let access = |mode: i32| -> i32 {
        // SAFETY: a plain system call on a descriptor we own and a static empty path.
        let rc = unsafe {
            libc::syscall(libc::SYS_faccessat2, p.fd.as_raw_fd(), c"".as_ptr(), mode, libc::AT_EMPTY_PATH | libc::AT_EACCESS)
        };
        if rc == 0 {
            0
        } else {
            std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EACCES)
        }
    };
    let mut err = access(p.need);
    if err != 0 && p.exec_ok {
        err = access((p.need & !libc::R_OK) | libc::X_OK);
    }
    if err != 0 {
        return err;
    }
    if let Some(path) = &p.path {
        // SAFETY: stat into a zeroed buffer we own; the path is a CString made before fork.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::stat(path.as_ptr(), &mut st) } != 0 {
            return std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EACCES);
        }
        if (st.st_dev, st.st_ino) != (p.dev, p.ino) {
            return libc::EXDEV;
        }
    }
    0
}

/// Runs the probes as `who` in a child; the index of the first the user may
/// not hold and why, or `None`.
fn first_refused(probes: &[Probe], who: &Identity) -> Result<Option<(usize, i32)>, HeldError> {
    // The probes' descriptors are the only ones of the agent's the child keeps.
    let fds: Vec<RawFd> = probes.iter().map(|p| p.fd.as_raw_fd()).collect();
    let answer = super::user_child::run_as_user(who, CHECK_BOUND, &fds, |w| {
        for (i, p) in probes.iter().enumerate() {
            let err = user_may_hold(p);
            if err != 0 {
                super::user_child::answer(w, i as u32, err);
                break;
            }
        }
    })?;
    Ok(answer.map(|(i, errno)| (i as usize, errno)))
}

fn describe_need(h: &Held) -> &'static str {
    match (h.need & libc::R_OK != 0, h.need & libc::W_OK != 0) {
        (true, true) => "read and write",
        (false, true) => "write",
        (true, false) if h.exec_ok => "read or execute",
        (true, false) => "read",
        (false, false) => "reach",
    }
}

/// The pages files of the image being restored, by device and inode: a
/// restored process may hold one of them mapped privately, though they are
/// root's, under root's directories. CRIU maps the driver's checkpoint
/// buffer from them (packaging/criu/0007, `preempt.restore_map_buffers`);
/// the driver reads it and unmaps it. What such a mapping shows is the
/// process's own memory as it was dumped, and a private mapping never
/// writes the file. Only mappings: a descriptor of them is checked as any
/// other file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImagePages(Vec<(u64, u64)>);

impl ImagePages {
    /// The `pages-*.img` files among `names` in the run directory `dir`
    /// (root's by now: images::ImageStore::open_for_restore); a file that
    /// cannot be looked at is left out (its mapping is then checked as any
    /// other, and refused).
    pub fn of<'a>(dir: &std::path::Path, names: impl IntoIterator<Item = &'a str>) -> Self {
        let pages = names.into_iter().filter(|n| crate::page_cache::is_pages_file(n));
        Self(pages.filter_map(|n| std::fs::symlink_metadata(dir.join(n)).ok()).map(|m| (m.dev(), m.ino())).collect())
    }

    fn allows(&self, h: &Held, p: &Probe) -> bool {
        h.private_mapping && self.0.contains(&(p.dev, p.ino))
    }
}

/// Every file the processes `pids` hold must be one `who` may hold (see the
/// module docs), or a private mapping of one of the image's `pages`; the
/// first that is not is named.
pub fn check_user_may_hold(pids: &[i32], who: &Identity, pages: &ImagePages) -> Result<(), HeldError> {
    let mut checked = Vec::new();
    for h in held_files(pids)? {
        let p = probe(&h)?;
        if !pages.allows(&h, &p) {
            checked.push((h, p));
        }
    }
    let (held, probes): (Vec<Held>, Vec<Probe>) = checked.into_iter().unzip();
    match first_refused(&probes, who)? {
        None => Ok(()),
        Some((i, errno)) => {
            let h = held.get(i).ok_or(HeldError::NoFile)?;
            Err(HeldError::Refused { pid: h.pid, path: h.path.clone(), what: h.what.clone(), need: describe_need(h), uid: who.uid, errno })
        }
    }
}

/// Stops `pid` and waits until it is stopped, as CRIU leaves a restored
/// tree: a process just exec'd is still mapping its libraries, and a check
/// of it would race with that.
#[cfg(test)]
pub(crate) fn stop_for_check(pid: i32) {
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let start = std::time::Instant::now();
    while crate::procfs::read(pid).is_none_or(|p| p.state != 'T') {
        assert!(start.elapsed() < Duration::from_secs(5), "pid {pid} did not stop");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::process::{Child, Command};

    const NOBODY: u32 = 65534;

    #[test]
    fn flags_and_map_lines_say_what_access_is_held() {
        assert_eq!(access_of_flags(0o100000), libc::R_OK);
        assert_eq!(access_of_flags(0o100001), libc::W_OK);
        assert_eq!(access_of_flags(0o102002), libc::R_OK | libc::W_OK);
        assert_eq!(access_of_flags(0o10000000), 0, "O_PATH");
        let lib = mapping_of_line(5, "7f00-7f80 r-xp 00000000 08:01 1234  /usr/lib/libc.so.6").unwrap();
        assert_eq!((lib.need, lib.exec_ok, lib.path.as_str()), (libc::R_OK, true, "/usr/lib/libc.so.6"));
        let shared = mapping_of_line(5, "7f00-7f80 rw-s 00000000 08:01 99 /home/u/my file").unwrap();
        assert_eq!((shared.need, shared.exec_ok, shared.path.as_str()), (libc::R_OK | libc::W_OK, false, "/home/u/my file"));
        assert_eq!(mapping_of_line(5, "7f00-7f80 rw-p 00000000 00:00 0  [heap]"), None);
        assert_eq!(mapping_of_line(5, "7f00-7f80 rw-p 00000000 00:00 0"), None);
        assert_eq!(lib.source, "/proc/5/map_files/7f00-7f80");
        let low = mapping_of_line(5, "00400000-00420000 r--p 00000000 08:01 77 /usr/bin/python3.12").unwrap();
        assert_eq!((low.what.as_str(), low.source.as_str()), ("mapping 00400000-00420000", "/proc/5/map_files/400000-420000"));
        assert_eq!(mapping_of_line(5, "zz-7f80 r--p 00000000 08:01 77 /bin/x"), None, "not an address range");
    }

    #[test]
    fn a_file_mapped_below_the_8_digit_addresses_is_checked() {
        // A non-PIE program (Ubuntu's python3) is mapped at 0x400000, which
        // /proc/<pid>/maps writes as 00400000: the check must find its
        // map_files entry all the same (it refused every PyTorch restore).
        if !gpu_mode_testkit::root_or_skip("map_files") {
            return;
        }
        let file = tempfile::NamedTempFile::new().unwrap();
        file.as_file().set_len(4096).unwrap();
        let mut at = 0;
        for want in [0x40_0000usize, 0x80_0000, 0x100_0000, 0x400_0000] {
            // SAFETY: a new mapping at an address nothing uses (NOREPLACE), unmapped below.
            let p = unsafe {
                libc::mmap(want as *mut _, 4096, libc::PROT_READ, libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE, file.as_file().as_raw_fd(), 0)
            };
            if p as usize == want {
                at = want;
                break;
            }
        }
        assert_ne!(at, 0, "no low address free to map at");
        let me = std::process::id() as i32;
        // The other tests of this process open and close descriptors
        // meanwhile: a listing that met one closing is taken again.
        let held = (0..10).map(|_| held_files(&[me])).find(Result::is_ok).unwrap_or_else(|| held_files(&[me]));
        let line = format!("{at:08x}-{:08x}", at + 4096);
        let mine = held.as_ref().ok().and_then(|h| h.iter().find(|h| h.what == format!("mapping {line}")).cloned());
        let probed = mine.as_ref().map(probe);
        // SAFETY: the mapping made above, no longer used.
        unsafe { libc::munmap(at as *mut _, 4096) };
        let mine = mine.unwrap_or_else(|| panic!("mapping {line} not listed"));
        assert_eq!(mine.path, file.path().display().to_string());
        let probe = probed.unwrap().unwrap();
        assert_eq!(probe.ino, file.as_file().metadata().unwrap().ino());
    }

    /// `sleep` as `uid` holding `file` as fd 3 with `flags`, opened as
    /// root before the identity changes: what a CRIU restore produces.
    fn holder(file: &std::path::Path, flags: i32, uid: u32) -> Child {
        let path = CString::new(file.as_os_str().as_encoded_bytes()).unwrap();
        let mut cmd = Command::new("/bin/sleep");
        cmd.arg("30").stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
        // SAFETY: only system calls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(path.as_ptr(), flags);
                if fd < 0 || libc::dup2(fd, 3) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::setgroups(0, std::ptr::null()) != 0 || libc::setgid(uid) != 0 || libc::setuid(uid) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd.spawn().unwrap()
    }

    fn nobody() -> Identity {
        Identity { uid: NOBODY, gid: NOBODY, groups: vec![NOBODY] }
    }

    /// A directory others may enter, or `None` (the test skipped) without root.
    fn root_tmp() -> Option<tempfile::TempDir> {
        if !gpu_mode_testkit::root_or_skip("the holder runs as nobody") {
            return None;
        }
        let tmp = tempfile::tempdir().unwrap();
        set_mode(tmp.path(), 0o755);
        Some(tmp)
    }

    fn set_mode(p: &std::path::Path, mode: u32) {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap();
    }

    fn file_with(p: &std::path::Path, mode: u32) {
        std::fs::write(p, b"data").unwrap();
        set_mode(p, mode);
    }

    /// The check of a holder of `file` (opened with `flags`) as nobody.
    fn check_holder(file: &std::path::Path, flags: i32) -> Result<(), HeldError> {
        let mut child = holder(file, flags, NOBODY);
        stop_for_check(child.id() as i32);
        let result = check_user_may_hold(&[child.id() as i32], &nobody(), &ImagePages::default());
        child.kill().unwrap();
        child.wait().unwrap();
        result
    }

    #[test]
    fn a_file_root_opened_for_the_user_is_refused_and_their_own_is_not() {
        let Some(tmp) = root_tmp() else { return };
        let (root_only, theirs) = (tmp.path().join("root-only"), tmp.path().join("theirs"));
        file_with(&root_only, 0o600);
        file_with(&theirs, 0o600);
        std::os::unix::fs::chown(&theirs, Some(NOBODY), Some(NOBODY)).unwrap();
        for (flags, need) in [(libc::O_RDWR, "read and write"), (libc::O_RDONLY, "read")] {
            let err = check_holder(&root_only, flags).unwrap_err();
            assert!(matches!(err, HeldError::Refused { errno: libc::EACCES, .. }), "{err:?}");
            let err = err.to_string();
            assert!(err.contains(&format!("holding {} (fd 3, {need})", root_only.display())), "{err}");
            assert!(err.contains("which uid 65534 may not (Permission denied"), "{err}");
        }
        check_holder(&theirs, libc::O_RDWR).unwrap();
    }

    #[test]
    fn a_readable_file_behind_a_closed_directory_is_refused() {
        let Some(tmp) = root_tmp() else { return };
        let closed = tmp.path().join("closed");
        std::fs::create_dir(&closed).unwrap();
        set_mode(&closed, 0o700);
        let file = closed.join("notes");
        file_with(&file, 0o644);
        let err = check_holder(&file, libc::O_RDONLY).unwrap_err().to_string();
        assert!(err.contains(&format!("holding {}", file.display())) && err.contains("Permission denied"), "{err}");
    }

    /// A child of this process as `uid`, holding `file` mapped privately
    /// (and no descriptor of it), stopped by itself once it does: a restored
    /// process whose buffer CRIU mapped from the image. Forked without exec,
    /// which would drop the mapping: only system calls run in the child.
    fn private_mapper(file: &std::path::Path, uid: u32) -> i32 {
        let path = CString::new(file.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: the child makes system calls only, then stops until killed.
        unsafe {
            let pid = libc::fork();
            assert!(pid >= 0, "fork");
            if pid == 0 {
                // The other tests' descriptors, inherited: not what is checked.
                libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
                let fd = libc::open(path.as_ptr(), libc::O_RDONLY);
                let p = libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE, fd, 0);
                libc::close(fd);
                if fd < 0 || p == libc::MAP_FAILED || libc::setgroups(0, std::ptr::null()) != 0 || libc::setgid(uid) != 0 || libc::setuid(uid) != 0 {
                    libc::_exit(1);
                }
                // Stopped once it holds the mapping, as CRIU leaves a tree.
                loop {
                    libc::raise(libc::SIGSTOP);
                }
            }
            let mut status = 0;
            assert_eq!(libc::waitpid(pid, &mut status, libc::WUNTRACED), pid);
            assert!(libc::WIFSTOPPED(status), "the mapper ended: {status:#x}");
            pid
        }
    }

    #[test]
    fn a_private_mapping_of_the_images_pages_is_let_through_and_nothing_else_of_root_is() {
        let Some(tmp) = root_tmp() else { return };
        let closed = tmp.path().join("run");
        std::fs::create_dir(&closed).unwrap();
        set_mode(&closed, 0o700);
        let (pages, other) = (closed.join("pages-1.img"), closed.join("core-1.img"));
        file_with(&pages, 0o644);
        file_with(&other, 0o644);
        let image = ImagePages::of(&closed, ["pages-1.img", "core-1.img", "pages-2.img"]);
        assert_eq!(image.0.len(), 1, "only the pages file that exists: {image:?}");
        let check = |file: &std::path::Path, pages: &ImagePages| {
            let pid = private_mapper(file, NOBODY);
            let result = check_user_may_hold(&[pid], &nobody(), pages);
            // SAFETY: our own child, killed and reaped.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
            result
        };
        check(&pages, &image).unwrap();
        let err = check(&pages, &ImagePages::default()).unwrap_err().to_string();
        assert!(err.contains(&format!("holding {}", pages.display())) && err.contains("Permission denied"), "{err}");
        let err = check(&other, &image).unwrap_err().to_string();
        assert!(err.contains(&format!("holding {}", other.display())), "another file of the image: {err}");
        // A descriptor of the pages file is not a mapping: refused.
        let mut child = holder(&pages, libc::O_RDONLY, NOBODY);
        stop_for_check(child.id() as i32);
        let result = check_user_may_hold(&[child.id() as i32], &nobody(), &image);
        child.kill().unwrap();
        child.wait().unwrap();
        let err = result.unwrap_err().to_string();
        assert!(err.contains(&format!("holding {} (fd 3, read)", pages.display())), "{err}");
    }

    #[test]
    fn capabilities_do_not_pass_the_check_for_uid_0() {
        // Root's own check must be that of root *without capabilities*
        // (the CI job user): a file of nobody's, mode 0600, is refused.
        let Some(tmp) = root_tmp() else { return };
        let file = tmp.path().join("nobodys");
        file_with(&file, 0o600);
        std::os::unix::fs::chown(&file, Some(NOBODY), Some(NOBODY)).unwrap();
        let mut child = holder(&file, libc::O_RDONLY, 0);
        stop_for_check(child.id() as i32);
        let result = check_user_may_hold(&[child.id() as i32], &Identity { uid: 0, gid: 0, groups: vec![0] }, &ImagePages::default());
        child.kill().unwrap();
        child.wait().unwrap();
        let err = result.unwrap_err().to_string();
        assert!(err.contains(&format!("holding {} (fd 3, read)", file.display())), "{err}");
    }
}
