//! The preload library in a real process (issue 24 item 5): with
//! `GPU_MODE_NO_IO_URING=1`, `io_uring_setup` through the C library's
//! `syscall()` fails with ENOSYS, as libuv (PyTorch's TCPStore) calls it;
//! every other call through `syscall()` keeps its arguments (six of them
//! included), result and errno. Without the variable the ring is made.
//!
//! The program is python3 calling `syscall` through ctypes, which finds it
//! by name as any shared library does: the preloaded definition first.

mod common;

use std::process::Command;

const PROGRAM: &str = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
L = ctypes.c_long
setup, getpid, close, mmap = (int(a) for a in sys.argv[1:5])
def call(*args):
    ctypes.set_errno(0)
    r = libc.syscall(*[a if isinstance(a, ctypes._SimpleCData) or hasattr(a, "_obj") else L(a) for a in args])
    return r, ctypes.get_errno()
params = (ctypes.c_uint32 * 30)()
r, e = call(setup, 4, ctypes.byref(params))
print("io_uring_setup: a ring" if r >= 0 else f"io_uring_setup: errno {e}")
r, _ = call(getpid)
print(f"getpid: {'the same' if r == os.getpid() else r}")
print("close(-1): %d errno %d" % call(close, -1))
# mmap's sixth argument (the offset) reaches the kernel: 0 maps, 1 is refused.
r, e = call(mmap, 0, 4096, 3, 0x22, -1, 0)
print(f"mmap offset 0: {'mapped' if r > 0 else e}")
r, e = call(mmap, 0, 4096, 3, 0x22, -1, 1)
print(f"mmap offset 1: {r} errno {e}")
"#;

fn run(hide: bool) -> String {
    let numbers = [libc::SYS_io_uring_setup, libc::SYS_getpid, libc::SYS_close, libc::SYS_mmap].map(|n| n.to_string());
    let mut cmd = Command::new("python3");
    cmd.args(["-c", PROGRAM]).args(numbers).env("LD_PRELOAD", common::built_library()).env("GPU_MODE_HUGEPAGES", "0");
    if hide {
        cmd.env("GPU_MODE_NO_IO_URING", "1");
    }
    let out = cmd.output().expect("python3 (the CI machines have it)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

const PASSED_ON: &str = "getpid: the same\nclose(-1): -1 errno 9\nmmap offset 0: mapped\nmmap offset 1: -1 errno 22\n";

#[test]
fn io_uring_setup_is_answered_enosys_and_every_other_call_goes_through() {
    assert_eq!(run(true), format!("io_uring_setup: errno {}\n{PASSED_ON}", libc::ENOSYS));
}

#[test]
fn without_the_setting_the_ring_is_made() {
    let out = run(false);
    // A kernel without io_uring (or with it disabled) says so itself.
    if !out.starts_with("io_uring_setup: a ring") {
        gpu_mode_testkit::skipped(&gpu_mode_testkit::this_test(), &format!("this kernel makes no io_uring: {}", out.lines().next().unwrap_or("")));
        return;
    }
    assert_eq!(out, format!("io_uring_setup: a ring\n{PASSED_ON}"));
}
