//! `gpu-mode-ckpt-agent --job J --uid U --gid G --restart-count K --node N
//!  [--gpus I,J] [--deadline-unix T] [--config PATH] [--nccl portable|native]
//!  [--pool] [--job-nodes A,B]`
//!
//! The per-job checkpoint agent (gpu_mode_core::preempt::agent), started by
//! the prolog as root through `spawn_agent`. `--gpus` are the job's NVML
//! indices in allocation order. It serves until the job is gone, its
//! deadline, or `stop` from root; exit 0 then, 2 on bad arguments or config,
//! 1 when it cannot start or listen. Run by CRIU as its action script
//! (`CRTOOLS_SCRIPT_ACTION` set), it is the restore's hold instead
//! (gpu_mode_core::preempt::agent::hold).

use gpu_mode_core::log::{ActionLine, Outcome};
use gpu_mode_core::preempt::agent::{gpu_facts, hold, listen, node_gpus, real_backends, AgentSettings};
use gpu_mode_core::job_env::JobRun;
use gpu_mode_core::preempt::{socket_path, Agent, AgentParams, NodeFacts};
use gpu_mode_core::gpu_mode::NcclTransport;
use gpu_mode_core::Config;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

struct Args {
    job: u32,
    uid: u32,
    gid: u32,
    restart_count: u32,
    node: String,
    gpus: Vec<u32>,
    deadline_unix: Option<u64>,
    config: Option<PathBuf>,
    /// The job's NCCL transport as the prolog resolved it; native (the
    /// side that refuses NCCL ranks before r610) when not given.
    nccl: NcclTransport,
    /// The job gets a host memory pool (`--pool`, a flag without a value).
    pool: bool,
    /// The job's nodes when several (the prolog passes them only then).
    job_nodes: Vec<String>,
}

fn parse() -> Result<Args, String> {
    let mut a = Args { job: 0, uid: 0, gid: 0, restart_count: 0, node: String::new(), gpus: vec![], deadline_unix: None, config: None, nccl: NcclTransport::Native, pool: false, job_nodes: vec![] };
    let mut it = std::env::args().skip(1);
    let mut seen = (false, false);
    while let Some(k) = it.next() {
        if k == "--pool" {
            a.pool = true;
            continue;
        }
        let v = it.next().ok_or_else(|| format!("{k} needs a value"))?;
        let num = |v: &str| v.parse::<u64>().map_err(|_| format!("{k} {v}: not a number"));
        match k.as_str() {
            "--job" => (a.job, seen.0) = (num(&v)? as u32, true),
            "--uid" => (a.uid, seen.1) = (num(&v)? as u32, true),
            "--gid" => a.gid = num(&v)? as u32,
            "--restart-count" => a.restart_count = num(&v)? as u32,
            "--node" => a.node = v,
            "--gpus" => a.gpus = v.split(',').map(|g| num(g).map(|n| n as u32)).collect::<Result<_, _>>()?,
            "--deadline-unix" => a.deadline_unix = Some(num(&v)?),
            "--config" => a.config = Some(v.into()),
            "--nccl" => a.nccl = v.parse()?,
            "--job-nodes" => a.job_nodes = v.split(',').map(String::from).collect(),
            _ => return Err(format!("unknown option {k}")),
        }
    }
    if !(seen.0 && seen.1) {
        return Err("--job and --uid are required".into());
    }
    Ok(a)
}

fn fail(code: i32, msg: String) -> ! {
    eprintln!("gpu-mode-ckpt-agent: {msg}");
    std::process::exit(code)
}

fn main() {
    // Run by CRIU as its action script (as the job's user): the restore's
    // hold, nothing else (preempt::agent::hold).
    if let Some(action) = std::env::var_os(hold::ACTION_ENV) {
        let socket = std::env::var_os(hold::SOCKET_ENV);
        std::process::exit(hold::script_main(&action.to_string_lossy(), socket.as_deref()));
    }
    let a = parse().unwrap_or_else(|e| fail(2, e));
    if unsafe { libc::geteuid() } != 0 {
        fail(2, "runs as root (the prolog starts it)".into());
    }
    let cfg = Config::load(a.config.as_deref()).unwrap_or_else(|e| fail(2, e.to_string()));
    let line = || ActionLine::new("checkpoint-agent").field("job", a.job).field("uid", a.uid).field("node", &a.node);
    let (gpus, driver_version) = gpu_facts(&cfg, &a.gpus).unwrap_or_else(|e| {
        line().field("detail", format!("no GPU facts: {e}")).outcome(Outcome::Failed).emit(&cfg.log);
        (Vec::new(), "unknown".into())
    });
    let (backends, cuda_version) = real_backends(&cfg).unwrap_or_else(|e| fail(1, e.to_string()));
    // The huge-page shim's copy for this version, which gpu-mode-run preloads
    // (preempt::hugepages): without it the job still runs, on the library
    // itself, and an upgrade may then strand its image.
    if let Err(e) = gpu_mode_core::preempt::hugepages::keep(&cfg.preempt) {
        line().field("detail", format!("cannot keep a copy of the huge-page shim: {e}")).outcome(Outcome::Failed).emit(&cfg.log);
    }
    let params = AgentParams {
        run: JobRun { job: a.job, restart_count: a.restart_count, uid: a.uid, gid: a.gid, node: a.node.clone() },
        gpus,
        deadline: a.deadline_unix.map(|t| SystemTime::UNIX_EPOCH + Duration::from_secs(t)),
        nccl: a.nccl,
        pool: a.pool,
        job_nodes: a.job_nodes,
    };
    let mut settings = AgentSettings::from_config(&cfg);
    // Checkpoints and restores are counted where the site keeps metrics.
    settings.events = cfg.metrics.textfile.is_some().then(|| gpu_mode_core::observe::recorder(&cfg));
    let socket_dir = settings.socket_dir.clone();
    let agent = Arc::new(Agent::new(params, settings, NodeFacts { driver_version, cuda_version, node_gpus: node_gpus(&cfg) }, backends));
    let listener =
        listen(&socket_dir, a.job, a.uid, a.gid).unwrap_or_else(|e| fail(1, format!("cannot listen in {}: {e}", socket_dir.display())));
    line().field("detail", "listening").outcome(Outcome::Ok).emit(&cfg.log);
    let reason = agent.serve(listener);
    let _ = gpu_mode_core::fsutil::remove_if_present(&socket_path(&socket_dir, a.job));
    // A staged image's copy to image_dir outlives the job's run (the epilog's
    // stop returns once the socket is gone; preempt::staging).
    agent.finish_copies();
    // A pool job's size links: its processes are gone with the job.
    if agent.params.pool {
        let _ = gpu_mode_core::fsutil::remove_tree_if_present(&agent.settings.pool_dir_of(a.job));
    }
    line().field("detail", format!("exiting: {reason:?}")).outcome(Outcome::Ok).emit(&cfg.log);
    std::process::exit(if reason.is_ok() { 0 } else { 1 });
}
