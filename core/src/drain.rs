//! Draining and resuming the node through scontrol, NHC-style: our reasons all
//! start with [`DRAIN_PREFIX`]; we never override another reason and never
//! resume a node someone else drained.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Every drain reason this project sets starts with this.
pub const DRAIN_PREFIX: &str = "gpu-mode:";
/// Slurm keeps reasons short in `sinfo -R`; longer ones are cut here, not there.
pub const MAX_REASON_LEN: usize = 200;
/// scontrol talks to slurmctld; a hung controller must not hang a prolog forever.
const SCONTROL_TIMEOUT: Duration = Duration::from_secs(20);

/// Builds a drain reason: `gpu-mode: <detail>`, one line, printable ASCII, bounded.
pub fn drain_reason(detail: &str) -> String {
    let clean: String = detail
        .chars()
        .map(|c| if c.is_ascii_graphic() || c == ' ' { c } else { '?' })
        .collect();
    let mut reason = format!("{DRAIN_PREFIX} {clean}");
    if reason.len() > MAX_REASON_LEN {
        reason.truncate(MAX_REASON_LEN - 3);
        reason.push_str("...");
    }
    reason
}

#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    #[error("cannot run {path}: {source}")]
    Spawn { path: PathBuf, source: std::io::Error },
    #[error("{path} {args} timed out after {secs} s")]
    Timeout { path: PathBuf, args: String, secs: u64 },
    #[error("{path} {args} failed ({status}): {stderr}")]
    Failed { path: PathBuf, args: String, status: String, stderr: String },
}

/// Runs scontrol by absolute path with an argument vector (no shell).
#[derive(Debug, Clone)]
pub struct Scontrol {
    path: PathBuf,
}

impl Scontrol {
    pub fn new(path: &Path) -> Self {
        Scontrol { path: path.to_path_buf() }
    }

    /// `scontrol update NodeName=<node> State=DRAIN Reason=<gpu-mode: detail>`.
    pub fn drain(&self, node: &str, detail: &str) -> Result<(), DrainError> {
        let reason = drain_reason(detail);
        self.run(&["update", &format!("NodeName={node}"), "State=DRAIN", &format!("Reason={reason}")])
            .map(|_| ())
    }

    /// `scontrol update NodeName=<node> State=RESUME`.
    pub fn resume(&self, node: &str) -> Result<(), DrainError> {
        self.run(&["update", &format!("NodeName={node}"), "State=RESUME"]).map(|_| ())
    }

    /// `scontrol show node <node>`, raw text.
    pub fn show_node(&self, node: &str) -> Result<String, DrainError> {
        self.run(&["show", "node", node])
    }

    fn run(&self, args: &[&str]) -> Result<String, DrainError> {
        let joined = args.join(" ");
        let mut child = Command::new(&self.path)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| DrainError::Spawn { path: self.path.clone(), source })?;
        let start = Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if start.elapsed() < SCONTROL_TIMEOUT => std::thread::sleep(Duration::from_millis(20)),
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(DrainError::Timeout {
                        path: self.path.clone(),
                        args: joined,
                        secs: SCONTROL_TIMEOUT.as_secs(),
                    });
                }
            }
        }
        let out = child
            .wait_with_output()
            .map_err(|source| DrainError::Spawn { path: self.path.clone(), source })?;
        if !out.status.success() {
            return Err(DrainError::Failed {
                path: self.path.clone(),
                args: joined,
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn reasons_carry_the_prefix_and_are_sanitised() {
        assert_eq!(drain_reason("MPS zombie pid 12"), "gpu-mode: MPS zombie pid 12");
        assert_eq!(drain_reason("a\nb\tc"), "gpu-mode: a?b?c");
        let long = drain_reason(&"x".repeat(500));
        assert_eq!(long.len(), MAX_REASON_LEN);
        assert!(long.ends_with("..."));
    }

    /// A stand-in scontrol that records its argv, one argument per line.
    fn fake_scontrol(dir: &Path, exit: i32) -> (PathBuf, PathBuf) {
        let log = dir.join("argv");
        let script = dir.join("scontrol");
        std::fs::write(
            &script,
            format!("#!/bin/sh\nfor a in \"$@\"; do echo \"$a\"; done >> {}\necho oops >&2\nexit {exit}\n", log.display()),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        (script, log)
    }

    #[test]
    fn drain_passes_the_reason_as_one_argument() {
        let dir = tempfile::tempdir().unwrap();
        let (script, log) = fake_scontrol(dir.path(), 0);
        Scontrol::new(&script).drain("n1", "prolog: it's $(bad); `x`").unwrap();
        let argv = std::fs::read_to_string(log).unwrap();
        assert_eq!(
            argv.lines().collect::<Vec<_>>(),
            vec!["update", "NodeName=n1", "State=DRAIN", "Reason=gpu-mode: prolog: it's $(bad); `x`"]
        );
    }

    #[test]
    fn failures_are_reported_with_stderr() {
        let dir = tempfile::tempdir().unwrap();
        let (script, _) = fake_scontrol(dir.path(), 3);
        let err = Scontrol::new(&script).resume("n1").unwrap_err().to_string();
        assert!(err.contains("update NodeName=n1 State=RESUME failed") && err.contains("oops"), "{err}");
        let err = Scontrol::new(Path::new("/nonexistent/scontrol")).resume("n1").unwrap_err().to_string();
        assert!(err.contains("cannot run /nonexistent/scontrol"), "{err}");
    }
}
