//! A child forked without exec from a CUDA process drops the GPU files it
//! inherited (issue 24, item 2), so that the tree can be checkpointed.
//!
//! # Why
//!
//! PyTorch's DataLoader workers (the default fork start method), and any
//! `os.fork()` or multiprocessing helper after CUDA started, are copies of
//! the parent: seen on an H100 (driver 580), such a worker held 31
//! descriptors of /dev/nvidiactl, /dev/nvidia0, /dev/nvidia-uvm and
//! /dev/nvidia-caps/*, and about 30 shared mappings of /dev/nvidia0 and
//! /dev/nvidiactl, while the driver answered CUDA_ERROR_NOT_INITIALIZED for
//! it (it has no CUDA context: CUDA cannot be used in a forked child). The
//! driver's checkpoint therefore leaves them alone, and CRIU cannot dump
//! them ("Can't handle non-regular mapping"). With the child's descriptors
//! closed and those mappings unmapped, the same tree was dumped, and the
//! parent restored intact (docs/validation/2026-11-26-s7/fork-diag-h100.txt).
//!
//! # What it does
//!
//! At load, when `GPU_MODE_FORK_DROP=1` (gpu-mode-run sets it from
//! `[preempt] forked_children_drop_gpu_files`), it registers a
//! `pthread_atfork` child handler. In every child forked without exec it
//! closes each descriptor whose target starts with one of the prefixes in
//! `GPU_MODE_FORK_DROP_PREFIXES` (colon-separated; default `/dev/nvidia`,
//! the config's `cuda_ckpt.device_paths`) and unmaps each mapping of such a
//! file. Nothing else; a process that holds none does two reads of /proc.
//! `vfork` and `posix_spawn` run no fork handlers; an exec'd program starts
//! without the parent's mappings anyway.
//!
//! What a child loses: GPU handles it cannot use (CUDA refuses a forked
//! child), and an NVML handle inherited from the parent (a child that wants
//! NVML calls `nvmlInit` itself, which opens its own descriptors). A child
//! that read the parent's pinned host memory through the inherited mapping
//! would fault: DataLoader workers do not.
//!
//! The handler runs in the child of a possibly multi-threaded process: only
//! system calls, no allocation, no locks, buffers of its own (the child has
//! one thread).

use std::sync::atomic::{AtomicBool, Ordering};

/// The prefixes' text, read at load (no getenv in the child).
const PREFIXES_CAP: usize = 512;
static mut PREFIXES: [u8; PREFIXES_CAP] = [0; PREFIXES_CAP];
static mut PREFIXES_LEN: usize = 0;
static ENABLED: AtomicBool = AtomicBool::new(false);

/// The default when `GPU_MODE_FORK_DROP_PREFIXES` is unset.
const DEFAULT_PREFIXES: &[u8] = b"/dev/nvidia";

/// At load: reads the settings and registers the child handler.
pub(crate) fn init(enabled: Option<&[u8]>, prefixes: Option<&[u8]>) {
    let text = prefixes.filter(|p| !p.is_empty() && p.len() <= PREFIXES_CAP).unwrap_or(DEFAULT_PREFIXES);
    // SAFETY: written once at load, before any thread or fork exists; only
    // read afterwards. Kept whether or not children drop anything: the
    // pool (pool.rs) starts at the first mapping of such a file.
    unsafe {
        let dst = &mut *std::ptr::addr_of_mut!(PREFIXES);
        dst[..text.len()].copy_from_slice(text);
        PREFIXES_LEN = text.len();
    }
    if enabled != Some(b"1") {
        return;
    }
    ENABLED.store(true, Ordering::Release);
    // SAFETY: registers a handler that only makes system calls.
    unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
}

pub(crate) fn prefixes() -> &'static [u8] {
    // SAFETY: see `init`.
    unsafe {
        let all: &[u8; PREFIXES_CAP] = &*std::ptr::addr_of!(PREFIXES);
        &all[..PREFIXES_LEN]
    }
}

/// Whether `path` starts with one of the colon-separated `prefixes`.
pub fn is_dropped(path: &[u8], prefixes: &[u8]) -> bool {
    prefixes.split(|b| *b == b':').any(|p| !p.is_empty() && path.starts_with(p))
}

extern "C" fn in_child() {
    if !ENABLED.load(Ordering::Acquire) {
        return;
    }
    let p = prefixes();
    close_descriptors(p);
    unmap_mappings(p);
}

/// Closes every descriptor that names a dropped file. /proc/self/fd is read
/// with getdents64 (opendir allocates), the closes follow the read.
fn close_descriptors(prefixes: &[u8]) {
    // Descriptors found per pass; a process with more goes round again.
    const MAX: usize = 256;
    loop {
        let mut found = [0 as libc::c_int; MAX];
        let mut n = 0;
        let mut more = false;
        // SAFETY: open/getdents64/readlinkat/close with buffers of this frame.
        unsafe {
            let dir = libc::open(c"/proc/self/fd".as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC);
            if dir < 0 {
                return;
            }
            let mut buf = [0u8; 4096];
            loop {
                let got = libc::syscall(libc::SYS_getdents64, dir, buf.as_mut_ptr(), buf.len());
                if got <= 0 {
                    break;
                }
                let mut at = 0usize;
                while at < got as usize {
                    // struct linux_dirent64: ino (8), off (8), reclen (2), type (1), name.
                    let reclen = u16::from_ne_bytes([buf[at + 16], buf[at + 17]]) as usize;
                    let name = &buf[at + 19..at + reclen];
                    if let Some(fd) = parse_decimal(name) {
                        if fd != dir && names_dropped(dir, name, prefixes) {
                            if n < MAX {
                                found[n] = fd;
                                n += 1;
                            } else {
                                more = true;
                            }
                        }
                    }
                    at += reclen;
                }
            }
            libc::close(dir);
            for fd in &found[..n] {
                libc::close(*fd);
            }
        }
        if !more {
            return;
        }
    }
}

/// Whether the descriptor `name` (NUL-terminated, in /proc/self/fd) points
/// to a dropped file.
unsafe fn names_dropped(dir: libc::c_int, name: &[u8], prefixes: &[u8]) -> bool {
    let mut target = [0u8; 256];
    // SAFETY: `name` is NUL-terminated within the dirent (getdents64 pads it).
    let len = unsafe { libc::readlinkat(dir, name.as_ptr().cast(), target.as_mut_ptr().cast(), target.len()) };
    len > 0 && is_dropped(&target[..len as usize], prefixes)
}

/// The fd number of a /proc/self/fd entry name (NUL-terminated digits).
fn parse_decimal(name: &[u8]) -> Option<libc::c_int> {
    let digits = &name[..name.iter().position(|b| *b == 0).unwrap_or(name.len())];
    if digits.is_empty() || digits.len() > 9 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(digits.iter().fold(0, |n, d| n * 10 + libc::c_int::from(d - b'0')))
}

/// Unmaps every mapping of a dropped file: /proc/self/maps is read to the
/// end first (unmapping while reading would shift it), then the ranges go.
fn unmap_mappings(prefixes: &[u8]) {
    const MAX: usize = 512;
    // Bounded: a process with more goes round again, at most this often.
    for _ in 0..64 {
        let mut ranges = [(0usize, 0usize); MAX];
        let mut n = 0;
        let mut more = false;
        read_lines(c"/proc/self/maps", |line| match parse_mapping(line, prefixes) {
            Some(r) if n < MAX => {
                ranges[n] = r;
                n += 1;
            }
            Some(_) => more = true,
            None => {}
        });
        for (start, end) in &ranges[..n] {
            // SAFETY: unmaps a range the kernel listed as a dropped file's.
            unsafe { libc::munmap(*start as *mut libc::c_void, end - start) };
        }
        if !more {
            return;
        }
    }
}

/// `(start, end)` of a /proc/self/maps line whose path is a dropped file.
pub fn parse_mapping(line: &[u8], prefixes: &[u8]) -> Option<(usize, usize)> {
    // `start-end perms offset dev inode   path`: the path is the sixth field.
    let mut fields = line.split(|b| *b == b' ').filter(|f| !f.is_empty());
    let range = fields.next()?;
    let path = fields.nth(4)?;
    if !is_dropped(path, prefixes) {
        return None;
    }
    let dash = range.iter().position(|b| *b == b'-')?;
    Some((parse_hex(&range[..dash])?, parse_hex(&range[dash + 1..])?))
}

fn parse_hex(text: &[u8]) -> Option<usize> {
    if text.is_empty() || text.len() > 16 {
        return None;
    }
    text.iter().try_fold(0usize, |n, c| Some(n << 4 | (*c as char).to_digit(16)? as usize))
}

/// Calls `each` with every line of `path` (without its newline; a line
/// longer than the buffer is cut to it), reading with plain system calls.
fn read_lines(path: &std::ffi::CStr, mut each: impl FnMut(&[u8])) {
    // SAFETY: open/read/close with a buffer of this frame.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return;
        }
        let mut buf = [0u8; 8192];
        let mut kept = 0usize;
        loop {
            let got = libc::read(fd, buf.as_mut_ptr().add(kept).cast(), buf.len() - kept);
            if got <= 0 {
                if kept > 0 {
                    each(&buf[..kept]);
                }
                break;
            }
            let end = kept + got as usize;
            let mut start = 0;
            while let Some(nl) = buf[start..end].iter().position(|b| *b == b'\n') {
                each(&buf[start..start + nl]);
                start += nl + 1;
            }
            if start == 0 && end == buf.len() {
                // One line fills the buffer: take it as it is.
                each(&buf[..end]);
                kept = 0;
            } else {
                buf.copy_within(start..end, 0);
                kept = end - start;
            }
        }
        libc::close(fd);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_files_under_the_prefixes_are_dropped() {
        let cases: [(&[u8], &[u8], bool); 6] = [
            (b"/dev/nvidiactl", b"/dev/nvidia", true),
            (b"/dev/nvidia-caps/nvidia-cap1", b"/dev/nvidia", true),
            (b"/dev/null", b"/dev/nvidia", false),
            (b"/tmp/sim/gpus/GPU-1/alloc-0", b"/dev/nvidia:/tmp/sim/gpus/", true),
            (b"/tmp/sim/other", b"/dev/nvidia:/tmp/sim/gpus/", false),
            (b"/dev/nvidia0", b"::", false),
        ];
        for (path, prefixes, dropped) in cases {
            assert_eq!(is_dropped(path, prefixes), dropped, "{}", String::from_utf8_lossy(path));
        }
    }

    #[test]
    fn a_mapping_line_of_a_dropped_file_gives_its_range() {
        let p = b"/dev/nvidia";
        let line = b"7f7435657000-7f7435658000 rw-s 00000000 00:06 142                        /dev/nvidiactl";
        assert_eq!(parse_mapping(line, p), Some((0x7f7435657000, 0x7f7435658000)));
        let lib = b"7f7437079000-7f7437094000 r--p 00000000 fe:10 73   /usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04";
        assert_eq!(parse_mapping(lib, p), None, "a library of NVIDIA's is not a device file");
        assert_eq!(parse_mapping(b"7f00-7f10 rw-p 00000000 00:00 0 ", p), None, "anonymous");
        assert_eq!(parse_mapping(b"zz-7f10 rw-s 00000000 00:06 142 /dev/nvidia0", p), None);
    }

    #[test]
    fn descriptor_names_are_decimal() {
        assert_eq!(parse_decimal(b"17\0\0"), Some(17));
        assert_eq!(parse_decimal(b".\0"), None);
        assert_eq!(parse_decimal(b"\0"), None);
    }

    #[test]
    fn lines_are_read_whole_across_reads() {
        let dir = std::env::temp_dir().join(format!("fork-lines-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("maps");
        let long: String = (0..3000).map(|i| format!("line {i} {}\n", "x".repeat(i % 50))).collect();
        std::fs::write(&file, &long).unwrap();
        let mut got = Vec::new();
        let path = std::ffi::CString::new(file.to_str().unwrap()).unwrap();
        read_lines(&path, |l| got.push(String::from_utf8(l.to_vec()).unwrap()));
        assert_eq!(got, long.lines().collect::<Vec<_>>());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
