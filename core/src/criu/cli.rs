//! The real CRIU: the `criu` binary, by absolute path, with argument vectors,
//! a clean environment and a bound on every run (module docs: why the CLI).

use super::{Criu, CriuError, CriuVersion, DumpReport, DumpRequest, RestoreReport, RestoreRequest};
use crate::command::{run_with_timeout, CommandError};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

pub const DUMP_LOG: &str = "dump.log";
pub const RESTORE_LOG: &str = "restore.log";
/// `criu --version` and `criu check` take well under a second.
const QUICK: Duration = Duration::from_secs(30);

pub struct CriuCli {
    pub binary: PathBuf,
    /// Bound on one dump or restore (`checkpoint.criu_timeout_ms`).
    pub timeout: Duration,
}

/// `criu dump`'s arguments.
pub fn dump_args(req: &DumpRequest) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec!["dump".into(), "--tree".into(), req.pid.to_string().into()];
    a.extend(common(&req.images_dir, DUMP_LOG));
    if req.tcp_established {
        a.extend(["--tcp-established".into(), "--network-lock".into(), "nftables".into()]);
    }
    a
}

/// `criu restore`'s arguments: detached, as the caller's child (sibling of
/// criu), cgroups left alone (criu already runs in the target cgroup), and
/// stopped: the agent checks what CRIU reopened as root before the tree
/// runs (preempt::held), then sends SIGCONT.
pub fn restore_args(req: &RestoreRequest) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec!["restore".into()];
    a.extend(common(&req.images_dir, RESTORE_LOG));
    a.extend(["--restore-detached".into(), "--restore-sibling".into(), "--leave-stopped".into(), "--pidfile".into(), req.pidfile.clone().into()]);
    if req.tcp_established {
        a.extend(["--tcp-established".into(), "--network-lock".into(), "nftables".into()]);
    }
    a
}

fn common(images: &Path, log: &str) -> Vec<OsString> {
    vec![
        "--images-dir".into(),
        images.into(),
        "--log-file".into(),
        log.into(),
        "-v2".into(),
        "--file-locks".into(),
        "--ext-unix-sk".into(),
        "--manage-cgroups=ignore".into(),
    ]
}

/// The last few error lines of a CRIU log, for the message.
pub fn log_errors(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    // RLIMIT_NOFILE is raised best-effort and reported as an error when the
    // hard limit forbids it; it does not fail the run.
    let errors: Vec<&str> = text.lines().filter(|l| l.starts_with("Error") && !l.contains("RLIMIT_NOFILE")).collect();
    let tail: Vec<&str> = errors.iter().rev().take(3).rev().copied().collect();
    if tail.is_empty() {
        "no error in its log".into()
    } else {
        tail.join("; ")
    }
}

impl CriuCli {
    fn command(&self, args: &[OsString]) -> Command {
        let mut cmd = Command::new(&self.binary);
        cmd.args(args).env_clear().env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin").current_dir("/");
        cmd
    }

    fn run(&self, verb: &'static str, cmd: Command, log: &Path, bound: Duration) -> Result<(), CriuError> {
        let out = run_with_timeout(cmd, None, bound).map_err(|e| match e {
            CommandError::Timeout { ms, .. } => CriuError::Timeout { verb, ms: ms as u64, log: log.to_path_buf() },
            CommandError::Spawn { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                CriuError::Missing { path: self.binary.clone(), detail: source.to_string() }
            }
            other => CriuError::Other { verb, detail: other.to_string() },
        })?;
        if out.status.success() {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        let detail = if stderr.is_empty() { log_errors(log) } else { format!("{}; {stderr}", log_errors(log)) };
        Err(CriuError::Failed { verb, status: out.status.to_string(), detail, log: log.to_path_buf() })
    }

    fn version(&self) -> Result<CriuVersion, CriuError> {
        if !self.binary.is_absolute() {
            return Err(CriuError::Missing { path: self.binary.clone(), detail: "not an absolute path".into() });
        }
        let out = run_with_timeout(self.command(&["--version".into()]), None, QUICK).map_err(|e| match e {
            CommandError::Spawn { source, .. } => CriuError::Missing { path: self.binary.clone(), detail: source.to_string() },
            other => CriuError::Other { verb: "--version", detail: other.to_string() },
        })?;
        let text = String::from_utf8_lossy(&out.stdout);
        CriuVersion::parse(&text)
            .ok_or_else(|| CriuError::Missing { path: self.binary.clone(), detail: format!("no version in {:?}", text.trim()) })
    }
}

impl Criu for CriuCli {
    fn check(&self) -> Result<CriuVersion, CriuError> {
        let version = self.version()?;
        if !version.new_enough() {
            return Err(CriuError::TooOld { path: self.binary.clone(), version: version.to_string() });
        }
        let out = run_with_timeout(self.command(&["check".into()]), None, QUICK)
            .map_err(|e| CriuError::CheckFailed { path: self.binary.clone(), detail: e.to_string() })?;
        if !out.status.success() {
            let text = String::from_utf8_lossy(&out.stderr).lines().filter(|l| l.starts_with("Error")).collect::<Vec<_>>().join("; ");
            return Err(CriuError::CheckFailed { path: self.binary.clone(), detail: text });
        }
        Ok(version)
    }

    fn dump(&self, req: &DumpRequest) -> Result<DumpReport, CriuError> {
        let log = req.images_dir.join(DUMP_LOG);
        let start = Instant::now();
        self.run("dump", self.command(&dump_args(req)), &log, self.timeout)?;
        Ok(DumpReport { ms: start.elapsed().as_secs_f64() * 1000.0, log })
    }

    fn restore(&self, req: &RestoreRequest) -> Result<RestoreReport, CriuError> {
        let log = req.images_dir.join(RESTORE_LOG);
        crate::fsutil::remove_if_present(&req.pidfile).map_err(|e| CriuError::Other { verb: "restore", detail: e.to_string() })?;
        let mut cmd = self.command(&restore_args(req));
        req.cgroup.join_before_exec(&mut cmd).map_err(|detail| CriuError::Other { verb: "restore", detail })?;
        let start = Instant::now();
        self.run("restore", cmd, &log, self.timeout)?;
        let ms = start.elapsed().as_secs_f64() * 1000.0;
        let text = std::fs::read_to_string(&req.pidfile).unwrap_or_default();
        let _ = crate::fsutil::remove_if_present(&req.pidfile);
        let pid = text.trim().parse().map_err(|_| CriuError::Other {
            verb: "restore",
            detail: format!("no root pid in {} ({:?})", req.pidfile.display(), text.trim()),
        })?;
        Ok(RestoreReport { pid, ms, log })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::criu::TargetCgroup;

    fn strings(a: Vec<OsString>) -> Vec<String> {
        a.into_iter().map(|s| s.to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn argument_vectors_say_what_the_module_docs_promise() {
        let dump = DumpRequest { pid: 42, images_dir: "/img/7/0".into(), tcp_established: false };
        assert_eq!(
            strings(dump_args(&dump)).join(" "),
            "dump --tree 42 --images-dir /img/7/0 --log-file dump.log -v2 --file-locks --ext-unix-sk --manage-cgroups=ignore"
        );
        let tcp = DumpRequest { tcp_established: true, ..dump };
        assert!(strings(dump_args(&tcp)).join(" ").ends_with("--tcp-established --network-lock nftables"));
        let restore = RestoreRequest {
            images_dir: "/img/7/0".into(),
            cgroup: TargetCgroup { lines: vec![], procs_files: vec![] },
            pidfile: "/run/x/pid".into(),
            tcp_established: false,
        };
        let text = strings(restore_args(&restore)).join(" ");
        assert_eq!(
            text,
            "restore --images-dir /img/7/0 --log-file restore.log -v2 --file-locks --ext-unix-sk --manage-cgroups=ignore \
             --restore-detached --restore-sibling --leave-stopped --pidfile /run/x/pid"
        );
        assert!(!text.contains("--shell-job"));
    }

    #[test]
    fn a_missing_or_relative_binary_is_named() {
        let cli = CriuCli { binary: "/nonexistent/criu".into(), timeout: Duration::from_secs(5) };
        let err = cli.check().unwrap_err().to_string();
        assert!(err.contains("CRIU is not installed at /nonexistent/criu") && err.contains("install-criu.sh"), "{err}");
        let cli = CriuCli { binary: "criu".into(), timeout: Duration::from_secs(5) };
        assert!(matches!(cli.check(), Err(CriuError::Missing { .. })));
    }

    #[test]
    fn an_old_criu_is_refused_by_version() {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("criu");
        std::fs::write(&fake, "#!/bin/sh\necho 'Version: 3.17.1'\n").unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let err = CriuCli { binary: fake, timeout: Duration::from_secs(5) }.check().unwrap_err().to_string();
        assert!(err.contains("is version 3.17.1") && err.contains("needs CRIU 4.0 or later"), "{err}");
    }

    #[test]
    fn log_errors_skip_the_rlimit_noise() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("dump.log");
        std::fs::write(
            &log,
            "Warn (a): x\nError (criu/util.c:1533): rlimit: Can't setup RLIMIT_NOFILE for self\nError (b): No space left on device\n",
        )
        .unwrap();
        assert_eq!(log_errors(&log), "Error (b): No space left on device");
        assert_eq!(log_errors(&dir.path().join("none")), "no error in its log");
    }
}
