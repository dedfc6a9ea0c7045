//! Locking and unlocking a set of processes, and the rollback that undoes a
//! partial checkpoint.

use super::parallel::{run_all, Phase, Step};
use super::Checkpointer;

impl Checkpointer<'_> {
    /// Locks every process in parallel, each with the configured timeout.
    pub(super) fn lock_all(&self, pids: &[i32]) -> Phase {
        let timeout = self.settings.lock_timeout_ms;
        run_all(Step::Lock, pids, |pid| self.driver.lock(pid, timeout))
    }

    pub(super) fn unlock_all(&self, pids: &[i32]) -> Phase {
        run_all(Step::Unlock, pids, |pid| self.driver.unlock(pid))
    }

    /// Undoes a partial checkpoint: restores `checkpointed`, then unlocks every
    /// process of `locked` that is not still checkpointed. Returns what
    /// happened, process by process, for the error report.
    pub(super) fn roll_back(&self, checkpointed: &[i32], locked: &[i32]) -> String {
        let restored = run_all(Step::Restore, checkpointed, |pid| self.driver.restore(pid, &[]));
        let stuck: Vec<i32> = restored.failures().iter().map(|f| f.pid).collect();
        let to_unlock: Vec<i32> = locked.iter().copied().filter(|p| !stuck.contains(p)).collect();
        let unlocked = self.unlock_all(&to_unlock);
        let mut notes = Vec::new();
        for f in restored.failures() {
            notes.push(format!("pid {} restore FAILED ({}), left checkpointed", f.pid, f.error));
        }
        for f in unlocked.failures() {
            notes.push(format!("pid {} unlock FAILED ({})", f.pid, f.error));
        }
        let ok = unlocked.succeeded();
        if !ok.is_empty() {
            notes.push(format!("pid {} running again", ok.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(",")));
        }
        if notes.is_empty() {
            notes.push("nothing to undo".into());
        }
        notes.join("; ")
    }
}
