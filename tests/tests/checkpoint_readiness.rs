//! Checkpoint readiness (issue 40 item 2) on a real Slurm with one
//! simulated H200: a node made unready in each way the harness can (image
//! directory not writable, CRIU missing, CRIU built without the project's
//! patches, a CRIU the job's user may not run, a driver older than the
//! checkpoint API, host memory below the simulated GPU's 141 GB where this
//! machine has less; the kernel's version alone is judged only in the
//! check's table tests) is flagged by gpu-mode-node-checker, run as slurmd
//! runs it, and shown by gpu-mode-status, and it is not drained; a
//! checkpoint-mode job there gets one line on its stderr at its start and
//! still runs.
//!
//! Its own cluster: the cases change the site config's `preempt.criu` and
//! the image directory. CRIU here is a stand-in script (`--version` and
//! `check` answer as CRIU 4.1.1 does) whose PATCHES file lists one patch
//! that is not the project's; the kernel, capability and driver checks
//! judge this machine and the simulated driver as they are.

use gpu_mode_tests::shared::cluster_with;
use gpu_mode_tests::Cluster;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

static SERIAL: Mutex<()> = Mutex::new(());

fn base() -> PathBuf {
    std::env::var_os("GPU_MODE_CLUSTER_BASE").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/tmp/gpu-mode-cluster"))
}

/// The stand-in CRIU's install: `<prefix>/bin/criu` and `<prefix>/PATCHES`.
fn criu_prefix() -> PathBuf {
    base().join("checkpoint_readiness.criu")
}

fn criu() -> PathBuf {
    criu_prefix().join("bin/criu")
}

/// A CRIU that answers `--version` and `check` as 4.1.1 does, its PATCHES
/// listing a patch the project does not ship; everything world-readable
/// (CRIU runs as the job's user, and the capability probe as nobody).
fn install_stand_in_criu() -> anyhow::Result<()> {
    std::fs::create_dir_all(criu_prefix().join("bin"))?;
    for d in [base(), criu_prefix(), criu_prefix().join("bin")] {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755))?;
    }
    std::fs::write(criu(), "#!/bin/sh\ncase \"$1\" in\n--version) echo 'Version: 4.1.1' ;;\ncheck) echo 'Looks good.' ;;\n*) exit 1 ;;\nesac\n")?;
    std::fs::set_permissions(criu(), std::fs::Permissions::from_mode(0o755))?;
    std::fs::write(criu_prefix().join("PATCHES"), format!("{}  0001-local-change.patch\n", "a".repeat(64)))?;
    Ok(())
}

/// sysfs with the simulated GPU's PCI address, vendor 0x10de (the GPU
/// count check compares NVML with it).
fn fake_sysfs() -> PathBuf {
    let d = base().join("checkpoint_readiness.sysfs/bus/pci/devices/0000:18:00.0");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("vendor"), "0x10de\n").unwrap();
    std::fs::write(d.join("class"), "0x030200\n").unwrap();
    base().join("checkpoint_readiness.sysfs")
}

/// The cluster (one for both tests, which change its one node: one at a
/// time), with the stand-in CRIU as `preempt.criu`.
fn c() -> (MutexGuard<'static, ()>, &'static Cluster) {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = cluster_with("checkpoint_readiness", 1, |spec| {
        std::fs::create_dir_all(base()).unwrap();
        install_stand_in_criu().unwrap();
        let kmsg = base().join("checkpoint_readiness.kmsg");
        std::fs::write(&kmsg, "6,1,0,-;Linux version x\n").unwrap();
        // The first line lands in the harness's [preempt] section.
        spec.extra_gpu_mode_config = format!(
            "criu = \"{}\"\n\n[health]\nsysfs_root = \"{}\"\nkmsg_path = \"{}\"\nexpected_gpus = 1\ndisabled = [\"mps\"]\n",
            criu().display(),
            fake_sysfs().display(),
            kmsg.display()
        );
    });
    (guard, cluster)
}

/// The node checker as root runs it with no environment but the simulated
/// NVML, for this node, with `--json`: it drains or resumes as it would as
/// HealthCheckProgram.
fn node_checker(c: &Cluster) -> serde_json::Value {
    let out = c.tool("gpu-mode-node-checker", &["--json", "--node", &c.spec.node_name]).unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "a node that cannot checkpoint is not a failed check:\n{text}{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// (status, message) of `check` in a node checker report.
fn result<'a>(report: &'a serde_json::Value, check: &str) -> (&'a str, &'a str) {
    let r = report["results"].as_array().unwrap().iter().find(|r| r["check"] == check).unwrap_or_else(|| panic!("no {check} in {report:#}"));
    (r["status"].as_str().unwrap(), r["message"].as_str().unwrap())
}

/// The report flags `check` with a message containing `words`, and the
/// node stays in service (the checker's own decision and Slurm's state).
fn assert_flagged_not_drained(c: &Cluster, report: &serde_json::Value, check: &str, words: &str) {
    let (status, message) = result(report, check);
    assert_eq!(status, "warn", "{check}: {message}");
    assert!(message.contains(words) && message.contains("fix: "), "{check}: {words:?} and a fix missing in {message:?}");
    assert_eq!(report["action"], serde_json::json!({"kind": "nothing"}), "{report:#}");
    let (state, reason) = c.node_state().unwrap();
    assert!(!state.contains("DRAIN") && !state.contains("DOWN"), "drained: {state} {reason}");
}

/// `gpu-mode-status --json`'s readiness verdict: (check, ready) pairs.
fn status_readiness(c: &Cluster) -> Vec<(String, bool)> {
    let out = c.tool("gpu-mode-status", &["--json", "--node", &c.spec.node_name]).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let items = v["checkpoint_readiness"]["items"].as_array().unwrap_or_else(|| panic!("no readiness in {v:#}")).clone();
    items.iter().map(|i| (i["check"].as_str().unwrap().to_string(), i["ready"].as_bool().unwrap())).collect()
}

/// The simulated H200's memory (`h200-141gb`: 143771 MiB).
const SIM_GPU_BYTES: u64 = 143_771 << 20;

/// The host memory against the simulated GPU's.
fn host_has_less_than_the_gpu() -> bool {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kib: u64 = text.lines().find_map(|l| l.strip_prefix("MemTotal:")).unwrap().trim().trim_end_matches("kB").trim().parse().unwrap();
    kib * 1024 < SIM_GPU_BYTES
}

/// Free bytes of the file system holding `dir`, for root.
fn free_bytes(dir: &Path) -> u64 {
    let s = nix::sys::statvfs::statvfs(dir).unwrap();
    s.blocks_available() as u64 * s.fragment_size() as u64
}

/// Replaces the site config's CRIU path for the rest of `f`.
fn with_criu_at(c: &Cluster, path: &Path, f: impl FnOnce()) {
    let config = c.dir.join("gpu-mode.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, text.replace(&criu().display().to_string(), &path.display().to_string())).unwrap();
    let restore = || std::fs::write(&config, &text).unwrap();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    restore();
    if let Err(p) = outcome {
        std::panic::resume_unwind(p);
    }
}

#[test]
fn an_unready_node_is_flagged_in_each_way_and_not_drained() {
    let (_g, c) = c();
    // The stand-in CRIU runs, but was not built with the project's patches.
    let report = node_checker(c);
    assert_flagged_not_drained(c, &report, "ckpt_criu", "is not the patch set this release expects (missing or changed: 0001-restorer-skip");
    assert_eq!(result(&report, "ckpt_kernel").0, "ok", "{report:#}");
    assert_eq!(result(&report, "ckpt_caps").0, "ok", "CRIU starts as nobody with the capability here: {report:#}");
    // A writable image directory; its free space judged as this machine has it.
    let (dirs, found) = result(&report, "ckpt_dirs");
    if free_bytes(&c.dir) < SIM_GPU_BYTES {
        assert_flagged_not_drained(c, &report, "ckpt_dirs", "free, less than GPU 0's 140.4 GiB of memory: a job that fills the GPU cannot be dumped");
    } else {
        assert_eq!(dirs, "ok", "{found}");
    }
    assert_eq!(result(&report, "ckpt_driver"), ("ok", "driver 580.159.04 (r580): single-process jobs; r5xx: NCCL jobs only in portable mode (--gpu-mode=checkpoint:nccl=portable); multi-process jobs (--launch-job) from r590, CUDA IPC from r610"));
    if host_has_less_than_the_gpu() {
        assert_flagged_not_drained(c, &report, "ckpt_memory", "is less than GPU 0's 140.4 GiB");
    } else {
        assert_eq!(result(&report, "ckpt_memory").0, "ok", "{report:#}");
    }
    let shown = status_readiness(c);
    assert!(shown.contains(&("ckpt_criu".into(), false)) && shown.contains(&("ckpt_kernel".into(), true)), "{shown:?}");

    // The image directory is a file: nothing can be written under it.
    let images = c.dir.join("images");
    let _ = std::fs::remove_dir_all(&images);
    std::fs::write(&images, "not a directory").unwrap();
    let report = node_checker(c);
    std::fs::remove_file(&images).unwrap();
    std::fs::create_dir_all(&images).unwrap();
    assert_flagged_not_drained(c, &report, "ckpt_dirs", &format!("preempt.image_dir {}: cannot write a file in {}", images.display(), images.display()));

    // A CRIU the job's user may not run (0700, root's): the capability
    // probe, which starts it as nobody, says so.
    std::fs::set_permissions(criu(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let report = node_checker(c);
    std::fs::set_permissions(criu(), std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_flagged_not_drained(c, &report, "ckpt_caps", "a user may not run CRIU (Permission denied (os error 13)), and CRIU runs as the job's user; fix: chmod 0755 preempt.criu");

    // A driver older than the checkpoint API (r550), as the simulated NVML reports it.
    let state = c.dir.join("sim/nvml-state.json");
    let text = std::fs::read_to_string(&state).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["driver_version"] = "550.54.15".into();
    std::fs::write(&state, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    let report = node_checker(c);
    std::fs::write(&state, &text).unwrap();
    assert_flagged_not_drained(c, &report, "ckpt_driver", "driver 550.54.15 has no CUDA checkpoint API (r570 or newer); fix: install an NVIDIA driver of branch r570 or newer");

    // No CRIU at the configured path: said, and the capability probe skipped.
    let missing = base().join("checkpoint_readiness.none/bin/criu");
    with_criu_at(c, &missing, || {
        let report = node_checker(c);
        assert_flagged_not_drained(c, &report, "ckpt_criu", &format!("CRIU is not installed at {}", missing.display()));
        assert_eq!(result(&report, "ckpt_caps").0, "skipped", "{report:#}");
        assert!(status_readiness(c).contains(&("ckpt_criu".into(), false)));
    });
}

#[test]
fn a_checkpoint_job_on_an_unready_node_is_told_once_at_its_start_and_runs() {
    let (_g, c) = c();
    node_checker(c);
    let config = c.dir.join("gpu-mode.toml");
    let run = c.spec.artifacts.prolog.with_file_name("gpu-mode-run");
    let script = format!("#!/bin/sh\nexec {} --config {} -- /bin/echo the application ran\n", run.display(), config.display());
    let args = ["--gres=gpu:1", "--gpu-mode=checkpoint", "--signal=B:USR1@60", "--requeue"];
    let id = c.submit(Some("gmtest1"), &args, &script, &c.sim_job_env()).unwrap();
    let info = c.wait_job(id, "the job to end", Duration::from_secs(60), |j| matches!(j.state(), "COMPLETED" | "FAILED" | "CANCELLED")).unwrap();
    let out = c.job_output(id);
    assert_eq!(info.state(), "COMPLETED", "{out}");
    let told: Vec<&str> = out.lines().filter(|l| l.contains("this node cannot checkpoint")).collect();
    assert_eq!(told.len(), 1, "one line, at the start:\n{out}");
    assert!(
        told[0].starts_with("gpu-mode-run: warning: this node cannot checkpoint (ckpt_criu: ")
            && told[0].ends_with("gpu-mode-status shows all): the job runs, but if it is preempted it starts over"),
        "{}",
        told[0]
    );
    let at = |needle: &str| out.lines().position(|l| l.contains(needle)).unwrap_or_else(|| panic!("{needle:?} missing in\n{out}"));
    assert!(at("this node cannot checkpoint") < at("the application ran"), "the line comes before the application's output:\n{out}");
}
