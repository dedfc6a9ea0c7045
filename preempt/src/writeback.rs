//! Writing a dump to disk while CRIU is still writing it.
//!
//! CRIU writes its images into the page cache; making them durable afterwards
//! (`sync`, or an fsync per file) then writes the whole image in series after
//! the dump: dump time + image size / disk bandwidth. The kernel's own
//! background writeback starts only past `dirty_background_ratio` of memory
//! (gigabytes on a GPU node), so for most of a dump nothing reaches the disk.
//! [`Writeback`] watches the run directory while CRIU runs and asks the
//! kernel to start writing every new part of every image file at once
//! (`sync_file_range(SYNC_FILE_RANGE_WRITE)`: it starts I/O, it does not
//! wait), so the disk works alongside CRIU and the fsyncs at the end find
//! little left to write. It changes nothing about durability: the seal still
//! fsyncs every file and the directory before the manifest is written; this
//! only moves the writing earlier.
//!
//! The run directory is the agent's (root-only, 0700, made fresh for the
//! run): only CRIU writes there. Files are opened relative to the directory's
//! descriptor with O_NOFOLLOW and must be regular files.

use crate::fsutil;
use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How often the directory is looked at.
const TICK: Duration = Duration::from_millis(50);
/// Less than this new in a file waits for the next tick (small files and
/// the last bytes of big ones are left to the seal's fsync).
const MIN_CHUNK: u64 = 4 << 20;

/// What the watcher started writing, for the tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WritebackStats {
    /// Bytes whose writing was started before the seal.
    pub started_bytes: u64,
    pub files: usize,
}

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    started_bytes: AtomicU64,
    files: AtomicUsize,
}

pub struct Writeback {
    shared: Arc<Shared>,
}

impl Writeback {
    /// Starts watching `run` (a directory CRIU is about to write into).
    pub fn start(run: &Path) -> std::io::Result<Writeback> {
        let dir = fsutil::open_dir_nofollow(run)?;
        let shared = Arc::new(Shared::default());
        let theirs = Arc::clone(&shared);
        let path = run.to_path_buf();
        std::thread::Builder::new().name("image-writeback".into()).spawn(move || watch(&path, &dir, &theirs))?;
        Ok(Writeback { shared })
    }

    /// What was started so far.
    pub fn stats(&self) -> WritebackStats {
        WritebackStats {
            started_bytes: self.shared.started_bytes.load(Ordering::SeqCst),
            files: self.shared.files.load(Ordering::SeqCst),
        }
    }

    /// CRIU has ended: the watcher stops at its next look, and the caller
    /// does not wait for it. (`sync_file_range` may block while the disk's
    /// queue is full; waiting for it would put the disk back in series. What
    /// it has not started, the seal's fsyncs write.)
    pub fn stop(self) -> WritebackStats {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.stats()
    }
}

fn watch(path: &Path, dir: &OwnedFd, shared: &Shared) {
    let mut started: BTreeMap<String, u64> = BTreeMap::new();
    while !shared.stop.load(Ordering::SeqCst) {
        pass(path, dir, &mut started, shared);
        std::thread::sleep(TICK);
    }
}

/// One look at the directory: starts writing what each file gained since.
fn pass(path: &Path, dir: &OwnedFd, started: &mut BTreeMap<String, u64>, shared: &Shared) {
    for name in file_names(path) {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(file) = open_regular(dir, &name) else { continue };
        let Ok(size) = file.metadata().map(|m| m.len()) else { continue };
        let done = started.get(&name).copied().unwrap_or(0);
        if size >= done + MIN_CHUNK {
            start_writing(&file, done, size - done);
            if done == 0 {
                shared.files.fetch_add(1, Ordering::SeqCst);
            }
            shared.started_bytes.fetch_add(size - done, Ordering::SeqCst);
            started.insert(name, size);
        }
    }
}

/// The names in the run directory (only root can change it: its parents are
/// root's and 0700); each is then opened through the directory's descriptor.
fn file_names(path: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(path) else { return Vec::new() };
    entries.flatten().filter_map(|e| e.file_name().to_str().map(String::from)).collect()
}

fn open_regular(dir: &OwnedFd, name: &str) -> std::io::Result<File> {
    use nix::fcntl::{openat, OFlag};
    use nix::sys::stat::Mode;
    let fd = openat(dir, name, OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK, Mode::empty())?;
    let file = File::from(fd);
    if !file.metadata()?.file_type().is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok(file)
}

/// Asks the kernel to start writing `len` bytes at `offset` (no waiting). A
/// refusal is harmless: the seal's fsync writes it anyway.
fn start_writing(file: &File, offset: u64, len: u64) {
    // SAFETY: a plain syscall on a descriptor we own; no memory is passed.
    unsafe {
        libc::sync_file_range(file.as_raw_fd(), offset as libc::off64_t, len as libc::off64_t, libc::SYNC_FILE_RANGE_WRITE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// The kernel shows no per-file count of pages under writeback that a
    /// test could read reliably: the test checks what the watcher started
    /// (every byte of every regular file, none through the symlink) and that
    /// the data is intact.
    #[test]
    fn files_written_while_watched_are_started_and_left_intact() {
        let dir = tempfile::tempdir().unwrap();
        let wb = Writeback::start(dir.path()).unwrap();
        let mut f = File::create(dir.path().join("pages-1.img")).unwrap();
        let chunk = vec![7u8; 1 << 20];
        for _ in 0..24 {
            f.write_all(&chunk).unwrap();
        }
        std::fs::write(dir.path().join("core-1.img"), b"small").unwrap();
        std::os::unix::fs::symlink(dir.path().join("pages-1.img"), dir.path().join("pages-2.img")).unwrap();
        let big = 24u64 << 20;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while wb.stats().started_bytes + MIN_CHUNK <= big && std::time::Instant::now() < deadline {
            std::thread::sleep(TICK);
        }
        std::thread::sleep(TICK * 3);
        let stats = wb.stop();
        // The big file, each byte at most once: all of it but what the last
        // look found short of MIN_CHUNK (the seal's); not the small file;
        // nothing through the symlink to the big one.
        assert_eq!(stats.files, 1, "{stats:?}");
        assert!(stats.started_bytes + MIN_CHUNK > big && stats.started_bytes <= big, "{stats:?}");
        assert_eq!(std::fs::read(dir.path().join("pages-1.img")).unwrap(), [chunk.as_slice(); 24].concat());
    }

    #[test]
    fn a_missing_directory_is_an_error() {
        assert!(Writeback::start(Path::new("/nonexistent/run")).is_err());
    }
}
