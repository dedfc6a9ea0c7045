//! The agent's decisions against a recording CRIU and a driver without CUDA
//! processes, on real processes (a `sleep` run as nobody): what a dump
//! writes, that a failed dump leaves nothing that claims success, and that a
//! restore refuses a manifest of another user, a corrupt one, a changed
//! file or another driver, with the image kept and CRIU never called.
//! The full path (real CRIU, simulated CUDA) is checkpoint/tests/preempt_criu.rs.

use super::server::{authorize, Peer, Unauthorized};
use super::*;
use crate::cuda_ckpt::{DriverError, GpuInfoError, GpuPair, GpuProcess, GpuUuid, ProcFs, ProcessState};
use crate::criu::{CriuCall, CriuError, RecordingCriu};
use crate::images::ImageStore;
use crate::manifest::{Manifest, MANIFEST_FILE};
use crate::protocol::{self, Request, Response};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};

const NOBODY: u32 = 65534;
const GPU_A: &str = "GPU-00000000-0000-0000-0000-00000000000a";

struct NoCuda;

impl CudaCkptDriver for NoCuda {
    fn state(&self, pid: i32) -> Result<ProcessState, DriverError> {
        Err(DriverError::Call { call: "cuCheckpointProcessGetState", pid, code: 3, name: "CUDA_ERROR_NOT_INITIALIZED".into(), text: "x".into() })
    }
    fn restore_thread_id(&self, pid: i32) -> Result<i32, DriverError> {
        self.state(pid).map(|_| 0)
    }
    fn lock(&self, pid: i32, _: u32) -> Result<(), DriverError> {
        self.state(pid).map(|_| ())
    }
    fn checkpoint(&self, pid: i32) -> Result<(), DriverError> {
        self.state(pid).map(|_| ())
    }
    fn restore(&self, pid: i32, _: &[GpuPair]) -> Result<(), DriverError> {
        self.state(pid).map(|_| ())
    }
    fn unlock(&self, pid: i32) -> Result<(), DriverError> {
        self.state(pid).map(|_| ())
    }
}

struct RoomyGpus;

impl GpuInfo for RoomyGpus {
    fn compute_processes(&self) -> Result<Vec<GpuProcess>, GpuInfoError> {
        Ok(Vec::new())
    }
    fn free_bytes(&self, _: GpuUuid) -> Result<u64, GpuInfoError> {
        Ok(u64::MAX / 2)
    }
}

struct Fx {
    _dir: tempfile::TempDir,
    agent: Arc<Agent>,
    criu: Arc<RecordingCriu>,
}

/// Whether the running test can run: it needs root (processes run as nobody).
fn root_or_skip() -> bool {
    gpu_mode_testkit::root_or_skip("processes run as nobody")
}

fn fixture() -> Fx {
    fixture_with(false, crate::accounting::AccountingField::Off)
}

/// Stand-ins for scontrol and squeue in `<dir>/bin`: each call appends a
/// line to `<dir>/scontrol.calls`; squeue reports an unset field.
fn fake_scontrol(dir: &std::path::Path) -> std::path::PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir(&bin).unwrap();
    let calls = dir.join("scontrol.calls");
    for (name, answer) in [("scontrol", ""), ("squeue", "echo '(null)'")] {
        gpu_mode_testkit::script(&bin, name, &format!("echo \"$0 $*\" >> {}\n{answer}", calls.display()));
    }
    bin.join("scontrol")
}

/// The lines the fake scontrol and squeue recorded (one per call).
fn scontrol_calls(fx: &Fx) -> Vec<String> {
    let text = std::fs::read_to_string(fx._dir.path().join("scontrol.calls")).unwrap_or_default();
    text.lines().map(str::to_string).collect()
}

/// `counting`: with `[metrics] textfile` at `<dir>/gpu-mode.prom`;
/// `accounting`: the field written through the fake scontrol.
fn fixture_with(counting: bool, accounting: crate::accounting::AccountingField) -> Fx {
    fixture_opts(counting, accounting, false)
}

/// With `staged`, dumps go to `<dir>/staging` first (staging.rs) and a
/// restore waits for another node's copy for 1 s.
fn fixture_opts(counting: bool, accounting: crate::accounting::AccountingField, staged: bool) -> Fx {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    let scontrol = fake_scontrol(p);
    let settings = AgentSettings {
        socket_dir: p.join("sock"),
        images: ImageStore::new(p.join("images")),
        checkpoint: crate::cuda_ckpt::Settings {
            lock_timeout_ms: 1000,
            memory_margin_bytes: 0,
            record_dir: p.join("records"),
            call_timeout: Duration::from_secs(5),
        },
        tcp_established: false,
        netlocks: crate::netlock::NetLocks {
            dir: p.join("run/netlocks"),
            nft: crate::netlock::Nft { binary: p.join("no-nft") },
            dump_bound: Duration::from_secs(60),
        },
        ghost_limit_bytes: 1 << 20,
        max_deleted_files: 64,
        pool_dir: p.join("run/pool"),
        pool_bounds: crate::pool::Bounds { max_bytes: 1 << 30, reserve_bytes: 0 },
        restore_map_buffers: true,
        staging: staged.then(|| crate::staging::Staging { local: ImageStore::new(p.join("staging")), copy_bytes_per_s: 0 }),
        staging_wait: Duration::from_secs(1),
        early_writeback: true,
        pid_wait: Duration::from_secs(2),
        idle_exit: Duration::from_secs(3600),
        start_grace: Duration::from_secs(3600),
        dump_wait: Duration::from_secs(5),
        request_wait: Duration::from_secs(1),
        log: LogConfig { syslog: false, stderr: false },
        events: counting.then(|| {
            let mut cfg = crate::Config::default();
            cfg.runtime_dir = p.join("run");
            cfg.preempt.image_dir = p.join("images");
            cfg.preempt.agent_socket_dir = Some(p.join("sock"));
            cfg.metrics.textfile = Some(p.join("gpu-mode.prom"));
            cfg.log = LogConfig { syslog: false, stderr: false };
            gpu_mode_core::observe::recorder(&cfg)
        }),
        accounting,
        scontrol,
        restore_hold: None,
    };
    let params = AgentParams {
        run: JobRun { job: 7, restart_count: 0, uid: NOBODY, gid: NOBODY, node: "n1".into() },
        gpus: vec![GpuFacts { uuid: GpuUuid::parse(GPU_A).unwrap(), name: "NVIDIA H200".into() }],
        deadline: None,
        nccl: gpu_mode_base::gpu_mode::NcclTransport::Native,
        pool: false,
        job_nodes: vec![],
    };
    let criu = Arc::new(RecordingCriu::default());
    // `<dir>/gpus/` plays the simulated driver's device-memory folder.
    let host = ProcFs { device_prefixes: vec!["/dev/nvidia".into(), format!("{}/gpus/", p.display())], ..ProcFs::default() };
    let backends = Backends { criu: criu.clone(), driver: Arc::new(NoCuda), host: Arc::new(host), gpus: Arc::new(RoomyGpus) };
    let facts = NodeFacts { driver_version: "580.159.04".into(), cuda_version: 13000, node_gpus: vec![GpuUuid::parse(GPU_A).unwrap()] };
    Fx { _dir: dir, agent: Arc::new(Agent::new(params, settings, facts, backends)), criu }
}

/// `sleep` as nobody, in a session of its own: the "application".
fn app() -> Child {
    app_with_env(&[])
}

fn app_with_env(vars: &[(&str, &str)]) -> Child {
    let mut cmd = Command::new("/bin/sleep");
    cmd.arg("30").envs(vars.iter().copied());
    as_nobody(cmd)
}

/// `cmd` as nobody, in a session of its own, without inherited terminal (a
/// restored tree's files are checked as its user, held.rs).
fn as_nobody(mut cmd: Command) -> Child {
    let null = std::process::Stdio::null;
    cmd.stdin(null()).stdout(null()).stderr(null());
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            if libc::setgroups(0, std::ptr::null()) != 0 || libc::setgid(NOBODY) != 0 || libc::setuid(NOBODY) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn().unwrap()
}

fn me() -> Peer {
    Peer { pid: std::process::id() as i32, uid: 0 }
}

/// The recording CRIU's dump leaves `pid` stopped, as `criu dump
/// --leave-stopped` does; the agent then kills it.
fn stop_on_dump(fx: &Fx, pid: i32) {
    *fx.criu.on_dump.lock().unwrap() = Some(Box::new(move |_| unsafe {
        libc::kill(pid, libc::SIGSTOP);
    }));
}

/// A dump through the recording CRIU that leaves the tree stopped; the
/// agent kills it.
fn dumped(fx: &Fx) -> (Child, std::path::PathBuf) {
    let mut child = app();
    let pid = child.id() as i32;
    stop_on_dump(fx, pid);
    let s = fx.agent.checkpoint(me(), pid, Some(crate::now_ms())).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL), "the agent kills the dumped tree");
    (child, s.image_dir.into())
}

/// A failure after CRIU's dump (here the seal refuses a link left among
/// the images): the agent has killed the tree, and its answer says so
/// (`TreeLost`), so that the wrapper starts the job over instead of ending
/// it with the killed application's status.
#[test]
fn a_failure_after_the_dump_answers_that_the_tree_is_lost() {
    if !root_or_skip() {
        return;
    }
    let fx = fixture();
    let mut child = app();
    let pid = child.id() as i32;
    *fx.criu.on_dump.lock().unwrap() = Some(Box::new(move |req| {
        std::os::unix::fs::symlink("/etc/passwd", req.images_dir.join("files.img")).unwrap();
        unsafe { libc::kill(pid, libc::SIGSTOP) };
    }));
    match fx.agent.checkpoint_request(me(), pid, None) {
        Response::TreeLost { message } => {
            assert!(message.contains("cannot seal the images") && message.ends_with("the tree was dumped and killed, and the image is dropped"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    let status = child.wait().unwrap();
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL));
    assert!(!fx.agent.settings.images.run_dir(7, 0).exists(), "the image is removed");
}

/// A job preempted as its application starts: the application opens a GPU
/// file after the agent's scan and before CRIU freezes it (seen in the
/// churn test with the simulated driver, whose device files CRIU dumps as
/// regular files; the image then failed to restore and the job ended
/// FAILED). The image is dropped, the application runs on, as after any
/// failed dump, and the checkpoint is tried once more: its scan finds the
/// file. This driver knows no CUDA process, so the second attempt refuses
/// the holder before the lock (the wrapper then starts the job over); the
/// second attempt that succeeds is in checkpoint/tests/preempt_criu.rs.
#[test]
fn a_gpu_file_opened_while_crius_dump_began_drops_the_image_and_the_second_attempts_scan_finds_it() {
    use std::os::unix::fs::PermissionsExt;
    if !root_or_skip() {
        return;
    }
    let fx = fixture();
    let dir = fx._dir.path().to_path_buf();
    let device = dir.join("gpus/0.mem");
    std::fs::create_dir(dir.join("gpus")).unwrap();
    std::fs::write(&device, b"gpu").unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Opens the device file once `go` exists, and keeps it open.
    let script = r#"while [ ! -e "$1/go" ]; do sleep 0.01; done; exec 3<"$1/gpus/0.mem"; exec sleep 30"#;
    let mut cmd = Command::new("/bin/sh");
    cmd.args(["-c", script, "sh"]).arg(&dir);
    let mut child = as_nobody(cmd);
    let pid = child.id() as i32;
    let (go, opened) = (dir.join("go"), device.display().to_string());
    *fx.criu.on_dump.lock().unwrap() = Some(Box::new(move |_| {
        std::fs::write(&go, b"").unwrap();
        let holds = || crate::procfs::fd_links(std::path::Path::new(&format!("/proc/{pid}/fd"))).unwrap().iter().any(|(_, t)| *t == opened);
        let start = std::time::Instant::now();
        while !holds() {
            assert!(start.elapsed() < Duration::from_secs(10), "the application never opened the device file");
            std::thread::sleep(Duration::from_millis(5));
        }
        unsafe { libc::kill(pid, libc::SIGSTOP) };
    }));
    let e = fx.agent.checkpoint(me(), pid, None).unwrap_err();
    assert_eq!(e.reason(), Some(FailureReason::Uncheckpointable), "{e}");
    let err = e.to_string();
    let holds = format!("pid {pid} holds {} (fd 3) but the CUDA driver cannot checkpoint it", device.display());
    assert!(err.contains(&holds) && err.contains("refused, nothing was changed; at a second attempt, the first failed: "), "{err}");
    let first = format!("pid {pid} opened {} (fd 3) after the GPU scan and before CRIU froze the tree", device.display());
    assert!(err.ends_with(&format!("{first}: the image could never be restored and is dropped; the application runs on")), "{err}");
    let dumps = fx.criu.calls().iter().filter(|c| matches!(c, CriuCall::Dump(_))).count();
    assert_eq!(dumps, 1, "the second attempt stopped before CRIU");
    assert!(!fx.agent.settings.images.run_dir(7, 0).exists(), "the image is removed");
    assert_eq!(fx.agent.settings.images.latest(7), None);
    assert_eq!(child.try_wait().unwrap(), None, "the application still runs");
    assert_ne!(crate::procfs::read(pid).unwrap().state, 'T', "and is no longer stopped");
    child.kill().unwrap();
    child.wait().unwrap();
}

/// A job on several nodes (the prolog's `--job-nodes`): refused before
/// anything is locked or dumped, with the nodes and what to do; the
/// application runs on and no image is made (the job starts over).
#[test]
fn a_job_on_several_nodes_is_refused_before_anything_is_locked() {
    if !root_or_skip() {
        return;
    }
    let mut fx = fixture();
    Arc::get_mut(&mut fx.agent).unwrap().params.job_nodes = vec!["n1".into(), "n2".into()];
    let mut child = app();
    let e = fx.agent.checkpoint(me(), child.id() as i32, None).unwrap_err();
    assert_eq!(e.reason(), Some(FailureReason::Uncheckpointable));
    let err = e.to_string();
    assert!(err.contains("job 7 runs on 2 nodes (n1,n2), and checkpoint mode checkpoints the processes of one node (n1)"), "{err}");
    assert!(err.contains("refused, nothing was changed (submit it with -N 1 to have it checkpointed)"), "{err}");
    assert!(fx.criu.calls().iter().all(|c| !matches!(c, CriuCall::Dump(_))), "no dump");
    assert_eq!(fx.agent.settings.images.latest(7), None);
    assert_eq!(child.try_wait().unwrap(), None, "the application runs on");
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn a_dump_writes_its_manifest_last_with_the_job_and_user() {
    if !root_or_skip() {
        return;
    }
    let fx = fixture();
    let (child, run) = dumped(&fx);
    let m = Manifest::load(&run).unwrap();
    assert_eq!((m.job, m.uid, m.node.as_str(), m.root_pid, m.restart_count), (7, NOBODY, "n1", child.id() as i32, 0));
    assert_eq!(m.criu_version, "4.1.1");
    let names: Vec<&str> = m.images.iter().map(|f| f.name.as_str()).collect();
    // CRIU's log is not among the sealed files: it went to the work directory (N1).
    assert_eq!(names, ["core-1.img", "pages-1.img", "pstree.img"]);
    assert!(m.cuda.is_empty(), "sleep holds no GPU");
    // What a restore needs of the tree: no TCP connection, so neither
    // --tcp-established nor CAP_NET_ADMIN; its limits and confinement.
    assert!(!m.tcp_established);
    assert_eq!(m.limits.0.len(), 16, "{:?}", m.limits);
    assert!(m.privs.contains_key(&(child.id() as i32)), "{:?}", m.privs);
    assert!(m.timings.signal_to_gpu_free_ms.is_some());
    // The timeline, from the signal: every phase up to the seal, in order,
    // none before its predecessor began; the summary figures agree with it.
    let names: Vec<&str> = m.timeline.phases.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["request", "checks", "image-dir", "criu-dump", "writeback", "seal"], "{:?}", m.timeline);
    assert!(m.timeline.phases.windows(2).all(|w| w[1].start_ms + 1e-9 >= w[0].start_ms), "{:?}", m.timeline);
    assert_eq!(m.timings.criu_dump_ms, m.timeline.phase("criu-dump").unwrap().ms);
    assert_eq!(m.timings.signal_to_gpu_free_ms, m.timeline.end_of("checks"), "no GPU memory: free once checked");
    assert_eq!(m.timings.signal_to_durable_ms, Some(m.timeline.end_ms()));
    match &fx.criu.calls()[..] {
        [CriuCall::Check, CriuCall::Dump(d)] => {
            assert_eq!((d.pid, &d.images_dir, d.tcp_established), (child.id() as i32, &run, false));
            assert_eq!(d.work_dir, run.parent().unwrap().join(".criu-0-dump"));
            assert_eq!(d.limits, m.limits);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(fx.agent.settings.images.latest(7).map(|(r, _)| r), Some(0));
}

/// With staging_dir: the image lands on the node, the shared store records
/// it before the checkpoint is answered, the background copy publishes it
/// whole, and a restore on this node takes the local copy. A run staged on
/// another node whose copy never comes is given up (its record removed)
/// with a note, and nothing is restored.
#[test]
fn a_staged_dump_is_recorded_copied_in_the_background_and_restored_from_its_node_first() {
    if !root_or_skip() {
        return;
    }
    let fx = fixture_opts(false, crate::accounting::AccountingField::Off, true);
    let (_child, run) = dumped(&fx);
    let (local, shared) = (&fx.agent.settings.staging.as_ref().unwrap().local, &fx.agent.settings.images);
    assert_eq!(run, local.run_dir(7, 0), "the dump lands on the node");
    assert_eq!(shared.staged(7), [(0, "n1".to_string())], "recorded before the answer");
    fx.agent.finish_copies();
    let manifest = |dir: &std::path::Path| std::fs::read(dir.join(MANIFEST_FILE)).unwrap();
    assert_eq!(manifest(&shared.run_dir(7, 0)), manifest(&run), "the copy is published whole");
    assert!(Manifest::load(&shared.run_dir(7, 0)).unwrap().check_files(&shared.run_dir(7, 0)).is_ok());
    let (found, note) = fx.agent.locate();
    let found = found.unwrap();
    assert_eq!((found.restart, found.local, found.dir.as_path(), note), (0, true, run.as_path(), None), "the node's own copy first");
    // A newer run staged elsewhere whose copy never comes: given up.
    shared.record_staged(7, 1, "n2").unwrap();
    let (found, note) = fx.agent.locate();
    let note = note.unwrap();
    assert!(found.is_none(), "the older image is not restored over a newer run");
    assert!(note.contains("run 1's image from n2") && note.ends_with("nothing is restored from a partial copy"), "{note}");
    assert_eq!(shared.staged(7), [(0, "n1".to_string())], "the given-up run's record is removed");
}

#[test]
fn a_failed_dump_leaves_nothing_that_claims_success_and_the_app_runs_on() {
    if !root_or_skip() {
        return;
    }
    let fx = fixture();
    let mut child = app();
    let fail = CriuError::Failed { verb: "dump", status: "exit status: 1".into(), detail: "No space left on device".into(), log: "/x".into() };
    *fx.criu.fail_dump.lock().unwrap() = Some(fail);
    let e = fx.agent.checkpoint(me(), child.id() as i32, None).unwrap_err();
    assert_eq!(e.reason(), Some(FailureReason::Criu), "counted as a CRIU failure, whatever its text");
    let err = e.to_string();
    assert!(err.contains("criu dump failed") && err.contains("No space left") && err.contains("the application runs on"), "{err}");
    assert!(!fx.agent.settings.images.run_dir(7, 0).exists(), "the partial dump is removed");
    assert_eq!(fx.agent.settings.images.latest(7), None);
    assert_eq!(child.try_wait().unwrap(), None, "the application still runs");
    child.kill().unwrap();
    child.wait().unwrap();
}

/// The image directory is made while the driver works (issue 17): when it
/// cannot be made, nothing is dumped and the application runs on.
#[test]
fn an_image_directory_that_cannot_be_made_fails_the_checkpoint_and_the_app_runs_on() {
    if !root_or_skip() {
        return;
    }
    let fx = fixture();
    // A file where the store's root should be: made by root here, it stands
    // for any failure to make the directory.
    std::fs::write(&fx.agent.settings.images.root, b"not a directory").unwrap();
    let mut child = app();
    let e = fx.agent.checkpoint(me(), child.id() as i32, None).unwrap_err();
    assert_eq!(e.reason(), Some(FailureReason::ImageDir));
    let err = e.to_string();
    assert!(err.starts_with("cannot prepare the image directory") && err.ends_with("the application runs on"), "{err}");
    assert!(matches!(&fx.criu.calls()[..], [CriuCall::Check]), "CRIU never ran: {:?}", fx.criu.calls());
    assert_eq!(child.try_wait().unwrap(), None, "the application still runs");
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn only_the_callers_own_tree_of_the_users_processes_is_dumped() {
    if !root_or_skip() {
        return;
    }
    let fx = fixture();
    // Not a descendant of the caller (the caller is a child of ours).
    let mut other = app();
    let err = fx.agent.checkpoint(Peer { pid: other.id() as i32, uid: 0 }, std::process::id() as i32, None).unwrap_err().to_string();
    assert!(err.contains("is neither a descendant of the caller"), "{err}");
    other.kill().unwrap();
    other.wait().unwrap();
    // A process with root's rights in the tree.
    let mut rooted = Command::new("/bin/sleep").arg("30").spawn().unwrap();
    let err = fx.agent.checkpoint(me(), rooted.id() as i32, None).unwrap_err().to_string();
    assert!(err.contains("not only as the job's user") || err.contains("holds capabilities"), "{err}");
    rooted.kill().unwrap();
    rooted.wait().unwrap();
    assert!(!fx.criu.calls().iter().any(|c| matches!(c, CriuCall::Dump(_))), "CRIU was never asked");
}

/// Rewrites the manifest of `run` through `edit` (as a forger would).
fn forge(run: &std::path::Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(run.join(MANIFEST_FILE)).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(run.join(MANIFEST_FILE), serde_json::to_vec(&v).unwrap()).unwrap();
}

#[test]
fn restores_refuse_foreign_corrupt_changed_or_incompatible_images_and_keep_them() {
    if !root_or_skip() {
        return;
    }
    type Case = (&'static str, Box<dyn Fn(&std::path::Path)>, &'static str, FailureReason);
    use FailureReason::{Driver, Image};
    let cases: Vec<Case> = vec![
        ("other user", Box::new(|run| forge(run, |v| v["uid"] = 1234.into())), "belongs to uid 1234, not to job 7's user (uid 65534): refused", Image),
        ("other job", Box::new(|run| forge(run, |v| v["job"] = 8.into())), "belongs to job 8, not job 7", Image),
        ("corrupt", Box::new(|run| std::fs::write(run.join(MANIFEST_FILE), b"{\"version\":1,").unwrap()), "is corrupt", Image),
        ("newer", Box::new(|run| forge(run, |v| v["version"] = 2.into())), "format version 2", Image),
        (
            "changed file",
            Box::new(|run| std::fs::write(run.join("pages-1.img"), b"tampered").unwrap()),
            "image file pages-1.img",
            Image,
        ),
        (
            "other driver",
            Box::new(|run| {
                forge(run, |v| {
                    v["driver_version"] = "570.86.15".into();
                    v["cuda"] = serde_json::json!([{"pid": 1, "start_time": 1, "phase": "checkpointed",
                        "footprint": [{"gpu": GPU_A, "bytes": 1024}]}]);
                })
            }),
            "taken with NVIDIA driver 570.86.15 (node n1); this node has 580.159.04",
            Driver,
        ),
        (
            "other GPU model",
            Box::new(|run| {
                forge(run, |v| {
                    v["gpus"][0]["name"] = "NVIDIA A100-SXM4-40GB".into();
                    v["cuda"] = serde_json::json!([{"pid": 1, "start_time": 1, "phase": "checkpointed",
                        "footprint": [{"gpu": GPU_A, "bytes": 1024}]}]);
                })
            }),
            "the image's GPU 0 is a NVIDIA A100-SXM4-40GB; this run got a NVIDIA H200",
            Image,
        ),
    ];
    for (name, spoil, needle, reason) in cases {
        let fx = fixture();
        let (_child, run) = dumped(&fx);
        spoil(&run);
        let e = fx.agent.restore(me()).unwrap_err();
        assert_eq!(e.reason(), Some(reason), "{name}: counted by its kind");
        let err = e.to_string();
        assert!(err.contains(needle) && err.contains("the image is kept"), "{name}: {err}");
        assert!(run.join(MANIFEST_FILE).exists(), "{name}: the image is kept");
        assert!(!fx.criu.calls().iter().any(|c| matches!(c, CriuCall::Restore(_))), "{name}: nothing was restored");
    }
}

/// Security review N3: a thread id of the image held by another user here
/// failed CRIU's restore ("Unable to create a thread: -17") and the job
/// failed instead of moving: such a failure now says "not here" (the
/// wrapper moves the job), keeping the image; other CRIU failures do not.
#[test]
fn a_pid_held_here_at_criu_s_restore_moves_the_job_and_keeps_the_image() {
    if !root_or_skip() {
        return;
    }
    let cases = [
        ("  77: Error (criu/pie/restorer.c:2105): Unable to create a thread: -17", true),
        ("Error (criu/cr-restore.c:1230): Can't fork for 77: File exists", true),
        ("Error (criu/files-reg.c:2294): File x has bad mode", false),
        // packaging/criu/0007 could not map the buffer: the way to read it is named.
        ("  77: Error (criu/pie/restorer.c:2190): Can't map pages from the image (-12)", false),
    ];
    for (detail, moves) in cases {
        let fx = fixture();
        let (_child, run) = dumped(&fx);
        *fx.criu.fail_restore.lock().unwrap() =
            Some(CriuError::Failed { verb: "restore", status: "exit status: 1".into(), detail: detail.into(), log: "/l".into() });
        let e = fx.agent.restore(me()).unwrap_err();
        assert_eq!(matches!(e, RequestError::NotHere(_)), moves, "{detail}: {e:?}");
        assert!(e.to_string().contains("the image is kept"), "{e}");
        let hint = "with [preempt] restore_map_buffers = false it is read instead";
        assert_eq!(e.to_string().contains(hint), detail.contains("Can't map pages"), "{e}");
        assert!(run.join(MANIFEST_FILE).exists(), "{detail}: the image is kept");
    }
}

/// CRIU's pid file is the user's (in the work directory lent to them): a
/// root pid it names other than the image's is refused before anything is
/// walked or killed from it (pid 1: every process of the node), and a
/// manifest whose root is pid 1 or 0 is corrupt.
#[test]
fn a_restored_root_other_than_the_image_s_is_refused_before_any_walk() {
    if !root_or_skip() {
        return;
    }
    let fx = fixture();
    let (_child, run) = dumped(&fx);
    *fx.criu.restored_pid.lock().unwrap() = 1;
    let err = fx.agent.restore(me()).unwrap_err().to_string();
    assert!(err.contains("CRIU restored pid 1, but the image's root is pid") && err.contains("the image is kept"), "{err}");
    assert!(crate::procfs::read(1).is_some(), "init is alive");
    assert!(run.join(MANIFEST_FILE).exists(), "the image is kept");
    let fx = fixture();
    let (_other, corrupt) = dumped(&fx);
    forge(&corrupt, |v| v["root_pid"] = 1.into());
    let err = fx.agent.restore(me()).unwrap_err().to_string();
    assert!(err.contains("its root pid 1 cannot be a dumped tree's: corrupt"), "{err}");
}

#[test]
fn no_image_is_a_clear_refusal() {
    let fx = fixture();
    let err = fx.agent.restore(me()).unwrap_err().to_string();
    assert!(err.contains("no checkpoint image of job 7 in"), "{err}");
}

#[test]
fn callers_other_than_the_user_and_root_are_refused() {
    let cases = [
        (Peer { pid: 5, uid: 1001 }, Request::Hello, Ok(())),
        (Peer { pid: 5, uid: 0 }, Request::Stop, Ok(())),
        (Peer { pid: 5, uid: 1002 }, Request::Hello, Err("refused: this agent serves job 7 of uid 1001; the caller (pid 5) is uid 1002")),
        (Peer { pid: 5, uid: 1002 }, Request::Restore, Err("is uid 1002")),
        (Peer { pid: 5, uid: 1001 }, Request::Stop, Err("only root (the epilog) stops the agent")),
    ];
    for (peer, req, want) in cases {
        let got = authorize(peer, 1001, 7, &req);
        match want {
            Ok(()) => assert!(got.is_ok(), "{peer:?} {req:?}: {got:?}"),
            Err(needle) => assert!(got.unwrap_err().to_string().contains(needle), "{peer:?} {req:?}"),
        }
    }
    // Each kind, with its whole text.
    let other = Unauthorized::OtherUser { job: 7, job_uid: 1001, pid: 5, uid: 1002 };
    assert_eq!(authorize(Peer { pid: 5, uid: 1002 }, 1001, 7, &Request::Stop), Err(other.clone()), "another user's stop: the user is refused first");
    assert_eq!(authorize(Peer { pid: 5, uid: 1001 }, 1001, 7, &Request::Stop), Err(Unauthorized::Stop));
    assert_eq!(other.to_string(), "refused: this agent serves job 7 of uid 1001; the caller (pid 5) is uid 1002");
    assert_eq!(Unauthorized::Stop.to_string(), "refused: only root (the epilog) stops the agent");
}

#[test]
fn the_socket_is_the_users_and_answers_hello_and_stop() {
    use std::os::unix::fs::MetadataExt;
    if !root_or_skip() {
        return;
    }
    let fx = fixture();
    let dir = fx.agent.settings.socket_dir.clone();
    let listener = listen(&dir, 7, NOBODY, NOBODY).unwrap();
    let meta = std::fs::metadata(crate::socket_path(&dir, 7)).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o777), (NOBODY, 0o600));
    assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o711);
    let agent = Arc::clone(&fx.agent);
    let server = std::thread::spawn(move || agent.serve(listener).unwrap());
    let ask = |req: &Request| -> Response {
        let s = std::os::unix::net::UnixStream::connect(crate::socket_path(&dir, 7)).unwrap();
        protocol::send(&mut s.try_clone().unwrap(), req).unwrap();
        protocol::receive(&mut std::io::BufReader::new(s)).unwrap().unwrap()
    };
    match ask(&Request::Hello) {
        Response::Hello { job: 7, restart_count: 0, image: None, criu: Ok(v), note: None } => assert_eq!(v, "4.1.1"),
        other => panic!("{other:?}"),
    }
    assert_eq!(ask(&Request::Stop), Response::Stopping);
    assert_eq!(server.join().unwrap(), ExitReason::Stopped);
}

/// Set (to the socket's path) in the child that connects as another user.
const CONNECT_CHILD: &str = "GPU_MODE_AGENT_CONNECT_TEST_SOCKET";

/// Threat-model boundary: another user cannot reach a job's agent socket
/// (the kernel refuses the connect: the socket is the job user's, 0600);
/// the job's own user can (the control that makes the test mean something).
#[test]
fn another_user_cannot_connect_to_the_agent_socket() {
    if let Some(path) = std::env::var_os(CONNECT_CHILD) {
        let code = match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => 0,
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => 13,
            Err(_) => 1,
        };
        std::process::exit(code);
    }
    if !root_or_skip() {
        return;
    }
    let fx = fixture();
    let dir = fx.agent.settings.socket_dir.clone();
    // The fixture's temporary directory must be passable for the test to mean anything.
    std::fs::set_permissions(dir.parent().unwrap(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let _listener = listen(&dir, 7, 1001, 1001).unwrap();
    let socket = crate::socket_path(&dir, 7);
    let connect_as = |uid: u32| {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        let test = "agent::tests::another_user_cannot_connect_to_the_agent_socket";
        cmd.args(["--exact", test, "--test-threads=1"]).env(CONNECT_CHILD, &socket).uid(uid).gid(uid);
        cmd.status().unwrap().code()
    };
    assert_eq!(connect_as(NOBODY), Some(13), "another user connected to the agent socket");
    assert_eq!(connect_as(1001), Some(0), "the job's user could not connect");
    // Nor can another user list the directory of sockets (0711).
    let out = Command::new("/bin/ls").arg(&dir).uid(NOBODY).gid(NOBODY).output().unwrap();
    assert!(!out.status.success(), "nobody listed {}", dir.display());
}

/// Threat-model boundary: a planted socket directory (a symlink, another
/// user's directory) is refused; what it points at is untouched.
#[test]
fn a_planted_socket_directory_is_refused() {
    if !root_or_skip() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let victim = tmp.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    let link = tmp.path().join("sock");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let err = listen(&link, 7, 1001, 1001).unwrap_err().to_string();
    assert!(err.contains("is not a directory (a symlink or file is in the way)"), "{err}");
    assert_eq!(std::fs::read_dir(&victim).unwrap().count(), 0, "a socket was made through the link");
    let foreign = tmp.path().join("sock2");
    std::fs::create_dir(&foreign).unwrap();
    std::os::unix::fs::chown(&foreign, Some(NOBODY), Some(NOBODY)).unwrap();
    let err = listen(&foreign, 7, 1001, 1001).unwrap_err().to_string();
    assert!(err.contains("is owned by uid 65534, expected uid 0"), "{err}");
    assert_eq!(std::fs::read_dir(&foreign).unwrap().count(), 0);
}

/// Checkpoints are counted: a success with its bytes and one observation
/// per phase of the manifest's timings, a failure by reason; a refusal is not.
#[test]
fn checkpoints_are_counted_in_the_metrics() {
    if !root_or_skip() {
        return;
    }
    let fx = fixture_with(true, crate::accounting::AccountingField::Off);
    let textfile = fx._dir.path().join("gpu-mode.prom");
    // A failure is counted; a refusal (pid 1) is not (security review F3).
    // The failure comes first: a failed dump replaces the run's image.
    let mut other = app();
    let fail = CriuError::Failed { verb: "dump", status: "exit status: 1".into(), detail: "x".into(), log: "/x".into() };
    *fx.criu.fail_dump.lock().unwrap() = Some(fail);
    assert!(matches!(fx.agent.checkpoint_request(me(), other.id() as i32, None), Response::Error { .. }));
    other.kill().unwrap();
    other.wait().unwrap();
    assert!(matches!(fx.agent.checkpoint_request(me(), 1, None), Response::Error { .. }));
    let mut child = app();
    let pid = child.id() as i32;
    stop_on_dump(&fx, pid);
    let Response::Checkpointed(summary) = fx.agent.checkpoint_request(me(), pid, None) else { panic!("the dump failed") };
    let _ = child.wait();
    let text = std::fs::read_to_string(&textfile).unwrap();
    assert!(!text.contains("reason=\"refused\""), "a refusal was counted\n{text}");
    for line in [
        "gpu_mode_checkpoints_total{outcome=\"ok\"} 1".to_string(),
        "gpu_mode_checkpoints_total{outcome=\"failed\"} 1".to_string(),
        "gpu_mode_checkpoint_failures_total{reason=\"criu\"} 1".to_string(),
        format!("gpu_mode_checkpoint_written_bytes_total {}", summary.image_bytes),
        "gpu_mode_checkpoint_phase_duration_seconds_count{phase=\"criu_dump\"} 1".to_string(),
        "gpu_mode_checkpoint_phase_duration_seconds_count{phase=\"total\"} 1".to_string(),
        "gpu_mode_checkpoint_images{state=\"complete\"} 1".to_string(),
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
    }
    let unobserved = "gpu_mode_checkpoint_phase_duration_seconds_count{phase=\"signal_to_gpu_free\"} 0";
    assert!(text.lines().any(|l| l == unobserved), "no signal time given: that phase did not happen\n{text}");
}

/// The fixture's agent serving its socket (owned by nobody, the job's user,
/// in a directory others may pass through).
fn serving(fx: &Fx) -> (std::path::PathBuf, std::thread::JoinHandle<ExitReason>) {
    let dir = fx.agent.settings.socket_dir.clone();
    std::fs::set_permissions(dir.parent().unwrap(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let listener = listen(&dir, 7, NOBODY, NOBODY).unwrap();
    let agent = Arc::clone(&fx.agent);
    (crate::socket_path(&dir, 7), std::thread::spawn(move || agent.serve(listener).unwrap()))
}

/// Set (to the socket's path) in the child that floods the agent as nobody.
const FLOOD_CHILD: &str = "GPU_MODE_AGENT_FLOOD_TEST_SOCKET";
const FLOOD: usize = 64;

/// In the flooding child: FLOOD silent connections, then one more that
/// asks `hello`; prints how that one was answered, then holds everything
/// open until stdin closes.
fn flood(socket: &std::ffi::OsStr) -> ! {
    use std::io::Read;
    let held: Vec<_> = (0..FLOOD).map(|_| std::os::unix::net::UnixStream::connect(socket).unwrap()).collect();
    let last = std::os::unix::net::UnixStream::connect(socket).unwrap();
    last.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    // The agent may refuse it (one error line, then close) before the
    // request is written: the write then fails with EPIPE (seen in CI under
    // load), and the error line is still there to read.
    let _ = protocol::send(&mut last.try_clone().unwrap(), &Request::Hello);
    match protocol::receive::<Response>(&mut std::io::BufReader::new(last)) {
        Ok(Some(r)) => println!("answered {r:?}"),
        other => println!("no answer: {other:?}"),
    }
    let _ = std::io::stdin().read(&mut [0u8; 1]);
    drop(held);
    std::process::exit(0);
}

/// Security review (issue 18), S2: a job's user opening connections that
/// send nothing made the root agent start a thread for each, for as long
/// as the user kept them (outside the job's cgroup and its pids limit).
/// Beyond a bound, connections are refused at once; root (the epilog's
/// `stop`) always gets through.
#[test]
fn a_flood_of_silent_connections_is_bounded_and_root_still_stops_the_agent() {
    if let Some(socket) = std::env::var_os(FLOOD_CHILD) {
        flood(&socket);
    }
    if !root_or_skip() {
        return;
    }
    let fx = fixture();
    let (socket, server) = serving(&fx);
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    let test = "agent::tests::a_flood_of_silent_connections_is_bounded_and_root_still_stops_the_agent";
    cmd.args(["--exact", test, "--test-threads=1", "--nocapture"]).env(FLOOD_CHILD, &socket).uid(NOBODY).gid(NOBODY);
    let mut child = cmd.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).spawn().unwrap();
    // The test harness prints its own lines first, and "test <name> ... "
    // just before the child's answer, on the same line.
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !(line.contains("answered") || line.contains("no answer")) {
        line.clear();
        assert_ne!(std::io::BufRead::read_line(&mut out, &mut line).unwrap(), 0, "the flooding child ended early");
    }
    let s = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    protocol::send(&mut s.try_clone().unwrap(), &Request::Stop).unwrap();
    let stopped = protocol::receive::<Response>(&mut std::io::BufReader::new(s));
    drop(child.stdin.take());
    child.wait().unwrap();
    assert!(line.contains("answered Error") && line.contains("connections"), "the connection past the bound: {line}");
    assert_eq!(stopped.unwrap(), Some(Response::Stopping), "root's stop during the flood");
    assert_eq!(server.join().unwrap(), ExitReason::Stopped);
}

/// Security review (issue 18), S2: a peer that trickles its request a byte
/// at a time is cut off when the request's time is up (a read timeout
/// alone restarts with every byte, so the thread was held for good).
#[test]
fn a_request_trickled_byte_by_byte_is_cut_off_in_time() {
    if !root_or_skip() {
        return;
    }
    let fx = fixture();
    let (socket, server) = serving(&fx);
    let s = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    let mut w = s.try_clone().unwrap();
    let start = std::time::Instant::now();
    let trickle = std::thread::spawn(move || {
        for b in b"{\"v\":1,\"op\":\"hello\"".iter().cycle().take(40) {
            if std::io::Write::write_all(&mut w, &[*b]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let answer = protocol::receive::<Response>(&mut std::io::BufReader::new(s));
    let took = start.elapsed();
    trickle.join().unwrap();
    assert!(took < Duration::from_millis(2500), "the trickling peer was served for {took:?} (request_wait is 1 s): {answer:?}");
    assert!(matches!(answer, Ok(Some(Response::Error { .. })) | Ok(None)), "{answer:?}");
    let stop = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    protocol::send(&mut stop.try_clone().unwrap(), &Request::Stop).unwrap();
    assert_eq!(protocol::receive::<Response>(&mut std::io::BufReader::new(stop)).unwrap(), Some(Response::Stopping));
    assert_eq!(server.join().unwrap(), ExitReason::Stopped);
}

/// Security review (issue 18), safe by design: a process of the job's user
/// that is not a process of this job (another job of theirs on the node, a
/// login session) may ask `hello` but neither checkpoint nor restore.
#[test]
fn the_users_processes_outside_the_job_cannot_checkpoint_or_restore() {
    if !root_or_skip() {
        return;
    }
    let fx = fixture();
    let mut outsider = app();
    let peer = Peer { pid: outsider.id() as i32, uid: NOBODY };
    let err = fx.agent.checkpoint(peer, outsider.id() as i32, None).unwrap_err().to_string();
    assert!(err.contains(&format!("the caller (pid {}) is not a process of job 7: refused", peer.pid)), "{err}");
    let err = fx.agent.restore(peer).unwrap_err().to_string();
    assert!(err.contains("is not a process of job 7"), "{err}");
    assert!(!fx.criu.calls().iter().any(|c| matches!(c, CriuCall::Dump(_) | CriuCall::Restore(_))), "CRIU was never asked");
    outsider.kill().unwrap();
    outsider.wait().unwrap();
    // The control: a process of job 7 (here, with no job cgroups, by its
    // SLURM_JOB_ID) may.
    let mut insider = app_with_env(&[("SLURM_JOB_ID", "7")]);
    let pid = insider.id() as i32;
    stop_on_dump(&fx, pid);
    fx.agent.checkpoint(Peer { pid, uid: NOBODY }, pid, None).unwrap();
    insider.wait().unwrap();
}

/// A tree as CRIU would restore one, stopped: `sh` as nobody whose child
/// `sleep` holds `file` (opened as root, as CRIU reopens files) while the
/// shell itself does not. Returns (shell, sleep).
fn tree_holding(file: &std::path::Path) -> (Child, i32) {
    let path = std::ffi::CString::new(file.as_os_str().as_encoded_bytes()).unwrap();
    let null = std::process::Stdio::null;
    let mut cmd = Command::new("/bin/sh");
    cmd.args(["-c", "/bin/sleep 30 & exec 3<&-; echo $!; wait"]).stdin(null()).stdout(std::process::Stdio::piped()).stderr(null());
    unsafe {
        cmd.pre_exec(move || {
            // A session of its own, as gpu-mode-run gives the application:
            // the agent's sweep of strays looks at the restored root's
            // session, which must not be the test process's (its other
            // tests' children of nobody are in it).
            libc::setsid();
            let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            if fd < 0 || libc::dup2(fd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::setgroups(0, std::ptr::null()) != 0 || libc::setgid(NOBODY) != 0 || libc::setuid(NOBODY) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut shell = cmd.spawn().unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(shell.stdout.take().unwrap()), &mut line).unwrap();
    let sleep: i32 = line.trim().parse().unwrap();
    for pid in [shell.id() as i32, sleep] {
        crate::held::stop_for_check(pid);
    }
    (shell, sleep)
}

/// Security review (issue 18), S1 and S4: after a restore every process of
/// the restored tree is checked before it runs, not only the root, and not
/// only the pids the manifest lists: those were listed before CRIU froze
/// the tree, and a process forked in between is dumped and restored too
/// (unchecked, it stayed stopped until its user sent it SIGCONT, holding
/// what CRIU had opened for it as root).
#[test]
fn every_restored_process_is_checked_before_it_runs_even_one_the_manifest_does_not_list() {
    if !root_or_skip() {
        return;
    }
    let fx = fixture();
    let (_child, run) = dumped(&fx);
    let tmp = tempfile::tempdir().unwrap();
    let secret = tmp.path().join("root-only");
    std::fs::write(&secret, b"root's").unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let (mut shell, sleep) = tree_holding(&secret);
    let root = shell.id() as i32;
    // The image's root is the shell; the sleep was forked after the listing.
    // (The list is left empty: the recording CRIU cannot make its pids free
    // before the restore and taken after it.)
    forge(&run, |v| {
        v["root_pid"] = root.into();
        v["pids"] = serde_json::json!([]);
    });
    *fx.criu.restored_pid.lock().unwrap() = root;
    let result = fx.agent.restore(me());
    // What the check saw of the sleep, for a failure's message (seen once in
    // CI, 2026-11-27: the restore passed; the cause was not kept).
    let seen = format!(
        "sleep {sleep}: {:?}, fds {:?}; shell {root}: {:?}",
        crate::procfs::read(sleep).map(|p| (p.state, p.ppid)),
        std::fs::read_dir(format!("/proc/{sleep}/fd")).map(|d| d.flatten().filter_map(|e| std::fs::read_link(e.path()).ok()).collect::<Vec<_>>()),
        crate::procfs::read(root).map(|p| (p.state, p.ppid)),
    );
    for pid in [sleep, root] {
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let _ = shell.wait();
    let err = match result {
        Ok((pid, _)) => panic!("restored pid {pid} passed the check: {seen}"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains(&format!("pid {sleep} was restored holding {}", secret.display())), "{err}");
    assert!(err.contains("the restored processes were killed, the image is kept"), "{err}");
}

/// A refused restore kills the tree CRIU made, and never a process that
/// only holds a pid the manifest lists: a restored process that exited
/// leaves its pid to any process of the node. Here the manifest lists the
/// pid of a `sleep` outside the restored tree (as a reused pid would be).
/// Before: `kill_restored` also killed the manifest's pids by their current
/// identity, which killed it. In these tests, whose manifests list pids of
/// exited processes, another test's refused restore could so kill the
/// `sleep` of
/// `every_restored_process_is_checked_before_it_runs_even_one_the_manifest_does_not_list`,
/// whose check then found nothing held and let the restore pass: the one
/// cause found of that test's failure in CI (2026-11-27).
#[test]
fn a_refused_restore_kills_its_tree_and_never_a_process_that_reused_a_pid_of_the_image() {
    if !root_or_skip() {
        return;
    }
    let fx = fixture();
    let (_child, run) = dumped(&fx);
    let tmp = tempfile::tempdir().unwrap();
    let held = tmp.path().join("held");
    std::fs::write(&held, b"").unwrap();
    let (mut shell, sleep) = tree_holding(&held);
    let root = shell.id() as i32;
    let mut bystander = Command::new("/bin/sleep").arg("30").spawn().unwrap();
    let bystander_pid = bystander.id() as i32;
    // The manifest as a refused restore has it once the bystander reused a
    // pid of the image (a restore's own check refuses pids in use before).
    forge(&run, |v| {
        v["root_pid"] = root.into();
        v["pids"] = serde_json::json!([root, bystander_pid]);
    });
    let m = Manifest::load(&run).unwrap();
    fx.agent.kill_restored(&m, &[]);
    let alive = |pid: i32| crate::procfs::read(pid).is_some_and(|p| !matches!(p.state, 'Z' | 'X'));
    // SIGKILL lands when the kernel gets to it: the tree is given 5 s to die.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while [root, sleep].iter().any(|p| alive(*p)) && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let (tree_alive, bystander_alive) = ([root, sleep].map(alive), alive(bystander_pid));
    for pid in [sleep, root] {
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let _ = shell.wait();
    let _ = bystander.kill();
    let _ = bystander.wait();
    assert_eq!(tree_alive, [false, false], "the refused tree (shell {root}, sleep {sleep}) is killed");
    assert!(bystander_alive, "a process that only holds a pid the manifest lists was killed");
}

/// Security review (issue 27), F3: every refused request cost root a log
/// line, a metrics render and two scontrol calls (one a job update), so a
/// loop of refused requests made the agent an unthrottled amplifier
/// against slurmctld, the journal and the disk. A refusal now reaches
/// neither scontrol nor the metrics, and its log lines are rate-limited.
#[test]
fn a_loop_of_refused_requests_reaches_neither_slurm_nor_the_metrics() {
    if !root_or_skip() {
        return;
    }
    let fx = fixture_with(true, crate::accounting::AccountingField::AdminComment);
    // The test process is not a process of job 7: every request is refused.
    let outsider = Peer { pid: std::process::id() as i32, uid: NOBODY };
    for _ in 0..100 {
        assert!(matches!(fx.agent.checkpoint_request(outsider, 1, None), Response::Error { .. }));
    }
    for _ in 0..100 {
        let (mut ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        fx.agent.restore_request(me(), &mut ours);
        drop(theirs);
    }
    let calls = scontrol_calls(&fx);
    assert!(calls.is_empty(), "{} scontrol and squeue calls for 200 refusals, the last: {:?}", calls.len(), calls.last());
    let textfile = fx._dir.path().join("gpu-mode.prom");
    assert!(!textfile.exists(), "refusals rendered the metrics:\n{}", std::fs::read_to_string(&textfile).unwrap());
    // Five lines per uid and minute; the rest counted for one line later.
    let log = fx.agent.refusal_log.lock().unwrap();
    assert_eq!((log.counts(NOBODY), log.counts(0)), ((5, 95), (5, 95)), "(logged, suppressed) of the user's and root's refusals");
    drop(log);
    // The control: a real failure is still counted and accounted.
    let mut insider = app_with_env(&[("SLURM_JOB_ID", "7")]);
    let fail = CriuError::Failed { verb: "dump", status: "exit status: 1".into(), detail: "x".into(), log: "/x".into() };
    *fx.criu.fail_dump.lock().unwrap() = Some(fail);
    let answer = fx.agent.checkpoint_request(Peer { pid: insider.id() as i32, uid: NOBODY }, insider.id() as i32, None);
    insider.kill().unwrap();
    insider.wait().unwrap();
    assert!(matches!(answer, Response::Error { .. }), "{answer:?}");
    assert_eq!(scontrol_calls(&fx).len(), 2, "the failure's squeue read and scontrol update");
    let rendered = std::fs::read_to_string(&textfile).unwrap();
    let failures: Vec<&str> = rendered.lines().filter(|l| l.starts_with("gpu_mode_checkpoint_failures_total")).collect();
    assert!(failures.contains(&"gpu_mode_checkpoint_failures_total{reason=\"criu\"} 1"), "{answer:?}: {failures:?}");
}

/// Security review (issue 27), F3: the job's user has a request budget;
/// past it a request is refused at once. Root (the epilog) never is.
#[test]
fn the_users_requests_have_a_budget_and_roots_do_not() {
    let fx = fixture();
    for i in 0..20 {
        assert_eq!(fx.agent.within_budget(NOBODY), Ok(()), "request {i} of the burst");
    }
    let err = fx.agent.within_budget(NOBODY).unwrap_err();
    assert_eq!((err.uid, err.refused), (NOBODY, 1), "{err:?}");
    let err = err.to_string();
    assert!(err.starts_with("too many requests from uid 65534: 1 refused in the last 60 s"), "{err}");
    for _ in 0..1000 {
        assert_eq!(fx.agent.within_budget(0), Ok(()));
    }
}

/// Set (to the socket's path) in the child that loops requests as nobody.
const LOOP_CHILD: &str = "GPU_MODE_AGENT_LOOP_TEST_SOCKET";

/// Issue 37: the budget as a user meets it, through the socket: a loop of
/// 30 hellos as nobody, back to back. Past the burst of 20 the answer is
/// "too many requests" (a few more may pass as the bucket refills at 2 per
/// second). With the check in `handle` removed this fails: every answer
/// is the refusal for not being the job's user (all 121 preempt tests
/// passed without the check before, which called within_budget directly).
#[test]
fn a_loop_of_requests_through_the_socket_meets_the_budget() {
    if let Some(socket) = std::env::var_os(LOOP_CHILD) {
        let over = (0..30)
            .filter(|_| {
                let s = std::os::unix::net::UnixStream::connect(&socket).unwrap();
                protocol::send(&mut s.try_clone().unwrap(), &Request::Hello).unwrap();
                let answer = protocol::receive::<Response>(&mut std::io::BufReader::new(s));
                matches!(answer, Ok(Some(Response::Error { message })) if message.starts_with("too many requests from uid 65534"))
            })
            .count();
        println!("over budget: {over}");
        std::process::exit(0);
    }
    if !root_or_skip() {
        return;
    }
    let fx = fixture();
    let (socket, server) = serving(&fx);
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    let test = "agent::tests::a_loop_of_requests_through_the_socket_meets_the_budget";
    cmd.args(["--exact", test, "--test-threads=1", "--nocapture"]).env(LOOP_CHILD, &socket).uid(NOBODY).gid(NOBODY);
    let out = String::from_utf8(cmd.output().unwrap().stdout).unwrap();
    let s = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    protocol::send(&mut s.try_clone().unwrap(), &Request::Stop).unwrap();
    let _ = protocol::receive::<Response>(&mut std::io::BufReader::new(s));
    assert_eq!(server.join().unwrap(), ExitReason::Stopped);
    let over: usize = out.split("over budget: ").nth(1).and_then(|t| t.split_whitespace().next()?.parse().ok()).unwrap_or_else(|| panic!("{out}"));
    assert!((5..=10).contains(&over), "{over} of 30 requests met the budget: {out}");
}

/// Refusals are told from failures by their type, never by their text.
#[test]
fn refusals_are_typed_by_kind() {
    if !root_or_skip() {
        return;
    }
    let fx = fixture();
    let kind = |r: Result<_, RequestError>| match r {
        Err(RequestError::Refused { kind, .. }) => Some(kind),
        _ => None,
    };
    let outsider = Peer { pid: std::process::id() as i32, uid: NOBODY };
    assert_eq!(kind(fx.agent.checkpoint(me(), 1, None).map(|_| ())), Some(RefusalKind::InvalidRoot));
    assert_eq!(kind(fx.agent.checkpoint(outsider, 2, None).map(|_| ())), Some(RefusalKind::NotInJob));
    let mut other = app();
    let stranger = Peer { pid: other.id() as i32, uid: 0 };
    assert_eq!(kind(fx.agent.checkpoint(stranger, std::process::id() as i32, None).map(|_| ())), Some(RefusalKind::NotDescendant));
    other.kill().unwrap();
    other.wait().unwrap();
    assert_eq!(kind(fx.agent.restore(me()).map(|_| ())), Some(RefusalKind::NoImage));
    let _busy = fx.agent.exclusive().unwrap();
    assert_eq!(kind(fx.agent.restore(me()).map(|_| ())), Some(RefusalKind::Busy));
}
