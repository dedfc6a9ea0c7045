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
//! * More deleted files held open or mapped than `preempt.max_deleted_files`,
//!   or one of more than `preempt.ghost_limit_mib` (issue 37 N5): CRIU
//!   carries each in the image as a ghost file, so a tree of 9 MiB of memory
//!   made a 38 MiB image with 3,000 sparse deleted files. Not counted:
//!   unlinked /dev/shm files, which are the job's memory, /dev/shm files
//!   with a name (shm.rs carries them itself) and memfds (crate::ghosts).

/// The first driver branch NVIDIA lists CUDA IPC checkpoints for.
pub const NCCL_DRIVER_MAJOR: u32 = 610;
/// PyTorch's ProcessGroupNCCL watchdog thread's name.
const NCCL_THREAD: &str = "pt_nccl_watchdg";
/// How a user asks for NCCL's portable transports.
const PORTABLE_OPTION: &str = "--gpu-mode=checkpoint:nccl=portable";

use crate::ghosts::OverLimit;
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
    /// A deleted file (not /dev/shm's memory) larger than CRIU may carry.
    #[error(
        "pid {pid} ({comm}) holds the deleted file {path} of {mib} MiB, more than preempt.ghost_limit_mib = \
         {limit_mib}: CRIU would copy it into the image: refused, nothing was changed"
    )]
    DeletedFileTooLarge { pid: i32, comm: String, path: String, mib: u64, limit_mib: u64 },
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
/// `nccl`: the job's NCCL transport (the agent's, from the prolog);
/// `max_deleted` and `ghost_limit`: the site's bounds on deleted files.
pub fn refuse(pids: &[i32], driver_version: &str, nccl: NcclTransport, max_deleted: usize, ghost_limit: u64) -> Result<(), UncheckpointableError> {
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
    match crate::ghosts::Ghosts::survey(pids).over_limits(max_deleted, ghost_limit) {
        None => Ok(()),
        Some(OverLimit::Count { first, count }) => {
            Err(UncheckpointableError::DeletedFiles { pid: first.pid, comm: comm(first.pid), example: first.path, count, limit: max_deleted })
        }
        Some(OverLimit::Size(g)) => Err(UncheckpointableError::DeletedFileTooLarge {
            pid: g.pid,
            comm: comm(g.pid),
            path: g.path,
            mib: g.bytes.div_ceil(1 << 20),
            limit_mib: ghost_limit >> 20,
        }),
    }
}

/// The names of a process's threads (their `comm`).
fn thread_names(pid: i32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.flatten().filter_map(|t| Some(std::fs::read_to_string(t.path().join("comm")).ok()?.trim().to_string())).collect())
        .unwrap_or_default()
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
        let err = refuse(&[me], "580.159.04", NcclTransport::Native, 64, u64::MAX).unwrap_err();
        assert!(matches!(&err, UncheckpointableError::IoUring { pid, what, .. } if *pid == me && *what == format!("fd {fd}")), "{err:?}");
        let err = err.to_string();
        assert!(err.contains(&format!("pid {me}")) && err.contains(&format!("fd {fd}")) && err.contains("refused"), "{err}");
        // SAFETY: closes the descriptor made above.
        unsafe { libc::close(fd as i32) };
        assert_eq!(refuse(&[me], "580.159.04", NcclTransport::Native, 64, u64::MAX), Ok(()));
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
        let err = refuse(&[me], "610.1", NcclTransport::Native, 4, u64::MAX).unwrap_err();
        assert!(matches!(&err, UncheckpointableError::DeletedFiles { count, limit: 4, .. } if *count >= 5), "{err:?}");
        assert!(err.to_string().contains("more than preempt.max_deleted_files = 4"), "{err}");
        assert_eq!(refuse(&[me], "610.1", NcclTransport::Native, 1000, u64::MAX), Ok(()));
        drop(held);
    }

    /// A real deleted file of 2 MiB against a limit of 1 MiB: refused by
    /// size, naming it (CRIU's `--ghost-limit` would have failed the dump
    /// after the driver's lock); an unlinked /dev/shm file of 2 MiB is the
    /// job's memory and refuses nothing. Each held by a `sleep` of its own
    /// (as its stdin), so that no other test's files count.
    #[test]
    fn a_deleted_file_larger_than_the_ghost_limit_refuses_the_tree_but_shm_memory_does_not() {
        use std::io::Write;
        let holder = |file: std::fs::File| std::process::Command::new("/bin/sleep").arg("30").stdin(file).spawn().unwrap();
        let me = std::process::id();
        let shm_path = format!("/dev/shm/gpu-mode-uncheckpointable-test-{me}");
        let mut shm = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&shm_path).unwrap();
        shm.write_all(&vec![3u8; 2 << 20]).unwrap();
        std::fs::remove_file(&shm_path).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("big");
        let mut big = std::fs::File::create(&p).unwrap();
        big.write_all(&vec![1u8; 2 << 20]).unwrap();
        big.sync_all().unwrap();
        std::fs::remove_file(&p).unwrap();
        let (mut memory, mut disk) = (holder(shm), holder(big));
        let limit = 1 << 20;
        let of_memory = refuse(&[memory.id() as i32], "610.1", NcclTransport::Native, 1000, limit);
        let of_disk = refuse(&[disk.id() as i32], "610.1", NcclTransport::Native, 1000, limit);
        for c in [&mut memory, &mut disk] {
            let _ = c.kill();
            let _ = c.wait();
        }
        assert_eq!(of_memory, Ok(()), "an unlinked /dev/shm file is the job's memory");
        let want = format!("{} (deleted)", p.display());
        assert!(
            matches!(&of_disk, Err(UncheckpointableError::DeletedFileTooLarge { path, mib: 2, limit_mib: 1, .. }) if *path == want),
            "{of_disk:?}"
        );
        let text = of_disk.unwrap_err().to_string();
        assert!(text.contains(&format!("holds the deleted file {want} of 2 MiB, more than preempt.ghost_limit_mib = 1")), "{text}");
    }
}
