//! Talking to an MPS control daemon: `nvidia-cuda-mps-control` in client
//! mode, commands on stdin, with the daemon's pipe directory in the
//! environment. The client runs as the daemon's user (the daemon accepts its
//! owner), never as root: its pipe directory is the user's, and root must not
//! open paths inside it (audit item M11).

use super::MpsError;
use crate::command::run_with_timeout;
use crate::privdrop::{run_as, Identity};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

pub use gpu_mode_base::mps_daemons::PIPE_VAR;
pub const LOG_VAR: &str = "CUDA_MPS_LOG_DIRECTORY";

/// One daemon's control interface.
#[derive(Debug, Clone, Copy)]
pub struct Control<'a> {
    pub program: &'a Path,
    pub pipe_dir: &'a Path,
    pub log_dir: &'a Path,
    /// The daemon's owner, whom the client runs as.
    pub who: &'a Identity,
}

impl Control<'_> {
    /// Sends `commands`, one per line, and returns the daemon's answers.
    pub fn send(&self, commands: &[String], timeout: Duration) -> Result<String, MpsError> {
        let mut cmd = Command::new(self.program);
        cmd.env_clear().env(PIPE_VAR, self.pipe_dir).env(LOG_VAR, self.log_dir).current_dir("/");
        run_as(&mut cmd, self.who);
        let input = commands.iter().map(|c| format!("{c}\n")).collect::<String>();
        let out = run_with_timeout(cmd, Some(input.as_bytes()), timeout).map_err(MpsError::Command)?;
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if !out.status.success() || stderr.contains("Cannot find MPS control daemon") {
            return Err(MpsError::Control {
                pipe_dir: self.pipe_dir.to_path_buf(),
                commands: commands.join("; "),
                detail: format!("{}: {stderr}", out.status),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Waits until the daemon answers `get_server_list`, at most `timeout`.
    pub fn wait_ready(&self, timeout: Duration) -> Result<(), MpsError> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.send(&["get_server_list".to_string()], left.max(Duration::from_millis(100))) {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

/// The commands that apply a job's `mps:` parameters to its daemon: the
/// defaults every new client of the daemon gets. Devices are numbered as the
/// daemon sees them (0..n-1 of its CUDA_VISIBLE_DEVICES).
pub fn parameter_commands(threads: Option<u8>, mem: Option<crate::gpu_mode::MemLimit>, devices: usize) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(t) = threads {
        out.push(format!("set_default_active_thread_percentage {t}"));
    }
    if let Some(m) = mem {
        out.extend((0..devices).map(|d| format!("set_default_device_pinned_mem_limit {d} {m}")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu_mode::{MemLimit, MemUnit};

    #[test]
    fn parameters_become_control_commands() {
        assert!(parameter_commands(None, None, 2).is_empty());
        assert_eq!(parameter_commands(Some(25), None, 2), vec!["set_default_active_thread_percentage 25"]);
        assert_eq!(
            parameter_commands(Some(5), Some(MemLimit { amount: 20, unit: MemUnit::GiB }), 2),
            vec![
                "set_default_active_thread_percentage 5",
                "set_default_device_pinned_mem_limit 0 20G",
                "set_default_device_pinned_mem_limit 1 20G"
            ]
        );
    }

    #[test]
    fn the_client_runs_as_the_daemons_owner() {
        if !gpu_mode_testkit::root_or_skip("to change user") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("ctl");
        std::fs::write(&fake, "#!/bin/sh\n/usr/bin/id -u\n").unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let nobody = Identity { uid: 65534, gid: 65534, groups: vec![65534] };
        let c = Control { program: &fake, pipe_dir: dir.path(), log_dir: dir.path(), who: &nobody };
        assert_eq!(c.send(&["get_server_list".into()], Duration::from_secs(5)).unwrap().trim(), "65534");
    }

    #[test]
    fn a_missing_daemon_is_a_control_error() {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("ctl");
        std::fs::write(&fake, "#!/bin/sh\necho 'Cannot find MPS control daemon process' >&2\nexit 1\n").unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let me = Identity::of_user_or_bare(unsafe { libc::geteuid() }, unsafe { libc::getegid() });
        let c = Control { program: &fake, pipe_dir: dir.path(), log_dir: dir.path(), who: &me };
        let err = c.send(&["quit".into()], Duration::from_secs(2)).unwrap_err().to_string();
        assert!(err.contains("quit") && err.contains("Cannot find MPS control daemon"), "{err}");
        assert!(c.wait_ready(Duration::from_millis(100)).is_err());
    }
}
