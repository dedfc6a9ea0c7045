//! Checkpoint: CUDA first (the GPU memory is freed as early as possible,
//! and CRIU then finds no GPU files), then CRIU, then the images are sealed
//! and the manifest written last. Success is reported only after the
//! manifest is durable; a failure leaves no manifest and removes the run
//! directory.
//!
//! Between the signal and the driver's checkpoint call stands only what the
//! driver needs or what guards it: the caller's and the tree's checks, the
//! scan of the tree's GPU holders and the record. The image directory is
//! made while the driver works, and the disk writes the image while CRIU
//! dumps it (writeback.rs). Every phase lands in the timeline (timeline.rs).

use super::server::Peer;
use super::{Agent, Because, FailureReason, RefusalKind, RequestError, RootState};
use crate::cuda_ckpt::record::CheckpointRecord;
use crate::cuda_ckpt::{CheckpointError, CheckpointReport, DeviceMap, FoundBy, NvidiaFile, Target};
use crate::criu::DumpRequest;
use crate::images::ImageStore;
use crate::manifest::{DumpTimings, Manifest, MANIFEST_VERSION};
use crate::protocol::CheckpointSummary;
use crate::timeline::{Stopwatch, Timeline};
use crate::log::Outcome;
use crate::shm::{self, Staged};
use crate::staging;
use crate::uncheckpointable;
use crate::writeback::Writeback;
use crate::{now_ms, tree};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Why an image CRIU wrote is not kept: each kind is one failure reason of
/// the metrics (`reason`), whatever its words.
#[derive(Debug, thiserror::Error)]
pub(super) enum DumpedError {
    /// The tree is resumed (end_dumped_tree).
    #[error("pid {pid} opened {file} after the GPU scan and before CRIU froze the tree: the image could never be restored and is dropped")]
    GpuFileOpened { pid: i32, file: NvidiaFile },
    /// The shared store could not record the staged image (publish_staged).
    #[error("cannot record the staged image in {store}: {source}")]
    StagedUnrecorded { store: PathBuf, source: std::io::Error },
}

impl DumpedError {
    pub(super) fn reason(&self) -> FailureReason {
        match self {
            DumpedError::GpuFileOpened { .. } => FailureReason::GpuFileInDump,
            DumpedError::StagedUnrecorded { .. } => FailureReason::Staging,
        }
    }
}

/// A failed checkpoint attempt. `again`: only a change of the tree's GPU
/// holders after the scan failed it (a GPU file opened, or CUDA left), and
/// the tree runs on with its GPU state back, as before the attempt: a second
/// attempt may succeed (Agent::checkpoint).
pub(super) struct AttemptFailed {
    error: RequestError,
    again: bool,
}

impl From<RequestError> for AttemptFailed {
    fn from(error: RequestError) -> AttemptFailed {
        AttemptFailed { error, again: false }
    }
}

/// What a rollback after a failed dump did: `whole` when the tree's GPU
/// state is back (or it had none); its words end the failure's message.
struct Undo {
    whole: bool,
    text: String,
}

impl std::fmt::Display for Undo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// What stands ready for CRIU's dump: the driver's checkpoint (none when the
/// tree holds no GPU files) and the /dev/shm files to carry (shm.rs).
struct Prepared<'a> {
    cuda: Option<CheckpointReport>,
    shm: Option<Staged>,
    /// The checked root (F8), looked at again just before CRIU.
    pinned: &'a crate::procfs::Pinned,
    record: &'a TreeRecord,
}

/// What the dump learns of the tree (beside the driver's checkpoint), and the
/// manifest keeps: what CRIU needs and may have, and what a restore must
/// give back (security review N1).
pub(super) struct TreeRecord {
    /// `--tcp-established` and CAP_NET_ADMIN: only when the site allows it
    /// and the tree holds a TCP connection (tcp.rs).
    pub tcp_established: bool,
    /// With it, CRIU's lock: none when every peer is the tree's own (tcp.rs),
    /// else an nftables table that netlock.rs records and removes.
    pub network_lock: crate::criu::NetworkLock,
    /// The tree's hard resource limits: CRIU's, at the dump and the restore.
    pub limits: crate::privdrop::HardLimits,
    /// Each process's confinement, compared after a restore.
    pub privs: std::collections::BTreeMap<i32, tree::Privs>,
    /// The tree's other thread ids: a restore waits for them as for its pids.
    pub tids: Vec<i32>,
    /// The local ports of its TCP sockets, which a restore rebinds (timewait.rs).
    pub tcp_ports: Vec<u16>,
}

impl TreeRecord {
    fn of(pids: &[i32], tcp_allowed: bool) -> TreeRecord {
        // One read of the tree's sockets and TCP tables serves both.
        let sockets = crate::tcp::TreeSockets::read(pids);
        let tcp = if tcp_allowed { sockets.tcp() } else { crate::tcp::TreeTcp::None };
        TreeRecord {
            tcp_established: tcp != crate::tcp::TreeTcp::None,
            network_lock: if tcp == crate::tcp::TreeTcp::InsideOnly { crate::criu::NetworkLock::Skip } else { crate::criu::NetworkLock::Nftables },
            limits: crate::privdrop::HardLimits::of_processes(pids),
            privs: tree::privs_of(pids),
            tids: tree::thread_ids(pids),
            tcp_ports: sockets.ports(),
        }
    }
}

/// The CUDA checkpoint's outcome: its report, or none when the tree holds
/// no GPU files.
type CudaOutcome = Result<Option<CheckpointReport>, AttemptFailed>;

impl Agent {
    /// One attempt, and a second when the first was dropped only because a
    /// process of the tree opened a GPU file after the scan (a job preempted
    /// as its application starts, or as it starts another GPU process) and
    /// everything went back as it was: the second attempt's scan finds that
    /// process, and the job keeps its progress rather than starting over.
    /// At most two: a tree that keeps opening GPU files cannot hold its
    /// checkpoint past the job's grace time.
    pub(super) fn checkpoint(&self, peer: Peer, root: i32, signal_at_ms: Option<u64>) -> Result<CheckpointSummary, RequestError> {
        let _op = self.exclusive()?;
        self.criu_usable("checkpoint")?;
        match self.checkpoint_once(peer, root, signal_at_ms) {
            // An application that ended meanwhile is not tried again: its
            // end is what the wrapper must learn, with the first reason.
            Err(AttemptFailed { error, again: true }) if crate::procfs::read(root).is_some_and(|p| p.state != 'Z') => {
                self.log("checkpoint-attempt", Outcome::Failed, &format!("{error}; checkpointing once more"));
                let second = self.checkpoint_once(peer, root, signal_at_ms);
                let summary = second.map_err(|f| f.error.noting(&format!("at a second attempt, the first failed: {error}")))?;
                Ok(CheckpointSummary { first_attempt: Some(error.to_string()), ..summary })
            }
            other => other.map_err(|f| f.error),
        }
    }

    fn checkpoint_once(&self, peer: Peer, root: i32, signal_at_ms: Option<u64>) -> Result<CheckpointSummary, AttemptFailed> {
        // From the signal: a second attempt's phases count the first's time.
        let lead_ms = signal_at_ms.map(|at| now_ms().saturating_sub(at) as f64);
        let mut sw = Stopwatch::new("request", lead_ms);
        let t = Instant::now();
        self.check_root(peer, root)?;
        self.refuse_several_nodes()?;
        let pinned = crate::procfs::Pinned::new(root).because(FailureReason::Other)?;
        let pids = self.host.with_descendants(root);
        tree::check_owned(&pids, &self.user).because(FailureReason::Other)?;
        // Before anything is locked: what CRIU could not dump alone is
        // found (and refused) here.
        uncheckpointable::refuse(&pids, &self.facts.driver_version, self.params.nccl, self.settings.max_deleted_files, self.settings.ghost_limit_bytes).map_err(|e| format!("cannot checkpoint: {e}")).because(FailureReason::Uncheckpointable)?;
        let shm = shm::stage(&pids, root, &self.user).map_err(|e| format!("cannot checkpoint: {e}; nothing was changed")).because(FailureReason::Shm)?;
        sw.since("checks", t);
        let was = self.root_state(root);
        if was.is_some() {
            self.set_root(root, Some(RootState::Dumping));
        }
        // The root checked above is the one the driver and CRIU get.
        let result = pinned
            .still_there()
            .because(FailureReason::Other)
            .map_err(AttemptFailed::from)
            .and_then(|_| self.dump_tree(&pinned, root, &pids, shm, signal_at_ms.is_some(), &mut sw));
        if was.is_some() {
            self.set_root(root, Some(if result.is_ok() { RootState::Dumped } else { RootState::Running }));
        }
        result
    }

    /// CUDA checkpoint (with the run directory made meanwhile), then CRIU;
    /// a failure removes the run directory: never a partial image, and
    /// never one that claims success.
    fn dump_tree(
        &self,
        pinned: &crate::procfs::Pinned,
        root: i32,
        pids: &[i32],
        shm: Option<Staged>,
        from_signal: bool,
        sw: &mut Stopwatch,
    ) -> Result<CheckpointSummary, AttemptFailed> {
        let target = Target::Pids(vec![root]);
        let (run, cuda, record) = self.cuda_checkpoint_and_run_dir(&target, pids, sw);
        let record = &record;
        let (run, cuda) = match (run, cuda) {
            (Ok(run), Ok(cuda)) => (run, cuda),
            // The checkpointer has rolled its own failure back.
            (run, Err(e)) => {
                if let Ok(run) = run {
                    let _ = crate::fsutil::remove_tree_if_present(&run);
                }
                return Err(e);
            }
            (Err(e), Ok(cuda)) => {
                let undo = self.roll_back(cuda.is_some(), &target);
                return Err(RequestError::failed(FailureReason::ImageDir, format!("cannot prepare the image directory: {e}; {undo}")).into());
            }
        };
        let result = self.dump_into(&run, root, pids, Prepared { cuda, shm, pinned, record }, from_signal, sw);
        if result.is_err() {
            let _ = crate::fsutil::remove_tree_if_present(&run);
        }
        result
    }

    /// The driver's checkpoint of the tree and, side by side (neither needs
    /// the other), the image directory's preparation (which may remove a
    /// failed attempt's leftovers) and the tree's record for CRIU and the
    /// manifest (/proc reads: tens of ms on a training job's tree, seen on
    /// an H200, which need not stand between the signal and a free GPU).
    fn cuda_checkpoint_and_run_dir(&self, target: &Target, pids: &[i32], sw: &mut Stopwatch) -> (std::io::Result<PathBuf>, CudaOutcome, TreeRecord) {
        let (job, restart) = (self.params.run.job, self.params.run.restart_count);
        let (run, cuda) = std::thread::scope(|s| {
            let prep = s.spawn(|| {
                let t = Instant::now();
                let run = self.dump_store().prepare_run(job, restart);
                let done = Instant::now();
                (run, t, done, TreeRecord::of(pids, self.settings.tcp_established))
            });
            let cuda = match self.checkpointer().checkpoint_scope(target, pids, FoundBy::Pid) {
                Ok(r) => Ok(Some(r)),
                Err(CheckpointError::NoCudaProcesses { .. }) => Ok(None),
                Err(e) => {
                    let reason = match e {
                        CheckpointError::HostMemory { .. } => FailureReason::HostMemory,
                        CheckpointError::NotCheckpointable { .. } => FailureReason::Uncheckpointable,
                        _ => FailureReason::CudaCheckpoint,
                    };
                    // A process that opened its GPU file after the scan (the
                    // same race as end_dumped_tree's, seen before CRIU), or
                    // one that left CUDA meanwhile (an application ending as
                    // the signal came: the next scan leaves it to CRIU, or
                    // finds it ended).
                    let again = e.holders_changed_after_scan();
                    Err(AttemptFailed { error: RequestError::failed(reason, format!("CUDA checkpoint failed: {e}")), again })
                }
            };
            let run = prep.join().unwrap_or_else(|_| {
                let now = Instant::now();
                (Err(std::io::Error::other("panicked")), now, now, TreeRecord::of(pids, self.settings.tcp_established))
            });
            (run, cuda)
        });
        let (run, t0, t1, record) = run;
        sw.record("image-dir", t0, t1);
        if let Ok(Some(report)) = &cuda {
            for (name, a, b) in &report.marks {
                sw.record(name, *a, *b);
            }
        }
        (run, cuda, record)
    }

    /// The root must be the caller's own descendant or a tree this agent
    /// restored, and the caller must be one of the job's processes (root,
    /// the admin, is trusted).
    fn check_root(&self, peer: Peer, root: i32) -> Result<(), RequestError> {
        if root <= 1 {
            return Err(RequestError::refused(RefusalKind::InvalidRoot, format!("pid {root} cannot be checkpointed: refused")));
        }
        if peer.uid != 0 {
            self.peer_in_job(peer)?;
        }
        if self.root_state(root).is_some() || tree::descends_from(root, peer.pid) {
            return Ok(());
        }
        let message = format!("pid {root} is neither a descendant of the caller (pid {}) nor a tree this agent restored: refused", peer.pid);
        Err(RequestError::refused(RefusalKind::NotDescendant, message))
    }

    /// A job on several nodes: this agent sees only its own node's
    /// processes, and an image of them alone could not bring the job back
    /// (its processes on the other nodes would be missing). Refused before
    /// anything is locked, so the job starts over.
    fn refuse_several_nodes(&self) -> Result<(), RequestError> {
        let nodes = &self.params.job_nodes;
        if nodes.len() < 2 {
            return Ok(());
        }
        Err(several_nodes_message(self.params.run.job, nodes, &self.params.run.node)).because(FailureReason::Uncheckpointable)
    }

    /// Another job of the same user on this node must not use this agent.
    /// A scan that fails is a failure, not a refusal: the node has a problem.
    pub(super) fn peer_in_job(&self, peer: Peer) -> Result<(), RequestError> {
        match self.host.is_job_process(peer.pid, self.params.run.job) {
            Ok(true) => Ok(()),
            Ok(false) => {
                let message = format!("the caller (pid {}) is not a process of job {}: refused", peer.pid, self.params.run.job);
                Err(RequestError::refused(RefusalKind::NotInJob, message))
            }
            Err(e) => Err(RequestError::failed(FailureReason::Other, format!("cannot tell the processes of job {}: {e}", self.params.run.job))),
        }
    }

    fn dump_into(
        &self,
        run: &Path,
        root: i32,
        pids: &[i32],
        prepared: Prepared,
        from_signal: bool,
        sw: &mut Stopwatch,
    ) -> Result<CheckpointSummary, AttemptFailed> {
        let Prepared { cuda, shm, pinned, record } = prepared;
        let target = Target::Pids(vec![root]);
        // CRIU writes as the user (crate::criu): the run directory is theirs
        // for the run only (the seal takes every file back), its log goes to
        // a work directory of its own, outside the sealed set.
        let (uid, gid) = (self.params.run.uid, self.params.run.gid);
        let lend = || -> std::io::Result<_> {
            let work = ImageStore::prepare_work(run, "dump")?;
            Ok((ImageStore::lend(run, uid, gid)?, ImageStore::lend(&work, uid, gid)?, work))
        };
        let (lent, lent_work, work_dir) = pinned
            .still_there()
            .because(FailureReason::Other)
            .and_then(|_| lend().map_err(|e| e.to_string()).because(FailureReason::ImageDir))
            .map_err(|e| e.noting(&self.roll_back(cuda.is_some(), &target).to_string()))?;
        // A second survey, not the one `uncheckpointable::refuse` made
        // before the lock: CRIU's `--ghost-limit` and the image's bound must
        // fit the files as CRIU will find them, and the tree runs on between
        // the two (it is frozen only when CRIU seizes it): it may unlink,
        // grow or make /dev/shm buffers meanwhile, and the driver's
        // checkpoint lies between them. The first pass's sizes could give
        // CRIU a limit below a buffer's, a dump failed after the driver's
        // lock; and no cheaper check (re-reading only the inodes seen
        // first) would see a file made since. Its cost: one read of the
        // tree's fd and maps links, off the path to a free GPU.
        let ghosts = crate::ghosts::Ghosts::survey(pids);
        // A pool job's buffers as the driver left them: what was served from
        // the host memory pool (preempt::pool), for the job's line.
        let pool_bytes: u64 = if self.params.pool { pids.iter().map(|&p| crate::cuda_ckpt::host_room::pool_bytes(Path::new("/proc"), p)).sum() } else { 0 };
        let req = DumpRequest {
            pid: root,
            images_dir: run.to_path_buf(),
            work_dir,
            tcp_established: record.tcp_established,
            network_lock: record.network_lock,
            // Unlinked /dev/shm files go whole: they are the job's memory
            // (crate::ghosts); every other deleted file was checked against
            // the site's limit before the lock.
            ghost_limit_bytes: ghosts.ghost_limit(self.settings.ghost_limit_bytes),
            user: self.user.clone(),
            limits: record.limits.clone(),
            // After the driver's checkpoint: the GPU memory is in the tree's
            // own memory now, and the /dev/shm ghosts are memory too. Unread
            // (0): no bound rather than a wrong one.
            max_image_bytes: Some(tree::memory_bytes(pids)).filter(|m| *m > 0).map(|m| {
                crate::criu::image_bound(m.saturating_add(ghosts.shm_total()), self.settings.ghost_limit_bytes, self.settings.max_deleted_files as u64)
            }),
        };
        let keeps_lock = req.tcp_established && req.network_lock == crate::criu::NetworkLock::Nftables;
        // A table CRIU makes during the dump is not a stray one (netlock.rs).
        let dumping = keeps_lock.then(|| self.settings.netlocks.dumping(self.params.run.job)).and_then(|m| {
            m.map_err(|e| self.log("netlock", Outcome::Failed, &format!("cannot mark the dump under way: {e}"))).ok()
        });
        // Best effort: without it the seal writes everything, as before.
        let writeback = self.settings.early_writeback.then(|| Writeback::start(run).ok()).flatten();
        let t = Instant::now();
        let dumped = self.criu.dump(&req);
        // The lock CRIU left, recorded before anything else can fail.
        let lock = (keeps_lock && dumped.is_ok()).then(|| self.record_lock(run)).flatten();
        drop(dumping);
        // Within the phase: the plain `criu dump` kills the tree and waits for it too.
        let ended = dumped.is_ok().then(|| self.end_dumped_tree(root));
        let back = lent.give_back();
        drop(lent_work);
        sw.since("criu-dump", t);
        if let Some(w) = writeback {
            w.stop();
            sw.since("writeback", t);
        }
        if let Err(e) = dumped {
            // The real driver's files are character devices CRIU refuses:
            // a process that opened one after the scan fails CRIU itself.
            // The driver's checkpoint left no GPU file in the processes it
            // found, so one there now is such a latecomer.
            let late = self.gpu_holder(&self.host.with_descendants(root)).map(|(pid, file)| format!("; pid {pid} opened {file} after the GPU scan"));
            let undo = self.roll_back(cuda.is_some(), &target);
            let reason = if late.is_some() { FailureReason::GpuFileInDump } else { FailureReason::Criu };
            let error = RequestError::failed(reason, format!("{e}{}; {undo}", late.as_deref().unwrap_or("")));
            return Err(AttemptFailed { error, again: late.is_some() && undo.whole });
        }
        if let Some(Err(e)) = ended {
            // The tree runs again: its GPU state goes back too, and its
            // connections must flow again.
            self.release_lock(lock.as_deref());
            let undo = self.roll_back(cuda.is_some(), &target);
            let again = matches!(e, DumpedError::GpuFileOpened { .. }) && undo.whole;
            return Err(AttemptFailed { error: RequestError::failed(e.reason(), format!("{e}; {undo}")), again });
        }
        let _ = CheckpointRecord::remove(&self.settings.checkpoint.record_dir, &target.key());
        // From here on the tree is gone: a failure means starting over,
        // which the wrapper must be told (it would take the killed
        // application's status for the job's otherwise).
        let lost = |reason: FailureReason, e: String| RequestError::TreeLost {
            reason,
            message: format!("{e}; the tree was dumped and killed, and the image is dropped"),
        };
        // An image that is not root's again cannot be sealed. An image that
        // is dropped needs no lock: no restore will remove it.
        let sealed = back
            .map_err(|e| (FailureReason::ImageDir, e.to_string()))
            .and_then(|_| self.seal_dumped(run, root, pids, record, cuda.as_ref(), shm, from_signal, sw))
            .map(|summary| CheckpointSummary { pool_bytes, ..summary });
        if sealed.is_err() {
            self.release_lock(lock.as_deref());
        }
        sealed.map_err(|(reason, e)| lost(reason, e).into())
    }

    /// The nftables table the dump in `run` left (netlock.rs), recorded for
    /// this node's sweeps; none (logged) when the inventory does not name
    /// one: the sweep then removes it as a stray once no dump is under way.
    fn record_lock(&self, run: &Path) -> Option<String> {
        let locks = &self.settings.netlocks;
        let recorded = crate::netlock::table_of_dump(run, self.params.run.uid)
            .and_then(|table| locks.record(&table, self.params.run.job, run).map(|_| table).map_err(|e| e.to_string()));
        match recorded {
            Ok(table) => Some(table),
            Err(e) => {
                self.log("netlock", Outcome::Failed, &format!("the dump's network lock is not recorded ({e}): a sweep removes it as a stray"));
                None
            }
        }
    }

    /// Removes the table of a dump whose image is not kept.
    fn release_lock(&self, table: Option<&str>) {
        if let Some(table) = table {
            if let Err(e) = self.settings.netlocks.release(table) {
                self.log("netlock", Outcome::Failed, &format!("cannot remove the network lock {table}: {e}"));
            }
        }
    }

    /// The dumped (and killed) tree's image: /dev/shm files, sealed images,
    /// the manifest written last and synced, the staged copy recorded.
    #[allow(clippy::too_many_arguments)]
    fn seal_dumped(
        &self,
        run: &Path,
        root: i32,
        pids: &[i32],
        record: &TreeRecord,
        cuda: Option<&CheckpointReport>,
        shm: Option<Staged>,
        from_signal: bool,
        sw: &mut Stopwatch,
    ) -> Result<CheckpointSummary, (FailureReason, String)> {
        let shm = match shm {
            Some(s) => {
                let (objects, note) = sw.time("shm", || s.save(run)).map_err(|e| (FailureReason::Shm, e.to_string()))?;
                if let Some(note) = note {
                    self.log("shm-remove", crate::log::Outcome::Failed, &note.to_string());
                }
                objects
            }
            None => vec![],
        };
        let images = sw
            .time("seal", || ImageStore::seal(run, self.params.run.uid))
            .map_err(|e| (FailureReason::Seal, format!("cannot seal the images in {}: {e}", run.display())))?;
        let mut manifest = self.manifest(root, pids, cuda, images, sw.timeline(), from_signal);
        manifest.shm = shm;
        manifest.tcp_established = record.tcp_established;
        manifest.tcp_ports = record.tcp_ports.clone();
        manifest.privs = record.privs.clone();
        manifest.tids = record.tids.clone();
        manifest.limits = record.limits.clone();
        let t = Instant::now();
        manifest.save(run).map_err(|e| (FailureReason::Manifest, format!("cannot write the manifest in {}: {e}", run.display())))?;
        self.dump_store().sync_parents(self.params.run.job).map_err(|e| (FailureReason::Manifest, format!("cannot sync the image directory: {e}")))?;
        sw.since("manifest", t);
        if self.settings.staging.is_some() {
            sw.time("staged", || self.publish_staged(run)).map_err(|e| (e.reason(), e.to_string()))?;
        }
        // Older images of this job (restored already) are of no more use.
        let _ = self.dump_store().remove_other_runs(self.params.run.job, Some(self.params.run.restart_count));
        let timeline = sw.timeline().clone();
        Ok(CheckpointSummary {
            image_dir: run.display().to_string(),
            image_bytes: manifest.image_bytes,
            gpu_bytes: cuda.map_or(0, |r| r.bytes()),
            cuda_processes: manifest.cuda.len(),
            processes: cuda.map(crate::protocol::ProcessSteps::of).unwrap_or_default(),
            timings: timings_of(&timeline, from_signal),
            timeline,
            pool_bytes: 0,
            first_attempt: None,
        })
    }

    /// A staged image (staging.rs) is durable on this node: the shared
    /// store records it (before the job is requeued: a restore anywhere
    /// then knows of it), and its copy there starts in the background.
    fn publish_staged(&self, run: &Path) -> Result<(), DumpedError> {
        let (job, restart, node) = (self.params.run.job, self.params.run.restart_count, self.params.run.node.clone());
        let shared = self.settings.images.clone();
        shared
            .record_staged(job, restart, &node)
            .map_err(|source| DumpedError::StagedUnrecorded { store: shared.root.clone(), source })?;
        let _ = shared.remove_other_runs(job, Some(restart));
        let bytes_per_s = self.settings.staging.as_ref().map_or(0, |s| s.copy_bytes_per_s);
        let (run, log) = (run.to_path_buf(), self.settings.log.clone());
        let line = self.action_line("staging-copy").field("run", restart);
        let copy = std::thread::Builder::new().name("staging-copy".into()).spawn(move || {
            let t = Instant::now();
            let (outcome, detail) = match staging::copy_run(&run, &shared, job, restart, &node, bytes_per_s) {
                Ok(bytes) => {
                    let to = shared.run_dir(job, restart);
                    (Outcome::Ok, format!("{bytes} bytes to {} in {:.1} s", to.display(), t.elapsed().as_secs_f64()))
                }
                Err(e @ staging::CopyError::Abandoned { .. }) => (Outcome::Skipped, e.to_string()),
                Err(e) => {
                    // A restore elsewhere stops waiting at once.
                    let _ = std::fs::write(shared.copy_failed_path(job, restart), format!("{e}\n"));
                    (Outcome::Failed, format!("{e}; a restore on another node starts the job over, this node's copy stays"))
                }
            };
            line.field("detail", detail).outcome(outcome).emit(&log);
        });
        match copy {
            Ok(handle) => self.copies.lock().unwrap_or_else(|p| p.into_inner()).push(handle),
            Err(e) => self.log("staging-copy", Outcome::Failed, &format!("cannot start the copy of run {restart}: {e}")),
        }
        Ok(())
    }

    /// CRIU leaves the dumped tree stopped as it froze it (`--leave-stopped`,
    /// crate::criu::cli::dump_args), so what these processes hold now is what
    /// the image holds. A GPU file among it, opened after the scan by a
    /// process the driver therefore never checkpointed (a job preempted as
    /// its application starts), makes an image that cannot be restored (seen
    /// in the churn test: CRIU's restore could not reopen the simulated
    /// device file and the job ended FAILED). Such a tree runs on and the
    /// dump fails, as when CRIU fails; otherwise the tree is killed, as CRIU
    /// would have killed it, and waited for, as CRIU waited (a restore on
    /// this node needs the pids free; seen on 2xH200: a restore right after
    /// found the 8 GiB process still a zombie its parent had not yet been
    /// able to reap). The real driver's files are character devices CRIU
    /// refuses on its own; this catches every `device_paths` file.
    fn end_dumped_tree(&self, root: i32) -> Result<(), DumpedError> {
        let pids = self.host.with_descendants(root);
        match self.gpu_holder(&pids) {
            None => {
                let ids: Vec<crate::procfs::ProcId> = pids.iter().filter_map(|p| crate::procfs::read(*p)).map(|p| p.id()).collect();
                tree::kill_all(&ids);
                if let Err(pid) = tree::wait_dead(&ids, self.settings.pid_wait) {
                    self.log("dump-kill", crate::log::Outcome::Failed, &format!("pid {pid} of the dumped tree still runs after SIGKILL"));
                }
                Ok(())
            }
            Some((pid, file)) => {
                tree::resume_all(&pids);
                Err(DumpedError::GpuFileOpened { pid, file })
            }
        }
    }

    /// A process of `pids` that holds a GPU file (`device_paths`), and that
    /// file: after the driver's checkpoint, one it did not find.
    fn gpu_holder(&self, pids: &[i32]) -> Option<(i32, NvidiaFile)> {
        pids.iter().find_map(|&p| Some((p, self.host.nvidia_files(p).ok()?.into_iter().next()?)))
    }

    /// After a failed CRIU dump (CRIU resumed the tree): the GPU state goes
    /// back so the application runs on until the job ends or is requeued.
    fn roll_back(&self, had_cuda: bool, target: &Target) -> Undo {
        let (whole, text) = if !had_cuda {
            (true, "the application runs on".to_string())
        } else {
            match self.checkpointer().restore(target, &DeviceMap::default()) {
                Ok(_) => (true, "its GPU state was restored and the application runs on".to_string()),
                Err(e) => (false, format!("its GPU state could NOT be restored ({e})")),
            }
        };
        Undo { whole, text }
    }

    fn manifest(
        &self,
        root: i32,
        pids: &[i32],
        cuda: Option<&CheckpointReport>,
        images: Vec<crate::manifest::ImageFile>,
        timeline: &Timeline,
        from_signal: bool,
    ) -> Manifest {
        let p = &self.params;
        Manifest {
            version: MANIFEST_VERSION,
            job: p.run.job,
            restart_count: p.run.restart_count,
            uid: p.run.uid,
            gid: p.run.gid,
            node: p.run.node.clone(),
            created_unix: now_ms() / 1000,
            root_pid: root,
            pids: pids.to_vec(),
            cuda: cuda.map(|r| r.processes.clone()).unwrap_or_default(),
            gpus: p.gpus.clone(),
            node_gpus: self.facts.node_gpus.clone(),
            driver_version: self.facts.driver_version.clone(),
            cuda_version: self.facts.cuda_version,
            criu_version: self.criu_status().clone().unwrap_or_default(),
            tcp_established: self.settings.tcp_established,
            tcp_ports: Vec::new(),
            image_bytes: images.iter().map(|f| f.bytes).sum(),
            images,
            shm: vec![],
            tids: vec![],
            privs: Default::default(),
            limits: Default::default(),
            timings: timings_of(timeline, from_signal),
            timeline: timeline.clone(),
        }
    }
}

/// The summary figures of a dump's timeline (see [`DumpTimings`]). The GPU
/// memory is free when the driver's checkpoint returns (or, for a tree
/// without GPU memory, when the checks are done).
/// Why a job on `nodes` is not checkpointed by the agent of `node`.
fn several_nodes_message(job: u32, nodes: &[String], node: &str) -> String {
    format!(
        "cannot checkpoint: job {job} runs on {} nodes ({}), and checkpoint mode checkpoints the processes of one node \
         ({node}): its processes on the others could not be restored: refused, nothing was changed (submit it with \
         -N 1 to have it checkpointed)",
        nodes.len(),
        nodes.join(",")
    )
}

fn timings_of(t: &Timeline, from_signal: bool) -> DumpTimings {
    let len = |name: &str| t.phase(name).map_or(0.0, |p| p.ms);
    let gpu_free = t.end_of("cuda-checkpoint").or_else(|| t.end_of("checks")).unwrap_or(0.0);
    let durable = t.end_ms();
    let lead = if from_signal { t.phase("request").map_or(0.0, |p| p.ms) } else { 0.0 };
    DumpTimings {
        signal_to_gpu_free_ms: from_signal.then_some(gpu_free),
        cuda_lock_ms: len("cuda-lock"),
        cuda_checkpoint_ms: len("cuda-checkpoint"),
        criu_dump_ms: len("criu-dump"),
        seal_ms: len("seal"),
        total_ms: durable - lead,
        signal_to_durable_ms: from_signal.then_some(durable),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each kind has its reason and the words the failure carried before.
    #[test]
    fn a_dropped_image_names_its_reason_by_kind() {
        let file = NvidiaFile { how: "fd 12".into(), path: "/dev/nvidia0".into() };
        let cases = [
            (
                DumpedError::GpuFileOpened { pid: 42, file },
                FailureReason::GpuFileInDump,
                "pid 42 opened /dev/nvidia0 (fd 12) after the GPU scan and before CRIU froze the tree: the image could never be restored and is dropped",
            ),
            (
                DumpedError::StagedUnrecorded { store: "/shared/images".into(), source: std::io::Error::from_raw_os_error(libc::ENOSPC) },
                FailureReason::Staging,
                "cannot record the staged image in /shared/images: No space left on device (os error 28)",
            ),
        ];
        for (e, reason, text) in cases {
            assert_eq!((e.reason(), e.to_string()), (reason, text.to_string()));
        }
    }
}
