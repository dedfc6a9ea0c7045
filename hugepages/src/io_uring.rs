//! The application's `io_uring_setup` through the C library's `syscall()`
//! fails with ENOSYS, as on a kernel without io_uring (issue 24 item 5), so
//! that a tree whose libraries fall back to epoll stays checkpointable.
//!
//! # Why
//!
//! CRIU cannot dump an io_uring instance (`Can't open <pid>'s mapfile link
//! ...: No such device or address`). torchrun's agent holds two: PyTorch's
//! TCPStore runs a libuv loop (thread `pt_tcpstore_uv`), and libuv sets up
//! rings for its own use when the kernel has io_uring; neither
//! `UV_USE_IO_URING=0` nor `USE_LIBUV=0` in the job's environment took them
//! away (H200s, 2026-11-26), so every torchrun job was refused at its
//! checkpoint and started over. libuv treats a failed `io_uring_setup` as a
//! kernel without io_uring and uses epoll: the same answer as Linux before
//! 5.1, which every io_uring user must handle to run on such kernels
//! (hence ENOSYS rather than the EPERM of `kernel.io_uring_disabled`).
//!
//! # What it does, and nothing else
//!
//! When `GPU_MODE_NO_IO_URING=1` (gpu-mode-run sets it from `[preempt]//! hide_io_uring`), the library defines `syscall`: a call of
//! `io_uring_setup` returns -1 with errno ENOSYS; every other call goes to
//! the C library's `syscall` (found with `dlsym(RTLD_NEXT)`) with the same
//! arguments, its result and errno untouched. Programs that make the system
//! call themselves (liburing built without the C library's `syscall`) still
//! get their ring, and are refused at the checkpoint with the message they
//! got before (core::preempt::uncheckpointable).

use libc::c_long;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

static ENABLED: AtomicBool = AtomicBool::new(false);
static REAL_SYSCALL: AtomicUsize = AtomicUsize::new(0);

type SyscallFn = unsafe extern "C" fn(c_long, c_long, c_long, c_long, c_long, c_long, c_long) -> c_long;

/// At load: reads the setting and finds the C library's `syscall`.
pub(crate) fn init(enabled: Option<&[u8]>) {
    ENABLED.store(enabled == Some(b"1"), Ordering::Relaxed);
    let _ = real_syscall();
}

/// Whether system call `number` is answered ENOSYS instead of made.
pub fn hidden(number: c_long, enabled: bool) -> bool {
    enabled && number == libc::SYS_io_uring_setup
}

fn real_syscall() -> usize {
    super::next_definition(&REAL_SYSCALL, c"syscall")
}

/// `syscall(2)` as the C library does it, but for `io_uring_setup` when
/// hidden.
///
/// The C function is variadic, which Rust cannot define on stable. On the
/// System V x86-64 and AAPCS64 (Linux) calling conventions a variadic call
/// passes integer arguments exactly where a call with seven `long`s does
/// (six registers, then the stack), which is how the C library's own
/// `syscall` reads them; arguments the caller did not pass are read as
/// whatever is there and passed on unused, as the C library's does.
///
/// # Safety
/// As `syscall(2)`: the caller answers for what the call does.
#[no_mangle]
pub unsafe extern "C" fn syscall(number: c_long, a1: c_long, a2: c_long, a3: c_long, a4: c_long, a5: c_long, a6: c_long) -> c_long {
    let real = real_syscall();
    if hidden(number, ENABLED.load(Ordering::Relaxed)) || real == 0 {
        // real == 0: no C library after us, which a preloaded library in
        // a dynamically linked program cannot be without (never seen).
        *libc::__errno_location() = libc::ENOSYS;
        return -1;
    }
    // SAFETY: the C library's syscall, found by name, with the caller's arguments.
    std::mem::transmute::<usize, SyscallFn>(real)(number, a1, a2, a3, a4, a5, a6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_io_uring_setup_is_hidden_and_only_when_asked() {
        let cases: &[(c_long, bool, bool)] = &[
            (libc::SYS_io_uring_setup, true, true),
            (libc::SYS_io_uring_setup, false, false),
            // The ring's other calls need a ring: left to fail on their own.
            (libc::SYS_io_uring_enter, true, false),
            (libc::SYS_io_uring_register, true, false),
            (libc::SYS_getpid, true, false),
            (libc::SYS_futex, true, false),
        ];
        for (number, enabled, want) in cases {
            assert_eq!(hidden(*number, *enabled), *want, "{number} {enabled}");
        }
    }
}
