//! Orchestration tests against a made-up node: one double plays the driver
//! (a per-process state machine), /proc and NVML, so a checkpoint really
//! releases the fake GPU files and a restore really needs free memory.

use super::*;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const GPU0: &str = "GPU-00000000-0000-0000-0000-000000000000";
const GPU1: &str = "GPU-11111111-1111-1111-1111-111111111111";
const GIB: u64 = 1 << 30;

fn gpu(text: &str) -> GpuUuid {
    GpuUuid::parse(text).unwrap()
}

fn file(path: &str) -> NvidiaFile {
    NvidiaFile { how: "fd 5".into(), path: path.into() }
}

#[derive(Default)]
struct Node {
    states: Mutex<HashMap<i32, ProcessState>>,
    files: Mutex<HashMap<i32, Vec<NvidiaFile>>>,
    /// pid → (GPU, bytes) while it is running on the GPU.
    memory: BTreeMap<i32, (GpuUuid, u64)>,
    free: BTreeMap<GpuUuid, u64>,
    jobs: BTreeMap<u32, Vec<i32>>,
    children: BTreeMap<i32, Vec<i32>>,
    /// Calls made, in order: ("lock", 12).
    calls: Mutex<Vec<(&'static str, i32)>>,
    /// Scripted failures: (call, pid) → CUDA error code.
    fail: Mutex<BTreeMap<(&'static str, i32), u32>>,
    /// Scripted hangs: (call, pid) → how long the call takes.
    hang: BTreeMap<(&'static str, i32), Duration>,
    /// Processes whose GPU files survive a checkpoint (a forked child's).
    sticky: Vec<i32>,
    delay: Duration,
    /// Runs at the start of every call: (call, pid).
    on_call: Option<Box<dyn Fn(&'static str, i32) + Send + Sync>>,
    /// Processes that end as their unlock lets them go: the call is
    /// abandoned, as the bounded driver abandons a call about a process gone.
    ends_at_unlock: Vec<i32>,
}

impl Node {
    /// A node whose processes each hold 1 GiB on GPU0 and /dev/nvidia0.
    fn with_cuda(pids: &[i32]) -> Node {
        let mut node = Node::default();
        for &pid in pids {
            node.states.get_mut().unwrap().insert(pid, ProcessState::Running);
            node.files.get_mut().unwrap().insert(pid, vec![file("/dev/nvidia0")]);
            node.memory.insert(pid, (gpu(GPU0), GIB));
        }
        node.free.insert(gpu(GPU0), 10 * GIB);
        node.free.insert(gpu(GPU1), 10 * GIB);
        node
    }

    fn job(mut self, job: u32, pids: &[i32]) -> Node {
        self.jobs.insert(job, pids.to_vec());
        self
    }

    fn failing(mut self, call: &'static str, pid: i32, code: u32) -> Node {
        self.fail.get_mut().unwrap().insert((call, pid), code);
        self
    }

    fn heal(&self) {
        self.fail.lock().unwrap().clear();
    }

    fn state_of(&self, pid: i32) -> Option<ProcessState> {
        self.states.lock().unwrap().get(&pid).copied()
    }

    fn calls(&self) -> Vec<(&'static str, i32)> {
        self.calls.lock().unwrap().clone()
    }

    /// One transition of the driver's state machine, or the error it gives.
    fn step(&self, call: &'static str, pid: i32, from: ProcessState, to: ProcessState) -> Result<(), DriverError> {
        if let Some(hook) = &self.on_call {
            hook(call, pid);
        }
        std::thread::sleep(self.delay + self.hang.get(&(call, pid)).copied().unwrap_or_default());
        self.calls.lock().unwrap().push((call, pid));
        let err = |code: u32| DriverError::Call { call, pid, code, name: format!("E{code}"), text: "scripted".into() };
        if let Some(code) = self.fail.lock().unwrap().get(&(call, pid)) {
            return Err(err(*code));
        }
        let mut states = self.states.lock().unwrap();
        match states.get(&pid) {
            Some(s) if *s == from => {
                states.insert(pid, to);
                Ok(())
            }
            // CUDA_ERROR_ILLEGAL_STATE
            _ => Err(err(401)),
        }
    }
}

impl CudaCkptDriver for Node {
    fn state(&self, pid: i32) -> Result<ProcessState, DriverError> {
        self.state_of(pid).ok_or(DriverError::Call {
            call: "cuCheckpointProcessGetState",
            pid,
            code: 3,
            name: "CUDA_ERROR_NOT_INITIALIZED".into(),
            text: "not a CUDA process".into(),
        })
    }
    fn restore_thread_id(&self, pid: i32) -> Result<i32, DriverError> {
        Ok(pid + 1)
    }
    fn lock(&self, pid: i32, _timeout_ms: u32) -> Result<(), DriverError> {
        self.step("lock", pid, ProcessState::Running, ProcessState::Locked)
    }
    fn checkpoint(&self, pid: i32) -> Result<(), DriverError> {
        self.step("checkpoint", pid, ProcessState::Locked, ProcessState::Checkpointed)?;
        if !self.sticky.contains(&pid) {
            self.files.lock().unwrap().insert(pid, Vec::new());
        }
        Ok(())
    }
    fn restore(&self, pid: i32, _pairs: &[GpuPair]) -> Result<(), DriverError> {
        self.step("restore", pid, ProcessState::Checkpointed, ProcessState::Locked)?;
        self.files.lock().unwrap().insert(pid, vec![file("/dev/nvidia0")]);
        Ok(())
    }
    fn unlock(&self, pid: i32) -> Result<(), DriverError> {
        self.step("unlock", pid, ProcessState::Locked, ProcessState::Running)?;
        if self.ends_at_unlock.contains(&pid) {
            let why = format!("pid {pid} ended during the call");
            return Err(DriverError::NoAnswer(crate::watchdog::DeadlineError::Abandoned { what: format!("unlock(pid {pid})"), why }));
        }
        Ok(())
    }
}

impl ProcessHost for Node {
    fn job_processes(&self, job: u32) -> Result<(Vec<i32>, FoundBy), HostError> {
        Ok((self.jobs.get(&job).cloned().unwrap_or_default(), FoundBy::Cgroup))
    }
    fn with_descendants(&self, pid: i32) -> Vec<i32> {
        let mut out = vec![pid];
        out.extend(self.children.get(&pid).into_iter().flatten());
        out
    }
    fn nvidia_files(&self, pid: i32) -> Result<Vec<NvidiaFile>, HostError> {
        Ok(self.files.lock().unwrap().get(&pid).cloned().unwrap_or_default())
    }
    fn start_time(&self, pid: i32) -> Option<u64> {
        let known = self.files.lock().unwrap().contains_key(&pid) || self.jobs.values().flatten().any(|p| *p == pid);
        known.then_some(1000 + pid as u64)
    }
}

impl GpuInfo for Node {
    fn compute_processes(&self) -> Result<Vec<GpuProcess>, GpuInfoError> {
        Ok(self.memory.iter().map(|(pid, (gpu, bytes))| GpuProcess { gpu: *gpu, pid: *pid, used_bytes: *bytes }).collect())
    }
    fn free_bytes(&self, gpu: GpuUuid) -> Result<u64, GpuInfoError> {
        self.free.get(&gpu).copied().ok_or(GpuInfoError::NoGpu { gpu })
    }
}

fn settings(dir: &Path) -> Settings {
    Settings {
        lock_timeout_ms: 500,
        memory_margin_bytes: 256 << 20,
        record_dir: dir.join("ckpt"),
        call_timeout: Duration::from_secs(5),
    }
}

fn checkpointer(node: &Arc<Node>, settings: Settings) -> Checkpointer<'_> {
    Checkpointer::new(node.clone(), &**node, &**node, settings)
}

/// Runs `f` with a checkpointer over `node` and a fresh record directory.
fn with<T>(node: &Arc<Node>, f: impl FnOnce(&Checkpointer) -> T) -> T {
    let dir = tempfile::tempdir().unwrap();
    f(&checkpointer(node, settings(dir.path())))
}

fn record_of(c: &Checkpointer, target: &Target) -> CheckpointRecord {
    CheckpointRecord::load(&c.settings.record_dir, &target.key()).unwrap().expect("a record on disk")
}

fn phases(record: &CheckpointRecord) -> Vec<(i32, ProcessPhase)> {
    record.processes.iter().map(|p| (p.pid, p.phase)).collect()
}

fn all_states(node: &Node, pids: &[i32]) -> Vec<Option<ProcessState>> {
    pids.iter().map(|p| node.state_of(*p)).collect()
}

const RUNNING: Option<ProcessState> = Some(ProcessState::Running);

#[test]
fn a_job_is_locked_in_full_before_any_checkpoint_and_restored_before_unlock() {
    let node = Arc::new(Node::with_cuda(&[10, 11, 12]).job(7, &[9, 10, 11, 12]));
    with(&node, |c| {
        let report = c.checkpoint(&Target::Job(7)).unwrap();
        assert_eq!(report.processes.iter().map(|p| p.pid).collect::<Vec<_>>(), [10, 11, 12], "pid 9 holds no GPU");
        assert_eq!(report.bytes(), 3 * GIB);
        assert_eq!(all_states(&node, &[10, 11, 12]), [Some(ProcessState::Checkpointed); 3]);
        let record = record_of(c, &Target::Job(7));
        assert_eq!((record.version, record.status), (RECORD_VERSION, RecordStatus::Complete));
        assert_eq!(phases(&record), [10, 11, 12].map(|p| (p, ProcessPhase::Checkpointed)));
        c.restore(&Target::Job(7), &DeviceMap::default()).unwrap();
        assert!(!report.record.exists(), "the record is removed after a full restore");
    });
    let calls: Vec<&str> = node.calls().iter().map(|(c, _)| *c).collect();
    assert_eq!(calls, ["lock", "lock", "lock", "checkpoint", "checkpoint", "checkpoint", "restore", "restore", "restore", "unlock", "unlock", "unlock"]);
    assert_eq!(all_states(&node, &[10, 11, 12]), [RUNNING; 3]);
}

#[test]
fn failures_roll_everything_back_to_running_and_the_record_says_so() {
    // (node, what the error must say)
    let cases = [
        (Node::with_cuda(&[1, 2, 3]).failing("lock", 2, driver::CUDA_ERROR_TIMEOUT), "locking failed: pid 2"),
        (Node::with_cuda(&[1, 2, 3]).failing("checkpoint", 3, 2), "checkpoint failed: pid 3"),
        (Node { sticky: vec![2], ..Node::with_cuda(&[1, 2, 3]) }, "pid 2 still holds /dev/nvidia0 (fd 5)"),
    ];
    for (node, needle) in cases {
        let node = Arc::new(node);
        let target = Target::Pids(vec![1, 2, 3]);
        let (err, record) = with(&node, |c| (c.checkpoint(&target).unwrap_err().to_string(), record_of(c, &target)));
        assert!(err.contains(needle), "{err}");
        assert!(err.contains("running again"), "{err}");
        assert_eq!(all_states(&node, &[1, 2, 3]), [RUNNING; 3], "{err}");
        assert_eq!(record.status, RecordStatus::RolledBack, "{err}");
        assert!(!record.any_touched(), "{err}: {:?}", phases(&record));
    }
}

/// GPU files left after the checkpoint: by a process the scan did not find
/// (a child that opened its GPU file while pid 1 was checkpointed), which a
/// new scan would find, or by a checkpointed one (sticky), which it would
/// not mend; and a latecomer whose rollback did not finish.
#[test]
fn files_left_by_a_process_the_scan_missed_say_so_and_those_of_a_checkpointed_one_do_not() {
    let latecomer = |restore_fails: bool| {
        let node = Arc::new_cyclic(|me: &std::sync::Weak<Node>| {
            let me = me.clone();
            let hook = move |call: &str, pid: i32| {
                if (call, pid) == ("checkpoint", 1) {
                    me.upgrade().unwrap().files.lock().unwrap().insert(4, vec![file("/dev/nvidia0")]);
                }
            };
            let mut node = Node { on_call: Some(Box::new(hook)), ..Node::with_cuda(&[1]) };
            node.children.insert(1, vec![4]);
            node.states.get_mut().unwrap().insert(4, ProcessState::Running);
            node.files.get_mut().unwrap().insert(4, vec![]);
            node
        });
        if restore_fails {
            node.fail.lock().unwrap().insert(("restore", 1), 2);
        }
        node
    };
    let sticky = Arc::new(Node { sticky: vec![2], ..Node::with_cuda(&[1, 2]) });
    let cases = [
        (latecomer(false), vec![1], "pid 4 still holds /dev/nvidia0", true),
        (latecomer(true), vec![1], "pid 4 still holds /dev/nvidia0", false),
        (sticky, vec![1, 2], "pid 2 still holds /dev/nvidia0", false),
    ];
    for (node, pids, needle, want) in cases {
        let target = Target::Pids(pids);
        match with(&node, |c| c.checkpoint(&target).unwrap_err()) {
            e @ CheckpointError::HandlesRemain { joined_after_scan, .. } => {
                assert!(e.to_string().contains(needle), "{e}");
                assert_eq!((joined_after_scan, e.holders_changed_after_scan()), (want, want), "{e}");
            }
            other => panic!("{other}"),
        }
    }
}

/// A lock that fails for a process that left CUDA after the scan (its GPU
/// files closed, as by a program on its way out) says so; one that fails
/// for a process still holding its files (a lock timeout) does not.
#[test]
fn a_lock_failed_by_a_process_that_left_cuda_after_the_scan_says_so() {
    let leaver = Arc::new_cyclic(|me: &std::sync::Weak<Node>| {
        let me = me.clone();
        let hook = move |call: &str, pid: i32| {
            if (call, pid) == ("lock", 2) {
                me.upgrade().unwrap().files.lock().unwrap().insert(2, vec![]);
            }
        };
        Node { on_call: Some(Box::new(hook)), ..Node::with_cuda(&[1, 2]).failing("lock", 2, 3) }
    });
    let busy = Arc::new(Node::with_cuda(&[1, 2]).failing("lock", 2, driver::CUDA_ERROR_TIMEOUT));
    for (node, want) in [(leaver, true), (busy, false)] {
        match with(&node, |c| c.checkpoint(&Target::Pids(vec![1, 2])).unwrap_err()) {
            e @ CheckpointError::Lock { left_after_scan, .. } => {
                assert!(e.to_string().contains("locking failed: pid 2") && e.to_string().contains("pid 1 running again"), "{e}");
                assert_eq!((left_after_scan, e.holders_changed_after_scan()), (want, want), "{e}");
            }
            other => panic!("{other}"),
        }
        assert_eq!(node.state_of(1), RUNNING);
    }
}

#[test]
fn a_lock_timeout_is_reported_with_the_driver_code_and_only_locked_ones_are_unlocked() {
    let node = Arc::new(Node::with_cuda(&[1, 2]).failing("lock", 1, driver::CUDA_ERROR_TIMEOUT));
    let err = with(&node, |c| c.checkpoint(&Target::Pids(vec![1, 2])).unwrap_err()).to_string();
    assert!(err.contains("(909)"), "{err}");
    let unlocks: Vec<i32> = node.calls().iter().filter(|(c, _)| *c == "unlock").map(|(_, p)| *p).collect();
    assert_eq!(unlocks, [2]);
    assert!(!node.calls().iter().any(|(c, _)| *c == "checkpoint"), "no checkpoint after a failed lock");
}

#[test]
fn processes_the_driver_cannot_take_are_refused_before_anything_is_touched() {
    // A forked child: holds the parent's /dev/nvidia0 but is no CUDA process.
    let mut fork = Node::with_cuda(&[1]);
    fork.children.insert(1, vec![2]);
    fork.files.get_mut().unwrap().insert(2, vec![file("/dev/nvidia0")]);
    let mut locked = Node::with_cuda(&[1, 2]);
    locked.states.get_mut().unwrap().insert(2, ProcessState::Locked);
    let cases = [
        (fork, vec![1], "pid 2 holds /dev/nvidia0 (fd 5) but the CUDA driver cannot checkpoint it"),
        (locked, vec![1, 2], "pid 2 is locked, not running"),
    ];
    for (node, pids, needle) in cases {
        let node = Arc::new(node);
        let err = with(&node, |c| c.checkpoint(&Target::Pids(pids)).unwrap_err()).to_string();
        assert!(err.contains(needle) && err.contains("nothing was changed"), "{err}");
        assert!(node.calls().is_empty(), "{:?}", node.calls());
    }
}

#[test]
fn empty_scopes_are_named() {
    let node = Arc::new(Node::with_cuda(&[]).job(5, &[40]).job(6, &[]));
    let cases = [
        (Target::Job(5), "job 5: no process holds a GPU"),
        (Target::Job(6), "job 6: no process found"),
        (Target::Pids(vec![99]), "pid 99 does not exist"),
    ];
    for (target, needle) in cases {
        let err = with(&node, |c| c.checkpoint(&target).unwrap_err()).to_string();
        assert!(err.contains(needle), "{err}");
    }
}

#[test]
fn restore_is_refused_when_the_target_gpu_lacks_room() {
    let mut node = Node::with_cuda(&[1, 2]);
    node.free.insert(gpu(GPU0), GIB);
    let node = Arc::new(node);
    with(&node, |c| {
        c.checkpoint(&Target::Pids(vec![1, 2])).unwrap();
        let err = c.restore(&Target::Pids(vec![1, 2]), &DeviceMap::default()).unwrap_err().to_string();
        assert!(err.contains(&format!("not enough free memory on {GPU0} to restore pid 1,2")), "{err}");
        assert!(err.contains("needs 2304 MiB (2048 MiB footprint + 256 MiB margin), 1024 MiB free"), "{err}");
        // Onto the other GPU it fits.
        let map = DeviceMap::parse(&format!("{GPU0}={GPU1}")).unwrap();
        c.restore(&Target::Pids(vec![1, 2]), &map).unwrap();
    });
    assert_eq!(all_states(&node, &[1, 2]), [RUNNING; 2]);
}

#[test]
fn a_device_map_must_cover_every_checkpointed_gpu() {
    let node = Arc::new(Node::with_cuda(&[1]));
    with(&node, |c| {
        c.checkpoint(&Target::Pids(vec![1])).unwrap();
        let map = DeviceMap::parse(&format!("{GPU1}={GPU0}")).unwrap();
        let err = c.restore(&Target::Pids(vec![1]), &map).unwrap_err().to_string();
        assert!(err.contains(&format!("pid 1 was checkpointed on {GPU0} but the map does not say")), "{err}");
    });
    assert_eq!(node.state_of(1), Some(ProcessState::Checkpointed));
}

#[test]
fn a_failed_restore_leaves_all_locked_and_a_rerun_finishes_the_job() {
    let node = Arc::new(Node::with_cuda(&[1, 2]).failing("restore", 2, 2));
    let target = Target::Pids(vec![1, 2]);
    with(&node, |c| {
        c.checkpoint(&target).unwrap();
        let err = c.restore(&target, &DeviceMap::default()).unwrap_err().to_string();
        assert!(err.contains("restore failed: pid 2") && err.contains("stays locked"), "{err}");
        assert_eq!(all_states(&node, &[1, 2]), [Some(ProcessState::Locked), Some(ProcessState::Checkpointed)]);
        assert!(!node.calls().iter().any(|(c, _)| *c == "unlock"), "nothing is unlocked after a failed restore");
        // The fault cleared: the rerun restores 2 and unlocks both.
        node.heal();
        let report = c.restore(&target, &DeviceMap::default()).unwrap();
        assert_eq!(report.restored.iter().map(|p| p.pid).collect::<Vec<_>>(), [2]);
        assert_eq!(report.unlocked_only, [1]);
    });
    assert_eq!(all_states(&node, &[1, 2]), [RUNNING; 2]);
}

/// After CRIU: a process that ends as its unlock lets it go (it was dumped
/// on its way out) was restored; it is named gone, not a failed restore,
/// while a process whose unlock fails otherwise still fails the restore.
#[test]
fn a_restored_process_that_ends_during_its_unlock_is_gone_not_a_failure() {
    let mut node = Node::with_cuda(&[1, 2]);
    node.ends_at_unlock = vec![2];
    let node = Arc::new(node);
    with(&node, |c| {
        let procs = c.checkpoint(&Target::Pids(vec![1, 2])).unwrap().processes;
        let report = c.restore_processes(&procs, &DeviceMap::default()).unwrap();
        assert_eq!(report.gone, [2]);
        assert_eq!(report.restored.len(), 2);
    });
    assert_eq!(all_states(&node, &[1, 2]), [RUNNING; 2]);
    let node = Arc::new(Node::with_cuda(&[1]).failing("unlock", 1, 2));
    with(&node, |c| {
        let procs = c.checkpoint(&Target::Pids(vec![1])).unwrap().processes;
        let err = c.restore_processes(&procs, &DeviceMap::default()).unwrap_err().to_string();
        assert!(err.contains("pid 1"), "{err}");
    });
}

#[test]
fn a_reused_pid_is_not_restored() {
    let node = Arc::new(Node::with_cuda(&[1]));
    with(&node, |c| {
        c.checkpoint(&Target::Pids(vec![1])).unwrap();
        let mut record = record_of(c, &Target::Pids(vec![1]));
        record.processes[0].start_time += 1;
        record.save(&c.settings.record_dir).unwrap();
        let err = c.restore(&Target::Pids(vec![1]), &DeviceMap::default()).unwrap_err().to_string();
        assert!(err.contains("pid 1 is no longer the process that was checkpointed"), "{err}");
        assert!(c.restore(&Target::Pids(vec![7]), &DeviceMap::default()).unwrap_err().to_string().contains("no checkpoint record"));
    });
}

#[test]
fn processes_are_handled_in_parallel() {
    let pids = [1, 2, 3, 4, 5, 6];
    let node = Arc::new(Node { delay: Duration::from_millis(150), ..Node::with_cuda(&pids) });
    with(&node, |c| {
        let report = c.checkpoint(&Target::Pids(pids.to_vec())).unwrap();
        for phase in &report.phases {
            // Serially this phase would take 6 × 150 ms.
            assert!(phase.wall_ms < 600.0, "{:?} took {} ms", phase.step, phase.wall_ms);
            assert_eq!(phase.runs.len(), 6);
        }
    });
}

#[test]
fn state_reports_cuda_processes_and_gpu_holders_only() {
    let mut node = Node::with_cuda(&[10]).job(3, &[9, 10, 11]);
    node.files.get_mut().unwrap().insert(11, vec![file("/dev/nvidia0")]);
    let node = Arc::new(node);
    with(&node, |c| {
        let report = c.state(&Target::Job(3)).unwrap();
        let got: Vec<(i32, Option<ProcessState>, bool)> =
            report.processes.iter().map(|p| (p.pid, p.state, p.error.is_some())).collect();
        assert_eq!(got, [(10, RUNNING, false), (11, None, true)]);
        assert_eq!(report.processes[0].restore_thread, Some(11));
        assert_eq!(report.record_status, None);
    });
}

// --- The record as a journal: written before each step, restorable from any
// --- point a checkpoint can stop at.

#[test]
fn an_unwritable_record_dir_locks_nothing() {
    let node = Arc::new(Node::with_cuda(&[1, 2]));
    let dir = tempfile::tempdir().unwrap();
    let settings = settings(dir.path());
    std::fs::write(&settings.record_dir, b"a file where the record directory should be").unwrap();
    let err = checkpointer(&node, settings).checkpoint(&Target::Pids(vec![1, 2])).unwrap_err().to_string();
    assert!(err.contains("pids-1-2.json: cannot write it") && err.contains("nothing was locked"), "{err}");
    assert!(node.calls().is_empty(), "{:?}", node.calls());
    assert_eq!(all_states(&node, &[1, 2]), [RUNNING; 2]);
}

#[test]
fn a_record_dir_lost_after_the_first_write_stops_before_any_checkpoint_and_restore_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let settings = settings(dir.path());
    let (records, moved) = (settings.record_dir.clone(), dir.path().join("moved"));
    // At the first lock the record directory gives way to a file.
    let swap = {
        let (records, moved, once) = (records.clone(), moved.clone(), std::sync::Once::new());
        move |call: &str, _pid: i32| {
            if call == "lock" {
                once.call_once(|| {
                    std::fs::rename(&records, &moved).unwrap();
                    std::fs::write(&records, b"").unwrap();
                });
            }
        }
    };
    let node = Arc::new(Node { on_call: Some(Box::new(swap)), ..Node::with_cuda(&[1, 2, 3]) });
    let target = Target::Pids(vec![1, 2, 3]);
    let err = checkpointer(&node, settings.clone()).checkpoint(&target).unwrap_err().to_string();
    assert!(err.contains("cannot write it") && err.contains("nothing was checkpointed"), "{err}");
    assert!(err.contains("pid 1,2,3 running again") && err.contains("the record could not be updated"), "{err}");
    assert!(!node.calls().iter().any(|(c, _)| *c == "checkpoint"), "{:?}", node.calls());
    // Put the directory back: it holds the record as first written.
    std::fs::remove_file(&records).unwrap();
    std::fs::rename(&moved, &records).unwrap();
    let c = checkpointer(&node, settings);
    let record = record_of(&c, &target);
    assert_eq!(record.status, RecordStatus::InProgress);
    assert_eq!(phases(&record), [1, 2, 3].map(|p| (p, ProcessPhase::Locking)));
    let report = c.restore(&target, &DeviceMap::default()).unwrap();
    assert_eq!(report.record_status, RecordStatus::InProgress);
    assert_eq!(all_states(&node, &[1, 2, 3]), [RUNNING; 3]);
}

/// What the node and the record looked like at one moment.
type Snapshot = (Vec<u8>, HashMap<i32, ProcessState>);

#[test]
fn a_checkpoint_killed_half_way_leaves_a_record_that_restore_recovers_from() {
    let dir = tempfile::tempdir().unwrap();
    let settings = settings(dir.path());
    let path = CheckpointRecord::path(&settings.record_dir, "pids-1-2-3");
    // The moment of the "kill": when pid 2's checkpoint starts.
    let seen: Arc<Mutex<Option<Snapshot>>> = Arc::default();
    let node = Arc::new_cyclic(|me: &std::sync::Weak<Node>| {
        let (me, seen, path) = (me.clone(), seen.clone(), path.clone());
        let hook = move |call: &str, pid: i32| {
            if (call, pid) == ("checkpoint", 2) {
                let states = me.upgrade().unwrap().states.lock().unwrap().clone();
                *seen.lock().unwrap() = Some((std::fs::read(&path).unwrap_or_default(), states));
            }
        };
        Node { on_call: Some(Box::new(hook)), ..Node::with_cuda(&[1, 2, 3]) }
    });
    let target = Target::Pids(vec![1, 2, 3]);
    let c = checkpointer(&node, settings);
    c.checkpoint(&target).unwrap();
    // Back to that moment, as if the run had been killed there.
    let (bytes, states) = seen.lock().unwrap().take().unwrap();
    std::fs::write(&path, &bytes).unwrap();
    for (pid, state) in &states {
        let files = if *state == ProcessState::Checkpointed { vec![] } else { vec![file("/dev/nvidia0")] };
        node.files.lock().unwrap().insert(*pid, files);
    }
    *node.states.lock().unwrap() = states;
    let record = record_of(&c, &target);
    assert_eq!(record.status, RecordStatus::InProgress);
    assert_eq!(phases(&record), [1, 2, 3].map(|p| (p, ProcessPhase::Checkpointing)), "every locked process is named");
    assert_eq!(node.state_of(2), Some(ProcessState::Locked));
    let report = c.restore(&target, &DeviceMap::default()).unwrap();
    assert!(report.unlocked_only.contains(&2), "{:?}", report.unlocked_only);
    assert_eq!(all_states(&node, &[1, 2, 3]), [RUNNING; 3]);
}

#[test]
fn a_rollback_that_cannot_finish_leaves_a_record_naming_exactly_what_is_checkpointed() {
    // pid 2's checkpoint fails; undoing it, pid 3's restore fails too.
    let node = Node::with_cuda(&[1, 2, 3]).failing("checkpoint", 2, 2).failing("restore", 3, 2);
    let node = Arc::new(node);
    let target = Target::Pids(vec![1, 2, 3]);
    with(&node, |c| {
        let err = c.checkpoint(&target).unwrap_err().to_string();
        assert!(err.contains("checkpoint failed: pid 2") && err.contains("pid 3 restore FAILED"), "{err}");
        let record = record_of(c, &target);
        assert_eq!(record.status, RecordStatus::RollbackIncomplete);
        use ProcessPhase::{Checkpointed, Running};
        assert_eq!(phases(&record), [(1, Running), (2, Running), (3, Checkpointed)]);
        assert_eq!(all_states(&node, &[1, 2, 3]), [RUNNING, RUNNING, Some(ProcessState::Checkpointed)]);
        let state = c.state(&target).unwrap();
        assert_eq!(state.record_status, Some(RecordStatus::RollbackIncomplete));
        // The fault cleared, restore brings pid 3 back and nothing else.
        node.heal();
        let report = c.restore(&target, &DeviceMap::default()).unwrap();
        assert_eq!(report.restored.iter().map(|p| p.pid).collect::<Vec<_>>(), [3]);
        assert_eq!(report.record_status, RecordStatus::RollbackIncomplete);
    });
    assert_eq!(all_states(&node, &[1, 2, 3]), [RUNNING; 3]);
}

#[test]
fn a_checkpoint_call_that_hangs_is_reported_in_bounded_time_and_recorded_unknown() {
    let hang = Duration::from_millis(1500);
    let node = Arc::new(Node { hang: [(("checkpoint", 2), hang)].into(), ..Node::with_cuda(&[1, 2, 3]) });
    let dir = tempfile::tempdir().unwrap();
    let c = checkpointer(&node, Settings { call_timeout: Duration::from_millis(200), ..settings(dir.path()) });
    let target = Target::Pids(vec![1, 2, 3]);
    let start = Instant::now();
    let err = c.checkpoint(&target).unwrap_err().to_string();
    assert!(start.elapsed() < Duration::from_millis(1200), "waited {:?} for a 200 ms bound", start.elapsed());
    let call = "cuCheckpointProcessCheckpoint(pid 2) did not return within 0.2 s";
    assert!(err.contains(&format!("checkpoint failed: pid 2: {call}")), "{err}");
    assert!(err.contains(&format!("pid 2 left alone, its state unknown ({call})")), "{err}");
    assert!(err.contains("pid 1,3 running again"), "{err}");
    let record = record_of(&c, &target);
    assert_eq!(record.status, RecordStatus::RollbackIncomplete);
    use ProcessPhase::{Running, Unknown};
    assert_eq!(phases(&record), [(1, Running), (2, Unknown), (3, Running)]);
    assert_eq!(record.processes[1].unanswered.as_deref(), Some(call));
    let state = c.state(&target).unwrap();
    let pid2 = state.processes.iter().find(|p| p.pid == 2).unwrap();
    assert_eq!((pid2.phase, pid2.unanswered.as_deref()), (Some(Unknown), Some(call)));
    // Once the stuck call has returned, restore finds the process
    // checkpointed and brings it back.
    std::thread::sleep(hang);
    c.restore(&target, &DeviceMap::default()).unwrap();
    assert_eq!(all_states(&node, &[1, 2, 3]), [RUNNING; 3]);
}
