//! The per-job checkpoint agent: root, one per checkpoint job and node,
//! started by the prolog ([`spawn_agent`]), serving only the job's user on a
//! unix socket (server.rs), and ending with the job.
//!
//! Checkpoint (dump.rs): CUDA lock+checkpoint of the application tree (GPU
//! memory free), CRIU dump, images sealed, manifest written last; on a CRIU
//! failure the CUDA state is rolled back and the application runs on.
//! Restore (restore.rs): every check first (manifest, files, node, free
//! memory, pids), then CRIU restore into the caller's cgroup, CUDA restore
//! onto the job's GPUs, unlock; any failure after CRIU kills what it
//! restored, so nothing half-restored keeps running; the image is kept.
//!
//! Lifetime: it exits on `stop` from root (the epilog), at its deadline, when
//! the job's processes have all been gone for `idle_exit`, or when none ever
//! appeared within `start_grace`.

mod dump;
pub mod hold;
mod ratelimit;
mod real;
mod refusal;
mod restore;
mod server;
mod spawn;
#[cfg(test)]
mod tests;

pub use real::{gpu_facts, node_gpus, real_backends, GpuFactsError};
pub use server::{listen, ExitReason};
pub use spawn::{spawn_agent, stop_agent, AgentControlError, AgentLaunch};
pub use refusal::FailureReason;
use refusal::{Because, RefusalKind, RequestError};

use super::accounting::{self, AccountingField, Event, EventKind};
use super::images::ImageStore;
use super::manifest::GpuFacts;
use super::staging::Staging;
use crate::cuda_ckpt::{CudaCkptDriver, Checkpointer, GpuInfo, GpuUuid, ProcessHost};
use crate::config::LogConfig;
use crate::criu::Criu;
use crate::job_env::JobRun;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// Bound on each of the two scontrol calls of an accounting record: a
/// checkpoint's is written before the wrapper hears of it (and requeues),
/// so that the preempted run's record in Slurm's accounting holds it.
const ACCOUNTING_TIMEOUT: Duration = Duration::from_secs(5);

/// Who the agent serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentParams {
    /// This run: dumps go to `<job>/<restart_count>/`.
    pub run: JobRun,
    /// The job's GPUs on this node, in allocation order.
    pub gpus: Vec<GpuFacts>,
    pub deadline: Option<SystemTime>,
    /// The job's NCCL transport (the prolog's `--nccl`): whether NCCL
    /// ranks may be checkpointed on drivers before r610 (uncheckpointable.rs).
    pub nccl: gpu_mode_base::gpu_mode::NcclTransport,
    /// The job asked for a host memory pool (preempt::pool): the agent sizes
    /// it (the prolog's `--pool`, `pool=on` against `preempt.host_pool`).
    pub pool: bool,
    /// The job's nodes when it runs on several (the prolog's `--job-nodes`;
    /// empty otherwise): such a job is refused at the checkpoint.
    pub job_nodes: Vec<String>,
}

/// The node's driver, recorded in manifests and compared at restore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    pub driver_version: String,
    pub cuda_version: i32,
    /// Every GPU of this node (NVML order): a restore onto other GPUs must
    /// map every GPU the process was checkpointed with (checkpoint::device_map).
    pub node_gpus: Vec<GpuUuid>,
}

#[derive(Debug, Clone)]
pub struct AgentSettings {
    pub socket_dir: PathBuf,
    /// `image_dir`: the shared store.
    pub images: ImageStore,
    /// `staging_dir`: dumps land on the node first and are copied to
    /// `images` in the background (staging.rs); `None`: straight to `images`.
    pub staging: Option<Staging>,
    /// `staging_wait_s`: how long a restore waits for a staged image's copy
    /// from another node (staging.rs, [`crate::staging::judge`]).
    pub staging_wait: Duration,
    pub checkpoint: crate::cuda_ckpt::Settings,
    pub tcp_established: bool,
    /// Where the network locks CRIU leaves are recorded, and nft
    /// (netlock.rs).
    pub netlocks: crate::netlock::NetLocks,
    /// CRIU's `--ghost-limit`: the most of one deleted file the image carries
    /// (`preempt.ghost_limit_mib`).
    pub ghost_limit_bytes: u64,
    /// More deleted files than this and the tree is refused
    /// (`preempt.max_deleted_files`, uncheckpointable.rs).
    pub max_deleted_files: usize,
    /// `preempt.early_writeback`.
    pub early_writeback: bool,
    /// How long a restore waits for the image's pids to be free.
    pub pid_wait: Duration,
    pub idle_exit: Duration,
    pub start_grace: Duration,
    /// How long a finished dump may take to be reported to a waiting restore.
    pub dump_wait: Duration,
    /// How long a connection may take to send its request, in all.
    pub request_wait: Duration,
    pub log: LogConfig,
    /// Where checkpoint and restore events go (crate::metrics): set by the
    /// binary that runs the agent, `None` from [`AgentSettings::from_config`]
    /// (nothing is kept).
    pub events: Option<crate::metrics::EventSink>,
    /// Where checkpoint and restore events go (accounting.rs), through
    /// scontrol at this path.
    pub accounting: AccountingField,
    pub scontrol: PathBuf,
    /// Where a restore holds for the agent's checks (hold.rs): the agent's
    /// own binary as CRIU's action script; `None` (the unit tests'
    /// recording CRIU runs no script): the tree is checked after CRIU.
    pub restore_hold: Option<hold::HoldSettings>,
    /// A `pool=on` job's pool sizes go to `<pool_dir>/<job>` (crate::pool),
    /// within these bounds.
    pub pool_dir: PathBuf,
    pub pool_bounds: crate::pool::Bounds,
    /// `preempt.restore_map_buffers`: the driver's buffer mapped from a
    /// cached image at a restore (page_cache.rs).
    pub restore_map_buffers: bool,
}

impl AgentSettings {
    pub fn from_config(cfg: &crate::Config) -> AgentSettings {
        AgentSettings {
            socket_dir: cfg.preempt.agent_socket_dir(&cfg.runtime_dir),
            images: ImageStore::new(&cfg.preempt.image_dir),
            staging: Staging::from_config(&cfg.preempt),
            staging_wait: super::staging::wait_bound(&cfg.preempt),
            checkpoint: crate::cuda_ckpt::Settings::from_config(cfg),
            tcp_established: true,
            netlocks: crate::netlock::NetLocks::from_config(cfg),
            ghost_limit_bytes: cfg.preempt.ghost_limit_mib << 20,
            max_deleted_files: cfg.preempt.max_deleted_files as usize,
            early_writeback: cfg.preempt.early_writeback,
            pid_wait: Duration::from_secs(10),
            idle_exit: Duration::from_secs(30),
            start_grace: Duration::from_secs(600),
            dump_wait: Duration::from_millis(cfg.preempt.criu_timeout_ms) + Duration::from_secs(60),
            request_wait: Duration::from_secs(30),
            log: cfg.log.clone(),
            events: None,
            accounting: cfg.preempt.accounting,
            scontrol: cfg.slurm.scontrol.clone(),
            restore_hold: Some(hold::HoldSettings { script: cfg.preempt.agent.clone(), criu: cfg.preempt.criu.clone() }),
            pool_dir: cfg.preempt.pool_root(&cfg.runtime_dir),
            pool_bounds: crate::pool::Bounds::from_config(&cfg.preempt),
            restore_map_buffers: cfg.preempt.restore_map_buffers,
        }
    }

    /// This job's pool directory.
    pub fn pool_dir_of(&self, job: u32) -> PathBuf {
        self.pool_dir.join(job.to_string())
    }
}

/// A tree the agent restored: its parent is the agent, which relays its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RootState {
    Running,
    Dumping,
    Dumped,
}

pub struct Agent {
    pub params: AgentParams,
    pub settings: AgentSettings,
    pub facts: NodeFacts,
    criu: Arc<dyn Criu>,
    driver: Arc<dyn CudaCkptDriver>,
    host: Arc<dyn ProcessHost + Send>,
    gpus: Arc<dyn GpuInfo + Send>,
    /// `criu check`, started with the agent and awaited by the first
    /// request that needs it ([`Agent::criu_status`]): a dump is refused up
    /// front when CRIU is unusable.
    criu_check: Mutex<Option<std::thread::JoinHandle<Result<String, String>>>>,
    criu_status: std::sync::OnceLock<Result<String, String>>,
    /// The job's user with their groups, looked up once (the group database
    /// may be a network service): CRIU and every check as the user use it.
    user: crate::privdrop::Identity,
    /// One checkpoint or restore at a time.
    op: Mutex<()>,
    restored: Mutex<BTreeMap<i32, RootState>>,
    /// A restore waiting at CRIU's pre-resume for its checks (hold.rs).
    hold: Mutex<Option<hold::Pending>>,
    stop: AtomicBool,
    started: Instant,
    /// Open connections of the job's user (server.rs bounds them).
    connections: AtomicUsize,
    /// Requests per uid (refusal.rs): a loop of requests is refused at once.
    budget: Mutex<ratelimit::RequestBudget>,
    /// Refusal log lines per uid (refusal.rs).
    refusal_log: Mutex<ratelimit::LogLimit>,
    /// Background copies of staged images to the shared store (staging.rs),
    /// which the agent finishes before it exits ([`Agent::finish_copies`]).
    copies: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

/// A `pool=on` job's sizer (crate::pool), logging each change of its total
/// as the agent's other actions are logged. A sizer that cannot start (its
/// directory) is logged; the job runs without its pool.
fn start_pool_sizer(params: &AgentParams, settings: &AgentSettings, b: &Backends) {
    let run = &params.run;
    let line = {
        let (job, uid, node, log) = (run.job, run.uid, run.node.clone(), settings.log.clone());
        move |action: &str, outcome: crate::log::Outcome, detail: String| {
            crate::log::ActionLine::new(action).field("job", job).field("uid", uid).field("node", &node).field("detail", detail).outcome(outcome).emit(&log)
        }
    };
    let sizer = crate::pool::Sizer {
        dir: settings.pool_dir_of(run.job),
        job: run.job,
        gid: run.gid,
        gpus: params.gpus.iter().map(|g| g.uuid.clone()).collect(),
        bounds: settings.pool_bounds,
        interval: crate::pool::INTERVAL,
        paths: Default::default(),
    };
    let turn = line.clone();
    let logged = move |plan: &crate::pool::Plan, e: Option<&crate::pool::PoolError>| match e {
        None => turn("pool-size", crate::log::Outcome::Ok, crate::pool::describe(plan)),
        Some(e) => turn("pool-size", crate::log::Outcome::Failed, format!("{}: {e}", crate::pool::describe(plan))),
    };
    if let Err(e) = crate::pool::spawn(sizer, Arc::clone(&b.gpus), Arc::clone(&b.host), logged) {
        line("pool-size", crate::log::Outcome::Failed, format!("no host memory pool for this job: {e}"));
    }
}

/// The backends an agent drives: real ones in the binary, doubles in tests.
pub struct Backends {
    pub criu: Arc<dyn Criu>,
    pub driver: Arc<dyn CudaCkptDriver>,
    pub host: Arc<dyn ProcessHost + Send>,
    pub gpus: Arc<dyn GpuInfo + Send>,
}

impl Agent {
    pub fn new(params: AgentParams, settings: AgentSettings, facts: NodeFacts, b: Backends) -> Agent {
        // Off the prolog's path: the prolog waits for the socket, which no
        // longer waits for CRIU (issue 25 item 5; check_cache.rs).
        let criu = Arc::clone(&b.criu);
        let criu_check = std::thread::Builder::new()
            .name("criu-check".into())
            .spawn(move || criu.check().map(|v| v.to_string()).map_err(|e| e.to_string()));
        let (criu_check, criu_status) = match criu_check {
            Ok(handle) => (Some(handle), std::sync::OnceLock::new()),
            Err(e) => (None, std::sync::OnceLock::from(Err(format!("cannot start the CRIU check: {e}")))),
        };
        let user = crate::privdrop::Identity::of_user_or_bare(params.run.uid, params.run.gid);
        if params.pool {
            start_pool_sizer(&params, &settings, &b);
        }
        Agent {
            user,
            params,
            settings,
            facts,
            criu: b.criu,
            driver: b.driver,
            host: b.host,
            gpus: b.gpus,
            criu_check: Mutex::new(criu_check),
            criu_status,
            op: Mutex::new(()),
            restored: Mutex::new(BTreeMap::new()),
            hold: Mutex::new(None),
            stop: AtomicBool::new(false),
            started: Instant::now(),
            connections: AtomicUsize::new(0),
            budget: Mutex::new(refusal::request_budget()),
            refusal_log: Mutex::new(refusal::refusal_log()),
            copies: Mutex::new(Vec::new()),
        }
    }

    /// Where this agent's dumps go: the node's staging directory if set,
    /// else the shared image directory.
    fn dump_store(&self) -> &ImageStore {
        self.settings.staging.as_ref().map_or(&self.settings.images, |s| &s.local)
    }

    /// Waits for the background copies of staged images (after the socket
    /// is gone: the epilog's `stop` does not wait for them, and the
    /// requeued job does not either).
    pub fn finish_copies(&self) {
        let copies = std::mem::take(&mut *self.copies.lock().unwrap_or_else(|p| p.into_inner()));
        for c in copies {
            let _ = c.join();
        }
    }

    fn checkpointer(&self) -> Checkpointer<'_> {
        Checkpointer::new(Arc::clone(&self.driver), &*self.host, &*self.gpus, self.settings.checkpoint.clone())
    }

    fn set_root(&self, pid: i32, state: Option<RootState>) {
        let mut map = self.restored.lock().unwrap_or_else(|p| p.into_inner());
        match state {
            Some(s) => map.insert(pid, s),
            None => map.remove(&pid),
        };
    }

    fn root_state(&self, pid: i32) -> Option<RootState> {
        self.restored.lock().unwrap_or_else(|p| p.into_inner()).get(&pid).copied()
    }

    /// One checkpoint or restore at a time: a second request is refused
    /// rather than queued (the grace time is short).
    fn exclusive(&self) -> Result<std::sync::MutexGuard<'_, ()>, RequestError> {
        let busy = || format!("a checkpoint or restore of job {} is already running", self.params.run.job);
        self.op.try_lock().map_err(|_| RequestError::refused(RefusalKind::Busy, busy()))
    }

    /// `criu check` failed at start: nothing can be dumped or restored.
    /// A node without a working CRIU is the admin's fault to see: a
    /// failure (logged, counted, accounted; the request budget bounds a
    /// user's loop of them), not a cheap refusal.
    fn criu_usable(&self, verb: &str) -> Result<(), RequestError> {
        let unusable = |e: &String| RequestError::failed(FailureReason::Criu, format!("cannot {verb}: {e}"));
        self.criu_status().as_ref().map(|_| ()).map_err(unusable)
    }

    /// CRIU's version, or why it cannot be used: the start's check, awaited
    /// once (concurrent callers wait for the same answer).
    fn criu_status(&self) -> &Result<String, String> {
        self.criu_status.get_or_init(|| {
            let handle = self.criu_check.lock().unwrap_or_else(|p| p.into_inner()).take();
            handle.and_then(|h| h.join().ok()).unwrap_or_else(|| Err("the CRIU check ended without an answer".into()))
        })
    }

    fn count(&self, events: &[crate::metrics::Event]) {
        if let Some(sink) = &self.settings.events {
            sink.send(events);
        }
    }

    /// Records an event of this run in the job's Slurm record. A failure
    /// is logged, never the checkpoint's or restore's failure; each
    /// scontrol call is bounded by [`ACCOUNTING_TIMEOUT`].
    fn account(&self, kind: EventKind, seconds: f64, image_bytes: Option<u64>) {
        if self.settings.accounting == AccountingField::Off {
            return;
        }
        let p = &self.params;
        let event = Event { kind, run: p.run.restart_count, node: p.run.node.clone(), seconds, image_bytes };
        let scontrol = crate::drain::Scontrol::new(&self.settings.scontrol).with_timeout(ACCOUNTING_TIMEOUT);
        if let Err(e) = accounting::record(&scontrol, self.settings.accounting, p.run.job, &event) {
            self.log("accounting", crate::log::Outcome::Failed, &format!("{}: {e}", event.token()));
        }
    }

    fn log(&self, action: &str, outcome: crate::log::Outcome, detail: &str) {
        self.action_line(action).field("detail", detail).outcome(outcome).emit(&self.settings.log);
    }

    /// A log line of this agent: the job, its user and the node.
    fn action_line(&self, action: &str) -> crate::log::ActionLine {
        crate::log::ActionLine::new(action).field("job", self.params.run.job).field("uid", self.params.run.uid).field("node", &self.params.run.node)
    }
}
