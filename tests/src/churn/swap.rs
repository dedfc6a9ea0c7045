//! The path-swap attack among the churn's faults (security review F1): a
//! checkpoint job's counter keeps a file of its user's open
//! (`cuda-sim-counter --keep-open`); once the product says the job was
//! checkpointed, and while the job waits requeued, the file is replaced by
//! a symlink to a root-owned file of the same size and mode (the user's
//! move). The restore, CRIU running as the user, cannot open the target:
//! the job fails with the restore's refusal, the image is kept, the root
//! file is untouched, and nothing drains ([`judge`] asks only that the
//! attack failed: Slurm may end a job before its restore runs). Jobs the
//! drawn preemptions never checkpointed just keep their file and end as
//! any other.

use crate::ckpt_jobs::Who;
use crate::Cluster;
use anyhow::{Context, Result};
use std::path::PathBuf;
use std::time::Duration;

/// What the root-owned file holds; the bait has the same length.
const ROOT_TEXT: &[u8] = b"root-owned: the churn's swap target\n";

/// One job's bait (the user's file the counter keeps open) and the
/// root-owned file it will point to.
#[derive(Debug, Clone)]
pub struct Bait {
    pub path: PathBuf,
    pub target: PathBuf,
}

/// Makes `<cluster>/bait/<user>/<name>` (the user's, 0644) and its root-owned
/// target beside the user's directory (0644, same length).
pub fn prepare(c: &Cluster, user: &str, name: &str) -> Result<Bait> {
    use std::os::unix::fs::PermissionsExt;
    let crate::users::User { uid, gid } = crate::users::lookup(user)?;
    let dir = c.dir.join("bait").join(user);
    std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
    std::os::unix::fs::chown(&dir, Some(uid), Some(gid))?;
    let path = dir.join(name);
    std::fs::write(&path, vec![b'x'; ROOT_TEXT.len()])?;
    std::os::unix::fs::chown(&path, Some(uid), Some(gid))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
    let target = c.dir.join("bait").join(format!("{name}.root"));
    std::fs::write(&target, ROOT_TEXT)?;
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644))?;
    Ok(Bait { path, target })
}

/// Swaps the bait once job `job` says it was checkpointed (the swap lands
/// while it waits requeued: a requeued job waits about 11 s to start
/// again). Returns whether it swapped; gives up when the job counted to
/// its end or `stop` is set.
pub fn swap_when_checkpointed(c: &Cluster, job: u32, bait: &Bait, owner: Who, stop: &std::sync::atomic::AtomicBool) -> Result<bool> {
    let Who::User(user) = owner else { return Ok(false) };
    let checkpointed = format!("gpu-mode-run: job {job} checkpointed:");
    // The output every 100 ms (a file read); Slurm's view every 2 s only:
    // scontrol calls of every swapping job at once load slurmctld and slow
    // every job's launch.
    for tick in 0u64.. {
        if stop.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(false);
        }
        let out = c.job_output(job);
        if let Some(at) = out.find(&checkpointed) {
            // A counter checkpointed before its first step may not have
            // opened its file yet: nothing of the user's is held to swap.
            if !out[..at].lines().any(|l| l.starts_with("step ")) {
                return Ok(false);
            }
            break;
        }
        if out.contains("DONE count=") || (tick % 20 == 19 && c.job(job).is_ok_and(|i| crate::ckpt_jobs::finished(&i))) {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let crate::users::User { uid, gid } = crate::users::lookup(user)?;
    std::fs::remove_file(&bait.path)?;
    std::os::unix::fs::symlink(&bait.target, &bait.path)?;
    std::os::unix::fs::lchown(&bait.path, Some(uid), Some(gid))?;
    Ok(true)
}

/// What is wrong with a swapped job's end, if anything: the attack must
/// have failed. The root file is as it was, and the counter never went on
/// to its end after the swap (a restored process holding the root file
/// would). The expected way is the restore's refusal (CRIU, as the user,
/// cannot open the root file: [`refused`]); a job that Slurm ended before
/// its restore ran is no attack either.
pub fn judge(job: &str, output: &str, bait: &Bait) -> Option<String> {
    let checkpointed = format!("gpu-mode-run: job {job} checkpointed:");
    let after = output.find(&checkpointed).map_or("", |at| &output[at..]);
    if after.contains("DONE count=") {
        return Some("swapped: the counter ran to its end after the swap".into());
    }
    match std::fs::read(&bait.target) {
        Ok(now) if now == ROOT_TEXT => None,
        Ok(now) => Some(format!("swapped: the root-owned file was written: {:?}", String::from_utf8_lossy(&now))),
        Err(e) => Some(format!("swapped: the root-owned file cannot be read: {e}")),
    }
}

/// Whether the job's restore was refused because CRIU, as the user, could
/// not open the root file (the report counts these).
pub fn refused(job: &str, output: &str) -> bool {
    output.lines().any(|l| l.starts_with(&format!("gpu-mode-run: cannot restore job {job}")) && l.contains("Permission denied"))
}
