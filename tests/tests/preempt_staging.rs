//! `--gpu-mode=checkpoint` with the node-local staging tier
//! (`preempt.staging_dir`, core::preempt::staging) on two slurmd nodes
//! (`gma`, `gmb`, as in preempt_other_node.rs: each with its own runtime
//! directory, where the staging directory is, and the image directory
//! shared). The dump lands on the node, the job is requeued, and the agent
//! copies the image to the shared directory in the background, bounded to
//! 1 MiB/s here so that the copy of the counter's ~10 MiB image takes about
//! 10 s. A job requeued onto its node restores the node-local copy; one
//! requeued onto the other node waits for the shared copy and restores it;
//! one whose staging node "dies" during the copy (its agent killed) starts
//! over on the other node, and nothing is restored from half a copy. Who
//! runs the job: as in preempt_checkpoint.rs. Needs root, `ip`, CRIU 4 and
//! `cargo build --workspace`.

use gpu_mode_core::preempt::manifest::Manifest;
use gpu_mode_tests::ckpt_jobs::*;
use gpu_mode_tests::shared::cluster_with;
use gpu_mode_tests::{Cluster, Preemption};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

const NODES: [&str; 2] = ["gma", "gmb"];
/// `staging_wait_s`: also the bound on a copy that makes no progress.
const STAGING_WAIT_S: u64 = 20;

fn c() -> Option<&'static Cluster> {
    criu_ready().then(|| {
        cluster_with("preempt_staging", 2, |s| {
            s.preemption = Some(Preemption::default());
            s.node_name = NODES[0].into();
            s.second_node = Some(NODES[1].into());
            // The last table of the generated config is [preempt]. The
            // cluster's run/ is each node's own (bind-mounted in its namespace).
            s.extra_gpu_mode_config = format!(
                "staging_dir = \"{}\"\nstaging_wait_s = {STAGING_WAIT_S}\nstaging_copy_mib_per_s = 1\n",
                s.dir.join("run/staging").display()
            );
        })
    })
}

fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Node `node`'s staging directory for `job`, as this (outside) process sees it.
fn staged_on(c: &Cluster, node: &str, job: u32) -> PathBuf {
    c.spec.node_dir(node).join("run/staging").join(job.to_string())
}

/// The agents of `job`'s run `run` (the one that dumped and copies).
fn agents_of_run(c: &Cluster, job: u32, run: u32) -> Vec<i32> {
    agents(c, job)
        .into_iter()
        .filter(|pid| {
            let argv = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let argv: Vec<String> = argv.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
            argv.windows(2).any(|w| w[0] == "--restart-count" && w[1] == run.to_string())
        })
        .collect()
}

fn cancel(c: &Cluster, job: u32) {
    let _ = c.client("scancel", &[&job.to_string()]).run_as(Some("gmtest2"));
}

/// Run 1 of `job` ended on `node` with the application's exit code,
/// restored from run 0's image taken on gma (gma's node-local copy, or the
/// shared one), and counted every step once.
fn assert_restored_on(c: &Cluster, job: u32, node: &str, local_copy: bool) {
    let end = wait_finished(c, job);
    let out = c.job_output(job);
    assert_eq!((end.get("NodeList"), end.get("ExitCode"), end.restarts()), (node, format!("{EXIT}:0").as_str(), 1), "{out}");
    assert!(out.contains(&format!("gpu-mode-run: job {job} run 1: restoring the checkpoint taken in run 0 on gma")), "{out}");
    let from = if local_copy { "image from gma's node-local copy)" } else { "image from gma)" };
    assert!(out.contains(from), "restored from {from}:\n{out}");
    assert_counted_once(&out);
    let (events, comment) = recorded_events(c, job);
    assert_eq!(events, ["ckpt=r0@gma".to_string(), format!("restore=r1@{node}")], "{comment}");
}

/// The job's agents (the copying one included) exit, its shared images are
/// removed, and neither node is drained.
fn assert_all_gone(c: &Cluster, job: u32) {
    wait_for("the agents to exit", Duration::from_secs(40), || agents(c, job).is_empty());
    assert_images_removed(c, job);
    for node in NODES {
        let (state, reason) = c.node_state_of(node).unwrap();
        assert!(!state.contains("DRAIN") && !state.contains("DOWN"), "{node}: {state} {reason}");
    }
}

/// Preempted on gma with gmb busy: the requeued run comes back to gma and
/// restores gma's own staged copy (whether or not its copy to the shared
/// directory is done); both copies are consumed and removed at the end.
#[test]
fn a_job_requeued_onto_its_node_restores_the_node_local_copy() {
    let Some(c) = c() else { return };
    let _turn = serial();
    let who = job_user();
    let (job, _) = start_counter(c, who, "local", 5);
    assert_eq!(c.job(job).unwrap().get("NodeList"), NODES[0], "an idle cluster starts it on the first node");
    // gmb is taken for the whole test; gma only for a moment.
    let blocker = submit_preemptor(c, Some("gmtest2"), Some(NODES[1]), 2, 120);
    c.wait_job(blocker, "the blocker on gmb", LONG, |j| j.state() == "RUNNING").unwrap();
    let preemptor = submit_preemptor(c, Some("gmtest2"), Some(NODES[0]), 2, 3);
    wait_requeued(c, job, 1);
    // Durable on gma when the job was requeued, and recorded in the shared directory.
    let local = staged_on(c, NODES[0], job).join("0");
    let m = Manifest::load(&local).unwrap_or_else(|e| panic!("no staged image on gma: {e}"));
    assert_eq!(m.node, NODES[0]);
    let record = images(c).join(job.to_string()).join("staged-0");
    assert_eq!(std::fs::read_to_string(&record).unwrap().trim(), NODES[0]);

    assert_restored_on(c, job, NODES[0], true);
    cancel(c, blocker);
    cancel(c, preemptor);
    // The run-0 agent finishes (or drops) its copy and exits; the end of the
    // job removes both tiers.
    assert_all_gone(c, job);
    assert!(!staged_on(c, NODES[0], job).exists(), "the end of the job removes gma's staged copy");
}

/// Preempted on gma while the preemptor keeps gma: the requeued run on gmb
/// starts while the shared copy is still under way (20 MiB of simulated GPU
/// memory: a ~22 MiB image, ~22 s at 1 MiB/s, against the requeued run's
/// start after ~11 s), waits for it and restores it.
#[test]
fn a_job_requeued_onto_another_node_waits_for_the_shared_copy_and_restores_it() {
    let Some(c) = c() else { return };
    let _turn = serial();
    let who = job_user();
    let mut app = counter_of(c, STEPS, EXIT, None);
    let mib = app.iter().position(|a| a == "--mib").unwrap() + 1;
    app[mib] = "20".into();
    let job = submit_low(c, who, "moved", &app);
    wait_steps(c, job, 5);
    assert_eq!(c.job(job).unwrap().get("NodeList"), NODES[0]);
    let preemptor = submit_preemptor(c, Some("gmtest2"), Some(NODES[0]), 2, 60);
    wait_requeued(c, job, 1);
    assert!(Manifest::load(&staged_on(c, NODES[0], job).join("0")).is_ok(), "staged on gma");
    c.wait_job(job, "the run on gmb", LONG, |j| j.state() == "RUNNING" && j.restarts() == 1).unwrap();
    let shared = images(c).join(job.to_string());
    assert!(!shared.join("0").exists() && shared.join(".copy-0-gma").exists(), "the copy is still under way as run 1 starts");

    assert_restored_on(c, job, NODES[1], false);
    cancel(c, preemptor);
    assert_all_gone(c, job);
}

/// gma "dies" during the copy: its agent (which copies) is killed while the
/// copy is half done. The run on gmb waits for a copy that makes no more
/// progress, gives up after `staging_wait_s`, says so, and starts over;
/// the half copy never becomes an image.
#[test]
fn a_node_that_dies_during_the_copy_makes_the_job_start_over_elsewhere() {
    let Some(c) = c() else { return };
    let _turn = serial();
    let who = job_user();
    let (job, _) = start_counter(c, who, "died", 5);
    assert_eq!(c.job(job).unwrap().get("NodeList"), NODES[0]);
    let preemptor = submit_preemptor(c, Some("gmtest2"), Some(NODES[0]), 2, 90);
    wait_requeued(c, job, 1);
    let dumped_at = last_step(c, job);
    let shared = images(c).join(job.to_string());
    let partial = shared.join(".copy-0-gma");
    wait_for("the copy to be under way", Duration::from_secs(20), || gpu_mode_core::preempt::images::tree_bytes(&partial) > 0);
    let copying = agents_of_run(c, job, 0);
    assert_eq!(copying.len(), 1, "one agent of run 0 copies: {copying:?}");
    // SAFETY: a plain kill of the agent process found above (this test's cluster).
    assert_eq!(unsafe { libc::kill(copying[0], libc::SIGKILL) }, 0);
    wait_for("the killed agent to go", Duration::from_secs(10), || agents_of_run(c, job, 0).is_empty());
    assert!(partial.exists() && !shared.join("0").exists(), "half a copy under its temporary name, no image");

    let end = wait_finished(c, job);
    cancel(c, preemptor);
    let out = c.job_output(job);
    assert_eq!((end.get("NodeList"), end.get("ExitCode"), end.restarts()), (NODES[1], format!("{EXIT}:0").as_str(), 1), "{out}");
    let line = out.lines().find(|l| l.contains(&format!("job {job} run 1: the copy of run 0's image from gma"))).unwrap_or_else(|| panic!("{out}"));
    assert!(
        line.contains("made no progress for")
            && line.ends_with("nothing is restored from a partial copy: starting the application from the beginning"),
        "{line}"
    );
    assert!(!out.contains("restored (pid"), "nothing was restored:\n{out}");
    // Run 1 counted every step from the first, on gmb's GPU.
    let all = steps(&out);
    let run1: Vec<u64> = all.iter().skip_while(|s| s.0 != dumped_at).skip(1).map(|s| s.0).collect();
    assert_eq!(run1, (1..=STEPS).collect::<Vec<_>>(), "run 1 starts over:\n{out}");
    assert!(out.contains(&format!("DONE count={STEPS}")) && !out.contains("MISMATCH"), "{out}");
    let (events, comment) = recorded_events(c, job);
    assert_eq!(events, ["ckpt=r0@gma"], "no restore: {comment}");
    // The end of the job on gmb removes the shared directory, half copy included.
    assert_all_gone(c, job);
}
