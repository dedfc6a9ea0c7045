//! The admin's view on a real Slurm with three simulated H200s: while an
//! MPS, a MIG and a checkpoint job run, `gpu-mode-status` shows each on its
//! GPU with its daemon, instance and agent and exits 0; after them the
//! node is empty again, and the metrics textfile counts their prologs,
//! epilogs and MIG instances; a drain with our reason makes it exit 1.

use gpu_mode_tests::shared::cluster;
use gpu_mode_tests::Cluster;
use std::time::Duration;

fn c() -> &'static Cluster {
    cluster("admin_view", 3)
}

/// One test at a time: a drained node would keep the other's jobs waiting.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// `gpu-mode-status --json --node localhost`: (exit code, JSON, the table).
fn status() -> (i32, serde_json::Value, String) {
    let json = c().tool("gpu-mode-status", &["--json", "--node", "localhost"]).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&json.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", String::from_utf8_lossy(&json.stdout), String::from_utf8_lossy(&json.stderr)));
    let table = c().tool("gpu-mode-status", &["--node", "localhost"]).unwrap();
    assert_eq!(table.status.code(), json.status.code(), "table and JSON agree on the exit code");
    (json.status.code().unwrap_or(-1), v, String::from_utf8_lossy(&table.stdout).into_owned())
}

fn ids(v: &serde_json::Value, key: &str, field: &str) -> Vec<u64> {
    v[key].as_array().into_iter().flatten().filter_map(|x| x[field].as_u64()).collect()
}

#[test]
fn status_shows_each_mode_on_its_gpu_and_the_metrics_count_the_jobs() {
    let _turn = serial();
    let mps = c().start_held_job("gmtest1", &["--gres=gpu:1", "--gpu-mode=mps"], "").unwrap();
    let mig = c().start_held_job("gmtest2", &["--gres=gpu:1", "--gpu-mode=mig:1g.18gb"], "").unwrap();
    let ckpt = c().start_held_job("gmtest1", &["--gres=gpu:1", "--gpu-mode=checkpoint", "--signal=B:USR1@120", "--requeue", "--open-mode=append"], "").unwrap();
    let (code, v, table) = status();
    let logs = || c().logs_tail();
    assert_eq!(code, 0, "{table}\n{}", logs());
    assert_eq!(v["healthy"], true);
    let mut jobs = ids(&v, "jobs", "job");
    jobs.sort_unstable();
    assert_eq!(jobs, [mps.id, mig.id, ckpt.id].map(u64::from), "{table}");
    // Each job on a GPU of its own, with its mode.
    let on_gpus: Vec<(u64, String)> = v["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["jobs"].as_array().unwrap().iter().map(|j| (j["job"].as_u64().unwrap(), j["mode"].as_str().unwrap().to_string())))
        .collect();
    assert_eq!(on_gpus.len(), 3, "{table}");
    for (id, mode) in [(mps.id, "mps"), (mig.id, "mig:1g.18gb"), (ckpt.id, "checkpoint")] {
        assert!(on_gpus.contains(&(u64::from(id), mode.to_string())), "job {id} ({mode}) not on a GPU:\n{table}");
        assert!(table.lines().any(|l| l.contains(&format!("{id} {mode} ("))), "job {id} not in the GPU table:\n{table}");
    }
    let daemons = v["mps_daemons"].as_array().unwrap();
    assert!(daemons.len() == 1 && daemons[0]["running"] == true && ids(&v, "mps_daemons", "pid").len() == 1, "{table}");
    assert_eq!(daemons[0]["jobs"], serde_json::json!([mps.id]));
    let instances = v["mig_instances"].as_array().unwrap();
    assert!(instances.len() == 1 && instances[0]["job"] == mig.id && instances[0]["profile"] == "1g.18gb", "{table}");
    assert_eq!(ids(&v, "agents", "job"), [u64::from(ckpt.id)], "{table}");

    for j in [&mps, &mig, &ckpt] {
        j.release();
    }
    for j in [&mps, &mig, &ckpt] {
        c().wait_epilog(j.id, Duration::from_secs(60)).unwrap();
    }
    let (code, v, table) = status();
    assert_eq!(code, 0, "{table}");
    for key in ["jobs", "mps_daemons", "mig_instances", "agents"] {
        assert_eq!(v[key], serde_json::json!([]), "{key} left after the jobs:\n{table}");
    }
    let text = std::fs::read_to_string(c().metrics_textfile()).unwrap();
    for line in [
        "gpu_mode_prolog_runs_total{mode=\"mps\",outcome=\"ok\"} 1",
        "gpu_mode_prolog_runs_total{mode=\"mig\",outcome=\"ok\"} 1",
        "gpu_mode_prolog_runs_total{mode=\"checkpoint\",outcome=\"ok\"} 1",
        "gpu_mode_epilog_runs_total{mode=\"mps\",outcome=\"ok\"} 1",
        "gpu_mode_epilog_runs_total{mode=\"mig\",outcome=\"ok\"} 1",
        "gpu_mode_mig_instances_created_total{profile=\"1g.18gb\"} 1",
        "gpu_mode_mig_instances_destroyed_total{profile=\"1g.18gb\"} 1",
        "gpu_mode_jobs{mode=\"mps\"} 0",
        "gpu_mode_problems 0",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
    }
}

#[test]
fn a_drain_with_our_reason_needs_the_admin() {
    let _turn = serial();
    let out = c().client("scontrol", &["update", "NodeName=localhost", "State=DRAIN", "Reason=gpu-mode: test: planted"]).run_as_root().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let seen = status();
    c().resume_node().unwrap();
    let (code, v, table) = seen;
    assert_eq!((code, &v["healthy"]), (1, &serde_json::json!(false)), "{table}");
    assert_eq!(v["slurm"]["drained_by_us"], true, "{table}");
    assert!(table.contains("NEEDS THE ADMIN") && table.contains("gpu-mode: test: planted"), "{table}");
}
