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
//!   mig/                    MIG journals and marks
//!   agent/                  checkpoint agents' sockets (default place)
//!   checkpoint/             gpu-mode-cuda-ckpt's records
//!   boot-id                 the boot these records belong to
//!   criu-check              a passed `criu check` of this boot (criu::CheckCache)
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

/// `<runtime_dir>/boot-id`: the kernel boot id (`/proc/sys/kernel/random/
/// boot_id`) of the boot whose jobs wrote the records here.
pub fn boot_id_path(runtime_dir: &Path) -> PathBuf {
    runtime_dir.join("boot-id")
}

/// This boot's id; empty if the kernel does not say.
pub fn current_boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").map(|s| s.trim().to_string()).unwrap_or_default()
}

/// Writes this boot's id unless one is there (the first record of a boot).
/// Best effort: without it, a reboot that keeps the directory leaves
/// records that [`clear_previous_boot`] cannot date.
pub fn stamp_boot_if_absent(runtime_dir: &Path) {
    let path = boot_id_path(runtime_dir);
    let id = current_boot_id();
    if !id.is_empty() && std::fs::symlink_metadata(&path).is_err() {
        let _ = crate::fsutil::write_atomic(&path, format!("{id}\n").as_bytes(), 0o644);
    }
}

/// What [`clear_previous_boot`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PreviousBoot {
    /// The records it removed (paths), empty when they were this boot's.
    pub removed: Vec<String>,
    /// Why nothing was removed, when nothing was.
    pub kept_because: Option<String>,
}

/// The per-job records of an earlier boot, which died with it: job states,
/// MIG journals and marks, MPS records and directories, agent sockets,
/// CUDA checkpoint records (their processes are gone).
/// Read at boot, before slurmd (by `gpu-mode-mig apply --boot`), so the
/// epilogs Slurm may still run for jobs the reboot ended, the baseline and
/// the node checker all see the same thing: nothing of those jobs. Removed
/// only when `boot-id` names another boot: no stamp, or this boot's, means
/// jobs may be live. Where /run is a tmpfs there is nothing to find.
pub fn clear_previous_boot(runtime_dir: &Path, this_boot: &str) -> std::io::Result<PreviousBoot> {
    let stamped = match std::fs::read_to_string(boot_id_path(runtime_dir)) {
        Ok(s) => s.trim().to_string(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if runtime_dir.is_dir() {
                stamp_boot_if_absent(runtime_dir);
            }
            return Ok(PreviousBoot { removed: vec![], kept_because: Some("no boot-id stamp: records may be this boot's".into()) });
        }
        Err(e) => return Err(e),
    };
    if this_boot.is_empty() || stamped == this_boot {
        return Ok(PreviousBoot { removed: vec![], kept_because: Some("the records are this boot's".into()) });
    }
    let mut removed = Vec::new();
    for sub in ["jobs", "mig", "mps-daemons", "mps", "agent", "checkpoint"] {
        let dir = runtime_dir.join(sub);
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for e in entries.flatten() {
            crate::fsutil::remove_tree_if_present(&e.path())?;
            removed.push(e.path().display().to_string());
        }
    }
    crate::fsutil::write_atomic(&boot_id_path(runtime_dir), format!("{this_boot}\n").as_bytes(), 0o644)?;
    removed.sort();
    Ok(PreviousBoot { removed, kept_because: None })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_of_another_boot_are_cleared_and_this_boots_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path();
        let plant = || {
            for f in ["jobs/7.json", "mig/job-7.json", "mig/gpu-1.mig-on", "mps-daemons/1000-0.json", "agent/job-7.sock", "health/cursor.json"] {
                std::fs::create_dir_all(run.join(f).parent().unwrap()).unwrap();
                std::fs::write(run.join(f), b"{}").unwrap();
            }
            std::fs::create_dir_all(run.join("mps/1000-0/pipe")).unwrap();
        };
        plant();
        // No stamp: the records may be live ones (a first run after install).
        let r = clear_previous_boot(run, "boot-b").unwrap();
        assert!(r.removed.is_empty() && r.kept_because.unwrap().contains("no boot-id stamp"));
        std::fs::write(boot_id_path(run), "boot-b\n").unwrap();
        assert!(clear_previous_boot(run, "boot-b").unwrap().removed.is_empty(), "this boot's records stay");
        std::fs::write(boot_id_path(run), "boot-a\n").unwrap();
        let r = clear_previous_boot(run, "boot-b").unwrap();
        assert_eq!(r.removed.len(), 6, "{:?}", r.removed);
        assert!(!run.join("jobs/7.json").exists() && !run.join("mps/1000-0").exists());
        assert!(run.join("health/cursor.json").exists(), "the checker's cursor dates itself");
        assert_eq!(std::fs::read_to_string(boot_id_path(run)).unwrap().trim(), "boot-b");
    }

    #[test]
    fn the_first_record_of_a_boot_stamps_it() {
        let dir = tempfile::tempdir().unwrap();
        stamp_boot_if_absent(dir.path());
        assert_eq!(std::fs::read_to_string(boot_id_path(dir.path())).unwrap().trim(), current_boot_id());
        std::fs::write(boot_id_path(dir.path()), "older\n").unwrap();
        stamp_boot_if_absent(dir.path());
        assert_eq!(std::fs::read_to_string(boot_id_path(dir.path())).unwrap(), "older\n", "a stamp is never overwritten here");
    }
}
