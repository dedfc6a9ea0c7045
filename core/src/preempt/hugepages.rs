//! Huge pages for the CUDA driver's checkpoint buffer (`[checkpoint]
//! huge_pages`): gpu-mode-run preloads the shim `libgpu_mode_hugepages.so`
//! (crate `hugepages/`, whose docs say what it does and why) into the
//! application. The driver's checkpoint copies the GPU memory into one new
//! mapping of the process, and its time is that of populating fresh memory
//! (H100, 8 GiB PyTorch process: 3.1-3.4 s with the shim against 4.5-4.9 s
//! without, docs/validation.md).
//!
//! Not `criu restore`: CRIU 4.1 maps a restored process's private memory
//! in its restorer with the system call itself, not the C library's mmap
//! (seen: preloaded into criu, the shim saw no mapping), and gives back a
//! mapping's `MADV_HUGEPAGE` only after reading the pages in.
//!
//! Optional speed: a shim that cannot be used is reported and the job runs
//! without it.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

pub const PRELOAD: &str = "LD_PRELOAD";

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

/// The shim to preload into the application (gpu-mode-run, as the job's
/// user): `None` when `huge_pages` is off; an error naming the problem when
/// it is on but the library is not a readable regular file.
pub fn for_application(cfg: &crate::config::CheckpointConfig) -> Result<Option<PathBuf>, String> {
    if !cfg.huge_pages {
        return Ok(None);
    }
    let lib = &cfg.huge_pages_library;
    let meta = std::fs::metadata(lib).map_err(|e| format!("{}: {e}", lib.display()))?;
    if !meta.is_file() {
        return Err(format!("{} is not a regular file", lib.display()));
    }
    // The dynamic loader opens it as the job's user.
    nix::unistd::access(lib, nix::unistd::AccessFlags::R_OK).map_err(|e| format!("{}: {e}", lib.display()))?;
    Ok(Some(lib.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::CheckpointConfig;

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

    #[test]
    fn off_means_no_shim_and_a_missing_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = CheckpointConfig { huge_pages: false, huge_pages_library: dir.path().join("none.so"), ..Default::default() };
        assert_eq!(for_application(&cfg), Ok(None));
        cfg.huge_pages = true;
        let err = for_application(&cfg).unwrap_err();
        assert!(err.contains("none.so") && err.contains("No such file"), "{err}");
        cfg.huge_pages_library = dir.path().to_path_buf();
        assert!(for_application(&cfg).unwrap_err().contains("is not a regular file"));
        let lib = dir.path().join("lib.so");
        std::fs::write(&lib, b"\x7fELF").unwrap();
        cfg.huge_pages_library = lib.clone();
        assert_eq!(for_application(&cfg), Ok(Some(lib.clone())));
        // Root reads anything: the unreadable case needs another user.
        if unsafe { libc::geteuid() } != 0 {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o000)).unwrap();
            assert!(for_application(&cfg).unwrap_err().contains("Permission denied"));
        }
    }
}
