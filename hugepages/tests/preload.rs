//! The shim preloaded into a real process: this test binary runs itself
//! again with `LD_PRELOAD` naming the built library, maps memory through
//! the C library's `mmap` there, and reports the mapping's `VmFlags` from
//! /proc/self/smaps (`hg`: MADV_HUGEPAGE was applied).

use std::path::PathBuf;
use std::process::Command;

const CHILD: &str = "GPU_MODE_HUGEPAGES_TEST_CHILD";

/// The library cargo built for this test: target/<profile>/deps/ (where
/// this test runs) or target/<profile>/.
fn shim() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let candidates = [deps.join("libgpu_mode_hugepages.so"), deps.parent().unwrap().join("libgpu_mode_hugepages.so")];
    candidates.iter().find(|p| p.exists()).cloned().unwrap_or_else(|| panic!("libgpu_mode_hugepages.so not built: {candidates:?}"))
}

/// The field `key` (`VmFlags`, `Rss`, ...) of the mapping that starts at `addr`.
fn smaps_field(addr: usize, key: &str) -> String {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let head = format!("{addr:x}-");
    let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&head)).skip(1);
    let key = format!("{key}:");
    lines.find_map(|l| l.strip_prefix(key.as_str()).map(str::trim).map(String::from)).unwrap_or_default()
}

/// In the child: `SPEC` is `MIB:KIND` (KIND anon, populate, noreserve,
/// shared); maps it, prints its resident and huge-page kB, touches it, and
/// prints its flags and the errno after the call.
fn child(spec: &str) {
    let (mib, kind) = spec.split_once(':').unwrap();
    let len = mib.parse::<usize>().unwrap() << 20;
    let flags = match kind {
        "anon" => libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
        "populate" => libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
        "noreserve" => libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
        "shared" => libc::MAP_SHARED | libc::MAP_ANONYMOUS,
        _ => panic!("{kind}"),
    };
    // SAFETY: a fresh anonymous mapping, written within its length.
    unsafe {
        *libc::__errno_location() = 1234;
        let p = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0);
        assert_ne!(p, libc::MAP_FAILED);
        let errno = *libc::__errno_location();
        println!("rss={}", smaps_field(p as usize, "Rss"));
        println!("thp={}", smaps_field(p as usize, "AnonHugePages"));
        std::ptr::write_bytes(p.cast::<u8>(), 7, len);
        println!("flags={}", smaps_field(p as usize, "VmFlags"));
        println!("errno={errno}");
    }
}

/// A `key=` line of the child's output.
fn line<'a>(stdout: &'a str, key: &str) -> &'a str {
    let key = format!("{key}=");
    stdout.lines().find_map(|l| l.split_once(key.as_str()).map(|(_, v)| v)).unwrap_or_else(|| panic!("no {key} in {stdout}"))
}

fn kib(field: &str) -> u64 {
    field.trim_end_matches("kB").trim().parse().unwrap_or_else(|_| panic!("{field:?}"))
}

fn run(spec: &str, env: &[(&str, &str)]) -> (String, String) {
    let (stdout, stderr) = run_child(spec, env);
    (line(&stdout, "flags").to_string(), stderr)
}

fn run_child(spec: &str, env: &[(&str, &str)]) -> (String, String) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "preloaded_child", "--nocapture", "--test-threads=1"]).env(CHILD, spec).env("LD_PRELOAD", shim());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "child failed: {stdout}\n{stderr}");
    assert!(stdout.contains("errno=1234"), "the shim changed errno: {stdout}");
    (stdout, stderr)
}

fn has_hg(flags: &str) -> bool {
    flags.split_whitespace().any(|f| f == "hg")
}

fn thp_built() -> bool {
    std::path::Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists()
}

/// THP may back an advised mapping here (`madvise` or `always`).
fn thp_usable() -> bool {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").is_ok_and(|s| !s.contains("[never]"))
}

#[test]
fn preloaded_child() {
    if let Ok(spec) = std::env::var(CHILD) {
        child(&spec);
    }
}

#[test]
fn a_large_private_anonymous_mapping_is_advised() {
    if !thp_built() {
        eprintln!("skipped: this kernel has no transparent huge pages");
        return;
    }
    let (flags, stderr) = run("128:anon", &[("GPU_MODE_HUGEPAGES_LOG", "1")]);
    assert!(has_hg(&flags), "no hg in {flags:?}");
    assert!(stderr.contains("gpu-mode-hugepages: MADV_HUGEPAGE on 128 MiB at 0x") && stderr.contains(": ok"), "{stderr}");
}

#[test]
fn a_populated_mapping_is_advised_before_its_pages_exist() {
    if !thp_built() {
        return;
    }
    // Advised after MAP_POPULATE had run, the mapping would hold no huge
    // page. Advised before, it holds some unless the kernel found no free
    // 2 MiB page at that moment: three tries.
    let mut outputs = Vec::new();
    for _ in 0..3 {
        let (stdout, stderr) = run_child("128:populate", &[("GPU_MODE_HUGEPAGES_LOG", "1")]);
        assert!(has_hg(line(&stdout, "flags")), "{stdout}");
        // Still populated when mmap returns, as MAP_POPULATE promises.
        assert_eq!(kib(line(&stdout, "rss")), 128 * 1024, "{stdout}");
        assert!(stderr.contains("populated after"), "{stderr}");
        if !thp_usable() || kib(line(&stdout, "thp")) > 0 {
            return;
        }
        outputs.push(stdout);
    }
    panic!("no huge page in a populated 128 MiB mapping in three tries: {outputs:?}");
}

#[test]
fn small_reserved_and_shared_mappings_are_left_alone() {
    for spec in ["16:anon", "128:noreserve", "128:shared"] {
        let (flags, stderr) = run(spec, &[("GPU_MODE_HUGEPAGES_LOG", "1")]);
        assert!(!has_hg(&flags), "{spec}: hg in {flags:?}");
        assert!(!stderr.contains("gpu-mode-hugepages:"), "{spec}: {stderr}");
    }
}

#[test]
fn the_threshold_comes_from_the_environment() {
    if !thp_built() {
        return;
    }
    let (flags, _) = run("128:anon", &[("GPU_MODE_HUGEPAGES_MIN_MIB", "256")]);
    assert!(!has_hg(&flags), "128 MiB under a 256 MiB threshold: {flags:?}");
    let (flags, _) = run("16:anon", &[("GPU_MODE_HUGEPAGES_MIN_MIB", "8")]);
    assert!(has_hg(&flags), "16 MiB over an 8 MiB threshold: {flags:?}");
}

#[test]
fn without_the_shim_nothing_is_advised() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "preloaded_child", "--nocapture", "--test-threads=1"])
        .env(CHILD, "128:anon")
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!has_hg(line(&stdout, "flags")), "{stdout}: the test would pass without the shim");
    assert_eq!(kib(line(&stdout, "rss")), 0, "{stdout}");
}
