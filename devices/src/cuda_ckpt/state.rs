//! The state verb: each process's checkpoint state as the driver reports it.

use super::driver::{CudaCkptDriver, ProcessState};
use super::record::{CheckpointRecord, ProcessPhase, ProcessRecord, RecordStatus};
use super::{CheckpointError, Checkpointer, Target};
use std::collections::BTreeSet;

#[derive(Debug, Clone, serde::Serialize)]
pub struct ProcessStateReport {
    pub pid: i32,
    /// `None` when the driver does not know the process as a CUDA process.
    pub state: Option<ProcessState>,
    /// The thread that runs a restore inside the process (for CRIU).
    pub restore_thread: Option<i32>,
    /// How many /dev/nvidia* descriptors and mappings it holds now.
    pub gpu_files: usize,
    pub error: Option<String>,
    /// How far the checkpoint got with it, when the record names it.
    pub phase: Option<ProcessPhase>,
    /// The driver call that did not return, when `phase` is `unknown`.
    pub unanswered: Option<String>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct StateReport {
    pub target: String,
    /// The checkpoint record's path, when one exists.
    pub record: Option<String>,
    /// The record's status (`in_progress` for a checkpoint that did not finish).
    pub record_status: Option<RecordStatus>,
    pub processes: Vec<ProcessStateReport>,
}

impl Checkpointer<'_> {
    /// Reports every process of the target that the driver knows or that
    /// holds a GPU file, plus every process of the checkpoint record.
    pub fn state(&self, target: &Target) -> Result<StateReport, CheckpointError> {
        let record = CheckpointRecord::load(&self.settings.record_dir, &target.key()).ok().flatten();
        let mut pids: BTreeSet<i32> = record.iter().flat_map(|r| r.processes.iter().map(|p| p.pid)).collect();
        match self.scope(target) {
            Ok((scope, _)) => pids.extend(scope),
            Err(e) if pids.is_empty() => return Err(e),
            Err(_) => {}
        }
        let recorded = |pid: i32| record.as_ref().and_then(|r| r.processes.iter().find(|p| p.pid == pid));
        let processes = pids.into_iter().filter_map(|pid| self.process_state(pid, recorded(pid))).collect();
        Ok(StateReport {
            target: target.to_string(),
            record: record.as_ref().map(|r| CheckpointRecord::path(&self.settings.record_dir, &r.target).display().to_string()),
            record_status: record.map(|r| r.status),
            processes,
        })
    }

    /// `None` for a process that is neither CUDA nor a GPU holder (a shell,
    /// slurmstepd) nor in the record: it has no checkpoint state to report.
    fn process_state(&self, pid: i32, recorded: Option<&ProcessRecord>) -> Option<ProcessStateReport> {
        let gpu_files = self.host.nvidia_files(pid).map_or(0, |f| f.len());
        let (state, error) = match self.driver.state(pid) {
            Ok(s) => (Some(s), None),
            Err(_) if gpu_files == 0 && recorded.is_none() => return None,
            Err(e) => (None, Some(e.to_string())),
        };
        let restore_thread = state.and_then(|_| self.driver.restore_thread_id(pid).ok());
        let phase = recorded.map(|p| p.phase);
        let unanswered = recorded.and_then(|p| p.unanswered.clone());
        Some(ProcessStateReport { pid, state, restore_thread, gpu_files, error, phase, unanswered })
    }
}
