//! `--gpu-mode=checkpoint` across nodes: two slurmd nodes on this machine
//! (`gma`, `gmb`; each in network and mount namespaces of its own, with its
//! own address, runtime directory and simulated GPUs with other UUIDs:
//! gpu_mode_tests::netns). A job preempted on `gma` while the preemptor
//! keeps `gma` busy is requeued, lands on `gmb`, and is restored there from
//! the image directory both nodes share, onto `gmb`'s GPU through the
//! manifest's device map; on a `gmb` with another NVIDIA driver the restore
//! is refused, the image kept, and restored once the driver matches. Who
//! runs the job: as in preempt_checkpoint.rs. The scenarios take turns (one
//! preemptor would preempt the other's job). Needs root, `ip`, CRIU 4 and
//! `cargo build --workspace`.

use gpu_mode_core::preempt::manifest::Manifest;
use gpu_mode_tests::ckpt_jobs::*;
use gpu_mode_tests::Cluster;
use std::os::unix::fs::MetadataExt;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

const NODES: [&str; 2] = TWO_NODES;

fn c() -> Option<&'static Cluster> {
    two_node_cluster("preempt_other_node", 2)
}

fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Sets the NVIDIA driver version node `node`'s simulated NVML reports,
/// under the lock the simulation's readers take.
fn set_driver(c: &Cluster, node: &str, version: &str) {
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsRawFd;
    let path = c.spec.node_dir(node).join("sim/nvml-state.json");
    let mut f = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) }, 0);
    let mut text = String::new();
    f.read_to_string(&mut text).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["driver_version"] = version.into();
    let text = serde_json::to_string_pretty(&v).unwrap();
    f.set_len(0).unwrap();
    f.rewind().unwrap();
    f.write_all(text.as_bytes()).unwrap();
}

/// A node's simulated GPU UUIDs, in NVML order.
fn uuids(c: &Cluster, node: &str) -> Vec<String> {
    let state: serde_json::Value = serde_json::from_slice(&std::fs::read(c.spec.node_dir(node).join("sim/nvml-state.json")).unwrap()).unwrap();
    state["gpus"].as_array().unwrap().iter().map(|g| g["uuid"].as_str().unwrap().to_string()).collect()
}

/// The network namespace a process is in, as its inode.
fn net_ns(pid: &str) -> u64 {
    std::fs::metadata(format!("/proc/{pid}/ns/net")).unwrap().ino()
}

#[test]
fn a_job_preempted_on_one_node_is_restored_on_the_other_onto_its_gpus() {
    let Some(c) = c() else { return };
    let _turn = serial();
    let who = job_user();
    eprintln!("the job runs as {who:?}");
    let (a, b) = (uuids(c, NODES[0]), uuids(c, NODES[1]));
    assert!(a.iter().all(|u| !b.contains(u)), "the nodes' GPUs differ: {a:?} {b:?}");
    let (job, ready) = start_counter(c, who, "moved", 5);
    assert_eq!(c.job(job).unwrap().get("NodeList"), NODES[0], "an idle cluster starts it on the first node");
    let app = std::fs::read_to_string(&ready).unwrap().trim().to_string();
    let ns_a = net_ns(&app);

    // The preemptor takes gma for long enough: the requeued job can only go to gmb.
    let preemptor = submit_preemptor(c, Some("gmtest2"), Some(NODES[0]), 2, 60);
    wait_requeued(c, job, 1);
    let m = Manifest::load(&images(c).join(job.to_string()).join("0")).unwrap();
    assert_eq!(m.node, NODES[0]);
    assert_eq!(m.gpus.iter().map(|g| g.uuid.to_string()).collect::<Vec<_>>(), vec![a[0].clone()]);

    let running = c.wait_job(job, "the run on gmb", LONG, |j| j.state() == "RUNNING" && j.restarts() == 1).unwrap();
    assert_eq!(running.get("NodeList"), NODES[1]);
    wait_for("the restore", LONG, || c.job_output(job).contains("restored (pid"));
    // The same pid (CRIU keeps it), now in gmb's network namespace.
    let ns_b = net_ns(&app);
    assert_ne!(ns_a, ns_b);
    let slurmd_b = std::fs::read_to_string(c.dir.join(format!("slurmd-{}.pid", NODES[1]))).unwrap();
    assert_eq!(ns_b, net_ns(slurmd_b.trim()), "the restored process runs in gmb's namespace");

    let end = wait_finished(c, job);
    let _ = c.client("scancel", &[&preemptor.to_string()]).run_as(Some("gmtest2"));
    let out = c.job_output(job);
    assert_eq!((end.get("ExitCode"), end.restarts()), (format!("{EXIT}:0").as_str(), 1), "{out}");
    assert!(out.contains(&format!("gpu-mode-run: job {job} run 1: restoring the checkpoint taken in run 0 on {}", NODES[0])), "{out}");
    assert!(out.contains(&format!("GPUs [(\"{}\", \"{}\")]", a[0], b[0])), "the device map from the manifest: {out}");
    assert_counted_once(&out);
    let all = steps(&out);
    assert_eq!(all.first().unwrap().1, a[0]);
    assert_eq!(all.last().unwrap().1, b[0], "counting went on on gmb's GPU");
    // The job's history in Slurm names both nodes.
    let (events, comment) = recorded_events(c, job);
    assert_eq!(events, ["ckpt=r0@gma", "restore=r1@gmb"], "{comment}");
    assert_images_removed(c, job);
    wait_for("the agents to exit", Duration::from_secs(20), || agents(c, job).is_empty());
    for node in NODES {
        let (state, reason) = c.node_state_of(node).unwrap();
        assert!(!state.contains("DRAIN") && !state.contains("DOWN"), "{node}: {state} {reason}");
    }
}

/// A process of `user` holding pid `pid` (free now): the pid allocator is
/// set just below it (`ns_last_pid`, root's) and a `sleep` forked, until
/// the fork gets it (other processes of the host may fork meanwhile).
fn hold_pid(pid: i32, user: &str) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let u = gpu_mode_tests::users::lookup(user).unwrap();
    for _ in 0..200 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).unwrap();
        let mut child = std::process::Command::new("sleep").arg("600").uid(u.uid).gid(u.gid).spawn().unwrap();
        if child.id() as i32 == pid {
            return child;
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!("no fork got pid {pid} in 200 tries");
}

/// The F7 defence, end to end: job `name` (the counter with `extra`
/// arguments) is preempted on gma; after its dump, gmtest2 holds the id
/// `pick` chooses from the manifest, on the machine both nodes share, until
/// the requeued run on gmb has moved the job. That run names the id, keeps
/// the image and requeues the job with gmb excluded; it is restored on gma
/// and counts to its end. Returns the id and the run's refusal line.
fn a_held_id_moves_the_restore(c: &Cluster, name: &str, extra: &[&str], pick: impl Fn(&Manifest) -> i32) -> (i32, String) {
    let ready = c.dir.join("out").join(format!("{name}-{}.ready", std::process::id()));
    let mut app = counter(c, &ready);
    app.extend(extra.iter().map(|a| a.to_string()));
    let job = submit_low(c, job_user(), name, &app);
    wait_steps(c, job, 5);
    assert_eq!(c.job(job).unwrap().get("NodeList"), NODES[0]);
    let preemptor = submit_preemptor(c, Some("gmtest2"), Some(NODES[0]), 2, 45);
    wait_requeued(c, job, 1);
    // Before the requeued run may start on gmb (its credential has 10 s to expire).
    let m = Manifest::load(&images(c).join(job.to_string()).join("0")).unwrap_or_else(|e| panic!("{e}\n{}", c.job_output(job)));
    let id = pick(&m);
    let mut holder = hold_pid(id, "gmtest2");
    let moved = c.wait_job(job, "the run on gmb to move the job", LONG, |j| j.restarts() == 2 && j.get("ExcNodeList") == NODES[1]);
    let _ = holder.kill();
    let _ = holder.wait();
    moved.unwrap_or_else(|e| panic!("{e}\n{}", c.job_output(job)));
    let end = c.wait_job(job, "the restored run", LONG, |j| j.restarts() == 2 && finished(j)).unwrap();
    let _ = c.client("scancel", &[&preemptor.to_string()]).run_as(Some("gmtest2"));
    let out = c.job_output(job);
    assert_eq!((end.get("NodeList"), end.get("ExitCode")), (NODES[0], format!("{EXIT}:0").as_str()), "{out}");
    let line = out.lines().find(|l| l.contains("cannot restore job")).unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains(&format!("cannot restore job {job} on {}: ", NODES[1])), "{line}");
    assert!(line.contains("the image is kept; requeueing it to be restored on another node (ExcNodeList=gmb)"), "{line}");
    assert!(out.contains(&format!("job {job} run 2: restoring the checkpoint taken in run 0 on gma")), "{out}");
    assert_counted_once(&out);
    let (events, comment) = recorded_events(c, job);
    assert_eq!(events, ["ckpt=r0@gma", "restore-failed=r1@gmb", "restore=r2@gma"], "{comment}");
    assert_images_removed(c, job);
    (id, line.to_string())
}

/// Security review F7: a second user's process holds a pid of the image on
/// the node the requeued job lands on (both nodes share this machine's pid
/// space). The restore there fails naming the process, the image is kept,
/// and gpu-mode-run requeues the job with that node excluded; it is then
/// restored on the other node (before: the job failed on gmb).
#[test]
fn a_pid_held_on_the_node_the_job_lands_on_moves_its_restore_to_another_node() {
    let Some(c) = c() else { return };
    let _turn = serial();
    let (pid, line) = a_held_id_moves_the_restore(c, "pidheld", &[], |m| m.root_pid);
    let uid = gpu_mode_tests::users::lookup("gmtest2").unwrap().uid;
    let needle = format!("pid {pid} is in use on this node (sleep, uid {uid}");
    assert!(line.contains(&needle), "{needle:?} not in {line:?}");
}

/// The job lands on a gmb whose driver differs from gma's: one line says
/// why, nothing is restored, the image is kept; with the driver matching
/// again, `scontrol requeue` restores it there.
#[test]
fn a_node_with_another_driver_refuses_the_restore_and_keeps_the_image() {
    let Some(c) = c() else { return };
    let _turn = serial();
    let who = job_user();
    let (job, _) = start_counter(c, who, "driver", 5);
    assert_eq!(c.job(job).unwrap().get("NodeList"), NODES[0]);
    let preemptor = submit_preemptor(c, Some("gmtest2"), Some(NODES[0]), 2, 90);
    wait_requeued(c, job, 1);
    // Before the requeued run may start (its credential has 10 s to expire).
    set_driver(c, NODES[1], "570.86.10");
    let dumped_at = last_step(c, job);
    let end = c.wait_job(job, "the refused run", LONG, |j| j.restarts() == 1 && finished(j)).unwrap();
    set_driver(c, NODES[1], "580.159.04");
    let out = c.job_output(job);
    assert_eq!((end.get("NodeList"), end.get("ExitCode")), (NODES[1], "1:0"), "{out}");
    let line = out.lines().find(|l| l.contains("cannot restore job")).unwrap_or_else(|| panic!("{out}"));
    assert!(
        line.contains("the image was taken with NVIDIA driver 580.159.04 (node gma); this node has 570.86.10") && line.ends_with("the image is kept"),
        "{line}"
    );
    assert_eq!(last_step(c, job), dumped_at, "nothing was restored or started:\n{out}");
    let run0 = images(c).join(job.to_string()).join("0");
    wait_for("the epilog", Duration::from_secs(20), || agents(c, job).is_empty());
    assert!(Manifest::load(&run0).is_ok(), "the image is kept through the epilog");

    let requeue = c.client("scontrol", &["requeue", &job.to_string()]).run_as_root().unwrap();
    assert!(requeue.status.success(), "{}", String::from_utf8_lossy(&requeue.stderr));
    let end = c.wait_job(job, "the restored run", LONG, |j| j.restarts() == 2 && finished(j)).unwrap();
    let _ = c.client("scancel", &[&preemptor.to_string()]).run_as(Some("gmtest2"));
    let out = c.job_output(job);
    assert_eq!((end.get("NodeList"), end.get("ExitCode")), (NODES[1], format!("{EXIT}:0").as_str()), "{out}");
    assert_counted_once(&out);
    assert!(out.contains(&format!("job {job} run 2: restoring the checkpoint taken in run 0 on gma")), "{out}");
    let (events, comment) = recorded_events(c, job);
    assert_eq!(events, ["ckpt=r0@gma", "restore-failed=r1@gmb", "restore=r2@gmb"], "{comment}");
    assert_images_removed(c, job);
}

/// Security review N3 under a real Slurm (issue 37): the F7 defence for a
/// thread id. The job runs a second thread, and gmtest2 holds that
/// thread's id (not a pid): the requeued run on gmb cannot give the thread
/// its id back (CRIU's `Unable to create a thread: -17`), so gpu-mode-run
/// keeps the image and moves the job, which is restored on gma once the id
/// is free. Before: the manifest had no thread ids, and the job failed.
#[test]
fn a_thread_id_held_on_the_node_the_job_lands_on_moves_its_restore_to_another_node() {
    let Some(c) = c() else { return };
    let _turn = serial();
    let thread = |m: &Manifest| {
        *m.tids.iter().find(|t| !m.pids.contains(t)).unwrap_or_else(|| panic!("no thread id besides the pids in the manifest: {:?} {:?}", m.pids, m.tids))
    };
    let (tid, line) = a_held_id_moves_the_restore(c, "tidheld", &["--hold", "thread"], thread);
    assert!(line.contains(&tid.to_string()), "the thread id {tid} is not named: {line}");
}
