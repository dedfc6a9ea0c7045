//! The node-local staging tier (`preempt.staging_dir`): the dump lands in
//! a directory of the node (the same layout, seal and manifest as
//! `image_dir`), the job is requeued as soon as that copy is durable, and the
//! agent copies the image to `image_dir` (shared storage) in the background.
//!
//! Records in the shared job directory (images.rs names them):
//! - `staged-<run>` (the node inside), written by the dump after the local
//!   manifest is durable and before the job is requeued: run `run`'s image
//!   exists on that node. Shared storage stays the one truth: a staged copy
//!   without its record is never restored (the record goes when the image is
//!   restored, given up, or removed with the job's images by any node's
//!   epilog).
//! - `.copy-<run>-<node>/`: the copy under way. Files are copied and fsynced
//!   one by one, the manifest last; then the directory is renamed to
//!   `<run>/` and the job directory fsynced. The name is no run number and
//!   the rename is atomic, so half a copy is never taken for an image.
//! - `copy-failed-<run>`: the copy failed (the reason inside).
//!
//! Where a restore takes its image from is [`decide`]; how long a restore on
//! another node waits for a copy is [`judge`]; the copy is [`copy_run`].

use super::images::ImageStore;
use super::manifest::MANIFEST_FILE;
use crate::fsutil;
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A copy that has copied nothing for this long is taken as dead (its node
/// down, or its agent killed): a restore elsewhere stops waiting for it.
pub const STALL: Duration = Duration::from_secs(60);
/// How often a waiting restore looks at the shared job directory.
const POLL: Duration = Duration::from_millis(250);
/// Bytes read and written at once by the copy.
const CHUNK: usize = 1 << 20;
/// How often, at most, the copy looks whether its image is still wanted.
const RECHECK: Duration = Duration::from_secs(1);

/// The staging tier of a node, from the site config.
#[derive(Debug, Clone)]
pub struct Staging {
    /// The node-local store the dump writes.
    pub local: ImageStore,
    /// `staging_copy_mib_per_s` in bytes; 0: no bound.
    pub copy_bytes_per_s: u64,
}

impl Staging {
    /// `None` where `staging_dir` is unset: dumps go to `image_dir`.
    pub fn from_config(cfg: &crate::config::PreemptConfig) -> Option<Staging> {
        let dir = cfg.staging_dir.as_ref()?;
        Some(Staging {
            local: ImageStore::new(dir),
            copy_bytes_per_s: cfg.staging_copy_mib_per_s.saturating_mul(1 << 20),
        })
    }
}

/// How long a restore waits for a staged image's copy from another node:
/// `staging_wait_s` where this node stages too; on a node without
/// `staging_dir` (a site staging on some nodes only), less than the 30 s
/// its wrapper gives `hello` (crate::wrapper), so that the wrapper hears why.
pub fn wait_bound(cfg: &crate::config::PreemptConfig) -> Duration {
    match cfg.staging_dir {
        Some(_) => Duration::from_secs(cfg.staging_wait_s),
        None => Duration::from_secs(cfg.staging_wait_s.min(20)),
    }
}

/// What the stores hold for a job, as a restore on `node` sees them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Found {
    /// The newest complete image in this node's staging directory.
    pub local: Option<u32>,
    /// The newest complete image in the shared `image_dir`.
    pub shared: Option<u32>,
    /// Staged runs (`staged-<run>`) and their nodes.
    pub staged: Vec<(u32, String)>,
    /// Runs whose copy failed (`copy-failed-<run>`).
    pub copy_failed: Vec<u32>,
}

/// Where a restore takes its image from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// This node's staged copy of run `run`.
    Local(u32),
    /// The shared store's image of run `run`.
    Shared(u32),
    /// Run `run` is staged on `node` and its copy not done: wait for it.
    Wait { run: u32, node: String },
    /// Run `run` is staged on `node` and its copy failed: start over.
    CopyFailed { run: u32, node: String },
    /// No image.
    Nothing,
}

/// Where to restore from, on `node`: the newest run anywhere (a complete
/// shared image or a staged one) wins. Its staged copy on this node first
/// (no copy needed), else its complete shared image, else its copy is
/// waited for, unless that copy failed. A local copy whose run is not (or
/// no longer) staged is stale and never used; an older image never wins
/// over a newer run that has not arrived yet.
pub fn decide(f: &Found, node: &str) -> Source {
    let newest_staged = f.staged.last().map(|s| s.0);
    let Some(newest) = f.shared.max(newest_staged) else { return Source::Nothing };
    let staged_here = f.staged.iter().any(|(r, n)| *r == newest && n == node);
    if f.local == Some(newest) && staged_here {
        return Source::Local(newest);
    }
    if f.shared == Some(newest) {
        return Source::Shared(newest);
    }
    let node = f.staged.iter().rev().find(|s| s.0 == newest).map_or_else(String::new, |s| s.1.clone());
    if f.copy_failed.contains(&newest) {
        return Source::CopyFailed { run: newest, node };
    }
    Source::Wait { run: newest, node }
}

/// What a waiting restore sees of a copy at one look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// `<run>/manifest.json` is in the shared store.
    pub complete: bool,
    /// `copy-failed-<run>`, with its reason.
    pub failed: Option<String>,
    /// `staged-<run>` is still there.
    pub staged: bool,
}

/// A waiting restore's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Ready,
    Wait,
    /// Stop waiting: the job starts over; why.
    GiveUp(CopyWaitError),
}

/// Why a restore stops waiting for the copy of run `run`'s image from
/// `node` (the node that staged it) and the job starts over: each way a
/// copy can fail to come, with the words the agent has always logged and
/// answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CopyWaitError {
    /// The copy wrote `copy-failed-<run>` (`why`: its first line).
    #[error("the copy of run {run}'s image from {node} to shared storage failed: {why}")]
    CopyFailed { run: u32, node: String, why: String },
    /// `staged-<run>` went (the image was given up on its node).
    #[error("run {run}'s staged image on {node} was given up meanwhile")]
    GivenUp { run: u32, node: String },
    /// The copy did not grow for `idle`.
    #[error("the copy of run {run}'s image from {node} to shared storage made no progress for {} s ({node} may be down or its copy stopped)", .idle.as_secs())]
    Stalled { run: u32, node: String, idle: Duration },
    /// `staging_wait_s` passed.
    #[error("the copy of run {run}'s image from {node} to shared storage did not finish within staging_wait_s = {} s", .wait.as_secs())]
    TimedOut { run: u32, node: String, wait: Duration },
}

/// One look of a restore waiting for the copy of `run` from `node`:
/// `waited` in all, `idle` since the copy last grew; `wait` is
/// `staging_wait_s`, `stall` the bound on a copy that does not grow.
pub fn judge(o: &Observed, run: u32, node: &str, waited: Duration, idle: Duration, wait: Duration, stall: Duration) -> Verdict {
    if o.complete {
        return Verdict::Ready;
    }
    let node = node.to_string();
    if let Some(why) = &o.failed {
        return Verdict::GiveUp(CopyWaitError::CopyFailed { run, node, why: why.clone() });
    }
    if !o.staged {
        return Verdict::GiveUp(CopyWaitError::GivenUp { run, node });
    }
    if idle >= stall.min(wait) {
        return Verdict::GiveUp(CopyWaitError::Stalled { run, node, idle });
    }
    if waited >= wait {
        return Verdict::GiveUp(CopyWaitError::TimedOut { run, node, wait });
    }
    Verdict::Wait
}

/// What the shared store shows of run `run`'s copy.
pub fn observe(shared: &ImageStore, job: u32, run: u32) -> Observed {
    let failed = fs::read_to_string(shared.copy_failed_path(job, run)).ok().map(|t| t.lines().next().unwrap_or_default().chars().take(300).collect());
    Observed {
        complete: shared.run_dir(job, run).join(MANIFEST_FILE).is_file(),
        failed,
        staged: shared.staged_path(job, run).is_file(),
    }
}

/// Waits until run `run`'s copy from `node` is complete in the shared
/// store (`Ok`), or gives up as [`judge`] says (`Err`: why). Progress is the
/// size of the copy under way.
pub fn wait_for_copy(shared: &ImageStore, job: u32, run: u32, node: &str, wait: Duration, stall: Duration) -> Result<(), CopyWaitError> {
    let start = Instant::now();
    let (mut last_bytes, mut last_growth) = (None, Instant::now());
    loop {
        let bytes = super::images::tree_bytes(&shared.copy_dir(job, run, node));
        if last_bytes != Some(bytes) {
            (last_bytes, last_growth) = (Some(bytes), Instant::now());
        }
        match judge(&observe(shared, job, run), run, node, start.elapsed(), last_growth.elapsed(), wait, stall) {
            Verdict::Ready => return Ok(()),
            Verdict::GiveUp(why) => return Err(why),
            Verdict::Wait => std::thread::sleep(POLL),
        }
    }
}

/// Why a background copy did not publish an image.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// The image was restored or removed meanwhile: nothing to publish.
    #[error("run {run}'s image is no longer staged (restored or removed meanwhile): the copy is dropped")]
    Abandoned { run: u32 },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{0} is not a plain file of one link: not copied")]
    NotAFile(PathBuf),
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> CopyError + '_ {
    move |source| CopyError::Io { path: path.to_path_buf(), source }
}

/// Copies the staged image `local_run` (run `run` of `job`, staged on
/// `node`) to the shared store: into `.copy-<run>-<node>/`, every file
/// fsynced, the manifest last, then renamed to `<run>/` (module docs). The
/// job directory must exist (the dump made it with the `staged-<run>`
/// record); it is never made here, so a job whose images an epilog removed
/// meanwhile gets nothing back. The copy stops as soon as the record is
/// gone, and an image published just as it went is removed again (the
/// restorer removes the record, then looks for the image; the copy
/// publishes, then looks for the record: one of the two sees the other).
/// `bytes_per_s` bounds the bandwidth (0: none). Returns the bytes copied.
pub fn copy_run(local_run: &Path, shared: &ImageStore, job: u32, run: u32, node: &str, bytes_per_s: u64) -> Result<u64, CopyError> {
    let still_staged = || shared.staged_path(job, run).is_file();
    if !still_staged() {
        return Err(CopyError::Abandoned { run });
    }
    let tmp = shared.copy_dir(job, run, node);
    fsutil::remove_tree_if_present(&tmp).map_err(io_at(&tmp))?;
    fs::create_dir(&tmp).map_err(io_at(&tmp))?;
    let result = copy_files(local_run, &tmp, run, bytes_per_s, &still_staged).and_then(|bytes| {
        let run_dir = shared.run_dir(job, run);
        if !still_staged() {
            return Err(CopyError::Abandoned { run });
        }
        fsutil::remove_tree_if_present(&run_dir).map_err(io_at(&run_dir))?;
        fs::rename(&tmp, &run_dir).map_err(io_at(&run_dir))?;
        fs::File::open(shared.job_dir(job)).and_then(|d| d.sync_all()).map_err(io_at(&shared.job_dir(job)))?;
        if !still_staged() {
            let _ = fsutil::remove_tree_if_present(&run_dir);
            return Err(CopyError::Abandoned { run });
        }
        Ok(bytes)
    });
    if result.is_err() {
        let _ = fsutil::remove_tree_if_present(&tmp);
    }
    result
}

/// Every file of `from` into the fresh directory `to` (0700, files 0600),
/// the manifest last, each fsynced, then the directory.
fn copy_files(from: &Path, to: &Path, run: u32, bytes_per_s: u64, wanted: &dyn Fn() -> bool) -> Result<u64, CopyError> {
    fs::set_permissions(to, fs::Permissions::from_mode(0o700)).map_err(io_at(to))?;
    let mut names: Vec<String> = Vec::new();
    for e in fs::read_dir(from).map_err(io_at(from))? {
        let e = e.map_err(io_at(from))?;
        names.push(e.file_name().to_string_lossy().into_owned());
    }
    // The manifest last: a copy that has one has everything.
    names.sort_by_key(|n| (n == MANIFEST_FILE, n.clone()));
    let mut pace = Pace { run, bytes_per_s, start: Instant::now(), bytes: 0, checked: Instant::now() };
    for name in &names {
        let (src, dst) = (from.join(name), to.join(name));
        let mut input = fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(&src).map_err(io_at(&src))?;
        let meta = input.metadata().map_err(io_at(&src))?;
        if !meta.is_file() || std::os::unix::fs::MetadataExt::nlink(&meta) != 1 {
            return Err(CopyError::NotAFile(src));
        }
        let mut output = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&dst).map_err(io_at(&dst))?;
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = input.read(&mut buf).map_err(io_at(&src))?;
            if n == 0 {
                break;
            }
            output.write_all(&buf[..n]).map_err(io_at(&dst))?;
            pace.after(n as u64, wanted)?;
        }
        output.sync_all().map_err(io_at(&dst))?;
        if !wanted() {
            return Err(CopyError::Abandoned { run });
        }
    }
    fs::File::open(to).and_then(|d| d.sync_all()).map_err(io_at(to))?;
    Ok(pace.bytes)
}

/// The copy's bandwidth bound and its look at whether it is still wanted.
struct Pace {
    run: u32,
    bytes_per_s: u64,
    start: Instant,
    bytes: u64,
    checked: Instant,
}

impl Pace {
    fn after(&mut self, n: u64, wanted: &dyn Fn() -> bool) -> Result<(), CopyError> {
        self.bytes += n;
        if self.bytes_per_s > 0 {
            let due = Duration::from_secs_f64(self.bytes as f64 / self.bytes_per_s as f64);
            if let Some(ahead) = due.checked_sub(self.start.elapsed()) {
                std::thread::sleep(ahead);
            }
        }
        if self.checked.elapsed() >= RECHECK {
            self.checked = Instant::now();
            if !wanted() {
                return Err(CopyError::Abandoned { run: self.run });
            }
        }
        Ok(())
    }
}

/// After a restore of run `run` from `dir` (which the caller consumed):
/// the run is no longer staged, and where the image came from this node's
/// staging directory, a shared copy already published is consumed too, so
/// neither copy is restored again.
pub fn settle_restored(shared: &ImageStore, job: u32, run: u32, from_local: bool) -> io::Result<()> {
    shared.unstage(job, run)?;
    let shared_run = shared.run_dir(job, run);
    if from_local && shared_run.join(MANIFEST_FILE).is_file() {
        match ImageStore::consume(&shared_run) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(local: Option<u32>, shared: Option<u32>, staged: &[(u32, &str)], failed: &[u32]) -> Found {
        Found { local, shared, staged: staged.iter().map(|(r, n)| (*r, n.to_string())).collect(), copy_failed: failed.to_vec() }
    }

    #[test]
    fn where_a_restore_takes_its_image_from() {
        let wait = |run, node: &str| Source::Wait { run, node: node.into() };
        let cases: Vec<(&str, Found, &str, Source)> = vec![
            ("nothing anywhere", found(None, None, &[], &[]), "a", Source::Nothing),
            ("no staging: the shared image", found(None, Some(0), &[], &[]), "a", Source::Shared(0)),
            ("staged here, copy under way", found(Some(0), None, &[(0, "a")], &[]), "a", Source::Local(0)),
            ("staged here, copy done: still the local copy", found(Some(0), Some(0), &[(0, "a")], &[]), "a", Source::Local(0)),
            ("staged here, copy failed: the local copy", found(Some(0), None, &[(0, "a")], &[0]), "a", Source::Local(0)),
            ("staged elsewhere, copy under way: wait", found(None, None, &[(0, "a")], &[]), "b", wait(0, "a")),
            ("staged elsewhere, copy done", found(None, Some(0), &[(0, "a")], &[]), "b", Source::Shared(0)),
            ("staged elsewhere, copy failed", found(None, None, &[(0, "a")], &[0]), "b", Source::CopyFailed { run: 0, node: "a".into() }),
            ("a stale local copy (no record) is never used", found(Some(0), None, &[], &[]), "a", Source::Nothing),
            ("a stale local copy beside a shared image", found(Some(0), Some(0), &[], &[]), "a", Source::Shared(0)),
            ("an older local copy loses to a newer run in transit", found(Some(0), None, &[(0, "a"), (1, "b")], &[]), "a", wait(1, "b")),
            ("an older shared image loses to a newer staged run", found(None, Some(0), &[(1, "a")], &[]), "b", wait(1, "a")),
            ("a newer shared image wins over an older staged run", found(Some(0), Some(1), &[(0, "a")], &[]), "a", Source::Shared(1)),
            ("the same node name elsewhere does not count", found(Some(1), None, &[(1, "b")], &[]), "a", wait(1, "b")),
        ];
        for (what, f, node, want) in cases {
            assert_eq!(decide(&f, node), want, "{what}");
        }
    }

    #[test]
    fn how_long_a_restore_elsewhere_waits_for_the_copy() {
        let o = |complete, failed: Option<&str>, staged| Observed { complete, failed: failed.map(String::from), staged };
        let s = Duration::from_secs;
        // Expected: "ready", "wait", or a part of the give-up message.
        let cases: Vec<(Observed, u64, u64, u64, &str)> = vec![
            (o(true, None, true), 999, 999, 10, "ready"),
            (o(true, None, false), 0, 0, 10, "ready"),
            (o(false, None, true), 5, 1, 10, "wait"),
            (o(false, Some("No space left on device"), true), 0, 0, 10, "to shared storage failed: No space left on device"),
            (o(false, None, false), 0, 0, 10, "was given up meanwhile"),
            (o(false, None, true), 9, 9, 10, "wait"),
            (o(false, None, true), 10, 10, 10, "made no progress for 10 s (a may be down"),
            (o(false, None, true), 11, 2, 10, "did not finish within staging_wait_s = 10 s"),
            // The stall bound (60 s) below a longer wait.
            (o(false, None, true), 61, 60, 600, "made no progress for 60 s"),
            (o(false, None, true), 300, 1, 600, "wait"),
        ];
        for (i, (obs, waited, idle, wait, want)) in cases.into_iter().enumerate() {
            let v = judge(&obs, 0, "a", s(waited), s(idle), s(wait), STALL);
            let ok = match (&v, want) {
                (Verdict::Ready, "ready") | (Verdict::Wait, "wait") => true,
                (Verdict::GiveUp(why), part) => why.to_string().contains(part),
                _ => false,
            };
            assert!(ok, "case {i}: {obs:?} waited {waited} idle {idle} wait {wait}: {v:?}, want {want}");
        }
    }

    /// Each way a waiting restore gives up, by kind, with today's words.
    #[test]
    fn each_give_up_says_todays_words() {
        let node = || "a".to_string();
        let table = [
            (
                CopyWaitError::CopyFailed { run: 3, node: node(), why: "No space left on device".into() },
                "the copy of run 3's image from a to shared storage failed: No space left on device",
            ),
            (CopyWaitError::GivenUp { run: 3, node: node() }, "run 3's staged image on a was given up meanwhile"),
            (
                CopyWaitError::Stalled { run: 3, node: node(), idle: Duration::from_millis(60_900) },
                "the copy of run 3's image from a to shared storage made no progress for 60 s (a may be down or its copy stopped)",
            ),
            (
                CopyWaitError::TimedOut { run: 3, node: node(), wait: Duration::from_secs(600) },
                "the copy of run 3's image from a to shared storage did not finish within staging_wait_s = 600 s",
            ),
        ];
        for (err, text) in table {
            assert_eq!(err.to_string(), text, "{err:?}");
        }
    }

    #[test]
    fn a_node_without_staging_waits_less_than_its_wrapper_gives_hello() {
        let cfg = |dir: Option<&str>, wait| crate::config::PreemptConfig {
            staging_dir: dir.map(PathBuf::from),
            staging_wait_s: wait,
            ..Default::default()
        };
        let cases = [(Some("/var/lib/s"), 300, 300), (Some("/var/lib/s"), 5, 5), (None, 300, 20), (None, 5, 5)];
        for (dir, wait, want) in cases {
            assert_eq!(wait_bound(&cfg(dir, wait)), Duration::from_secs(want), "{dir:?} {wait}");
        }
    }

    /// A staged image and its shared store, as the dump leaves them.
    fn staged_image(tmp: &Path) -> (ImageStore, ImageStore, PathBuf) {
        let local = ImageStore::new(tmp.join("staging"));
        let shared = ImageStore::new(tmp.join("images"));
        let run = local.prepare_run(7, 0).unwrap();
        fs::write(run.join("pages-1.img"), vec![3u8; 3 * CHUNK + 5]).unwrap();
        fs::write(run.join("core-1.img"), b"core").unwrap();
        fs::write(run.join(MANIFEST_FILE), b"{}").unwrap();
        shared.record_staged(7, 0, "a").unwrap();
        (local, shared, run)
    }

    #[test]
    fn the_copy_publishes_a_whole_private_image_at_once() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let (_, shared, run) = staged_image(tmp.path());
        let bytes = copy_run(&run, &shared, 7, 0, "a", 0).unwrap();
        assert_eq!(bytes, 3 * CHUNK as u64 + 5 + 4 + 2);
        let out = shared.run_dir(7, 0);
        for name in ["pages-1.img", "core-1.img", MANIFEST_FILE] {
            assert_eq!(fs::read(out.join(name)).unwrap(), fs::read(run.join(name)).unwrap(), "{name}");
            assert_eq!(fs::metadata(out.join(name)).unwrap().mode() & 0o777, 0o600, "{name}");
        }
        assert_eq!(fs::metadata(&out).unwrap().mode() & 0o7777, 0o700);
        assert!(!shared.copy_dir(7, 0, "a").exists(), "the copy's temporary name is gone");
        assert_eq!(shared.latest(7).map(|(r, _)| r), Some(0));
        assert_eq!(observe(&shared, 7, 0), Observed { complete: true, failed: None, staged: true });
    }

    #[test]
    fn a_copy_of_an_image_no_longer_staged_publishes_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let (_, shared, run) = staged_image(tmp.path());
        shared.unstage(7, 0).unwrap();
        assert!(matches!(copy_run(&run, &shared, 7, 0, "a", 0), Err(CopyError::Abandoned { run: 0 })));
        assert!(!shared.run_dir(7, 0).exists() && !shared.copy_dir(7, 0, "a").exists());
        // The job's images removed by an epilog: the job directory is never made again.
        shared.record_staged(7, 0, "a").unwrap();
        fs::remove_dir_all(shared.job_dir(7)).unwrap();
        assert!(copy_run(&run, &shared, 7, 0, "a", 0).is_err());
        assert!(!shared.job_dir(7).exists());
    }

    /// The copy is stopped half way (its node "dies"): what is left has no
    /// run number and no manifest, and a restore never takes it.
    #[test]
    fn half_a_copy_is_never_an_image() {
        let tmp = tempfile::tempdir().unwrap();
        let (local, shared, run) = staged_image(tmp.path());
        // The copy's first file, as a node that died would leave it.
        let half = shared.copy_dir(7, 0, "a");
        fs::create_dir(&half).unwrap();
        fs::write(half.join("core-1.img"), b"core").unwrap();
        assert_eq!(shared.latest(7), None);
        assert_eq!(shared.runs_of(7), vec![]);
        let f = Found { local: None, shared: None, staged: shared.staged(7), copy_failed: vec![] };
        assert_eq!(decide(&f, "b"), Source::Wait { run: 0, node: "a".into() });
        let gave_up = wait_for_copy(&shared, 7, 0, "a", Duration::from_secs(5), Duration::from_millis(600)).unwrap_err();
        assert!(matches!(&gave_up, CopyWaitError::Stalled { run: 0, node, .. } if node == "a"), "{gave_up:?}");
        let gave_up = gave_up.to_string();
        assert!(gave_up.contains("made no progress") && gave_up.contains("a may be down"), "{gave_up}");
        // The node that staged it still restores its own copy.
        let f = Found { local: local.latest(7).map(|(r, _)| r), ..f };
        assert_eq!(decide(&f, "a"), Source::Local(0));
        // A later copy replaces the leftover.
        copy_run(&run, &shared, 7, 0, "a", 0).unwrap();
        assert!(!half.exists() && shared.latest(7).is_some());
    }

    /// The staged directory is root's, but what CRIU wrote there is checked
    /// again: a file with a second link is not copied, and nothing is
    /// published.
    #[test]
    fn a_file_with_a_second_link_fails_the_copy_and_publishes_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let (_, shared, run) = staged_image(tmp.path());
        fs::hard_link(run.join("core-1.img"), tmp.path().join("elsewhere")).unwrap();
        let err = copy_run(&run, &shared, 7, 0, "a", 0).unwrap_err();
        assert!(matches!(err, CopyError::NotAFile(ref p) if p.ends_with("core-1.img")), "{err}");
        assert!(!shared.run_dir(7, 0).exists() && !shared.copy_dir(7, 0, "a").exists());
        assert_eq!(shared.staged(7), [(0, "a".to_string())], "the record stays: its node still has the image");
    }

    #[test]
    fn the_bandwidth_bound_paces_the_copy() {
        let tmp = tempfile::tempdir().unwrap();
        let (_, shared, run) = staged_image(tmp.path());
        let start = Instant::now();
        copy_run(&run, &shared, 7, 0, "a", 8 << 20).unwrap();
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(350), "3 MiB at 8 MiB/s took {took:?}");
    }

    #[test]
    fn a_restore_settles_both_tiers_and_the_records_go_with_the_other_runs() {
        let tmp = tempfile::tempdir().unwrap();
        let (local, shared, run) = staged_image(tmp.path());
        copy_run(&run, &shared, 7, 0, "a", 0).unwrap();
        ImageStore::consume(&run).unwrap();
        settle_restored(&shared, 7, 0, true).unwrap();
        assert_eq!((local.latest(7), shared.latest(7), shared.staged(7)), (None, None, vec![]));
        // The records of other runs go with their images; this run's stay.
        shared.record_staged(7, 1, "b").unwrap();
        fs::write(shared.copy_failed_path(7, 0), "x\n").unwrap();
        fs::create_dir(shared.copy_dir(7, 0, "a")).unwrap();
        assert_eq!(super::super::cleanup_after_job(&shared, 7, 1, &|| panic!("not asked")).unwrap(), super::super::Cleanup::Kept { restart: 1 });
        let mut left: Vec<String> = fs::read_dir(shared.job_dir(7)).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        left.sort();
        assert_eq!(left, ["staged-1"]);
        // Run 2 restored it (from its staged copy) and made no image of its
        // own: all goes, even as the job is requeued.
        settle_restored(&shared, 7, 1, true).unwrap();
        assert_eq!(super::super::cleanup_after_job(&shared, 7, 2, &|| true).unwrap(), super::super::Cleanup::Removed);
        assert!(!shared.job_dir(7).exists());
    }
}
