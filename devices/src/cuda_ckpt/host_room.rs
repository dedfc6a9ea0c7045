//! Host memory before the lock (issue 25 item 4). The driver's checkpoint
//! copies each process's GPU memory into that process's host memory, which
//! the node and the job's memory cgroup must be able to give: a checkpoint
//! that cannot fit would be OOM-killed halfway (the job's cgroup) or make
//! the node thrash (many GPUs at once). So before anything is locked the
//! job's footprint (NVML's, per process) is compared with what is free:
//! the node's MemAvailable and, for each process, the headroom of its
//! memory cgroup and every ancestor (limit minus usage; cgroup v2
//! `memory.max`/`memory.current`, v1 `memory.limit_in_bytes`/
//! `memory.usage_in_bytes`). Processes of one cgroup share its headroom.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Kept free beyond the GPU memory: the driver's own buffers and what the
/// process allocates meanwhile (measured on the H100s: a few MiB per process).
pub const MARGIN_BYTES: u64 = 64 << 20;

/// Where the numbers come from (tests point these elsewhere).
#[derive(Debug, Clone)]
pub struct HostPaths {
    pub proc_root: PathBuf,
    pub cgroup_root: PathBuf,
}

impl Default for HostPaths {
    fn default() -> HostPaths {
        HostPaths { proc_root: "/proc".into(), cgroup_root: "/sys/fs/cgroup".into() }
    }
}

/// How much host memory one group of processes may still take, and what
/// bounds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Room {
    pub bytes: u64,
    pub limited_by: String,
}

/// Why a checkpoint does not fit, for [`super::CheckpointError::HostMemory`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shortfall {
    pub pids: Vec<i32>,
    pub need: u64,
    pub room: Room,
}

/// Checks that the GPU memory of `footprints` (pid, bytes) plus a margin
/// fits: in the node's MemAvailable as a whole, and in each memory cgroup
/// for the processes in it. An unreadable number is no limit (the check
/// must never refuse a job for the node's own oddity). A process's host
/// memory pool (issue 39: pages populated before the signal, which the
/// driver's buffer is served from) is memory it already holds: only the
/// footprint beyond it is asked. The pools are read (each process's smaps,
/// on the path to a free GPU) only when the footprints do not fit without
/// them: a pool only ever lowers what is asked.
pub fn check(paths: &HostPaths, footprints: &[(i32, u64)]) -> Result<(), Shortfall> {
    let short = match fits_whole(paths, footprints) {
        Ok(()) => return Ok(()),
        Err(short) => short,
    };
    let beyond_pools: Vec<(i32, u64)> = footprints.iter().map(|&(pid, bytes)| (pid, bytes.saturating_sub(pool_bytes(&paths.proc_root, pid)))).collect();
    if beyond_pools == footprints {
        return Err(short);
    }
    fits_whole(paths, &beyond_pools)
}

/// [`check`] of `footprints` as they are.
fn fits_whole(paths: &HostPaths, footprints: &[(i32, u64)]) -> Result<(), Shortfall> {
    let pids: Vec<i32> = footprints.iter().map(|f| f.0).collect();
    let total: u64 = footprints.iter().map(|f| f.1).sum();
    if let Some(avail) = mem_available(&paths.proc_root) {
        fits(&pids, total, Room { bytes: avail, limited_by: "the node's MemAvailable".into() })?;
    }
    let mut by_cgroup: BTreeMap<(PathBuf, bool), (Vec<i32>, u64)> = BTreeMap::new();
    for &(pid, bytes) in footprints {
        if let Some(cg) = memory_cgroup(&paths.proc_root, pid) {
            let e = by_cgroup.entry(cg).or_default();
            e.0.push(pid);
            e.1 += bytes;
        }
    }
    for ((cgroup, v2), (pids, bytes)) in by_cgroup {
        if let Some(room) = cgroup_room(&paths.cgroup_root, &cgroup, v2) {
            fits(&pids, bytes, room)?;
        }
    }
    Ok(())
}

fn fits(pids: &[i32], bytes: u64, room: Room) -> Result<(), Shortfall> {
    let need = bytes + MARGIN_BYTES;
    if need > room.bytes {
        return Err(Shortfall { pids: pids.to_vec(), need, room });
    }
    Ok(())
}

/// The resident bytes of the process's host memory pool: its anonymous
/// private mappings that the huge-page shim made for it, told by their
/// flags (`dc` MADV_DONTFORK and `nr` MAP_NORESERVE on a writable mapping;
/// no other mapping of a CUDA process was seen with them, H200,
/// 2026-11-28) or their name (`[anon:gpu-mode-pool]`, kernels that name
/// mappings). 0 when unreadable.
pub fn pool_bytes(proc_root: &Path, pid: i32) -> u64 {
    let Ok(text) = std::fs::read_to_string(proc_root.join(pid.to_string()).join("smaps")) else { return 0 };
    pool_bytes_of_smaps(&text)
}

/// [`pool_bytes`] of a /proc/<pid>/smaps text.
pub fn pool_bytes_of_smaps(smaps: &str) -> u64 {
    let (mut total, mut rss, mut anonymous, mut named) = (0u64, 0u64, false, false);
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let Some(first) = words.next() else { continue };
        if first.contains('-') && !first.ends_with(':') {
            // A mapping's head line: range, perms, offset, dev, inode, [path].
            let path: Vec<&str> = words.skip(4).collect();
            named = path == ["[anon:gpu-mode-pool]"];
            anonymous = path.is_empty() || named;
            rss = 0;
        } else if first == "Rss:" {
            rss = words.next().and_then(|kib| kib.parse::<u64>().ok()).unwrap_or(0) << 10;
        } else if first == "VmFlags:" {
            let flags: Vec<&str> = words.collect();
            // Without hg where the kernel has no transparent huge pages.
            let marked = ["dc", "nr", "wr"].iter().all(|f| flags.contains(f));
            if anonymous && (named || marked) {
                total += rss;
            }
        }
    }
    total
}

/// /proc/meminfo's MemAvailable, bytes.
pub fn mem_available(proc_root: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(proc_root.join("meminfo")).ok()?;
    let kib: u64 = text.lines().find_map(|l| l.strip_prefix("MemAvailable:"))?.trim().strip_suffix("kB")?.trim().parse().ok()?;
    Some(kib << 10)
}

/// The process's memory cgroup: its path and whether it is v2 (`0::/p`)
/// rather than v1's memory hierarchy (`N:memory:/p`, preferred where both).
pub fn memory_cgroup(proc_root: &Path, pid: i32) -> Option<(PathBuf, bool)> {
    let text = std::fs::read_to_string(proc_root.join(pid.to_string()).join("cgroup")).ok()?;
    let mut v2 = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        if controllers.split(',').any(|c| c == "memory") {
            return Some((PathBuf::from(path), false));
        }
        if controllers.is_empty() {
            v2 = Some((PathBuf::from(path), true));
        }
    }
    v2
}

/// The least headroom (limit minus usage) from the cgroup up to the root;
/// `None` when no level has a limit.
pub fn cgroup_room(cgroup_root: &Path, cgroup: &Path, v2: bool) -> Option<Room> {
    let base = if v2 { cgroup_root.to_path_buf() } else { cgroup_root.join("memory") };
    let (limit_file, usage_file) = if v2 { ("memory.max", "memory.current") } else { ("memory.limit_in_bytes", "memory.usage_in_bytes") };
    let mut best: Option<Room> = None;
    let mut level = Some(cgroup);
    while let Some(p) = level {
        let dir = base.join(p.strip_prefix("/").unwrap_or(p));
        let number = |f: &str| std::fs::read_to_string(dir.join(f)).ok().and_then(|s| s.trim().parse::<u64>().ok());
        // "max" (v2) or a huge v1 value (no limit) does not parse or never binds.
        if let (Some(limit), Some(usage)) = (number(limit_file), number(usage_file)) {
            let room = limit.saturating_sub(usage);
            if best.as_ref().is_none_or(|b| room < b.bytes) {
                let limited_by = format!("{} ({} MiB, {} MiB in use)", dir.join(limit_file).display(), limit >> 20, usage >> 20);
                best = Some(Room { bytes: room, limited_by });
            }
        }
        level = p.parent();
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_is_told_by_its_flags_or_its_name() {
        let smaps = "\
7f0000000000-7f02bdc00000 rw-p 00000000 00:00 0 
Rss:            11493376 kB
VmFlags: rd wr mr mw me dc nr hg 
7f1000000000-7f1000200000 rw-p 00000000 00:00 0 
Rss:                2048 kB
VmFlags: rd wr mr mw me ac 
7f2000000000-7f2000400000 rw-p 00000000 00:00 0 
Rss:                4096 kB
VmFlags: rd wr mr mw me dc ac 
7f3000000000-7f3000400000 rw-p 00000000 00:05 12 /dev/nvidiactl
Rss:                4096 kB
VmFlags: rd wr mr mw me dc nr hg 
7f4000000000-7f4000400000 rw-p 00000000 00:00 0 [anon:gpu-mode-pool]
Rss:                1024 kB
VmFlags: rd wr mr mw me 
7f5000000000-7f5040000000 ---p 00000000 00:00 0 
Rss:                   0 kB
VmFlags: mr mw me dc nr hg 
7f6000000000-7f6000400000 rw-p 00000000 00:00 0 
Rss:                2048 kB
VmFlags: rd wr mr mw me dc nr 
";
        // The pool (flags), the named pool, a pool without huge pages (THP
        // off); not: plain memory, CUDA's pinned memory (dc alone), a device
        // file, the reservation (no access).
        assert_eq!(pool_bytes_of_smaps(smaps), (11493376 + 1024 + 2048) << 10);
        assert_eq!(pool_bytes_of_smaps(""), 0);
    }

    /// A fake /proc and /sys/fs/cgroup: meminfo, each pid's cgroup line, and
    /// the limits and usage of each cgroup level.
    fn host(avail_mib: u64, pids: &[(i32, &str)], levels: &[(&str, &str, u64)], v2: bool) -> (tempfile::TempDir, HostPaths) {
        let dir = tempfile::tempdir().unwrap();
        let paths = HostPaths { proc_root: dir.path().join("proc"), cgroup_root: dir.path().join("cgroup") };
        std::fs::create_dir_all(&paths.proc_root).unwrap();
        std::fs::write(paths.proc_root.join("meminfo"), format!("MemTotal: 99999999 kB\nMemAvailable: {} kB\n", avail_mib << 10)).unwrap();
        for (pid, cg) in pids {
            std::fs::create_dir_all(paths.proc_root.join(pid.to_string())).unwrap();
            let line = if v2 { format!("0::{cg}\n") } else { format!("9:pids:/\n4:memory:{cg}\n0::/\n") };
            std::fs::write(paths.proc_root.join(pid.to_string()).join("cgroup"), line).unwrap();
        }
        let base = if v2 { paths.cgroup_root.clone() } else { paths.cgroup_root.join("memory") };
        let (lf, uf) = if v2 { ("memory.max", "memory.current") } else { ("memory.limit_in_bytes", "memory.usage_in_bytes") };
        for (cg, limit, usage_mib) in levels {
            let d = base.join(cg.trim_start_matches('/'));
            std::fs::create_dir_all(&d).unwrap();
            let limit = limit.parse::<u64>().map_or(limit.to_string(), |m| (m << 20).to_string());
            std::fs::write(d.join(lf), limit).unwrap();
            std::fs::write(d.join(uf), (usage_mib << 20).to_string()).unwrap();
        }
        (dir, paths)
    }

    const GIB: u64 = 1 << 30;

    #[test]
    fn a_checkpoint_fits_or_is_refused_by_what_binds() {
        let job = "/slurm/uid_1001/job_7";
        // (case, MemAvailable MiB, footprints, levels (cgroup, limit MiB or "max", usage MiB), v2, refused by)
        type Case<'a> = (&'a str, u64, Vec<(i32, u64)>, Vec<(&'a str, &'a str, u64)>, bool, Option<&'a str>);
        let cases: Vec<Case> = vec![
            ("room everywhere", 64 << 10, vec![(10, 8 * GIB)], vec![(job, "max", 100)], true, None),
            ("the job's cgroup binds", 64 << 10, vec![(10, 8 * GIB)], vec![(job, "4096", 100)], true, Some("job_7/memory.max (4096 MiB")),
            ("an ancestor binds", 64 << 10, vec![(10, 2 * GIB)], vec![(job, "max", 0), ("/slurm", "2048", 1024)], true, Some("slurm/memory.max")),
            ("the node binds", 4 << 10, vec![(10, 3 * GIB), (11, 2 * GIB)], vec![], true, Some("MemAvailable")),
            ("processes of one cgroup add up", 64 << 10, vec![(10, 3 * GIB), (11, 3 * GIB)], vec![(job, "8192", 2500)], true, Some("job_7/memory.max")),
            ("the margin counts", 64 << 10, vec![(10, 4 * GIB - (32 << 20))], vec![(job, "4096", 0)], true, Some("job_7")),
            ("v1: the job's cgroup binds", 64 << 10, vec![(10, 8 * GIB)], vec![(job, "4096", 100)], false, Some("memory.limit_in_bytes")),
            ("v1: no limit (a huge number) fits", 64 << 10, vec![(10, 8 * GIB)], vec![(job, "9223372036854771712", 100)], false, None),
        ];
        for (name, avail, fps, levels, v2, refused_by) in cases {
            let pids: Vec<(i32, &str)> = fps.iter().map(|f| (f.0, job)).collect();
            let (_dir, paths) = host(avail, &pids, &levels, v2);
            match (check(&paths, &fps), refused_by) {
                (Ok(()), None) => {}
                (Err(s), Some(needle)) => assert!(s.room.limited_by.contains(needle), "{name}: {s:?}"),
                (got, want) => panic!("{name}: got {got:?}, wanted refusal by {want:?}"),
            }
        }
    }

    /// A footprint that does not fit on its own fits when the process's pool
    /// holds enough of it; without a pool, the same refusal.
    #[test]
    fn a_pool_is_counted_as_memory_the_process_holds() {
        let job = "/slurm/uid_1001/job_7";
        let (_dir, paths) = host(64 << 10, &[(10, job)], &[(job, "4096", 100)], true);
        let fps = [(10, 8 * GIB)];
        assert!(check(&paths, &fps).unwrap_err().room.limited_by.contains("job_7/memory.max"));
        let pool = |kib: u64| format!("7f0000000000-7f0200000000 rw-p 00000000 00:00 0 \nRss: {kib} kB\nVmFlags: rd wr mr mw me dc nr hg \n");
        std::fs::write(paths.proc_root.join("10/smaps"), pool(5 << 20)).unwrap();
        assert_eq!(check(&paths, &fps), Ok(()), "8 GiB less a 5 GiB pool fits in 4 GiB");
        std::fs::write(paths.proc_root.join("10/smaps"), pool(1 << 20)).unwrap();
        let short = check(&paths, &fps).unwrap_err();
        assert_eq!(short.need, 7 * GIB + MARGIN_BYTES, "only what is beyond the pool is asked");
    }

    #[test]
    fn what_cannot_be_read_is_no_limit() {
        let paths = HostPaths { proc_root: "/nonexistent/proc".into(), cgroup_root: "/nonexistent/cg".into() };
        assert_eq!(check(&paths, &[(10, 1 << 40)]), Ok(()));
    }

    /// The real files of this machine: this process's own cgroup is read.
    #[test]
    fn this_machine_gives_numbers() {
        let me = std::process::id() as i32;
        let paths = HostPaths::default();
        assert!(mem_available(&paths.proc_root).is_some_and(|b| b > 0));
        assert!(memory_cgroup(&paths.proc_root, me).is_some());
        let err = check(&paths, &[(me, 1 << 50)]).unwrap_err();
        assert!(err.need > 1 << 50 && err.pids == [me], "{err:?}");
    }
}
