//! File-system helpers for root-run code: atomic writes and directories whose
//! ownership and mode are checked, never trusted.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
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

/// Removes a file; a file that is already gone is success (idempotent teardown).
pub fn remove_if_present(path: &Path) -> io::Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Creates `dir` (and parents) if missing, then checks that it is a real
/// directory (not a symlink) owned by `uid` with exactly `mode`, fixing the mode
/// and owner of a directory we just created. An existing directory with another
/// owner is refused: someone else may control what we are about to trust.
pub fn ensure_private_dir(dir: &Path, uid: u32, gid: u32, mode: u32) -> io::Result<()> {
    match fs::symlink_metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::create_dir_all(dir)?;
            std::os::unix::fs::chown(dir, Some(uid), Some(gid))?;
            fs::set_permissions(dir, fs::Permissions::from_mode(mode))?;
        }
        Err(e) => return Err(e),
        Ok(_) => {}
    }
    let meta = fs::symlink_metadata(dir)?;
    if !meta.file_type().is_dir() {
        return Err(io::Error::other(format!("{} is not a directory (a symlink or file is in the way)", dir.display())));
    }
    if meta.uid() != uid {
        return Err(io::Error::other(format!(
            "{} is owned by uid {}, expected uid {uid}",
            dir.display(),
            meta.uid()
        )));
    }
    if meta.mode() & 0o7777 != mode {
        fs::set_permissions(dir, fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
