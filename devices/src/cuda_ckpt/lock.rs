//! Locking and unlocking a set of processes, and the rollback that undoes a
//! partial checkpoint.

use super::driver::CudaCkptDriver;
use super::parallel::{run_all, Phase, Step};
use super::record::{CheckpointRecord, ProcessPhase, RecordStatus};
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

    /// Undoes a partial checkpoint from what the record says of each process:
    /// restores the checkpointed ones, then unlocks every locked one (a
    /// process whose restore failed stays checkpointed, a process whose call
    /// did not return is left alone). Updates the record as it goes and
    /// returns what happened, process by process, for the error report.
    pub(super) fn roll_back(&self, record: &mut CheckpointRecord) -> String {
        let restored = run_all(Step::Restore, &record.pids_in(ProcessPhase::Checkpointed), |pid| self.driver.restore(pid, &[]));
        record.settle(&restored, ProcessPhase::Locked, ProcessPhase::Checkpointed);
        let unlocked = self.unlock_all(&record.pids_in(ProcessPhase::Locked));
        record.settle(&unlocked, ProcessPhase::Running, ProcessPhase::Locked);
        record.status = if record.any_touched() { RecordStatus::RollbackIncomplete } else { RecordStatus::RolledBack };
        let mut notes = rollback_notes(record, &restored, &unlocked);
        if let Err(e) = record.save(&self.settings.record_dir) {
            notes.push(format!("the record could not be updated ({e}); it still names every process that may be locked"));
        }
        notes.join("; ")
    }
}

fn rollback_notes(record: &CheckpointRecord, restored: &Phase, unlocked: &Phase) -> Vec<String> {
    let mut notes = Vec::new();
    // Calls that did not return are named once, below.
    let unknown = record.pids_in(ProcessPhase::Unknown);
    for f in restored.failures().iter().filter(|f| !unknown.contains(&f.pid)) {
        notes.push(format!("pid {} restore FAILED ({}), left checkpointed", f.pid, f.error));
    }
    for f in unlocked.failures().iter().filter(|f| !unknown.contains(&f.pid)) {
        notes.push(format!("pid {} unlock FAILED ({})", f.pid, f.error));
    }
    for p in record.processes.iter().filter(|p| unknown.contains(&p.pid)) {
        let call = p.unanswered.as_deref().unwrap_or("a driver call did not return");
        notes.push(format!("pid {} left alone, its state unknown ({call})", p.pid));
    }
    let ok = unlocked.succeeded();
    if !ok.is_empty() {
        notes.push(format!("pid {} running again", ok.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(",")));
    }
    if notes.is_empty() {
        notes.push("nothing to undo".into());
    }
    notes
}
