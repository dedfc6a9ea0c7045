use super::*;
use crate::metrics::*;
use crate::preempt::manifest::DumpTimings;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

fn cfg(dir: &Path) -> Config {
    let mut c = Config { runtime_dir: dir.join("run"), ..Config::default() };
    c.preempt.image_dir = dir.join("images");
    c.metrics.textfile = Some(dir.join("gpu-mode.prom"));
    c.log.syslog = false;
    c.log.stderr = false;
    c
}

/// A textfile with a value in every family, as after a busy day.
fn busy_textfile(dir: &Path) -> String {
    let c = cfg(dir);
    let timings = DumpTimings { signal_to_gpu_free_ms: Some(800.0), cuda_lock_ms: 12.0, cuda_checkpoint_ms: 640.0, criu_dump_ms: 3900.0, seal_ms: 80.0, total_ms: 4700.0, ..Default::default() };
    let mut events = vec![
        Event::count(PROLOG_RUNS, vec![("mode", "mps".into()), ("outcome", "ok".into())]),
        Event::count(PROLOG_RUNS, vec![("mode", "mig".into()), ("outcome", "refused".into())]),
        Event::count(EPILOG_RUNS, vec![("mode", "mps".into()), ("outcome", "ok".into())]),
        Event::count(MIG_CREATED, vec![("profile", "1g.10gb".into())]),
        Event::count(MIG_DESTROYED, vec![("profile", "1g.10gb".into())]),
        Event::count(CHECKPOINTS, vec![("outcome", "ok".into())]),
        Event::count(CHECKPOINT_FAILURES, vec![("reason", "criu".into())]),
        Event::Add { family: CHECKPOINT_BYTES, labels: vec![], by: 3.2e9 },
        Event::count(RESTORES, vec![("outcome", "ok".into())]),
        Event::count(RESTORE_FAILURES, vec![("reason", "driver".into())]),
    ];
    events.extend(phase_events(CHECKPOINT_PHASE, &phases_of(&timings)));
    events.extend(phase_events(RESTORE_PHASE, &[("criu_restore".into(), 2.0)]));
    record(&c, &events);
    drain_set(&c, "prolog", "job_state", "gpu-mode: prolog: cannot write job state: disk full");
    std::fs::read_to_string(c.metrics.textfile.as_ref().unwrap()).unwrap()
}

#[test]
fn the_textfile_has_help_type_and_the_recorded_values() {
    let dir = tempfile::tempdir().unwrap();
    let text = busy_textfile(dir.path());
    for f in FAMILIES {
        assert!(text.contains(&format!("# HELP {} ", f.name)) && text.contains(&format!("# TYPE {} ", f.name)), "{} undeclared", f.name);
    }
    for line in [
        "gpu_mode_prolog_runs_total{mode=\"mps\",outcome=\"ok\"} 1",
        "gpu_mode_prolog_runs_total{mode=\"mig\",outcome=\"refused\"} 1",
        "gpu_mode_mig_instances_created_total{profile=\"1g.10gb\"} 1",
        "gpu_mode_checkpoint_written_bytes_total 3200000000",
        "gpu_mode_checkpoint_phase_duration_seconds_bucket{phase=\"criu_dump\",le=\"2.5\"} 0",
        "gpu_mode_checkpoint_phase_duration_seconds_bucket{phase=\"criu_dump\",le=\"5\"} 1",
        "gpu_mode_checkpoint_phase_duration_seconds_sum{phase=\"cuda_checkpoint\"} 0.64",
        "gpu_mode_checkpoint_phase_duration_seconds_count{phase=\"signal_to_gpu_free\"} 1",
        "gpu_mode_drains_total{source=\"prolog\",reason=\"job_state\"} 1",
        "gpu_mode_jobs{mode=\"mps\"} 0",
        "gpu_mode_checkpoint_images{state=\"complete\"} 0",
        "gpu_mode_problems 0",
        "gpu_mode_checkpoint_images_bytes 0",
        // Known series exist at 0 before their first event (rate() misses a first increment otherwise).
        "gpu_mode_prolog_runs_total{mode=\"checkpoint\",outcome=\"failed\"} 0",
        "gpu_mode_restores_total{outcome=\"failed\"} 0",
        "gpu_mode_restore_phase_duration_seconds_count{phase=\"cuda_restore\"} 0",
        "gpu_mode_restore_phase_duration_seconds_count{phase=\"criu_restore\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
    }
    let mode = std::fs::metadata(dir.path().join("gpu-mode.prom")).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o644, "node_exporter reads it as its own user");
    assert_eq!(crate::drain::last_drain(&dir.path().join("run")).unwrap().unwrap().reason, "gpu-mode: prolog: cannot write job state: disk full");
}

/// promtool (Debian package `prometheus`) lints the real rendered file:
/// names, types, units, `_total` suffixes, histogram series. CI installs
/// it (scripts/test.sh) and sets GPU_MODE_REQUIRE_PROMTOOL.
#[test]
fn promtool_accepts_the_textfile() {
    let dir = tempfile::tempdir().unwrap();
    let text = busy_textfile(dir.path());
    let promtool = ["/usr/bin/promtool", "/usr/local/bin/promtool"].into_iter().map(Path::new).find(|p| p.exists());
    let Some(promtool) = promtool else {
        assert!(!gpu_mode_testkit::required("GPU_MODE_REQUIRE_PROMTOOL"), "promtool is required here (GPU_MODE_REQUIRE_PROMTOOL): apt-get install prometheus");
        gpu_mode_testkit::skipped("observe::tests::promtool_accepts_the_textfile", "promtool not installed (Debian package prometheus)");
        return;
    };
    use std::io::Write;
    let mut child = std::process::Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && said.trim().is_empty(), "promtool check metrics:\n{said}\n--- file:\n{text}");
}

#[test]
fn without_a_textfile_nothing_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(dir.path());
    c.metrics.textfile = None;
    record(&c, &[Event::count(PROLOG_RUNS, vec![("mode", "mps".into()), ("outcome", "ok".into())])]);
    assert!(!store::metrics_dir(&c.runtime_dir).exists());
}

#[test]
fn phases_are_read_by_name_from_the_timings() {
    let t = DumpTimings { signal_to_gpu_free_ms: None, cuda_lock_ms: 10.0, cuda_checkpoint_ms: 500.0, criu_dump_ms: 2000.0, seal_ms: 5.0, total_ms: 2600.0, ..Default::default() };
    let mut got = phases_of(&t);
    got.sort_by(|a, b| a.0.cmp(&b.0));
    let want: Vec<(String, f64)> =
        [("criu_dump", 2.0), ("cuda_checkpoint", 0.5), ("cuda_lock", 0.01), ("seal", 0.005), ("total", 2.6)].iter().map(|(p, s)| (p.to_string(), *s)).collect();
    assert_eq!(got, want, "a phase that did not happen (None) is not observed");
    let mut names = phase_names(&DumpTimings::default());
    names.sort();
    assert!(names.contains(&"signal_to_gpu_free".to_string()) && names.contains(&"criu_dump".to_string()), "{names:?}");
    assert_eq!(names.len(), want.len() + names.iter().filter(|n| n.starts_with("signal_to_")).count(), "every _ms field, None ones too: {names:?}");
    let extended = serde_json::json!({"cuda_lock_ms": 1.0, "gpu_wait_ms": 250.0, "node": "n1", "bad_ms": -1.0});
    let mut got = phases_of(&extended);
    got.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(got, vec![("cuda_lock".to_string(), 0.001), ("gpu_wait".to_string(), 0.25)], "new phases are picked up");
}
