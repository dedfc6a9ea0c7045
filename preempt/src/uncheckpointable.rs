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
//!   NVIDIA lists CUDA IPC between processes for the r610 branch. Refused on
//!   drivers before it.

/// The first driver branch NVIDIA lists CUDA IPC checkpoints for.
const NCCL_DRIVER_MAJOR: u32 = 610;
/// PyTorch's ProcessGroupNCCL watchdog thread's name.
const NCCL_THREAD: &str = "pt_nccl_watchdg";

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
         cannot restore NCCL ranks after a checkpoint (CUDA IPC needs the r{NCCL_DRIVER_MAJOR} branch): refused, \
         nothing was changed"
    )]
    Nccl { pid: i32, comm: String, driver: String },
    /// An io_uring instance (`what`: `fd N` or `mapping A-B`).
    #[error(
        "pid {pid} ({comm}) holds an io_uring instance ({what}), which CRIU cannot checkpoint (torchrun's agent \
         holds one for PyTorch's libuv TCPStore): refused, nothing was changed"
    )]
    IoUring { pid: i32, comm: String, what: String },
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
/// process group that a driver of branch `driver_major` cannot bring back.
pub fn nccl_unsupported(thread_names: &[String], driver_major: u32) -> bool {
    driver_major < NCCL_DRIVER_MAJOR && thread_names.iter().any(|n| n == NCCL_THREAD)
}

/// The major of a driver version ("580.159.04" → 580; unreadable → 0).
pub fn driver_major(version: &str) -> u32 {
    version.split('.').next().and_then(|m| m.trim().parse().ok()).unwrap_or(0)
}

/// Refuses a tree that holds what CRIU or the driver (`driver_version`)
/// cannot checkpoint and bring back, naming the process; before anything is
/// locked. The driver's limits first: they stand whatever CRIU learns.
pub fn refuse(pids: &[i32], driver_version: &str) -> Result<(), UncheckpointableError> {
    let comm = |pid: i32| std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim().to_string();
    for &pid in pids {
        let threads: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| d.flatten().filter_map(|t| Some(std::fs::read_to_string(t.path().join("comm")).ok()?.trim().to_string())).collect())
            .unwrap_or_default();
        if nccl_unsupported(&threads, driver_major(driver_version)) {
            return Err(UncheckpointableError::Nccl { pid, comm: comm(pid), driver: driver_version.to_string() });
        }
    }
    for &pid in pids {
        let links = crate::procfs::fd_links(std::path::Path::new(&format!("/proc/{pid}/fd"))).unwrap_or_default();
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        if let Some(what) = io_uring_in(&links, &maps) {
            return Err(UncheckpointableError::IoUring { pid, comm: comm(pid), what });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_groups_are_refused_only_before_the_driver_branch_that_restores_them() {
        let names = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let nccl = names(&["python", "pt_autograd_0", "pt_nccl_heartbt", "pt_nccl_watchdg", "cuda-EvtHandlr"]);
        let gloo = names(&["python", "pt_autograd_0", "cuda-EvtHandlr"]);
        let table: &[(&Vec<String>, &str, bool)] = &[(&nccl, "580.159.04", true), (&nccl, "610.10", false), (&gloo, "580.159.04", false), (&nccl, "", true)];
        for (threads, driver, want) in table {
            assert_eq!(nccl_unsupported(threads, driver_major(driver)), *want, "{threads:?} on {driver:?}");
        }
    }

    /// Each refusal's kind says the words the agent has always given.
    #[test]
    fn each_refusal_says_todays_words() {
        let table = [
            (
                UncheckpointableError::Nccl { pid: 42, comm: "python".into(), driver: "580.159.04".into() },
                "pid 42 (python) runs a PyTorch NCCL process group (thread pt_nccl_watchdg); NVIDIA driver 580.159.04 \
                 cannot restore NCCL ranks after a checkpoint (CUDA IPC needs the r610 branch): refused, nothing was changed",
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
        let err = refuse(&[me], "580.159.04").unwrap_err();
        assert!(matches!(&err, UncheckpointableError::IoUring { pid, what, .. } if *pid == me && *what == format!("fd {fd}")), "{err:?}");
        let err = err.to_string();
        assert!(err.contains(&format!("pid {me}")) && err.contains(&format!("fd {fd}")) && err.contains("refused"), "{err}");
        // SAFETY: closes the descriptor made above.
        unsafe { libc::close(fd as i32) };
        assert_eq!(refuse(&[me], "580.159.04"), Ok(()));
    }
}
