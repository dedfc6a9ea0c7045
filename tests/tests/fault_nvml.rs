//! Fault matrix (docs/faults.md), NVML rows: libnvidia-ml missing, NVML
//! failing to initialise, a GPU lost (NVML_ERROR_GPU_IS_LOST) during the
//! prolog and during the epilog. Jobs without --gpu-mode never open NVML and
//! keep running; a job with a mode finds the node at fault: the helper
//! drains it naming the call, Slurm requeues the job held, and nothing of
//! the job is left on the node. The tests take turns: each drains the node.

use gpu_mode_tests::shared::cluster;
use gpu_mode_tests::Cluster;
use std::sync::Mutex;
use std::time::Duration;

static TURN: Mutex<()> = Mutex::new(());
const WAIT: Duration = Duration::from_secs(60);

fn c() -> &'static Cluster {
    cluster("fault_nvml", 1)
}

fn config_path() -> std::path::PathBuf {
    c().dir.join("gpu-mode.toml")
}

/// Puts the node back when a test ends, passed or failed: the config as
/// written, no faults, no held jobs, in service. A passing test then checks
/// nothing of its jobs is left ([`Restore::check`]).
struct Restore {
    config: String,
    aside: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

impl Restore {
    fn new() -> Restore {
        Restore { config: std::fs::read_to_string(config_path()).unwrap(), aside: None }
    }

    fn check(&self, what: &str) {
        self.put_back();
        let left = c().leftovers(None);
        assert!(left.is_clean(), "{what}: left behind:\n{}", left.summary());
    }

    fn put_back(&self) {
        std::fs::write(config_path(), &self.config).unwrap();
        if let Some((from, to)) = &self.aside {
            let _ = std::fs::rename(from, to);
        }
        let _ = c().sim_ctl(&["clear"]);
        c().cancel_all_and_resume();
        c().wait_until("held jobs to go", || c().client("squeue", &["-h"]).run_as_root().is_ok_and(|o| o.stdout.is_empty()));
    }
}

impl Drop for Restore {
    fn drop(&mut self) {
        self.put_back();
    }
}

/// A plain job runs while NVML is broken; an MPS job's prolog drains the
/// node with a reason starting `reason`, and the job goes back held.
fn plain_runs_then_mode_job_drains(reason: &str, what: &str) {
    let plain = c().sbatch_wait(Some("gmtest1"), &["--gres=gpu:1"], "#!/bin/sh\necho plain-ran\n").unwrap();
    assert_eq!(plain.exit_code, 0, "{what}: a job without --gpu-mode failed: {}", plain.output);
    assert!(plain.output.contains("plain-ran"));
    let job = c().sbatch(Some("gmtest1"), &["--gpu-mode=mps", "--gres=gpu:1"], "#!/bin/sh\necho mode-ran\n").unwrap();
    let (_, got) = c().wait_drained(WAIT).unwrap();
    assert!(got.starts_with(reason), "{what}: drain reason {got:?} lacks {reason:?}");
    let info = c().wait_job_info(job, WAIT, "requeue", |j| j.state == "PENDING").unwrap();
    assert!(info.raw.contains("Priority=0") || info.reason.contains("held") || info.reason.contains("Held"), "{what}: not held: {}", info.raw);
    let lines = c().hook_log_lines(job);
    assert!(lines.iter().any(|l| l.contains("action=prolog") && l.ends_with("outcome=failed")), "{what}: {lines:#?}");
}

#[test]
fn a_missing_libnvidia_ml_drains_for_mode_jobs_only() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let r = Restore::new();
    let lib = c().spec.artifacts.sim.as_ref().unwrap().nvml_library.display().to_string();
    std::fs::write(config_path(), r.config.replace(&lib, "/nonexistent/libnvidia-ml.so.1")).unwrap();
    plain_runs_then_mode_job_drains("gpu-mode: prolog: GPU indices: NVML: cannot load libnvidia-ml", "library missing");
    r.check("library missing");
}

#[test]
fn nvml_failing_to_initialise_drains_for_mode_jobs_only() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let mut r = Restore::new();
    // The simulated driver answers nvmlInit with DRIVER_NOT_LOADED when its
    // node is gone, as a node whose kernel module did not load.
    let state = c().dir.join("sim/nvml-state.json");
    let aside = c().dir.join("sim/nvml-state.json.aside");
    std::fs::rename(&state, &aside).unwrap();
    r.aside = Some((aside, state));
    plain_runs_then_mode_job_drains("gpu-mode: prolog: GPU indices: NVML: nvmlInit_v2: the NVIDIA driver is not loaded", "init fails");
    r.check("init fails");
}

#[test]
fn a_gpu_lost_during_the_prolog_drains_and_leaves_nothing() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let r = Restore::new();
    c().sim_ctl(&["inject", "lost", "--gpu", "0"]).unwrap();
    plain_runs_then_mode_job_drains(
        "gpu-mode: prolog: GPU indices: nvmlDeviceGetHandleByIndex_v2 on GPU 0: the GPU is lost (fell off the bus)",
        "lost in prolog",
    );
    r.check("lost in prolog");
}

#[test]
fn a_gpu_lost_during_the_epilog_drains_after_undoing_everything_else() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let r = Restore::new();
    let job = c().start_held_job("gmtest1", &["--gpu-mode=mps", "--gres=gpu:1"], "echo finished").unwrap();
    c().sim_ctl(&["inject", "lost", "--gpu", "0"]).unwrap();
    job.release();
    let done = c().wait_finished(job.id, WAIT).unwrap();
    // The user's job had finished its work: it ends as it ended.
    assert_eq!(done.exit_code, 0, "{}", done.output);
    let (_, reason) = c().wait_drained(WAIT).unwrap();
    assert!(reason.starts_with("gpu-mode: epilog: mps teardown: cannot restore compute mode"), "{reason}");
    assert!(reason.contains("lost") || reason.contains("GPU_IS_LOST"), "{reason}");
    // The daemon, its directories and record, the state: all gone anyway.
    r.check("lost in epilog");
}
