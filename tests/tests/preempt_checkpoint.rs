//! `--gpu-mode=checkpoint` end to end: a real Slurm preempts a low-priority
//! job (preempt/partition_prio, PreemptMode=REQUEUE, the job's
//! `--signal=B:USR1` through preempt_send_user_signal), the real CRIU dumps
//! it, Slurm requeues it, and the requeued job is restored; the GPUs are
//! the simulated ones (sim/nvml, sim/cuda), the application
//! `cuda-sim-counter`, which counts steps in simulated GPU memory.
//!
//! Who runs the preempted job: the test user gmtest1 where root has
//! CAP_SYS_RESOURCE (which `criu dump` needs for another user's processes,
//! as on real nodes); where it has not (this sandbox, CI containers) root,
//! with every capability dropped by `setpriv` in the batch script, which
//! CRIU can dump and the agent accepts (it refuses trees holding
//! capabilities). Each test notes that substitute through the testkit.
//!
//! The scenarios preempt each other's jobs if run at once (the preemptor
//! takes both GPUs), so they take turns ([`serial`]). Needs root, CRIU 4
//! (scripts/install-criu.sh) and `cargo build --workspace`; skipped without
//! CRIU (said through the testkit) unless GPU_MODE_REQUIRE_CRIU=1 (CI).

use gpu_mode_core::preempt::manifest::{Manifest, MANIFEST_FILE};
use gpu_mode_tests::ckpt_jobs::*;
use gpu_mode_tests::shared::cluster_with;
use gpu_mode_tests::{Cluster, Preemption};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

fn c() -> Option<&'static Cluster> {
    criu_ready().then(|| {
        cluster_with("preempt_checkpoint", 2, |s| {
            s.preemption = Some(Preemption::default());
            // CRIU's bound, below the tests' LONG wait: a restore the N1
            // thief's SIGCONT leaves hanging (preempt_criu.rs's N1 test says
            // how) ends at it, refused, within the wait. Dumps here take < 1 s.
            s.extra_gpu_mode_config = "criu_timeout_ms = 60000\n".into();
        })
    })
}

/// One scenario at a time (see module docs); a failed one does not block the rest.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    let guard = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // Notes a substitute for the test user where there is one.
    job_user();
    guard
}

fn gpu_uuids(c: &Cluster) -> Vec<String> {
    (0..2).map(|g| c.sim_gpu(g).unwrap()["uuid"].as_str().unwrap().to_string()).collect()
}

/// The pids holding simulated GPU memory, per NVML index.
fn gpu_pids(c: &Cluster) -> Vec<Vec<u64>> {
    (0..2)
        .map(|g| {
            let gpu = c.sim_gpu(g).unwrap();
            gpu["processes"].as_array().map(|ps| ps.iter().filter_map(|p| p["pid"].as_u64()).collect()).unwrap_or_default()
        })
        .collect()
}

/// Live processes of the simulated driver that are not RUNNING (locked or
/// checkpointed, from their published state).
fn stuck_cuda_processes(c: &Cluster) -> Vec<String> {
    let procs = c.dir.join("sim/nvml-state.json.cuda/procs");
    std::fs::read_dir(procs)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v: serde_json::Value = serde_json::from_slice(&std::fs::read(e.path().join("state.json")).ok()?).ok()?;
            let pid = v["pid"].as_i64()? as i32;
            let live = gpu_mode_core::procfs::read(pid).is_some_and(|p| p.state != 'Z');
            (live && v["state"].as_i64() != Some(0)).then(|| format!("pid {pid} state {}", v["state"]))
        })
        .collect()
}

/// What every scenario must leave: the job's agent gone, no simulated CUDA
/// process locked or checkpointed, no image left of a job that ended, the
/// node in service.
fn assert_nothing_stuck(c: &Cluster, job: u32) {
    wait_for("the job's agent to exit", Duration::from_secs(20), || agents(c, job).is_empty());
    assert!(stuck_cuda_processes(c).is_empty(), "{:?}", stuck_cuda_processes(c));
    let (state, reason) = c.node_state().unwrap();
    assert!(!state.contains("DRAIN") && !state.contains("DOWN"), "node {state} {reason}");
}

/// A preempted job dumped, requeued and restored (by the preemptor `by`),
/// onto the other GPU when `other_gpu`; every step exactly once, the
/// application's exit code.
fn preempted_job_is_restored(by: Option<&'static str>, other_gpu: bool) {
    let Some(c) = c() else { return };
    let _turn = serial();
    let who = job_user();
    let name = if other_gpu { "moved" } else { "same" };
    let (job, ready) = start_counter(c, who, name, 5);
    let uuids = gpu_uuids(c);
    let first_gpu = steps(&c.job_output(job))[0].1.clone();
    let app: u64 = std::fs::read_to_string(&ready).unwrap().trim().parse().unwrap();
    let on = uuids.iter().position(|u| *u == first_gpu).unwrap();
    assert!(gpu_pids(c)[on].contains(&app), "the application holds memory on its GPU: {:?}", gpu_pids(c));
    // gpu-mode-run preloaded the huge-page shim ([preempt] huge_pages, on
    // by default), the copy the agent keeps for this version.
    let maps = std::fs::read_to_string(format!("/proc/{app}/maps")).unwrap();
    let kept = format!("{}/hugepages/libgpu_mode_hugepages-", c.spec.dir.display());
    assert!(maps.contains(&kept), "the kept huge-page shim ({kept}*) is not in the application:\n{maps}");
    // The site's own AdminComment, which the accounting record must keep.
    let site = c.client("scontrol", &["update", &format!("JobId={job}"), "AdminComment=site ticket 42"]).run_as_root().unwrap();
    assert!(site.status.success(), "{}", String::from_utf8_lossy(&site.stderr));

    let preemptor = submit_preemptor(c, by, None, 2, 3);
    let pending = wait_requeued(c, job, 1);
    assert_eq!(pending.get("Partition"), "low");
    // Dumped: a complete image with its manifest, the application gone, its
    // simulated GPU memory free (the CUDA checkpoint released it before CRIU ran).
    let run0 = images(c).join(job.to_string()).join("0");
    let m = Manifest::load(&run0).unwrap_or_else(|e| panic!("{e}\n{}", c.job_output(job)));
    let uid = match who {
        Who::User(u) => gpu_mode_tests::users::lookup(u).unwrap().uid,
        Who::CaplessRoot => 0,
    };
    assert_eq!((m.job, m.restart_count, m.uid, m.root_pid as u64, m.cuda.len()), (job, 0, uid, app, 1));
    assert_eq!(m.cuda[0].footprint[0].bytes, 8 << 20);
    assert_eq!(m.cuda[0].footprint[0].gpu.to_string(), first_gpu);
    assert!(m.image_bytes > 8 << 20, "the image holds the GPU memory: {}", m.image_bytes);
    assert!(gpu_mode_core::procfs::read(app as i32).is_none(), "the dumped application is gone");
    assert!(gpu_pids(c).iter().all(|g| !g.contains(&app)), "its GPU memory is free: {:?}", gpu_pids(c));
    let dumped_at = last_step(c, job);
    // Recorded in Slurm before the requeue: run 0's checkpoint on this node
    // with the image's size, after the site's text.
    let node = &c.spec.node_name;
    let size = format!("s/{}MiB", m.image_bytes.div_ceil(1 << 20));
    let (events, comment) = recorded_events(c, job);
    assert_eq!(events, [format!("ckpt=r0@{node}")], "{comment}");
    assert!(comment.starts_with(&format!("site ticket 42 gpu-mode{{ckpt=r0@{node}:")) && comment.ends_with(&format!("{size}}}")), "{comment}");

    // The preemptor ran on both GPUs while the job waited.
    let filler = other_gpu.then(|| {
        c.wait_job(preemptor, "the preemptor to run", LONG, |j| j.state() == "RUNNING").unwrap();
        // A second high job queued now takes the first free GPU when the
        // preemptor ends, before the requeued job may start: the job must
        // then come back on the other GPU.
        submit_preemptor(c, by, None, 1, 60)
    });
    let p = wait_finished(c, preemptor);
    assert_eq!(p.get("ExitCode"), "0:0");
    let who_ran = by.unwrap_or("root");
    assert_eq!(c.job_output(preemptor).trim(), format!("preemptor {who_ran} on GPUs 0,1"));

    let end = wait_finished(c, job);
    if let Some(f) = filler {
        c.client("scancel", &[&f.to_string()]).run_as(by).unwrap();
    }
    let out = c.job_output(job);
    assert_eq!((end.get("ExitCode"), end.restarts()), (format!("{EXIT}:0").as_str(), 1), "{out}");
    assert_counted_once(&out);
    let all = steps(&out);
    for needle in [
        format!("gpu-mode-run: SIGUSR1 received: checkpointing job {job}"),
        "GPU memory free".to_string(),
        // The timeline of each, phase by phase (issue 17).
        format!("gpu-mode-run: job {job} checkpoint phases: request "),
        ", cuda-checkpoint ".to_string(),
        ", criu-dump ".to_string(),
        ", seal ".to_string(),
        format!("gpu-mode-run: job {job} run 1: restoring the checkpoint taken in run 0"),
        format!("gpu-mode-run: job {job} restore phases: manifest "),
        ", criu-restore ".to_string(),
        ", restored-check ".to_string(),
        ", cuda-restore ".to_string(),
        format!("gpu-mode-run: job {job} restored (pid {app}"),
    ] {
        assert!(out.contains(&needle), "missing {needle:?} in:\n{out}");
    }
    let restored_gpu = &all.last().unwrap().1;
    if other_gpu {
        assert_ne!(*restored_gpu, first_gpu, "restored onto the other GPU:\n{out}");
        assert!(out.contains(&format!("GPUs [(\"{first_gpu}\", \"{restored_gpu}\")]")), "the device map is reported:\n{out}");
    }
    // Before the dump on the first GPU, after it on the one the run got.
    assert!(all.iter().all(|(k, g)| if *k <= dumped_at { *g == first_gpu } else { g == restored_gpu }), "{all:?}");
    // ... and run 1's restore of it after that.
    let (events, comment) = recorded_events(c, job);
    assert_eq!(events, [format!("ckpt=r0@{node}"), format!("restore=r1@{node}")], "{comment}");
    assert!(comment.starts_with("site ticket 42 gpu-mode{") && comment.ends_with(&format!("{size}}}")), "{comment}");
    assert_images_removed(c, job);
    assert_nothing_stuck(c, job);
    let hooks = c.hook_log_lines(job).join("\n");
    assert!(hooks.contains("image of run 0 kept for the requeued job") && hooks.contains("the job's images removed"), "{hooks}");
}

#[test]
fn a_preempted_job_is_checkpointed_requeued_and_restored_with_its_count_and_exit_code() {
    preempted_job_is_restored(None, false);
}

#[test]
fn a_second_users_preemptor_and_the_job_comes_back_on_the_other_gpu() {
    preempted_job_is_restored(Some("gmtest2"), true);
}

/// Run 0 is preempted after `spoil` ruined its checkpoint: the job is
/// requeued with `needle` in its output, starts over, and counts to the end.
/// `recorded`: whether the agent lives to record the failure in the job's
/// AdminComment.
fn failed_checkpoint_starts_over(
    name: &str,
    app: impl FnOnce(&Cluster, &Path) -> Vec<String>,
    spoil: impl FnOnce(&Cluster, u32),
    needle: &str,
    recorded: bool,
) {
    let submit = |c: &Cluster, who: Who, ready: &Path| submit_low(c, who, name, &app(c, ready));
    submitted_checkpoint_starts_over(name, submit, spoil, needle, recorded)
}

/// [`failed_checkpoint_starts_over`] of the job `submit` submits (its
/// ready file given).
fn submitted_checkpoint_starts_over(
    name: &str,
    submit: impl FnOnce(&Cluster, Who, &Path) -> u32,
    spoil: impl FnOnce(&Cluster, u32),
    needle: &str,
    recorded: bool,
) {
    let c = c().unwrap();
    let who = job_user();
    let ready = c.dir.join("out").join(format!("{name}-{}.ready", std::process::id()));
    let job = submit(c, who, &ready);
    wait_steps(c, job, 5);
    spoil(c, job);
    let preemptor = submit_preemptor(c, None, None, 2, 2);
    wait_requeued(c, job, 1);
    let out = c.job_output(job);
    for n in [format!("gpu-mode-run: checkpoint of job {job} failed: "), needle.to_string(), "The job is requeued and will start over from the beginning.".into()] {
        assert!(out.contains(&n), "missing {n:?} in:\n{out}");
    }
    // Nothing claims success: no manifest (the epilog removed what there was).
    assert!(!images(c).join(job.to_string()).exists(), "{:?}", std::fs::read_dir(images(c).join(job.to_string())).map(|d| d.count()));
    wait_finished(c, preemptor);
    let end = wait_finished(c, job);
    let out = c.job_output(job);
    assert_eq!((end.get("ExitCode"), end.restarts()), (format!("{EXIT}:0").as_str(), 1), "{out}");
    assert!(out.contains(&format!("job {job} run 1: no checkpoint image to restore: starting the application from the beginning")), "{out}");
    // Run 0's steps, then all of them again from 1.
    let counts: Vec<u64> = steps(&out).iter().map(|s| s.0).collect();
    let restart = counts.iter().skip(1).position(|k| *k == 1).map(|i| i + 1).unwrap_or_else(|| panic!("no second start:\n{out}"));
    assert!(restart >= 5 && counts[..restart] == (1..=restart as u64).collect::<Vec<_>>()[..], "{counts:?}");
    assert_eq!(counts[restart..], (1..=STEPS).collect::<Vec<_>>()[..], "run 1 counted from scratch");
    assert!(out.contains(&format!("DONE count={STEPS}")) && !out.contains("MISMATCH"), "{out}");
    let (events, comment) = recorded_events(c, job);
    let want = if recorded { vec![format!("ckpt-failed=r0@{}", c.spec.node_name)] } else { vec![] };
    assert_eq!(events, want, "{comment}");
    assert_images_removed(c, job);
    assert_nothing_stuck(c, job);
}

#[test]
fn a_dump_onto_a_full_disk_requeues_the_job_to_start_over() {
    let Some(c) = c() else { return };
    let _turn = serial();
    // The cluster's image_dir on a 1 MiB tmpfs: the 8 MiB dump cannot fit.
    let dir = images(c);
    std::fs::create_dir_all(&dir).unwrap();
    let mounted = std::process::Command::new("/bin/mount").args(["-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs"]).arg(&dir).status().unwrap();
    assert!(mounted.success());
    let result = std::panic::catch_unwind(|| failed_checkpoint_starts_over("full", counter, |_, _| {}, "No space left on device", true));
    let _ = std::process::Command::new("/bin/umount").arg(&dir).status();
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

#[test]
fn a_process_holding_a_gpu_file_that_cuda_cannot_checkpoint_requeues_the_job_to_start_over() {
    let Some(c) = c() else { return };
    let _turn = serial();
    // The application is a shell that starts the counter and then holds the
    // counter's simulated device memory open itself: a process the CUDA
    // driver does not know holding a GPU file (as a child forked without
    // exec holds /dev/nvidia* on a real node) blocks the checkpoint.
    let holder = c.dir.join("out/holder.sh");
    let gpus_dir = c.dir.join("sim/nvml-state.json.cuda/gpus");
    std::fs::write(
        &holder,
        format!(
            "#!/bin/sh\n# $1: the counter's ready file, per run (a rerun must not find the old one)\nready=$1.$SLURM_RESTART_COUNT\n\
             {counter} --steps {STEPS} --interval-ms 100 --mib 8 --exit-code {EXIT} --ready $ready &\n\
             app=$!\nwhile [ ! -s $ready ]; do sleep 0.1; done\nexec 3< $(ls {gpus}/*/$app-0.mem)\nwait $app\n",
            counter = bin(c, "cuda-sim-counter"),
            gpus = gpus_dir.display()
        ),
    )
    .unwrap();
    let app = |_: &Cluster, r: &Path| vec!["/bin/sh".to_string(), holder.display().to_string(), r.display().to_string()];
    failed_checkpoint_starts_over("holder", app, |_, _| {}, "but the CUDA driver cannot checkpoint it", true);
}

/// Security review N5 under a real Slurm (issue 37): a gmtest1 job holding
/// more deleted files than `preempt.max_deleted_files` (64 by default; each
/// would travel in the image as a ghost file, so a job's image could
/// outgrow its memory many times) is refused at its preemption before
/// anything is locked, and starts over. Before: CRIU copied them all (9 MiB
/// of RSS gave a 38 MiB image with 3,000 sparse deleted files).
#[test]
fn a_job_holding_more_deleted_files_than_the_site_allows_starts_over_at_its_preemption() {
    let Some(c) = c() else { return };
    let _turn = serial();
    // bash opens 70 files, unlinks each, and execs the counter, which
    // inherits the descriptors (bash's `{fd}` redirections are not close-on-exec).
    let holder = c.dir.join("out/deleted-files.sh");
    std::fs::write(
        &holder,
        format!(
            "#!/bin/bash\n# $1: the counter's ready file\ndir=$(mktemp -d)\nfor i in $(seq 70); do exec {{fd}}<>\"$dir/f$i\"; rm \"$dir/f$i\"; done\nrmdir \"$dir\"\n\
             exec {counter} --steps {STEPS} --interval-ms 100 --mib 8 --exit-code {EXIT} --ready \"$1\"\n",
            counter = bin(c, "cuda-sim-counter"),
        ),
    )
    .unwrap();
    let app = |_: &Cluster, r: &Path| vec!["/bin/bash".to_string(), holder.display().to_string(), r.display().to_string()];
    failed_checkpoint_starts_over("deleted", app, |_, _| {}, "more than preempt.max_deleted_files = 64: CRIU would copy each into the image", true);
}

#[test]
fn a_killed_agent_requeues_the_job_to_start_over() {
    if c().is_none() {
        return;
    }
    let _turn = serial();
    let kill_agent = |c: &Cluster, job: u32| {
        let found = agents(c, job);
        assert_eq!(found.len(), 1, "one agent for job {job}: {found:?}");
        assert_eq!(unsafe { libc::kill(found[0], libc::SIGKILL) }, 0);
        wait_for("the agent to die", Duration::from_secs(10), || agents(c, job).is_empty());
    };
    failed_checkpoint_starts_over("agentless", counter, kill_agent, "cannot reach the checkpoint agent at ", false);
}

/// The checkpoint signal to the job's batch shell, as a preemption sends
/// it (`scancel --signal=USR1 --batch`), without a preemptor holding GPUs.
fn send_checkpoint_signal(c: &Cluster, job: u32) -> Result<(), String> {
    let sent = c.client("scancel", &["--signal=USR1", "--batch", &job.to_string()]).run_as_root().map_err(|e| e.to_string())?;
    sent.status.success().then_some(()).ok_or_else(|| String::from_utf8_lossy(&sent.stderr).into_owned())
}


/// Issue 27 item 2: gpu-mode-run reads its job's state from squeue's own
/// fields, never from `scontrol show job`, which prints the job's name
/// before its state: a job named like Slurm's fields is still requeued
/// after its checkpoint and restored (before: `job J is CANCELLED in Slurm
/// (...): not requeued by gpu-mode-run`, and the job ended after its
/// checkpoint without its last steps).
#[test]
fn a_job_named_like_slurms_own_fields_is_still_requeued_and_restored() {
    let Some(c) = c() else { return };
    let _turn = serial();
    let ready = c.dir.join("out").join(format!("hostile-name-{}.ready", std::process::id()));
    let name = "x JobState=CANCELLED PreemptTime=2026-01-01T00:00:00";
    let job = submit_low(c, job_user(), name, &counter(c, &ready));
    wait_steps(c, job, 5);
    send_checkpoint_signal(c, job).unwrap();
    let end = wait_finished(c, job);
    let out = c.job_output(job);
    assert_eq!((end.get("ExitCode"), end.restarts()), (format!("{EXIT}:0").as_str(), 1), "{out}");
    assert!(!out.contains("not requeued by gpu-mode-run"), "{out}");
    assert!(out.contains(&format!("gpu-mode-run: job {job} restored (pid")), "{out}");
    assert_counted_once(&out);
    assert_images_removed(c, job);
}

/// The application ends on its own while it is being checkpointed (seen in
/// the churn: CRIU then fails, its process gone): the job ends with the
/// application's status, not requeued to start over. Forced here: the
/// agent's Lock waits 5 s in the simulated driver while the counter runs
/// its last steps; the signal is sent by hand (`scancel --signal=USR1
/// --batch`, the wrapper's path for a preemption).
#[test]
fn an_application_that_ends_during_its_checkpoint_ends_the_job_with_its_own_status() {
    let Some(c) = c() else { return };
    let _turn = serial();
    let (job, ready) = start_counter(c, job_user(), "endsduring", STEPS - 10);
    let app = std::fs::read_to_string(&ready).unwrap().trim().to_string();
    c.cuda_sim_ctl(&["delay", "lock", "5000", "--pid", &app]).unwrap();
    let sent = send_checkpoint_signal(c, job);
    let end = wait_finished(c, job);
    c.cuda_sim_ctl(&["clear"]).unwrap();
    sent.unwrap();
    let out = c.job_output(job);
    assert!(out.contains(&format!("job {job}: the application ended (status {EXIT}) while it was being checkpointed")), "{out}");
    assert_eq!((end.get("ExitCode"), end.restarts()), (format!("{EXIT}:0").as_str(), 0), "{out}");
    assert_counted_once(&out);
    assert_images_removed(c, job);
    assert_nothing_stuck(c, job);
}

/// Fault matrix (docs/faults.md): a driver call that hangs on the
/// preemption path (`cuda-sim-ctl hang lock --pid <app>`: the agent's
/// cuCheckpointProcessLock never returns, as with a GPU stuck in the
/// kernel). The agent's watchdog bounds it (`[cuda_ckpt] call_timeout_ms`,
/// 8 s here, inside the 60 s GraceTime), the wrapper kills the application
/// and requeues the job to start over with the reason on its output, and
/// since the kill did end the application the GPU is not stuck: the epilog
/// removes the checkpoint record the hung call left, and drains nothing.
#[test]
fn a_hanging_driver_call_on_preemption_requeues_the_job_to_start_over_without_a_drain() {
    let Some(c) = c() else { return };
    let _turn = serial();
    let ctl = |args: &[&str]| c.cuda_sim_ctl(args).unwrap();
    let records = c.runtime_dir().join("checkpoint");
    let mut app = 0;
    let hang = |c: &Cluster, _job: u32| {
        let ready = c.dir.join("out").join(format!("hang-{}.ready", std::process::id()));
        app = std::fs::read_to_string(ready).unwrap().trim().parse().unwrap();
        ctl(&["hang", "lock", "--pid", &app.to_string()]);
    };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // Steps of 300 ms: the application must outlive the 10 s bound (one
        // that ends meanwhile ends the job with its own status instead).
        let slow = |c: &Cluster, r: &Path| {
            let mut a = counter(c, r);
            let i = a.iter().position(|w| w == "--interval-ms").unwrap();
            a[i + 1] = "300".into();
            a
        };
        failed_checkpoint_starts_over("hang", slow, hang, ") did not return within 10 s", true)
    }));
    ctl(&["clear"]);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
    // The record the hung call left named the application, now gone.
    let left: Vec<_> = std::fs::read_dir(&records).into_iter().flatten().flatten().map(|e| e.file_name()).collect();
    assert!(!left.iter().any(|f| f.to_string_lossy() == format!("pid-{app}.json")), "record of pid {app} left: {left:?}");
    let hooks = std::fs::read_to_string(c.dir.join("log/hooks.log")).unwrap_or_default();
    assert!(hooks.contains(&format!("stale checkpoint records removed: pid-{app}")), "no epilog line removing the record:\n{hooks}");
}

/// Slurm 22.05 at times starts a requeued run without its prolog (seen in
/// the churn under load: gpu_mode_core::skipped_prolog). Here slurmd's next
/// prolog does nothing (the harness's one-shot skip) after the checkpoint
/// signal was sent by hand (`scancel --signal=USR1 --batch`: the wrapper's
/// path for a preemption). The plugin requeues that run instead of failing
/// it, and the run after it restores the image: every step once, the
/// application's exit code, the image gone at the end.
#[test]
fn a_requeued_run_that_slurm_starts_without_its_prolog_is_requeued_again_and_then_restored() {
    let Some(c) = c() else { return };
    let _turn = serial();
    let (job, _ready) = start_counter(c, job_user(), "noprolog", 5);
    c.skip_next_prolog().unwrap();
    send_checkpoint_signal(c, job).unwrap();
    let end = wait_finished(c, job);
    let out = c.job_output(job);
    assert!(out.contains(&format!("Slurm started run 1 of job {job} on this node without its prolog")), "{out}\n{}", c.logs_tail());
    assert!(out.contains("the job is requeued to start again with its prolog"), "{out}");
    assert!(out.contains(&format!("job {job} run 2: restoring the checkpoint taken in run 0")), "{out}");
    assert_eq!((end.get("ExitCode"), end.restarts()), (format!("{EXIT}:0").as_str(), 2), "{out}");
    assert_counted_once(&out);
    assert_images_removed(c, job);
    assert_nothing_stuck(c, job);
}

/// A requeued run whose prolog ran (a job state, an agent) but whose task
/// never reached the agent, and Slurm requeued the job again: that run's
/// epilog must keep run 0's image, which the run never tried to restore,
/// and a later run restores it. The CI's churn, 2026-11-27, lost an image
/// so (most likely Slurm 22.05 ran a requeued run's prolog after the plugin
/// had requeued the run for lack of one: core::skipped_prolog). Here the
/// batch script itself requeues the job in the first requeued run it gets
/// to (slurmd may skip run 1's prolog: the script then never runs there)
/// and waits to be ended, so the order is the same every time. Every step
/// once, the application's exit code, the image gone at the end.
#[test]
fn a_requeued_run_that_never_reached_the_agent_keeps_the_image_for_the_next_run() {
    let Some(c) = c() else { return };
    let _turn = serial();
    let who = job_user();
    let marker = c.dir.join("out").join(format!("untried-{}.requeued", std::process::id()));
    let ready = c.dir.join("out").join(format!("untried-{}.ready", std::process::id()));
    let script = format!(
        "#!/bin/bash\nif [ \"${{SLURM_RESTART_COUNT:-0}}\" -gt 0 ] && [ ! -e {m} ]; then\n  : > {m}\n  {scontrol} requeue $SLURM_JOB_ID\n  sleep 120\nfi\n{exec}\n",
        m = marker.display(),
        scontrol = c.install.bin("scontrol").display(),
        exec = batch_line(c, who, &counter(c, &ready), true),
    );
    let job = submit_low_script(c, who, "untried", &script, true).unwrap();
    wait_steps(c, job, 5);
    send_checkpoint_signal(c, job).unwrap();
    let end = wait_finished(c, job);
    let out = c.job_output(job);
    let hooks = c.hook_log_lines(job).join("\n");
    assert!(marker.exists(), "no requeued run reached the script:\n{out}\n{hooks}");
    let kept = hooks.lines().find(|l| l.contains("image of run 0 kept: run ") && l.contains(" never tried to restore it and the job is requeued"));
    assert!(kept.is_some(), "no epilog kept run 0's image for the run that never tried it:\n{hooks}\n{out}");
    assert!(out.contains("restoring the checkpoint taken in run 0"), "{out}\n{hooks}");
    assert_eq!(end.get("ExitCode"), format!("{EXIT}:0").as_str(), "{out}");
    assert_counted_once(&out);
    assert_images_removed(c, job);
    assert_nothing_stuck(c, job);
}

/// The manifest of run 0 is spoiled while the job waits: the requeued run
/// fails with one line naming why, nothing is restored, and the image is
/// kept — so that, once the manifest is put back, `scontrol requeue`
/// restores it after all.
#[test]
fn a_restore_refuses_another_users_or_a_corrupt_manifest_and_keeps_the_image() {
    let Some(c) = c() else { return };
    let _turn = serial();
    let who = job_user();
    let (job, _) = start_counter(c, who, "refused", 5);
    let preemptor = submit_preemptor(c, None, None, 2, 1);
    // Held: the spoiling must happen before the next run starts.
    wait_requeued(c, job, 1);
    let hold = c.client("scontrol", &["hold", &job.to_string()]).run_as_root().unwrap();
    assert!(hold.status.success(), "{}", String::from_utf8_lossy(&hold.stderr));
    wait_finished(c, preemptor);
    let run0 = images(c).join(job.to_string()).join("0");
    let manifest = run0.join(MANIFEST_FILE);
    let original = std::fs::read(&manifest).unwrap();
    let dumped_at = last_step(c, job);
    let image_pids = Manifest::load(&run0).unwrap().pids;
    let other_uid = gpu_mode_tests::users::lookup("gmtest2").unwrap().uid;

    let mut foreign: serde_json::Value = serde_json::from_slice(&original).unwrap();
    foreign["uid"] = other_uid.into();
    let cases: [(&str, Vec<u8>, String); 2] = [
        ("another user's", serde_json::to_vec(&foreign).unwrap(), format!("not to job {job}'s user")),
        ("corrupt", b"{\"version\": 1, \"job\"".to_vec(), "is corrupt".into()),
    ];
    for (run, (what, text, needle)) in (1u32..).zip(cases) {
        std::fs::write(&manifest, &text).unwrap();
        let verb = if run == 1 { "release" } else { "requeue" };
        let out = c.client("scontrol", &[verb, &job.to_string()]).run_as_root().unwrap();
        assert!(out.status.success(), "scontrol {verb}: {}", String::from_utf8_lossy(&out.stderr));
        let end = c.wait_job(job, "the refused run's end", LONG, |j| j.restarts() == run && finished(j)).unwrap();
        let out = c.job_output(job);
        assert_eq!(end.get("ExitCode"), "1:0", "{what}: {out}");
        let line = out.lines().rfind(|l| l.contains(&format!("gpu-mode-run: cannot restore job {job}: "))).unwrap_or_else(|| panic!("{what}: {out}"));
        assert!(line.contains(&needle) && line.ends_with("the image is kept"), "{what}: {line}");
        assert_eq!(out.matches("cannot restore").count(), run as usize, "one line per refused run:\n{out}");
        assert_eq!(last_step(c, job), dumped_at, "{what}: nothing was restored or started");
        assert!(image_pids.iter().all(|p| gpu_mode_core::procfs::read(*p).is_none()), "{what}: no process of the image runs");
        // Kept through the epilog, as the line promised.
        wait_for("the epilog", Duration::from_secs(20), || c.hook_log_lines(job).iter().filter(|l| l.contains("action=epilog")).count() == run as usize + 1);
        assert!(manifest.exists(), "{what}: the image is kept");
        let hooks = c.hook_log_lines(job).join("\n");
        assert!(hooks.contains("image of run 0 kept: this run's restore of it was refused"), "{hooks}");
        assert_nothing_stuck(c, job);
    }

    // The image was kept for a reason: with its manifest back, the job restores.
    std::fs::write(&manifest, &original).unwrap();
    let out = c.client("scontrol", &["requeue", &job.to_string()]).run_as_root().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let end = c.wait_job(job, "the restored run's end", LONG, |j| j.restarts() == 3 && finished(j)).unwrap();
    let out = c.job_output(job);
    assert_eq!(end.get("ExitCode"), format!("{EXIT}:0"), "{out}");
    assert_counted_once(&out);
    assert!(out.contains(&format!("job {job} run 3: restoring the checkpoint taken in run 0")), "{out}");
    // The job's history, in Slurm: one checkpoint, two refused restores, one restore.
    let node = &c.spec.node_name;
    let (events, comment) = recorded_events(c, job);
    let want = [format!("ckpt=r0@{node}"), format!("restore-failed=r1@{node}"), format!("restore-failed=r2@{node}"), format!("restore=r3@{node}")];
    assert_eq!(events, want, "{comment}");
    assert_images_removed(c, job);
    assert_nothing_stuck(c, job);
}

/// `scancel` ends a running checkpoint job: no checkpoint, no requeue (the
/// SIGTERM reaches the application), no image left.
#[test]
fn a_cancelled_job_is_not_checkpointed_or_requeued_and_leaves_no_image() {
    let Some(c) = c() else { return };
    let _turn = serial();
    let who = job_user();
    let (job, _) = start_counter(c, who, "cancelled", 3);
    let out = c.client("scancel", &[&job.to_string()]).run_as(submitter(who)).unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let end = wait_finished(c, job);
    // Requeueing would show in the restart count; give a wrongly requeued job the time to be seen.
    std::thread::sleep(Duration::from_secs(2));
    let out = c.job_output(job);
    assert_eq!((end.state(), c.job(job).unwrap().state(), end.restarts()), ("CANCELLED", "CANCELLED", 0), "{out}");
    assert!(!out.contains("checkpointing"), "{out}");
    assert!(last_step(c, job) < STEPS, "{out}");
    assert_images_removed(c, job);
    assert_nothing_stuck(c, job);
}

/// Preempts `job`, waits for its requeue and holds it, so that what a test
/// does to the image comes before the next run; returns run 0's image
/// directory and manifest once the preemptor ended.
fn preempt_and_hold(c: &Cluster, job: u32) -> (std::path::PathBuf, Manifest) {
    let preemptor = submit_preemptor(c, None, None, 2, 1);
    wait_requeued(c, job, 1);
    let hold = c.client("scontrol", &["hold", &job.to_string()]).run_as_root().unwrap();
    assert!(hold.status.success(), "{}", String::from_utf8_lossy(&hold.stderr));
    wait_finished(c, preemptor);
    let run = images(c).join(job.to_string()).join("0");
    let m = Manifest::load(&run).unwrap_or_else(|e| panic!("{e}\n{}", c.job_output(job)));
    (run, m)
}

/// The plain user the job runs as, or `None` (said as skipped: `why` the
/// test needs one) where a capability-less root stands in for it.
fn plain_job_user(why: &str) -> Option<(Who, &'static str, gpu_mode_tests::users::User)> {
    match job_user() {
        Who::User(user) => Some((Who::User(user), user, gpu_mode_tests::users::lookup(user).unwrap())),
        Who::CaplessRoot => {
            gpu_mode_testkit::skipped(&gpu_mode_testkit::this_test(), why);
            None
        }
    }
}

/// Processes of `uid` (any of its four uids) holding a capability in their
/// effective, permitted or ambient set: `pid name Cap...` of each.
fn capable_processes_of(uid: u32) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            let field = |k: &str| status.lines().find_map(|l| l.strip_prefix(k)?.strip_prefix(':').map(str::trim).map(str::to_string));
            let uids = field("Uid")?;
            if !uids.split_whitespace().any(|u| u == uid.to_string()) {
                return None;
            }
            let caps: Vec<String> = ["CapEff", "CapPrm", "CapAmb"].iter().filter_map(|k| Some(format!("{k}={}", field(k)?))).collect();
            let any = caps.iter().any(|c| c.rsplit('=').next().is_some_and(|v| u64::from_str_radix(v, 16) != Ok(0)));
            any.then(|| format!("{pid} {} {}", field("Name").unwrap_or_default(), caps.join(" ")))
        })
        .collect()
}

/// Security review N1 under a real Slurm (issue 37): the attack of
/// checkpoint/tests/preempt_criu.rs::the_n1_attack_forges_no_image_gains_no_capability_and_leaves_nothing_running
/// against a job of gmtest1 that slurmd runs, preempted, dumped by the
/// job's agent, requeued and restored by the requeued run. The job holds a
/// directory at descriptor 3; while the requeued job is held, the user
/// swaps it for a symlink to /proc/self/cwd (so CRIU reopens its own
/// working directory in the restored task), and a thief of the same user
/// outside the job waits until the restored task is stopped, then loops
/// SIGCONT, `pidfd_getfd(pid, 3)` and appends to every `.img` it can list
/// through what it took. The task, if it ever ran, would clone a
/// `CLONE_PARENT` sibling recording its capabilities. The requeued run's
/// restore must be refused (the tree holds CRIU's work directory, which
/// the user may not reach by its path) with the image kept, byte for byte
/// as sealed; the thief acted and wrote nothing; no sibling was made, no
/// process of the user holds a capability, nothing of the job runs.
#[test]
fn the_n1_attack_under_slurm_forges_no_image_gains_no_capability_and_leaves_nothing_running() {
    let Some(c) = c() else { return };
    let _turn = serial();
    let Some((who, user, u)) = plain_job_user("the thief must be another process of the job's user") else { return };
    let own = |p: &Path| std::os::unix::fs::lchown(p, Some(u.uid), Some(u.gid)).unwrap();
    let chmod = |p: &Path, mode: u32| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    // The user's own directory (out/ is 1777), with the directory the job holds.
    let home = c.dir.join("out").join(format!("n1-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    let held = home.join("held");
    std::fs::create_dir_all(&held).unwrap();
    for d in [&home, &held] {
        own(d);
        // `held`: the mode of CRIU's working directory, which CRIU compares with the image's.
        chmod(d, 0o700);
    }
    let (ready, go, stop) = (home.join("ready"), home.join("go"), home.join("stop"));
    // The application of the N1 test (gpu_mode_testkit::n1::APP): holds
    // `held` as descriptor 3; once `go` exists, it clones a sibling recording
    // its capabilities.
    let app_py = home.join("app.py");
    std::fs::write(&app_py, gpu_mode_testkit::n1::APP).unwrap();
    own(&app_py);
    let app: Vec<String> = [Path::new("/usr/bin/python3"), &app_py, &ready, &held, &go, &home].iter().map(|p| p.display().to_string()).collect();
    let job = submit_low(c, who, "n1", &app);
    wait_for("the application to hold its directory", LONG, || {
        std::fs::read_to_string(&ready).ok().and_then(|p| p.trim().parse::<i32>().ok()).is_some_and(|p| gpu_mode_testkit::n1::holds(p, &held))
    });
    let app_pid: i32 = std::fs::read_to_string(&ready).unwrap().trim().parse().unwrap();

    // Preempted, dumped by the job's agent, requeued; held, so that the
    // user's moves come before the requeued run.
    let (run, m) = preempt_and_hold(c, job);
    assert_eq!((m.job, m.uid, m.root_pid), (job, u.uid, app_pid));
    let sealed = gpu_mode_testkit::n1::image_bytes(&run);
    assert!(!sealed.is_empty(), "no image file in {}", run.display());
    assert!(gpu_mode_core::procfs::read(app_pid).is_none(), "the dumped application is gone");

    // The user's moves: the directory becomes a link to /proc/self/cwd, and `go`.
    std::fs::rename(&held, home.join("held-away")).unwrap();
    std::os::unix::fs::symlink("/proc/self/cwd", &held).unwrap();
    own(&held);
    std::fs::write(&go, b"").unwrap();
    own(&go);
    // The thief of the N1 test (gpu_mode_testkit::n1::THIEF), as the user
    // outside the job, until `stop` exists (300 s at most): it waits until
    // the restored task is stopped, then strikes. Its counts and every path
    // it got a descriptor of, as JSON.
    let mut thief = std::process::Command::new("/usr/bin/python3");
    thief.args(["-c", gpu_mode_testkit::n1::THIEF, &app_pid.to_string(), &stop.display().to_string(), "300"]).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::null());
    thief.current_dir("/tmp");
    gpu_mode_core::privdrop::run_as(&mut thief, &gpu_mode_core::privdrop::Identity::of_user(u.uid, u.gid).unwrap());
    let thief = thief.spawn().unwrap();

    let release = c.client("scontrol", &["release", &job.to_string()]).run_as_root().unwrap();
    assert!(release.status.success(), "{}", String::from_utf8_lossy(&release.stderr));
    let restored = format!("gpu-mode-run: job {job} restored (pid");
    wait_for("the requeued run to end or restore", LONG, || {
        c.job(job).is_ok_and(|j| j.restarts() == 1 && finished(&j)) || c.job_output(job).contains(&restored)
    });
    // The thief keeps at it a moment after, while a restored task would run.
    std::thread::sleep(Duration::from_millis(500));
    let capable = capable_processes_of(u.uid);
    std::fs::write(&stop, b"").unwrap();
    let report = String::from_utf8_lossy(&thief.wait_with_output().unwrap().stdout).into_owned();
    let siblings: Vec<String> = std::fs::read_dir(&home)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("sibling-"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .collect();
    let sibling_pids: Vec<i32> = siblings.iter().filter_map(|t| t.split_whitespace().next()?.parse().ok()).collect();
    let running = |pid: i32| gpu_mode_core::procfs::read(pid).is_some_and(|p| !matches!(p.state, 'Z' | 'X'));
    let left: Vec<i32> = sibling_pids.iter().chain(&m.pids).copied().filter(|p| running(*p)).collect();
    // Whatever happened, everything of the job goes now.
    let end = c.job(job).unwrap();
    if !finished(&end) {
        let _ = c.client("scancel", &[&job.to_string()]).run_as_root();
    }
    for pid in sibling_pids.iter().chain(&m.pids).chain([&app_pid]) {
        unsafe { libc::kill(*pid, libc::SIGKILL) };
    }
    let end = wait_finished(c, job);
    let out = c.job_output(job);

    let counts: serde_json::Value = serde_json::from_str(report.trim()).unwrap_or_else(|e| panic!("the thief's report {report:?}: {e}\n{out}"));
    let count = |k: &str| counts[k].as_u64().unwrap_or(0);
    // The thief acted: the test fails when it never ran.
    assert!(count("sigcont") > 0 && count("getfd_tries") > 0, "the thief never acted: {counts}\n{out}");
    assert_eq!(count("writes"), 0, "the thief wrote an image file: {counts}\n{out}");
    let paths: Vec<&str> = counts["paths"].as_array().unwrap().iter().filter_map(|p| p.as_str()).collect();
    let run_real = std::fs::canonicalize(&run).unwrap_or(run.clone());
    let in_run = |p: &str| [&run, &run_real].iter().any(|r| Path::new(p).starts_with(r));
    assert!(!paths.iter().any(|p| in_run(p)), "the thief held the image directory: {paths:?}\n{out}");
    // At most the work directory, lent to the user for the run.
    let work = format!("{}/.criu-", images(c).join(job.to_string()).display());
    assert!(paths.iter().all(|p| p.starts_with(&work)), "the thief held more than CRIU's work directory: {paths:?}\n{out}");
    assert_eq!(gpu_mode_testkit::n1::image_bytes(&run), sealed, "an image file changed after its seal (thief: {counts})");
    for record in siblings.iter().flat_map(|t| t.lines()) {
        let caps: Vec<&str> = record.split_whitespace().skip(1).collect();
        assert!(caps.iter().all(|c| u64::from_str_radix(c, 16) == Ok(0)), "a sibling ran with capabilities: {record}");
    }
    assert!(capable.is_empty(), "processes of {user} with capabilities: {capable:?}\n{out}");
    // Held by CRIU until its check (agent::hold): the task never ran, so the
    // thief's SIGCONTs made no sibling.
    assert!(sibling_pids.is_empty(), "the restored task ran before its check: siblings {sibling_pids:?} (thief: {counts})\n{out}");
    assert!(left.is_empty(), "processes of the job or its siblings still ran after the requeued run: {left:?}\n{out}");
    // Refused, with the image kept, and the job ended.
    assert!(!out.contains(&restored), "the restore was not refused:\n{out}");
    let line = out.lines().rfind(|l| l.contains(&format!("gpu-mode-run: cannot restore job {job}: "))).unwrap_or_else(|| panic!("no refusal:\n{out}"));
    // What the check found: the task holds CRIU's work directory for the run
    // (`<job>/.criu-*`), which the user may not reach by its path.
    let work = format!("{}/.criu-", images(c).join(job.to_string()).display());
    assert!(line.contains(&format!("was restored holding {work}")) && line.contains("a path was swapped since the dump"), "{line}");
    assert!(line.ends_with("the image is kept"), "{line}");
    assert_eq!((end.state(), end.get("ExitCode"), end.restarts()), ("FAILED", "1:0", 1), "{out}");
    wait_for("the epilog", Duration::from_secs(20), || c.hook_log_lines(job).iter().filter(|l| l.contains("action=epilog")).count() == 2);
    let hooks = c.hook_log_lines(job).join("\n");
    assert!(hooks.contains("image of run 0 kept: this run's restore of it was refused"), "{hooks}");
    assert!(run.join(MANIFEST_FILE).exists(), "the image is kept");
    assert_eq!(gpu_mode_testkit::n1::image_bytes(&run), sealed, "an image file changed after its seal");
    assert_nothing_stuck(c, job);
    eprintln!("n1 under Slurm: job {job}: {line}; thief {counts}");
    // The kept image of a job that ended is the admin's to remove.
    std::fs::remove_dir_all(images(c).join(job.to_string())).unwrap();
    let _ = std::fs::remove_dir_all(&home);
}

/// Root writes `bytes` as `name` in the run directory `run` and its
/// description into the manifest, as a forger who got past the agent's
/// checks would have it (the checksums then vouch for the forgery).
fn forge_image_file(run: &Path, name: &str, bytes: &[u8]) {
    std::fs::write(run.join(name), bytes).unwrap();
    let mut m = Manifest::load(run).unwrap();
    let dir = gpu_mode_core::fsutil::open_dir_nofollow(run).unwrap();
    let now = gpu_mode_core::preempt::manifest::describe_file(&dir, name).unwrap();
    let entry = m.images.iter_mut().find(|f| f.name == name).unwrap_or_else(|| panic!("{name} is not in the manifest"));
    m.image_bytes = m.image_bytes - entry.bytes + now.bytes;
    *entry = now;
    m.save(run).unwrap();
}

/// Resource limits a forged image raises: RLIMIT_* index and name, for
/// those whose dumped hard limit is finite.
const FORGED_LIMITS: [(usize, &str); 6] = [(6, "nproc"), (8, "memlock"), (11, "sigpending"), (12, "msgqueue"), (13, "nice"), (14, "rtprio")];

/// Security review N1b and N1d under a real Slurm (issue 37): what a user
/// who got a forged core image past the agent's checks would gain from
/// CRIU, against a gmtest1 checkpoint job that Slurm preempts, requeues and
/// holds while root forges the image and its checksum (so every check of
/// the agent passes). First the creds get CAP_CHECKPOINT_RESTORE, which
/// CRIU always runs with, in every set: CRIU itself refuses the task
/// (packaging/criu/0005), the run fails, the image is kept, and no process
/// of the user holds a capability. Then the creds as dumped, but every
/// finite hard limit of nproc, memlock, sigpending, msgqueue, nice and
/// rtprio raised and SCHED_FIFO asked for: CRIU runs with the hard limits
/// the dump recorded (privdrop::HardLimits), so the restored process gets
/// none of that (CRIU's restorer ignores a refused setrlimit and
/// sched_setscheduler) and the job counts on to its end. Before: CRIU ran
/// with every hard limit unlimited and would have restored the forged ones.
#[test]
fn a_forged_core_image_under_slurm_gains_no_capability_limit_or_priority() {
    use gpu_mode_testkit::criu_image;
    let Some(c) = c() else { return };
    let _turn = serial();
    let Some((who, user, u)) = plain_job_user("CRIU must run as the job's user to refuse what it does not hold") else { return };
    let ready = c.dir.join("out").join(format!("forged-{}.ready", std::process::id()));
    let job = submit_low(c, who, "forged", &counter_of(c, 200, EXIT, Some(&ready)));
    wait_steps(c, job, 5);
    let app: i32 = std::fs::read_to_string(&ready).unwrap().trim().parse().unwrap();
    let (run, m) = preempt_and_hold(c, job);
    assert_eq!((m.uid, m.root_pid), (u.uid, app));
    let core = format!("core-{app}.img");
    let dumped = std::fs::read(run.join(&core)).unwrap();
    let dumped_at = last_step(c, job);

    // N1d: CAP_CHECKPOINT_RESTORE (40, bit 8 of word 1) in every set.
    let cap: &[u32] = &[0, 1 << (40 - 32)];
    forge_image_file(&run, &core, &criu_image::forge_creds(&dumped, &[(9, cap), (10, cap), (11, cap), (19, cap)]));
    let release = c.client("scontrol", &["release", &job.to_string()]).run_as_root().unwrap();
    assert!(release.status.success(), "{}", String::from_utf8_lossy(&release.stderr));
    c.wait_job(job, "the run with forged creds to end", LONG, |j| j.restarts() == 1 && finished(j)).unwrap();
    // (Not sampled while CRIU runs: CRIU itself, and its restorer in the
    // tasks until their creds are set, hold CRIU's capabilities as the user.)
    let capable = capable_processes_of(u.uid);
    let out = c.job_output(job);
    assert!(capable.is_empty(), "processes of {user} with capabilities after the forged restore: {capable:?}\n{out}");
    let line = out.lines().rfind(|l| l.contains(&format!("gpu-mode-run: cannot restore job {job}: "))).unwrap_or_else(|| panic!("no refusal:\n{out}"));
    assert!(line.ends_with("the image is kept"), "{line}");
    let refusal = format!("Refusing to restore task {app}: creds cap_inh word 1 is 0x100, not 0");
    assert!(out.contains(&refusal), "CRIU itself did not refuse the forged creds ({refusal:?}):\n{out}");
    assert_eq!(c.job(job).unwrap().get("ExitCode"), "1:0", "{out}");
    assert_eq!(last_step(c, job), dumped_at, "nothing was restored");
    assert!(m.pids.iter().all(|p| gpu_mode_core::procfs::read(*p).is_none()), "no process of the image runs");
    wait_for("the epilog", Duration::from_secs(20), || c.hook_log_lines(job).iter().filter(|l| l.contains("action=epilog")).count() == 2);
    assert!(run.join(MANIFEST_FILE).exists(), "the image is kept");

    // N1b: the creds as dumped; limits and the scheduling policy raised.
    let limits = criu_image::rlimits(&dumped);
    let raised: Vec<(usize, u64, u64)> =
        FORGED_LIMITS.iter().filter(|(i, _)| limits[*i].1 != u64::MAX).map(|(i, _)| (*i, limits[*i].1 * 2 + 99, limits[*i].1 * 2 + 99)).collect();
    assert!(!raised.is_empty(), "no finite hard limit to raise among {FORGED_LIMITS:?}: {limits:?}");
    forge_image_file(&run, &core, &criu_image::forge_sched(&criu_image::forge_rlimits(&dumped, &raised), libc::SCHED_FIFO as u32, 50));
    let requeue = c.client("scontrol", &["requeue", &job.to_string()]).run_as_root().unwrap();
    assert!(requeue.status.success(), "{}", String::from_utf8_lossy(&requeue.stderr));
    let restored = format!("gpu-mode-run: job {job} restored (pid {app}");
    wait_for("the forged-limits restore", LONG, || c.job_output(job).contains(&restored) || c.job(job).is_ok_and(|j| j.restarts() == 2 && finished(&j)));
    let got = gpu_mode_core::privdrop::HardLimits::of_processes(&[app]);
    // SAFETY: sched_getscheduler has no memory effects.
    let policy = unsafe { libc::sched_getscheduler(app) };
    let end = wait_finished(c, job);
    let out = c.job_output(job);
    assert!(out.contains(&restored), "the image with forged limits was not restored:\n{out}");
    assert!(!got.0.is_empty(), "the restored process's limits were not read:\n{out}");
    for (i, name) in FORGED_LIMITS.iter().filter(|(i, _)| raised.iter().any(|r| r.0 == *i)) {
        assert_eq!(got.0.get(*name), Some(&limits[*i].1), "the restored {name} hard limit, forged to {}:\n{out}", limits[*i].1 * 2 + 99);
    }
    assert_eq!(policy, libc::SCHED_OTHER, "the restored process runs SCHED_FIFO");
    assert_eq!((end.get("ExitCode"), end.restarts()), (format!("{EXIT}:0").as_str(), 2), "{out}");
    if let Err(e) = counted_once(&out, 200) {
        panic!("{e}:\n{out}");
    }
    let node = &c.spec.node_name;
    let (events, comment) = recorded_events(c, job);
    assert_eq!(events, [format!("ckpt=r0@{node}"), format!("restore-failed=r1@{node}"), format!("restore=r2@{node}")], "{comment}");
    assert_images_removed(c, job);
    assert_nothing_stuck(c, job);
}

/// CRIU's tables on the node (`CRIU-*`), or `None` without a working nft.
fn criu_tables() -> Option<Vec<String>> {
    gpu_mode_core::preempt::netlock::Nft { binary: "/usr/sbin/nft".into() }.criu_tables().ok()
}

/// Security review N2 under a real Slurm (issue 37): a gmtest1 checkpoint
/// job connected to a peer outside its tree (a listener of the test's) is
/// preempted: its dump keeps CRIU's network lock, an nftables table that
/// the node records for the image; the job is then cancelled while it
/// waits, so no restore ever removes the table. The next checkpoint job on
/// the node, whose connection is between two of its own sockets, is
/// dumped without any lock and restored; its epilog's sweep removes the
/// cancelled job's image and then that table. Before: every dump left its
/// table for good, and a root program reusing one of its ports timed out.
#[test]
fn a_cancelled_jobs_network_lock_is_removed_by_the_next_epilog_and_a_tree_with_its_own_peers_gets_none() {
    let Some(c) = c() else { return };
    let Some(before) = criu_tables() else {
        assert!(!gpu_mode_testkit::required("CI"), "no working /usr/sbin/nft (scripts/test.sh installs nftables)");
        return gpu_mode_testkit::skipped(&gpu_mode_testkit::this_test(), "no working /usr/sbin/nft here (apt-get install nftables)");
    };
    let _turn = serial();
    let who = job_user();
    let records = c.runtime_dir().join("netlocks");
    let locks = gpu_mode_core::preempt::netlock::NetLocks {
        dir: records.clone(),
        nft: gpu_mode_core::preempt::netlock::Nft { binary: "/usr/sbin/nft".into() },
        dump_bound: Duration::from_secs(60),
    };
    // The outside peer, accepting in the background (kept to the end).
    let outside = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = outside.local_addr().unwrap().port();
    let peer = std::thread::spawn(move || outside.accept().map(|(s, _)| s));
    let with_hold = |name: &str, hold: &str| {
        let ready = c.dir.join("out").join(format!("{name}-{}.ready", std::process::id()));
        let mut app = counter(c, &ready);
        app.extend(["--hold".to_string(), hold.to_string()]);
        submit_low(c, who, name, &app)
    };

    // The job with an outside peer: dumped with a lock, which is recorded.
    let outward = with_hold("lock-out", &format!("tcp-to:{port}"));
    wait_steps(c, outward, 5);
    let (_, m) = preempt_and_hold(c, outward);
    assert!(m.tcp_established, "the dump had --tcp-established");
    let new: Vec<String> = criu_tables().unwrap().into_iter().filter(|t| !before.contains(t)).collect();
    let kept: Vec<String> = new.iter().filter(|t| locks.record_of(t).is_some_and(|r| r.job == outward)).cloned().collect();
    assert_eq!(kept.len(), 1, "one recorded table for job {outward}'s dump: new {new:?}\n{}", c.job_output(outward));
    let cancel = c.client("scancel", &[&outward.to_string()]).run_as_root().unwrap();
    assert!(cancel.status.success(), "{}", String::from_utf8_lossy(&cancel.stderr));
    wait_finished(c, outward);
    assert!(criu_tables().unwrap().contains(&kept[0]), "the table waits for a sweep (no epilog runs for a pending job)");

    // The job whose peer is its own: no lock; its epilog sweeps.
    let inward = with_hold("lock-in", "tcp-loopback");
    wait_steps(c, inward, 5);
    let preemptor = submit_preemptor(c, None, None, 2, 1);
    wait_requeued(c, inward, 1);
    let during: Vec<String> = criu_tables().unwrap().into_iter().filter(|t| !before.contains(t) && *t != kept[0]).collect();
    wait_finished(c, preemptor);
    let end = wait_finished(c, inward);
    let out = c.job_output(inward);
    assert!(during.is_empty(), "a tree whose peers are its own was locked: {during:?}\n{out}");
    assert_eq!((end.get("ExitCode"), end.restarts()), (format!("{EXIT}:0").as_str(), 1), "{out}");
    assert_counted_once(&out);
    assert!(out.contains(&format!("gpu-mode-run: job {inward} restored (pid")), "{out}");
    wait_for("the epilog's sweep", Duration::from_secs(30), || !criu_tables().unwrap().contains(&kept[0]));
    let hooks = c.hook_log_lines(inward).join("\n");
    assert!(hooks.contains(&format!("network locks removed: {}", kept[0])), "{hooks}");
    assert!(!images(c).join(outward.to_string()).exists(), "the cancelled job's image was swept first");
    assert_eq!(locks.record_of(&kept[0]), None, "the record went with its table");
    let left: Vec<String> = criu_tables().unwrap().into_iter().filter(|t| !before.contains(t)).collect();
    assert!(left.is_empty(), "tables left: {left:?}");
    assert_images_removed(c, inward);
    assert_nothing_stuck(c, inward);
    drop(peer);
}

/// A simulated NCCL rank (issue 38): the counter with PyTorch's NCCL
/// watchdog thread, which picks its transport as NCCL's init does
/// (cuda-sim-counter `--hold nccl-thread`; `extra`: more of its arguments).
fn nccl_rank(c: &Cluster, ready: &Path, extra: &[&str]) -> Vec<String> {
    let mut a = counter(c, ready);
    a.extend(["--hold", "nccl-thread"].iter().chain(extra).map(|s| s.to_string()));
    a
}

/// Issue 38 (a): NCCL ranks of a plain checkpoint job on the r580 driver
/// (the simulated node's) are refused before anything is locked, with the
/// option that would let them be checkpointed; the job starts over and
/// completes, the node stays in service.
#[test]
fn nccl_ranks_without_the_portable_mode_are_refused_before_the_lock_and_start_over() {
    let Some(_) = c() else { return };
    let _turn = serial();
    let submit = |c: &Cluster, who: Who, r: &Path| submit_low(c, who, "nccl-native", &nccl_rank(c, r, &[]));
    let needle = "runs a PyTorch NCCL process group (thread pt_nccl_watchdg); NVIDIA driver 580.159.04 cannot restore NCCL ranks after a \
                  checkpoint (CUDA IPC needs the r610 branch) unless they stay off CUDA IPC: submit with \
                  --gpu-mode=checkpoint:nccl=portable: refused, nothing was changed";
    submitted_checkpoint_starts_over("nccl-native", submit, |_, _| {}, needle, true);
}

/// Issue 38 (a'): the portable mode, but the batch script sets one of its
/// variables otherwise: gpu-mode-run keeps it and says so, the agent reads
/// it in the rank's environment and refuses before the lock; the job
/// starts over.
#[test]
fn an_nccl_variable_the_job_overrides_is_said_and_refused_before_the_lock() {
    let Some(_) = c() else { return };
    let _turn = serial();
    let submit = |c: &Cluster, who: Who, r: &Path| {
        let exports = [("NCCL_SHM_DISABLE", "0")];
        submit_low_mode(c, who, "nccl-override", &nccl_rank(c, r, &[]), "checkpoint:nccl=portable", &exports).unwrap()
    };
    let needle = "in --gpu-mode=checkpoint:nccl=portable, but its environment has NCCL_SHM_DISABLE=0 (the mode needs NCCL_SHM_DISABLE=1)";
    submitted_checkpoint_starts_over("nccl-override", submit, |_, _| {}, needle, true);
    let c = c().unwrap();
    let job = last_job_named(c, "nccl-override");
    let out = c.job_output(job);
    assert!(out.contains("gpu-mode-run: warning: --gpu-mode=checkpoint:nccl=portable, but the job's environment sets NCCL_SHM_DISABLE=0"), "{out}");
}

/// The newest job of this cluster named `name`.
fn last_job_named(c: &Cluster, name: &str) -> u32 {
    let out = c.client("squeue", &["-h", "-t", "all", "-n", name, "-o", "%i"]).run_as_root().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.split_whitespace().filter_map(|j| j.parse().ok()).max().unwrap_or_else(|| panic!("no job {name}: {text}"))
}

/// Issue 38 (b): in the portable mode gpu-mode-run gives the rank NCCL's
/// portable variables, the rank stays off CUDA IPC, and the job is
/// preempted, checkpointed, requeued, restored and completes, every step
/// once.
#[test]
fn nccl_ranks_in_the_portable_mode_are_checkpointed_and_restored() {
    let Some(c) = c() else { return };
    let _turn = serial();
    let who = job_user();
    let ready = c.dir.join("out").join(format!("nccl-portable-{}.ready", std::process::id()));
    let job = submit_low_mode(c, who, "nccl-portable", &nccl_rank(c, &ready, &[]), "checkpoint:nccl=portable", &[]).unwrap();
    wait_steps(c, job, 5);
    let app: i32 = std::fs::read_to_string(&ready).unwrap().trim().parse().unwrap();
    let environ = std::fs::read(format!("/proc/{app}/environ")).unwrap();
    assert_eq!(gpu_mode_core::preempt::nccl::environ_override(&environ), None, "the rank starts with every portable variable");
    let preemptor = submit_preemptor(c, None, None, 2, 2);
    wait_requeued(c, job, 1);
    assert!(Manifest::load(&images(c).join(job.to_string()).join("0")).is_ok(), "{}", c.job_output(job));
    wait_finished(c, preemptor);
    let end = wait_finished(c, job);
    let out = c.job_output(job);
    assert_eq!((end.get("ExitCode"), end.restarts()), (format!("{EXIT}:0").as_str(), 1), "{out}");
    assert_counted_once(&out);
    assert!(out.contains("nccl transport portable") && !out.contains("nccl transport p2p"), "{out}");
    assert!(out.contains(&format!("gpu-mode-run: job {job} restored (pid {app}")), "{out}");
    assert_images_removed(c, job);
    assert_nothing_stuck(c, job);
}

/// Issue 38 (c): a rank of a portable-mode job that turns P2P back on in
/// its own environment before NCCL's init (invisible to the agent, which
/// reads the initial one) is checkpointed; its restore fails as on the
/// r580 driver (801): the restored processes are killed, the job fails with
/// the driver's words, nothing hangs, nothing is half restored, no drain.
#[test]
fn an_nccl_rank_that_used_p2p_anyway_fails_its_restore_cleanly() {
    let Some(c) = c() else { return };
    let _turn = serial();
    let who = job_user();
    let ready = c.dir.join("out").join(format!("nccl-p2p-{}.ready", std::process::id()));
    let rank = nccl_rank(c, &ready, &["--nccl-setenv", "NCCL_P2P_DISABLE=0"]);
    let job = submit_low_mode(c, who, "nccl-p2p", &rank, "checkpoint:nccl=portable", &[]).unwrap();
    wait_steps(c, job, 5);
    let app: i32 = std::fs::read_to_string(&ready).unwrap().trim().parse().unwrap();
    let image_pids = {
        let preemptor = submit_preemptor(c, None, None, 2, 2);
        wait_requeued(c, job, 1);
        let pids = Manifest::load(&images(c).join(job.to_string()).join("0")).map(|m| m.pids).unwrap_or_else(|e| panic!("{e}\n{}", c.job_output(job)));
        wait_finished(c, preemptor);
        pids
    };
    let dumped_at = last_step(c, job);
    let end = wait_finished(c, job);
    let out = c.job_output(job);
    assert!(out.contains("nccl transport p2p"), "{out}");
    assert_eq!((end.get("ExitCode"), end.restarts()), ("1:0", 1), "{out}");
    let line = out.lines().rfind(|l| l.contains(&format!("gpu-mode-run: cannot restore job {job}: CUDA restore failed: "))).unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("CUDA_ERROR_NOT_SUPPORTED") && line.ends_with("the restored processes were killed, the image is kept"), "{line}");
    assert_eq!(last_step(c, job), dumped_at, "the restored rank never ran:\n{out}");
    assert!(image_pids.iter().chain([&app]).all(|p| gpu_mode_core::procfs::read(*p).is_none()), "no process of the image runs");
    assert_nothing_stuck(c, job);
    // Kept by the epilog (a refused restore's image), removed here.
    wait_for("the epilog", Duration::from_secs(20), || c.hook_log_lines(job).iter().filter(|l| l.contains("action=epilog")).count() == 2);
    std::fs::remove_dir_all(images(c).join(job.to_string())).unwrap();
}

/// Issue 39: a `pool=on` job. The agent sizes the application's host memory
/// pool from its simulated GPU memory, the huge-page shim populates it while
/// the job runs, the driver's checkpoint buffer is served from it at the
/// preemption (all of it populated before the signal), the restored job
/// frees the buffer off the restore's path and builds a new pool, and the
/// job completes every step once; the pool's directory goes with the job.
/// The CPUs `pid` may run on (`Cpus_allowed_list`: `0-3,8,10-11`).
fn cpus_allowed(pid: i32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let list = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap().trim();
    list.split(',')
        .map(|range| match range.split_once('-') {
            Some((a, b)) => b.parse::<usize>().unwrap() - a.parse::<usize>().unwrap() + 1,
            None => 1,
        })
        .sum()
}

#[test]
fn a_pool_job_checkpoints_into_memory_populated_before_the_signal_and_is_restored() {
    let Some(c) = c() else { return };
    let _turn = serial();
    let who = job_user();
    const MIB: u64 = 96;
    const N: u64 = 200;
    let ready = c.dir.join("out").join(format!("pool-{}.ready", std::process::id()));
    let mut app_args = counter_of(c, N, EXIT, Some(&ready));
    let mib = app_args.iter().position(|a| a == "--mib").unwrap() + 1;
    app_args[mib] = MIB.to_string();
    // EAGER: the simulated driver maps no GPU file, which is what starts the
    // pool's thread in a process of the real driver (hugepages/tests/pool.rs
    // tests that start).
    let exports = [("GPU_MODE_HUGEPAGES_LOG", "1"), ("GPU_MODE_POOL_EAGER", "1")];
    let job = submit_low_mode(c, who, "pool", &app_args, "checkpoint:pool=on", &exports).unwrap();
    wait_steps(c, job, 3);
    let app: i32 = std::fs::read_to_string(&ready).unwrap().trim().parse().unwrap();
    let dir = c.runtime_dir().join("pool").join(job.to_string());
    let link = dir.join(app.to_string());
    wait_for("the agent to size the pool", Duration::from_secs(20), || std::fs::read_link(&link).is_ok());
    assert_eq!(std::fs::read_link(&link).unwrap(), Path::new(&MIB.to_string()), "the pool is the GPU footprint");
    let held = || gpu_mode_core::cuda_ckpt::host_room::pool_bytes(Path::new("/proc"), app);
    wait_for("the shim to populate the pool", Duration::from_secs(20), || held() >= MIB << 20);
    // The shim splits the driver's copies across copy_threads (8) threads,
    // never more than the CPUs the application may run on.
    let threads = cpus_allowed(app).min(8);
    let preemptor = submit_preemptor(c, None, None, 2, 2);
    wait_requeued(c, job, 1);
    wait_finished(c, preemptor);
    let end = wait_finished(c, job);
    let out = c.job_output(job);
    assert_eq!((end.get("ExitCode"), end.restarts()), (format!("{EXIT}:0").as_str(), 1), "{out}");
    if let Err(e) = counted_once(&out, N) {
        panic!("{e}:\n{out}");
    }
    let lent = format!("gpu-mode-pool: lent {MIB} MiB, {MIB} MiB populated before, 0 MiB made");
    assert!(out.contains(&lent), "missing {lent:?} in:\n{out}");
    let served = "GPU memory free ";
    let line = out.lines().find(|l| l.contains(&format!("gpu-mode-run: job {job} checkpointed: ")) && l.contains(served)).unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("(its buffers' 0.09 GiB populated before the signal, in the host memory pool); requeueing"), "{line}");
    assert!(out.contains(&format!("gpu-mode-pool: buffer freed {MIB} MiB")), "the restored process freed the buffer:\n{out}");
    // The simulated driver copies through memcpy, 2 MiB at a time, as the
    // real one: the shim split every piece into and out of the buffer.
    let split = format!("gpu-mode-copy: buffer {MIB} MiB, {MIB} MiB in and {MIB} MiB out by {threads} threads in ");
    assert_eq!(out.contains(&split), threads > 1, "{split:?} ({threads} threads) in:\n{out}");
    assert!(out.contains(&format!("gpu-mode-run: job {job} restored (pid {app}")), "{out}");
    assert_images_removed(c, job);
    assert_nothing_stuck(c, job);
    assert!(!dir.exists(), "the pool directory goes with the job");
}
