//! `--gpu-mode=mig` through the real prolog and epilog against the
//! simulated NVML (its MIG rules: placements, IN_USE while a process holds an
//! instance, MIG mode switched by an implicit reset unless held).

mod common;

use common::SimNode;
use gpu_mode_core::config::Config;
use gpu_mode_core::gpu::{GpuOps, MigInstanceSetting, MigModeSetting};
use gpu_mode_core::job_env::JobEnv;
use gpu_mode_core::lifecycle::{epilog, prolog, Failure, Fault as NodeFault};
use gpu_mode_core::log::Outcome;
use gpu_mode_core::modes::mig::journal::MigJournal;
use gpu_mode_core::modes::GrantRecord;
use gpu_mode_core::state::JobState;
use nvml_sim::model::{Fault, SimProcess};

fn setup(node: &SimNode) -> (tempfile::TempDir, Config) {
    let _ = node;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = common::config();
    cfg.runtime_dir = dir.path().join("run");
    cfg.log.syslog = false;
    cfg.log.stderr = false;
    cfg.mps.kill_timeout_ms = 300;
    cfg.slurm.gres_conf = dir.path().join("no-gres.conf");
    (dir, cfg)
}

fn job(id: u32, uid: u32, gpus: &[u32], mode: &str) -> JobEnv {
    JobEnv { job_id: id, uid, gid: uid, user: "u".into(), node: "n".into(), slurm_gpus: gpus.to_vec(), mode_value: Some(mode.into()) , restart_count: 0}
}

fn instances(node: &SimNode, gpu: usize) -> Vec<(u32, u32)> {
    node.edit(|s| s.gpus[gpu].instances.iter().map(|g| (g.profile_id, g.start)).collect())
}

fn mig_on(node: &SimNode, gpu: usize) -> bool {
    node.edit(|s| s.gpus[gpu].mig_current)
}

#[test]
fn a_job_gets_its_layout_one_device_per_task_and_the_epilog_removes_it() {
    let node = SimNode::new("node-2x-h200.toml");
    let (_d, cfg) = setup(&node);
    let env = job(10, 1000, &[1], "mig:3g.71gb,2g.35gbx2");
    let report = prolog::run(&cfg, &env).unwrap();
    assert_eq!(report.outcome, Outcome::Ok);
    // 3g + 2g + 2g fits only with the 3g at slice 4.
    let mut got = instances(&node, 1);
    got.sort_unstable();
    assert_eq!(got, vec![(9, 4), (14, 0), (14, 2)]);
    assert!(mig_on(&node, 1) && !mig_on(&node, 0));
    let state = JobState::load(&cfg.runtime_dir, 10).unwrap();
    let uuids = &state.per_task_env["CUDA_VISIBLE_DEVICES"];
    assert_eq!(uuids.len(), 3);
    assert!(uuids.iter().all(|u| u.starts_with("MIG-")), "{uuids:?}");
    assert_eq!(state.task_env["SLURM_GPU_MODE_MIG_UUIDS"], uuids.join(","));
    let GrantRecord::Mig(grant) = &state.grant else { panic!("{:?}", state.grant) };
    assert!(grant.gpus[0].enabled_mig && grant.gpus[0].instances.iter().all(|i| i.made));

    let out = epilog::run(&cfg, &env).unwrap();
    assert!(out.detail.unwrap().contains("3 instance(s) destroyed; MIG switched off"), "epilog detail");
    assert!(instances(&node, 1).is_empty() && !mig_on(&node, 1));
    assert_eq!(MigJournal::jobs(&cfg.runtime_dir), Vec::<u32>::new());
    // Twice is safe.
    assert_eq!(epilog::run(&cfg, &env).unwrap().outcome, Outcome::Skipped);
}

/// Regression (tests/tests/fault_prolog_race.rs): the job that switched MIG
/// on ends first, while another job's instance is still there; the other
/// job's epilog, the last one out, switches MIG off.
#[test]
fn mig_is_switched_off_by_the_last_epilog_whichever_job_switched_it_on() {
    let node = SimNode::new("node-1x-h200.toml");
    let (_d, cfg) = setup(&node);
    let (a, b) = (job(20, 1000, &[0], "mig:3g.71gb"), job(21, 1001, &[0], "mig:3g.71gb"));
    prolog::run(&cfg, &a).unwrap();
    prolog::run(&cfg, &b).unwrap();
    let enabled = |id| match JobState::load(&cfg.runtime_dir, id).unwrap().grant {
        GrantRecord::Mig(g) => g.gpus[0].enabled_mig,
        other => panic!("{other:?}"),
    };
    assert!(enabled(20) && !enabled(21), "job 20 switched MIG on");
    epilog::run(&cfg, &a).unwrap();
    assert!(mig_on(&node, 0) && instances(&node, 0).len() == 1, "job 21 still has its instance");
    let out = epilog::run(&cfg, &b).unwrap();
    assert!(out.detail.unwrap().contains("MIG switched off"), "the last epilog switches MIG off");
    assert!(!mig_on(&node, 0) && instances(&node, 0).is_empty());
    assert!(std::fs::read_dir(cfg.runtime_dir.join("mig")).unwrap().next().is_none(), "no journal or mark left");
}

#[test]
fn a_layout_that_does_not_fit_is_refused_before_anything_changes() {
    let node = SimNode::new("node-1x-h100.toml");
    let (_d, cfg) = setup(&node);
    match prolog::run(&cfg, &job(11, 1000, &[0], "mig:3g.40gbx3")) {
        Err(Failure::Job(msg)) => {
            assert!(msg.contains("MIG layout 3g.40gbx3 does not fit") && msg.contains("mig:3g.40gbx2"), "{msg}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(!mig_on(&node, 0), "MIG mode must not be switched for a refused job");
    assert!(instances(&node, 0).is_empty());
    match prolog::run(&cfg, &job(12, 1000, &[0], "mig:1g.18gb")) {
        Err(Failure::Job(msg)) => assert!(msg.contains("has no MIG profile 1g.18gb; its profiles are 1g.10gb"), "{msg}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_creation_failing_half_way_destroys_what_the_job_made_and_is_a_node_fault() {
    let node = SimNode::new("node-1x-h100.toml");
    let (_d, cfg) = setup(&node);
    node.inject(0, Fault::MigCreateFails { after: 2 });
    match prolog::run(&cfg, &job(13, 1000, &[0], "mig:1g.10gbx4")) {
        Err(Failure::Node(NodeFault::Mig, msg)) => assert!(msg.contains("mig: GPU GPU-") && msg.contains("nvmlDeviceCreateGpuInstance"), "{msg}"),
        other => panic!("expected a node fault, got {other:?}"),
    }
    assert!(instances(&node, 0).is_empty(), "half a layout left behind");
    assert!(!mig_on(&node, 0), "MIG mode the job switched on must be switched off again");
    assert_eq!(MigJournal::jobs(&cfg.runtime_dir), Vec::<u32>::new());
    assert!(!gpu_mode_core::runtime::job_is_live(&cfg.runtime_dir, 13));
}

#[test]
fn the_epilog_kills_the_jobs_leftover_process_but_drains_for_anyone_elses() {
    let node = SimNode::new("node-1x-h100.toml");
    let (_d, cfg) = setup(&node);
    let me = unsafe { libc::geteuid() };
    // The job's user: 65534 when we can act as it, else ourselves.
    let uid = if me == 0 { 65534 } else { me };
    let env = job(14, uid, &[0], "mig:7g.80gb");
    prolog::run(&cfg, &env).unwrap();
    let gi = node.edit(|s| s.gpus[0].instances[0].id);
    let mut leftover = std::process::Command::new("/bin/sleep");
    leftover.arg("60");
    if me == 0 {
        std::os::unix::process::CommandExt::uid(&mut leftover, uid);
    }
    let mut leftover = leftover.spawn().unwrap();
    // A real process: the simulated driver forgets it once it is gone.
    let on_instance = |pid| SimProcess { pid, used_mib: 100, gpu_instance: Some(gi), compute_instance: Some(0), live: true };
    node.edit(|s| s.gpus[0].processes.push(on_instance(leftover.id())));
    let watcher = std::thread::spawn(move || leftover.wait().unwrap());
    let out = epilog::run(&cfg, &env).unwrap();
    assert!(out.detail.unwrap().contains("killed the job's leftover pids"));
    assert!(watcher.join().unwrap().code().is_none(), "the leftover was killed by a signal");
    assert!(instances(&node, 0).is_empty());

    // A process that is not the job user's is never killed: the node drains.
    let env = job(15, uid, &[0], "mig:7g.80gb");
    prolog::run(&cfg, &env).unwrap();
    let gi = node.edit(|s| s.gpus[0].instances[0].id);
    let stranger = std::process::id();
    node.edit(|s| s.gpus[0].processes.push(SimProcess { pid: stranger, used_mib: 1, gpu_instance: Some(gi), compute_instance: Some(0), live: true }));
    match epilog::run(&cfg, &env) {
        Err(Failure::Drain(NodeFault::MigBusy, reason)) => assert!(reason.starts_with(&format!("MIG instance {gi} on GPU GPU-")) && reason.ends_with("busy (job 15)"), "{reason}"),
        other => panic!("expected a drain, got {other:?}"),
    }
    node.edit(|s| s.gpus[0].processes.clear());
}

#[test]
fn with_leave_the_job_uses_instances_already_there_and_never_destroys_them() {
    let node = SimNode::new("node-1x-h100.toml");
    let (_d, mut cfg) = setup(&node);
    cfg.gpu.mig_instances = MigInstanceSetting::Leave;
    let ops = node.gpus();
    ops.set_mig_mode(0, true).unwrap();
    ops.create_mig_instance(0, 9, Some(0)).unwrap();
    ops.create_mig_instance(0, 9, Some(4)).unwrap();
    let env = job(16, 1000, &[0], "mig:3g.40gbx2");
    prolog::run(&cfg, &env).unwrap();
    epilog::run(&cfg, &env).unwrap();
    assert_eq!(instances(&node, 0).len(), 2, "the admin's instances must stay");
    match prolog::run(&cfg, &job(17, 1000, &[0], "mig:1g.10gb")) {
        Err(Failure::Job(msg)) => assert!(msg.contains("mig_instances = \"leave\""), "{msg}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    // A GPU not in MIG mode with mig_mode = "leave": refused, naming the fix.
    drop(ops);
    drop(node);
    let node2 = SimNode::new("node-2x-h200.toml");
    let (_d2, mut cfg2) = setup(&node2);
    cfg2.gpu.mig_mode = MigModeSetting::Leave;
    match prolog::run(&cfg2, &job(18, 1000, &[0], "mig:7g.141gb")) {
        Err(Failure::Job(msg)) => assert!(msg.contains("is not in MIG mode; an admin enables it with `nvidia-smi -i GPU-"), "{msg}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_prolog_that_died_half_way_is_cleaned_up_by_the_next_one() {
    let node = SimNode::new("node-1x-h100.toml");
    let (_d, cfg) = setup(&node);
    // Job 20's prolog made one instance and died creating the second: its
    // journal lists one and a pending create that did happen.
    let ops = node.gpus();
    ops.set_mig_mode(0, true).unwrap();
    let a = ops.create_mig_instance(0, 9, Some(0)).unwrap();
    let b = ops.create_mig_instance(0, 9, Some(4)).unwrap();
    let mut j = MigJournal::new(20, 1000);
    j.grant.gpus.push(gpu_mode_core::modes::mig::MigGpuGrant {
        gpu: 0,
        gpu_uuid: ops.inventory(0).unwrap().uuid,
        instances: vec![gpu_mode_core::modes::mig::GrantedInstance {
            gpu_instance: a.gpu_instance,
            compute_instance: 0,
            profile: "3g.40gb".into(),
            profile_id: 9,
            placement_start: 0,
            placement_size: 4,
            uuid: "MIG-a".into(),
            made: true,
        }],
        enabled_mig: true,
    });
    j.pending = Some(gpu_mode_core::modes::mig::journal::PendingCreate { gpu: 0, profile_id: 9, start: b.placement_start });
    j.save(&cfg.runtime_dir).unwrap();
    // The next job on the GPU finds a clean GPU.
    let env = job(21, 1000, &[0], "mig:7g.80gb");
    prolog::run(&cfg, &env).unwrap();
    assert_eq!(instances(&node, 0), vec![(0, 0)]);
    assert_eq!(MigJournal::jobs(&cfg.runtime_dir), vec![21]);
    epilog::run(&cfg, &env).unwrap();
}
