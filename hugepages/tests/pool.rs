//! The shim's host memory pool in a real process (issue 39): `pool-probe`
//! (src/bin/) does to its memory what the CUDA driver's checkpoint does
//! (one `MAP_POPULATE` buffer, later unmapped) with the shim preloaded and a
//! pool asked for, and reports what it found.

mod common;

use std::process::{Command, Stdio};

const PROBE: &str = env!("CARGO_BIN_EXE_pool-probe");
const MIB: u64 = 96;

fn value<'a>(stdout: &'a str, key: &str) -> &'a str {
    let key = format!("{key}=");
    stdout.lines().find_map(|l| l.strip_prefix(key.as_str())).unwrap_or_else(|| panic!("no {key} in {stdout}"))
}

/// Every promise of the pool, from the probe's report and the shim's log.
fn assert_served_from_the_pool(stdout: &str, stderr: &str) {
    let pool = value(stdout, "pool");
    assert_ne!(pool, "none", "no pool was populated:\n{stdout}\n{stderr}");
    assert_eq!(value(stdout, "buffer"), pool, "the buffer is the pool's start:\n{stdout}\n{stderr}");
    assert_eq!(value(stdout, "rss"), (MIB << 10).to_string(), "populated when mmap returns:\n{stdout}");
    assert_eq!(value(stdout, "zero"), "1", "zero, as MAP_POPULATE gives it:\n{stdout}");
    assert_eq!(value(stdout, "child_mapped"), "0", "a forked child has none of it:\n{stdout}");
    assert_eq!((value(stdout, "munmap"), value(stdout, "kept")), ("0", "1"), "munmap succeeds, the thread unmaps later:\n{stdout}");
    assert_eq!(value(stdout, "rebuilt"), "1", "the buffer freed and a new pool built:\n{stdout}\n{stderr}");
    let lent = format!("gpu-mode-pool: lent {MIB} MiB, {MIB} MiB populated before, 0 MiB made");
    let at = |needle: &str| stderr.find(needle).unwrap_or_else(|| panic!("no {needle:?} in:\n{stderr}"));
    assert!(at(&lent) < at(&format!("gpu-mode-pool: buffer freed {MIB} MiB")), "{stderr}");
}

fn probe() -> Command {
    let mut cmd = Command::new(PROBE);
    cmd.arg(MIB.to_string()).env("LD_PRELOAD", common::built_library()).env("GPU_MODE_HUGEPAGES_LOG", "1");
    cmd
}

#[test]
fn a_fixed_pool_serves_the_populated_buffer_and_is_built_again_after_it() {
    let out = probe().env("GPU_MODE_POOL_MIB", MIB.to_string()).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_served_from_the_pool(&stdout, &stderr);
}

/// The probe with a size link for it in a pool directory, as gpu-mode-run
/// and the agent set it up; `gpu_file`: it maps a file under the GPU
/// prefixes first, as the CUDA driver maps /dev/nvidiactl.
fn probe_with_link(gpu_file: bool, wait_s: &str) -> (String, String) {
    let dir = tempfile::tempdir().unwrap();
    let (links, gpus) = (dir.path().join("pool"), dir.path().join("gpus"));
    std::fs::create_dir_all(&links).unwrap();
    std::fs::create_dir_all(&gpus).unwrap();
    let mut cmd = probe();
    cmd.arg(wait_s).env("GPU_MODE_POOL_DIR", &links).env("GPU_MODE_FORK_DROP_PREFIXES", format!("/dev/nvidia:{}/", gpus.display()));
    if gpu_file {
        cmd.env("POOL_PROBE_GPU_FILE", gpus.join("ctl"));
    }
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    std::os::unix::fs::symlink(MIB.to_string(), links.join(child.id().to_string())).unwrap();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(out.status.success(), "{stdout}\n{stderr}");
    (stdout, stderr)
}

#[test]
fn the_agents_size_link_sizes_the_pool_of_a_process_that_maps_a_gpu_file() {
    let (stdout, stderr) = probe_with_link(true, "10");
    assert_eq!(value(&stdout, "threads"), "2", "the pool's thread started at the GPU file's mapping:\n{stdout}");
    assert_served_from_the_pool(&stdout, &stderr);
}

#[test]
fn a_process_that_maps_no_gpu_file_gets_no_thread_and_no_pool() {
    // 3 s for a pool that must not come (the size is there to read).
    let (stdout, stderr) = probe_with_link(false, "3");
    assert_eq!(value(&stdout, "threads"), "1", "no thread in a process that does not use the GPU:\n{stdout}");
    assert_eq!(value(&stdout, "pool"), "none", "{stdout}\n{stderr}");
}

#[test]
fn without_a_size_there_is_no_pool() {
    let dir = tempfile::tempdir().unwrap();
    // 3 s for a pool that must not come (the agent's size is read every 2 s).
    let out = probe().arg("3").env("GPU_MODE_POOL_DIR", dir.path()).env("GPU_MODE_POOL_EAGER", "1").output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(value(&stdout, "pool"), "none", "{stdout}\n{stderr}");
    assert!(!stderr.contains("gpu-mode-pool: lent"), "{stderr}");
}
