//! `copy-probe MIB`: the process that `tests/copy.rs` starts with the shim
//! preloaded. Not installed. It copies as the CUDA driver's checkpoint and
//! restore do (the C library's `memcpy`, 2 MiB at a time, into and then out
//! of one `MAP_POPULATE` buffer), and reports what it found:
//!
//! - `threads_before=<n>` and `threads_after=<n>`: the process's threads
//!   before and after the copies (the shim's helpers are the difference);
//! - `into_ok=1`, `out_ok=1`: every byte arrived, each way;
//! - `child_ok=1`: a child forked afterwards copied into its copy of the
//!   buffer, alone, and got the same bytes (it did not wait for helpers it
//!   does not have); `child_ok=unmapped`: the child has no buffer (one lent
//!   from the pool, which forked children do not get);
//! - `plain_ok=1`: a copy between two other mappings.
//!
//! Then it unmaps the buffer, which makes the shim log its line.

use std::time::Duration;

const PIECE: usize = 2 << 20;

fn threads() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status.lines().find_map(|l| l.strip_prefix("Threads:")).unwrap().trim().parse().unwrap()
}

/// A private anonymous mapping; `populate`: as the driver's buffer.
fn map(len: usize, populate: bool) -> *mut u8 {
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | if populate { libc::MAP_POPULATE } else { 0 };
    // SAFETY: a fresh mapping, which the process keeps.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
    assert_ne!(p, libc::MAP_FAILED);
    p.cast()
}

/// `len` bytes from `src` to `dst` through the C library's memcpy (the
/// preloaded one), `PIECE` at a time.
fn copy_in_pieces(dst: *mut u8, src: *const u8, len: usize) {
    let mut at = 0;
    while at < len {
        let n = PIECE.min(len - at);
        // SAFETY: both ranges are within the caller's mappings of `len`.
        unsafe { libc::memcpy(dst.add(at).cast(), src.add(at).cast(), n) };
        at += n;
    }
}

fn same(a: *const u8, b: *const u8, len: usize) -> bool {
    // SAFETY: both are mappings of at least `len` bytes.
    unsafe { std::slice::from_raw_parts(a, len) == std::slice::from_raw_parts(b, len) }
}

fn main() {
    let mib: usize = std::env::args().nth(1).expect("usage: copy-probe MIB").parse().expect("MIB");
    let len = mib << 20;
    println!("threads_before={}", threads());
    let src = map(len, false);
    // SAFETY: src is a mapping of len bytes.
    let pattern = unsafe { std::slice::from_raw_parts_mut(src, len) };
    for (i, b) in pattern.iter_mut().enumerate() {
        *b = (i.wrapping_mul(2654435761) >> 13) as u8;
    }
    let buffer = map(len, true);
    copy_in_pieces(buffer, src, len);
    println!("into_ok={}", u8::from(same(buffer, src, len)));
    let back = map(len, false);
    copy_in_pieces(back, buffer, len);
    println!("out_ok={}", u8::from(same(back, src, len)));
    std::thread::sleep(Duration::from_millis(50));
    println!("threads_after={}", threads());
    let other = map(len, false);
    copy_in_pieces(other, src, len);
    println!("plain_ok={}", u8::from(same(other, src, len)));
    // SAFETY: fork in a process whose other threads (the shim's helpers)
    // hold no lock now; the child only copies, compares and exits.
    match unsafe { libc::fork() } {
        0 => {
            // SAFETY: the child's copy of the buffer, then its end.
            unsafe {
                if libc::madvise(buffer.cast(), len, libc::MADV_NORMAL) != 0 {
                    libc::_exit(2);
                }
                std::ptr::write_bytes(buffer, 0, len);
                copy_in_pieces(buffer, src, len);
                libc::_exit(if same(buffer, src, len) { 0 } else { 1 });
            }
        }
        pid => {
            let mut status = 0;
            // SAFETY: our child.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            let said = match (libc::WIFEXITED(status), libc::WEXITSTATUS(status)) {
                (true, 0) => "1",
                (true, 2) => "unmapped",
                _ => "0",
            };
            println!("child_ok={said}");
        }
    }
    // SAFETY: the buffer, unmapped once.
    unsafe { libc::munmap(buffer.cast(), len) };
}
