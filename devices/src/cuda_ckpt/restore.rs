//! The restore verb: check every process is still the one checkpointed and
//! every target GPU has room, restore all in parallel, then unlock all.
//! Re-running it after a partial failure picks up where it stopped. A record
//! of a checkpoint that did not complete is restorable too: exactly the
//! processes it names as (maybe) locked or checkpointed are brought back.

use super::device_map::DeviceMap;
use super::driver::{CudaCkptDriver, GpuUuid, ProcessState};
use super::parallel::{run_all, Phase, Step};
use super::record::{CheckpointRecord, ProcessRecord, RecordStatus};
use super::{CheckpointError, Checkpointer, Target};
use std::collections::BTreeMap;

#[derive(Debug, Clone, serde::Serialize)]
pub struct RestoreReport {
    pub target: String,
    /// The status of the record restored from (`complete` unless the
    /// checkpoint was interrupted or failed).
    pub record_status: RecordStatus,
    pub restored: Vec<ProcessRecord>,
    /// Processes only unlocked (restored by an earlier, interrupted run).
    pub unlocked_only: Vec<i32>,
    /// Processes of an incomplete checkpoint that have exited since: nothing
    /// to bring back. After CRIU (after_criu.rs): restored processes that
    /// ended as their unlock let them go.
    pub gone: Vec<i32>,
    pub phases: Vec<Phase>,
    pub total_ms: f64,
}

impl RestoreReport {
    pub fn bytes(&self) -> u64 {
        self.restored.iter().map(ProcessRecord::bytes).sum()
    }
}

/// What each recorded process still needs.
#[derive(Default)]
struct Plan {
    restore: Vec<ProcessRecord>,
    unlock_only: Vec<i32>,
    gone: Vec<i32>,
}

impl Checkpointer<'_> {
    pub fn restore(&self, target: &Target, map: &DeviceMap) -> Result<RestoreReport, CheckpointError> {
        let mut record = self.load_record(target)?;
        let plan = self.plan_restore(&record)?;
        self.check_device_map(&plan.restore, map)?;
        self.check_free_memory(&plan.restore, map)?;
        let start = std::time::Instant::now();
        let pids: Vec<i32> = plan.restore.iter().map(|p| p.pid).collect();
        let restore = run_all(Step::Restore, &pids, |pid| self.driver.restore(pid, map.pairs()));
        let failures = restore.failures();
        if !failures.is_empty() {
            self.note_unanswered(&mut record, &restore);
            return Err(CheckpointError::Restore { failures });
        }
        let all: Vec<i32> = pids.iter().chain(&plan.unlock_only).copied().collect();
        let unlock = self.unlock_all(&all);
        let failures = unlock.failures();
        if !failures.is_empty() {
            self.note_unanswered(&mut record, &unlock);
            return Err(CheckpointError::Unlock { failures });
        }
        // The record has served; a failure to delete it is harmless (a later
        // restore finds every process running and does nothing).
        let _ = CheckpointRecord::remove(&self.settings.record_dir, &record.target);
        Ok(RestoreReport {
            target: target.to_string(),
            record_status: record.status,
            restored: plan.restore,
            unlocked_only: plan.unlock_only,
            gone: plan.gone,
            phases: vec![restore, unlock],
            total_ms: super::ms(start.elapsed()),
        })
    }

    pub(super) fn load_record(&self, target: &Target) -> Result<CheckpointRecord, CheckpointError> {
        let dir = &self.settings.record_dir;
        let key = target.key();
        let path = CheckpointRecord::path(dir, &key);
        match CheckpointRecord::load(dir, &key) {
            Ok(Some(record)) => Ok(record),
            Ok(None) => Err(CheckpointError::NoRecord { target: target.clone(), path }),
            Err(e) => Err(CheckpointError::Record { path, detail: e.to_string() }),
        }
    }

    /// Records calls that did not return (phase `unknown`), so the next
    /// look at the record shows which process is stuck. Best effort: the
    /// driver's state decides the next restore anyway.
    fn note_unanswered(&self, record: &mut CheckpointRecord, step: &super::Phase) {
        if record.note_unanswered(step) {
            let _ = record.save(&self.settings.record_dir);
        }
    }

    /// Sorts the recorded processes by state; refuses a pid that now names
    /// another process, or a state restore cannot leave. For a checkpoint
    /// that did not complete, only the processes it may have touched count,
    /// and one that has exited is skipped: its peers must not stay locked.
    fn plan_restore(&self, record: &CheckpointRecord) -> Result<Plan, CheckpointError> {
        let mut plan = Plan::default();
        let complete = record.status == RecordStatus::Complete;
        for proc in record.processes.iter().filter(|p| complete || p.phase.touched()) {
            if self.host.start_time(proc.pid) != Some(proc.start_time) {
                if complete {
                    return Err(CheckpointError::ProcessGone { pid: proc.pid });
                }
                plan.gone.push(proc.pid);
                continue;
            }
            match self.driver.state(proc.pid) {
                Ok(ProcessState::Checkpointed) => plan.restore.push(proc.clone()),
                Ok(ProcessState::Locked) => plan.unlock_only.push(proc.pid),
                Ok(ProcessState::Running) => {}
                Ok(state) => return Err(CheckpointError::CannotRestore { pid: proc.pid, state: state.name() }),
                Err(e) => return Err(CheckpointError::CannotRestore { pid: proc.pid, state: e.to_string() }),
            }
        }
        Ok(plan)
    }

    pub(super) fn check_device_map(&self, procs: &[ProcessRecord], map: &DeviceMap) -> Result<(), CheckpointError> {
        for proc in procs {
            if let Some(f) = proc.footprint.iter().find(|f| !map.covers(f.gpu)) {
                return Err(CheckpointError::DeviceMap(format!(
                    "pid {} was checkpointed on {} but the map does not say where it goes: the driver needs every GPU mapped",
                    proc.pid, f.gpu
                )));
            }
        }
        Ok(())
    }

    /// Sums the footprints bound for each GPU and compares with its free
    /// memory less the margin. All GPUs are checked before any restore.
    pub(super) fn check_free_memory(&self, procs: &[ProcessRecord], map: &DeviceMap) -> Result<(), CheckpointError> {
        let mut need: BTreeMap<GpuUuid, (u64, Vec<i32>)> = BTreeMap::new();
        for proc in procs {
            for f in &proc.footprint {
                let entry = need.entry(map.target(f.gpu)).or_default();
                entry.0 += f.bytes;
                entry.1.push(proc.pid);
            }
        }
        let margin = self.settings.memory_margin_bytes;
        for (gpu, (bytes, pids)) in need {
            let free = self.gpus.free_bytes(gpu).map_err(|detail| CheckpointError::FreeMemory { gpu, detail })?;
            if free < bytes + margin {
                return Err(CheckpointError::NotEnoughMemory { gpu, pids, need: bytes, margin, free });
            }
        }
        Ok(())
    }
}
