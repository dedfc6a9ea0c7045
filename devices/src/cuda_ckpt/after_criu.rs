//! The CUDA half of restoring a process tree that CRIU has just brought back.
//!
//! `restore` (restore.rs) refuses a pid whose start time changed, since that
//! is how it tells a reused pid from the checkpointed process. A
//! CRIU-restored process keeps its pid but gets a new start time (field
//! notes section 8), so here identity is proven otherwise by the caller: the
//! pids are the ones CRIU restored from the job's own images, in the tree it
//! just created. The driver must still report each one CHECKPOINTED.

use super::device_map::DeviceMap;
use super::driver::{CudaCkptDriver, DriverError, ProcessState};
use super::parallel::{run_all, Step};
use super::record::{ProcessRecord, RecordStatus};
use super::restore::RestoreReport;
use super::{CheckpointError, Checkpointer};

impl Checkpointer<'_> {
    /// Everything a restore of `procs` needs that can be known before the
    /// processes exist: every GPU they used is mapped, and each target GPU
    /// has their footprints free plus the margin. Call it before CRIU runs,
    /// so a node that cannot take the job is refused with nothing restored.
    pub fn check_restore_room(&self, procs: &[ProcessRecord], map: &DeviceMap) -> Result<(), CheckpointError> {
        self.check_device_map(procs, map)?;
        self.check_free_memory(procs, map)
    }

    /// Restores (onto `map`'s GPUs) and unlocks the CRIU-restored `procs`,
    /// all in parallel. Every one must be CHECKPOINTED first; on any failure
    /// none is unlocked, and the caller kills the tree. One that ends during
    /// its unlock is restored, and named in `gone`.
    pub fn restore_processes(&self, procs: &[ProcessRecord], map: &DeviceMap) -> Result<RestoreReport, CheckpointError> {
        for p in procs {
            match self.driver.state(p.pid) {
                Ok(ProcessState::Checkpointed) => {}
                Ok(state) => return Err(CheckpointError::CannotRestore { pid: p.pid, state: state.name() }),
                Err(e) => return Err(CheckpointError::CannotRestore { pid: p.pid, state: e.to_string() }),
            }
        }
        let start = std::time::Instant::now();
        let pids: Vec<i32> = procs.iter().map(|p| p.pid).collect();
        let restore = run_all(Step::Restore, &pids, |pid| self.driver.restore(pid, map.pairs()));
        if !restore.failures().is_empty() {
            return Err(CheckpointError::Restore { failures: restore.failures() });
        }
        let unlock = self.unlock_all(&pids);
        // A restored process that ended during its unlock: the unlock let it
        // go and it ran to its end at once (one dumped on its way out, its
        // work done as the signal came; seen in CI's churn). Restored, not
        // failed: how it ended is the application's, for the caller to
        // report.
        let gone: Vec<i32> = unlock.runs.iter().filter(|r| r.result.as_ref().is_err_and(DriverError::process_ended)).map(|r| r.pid).collect();
        let failures: Vec<_> = unlock.failures().into_iter().filter(|f| !gone.contains(&f.pid)).collect();
        if !failures.is_empty() {
            return Err(CheckpointError::Unlock { failures });
        }
        Ok(RestoreReport {
            target: format!("pid {}", pids.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(",")),
            record_status: RecordStatus::Complete,
            restored: procs.to_vec(),
            unlocked_only: Vec::new(),
            gone,
            phases: vec![restore, unlock],
            total_ms: super::ms(start.elapsed()),
        })
    }
}
