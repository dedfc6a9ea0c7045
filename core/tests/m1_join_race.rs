//! Audit item M1: job A's epilog must not stop the MPS daemon that job B's
//! prolog is joining. Before the fix, B's state was written only after B's
//! prolog released the GPU locks, so in between A's epilog counted B as not
//! live and stopped the daemon B had just joined. Now the prolog records B
//! (`preparing`) before it takes any lock.

mod common;

use common::SimNode;
use gpu_mode_core::job_env::JobEnv;
use gpu_mode_core::lifecycle::prolog;
use gpu_mode_core::mps::{registry::test_record_for, teardown, TeardownOutcome};
use gpu_mode_core::state::{JobState, JobStatus};
use std::time::Duration;

fn env(job_id: u32) -> JobEnv {
    JobEnv { job_id, uid: 1000, gid: 1000, user: "u".into(), node: "n".into(), slurm_gpus: vec![0], mode_value: Some("mps".into()) , restart_count: 0}
}

#[test]
fn a_job_joining_a_daemon_is_live_before_it_takes_the_locks() {
    let _node = SimNode::new("node-1x-h100.toml");
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = common::config();
    cfg.runtime_dir = dir.path().join("run");
    cfg.mps.lock_timeout_ms = 20_000;
    cfg.log.syslog = false;
    // A's daemon: a live process standing in for it, serving jobs A and C,
    // where C's prolog has joined it but not finished (state `preparing`).
    let mut daemon = std::process::Command::new("/bin/sleep").arg("60").spawn().unwrap();
    let id = gpu_mode_core::procfs::read(daemon.id() as i32).unwrap().id();
    let (a, b, c) = (41, 42, 43);
    let rec = test_record_for(1000, &[0], &[a, c], id, &cfg.runtime_dir);
    rec.save(&cfg.runtime_dir).unwrap();
    JobState::save(&JobState { status: JobStatus::Preparing, ..state(c) }, &cfg.runtime_dir).unwrap();
    // A ends: C keeps the daemon.
    let out = teardown(&cfg, a, Some(&rec.key)).unwrap();
    assert_eq!(out, TeardownOutcome::Released { key: rec.key.clone(), remaining: vec![c] });
    assert!(daemon.try_wait().unwrap().is_none(), "A's epilog stopped the daemon job {c} is joining");

    // And a prolog makes its job live before it waits for the GPU locks:
    // B's prolog waits for a lock held here, and must already count.
    let held = gpu_mode_core::gpu_lock::GpuLocks::acquire(&cfg.runtime_dir, &[0], Duration::from_secs(5)).unwrap();
    let cfg_b = cfg.clone();
    let prolog_b = std::thread::spawn(move || prolog::run(&cfg_b, &env(b)));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !JobState::is_live(&cfg.runtime_dir, b) {
        assert!(std::time::Instant::now() < deadline, "job {b} is not live while its prolog waits for the lock");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(JobState::load(&cfg.runtime_dir, b).unwrap().status, JobStatus::Preparing);
    drop(held);
    // B then joins the daemon C uses.
    let report = prolog_b.join().unwrap().unwrap();
    assert!(report.detail.unwrap().ends_with("mps daemon 1000-0"));
    assert_eq!(JobState::load(&cfg.runtime_dir, b).unwrap().status, JobStatus::Ready);
    let _ = daemon.kill();
    let _ = daemon.wait();
}

fn state(job_id: u32) -> JobState {
    JobState {
        version: gpu_mode_core::state::STATE_VERSION,
        status: JobStatus::Ready,
        job_id,
        uid: 1000,
        gid: 1000,
        user: "u".into(),
        node: "n".into(),
        mode: "mps".into(),
        gpus: vec![0],
        task_env: Default::default(),
        refusal: None,
        created_unix: 0,
        per_task_env: Default::default(),
        grant: gpu_mode_core::modes::GrantRecord::None,
    }
}
