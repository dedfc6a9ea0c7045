//! The host memory pool's sizes (issue 39): the agent tells each GPU process
//! of a `pool=on` job how much host memory to keep populated for the
//! driver's checkpoint buffer; the huge-page shim in the process keeps it
//! (hugepages/src/pool.rs).
//!
//! Every [`Sizer::interval`] the agent reads NVML's footprint of each
//! process of the job on the job's GPUs and the host's room, decides each
//! process's pool ([`plan`]) and writes it as a symbolic link
//! `<runtime_dir>/pool/<job>/<pid>` whose target is the size in MiB. A link
//! and not a file: the shim reads it with `readlink`, which holds no
//! descriptor that CRIU could find open in a frozen process. The directory
//! is root's, readable by the job's group only; the user cannot write there
//! (a forged size could only cost the user's own job memory anyway: the
//! pool is the process's memory, charged to its cgroup).
//!
//! The pool takes memory the checkpoint needs anyway, earlier: so it is
//! bounded like the checkpoint's own host-memory check (host_room), and
//! more: it never takes the node's MemAvailable, or the room left under the
//! job's memory limits, below `host_pool_reserve_gib`, and one job's pools
//! never pass `host_pool_max_gib`. When memory gets tight the sizes shrink
//! on the next turn and the shim gives the difference back.

use crate::cuda_ckpt::host_room::{self, HostPaths};
use crate::cuda_ckpt::{GpuInfo, GpuUuid, ProcessHost};
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

const MIB: u64 = 1 << 20;

/// The variable that tells the shim where its size links are (gpu-mode-run
/// sets it for the application of a pool job).
pub const DIR_ENV: &str = "GPU_MODE_POOL_DIR";

/// Task variable set to `on` by the prolog when the job gets a host memory
/// pool (`--gpu-mode=checkpoint:pool=on`, bounded by `preempt.host_pool`;
/// issue 39): gpu-mode-run then points the huge-page shim at the job's pool
/// directory. Unset otherwise. Like [`crate::nccl::TASK_NCCL_VAR`], the agent has it from
/// its own command line (`--pool`), never from the job.
pub const TASK_POOL_VAR: &str = "GPU_MODE_TASK_POOL";

/// What one turn of the sizer knows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inputs {
    /// NVML's footprint of each process of the job on its GPUs (pid, bytes).
    pub footprints: BTreeMap<i32, u64>,
    /// Each process's pool now (resident, host_room::pool_bytes).
    pub pooled: BTreeMap<i32, u64>,
    /// The node's MemAvailable, when readable.
    pub mem_available: Option<u64>,
    /// The least room under the job processes' memory cgroups, when limited.
    pub cgroup_room: Option<u64>,
}

/// The site's bounds (`[preempt] host_pool_max_gib`, `host_pool_reserve_gib`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub max_bytes: u64,
    pub reserve_bytes: u64,
}

impl Bounds {
    pub fn from_config(p: &crate::config::PreemptConfig) -> Bounds {
        const GIB: u64 = 1 << 30;
        Bounds { max_bytes: p.host_pool_max_gib.saturating_mul(GIB), reserve_bytes: p.host_pool_reserve_gib.saturating_mul(GIB) }
    }
}

/// A turn's decision: each process's pool, and what bounded the total.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub sizes: BTreeMap<i32, u64>,
    pub total: u64,
    pub bound: Bound,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// Every process gets its footprint.
    Footprint,
    /// `host_pool_max_gib`.
    SiteMax,
    /// The node's MemAvailable less the reserve.
    Node,
    /// The job's memory limit less the reserve.
    Cgroup,
}

impl Bound {
    pub fn as_str(self) -> &'static str {
        match self {
            Bound::Footprint => "the footprint",
            Bound::SiteMax => "host_pool_max_gib",
            Bound::Node => "the node's MemAvailable less host_pool_reserve_gib",
            Bound::Cgroup => "the job's memory limit less host_pool_reserve_gib",
        }
    }
}

/// The pools of one turn. The memory the pools hold now counts as free for
/// them (it is theirs); the rest must leave the reserve free. When the
/// total wanted does not fit, each process gets the same share of its
/// footprint, in whole MiB.
pub fn plan(inputs: &Inputs, bounds: Bounds) -> Plan {
    let wanted: u64 = inputs.footprints.values().sum();
    let pooled: u64 = inputs.pooled.iter().filter(|(pid, _)| inputs.footprints.contains_key(pid)).map(|(_, b)| b).sum();
    let room = |free: Option<u64>| free.map(|f| (f + pooled).saturating_sub(bounds.reserve_bytes));
    let mut cap = (wanted, Bound::Footprint);
    for (limit, bound) in [(Some(bounds.max_bytes), Bound::SiteMax), (room(inputs.mem_available), Bound::Node), (room(inputs.cgroup_room), Bound::Cgroup)] {
        if let Some(limit) = limit.filter(|l| *l < cap.0) {
            cap = (limit, bound);
        }
    }
    let sizes: BTreeMap<i32, u64> = inputs
        .footprints
        .iter()
        .map(|(&pid, &bytes)| {
            let share = if wanted == 0 { 0 } else { (u128::from(bytes) * u128::from(cap.0) / u128::from(wanted)) as u64 };
            (pid, share / MIB * MIB)
        })
        .collect();
    Plan { total: sizes.values().sum(), sizes, bound: cap.1 }
}

/// The agent's sizer for one job.
#[derive(Debug, Clone)]
pub struct Sizer {
    pub dir: PathBuf,
    pub job: u32,
    pub gid: u32,
    pub gpus: Vec<GpuUuid>,
    pub bounds: Bounds,
    pub interval: Duration,
    pub paths: HostPaths,
}

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("cannot make the pool directory {path}: {source}")]
    Dir { path: PathBuf, source: std::io::Error },
    #[error("the pool directory {path} is not a directory owned by root: refusing to write there")]
    NotOurs { path: PathBuf },
    #[error("cannot write the pool size {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
}

/// How often the sizer looks: the pool follows a footprint that grows
/// within this (PyTorch's allocator grows in the first steps), and a fill
/// starts this long after the process's first GPU memory at most.
pub const INTERVAL: Duration = Duration::from_secs(2);

impl Sizer {
    /// `<dir>` made (root's, mode 0750, group the job's) with its parent
    /// (root's, 0755), every link of an earlier run removed.
    pub fn prepare(&self) -> Result<(), PoolError> {
        let parent = self.dir.parent().unwrap_or(Path::new("/"));
        // The runtime directory itself, where it is not there yet (a bench's).
        if let Some(runtime) = parent.parent().filter(|r| !r.exists()) {
            std::fs::create_dir_all(runtime).map_err(|source| PoolError::Dir { path: runtime.into(), source })?;
        }
        for (dir, mode) in [(parent, 0o755), (self.dir.as_path(), 0o750)] {
            match std::fs::create_dir(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(source) => return Err(PoolError::Dir { path: dir.into(), source }),
            }
            check_ours(dir)?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).map_err(|source| PoolError::Dir { path: dir.into(), source })?;
        }
        std::os::unix::fs::chown(&self.dir, Some(0), Some(self.gid)).map_err(|source| PoolError::Dir { path: self.dir.clone(), source })?;
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                let _ = std::fs::remove_file(e.path());
            }
        }
        Ok(())
    }

    /// What one turn reads: the job's processes' footprints on its GPUs,
    /// their pools, and the host's room. `None` when NVML or the process
    /// scan fails: the turn changes nothing (a pool is not dropped for a
    /// moment's failure).
    pub fn inputs(&self, gpus: &dyn GpuInfo, host: &dyn ProcessHost) -> Option<Inputs> {
        let mut inputs = Inputs { mem_available: host_room::mem_available(&self.paths.proc_root), ..Inputs::default() };
        let procs = gpus.compute_processes().ok()?;
        let (job_pids, _) = host.job_processes(self.job).ok()?;
        for p in procs.iter().filter(|p| self.gpus.contains(&p.gpu) && job_pids.contains(&p.pid)) {
            *inputs.footprints.entry(p.pid).or_default() += p.used_bytes;
        }
        for &pid in inputs.footprints.keys() {
            inputs.pooled.insert(pid, host_room::pool_bytes(&self.paths.proc_root, pid));
            if let Some((cgroup, v2)) = host_room::memory_cgroup(&self.paths.proc_root, pid) {
                if let Some(room) = host_room::cgroup_room(&self.paths.cgroup_root, &cgroup, v2) {
                    inputs.cgroup_room = Some(inputs.cgroup_room.map_or(room.bytes, |r| r.min(room.bytes)));
                }
            }
        }
        Some(inputs)
    }

    /// The links made to match `plan`, given what the last turn wrote.
    pub fn write(&self, plan: &Plan, before: &BTreeMap<i32, u64>) -> Result<(), PoolError> {
        for (&pid, &bytes) in &plan.sizes {
            if before.get(&pid) != Some(&bytes) {
                self.link(pid, bytes)?;
            }
        }
        for pid in before.keys().filter(|p| !plan.sizes.contains_key(p)) {
            let _ = std::fs::remove_file(self.dir.join(pid.to_string()));
        }
        Ok(())
    }

    /// `<dir>/<pid>` → "<MiB>", replaced whole (a link made aside, renamed).
    fn link(&self, pid: i32, bytes: u64) -> Result<(), PoolError> {
        let (tmp, path) = (self.dir.join(format!(".{pid}.new")), self.dir.join(pid.to_string()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink((bytes / MIB).to_string(), &tmp)
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(|source| PoolError::Write { path, source })
    }

    /// Turns until the process ends: `log` gets a line whenever the total
    /// moves by a GiB or more, or what bounds it changes.
    pub fn run(&self, gpus: &dyn GpuInfo, host: &dyn ProcessHost, log: &dyn Fn(&Plan, Option<&PoolError>)) -> ! {
        let mut before: BTreeMap<i32, u64> = BTreeMap::new();
        let mut logged: Option<(u64, Bound)> = None;
        loop {
            let Some(inputs) = self.inputs(gpus, host) else {
                std::thread::sleep(self.interval);
                continue;
            };
            let plan = plan(&inputs, self.bounds);
            let written = self.write(&plan, &before);
            let moved = logged.is_none_or(|(total, bound)| total.abs_diff(plan.total) >= 1 << 30 || bound != plan.bound);
            if written.is_err() || (moved && (plan.total > 0 || logged.is_some())) {
                log(&plan, written.as_ref().err());
                logged = Some((plan.total, plan.bound));
            }
            if written.is_ok() {
                before = plan.sizes;
            }
            std::thread::sleep(self.interval);
        }
    }
}

/// The sizer's directory made and its thread started; the thread lives as
/// long as the process (the agent exits with its job).
pub fn spawn(
    sizer: Sizer,
    gpus: std::sync::Arc<dyn GpuInfo + Send>,
    host: std::sync::Arc<dyn ProcessHost + Send>,
    log: impl Fn(&Plan, Option<&PoolError>) + Send + 'static,
) -> Result<(), PoolError> {
    sizer.prepare()?;
    std::thread::Builder::new()
        .name("pool-sizer".into())
        .spawn(move || sizer.run(gpus.as_ref(), host.as_ref(), &log))
        .map_err(|source| PoolError::Dir { path: "(the sizer's thread)".into(), source })?;
    Ok(())
}

/// The line a turn logs: the total, what bounds it, each process's size.
pub fn describe(plan: &Plan) -> String {
    let each: Vec<String> = plan.sizes.iter().map(|(pid, b)| format!("{pid}:{}", b / MIB)).collect();
    format!("host memory pool {} MiB (bounded by {}); per process MiB: {}", plan.total / MIB, plan.bound.as_str(), if each.is_empty() { "none".into() } else { each.join(" ") })
}

fn check_ours(dir: &Path) -> Result<(), PoolError> {
    use std::os::unix::fs::MetadataExt;
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() && m.uid() == 0 => Ok(()),
        _ => Err(PoolError::NotOurs { path: dir.into() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn inputs(footprints: &[(i32, u64)], pooled: &[(i32, u64)], avail: Option<u64>, cgroup: Option<u64>) -> Inputs {
        Inputs { footprints: footprints.iter().copied().collect(), pooled: pooled.iter().copied().collect(), mem_available: avail, cgroup_room: cgroup }
    }

    #[test]
    fn each_process_gets_its_footprint_within_the_sites_and_the_hosts_room() {
        let bounds = Bounds { max_bytes: 64 * GIB, reserve_bytes: 8 * GIB };
        // (case, inputs, each pid's pool in GiB, bound)
        let cases: Vec<(&str, Inputs, Vec<(i32, u64)>, Bound)> = vec![
            ("room for all", inputs(&[(10, 12 * GIB)], &[], Some(100 * GIB), None), vec![(10, 12 * GIB)], Bound::Footprint),
            ("no GPU process: nothing", inputs(&[], &[], Some(100 * GIB), None), vec![], Bound::Footprint),
            ("the site's maximum, shared alike", inputs(&[(10, 48 * GIB), (11, 48 * GIB)], &[], Some(500 * GIB), None), vec![(10, 32 * GIB), (11, 32 * GIB)], Bound::SiteMax),
            ("the node keeps its reserve", inputs(&[(10, 12 * GIB)], &[], Some(14 * GIB), None), vec![(10, 6 * GIB)], Bound::Node),
            ("what the pool holds is its own", inputs(&[(10, 12 * GIB)], &[(10, 12 * GIB)], Some(9 * GIB), None), vec![(10, 12 * GIB)], Bound::Footprint),
            ("memory got tight: the pool shrinks", inputs(&[(10, 12 * GIB)], &[(10, 12 * GIB)], Some(2 * GIB), None), vec![(10, 6 * GIB)], Bound::Node),
            ("the job's limit binds", inputs(&[(10, 12 * GIB)], &[], Some(100 * GIB), Some(10 * GIB)), vec![(10, 2 * GIB)], Bound::Cgroup),
            ("no room at all", inputs(&[(10, 12 * GIB)], &[], Some(4 * GIB), None), vec![(10, 0)], Bound::Node),
            ("a gone process's pool is not counted", inputs(&[(10, 12 * GIB)], &[(99, 50 * GIB)], Some(14 * GIB), None), vec![(10, 6 * GIB)], Bound::Node),
            ("unreadable numbers bound nothing", inputs(&[(10, 12 * GIB)], &[], None, None), vec![(10, 12 * GIB)], Bound::Footprint),
        ];
        for (what, inputs, want, bound) in cases {
            let got = plan(&inputs, bounds);
            assert_eq!(got.sizes, want.iter().copied().collect::<BTreeMap<_, _>>(), "{what}");
            assert_eq!(got.bound, bound, "{what}");
            assert_eq!(got.total, want.iter().map(|w| w.1).sum::<u64>(), "{what}");
        }
    }

    #[test]
    fn shares_are_whole_mib_and_never_pass_the_cap() {
        let bounds = Bounds { max_bytes: 10 * GIB + 1, reserve_bytes: 0 };
        let got = plan(&inputs(&[(1, 7 * GIB + 3), (2, 5 * GIB), (3, 1)], &[], None, None), bounds);
        assert!(got.sizes.values().all(|b| b % MIB == 0), "{got:?}");
        assert!(got.total <= 10 * GIB, "{got:?}");
        assert!(got.total > 10 * GIB - 3 * MIB, "{got:?}");
    }

    fn sizer(dir: &Path) -> Sizer {
        Sizer {
            dir: dir.join("pool").join("7"),
            job: 7,
            gid: nix::unistd::getgid().as_raw(),
            gpus: vec![],
            bounds: Bounds { max_bytes: GIB, reserve_bytes: 0 },
            interval: Duration::from_secs(1),
            paths: HostPaths::default(),
        }
    }

    /// NVML's processes (or its failure) and the job's processes, as the
    /// sizer asks them.
    struct Node {
        procs: Option<Vec<crate::cuda_ckpt::GpuProcess>>,
        job: Vec<i32>,
    }

    impl GpuInfo for Node {
        fn compute_processes(&self) -> Result<Vec<crate::cuda_ckpt::GpuProcess>, crate::cuda_ckpt::GpuInfoError> {
            self.procs.clone().ok_or(crate::cuda_ckpt::GpuInfoError::Panicked)
        }
        fn free_bytes(&self, _: GpuUuid) -> Result<u64, crate::cuda_ckpt::GpuInfoError> {
            Ok(0)
        }
    }

    impl ProcessHost for Node {
        fn job_processes(&self, _: u32) -> Result<(Vec<i32>, crate::cuda_ckpt::FoundBy), crate::cuda_ckpt::HostError> {
            Ok((self.job.clone(), crate::cuda_ckpt::FoundBy::Cgroup))
        }
        fn with_descendants(&self, pid: i32) -> Vec<i32> {
            vec![pid]
        }
        fn nvidia_files(&self, _: i32) -> Result<Vec<crate::cuda_ckpt::NvidiaFile>, crate::cuda_ckpt::HostError> {
            Ok(vec![])
        }
        fn start_time(&self, _: i32) -> Option<u64> {
            None
        }
    }

    #[test]
    fn a_turn_counts_the_jobs_processes_on_the_jobs_gpus_only_and_skips_when_nvml_fails() {
        let uuid = |n: u8| GpuUuid::parse(&format!("GPU-{n}0000000-0000-0000-0000-000000000000")).unwrap();
        let used = |gpu: u8, pid: i32, bytes: u64| crate::cuda_ckpt::GpuProcess { gpu: uuid(gpu), pid, used_bytes: bytes };
        let tmp = tempfile::tempdir().unwrap();
        let mut s = sizer(tmp.path());
        s.gpus = vec![uuid(1), uuid(2)];
        let node = Node {
            // pid 10 on both of the job's GPUs; 11 another job's; 10 also on a GPU not the job's.
            procs: Some(vec![used(1, 10, 3 * GIB), used(2, 10, GIB), used(1, 11, 5 * GIB), used(3, 10, 7 * GIB)]),
            job: vec![10, 12],
        };
        let got = s.inputs(&node, &node).unwrap();
        assert_eq!(got.footprints, [(10, 4 * GIB)].into());
        assert_eq!(got.pooled.keys().copied().collect::<Vec<_>>(), [10]);
        assert!(s.inputs(&Node { procs: None, ..node }, &Node { procs: Some(vec![]), job: vec![10] }).is_none(), "NVML failed: no turn");
    }

    #[test]
    fn sizes_are_links_replaced_whole_and_removed_with_their_process() {
        if !gpu_mode_testkit::root_or_skip("the pool directory is root's") {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let s = sizer(tmp.path());
        std::fs::create_dir_all(&s.dir).unwrap();
        std::os::unix::fs::symlink("5", s.dir.join("42")).unwrap();
        s.prepare().unwrap();
        assert_eq!(std::fs::read_dir(&s.dir).unwrap().count(), 0, "an earlier run's links are gone");
        let mode = std::fs::metadata(&s.dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o750);
        let first = Plan { sizes: [(10, 12 * GIB), (11, 3 * MIB)].into(), total: 0, bound: Bound::Footprint };
        s.write(&first, &BTreeMap::new()).unwrap();
        assert_eq!(std::fs::read_link(s.dir.join("10")).unwrap(), Path::new("12288"));
        assert_eq!(std::fs::read_link(s.dir.join("11")).unwrap(), Path::new("3"));
        let second = Plan { sizes: [(10, 6 * GIB)].into(), total: 0, bound: Bound::Node };
        s.write(&second, &first.sizes).unwrap();
        assert_eq!(std::fs::read_link(s.dir.join("10")).unwrap(), Path::new("6144"));
        assert!(std::fs::symlink_metadata(s.dir.join("11")).is_err(), "a gone process's link is removed");
        assert_eq!(std::fs::read_dir(&s.dir).unwrap().count(), 1, "no link left aside");
    }

    #[test]
    fn a_pool_directory_that_is_not_roots_is_refused() {
        if !gpu_mode_testkit::root_or_skip("the pool directory is root's") {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let s = sizer(tmp.path());
        std::fs::create_dir_all(s.dir.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(tmp.path(), &s.dir).unwrap();
        assert!(matches!(s.prepare(), Err(PoolError::NotOurs { .. })), "a link in its place");
    }
}
