//! Huge pages for the CUDA driver's checkpoint buffer (`[preempt]//! huge_pages`): gpu-mode-run preloads the shim `libgpu_mode_hugepages.so`
//! (crate `hugepages/`, whose docs say what it does and why) into the
//! application. The driver's checkpoint copies the GPU memory into one new
//! mapping of the process, and its time is that of populating fresh memory
//! (H100, 8 GiB PyTorch process: 3.1-3.4 s with the shim against 4.5-4.9 s
//! without, docs/validation.md).
//!
//! Kept copies: a checkpoint image holds the shim as a mapped file, and CRIU
//! restores a mapped file only if it is the very file of the dump (size and
//! build-id). A package upgrade replaces the library, so the agent (root, at
//! every checkpoint job's start) keeps a copy of each version it meets under
//! `huge_pages_dir`, named by its content ([`keep`]), and gpu-mode-run
//! preloads that copy ([`for_application`]): an image taken before an
//! upgrade finds its version still there.
//!
//! Not `criu restore`: CRIU 4.1 maps a restored process's private memory
//! in its restorer with the system call itself, not the C library's mmap
//! (seen: preloaded into criu, the shim saw no mapping), and gives back a
//! mapping's `MADV_HUGEPAGE` only after reading the pages in.
//!
//! Optional speed: a shim that cannot be used is reported and the job runs
//! without it.

use crate::config::PreemptConfig;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

pub const PRELOAD: &str = "LD_PRELOAD";
/// The shim is about 0.4 MB; anything far larger is not it.
const MAX_LIBRARY_BYTES: u64 = 64 << 20;

/// `LD_PRELOAD` with the job's own entries first and `library` after them
/// (the dynamic loader takes entries separated by spaces or colons): a
/// library that must come first (AddressSanitizer's runtime refuses to run
/// otherwise) stays first, and a preloaded allocator's own `mmap` still
/// reaches the shim's through `RTLD_NEXT`. An entry naming `library` again
/// is dropped.
pub fn preload_value(library: &Path, existing: Option<&OsStr>) -> OsString {
    let ours = library.as_os_str().as_bytes();
    let others = existing.map(OsStr::as_bytes).unwrap_or_default();
    let mut out = Vec::new();
    for entry in others.split(|b| *b == b':' || *b == b' ').filter(|e| !e.is_empty() && *e != ours) {
        out.extend_from_slice(entry);
        out.push(b':');
    }
    out.extend_from_slice(ours);
    OsString::from_vec(out)
}

/// Why the shim is not preloaded (gpu-mode-run says it and the application
/// runs without it: optional speed) or not kept (the agent logs it and the
/// job runs on the library itself). Each Display is the words said before.
#[derive(Debug, thiserror::Error)]
pub enum HugepagesError {
    /// The configured library cannot be looked at or read (as the job's
    /// user: the dynamic loader would not read it either).
    #[error("{}: {source}", .path.display())]
    Unreadable { path: PathBuf, source: std::io::Error },
    #[error("{} is not a regular file", .path.display())]
    NotAFile { path: PathBuf },
    /// Far larger than the shim: not it.
    #[error("{} is {bytes} bytes, more than the shim's {limit}", .path.display(), limit = MAX_LIBRARY_BYTES)]
    TooLarge { path: PathBuf, bytes: u64 },
    /// The kept copy or its directory cannot be looked at (missing included).
    #[error("{}: {source}", .path.display())]
    Unchecked { path: PathBuf, source: std::io::Error },
    #[error("{} is a symlink", .path.display())]
    Symlink { path: PathBuf },
    /// Someone besides root could have written it (`mode` the permission bits).
    #[error("{} is owned by uid {uid} with mode {mode:o}: only root may write it", .path.display())]
    NotRootOnly { path: PathBuf, uid: u32, mode: u32 },
    /// Not a regular file, or not the library's size.
    #[error("{} is not a copy of the library", .path.display())]
    NotACopy { path: PathBuf },
    /// keep: `huge_pages_dir` cannot be made root's and 0755.
    #[error("{}: {source}", .path.display())]
    Directory { path: PathBuf, source: std::io::Error },
    /// keep: the copy cannot be written or made readable by everyone.
    #[error("{}: {source}", .path.display())]
    Write { path: PathBuf, source: std::io::Error },
}

/// The name of the kept copy of a library whose bytes are `bytes`.
pub fn kept_name(bytes: &[u8]) -> String {
    format!("libgpu_mode_hugepages-{:016x}.so", super::manifest::fnv64(bytes))
}

/// The configured library's bytes: a readable regular file of sane size.
fn read_library(lib: &Path) -> Result<Vec<u8>, HugepagesError> {
    let unreadable = |source| HugepagesError::Unreadable { path: lib.to_path_buf(), source };
    let meta = std::fs::metadata(lib).map_err(unreadable)?;
    if !meta.is_file() {
        return Err(HugepagesError::NotAFile { path: lib.to_path_buf() });
    }
    if meta.len() > MAX_LIBRARY_BYTES {
        return Err(HugepagesError::TooLarge { path: lib.to_path_buf(), bytes: meta.len() });
    }
    std::fs::read(lib).map_err(unreadable)
}

/// Root may have written `path` and nobody else: owned by root, not
/// writable by group or others (a user who could plant the kept copy would
/// run code in other users' jobs).
fn root_only(path: &Path) -> Result<std::fs::Metadata, HugepagesError> {
    let meta = std::fs::symlink_metadata(path).map_err(|source| HugepagesError::Unchecked { path: path.to_path_buf(), source })?;
    if meta.file_type().is_symlink() {
        return Err(HugepagesError::Symlink { path: path.to_path_buf() });
    }
    if meta.uid() != 0 || meta.mode() & 0o022 != 0 {
        return Err(HugepagesError::NotRootOnly { path: path.to_path_buf(), uid: meta.uid(), mode: meta.mode() & 0o7777 });
    }
    Ok(meta)
}

/// The kept copy for `bytes`, if it is there and trustworthy: a regular
/// file of the same size in a directory that only root may write.
fn kept_copy(dir: &Path, bytes: &[u8]) -> Result<PathBuf, HugepagesError> {
    root_only(dir)?;
    let path = dir.join(kept_name(bytes));
    let meta = root_only(&path)?;
    if !meta.is_file() || meta.len() != bytes.len() as u64 {
        return Err(HugepagesError::NotACopy { path });
    }
    Ok(path)
}

/// Root, at a checkpoint job's start (the agent): makes sure `huge_pages_dir`
/// holds a copy of the configured library, named by its content, readable by
/// everyone and writable by root alone; returns it. Old copies stay: images
/// taken with them restore only from them.
pub fn keep(cfg: &PreemptConfig) -> Result<Option<PathBuf>, HugepagesError> {
    if !preloaded(cfg) {
        return Ok(None);
    }
    let bytes = read_library(&cfg.huge_pages_library)?;
    let dir = &cfg.huge_pages_dir;
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    crate::fsutil::ensure_private_dir(dir, uid, 0, 0o755).map_err(|source| HugepagesError::Directory { path: dir.clone(), source })?;
    if let Ok(path) = kept_copy(dir, &bytes) {
        return Ok(Some(path));
    }
    let path = dir.join(kept_name(&bytes));
    let unwritten = |source| HugepagesError::Write { path: path.clone(), source };
    crate::fsutil::write_atomic(&path, &bytes, 0o644).map_err(unwritten)?;
    // Whatever the umask took away: the job's user must read it.
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644)).map_err(unwritten)?;
    Ok(Some(path))
}

/// Whether gpu-mode-run preloads the library: for the huge pages, for the
/// forked children's GPU files (hugepages/src/fork.rs), for hiding
/// io_uring (hugepages/src/io_uring.rs), or several.
pub fn preloaded(cfg: &PreemptConfig) -> bool {
    cfg.huge_pages || cfg.forked_children_drop_gpu_files || cfg.hide_io_uring
}

/// The variables that tell the preloaded library which of its jobs to do:
/// the huge-page advice off when `huge_pages` is (and with it the split
/// copies, which follow the buffers the advice sees), else the threads that
/// copy the driver's buffer (`copy_threads`); and the forked children's
/// drop of the files under `device_paths` (`[cuda_ckpt]`'s) when it is on.
pub fn preload_env(cfg: &PreemptConfig, device_paths: &[String]) -> Vec<(&'static str, String)> {
    let mut env = Vec::new();
    if cfg.huge_pages {
        env.push(("GPU_MODE_COPY_THREADS", cfg.copy_threads.to_string()));
    } else {
        env.push(("GPU_MODE_HUGEPAGES", "0".to_string()));
    }
    if cfg.forked_children_drop_gpu_files {
        env.push(("GPU_MODE_FORK_DROP", "1".to_string()));
        env.push(("GPU_MODE_FORK_DROP_PREFIXES", device_paths.join(":")));
    }
    if cfg.hide_io_uring {
        env.push(("GPU_MODE_NO_IO_URING", "1".to_string()));
    }
    env
}

/// The library to preload into the application (gpu-mode-run, as the job's
/// user): `None` when neither of its jobs is on ([`preloaded`]); the kept
/// copy of the configured library when the agent made one (see the module
/// docs), else the library itself; an error naming the problem when the
/// library cannot be used.
pub fn for_application(cfg: &PreemptConfig) -> Result<Option<PathBuf>, HugepagesError> {
    if !preloaded(cfg) {
        return Ok(None);
    }
    let lib = &cfg.huge_pages_library;
    // Reading it is also the check that the dynamic loader, which opens it
    // as the job's user, will be able to.
    let bytes = read_library(lib)?;
    Ok(Some(kept_copy(&cfg.huge_pages_dir, &bytes).unwrap_or_else(|_| lib.clone())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_mode_testkit::user::as_nobody;
    use std::os::unix::fs::PermissionsExt;

    /// A result with its error as the words said (io::Error has no PartialEq).
    fn text<T>(r: Result<T, HugepagesError>) -> Result<T, String> {
        r.map_err(|e| e.to_string())
    }

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn the_jobs_own_preloads_stay_first_and_the_shim_comes_after_them() {
        let lib = Path::new("/usr/libexec/slurm-gpu-mode/libgpu_mode_hugepages.so");
        let cases: &[(Option<&str>, &str)] = &[
            (None, "/usr/libexec/slurm-gpu-mode/libgpu_mode_hugepages.so"),
            (Some(""), "/usr/libexec/slurm-gpu-mode/libgpu_mode_hugepages.so"),
            (Some("/usr/lib/x86_64-linux-gnu/libasan.so.8"), "/usr/lib/x86_64-linux-gnu/libasan.so.8:/usr/libexec/slurm-gpu-mode/libgpu_mode_hugepages.so"),
            (Some("a.so b.so:c.so"), "a.so:b.so:c.so:/usr/libexec/slurm-gpu-mode/libgpu_mode_hugepages.so"),
            (
                Some("/usr/libexec/slurm-gpu-mode/libgpu_mode_hugepages.so:a.so"),
                "a.so:/usr/libexec/slurm-gpu-mode/libgpu_mode_hugepages.so",
            ),
        ];
        for (existing, want) in cases {
            assert_eq!(preload_value(lib, existing.map(OsStr::new)), OsString::from(want), "{existing:?}");
        }
    }

    fn config(dir: &Path) -> PreemptConfig {
        PreemptConfig { huge_pages: true, huge_pages_library: dir.join("lib.so"), huge_pages_dir: dir.join("kept"), ..Default::default() }
    }

    #[test]
    fn the_library_is_told_which_of_its_jobs_to_do() {
        let mut cfg = PreemptConfig::default();
        let paths = ["/dev/nvidia".to_string(), "/tmp/sim/gpus/".to_string()];
        let env = |cfg: &PreemptConfig| preload_env(cfg, &paths).into_iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>();
        assert_eq!(
            env(&cfg),
            ["GPU_MODE_COPY_THREADS=8", "GPU_MODE_FORK_DROP=1", "GPU_MODE_FORK_DROP_PREFIXES=/dev/nvidia:/tmp/sim/gpus/", "GPU_MODE_NO_IO_URING=1"]
        );
        cfg.copy_threads = 1;
        assert_eq!(env(&cfg)[0], "GPU_MODE_COPY_THREADS=1");
        cfg.huge_pages = false;
        assert_eq!(env(&cfg)[0], "GPU_MODE_HUGEPAGES=0");
        cfg.forked_children_drop_gpu_files = false;
        assert_eq!(env(&cfg), ["GPU_MODE_HUGEPAGES=0", "GPU_MODE_NO_IO_URING=1"]);
        cfg.hide_io_uring = false;
        assert_eq!(env(&cfg), ["GPU_MODE_HUGEPAGES=0"]);
    }

    #[test]
    fn off_means_no_shim_and_a_missing_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(dir.path());
        cfg.huge_pages_library = dir.path().join("none.so");
        cfg.huge_pages = false;
        cfg.forked_children_drop_gpu_files = false;
        cfg.hide_io_uring = false;
        assert_eq!(text(for_application(&cfg)), Ok(None));
        assert_eq!(text(keep(&cfg)), Ok(None));
        assert!(!cfg.huge_pages_dir.exists(), "all off: nothing is kept");
        // Any of the library's jobs needs it.
        cfg.forked_children_drop_gpu_files = true;
        assert!(for_application(&cfg).unwrap_err().to_string().contains("none.so"));
        cfg.forked_children_drop_gpu_files = false;
        cfg.hide_io_uring = true;
        assert!(for_application(&cfg).unwrap_err().to_string().contains("none.so"));
        cfg.hide_io_uring = false;
        cfg.huge_pages = true;
        let err = for_application(&cfg).unwrap_err().to_string();
        assert!(err.contains("none.so") && err.contains("No such file"), "{err}");
        assert!(keep(&cfg).unwrap_err().to_string().contains("none.so"));
        assert!(matches!(for_application(&cfg), Err(HugepagesError::Unreadable { .. })));
        cfg.huge_pages_library = dir.path().to_path_buf();
        assert!(for_application(&cfg).unwrap_err().to_string().contains("is not a regular file"));
        assert!(matches!(for_application(&cfg), Err(HugepagesError::NotAFile { .. })));
        let lib = dir.path().join("lib.so");
        std::fs::write(&lib, b"\x7fELF v1").unwrap();
        cfg.huge_pages_library = lib.clone();
        // Nothing kept yet: the library itself.
        assert_eq!(text(for_application(&cfg)), Ok(Some(lib.clone())));
    }

    /// gpu-mode-run calls `for_application` as the job's user, not as root
    /// (who reads anything): the user's view runs as uid 65534, on a thread
    /// that became it when the tests run as root (CI).
    #[test]
    fn the_jobs_user_preloads_the_kept_copy_and_is_told_of_a_library_it_cannot_read() {
        let dir = tempfile::tempdir().unwrap();
        chmod(dir.path(), 0o755);
        let cfg = config(dir.path());
        let lib = cfg.huge_pages_library.clone();
        std::fs::write(&lib, b"\x7fELF v1").unwrap();
        chmod(&lib, 0o644);
        // Only root keeps copies (the agent); a plain user's run has none.
        let want = if is_root() { keep(&cfg).unwrap().unwrap() } else { lib.clone() };
        as_nobody("the readable library", || assert_eq!(text(for_application(&cfg)), Ok(Some(want))));
        chmod(&lib, 0o000);
        as_nobody("the unreadable library", || {
            let err = for_application(&cfg).unwrap_err().to_string();
            assert!(err.contains("lib.so") && err.contains("Permission denied"), "{err}");
        });
    }

    fn is_root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }


    #[test]
    fn each_version_is_kept_once_and_the_application_preloads_its_own() {
        if !gpu_mode_testkit::root_or_skip("the kept copies are root's") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        chmod(dir.path(), 0o755);
        let cfg = config(dir.path());
        std::fs::write(&cfg.huge_pages_library, b"\x7fELF v1").unwrap();
        let v1 = keep(&cfg).unwrap().unwrap();
        assert_eq!(v1, cfg.huge_pages_dir.join(kept_name(b"\x7fELF v1")));
        assert_eq!(std::fs::read(&v1).unwrap(), b"\x7fELF v1");
        assert_eq!(std::fs::metadata(&v1).unwrap().mode() & 0o7777, 0o644);
        assert_eq!(std::fs::metadata(&cfg.huge_pages_dir).unwrap().mode() & 0o7777, 0o755);
        assert_eq!(text(keep(&cfg)), Ok(Some(v1.clone())), "kept once");
        assert_eq!(text(for_application(&cfg)), Ok(Some(v1.clone())));
        // An upgrade: the new version is kept beside the old one, which an
        // image taken before it still needs.
        std::fs::write(&cfg.huge_pages_library, b"\x7fELF v2, longer").unwrap();
        let v2 = keep(&cfg).unwrap().unwrap();
        assert_ne!(v1, v2);
        assert!(v1.exists() && v2.exists());
        assert_eq!(text(for_application(&cfg)), Ok(Some(v2)));
    }

    #[test]
    fn a_kept_copy_that_someone_else_could_have_written_is_not_preloaded() {
        if !gpu_mode_testkit::root_or_skip("the kept copies are root's") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        chmod(dir.path(), 0o755);
        let cfg = config(dir.path());
        let lib = cfg.huge_pages_library.clone();
        std::fs::write(&lib, b"\x7fELF v1").unwrap();
        let kept = keep(&cfg).unwrap().unwrap();
        let bytes = b"\x7fELF v1";
        // Writable by others: the library itself instead; keep() mends it.
        chmod(&kept, 0o666);
        assert!(matches!(kept_copy(&cfg.huge_pages_dir, bytes), Err(HugepagesError::NotRootOnly { uid: 0, mode: 0o666, .. })));
        assert_eq!(text(for_application(&cfg)), Ok(Some(lib.clone())));
        assert_eq!(text(keep(&cfg)), Ok(Some(kept.clone())));
        assert_eq!(text(for_application(&cfg)), Ok(Some(kept.clone())));
        // A user's file of the right name and size: the same.
        nix::unistd::chown(&kept, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
        assert_eq!(text(for_application(&cfg)), Ok(Some(lib.clone())));
        std::fs::remove_file(&kept).unwrap();
        // A symlink planted in its place.
        std::os::unix::fs::symlink(&lib, &kept).unwrap();
        assert!(matches!(kept_copy(&cfg.huge_pages_dir, bytes), Err(HugepagesError::Symlink { .. })));
        assert_eq!(text(for_application(&cfg)), Ok(Some(lib.clone())));
        // A directory others may write: nothing in it is trusted.
        std::fs::remove_file(&kept).unwrap();
        keep(&cfg).unwrap();
        chmod(&cfg.huge_pages_dir, 0o777);
        assert!(matches!(kept_copy(&cfg.huge_pages_dir, bytes), Err(HugepagesError::NotRootOnly { mode: 0o777, .. })));
        assert_eq!(text(for_application(&cfg)), Ok(Some(lib)));
        // Root's, but not the library's size.
        chmod(&cfg.huge_pages_dir, 0o755);
        assert!(matches!(kept_copy(&cfg.huge_pages_dir, b"\x7fELF v1 and more"), Err(HugepagesError::Unchecked { .. })));
        std::fs::write(cfg.huge_pages_dir.join(kept_name(b"\x7fELF v9")), b"short").unwrap();
        assert!(matches!(kept_copy(&cfg.huge_pages_dir, b"\x7fELF v9"), Err(HugepagesError::NotACopy { .. })));
    }

    /// Each reason the shim is not preloaded or kept says the words
    /// gpu-mode-run and the agent said before.
    #[test]
    fn each_unusable_shim_says_todays_words() {
        let path = || PathBuf::from("/usr/libexec/slurm-gpu-mode/libgpu_mode_hugepages.so");
        let io = |errno| std::io::Error::from_raw_os_error(errno);
        let cases = [
            (HugepagesError::Unreadable { path: path(), source: io(libc::EACCES) }, "/usr/libexec/slurm-gpu-mode/libgpu_mode_hugepages.so: Permission denied (os error 13)"),
            (HugepagesError::NotAFile { path: path() }, "/usr/libexec/slurm-gpu-mode/libgpu_mode_hugepages.so is not a regular file"),
            (HugepagesError::TooLarge { path: path(), bytes: 70 << 20 }, "/usr/libexec/slurm-gpu-mode/libgpu_mode_hugepages.so is 73400320 bytes, more than the shim's 67108864"),
            (HugepagesError::Unchecked { path: "/var/lib/kept".into(), source: io(libc::ENOENT) }, "/var/lib/kept: No such file or directory (os error 2)"),
            (HugepagesError::Symlink { path: "/var/lib/kept/x.so".into() }, "/var/lib/kept/x.so is a symlink"),
            (HugepagesError::NotRootOnly { path: "/var/lib/kept".into(), uid: 65534, mode: 0o1777 }, "/var/lib/kept is owned by uid 65534 with mode 1777: only root may write it"),
            (HugepagesError::NotACopy { path: "/var/lib/kept/x.so".into() }, "/var/lib/kept/x.so is not a copy of the library"),
            (HugepagesError::Directory { path: "/var/lib/kept".into(), source: io(libc::EROFS) }, "/var/lib/kept: Read-only file system (os error 30)"),
            (HugepagesError::Write { path: "/var/lib/kept/x.so".into(), source: io(libc::ENOSPC) }, "/var/lib/kept/x.so: No space left on device (os error 28)"),
        ];
        for (e, text) in cases {
            assert_eq!(e.to_string(), text, "{e:?}");
        }
    }
}
