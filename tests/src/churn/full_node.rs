//! The preemption every churn run has, whatever its draws. Slurm preempts
//! a `low` job only when the node has no free GPU, and the churn's random
//! preemptors do not find it full every run (seen 2026-11-25: four
//! preemptors, none preempted). So first the node is held full: `GPUS - 1`
//! `debug` fillers and one checkpoint job, each seen running; then a
//! one-GPU preemptor on `high`, which Slurm can start only by preempting
//! the checkpoint job. The fillers end once the product says the job's
//! checkpoint began, and the random churn follows.
//!
//! A second checkpoint job beside it keeps a file of its user's open, and
//! the preemptor takes two GPUs, so both are preempted: once that job was
//! checkpointed its file is swapped for a link to a root-owned file (the
//! path-swap attack, [`super::swap`]), and its restore must be refused
//! while the first job's succeeds (only where the jobs run as a user).
//!
//! What is judged is what the product did: `gpu-mode-run`'s lines in the
//! job's output (the signal, the checkpoint, the restore), the agent's
//! events in the job's AdminComment, the epilog's image lines, and the
//! application's own count and exit code.

use super::swap::{self, Bait};
use super::GPUS;
use crate::ckpt_jobs::{self, Who};
use crate::{Cluster, JobInfo};
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The checkpoint job's steps (100 ms each): long enough that it is still
/// counting when the preemptor comes on a loaded node (the signal came
/// within 2 s of the preemptor's submission here), short enough that its
/// restored runs end while the churn goes on (at 150 steps, preempted
/// twice, it was the churn's last job: 57 s against 40 s without it).
const STEPS: u64 = 60;
/// Steps the job must have counted before the preemptor is submitted: the
/// application runs under `gpu-mode-run`, its agent up.
const STEPS_BEFORE: u64 = 3;
/// How long Slurm may take to start the jobs, or to preempt.
const LIMIT: Duration = Duration::from_secs(120);

/// The jobs of the scene.
#[derive(Debug, Clone)]
pub struct FullNode {
    /// The checkpoint job that must be preempted and restored.
    pub job: u32,
    pub fillers: Vec<u32>,
    pub preemptor: u32,
    /// The second checkpoint job and its file, swapped once it was
    /// checkpointed (where the jobs run as a user).
    pub swapped: Option<(u32, Bait)>,
    /// Its presence ends the fillers.
    release: PathBuf,
    /// From the first filler's submission to their release: what the
    /// scene adds to the churn's time.
    pub took: Duration,
}

impl FullNode {
    /// Fills the node, submits the preemptor and waits until the product
    /// says the checkpoint job is being checkpointed; then lets the
    /// fillers end.
    pub fn preempt(c: &Cluster, who: Who) -> Result<FullNode> {
        let start = Instant::now();
        let release = c.dir.join("out").join(format!("full-node-release-{}", crate::unique_suffix()));
        let wait = format!("#!/bin/sh\nwhile [ ! -e {} ]; do sleep 0.1; done\n", release.display());
        let fillers = (2..GPUS)
            .map(|i| c.sbatch(None, &[&format!("--job-name=full-node-filler-{i}"), "--gres=gpu:1"], &wait))
            .collect::<Result<Vec<u32>>>()?;
        // The training shape (issue 24): a worker forked after the GPU was
        // in use, holding the (simulated) driver's files, lives through the
        // preemption as a DataLoader worker does.
        let mut app = ckpt_jobs::counter_of(c, STEPS, ckpt_jobs::EXIT, None);
        app.extend(["--fork-worker".to_string(), "yes".to_string()]);
        let job = ckpt_jobs::try_submit_low(c, who, "full-node-checkpoint", &app)?;
        let mut second = ckpt_jobs::counter_of(c, STEPS, ckpt_jobs::EXIT, None);
        let bait = match who {
            Who::User(user) => Some(swap::prepare(c, user, "full-node-swap")?),
            Who::CaplessRoot => None,
        };
        if let Some(b) = &bait {
            second.extend(["--keep-open".to_string(), b.path.display().to_string()]);
        }
        let other = ckpt_jobs::try_submit_low(c, who, "full-node-swap", &second)?;
        for &f in &fillers {
            c.wait_job(f, "a filler to run", LIMIT, |j| j.state() == "RUNNING")?;
        }
        for j in [job, other] {
            wait_output(c, j, "its first steps", |out| ckpt_jobs::steps(out).len() as u64 >= STEPS_BEFORE)?;
        }
        let preemptor = c.sbatch(None, &["--job-name=full-node-preemptor", "-p", "high", "--gres=gpu:2"], "#!/bin/sh\nsleep 1\n")?;
        let signalled = |j: u32| format!("gpu-mode-run: SIGUSR1 received: checkpointing job {j}");
        let seen = wait_output(c, job, "the preemption's signal", |out| out.contains(&signalled(job)));
        let seen = seen.and_then(|_| wait_output(c, other, "the preemption's signal", |out| out.contains(&signalled(other))));
        // Released whatever happened: a failed scene must not hold the node.
        std::fs::write(&release, "").context("releasing the fillers")?;
        seen?;
        let swapped = match bait {
            Some(b) => {
                let never = std::sync::atomic::AtomicBool::new(false);
                swap::swap_when_checkpointed(c, other, &b, who, &never)?.then_some((other, b))
            }
            None => None,
        };
        Ok(FullNode { job, fillers, preemptor, swapped, release, took: start.elapsed() })
    }

    /// What is wrong with the scene's outcome, once every job ended: the
    /// job preempted (checkpointed in run 0) and restored, each step
    /// counted once, the application's exit code; fillers and preemptor
    /// completed.
    pub fn problems(&self, c: &Cluster) -> Vec<String> {
        let _ = std::fs::remove_file(&self.release);
        let mut p = Vec::new();
        for &id in self.fillers.iter().chain([&self.preemptor]) {
            if let Some(why) = not_completed(c, id) {
                p.push(format!("full node: job {id}: {why}"));
            }
        }
        p.extend(self.job_problems(c).into_iter().map(|why| format!("full node: checkpoint job {}: {why}\n{}", self.job, self.evidence(c))));
        if let Some((id, bait)) = &self.swapped {
            if let Some(why) = swap::judge(&id.to_string(), &c.job_output(*id), bait) {
                p.push(format!("full node: swapped job {id}: {why}\n{}", c.job_output(*id)));
            }
        }
        p
    }

    /// The job's output without the application's step lines (the count's
    /// problem names those), then the product's hook lines for it: what a
    /// failed CI run keeps of the scene.
    fn evidence(&self, c: &Cluster) -> String {
        let out = c.job_output(self.job);
        let lines: Vec<&str> = out.lines().filter(|l| !l.starts_with("step ")).collect();
        format!("{}\nhooks:\n{}", lines.join("\n"), c.hook_log_lines(self.job).join("\n"))
    }

    /// The swapped job, whose image is kept after its refused restore.
    pub fn kept_image(&self) -> Option<String> {
        self.swapped.as_ref().map(|(id, _)| id.to_string())
    }

    /// The line of the churn's report.
    pub fn summary(&self, c: &Cluster) -> String {
        let info = c.job(self.job).unwrap_or_else(|_| JobInfo::default());
        format!(
            "full node: checkpoint job {} preempted by job {} with {} fillers ({:.0} s before the churn); ended {} exit {} after {} restarts{}",
            self.job,
            self.preemptor,
            self.fillers.len(),
            self.took.as_secs_f64(),
            info.state(),
            info.get("ExitCode"),
            info.restarts(),
            self.swapped.as_ref().map_or(String::new(), |(id, _)| {
                let state = c.job(*id).map(|i| i.state().to_string()).unwrap_or_default();
                format!("; job {id}, its file swapped for a root file after its checkpoint, ended {state}")
            })
        )
    }

    fn job_problems(&self, c: &Cluster) -> Vec<String> {
        let job = self.job;
        let info = match c.job(job) {
            Ok(info) => info,
            Err(e) => return vec![format!("{e:#}")],
        };
        let mut p = Vec::new();
        let want_exit = format!("{}:0", ckpt_jobs::EXIT);
        if info.get("ExitCode") != want_exit || info.restarts() == 0 {
            p.push(format!("ended {} exit {} after {} restarts; wanted the application's exit {want_exit} after at least one", info.state(), info.get("ExitCode"), info.restarts()));
        }
        let out = c.job_output(job);
        if let Err(e) = ckpt_jobs::counted_once(&out, STEPS) {
            p.push(e);
        }
        for needle in [format!("gpu-mode-run: job {job} checkpointed: "), format!("gpu-mode-run: job {job} restored (pid ")] {
            if !out.contains(&needle) {
                p.push(format!("gpu-mode-run never said {needle:?}"));
            }
        }
        // Run 0's checkpoint, restored by a later run: run 1, or a later
        // one where run 1 did not get to restore (Slurm started it without
        // its prolog and it was requeued again: core::skipped_prolog).
        let restoring_run_0 = |l: &str| l.strip_prefix(&format!("gpu-mode-run: job {job} run ")).is_some_and(|r| r.contains(": restoring the checkpoint taken in run 0 "));
        if !out.lines().any(restoring_run_0) {
            p.push("gpu-mode-run never said that a run restored the checkpoint taken in run 0".into());
        }
        p.extend(recorded_problems(c, job));
        p
    }
}

/// The agent's events in the AdminComment (the run-0 checkpoint first,
/// then a later run's restore of it) and the epilog's lines about the
/// images.
fn recorded_problems(c: &Cluster, job: u32) -> Vec<String> {
    let mut p = Vec::new();
    let node = &c.spec.node_name;
    let (events, comment) = ckpt_jobs::recorded_events(c, job);
    let ckpt = format!("ckpt=r0@{node}");
    let restored = events.get(1).is_some_and(|e| e.starts_with("restore=r") && e.ends_with(&format!("@{node}")));
    if events.first() != Some(&ckpt) || !restored {
        p.push(format!("the agent recorded {events:?} (wanted {ckpt} first, then a restore): {comment}"));
    }
    let hooks = c.hook_log_lines(job).join("\n");
    for needle in ["image of run 0 kept for the requeued job", "the job's images removed"] {
        if !hooks.contains(needle) {
            p.push(format!("no epilog said {needle:?}:\n{hooks}"));
        }
    }
    p
}

/// Why job `id` did not complete with exit 0, if it did not.
fn not_completed(c: &Cluster, id: u32) -> Option<String> {
    match c.job(id) {
        Ok(i) if i.state() == "COMPLETED" && i.get("ExitCode") == "0:0" => None,
        Ok(i) => Some(format!("{} exit {} reason {}", i.state(), i.get("ExitCode"), i.get("Reason"))),
        Err(e) => Some(format!("{e:#}")),
    }
}

/// Waits until job `id`'s output satisfies `f`; an error with the job and
/// the logs when it ended first or after [`LIMIT`].
fn wait_output(c: &Cluster, id: u32, what: &str, f: impl Fn(&str) -> bool) -> Result<()> {
    let start = Instant::now();
    loop {
        if f(&c.job_output(id)) {
            return Ok(());
        }
        let info = c.job(id).unwrap_or_default();
        if ckpt_jobs::finished(&info) || start.elapsed() > LIMIT {
            bail!("full node: job {id} never showed {what} ({} after {:?})\n{}\n{}", info.state(), start.elapsed(), c.job_output(id), c.logs_tail());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
