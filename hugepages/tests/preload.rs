//! The shim preloaded into a real process: each test starts the
//! `hugepages-probe` program (src/bin/) with `LD_PRELOAD` naming the built
//! library; the probe maps memory through the C library's `mmap` and reports
//! the mapping's `VmFlags` from /proc/self/smaps (`hg`: MADV_HUGEPAGE was
//! applied) and its huge pages.
//!
//! Without transparent huge pages in the kernel (or with them `never`), what
//! these tests promise cannot be seen: they say so where CI's log shows it,
//! and fail where the environment must have THP (`CI=true` or
//! `GPU_MODE_REQUIRE_THP=1`).

mod common;

use std::process::Command;

const PROBE: &str = env!("CARGO_BIN_EXE_hugepages-probe");

/// A `key=` line of the probe's output.
fn line<'a>(stdout: &'a str, key: &str) -> &'a str {
    let key = format!("{key}=");
    stdout.lines().find_map(|l| l.split_once(key.as_str()).map(|(_, v)| v)).unwrap_or_else(|| panic!("no {key} in {stdout}"))
}

fn kib(field: &str) -> u64 {
    field.trim_end_matches("kB").trim().parse().unwrap_or_else(|_| panic!("{field:?}"))
}

fn run(spec: &str, env: &[(&str, &str)]) -> (String, String) {
    let (stdout, stderr) = run_probe(spec, env);
    (line(&stdout, "flags").to_string(), stderr)
}

/// The probe's stdout and stderr, with the shim preloaded.
fn run_probe(spec: &str, env: &[(&str, &str)]) -> (String, String) {
    let mut cmd = Command::new(PROBE);
    cmd.arg(spec).env("LD_PRELOAD", common::built_library());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "probe failed: {stdout}\n{stderr}");
    assert!(stdout.contains("errno=1234"), "the shim changed errno: {stdout}");
    (stdout, stderr)
}

fn has_hg(flags: &str) -> bool {
    flags.split_whitespace().any(|f| f == "hg")
}

/// What this kernel's transparent huge pages let a test see, least first.
#[derive(Debug, PartialEq, PartialOrd)]
enum Thp {
    /// Not built in: `madvise(MADV_HUGEPAGE)` fails, nothing is advised.
    Absent,
    /// `never`: a mapping is advised (`hg`) but gets no huge page.
    Never,
    /// `madvise` or `always`: an advised mapping may get huge pages.
    Usable,
}

fn thp() -> Thp {
    match std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled") {
        Err(_) => Thp::Absent,
        Ok(s) if s.contains("[never]") => Thp::Never,
        Ok(_) => Thp::Usable,
    }
}

/// Whether this kernel shows what `test` checks (`need`). When not, says so
/// where CI's log shows it, or fails where the environment demands THP.
fn thp_shows(test: &str, need: Thp) -> bool {
    let have = thp();
    if have >= need {
        return true;
    }
    let reason = match have {
        Thp::Absent => "this kernel has no transparent huge pages",
        _ => "transparent huge pages are off (enabled = never): no huge page can back a mapping",
    };
    let demanded = gpu_mode_testkit::required("GPU_MODE_REQUIRE_THP") || gpu_mode_testkit::required("CI");
    assert!(!demanded, "{test}: {reason}; CI=true or GPU_MODE_REQUIRE_THP=1 needs THP set to madvise or always");
    gpu_mode_testkit::skipped(test, reason);
    false
}

#[test]
fn a_large_private_anonymous_mapping_is_advised() {
    if !thp_shows("preload::a_large_private_anonymous_mapping_is_advised", Thp::Never) {
        return;
    }
    let (flags, stderr) = run("128:anon", &[("GPU_MODE_HUGEPAGES_LOG", "1")]);
    assert!(has_hg(&flags), "no hg in {flags:?}");
    assert!(stderr.contains("gpu-mode-hugepages: MADV_HUGEPAGE on 128 MiB at 0x") && stderr.contains(": ok"), "{stderr}");
}

#[test]
fn a_populated_mapping_is_advised_before_its_pages_exist() {
    let test = "preload::a_populated_mapping_is_advised_before_its_pages_exist";
    if !thp_shows(test, Thp::Never) {
        return;
    }
    let pages_show = thp_shows(test, Thp::Usable);
    // Advised after MAP_POPULATE had run, the mapping would hold no huge
    // page. Advised before, it holds some unless the kernel found no free
    // 2 MiB page at that moment: three tries.
    let mut outputs = Vec::new();
    for _ in 0..3 {
        let (stdout, stderr) = run_probe("128:populate", &[("GPU_MODE_HUGEPAGES_LOG", "1")]);
        assert!(has_hg(line(&stdout, "flags")), "{stdout}");
        // Still populated when mmap returns, as MAP_POPULATE promises.
        assert_eq!(kib(line(&stdout, "rss")), 128 * 1024, "{stdout}");
        assert!(stderr.contains("populated after"), "{stderr}");
        if !pages_show || kib(line(&stdout, "thp")) > 0 {
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
    if !thp_shows("preload::the_threshold_comes_from_the_environment", Thp::Never) {
        return;
    }
    let (flags, _) = run("128:anon", &[("GPU_MODE_HUGEPAGES_MIN_MIB", "256")]);
    assert!(!has_hg(&flags), "128 MiB under a 256 MiB threshold: {flags:?}");
    let (flags, _) = run("16:anon", &[("GPU_MODE_HUGEPAGES_MIN_MIB", "8")]);
    assert!(has_hg(&flags), "16 MiB over an 8 MiB threshold: {flags:?}");
}

#[test]
fn without_the_shim_nothing_is_advised() {
    let out = Command::new(PROBE).arg("128:anon").env_remove("LD_PRELOAD").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "probe failed: {stdout}");
    assert!(!has_hg(line(&stdout, "flags")), "{stdout}: the test would pass without the shim");
    assert_eq!(kib(line(&stdout, "rss")), 0, "{stdout}");
}

/// The driver's buffer (a populated mapping: `MAP_POPULATE`, no address)
/// is advised `MADV_SEQUENTIAL` (`sr`), the mark by which the project's CRIU
/// maps it from the image at a restore (packaging/criu/0007); a large
/// mapping that is not such a buffer is not marked, and neither is the
/// buffer where the shim is off. Needs no transparent huge pages.
#[test]
fn only_the_drivers_buffer_is_marked_for_mapping_from_the_image() {
    let has_sr = |flags: &str| flags.split_whitespace().any(|f| f == "sr");
    let (flags, _) = run("128:populate", &[]);
    assert!(has_sr(&flags), "the buffer is not marked: {flags:?}");
    let (flags, _) = run("128:anon", &[]);
    assert!(!has_sr(&flags), "a mapping without MAP_POPULATE is marked: {flags:?}");
    let (flags, _) = run("128:populate", &[("GPU_MODE_HUGEPAGES", "0")]);
    assert!(!has_sr(&flags), "marked with the shim off: {flags:?}");
}
