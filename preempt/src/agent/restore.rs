//! Restore: every check that can refuse runs before CRIU (manifest, files,
//! driver, GPU models, device map, free GPU memory, pids), so a node that
//! cannot take the job refuses it with the image intact and nothing started.
//! After CRIU, a failure kills what was restored. A restored image is marked
//! consumed: it is never restored twice.

use super::server::Peer;
use super::{Agent, Because, FailureReason, RefusalKind, RequestError, RootState};
use crate::cuda_ckpt::DeviceMap;
use crate::criu::{CgroupError, HoldScript, RestoreRequest, TargetCgroup};
use super::hold::Pending;
use crate::held::ImagePages;
use crate::page_cache::{self, BufferRestore};
use crate::images::{ImageStore, Lent};
use crate::manifest::{Manifest, ManifestError};
use crate::protocol::RestoreSummary;
use crate::shm;
use crate::staging::{self, Found, Source};
use crate::timeline::Stopwatch;
use crate::tree;
use crate::procfs;
use std::path::Path;
use std::time::Instant;

/// Why the tree CRIU restored (and left stopped) is killed before it runs:
/// every kind is the failure reason `restored_check`.
#[derive(Debug, thiserror::Error)]
pub(super) enum RestoredCheckError {
    #[error("CRIU restored pid {restored}, but the image's root is pid {image}")]
    OtherRoot { restored: i32, image: i32 },
    /// Not in the job's cgroups: it would escape its limits and accounting.
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error(transparent)]
    Owner(#[from] tree::OwnerError),
    /// A file the user may not hold, or one the check could not look at.
    #[error(transparent)]
    Held(#[from] crate::held::HeldError),
}

/// The image a restore takes (Agent::locate).
pub(super) struct Located {
    pub restart: u32,
    pub dir: std::path::PathBuf,
    /// This node's staged copy (staging.rs), not the shared store's.
    pub local: bool,
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

impl Agent {
    pub(super) fn restore(&self, peer: Peer) -> Result<(i32, RestoreSummary), RequestError> {
        let mut sw = Stopwatch::new("request", None);
        let _op = self.exclusive()?;
        self.criu_usable("restore")?;
        if peer.uid != 0 {
            self.peer_in_job(peer)?;
        }
        let (located, note) = self.locate();
        let Some(Located { restart, dir, local }) = located else {
            let message = note.unwrap_or_else(|| format!("no checkpoint image of job {} in {}", self.params.run.job, self.settings.images.root.display()));
            return Err(RequestError::refused(RefusalKind::NoImage, message));
        };
        let result = self.restore_image(peer, restart, &dir, local, &mut sw);
        if let Err(e) = &result {
            // The epilog of this run would otherwise remove the image that
            // the message promises to keep (it keeps only what a run
            // completed): the mark tells it this run tried and was refused.
            let stores = std::iter::once(&self.settings.images).chain(self.settings.staging.as_ref().filter(|_| local).map(|s| &s.local));
            for store in stores {
                if let Err(io) = store.mark_refused(self.params.run.job, self.params.run.restart_count, &e.to_string()) {
                    self.log("restore-mark", crate::log::Outcome::Failed, &io.to_string());
                }
            }
        }
        result
    }

    /// Where this run's image is (staging::decide): this node's staged
    /// copy, the shared store's, or, for a run staged on another node whose
    /// copy is under way, the shared copy once it is complete (waited for
    /// within `staging_wait_s`). `None` with a note: a staged run whose copy
    /// failed or did not come is given up (its record removed, so that no
    /// node restores it later), and the job starts over.
    pub(super) fn locate(&self) -> (Option<Located>, Option<String>) {
        let (job, shared) = (self.params.run.job, &self.settings.images);
        let local = self.settings.staging.as_ref().map(|s| &s.local);
        let staged = shared.staged(job);
        let found = Found {
            local: local.and_then(|l| l.latest(job)).map(|(r, _)| r),
            shared: shared.latest(job).map(|(r, _)| r),
            copy_failed: staged.iter().map(|s| s.0).filter(|r| shared.copy_failed_path(job, *r).is_file()).collect(),
            staged,
        };
        let at = |restart: u32, local: bool| {
            let store = if local { self.dump_store() } else { shared };
            Some(Located { restart, dir: store.run_dir(job, restart), local })
        };
        let why = match staging::decide(&found, &self.params.run.node) {
            Source::Nothing => return (None, None),
            Source::Local(r) => return (at(r, true), None),
            Source::Shared(r) => return (at(r, false), None),
            Source::Wait { run, node } => match staging::wait_for_copy(shared, job, run, &node, self.settings.staging_wait, staging::STALL) {
                Ok(()) => return (at(run, false), None),
                Err(why) => (run, why),
            },
            Source::CopyFailed { run, node } => {
                let why = staging::observe(shared, job, run).failed.unwrap_or_default();
                (run, staging::CopyWaitError::CopyFailed { run, node, why })
            }
        };
        let (run, why) = why;
        if let Err(e) = shared.unstage(job, run) {
            self.log("staging-give-up", crate::log::Outcome::Failed, &e.to_string());
        }
        self.log("staging-give-up", crate::log::Outcome::Ok, &why.to_string());
        (None, Some(format!("{why}; nothing is restored from a partial copy")))
    }

    fn restore_image(
        &self,
        peer: Peer,
        restart: u32,
        dir: &Path,
        local: bool,
        sw: &mut Stopwatch,
    ) -> Result<(i32, RestoreSummary), RequestError> {
        let dir = dir.to_path_buf();
        let t = Instant::now();
        let (manifest, map, opened, buffer) = self.vet(&dir, sw).map_err(|e| e.noting("the image is kept"))?;
        // Last: a pid or thread id another process holds here may be free
        // on another node, where the wrapper then moves the job (security
        // review F7, N3).
        let ids: Vec<i32> = manifest.pids.iter().chain(&manifest.tids).copied().collect();
        sw.time("pids-free", || tree::wait_pids_free(&ids, self.settings.pid_wait))
            .map_err(|e| RequestError::NotHere(format!("{e}; the image is kept")))?;
        let cgroup = TargetCgroup::of_pid(peer.pid).because(FailureReason::Other)?;
        // Dropped on any failure below: the names made are removed again. A
        // name someone made here since the checkpoint (another user's, N3)
        // may be free on another node.
        let shm = sw.time("shm", || shm::recreate(&manifest.shm, &dir, peer.pid, &self.user)).map_err(|e| {
            let taken = matches!(&e, shm::ShmError::Remake { source, .. } if source.raw_os_error() == Some(libc::EEXIST));
            let message = format!("{e}; the image is kept");
            if taken {
                RequestError::NotHere(message)
            } else {
                RequestError::failed(FailureReason::Shm, message)
            }
        })?;
        let check_ms = ms(t);
        self.clear_time_wait(&manifest);
        let (pid, tree) = self.criu_restore(&dir, &manifest, cgroup, opened, buffer, sw)?;
        let t = Instant::now();
        if !manifest.cuda.is_empty() {
            if let Err(e) = self.checkpointer().restore_processes(&manifest.cuda, &map) {
                self.kill_restored(&manifest, &tree);
                let message = format!("CUDA restore failed: {e}; the restored processes were killed, the image is kept");
                return Err(RequestError::failed(FailureReason::CudaRestore, message));
            }
            sw.since("cuda-restore", t);
        }
        let t = Instant::now();
        let consumed = ImageStore::consume(&dir).and_then(|_| staging::settle_restored(&self.settings.images, self.params.run.job, restart, local));
        if let Err(e) = consumed {
            // It runs; only a second restore of this image is at risk.
            self.log("restore-consume", crate::log::Outcome::Failed, &format!("{}: {e}", dir.display()));
        }
        sw.since("consume", t);
        if let Some(shm) = shm {
            shm.keep();
        }
        self.set_root(pid, Some(RootState::Running));
        let timeline = sw.timeline().clone();
        let summary = RestoreSummary {
            from_restart: restart,
            from_node: manifest.node.clone(),
            image_bytes: manifest.image_bytes,
            check_ms,
            criu_restore_ms: timeline.phase("criu-restore").map_or(0.0, |p| p.ms),
            cuda_restore_ms: timeline.phase("cuda-restore").map_or(0.0, |p| p.ms),
            total_ms: timeline.end_ms(),
            // The job's own GPUs; the pairs that complete the map for the
            // driver (device_map) are of no interest to the user.
            device_map: map
                .pairs()
                .iter()
                .filter(|p| manifest.gpus.iter().any(|g| g.uuid == p.old))
                .map(|p| (p.old.to_string(), p.new.to_string()))
                .collect(),
            from_local: local,
            timeline,
        };
        Ok((pid, summary))
    }

    /// Everything that can refuse the image. The image's pages are read
    /// ahead meanwhile (an image not in the page cache, e.g. on shared
    /// storage, is then read while the checks run). The files are made
    /// root's and proven free of writers before their checksums are
    /// verified (images::ImageStore::open_for_restore), and the run
    /// directory stays open to CRIU's reads until the returned loan ends:
    /// nothing checked here can change before CRIU reads it (N1).
    fn vet(&self, dir: &Path, sw: &mut Stopwatch) -> Result<(Manifest, DeviceMap, Lent, BufferRestore), RequestError> {
        let m = sw
            .time("manifest", || -> Result<Manifest, ManifestError> {
                let m = Manifest::load(dir)?;
                m.check_owner(dir, self.params.run.job, self.params.run.uid)?;
                Ok(m)
            })
            .because(FailureReason::Image)?;
        if m.root_pid <= 1 {
            // Every walk and kill of the restored tree starts at this pid.
            let message = format!("{}: its root pid {} cannot be a dumped tree's: corrupt", dir.display(), m.root_pid);
            return Err(RequestError::failed(FailureReason::Image, message));
        }
        let names: Vec<&str> = m.images.iter().map(|f| f.name.as_str()).collect();
        let opened = ImageStore::open_for_restore(dir, &names, self.params.run.uid).map_err(|e| e.to_string()).because(FailureReason::ImageDir)?;
        // Before the read-ahead: what the page cache held of the image decides how the buffer comes back.
        let buffer = self.buffer_restore(dir, &m);
        read_ahead(dir, &m);
        sw.time("checksums", || m.check_files(dir)).because(FailureReason::Image)?;
        let map = sw.time("gpu-room", || -> Result<DeviceMap, RequestError> {
            let map = self.device_map(&m)?;
            self.checkpointer().check_restore_room(&m.cuda, &map).map_err(|e| e.to_string()).because(FailureReason::GpuMemory)?;
            Ok(map)
        })?;
        Ok((m, map, opened, buffer))
    }

    /// How the driver's buffer comes back (page_cache.rs), logged.
    fn buffer_restore(&self, dir: &Path, m: &Manifest) -> BufferRestore {
        let files: Vec<(&str, u64)> = m.images.iter().map(|f| (f.name.as_str(), f.bytes)).collect();
        let (cached, total) = page_cache::pages_cached(dir, &files);
        let decision = BufferRestore::decide(self.settings.restore_map_buffers, cached, total);
        self.log("restore-buffer", crate::log::Outcome::Ok, &decision.to_string());
        decision
    }

    /// The image's GPUs → this job's, by position; the same driver version
    /// and GPU model for each GPU that holds checkpointed memory.
    fn device_map(&self, m: &Manifest) -> Result<DeviceMap, RequestError> {
        if m.cuda.is_empty() {
            return Ok(DeviceMap::default());
        }
        if m.driver_version != self.facts.driver_version {
            return Err(RequestError::failed(
                FailureReason::Driver,
                format!(
                    "the image was taken with NVIDIA driver {} (node {}); this node has {}: a CUDA checkpoint restores only on the same driver",
                    m.driver_version, m.node, self.facts.driver_version
                ),
            ));
        }
        let used: Vec<_> = m.cuda.iter().flat_map(|p| p.footprint.iter().map(|f| f.gpu)).collect();
        let mut pairs = Vec::new();
        for (i, old) in m.gpus.iter().enumerate().filter(|(_, g)| used.contains(&g.uuid)) {
            let new = self.params.gpus.get(i).ok_or_else(|| {
                let message = format!("the image used {} GPUs; this run of the job has {}", m.gpus.len(), self.params.gpus.len());
                RequestError::failed(FailureReason::Image, message)
            })?;
            if new.name != old.name {
                let message = format!("the image's GPU {i} is a {}; this run got a {} ({})", old.name, new.name, new.uuid);
                return Err(RequestError::failed(FailureReason::Image, message));
            }
            pairs.push(format!("{}={}", old.uuid, new.uuid));
        }
        if let Some(g) = used.iter().find(|u| !m.gpus.iter().any(|g| g.uuid == **u)) {
            return Err(RequestError::failed(FailureReason::Image, format!("the image's footprint names {g}, which is not among its GPUs: corrupt")));
        }
        let same = m.gpus.iter().zip(&self.params.gpus).all(|(a, b)| a.uuid == b.uuid);
        if same || pairs.is_empty() {
            return Ok(DeviceMap::default());
        }
        if self.facts.cuda_version < 13000 {
            let message = format!("restoring onto other GPUs needs driver r580 / CUDA 13.0; this node's CUDA is {}", self.facts.cuda_version);
            return Err(RequestError::failed(FailureReason::Driver, message));
        }
        // Every GPU the dump node had, not only the job's (the driver's rule):
        // manifests from before node_gpus was recorded map the job's only.
        Ok(DeviceMap::parse(&pairs.join(",")).because(FailureReason::Image)?.completed(&m.node_gpus, &self.facts.node_gpus))
    }

    /// CRIU restore into `cgroup`, then the checks that need the processes:
    /// the root is the image's, in the new job's cgroup, the user's, no less
    /// confined than it was dumped. The restored processes are pinned (pidfds)
    /// before anything looks at them: what is checked, resumed or killed is
    /// exactly what CRIU made, and a process that left the tree (a stray)
    /// goes with a refused one.
    fn criu_restore(
        &self,
        dir: &Path,
        m: &Manifest,
        cgroup: TargetCgroup,
        opened: Lent,
        buffer: BufferRestore,
        sw: &mut Stopwatch,
    ) -> Result<(i32, Vec<procfs::Pinned>), RequestError> {
        let (uid, gid) = (self.params.run.uid, self.params.run.gid);
        // CRIU reads root's files as the user through the directory's
        // descriptor (opened by vet); it writes only in a work directory
        // of its own, lent to the user for the run (crate::criu).
        let lend = || -> std::io::Result<_> {
            let work = ImageStore::prepare_work(dir, "restore")?;
            Ok((ImageStore::lend(&work, uid, gid)?, work))
        };
        let (lent, work_dir) = lend().map_err(|e| format!("{e}; the image is kept")).because(FailureReason::ImageDir)?;
        let hold = self.settings.restore_hold.clone();
        // What a restored process may hold mapped of the image: its pages
        // files, only where CRIU maps the buffer from them.
        let pages = if buffer.mapped() { ImagePages::of(dir, m.images.iter().map(|f| f.name.as_str())) } else { ImagePages::default() };
        let req = RestoreRequest {
            images_dir: dir.to_path_buf(),
            work_dir,
            cgroup: cgroup.clone(),
            tcp_established: m.tcp_established,
            user: self.user.clone(),
            limits: m.limits.clone(),
            hold: hold.as_ref().map(|h| HoldScript {
                script: h.script.clone(),
                socket: crate::socket_path(&self.settings.socket_dir, self.params.run.job),
            }),
            map_buffers: buffer.mapped(),
        };
        if let Some(settings) = hold {
            *self.hold.lock().unwrap_or_else(|p| p.into_inner()) =
                Some(Pending { root: m.root_pid, manifest: m.clone(), cgroup: cgroup.clone(), pages: pages.clone(), settings, outcome: None });
        }
        let t = Instant::now();
        let restored = self.criu.restore(&req);
        let held = self.hold.lock().unwrap_or_else(|p| p.into_inner()).take().map(|p| p.outcome);
        let back = opened.give_back().and(lent.give_back());
        sw.since("criu-restore", t);
        let failed_check = |e: &dyn std::fmt::Display| {
            RequestError::failed(FailureReason::RestoredCheck, format!("{e}; the restored processes were killed, the image is kept"))
        };
        // The checks ran at the hold and refused: whatever CRIU said after.
        if let Some(Some(Err(e))) = &held {
            self.reap_failed_restore(m);
            return Err(failed_check(e));
        }
        let r = match (restored, back) {
            (Ok(r), Ok(())) => r,
            (Err(e), _) => {
                self.reap_failed_restore(m);
                let mut message = format!("{e}; the image is kept");
                if e.buffer_mapping_failed() {
                    message.push_str(" (the driver's buffer was mapped from the image: with [preempt] restore_map_buffers = false it is read instead)");
                }
                // A pid or thread id held here (N3): another node may have it free.
                return Err(if e.pid_taken() { RequestError::NotHere(message) } else { RequestError::failed(FailureReason::Criu, message) });
            }
            (Ok(_), Err(e)) => {
                self.kill_restored(m, &[]);
                return Err(RequestError::failed(FailureReason::ImageDir, format!("{e}; the restored processes were killed, the image is kept")));
            }
        };
        let t = Instant::now();
        let tree = match held {
            // Checked while CRIU held it (hold.rs): nothing of it ran before.
            Some(Some(Ok(tree))) if r.pid == m.root_pid => tree,
            // A hold was asked for and CRIU went on without one (a CRIU
            // without packaging/criu/0006 whose script was killed): the tree
            // may have run before any check.
            Some(None) => {
                self.kill_restored(m, &[]);
                return Err(failed_check(&"CRIU resumed the restored tree without the agent's hold"));
            }
            _ => self.check_after_criu(r.pid, m, &cgroup, &pages).map_err(|(tree, e)| {
                self.kill_restored(m, &tree);
                failed_check(&e)
            })?,
        };
        for p in &tree {
            p.signal(libc::SIGCONT);
        }
        sw.since("restored-check", t);
        Ok((r.pid, tree))
    }

    /// Without a hold: the tree CRIU left stopped is pinned, then checked.
    /// `root` is what CRIU's pid file said, a file in the user's work
    /// directory: it is compared with the image's root before anything is
    /// walked from it (a pid file saying 1 would otherwise make every
    /// process of the node "the tree").
    fn check_after_criu(
        &self,
        root: i32,
        m: &Manifest,
        cgroup: &TargetCgroup,
        pages: &ImagePages,
    ) -> Result<Vec<procfs::Pinned>, (Vec<procfs::Pinned>, RestoredCheckError)> {
        if root != m.root_pid {
            return Err((Vec::new(), RestoredCheckError::OtherRoot { restored: root, image: m.root_pid }));
        }
        let (tree, check) = self.pin_and_check(root, m, cgroup, pages);
        match check {
            Ok(()) => Ok(tree),
            Err(e) => Err((tree, e)),
        }
    }

    /// The restored tree from `root` (the image's), its descendants and its
    /// strays, pinned, then checked: in the job's cgroup and
    /// [`Self::check_stopped_tree`]. After CRIU, or at the hold (hold.rs).
    pub(super) fn pin_and_check(&self, root: i32, m: &Manifest, cgroup: &TargetCgroup, pages: &ImagePages) -> (Vec<procfs::Pinned>, Result<(), RestoredCheckError>) {
        let mut pids = self.host.with_descendants(root);
        pids.extend(self.strays(root));
        let tree: Vec<procfs::Pinned> = pids.iter().filter_map(|p| procfs::Pinned::new(*p).ok()).collect();
        let check = cgroup.verify(root).map_err(RestoredCheckError::from).and_then(|_| self.check_stopped_tree(&pids, m, pages));
        (tree, check)
    }

    /// The tree CRIU left stopped (`--leave-stopped`), before it runs: every
    /// process is the user's without capabilities, no less confined and
    /// with no higher hard limit than dumped, and holds only files the user
    /// may hold (held.rs). `pids`: the tree as it is, from its root (the
    /// manifest's list was made before CRIU froze the tree, which may have
    /// forked since: security review S4), and the strays.
    pub(super) fn check_stopped_tree(&self, pids: &[i32], m: &Manifest, pages: &ImagePages) -> Result<(), RestoredCheckError> {
        tree::check_owned(pids, &self.user)?;
        tree::check_confined(pids, &m.privs)?;
        tree::check_limits(pids, &m.limits)?;
        Ok(crate::held::check_user_may_hold(pids, &self.user, pages)?)
    }

    /// After CRIU failed or was killed (security review F6): what it may
    /// have left of the tree is killed and reaped. Only a root that is this
    /// agent's own child (`--restore-sibling`) and what descends from it: a
    /// pid of the image may belong to another process when CRIU failed
    /// because it was taken.
    fn reap_failed_restore(&self, m: &Manifest) {
        let me = std::process::id() as i32;
        if procfs::read(m.root_pid).is_none_or(|p| p.ppid != me) {
            return;
        }
        let mut pids = self.host.with_descendants(m.root_pid);
        pids.extend(self.strays(m.root_pid));
        let ids: Vec<procfs::ProcId> = pids.iter().filter_map(|p| procfs::read(*p)).map(|p| p.id()).collect();
        tree::kill_all(&ids);
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(m.root_pid), None);
    }

    /// Frees the image's TCP ports of TIME_WAIT entries, which would fail
    /// CRIU's rebind of a socket that had no SO_REUSEADDR (timewait.rs).
    /// Never fails the restore: what is left is said, and CRIU tries.
    fn clear_time_wait(&self, m: &Manifest) {
        if m.tcp_ports.is_empty() {
            return;
        }
        match crate::timewait::clear(&m.tcp_ports) {
            Ok(0) => {}
            Ok(n) => self.log("restore-ports", crate::log::Outcome::Ok, &format!("{n} TIME_WAIT entries cleared on the image's ports {:?}", m.tcp_ports)),
            Err(e) => self.log("restore-ports", crate::log::Outcome::Failed, &format!("cannot clear TIME_WAIT entries on the image's ports: {e}; a rebind may fail")),
        }
    }

    /// Kills the tree CRIU just made: `pinned` through their pidfds first,
    /// then what [`Self::reap_failed_restore`] finds of it now. Never the
    /// image's pids by number: a restored process that exited (the tree runs
    /// during the CUDA restore) leaves its pid free for any process of the
    /// node, which a kill by the manifest's pid list would hit. (In the
    /// agent's tests, whose manifests list pids of exited processes, that is
    /// how another test's refused restore could kill the `sleep` of
    /// `every_restored_process_is_checked_before_...` and let its check find
    /// nothing held: the one cause found of that test's failure in CI.)
    pub(super) fn kill_restored(&self, m: &Manifest, pinned: &[procfs::Pinned]) {
        for p in pinned {
            p.signal(libc::SIGKILL);
        }
        self.reap_failed_restore(m);
    }
}

impl Agent {
    /// Processes of the job's user that left the restored tree for this
    /// agent: children of the agent (a task cloned with CLONE_PARENT by a
    /// restored process, N1 step 5) in the restored root's session that are
    /// neither `root` nor a tree the agent restored earlier and runs, with
    /// their descendants. A descendant walk from `root` never finds them.
    /// The session tells them from the agent's other children of that uid
    /// (the wrapper makes the application a session leader); one that also
    /// left the session (setsid) is not found: it runs as the user, without
    /// capabilities, in the job's cgroup, which Slurm ends with the job.
    fn strays(&self, root: i32) -> Vec<i32> {
        let me = std::process::id() as i32;
        let Some(sid) = procfs::session(root) else { return Vec::new() };
        let kept: Vec<i32> = self.restored.lock().unwrap_or_else(|p| p.into_inner()).keys().copied().collect();
        procfs::all()
            .into_iter()
            .filter(|p| p.ppid == me && p.uid == self.params.run.uid && p.pid != root && !kept.contains(&p.pid))
            .filter(|p| procfs::session(p.pid) == Some(sid))
            .flat_map(|p| self.host.with_descendants(p.pid))
            .collect()
    }
}

/// Starts reading the image's files into the page cache on a thread of its
/// own (posix_fadvise WILLNEED), largest first, and returns at once. Opened
/// through the directory's descriptor without following symlinks, as the
/// checks open them; a file that cannot be opened is left to the checks.
fn read_ahead(dir: &Path, m: &Manifest) {
    let Ok(dir_fd) = crate::fsutil::open_dir_nofollow(dir) else { return };
    let mut names: Vec<(u64, String)> = m.images.iter().map(|f| (f.bytes, f.name.clone())).collect();
    names.sort_unstable_by(|a, b| b.cmp(a));
    let _ = std::thread::Builder::new().name("image-read-ahead".into()).spawn(move || {
        use nix::fcntl::{openat, OFlag};
        use std::os::fd::AsRawFd;
        for (bytes, name) in names {
            let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK;
            let Ok(fd) = openat(&dir_fd, name.as_str(), flags, nix::sys::stat::Mode::empty()) else { continue };
            // SAFETY: a plain syscall on a descriptor we own.
            unsafe { libc::posix_fadvise(fd.as_raw_fd(), 0, bytes as libc::off_t, libc::POSIX_FADV_WILLNEED) };
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each kind says what it said as text, the lower layers' words unchanged.
    #[test]
    fn a_restored_tree_refused_says_why_in_today_s_words() {
        let owner = tree::OwnerError::Gid { pid: 9, gid: 5 };
        let cases = [
            (RestoredCheckError::OtherRoot { restored: 12, image: 10 }, "CRIU restored pid 12, but the image's root is pid 10".to_string()),
            (RestoredCheckError::from(owner.clone()), owner.to_string()),
            (
                RestoredCheckError::from(crate::held::HeldError::Refused { pid: 9, path: "/x".into(), what: "fd 3".into(), need: "read", uid: 7, errno: libc::EXDEV }),
                "pid 9 was restored holding /x (fd 3, read), which uid 7 may not (its path now leads elsewhere): a path was swapped since the dump".to_string(),
            ),
        ];
        for (e, text) in cases {
            assert_eq!(e.to_string(), text, "{e:?}");
        }
    }
}
