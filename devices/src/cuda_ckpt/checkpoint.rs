//! The checkpoint verb: find, vet, record, lock all, checkpoint all, verify
//! that no GPU file remains, roll everything back on any failure. The record
//! is written before each step (see record.rs).

use super::driver::{CudaCkptDriver, ProcessState};
use super::parallel::{run_all, Phase, Step};
use super::procs::{FoundBy, NvidiaFile};
use super::record::{CheckpointRecord, Footprint, ProcessPhase, ProcessRecord, RecordStatus, RECORD_VERSION};
use super::nvml::GpuInfoError;
use super::{CheckpointError, Checkpointer, Target};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Instant;

/// When each step of a checkpoint ran (`scan`, `record`, `cuda-lock`,
/// `cuda-checkpoint`, `verify`), for the caller's timeline. The GPU memory is
/// free when `cuda-checkpoint` ends.
pub type StepMarks = Vec<(&'static str, Instant, Instant)>;

#[derive(Debug, Clone, serde::Serialize)]
pub struct CheckpointReport {
    pub target: String,
    pub found_by: FoundBy,
    pub processes: Vec<ProcessRecord>,
    pub phases: Vec<Phase>,
    pub total_ms: f64,
    pub record: PathBuf,
    #[serde(skip)]
    pub marks: StepMarks,
}

impl CheckpointReport {
    pub fn bytes(&self) -> u64 {
        self.processes.iter().map(ProcessRecord::bytes).sum()
    }
}

impl Checkpointer<'_> {
    pub fn checkpoint(&self, target: &Target) -> Result<CheckpointReport, CheckpointError> {
        let (scope, found_by) = self.scope(target)?;
        self.checkpoint_scope(target, &scope, found_by)
    }

    /// [`Self::checkpoint`] of a scope the caller has just read (the agent
    /// reads the tree for its own checks): /proc is not walked twice
    /// between the signal and the driver call. The check after the
    /// checkpoint still re-reads the scope.
    pub fn checkpoint_scope(&self, target: &Target, scope: &[i32], found_by: FoundBy) -> Result<CheckpointReport, CheckpointError> {
        let mut marks = StepMarks::new();
        let t = Instant::now();
        let holders = self.holders(target, scope)?;
        if holders.is_empty() {
            return Err(CheckpointError::NoCudaProcesses { target: target.clone() });
        }
        let pids: Vec<i32> = holders.iter().map(|(p, _)| *p).collect();
        // NVML's footprints and the driver's states are independent reads:
        // they run side by side.
        let (ready, record) = std::thread::scope(|s| {
            let record = s.spawn(|| self.make_record(target, &pids));
            let ready = self.refuse_unready(&holders);
            (ready, record.join().unwrap_or_else(|_| Err(CheckpointError::Footprint(GpuInfoError::Panicked))))
        });
        ready?;
        let mut record = record?;
        let footprints: Vec<(i32, u64)> = record.processes.iter().map(|p| (p.pid, p.bytes())).collect();
        super::host_room::check(&super::host_room::HostPaths::default(), &footprints).map_err(|short| CheckpointError::HostMemory { short })?;
        marks.push(("scan", t, Instant::now()));
        let t = Instant::now();
        // Before the first lock: from here on, whatever stops this run, the
        // record on disk names every process that may be locked.
        record.mark(&pids, ProcessPhase::Locking);
        let path = record
            .save(&self.settings.record_dir)
            .map_err(|e| self.record_error(&record, format!("cannot write it: {e}; nothing was locked")))?;
        marks.push(("record", t, Instant::now()));
        let start = Instant::now();
        let phases = self.lock_and_checkpoint(target, &pids, &mut record, &mut marks)?;
        Ok(CheckpointReport {
            target: target.to_string(),
            found_by,
            processes: record.processes,
            phases,
            total_ms: super::ms(start.elapsed()),
            record: path,
            marks,
        })
    }

    fn record_error(&self, record: &CheckpointRecord, detail: String) -> CheckpointError {
        CheckpointError::Record { path: CheckpointRecord::path(&self.settings.record_dir, &record.target), detail }
    }

    /// Writes the record as `change` leaves it, before the step it announces;
    /// if it cannot be written, rolls back from what is known so far
    /// (`record`, unchanged): a step must never run unannounced.
    fn advance(
        &self,
        record: &mut CheckpointRecord,
        change: impl FnOnce(&mut CheckpointRecord),
        undone: &str,
    ) -> Result<(), CheckpointError> {
        let mut next = record.clone();
        change(&mut next);
        if let Err(e) = next.save(&self.settings.record_dir) {
            let rollback = self.roll_back(record);
            return Err(self.record_error(record, format!("cannot write it: {e}; {undone}; rollback: {rollback}")));
        }
        *record = next;
        Ok(())
    }

    /// The processes the checkpoint must cover: the job's, or each pid with
    /// its descendants.
    pub(super) fn scope(&self, target: &Target) -> Result<(Vec<i32>, FoundBy), CheckpointError> {
        let (pids, found_by) = match target {
            Target::Job(job) => self
                .host
                .job_processes(*job)
                .map_err(|e| CheckpointError::Scan { target: target.clone(), detail: e.to_string() })?,
            Target::Pids(pids) => {
                if let Some(gone) = pids.iter().find(|p| self.host.start_time(**p).is_none()) {
                    return Err(CheckpointError::Scan { target: target.clone(), detail: format!("pid {gone} does not exist") });
                }
                let all: BTreeSet<i32> = pids.iter().flat_map(|p| self.host.with_descendants(*p)).collect();
                (all.into_iter().collect(), FoundBy::Pid)
            }
        };
        if pids.is_empty() {
            return Err(CheckpointError::NoProcesses { target: target.clone() });
        }
        Ok((pids, found_by))
    }

    /// The processes of `scope` that hold /dev/nvidia* files. A process that
    /// exits while being scanned holds nothing and is skipped.
    pub(super) fn holders(&self, target: &Target, scope: &[i32]) -> Result<Vec<(i32, Vec<NvidiaFile>)>, CheckpointError> {
        let mut out = Vec::new();
        for &pid in scope {
            match self.host.nvidia_files(pid) {
                Ok(files) if files.is_empty() => {}
                Ok(files) => out.push((pid, files)),
                Err(_) if self.host.start_time(pid).is_none() => {}
                Err(e) => return Err(CheckpointError::Scan { target: target.clone(), detail: e.to_string() }),
            }
        }
        Ok(out)
    }

    /// Every GPU holder must be a running CUDA process the driver can take;
    /// checked for all before any is touched.
    fn refuse_unready(&self, holders: &[(i32, Vec<NvidiaFile>)]) -> Result<(), CheckpointError> {
        for (pid, files) in holders {
            match self.driver.state(*pid) {
                Ok(ProcessState::Running) => {}
                Ok(state) => return Err(CheckpointError::NotRunning { pid: *pid, state: state.name() }),
                Err(e) if e.unanswered() => return Err(CheckpointError::Unanswered(e.to_string())),
                Err(e) => {
                    return Err(CheckpointError::NotCheckpointable { pid: *pid, file: files[0].clone(), detail: e.to_string() })
                }
            }
        }
        Ok(())
    }

    fn make_record(&self, target: &Target, pids: &[i32]) -> Result<CheckpointRecord, CheckpointError> {
        let on_gpus = self.gpus.compute_processes().map_err(CheckpointError::Footprint)?;
        let processes = pids
            .iter()
            .map(|&pid| ProcessRecord {
                pid,
                start_time: self.host.start_time(pid).unwrap_or(0),
                footprint: on_gpus
                    .iter()
                    .filter(|g| g.pid == pid)
                    .map(|g| Footprint { gpu: g.gpu, bytes: g.used_bytes })
                    .collect(),
                phase: ProcessPhase::Found,
                unanswered: None,
            })
            .collect();
        let created_unix = crate::persist::now_unix();
        Ok(CheckpointRecord {
            version: RECORD_VERSION,
            target: target.key(),
            created_unix,
            status: RecordStatus::InProgress,
            processes,
        })
    }

    /// Lock all, then checkpoint all, then prove the GPU files are gone from
    /// every process of the (re-read) scope, keeping the record one step
    /// ahead. Rolls back on any failure.
    fn lock_and_checkpoint(
        &self,
        target: &Target,
        pids: &[i32],
        record: &mut CheckpointRecord,
        marks: &mut StepMarks,
    ) -> Result<Vec<Phase>, CheckpointError> {
        let t = Instant::now();
        let lock = self.lock_all(pids);
        record.settle(&lock, ProcessPhase::Locked, ProcessPhase::Found);
        let failures = lock.failures();
        if !failures.is_empty() {
            let rollback = self.roll_back(record);
            let left_after_scan = record.status == RecordStatus::RolledBack && failures.iter().all(|f| self.left_cuda(f.pid));
            return Err(CheckpointError::Lock { failures, rollback, left_after_scan });
        }
        self.advance(record, |r| r.mark(pids, ProcessPhase::Checkpointing), "nothing was checkpointed")?;
        marks.push(("cuda-lock", t, Instant::now()));
        let t = Instant::now();
        let ckpt = run_all(Step::Checkpoint, pids, |pid| self.driver.checkpoint(pid));
        marks.push(("cuda-checkpoint", t, Instant::now()));
        record.settle(&ckpt, ProcessPhase::Checkpointed, ProcessPhase::Locked);
        if !ckpt.failures().is_empty() {
            let rollback = self.roll_back(record);
            return Err(CheckpointError::Checkpoint { failures: ckpt.failures(), rollback });
        }
        let t = Instant::now();
        let blocked = self.leftover_files(target, pids);
        if !blocked.is_empty() {
            let rollback = self.roll_back(record);
            let joined_after_scan = record.status == RecordStatus::RolledBack && blocked.iter().all(|(p, _)| !pids.contains(p));
            return Err(CheckpointError::HandlesRemain { blocked, rollback, joined_after_scan });
        }
        self.advance(record, |r| r.status = RecordStatus::Complete, "the checkpoint was undone")?;
        marks.push(("verify", t, Instant::now()));
        Ok(vec![lock, ckpt])
    }

    /// Whether `pid`, a GPU holder at the scan, holds no GPU file now or
    /// has ended (a process on its way out closes its files).
    fn left_cuda(&self, pid: i32) -> bool {
        self.files_held(pid).is_empty()
    }

    /// The GPU files `pid` holds now. Unreadable is not proof of absence,
    /// unless the process is gone: it counts as one file then.
    fn files_held(&self, pid: i32) -> Vec<NvidiaFile> {
        match self.host.nvidia_files(pid) {
            Ok(files) => files,
            Err(e) if self.host.start_time(pid).is_some() => vec![NvidiaFile { how: "unreadable".into(), path: e.to_string() }],
            Err(_) => vec![],
        }
    }

    /// GPU files still held after checkpoint, by the checkpointed processes or
    /// by any process that joined the scope meanwhile.
    fn leftover_files(&self, target: &Target, pids: &[i32]) -> Vec<(i32, NvidiaFile)> {
        let mut scope: BTreeSet<i32> = pids.iter().copied().collect();
        if let Ok((now, _)) = self.scope(target) {
            scope.extend(now);
        }
        scope.into_iter().flat_map(|pid| self.files_held(pid).into_iter().map(move |f| (pid, f))).collect()
    }
}
