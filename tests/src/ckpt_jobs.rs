//! Checkpoint jobs on a harness cluster with preemption
//! ([`crate::ClusterSpec::preemption`]), for the end-to-end tests: who runs
//! them, how they are submitted (as docs/checkpoint.md "What users do"
//! says), the simulated application, and what to wait for and look at.

use crate::{Cluster, JobInfo};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub const CRIU: &str = "/opt/slurm-gpu-mode/criu/bin/criu";
/// Steps of the counter: 100 ms each, so a job runs about 6 s in all.
pub const STEPS: u64 = 60;
/// The application's exit code, which the job must end with.
pub const EXIT: i32 = 7;
/// Generous: two cores shared with other builds; a requeued job waits
/// cred_expire + 1 = 11 s before it may start again.
pub const LONG: Duration = Duration::from_secs(120);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Who {
    User(&'static str),
    CaplessRoot,
}

/// Who runs checkpoint jobs: the test user gmtest1, as in production (CRIU
/// runs as the job's user, so root's own capabilities do not matter). Root
/// without capabilities only where GPU_MODE_TEST_JOBS_AS_ROOT=1 asks for it;
/// the running test is then noted SUBSTITUTED (CI's log and count show it).
pub fn job_user() -> Who {
    if !gpu_mode_testkit::required("GPU_MODE_TEST_JOBS_AS_ROOT") {
        return Who::User("gmtest1");
    }
    gpu_mode_testkit::substituted(
        &gpu_mode_testkit::this_test(),
        "checkpoint jobs run as root without capabilities instead of the test user gmtest1: GPU_MODE_TEST_JOBS_AS_ROOT=1",
    );
    Who::CaplessRoot
}

pub fn bin(c: &Cluster, name: &str) -> String {
    c.spec.artifacts.prolog.parent().unwrap().join(name).display().to_string()
}

pub fn submitter(who: Who) -> Option<&'static str> {
    match who {
        Who::User(u) => Some(u),
        Who::CaplessRoot => None,
    }
}

/// The counter's arguments (its pid goes to `ready` after step 1).
pub fn counter(c: &Cluster, ready: &Path) -> Vec<String> {
    counter_of(c, STEPS, EXIT, Some(ready))
}

/// A counter of `steps` steps of 100 ms holding 8 MiB of simulated GPU
/// memory, which exits with `exit` (its pid goes to `ready` after step 1).
pub fn counter_of(c: &Cluster, steps: u64, exit: i32, ready: Option<&Path>) -> Vec<String> {
    let mut a = vec![bin(c, "cuda-sim-counter")];
    for w in ["--steps", &steps.to_string(), "--interval-ms", "100", "--mib", "8", "--exit-code", &exit.to_string()] {
        a.push(w.to_string());
    }
    if let Some(r) = ready {
        a.extend(["--ready".to_string(), r.display().to_string()]);
    }
    a
}

/// Submits a checkpoint job on `low` whose batch shell is `gpu-mode-run app`,
/// as the user submits it (docs/checkpoint.md "What users do").
pub fn submit_low(c: &Cluster, who: Who, name: &str, app: &[String]) -> u32 {
    try_submit_low(c, who, name, app).unwrap()
}

/// [`submit_low`], with sbatch's refusal as an error.
pub fn try_submit_low(c: &Cluster, who: Who, name: &str, app: &[String]) -> anyhow::Result<u32> {
    submit_low_as(c, who, name, app, true)
}

/// The same job without slurm-gpu-mode (no `--gpu-mode`, `app` as the
/// batch shell itself, without gpu-mode-run): the plain run the wrapped one
/// must look like to the application. (A checkpoint job's batch step has
/// the checkpoint signal blocked by the plugin until gpu-mode-run takes it,
/// signal_state::hold.)
pub fn submit_low_unwrapped(c: &Cluster, who: Who, name: &str, app: &[String]) -> u32 {
    submit_low_as(c, who, name, app, false).unwrap()
}

/// The batch script is bash's, as most sites' job scripts are: bash keeps
/// the checkpoint signal the plugin holds back pending until gpu-mode-run
/// takes it, so a preemption as the job starts is checkpointed (with dash
/// it is dropped and Slurm requeues the job at its grace time's end to
/// start over; preempt_training_shapes.rs tests both).
fn submit_low_as(c: &Cluster, who: Who, name: &str, app: &[String], wrapped: bool) -> anyhow::Result<u32> {
    submit_low_script(c, who, name, &format!("#!/bin/bash\n{}\n", batch_line(c, who, app, wrapped)), wrapped)
}

/// The batch script's line that runs `app`, under gpu-mode-run if
/// `wrapped`. exec: the wrapper must be the batch shell, which --signal=B:
/// reaches.
pub fn batch_line(c: &Cluster, who: Who, app: &[String], wrapped: bool) -> String {
    let mut words: Vec<String> = vec!["exec".into()];
    if who == Who::CaplessRoot {
        // Root without capabilities stands in for a user (module docs).
        words.extend(["/usr/bin/setpriv", "--bounding-set=-all", "--inh-caps=-all", "--"].map(String::from));
    }
    if wrapped {
        let config = c.dir.join("gpu-mode.toml").display().to_string();
        words.extend([bin(c, "gpu-mode-run"), "--config".into(), config, "--".into()]);
    }
    words.extend(app.iter().cloned());
    words.join(" ")
}

/// Submits `script` as a job on `low` with the checkpoint job's options
/// (`--gpu-mode=checkpoint` when `checkpoint`).
pub fn submit_low_script(c: &Cluster, who: Who, name: &str, script: &str, checkpoint: bool) -> anyhow::Result<u32> {
    submit_low_mode_script(c, who, name, script, checkpoint.then_some("checkpoint"))
}

/// [`submit_low_script`] with `--gpu-mode=<mode>` when `mode` is given.
pub fn submit_low_mode_script(c: &Cluster, who: Who, name: &str, script: &str, mode: Option<&str>) -> anyhow::Result<u32> {
    let mut args = vec!["-J", name, "-p", "low", "--signal=B:USR1@60", "--requeue", "--open-mode=append", "--gres=gpu:1"];
    let option = mode.map(|m| format!("--gpu-mode={m}"));
    args.extend(option.as_deref());
    c.submit(submitter(who), &args, script, &c.sim_job_env())
}

/// A checkpoint job as [`submit_low`] submits it, with `--gpu-mode=<mode>`
/// and the batch script exporting `exports` before it runs gpu-mode-run.
pub fn submit_low_mode(c: &Cluster, who: Who, name: &str, app: &[String], mode: &str, exports: &[(&str, &str)]) -> anyhow::Result<u32> {
    let lines: String = exports.iter().map(|(k, v)| format!("export {k}={v}\n")).collect();
    let script = format!("#!/bin/bash\n{lines}{}\n", batch_line(c, who, app, true));
    submit_low_mode_script(c, who, name, &script, Some(mode))
}


/// Submits the counter as `name` ([`submit_low`]) and waits for its first
/// `n` steps; returns the job and the counter's ready file (its pid).
pub fn start_counter(c: &Cluster, who: Who, name: &str, n: u64) -> (u32, PathBuf) {
    let ready = c.dir.join("out").join(format!("{name}-{}.ready", std::process::id()));
    let job = submit_low(c, who, name, &counter(c, &ready));
    wait_steps(c, job, n);
    (job, ready)
}

/// Every step 1..=STEPS exactly once, in order, and the final check passed.
pub fn assert_counted_once(out: &str) {
    if let Err(e) = counted_once(out, STEPS) {
        panic!("{e}:\n{out}");
    }
}

/// Whether a counter of `n` steps counted every step 1..=n exactly once, in
/// order, and its final check passed; what is wrong when not.
pub fn counted_once(out: &str, n: u64) -> Result<(), String> {
    let counted: Vec<u64> = steps(out).iter().map(|s| s.0).collect();
    if counted != (1..=n).collect::<Vec<_>>() {
        return Err(format!("not every step exactly once: {counted:?}"));
    }
    if !out.contains(&format!("DONE count={n}")) || out.contains("MISMATCH") {
        return Err(format!("no `DONE count={n}`, or a MISMATCH"));
    }
    Ok(())
}

/// A high-priority job taking `gpus` GPUs (all of a node's: it must
/// preempt) for `secs`, on `node` if given.
pub fn submit_preemptor(c: &Cluster, user: Option<&str>, node: Option<&str>, gpus: u32, secs: u32) -> u32 {
    let script = format!("#!/bin/sh\necho preemptor $(id -un) on GPUs $CUDA_VISIBLE_DEVICES\nsleep {secs}\n");
    let gres = format!("--gres=gpu:{gpus}");
    let mut args = vec!["-J", "preemptor", "-p", "high", &gres];
    if let Some(n) = node {
        args.extend(["-w", n]);
    }
    c.submit(user, &args, &script, &[]).unwrap()
}

/// The harness's two slurmd nodes, each in namespaces of its own
/// ([`crate::ClusterSpec::second_node`]).
pub const TWO_NODES: [&str; 2] = ["gma", "gmb"];

/// This test binary's cluster `name` of [`TWO_NODES`] with `gpus` GPUs
/// each and preemption, when CRIU works here ([`criu_ready`]).
pub fn two_node_cluster(name: &str, gpus: u32) -> Option<&'static Cluster> {
    criu_ready().then(|| {
        crate::shared::cluster_with(name, gpus, |s| {
            s.preemption = Some(crate::Preemption::default());
            s.node_name = TWO_NODES[0].into();
            s.second_node = Some(TWO_NODES[1].into());
        })
    })
}

/// Whether CRIU works here. When not, the running test is noted SKIPPED
/// (CI's log and count show it), or fails where CRIU is required
/// (GPU_MODE_REQUIRE_CRIU=1, as scripts/test.sh sets: a skip there would
/// hide the feature).
pub fn criu_ready() -> bool {
    if std::process::Command::new(CRIU).arg("check").output().is_ok_and(|o| o.status.success()) {
        return true;
    }
    skip_unless_required(&format!("{CRIU} missing or `criu check` fails: run scripts/install-criu.sh"));
    false
}

/// Whether slurmdbd and MariaDB are installed here
/// ([`crate::ClusterSpec::accounting_db`]); when not, as [`criu_ready`]:
/// SKIPPED, or a failure where GPU_MODE_REQUIRE_CRIU=1 (scripts/test.sh
/// installs them with the rest).
pub fn accounting_db_ready() -> bool {
    let missing = match crate::SlurmInstall::detect() {
        Ok(install) => crate::accounting_db::missing_programs(&install),
        Err(e) => Some(format!("{e:#}")),
    };
    match missing {
        None => true,
        Some(why) => {
            skip_unless_required(&why);
            false
        }
    }
}

/// Notes the running test SKIPPED for `why`, or fails it where the tests'
/// needs are required (GPU_MODE_REQUIRE_CRIU=1, as CI sets).
fn skip_unless_required(why: &str) {
    if gpu_mode_testkit::required("GPU_MODE_REQUIRE_CRIU") {
        panic!("required here (GPU_MODE_REQUIRE_CRIU): {why}");
    }
    gpu_mode_testkit::skipped(&gpu_mode_testkit::this_test(), why);
}

/// `(step, GPU UUID)` of every `step <n> gpu <uuid>` line of the output.
pub fn steps(output: &str) -> Vec<(u64, String)> {
    output
        .lines()
        .filter_map(|l| {
            let mut w = l.strip_prefix("step ")?.split(' ');
            Some((w.next()?.parse().ok()?, w.nth(1)?.to_string()))
        })
        .collect()
}

pub fn last_step(c: &Cluster, job: u32) -> u64 {
    steps(&c.job_output(job)).last().map_or(0, |s| s.0)
}

pub fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "timed out after {limit:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn wait_steps(c: &Cluster, job: u32, n: u64) {
    let start = Instant::now();
    while last_step(c, job) < n {
        if start.elapsed() > LONG {
            panic!("job {job} did not reach step {n}: {:?}\n{}\n{}", c.job(job).ok(), c.job_output(job), c.logs_tail());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn finished(j: &JobInfo) -> bool {
    ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"].contains(&j.state())
}

pub fn wait_finished(c: &Cluster, job: u32) -> JobInfo {
    c.wait_job(job, "the job's end", LONG, finished).unwrap()
}

/// Waits until the job is back in the queue after run `restarts - 1`.
pub fn wait_requeued(c: &Cluster, job: u32, restarts: u32) -> JobInfo {
    c.wait_job(job, "the requeue", LONG, |j| j.state() == "PENDING" && j.restarts() == restarts).unwrap()
}

pub fn images(c: &Cluster) -> PathBuf {
    c.dir.join("images")
}

/// Checkpoint agents of this cluster serving `job`.
pub fn agents(c: &Cluster, job: u32) -> Vec<i32> {
    let config = c.dir.join("gpu-mode.toml").display().to_string();
    let job = job.to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let argv = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let argv: Vec<String> = argv.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
            argv.first().is_some_and(|a| a.ends_with("gpu-mode-ckpt-agent"))
                && argv.windows(2).any(|w| w[0] == "--job" && w[1] == job)
                && argv.contains(&config)
        })
        .collect()
}

pub fn assert_images_removed(c: &Cluster, job: u32) {
    let dir = images(c).join(job.to_string());
    wait_for("the epilog to remove the job's images", Duration::from_secs(20), || !dir.exists());
}


/// The job's AdminComment as the agent reads it: squeue printing that field
/// alone (empty if none).
pub fn admin_comment(c: &Cluster, job: u32) -> String {
    use gpu_mode_core::preempt::accounting::{squeue_value, AccountingField};
    let format = gpu_mode_core::preempt::accounting::squeue_format(AccountingField::AdminComment).unwrap();
    let out = c.client("squeue", &["-h", "-t", "all", "-j", &job.to_string(), "-O", &format]).run_as_root().unwrap();
    assert!(out.status.success(), "squeue: {}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect();
    squeue_value(&lines).unwrap()
}

/// The checkpoint/restore events the agent recorded in the job's
/// AdminComment, each as `<kind>=r<run>@<node>` (its timing cut off), and
/// the whole value.
pub fn recorded_events(c: &Cluster, job: u32) -> (Vec<String>, String) {
    let comment = admin_comment(c, job);
    (events_in(&comment), comment)
}

/// The events of an AdminComment's `gpu-mode{...}` section, each as
/// `<kind>=r<run>@<node>` (its timing cut off).
pub fn events_in(comment: &str) -> Vec<String> {
    let section = comment.split_once(gpu_mode_core::preempt::accounting::SECTION_START).map_or("", |(_, s)| s);
    section
        .trim_end_matches('}')
        .split(';')
        .filter(|e| !e.is_empty() && !e.starts_with("omitted="))
        .map(|e| e.rsplit_once(':').map_or(e, |(head, _)| head).to_string())
        .collect()
}
