//! The node's checkpoint-readiness verdict, as a file: the node checker
//! (core::health::readiness) writes `<runtime_dir>/checkpoint-readiness.json`
//! (root's, 0644) after each full run; `gpu-mode-run`, which runs as the
//! job's user, reads it at the job's start and prints one line when the
//! node cannot checkpoint (the job still runs: only a checkpoint at
//! preemption would fail, and the job would start over); `gpu-mode-status`
//! shows it. A file, because the checks take a CRIU run and a spawn as
//! another user: too much for every job's start, and the wrapper may not do
//! either.

use serde::{Deserialize, Serialize};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The file under the runtime directory.
pub const FILE: &str = "checkpoint-readiness.json";
/// Bump when a field changes meaning or is removed.
pub const VERSION: u32 = 1;
/// A verdict larger than this is not read (a few lines of text expected).
const MAX_BYTES: u64 = 64 << 10;

/// One readiness check's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Item {
    pub check: String,
    pub ready: bool,
    /// What was found and, when not ready, the fix.
    pub message: String,
    /// Not ready only for jobs past a size (host memory or free space below
    /// the largest GPU's memory): the node checkpoints smaller ones, so a
    /// job is not told it cannot be (absent in older verdicts: false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub bounds_only: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    pub version: u32,
    /// When the node checker judged (Unix seconds).
    pub checked_unix: u64,
    pub items: Vec<Item>,
}

impl Verdict {
    /// Whether the node can checkpoint (perhaps not every size of job).
    pub fn ready(&self) -> bool {
        self.items.iter().all(|i| i.ready || i.bounds_only)
    }

    /// Whether some finding bounds the size of a job it can checkpoint.
    pub fn bounded(&self) -> bool {
        self.items.iter().any(|i| !i.ready && i.bounds_only)
    }

    /// The line a checkpoint job gets on its stderr at its start, when the
    /// node cannot checkpoint: the first problem, how many more, and what it
    /// means for the job.
    pub fn job_start_line(&self) -> Option<String> {
        let problems: Vec<&Item> = self.items.iter().filter(|i| !i.ready && !i.bounds_only).collect();
        let first = problems.first()?;
        let more = if problems.len() > 1 { format!(" (+{} more)", problems.len() - 1) } else { String::new() };
        Some(format!(
            "warning: this node cannot checkpoint ({}: {}{more}; gpu-mode-status shows all): the job runs, but if it is preempted it starts over",
            first.check, first.message
        ))
    }
}

pub fn path(runtime_dir: &Path) -> PathBuf {
    runtime_dir.join(FILE)
}

/// Writes the verdict atomically, readable by every job's wrapper.
pub fn write(runtime_dir: &Path, verdict: &Verdict) -> Result<(), String> {
    let p = path(runtime_dir);
    let text = serde_json::to_vec_pretty(verdict).map_err(|e| format!("cannot serialize the checkpoint readiness: {e}"))?;
    crate::fsutil::write_atomic(&p, &text, 0o644).map_err(|e| format!("cannot write {}: {e}", p.display()))
}

/// The verdict at `path`, if there is one the node checker (root) wrote:
/// a missing, foreign, oversized or unreadable file is no verdict (the
/// wrapper then says nothing, rather than something wrong).
pub fn read(path: &Path) -> Option<Verdict> {
    // O_NOFOLLOW: the file is root's, never a link to elsewhere.
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(path).ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.uid() != 0 || meta.len() > MAX_BYTES {
        return None;
    }
    let mut text = Vec::new();
    file.take(MAX_BYTES).read_to_end(&mut text).ok()?;
    let verdict: Verdict = serde_json::from_slice(&text).ok()?;
    (verdict.version == VERSION).then_some(verdict)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(check: &str, ready: bool, message: &str) -> Item {
        Item { check: check.into(), ready, message: message.into(), bounds_only: false }
    }

    fn bounding(check: &str, message: &str) -> Item {
        Item { check: check.into(), ready: false, message: message.into(), bounds_only: true }
    }

    #[test]
    fn a_job_is_told_only_when_something_is_not_ready() {
        let v = |items| Verdict { version: VERSION, checked_unix: 1, items };
        let cases: Vec<(Verdict, Option<&str>)> = vec![
            (v(vec![]), None),
            (v(vec![item("ckpt_kernel", true, "Linux 6.18")]), None),
            (
                v(vec![item("ckpt_kernel", true, "Linux 6.18"), item("ckpt_criu", false, "/x/criu is missing; fix: scripts/install-criu.sh")]),
                Some("warning: this node cannot checkpoint (ckpt_criu: /x/criu is missing; fix: scripts/install-criu.sh; gpu-mode-status shows all): the job runs, but if it is preempted it starts over"),
            ),
            (
                v(vec![item("ckpt_criu", false, "a"), item("ckpt_dirs", false, "b"), item("ckpt_memory", false, "c")]),
                Some("warning: this node cannot checkpoint (ckpt_criu: a (+2 more); gpu-mode-status shows all): the job runs, but if it is preempted it starts over"),
            ),
            // Host memory below a GPU's bounds the jobs it checkpoints: a job
            // is not told the node cannot (the GPU machines: 125 GiB for 139).
            (v(vec![item("ckpt_kernel", true, "Linux 6.18"), bounding("ckpt_memory", "host memory 125.0 GiB is less than GPU 0's 139.5 GiB")]), None),
            // A bound beside a real problem: the problem is what the job is told.
            (
                v(vec![bounding("ckpt_memory", "m"), item("ckpt_criu", false, "c")]),
                Some("warning: this node cannot checkpoint (ckpt_criu: c; gpu-mode-status shows all): the job runs, but if it is preempted it starts over"),
            ),
        ];
        for (verdict, want) in cases {
            assert_eq!(verdict.job_start_line().as_deref(), want, "{verdict:?}");
            assert_eq!(verdict.ready(), want.is_none());
        }
    }

    #[test]
    fn only_roots_file_of_this_version_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let verdict = Verdict { version: VERSION, checked_unix: 5, items: vec![item("ckpt_criu", false, "missing")] };
        write(dir.path(), &verdict).unwrap();
        let p = path(dir.path());
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, 0o644);
        let running_as_root = nix::unistd::geteuid().is_root();
        assert_eq!(read(&p), running_as_root.then(|| verdict.clone()), "root's file is read (and only root's)");
        assert_eq!(read(&dir.path().join("absent")), None);
        std::fs::write(&p, "{not json").unwrap();
        assert_eq!(read(&p), None, "a damaged file is no verdict");
        std::fs::write(&p, serde_json::to_string(&Verdict { version: VERSION + 1, ..verdict.clone() }).unwrap()).unwrap();
        assert_eq!(read(&p), None, "another version is no verdict");
        let link = dir.path().join("link");
        write(dir.path(), &verdict).unwrap();
        std::os::unix::fs::symlink(&p, &link).unwrap();
        assert_eq!(read(&link), None, "a link is not followed");
    }
}
