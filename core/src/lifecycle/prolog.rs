//! The Prolog verb: parse the job's mode, decide what its tasks get, and
//! record it in the job state for the plugin and the epilog.

use super::{Failure, Fault, Report};
use crate::config::Config;
use crate::job_env::{format_gpu_list, JobEnv};
use crate::log::Outcome;
use crate::gpu::slurm_index::{self, JobGpus};
use crate::gpu::LazyGpus;
use crate::gpu_mode::GpuMode;
use crate::modes::{self, GrantRecord, PrepareCtx};
use crate::state::{JobState, JobStatus, STATE_VERSION};
use crate::watchdog;
use std::collections::BTreeMap;

/// Task variable with the job's mode in canonical form, set by the plugin from
/// the job state (proof that the prolog's decision reached the task).
pub const TASK_MODE_VAR: &str = "SLURM_GPU_MODE";
/// Task variable with the NVML indices of the GPUs the prolog prepared.
pub const TASK_GPUS_VAR: &str = "SLURM_GPU_MODE_GPUS";

/// The most of a user's raw mode value or of a message kept in a state file
/// or a log line: a forged value must not bloat them.
pub const MAX_RECORDED_LEN: usize = 512;

pub fn run(cfg: &Config, env: &JobEnv) -> Result<Report, Failure> {
    run_with(cfg, env, &LazyGpus::from_config(cfg))
}

/// [`run`] with the NVML to use when a step needs one (tests give a fake).
pub fn run_with(cfg: &Config, env: &JobEnv, nvml: &LazyGpus) -> Result<Report, Failure> {
    let Some(raw) = env.mode_value.as_deref() else {
        // Jobs without --gpu-mode are never touched.
        return Ok(Report { outcome: Outcome::Skipped, mode: None, detail: None });
    };
    // The value comes from the job's user: it is parsed again here, never
    // trusted because the plugin checked it at submit.
    let mode = match GpuMode::parse(raw) {
        Ok(mode) => mode,
        // A value that bypassed the plugin (e.g. a plugin missing on the
        // submit host): the job's fault.
        Err(e) => return refuse(cfg, env, raw, e.to_string()),
    };
    let canonical = mode.to_string();
    // From here on the job is live on this node (audit item M1).
    save(cfg, new_state(env, &canonical, BTreeMap::new(), None, JobStatus::Preparing))?;
    match prepare(cfg, env, &mode, nvml) {
        Err(Failure::Job(msg)) => refuse(cfg, env, &canonical, msg),
        Err(fault) => {
            // Everything was undone: the job no longer holds anything here.
            let _ = JobState::remove(&cfg.runtime_dir, env.job_id);
            Err(fault)
        }
        ok => ok,
    }
}

/// The mode's driver checks, then prepares; the state records its grant.
fn prepare(cfg: &Config, env: &JobEnv, mode: &GpuMode, nvml: &LazyGpus) -> Result<Report, Failure> {
    let canonical = mode.to_string();
    let gpus = {
        let _step = watchdog::step("GPU indices");
        job_gpus(cfg, env, nvml)?
    };
    let driver = modes::driver_for(mode);
    let ctx = PrepareCtx { cfg, env, gpus: &gpus.nvml, nvml };
    driver.check(&ctx)?;
    let grant = driver.prepare(&ctx)?;
    super::record_events(cfg, &grant.events);
    let mut state = new_state(env, &canonical, BTreeMap::new(), None, JobStatus::Ready);
    state.gpus = gpus.nvml.clone();
    state.task_env = [
        (TASK_MODE_VAR.to_string(), canonical.clone()),
        (TASK_GPUS_VAR.to_string(), format_gpu_list(&gpus.nvml)),
    ]
    .into();
    state.task_env.extend(grant.task_env);
    state.per_task_env = grant.per_task_env;
    state.grant = grant.record;
    if let Err(e) = save(cfg, state.clone()) {
        // Undo what was set up: the epilog would find no state to work from.
        if let Ok(undone) = driver.release(cfg, env.job_id, &state.grant) {
            super::record_events(cfg, &undone.events);
        }
        return Err(e);
    }
    Ok(Report { outcome: Outcome::Ok, mode: Some(canonical), detail: report_detail(&gpus, grant.detail) })
}

/// The log line's detail: how Slurm's GPUs mapped to NVML's, and the mode's.
fn report_detail(gpus: &JobGpus, mode_detail: Option<String>) -> Option<String> {
    let how = (!gpus.how.is_empty()).then(|| gpus.how.clone());
    let parts: Vec<String> = [how, mode_detail].into_iter().flatten().collect();
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// The job's GPUs as NVML numbers them. Mode code must use these, never
/// Slurm's indices: on nodes whose gres.conf lists the devices in another
/// order than NVML, Slurm's GPU 0 is not NVML's GPU 0.
fn job_gpus(cfg: &Config, env: &JobEnv, nvml: &LazyGpus) -> Result<JobGpus, Failure> {
    slurm_index::resolve(cfg, env, || nvml.get()).map_err(|e| Failure::node(Fault::GpuIndices, format!("GPU indices: {e}")))
}

/// Records a refusal so the plugin fails the job's tasks with `message`.
/// The state lists no GPUs: the refused job never uses them.
pub fn refuse(cfg: &Config, env: &JobEnv, mode: &str, message: String) -> Result<Report, Failure> {
    let message = bounded(&message);
    save(cfg, new_state(env, &bounded(mode), BTreeMap::new(), Some(message.clone()), JobStatus::Ready))?;
    Err(Failure::Job(message))
}

/// `text` cut to [`MAX_RECORDED_LEN`] bytes (at a character boundary).
pub fn bounded(text: &str) -> String {
    if text.len() <= MAX_RECORDED_LEN {
        return text.to_string();
    }
    let mut end = MAX_RECORDED_LEN - 3;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

fn new_state(env: &JobEnv, mode: &str, task_env: BTreeMap<String, String>, refusal: Option<String>, status: JobStatus) -> JobState {
    JobState {
        version: STATE_VERSION,
        status,
        job_id: env.job_id,
        uid: env.uid,
        gid: env.gid,
        user: env.user.clone(),
        node: env.node.clone(),
        mode: mode.to_string(),
        gpus: Vec::new(),
        task_env,
        refusal,
        per_task_env: BTreeMap::new(),
        grant: GrantRecord::None,
        created_unix: crate::persist::now_unix(),
    }
}

fn save(cfg: &Config, state: JobState) -> Result<(), Failure> {
    let _step = watchdog::step("job state: save");
    state
        .save(&cfg.runtime_dir)
        .map(|_| ())
        .map_err(|e| Failure::node(Fault::JobState, format!("cannot write job state: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::gpu::fake::FakeGpus;
    use crate::gpu::{GpuError, GpuOps};
    use std::cell::Cell;

    /// A job on Slurm's GPUs 1 and 2 of a node without gres.conf.
    fn setup(mode: Option<&str>) -> (tempfile::TempDir, Config, JobEnv) {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = Config { runtime_dir: dir.path().join("run"), ..Config::default() };
        cfg.slurm.gres_conf = dir.path().join("gres.conf");
        let env = JobEnv {
            job_id: 77,
            uid: 1000,
            gid: 1000,
            user: "u".into(),
            node: "n".into(),
            slurm_gpus: vec![1, 2],
            mode_value: mode.map(String::from),
            restart_count: 0,
        };
        (dir, cfg, env)
    }

    /// NVML that must not be opened; `opened` tells whether it was tried.
    fn no_nvml(opened: &Cell<bool>) -> LazyGpus<'_> {
        LazyGpus::new(move || {
            opened.set(true);
            Err(GpuError::DriverNotLoaded { call: "nvmlInit_v2" })
        })
    }

    /// A checkpoint job's prolog starts an agent: a stand-in here.
    fn with_agent(mode: Option<&str>) -> (tempfile::TempDir, Config, JobEnv) {
        let (d, mut cfg, env) = setup(mode);
        let _ = crate::modes::checkpoint::stand_in::install(&mut cfg, d.path(), env.job_id);
        (d, cfg, env)
    }

    #[test]
    fn jobs_without_a_mode_or_without_gpus_read_neither_gres_conf_nor_nvml() {
        let opened = Cell::new(false);
        let (_d, cfg, mut env) = with_agent(None);
        // A gres.conf that cannot be read: reading it would be an error.
        std::fs::create_dir(&cfg.slurm.gres_conf).unwrap();
        assert_eq!(run_with(&cfg, &env, &no_nvml(&opened)).unwrap().outcome, Outcome::Skipped);
        env.mode_value = Some("checkpoint".into());
        env.slurm_gpus.clear();
        assert_eq!(run_with(&cfg, &env, &no_nvml(&opened)).unwrap().outcome, Outcome::Ok);
        assert!(!opened.get(), "NVML was opened");
    }

    #[test]
    fn mode_work_gets_nvml_indices_when_gres_conf_order_differs() {
        let (_d, cfg, env) = with_agent(Some("checkpoint"));
        // Slurm's index i is the i-th File=: 0 → nvidia3, 1 → nvidia0, 2 → nvidia2.
        std::fs::write(&cfg.slurm.gres_conf, "AutoDetect=off\nName=gpu File=/dev/nvidia3,/dev/nvidia0\nName=gpu File=/dev/nvidia[2,1]\n").unwrap();
        // NVML GPU 0 is nvidia2, 1 is nvidia3, 2 is nvidia0, 3 is nvidia1.
        let nvml = LazyGpus::new(|| Ok(Box::new(FakeGpus::with_minors(&[2, 3, 0, 1])) as Box<dyn GpuOps>));
        let report = run_with(&cfg, &env, &nvml).unwrap();
        let state = JobState::load(&cfg.runtime_dir, 77).unwrap();
        // Slurm's 1, 2 are nvidia0, nvidia2: NVML's 2, 0.
        assert_eq!(state.gpus, vec![2, 0]);
        assert_eq!(state.task_env[TASK_GPUS_VAR], "2,0");
        assert!(report.detail.unwrap().contains("Slurm GPUs 1,2 are NVML GPUs 2,0"));
    }

    #[test]
    fn a_gpu_gres_conf_does_not_list_is_a_node_fault() {
        let (_d, cfg, env) = setup(Some("checkpoint"));
        std::fs::write(&cfg.slurm.gres_conf, "Name=gpu File=/dev/nvidia[0-1]\n").unwrap();
        let nvml = LazyGpus::new(|| Ok(Box::new(FakeGpus::with_minors(&[0, 1])) as Box<dyn GpuOps>));
        match run_with(&cfg, &env, &nvml) {
            Err(Failure::Node(fault, msg)) => assert!(fault == Fault::GpuIndices && msg.starts_with("GPU indices: Slurm GPU index 2 is not in"), "{msg}"),
            other => panic!("expected a node fault, got {other:?}"),
        }
        assert_eq!(JobState::load_if_present(&cfg.runtime_dir, 77).unwrap(), None);
    }

    #[test]
    fn a_job_without_mode_gets_no_state() {
        let (_d, cfg, env) = setup(None);
        assert_eq!(run(&cfg, &env).unwrap().outcome, Outcome::Skipped);
        assert_eq!(JobState::load_if_present(&cfg.runtime_dir, 77).unwrap(), None);
    }

    #[test]
    fn a_valid_mode_is_recorded_with_its_task_environment() {
        let (_d, cfg, env) = with_agent(Some("checkpoint"));
        let report = run(&cfg, &env).unwrap();
        assert_eq!(report.mode.as_deref(), Some("checkpoint"));
        let state = JobState::load(&cfg.runtime_dir, 77).unwrap();
        assert_eq!(state.task_env[TASK_MODE_VAR], "checkpoint");
        assert_eq!(state.task_env[TASK_GPUS_VAR], "1,2");
        assert_eq!(state.gpus, vec![1, 2]);
        assert_eq!(state.refusal, None);
    }

    /// `pool=`: the tasks hear of the job's host memory pool only when it
    /// gets one; one the node's config forbids refuses the job, naming the
    /// setting (the submit host's config may differ).
    #[test]
    fn a_checkpoint_jobs_host_pool_reaches_its_tasks_within_the_sites_bound() {
        use crate::config::HostPoolSetting::{Allow, Default, Forbid};
        let pool_var = crate::modes::checkpoint::TASK_POOL_VAR;
        for (mode, site, want) in [
            ("checkpoint", Allow, None),
            ("checkpoint:pool=on", Allow, Some("on")),
            ("checkpoint:pool=off", Default, None),
            ("checkpoint", Default, Some("on")),
            ("checkpoint:pool=off", Forbid, None),
        ] {
            let (_d, mut cfg, env) = with_agent(Some(mode));
            cfg.preempt.host_pool = site;
            run(&cfg, &env).unwrap();
            let state = JobState::load(&cfg.runtime_dir, 77).unwrap();
            assert_eq!(state.task_env.get(pool_var).map(String::as_str), want, "{mode} with host_pool {site:?}");
        }
        let (_d, mut cfg, env) = with_agent(Some("checkpoint:pool=on"));
        cfg.preempt.host_pool = Forbid;
        match run(&cfg, &env) {
            Err(Failure::Job(msg)) => assert!(msg.contains("preempt.host_pool = \"forbid\""), "{msg}"),
            other => panic!("expected a job refusal, got {other:?}"),
        }
    }

    #[test]
    fn an_invalid_mode_is_refused_not_a_node_fault() {
        let (_d, cfg, env) = setup(Some("mig:1g.10gbx9"));
        match run(&cfg, &env) {
            Err(Failure::Job(msg)) => assert!(msg.contains("count 9"), "{msg}"),
            other => panic!("expected a job refusal, got {other:?}"),
        }
        let state = JobState::load(&cfg.runtime_dir, 77).unwrap();
        assert!(state.refusal.unwrap().contains("count 9"));
        assert!(state.task_env.is_empty());
    }

    #[test]
    fn a_layout_this_node_does_not_define_is_refused() {
        let (_d, mut cfg, env) = setup(Some("mig:@nope"));
        cfg.mig.layouts.insert("half".into(), "3g.40gbx2".into());
        match run(&cfg, &env) {
            Err(Failure::Job(msg)) => {
                assert_eq!(msg, "MIG layout \"nope\" is not defined on node n (defined: half)")
            }
            other => panic!("expected a job refusal, got {other:?}"),
        }
        // A defined layout passes the check; making it needs NVML, absent
        // here (core/tests/mig_mode.rs runs it on the simulated one).
        let (_d, mut cfg, env) = setup(Some("mig:@half"));
        cfg.mig.layouts.insert("half".into(), "3g.40gbx2".into());
        match run(&cfg, &env) {
            Err(Failure::Node(fault, msg)) => assert!(fault == Fault::Nvml && msg.starts_with("NVML: cannot load libnvidia-ml"), "{msg}"),
            other => panic!("expected the NVML step, got {other:?}"),
        }
    }

    #[test]
    fn a_forged_huge_mode_value_is_refused_and_recorded_bounded() {
        let huge = format!("mps:threads={}", "9".repeat(1_000_000));
        let (_d, cfg, env) = setup(Some(&huge));
        match run(&cfg, &env) {
            Err(Failure::Job(msg)) => assert!(msg.len() <= MAX_RECORDED_LEN, "{}", msg.len()),
            other => panic!("expected a job refusal, got {other:?}"),
        }
        let state = JobState::load(&cfg.runtime_dir, 77).unwrap();
        assert!(state.mode.len() <= MAX_RECORDED_LEN && state.refusal.unwrap().len() <= MAX_RECORDED_LEN);
        assert!(std::fs::metadata(crate::state::state_path(&cfg.runtime_dir, 77)).unwrap().len() < 4096);
        assert_eq!(bounded("ab"), "ab");
        assert_eq!(bounded(&"é".repeat(400)).len(), MAX_RECORDED_LEN - 1);
    }

    #[test]
    fn an_unwritable_runtime_dir_is_a_node_fault() {
        let (d, mut cfg, env) = setup(Some("checkpoint"));
        let file = d.path().join("file");
        std::fs::write(&file, b"").unwrap();
        cfg.runtime_dir = file.join("run");
        match run(&cfg, &env) {
            Err(Failure::Node(fault, msg)) => assert!(fault == Fault::JobState && msg.contains("cannot write job state"), "{msg}"),
            other => panic!("expected a node fault, got {other:?}"),
        }
    }
}
