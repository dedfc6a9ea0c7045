//! `--gpu-mode=checkpoint`: checkpoint on preemption, restore on requeue.
//!
//! The prolog starts the job's checkpoint agent (root, one per job, bounded
//! lifetime: [`crate::preempt`]) with the job's GPUs and restart count; the
//! user's `gpu-mode-run` wrapper asks it to checkpoint when the preemption
//! signal comes and to restore when the job runs again. The epilog stops
//! the agent and removes the job's images unless this run just completed a
//! checkpoint (the job is being requeued), then keeps the image directory
//! within its size and age limits.

use crate::config::Config;
use crate::failure::{Failure, Fault};
use crate::grant::GrantRecord;
use crate::mode_driver::{Grant, ModeDriver, PrepareCtx, Released};
use crate::preempt::staging::Staging;
use crate::preempt::{self, AgentLaunch, Cleanup, ImageStore, Limits};
use crate::watchdog;
use std::time::Duration;

/// Task variable with the agent's socket (gpu-mode-run finds it there).
pub const TASK_SOCKET_VAR: &str = "GPU_MODE_CKPT_SOCKET";
pub use crate::job_env::TASK_SIGNAL_VAR;
/// Task variable with the job's NCCL transport (gpu-mode-run sets NCCL's
/// portable variables when it says `portable`).
pub use crate::preempt::nccl::TASK_NCCL_VAR;
/// Task variable that says `on` when the job gets a host memory pool
/// (gpu-mode-run then gives the huge-page shim the job's pool directory).
pub use crate::preempt::pool::TASK_POOL_VAR;
use crate::gpu_mode::{CheckpointParams, NcclTransport};
/// How long the prolog waits for the agent to listen.
const AGENT_START: Duration = Duration::from_secs(20);
/// How long the epilog waits for the agent to acknowledge `stop`.
const AGENT_STOP: Duration = Duration::from_secs(10);
/// How long the sweep may spend asking Slurm which jobs have ended.
const SWEEP_QUERIES: Duration = Duration::from_secs(20);

/// The checkpoint mode; `params`: what the job asked for (`None` in the
/// epilog, which needs none of it).
pub struct CheckpointDriver<'a> {
    pub params: Option<&'a CheckpointParams>,
}

impl CheckpointDriver<'_> {
    /// The job's NCCL transport: what it asked for, bounded by this node's
    /// `preempt.nccl_portable` (the submit host's config may differ).
    fn nccl(&self, cfg: &Config) -> Result<NcclTransport, Failure> {
        cfg.preempt.nccl_transport(self.params.and_then(|p| p.nccl)).map_err(Failure::Job)
    }

    /// Whether the job gets a host memory pool: what it asked for (`pool=`),
    /// bounded by this node's `preempt.host_pool` (the submit host's config
    /// may differ).
    fn pool(&self, cfg: &Config) -> Result<bool, Failure> {
        cfg.preempt.host_pool(self.params.and_then(|p| p.pool)).map_err(Failure::Job)
    }
}

impl ModeDriver for CheckpointDriver<'_> {
    fn name(&self) -> &'static str {
        "checkpoint"
    }

    /// A node without the agent or CRIU cannot serve checkpoint jobs: that
    /// refuses the job (with what is missing), it does not drain the node,
    /// or any user could take nodes out by asking for the mode.
    fn check(&self, ctx: &PrepareCtx) -> Result<(), Failure> {
        let c = &ctx.cfg.preempt;
        for (what, path) in [("checkpoint agent", &c.agent), ("CRIU", &c.criu)] {
            if !is_executable(path) {
                return Err(Failure::Job(format!(
                    "--gpu-mode=checkpoint is not available on node {}: the {what} {} is not installed (ask the site admin)",
                    ctx.env.node,
                    path.display()
                )));
            }
        }
        self.nccl(ctx.cfg)?;
        self.pool(ctx.cfg).map(|_| ())
    }

    fn prepare(&self, ctx: &PrepareCtx) -> Result<Grant, Failure> {
        let env = ctx.env;
        let nccl = self.nccl(ctx.cfg)?;
        let pool = self.pool(ctx.cfg)?;
        let launch = AgentLaunch {
            run: env.run(),
            gpus: ctx.gpus.to_vec(),
            deadline_unix: None,
            config: ctx.cfg.source.clone(),
            nccl,
            pool,
            // The agent refuses to checkpoint a job on several nodes.
            job_nodes: crate::job_env::job_nodes_of_process(),
        };
        let pid = {
            let _step = watchdog::step("checkpoint: agent start");
            preempt::spawn_agent(ctx.cfg, &launch, AGENT_START).map_err(|e| Failure::node(Fault::CheckpointAgent, format!("checkpoint agent: {e}")))?
        };
        let socket = preempt::socket_path(&ctx.cfg.preempt.agent_socket_dir(&ctx.cfg.runtime_dir), env.job_id);
        // Checked when the config was loaded.
        let signal = preempt::signal_number(&ctx.cfg.preempt.signal).map_err(|e| Failure::node(Fault::Config, e))?;
        let mut task_env: std::collections::BTreeMap<String, String> = [
            (TASK_SOCKET_VAR.to_string(), socket.display().to_string()),
            (TASK_SIGNAL_VAR.to_string(), signal.to_string()),
            (TASK_NCCL_VAR.to_string(), nccl.as_str().to_string()),
        ]
        .into();
        if pool {
            task_env.insert(TASK_POOL_VAR.to_string(), "on".to_string());
        }
        Ok(Grant {
            record: GrantRecord::Checkpoint { restart_count: env.restart_count },
            task_env,
            per_task_env: Default::default(),
            detail: Some(format!("checkpoint agent pid {pid}, run {}", env.restart_count)),
            events: Vec::new(),
        })
    }

    fn release(&self, cfg: &Config, job_id: u32, grant: &GrantRecord) -> Result<Released, Failure> {
        let restart_count = match grant {
            GrantRecord::Checkpoint { restart_count } => *restart_count,
            _ => 0,
        };
        finish(cfg, job_id, Some(restart_count))
    }

    fn release_lost(&self, cfg: &Config, job_id: u32) -> Result<Released, Failure> {
        finish(cfg, job_id, None)
    }
}

/// Stops the agent and tidies the images: those of this run unless it
/// completed a checkpoint (`restart_count` known), then the limits. With no
/// state (`None`) only the agent is stopped: whether an image is wanted is
/// unknown, and the sweep's limits bound what stays. Last, the checkpoint
/// records whose processes are gone are removed; a process of the job that
/// outlived it inside a driver call drains the node.
fn finish(cfg: &Config, job_id: u32, restart_count: Option<u32>) -> Result<Released, Failure> {
    let _step = watchdog::step("checkpoint: agent stop");
    let stopped = preempt::stop_agent(cfg, job_id, AGENT_STOP).unwrap_or_else(|e| {
        // The agent ends by itself with the job; a failed stop is logged, not
        // a node fault.
        crate::log::stderr_line(&format!("gpu-mode: job {job_id}: stopping the checkpoint agent: {e}"));
        false
    });
    let store = ImageStore::new(&cfg.preempt.image_dir);
    let mut parts = vec![if stopped { "agent stopped".to_string() } else { "no agent".to_string() }];
    // Asked at most once, and only about an image this run never tried.
    let asked = std::cell::OnceCell::new();
    let requeued = || *asked.get_or_init(|| restart_count.is_some_and(|run| requeued_since(cfg, job_id, run)));
    if let Some(run) = restart_count {
        match preempt::cleanup_after_job(&store, job_id, run, &requeued) {
            Ok(Cleanup::Kept { .. }) => parts.push(format!("image of run {run} kept for the requeued job")),
            Ok(Cleanup::KeptRefused { restart }) => {
                parts.push(format!("image of run {restart} kept: this run's restore of it was refused"))
            }
            Ok(Cleanup::KeptUntried { restart }) => {
                parts.push(format!("image of run {restart} kept: run {run} never tried to restore it and the job is requeued"))
            }
            Ok(Cleanup::Removed) => parts.push("the job's images removed".into()),
            Err(e) => return Err(Failure::node(Fault::CheckpointImages, format!("checkpoint images of job {job_id}: {e}"))),
        }
    }
    if let Some(staging) = Staging::from_config(&cfg.preempt) {
        parts.extend(tidy_staging(cfg, &store, &staging.local, job_id, restart_count, &requeued)?);
    }
    match sweep(cfg, &store, SWEEP_QUERIES) {
        Ok(swept) if !swept.is_empty() => parts.push(format!("swept images of jobs {swept:?}")),
        Ok(_) => {}
        Err(e) => parts.push(format!("sweep failed: {e}")),
    }
    parts.extend(sweep_network_locks(cfg));
    let settled = {
        let _step = watchdog::step("checkpoint: records");
        let dir = crate::cuda_ckpt::Settings::from_config(cfg).record_dir;
        crate::cuda_ckpt::settle_records(&dir, &crate::cuda_ckpt::ProcFs::default(), job_id)
    };
    parts.extend(settled.summary());
    if let Some(stuck) = settled.stuck.first() {
        // The only checkpoint outcome that needs the node looked at: a
        // process the job's end could not remove (checkpoint::settle).
        return Err(Failure::node(Fault::CheckpointStuck, stuck.to_string()));
    }
    Ok(Released { found: stopped || restart_count.is_some(), detail: Some(format!("checkpoint: {}", parts.join("; "))), events: Vec::new() })
}

/// The node's staging directory (core::preempt::staging) after a run of
/// `job_id`: its staged image is kept as the shared store's is (this run's
/// own, or one whose restore it was refused), the rest of the job goes.
/// Then the sweep: besides the limits and the jobs Slurm has ended, a
/// staged copy whose run the shared store no longer records (restored
/// elsewhere, given up, or removed with the job's images) is of no more
/// use and goes; jobs live on this node are never touched.
fn tidy_staging(
    cfg: &Config,
    shared: &ImageStore,
    local: &ImageStore,
    job_id: u32,
    restart_count: Option<u32>,
    requeued: &dyn Fn() -> bool,
) -> Result<Vec<String>, Failure> {
    let mut parts = Vec::new();
    if let Some(run) = restart_count {
        match preempt::cleanup_after_job(local, job_id, run, requeued) {
            Ok(Cleanup::Kept { .. }) => parts.push(format!("staged image of run {run} kept")),
            Ok(Cleanup::KeptRefused { restart }) => parts.push(format!("staged image of run {restart} kept: its restore was refused")),
            Ok(Cleanup::KeptUntried { restart }) => parts.push(format!("staged image of run {restart} kept: never tried, the job is requeued")),
            Ok(Cleanup::Removed) => {}
            Err(e) => return Err(Failure::node(Fault::CheckpointImages, format!("staged checkpoint images of job {job_id}: {e}"))),
        }
    }
    let recorded = |job: u32| local.runs_of(job).iter().any(|(r, _)| shared.staged_path(job, *r).is_file());
    let ended = |job: u32| !recorded(job);
    match preempt::sweep_images(local, Limits::from_config(&cfg.preempt), &live_jobs(cfg), &ended) {
        Ok(swept) if !swept.is_empty() => parts.push(format!("swept staged images of jobs {swept:?}")),
        Ok(_) => {}
        Err(e) => parts.push(format!("staging sweep failed: {e}")),
    }
    Ok(parts)
}

/// Whether Slurm has requeued `job_id` since its run `run` started: its
/// restart count, which Slurm raises at the requeue, is past `run`. Asked
/// only for an image that run never tried to restore; when Slurm cannot
/// say, the image stays (the sweep removes it once Slurm has ended the
/// job): losing it would start the job over from the beginning.
fn requeued_since(cfg: &Config, job_id: u32, run: u32) -> bool {
    match crate::drain::Scontrol::new(&cfg.slurm.scontrol).restart_count(job_id) {
        Ok(Some(count)) => count > run,
        Ok(None) => false,
        Err(e) => {
            crate::log::stderr_line(&format!("gpu-mode: job {job_id}: cannot ask Slurm whether it was requeued ({e}): its image is kept"));
            true
        }
    }
}

/// The sweep: the image directory's limits, and the images of jobs Slurm
/// has ended, asking Slurm for at most `queries` in all. Every job with an
/// image anywhere in the (shared) directory costs an `scontrol` call, and a
/// user can have hundreds of requeued jobs waiting: unbounded, that ran the
/// epilog into its watchdog, which drains the node. Jobs not asked about
/// this time are left to a later sweep and to the limits.
fn sweep(cfg: &Config, store: &ImageStore, queries: Duration) -> std::io::Result<Vec<u32>> {
    let live: Vec<u32> = live_jobs(cfg);
    let scontrol = crate::drain::Scontrol::new(&cfg.slurm.scontrol);
    let until = std::time::Instant::now() + queries;
    let ended = |job: u32| std::time::Instant::now() < until && scontrol.job_has_ended(job).unwrap_or(false);
    preempt::sweep_images(store, Limits::from_config(&cfg.preempt), &live, &ended)
}

/// CRIU's nftables tables on this node that no complete image needs any
/// more (removed above, consumed by a restore here or elsewhere, or never
/// recorded: a CRIU killed mid-dump) are deleted (preempt::netlock, issue
/// 37 N2). Never a node fault: a node without nft says so.
fn sweep_network_locks(cfg: &Config) -> Option<String> {
    let _step = watchdog::step("checkpoint: network locks");
    let swept = preempt::netlock::NetLocks::from_config(cfg).sweep();
    let deleted = (!swept.deleted.is_empty()).then(|| format!("network locks removed: {}", swept.deleted.join(" ")));
    match (deleted, swept.note) {
        (Some(d), Some(n)) => Some(format!("{d} ({n})")),
        (d, n) => d.or(n.map(|n| format!("network locks: {n}"))),
    }
}

/// Jobs live on this node (their images are never swept).
fn live_jobs(cfg: &Config) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(crate::runtime::jobs_dir(&cfg.runtime_dir)) else { return Vec::new() };
    entries.filter_map(|e| e.ok()?.file_name().to_str()?.strip_suffix(".json")?.parse().ok()).collect()
}

fn is_executable(path: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A stand-in for the checkpoint agent in unit tests of the lifecycle: an
/// executable that only marks that it started, and a thread that then
/// listens on the job's socket and answers `stop`, as the agent would
/// (feature `stand-in`: gpu-mode-core's lifecycle tests use it).
#[cfg(any(test, feature = "stand-in"))]
pub mod stand_in {
    use crate::config::Config;
    use crate::preempt::protocol::{self, Request, Response};
    use std::io::BufReader;
    use std::os::unix::net::UnixListener;
    use std::path::Path;
    use std::time::{Duration, Instant};

    pub fn install(cfg: &mut Config, dir: &Path, job: u32) -> std::thread::JoinHandle<()> {
        use std::os::unix::fs::PermissionsExt;
        let script = dir.join("agent");
        let started = dir.join("agent.started");
        std::fs::write(&script, format!("#!/bin/sh\n: > {}\nexec /bin/sleep 10\n", started.display())).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        cfg.preempt.agent = script;
        cfg.preempt.criu = "/bin/true".into();
        cfg.preempt.image_dir = dir.join("images");
        let socket = crate::preempt::socket_path(&cfg.preempt.agent_socket_dir(&cfg.runtime_dir), job);
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(20);
            while !started.exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
            let listener = UnixListener::bind(&socket).unwrap();
            listener.set_nonblocking(true).unwrap();
            while Instant::now() < deadline {
                let Ok((stream, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                stream.set_nonblocking(false).unwrap();
                let mut out = stream.try_clone().unwrap();
                if let Ok(Some(Request::Stop)) = protocol::receive::<Request>(&mut BufReader::new(stream)) {
                    let _ = protocol::send(&mut out, &Response::Stopping);
                    // As the agent does on its way out.
                    let _ = std::fs::remove_file(&socket);
                    return;
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Security review (issue 18), S3: every job with an image costs the
    /// sweep a Slurm query (squeue), in every checkpoint job's epilog. A user's
    /// many requeued jobs waiting with images (or a slow slurmctld) must not
    /// run the epilog into its watchdog: the queries stop at their budget.
    #[test]
    fn the_sweeps_slurm_queries_are_bounded_in_time() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = Config { runtime_dir: dir.path().join("run"), ..Config::default() };
        cfg.preempt.image_dir = dir.path().join("images");
        cfg.preempt.images_max_gib = 0;
        cfg.preempt.images_max_age_hours = 0;
        // The state comes from squeue beside scontrol (`-o %T`, issue 27 F5).
        let squeue = dir.path().join("squeue");
        let state = dir.path().join("state");
        std::fs::write(&state, "PENDING").unwrap();
        std::fs::write(&squeue, format!("#!/bin/sh\nsleep 0.2\ncat {}\n", state.display())).unwrap();
        std::fs::set_permissions(&squeue, std::fs::Permissions::from_mode(0o755)).unwrap();
        cfg.slurm.scontrol = dir.path().join("scontrol");
        let store = ImageStore::new(&cfg.preempt.image_dir);
        for job in 1..=20 {
            std::fs::write(store.prepare_run(job, 0).unwrap().join("pages-1.img"), b"x").unwrap();
        }
        let start = std::time::Instant::now();
        assert_eq!(sweep(&cfg, &store, Duration::from_secs(1)).unwrap(), Vec::<u32>::new(), "pending jobs keep their images");
        let took = start.elapsed();
        assert!(took < Duration::from_millis(2500), "20 queries of 0.2 s took {took:?} with a budget of 1 s");
        // The control: jobs Slurm has ended lose their images (the queries are used).
        std::fs::write(&state, "COMPLETED").unwrap();
        let removed = sweep(&cfg, &store, Duration::from_secs(60)).unwrap();
        assert_eq!(removed.len(), 20, "{removed:?}");
    }

    /// The epilog of a run that never tried the image of run 0 (its task
    /// never reached the agent) keeps it while Slurm's restart count is past
    /// the run, and asks Slurm once, for both the shared and the staging
    /// store; a run Slurm did not requeue loses it.
    #[test]
    fn an_untried_image_is_kept_while_slurm_requeued_the_job_and_slurm_is_asked_once() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = Config { runtime_dir: dir.path().join("run"), ..Config::default() };
        cfg.preempt.image_dir = dir.path().join("images");
        cfg.preempt.staging_dir = Some(dir.path().join("staging"));
        cfg.slurm.scontrol = dir.path().join("scontrol");
        let (count, asked) = (dir.path().join("count"), dir.path().join("asked"));
        // RestartCnt from a file, every ask logged; the sweep's `%T`: PENDING.
        let squeue = format!(
            "#!/bin/sh\ncase \"$*\" in *RestartCnt*) echo x >> {asked}; cat {count};; *) echo PENDING;; esac\n",
            asked = asked.display(),
            count = count.display()
        );
        std::fs::write(dir.path().join("squeue"), squeue).unwrap();
        std::fs::set_permissions(dir.path().join("squeue"), std::fs::Permissions::from_mode(0o755)).unwrap();
        let image = |store: &ImageStore| {
            let run = store.prepare_run(7, 0).unwrap();
            std::fs::write(run.join(preempt::manifest::MANIFEST_FILE), b"{}").unwrap();
        };
        let (shared, local) = (ImageStore::new(&cfg.preempt.image_dir), ImageStore::new(dir.path().join("staging")));
        let asks = || std::fs::read_to_string(&asked).unwrap_or_default().lines().count();
        for (restarts, kept) in [("2", true), ("1", false)] {
            image(&shared);
            // Staged here, its copy recorded in the shared store.
            image(&local);
            shared.record_staged(7, 0, "n1").unwrap();
            std::fs::write(&count, restarts).unwrap();
            let before = asks();
            let detail = finish(&cfg, 7, Some(1)).unwrap().detail.unwrap();
            assert_eq!(asks() - before, 1, "{detail}");
            let line = "image of run 0 kept: run 1 never tried to restore it and the job is requeued";
            assert_eq!(detail.contains(line), kept, "{detail}");
            assert_eq!(detail.contains("staged image of run 0 kept: never tried, the job is requeued"), kept, "{detail}");
            assert_eq!(shared.latest(7).is_some(), kept, "{detail}");
            assert_eq!(local.latest(7).is_some(), kept, "{detail}");
            let _ = std::fs::remove_dir_all(shared.job_dir(7));
            let _ = std::fs::remove_dir_all(local.job_dir(7));
        }
        // Nothing untried (no image at all): Slurm is not asked.
        let before = asks();
        finish(&cfg, 7, Some(1)).unwrap();
        assert_eq!(asks(), before);
    }
}
