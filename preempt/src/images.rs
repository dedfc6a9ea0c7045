//! The image directory: `<image_dir>/<job>/<restart count>/`, root-only
//! (directories 0700: images hold the whole memory of a user's processes).
//! A run directory is made fresh for each dump; its manifest is written
//! last, after every file is fsynced, so a directory without one is a failed
//! or interrupted dump and is never restored.
//!
//! Nothing CRIU reads is ever the user's (security review N1). CRIU runs as
//! the job's user: at the dump the run directory is lent to the user for
//! CRIU to write ([`ImageStore::lend`]); the seal then takes every file
//! back (root's, 0644) and proves that no open file description can still
//! write it ([`take_file`]). At a restore nothing is lent: the run directory
//! stays root's (0755 for the CRIU run only, [`ImageStore::open_for_restore`])
//! and CRIU reads root's files through the directory's inherited descriptor;
//! the 0700 directories above keep every other path out. What CRIU writes
//! (its log, the restored root's pid, its caches) goes to a separate, empty
//! work directory lent to the user ([`ImageStore::prepare_work`]), which
//! root reads back only through bounded, `O_NOFOLLOW`, owner-checked reads.
//!
//! Retention: the epilog calls [`cleanup_after_job`] (keep only an image this
//! run completed, which its requeued run will restore, one whose restore it
//! was refused, or one it never tried while Slurm requeued the job) and [`sweep_images`]
//! (age and size limits over the whole directory, oldest first).

use super::manifest::{describe_file, ImageFile, CONSUMED_FILE, MANIFEST_FILE};
use crate::fsutil;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// Files sealed at once (the pages images are few and large, the rest small).
const SEAL_THREADS: usize = 8;

/// A sealed image file: root's, readable by CRIU as the job's user through
/// the run directory's descriptor (module docs), writable by no one else.
const IMAGE_MODE: u32 = 0o644;
/// A run directory while CRIU restores from it: CRIU, as the user, must
/// open and search it. Its parents stay 0700, so only that descriptor reaches it.
const RESTORING_DIR_MODE: u32 = 0o755;

#[derive(Debug, Clone)]
pub struct ImageStore {
    pub root: PathBuf,
}

fn me() -> (u32, u32) {
    unsafe { (libc::geteuid(), libc::getegid()) }
}

fn fchown_fd(fd: &std::os::fd::OwnedFd, uid: u32, gid: u32) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: fchown on a descriptor we own.
    if unsafe { libc::fchown(fd.as_raw_fd(), uid, gid) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A directory opened to the job's user for one CRIU run, held by its
/// descriptor, and closed to them again when given back or dropped: lent
/// (theirs, [`ImageStore::lend`]) or opened to reads (root's, 0755,
/// [`ImageStore::open_for_restore`]).
pub struct Lent {
    dir: Option<std::os::fd::OwnedFd>,
    path: PathBuf,
    /// Opened to reads rather than lent: closing sets the mode back to 0700.
    read_only: bool,
}

impl Lent {
    /// The directory is root's and root-only again; an error says it could
    /// not be taken back (the caller must then not trust it).
    pub fn give_back(mut self) -> io::Result<()> {
        self.take_back()
    }

    fn take_back(&mut self) -> io::Result<()> {
        let Some(dir) = self.dir.take() else { return Ok(()) };
        let (uid, gid) = me();
        let done = if self.read_only { fchmod_fd(&dir, 0o700) } else { fchown_fd(&dir, uid, gid) };
        done.map_err(|e| io::Error::new(e.kind(), format!("cannot take {} back: {e}", self.path.display())))
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        let _ = self.take_back();
    }
}

fn fchmod_fd(fd: &std::os::fd::OwnedFd, mode: u32) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: fchmod on a descriptor we own.
    if unsafe { libc::fchmod(fd.as_raw_fd(), mode) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// An image file opened for reading through its directory's descriptor,
/// never following a link, never blocking on a FIFO.
fn open_image_file(dir: &std::os::fd::OwnedFd, name: &str) -> io::Result<fs::File> {
    use nix::fcntl::{openat, OFlag};
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC | OFlag::O_NOCTTY;
    let fd = openat(dir, name, flags, nix::sys::stat::Mode::empty()).map_err(io::Error::from)?;
    Ok(fs::File::from(fd))
}

/// Image `name` of `run` (its descriptor `dir`), opened as
/// [`open_image_file`] opens one, and only a plain file with one link owned
/// by root or by the job's user `user` (CRIU writes as the user); anything
/// else is "not <expected>". The file, its metadata and its path.
fn open_owned_image(dir: &std::os::fd::OwnedFd, run: &Path, name: &str, user: u32, expected: &str) -> io::Result<(fs::File, fs::Metadata, PathBuf)> {
    use std::os::unix::fs::MetadataExt;
    let shown = run.join(name);
    let file = open_image_file(dir, name).map_err(|e| ctx(&shown, e))?;
    let meta = file.metadata()?;
    if !meta.is_file() || meta.nlink() != 1 || (meta.uid() != me().0 && meta.uid() != user) {
        let what = format!("a file with {} links owned by uid {}", meta.nlink(), meta.uid());
        return Err(io::Error::other(format!("{} is not {expected} ({what})", shown.display())));
    }
    Ok((file, meta, shown))
}

/// What [`take_file`] could prove.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Took {
    /// No open file description can write the file.
    Proven,
    /// This file system grants no leases (NFS, `fs.leases-enable = 0`):
    /// nothing proven; the caller copies the file into a fresh inode.
    Unproven,
}

/// Makes `file` root's and 0644, then proves that no open file description
/// can write it. After the chown and chmod only root can open it for
/// writing, so what remains to rule out are descriptions opened before:
/// a descriptor of CRIU's the user got hold of, a shared writable mapping,
/// one in flight in a unix socket. The kernel grants a read lease only
/// while no description of the file is open for writing (fcntl(2),
/// F_SETLEASE), so a granted lease, dropped at once, is that proof. Readers
/// are no threat: a read-only description cannot be made writable (a
/// reopen through /proc checks the mode again). Hand-written: no crate
/// wraps leases.
fn take_file(file: &fs::File, shown: &Path) -> io::Result<Took> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::PermissionsExt;
    let (uid, gid) = me();
    let fd = file.as_raw_fd();
    // SAFETY: fchown on a descriptor we own.
    if unsafe { libc::fchown(fd, uid, gid) } != 0 {
        return Err(ctx(shown, io::Error::last_os_error()));
    }
    file.set_permissions(fs::Permissions::from_mode(IMAGE_MODE)).map_err(|e| ctx(shown, e))?;
    // A writer seen is asked about again for a moment: a child this
    // multithreaded process forks holds copies of its descriptors until
    // its exec (close-on-exec closes them only then).
    for _ in 0..LEASE_TRIES {
        // SAFETY: fcntl on a descriptor we own; the lease, if granted, is
        // released on the next line.
        if unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_RDLCK) } == 0 {
            unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_UNLCK) };
            return Ok(Took::Proven);
        }
        match io::Error::last_os_error().raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EBUSY) => std::thread::sleep(std::time::Duration::from_millis(5)),
            _ => return Ok(Took::Unproven),
        }
    }
    Err(io::Error::other(format!(
        "{} is still open for writing by another process (a descriptor of CRIU's taken by someone?): refused",
        shown.display()
    )))
}

/// How often [`take_file`] asks for its lease (5 ms apart) before a
/// writer it sees is taken for one that stays.
const LEASE_TRIES: u32 = 40;

/// Replaces `name` by a copy in a fresh inode, root's and 0644: a
/// description of the old inode, if one was open for writing, then writes
/// to a file no longer in the image.
fn copy_to_fresh_inode(dir: &std::os::fd::OwnedFd, name: &str, from: &fs::File) -> io::Result<()> {
    use nix::fcntl::{openat, renameat, OFlag};
    use std::os::unix::fs::PermissionsExt;
    let fresh = format!("{name}.fresh");
    let _ = nix::unistd::unlinkat(dir, fresh.as_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
    let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = openat(dir, fresh.as_str(), flags, nix::sys::stat::Mode::from_bits_truncate(0o600)).map_err(io::Error::from)?;
    let mut out = fs::File::from(fd);
    let mut src = from.try_clone()?;
    std::io::Seek::seek(&mut src, std::io::SeekFrom::Start(0))?;
    io::copy(&mut src, &mut out)?;
    out.set_permissions(fs::Permissions::from_mode(IMAGE_MODE))?;
    out.sync_all()?;
    renameat(dir, fresh.as_str(), dir, name).map_err(io::Error::from)
}

/// An error with the path it is about.
fn ctx(p: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", p.display()))
}

fn fsync_dir(dir: &Path) -> io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

impl ImageStore {
    pub fn new(root: impl Into<PathBuf>) -> ImageStore {
        ImageStore { root: root.into() }
    }

    pub fn job_dir(&self, job: u32) -> PathBuf {
        self.root.join(job.to_string())
    }

    pub fn run_dir(&self, job: u32, restart: u32) -> PathBuf {
        self.job_dir(job).join(restart.to_string())
    }

    /// The store's and `job`'s directories, root-only (0700), made if missing;
    /// a symlink or another owner's directory in their place is refused.
    fn ensure_job_dir(&self, job: u32) -> io::Result<()> {
        let (uid, gid) = me();
        fsutil::ensure_private_dir(&self.root, uid, gid, 0o700).map_err(|e| ctx(&self.root, e))?;
        let job_dir = self.job_dir(job);
        fsutil::ensure_private_dir(&job_dir, uid, gid, 0o700).map_err(|e| ctx(&job_dir, e))
    }

    /// A fresh, empty, root-only directory for this run's dump. A leftover
    /// of an earlier attempt of the same run (a failed dump) is removed.
    pub fn prepare_run(&self, job: u32, restart: u32) -> io::Result<PathBuf> {
        let (uid, gid) = me();
        self.ensure_job_dir(job)?;
        let run = self.run_dir(job, restart);
        fsutil::remove_tree_if_present(&run).map_err(|e| ctx(&run, e))?;
        fsutil::ensure_private_dir(&run, uid, gid, 0o700).map_err(|e| ctx(&run, e))?;
        Ok(run)
    }

    /// Lends the run directory to the job's user (`uid`, `gid`) for one CRIU
    /// run: CRIU runs as the user and writes (dump) or reads (restore) it with
    /// the user's rights (crate::criu, module docs). The user's other
    /// processes cannot reach it meanwhile: its parents are root's and 0700.
    /// The directory is root's again when the loan is returned or dropped.
    pub fn lend(run: &Path, uid: u32, gid: u32) -> io::Result<Lent> {
        let dir = fsutil::open_dir_nofollow(run)?;
        fchown_fd(&dir, uid, gid).map_err(|e| io::Error::new(e.kind(), format!("cannot lend {} to uid {uid}: {e}", run.display())))?;
        Ok(Lent { dir: Some(dir), path: run.to_path_buf(), read_only: false })
    }

    /// Before a restore's checks: the run directory (root's) and every
    /// image file the manifest names, made root's and read-only for others
    /// ([`take_file`]: files of images dumped before the seal took them back
    /// were the user's), then the directory opened to CRIU's reads for the
    /// loan's life. Checksums are verified after this, so what they vouch
    /// for is what CRIU reads: nobody but root can change it any more.
    pub fn open_for_restore(run: &Path, names: &[&str], user: u32) -> io::Result<Lent> {
        use std::os::unix::fs::MetadataExt;
        let dir = fsutil::open_dir_nofollow(run)?;
        let st = nix::sys::stat::fstat(&dir).map_err(|e| ctx(run, e.into()))?;
        if st.st_uid != me().0 {
            return Err(io::Error::other(format!("{} is owned by uid {}, not root: refused", run.display(), st.st_uid)));
        }
        for name in names {
            let (file, meta, shown) = open_owned_image(&dir, run, name, user, "a sealed image file")?;
            let was_users = meta.uid() != me().0;
            match take_file(&file, &shown)? {
                Took::Proven => {}
                // Root's since its seal, which proved (or copied) it.
                Took::Unproven if !was_users => {}
                Took::Unproven => copy_to_fresh_inode(&dir, name, &file).map_err(|e| ctx(&shown, e))?,
            }
        }
        fchmod_fd(&dir, RESTORING_DIR_MODE).map_err(|e| ctx(run, e))?;
        Ok(Lent { dir: Some(dir), path: run.to_path_buf(), read_only: true })
    }

    /// Makes every file of a finished dump root's again, read-only for
    /// others, proven free of writers ([`take_file`]), durable, and
    /// describes it (size, checksum) for the manifest. Anything but a plain
    /// file with one link, owned by root or by the job's user `user` (CRIU
    /// writes as the user), is an error: CRIU writes only such files there.
    /// A file another process can still write (a descriptor the user got
    /// hold of) is an error too: the image is dropped, never sealed.
    pub fn seal(run: &Path, user: u32) -> io::Result<Vec<ImageFile>> {
        let dir_fd = fsutil::open_dir_nofollow(run)?;
        let mut names: Vec<String> = Vec::new();
        for entry in fs::read_dir(run)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !entry.file_type()?.is_file() {
                return Err(io::Error::other(format!("{} is not a regular file", run.join(&name).display())));
            }
            names.push(name);
        }
        names.sort();
        names.retain(|n| n != MANIFEST_FILE);
        // One fsync and one checksum per file, several files at once: the
        // disk and the file system's journal take concurrent fsyncs in one
        // go, where one after the other each waits for its own commit.
        let seal_one = |name: &String| -> io::Result<ImageFile> {
            let (f, _, shown) = open_owned_image(&dir_fd, run, name, user, "what CRIU writes")?;
            if take_file(&f, &shown)? == Took::Unproven {
                copy_to_fresh_inode(&dir_fd, name, &f).map_err(|e| ctx(&shown, e))?;
            }
            f.sync_all()?;
            describe_file(&dir_fd, name)
        };
        let out = crate::parallel_map(&names, SEAL_THREADS, seal_one).into_iter().collect::<io::Result<Vec<_>>>()?;
        fsync_dir(run)?;
        Ok(out)
    }

    /// A fresh, empty work directory for one CRIU run on `run`'s image
    /// (`<job dir>/.criu-<run>-<verb>`, beside it: never inside the sealed
    /// set), root's and 0700, to be lent to the job's user
    /// ([`ImageStore::lend`]) for CRIU's log, pid file and caches. An
    /// earlier one of the same run and verb (its log) is replaced.
    pub fn prepare_work(run: &Path, verb: &str) -> io::Result<PathBuf> {
        let (uid, gid) = me();
        let (Some(job_dir), Some(r)) = (run.parent(), run.file_name().and_then(|n| n.to_str())) else {
            return Err(io::Error::other(format!("{} is no run directory", run.display())));
        };
        let work = job_dir.join(format!("{WORK_PREFIX}{r}-{verb}"));
        fsutil::remove_tree_if_present(&work).map_err(|e| ctx(&work, e))?;
        fsutil::ensure_private_dir(&work, uid, gid, 0o700).map_err(|e| ctx(&work, e))?;
        Ok(work)
    }

    /// After the manifest: the run directory's own entry (and the job's) are
    /// made durable too, so a crash cannot lose a directory whose manifest
    /// said "complete".
    pub fn sync_parents(&self, job: u32) -> io::Result<()> {
        fsync_dir(&self.job_dir(job))?;
        fsync_dir(&self.root)
    }

    /// The newest complete image of `job`: the highest restart count whose
    /// directory has a manifest (consumed or partial ones are skipped).
    pub fn latest(&self, job: u32) -> Option<(u32, PathBuf)> {
        runs(&self.job_dir(job)).into_iter().rev().find(|(_, dir)| dir.join(MANIFEST_FILE).is_file())
    }

    /// Marks a restored image as used: a later restore must not bring the
    /// application back to a state older than its files.
    pub fn consume(run: &Path) -> io::Result<()> {
        fs::rename(run.join(MANIFEST_FILE), run.join(CONSUMED_FILE))?;
        fsync_dir(run)
    }

    /// Records that run `by_run` of `job` could not restore the job's
    /// image (`reason`): [`cleanup_after_job`] then keeps that image for a
    /// later attempt (`scontrol requeue` once the cause is fixed) instead of
    /// removing it; the sweep's limits still bound it.
    pub fn mark_refused(&self, job: u32, by_run: u32, reason: &str) -> io::Result<()> {
        let path = self.job_dir(job).join(format!("{REFUSED_PREFIX}{by_run}"));
        fs::write(&path, format!("{reason}\n"))
    }

    /// The jobs with a directory in the store, ascending.
    pub fn jobs(&self) -> Vec<u32> {
        let Ok(dir) = fs::read_dir(&self.root) else { return Vec::new() };
        let mut jobs: Vec<u32> = dir.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect();
        jobs.sort_unstable();
        jobs
    }

    /// The run directories of `job`, by restart count.
    pub fn runs_of(&self, job: u32) -> Vec<(u32, PathBuf)> {
        runs(&self.job_dir(job))
    }

    /// The runs of `job` whose restore was refused, with the reason each recorded.
    pub fn refusals(&self, job: u32) -> Vec<(u32, String)> {
        self.marks(job, REFUSED_PREFIX)
    }

    /// The marks `<prefix><run>` in `job`'s directory, with the first line
    /// of each (root-written, one line; bounded anyway), by run.
    fn marks(&self, job: u32, prefix: &str) -> Vec<(u32, String)> {
        let Ok(dir) = fs::read_dir(self.job_dir(job)) else { return Vec::new() };
        let mut out: Vec<(u32, String)> = dir
            .flatten()
            .filter_map(|e| {
                let run = e.file_name().to_str()?.strip_prefix(prefix)?.parse().ok()?;
                let text = fs::read_to_string(e.path()).unwrap_or_default();
                Some((run, text.lines().next().unwrap_or_default().chars().take(300).collect()))
            })
            .collect();
        out.sort();
        out
    }

    /// Removes every run directory of `job` except `keep`, with the staging
    /// records of the other runs (a staged image's record, a failed copy's
    /// mark, a copy under way: crate::staging).
    pub fn remove_other_runs(&self, job: u32, keep: Option<u32>) -> io::Result<()> {
        for (restart, dir) in runs(&self.job_dir(job)) {
            if Some(restart) != keep {
                fsutil::remove_tree_if_present(&dir)?;
            }
        }
        let Ok(entries) = fs::read_dir(self.job_dir(job)) else { return Ok(()) };
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(run) = name.to_str().and_then(staging_record_run) else { continue };
            if Some(run) != keep {
                fsutil::remove_tree_if_present(&e.path())?;
            }
        }
        Ok(())
    }

    /// `<job dir>/staged-<run>`: run `run`'s image is complete and durable
    /// on a node's staging directory (the node's name inside), and its copy
    /// to this store is under way or done. Written by the dump before the
    /// job is requeued; removed when the image is restored or given up.
    pub fn staged_path(&self, job: u32, run: u32) -> PathBuf {
        self.job_dir(job).join(format!("{STAGED_PREFIX}{run}"))
    }

    /// `<job dir>/copy-failed-<run>`: the copy of run `run`'s staged image
    /// failed (the reason inside): a restore elsewhere need not wait for it.
    pub fn copy_failed_path(&self, job: u32, run: u32) -> PathBuf {
        self.job_dir(job).join(format!("{COPY_FAILED_PREFIX}{run}"))
    }

    /// `<job dir>/.copy-<run>-<node>`: a copy under way. Its name is no run
    /// number, so nothing ever takes it for an image.
    pub fn copy_dir(&self, job: u32, run: u32, node: &str) -> PathBuf {
        self.job_dir(job).join(format!("{COPY_PREFIX}{run}-{node}"))
    }

    /// Records durably that run `run` of `job` is staged on `node` (see
    /// [`ImageStore::staged_path`]); the store's and the job's directories
    /// are made root-only as for a dump.
    pub fn record_staged(&self, job: u32, run: u32, node: &str) -> io::Result<()> {
        self.ensure_job_dir(job)?;
        let path = self.staged_path(job, run);
        fsutil::write_atomic(&path, format!("{node}\n").as_bytes(), 0o600).map_err(|e| ctx(&path, e))?;
        fsync_dir(&self.root)
    }

    /// The staged runs of `job` and the node each is staged on, ascending.
    pub fn staged(&self, job: u32) -> Vec<(u32, String)> {
        self.marks(job, STAGED_PREFIX)
    }

    /// The image of run `run` is no longer wanted from the staging tier
    /// (restored, or given up): its record goes, so that no node restores
    /// its staged copy and a copy still under way is dropped.
    pub fn unstage(&self, job: u32, run: u32) -> io::Result<()> {
        if fsutil::remove_if_present(&self.staged_path(job, run))? {
            fsync_dir(&self.job_dir(job))?;
        }
        Ok(())
    }
}

/// The run a record of a job directory is about (`staged-<run>`,
/// `copy-failed-<run>`, `.copy-<run>-<node>`, a work directory `.criu-<run>-<verb>`).
fn staging_record_run(name: &str) -> Option<u32> {
    let digits = name
        .strip_prefix(STAGED_PREFIX)
        .or_else(|| name.strip_prefix(COPY_FAILED_PREFIX))
        .or_else(|| name.strip_prefix(COPY_PREFIX).map(|r| r.split('-').next().unwrap_or_default()))
        .or_else(|| name.strip_prefix(WORK_PREFIX).map(|r| r.split('-').next().unwrap_or_default()))?;
    digits.parse().ok()
}

const STAGED_PREFIX: &str = "staged-";
const COPY_FAILED_PREFIX: &str = "copy-failed-";
const COPY_PREFIX: &str = ".copy-";
/// `<job dir>/.criu-<run>-<verb>`: a CRIU run's work directory
/// ([`ImageStore::prepare_work`]); its name is no run number either.
const WORK_PREFIX: &str = ".criu-";

/// The run directories of a job directory, by restart count.
fn runs(job_dir: &Path) -> Vec<(u32, PathBuf)> {
    let Ok(dir) = fs::read_dir(job_dir) else { return Vec::new() };
    let mut out: Vec<(u32, PathBuf)> =
        dir.flatten().filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path()))).collect();
    out.sort();
    out
}

/// `<job dir>/refused-by-<run>`: that run's restore was refused (its reason inside).
const REFUSED_PREFIX: &str = "refused-by-";

/// What the epilog did with a job's images.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cleanup {
    /// This run completed an image: kept for the requeued run to restore.
    Kept { restart: u32 },
    /// This run could not restore the image of run `restart`: kept (the job
    /// failed with "the image is kept") for a retry, within the sweep's limits.
    KeptRefused { restart: u32 },
    /// An earlier run's image `restart` that this run never tried to
    /// restore (its task never reached the agent: Slurm started it without
    /// its prolog, or ran the prolog only after the task had failed), kept
    /// because Slurm has requeued the job: a later run restores it.
    KeptUntried { restart: u32 },
    /// Nothing of the job is kept (it ended, or its checkpoint failed and it
    /// starts over).
    Removed,
}

/// For the epilog of `job`'s run `restart`: keep the image this run
/// completed, if any (the job was checkpointed and is being requeued), and
/// remove everything else of the job: consumed images, partial dumps, and
/// the whole directory of a job that ended without a checkpoint. An earlier
/// run's image this run left untouched (neither restored nor refused) is
/// kept when `requeued` says Slurm requeued the job, asked only then:
/// removing it would make the next run start over from the beginning.
pub fn cleanup_after_job(store: &ImageStore, job: u32, restart: u32, requeued: &dyn Fn() -> bool) -> io::Result<Cleanup> {
    let this_run = store.run_dir(job, restart);
    // A staged image of this run (its copy to this store may be under way)
    // is kept as a complete one is.
    if this_run.join(MANIFEST_FILE).is_file() || store.staged_path(job, restart).is_file() {
        store.remove_other_runs(job, Some(restart))?;
        return Ok(Cleanup::Kept { restart });
    }
    if store.job_dir(job).join(format!("{REFUSED_PREFIX}{restart}")).is_file() {
        let newest = store.latest(job).map(|(r, _)| r).max(store.staged(job).last().map(|s| s.0));
        if let Some(image) = newest {
            store.remove_other_runs(job, Some(image))?;
            return Ok(Cleanup::KeptRefused { restart: image });
        }
    }
    if let Some(image) = untried_image(store, job, restart).filter(|_| requeued()) {
        store.remove_other_runs(job, Some(image))?;
        return Ok(Cleanup::KeptUntried { restart: image });
    }
    fsutil::remove_tree_if_present(&store.job_dir(job))?;
    Ok(Cleanup::Removed)
}

/// The job's newest image, if it is another run's and still restorable:
/// complete (a manifest) or staged (its copy to this store may be under
/// way), and not consumed. An older complete image behind a newer consumed
/// one is stale: none.
fn untried_image(store: &ImageStore, job: u32, restart: u32) -> Option<u32> {
    let mut restorable = std::collections::BTreeMap::new();
    for (run, dir) in runs(&store.job_dir(job)) {
        match run_state(&dir) {
            "complete" => restorable.insert(run, true),
            "consumed" => restorable.insert(run, false),
            _ => None,
        };
    }
    for (run, _) in store.staged(job) {
        restorable.entry(run).or_insert(true);
    }
    let (&newest, &usable) = restorable.iter().next_back()?;
    (usable && newest != restart).then_some(newest)
}

/// For a caller that knows the job ended for good (completed, cancelled,
/// failed) even though a run completed an image (e.g. a cancel during the
/// dump): removes all of it.
pub fn discard_job_images(store: &ImageStore, job: u32) -> io::Result<()> {
    fsutil::remove_tree_if_present(&store.job_dir(job))
}

/// The image directory's limits (`images_max_gib`, `images_max_age_hours`;
/// zero: no limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_bytes: u64,
    pub max_age: Duration,
}

impl Limits {
    pub fn from_config(cfg: &crate::config::PreemptConfig) -> Limits {
        Limits {
            max_bytes: cfg.images_max_gib.saturating_mul(1 << 30),
            max_age: Duration::from_secs(cfg.images_max_age_hours.saturating_mul(3600)),
        }
    }
}

/// One job's images, for the sweep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobImages {
    pub job: u32,
    pub bytes: u64,
    /// Newest modification time in it, seconds since the epoch.
    pub newest_unix: u64,
}

/// Which jobs' images to remove: those older than the age limit, then the
/// oldest until the rest fits the size limit. `protect` (jobs running here
/// now) are never chosen.
pub fn plan_sweep(entries: &[JobImages], limits: Limits, now_unix: u64, protect: &[u32]) -> Vec<u32> {
    let mut candidates: Vec<&JobImages> = entries.iter().filter(|e| !protect.contains(&e.job)).collect();
    candidates.sort_by_key(|e| (e.newest_unix, e.job));
    let mut total: u64 = entries.iter().map(|e| e.bytes).sum();
    let mut out = Vec::new();
    for e in candidates {
        let too_old = !limits.max_age.is_zero() && now_unix.saturating_sub(e.newest_unix) > limits.max_age.as_secs();
        let too_big = limits.max_bytes > 0 && total > limits.max_bytes;
        if too_old || too_big {
            out.push(e.job);
            total -= e.bytes;
        }
    }
    out
}

fn measure(path: &Path, into: &mut JobImages) {
    let Ok(meta) = fs::symlink_metadata(path) else { return };
    let mtime = meta.modified().ok().and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok()).map_or(0, |d| d.as_secs());
    into.newest_unix = into.newest_unix.max(mtime);
    if meta.is_file() {
        into.bytes += meta.len();
    } else if meta.is_dir() {
        for e in fs::read_dir(path).into_iter().flatten().flatten() {
            measure(&e.path(), into);
        }
    }
}

/// `complete` (a manifest: restorable), `consumed` (restored once) or
/// `partial` (no manifest: an interrupted dump, never restored).
pub fn run_state(run: &Path) -> &'static str {
    if run.join(MANIFEST_FILE).is_file() {
        "complete"
    } else if run.join(CONSUMED_FILE).is_file() {
        "consumed"
    } else {
        "partial"
    }
}

/// Bytes of the files under `path` (not following symlinks).
pub fn tree_bytes(path: &Path) -> u64 {
    let mut j = JobImages { job: 0, bytes: 0, newest_unix: 0 };
    measure(path, &mut j);
    j.bytes
}

/// Applies [`plan_sweep`] to the image directory, after removing the images
/// of jobs `ended` says Slurm has finished for good (a job cancelled while
/// it waited, requeued, to be restored: no epilog of its runs comes to
/// remove them); returns the jobs removed. Protected jobs are never asked
/// about. Safe to run from several nodes at once on shared storage (a
/// directory already gone is not an error).
pub fn sweep_images(store: &ImageStore, limits: Limits, protect: &[u32], ended: &dyn Fn(u32) -> bool) -> io::Result<Vec<u32>> {
    let Ok(dir) = fs::read_dir(&store.root) else { return Ok(Vec::new()) };
    let mut entries = Vec::new();
    for e in dir.flatten() {
        let Some(job) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let mut j = JobImages { job, bytes: 0, newest_unix: 0 };
        measure(&e.path(), &mut j);
        entries.push(j);
    }
    let now = crate::persist::now_unix();
    let (over, kept): (Vec<JobImages>, Vec<JobImages>) = entries.into_iter().partition(|e| !protect.contains(&e.job) && ended(e.job));
    let mut chosen: Vec<u32> = over.iter().map(|e| e.job).collect();
    chosen.extend(plan_sweep(&kept, limits, now, protect));
    for job in &chosen {
        fsutil::remove_tree_if_present(&store.job_dir(*job))?;
    }
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn write(p: &Path, bytes: usize) {
        fs::write(p, vec![1u8; bytes]).unwrap();
    }

    /// Run 0 of job 7 in a store under `base`, holding core-1.img and
    /// pages-1.img (10 bytes each), root's.
    fn two_image_run(base: &Path) -> PathBuf {
        let run = ImageStore::new(base.join("images")).prepare_run(7, 0).unwrap();
        write(&run.join("core-1.img"), 10);
        write(&run.join("pages-1.img"), 10);
        run
    }

    #[test]
    fn runs_are_fresh_private_and_sealed() {
        let tmp = tempfile::tempdir().unwrap();
        let store = ImageStore::new(tmp.path().join("images"));
        let run = store.prepare_run(7, 0).unwrap();
        write(&run.join("core-1.img"), 10);
        write(&run.join("pages-1.img"), 100);
        let files = ImageStore::seal(&run, 1001).unwrap();
        assert_eq!(files.iter().map(|f| (f.name.as_str(), f.bytes)).collect::<Vec<_>>(), [("core-1.img", 10), ("pages-1.img", 100)]);
        for p in [store.root.clone(), store.job_dir(7), run.clone()] {
            assert_eq!(fs::metadata(&p).unwrap().mode() & 0o7777, 0o700, "{}", p.display());
        }
        assert_eq!(fs::metadata(run.join("core-1.img")).unwrap().mode() & 0o777, 0o644);
        // A second attempt of the same run starts empty.
        let again = store.prepare_run(7, 0).unwrap();
        assert_eq!(fs::read_dir(&again).unwrap().count(), 0);
        // A symlink among the images is refused, not followed.
        std::os::unix::fs::symlink("/etc/passwd", again.join("x.img")).unwrap();
        assert!(ImageStore::seal(&again, 1001).unwrap_err().to_string().contains("not a regular file"));
    }

    /// CRIU writes as the job's user (crate::criu): the seal takes the user's
    /// files and root's, nothing with a second link and nobody else's.
    #[test]
    fn the_seal_takes_only_files_of_root_or_the_user_with_one_link() {
        if !gpu_mode_testkit::root_or_skip("it chowns files") {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let run = two_image_run(tmp.path());
        std::os::unix::fs::chown(run.join("pages-1.img"), Some(1001), Some(1001)).unwrap();
        assert_eq!(ImageStore::seal(&run, 1001).unwrap().len(), 2);
        std::os::unix::fs::chown(run.join("pages-1.img"), Some(1002), Some(1002)).unwrap();
        let err = ImageStore::seal(&run, 1001).unwrap_err().to_string();
        assert!(err.contains("pages-1.img is not what CRIU writes") && err.contains("owned by uid 1002"), "{err}");
        std::os::unix::fs::chown(run.join("pages-1.img"), Some(1001), Some(1001)).unwrap();
        fs::hard_link(run.join("core-1.img"), tmp.path().join("elsewhere")).unwrap();
        let err = ImageStore::seal(&run, 1001).unwrap_err().to_string();
        assert!(err.contains("core-1.img is not what CRIU writes (a file with 2 links"), "{err}");
    }

    /// A loan makes the run directory the user's for one CRIU run and
    /// always ends with it root's again (given back, or dropped on an error
    /// path); the user cannot reach it by path meanwhile.
    #[test]
    fn a_lent_run_directory_is_unreachable_by_path_and_comes_back() {
        if !gpu_mode_testkit::root_or_skip("it lends to nobody") {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        fs::set_permissions(tmp.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let store = ImageStore::new(tmp.path().join("images"));
        let run = store.prepare_run(7, 0).unwrap();
        write(&run.join("core-1.img"), 10);
        let owner = |p: &Path| fs::metadata(p).unwrap().uid();
        let lent = ImageStore::lend(&run, 65534, 65534).unwrap();
        assert_eq!(owner(&run), 65534);
        let (ok, err) = as_nobody("/bin/ls", &[&run]);
        assert!(!ok && err.contains("Permission denied"), "nobody reached a lent directory by path: {err}");
        lent.give_back().unwrap();
        assert_eq!(owner(&run), 0);
        drop(ImageStore::lend(&run, 65534, 65534).unwrap());
        assert_eq!(owner(&run), 0, "a dropped loan is taken back");
    }

    /// N1: the seal takes every file CRIU wrote as the user back (root's,
    /// 0644) and refuses a file some description can still write: the
    /// user's way to rewrite an image after its checks is gone. A reader
    /// is no threat and passes.
    #[test]
    fn the_seal_takes_every_file_back_and_refuses_one_still_open_for_writing() {
        if !gpu_mode_testkit::root_or_skip("it chowns files") {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let run = two_image_run(tmp.path());
        for f in ["core-1.img", "pages-1.img"] {
            std::os::unix::fs::chown(run.join(f), Some(1001), Some(1001)).unwrap();
        }
        let reader = fs::File::open(run.join("pages-1.img")).unwrap();
        ImageStore::seal(&run, 1001).unwrap();
        for f in ["core-1.img", "pages-1.img"] {
            let meta = fs::metadata(run.join(f)).unwrap();
            assert_eq!((meta.uid(), meta.gid(), meta.mode() & 0o7777), (0, 0, 0o644), "{f}");
        }
        drop(reader);
        // A description open for writing since before the seal (what a
        // descriptor of CRIU's taken by the user would be).
        std::os::unix::fs::chown(run.join("core-1.img"), Some(1001), Some(1001)).unwrap();
        let writer = fs::OpenOptions::new().append(true).open(run.join("core-1.img")).unwrap();
        let err = ImageStore::seal(&run, 1001).unwrap_err().to_string();
        assert!(err.contains("core-1.img is still open for writing by another process"), "{err}");
        drop(writer);
        ImageStore::seal(&run, 1001).unwrap();
    }

    /// N1: a restore lends nothing. The run directory stays root's (0755
    /// while CRIU reads it, 0700 after), the files root's and 0644 (an older
    /// image's user-owned files are taken), and the user, even holding the
    /// directory's descriptor as CRIU does, can read them and change none.
    #[test]
    fn a_restore_reads_root_files_that_the_user_cannot_change() {
        if !gpu_mode_testkit::root_or_skip("the reader runs as nobody") {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let run = two_image_run(tmp.path());
        // An image sealed by an older version: the user's files.
        std::os::unix::fs::chown(run.join("core-1.img"), Some(65534), Some(65534)).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().mode() & 0o7777;
        let opened = ImageStore::open_for_restore(&run, &["core-1.img", "pages-1.img"], 65534).unwrap();
        assert_eq!(mode(&run), 0o755);
        for f in ["core-1.img", "pages-1.img"] {
            let meta = fs::metadata(run.join(f)).unwrap();
            assert_eq!((meta.uid(), meta.mode() & 0o7777), (0, 0o644), "{f}");
        }
        let dir = fsutil::open_dir_nofollow(&run).unwrap();
        let (wrote, err) = as_nobody_with_dir(&dir, "/usr/bin/tee", &["-a", "core-1.img"]);
        assert!(!wrote && err.contains("Permission denied"), "nobody wrote an image through the directory's descriptor: {err}");
        let (read, err) = as_nobody_with_dir(&dir, "/bin/cat", &["core-1.img"]);
        assert!(read, "CRIU as the user could not read: {err}");
        opened.give_back().unwrap();
        assert_eq!(mode(&run), 0o700);
        // A file some description can still write is refused; a link or
        // another user's file too.
        let writer = fs::OpenOptions::new().append(true).open(run.join("pages-1.img")).unwrap();
        let err = ImageStore::open_for_restore(&run, &["pages-1.img"], 65534).err().unwrap().to_string();
        assert!(err.contains("pages-1.img is still open for writing"), "{err}");
        drop(writer);
        std::os::unix::fs::symlink("/etc/passwd", run.join("link.img")).unwrap();
        assert!(ImageStore::open_for_restore(&run, &["link.img"], 65534).is_err());
        assert_eq!(fs::metadata("/etc/passwd").unwrap().uid(), 0);
        std::os::unix::fs::chown(run.join("pages-1.img"), Some(1002), Some(1002)).unwrap();
        let err = ImageStore::open_for_restore(&run, &["pages-1.img"], 65534).err().unwrap().to_string();
        assert!(err.contains("not a sealed image file") && err.contains("owned by uid 1002"), "{err}");
        assert_eq!(mode(&run), 0o700, "a refused restore leaves the directory closed");
    }

    /// The work directory: fresh, root's until lent, beside the run (never
    /// in the sealed set), replaced per run and verb, and gone with the
    /// other runs' records.
    #[test]
    fn a_work_directory_is_fresh_and_goes_with_its_run() {
        let tmp = tempfile::tempdir().unwrap();
        let store = ImageStore::new(tmp.path().join("images"));
        let run = store.prepare_run(7, 0).unwrap();
        let work = ImageStore::prepare_work(&run, "dump").unwrap();
        assert_eq!(work, store.job_dir(7).join(".criu-0-dump"));
        write(&work.join("dump.log"), 10);
        let again = ImageStore::prepare_work(&run, "dump").unwrap();
        assert_eq!(fs::read_dir(&again).unwrap().count(), 0, "an old log is replaced");
        assert_eq!(fs::metadata(&again).unwrap().mode() & 0o7777, 0o700);
        assert_eq!(store.runs_of(7).len(), 1, "a work directory is no run");
        let run1 = store.prepare_run(7, 1).unwrap();
        ImageStore::prepare_work(&run1, "restore").unwrap();
        store.remove_other_runs(7, Some(1)).unwrap();
        assert!(!work.exists() && store.job_dir(7).join(".criu-1-restore").is_dir());
    }

    /// `program args...` as nobody in `dir` (inherited as descriptor 3 and
    /// reached through /proc/self/fd, as CRIU reaches it): status, stderr.
    fn as_nobody_with_dir(dir: &std::os::fd::OwnedFd, program: &str, args: &[&str]) -> (bool, String) {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        let fd = dir.as_raw_fd();
        let mut cmd = std::process::Command::new(program);
        let file = args.last().copied().unwrap_or_default();
        cmd.args(&args[..args.len() - 1]).arg(format!("/proc/self/fd/3/{file}")).uid(65534).gid(65534);
        cmd.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null());
        // SAFETY: dup2 and fcntl are async-signal-safe, on descriptors we
        // own. Already 3, dup2 would leave close-on-exec set (seen: tee then
        // found no /proc/self/fd/3 once in six runs): clear it instead.
        unsafe {
            cmd.pre_exec(move || {
                let ok = if fd == 3 { libc::fcntl(3, libc::F_SETFD, 0) == 0 } else { libc::dup2(fd, 3) == 3 };
                if ok {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            })
        };
        let out = cmd.output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    }

    /// `program args...` run as nobody (no shell): its exit status and stderr.
    fn as_nobody(program: &str, args: &[&Path]) -> (bool, String) {
        use std::os::unix::process::CommandExt;
        let out = std::process::Command::new(program).args(args).uid(65534).gid(65534).output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    }

    /// Threat-model boundary: another user cannot list, read or reach a
    /// job's images (they hold the whole memory of its processes).
    #[test]
    fn another_user_cannot_list_or_read_images() {
        if !gpu_mode_testkit::root_or_skip("the reader runs as nobody") {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        // The store root must be reachable for the test to mean anything.
        fs::set_permissions(tmp.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let store = ImageStore::new(tmp.path().join("images"));
        let run = store.prepare_run(7, 0).unwrap();
        write(&run.join("pages-1.img"), 100);
        ImageStore::seal(&run, 1001).unwrap();
        for dir in [&store.root, &store.job_dir(7), &run] {
            let (ok, err) = as_nobody("/bin/ls", &[dir]);
            assert!(!ok && err.contains("Permission denied"), "nobody listed {}: {err}", dir.display());
        }
        let (ok, err) = as_nobody("/bin/cat", &[&run.join("pages-1.img")]);
        assert!(!ok && err.contains("Permission denied"), "nobody read an image: {err}");
        // Root can: the refusal is the permissions', not a missing file.
        assert_eq!(fs::read(run.join("pages-1.img")).unwrap().len(), 100);
    }

    /// Threat-model boundary: a symlink or another user's directory planted
    /// at the store, a job's or a run's directory is refused or replaced,
    /// and what it points at is untouched.
    #[test]
    fn planted_image_directories_are_refused_not_followed() {
        if !gpu_mode_testkit::root_or_skip("a directory of another owner") {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let victim = tmp.path().join("victim");
        fs::create_dir(&victim).unwrap();
        let untouched = || fs::read_dir(&victim).unwrap().count() == 0 && fs::metadata(&victim).unwrap().uid() == 0;
        // The store root or a job directory as a symlink: refused.
        let store = ImageStore::new(tmp.path().join("images"));
        std::os::unix::fs::symlink(&victim, &store.root).unwrap();
        let err = store.prepare_run(7, 0).unwrap_err().to_string();
        assert!(err.contains("is not a directory (a symlink or file is in the way)"), "{err}");
        fs::remove_file(&store.root).unwrap();
        fs::create_dir(&store.root).unwrap();
        std::os::unix::fs::symlink(&victim, store.job_dir(7)).unwrap();
        assert!(store.prepare_run(7, 0).is_err());
        // A job directory another user owns: refused.
        let other = ImageStore::new(tmp.path().join("images2"));
        fs::create_dir_all(other.job_dir(8)).unwrap();
        std::os::unix::fs::chown(other.job_dir(8), Some(65534), Some(65534)).unwrap();
        let err = other.prepare_run(8, 0).unwrap_err().to_string();
        assert!(err.contains("is owned by uid 65534, expected uid 0"), "{err}");
        // A run directory as a symlink: the link is removed, a fresh
        // directory made, the target kept.
        fs::remove_file(store.job_dir(7)).unwrap();
        let run = store.run_dir(7, 1);
        fs::create_dir_all(store.job_dir(7)).unwrap();
        std::os::unix::fs::symlink(&victim, &run).unwrap();
        let made = store.prepare_run(7, 1).unwrap();
        assert!(fs::symlink_metadata(&made).unwrap().is_dir());
        assert!(untouched(), "the victim directory was written to or changed");
    }

    #[test]
    fn latest_skips_partial_and_consumed_and_cleanup_keeps_only_this_runs_image() {
        let tmp = tempfile::tempdir().unwrap();
        let store = ImageStore::new(tmp.path());
        for r in 0..3 {
            store.prepare_run(7, r).unwrap();
        }
        write(&store.run_dir(7, 0).join(MANIFEST_FILE), 1);
        write(&store.run_dir(7, 1).join(MANIFEST_FILE), 1);
        // Run 2 is a partial dump: no manifest.
        assert_eq!(store.latest(7).map(|(r, _)| r), Some(1));
        ImageStore::consume(&store.run_dir(7, 1)).unwrap();
        assert_eq!(store.latest(7).map(|(r, _)| r), Some(0));
        assert_eq!(store.latest(8), None);
        // Run 2's epilog: run 1's image was consumed, run 0's behind it is
        // stale, run 2 made none: all goes, requeued or not.
        assert_eq!(cleanup_after_job(&store, 7, 2, &|| true).unwrap(), Cleanup::Removed);
        assert!(!store.job_dir(7).exists());
        // A run that completed an image keeps it alone.
        for r in 0..2 {
            store.prepare_run(9, r).unwrap();
        }
        write(&store.run_dir(9, 1).join(MANIFEST_FILE), 1);
        assert_eq!(cleanup_after_job(&store, 9, 1, &|| panic!("not asked")).unwrap(), Cleanup::Kept { restart: 1 });
        assert!(store.run_dir(9, 1).exists() && !store.run_dir(9, 0).exists());
        discard_job_images(&store, 9).unwrap();
        discard_job_images(&store, 9).unwrap();
        assert!(!store.job_dir(9).exists());
    }

    #[test]
    fn an_image_whose_restore_this_run_was_refused_is_kept_and_only_that_run_keeps_it() {
        let tmp = tempfile::tempdir().unwrap();
        let store = ImageStore::new(tmp.path());
        store.prepare_run(7, 0).unwrap();
        write(&store.run_dir(7, 0).join(MANIFEST_FILE), 1);
        // Run 1 was refused (e.g. another driver); it left a partial dir too.
        store.prepare_run(7, 1).unwrap();
        store.mark_refused(7, 1, "the image was taken with NVIDIA driver 570").unwrap();
        assert_eq!(cleanup_after_job(&store, 7, 1, &|| panic!("not asked")).unwrap(), Cleanup::KeptRefused { restart: 0 });
        assert!(store.run_dir(7, 0).join(MANIFEST_FILE).exists() && !store.run_dir(7, 1).exists());
        assert_eq!(store.latest(7).map(|(r, _)| r), Some(0), "the mark is no run directory");
        // Run 2 tried nothing (e.g. no agent, started afresh) and ended: all goes.
        assert_eq!(cleanup_after_job(&store, 7, 2, &|| false).unwrap(), Cleanup::Removed);
        assert!(!store.job_dir(7).exists());
    }

    /// The CI's churn, 2026-11-27: Slurm started run 1 of a checkpointed
    /// job without its prolog and ran the prolog only after the plugin had
    /// requeued the run; that run's epilog removed run 0's image as a job
    /// that ended without one, and run 2 started over from the beginning.
    #[test]
    fn an_image_a_requeued_run_never_tried_is_kept_and_only_while_slurm_requeued_the_job() {
        let tmp = tempfile::tempdir().unwrap();
        let store = ImageStore::new(tmp.path());
        let asked = std::cell::Cell::new(0);
        let image = |store: &ImageStore| {
            store.prepare_run(7, 0).unwrap();
            write(&store.run_dir(7, 0).join(MANIFEST_FILE), 1);
            // Run 1 left a partial directory (a dump it never finished).
            store.prepare_run(7, 1).unwrap();
        };
        image(&store);
        let requeued = || {
            asked.set(asked.get() + 1);
            true
        };
        assert_eq!(cleanup_after_job(&store, 7, 1, &requeued).unwrap(), Cleanup::KeptUntried { restart: 0 });
        assert_eq!(asked.get(), 1);
        assert!(store.run_dir(7, 0).join(MANIFEST_FILE).exists() && !store.run_dir(7, 1).exists());
        assert_eq!(store.latest(7).map(|(r, _)| r), Some(0));
        // The same run, the job not requeued (cancelled before its task
        // started): all goes.
        assert_eq!(cleanup_after_job(&store, 7, 1, &|| false).unwrap(), Cleanup::Removed);
        assert!(!store.job_dir(7).exists());
        // Restored (consumed) by run 1: nothing untried, Slurm not asked.
        image(&store);
        ImageStore::consume(&store.run_dir(7, 0)).unwrap();
        assert_eq!(cleanup_after_job(&store, 7, 1, &|| panic!("not asked")).unwrap(), Cleanup::Removed);
        assert!(!store.job_dir(7).exists());
        // Staged on another node, its copy here under way (no manifest
        // yet): kept as well.
        store.prepare_run(7, 0).unwrap();
        store.record_staged(7, 0, "n2").unwrap();
        assert_eq!(cleanup_after_job(&store, 7, 1, &|| true).unwrap(), Cleanup::KeptUntried { restart: 0 });
        assert!(store.staged_path(7, 0).is_file());
    }

    #[test]
    fn the_sweep_removes_old_then_oldest_until_it_fits() {
        let day = 86_400;
        let now = 100 * day;
        let e = |job, gib: u64, age_days: u64| JobImages { job, bytes: gib << 30, newest_unix: now - age_days * day };
        let entries = [e(1, 10, 9), e(2, 10, 3), e(3, 10, 2), e(4, 10, 1), e(5, 10, 0)];
        let week = Duration::from_secs(7 * day);
        let cases: Vec<(Limits, Vec<u32>, Vec<u32>)> = vec![
            (Limits { max_bytes: 0, max_age: Duration::ZERO }, vec![], vec![]),
            (Limits { max_bytes: 0, max_age: week }, vec![], vec![1]),
            (Limits { max_bytes: 30 << 30, max_age: Duration::ZERO }, vec![], vec![1, 2]),
            (Limits { max_bytes: 30 << 30, max_age: week }, vec![2], vec![1, 3]),
            (Limits { max_bytes: 1, max_age: week }, vec![5], vec![1, 2, 3, 4]),
        ];
        for (limits, protect, want) in cases {
            assert_eq!(plan_sweep(&entries, limits, now, &protect), want, "{limits:?} protect {protect:?}");
        }
    }

    #[test]
    fn sweep_images_measures_and_removes() {
        let tmp = tempfile::tempdir().unwrap();
        let store = ImageStore::new(tmp.path());
        for job in [1, 2] {
            let run = store.prepare_run(job, 0).unwrap();
            write(&run.join("pages-1.img"), 1000);
        }
        fs::create_dir(tmp.path().join("not-a-job")).unwrap();
        let removed = sweep_images(&store, Limits { max_bytes: 1500, max_age: Duration::ZERO }, &[2], &|_| false).unwrap();
        assert_eq!(removed, vec![1]);
        assert!(!store.job_dir(1).exists() && store.job_dir(2).exists() && tmp.path().join("not-a-job").exists());
    }

    #[test]
    fn images_of_jobs_slurm_has_ended_go_whatever_the_limits_and_protected_ones_are_not_asked_about() {
        let tmp = tempfile::tempdir().unwrap();
        let store = ImageStore::new(tmp.path());
        for job in [1, 2, 3] {
            write(&store.prepare_run(job, 0).unwrap().join("pages-1.img"), 10);
        }
        let asked = std::sync::Mutex::new(Vec::new());
        let ended = |job: u32| {
            asked.lock().unwrap().push(job);
            job != 3
        };
        let no_limits = Limits { max_bytes: 0, max_age: Duration::ZERO };
        let mut removed = sweep_images(&store, no_limits, &[2], &ended).unwrap();
        removed.sort();
        assert_eq!(removed, vec![1]);
        assert!(!store.job_dir(1).exists() && store.job_dir(2).exists() && store.job_dir(3).exists());
        let mut asked = asked.into_inner().unwrap();
        asked.sort();
        assert_eq!(asked, vec![1, 3], "job 2 runs here: never asked about");
    }
}
