//! A MIG instance creation that fails half-way through a job's layout:
//! what the job made is destroyed, MIG mode is switched back, and the node
//! is drained with the reason (a failing driver is the node's fault; the job
//! is requeued held, as for every prolog node fault). Its own cluster: it
//! drains the node.

use gpu_mode_tests::{Artifacts, Cluster, ClusterSpec};
use std::time::{Duration, Instant};

#[test]
fn a_failure_half_way_leaves_nothing_and_drains_with_the_reason() {
    gpu_mode_tests::users::ensure_test_users().unwrap();
    let c = Cluster::start(ClusterSpec::new("mig_fault", 1, Artifacts::locate().unwrap())).unwrap();
    c.sim_ctl(&["inject", "mig-create-fails", "1", "--gpu", "0"]).unwrap();
    let out = c
        .client("sbatch", &["--parsable", "--gres=gpu:1", "--gpu-mode=mig:1g.18gbx3", "--wrap", "true"])
        .run_as(Some("gmtest1"))
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let start = Instant::now();
    let (state, reason) = loop {
        let (state, reason) = c.node_state().unwrap();
        if state.contains("DRAIN") || start.elapsed() > Duration::from_secs(60) {
            break (state, reason);
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    assert!(state.contains("DRAIN"), "{state}\n{}", c.logs_tail());
    assert!(reason.starts_with("gpu-mode: prolog: mig: GPU GPU-") && reason.contains("nvmlDeviceCreateGpuInstance"), "{reason}");
    let gpu = c.sim_gpu(0).unwrap();
    assert!(gpu["instances"].as_array().unwrap().is_empty(), "half a layout left: {gpu}");
    assert_eq!(gpu["mig_current"], false, "MIG mode must be switched back");
    assert!(std::fs::read_dir(c.runtime_dir().join("mig")).map(|d| d.count()).unwrap_or(0) == 0, "no journal may remain");
    c.stop();
}
