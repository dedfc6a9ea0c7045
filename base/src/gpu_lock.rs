//! Per-GPU locks. Prologs and epilogs of different jobs run at the same time;
//! whatever reads and changes a GPU's shared state (compute mode, the MPS
//! daemon registry, MIG instances) holds the lock of every GPU it touches.
//!
//! flock(2) on `<runtime_dir>/locks/gpu<N>.lock`, N the NVML index (so every
//! job names a GPU alike, whatever Slurm calls it): released by the kernel when
//! the holder dies, so a killed prolog never leaves a GPU locked. Locks are
//! taken in ascending GPU order, so two jobs can never deadlock.

use crate::fsutil;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Held locks; dropping releases them.
#[derive(Debug)]
pub struct GpuLocks {
    _files: Vec<File>,
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("GPU {gpu}: lock {path} still held by another job after {secs} s")]
    Timeout { gpu: u32, path: PathBuf, secs: u64 },
    #[error("GPU lock {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

pub fn lock_path(runtime_dir: &Path, gpu: u32) -> PathBuf {
    runtime_dir.join("locks").join(format!("gpu{gpu}.lock"))
}

impl GpuLocks {
    /// Locks `gpus` (any order, duplicates ignored), waiting at most `timeout`.
    pub fn acquire(runtime_dir: &Path, gpus: &[u32], timeout: Duration) -> Result<GpuLocks, LockError> {
        let mut sorted = gpus.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let dir = runtime_dir.join("locks");
        fsutil::ensure_runtime_subdir(runtime_dir, &dir).map_err(|source| LockError::Io { path: dir.clone(), source })?;
        let deadline = Instant::now() + timeout;
        let files = sorted
            .iter()
            .map(|&gpu| lock_one(&lock_path(runtime_dir, gpu), gpu, deadline, timeout))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(GpuLocks { _files: files })
    }
}

fn lock_one(path: &Path, gpu: u32, deadline: Instant, timeout: Duration) -> Result<File, LockError> {
    let io = |source| LockError::Io { path: path.to_path_buf(), source };
    // O_NOFOLLOW: only root writes the 0700 lock directory, but a link
    // left there must not make root open (and create) whatever it names.
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(io)?;
    loop {
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(file);
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(io(err));
        }
        if Instant::now() >= deadline {
            return Err(LockError::Timeout { gpu, path: path.to_path_buf(), secs: timeout.as_secs() });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_gpu_times_out_and_is_free_after_release() {
        let dir = tempfile::tempdir().unwrap();
        let held = GpuLocks::acquire(dir.path(), &[2, 0], Duration::from_secs(1)).unwrap();
        // flock locks belong to the open file description: a second open in
        // the same process contends like another process would.
        let err = GpuLocks::acquire(dir.path(), &[1, 2], Duration::from_millis(50)).unwrap_err().to_string();
        assert!(err.starts_with("GPU 2: lock") && err.contains("still held"), "{err}");
        // GPU 1 alone is free.
        GpuLocks::acquire(dir.path(), &[1], Duration::from_millis(50)).unwrap();
        drop(held);
        GpuLocks::acquire(dir.path(), &[0, 1, 2], Duration::from_millis(50)).unwrap();
    }

    #[test]
    fn waiters_get_the_lock_when_it_is_released() {
        let dir = tempfile::tempdir().unwrap();
        let held = GpuLocks::acquire(dir.path(), &[3], Duration::from_secs(1)).unwrap();
        let path = dir.path().to_path_buf();
        let waiter = std::thread::spawn(move || GpuLocks::acquire(&path, &[3], Duration::from_secs(5)).is_ok());
        std::thread::sleep(Duration::from_millis(100));
        drop(held);
        assert!(waiter.join().unwrap());
    }
}
