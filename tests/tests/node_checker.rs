//! gpu-mode-node-checker as Slurm's HealthCheckProgram on a real Slurm with
//! the simulated NVML: each injected fault drains the node with its own
//! reason, clearing it resumes the node, an admin's drain is never touched,
//! and the program works with no PATH well under slurmd's 60 s kill.
//!
//! Its own cluster (faults on a shared node would disturb other tests) with a
//! fake sysfs (two NVIDIA GPUs, to match the simulated ones) and a fake
//! kernel log the test appends XID lines to. The MPS check is disabled here:
//! other test binaries' simulated MPS daemons would be orphans to it (its
//! end-to-end test is mps_orphans.rs); its unit tests are in core.

use gpu_mode_tests::{Artifacts, Cluster, ClusterSpec};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// Every test changes the one node: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());
static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();

fn base() -> PathBuf {
    std::env::var_os("GPU_MODE_CLUSTER_BASE").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/tmp/gpu-mode-cluster"))
}

/// sysfs with the simulated GPUs' PCI addresses, vendor 0x10de.
fn fake_sysfs() -> PathBuf {
    let root = base().join("node_checker.sysfs");
    for bus in ["0000:18:00.0", "0000:2a:00.0"] {
        let d = root.join("bus/pci/devices").join(bus);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("vendor"), "0x10de\n").unwrap();
        std::fs::write(d.join("class"), "0x030200\n").unwrap();
    }
    root
}

fn kmsg() -> PathBuf {
    base().join("node_checker.kmsg")
}

fn c() -> (MutexGuard<'static, ()>, &'static Cluster) {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let started = CLUSTER.get_or_init(|| {
        let r = (|| -> anyhow::Result<Cluster> {
            gpu_mode_tests::users::ensure_test_users()?;
            let mut spec = ClusterSpec::new("node_checker", 2, Artifacts::locate()?);
            std::fs::create_dir_all(base())?;
            std::fs::write(kmsg(), "6,1,0,-;Linux version x\n")?;
            spec.health_check_interval = Some(2);
            spec.extra_gpu_mode_config = format!(
                "[health]\nsysfs_root = \"{}\"\nkmsg_path = \"{}\"\nexpected_gpus = 2\ndisabled = [\"mps\"]\n",
                fake_sysfs().display(),
                kmsg().display()
            );
            Cluster::start(spec)
        })();
        unsafe { libc::atexit(stop_at_exit) };
        r.map_err(|e| format!("{e:#}"))
    });
    match started {
        Ok(c) => (guard, c),
        Err(e) => panic!("local Slurm cluster did not start: {e}"),
    }
}

extern "C" fn stop_at_exit() {
    if let Some(Ok(c)) = CLUSTER.get() {
        c.stop();
    }
}

/// Polls the node until `want(state, reason)` or 40 s (several health-check intervals).
fn wait_node(c: &Cluster, what: &str, want: impl Fn(&str, &str) -> bool) -> (String, String) {
    let start = Instant::now();
    loop {
        let (state, reason) = c.node_state().unwrap();
        if want(&state, &reason) {
            return (state, reason);
        }
        if start.elapsed() > Duration::from_secs(40) {
            panic!("node never {what}: state {state:?} reason {reason:?}\n{}", c.logs_tail());
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn drained_with(c: &Cluster, prefix: &str) -> String {
    let (_, reason) = wait_node(c, &format!("drained with {prefix:?}"), |s, r| s.contains("DRAIN") && r.starts_with(prefix));
    reason
}

fn back_in_service(c: &Cluster) {
    wait_node(c, "resumed", |s, _| !s.contains("DRAIN") && !s.contains("DOWN"));
}

/// The checker's wrapper run with nothing but SLURMD_NODENAME, as slurmd runs it.
fn run_checker(c: &Cluster, args: &[&str]) -> (std::process::Output, Duration) {
    let start = Instant::now();
    let out = Command::new(c.dir.join("hooks/node-checker"))
        .args(args)
        .env_clear()
        .env("SLURMD_NODENAME", &c.spec.node_name)
        .output()
        .unwrap();
    (out, start.elapsed())
}

/// The node checker binary itself (for `ack`), with the cluster's simulated NVML.
fn ack(c: &Cluster) {
    let out = Command::new(&c.spec.artifacts.node_checker)
        .args(["ack", "--config", c.dir.join("gpu-mode.toml").to_str().unwrap()])
        .env_clear()
        .env("GPU_MODE_SIM_STATE", c.dir.join("sim/nvml-state.json"))
        .output()
        .unwrap();
    assert!(out.status.success(), "ack: {}", String::from_utf8_lossy(&out.stderr));
}

fn append_kmsg(line: &str) {
    use std::io::Write;
    let text = std::fs::read_to_string(kmsg()).unwrap();
    let seq = text.lines().count() + 1;
    let mut f = std::fs::OpenOptions::new().append(true).open(kmsg()).unwrap();
    writeln!(f, "3,{seq},0,-;{line}").unwrap();
}

#[test]
fn each_fault_drains_with_its_reason_and_clearing_it_resumes() {
    let (_g, c) = c();
    back_in_service(c);
    let cases: &[(&[&str], &str)] = &[
        (&["inject", "ecc", "--gpu", "1"], "gpu-mode: memory: GPU 1: 1 new uncorrectable ECC error(s)"),
        (&["inject", "remap", "pending", "--gpu", "1"], "gpu-mode: memory: GPU 1: row remap pending: GPU reset needed"),
        (&["inject", "remap", "failed", "--gpu", "0"], "gpu-mode: memory: GPU 0: row remapping failed: replace the GPU"),
        (&["inject", "lost", "--gpu", "1"], "gpu-mode: driver: GPU 1: GPU lost (fell off the bus)"),
        (&["inject", "needs-reset", "--gpu", "0"], "gpu-mode: driver: GPU 0: GPU needs a reset"),
        (&["inject", "persistence", "off", "--gpu", "1"], "gpu-mode: persistence: GPU 1: persistence Disabled: start nvidia-persistenced"),
        (&["inject", "pcie", "x8", "--gpu", "1"], "gpu-mode: pcie: GPU 1: link width x8 below max x16"),
        (&["inject", "thermal", "--gpu", "0"], "gpu-mode: clocks: GPU 0: clocks held back: hw_thermal_slowdown"),
        (&["process", "add", "4242", "--gpu", "1"], "gpu-mode: leftovers: GPU 1: 1 compute process(es) with no job: pid 4242"),
    ];
    // Retired pages are not in this table: H200s remap rows instead, and the
    // simulated H200 reports page retirement as not supported, like the real
    // one (the rule is unit-tested in core/src/health/memory.rs).
    for (inject, reason) in cases {
        c.sim_ctl(inject).unwrap();
        drained_with(c, reason);
        c.sim_ctl(&["clear"]).unwrap();
        c.sim_ctl(&["process", "clear", "--gpu", "1"]).unwrap();
        back_in_service(c);
    }
}

#[test]
fn a_critical_xid_drains_until_acknowledged_and_application_xids_do_not() {
    let (_g, c) = c();
    back_in_service(c);
    // GPU 1 of the simulated node is at 00000000:2A:00.0.
    append_kmsg("NVRM: Xid (PCI:0000:2a:00): 13, pid=77, name=python, Graphics Exception");
    append_kmsg("NVRM: Xid (PCI:0000:2a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.");
    let reason = drained_with(c, "gpu-mode: xid: GPU 1: XID 79 this boot");
    // Slurm appends " [user@time]"; the time may well contain "13".
    let text = reason.split(" [").next().unwrap_or_default();
    assert!(!text.contains("13"), "application XID 13 counted: {reason}");
    // The XID stays counted across runs (it does not heal by itself) ...
    std::thread::sleep(Duration::from_secs(5));
    drained_with(c, "gpu-mode: xid: GPU 1: XID 79");
    // ... until an administrator acknowledges the repair.
    ack(c);
    back_in_service(c);
    // Only application XIDs: nothing to drain, and the node stays up.
    append_kmsg("NVRM: Xid (PCI:0000:18:00): 43, pid=78, name=python, Ch 00000010");
    let (out, _) = run_checker(c, &["--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let xid: Vec<&serde_json::Value> = v["results"].as_array().unwrap().iter().filter(|r| r["check"] == "xid").collect();
    assert!(xid.iter().all(|r| r["status"] == "ok"), "{xid:?}");
    let (state, _) = c.node_state().unwrap();
    assert!(!state.contains("DRAIN"), "{state}");
}

#[test]
fn an_admin_drain_is_never_resumed_nor_overwritten() {
    let (_g, c) = c();
    back_in_service(c);
    let node = format!("NodeName={}", c.spec.node_name);
    let out = c.client("scontrol", &["update", &node, "State=DRAIN", "Reason=admin: bad fan"]).run_as_root().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let cursor = c.runtime_dir().join("health/cursor.json");
    let before = std::fs::metadata(&cursor).and_then(|m| m.modified()).ok();
    // A healthy node and then a faulty one: the checker runs (its cursor
    // file is rewritten each run) but leaves the admin's drain alone.
    std::thread::sleep(Duration::from_secs(6));
    c.sim_ctl(&["inject", "thermal", "--gpu", "0"]).unwrap();
    std::thread::sleep(Duration::from_secs(6));
    let after = std::fs::metadata(&cursor).and_then(|m| m.modified()).ok();
    assert_ne!(before, after, "the health check did not run in 12 s\n{}", c.logs_tail());
    let (state, reason) = c.node_state().unwrap();
    assert!(state.contains("DRAIN") && reason.starts_with("admin: bad fan"), "{state} {reason}");
    c.sim_ctl(&["clear"]).unwrap();
    std::thread::sleep(Duration::from_secs(5));
    let (state, reason) = c.node_state().unwrap();
    assert!(state.contains("DRAIN") && reason.starts_with("admin: bad fan"), "resumed an admin's drain: {state} {reason}");
    c.resume_node().unwrap();
}

#[test]
fn works_with_no_path_and_finishes_well_under_60_s() {
    let (_g, c) = c();
    back_in_service(c);
    let (out, took) = run_checker(c, &["--no-drain"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("overall: OK") || text.contains("overall: WARN"), "{text}");
    assert!(text.contains("gpu_count    -    OK       2 GPU(s) (NVML and PCI agree)"), "{text}");
    assert!(took < Duration::from_secs(60), "took {took:?}");
    // A failing check gives exit 1; --no-drain leaves the node alone.
    c.sim_ctl(&["inject", "remap", "failed", "--gpu", "1"]).unwrap();
    let (out, _) = run_checker(c, &["--no-drain", "--json", "--only", "memory"]);
    c.sim_ctl(&["clear"]).unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["results"][1]["status"], "fail", "{v}");
    assert_eq!(v["action"], serde_json::Value::Null);
    back_in_service(c);
}
