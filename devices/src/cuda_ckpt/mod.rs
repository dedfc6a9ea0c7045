//! `cuda_ckpt`: the CUDA driver's checkpoint (one word per concept, issue 26:
//! this is the driver verb; `preempt` is the machinery that checkpoints a
//! preempted job with it and CRIU; `modes::checkpoint` is the mode's prolog
//! and epilog). CUDA checkpoint/restore of a process or of every CUDA process
//! of a Slurm job on this node: GPU memory is copied to host memory and released, then
//! later restored (optionally onto other GPUs) intact.
//!
//! Order of a checkpoint: find the processes, refuse anything the driver
//! cannot take (before touching any), record each one's GPU footprint, lock
//! all in parallel, checkpoint all in parallel, then prove no /dev/nvidia*
//! descriptor or mapping remains. Any failure rolls every process back
//! (restore, then unlock). The record is written before the first lock and
//! before each step, so an interrupted checkpoint can always be restored.
//! A restore first checks each target GPU has room, then restores all in
//! parallel and unlocks all in parallel. Every driver call runs under a
//! deadline (bounded.rs).

// One file per verb: the checkpoint verb lives in checkpoint.rs like the others.
#[allow(clippy::module_inception)]
mod checkpoint;
mod after_criu;
pub mod bounded;
pub mod device_map;
pub mod driver;
pub mod host_room;
mod lock;
pub mod nvml;
mod parallel;
pub mod procs;
pub mod record;
mod restore;
pub mod settle;
mod state;
#[cfg(test)]
mod tests;

pub use device_map::{DeviceMap, DeviceMapError};
pub use driver::{CudaCkptDriver, CudaDriver, DriverError, GpuPair, GpuUuid, ProcessState, UuidError};
pub use nvml::{GpuInfo, GpuInfoError, GpuProcess, Nvml};
pub use parallel::{Phase, Step, StepRun};
pub use procs::{FoundBy, HostError, NvidiaFile, ProcFs, ProcessHost};
pub use bounded::BoundedDriver;
pub use record::{CheckpointRecord, Footprint, ProcessPhase, ProcessRecord, RecordError, RecordStatus, RECORD_VERSION};
pub use checkpoint::{CheckpointReport, StepMarks};
pub use restore::RestoreReport;
pub use settle::{settle_records, Settled, StuckProcess};
pub use state::{ProcessStateReport, StateReport};

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// What to checkpoint: explicit processes (each with its descendants) or
/// every process of a Slurm job on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Pids(Vec<i32>),
    Job(u32),
}

impl Target {
    /// The record file's name stem: `job-42`, `pid-1234`, `pids-1-2`.
    pub fn key(&self) -> String {
        match self {
            Target::Job(j) => format!("job-{j}"),
            Target::Pids(p) if p.len() == 1 => format!("pid-{}", p[0]),
            Target::Pids(p) => format!("pids-{}", p.iter().map(|x| x.to_string()).collect::<Vec<_>>().join("-")),
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Job(j) => write!(f, "job {j}"),
            Target::Pids(p) => write!(f, "pid {}", p.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",")),
        }
    }
}

/// Tunables, from the `[cuda_ckpt]` section of the config.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// How long Lock waits for a process's in-flight GPU work.
    pub lock_timeout_ms: u32,
    /// Headroom a target GPU must have beyond the recorded footprint.
    pub memory_margin_bytes: u64,
    /// Where checkpoint records (footprints, start times) are kept.
    pub record_dir: PathBuf,
    /// How long any other driver call may take before it is reported as not
    /// returning (Lock gets `lock_timeout_ms` on top).
    pub call_timeout: Duration,
}

/// One process's outcome in a failed step, for the error's report.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PidFailure {
    pub pid: i32,
    pub error: String,
}

fn list_failures(f: &[PidFailure]) -> String {
    f.iter().map(|x| format!("pid {}: {}", x.pid, x.error)).collect::<Vec<_>>().join("; ")
}

fn list_blocked(b: &[(i32, NvidiaFile)]) -> String {
    b.iter().map(|(pid, f)| format!("pid {pid} still holds {f}")).collect::<Vec<_>>().join("; ")
}

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{target}: no process found on this node")]
    NoProcesses { target: Target },
    #[error("{target}: no process holds a GPU (/dev/nvidia*): nothing to checkpoint")]
    NoCudaProcesses { target: Target },
    #[error("cannot list the processes of {target}: {detail}")]
    Scan { target: Target, detail: String },
    #[error(
        "pid {pid} holds {file} but the CUDA driver cannot checkpoint it ({detail}); a child forked without exec keeps its \
         parent's GPU mappings and cannot be checkpointed unless it dropped them at the fork (gpu-mode-run's preloaded \
         library does, with [preempt] forked_children_drop_gpu_files on and LD_PRELOAD kept): refused, nothing was changed"
    )]
    NotCheckpointable { pid: i32, file: NvidiaFile, detail: String },
    #[error("pid {pid} is {state}, not running: refused, nothing was changed")]
    NotRunning { pid: i32, state: String },
    #[error(
        "pids {} hold {} MiB of GPU memory, which the driver's checkpoint copies into their host memory ({} MiB with its \
         margin), but only {} MiB is free there, bounded by {}: refused before anything was locked",
        short.pids.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(","),
        (short.need - host_room::MARGIN_BYTES) >> 20, short.need >> 20, short.room.bytes >> 20, short.room.limited_by
    )]
    HostMemory { short: host_room::Shortfall },
    #[error("cannot record the GPU memory footprint (needed to check free memory before restore): {0}")]
    Footprint(GpuInfoError),
    /// `left_after_scan`: every process whose lock failed holds no GPU file
    /// any more, or has ended (it left CUDA, e.g. on its way out, after the
    /// scan), and the rollback was whole: a new scan would not take it.
    #[error("locking failed: {}; rollback: {rollback}", list_failures(failures))]
    Lock { failures: Vec<PidFailure>, rollback: String, left_after_scan: bool },
    #[error("checkpoint failed: {}; rollback: {rollback}", list_failures(failures))]
    Checkpoint { failures: Vec<PidFailure>, rollback: String },
    /// `joined_after_scan`: every holder is a process the scan did not
    /// find (it opened its GPU file, or joined the scope, after the scan)
    /// and the rollback was whole: a new scan would find them.
    #[error("GPU files remain after checkpoint: {}; rollback: {rollback}", list_blocked(blocked))]
    HandlesRemain { blocked: Vec<(i32, NvidiaFile)>, rollback: String, joined_after_scan: bool },
    #[error("no checkpoint record for {target} at {path}: was it checkpointed by gpu-mode-cuda-ckpt on this node?")]
    NoRecord { target: Target, path: PathBuf },
    #[error("checkpoint record {path}: {detail}")]
    Record { path: PathBuf, detail: String },
    #[error("pid {pid} is no longer the process that was checkpointed (it exited, or its pid was reused): refused")]
    ProcessGone { pid: i32 },
    #[error("device map: {0}")]
    DeviceMap(String),
    #[error(
        "not enough free memory on {gpu} to restore pid {}: needs {} MiB ({} MiB footprint + {} MiB margin), {} MiB free; \
         a restore that runs out of GPU memory leaves the process stuck, so nothing was restored",
        pids.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(","),
        (need + margin) >> 20, need >> 20, margin >> 20, free >> 20
    )]
    NotEnoughMemory { gpu: GpuUuid, pids: Vec<i32>, need: u64, margin: u64, free: u64 },
    #[error("cannot read free memory of {gpu}: {detail}")]
    FreeMemory { gpu: GpuUuid, detail: GpuInfoError },
    #[error("restore failed: {}; every process stays locked (restored ones included) so none runs without its peers; run restore again", list_failures(failures))]
    Restore { failures: Vec<PidFailure> },
    #[error("unlock failed: {}", list_failures(failures))]
    Unlock { failures: Vec<PidFailure> },
    #[error("pid {pid} is in state {state}: cannot restore it")]
    CannotRestore { pid: i32, state: String },
    #[error("{0}: refused, nothing was changed")]
    Unanswered(String),
}

impl CheckpointError {
    /// The tree's GPU holders changed after the scan (a process opened its
    /// GPU file, or left CUDA) and everything is back as it was: a new scan
    /// may succeed where this one failed.
    pub fn holders_changed_after_scan(&self) -> bool {
        matches!(
            self,
            CheckpointError::HandlesRemain { joined_after_scan: true, .. } | CheckpointError::Lock { left_after_scan: true, .. }
        )
    }
}

/// The checkpoint machinery over a driver, a host and a GPU inventory, each a
/// trait so the orchestration runs against doubles in tests.
pub struct Checkpointer<'a> {
    /// Every call bounded by `settings.call_timeout`.
    driver: BoundedDriver,
    pub host: &'a dyn ProcessHost,
    pub gpus: &'a dyn GpuInfo,
    pub settings: Settings,
}

impl<'a> Checkpointer<'a> {
    /// The driver is shared (`Arc`) because each call runs on a thread that
    /// may outlive the call's deadline.
    pub fn new(driver: Arc<dyn CudaCkptDriver>, host: &'a dyn ProcessHost, gpus: &'a dyn GpuInfo, settings: Settings) -> Self {
        let driver = BoundedDriver::new(driver, settings.call_timeout);
        Checkpointer { driver, host, gpus, settings }
    }
}

/// Milliseconds of a duration, for reports.
fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

impl Settings {
    /// The `[cuda_ckpt]` section, with records under `<runtime_dir>/checkpoint`.
    pub fn from_config(cfg: &crate::Config) -> Settings {
        Settings {
            lock_timeout_ms: cfg.cuda_ckpt.lock_timeout_ms,
            memory_margin_bytes: cfg.cuda_ckpt.memory_margin_mib << 20,
            record_dir: cfg.runtime_dir.join("checkpoint"),
            call_timeout: Duration::from_millis(cfg.cuda_ckpt.call_timeout_ms),
        }
    }
}
