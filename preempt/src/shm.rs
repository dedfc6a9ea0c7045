//! The job's POSIX semaphores and shared memory in /dev/shm that CRIU cannot
//! dump on its own, carried in the image by the agent.
//!
//! glibc's `sem_open(O_CREAT)` makes a semaphore under a temporary name,
//! maps it, links it to its final name and removes the temporary one, so
//! the creator maps a deleted file that still has a name
//! (`/dev/shm/sem.Ab12Cd (deleted)`, also `/dev/shm/sem.mp-xyz`). Python's
//! multiprocessing keeps such names with the spawn and forkserver start
//! methods (a DataLoader with `multiprocessing_context="spawn"`). CRIU dumps
//! a deleted file with no name left as a "ghost" (content in the image), but
//! one that still has a name only with `--link-remap`: a hard link CRIU makes
//! as root beside it, in any directory, and opens again by path as root at
//! restore, where the user may have put something else. The agent does not
//! use it. Instead, for each such file the tree holds that is the user's own
//! and sits directly in /dev/shm:
//!
//! * **dump**, before the driver is locked: as the user, the deleted name is
//!   linked back under the literal name CRIU looks up (`sem.Ab12Cd
//!   (deleted)`: CRIU stats the path /proc shows, suffix included, and dumps
//!   a file it finds there with the same inode by path, files-reg.c
//!   `check_path_remap`). Once CRIU has dumped the tree, the file's content
//!   goes into the image (`shm-<n>.img`, sealed and checksummed with the
//!   rest) and its names are removed, as the user: they leave the node with
//!   the job (a killed tree would leave them behind otherwise).
//! * **restore**, before CRIU: the names are made again as the user (never
//!   over an existing name or through a symlink) with the content and mode;
//!   CRIU opens them by path; the alias names go once CRIU is done.
//!
//! No step depends on a kernel setting (issue 37: `fs.protected_symlinks`
//! and `fs.protected_hardlinks` may be off). Every name in /dev/shm is
//! made, linked or removed by the user (`run_as_user`, relative to a
//! descriptor of the directory, `O_CREAT|O_EXCL|O_NOFOLLOW`, a removal only
//! of the inode planned), so the kernel checks each step against the
//! user's rights: a link the user planted leads them only where they could
//! go anyway, and those protections matter only to a more privileged
//! process following it. CRIU opens the names as the user too
//! (crate::criu). Root only lists the directory (`fstatat` with
//! `AT_SYMLINK_NOFOLLOW`: a symlink is its own inode, never followed) and
//! reads each file's content through the tree's own descriptor or mapping
//! (`/proc/<pid>/fd/N`, `map_files`), opened once and checked with fstat to
//! be the planned inode, a regular file of the user's on /dev/shm's file
//! system: never by a name in /dev/shm. What stays checked is what keeps
//! the names the user made theirs until CRIU has opened them: /dev/shm is
//! root's, sticky and world-writable (no other user can remove or replace
//! them) and a tmpfs (a file system that holds only what was made on it).
//! The restored tree is then checked by held.rs like every other file.
//! Anything else that needs `--link-remap` is still refused by CRIU.

use crate::privdrop::Identity;
use crate::user_child::{answer, errno, run_as_user, UserChildError};
use serde::{Deserialize, Serialize};
use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where the job's objects live, as the processes name it.
const SHM_DIR: &str = "/dev/shm/";
const DELETED: &str = " (deleted)";
/// How long the work as the user may take.
const USER_BOUND: Duration = Duration::from_secs(10);

/// Why the job's /dev/shm objects cannot be carried in the image (at the
/// dump) or made again (at the restore), or a name that stays behind. Its
/// own kind per failure, so that a test or a caller tells them apart without
/// reading the words; each Display is the message the agent has always
/// given (the dump and the restore add their own words around it, and every
/// kind is the metrics' reason `shm` there).
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    /// plan: another user's file, deleted under one name but named still.
    #[error(
        "pid {pid} holds {path} ({what}), a file of uid {uid} that was deleted under this name but still has another: \
         only the job's own such files are carried in the image: refused"
    )]
    ForeignFile { pid: i32, path: String, what: String, uid: u32 },
    /// plan: some of the file's names are elsewhere (another directory), so
    /// CRIU would need `--link-remap`.
    #[error(
        "pid {pid} holds {path} ({what}), deleted under this name, whose {nlink} name(s) are not all in {SHM_DIR} ({found} found): \
         CRIU cannot dump it without --link-remap: refused"
    )]
    NamesElsewhere { pid: i32, path: String, what: String, nlink: u64, found: usize },
    /// plan: the name CRIU looks up (`<name> (deleted)`) is another file.
    #[error("pid {pid} holds {path} ({what}), and {SHM_DIR}{alias} is another file: refused")]
    AliasTaken { pid: i32, path: String, what: String, alias: String },
    /// collect_refs: a process's /proc/<pid>/maps.
    #[error("cannot read pid {pid}'s mappings: {source}")]
    Mappings { pid: i32, source: std::io::Error },
    /// shm_dir: /dev/shm as the process sees it.
    #[error("cannot open {SHM_DIR} of pid {pid}: {source}")]
    OpenDir { pid: i32, source: nix::errno::Errno },
    /// shm_dir: its fstat or fstatfs.
    #[error("{SHM_DIR}: {0}")]
    StatDir(nix::errno::Errno),
    /// shm_dir: not what the design relies on (module docs).
    #[error("{SHM_DIR} {0}: the job's semaphores there cannot be carried safely: refused")]
    UnsafeDir(DirProblem),
    /// list: the directory's listing.
    #[error("cannot list {SHM_DIR}: {0}")]
    List(std::io::Error),
    /// cstr: a name with a NUL byte (a corrupt manifest).
    #[error("{name:?}: NUL in a name")]
    Nul { name: String },
    /// run_ops: the work as the job's user gave no answer.
    #[error(transparent)]
    Child(#[from] UserChildError),
    /// stage: the file the tree holds, opened through /proc.
    #[error("cannot read {path}: {source}")]
    Source { path: String, source: std::io::Error },
    /// stage: that file's metadata.
    #[error("{path}: {source}")]
    SourceStat { path: String, source: std::io::Error },
    /// stage: another inode than the one planned.
    #[error("{path} changed while it was looked at: refused")]
    Changed { path: String },
    /// stage: an alias CRIU looks up not linked as the user (`name` is its path).
    #[error("cannot link {name} as uid {uid}: {source}: refused")]
    Link { name: String, uid: u32, source: std::io::Error },
    /// Staged::save: an object's content (`name`: its first name).
    #[error("cannot read {SHM_DIR}{name}: {source}")]
    Content { name: String, source: std::io::Error },
    /// Staged::save: the image's `shm-<n>.img`, created or written.
    #[error("{}: {source}", .path.display())]
    ImageWrite { path: PathBuf, source: std::io::Error },
    /// Staged::save's note: a name not removed after the dump (`name` is its path).
    #[error("{name} stays: {source}")]
    Stays { name: String, source: std::io::Error },
    /// recreate: the image directory, opened without following a symlink.
    #[error("{}: {source}", .path.display())]
    RunDir { path: PathBuf, source: std::io::Error },
    /// recreate: the manifest names an object outside /dev/shm, or none.
    #[error("the manifest's /dev/shm object {names:?} is not valid: corrupt")]
    CorruptObject { names: Vec<String> },
    /// recreate: an object's image file (missing, short, a symlink).
    #[error("image file {image}: {source}")]
    ImageRead { image: String, source: std::io::Error },
    /// recreate: a name not made again as the user (`name` is its path);
    /// EEXIST says that something made it since the checkpoint.
    #[error("cannot make {name} again as uid {uid}: {}: nothing was restored", remake_why(.source))]
    Remake { name: String, uid: u32, source: std::io::Error },
}

/// What is wrong with /dev/shm ([`ShmError::UnsafeDir`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DirProblem {
    #[error("belongs to uid {0}, not root")]
    NotRoot(u32),
    /// Its permission bits (not sticky and world-writable).
    #[error("has mode {0:o}, not 1777")]
    Mode(u32),
    #[error("is not a tmpfs")]
    NotTmpfs,
}

fn remake_why(e: &std::io::Error) -> String {
    if e.raw_os_error() == Some(libc::EEXIST) {
        "it exists (made since the checkpoint)".to_string()
    } else {
        e.to_string()
    }
}

/// One object of the job's, as the manifest records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShmObject {
    /// Its names in /dev/shm: the first is made, the others linked to it.
    pub names: Vec<String>,
    /// The names CRIU recorded for the tree's references through a deleted
    /// name (`sem.Ab12Cd (deleted)`), made for CRIU and removed after it.
    pub aliases: Vec<String>,
    pub mode: u32,
    pub bytes: u64,
    /// Its content, a file of the image directory.
    pub image: String,
}

/// One descriptor or mapping of the tree that names a file in /dev/shm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShmRef {
    pub pid: i32,
    /// `fd 3`, `mapping 7f00-7f80`.
    pub what: String,
    /// The path /proc shows, ` (deleted)` included.
    pub path: String,
    pub dev: u64,
    pub ino: u64,
    pub nlink: u64,
    pub uid: u32,
    pub mode: u32,
    pub bytes: u64,
    /// Where the file itself can be opened (`/proc/<pid>/map_files/...`).
    pub source: String,
}

/// An object to carry: what the manifest will say, and where to read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    pub ino: u64,
    pub names: Vec<String>,
    /// Aliases to make (those already there, from an earlier attempt, are not).
    pub aliases: Vec<String>,
    pub existing_aliases: Vec<String>,
    pub mode: u32,
    pub bytes: u64,
    pub source: String,
}

/// `name` and whether /proc says it was deleted, for a path directly in
/// /dev/shm; `None` for anything else.
fn shm_name(path: &str) -> Option<(&str, bool)> {
    let rest = path.strip_prefix(SHM_DIR)?;
    let (name, deleted) = match rest.strip_suffix(DELETED) {
        Some(n) => (n, true),
        None => (rest, false),
    };
    (valid_name(name)).then_some((name, deleted))
}

fn valid_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('\0') && name.len() <= 255
}

/// Which of the tree's /dev/shm files CRIU could not dump (held through a
/// deleted name, yet still named), with all their names: `entries` is the
/// directory's listing (name, inode) and `dev` its device. Pure: the rules
/// are here, the reading is in [`stage`].
pub fn plan(refs: &[ShmRef], dev: u64, entries: &[(String, u64)], uid: u32) -> Result<Vec<Planned>, ShmError> {
    let mut out: Vec<Planned> = Vec::new();
    for r in refs {
        let Some((name, true)) = shm_name(&r.path) else { continue };
        // Another file system's path that reads the same, a non-file, or a
        // file with no name left (CRIU's ghost file carries it).
        if r.dev != dev || r.mode & libc::S_IFMT != libc::S_IFREG || r.nlink == 0 {
            continue;
        }
        if r.uid != uid {
            return Err(ShmError::ForeignFile { pid: r.pid, path: r.path.clone(), what: r.what.clone(), uid: r.uid });
        }
        let alias = format!("{name}{DELETED}");
        if let Some(p) = out.iter_mut().find(|p| p.ino == r.ino) {
            if !p.aliases.contains(&alias) && !p.existing_aliases.contains(&alias) {
                add_alias(p, alias, entries, r)?;
            }
            continue;
        }
        let linked = entries.iter().filter(|(_, ino)| *ino == r.ino).count();
        let names: Vec<String> =
            entries.iter().filter(|(n, ino)| *ino == r.ino && !n.ends_with(DELETED)).map(|(n, _)| n.clone()).collect();
        if linked as u64 != r.nlink || names.is_empty() {
            return Err(ShmError::NamesElsewhere { pid: r.pid, path: r.path.clone(), what: r.what.clone(), nlink: r.nlink, found: names.len() });
        }
        let mut p = Planned {
            ino: r.ino,
            names,
            aliases: vec![],
            existing_aliases: vec![],
            mode: r.mode & 0o7777,
            bytes: r.bytes,
            source: r.source.clone(),
        };
        add_alias(&mut p, alias, entries, r)?;
        out.push(p);
    }
    Ok(out)
}

fn add_alias(p: &mut Planned, alias: String, entries: &[(String, u64)], r: &ShmRef) -> Result<(), ShmError> {
    match entries.iter().find(|(n, _)| *n == alias) {
        None => p.aliases.push(alias),
        Some((_, ino)) if *ino == r.ino => p.existing_aliases.push(alias),
        Some(_) => {
            return Err(ShmError::AliasTaken { pid: r.pid, path: r.path.clone(), what: r.what.clone(), alias });
        }
    }
    Ok(())
}

/// The tree's descriptors and mappings that name a file in /dev/shm.
pub fn collect_refs(pids: &[i32]) -> Result<Vec<ShmRef>, ShmError> {
    let mut out = Vec::new();
    for &pid in pids {
        let links = crate::procfs::fd_links(Path::new(&format!("/proc/{pid}/fd"))).unwrap_or_default();
        for (fd, link) in links.into_iter().filter(|(_, link)| link.starts_with(SHM_DIR)) {
            out.extend(reference(pid, format!("fd {fd}"), link, format!("/proc/{pid}/fd/{fd}")));
        }
        let maps = match std::fs::read_to_string(format!("/proc/{pid}/maps")) {
            Ok(maps) => maps,
            // Ended since the tree was listed (a short-lived child, e.g. a
            // shell's `sleep` in a loop): it holds nothing to carry. Seen
            // as a spurious failure of agent::tests::a_gpu_file_opened_...
            // (reason shm) about once in 18 runs of the crate's tests.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH) => continue,
            Err(source) => return Err(ShmError::Mappings { pid, source }),
        };
        for line in maps.lines().filter(|l| l.contains(" /dev/shm/")) {
            let Some(h) = crate::held::mapping_of_line(pid, line) else { continue };
            out.extend(reference(pid, h.what.clone(), h.path.clone(), h.source().to_string()));
        }
    }
    Ok(out)
}

fn reference(pid: i32, what: String, path: String, source: String) -> Option<ShmRef> {
    // The process may have closed or unmapped it since: nothing to carry.
    let m = std::fs::metadata(&source).ok()?;
    Some(ShmRef { pid, what, path, dev: m.dev(), ino: m.ino(), nlink: m.nlink(), uid: m.uid(), mode: m.mode(), bytes: m.size(), source })
}

/// /dev/shm as process `pid` sees it, if it is what the design relies on:
/// root's, sticky and world-writable, a tmpfs. No kernel setting is asked
/// for (module docs).
fn shm_dir(pid: i32) -> Result<(OwnedFd, u64), ShmError> {
    let path = format!("/proc/{pid}/root{}", SHM_DIR.trim_end_matches('/'));
    let dir = nix::fcntl::open(path.as_str(), nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC, nix::sys::stat::Mode::empty())
        .map_err(|source| ShmError::OpenDir { pid, source })?;
    let st = nix::sys::stat::fstat(&dir).map_err(ShmError::StatDir)?;
    let fs = nix::sys::statfs::fstatfs(&dir).map_err(ShmError::StatDir)?;
    let problem = if st.st_uid != 0 {
        Some(DirProblem::NotRoot(st.st_uid))
    } else if st.st_mode & 0o1777 != 0o1777 {
        Some(DirProblem::Mode(st.st_mode & 0o7777))
    } else if fs.filesystem_type() != nix::sys::statfs::TMPFS_MAGIC {
        Some(DirProblem::NotTmpfs)
    } else {
        None
    };
    if let Some(p) = problem {
        return Err(ShmError::UnsafeDir(p));
    }
    Ok((dir, st.st_dev))
}

/// The directory's entries and their inodes (symlinks and all, not followed).
fn list(dir: &OwnedFd) -> Result<Vec<(String, u64)>, ShmError> {
    let listing = std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd())).map_err(ShmError::List)?;
    let mut out = Vec::new();
    for entry in listing.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let flags = nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW;
        if let Ok(st) = nix::sys::stat::fstatat(dir, name.as_str(), flags) {
            out.push((name, st.st_ino));
        }
    }
    Ok(out)
}

/// One step done as the user in /dev/shm.
enum Op {
    /// A new file (never over a name, never through a symlink) with this
    /// content and mode.
    Create { name: CString, mode: u32, content: Vec<u8> },
    Link { from: CString, to: CString },
    /// Removes `name` if it still is the inode `ino`; gone already is fine.
    Unlink { name: CString, ino: u64 },
}

fn cstr(name: &str) -> Result<CString, ShmError> {
    CString::new(name).map_err(|_| ShmError::Nul { name: name.to_string() })
}

/// In the child: one step; 0 or an errno.
fn run_op(dir: RawFd, op: &Op) -> i32 {
    // SAFETY: system calls on CStrings and buffers made before the fork.
    unsafe {
        match op {
            Op::Create { name, mode, content } => {
                let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
                let fd = libc::openat(dir, name.as_ptr(), flags, 0o600 as libc::c_uint);
                if fd < 0 {
                    return errno();
                }
                let mut done = 0usize;
                while done < content.len() {
                    let n = libc::write(fd, content[done..].as_ptr().cast(), content.len() - done);
                    if n <= 0 {
                        let e = errno();
                        libc::close(fd);
                        return e;
                    }
                    done += n as usize;
                }
                let rc = libc::fchmod(fd, *mode as libc::mode_t);
                let e = if rc != 0 { errno() } else { 0 };
                libc::close(fd);
                e
            }
            Op::Link { from, to } => {
                if libc::linkat(dir, from.as_ptr(), dir, to.as_ptr(), 0) != 0 {
                    return errno();
                }
                0
            }
            Op::Unlink { name, ino } => {
                let mut st: libc::stat = std::mem::zeroed();
                if libc::fstatat(dir, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) != 0 {
                    let e = errno();
                    return if e == libc::ENOENT { 0 } else { e };
                }
                // Someone else's file under that name now: not ours to remove.
                if st.st_ino != *ino {
                    return 0;
                }
                if libc::unlinkat(dir, name.as_ptr(), 0) != 0 && errno() != libc::ENOENT {
                    return errno();
                }
                0
            }
        }
    }
}

/// Runs `ops` as `who` in `dir`: up to the first failure when `stop` (its
/// index and errno), else all of them (the first failure is still named).
fn run_ops(dir: &OwnedFd, ops: &[Op], who: &Identity, stop: bool) -> Result<Option<(usize, i32)>, UserChildError> {
    if ops.is_empty() {
        return Ok(None);
    }
    let d = dir.as_raw_fd();
    let got = run_as_user(who, USER_BOUND, &[d], |w| {
        let mut first = None;
        for (i, op) in ops.iter().enumerate() {
            let e = run_op(d, op);
            if e != 0 && first.is_none() {
                first = Some((i as u32, e));
                if stop {
                    break;
                }
            }
        }
        if let Some((i, e)) = first {
            answer(w, i, e);
        }
    })?;
    Ok(got.map(|(i, e)| (i as usize, e)))
}

/// The name a step makes or removes.
fn op_target(op: &Op) -> &CString {
    match op {
        Op::Create { name, .. } | Op::Unlink { name, .. } => name,
        Op::Link { to, .. } => to,
    }
}

fn op_name(op: &Op) -> String {
    format!("{SHM_DIR}{}", op_target(op).to_string_lossy())
}

/// A dump's carried objects, between the stage and the end of CRIU's dump.
/// Dropped without [`Staged::save`] (a failed dump), the aliases it made are
/// removed and the files stay as they were.
pub struct Staged {
    dir: OwnedFd,
    who: Identity,
    objects: Vec<(Planned, File)>,
    armed: bool,
}

/// Finds what CRIU could not dump in the tree `pids` (see the module docs),
/// and makes the aliases CRIU will look up. `None` when there is nothing to
/// carry (the common case: one read of each process's maps and fds).
pub fn stage(pids: &[i32], root: i32, who: &Identity) -> Result<Option<Staged>, ShmError> {
    let refs = collect_refs(pids)?;
    if !refs.iter().any(|r| r.path.ends_with(DELETED) && r.nlink > 0) {
        return Ok(None);
    }
    let (dir, dev) = shm_dir(root)?;
    let planned = plan(&refs, dev, &list(&dir)?, who.uid)?;
    if planned.is_empty() {
        return Ok(None);
    }
    let mut objects = Vec::new();
    for p in planned {
        let file = File::open(&p.source).map_err(|source| ShmError::Source { path: p.source.clone(), source })?;
        // The tree's own descriptor or mapping, never a name in /dev/shm:
        // still the planned inode, a regular file of the user's on /dev/shm's
        // file system (the process may have replaced it since it was planned).
        let m = file.metadata().map_err(|source| ShmError::SourceStat { path: p.source.clone(), source })?;
        if (m.ino(), m.dev(), m.uid(), m.mode() & libc::S_IFMT) != (p.ino, dev, who.uid, libc::S_IFREG) {
            return Err(ShmError::Changed { path: p.source });
        }
        objects.push((p, file));
    }
    let mut ops = Vec::new();
    for (p, _) in &objects {
        for a in &p.aliases {
            ops.push(Op::Link { from: cstr(&p.names[0])?, to: cstr(a)? });
        }
    }
    let staged = Staged { dir, who: who.clone(), objects, armed: true };
    if let Some((i, e)) = run_ops(&staged.dir, &ops, who, true)? {
        // Drop removes the aliases made before the failure.
        return Err(ShmError::Link { name: op_name(&ops[i]), uid: who.uid, source: std::io::Error::from_raw_os_error(e) });
    }
    Ok(Some(staged))
}

impl Staged {
    /// After CRIU dumped the tree: each object's content into `run`
    /// (`shm-<n>.img`), then its names and aliases removed as the user.
    /// Returns what the manifest records, and a note if a name could not
    /// be removed (it then stays behind; the image is complete): `Stays`,
    /// or `Child` when the work as the user gave no answer.
    pub fn save(mut self, run: &Path) -> Result<(Vec<ShmObject>, Option<ShmError>), ShmError> {
        let mut out = Vec::new();
        for (i, (p, file)) in self.objects.iter().enumerate() {
            let image = format!("shm-{i}.img");
            let content = read_all(file, p.bytes).map_err(|source| ShmError::Content { name: p.names[0].clone(), source })?;
            let path = run.join(&image);
            // create_new: never over an existing file or through a symlink.
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .map_err(|source| ShmError::ImageWrite { path: path.clone(), source })?;
            std::io::Write::write_all(&mut f, &content).map_err(|source| ShmError::ImageWrite { path: path.clone(), source })?;
            let aliases = p.aliases.iter().chain(&p.existing_aliases).cloned().collect();
            out.push(ShmObject { names: p.names.clone(), aliases, mode: p.mode, bytes: content.len() as u64, image });
        }
        self.armed = false;
        let ops: Vec<Op> = self
            .objects
            .iter()
            .flat_map(|(p, _)| p.names.iter().chain(&p.aliases).chain(&p.existing_aliases).map(move |n| (n, p.ino)))
            .map(|(n, ino)| Ok(Op::Unlink { name: cstr(n)?, ino }))
            .collect::<Result<_, ShmError>>()?;
        let note = match run_ops(&self.dir, &ops, &self.who, false) {
            Ok(None) => None,
            Ok(Some((i, e))) => Some(ShmError::Stays { name: op_name(&ops[i]), source: std::io::Error::from_raw_os_error(e) }),
            Err(e) => Some(ShmError::Child(e)),
        };
        Ok((out, note))
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let ops: Vec<Op> = self
            .objects
            .iter()
            .flat_map(|(p, _)| p.aliases.iter().map(move |a| (a, p.ino)))
            .filter_map(|(a, ino)| Some(Op::Unlink { name: cstr(a).ok()?, ino }))
            .collect();
        let _ = run_ops(&self.dir, &ops, &self.who, false);
    }
}

fn read_all(file: &File, bytes: u64) -> std::io::Result<Vec<u8>> {
    let len = file.metadata()?.len().max(bytes);
    let mut buf = vec![0u8; len as usize];
    let mut done = 0;
    while done < buf.len() {
        let n = file.read_at(&mut buf[done..], done as u64)?;
        if n == 0 {
            break;
        }
        done += n;
    }
    buf.truncate(done);
    Ok(buf)
}

/// The objects of an image made again for a restore. Dropped without
/// [`Recreated::keep`] (a failed restore), every name made is removed.
pub struct Recreated {
    dir: OwnedFd,
    who: Identity,
    /// (name, inode) of everything made: names first, aliases (the names
    /// ending in ` (deleted)`) after.
    made: Vec<(String, u64)>,
    armed: bool,
}

/// Before CRIU's restore: the image's objects made again in /dev/shm of
/// process `pid` (the job's new run), as the user. A name that exists
/// refuses the restore (something made it since the checkpoint), with
/// nothing left behind.
pub fn recreate(objects: &[ShmObject], run: &Path, pid: i32, who: &Identity) -> Result<Option<Recreated>, ShmError> {
    if objects.is_empty() {
        return Ok(None);
    }
    let (dir, _) = shm_dir(pid)?;
    let run_fd = crate::fsutil::open_dir_nofollow(run).map_err(|source| ShmError::RunDir { path: run.to_path_buf(), source })?;
    let mut ops = Vec::new();
    for o in objects {
        if o.names.is_empty() || !o.names.iter().chain(&o.aliases).all(|n| valid_name(n)) || !valid_name(&o.image) {
            return Err(ShmError::CorruptObject { names: o.names.clone() });
        }
        let content = read_image(&run_fd, &o.image, o.bytes).map_err(|source| ShmError::ImageRead { image: o.image.clone(), source })?;
        ops.push(Op::Create { name: cstr(&o.names[0])?, mode: o.mode & 0o7777, content });
        for n in o.names[1..].iter().chain(&o.aliases) {
            ops.push(Op::Link { from: cstr(&o.names[0])?, to: cstr(n)? });
        }
    }
    let mut done = Recreated { dir, who: who.clone(), made: vec![], armed: true };
    let failed = run_ops(&done.dir, &ops, who, true)?;
    let made = failed.map_or(ops.len(), |(i, _)| i);
    for op in &ops[..made] {
        let name = op_target(op).to_string_lossy().into_owned();
        let flags = nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW;
        let ino = nix::sys::stat::fstatat(&done.dir, name.as_str(), flags).map(|s| s.st_ino).unwrap_or(0);
        done.made.push((name, ino));
    }
    if let Some((i, e)) = failed {
        // Drop removes what was made.
        return Err(ShmError::Remake { name: op_name(&ops[i]), uid: who.uid, source: std::io::Error::from_raw_os_error(e) });
    }
    Ok(Some(done))
}

fn read_image(dir: &OwnedFd, name: &str, bytes: u64) -> std::io::Result<Vec<u8>> {
    use nix::fcntl::{openat, OFlag};
    let fd = openat(dir, name, OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, nix::sys::stat::Mode::empty())?;
    let content = read_all(&File::from(fd), bytes)?;
    if content.len() as u64 != bytes {
        return Err(std::io::Error::other(format!("has {} bytes, the manifest says {bytes}", content.len())));
    }
    Ok(content)
}

impl Recreated {
    /// After a restore that worked: the names stay (the restored processes
    /// use them), the aliases go.
    pub fn keep(mut self) {
        self.armed = false;
        self.remove(true);
    }

    fn remove(&self, aliases_only: bool) {
        let ops: Vec<Op> = self
            .made
            .iter()
            .filter(|(n, _)| n.ends_with(DELETED) || !aliases_only)
            .filter_map(|(n, ino)| Some(Op::Unlink { name: cstr(n).ok()?, ino: *ino }))
            .collect();
        let _ = run_ops(&self.dir, &ops, &self.who, false);
    }
}

impl Drop for Recreated {
    fn drop(&mut self) {
        if self.armed {
            self.remove(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process of the tree that ended since it was listed holds nothing
    /// to carry: not an error (a shell's short-lived `sleep` failed whole
    /// checkpoints with "cannot read pid P's mappings").
    #[test]
    fn a_process_that_ended_since_the_listing_is_skipped() {
        let mut child = std::process::Command::new("/bin/true").spawn().unwrap();
        let gone = child.id() as i32;
        child.wait().unwrap();
        assert!(collect_refs(&[gone]).unwrap().is_empty());
    }

    fn r(pid: i32, path: &str, ino: u64, nlink: u64, uid: u32) -> ShmRef {
        ShmRef {
            pid,
            what: format!("mapping {ino:x}"),
            path: path.into(),
            dev: 7,
            ino,
            nlink,
            uid,
            mode: libc::S_IFREG | 0o600,
            bytes: 32,
            source: format!("/proc/{pid}/map_files/{ino:x}"),
        }
    }

    fn e(list: &[(&str, u64)]) -> Vec<(String, u64)> {
        list.iter().map(|(n, i)| (n.to_string(), *i)).collect()
    }

    /// Made again as the user in this process's /dev/shm: content, mode,
    /// every name and alias; `keep` removes the aliases only. A name that
    /// exists refuses, and what was made before it goes again.
    #[test]
    fn a_restore_makes_the_names_again_as_the_user_and_never_over_an_existing_one() {
        if !gpu_mode_testkit::root_or_skip("files made as another user") {
            return;
        }
        let who = Identity { uid: 65534, gid: 65534, groups: vec![65534] };
        let run = tempfile::tempdir().unwrap();
        std::fs::write(run.path().join("shm-0.img"), b"semaphore").unwrap();
        let tag = format!("gmtest-shm-{}", std::process::id());
        let (name, other, alias) = (format!("sem.{tag}-a"), format!("sem.{tag}-b"), format!("sem.{tag}-t (deleted)"));
        let object = ShmObject { names: vec![name.clone(), other.clone()], aliases: vec![alias.clone()], mode: 0o640, bytes: 9, image: "shm-0.img".into() };
        let at = |n: &str| Path::new("/dev/shm").join(n);
        let me = std::process::id() as i32;

        let made = recreate(std::slice::from_ref(&object), run.path(), me, &who).unwrap().unwrap();
        let m = std::fs::symlink_metadata(at(&name)).unwrap();
        assert_eq!((m.uid(), m.mode() & 0o7777, m.nlink()), (65534, 0o640, 3), "made by the user, with its mode, three names");
        assert_eq!(std::fs::read(at(&other)).unwrap(), b"semaphore");
        made.keep();
        assert!(at(&name).exists() && at(&other).exists() && !at(&alias).exists(), "the names stay, the alias goes");

        // The first name exists now: refused, and nothing else is made.
        let err = recreate(std::slice::from_ref(&object), run.path(), me, &who).err().unwrap();
        assert!(matches!(&err, ShmError::Remake { source, .. } if source.raw_os_error() == Some(libc::EEXIST)), "{err:?}");
        let err = err.to_string();
        assert!(err.contains(&name) && err.contains("exists"), "{err}");
        assert!(!at(&alias).exists());
        std::fs::remove_file(at(&name)).unwrap();
        // The second exists: the first, made before the failure, goes again.
        let err = recreate(std::slice::from_ref(&object), run.path(), me, &who).err().unwrap().to_string();
        assert!(err.contains(&other) && err.contains("nothing was restored"), "{err}");
        assert!(!at(&name).exists(), "what was made before the refusal is removed");
        std::fs::remove_file(at(&other)).unwrap();

        // A manifest whose name would leave /dev/shm is corrupt.
        let bad = ShmObject { names: vec!["../etc/x".into()], ..object };
        let err = recreate(&[bad], run.path(), me, &who).err().unwrap();
        assert!(matches!(err, ShmError::CorruptObject { .. }) && err.to_string().contains("corrupt"), "{err:?}");
    }

    /// The job's user, in /dev/shm, through a shell (`nobody`).
    fn as_nobody(script: &str) -> std::process::Command {
        use std::os::unix::process::CommandExt;
        let mut c = std::process::Command::new("/bin/sh");
        c.arg("-c").arg(script).current_dir("/dev/shm").uid(65534).gid(65534);
        c
    }

    /// Sets a file's access time to 1970 (a read moves it past its mtime again).
    fn old_atime(path: &Path) {
        let p = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        let times = [libc::timespec { tv_sec: 1, tv_nsec: 0 }, libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT }];
        // SAFETY: a path and two timespecs we own.
        assert_eq!(unsafe { libc::utimensat(libc::AT_FDCWD, p.as_ptr(), times.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) }, 0);
    }

    /// Removes the test's names in /dev/shm, also when an assertion fails.
    struct Names(Vec<PathBuf>);
    impl Drop for Names {
        fn drop(&mut self) {
            for p in &self.0 {
                let _ = std::fs::remove_file(p);
            }
        }
    }

    struct Job(std::process::Child);
    impl Drop for Job {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// Issue 37: no kernel setting is a prerequisite. With
    /// `fs.protected_symlinks` and `fs.protected_hardlinks` off (run this
    /// test with both at 0: it does not read them), the job's user plants
    /// symlinks to a root file (`/etc/passwd`'s stand-in) and, where the
    /// hard-link protection is off, hard links to root's own file in
    /// /dev/shm, under every name the agent uses, at each step: before the
    /// stage, between the stage and the save, before and after the restore's
    /// remaking. Every step is refused or leaves the planted name alone, the
    /// image holds the job's own bytes, and root's files are not read (their
    /// access time stays in 1970), changed nor removed.
    #[test]
    fn links_the_user_plants_in_dev_shm_never_lead_root_to_its_own_files() {
        if !gpu_mode_testkit::root_or_skip("files made as another user") {
            return;
        }
        let who = Identity { uid: 65534, gid: 65534, groups: vec![65534] };
        let tag = format!("gmtest-shmh-{}", std::process::id());
        let (held, name, alias) = (format!("sem.{tag}-t"), format!("sem.{tag}"), format!("sem.{tag}-t (deleted)"));
        let at = |n: &str| Path::new("/dev/shm").join(n);
        let etc = tempfile::tempdir().unwrap();
        std::fs::set_permissions(etc.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let passwd = etc.path().join("passwd");
        let secret = at(&format!("{tag}-root"));
        let _names = Names(vec![at(&held), at(&name), at(&alias), secret.clone(), at(&format!("{tag}-probe"))]);
        let roots: [(&Path, &[u8], u32); 2] = [(&passwd, b"root:x:0:0:root:/root:/bin/sh\n", 0o644), (&secret, b"root's own", 0o600)];
        for (path, content, mode) in roots {
            std::fs::write(path, content).unwrap();
            std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap();
            old_atime(path);
        }
        let mtimes: Vec<i64> = roots.iter().map(|(p, ..)| std::fs::metadata(p).unwrap().mtime_nsec()).collect();
        // A hard link to root's file where the kernel lets the user make one,
        // else a symlink to it.
        let (p, s) = (passwd.display().to_string(), secret.display().to_string());
        let to_root = |n: &str| format!("{{ ln '{s}' '{n}' 2>/dev/null || ln -s '{s}' '{n}'; }}");
        let plant = |script: &str| assert!(as_nobody(script).status().unwrap().success(), "as the user: {script}");
        let clear = |names: &[&str]| {
            for n in names {
                let _ = std::fs::remove_file(at(n));
            }
        };
        let hard = as_nobody(&format!("ln '{s}' '{tag}-probe'")).status().unwrap().success();
        clear(&[&format!("{tag}-probe")]);
        let knobs = ["protected_symlinks", "protected_hardlinks"].map(|k| std::fs::read_to_string(format!("/proc/sys/fs/{k}")).unwrap_or_default());
        eprintln!("fs.protected_symlinks={} fs.protected_hardlinks={}: hard links to root's file: {hard}", knobs[0].trim(), knobs[1].trim());

        // The job: a semaphore held through its deleted temporary name.
        let mut child = as_nobody(&format!(
            "umask 077 && printf semaphore > '{held}' && ln '{held}' '{name}' && exec 3<>'{held}' && rm '{held}' && echo ready && exec sleep 60"
        ))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
        let job = Job(child);
        assert_eq!(line, "ready\n");
        let pid = job.0.id() as i32;

        // Before the stage, the alias CRIU would look up is the user's link to root's files.
        for planted in [format!("ln -s '{p}' '{alias}'"), to_root(&alias)] {
            plant(&planted);
            let err = stage(&[pid], pid, &who).err().unwrap();
            assert!(matches!(err, ShmError::AliasTaken { .. }), "{planted}: {err:?}");
            clear(&[&alias]);
        }

        // Staged; then the user swaps both names for links to root's files.
        let staged = stage(&[pid], pid, &who).unwrap().unwrap();
        plant(&format!("rm '{name}' '{alias}' && ln -s '{p}' '{name}' && {}", to_root(&alias)));
        let run = tempfile::tempdir().unwrap();
        let (objects, note) = staged.save(run.path()).unwrap();
        assert!(note.is_none(), "{note:?}");
        assert_eq!((objects.len(), &objects[0].names, &objects[0].aliases), (1, &vec![name.clone()], &vec![alias.clone()]));
        assert_eq!(std::fs::read(run.path().join(&objects[0].image)).unwrap(), b"semaphore", "the job's bytes, from its descriptor");
        assert!(std::fs::symlink_metadata(at(&name)).unwrap().file_type().is_symlink(), "the user's planted names are not removed");
        assert!(std::fs::symlink_metadata(at(&alias)).is_ok());
        clear(&[&name, &alias]);
        drop(job);

        // Before the restore, the names to make are the user's links to root's files.
        let me = std::process::id() as i32;
        for planted in [format!("ln -s '{p}' '{name}'"), to_root(&name), format!("ln -s '{p}' '{alias}'"), to_root(&alias)] {
            plant(&planted);
            let err = recreate(&objects, run.path(), me, &who).err().unwrap();
            assert!(matches!(&err, ShmError::Remake { source, .. } if source.raw_os_error() == Some(libc::EEXIST)), "{planted}: {err:?}");
            let planted_at = if planted.contains(&format!("'{name}'")) { &name } else { &alias };
            assert!(std::fs::symlink_metadata(at(planted_at)).is_ok(), "{planted}: the planted name stays");
            if planted_at == &alias {
                assert!(std::fs::symlink_metadata(at(&name)).is_err(), "what was made before the refusal is removed");
            }
            clear(&[&name, &alias]);
        }

        // Remade; then swapped before a failed restore removes everything it made.
        let made = recreate(&objects, run.path(), me, &who).unwrap().unwrap();
        plant(&format!("rm '{name}' '{alias}' && ln -s '{p}' '{name}' && {}", to_root(&alias)));
        drop(made);
        assert!(std::fs::symlink_metadata(at(&name)).is_ok() && std::fs::symlink_metadata(at(&alias)).is_ok(), "the user's links stay");
        clear(&[&name, &alias]);

        // Root's files: not read, changed nor removed.
        for ((path, content, mode), mtime) in roots.iter().zip(&mtimes) {
            let m = std::fs::symlink_metadata(path).unwrap();
            assert_eq!((m.uid(), m.mode() & 0o7777, m.nlink(), m.mtime_nsec()), (0, *mode, 1, *mtime), "{}", path.display());
            assert_eq!(m.atime(), 1, "{} was read", path.display());
            assert_eq!(std::fs::read(path).unwrap(), *content, "{}", path.display());
            if std::fs::metadata(path).unwrap().atime() == 1 {
                eprintln!("{}: a read does not move its access time here: 'not read' was not shown", path.display());
            }
        }
    }

    #[test]
    fn names_directly_in_dev_shm_only() {
        let table: &[(&str, Option<(&str, bool)>)] = &[
            ("/dev/shm/sem.mp-1", Some(("sem.mp-1", false))),
            ("/dev/shm/sem.Ab12 (deleted)", Some(("sem.Ab12", true))),
            ("/dev/shm/a b (deleted)", Some(("a b", true))),
            ("/dev/shm/dir/sem.x (deleted)", None),
            ("/dev/shm/", None),
            ("/dev/shm/.. (deleted)", None),
            ("/tmp/dev/shm/x", None),
            ("/dev/shmx", None),
        ];
        for (path, want) in table {
            assert_eq!(shm_name(path), *want, "{path}");
        }
    }

    #[test]
    fn a_deleted_but_named_semaphore_is_carried_with_all_its_names() {
        // The creator maps the temporary name, a worker the final one.
        let refs = [r(10, "/dev/shm/sem.Ab12 (deleted)", 5, 1, 1000), r(11, "/dev/shm/sem.mp-x", 5, 1, 1000)];
        let got = plan(&refs, 7, &e(&[("sem.mp-x", 5), ("other", 6)]), 1000).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].names, ["sem.mp-x"]);
        assert_eq!(got[0].aliases, ["sem.Ab12 (deleted)"]);
        assert_eq!((got[0].mode, got[0].bytes), (0o600, 32));
    }

    #[test]
    fn what_criu_handles_itself_is_left_to_it() {
        let table: &[(&str, ShmRef)] = &[
            ("no name left: CRIU's ghost file", r(10, "/dev/shm/torch_1 (deleted)", 5, 0, 1000)),
            ("not deleted: dumped by path", r(10, "/dev/shm/sem.mp-x", 5, 1, 1000)),
            ("another file system", ShmRef { dev: 8, ..r(10, "/dev/shm/x (deleted)", 5, 1, 1000) }),
            ("not a regular file", ShmRef { mode: libc::S_IFDIR | 0o700, ..r(10, "/dev/shm/x (deleted)", 5, 1, 1000) }),
            ("not in /dev/shm", r(10, "/home/u/x (deleted)", 5, 1, 1000)),
        ];
        for (why, one) in table {
            assert_eq!(plan(std::slice::from_ref(one), 7, &e(&[("sem.mp-x", 5), ("x", 5)]), 1000).unwrap(), vec![], "{why}");
        }
    }

    #[test]
    fn what_cannot_be_carried_is_refused_by_name() {
        let table: &[(&str, Vec<ShmRef>, Vec<(String, u64)>, &str)] = &[
            ("another user's", vec![r(10, "/dev/shm/s (deleted)", 5, 1, 1001)], e(&[("t", 5)]), "a file of uid 1001"),
            ("a name outside /dev/shm", vec![r(10, "/dev/shm/s (deleted)", 5, 2, 1000)], e(&[("t", 5)]), "2 name(s)"),
            ("the alias taken by another file", vec![r(10, "/dev/shm/s (deleted)", 5, 1, 1000)], e(&[("t", 5), ("s (deleted)", 9)]), "is another file"),
        ];
        for (why, refs, entries, needle) in table {
            let err = plan(refs, 7, entries, 1000).unwrap_err().to_string();
            assert!(err.contains(needle) && err.contains("pid 10"), "{why}: {err}");
        }
    }

    /// Each refusal by kind, with the words the agent has always given.
    #[test]
    fn each_shm_error_is_its_kind_with_todays_words() {
        let refs = |uid, nlink| vec![r(10, "/dev/shm/s (deleted)", 5, nlink, uid)];
        let planned = [
            (plan(&refs(1001, 1), 7, &e(&[("t", 5)]), 1000).unwrap_err(), "ForeignFile"),
            (plan(&refs(1000, 2), 7, &e(&[("t", 5)]), 1000).unwrap_err(), "NamesElsewhere"),
            (plan(&refs(1000, 1), 7, &e(&[("t", 5), ("s (deleted)", 9)]), 1000).unwrap_err(), "AliasTaken"),
        ];
        for (err, kind) in &planned {
            let got = match err {
                ShmError::ForeignFile { .. } => "ForeignFile",
                ShmError::NamesElsewhere { .. } => "NamesElsewhere",
                ShmError::AliasTaken { .. } => "AliasTaken",
                _ => "another",
            };
            assert_eq!(got, *kind, "{err}");
        }
        let os = |errno| std::io::Error::from_raw_os_error(errno);
        let table: Vec<(ShmError, &str)> = vec![
            (
                planned.into_iter().next().map(|(e, _)| e).unwrap(),
                "pid 10 holds /dev/shm/s (deleted) (mapping 5), a file of uid 1001 that was deleted under this name but still has another: \
                 only the job's own such files are carried in the image: refused",
            ),
            (
                ShmError::NamesElsewhere { pid: 10, path: "/dev/shm/s (deleted)".into(), what: "fd 3".into(), nlink: 2, found: 1 },
                "pid 10 holds /dev/shm/s (deleted) (fd 3), deleted under this name, whose 2 name(s) are not all in /dev/shm/ (1 found): \
                 CRIU cannot dump it without --link-remap: refused",
            ),
            (
                ShmError::AliasTaken { pid: 10, path: "/dev/shm/s (deleted)".into(), what: "fd 3".into(), alias: "s (deleted)".into() },
                "pid 10 holds /dev/shm/s (deleted) (fd 3), and /dev/shm/s (deleted) is another file: refused",
            ),
            (ShmError::Mappings { pid: 12, source: os(libc::ESRCH) }, "cannot read pid 12's mappings: No such process (os error 3)"),
            (ShmError::OpenDir { pid: 12, source: nix::errno::Errno::ENOENT }, "cannot open /dev/shm/ of pid 12: ENOENT: No such file or directory"),
            (ShmError::StatDir(nix::errno::Errno::EIO), "/dev/shm/: EIO: I/O error"),
            (ShmError::UnsafeDir(DirProblem::NotRoot(1000)), "/dev/shm/ belongs to uid 1000, not root: the job's semaphores there cannot be carried safely: refused"),
            (ShmError::UnsafeDir(DirProblem::Mode(0o755)), "/dev/shm/ has mode 755, not 1777: the job's semaphores there cannot be carried safely: refused"),
            (ShmError::UnsafeDir(DirProblem::NotTmpfs), "/dev/shm/ is not a tmpfs: the job's semaphores there cannot be carried safely: refused"),
            (ShmError::List(os(libc::EACCES)), "cannot list /dev/shm/: Permission denied (os error 13)"),
            (cstr("a\0b").unwrap_err(), "\"a\\0b\": NUL in a name"),
            (ShmError::Child(UserChildError::Timeout { bound: USER_BOUND }), "the work as the job's user did not finish within 10 s"),
            (ShmError::Source { path: "/proc/10/fd/3".into(), source: os(libc::ENOENT) }, "cannot read /proc/10/fd/3: No such file or directory (os error 2)"),
            (ShmError::SourceStat { path: "/proc/10/fd/3".into(), source: os(libc::EIO) }, "/proc/10/fd/3: Input/output error (os error 5)"),
            (ShmError::Changed { path: "/proc/10/fd/3".into() }, "/proc/10/fd/3 changed while it was looked at: refused"),
            (
                ShmError::Link { name: "/dev/shm/s (deleted)".into(), uid: 1000, source: os(libc::EPERM) },
                "cannot link /dev/shm/s (deleted) as uid 1000: Operation not permitted (os error 1): refused",
            ),
            (ShmError::Content { name: "sem.mp-x".into(), source: os(libc::EIO) }, "cannot read /dev/shm/sem.mp-x: Input/output error (os error 5)"),
            (ShmError::ImageWrite { path: "/run/j/shm-0.img".into(), source: os(libc::EEXIST) }, "/run/j/shm-0.img: File exists (os error 17)"),
            (ShmError::Stays { name: "/dev/shm/sem.mp-x".into(), source: os(libc::EPERM) }, "/dev/shm/sem.mp-x stays: Operation not permitted (os error 1)"),
            (ShmError::RunDir { path: "/run/j".into(), source: os(libc::ENOTDIR) }, "/run/j: Not a directory (os error 20)"),
            (ShmError::CorruptObject { names: vec!["../etc/x".into()] }, "the manifest's /dev/shm object [\"../etc/x\"] is not valid: corrupt"),
            (ShmError::ImageRead { image: "shm-0.img".into(), source: os(libc::ENOENT) }, "image file shm-0.img: No such file or directory (os error 2)"),
            (
                ShmError::Remake { name: "/dev/shm/sem.mp-x".into(), uid: 1000, source: os(libc::EEXIST) },
                "cannot make /dev/shm/sem.mp-x again as uid 1000: it exists (made since the checkpoint): nothing was restored",
            ),
            (
                ShmError::Remake { name: "/dev/shm/sem.mp-x".into(), uid: 1000, source: os(libc::ENOSPC) },
                "cannot make /dev/shm/sem.mp-x again as uid 1000: No space left on device (os error 28): nothing was restored",
            ),
        ];
        for (err, text) in table {
            assert_eq!(err.to_string(), text, "{err:?}");
        }
    }

    #[test]
    fn an_alias_left_by_an_earlier_attempt_is_reused_and_one_per_name() {
        let refs = [r(10, "/dev/shm/s (deleted)", 5, 2, 1000), r(10, "/dev/shm/s (deleted)", 5, 2, 1000), r(12, "/dev/shm/u (deleted)", 5, 2, 1000)];
        let got = plan(&refs, 7, &e(&[("t", 5), ("s (deleted)", 5)]), 1000).unwrap();
        assert_eq!(got[0].existing_aliases, ["s (deleted)"]);
        assert_eq!(got[0].aliases, ["u (deleted)"]);
    }
}
