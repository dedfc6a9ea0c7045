//! File-system helpers for root-run code: atomic writes and directories whose
//! ownership and mode are checked, never trusted.

use nix::errno::Errno;
use nix::fcntl::{open, openat, OFlag};
use nix::sys::stat::{fchmod, fstat, mkdirat, Mode};
use nix::unistd::{fchown, mkdir, Gid, Uid};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Writes `data` to `path` atomically: a temporary file in the same directory,
/// fsync, rename over the target, fsync the directory. A reader sees the old
/// file or the new one, never a torn one, even across a crash.
pub fn write_atomic(path: &Path, data: &[u8], mode: u32) -> io::Result<()> {
    let dir = path.parent().ok_or_else(|| io::Error::other("path has no parent directory"))?;
    let name = path.file_name().ok_or_else(|| io::Error::other("path has no file name"))?;
    let tmp = dir.join(format!(".{}.tmp.{}", name.to_string_lossy(), std::process::id()));
    let result = (|| {
        let mut f = OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Paths in the config are used by root helpers with no PATH and no fixed
/// working directory, so relative paths are refused outright.
pub fn require_absolute(key: &str, path: &Path) -> Result<(), String> {
    if !path.is_absolute() {
        return Err(format!("{key} = {:?} must be an absolute path", path));
    }
    if path.components().any(|c| c == std::path::Component::ParentDir) {
        return Err(format!("{key} = {:?} must not contain '..'", path));
    }
    Ok(())
}

/// Removes a file; a file that is already gone is success (idempotent teardown).
pub fn remove_if_present(path: &Path) -> io::Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Opens a directory without following a symlink in its last component and
/// returns the descriptor: every later change goes through it, so nobody can
/// swap the path for a symlink between our check and our change.
pub fn open_dir_nofollow(dir: &Path) -> io::Result<OwnedFd> {
    open(dir, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|e| not_a_dir_error(dir, e))
}

/// Opens `name` inside the directory `parent` (a descriptor), never
/// following a symlink, and only if it is a directory.
fn open_dir_at(parent: &OwnedFd, name: &str, shown: &Path) -> io::Result<OwnedFd> {
    openat(parent, name, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|e| not_a_dir_error(&shown.join(name), e))
}

fn not_a_dir_error(path: &Path, e: Errno) -> io::Error {
    match e {
        Errno::ELOOP | Errno::ENOTDIR => {
            io::Error::other(format!("{} is not a directory (a symlink or file is in the way)", path.display()))
        }
        other => io::Error::other(format!("{}: {}", path.display(), other.desc())),
    }
}

fn errno(path: &Path, what: &str, e: Errno) -> io::Error {
    io::Error::other(format!("{what} {}: {}", path.display(), e.desc()))
}

/// The runtime directory (this process's user's, 0755: users reach their
/// MPS pipe directories through it), then `sub` inside it, this process's
/// user's alone (0700), each checked as [`ensure_private_dir`] does: the
/// runtime directory first, so that one that is a symlink is never written
/// through (tests/planted_paths.rs). The one way every root-only record
/// directory under the runtime directory is made (job states, GPU locks,
/// metrics, MPS registry, MIG journal).
pub fn ensure_runtime_subdir(runtime_dir: &Path, sub: &Path) -> io::Result<()> {
    // SAFETY: geteuid and getegid have no preconditions.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    ensure_private_dir(runtime_dir, uid, gid, 0o755)?;
    ensure_private_dir(sub, uid, gid, 0o700)
}

/// Creates `dir` (and its parents) if missing, then checks that it is a real
/// directory (never a symlink: the last component is opened with O_NOFOLLOW
/// and every change is made through that descriptor) owned by `uid` with
/// exactly `mode`. A directory we just created gets `uid`/`gid`; an existing
/// one with another owner is refused: someone else may control what we are
/// about to trust. For root-owned directories in root-owned places (the
/// runtime directory); a tree a user will own is made by [`create_user_tree`].
pub fn ensure_private_dir(dir: &Path, uid: u32, gid: u32, mode: u32) -> io::Result<()> {
    let created = match fs::symlink_metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(parent) = dir.parent() {
                fs::create_dir_all(parent)?;
            }
            match mkdir(dir, Mode::from_bits_truncate(0o700)) {
                Ok(()) => true,
                // Someone else made it meanwhile: checked below like any other.
                Err(Errno::EEXIST) => false,
                Err(e) => return Err(errno(dir, "cannot create", e)),
            }
        }
        Err(e) => return Err(e),
        Ok(_) => false,
    };
    let fd = open_dir_nofollow(dir)?;
    if created {
        fchown(&fd, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid))).map_err(|e| errno(dir, "cannot chown", e))?;
    }
    let st = fstat(&fd).map_err(|e| errno(dir, "cannot stat", e))?;
    if st.st_uid != uid {
        return Err(io::Error::other(format!("{} is owned by uid {}, expected uid {uid}", dir.display(), st.st_uid)));
    }
    if st.st_mode & 0o7777 != mode {
        fchmod(&fd, Mode::from_bits_truncate(mode)).map_err(|e| errno(dir, "cannot chmod", e))?;
    }
    Ok(())
}

/// Creates `<parent>/<name>` and its `subdirs` for a user: the whole tree is
/// made while it is still root's, each level opened with O_NOFOLLOW, and then
/// handed over through the descriptors, leaves first. Once a directory is the
/// user's, root never again resolves a path inside it, so a user cannot
/// redirect a chown or chmod with a symlink (audit item C1). `parent` must be
/// root-owned and not writable by the user; an old `<name>` (a crashed run's)
/// is removed first without following symlinks.
pub fn create_user_tree(parent: &Path, name: &str, subdirs: &[&str], uid: u32, gid: u32, mode: u32) -> io::Result<()> {
    for part in std::iter::once(&name).chain(subdirs) {
        if part.is_empty() || part.contains('/') || *part == "." || *part == ".." {
            return Err(io::Error::other(format!("{part:?} is not a plain directory name")));
        }
    }
    let parent_fd = open_dir_nofollow(parent)?;
    let top = parent.join(name);
    remove_tree_if_present(&top)?;
    let private = Mode::from_bits_truncate(0o700);
    mkdirat(&parent_fd, name, private).map_err(|e| errno(&top, "cannot create", e))?;
    let top_fd = open_dir_at(&parent_fd, name, parent)?;
    let (owner, group) = (Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)));
    let hand_over = |fd: &OwnedFd, path: &Path| -> io::Result<()> {
        fchmod(fd, Mode::from_bits_truncate(mode)).map_err(|e| errno(path, "cannot chmod", e))?;
        fchown(fd, owner, group).map_err(|e| errno(path, "cannot chown", e))
    };
    for sub in subdirs {
        mkdirat(&top_fd, *sub, private).map_err(|e| errno(&top.join(sub), "cannot create", e))?;
        let fd = open_dir_at(&top_fd, sub, &top)?;
        hand_over(&fd, &top.join(sub))?;
    }
    hand_over(&top_fd, &top)
}

/// Removes a directory tree if present. std's remove_dir_all works through
/// directory descriptors and never follows a symlink (CVE-2022-21658 fixed),
/// so it is safe on a tree a user controls; a symlink itself is just removed.
pub fn remove_tree_if_present(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
        Ok(m) if m.file_type().is_dir() => match fs::remove_dir_all(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        },
        Ok(_) => remove_if_present(path).map(|_| ()),
    }
}

/// Reads a small file that a user controls, as root, without being fooled:
/// `rel` is walked from the trusted directory `base` one component at a time
/// with O_NOFOLLOW; the file is opened non-blocking (a FIFO cannot hang us),
/// must be a regular file owned by `owner`, and at most `max` bytes are read
/// (a link to /dev/zero cannot exhaust memory). Audit item H1.
pub fn read_user_file(base: &Path, rel: &[&str], owner: u32, max: usize) -> io::Result<Vec<u8>> {
    let (file, _) = open_user_file(base, rel, owner)?;
    let mut buf = Vec::with_capacity(max);
    file.take(max as u64).read_to_end(&mut buf)?;
    Ok(buf)
}

/// The last `max` bytes of a file the user controls (a log CRIU wrote as
/// the user), opened as [`read_user_file`] opens one: a symlink, a FIFO, a
/// device or another owner's file is refused, and a huge file costs `max`.
/// The first line may be cut.
pub fn read_user_file_tail(base: &Path, rel: &[&str], owner: u32, max: usize) -> io::Result<Vec<u8>> {
    use std::io::{Seek, SeekFrom};
    let (mut file, size) = open_user_file(base, rel, owner)?;
    file.seek(SeekFrom::Start(size.saturating_sub(max as u64)))?;
    let mut buf = Vec::with_capacity(max.min(size as usize));
    file.take(max as u64).read_to_end(&mut buf)?;
    Ok(buf)
}

/// `base/rel...` walked with `O_NOFOLLOW` at each level, opened
/// non-blocking, and only a regular file of `owner`: the file and its size.
fn open_user_file(base: &Path, rel: &[&str], owner: u32) -> io::Result<(File, u64)> {
    let Some((file, dirs)) = rel.split_last() else { return Err(io::Error::other("no file named")) };
    let mut shown = base.to_path_buf();
    let mut dir = open_dir_nofollow(base)?;
    for d in dirs {
        dir = open_dir_at(&dir, d, &shown)?;
        shown.push(d);
    }
    shown.push(file);
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC | OFlag::O_NOCTTY;
    let fd = openat(&dir, *file, flags, Mode::empty()).map_err(|e| match e {
        Errno::ENOENT => io::Error::new(io::ErrorKind::NotFound, format!("{} does not exist", shown.display())),
        Errno::ELOOP => io::Error::other(format!("{} is a symlink", shown.display())),
        other => errno(&shown, "cannot open", other),
    })?;
    let st = fstat(&fd).map_err(|e| errno(&shown, "cannot stat", e))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(io::Error::other(format!("{} is not a regular file", shown.display())));
    }
    if st.st_uid != owner {
        return Err(io::Error::other(format!("{} is owned by uid {}, expected uid {owner}", shown.display(), st.st_uid)));
    }
    Ok((File::from(fd), st.st_size.max(0) as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn me() -> (u32, u32) {
        unsafe { (libc::geteuid(), libc::getegid()) }
    }

    #[test]
    fn create_user_tree_makes_private_levels_and_replaces_an_old_tree() {
        let dir = tempfile::tempdir().unwrap();
        let (uid, gid) = me();
        // A crashed run's tree, with a symlink planted inside, is removed
        // without following the link.
        let target = dir.path().join("target");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("keep"), b"x").unwrap();
        fs::create_dir_all(dir.path().join("k/pipe")).unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join("k/pipe/link")).unwrap();
        create_user_tree(dir.path(), "k", &["pipe", "log"], uid, gid, 0o700).unwrap();
        assert!(target.join("keep").exists(), "the link's target must survive");
        for d in ["k", "k/pipe", "k/log"] {
            let m = fs::symlink_metadata(dir.path().join(d)).unwrap();
            assert!(m.is_dir(), "{d}");
            assert_eq!((m.mode() & 0o7777, m.uid()), (0o700, uid), "{d}");
        }
        assert_eq!(fs::read_dir(dir.path().join("k/pipe")).unwrap().count(), 0);
        // A symlink in place of the whole tree is removed, its target kept.
        fs::remove_dir_all(dir.path().join("k")).unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join("k")).unwrap();
        create_user_tree(dir.path(), "k", &["pipe"], uid, gid, 0o700).unwrap();
        assert!(fs::symlink_metadata(dir.path().join("k")).unwrap().is_dir());
        assert!(target.join("keep").exists());
        for bad in ["", "a/b", ".."] {
            assert!(create_user_tree(dir.path(), bad, &[], uid, gid, 0o700).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn ensure_private_dir_never_follows_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let (uid, gid) = me();
        let target = dir.path().join("target");
        fs::create_dir(&target).unwrap();
        fs::set_permissions(&target, fs::Permissions::from_mode(0o755)).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let err = ensure_private_dir(&link, uid, gid, 0o700).unwrap_err().to_string();
        assert!(err.contains("not a directory"), "{err}");
        assert_eq!(fs::metadata(&target).unwrap().mode() & 0o7777, 0o755, "the target's mode must not change");
    }

    #[test]
    fn read_user_file_refuses_what_could_hang_or_fool_root() {
        let dir = tempfile::tempdir().unwrap();
        let (uid, _) = me();
        let d = dir.path();
        fs::create_dir(d.join("pipe")).unwrap();
        fs::write(d.join("pipe/pid"), b"1234\n").unwrap();
        assert_eq!(read_user_file(d, &["pipe", "pid"], uid, 32).unwrap(), b"1234\n");
        // Bounded: only `max` bytes are read.
        fs::write(d.join("pipe/big"), vec![b'7'; 10_000]).unwrap();
        assert_eq!(read_user_file(d, &["pipe", "big"], uid, 32).unwrap().len(), 32);
        type Case<'a> = (&'a str, Box<dyn Fn() + 'a>, &'a str);
        let cases: Vec<Case> = vec![
            ("fifo", Box::new(|| nix::unistd::mkfifo(&d.join("pipe/fifo"), Mode::from_bits_truncate(0o600)).unwrap()), "not a regular file"),
            ("zero", Box::new(|| std::os::unix::fs::symlink("/dev/zero", d.join("pipe/zero")).unwrap()), "is a symlink"),
            ("missing", Box::new(|| ()), "does not exist"),
        ];
        for (name, make, needle) in cases {
            make();
            let err = read_user_file(d, &["pipe", name], uid, 32).unwrap_err().to_string();
            assert!(err.contains(needle), "{name}: {err}");
        }
        // A symlinked directory on the way is refused too.
        std::os::unix::fs::symlink(d.join("pipe"), d.join("alias")).unwrap();
        let err = read_user_file(d, &["alias", "pid"], uid, 32).unwrap_err().to_string();
        assert!(err.contains("not a directory"), "{err}");
        // Another owner is refused.
        let err = read_user_file(d, &["pipe", "pid"], uid + 1, 32).unwrap_err().to_string();
        assert!(err.contains("expected uid"), "{err}");
    }

    /// A log CRIU wrote as the user: its end, bounded, through the same
    /// refusals (security review N1: a planted link to /dev/zero exhausted
    /// the agent's memory, a FIFO hung it, a link to a root file leaked it).
    #[test]
    fn a_user_files_tail_is_its_last_bytes_and_the_same_refusals_hold() {
        let dir = tempfile::tempdir().unwrap();
        let (uid, _) = me();
        let d = dir.path();
        fs::write(d.join("log"), b"first\nsecond\nlast line\n").unwrap();
        assert_eq!(read_user_file_tail(d, &["log"], uid, 10).unwrap(), b"last line\n");
        assert_eq!(read_user_file_tail(d, &["log"], uid, 1 << 20).unwrap(), b"first\nsecond\nlast line\n");
        std::os::unix::fs::symlink("/dev/zero", d.join("zero")).unwrap();
        nix::unistd::mkfifo(&d.join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        std::os::unix::fs::symlink("/etc/shadow", d.join("shadow")).unwrap();
        for (name, needle) in [("zero", "is a symlink"), ("fifo", "not a regular file"), ("shadow", "is a symlink"), ("none", "does not exist")] {
            let err = read_user_file_tail(d, &[name], uid, 64).unwrap_err().to_string();
            assert!(err.contains(needle), "{name}: {err}");
        }
        let err = read_user_file_tail(d, &["log"], uid + 1, 64).unwrap_err().to_string();
        assert!(err.contains("expected uid"), "{err}");
    }

    #[test]
    fn write_atomic_replaces_content_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.json");
        write_atomic(&p, b"one", 0o644).unwrap();
        write_atomic(&p, b"two", 0o644).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert_eq!(fs::metadata(&p).unwrap().mode() & 0o777, 0o644);
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("s.json")]);
    }

    #[test]
    fn remove_if_present_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        fs::write(&p, b"x").unwrap();
        assert!(remove_if_present(&p).unwrap());
        assert!(!remove_if_present(&p).unwrap());
    }

    #[test]
    fn ensure_private_dir_creates_and_checks() {
        let dir = tempfile::tempdir().unwrap();
        let me = unsafe { libc::geteuid() };
        let gid = unsafe { libc::getegid() };
        let d = dir.path().join("a/b");
        ensure_private_dir(&d, me, gid, 0o700).unwrap();
        assert_eq!(fs::metadata(&d).unwrap().mode() & 0o7777, 0o700);
        // An existing directory with a loose mode is tightened.
        fs::set_permissions(&d, fs::Permissions::from_mode(0o777)).unwrap();
        ensure_private_dir(&d, me, gid, 0o700).unwrap();
        assert_eq!(fs::metadata(&d).unwrap().mode() & 0o7777, 0o700);
        // A symlink in the way is refused.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&d, &link).unwrap();
        let err = ensure_private_dir(&link, me, gid, 0o700).unwrap_err().to_string();
        assert!(err.contains("not a directory"), "{err}");
        // Another owner is refused.
        let err = ensure_private_dir(&d, me + 1, gid, 0o700).unwrap_err().to_string();
        assert!(err.contains("expected uid"), "{err}");
    }
}
