//! `[health] after_epilog = true`: the epilog runs the quick checks after
//! teardown, so a fault is caught at the end of the job that met it, even
//! with no HealthCheckProgram configured (this cluster has none).

use gpu_mode_tests::{Artifacts, Cluster, ClusterSpec};
use std::time::{Duration, Instant};

#[test]
fn a_fault_found_by_the_epilog_check_drains_the_node_with_the_check_reason() {
    gpu_mode_tests::users::ensure_test_users().unwrap();
    let mut spec = ClusterSpec::new("epilog_health", 1, Artifacts::locate().unwrap());
    // sysfs and kernel log the checks read, faked to match the one simulated GPU.
    let fake = spec.dir.with_file_name("epilog_health.fake");
    let dev = fake.join("sys/bus/pci/devices/0000:18:00.0");
    std::fs::create_dir_all(&dev).unwrap();
    std::fs::write(dev.join("vendor"), "0x10de\n").unwrap();
    std::fs::write(dev.join("class"), "0x030200\n").unwrap();
    std::fs::write(fake.join("kmsg"), "6,1,0,-;Linux version x\n").unwrap();
    spec.extra_gpu_mode_config = format!(
        "[health]\nafter_epilog = true\nsysfs_root = \"{}\"\nkmsg_path = \"{}\"\nexpected_gpus = 1\ndisabled = [\"mps\"]\n",
        fake.join("sys").display(),
        fake.join("kmsg").display()
    );
    let cluster = Cluster::start(spec).unwrap();

    // Healthy: a job ends and the node stays in service.
    let job = cluster.sbatch_wait(Some("gmtest1"), &["--gres=gpu:1"], "#!/bin/sh\ntrue\n").unwrap();
    assert_eq!(job.exit_code, 0, "{}", job.output);
    std::thread::sleep(Duration::from_secs(2));
    assert!(!cluster.node_state().unwrap().0.contains("DRAIN"), "{}", cluster.logs_tail());

    // Persistence goes off during a job: its epilog drains the node.
    cluster.sim_ctl(&["inject", "persistence", "off"]).unwrap();
    let job = cluster.sbatch_wait(Some("gmtest1"), &["--gres=gpu:1"], "#!/bin/sh\ntrue\n").unwrap();
    assert_eq!(job.exit_code, 0, "{}", job.output);
    let start = Instant::now();
    let (state, reason) = loop {
        let (s, r) = cluster.node_state().unwrap();
        if s.contains("DRAIN") || start.elapsed() > Duration::from_secs(30) {
            break (s, r);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(state.contains("DRAIN"), "not drained: {state}\n{}", cluster.logs_tail());
    assert!(reason.starts_with("gpu-mode: persistence"), "reason {reason:?}");
    cluster.sim_ctl(&["clear"]).unwrap();
    cluster.resume_node().unwrap();
}
