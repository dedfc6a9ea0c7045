//! Audit item H2: one typo in the site config must not fail every job on the
//! cluster. Before the fix, the prolog loaded the config before looking at
//! the job, so a misspelt key failed jobs *without* --gpu-mode and drained
//! the node. Now jobs without a mode run untouched, a job with one is
//! refused with a message naming the problem, the node stays up, and every
//! hook run logs the config error. Its own cluster: its config is broken.

use gpu_mode_tests::{Artifacts, Cluster, ClusterSpec};

#[test]
fn a_config_typo_refuses_mode_jobs_only_and_drains_nothing() {
    gpu_mode_tests::users::ensure_test_users().unwrap();
    let c = Cluster::start(ClusterSpec::new("config_typo", 1, Artifacts::locate().unwrap())).unwrap();
    let conf = c.dir.join("gpu-mode.toml");
    let text = std::fs::read_to_string(&conf).unwrap();
    std::fs::write(&conf, format!("runtimedir = \"/run/typo\"\n{text}")).unwrap();

    let plain = c.sbatch_wait(Some("gmtest1"), &["--gres=gpu:1"], "#!/bin/sh\necho plain-ran\n").unwrap();
    assert_eq!(plain.exit_code, 0, "a job without --gpu-mode failed: {}\n{}", plain.output, c.logs_tail());
    assert!(plain.output.contains("plain-ran"), "{}", plain.output);
    let lines = c.hook_log_lines(plain.id);
    assert!(
        lines.iter().any(|l| l.contains("action=config") && l.contains("unknown field `runtimedir`")),
        "no loud config line: {lines:?}"
    );

    let mps = c.sbatch_wait(Some("gmtest1"), &["--gpu-mode=mps", "--gres=gpu:1"], "#!/bin/sh\necho mps-ran\n").unwrap();
    assert_ne!(mps.exit_code, 0, "{}", mps.output);
    assert!(!mps.output.contains("mps-ran"), "{}", mps.output);
    assert!(mps.output.contains("gpu-mode site configuration of node") && mps.output.contains("runtimedir"), "{}", mps.output);

    let (state, reason) = c.node_state().unwrap();
    assert!(!state.contains("DRAIN"), "the node was drained: {state} {reason}\n{}", c.logs_tail());
    c.stop();
}
