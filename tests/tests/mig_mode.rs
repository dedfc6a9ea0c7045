//! `--gpu-mode=mig` on a real Slurm with two simulated H200s: jobs of two
//! users at once on different GPUs with different layouts, each task with a
//! MIG device of its own job; a layout that does not fit refused before
//! anything is made; named layouts; a leftover process killed by the
//! epilog; the epilog twice.

use gpu_mode_tests::shared::cluster_with;
use gpu_mode_tests::Cluster;
use std::collections::BTreeSet;

fn c() -> &'static Cluster {
    // The harness defines the layout half = "3g.71gbx2".
    cluster_with("mig_mode", 2, |_| {})
}

/// One test at a time: each checks the GPUs its jobs used (instances gone,
/// MIG off), which another test's job on the same GPU would upset.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Each task prints its local id, its CUDA_VISIBLE_DEVICES and the job's list.
const TASKS: &str = "#!/bin/sh\nsrun -n2 sh -c 'echo task=$SLURM_LOCALID cvd=$CUDA_VISIBLE_DEVICES all=$SLURM_GPU_MODE_MIG_UUIDS'\n";

struct Seen {
    per_task: Vec<String>,
    all: Vec<String>,
}

fn seen(output: &str) -> Seen {
    let mut per_task = Vec::new();
    let mut all = BTreeSet::new();
    for line in output.lines().filter(|l| l.starts_with("task=")) {
        let field = |k: &str| line.split_whitespace().find_map(|w| w.strip_prefix(k)).unwrap_or_default().to_string();
        per_task.push(field("cvd="));
        all.insert(field("all="));
    }
    assert_eq!(all.len(), 1, "every task must see the same list: {output}");
    let all = all.into_iter().next().unwrap().split(',').map(String::from).collect();
    Seen { per_task, all }
}

/// [`TASKS`] once the other job (`other`) runs too: both hold their GPU at
/// once (else, on a loaded machine, the second may start after the first
/// ended, on the same GPU, and get the same instance ids).
fn at_once(me: &str, other: &str) -> String {
    let d = c().dir.join("out");
    let (mine, theirs) = (d.join(format!("mig-{me}.here")), d.join(format!("mig-{other}.here")));
    format!(
        "#!/bin/sh\n: > {}\ni=0\nwhile [ ! -e {} ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i + 1)); done\n{}",
        mine.display(),
        theirs.display(),
        TASKS.trim_start_matches("#!/bin/sh\n")
    )
}

#[test]
fn two_users_jobs_get_their_own_layouts_and_devices_at_once() {
    let _turn = serial();
    for who in ["a", "b"] {
        let _ = std::fs::remove_file(c().dir.join("out").join(format!("mig-{who}.here")));
    }
    let (script_a, script_b) = (at_once("a", "b"), at_once("b", "a"));
    let a = std::thread::spawn(move || c().sbatch_wait(Some("gmtest1"), &["-n2", "--gres=gpu:1", "--gpu-mode=mig:3g.71gbx2"], &script_a));
    let b = std::thread::spawn(move || c().sbatch_wait(Some("gmtest2"), &["-n2", "--gres=gpu:1", "--gpu-mode=mig:1g.18gbx3"], &script_b));
    let (a, b) = (a.join().unwrap().unwrap(), b.join().unwrap().unwrap());
    assert_eq!((a.exit_code, b.exit_code), (0, 0), "{}\n{}\n{}", a.output, b.output, c().logs_tail());
    let (sa, sb) = (seen(&a.output), seen(&b.output));
    assert_eq!((sa.all.len(), sb.all.len()), (2, 3), "{}\n{}", a.output, b.output);
    for s in [&sa, &sb] {
        assert_eq!(s.per_task.len(), 2);
        assert_ne!(s.per_task[0], s.per_task[1], "each task its own MIG device");
        assert!(s.per_task.iter().all(|d| d.starts_with("MIG-") && s.all.contains(d)), "{:?} / {:?}", s.per_task, s.all);
    }
    assert!(sa.all.iter().all(|u| !sb.all.contains(u)), "the jobs share no device");
    // Both epilogs ran: nothing left, MIG mode back off on both GPUs.
    for gpu in 0..2 {
        c().wait_until("instances destroyed", || c().sim_gpu(gpu).unwrap()["instances"].as_array().is_some_and(|a| a.is_empty()));
        c().wait_until("MIG switched off", || c().sim_gpu(gpu).unwrap()["mig_current"] == false);
    }
}

#[test]
fn a_layout_that_does_not_fit_is_refused_before_any_instance_is_made() {
    let _turn = serial();
    let job = c().sbatch_wait(Some("gmtest1"), &["--gres=gpu:1", "--gpu-mode=mig:3g.71gbx3"], "#!/bin/sh\necho ran\n").unwrap();
    assert_ne!(job.exit_code, 0);
    assert!(!job.output.contains("ran"), "{}", job.output);
    assert!(job.output.contains("does not fit") && job.output.contains("mig:3g.71gbx2"), "{}", job.output);
    let prolog = c().hook_log_lines(job.id).into_iter().find(|l| l.contains("action=prolog")).unwrap_or_default();
    assert!(prolog.contains("outcome=refused"), "{prolog}");
    assert!(!c().node_state().unwrap().0.contains("DRAIN"));
}

#[test]
fn a_named_layout_comes_from_the_site_config() {
    let _turn = serial();
    let job = c().sbatch_wait(Some("gmtest2"), &["-n2", "--gres=gpu:1", "--gpu-mode=mig:@half"], TASKS).unwrap();
    assert_eq!(job.exit_code, 0, "{}", job.output);
    assert_eq!(seen(&job.output).all.len(), 2);
    let job = c().sbatch_wait(Some("gmtest2"), &["--gres=gpu:1", "--gpu-mode=mig:@nope"], "#!/bin/sh\ntrue\n").unwrap();
    assert!(job.output.contains("MIG layout \"nope\" is not defined"), "{}", job.output);
}

#[test]
fn the_epilog_kills_a_leftover_process_on_the_jobs_instance_and_twice_is_safe() {
    let _turn = serial();
    let cl = c();
    let out = cl
        .client("sbatch", &["--parsable", "--gres=gpu:1", "--gpu-mode=mig:7g.141gb", "--wrap", "sleep 4"])
        .run_as(Some("gmtest1"))
        .unwrap();
    let job: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().expect("a job id");
    let state_file = cl.runtime_dir().join(format!("jobs/{job}.json"));
    cl.wait_until("the job's MIG instance", || {
        std::fs::read_to_string(&state_file).map(|t| t.contains("\"made\": true")).unwrap_or(false)
    });
    let state: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&state_file).unwrap()).unwrap();
    let gpu = state["grant"]["gpus"][0]["gpu"].as_u64().unwrap();
    let gi = state["grant"]["gpus"][0]["instances"][0]["gpu_instance"].as_u64().unwrap();
    // A process of the job's user that escaped the job and holds the instance.
    let uid = gpu_mode_tests::users::lookup("gmtest1").unwrap().uid;
    let mut leftover = std::process::Command::new("/bin/sleep");
    std::os::unix::process::CommandExt::uid(leftover.arg("300"), uid);
    let mut leftover = leftover.spawn().unwrap();
    let pid = leftover.id().to_string();
    cl.sim_ctl(&["process", "add-live", &pid, "--gpu", &gpu.to_string(), "--gi", &gi.to_string(), "--ci", "0"]).unwrap();
    cl.wait_until("the epilog", || cl.hook_log_lines(job).iter().any(|l| l.contains("action=epilog")));
    let epilog = cl.hook_log_lines(job).into_iter().find(|l| l.contains("action=epilog")).unwrap();
    assert!(epilog.contains("outcome=ok") && epilog.contains(&format!("killed the job's leftover pids [{pid}]")), "{epilog}");
    let status = leftover.wait().unwrap();
    assert!(status.code().is_none(), "the leftover must have been killed: {status}");
    assert!(cl.sim_gpu(gpu as usize).unwrap()["instances"].as_array().unwrap().is_empty());
    assert!(!cl.node_state().unwrap().0.contains("DRAIN"));
    // The epilog again (slurmd restarted, say): nothing to do, no error.
    let again = cl.run_hook("epilog", job, "gmtest1", &gpu.to_string(), "mig:7g.141gb").unwrap();
    assert!(again.status.success(), "{}", String::from_utf8_lossy(&again.stderr));
    let last = cl.hook_log_lines(job).into_iter().rfind(|l| l.contains("action=epilog")).unwrap();
    assert!(last.contains("outcome=skipped"), "{last}");
}
