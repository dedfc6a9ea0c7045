//! Prolog side of `--gpu-mode=mps`.

use super::control::{parameter_commands, Control, LOG_VAR, PIPE_VAR};
use super::daemon::{self, DaemonSpec};
use super::registry::{create_daemon_dirs, daemon_dir, daemon_key, daemons_parent, DaemonRecord, REGISTRY_VERSION};
use super::teardown::dismantle;
use crate::config::Config;
use crate::gpu::{apply_compute_mode, Applied, GpuError, GpuOps};
use crate::gpu_lock::GpuLocks;
use crate::job_env::{format_gpu_list, JobEnv};
use crate::failure::{Failure, Fault};
use crate::gpu_mode::MpsParams;
use crate::persist::StateError;
use crate::privdrop::{Identity, SpawnError};
use crate::procfs;
use super::MpsError;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// The step of a daemon's start that failed. The prolog rolls back what the
/// steps before it did and fails the job with `mps: <this>`.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Reading a GPU's UUID, or setting its compute mode.
    #[error(transparent)]
    Gpu(#[from] GpuError),
    /// Writing the daemon's record (the undo's intent, first of all).
    #[error(transparent)]
    Record(#[from] StateError),
    #[error("creating {}: {source}", .dir.display())]
    Dirs { dir: PathBuf, source: std::io::Error },
    /// The job's user is not one the daemon can run as.
    #[error(transparent)]
    User(#[from] SpawnError),
    /// The daemon did not start, or refused the job's parameters.
    #[error(transparent)]
    Daemon(#[from] MpsError),
}

/// What the job got: its daemon's key (for the epilog) and its tasks' variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsJob {
    pub key: String,
    pub task_env: BTreeMap<String, String>,
}

/// Where a job's daemon comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum Placement {
    /// The user already has a daemon on exactly these GPUs.
    Reuse(DaemonRecord),
    New,
    /// A job refusal: the message names the GPU.
    Conflict(String),
}

/// Decides, from the live daemons, whether a job of `uid` on `gpus` shares a
/// daemon, needs a new one, or cannot use MPS on these GPUs now.
pub fn place(live: &[DaemonRecord], uid: u32, gpus: &[u32]) -> Placement {
    let key = daemon_key(uid, gpus);
    for rec in live {
        let Some(shared) = gpus.iter().find(|g| rec.gpus.contains(g)) else { continue };
        let jobs = format_gpu_list(&rec.jobs);
        if rec.uid != uid {
            return Placement::Conflict(format!(
                "GPU {} is in use by another user's MPS daemon (job {jobs}); MPS serves one user per GPU at a time",
                rec.gpu_label(*shared)
            ));
        }
        if rec.key != key {
            return Placement::Conflict(format!(
                "GPU {} is in your MPS daemon for GPUs {} (job {jobs}); jobs sharing a GPU under MPS must hold the same GPUs",
                rec.gpu_label(*shared),
                format_gpu_list(&rec.gpus)
            ));
        }
        return Placement::Reuse(rec.clone());
    }
    Placement::New
}

/// Prepares MPS for a job on `gpus`, NVML indices (the prolog maps Slurm's:
/// `gpu::slurm_index`); see the module docs of [`crate::mps`].
pub fn setup(cfg: &Config, env: &JobEnv, gpus: &[u32], params: &MpsParams, ops: &dyn GpuOps) -> Result<MpsJob, Failure> {
    if gpus.is_empty() {
        return Err(Failure::Job("--gpu-mode=mps needs GPUs: request them with --gres=gpu:N or --gpus=N".into()));
    }
    let node = |what: &str, e: &dyn std::fmt::Display| Failure::node(Fault::Mps, format!("mps: {what}: {e}"));
    let _locks = GpuLocks::acquire(&cfg.runtime_dir, gpus, ms(cfg.mps.lock_timeout_ms))
        .map_err(|e| node("locking GPUs", &e))?;
    let records = DaemonRecord::all(&cfg.runtime_dir).map_err(|e| node("reading the daemon registry", &e))?;
    // Under the locks, an intent record (no daemon) is a prolog that died
    // mid-start: stale like a record whose daemon is gone.
    let (live, stale): (Vec<_>, Vec<_>) = records.into_iter().partition(|r| r.daemon.and_then(procfs::find).is_some());
    for rec in stale.iter().filter(|r| r.gpus.iter().any(|g| gpus.contains(g))) {
        // A daemon that died (or a node that rebooted with /run kept): clear
        // what it left before its GPUs are used again.
        dismantle(cfg, rec, env.job_id, Some(ops))
            .map_err(|f| Failure::node(f.fault().unwrap_or(Fault::Mps), format!("mps: stale daemon {}: {f}", rec.key)))?;
    }
    let record = match place(&live, env.uid, gpus) {
        Placement::Conflict(msg) => return Err(Failure::Job(msg)),
        Placement::Reuse(mut rec) => {
            rec.jobs.push(env.job_id);
            rec.save(&cfg.runtime_dir).map_err(|e| node("saving the daemon registry", &e))?;
            rec
        }
        Placement::New => start_new(cfg, env, gpus, params, ops)?,
    };
    Ok(MpsJob { key: record.key.clone(), task_env: task_env(&record, params) })
}

/// Every task's MPS variables. The devices are the daemon's UUIDs: the same
/// strings for daemon and clients, whatever index Slurm gave the task.
pub fn task_env(rec: &DaemonRecord, params: &MpsParams) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = [
        (PIPE_VAR.to_string(), rec.pipe_dir.display().to_string()),
        (LOG_VAR.to_string(), rec.log_dir.display().to_string()),
        ("CUDA_VISIBLE_DEVICES".to_string(), rec.gpu_uuids.join(",")),
    ]
    .into();
    if let Some(t) = params.threads {
        env.insert("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(), t.to_string());
    }
    if let Some(m) = params.mem {
        let limits: Vec<String> = (0..rec.gpus.len()).map(|d| format!("{d}={m}")).collect();
        env.insert("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(), limits.join(","));
    }
    env
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

/// Steps done so far, undone in reverse on failure.
#[derive(Default)]
struct Undo {
    saved_modes: Vec<(u32, crate::gpu::ComputeMode)>,
    /// The registry record, once saved (intent or final).
    record: Option<DaemonRecord>,
    dir: bool,
}

fn start_new(cfg: &Config, env: &JobEnv, gpus: &[u32], params: &MpsParams, ops: &dyn GpuOps) -> Result<DaemonRecord, Failure> {
    let mut gpus = gpus.to_vec();
    gpus.sort_unstable();
    let key = daemon_key(env.uid, &gpus);
    let dir = daemon_dir(&cfg.runtime_dir, &key);
    let mut undo = Undo::default();
    let result = start_steps(cfg, env, params, ops, &gpus, &key, &mut undo);
    result.map_err(|msg| {
        let undo_errors = roll_back(cfg, ops, &dir, &mut undo);
        Failure::node(Fault::Mps, format!("mps: {msg}{undo_errors}"))
    })
}

fn start_steps(
    cfg: &Config,
    env: &JobEnv,
    params: &MpsParams,
    ops: &dyn GpuOps,
    gpus: &[u32],
    key: &str,
    undo: &mut Undo,
) -> Result<DaemonRecord, StartError> {
    let uuids = gpus.iter().map(|&g| ops.inventory(g).map(|i| i.uuid)).collect::<Result<Vec<_>, _>>()?;
    let dir = daemon_dir(&cfg.runtime_dir, key);
    // The intent record comes first: whatever this prolog does next, a later
    // prolog or epilog finds it and knows what to undo (audit item H1).
    let mut record = DaemonRecord {
        version: REGISTRY_VERSION,
        key: key.to_string(),
        uid: env.uid,
        gid: env.gid,
        gpus: gpus.to_vec(),
        gpu_uuids: uuids,
        daemon: None,
        pipe_dir: dir.join("pipe"),
        log_dir: dir.join("log"),
        jobs: vec![env.job_id],
        saved_compute_modes: Vec::new(),
    };
    save_record(cfg, &record, undo)?;
    for &gpu in gpus {
        if let Applied::Changed { from, .. } = apply_compute_mode(ops, gpu, cfg.gpu.mps_compute_mode)? {
            undo.saved_modes.push((gpu, from));
            record.saved_compute_modes = undo.saved_modes.clone();
            save_record(cfg, &record, undo)?;
        }
    }
    undo.dir = true;
    create_daemon_dirs(&cfg.runtime_dir, key, env.uid, env.gid).map_err(|source| StartError::Dirs { dir: dir.clone(), source })?;
    let who = Identity::of_user(env.uid, env.gid)?;
    let spec = DaemonSpec {
        program: &cfg.mps.control,
        who: &who,
        devices: &record.gpu_uuids,
        parent: &daemons_parent(&cfg.runtime_dir),
        key,
        pipe_dir: &record.pipe_dir,
        log_dir: &record.log_dir,
    };
    record.daemon = Some(daemon::start(&spec, ms(cfg.mps.start_timeout_ms))?);
    save_record(cfg, &record, undo)?;
    let commands = parameter_commands(params.threads, params.mem, gpus.len());
    if !commands.is_empty() {
        let control = Control { program: &cfg.mps.control, pipe_dir: &record.pipe_dir, log_dir: &record.log_dir, who: &who };
        control.send(&commands, ms(cfg.mps.start_timeout_ms))?;
    }
    Ok(record)
}

fn save_record(cfg: &Config, record: &DaemonRecord, undo: &mut Undo) -> Result<(), StartError> {
    record.save(&cfg.runtime_dir)?;
    undo.record = Some(record.clone());
    Ok(())
}

/// Undoes the steps of a failed start; returns "; undo: ..." when some undo
/// step failed too (the node then needs a look).
fn roll_back(cfg: &Config, ops: &dyn GpuOps, dir: &std::path::Path, undo: &mut Undo) -> String {
    let mut errors = Vec::new();
    if let Some(rec) = &undo.record {
        // Stops the daemon if it started, or any process serving its pipe
        // directory if the start was cut short.
        let who = Identity::of_user_or_bare(rec.uid, rec.gid);
        let control = Control { program: &cfg.mps.control, pipe_dir: &rec.pipe_dir, log_dir: &rec.log_dir, who: &who };
        let out = daemon::stop(&control, rec.daemon, ms(cfg.mps.quit_timeout_ms), ms(cfg.mps.kill_timeout_ms));
        if let Some(p) = out.survivors.first() {
            errors.push(format!("MPS process {} survived SIGKILL", p.pid));
        }
    }
    if std::mem::take(&mut undo.dir) {
        if let Err(e) = crate::fsutil::remove_tree_if_present(dir) {
            errors.push(format!("removing {}: {e}", dir.display()));
        }
    }
    for (gpu, mode) in undo.saved_modes.drain(..).rev() {
        if let Err(e) = ops.set_compute_mode(gpu, mode) {
            errors.push(format!("restoring compute mode of GPU {gpu}: {e}"));
        }
    }
    if let Some(rec) = undo.record.take() {
        if let Err(e) = DaemonRecord::remove(&cfg.runtime_dir, &rec.key) {
            errors.push(e.to_string());
        }
    }
    if errors.is_empty() {
        String::new()
    } else {
        format!("; undo: {}", errors.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    fn rec(uid: u32, gpus: &[u32], jobs: &[u32]) -> DaemonRecord {
        DaemonRecord {
            pipe_dir: "/r/mps/k/pipe".into(),
            log_dir: "/r/mps/k/log".into(),
            saved_compute_modes: vec![],
            ..crate::mps::registry::test_record(uid, gpus, jobs)
        }
    }

    /// A step's failure keeps its kind (what the prolog's `mps: ...` names),
    /// and the roll-back removes the record the steps before it wrote.
    #[test]
    fn a_failed_start_step_is_typed_and_rolled_back() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config { runtime_dir: dir.path().to_path_buf(), ..Config::default() };
        let env = JobEnv { job_id: 7, uid: 1000, gid: 1000, user: "u".into(), node: "n1".into(), slurm_gpus: vec![0], mode_value: None, restart_count: 0 };
        let key = daemon_key(env.uid, &[0]);
        let step = |gpus: &crate::gpu::fake::FakeGpus, undo: &mut Undo| start_steps(&cfg, &env, &MpsParams::default(), gpus, &[0], &key, undo);

        let mut lost = crate::gpu::fake::FakeGpus::with_minors(&[0]);
        lost.lost = vec![0];
        let mut undo = Undo::default();
        let err = step(&lost, &mut undo).unwrap_err();
        assert!(matches!(err, StartError::Gpu(GpuError::GpuLost { .. })), "{err:?}");
        assert!(undo.record.is_none(), "nothing was written before the UUIDs were read");

        // The fake does not model compute modes: the record is written, then the mode fails.
        let gpus = crate::gpu::fake::FakeGpus::with_minors(&[0]);
        let mut undo = Undo::default();
        let err = step(&gpus, &mut undo).unwrap_err();
        assert!(matches!(err, StartError::Gpu(GpuError::Refused { .. })), "{err:?}");
        assert_eq!(err.to_string(), "GPU 0: modes is not modelled by FakeGpus");
        assert!(DaemonRecord::load(&cfg.runtime_dir, &key).unwrap().is_some(), "the intent record comes first");
        assert_eq!(roll_back(&cfg, &gpus, &daemon_dir(&cfg.runtime_dir, &key), &mut undo), "");
        assert!(DaemonRecord::load(&cfg.runtime_dir, &key).unwrap().is_none(), "rolled back");
    }

    #[test]
    fn placement_decision_table() {
        let alice01 = rec(1001, &[0, 1], &[5]);
        let bob2 = rec(1002, &[2], &[6]);
        let live = vec![alice01.clone(), bob2];
        // (uid, GPUs, Ok(shared daemon key) / Ok(None) for a new one / Err(refusal))
        type Want<'a> = Result<Option<&'a str>, &'a str>;
        let cases: Vec<(u32, Vec<u32>, Want)> = vec![
            // same user, same GPUs (any order): share
            (1001, vec![1, 0], Ok(Some("1001-0_1"))),
            // free GPU: new daemon
            (1001, vec![3], Ok(None)),
            (1002, vec![3], Ok(None)),
            // another user's GPU: refused, naming the GPU
            (1001, vec![2], Err("GPU GPU-2 is in use by another user's MPS daemon (job 6)")),
            (1002, vec![1, 3], Err("GPU GPU-1 is in use by another user's MPS daemon (job 5)")),
            // the same user on an overlapping but different set: refused
            (1001, vec![1], Err("GPU GPU-1 is in your MPS daemon for GPUs 0,1 (job 5)")),
        ];
        for (uid, gpus, want) in cases {
            let got = place(&live, uid, &gpus);
            match (&got, want) {
                (Placement::Reuse(r), Ok(Some(key))) => assert_eq!(r.key, key),
                (Placement::New, Ok(None)) => {}
                (Placement::Conflict(msg), Err(needle)) => assert!(msg.starts_with(needle), "{msg}"),
                _ => panic!("uid {uid} gpus {gpus:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn task_env_uses_uuids_and_per_client_limits() {
        let r = rec(7, &[0, 3], &[1]);
        let env = task_env(&r, &MpsParams::default());
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], "GPU-0,GPU-3");
        assert_eq!(env["CUDA_MPS_PIPE_DIRECTORY"], "/r/mps/k/pipe");
        assert!(!env.contains_key("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
        let p = crate::gpu_mode::GpuMode::parse("mps:threads=25,mem=2G").unwrap();
        let crate::gpu_mode::GpuMode::Mps(params) = p else { unreachable!() };
        let env = task_env(&r, &params);
        assert_eq!(env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "25");
        assert_eq!(env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=2G,1=2G");
    }
}
