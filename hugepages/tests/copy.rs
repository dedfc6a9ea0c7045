//! The shim's split copies in a real process (issue 39): `copy-probe`
//! (src/bin/) copies into and out of a `MAP_POPULATE` buffer through the C
//! library's memcpy, as the CUDA driver's checkpoint and restore do, with
//! the shim preloaded, and reports what it found.

mod common;

use std::process::Command;

const PROBE: &str = env!("CARGO_BIN_EXE_copy-probe");
const MIB: usize = 96;

fn value<'a>(stdout: &'a str, key: &str) -> &'a str {
    let key = format!("{key}=");
    stdout.lines().find_map(|l| l.strip_prefix(key.as_str())).unwrap_or_else(|| panic!("no {key} in {stdout}"))
}

/// The CPUs this process may run on: the shim never starts more threads.
fn cpus_allowed() -> usize {
    // SAFETY: a zeroed cpu_set_t filled by the kernel.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set), 0);
        libc::CPU_COUNT(&set) as usize
    }
}

fn run(threads: &str, pool: bool) -> (String, String) {
    let mut cmd = Command::new(PROBE);
    if pool {
        cmd.env("GPU_MODE_POOL_MIB", MIB.to_string()).env("GPU_MODE_POOL_EAGER", "1");
    }
    let out = cmd
        .arg(MIB.to_string())
        .env("LD_PRELOAD", common::built_library())
        .env("GPU_MODE_HUGEPAGES_LOG", "1")
        .env("GPU_MODE_COPY_THREADS", threads)
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for key in ["into_ok", "out_ok", "plain_ok"] {
        assert_eq!(value(&stdout, key), "1", "{key}:\n{stdout}\n{stderr}");
    }
    // A pool's buffer is not inherited (MADV_DONTFORK, tests/pool.rs).
    assert_eq!(value(&stdout, "child_ok"), if pool { "unmapped" } else { "1" }, "{stdout}\n{stderr}");
    (stdout, stderr)
}

fn helpers(stdout: &str) -> usize {
    value(stdout, "threads_after").parse::<usize>().unwrap() - value(stdout, "threads_before").parse::<usize>().unwrap()
}

fn assert_split(pool: bool) {
    let threads = 4.min(cpus_allowed());
    let (stdout, stderr) = run("4", pool);
    assert_eq!(helpers(&stdout), threads - 1, "helpers started:\n{stdout}\n{stderr}");
    if threads > 1 {
        // Only the buffer's copies count: the copy between two other
        // mappings is not in the line.
        let line = format!("gpu-mode-copy: buffer {MIB} MiB, {MIB} MiB in and {MIB} MiB out by {threads} threads in ");
        assert!(stderr.contains(&line), "no {line:?} in:\n{stderr}");
    }
}

#[test]
fn copies_into_and_out_of_the_buffer_are_split_across_threads() {
    assert_split(false);
}

#[test]
fn copies_into_and_out_of_a_buffer_lent_from_the_pool_are_split_too() {
    assert_split(true);
}

#[test]
fn one_thread_copies_alone() {
    let (stdout, stderr) = run("1", false);
    assert_eq!(helpers(&stdout), 0, "no helper:\n{stdout}\n{stderr}");
    assert!(!stderr.contains("gpu-mode-copy:"), "{stderr}");
}
