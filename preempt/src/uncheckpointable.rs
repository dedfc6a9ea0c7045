//! What CRIU or the driver cannot checkpoint and bring back, found before
//! anything is locked: such a tree is refused and the job starts over.
//!
//! * io_uring: CRIU 4.1.1 has no support for it; a process that maps an
//!   io_uring instance stops `criu dump` (`Can't open <pid>'s mapfile link
//!   ...: No such device or address`) after the driver has checkpointed the
//!   GPU processes. Seen on 2 H200s in torchrun's agent process: PyTorch's
//!   TCPStore (the rendezvous store the agent serves, thread
//!   `pt_tcpstore_uv`) runs a libuv loop with two rings. Neither
//!   `UV_USE_IO_URING=0` nor `USE_LIBUV=0` in the environment took them away
//!   (PyTorch 2.9), so such a tree is refused, and the job starts over.
//! * PyTorch's NCCL process groups (their watchdog thread,
//!   `pt_nccl_watchdg`): the driver checkpointed two NCCL ranks and then
//!   could not restore them (CUDA_ERROR_NOT_SUPPORTED, driver 580, 2 H200s);
//!   NVIDIA lists CUDA IPC between processes for the r610 branch. Before it
//!   the ranks are let through only in NCCL's portable-transport mode
//!   (`--gpu-mode=checkpoint:nccl=portable`, crate::nccl) with every one of
//!   its variables in each rank's initial environment: then the driver
//!   restored them (2 H200s, driver 580). [`nccl_decision`] is the table.
//! * More deleted files held open or mapped than `preempt.max_deleted_files`
//!   (issue 37 N5): CRIU carries each in the image as a ghost file (up to
//!   `--ghost-limit` of blocks apiece, `preempt.ghost_limit_mib`), so a tree
//!   of 9 MiB of memory made a 38 MiB image with 3,000 sparse deleted files.
//!   Not counted: /dev/shm files (shm.rs carries them itself) and memfds.

/// The first driver branch NVIDIA lists CUDA IPC checkpoints for.
pub const NCCL_DRIVER_MAJOR: u32 = 610;
/// PyTorch's ProcessGroupNCCL watchdog thread's name.
const NCCL_THREAD: &str = "pt_nccl_watchdg";
/// How a user asks for NCCL's portable transports.
const PORTABLE_OPTION: &str = "--gpu-mode=checkpoint:nccl=portable";

use crate::nccl::Override;
use gpu_mode_base::gpu_mode::NcclTransport;

const IO_URING: &str = "anon_inode:[io_uring]";

/// Why a tree is refused before anything is locked: what it holds that CRIU
/// or the driver cannot bring back, with the process (`comm`: its name).
/// One kind per limit, so that a test tells which one refused; each Display
/// is the message the agent has always given (reason `uncheckpointable`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UncheckpointableError {
    /// A PyTorch NCCL process group on a driver (`driver`: its version)
    /// before the branch that restores CUDA IPC.
    #[error(
        "pid {pid} ({comm}) runs a PyTorch NCCL process group (thread {NCCL_THREAD}); NVIDIA driver {driver} \
         cannot restore NCCL ranks after a checkpoint (CUDA IPC needs the r{NCCL_DRIVER_MAJOR} branch) unless \
         they stay off CUDA IPC: submit with {PORTABLE_OPTION}: refused, nothing was changed"
    )]
    Nccl { pid: i32, comm: String, driver: String },
    /// An NCCL rank of a job in the portable mode whose initial environment
    /// lacks one of its variables (`what`), so it may use CUDA IPC.
    #[error(
        "pid {pid} ({comm}) runs a PyTorch NCCL process group (thread {NCCL_THREAD}) in {PORTABLE_OPTION}, but its \
         environment has {what}: NVIDIA driver {driver} cannot restore NCCL ranks that use CUDA IPC; leave the \
         variable to gpu-mode-run: refused, nothing was changed"
    )]
    NcclOverridden { pid: i32, comm: String, driver: String, what: Override },
    /// An io_uring instance (`what`: `fd N` or `mapping A-B`).
    #[error(
        "pid {pid} ({comm}) holds an io_uring instance ({what}), which CRIU cannot checkpoint (torchrun's agent \
         holds one for PyTorch's libuv TCPStore): refused, nothing was changed"
    )]
    IoUring { pid: i32, comm: String, what: String },
    /// More deleted regular files held (open or mapped) than the site allows;
    /// `example`: one of them, as /proc shows it.
    #[error(
        "the tree holds {count} deleted files still open or mapped (pid {pid} ({comm}): {example}), more than \
         preempt.max_deleted_files = {limit}: CRIU would copy each into the image: refused, nothing was changed"
    )]
    DeletedFiles { pid: i32, comm: String, example: String, count: usize, limit: usize },
}

/// Whether a descriptor's link text or a mapping's path names a deleted
/// file CRIU would carry as a ghost: a path, `(deleted)`, not in /dev/shm
/// (shm.rs) and not a memfd (CRIU dumps those as memfds).
pub fn is_ghost_candidate(path: &str) -> bool {
    path.starts_with('/') && path.ends_with(" (deleted)") && !path.starts_with("/dev/shm/") && !path.starts_with("/memfd:")
}

/// The deleted files of one process's maps text: (inode, path).
/// A line: `start-end perms offset dev inode path`.
pub fn deleted_mappings(maps: &str) -> Vec<(u64, String)> {
    maps.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.splitn(6, ' ').collect();
            let path = f.get(5)?.trim_start();
            let inode = f.get(4)?.parse::<u64>().ok().filter(|i| *i != 0)?;
            is_ghost_candidate(path).then(|| (inode, path.to_string()))
        })
        .collect()
}

/// Where a process holds an io_uring: its descriptors' link texts and its
/// maps text. `fd N` or `mapping A-B`.
pub fn io_uring_in(fd_links: &[(String, String)], maps: &str) -> Option<String> {
    if let Some((fd, _)) = fd_links.iter().find(|(_, link)| link == IO_URING) {
        return Some(format!("fd {fd}"));
    }
    maps.lines().find(|l| l.trim_end().ends_with(IO_URING)).and_then(|l| l.split_whitespace().next()).map(|r| format!("mapping {r}"))
}

/// Whether a process whose threads have these names runs a PyTorch NCCL
/// process group.
pub fn runs_nccl(thread_names: &[String]) -> bool {
    thread_names.iter().any(|n| n == NCCL_THREAD)
}

/// Why an NCCL rank cannot be brought back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NcclRefusal {
    /// NCCL's own transports on a driver that cannot restore CUDA IPC.
    NotPortable,
    /// The portable mode, but the rank's environment overrides a variable.
    Overridden(Override),
}

/// The decision for one NCCL rank: driver branch × the job's transport ×
/// the rank's environment (`overridden`: the first portable variable its
/// initial environment lacks, crate::nccl::environ_override).
pub fn nccl_decision(driver_major: u32, transport: NcclTransport, overridden: Option<Override>) -> Result<(), NcclRefusal> {
    if driver_major >= NCCL_DRIVER_MAJOR {
        // NVIDIA lists CUDA IPC for r610; not tried here yet (docs/preempt.md).
        return Ok(());
    }
    match (transport, overridden) {
        (NcclTransport::Native, _) => Err(NcclRefusal::NotPortable),
        (NcclTransport::Portable, Some(o)) => Err(NcclRefusal::Overridden(o)),
        (NcclTransport::Portable, None) => Ok(()),
    }
}

/// The major of a driver version ("580.159.04" → 580; unreadable → 0).
pub fn driver_major(version: &str) -> u32 {
    version.split('.').next().and_then(|m| m.trim().parse().ok()).unwrap_or(0)
}

/// Refuses a tree that holds what CRIU or the driver (`driver_version`)
/// cannot checkpoint and bring back, naming the process; before anything is
/// locked. The driver's limits first: they stand whatever CRIU learns.
/// `nccl`: the job's NCCL transport (the agent's, from the prolog).
pub fn refuse(pids: &[i32], driver_version: &str, nccl: NcclTransport, max_deleted: usize) -> Result<(), UncheckpointableError> {
    let comm = |pid: i32| std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim().to_string();
    for &pid in pids {
        if !runs_nccl(&thread_names(pid)) {
            continue;
        }
        // The initial environment: what NCCL read at its init. Unreadable
        // reads as empty, which lacks every variable: refused.
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let driver = driver_version.to_string();
        match nccl_decision(driver_major(driver_version), nccl, crate::nccl::environ_override(&environ)) {
            Ok(()) => {}
            Err(NcclRefusal::NotPortable) => return Err(UncheckpointableError::Nccl { pid, comm: comm(pid), driver }),
            Err(NcclRefusal::Overridden(what)) => {
                return Err(UncheckpointableError::NcclOverridden { pid, comm: comm(pid), driver, what })
            }
        }
    }
    for &pid in pids {
        let links = crate::procfs::fd_links(std::path::Path::new(&format!("/proc/{pid}/fd"))).unwrap_or_default();
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        if let Some(what) = io_uring_in(&links, &maps) {
            return Err(UncheckpointableError::IoUring { pid, comm: comm(pid), what });
        }
    }
    deleted_files(pids, max_deleted).map_or(Ok(()), |(pid, example, count)| {
        Err(UncheckpointableError::DeletedFiles { pid, comm: comm(pid), example, count, limit: max_deleted })
    })
}

/// The names of a process's threads (their `comm`).
fn thread_names(pid: i32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.flatten().filter_map(|t| Some(std::fs::read_to_string(t.path().join("comm")).ok()?.trim().to_string())).collect())
        .unwrap_or_default()
}

/// The tree's deleted regular files, each inode number once (CRIU makes
/// one ghost per inode; /proc/<pid>/maps and stat write the device in
/// different forms, so the device is left out: two files of two file
/// systems with one inode number count once), held by a descriptor or a
/// mapping; past `max` (the pid and path of one, and the count) or `None`.
fn deleted_files(pids: &[i32], max: usize) -> Option<(i32, String, usize)> {
    use std::os::unix::fs::MetadataExt;
    let mut seen = std::collections::BTreeSet::new();
    let mut first = None;
    for &pid in pids {
        let dir = format!("/proc/{pid}/fd");
        for (fd, link) in crate::procfs::fd_links(std::path::Path::new(&dir)).unwrap_or_default() {
            if !is_ghost_candidate(&link) {
                continue;
            }
            let Ok(m) = std::fs::metadata(format!("{dir}/{fd}")) else { continue };
            if m.is_file() && seen.insert(m.ino()) {
                first.get_or_insert((pid, link));
            }
        }
        for (inode, path) in deleted_mappings(&std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default()) {
            if seen.insert(inode) {
                first.get_or_insert((pid, path));
            }
        }
    }
    (seen.len() > max).then(|| first.map(|(pid, path)| (pid, path, seen.len()))).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_ranks_are_told_by_the_watchdog_thread() {
        let names = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(runs_nccl(&names(&["python", "pt_autograd_0", "pt_nccl_heartbt", "pt_nccl_watchdg", "cuda-EvtHandlr"])));
        assert!(!runs_nccl(&names(&["python", "pt_autograd_0", "cuda-EvtHandlr"])));
    }

    /// Driver branch × the job's transport × the rank's environment.
    #[test]
    fn nccl_ranks_are_decided_by_driver_mode_and_environment() {
        use NcclTransport::{Native, Portable};
        let over = Override { name: "NCCL_P2P_DISABLE", want: "1", found: Some("0".into()) };
        // (driver version, the job's transport, the rank's override, the decision)
        type Case<'a> = (&'a str, NcclTransport, Option<&'a Override>, Result<(), NcclRefusal>);
        let table: &[Case] = &[
            ("580.159.04", Native, None, Err(NcclRefusal::NotPortable)),
            ("580.159.04", Native, Some(&over), Err(NcclRefusal::NotPortable)),
            ("580.159.04", Portable, None, Ok(())),
            ("580.159.04", Portable, Some(&over), Err(NcclRefusal::Overridden(over.clone()))),
            ("590.10", Native, None, Err(NcclRefusal::NotPortable)),
            ("590.10", Portable, None, Ok(())),
            // Unreadable driver version: the oldest.
            ("", Native, None, Err(NcclRefusal::NotPortable)),
            ("", Portable, None, Ok(())),
            ("610.10", Native, None, Ok(())),
            ("610.10", Native, Some(&over), Ok(())),
            ("610.10", Portable, Some(&over), Ok(())),
        ];
        for (driver, transport, overridden, want) in table {
            assert_eq!(&nccl_decision(driver_major(driver), *transport, overridden.cloned()), want, "{driver:?} {transport:?} {overridden:?}");
        }
    }

    /// Each refusal's kind says the words the agent has always given.
    #[test]
    fn each_refusal_says_todays_words() {
        let table = [
            (
                UncheckpointableError::Nccl { pid: 42, comm: "python".into(), driver: "580.159.04".into() },
                "pid 42 (python) runs a PyTorch NCCL process group (thread pt_nccl_watchdg); NVIDIA driver 580.159.04 \
                 cannot restore NCCL ranks after a checkpoint (CUDA IPC needs the r610 branch) unless they stay off CUDA IPC: \
                 submit with --gpu-mode=checkpoint:nccl=portable: refused, nothing was changed",
            ),
            (
                UncheckpointableError::NcclOverridden {
                    pid: 44,
                    comm: "python".into(),
                    driver: "580.159.04".into(),
                    what: Override { name: "NCCL_SHM_DISABLE", want: "1", found: Some("0".into()) },
                },
                "pid 44 (python) runs a PyTorch NCCL process group (thread pt_nccl_watchdg) in --gpu-mode=checkpoint:nccl=portable, \
                 but its environment has NCCL_SHM_DISABLE=0 (the mode needs NCCL_SHM_DISABLE=1): NVIDIA driver 580.159.04 cannot \
                 restore NCCL ranks that use CUDA IPC; leave the variable to gpu-mode-run: refused, nothing was changed",
            ),
            (
                UncheckpointableError::IoUring { pid: 43, comm: "torchrun".into(), what: "mapping 7f00-7f10".into() },
                "pid 43 (torchrun) holds an io_uring instance (mapping 7f00-7f10), which CRIU cannot checkpoint (torchrun's agent \
                 holds one for PyTorch's libuv TCPStore): refused, nothing was changed",
            ),
        ];
        for (err, text) in table {
            assert_eq!(err.to_string(), text, "{err:?}");
        }
    }

    #[test]
    fn an_io_uring_is_found_by_descriptor_or_mapping() {
        let fds = |l: &[(&str, &str)]| l.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect::<Vec<_>>();
        let maps = "7f00-7f10 rw-s 10000000 00:10 6482                       anon_inode:[io_uring]\n";
        let table: &[(Vec<(String, String)>, &str, Option<&str>)] = &[
            (fds(&[("3", "anon_inode:[eventfd]"), ("29", IO_URING)]), "", Some("fd 29")),
            (fds(&[("3", "/dev/null")]), maps, Some("mapping 7f00-7f10")),
            (fds(&[("3", "anon_inode:[eventpoll]")]), "7f00-7f10 rw-s 0 00:10 1 /dev/zero\n", None),
        ];
        for (links, maps, want) in table {
            assert_eq!(io_uring_in(links, maps).as_deref(), *want, "{links:?} {maps:?}");
        }
    }

    #[test]
    fn a_real_io_uring_refuses_the_tree_and_its_end_lifts_it() {
        #[repr(C)]
        #[derive(Default)]
        struct Params([u32; 30]);
        let mut p = Params::default();
        // SAFETY: io_uring_setup with a zeroed parameter block we own.
        let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 4u32, &mut p as *mut Params) };
        if fd < 0 {
            gpu_mode_testkit::skipped(&gpu_mode_testkit::this_test(), &format!("io_uring_setup: {}", std::io::Error::last_os_error()));
            return;
        }
        let me = std::process::id() as i32;
        let err = refuse(&[me], "580.159.04", NcclTransport::Native, 64).unwrap_err();
        assert!(matches!(&err, UncheckpointableError::IoUring { pid, what, .. } if *pid == me && *what == format!("fd {fd}")), "{err:?}");
        let err = err.to_string();
        assert!(err.contains(&format!("pid {me}")) && err.contains(&format!("fd {fd}")) && err.contains("refused"), "{err}");
        // SAFETY: closes the descriptor made above.
        unsafe { libc::close(fd as i32) };
        assert_eq!(refuse(&[me], "580.159.04", NcclTransport::Native, 64), Ok(()));
    }

    #[test]
    fn deleted_files_are_counted_but_not_shm_or_memfds() {
        let table = [
            ("/tmp/x (deleted)", true),
            ("/home/u/ckpt.tmp (deleted)", true),
            ("/dev/shm/sem.a (deleted)", false),
            ("/memfd:cuda (deleted)", false),
            ("/tmp/x", false),
            ("socket:[12] (deleted)", false),
            ("anon_inode:[eventfd]", false),
        ];
        for (link, ghost) in table {
            assert_eq!(is_ghost_candidate(link), ghost, "{link}");
        }
        let maps = "7f00-7f10 r--p 00000000 fd:01 1234                       /tmp/lib.so (deleted)\n\
                    7f10-7f20 rw-s 00000000 00:05 99                         /dev/shm/x (deleted)\n\
                    7f20-7f30 rw-p 00000000 00:00 0 \n\
                    7f30-7f40 r--p 00000000 fd:01 77                         /usr/lib/libc.so.6\n";
        assert_eq!(deleted_mappings(maps), [(1234, "/tmp/lib.so (deleted)".to_string())]);
    }

    /// Real files of this process: past the bound the tree is refused by
    /// count, at it not.
    #[test]
    fn more_deleted_files_than_allowed_refuse_the_tree() {
        let dir = tempfile::tempdir().unwrap();
        let held: Vec<std::fs::File> = (0..5)
            .map(|i| {
                let p = dir.path().join(format!("f{i}"));
                let f = std::fs::File::create(&p).unwrap();
                std::fs::remove_file(&p).unwrap();
                f
            })
            .collect();
        let me = std::process::id() as i32;
        // Other tests of this binary may hold deleted files too: at least 5.
        let err = refuse(&[me], "610.1", NcclTransport::Native, 4).unwrap_err();
        assert!(matches!(&err, UncheckpointableError::DeletedFiles { count, limit: 4, .. } if *count >= 5), "{err:?}");
        assert!(err.to_string().contains("more than preempt.max_deleted_files = 4"), "{err}");
        assert_eq!(refuse(&[me], "610.1", NcclTransport::Native, 1000), Ok(()));
        drop(held);
    }
}
