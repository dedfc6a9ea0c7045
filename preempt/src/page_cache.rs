//! How much of an image is in the page cache, and so how a restore gets the
//! CUDA driver's checkpoint buffer back.
//!
//! From an image in the page cache, the buffer is mapped from the image's
//! pages file (packaging/criu/0007, `CRIU_MAP_SEQUENTIAL_PAGES`): nothing is
//! allocated or copied at the restore and the driver reads the cache itself
//! (an 8 GiB job restored in 1.3 s instead of 1.5 s, 32 GiB in 3.3 s instead
//! of 4.5 s, on an H200; docs/preempt.md, "The buffer mapped from the
//! image"). From an image that is not (another node after a requeue, or the
//! cache reclaimed), CRIU's page readers read the buffer, as they always
//! did: they were measured at 0.79 of the disk's read limit, while mapped,
//! the reads would be left to the driver's page faults behind the agent's
//! read-ahead, which nobody measured. So the buffer is mapped only where
//! [`MAPPED_SHARE`] of the pages files is cached when the restore starts.
//!
//! Hand-written: `cachestat(2)` (Linux 6.5) has no wrapper in libc or nix.

use std::os::fd::{AsRawFd, BorrowedFd};

/// `__NR_cachestat`, the same number on every architecture (Linux 6.5).
const SYS_CACHESTAT: libc::c_long = 451;

/// Map the buffer when at least this share (numerator, denominator) of the
/// image's pages files is in the page cache.
pub const MAPPED_SHARE: (u64, u64) = (3, 4);

#[repr(C)]
struct CachestatRange {
    off: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct Cachestat {
    nr_cache: u64,
    nr_dirty: u64,
    nr_writeback: u64,
    nr_evicted: u64,
    nr_recently_evicted: u64,
}

/// Bytes of the file behind `fd` in the page cache, or `None` where the
/// kernel cannot say (before 6.5, or a file system without a page cache).
pub fn cached_bytes(fd: BorrowedFd) -> Option<u64> {
    // len 0: from `off` to the end of the file.
    let range = CachestatRange { off: 0, len: 0 };
    let mut stat = Cachestat::default();
    // SAFETY: the kernel reads `range` and writes `stat`, both ours and
    // live for the call; flags must be 0.
    let rc = unsafe { libc::syscall(SYS_CACHESTAT, fd.as_raw_fd(), &range as *const CachestatRange, &mut stat as *mut Cachestat, 0u32) };
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    (rc == 0 && page > 0).then(|| stat.nr_cache * page as u64)
}

/// How the restore gets the driver's buffer back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufferRestore {
    /// Mapped from the image (the page cache held `cached` of `total`
    /// bytes of its pages files; `None`: the kernel could not say).
    Mapped { cached: Option<u64>, total: u64 },
    /// Read by CRIU's page readers: the site turned the mapping off.
    ReadAsConfigured,
    /// Read by CRIU's page readers: too little of the image is cached.
    ReadCold { cached: u64, total: u64 },
}

impl BufferRestore {
    /// The decision: `configured` is `preempt.restore_map_buffers`;
    /// `cached` the bytes of the pages files in the page cache (`None`:
    /// unknown, taken as cached: a restore on the node that dumped is the
    /// common case), of `total`.
    pub fn decide(configured: bool, cached: Option<u64>, total: u64) -> Self {
        let (num, den) = MAPPED_SHARE;
        match cached {
            _ if !configured => Self::ReadAsConfigured,
            Some(c) if c.saturating_mul(den) < total.saturating_mul(num) => Self::ReadCold { cached: c, total },
            _ => Self::Mapped { cached, total },
        }
    }

    pub fn mapped(&self) -> bool {
        matches!(self, Self::Mapped { .. })
    }
}

impl std::fmt::Display for BufferRestore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: u64| b >> 20;
        match self {
            Self::Mapped { cached: Some(c), total } => {
                write!(f, "the driver's buffer mapped from the image ({} of its {} MiB of pages in the page cache)", mib(*c), mib(*total))
            }
            Self::Mapped { cached: None, total } => {
                write!(f, "the driver's buffer mapped from the image ({} MiB of pages; the kernel does not say what is cached)", mib(*total))
            }
            Self::ReadAsConfigured => write!(f, "the driver's buffer read by CRIU's page readers (restore_map_buffers = false)"),
            Self::ReadCold { cached, total } => write!(
                f,
                "the driver's buffer read by CRIU's page readers: only {} of the image's {} MiB of pages in the page cache",
                mib(*cached),
                mib(*total)
            ),
        }
    }
}

/// Whether an image file is one of CRIU's pages files (`pages-<id>.img`),
/// which hold the processes' memory: the ones the buffer is mapped from.
pub fn is_pages_file(name: &str) -> bool {
    name.starts_with("pages-") && name.ends_with(".img")
}

/// The image's pages files among `files` (name, bytes) in the run
/// directory `dir`: their bytes in the page cache (`None` where one cannot
/// be told, or the directory cannot be opened) and their total.
pub fn pages_cached(dir: &std::path::Path, files: &[(&str, u64)]) -> (Option<u64>, u64) {
    use nix::fcntl::{openat, OFlag};
    use std::os::fd::AsFd;
    let dir = crate::fsutil::open_dir_nofollow(dir).ok();
    let pages = files.iter().filter(|(n, _)| is_pages_file(n));
    let (mut cached, mut total) = (Some(0u64), 0u64);
    for (name, bytes) in pages {
        total += bytes;
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK;
        let open = |d: &std::os::fd::OwnedFd| openat(d, *name, flags, nix::sys::stat::Mode::empty()).ok();
        let here = dir.as_ref().and_then(open).and_then(|fd| cached_bytes(fd.as_fd()));
        cached = cached.zip(here).map(|(a, b)| a + b);
    }
    (cached, total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_buffer_is_mapped_only_from_a_cached_image_and_where_the_site_allows() {
        const G: u64 = 1 << 30;
        let cases = [
            (true, Some(8 * G), 8 * G, BufferRestore::Mapped { cached: Some(8 * G), total: 8 * G }),
            (true, Some(6 * G), 8 * G, BufferRestore::Mapped { cached: Some(6 * G), total: 8 * G }),
            (true, Some(6 * G - 1), 8 * G, BufferRestore::ReadCold { cached: 6 * G - 1, total: 8 * G }),
            (true, Some(0), 8 * G, BufferRestore::ReadCold { cached: 0, total: 8 * G }),
            (true, None, 8 * G, BufferRestore::Mapped { cached: None, total: 8 * G }),
            (true, Some(0), 0, BufferRestore::Mapped { cached: Some(0), total: 0 }),
            (false, Some(8 * G), 8 * G, BufferRestore::ReadAsConfigured),
            (true, Some(u64::MAX), u64::MAX, BufferRestore::Mapped { cached: Some(u64::MAX), total: u64::MAX }),
        ];
        for (configured, cached, total, want) in cases {
            let got = BufferRestore::decide(configured, cached, total);
            assert_eq!(got, want, "configured {configured}, cached {cached:?} of {total}");
            assert_eq!(got.mapped(), matches!(want, BufferRestore::Mapped { .. }));
        }
        let cold = BufferRestore::decide(true, Some(1 << 30), 8 << 30).to_string();
        assert_eq!(cold, "the driver's buffer read by CRIU's page readers: only 1024 of the image's 8192 MiB of pages in the page cache");
    }

    /// A file just written is in the page cache; dropped from it (after
    /// fsync, `POSIX_FADV_DONTNEED`), it is not: what a cold image looks like.
    /// Only the pages files count.
    #[test]
    fn the_page_cache_is_asked_about_the_pages_files_only() {
        let dir = tempfile::tempdir().unwrap();
        let data = vec![7u8; 8 << 20];
        for name in ["pages-1.img", "core-1.img"] {
            std::fs::write(dir.path().join(name), &data).unwrap();
        }
        let files = [("pages-1.img", 8u64 << 20), ("core-1.img", 8 << 20)];
        let (cached, total) = pages_cached(dir.path(), &files);
        assert_eq!(total, 8 << 20, "the core file counted");
        // A run directory that cannot be opened: unknown, of the pages' bytes alone.
        assert_eq!(pages_cached(&dir.path().join("gone"), &files), (None, 8 << 20));
        let Some(cached) = cached else {
            gpu_mode_testkit::skipped("page_cache::the_page_cache_is_asked_about_the_pages_files_only", "no cachestat(2) (Linux 6.5)");
            return;
        };
        assert_eq!(cached, 8 << 20, "a file just written is cached");
        let f = std::fs::File::open(dir.path().join("pages-1.img")).unwrap();
        f.sync_all().unwrap();
        // SAFETY: advice on a descriptor we own.
        assert_eq!(unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) }, 0);
        let (cached, _) = pages_cached(dir.path(), &files);
        let cached = cached.unwrap();
        if cached >= 1 << 20 {
            // tmpfs (its pages are the files themselves), or a file system
            // that ignores the advice: no cold file to be had here.
            let fs = nix::sys::statfs::statfs(dir.path()).map(|s| format!("{:?}", s.filesystem_type())).unwrap_or_default();
            let why = format!("{cached} bytes stay cached after POSIX_FADV_DONTNEED in {} (file system {fs})", dir.path().display());
            gpu_mode_testkit::skipped("page_cache::the_page_cache_is_asked_about_the_pages_files_only", &why);
            return;
        }
        assert!(!BufferRestore::decide(true, Some(cached), total).mapped());
    }
}
