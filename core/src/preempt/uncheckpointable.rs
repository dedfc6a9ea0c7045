//! What CRIU cannot dump, found before anything is locked, and the one the
//! application can be kept from making.
//!
//! io_uring: CRIU 4.1.1 has no support for it; a process that maps an
//! io_uring instance stops `criu dump` (`Can't open <pid>'s mapfile link
//! ...: No such device or address`) after the driver has checkpointed the
//! GPU processes, and the driver's rollback is not always possible (seen on
//! 2 H200s, torchrun over NCCL: CUDA_ERROR_NOT_SUPPORTED). The common source
//! is libuv (PyTorch's TCPStore, served by torchrun's agent process, from
//! PyTorch 2.4; Node.js; Julia), which uses io_uring for file operations and
//! falls back to epoll and its thread pool when `UV_USE_IO_URING=0`:
//! gpu-mode-run sets it for the application unless the job set it itself.

/// Variables gpu-mode-run gives the application (unless already set) so
/// that it makes nothing CRIU cannot dump.
const APP_ENV: &[(&str, &str)] = &[("UV_USE_IO_URING", "0")];

/// [`APP_ENV`] less what the job's environment `env` already sets.
pub fn app_env(env: &dyn Fn(&str) -> Option<String>) -> Vec<(&'static str, String)> {
    APP_ENV.iter().filter(|(k, _)| env(k).is_none()).map(|(k, v)| (*k, v.to_string())).collect()
}

const IO_URING: &str = "anon_inode:[io_uring]";

/// Where a process holds an io_uring: its descriptors' link texts and its
/// maps text. `fd N` or `mapping A-B`.
pub fn io_uring_in(fd_links: &[(String, String)], maps: &str) -> Option<String> {
    if let Some((fd, _)) = fd_links.iter().find(|(_, link)| link == IO_URING) {
        return Some(format!("fd {fd}"));
    }
    maps.lines().find(|l| l.trim_end().ends_with(IO_URING)).and_then(|l| l.split_whitespace().next()).map(|r| format!("mapping {r}"))
}

/// Refuses a tree that holds what CRIU cannot dump, naming the process.
pub fn refuse(pids: &[i32]) -> Result<(), String> {
    for &pid in pids {
        let links: Vec<(String, String)> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|d| {
                d.flatten()
                    .filter_map(|e| Some((e.file_name().to_string_lossy().into_owned(), std::fs::read_link(e.path()).ok()?.to_string_lossy().into_owned())))
                    .collect()
            })
            .unwrap_or_default();
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        if let Some(what) = io_uring_in(&links, &maps) {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            return Err(format!(
                "pid {pid} ({}) holds an io_uring instance ({what}), which CRIU cannot checkpoint; libuv's users (PyTorch's \
                 TCPStore in torchrun, Node.js) do without it under UV_USE_IO_URING=0, which gpu-mode-run sets unless the job \
                 set it: refused, nothing was changed",
                comm.trim()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_is_given_unless_the_job_set_it() {
        assert_eq!(app_env(&|_| None), vec![("UV_USE_IO_URING", "0".to_string())]);
        assert_eq!(app_env(&|k| (k == "UV_USE_IO_URING").then(|| "1".to_string())), vec![], "the job's own choice stands");
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
        let err = refuse(&[me]).unwrap_err();
        assert!(err.contains(&format!("pid {me}")) && err.contains(&format!("fd {fd}")) && err.contains("refused"), "{err}");
        // SAFETY: closes the descriptor made above.
        unsafe { libc::close(fd as i32) };
        assert_eq!(refuse(&[me]), Ok(()));
    }
}
