//! The runtime directory's layout (`runtime_dir`, /run/slurm-gpu-mode by
//! default) and the one answer to "is job J still on this node?". Below the
//! modes and the job state, so both can ask without importing each other.
//!
//! ```text
//! <runtime_dir>/            root, 0755 (users reach their MPS directories)
//!   jobs/<job>.json         job states, root-only (0700 / 0600)
//!   locks/gpu<N>.lock       per-GPU locks
//!   mps-daemons/<key>.json  the MPS daemon registry, root-only
//!   mps/<key>/{pipe,log}    each daemon's directories, the user's, 0700
//!   health/                 the node checker's cursor
//! ```

use std::path::{Path, PathBuf};

/// The directory of job state files under a runtime directory.
pub fn jobs_dir(runtime_dir: &Path) -> PathBuf {
    runtime_dir.join("jobs")
}

/// The state file of one job. Job ids are integers, so the path cannot escape
/// the directory.
pub fn state_path(runtime_dir: &Path, job_id: u32) -> PathBuf {
    jobs_dir(runtime_dir).join(format!("{job_id}.json"))
}

/// A job is live on this node from the moment its prolog starts until its
/// epilog ends: exactly while its state file exists, whatever it holds (the
/// prolog writes it first, the epilog removes it last, also when it is
/// corrupt). The one answer for MPS teardown, orphan checks and the node
/// checker.
pub fn job_is_live(runtime_dir: &Path, job_id: u32) -> bool {
    std::fs::symlink_metadata(state_path(runtime_dir, job_id)).is_ok()
}
