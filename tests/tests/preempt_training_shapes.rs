//! Training jobs as people write them (issue 24), on a real Slurm with the
//! job's agent and the real CRIU, the GPUs simulated:
//!
//! * Under `gpu-mode-run` the application gets the signals a plain run
//!   gets, fresh and after a restore. Seen on an H100 before the fix: the
//!   application and its forked DataLoader workers ran with the wrapper's
//!   own mask (HUP, INT, QUIT, USR1, USR2, TERM blocked), so Python could
//!   not end its workers with SIGTERM at exit and the job held its GPU
//!   until the time limit.
//! * A child forked without exec after the application's GPU memory was
//!   made (a DataLoader worker of the fork start method) is checkpointed and
//!   restored with the tree: the preloaded library made it drop the GPU
//!   files it inherited (hugepages/src/fork.rs). Before, the agent refused
//!   the tree and the job started over.
//!
//! Who runs the jobs, and the cluster: as tests/tests/preempt_checkpoint.rs
//! (its own cluster here; the scenarios take turns, [`serial`]).

use gpu_mode_tests::ckpt_jobs::*;
use gpu_mode_tests::shared::cluster_with;
use gpu_mode_tests::{Cluster, Preemption};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

fn c() -> Option<&'static Cluster> {
    criu_ready().then(|| cluster_with("preempt_training_shapes", 2, |s| s.preemption = Some(Preemption::default())))
}

fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The counter of `steps` steps with `extra` options.
fn counter_with(c: &Cluster, steps: u64, extra: &[&str]) -> Vec<String> {
    let mut app = counter_of(c, steps, 0, None);
    app.extend(extra.iter().map(|s| s.to_string()));
    app
}

/// Every `signals blocked=... ignored=...` line, and how many of them come
/// after gpu-mode-run's `restored` line.
fn signal_lines(out: &str) -> (Vec<&str>, usize) {
    let restored_at = out.lines().position(|l| l.starts_with("gpu-mode-run: job ") && l.contains(" restored (pid "));
    let mut lines = Vec::new();
    let mut after = 0;
    for (i, l) in out.lines().enumerate() {
        if l.starts_with("signals ") {
            lines.push(l);
            after += usize::from(restored_at.is_some_and(|r| i > r));
        }
    }
    (lines, after)
}

/// Preempts `job` (a counter of STEPS steps) after step 5 and waits for its
/// end: restored, COMPLETED with 0, every step once. Its output.
fn preempted_to_the_end(c: &Cluster, job: u32) -> String {
    wait_steps(c, job, 5);
    let preemptor = submit_preemptor(c, None, None, 2, 3);
    wait_requeued(c, job, 1);
    wait_finished(c, preemptor);
    let j = wait_finished(c, job);
    let out = c.job_output(job);
    assert!(out.contains(" restored (pid "), "not restored:\n{out}");
    assert_eq!((j.state(), j.get("ExitCode")), ("COMPLETED", "0:0"), "{out}");
    assert_counted_once(&out);
    out
}

#[test]
fn the_application_has_a_plain_runs_signal_state_fresh_and_restored() {
    let Some(c) = c() else { return };
    let _turn = serial();
    let who = job_user();
    let plain = submit_low_unwrapped(c, who, "sig-plain", &counter_with(c, 2, &["--signals", "yes"]));
    wait_finished(c, plain);
    let plain_out = c.job_output(plain);
    let (plain_lines, _) = signal_lines(&plain_out);
    assert!(plain_lines.len() == 2, "the plain run printed its signal state each step:\n{plain_out}");
    let expected = plain_lines[0];

    let ready = c.dir.join("out").join(format!("sig-wrapped-{}.ready", std::process::id()));
    let mut app = counter_with(c, STEPS, &["--signals", "yes"]);
    app.extend(["--ready".to_string(), ready.display().to_string()]);
    let out = preempted_to_the_end(c, submit_low(c, who, "sig-wrapped", &app));
    let (lines, after_restore) = signal_lines(&out);
    assert!(after_restore > 0, "no step after the restore printed its signal state:\n{out}");
    let differing: Vec<_> = lines.iter().filter(|l| **l != expected).collect();
    assert!(differing.is_empty(), "a plain run has `{expected}`; under gpu-mode-run {} of {} steps differ, e.g. `{}`", differing.len(), lines.len(), differing[0]);
}

/// A checkpoint signal that reaches the batch shell before gpu-mode-run
/// started (a job preempted as it starts; the churn saw such jobs end
/// FAILED 0:10 with no line of gpu-mode-run, the shell ended by SIGUSR1):
/// the plugin holds the signal back in the batch step, ignored and blocked
/// (signal_state::hold). bash keeps it pending, and gpu-mode-run
/// checkpoints on it as soon as it runs: requeued and restored. dash clears
/// its mask at start but keeps the signal ignored: dropped; sent by hand,
/// the job runs on; sent by a real preemption, gpu-mode-run finds the job
/// being preempted when it starts and checkpoints then (before, the job ran
/// to its grace time's end and started over). Either way the application
/// has a plain run's state for the signal (neither blocked nor ignored).
#[test]
fn a_checkpoint_signal_sent_before_gpu_mode_run_started_never_ends_the_batch_shell() {
    let Some(c) = c() else { return };
    let _turn = serial();
    let who = job_user();
    for (shell, preemption, restarts) in [("/bin/bash", false, 1), ("/bin/dash", false, 0), ("/bin/dash", true, 1)] {
        let app = counter_with(c, 40, &["--signals", "yes"]);
        let script = format!("#!{shell}\necho shell started\nsleep 8\n{}\n", batch_line(c, who, &app, true));
        let job = submit_low_script(c, who, "sig-early", &script, true).unwrap();
        wait_for("the batch shell", LONG, || c.job_output(job).contains("shell started"));
        let preemptor = if preemption {
            Some(submit_preemptor(c, None, None, 2, 3))
        } else {
            let sent = c.client("scancel", &["--signal=USR1", "--batch", &job.to_string()]).run_as_root().unwrap();
            assert!(sent.status.success(), "{}", String::from_utf8_lossy(&sent.stderr));
            None
        };
        let end = wait_finished(c, job);
        if let Some(p) = preemptor {
            wait_finished(c, p);
        }
        let shell = format!("{shell}{}", if preemption { " (a preemption)" } else { "" });
        let out = c.job_output(job);
        assert_eq!((end.state(), end.get("ExitCode"), end.restarts()), ("COMPLETED", "0:0", restarts), "{shell}:\n{out}");
        let checkpointed = out.contains(&format!("gpu-mode-run: SIGUSR1 received: checkpointing job {job}")) && out.contains(" restored (pid ");
        assert_eq!(checkpointed, restarts == 1, "{shell}:\n{out}");
        let caught_up = out.contains(&format!("job {job} was preempted before gpu-mode-run could take its checkpoint signal"));
        assert_eq!(caught_up, preemption, "{shell}: Slurm's preemption seen when gpu-mode-run started:\n{out}");
        if let Err(e) = counted_once(&out, 40) {
            panic!("{shell}: {e}:\n{out}");
        }
        let (lines, _) = signal_lines(&out);
        let usr1 = 1u64 << (libc::SIGUSR1 - 1);
        let held = |l: &&str| {
            let field = |k: &str| l.split_whitespace().find_map(|w| w.strip_prefix(k)).and_then(|v| u64::from_str_radix(v, 16).ok());
            field("blocked=").is_none_or(|b| b & usr1 != 0) || field("ignored=").is_none_or(|i| i & usr1 != 0)
        };
        assert!(!lines.is_empty() && !lines.iter().any(held), "{shell}: {lines:?}");
    }
}

/// Python's multiprocessing ends its workers with SIGTERM at exit and waits
/// for them: with SIGTERM blocked in the workers, such a job never ended.
#[test]
fn a_job_whose_forked_worker_ends_on_its_parents_sigterm_ends() {
    let Some(c) = c() else { return };
    let _turn = serial();
    let job = submit_low(c, job_user(), "sig-worker", &counter_with(c, 5, &["--fork-worker", "yes"]));
    let j = c.wait_job(job, "the job's end", Duration::from_secs(60), finished).unwrap_or_else(|e| {
        panic!("{e}: the application waits for its worker, which did not end on SIGTERM\n{}", c.job_output(job))
    });
    let out = c.job_output(job);
    assert_eq!((j.state(), j.get("ExitCode")), ("COMPLETED", "0:0"), "{out}");
    assert!(out.contains(&format!("ended by signal {}", libc::SIGTERM)), "{out}");
    assert!(out.contains("DONE count=5"), "{out}");
}

/// scancel's SIGTERM reaches the application, which may act on it (here:
/// say so and exit 143); before the fix it stayed blocked until Slurm's
/// SIGKILL.
#[test]
fn scancels_sigterm_reaches_the_application() {
    let Some(c) = c() else { return };
    let _turn = serial();
    let job = submit_low(c, job_user(), "sig-scancel", &counter_with(c, STEPS, &["--signals", "yes"]));
    wait_steps(c, job, 3);
    let cancel = c.client("scancel", &[&job.to_string()]).run_as_root().unwrap();
    assert!(cancel.status.success(), "{}", String::from_utf8_lossy(&cancel.stderr));
    let j = wait_finished(c, job);
    let out = c.job_output(job);
    assert_eq!(j.state(), "CANCELLED", "{out}");
    wait_for("the application's answer to SIGTERM", Duration::from_secs(10), || c.job_output(job).contains("received SIGTERM"));
}

/// A DataLoader-like worker forked after the GPU memory was made: the tree
/// is checkpointed with it, restored, and the worker, alive again, ends on
/// its parent's SIGTERM at the end; every step once.
#[test]
fn a_forked_worker_is_checkpointed_and_restored_with_its_parent() {
    let Some(c) = c() else { return };
    let _turn = serial();
    let out = preempted_to_the_end(c, submit_low(c, job_user(), "fork-worker", &counter_with(c, STEPS, &["--fork-worker", "yes"])));
    assert!(out.contains(&format!("ended by signal {}", libc::SIGTERM)), "the restored worker did not end on SIGTERM:\n{out}");
}
