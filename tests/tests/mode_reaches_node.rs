//! The validated mode travels submit → Prolog/Epilog (SPANK_GPU_MODE) → job
//! state → every task (the plugin in slurmstepd), and the Epilog cleans up.

use gpu_mode_tests::shared::cluster;
use gpu_mode_tests::Cluster;

fn c() -> &'static Cluster {
    cluster("mode_reaches_node", 4)
}

fn state_file(job: u32) -> std::path::PathBuf {
    c().runtime_dir().join(format!("jobs/{job}.json"))
}

/// Hook lines are written after the job's end is reported; give the epilog a moment.
fn wait_for_epilog_line(job: u32) -> Vec<String> {
    for _ in 0..100 {
        let lines = c().hook_log_lines(job);
        if lines.iter().any(|l| l.contains("action=epilog")) {
            return lines;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("no epilog line for job {job}\n{}", c().logs_tail());
}

#[test]
fn prolog_and_epilog_see_the_mode_and_the_epilog_removes_the_state() {
    let script = format!("#!/bin/sh\ntest -f {}/jobs/$SLURM_JOB_ID.json && echo state-present\n", c().runtime_dir().display());
    let job = c().sbatch_wait(None, &["--gpu-mode=mps:mem=8G,threads=30", "--gres=gpu:2"], &script).unwrap();
    assert_eq!(job.exit_code, 0, "{}\n{}", job.output, c().logs_tail());
    assert_eq!(job.output.trim(), "state-present", "the prolog must have written the state before the job ran");
    let lines = wait_for_epilog_line(job.id);
    let prolog = lines.iter().find(|l| l.contains("action=prolog")).expect("a prolog line");
    assert!(prolog.contains("mode=\"mps:threads=30,mem=8G\""), "{prolog}");
    assert!(prolog.contains("outcome=ok"), "{prolog}");
    // Two GPUs, whichever Slurm picked (tests run concurrently).
    let gpus = prolog.split_whitespace().find_map(|f| f.strip_prefix("gpu=")).expect("a gpu= field");
    assert_eq!(gpus.split(',').count(), 2, "{prolog}");
    let epilog = lines.iter().find(|l| l.contains("action=epilog")).unwrap();
    assert!(epilog.contains("outcome=ok") && epilog.contains("mode=\"mps:threads=30,mem=8G\""), "{epilog}");
    assert!(!state_file(job.id).exists(), "the epilog must remove the job state");
}

#[test]
fn the_job_state_reaches_every_task_of_batch_and_steps() {
    let script = "#!/bin/sh\necho batch=$SLURM_GPU_MODE gpus=$SLURM_GPU_MODE_GPUS\nsrun -n2 sh -c 'echo task=$SLURM_GPU_MODE'\n";
    let job = c().sbatch_wait(None, &["--gpu-mode=checkpoint", "--signal=B:USR1@60", "--requeue", "--gres=gpu:1", "-n2"], script).unwrap();
    assert_eq!(job.exit_code, 0, "{}", job.output);
    let mut lines: Vec<&str> = job.output.lines().collect();
    lines.sort();
    // One GPU, whichever Slurm picked (tests run concurrently; Slurm 24.11
    // picks differently from 22.05).
    let batch = lines.first().and_then(|l| l.strip_prefix("batch=checkpoint gpus=")).unwrap_or_default();
    assert!(batch.parse::<u32>().is_ok(), "{}", job.output);
    assert_eq!(&lines[1..], &["task=checkpoint", "task=checkpoint"], "{}", job.output);
}

#[test]
fn tasks_of_jobs_without_a_mode_are_untouched() {
    let job = c()
        .sbatch_wait(None, &["--gres=gpu:1"], "#!/bin/sh\nenv | grep -c GPU_MODE || true\n")
        .unwrap();
    assert_eq!(job.exit_code, 0, "{}", job.output);
    assert_eq!(job.output.trim(), "0", "a job without --gpu-mode saw GPU_MODE variables");
    let lines = wait_for_epilog_line(job.id);
    assert!(lines.iter().all(|l| l.contains("outcome=skipped")), "{lines:?}");
    assert!(!state_file(job.id).exists());
}

#[test]
fn a_step_cannot_change_the_job_mode() {
    let script = "#!/bin/sh\nsrun --gpu-mode=mps true && echo changed\nsrun --gpu-mode=checkpoint true && echo same\n";
    let job = c().sbatch_wait(None, &["--gpu-mode=checkpoint", "--signal=B:USR1@60", "--requeue", "--gres=gpu:1"], script).unwrap();
    assert!(job.output.contains("differs from this job's --gpu-mode=checkpoint"), "{}", job.output);
    assert!(!job.output.contains("changed"), "{}", job.output);
    assert!(job.output.contains("same"), "{}", job.output);
}

#[test]
fn two_users_jobs_run_at_once_with_their_own_state() {
    let (a, b) = std::thread::scope(|s| {
        let script = "#!/bin/sh\nsleep 2\necho $(id -un) $SLURM_GPU_MODE $SLURM_GPU_MODE_GPUS\n";
        let a = s.spawn(|| c().sbatch_wait(Some("gmtest1"), &["--gpu-mode=mps:threads=10", "--gres=gpu:1"], script));
        let b = s.spawn(|| c().sbatch_wait(Some("gmtest2"), &["--gpu-mode=mps:threads=20", "--gres=gpu:1"], script));
        (a.join().unwrap().unwrap(), b.join().unwrap().unwrap())
    });
    assert_eq!(a.exit_code, 0, "{}", a.output);
    assert_eq!(b.exit_code, 0, "{}", b.output);
    let (wa, wb): (Vec<&str>, Vec<&str>) = (a.output.split_whitespace().collect(), b.output.split_whitespace().collect());
    assert_eq!(&wa[..2], &["gmtest1", "mps:threads=10"]);
    assert_eq!(&wb[..2], &["gmtest2", "mps:threads=20"]);
}

#[test]
fn a_value_this_node_cannot_serve_fails_the_job_not_the_node() {
    let job = c().sbatch_wait(Some("gmtest1"), &["--gpu-mode=mig:@nosuch", "--gres=gpu:1"], "#!/bin/sh\necho ran\n").unwrap();
    assert_ne!(job.exit_code, 0, "the job ran: {}", job.output);
    assert!(!job.output.contains("ran"), "{}", job.output);
    assert!(
        job.output.contains("cannot run on this node: MIG layout \"nosuch\" is not defined on node localhost (defined: half)"),
        "{}",
        job.output
    );
    let (state, reason) = c().node_state().unwrap();
    assert!(!state.contains("DRAIN"), "a job's bad request drained the node: {state} {reason}");
    let lines = wait_for_epilog_line(job.id);
    assert!(lines.iter().any(|l| l.contains("action=prolog") && l.contains("outcome=refused")), "{lines:?}");
    assert!(!state_file(job.id).exists());
}
