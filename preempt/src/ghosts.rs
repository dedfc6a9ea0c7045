//! The deleted files a tree holds, which CRIU copies into the image as
//! "ghost" files, by what they cost (issue 37 N5, issue 38).
//!
//! * **Unlinked /dev/shm files** (a regular file of /dev/shm's tmpfs with
//!   no name left): their pages are memory, charged to the job's memory
//!   cgroup like the rest of its memory, so carrying them whole keeps the
//!   image bounded by the job's memory. NCCL makes such buffers (34 MB each
//!   on 2×H200, even with its SHM transport off), which a 1 MiB
//!   `--ghost-limit` refused: CRIU's limit for a dump is raised to the
//!   largest of them, and the image's bound grows by their total.
//! * **Other deleted files** (a disk's, or any file system's but
//!   /dev/shm's): their blocks are not the job's memory. At most
//!   `preempt.max_deleted_files` of them, each at most
//!   `preempt.ghost_limit_mib` of blocks: a tree past either is refused
//!   before anything is locked (CRIU would have failed on a file past the
//!   limit, after the driver's lock).
//!
//! /dev/shm files that still have a name are shm.rs's (it links and carries
//! them itself); anonymous shared memory (`MAP_SHARED|MAP_ANONYMOUS`, which
//! /proc shows as `/dev/zero (deleted)`; SysV segments, `/SYSV... (deleted)`;
//! memfds) is CRIU's shared-memory kind, dumped as memory, not as files
//! (seen on 2×H200: a DDP rank maps a dozen `/dev/zero (deleted)` regions
//! of 2-10 MiB, which the first version of this module refused as deleted
//! files past the limit). None of them is counted here.
//! Sizes are allocated blocks (`st_blocks`), what CRIU compares with its
//! limit and what a sparse file's image takes (CRIU copies only data).

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;

/// Where the job's POSIX shared memory lives.
const SHM_DIR: &str = "/dev/shm/";
/// The suffix /proc gives the path of a file with no name left.
const DELETED: &str = " (deleted)";

/// What kind of ghost a deleted file held by the tree is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An unlinked file of /dev/shm's tmpfs: memory.
    Shm,
    /// Any other deleted regular file: not memory.
    Disk,
}

/// One file as /proc shows it (the path of the link or mapping) and as its
/// inode says (`None` fields: the inode could not be read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen<'a> {
    pub path: &'a str,
    pub is_file: bool,
    pub nlink: Option<u64>,
    pub dev: Option<u64>,
}

/// The kind of a deleted file, or `None` for what CRIU does not carry as a
/// ghost (anonymous shared memory, a memfd, a socket, a file with a name)
/// or shm.rs carries (a /dev/shm file that still has a name). `devs`: the
/// devices of /dev/shm and of the kernel's internal shared-memory mount.
pub fn kind(seen: &Seen, devs: Devices) -> Option<Kind> {
    if !seen.path.starts_with('/') || !seen.path.ends_with(DELETED) || !seen.is_file || is_anonymous_shared(seen, devs.anon) {
        return None;
    }
    let shm_dev = devs.shm;
    if !seen.path.starts_with(SHM_DIR) {
        return Some(Kind::Disk);
    }
    // A name left: shm.rs's; unknown: left to CRIU's own limit (not raised for it).
    let on_shm = shm_dev.is_some() && seen.dev == shm_dev;
    match seen.nlink {
        Some(0) if on_shm => Some(Kind::Shm),
        Some(0) => Some(Kind::Disk),
        _ => None,
    }
}

/// The devices that tell files apart: /dev/shm's tmpfs, and the kernel's
/// internal mount of anonymous shared memory (what CRIU itself compares
/// with, learnt as CRIU learns it: from a mapping of its own).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Devices {
    pub shm: Option<u64>,
    pub anon: Option<u64>,
}

impl Devices {
    /// This node's.
    pub fn here() -> Devices {
        Devices { shm: std::fs::metadata(SHM_DIR).ok().map(|m| m.dev()), anon: anonymous_shared_dev() }
    }
}

/// Anonymous shared memory: on the kernel's internal mount (when it is
/// known), or named as the kernel names it (when the inode is unreadable).
fn is_anonymous_shared(seen: &Seen, anon: Option<u64>) -> bool {
    if anon.is_some() && seen.dev.is_some() {
        return seen.dev == anon;
    }
    seen.path == "/dev/zero (deleted)" || seen.path.starts_with("/SYSV") || seen.path.starts_with("/memfd:")
}

/// The device of the kernel's internal shared-memory mount: that of a
/// shared anonymous mapping of this process's own, read through
/// map_files (root's; `None` where it cannot be read).
fn anonymous_shared_dev() -> Option<u64> {
    const LEN: usize = 4096;
    // SAFETY: a fresh shared anonymous mapping, unmapped below.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), LEN, libc::PROT_READ, libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1, 0) };
    if p == libc::MAP_FAILED {
        return None;
    }
    let start = p as usize;
    let dev = std::fs::metadata(format!("/proc/self/map_files/{start:x}-{:x}", start + LEN)).ok().map(|m| m.dev());
    // SAFETY: unmaps the mapping made above.
    unsafe { libc::munmap(p, LEN) };
    dev
}

/// One ghost: a process that holds it, the path /proc shows and its
/// allocated bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ghost {
    pub pid: i32,
    pub path: String,
    pub bytes: u64,
}

/// A tree's ghosts, each file once (by device and inode).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Ghosts {
    pub shm: BTreeMap<(u64, u64), Ghost>,
    pub disk: BTreeMap<(u64, u64), Ghost>,
}

impl Ghosts {
    /// The ghosts of `pids`, from their descriptors (`/proc/<pid>/fd`) and
    /// mappings (`/proc/<pid>/map_files`, root's), each inode read through
    /// the process's own reference, never by a name.
    pub fn survey(pids: &[i32]) -> Ghosts {
        let devs = Devices::here();
        let mut out = Ghosts::default();
        for &pid in pids {
            let fd_dir = format!("/proc/{pid}/fd");
            for (fd, link) in crate::procfs::fd_links(std::path::Path::new(&fd_dir)).unwrap_or_default() {
                out.note(pid, &link, std::fs::metadata(format!("{fd_dir}/{fd}")).ok(), devs);
            }
            let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
            for (range, path) in mapped_paths(&maps) {
                out.note(pid, path, std::fs::metadata(format!("/proc/{pid}/map_files/{range}")).ok(), devs);
            }
        }
        out
    }

    fn note(&mut self, pid: i32, path: &str, meta: Option<std::fs::Metadata>, devs: Devices) {
        let seen = Seen { path, is_file: meta.as_ref().is_none_or(|m| m.is_file()), nlink: meta.as_ref().map(|m| m.nlink()), dev: meta.as_ref().map(|m| m.dev()) };
        let Some(kind) = kind(&seen, devs) else { return };
        // Unreadable (no map_files here): counted, of unknown size, under
        // its path (no inode to tell two apart).
        let (key, bytes) = meta.map_or(((u64::MAX, hash(path)), 0), |m| ((m.dev(), m.ino()), m.blocks() * 512));
        let map = if kind == Kind::Shm { &mut self.shm } else { &mut self.disk };
        map.entry(key).or_insert_with(|| Ghost { pid, path: path.to_string(), bytes });
    }

    /// The largest unlinked /dev/shm file's bytes.
    pub fn shm_largest(&self) -> u64 {
        self.shm.values().map(|g| g.bytes).max().unwrap_or(0)
    }

    /// All unlinked /dev/shm files' bytes.
    pub fn shm_total(&self) -> u64 {
        self.shm.values().map(|g| g.bytes).sum()
    }

    /// CRIU's `--ghost-limit` for this tree's dump: the site's, or the
    /// largest unlinked /dev/shm file where that is more (those are the
    /// job's memory; every other file was checked against the site's limit
    /// by [`Ghosts::over_limits`]).
    pub fn ghost_limit(&self, site_limit: u64) -> u64 {
        site_limit.max(self.shm_largest())
    }

    /// The first limit the other deleted files break: more of them than
    /// `max_count`, or one of more than `limit` bytes.
    pub fn over_limits(&self, max_count: usize, limit: u64) -> Option<OverLimit> {
        if self.disk.len() > max_count {
            let first = self.disk.values().next()?.clone();
            return Some(OverLimit::Count { first, count: self.disk.len() });
        }
        self.disk.values().find(|g| g.bytes > limit).map(|g| OverLimit::Size(g.clone()))
    }
}

/// Which limit a tree's deleted files break.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OverLimit {
    Count { first: Ghost, count: usize },
    Size(Ghost),
}

/// The mapped files of a maps text that have a path: (the range as
/// map_files names it, the path).
fn mapped_paths(maps: &str) -> Vec<(&str, &str)> {
    maps.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.splitn(6, ' ').collect();
            let path = f.get(5)?.trim_start();
            f.get(4)?.parse::<u64>().ok().filter(|i| *i != 0)?;
            Some((f[0], path))
        })
        .collect()
}

/// A stand-in key for a file whose inode could not be read.
fn hash(path: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    path.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Path × inode facts → kind.
    #[test]
    fn a_deleted_file_is_memory_only_when_unlinked_on_dev_shms_tmpfs() {
        let devs = Devices { shm: Some(21), anon: Some(1) };
        let seen = |path, is_file, nlink, dev| Seen { path, is_file, nlink, dev };
        let table = [
            (seen("/dev/shm/nccl-Ab12 (deleted)", true, Some(0), Some(21)), Some(Kind::Shm)),
            // Still named (glibc's semaphores): shm.rs carries it.
            (seen("/dev/shm/sem.x (deleted)", true, Some(1), Some(21)), None),
            // A path that reads /dev/shm on another file system: not memory.
            (seen("/dev/shm/x (deleted)", true, Some(0), Some(7)), Some(Kind::Disk)),
            // Unreadable inode: left to CRIU's own limit.
            (seen("/dev/shm/x (deleted)", true, None, None), None),
            (seen("/tmp/ckpt.tmp (deleted)", true, Some(0), Some(7)), Some(Kind::Disk)),
            (seen("/tmp/lib.so (deleted)", true, None, None), Some(Kind::Disk)),
            (seen("/memfd:cuda (deleted)", true, Some(0), Some(1)), None),
            // Anonymous shared memory (MAP_SHARED|MAP_ANONYMOUS, SysV): CRIU's shmem, by device...
            (seen("/dev/zero (deleted)", true, Some(0), Some(1)), None),
            (seen("/SYSV00000000 (deleted)", true, Some(0), Some(1)), None),
            // ... or, the inode unreadable, by the kernel's names for it.
            (seen("/dev/zero (deleted)", true, None, None), None),
            (seen("/SYSV0000002a (deleted)", true, None, None), None),
            (seen("/tmp/x", true, Some(1), Some(7)), None),
            (seen("socket:[12] (deleted)", false, Some(1), Some(8)), None),
            (seen("/tmp/dir (deleted)", false, Some(0), Some(7)), None),
        ];
        for (s, want) in table {
            assert_eq!(kind(&s, devs), want, "{s:?}");
        }
    }

    fn ghost(pid: i32, path: &str, bytes: u64) -> Ghost {
        Ghost { pid, path: path.into(), bytes }
    }

    #[test]
    fn limits_apply_to_other_deleted_files_and_the_dump_limit_follows_shm() {
        let mut g = Ghosts::default();
        g.shm.insert((21, 1), ghost(5, "/dev/shm/nccl-a (deleted)", 34 << 20));
        g.shm.insert((21, 2), ghost(6, "/dev/shm/nccl-b (deleted)", 8 << 20));
        g.disk.insert((7, 1), ghost(5, "/tmp/a (deleted)", 4096));
        assert_eq!((g.shm_largest(), g.shm_total()), (34 << 20, 42 << 20));
        assert_eq!(g.ghost_limit(1 << 20), 34 << 20);
        assert_eq!(g.ghost_limit(64 << 20), 64 << 20);
        assert_eq!(g.over_limits(64, 1 << 20), None, "the /dev/shm buffers are not the disk's files");
        assert_eq!(g.over_limits(0, 1 << 20), Some(OverLimit::Count { first: ghost(5, "/tmp/a (deleted)", 4096), count: 1 }));
        g.disk.insert((7, 2), ghost(6, "/tmp/big (deleted)", 2 << 20));
        assert_eq!(g.over_limits(64, 1 << 20), Some(OverLimit::Size(ghost(6, "/tmp/big (deleted)", 2 << 20))));
        assert_eq!(Ghosts::default().ghost_limit(1 << 20), 1 << 20);
    }

    /// The test process holds an unlinked /dev/shm file of 3 MiB (open and
    /// mapped: counted once) and a deleted /tmp file of 2 MiB.
    #[test]
    fn a_survey_of_real_files_sorts_and_sizes_them() {
        if !std::path::Path::new(SHM_DIR).is_dir() {
            return gpu_mode_testkit::skipped(&gpu_mode_testkit::this_test(), "no /dev/shm here");
        }
        let me = std::process::id() as i32;
        let shm_path = format!("{SHM_DIR}gpu-mode-ghost-test-{me}");
        let mut shm = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&shm_path).unwrap();
        shm.write_all(&vec![7u8; 3 << 20]).unwrap();
        std::fs::remove_file(&shm_path).unwrap();
        // SAFETY: a shared mapping of the file just written, unmapped below.
        let map = unsafe {
            libc::mmap(std::ptr::null_mut(), 3 << 20, libc::PROT_READ, libc::MAP_SHARED, std::os::fd::AsRawFd::as_raw_fd(&shm), 0)
        };
        assert_ne!(map, libc::MAP_FAILED);
        let dir = tempfile::tempdir().unwrap();
        let disk_path = dir.path().join("deleted");
        let mut disk = std::fs::File::create(&disk_path).unwrap();
        disk.write_all(&vec![1u8; 2 << 20]).unwrap();
        disk.sync_all().unwrap();
        std::fs::remove_file(&disk_path).unwrap();
        // Shared anonymous memory of 4 MiB (`/dev/zero (deleted)` in maps): not a ghost.
        // SAFETY: a fresh shared anonymous mapping, unmapped below.
        let anon = unsafe { libc::mmap(std::ptr::null_mut(), 4 << 20, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1, 0) };
        assert_ne!(anon, libc::MAP_FAILED);
        // SAFETY: within the mapping just made.
        unsafe { std::ptr::write_bytes(anon.cast::<u8>(), 9, 4 << 20) };
        let g = Ghosts::survey(&[me]);
        let anon_range = format!("{:x}-", anon as usize);
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let anon_line = maps.lines().find(|l| l.starts_with(&anon_range)).unwrap_or_default().to_string();
        // SAFETY: unmaps the mappings made above.
        unsafe {
            libc::munmap(map, 3 << 20);
            libc::munmap(anon, 4 << 20);
        }
        assert!(anon_line.ends_with("/dev/zero (deleted)"), "shared anonymous memory as maps shows it: {anon_line}");
        assert!(!g.disk.values().chain(g.shm.values()).any(|x| x.path == "/dev/zero (deleted)"), "shared anonymous memory is no ghost: {g:?}");
        drop((shm, disk));
        let ours: Vec<&Ghost> = g.shm.values().filter(|x| x.path.starts_with(&shm_path)).collect();
        assert_eq!(ours.len(), 1, "the /dev/shm file once, open and mapped: {g:?}");
        assert_eq!(ours[0].bytes, 3 << 20);
        let disk: Vec<&Ghost> = g.disk.values().filter(|x| x.path.starts_with(&disk_path.display().to_string())).collect();
        assert_eq!(disk.len(), 1, "{g:?}");
        assert!(disk[0].bytes >= 2 << 20, "{disk:?}");
        assert!(g.shm_largest() >= 3 << 20 && g.ghost_limit(1 << 20) >= 3 << 20);
        // Other tests of this binary hold deleted files too: the limits on ours alone.
        let mine = |m: &BTreeMap<(u64, u64), Ghost>, p: &str| m.iter().filter(|(_, x)| x.path.starts_with(p)).map(|(k, v)| (*k, v.clone())).collect();
        let ours = Ghosts { shm: mine(&g.shm, &shm_path), disk: mine(&g.disk, &disk_path.display().to_string()) };
        assert!(matches!(ours.over_limits(64, 1 << 20), Some(OverLimit::Size(ref x)) if x.path == disk[0].path), "{ours:?}");
        assert_eq!(ours.over_limits(64, 4 << 20), None, "{ours:?}");
    }
}
