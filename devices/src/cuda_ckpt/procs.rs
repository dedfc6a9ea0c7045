//! Finding a job's processes and what GPU files each one holds, from /proc.
//!
//! A job's processes are found through its cgroup (`…/job_<id>/…` in
//! /proc/<pid>/cgroup, cgroup v1 and v2 alike), never by name. Only where no
//! process sits in such a cgroup (proctrack/linuxproc without cgroups) does the
//! scan fall back to `SLURM_JOB_ID=<id>` in /proc/<pid>/environ.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// A GPU device file a process holds: an open descriptor or a mapping.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NvidiaFile {
    /// `fd 12` or `map 7f00…-7f01…`.
    pub how: String,
    pub path: String,
}

impl std::fmt::Display for NvidiaFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.path, self.how)
    }
}

/// How a job's processes were found, for the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FoundBy {
    Cgroup,
    Environ,
    Pid,
}

/// Why the host could not tell a job's processes or a process's GPU files.
/// A checkpoint is refused on either (CheckpointError::Scan); an unreadable
/// process that is gone meanwhile held nothing.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The environment is the user's to write: one user could name another's
    /// job. Processes of several users are therefore refused, not mixed.
    #[error("processes naming SLURM_JOB_ID={job} belong to several users ({}): refusing to guess which are the job's", list_users(uids))]
    SeveralUsers { job: u32, uids: Vec<(u32, i32)> },
    #[error("cannot read {path}: {source}")]
    Unreadable { path: PathBuf, source: std::io::Error },
}

/// `uid 1001, e.g. pid 5; uid 1002, e.g. pid 9`: each uid with one of its pids.
fn list_users(uids: &[(u32, i32)]) -> String {
    uids.iter().map(|(u, p)| format!("uid {u}, e.g. pid {p}")).collect::<Vec<_>>().join("; ")
}

/// What the orchestration needs from the host, behind a trait so tests can
/// hand it a made-up process table.
pub trait ProcessHost: Sync {
    /// Every process of Slurm job `job` on this node, except the caller.
    fn job_processes(&self, job: u32) -> Result<(Vec<i32>, FoundBy), HostError>;
    /// Whether `pid` is one of [`Self::job_processes`].
    fn is_job_process(&self, pid: i32, job: u32) -> Result<bool, HostError> {
        self.job_processes(job).map(|(pids, _)| pids.contains(&pid))
    }
    /// `pid` and all its descendants (a child forked without exec keeps the
    /// parent's GPU mappings, so it belongs to the checkpoint's scope).
    fn with_descendants(&self, pid: i32) -> Vec<i32>;
    /// The /dev/nvidia* descriptors and mappings `pid` holds.
    fn nvidia_files(&self, pid: i32) -> Result<Vec<NvidiaFile>, HostError>;
    /// The process's start time (clock ticks since boot): tells a pid reused by
    /// another process apart from the one that was checkpointed.
    fn start_time(&self, pid: i32) -> Option<u64>;
}

/// The device files of NVIDIA's driver.
pub const NVIDIA_DEVICE_PREFIX: &str = "/dev/nvidia";

/// The real host, reading `root` (normally /proc).
pub struct ProcFs {
    pub root: PathBuf,
    /// Path prefixes whose descriptors and mappings make a process a GPU
    /// holder: /dev/nvidia, plus the simulated driver's device-memory folder
    /// in tests (`cuda_ckpt.device_paths`).
    pub device_prefixes: Vec<String>,
}

impl Default for ProcFs {
    fn default() -> Self {
        ProcFs { root: PathBuf::from("/proc"), device_prefixes: vec![NVIDIA_DEVICE_PREFIX.to_string()] }
    }
}

impl ProcFs {
    fn pids(&self) -> Vec<i32> {
        let Ok(dir) = std::fs::read_dir(&self.root) else { return Vec::new() };
        let me = std::process::id() as i32;
        let mut pids: Vec<i32> = dir
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .filter(|p| *p != me)
            .collect();
        pids.sort_unstable();
        pids
    }

    fn read(&self, pid: i32, file: &str) -> Option<Vec<u8>> {
        std::fs::read(self.root.join(pid.to_string()).join(file)).ok()
    }

    fn uid(&self, pid: i32) -> Option<u32> {
        let status = String::from_utf8(self.read(pid, "status")?).ok()?;
        status.lines().find_map(|l| l.strip_prefix("Uid:")?.split_whitespace().next()?.parse().ok())
    }
}

impl ProcessHost for ProcFs {
    fn job_processes(&self, job: u32) -> Result<(Vec<i32>, FoundBy), HostError> {
        let pids = self.pids();
        let by_cgroup: Vec<i32> = pids
            .iter()
            .copied()
            .filter(|p| self.read(*p, "cgroup").is_some_and(|c| cgroup_is_job(&String::from_utf8_lossy(&c), job)))
            .collect();
        if !by_cgroup.is_empty() {
            return Ok((by_cgroup, FoundBy::Cgroup));
        }
        let by_env: Vec<i32> =
            pids.iter().copied().filter(|p| self.read(*p, "environ").is_some_and(|e| environ_is_job(&e, job))).collect();
        // Processes of several users are refused (HostError::SeveralUsers).
        let mut uids: Vec<(u32, i32)> = by_env.iter().filter_map(|p| Some((self.uid(*p)?, *p))).collect();
        uids.sort_unstable();
        uids.dedup_by_key(|(uid, _)| *uid);
        if uids.len() > 1 {
            return Err(HostError::SeveralUsers { job, uids });
        }
        Ok((by_env, FoundBy::Environ))
    }

    /// The process's own cgroup first (one file, where the full answer reads
    /// every process's): a process in the job's cgroup is one of
    /// `job_processes` whatever the others are. Otherwise the full answer.
    fn is_job_process(&self, pid: i32, job: u32) -> Result<bool, HostError> {
        if self.read(pid, "cgroup").is_some_and(|c| cgroup_is_job(&String::from_utf8_lossy(&c), job)) {
            return Ok(true);
        }
        self.job_processes(job).map(|(pids, _)| pids.contains(&pid))
    }

    fn with_descendants(&self, pid: i32) -> Vec<i32> {
        let parents: Vec<(i32, i32)> = self
            .pids()
            .into_iter()
            .filter_map(|p| Some((p, parse_ppid(&String::from_utf8_lossy(&self.read(p, "stat")?))?)))
            .collect();
        descendants(pid, &parents)
    }

    fn nvidia_files(&self, pid: i32) -> Result<Vec<NvidiaFile>, HostError> {
        let dir = self.root.join(pid.to_string());
        let mut found = Vec::new();
        let fds = crate::procfs::fd_links(&dir.join("fd")).map_err(|source| HostError::Unreadable { path: dir.join("fd"), source })?;
        for (fd, target) in fds {
            if is_device_path(&target, &self.device_prefixes) {
                found.push(NvidiaFile { how: format!("fd {fd}"), path: target });
            }
        }
        let maps = std::fs::read(dir.join("maps")).map_err(|source| HostError::Unreadable { path: dir.join("maps"), source })?;
        found.extend(device_maps(&String::from_utf8_lossy(&maps), &self.device_prefixes));
        Ok(found)
    }

    fn start_time(&self, pid: i32) -> Option<u64> {
        parse_start_time(&String::from_utf8_lossy(&self.read(pid, "stat")?))
    }
}

fn is_device_path(path: &str, prefixes: &[String]) -> bool {
    prefixes.iter().any(|p| path.starts_with(p.as_str()))
}

/// True when a /proc/<pid>/cgroup text places the process under `job_<job>`.
pub fn cgroup_is_job(text: &str, job: u32) -> bool {
    let want = format!("job_{job}");
    text.lines().filter_map(|l| l.splitn(3, ':').nth(2)).any(|path| path.split('/').any(|c| c == want))
}

/// True when a NUL-separated environ block holds `SLURM_JOB_ID=<job>`.
pub fn environ_is_job(environ: &[u8], job: u32) -> bool {
    let want = format!("SLURM_JOB_ID={job}");
    environ.split(|b| *b == 0).any(|v| v == want.as_bytes())
}

/// The /dev/nvidia* mappings of a /proc/<pid>/maps text, one per mapping.
pub fn nvidia_maps(text: &str) -> Vec<NvidiaFile> {
    device_maps(text, &[NVIDIA_DEVICE_PREFIX.to_string()])
}

/// The mappings of files under any of `prefixes`, one per mapping.
pub fn device_maps(text: &str, prefixes: &[String]) -> Vec<NvidiaFile> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let range = fields.next()?;
            let path = fields.nth(4)?;
            is_device_path(path, prefixes).then(|| NvidiaFile { how: format!("map {range}"), path: path.to_string() })
        })
        .collect()
}

/// The parent pid from a /proc/<pid>/stat line (parsed by [`crate::procfs`]).
pub fn parse_ppid(stat: &str) -> Option<i32> {
    crate::procfs::parse_stat(stat).map(|(_, _, ppid, _)| ppid)
}

/// The start time (clock ticks after boot) from a /proc/<pid>/stat line.
pub fn parse_start_time(stat: &str) -> Option<u64> {
    crate::procfs::parse_stat(stat).map(|(_, _, _, start)| start)
}

/// `root` and every process below it in the (pid, ppid) table.
pub fn descendants(root: i32, parents: &[(i32, i32)]) -> Vec<i32> {
    let mut children: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
    for (pid, ppid) in parents {
        children.entry(*ppid).or_default().push(*pid);
    }
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        if let Some(kids) = children.get(&out[i]) {
            out.extend(kids.iter().filter(|k| **k != root));
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_lines_match_the_job_component_only() {
        let cases = [
            ("0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n", 42, true),
            ("4:freezer:/slurm/uid_1000/job_42/step_batch\n1:name=systemd:/user.slice\n", 42, true),
            ("0::/system.slice/slurmstepd.scope/job_420/step_0\n", 42, false),
            ("0::/user.slice/job_42x\n", 42, false),
            ("0::/\n", 42, false),
        ];
        for (text, job, want) in cases {
            assert_eq!(cgroup_is_job(text, job), want, "{text:?}");
        }
    }

    #[test]
    fn environ_matches_the_exact_variable() {
        let cases: [(&[u8], bool); 4] = [
            (b"PATH=/bin\0SLURM_JOB_ID=42\0", true),
            (b"SLURM_JOB_ID=421\0", false),
            (b"XSLURM_JOB_ID=42\0", false),
            (b"SLURM_JOB_ID=42", true),
        ];
        for (env, want) in cases {
            assert_eq!(environ_is_job(env, 42), want, "{:?}", String::from_utf8_lossy(env));
        }
    }

    #[test]
    fn maps_yield_nvidia_mappings_only() {
        let text = "\
7f00-7f10 rw-s 00000000 00:05 12 /dev/nvidia0
7f10-7f20 rw-s 00000000 00:05 13 /dev/nvidiactl
7f20-7f30 r-xp 00000000 08:01 99 /usr/lib/libc.so.6
7f30-7f40 rw-p 00000000 00:00 0
7f40-7f50 rw-s 00000000 00:05 14 /dev/nvidia-uvm
";
        let got: Vec<String> = nvidia_maps(text).iter().map(|f| f.to_string()).collect();
        assert_eq!(got, ["/dev/nvidia0 (map 7f00-7f10)", "/dev/nvidiactl (map 7f10-7f20)", "/dev/nvidia-uvm (map 7f40-7f50)"]);
        // Another device prefix (the simulated driver's memory files) counts too.
        let sim = "7f00-7f10 rw-s 00000000 00:05 12 /tmp/sim/gpus/GPU-1/7-0.mem\n";
        assert_eq!(device_maps(sim, &["/tmp/sim/gpus/".to_string()]).len(), 1);
        assert!(nvidia_maps(sim).is_empty());
    }

    #[test]
    fn stat_parsing_survives_odd_command_names() {
        let stat = "1234 (a (b) c) S 77 1234 1234 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 98765 1000 10";
        assert_eq!(parse_ppid(stat), Some(77));
        assert_eq!(parse_start_time(stat), Some(98765));
        assert_eq!(parse_ppid("garbage"), None);
    }

    #[test]
    fn descendants_walk_the_whole_tree() {
        let table = [(10, 1), (11, 10), (12, 11), (13, 10), (20, 1), (21, 20)];
        assert_eq!(descendants(10, &table), vec![10, 11, 13, 12]);
        assert_eq!(descendants(21, &table), vec![21]);
    }

    #[test]
    fn this_process_is_scanned_from_the_real_proc() {
        let fs = ProcFs::default();
        let me = std::process::id() as i32;
        assert_eq!(fs.nvidia_files(me).unwrap(), Vec::<NvidiaFile>::new());
        assert!(fs.start_time(me).is_some());
        // A job id no process carries finds nothing.
        assert_eq!(fs.job_processes(4_000_000_123).unwrap().0, Vec::<i32>::new());
    }

    /// The one-file answer agrees with the full scan in every case: the
    /// process in the job's cgroup, one outside it while others are in it
    /// (its environment names the job: not enough), and the environment
    /// fallback where no process of the job sits in a cgroup.
    #[test]
    fn is_job_process_agrees_with_the_full_scan() {
        let root = tempfile::tempdir().unwrap();
        let proc = |pid: i32, cgroup: &str, environ: &[u8]| {
            let d = root.path().join(pid.to_string());
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("cgroup"), cgroup).unwrap();
            std::fs::write(d.join("environ"), environ).unwrap();
            std::fs::write(d.join("status"), "Uid:\t1000\t1000\t1000\t1000\n").unwrap();
        };
        proc(10, "0::/system.slice/slurmstepd.scope/job_7/step_batch/user/task_0\n", b"");
        proc(11, "0::/user.slice\n", b"SLURM_JOB_ID=7\0");
        proc(12, "0::/user.slice\n", b"SLURM_JOB_ID=9\0");
        let fs = ProcFs { root: root.path().to_path_buf(), ..ProcFs::default() };
        let cases = [(10, 7, true), (11, 7, false), (12, 7, false), (12, 9, true), (10, 9, false), (99, 7, false)];
        for (pid, job, want) in cases {
            let full = fs.job_processes(job).unwrap().0.contains(&pid);
            assert_eq!(full, want, "full scan: pid {pid} job {job}");
            assert_eq!(fs.is_job_process(pid, job).unwrap(), want, "pid {pid} job {job}");
        }
    }

    /// Processes of several users naming the job, and a process whose files
    /// cannot be read: each its own kind, with the words of before.
    #[test]
    fn a_scan_that_cannot_answer_says_why_by_kind() {
        let root = tempfile::tempdir().unwrap();
        for (pid, uid) in [(21, 1000), (22, 1001)] {
            let d = root.path().join(pid.to_string());
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("cgroup"), "0::/user.slice\n").unwrap();
            std::fs::write(d.join("environ"), b"SLURM_JOB_ID=7\0").unwrap();
            std::fs::write(d.join("status"), format!("Uid:\t{uid}\t{uid}\t{uid}\t{uid}\n")).unwrap();
        }
        let fs = ProcFs { root: root.path().to_path_buf(), ..ProcFs::default() };
        let err = fs.job_processes(7).unwrap_err();
        assert!(matches!(&err, HostError::SeveralUsers { job: 7, uids } if uids.len() == 2), "{err:?}");
        let text = "processes naming SLURM_JOB_ID=7 belong to several users (uid 1000, e.g. pid 21; uid 1001, e.g. pid 22): refusing to guess which are the job's";
        assert_eq!(err.to_string(), text);
        let err = fs.nvidia_files(21).unwrap_err();
        assert!(matches!(err, HostError::Unreadable { .. }), "{err:?}");
        let fd = root.path().join("21/fd");
        assert!(err.to_string().starts_with(&format!("cannot read {}: ", fd.display())), "{err}");
    }
}
