//! Refused requests are cheap for root (security review F3). A refusal
//! (rejected before any real work started) costs a log line within
//! [`LogLimit`]'s cap and nothing else: no scontrol call (slurmctld exempts
//! root from its rate limit) and no metrics render (a global flock, a walk
//! of the image store, two fsyncs). Refusals are not counted in the metrics
//! at all: counting them is what made them dear, and the log lines (with the
//! number left out) tell an admin that a user is looping. A *failure* (real
//! work started: driver, CRIU, the image's checks) is logged, counted and
//! accounted as before (server.rs).

use super::ratelimit::{Budget, LogLimit, OverBudget, RequestBudget};
use super::Agent;
use crate::log::Outcome;
use std::time::{Duration, Instant};

/// Refusal lines per uid and window; the rest are counted and reported.
pub(super) const REFUSAL_LOG_LINES: u32 = 5;
pub(super) const REFUSAL_LOG_WINDOW: Duration = Duration::from_secs(60);
/// Requests of one uid (root exempt): far more than the wrapper ever sends
/// (a hello, a checkpoint or a restore), far less than a loop.
pub(super) const REQUEST_BUDGET: Budget = Budget { burst: 20.0, per_second: 2.0 };

pub(super) fn request_budget() -> RequestBudget {
    RequestBudget::new(REQUEST_BUDGET, REFUSAL_LOG_WINDOW)
}

pub(super) fn refusal_log() -> LogLimit {
    LogLimit::new(REFUSAL_LOG_LINES, REFUSAL_LOG_WINDOW)
}

/// Why a request was refused; the log's `reason` field, never derived
/// from the message's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalKind {
    /// Neither the job's user nor root, or `stop` from the user (authorize).
    Unauthorized,
    OverBudget,
    /// The caller is not one of the job's processes.
    NotInJob,
    /// The root pid is neither the caller's descendant nor a restored tree.
    NotDescendant,
    /// A root pid no checkpoint can be of (pid 1 or below).
    InvalidRoot,
    /// A checkpoint or restore is already running.
    Busy,
    NoImage,
}

impl RefusalKind {
    pub fn label(self) -> &'static str {
        match self {
            RefusalKind::Unauthorized => "unauthorized",
            RefusalKind::OverBudget => "over_budget",
            RefusalKind::NotInJob => "not_in_job",
            RefusalKind::NotDescendant => "not_descendant",
            RefusalKind::InvalidRoot => "invalid_root",
            RefusalKind::Busy => "busy",
            RefusalKind::NoImage => "no_image",
        }
    }
}

/// Why a checkpoint or restore failed: the `reason` label of
/// `gpu_mode_checkpoint_failures_total` and `gpu_mode_restore_failures_total`
/// (docs/metrics.md). Set where the failure happens, never read back from
/// the message: rewording a message changes no metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureReason {
    /// The tree is one neither CRIU nor the driver can bring back (an
    /// io_uring, an NCCL process group, a file only the driver may hold),
    /// or its /dev/shm semaphores could not be staged: refused before the lock.
    Uncheckpointable,
    /// The driver's checkpoint would not fit in host memory or the job's
    /// memory cgroup: refused before the lock.
    HostMemory,
    /// The driver's lock or checkpoint (a call past its deadline included).
    CudaCheckpoint,
    /// The image directory could not be made, lent or given back.
    ImageDir,
    /// CRIU failed, or is not usable on this node.
    Criu,
    /// CRIU dumped a process that had opened a GPU file meanwhile.
    GpuFileInDump,
    Seal,
    Manifest,
    /// The staged image could not be published to the shared store.
    Staging,
    /// The image's manifest, files or checksums, or its GPUs, do not fit
    /// this restore.
    Image,
    /// The image's GPU memory does not fit on this node's GPUs.
    GpuMemory,
    /// This node's driver cannot restore the image (version, remapping).
    Driver,
    /// The /dev/shm objects could not be recreated.
    Shm,
    /// The restored tree failed the checks made before it runs.
    RestoredCheck,
    /// The driver's restore or unlock.
    CudaRestore,
    /// Another process holds a pid of the image on this node (F7).
    PidsHeld,
    /// Anything not named above.
    Other,
}

impl FailureReason {
    /// Every reason (the docs and the tests go through it).
    pub const ALL: [FailureReason; 17] = [
        FailureReason::Uncheckpointable,
        FailureReason::HostMemory,
        FailureReason::CudaCheckpoint,
        FailureReason::ImageDir,
        FailureReason::Criu,
        FailureReason::GpuFileInDump,
        FailureReason::Seal,
        FailureReason::Manifest,
        FailureReason::Staging,
        FailureReason::Image,
        FailureReason::GpuMemory,
        FailureReason::Driver,
        FailureReason::Shm,
        FailureReason::RestoredCheck,
        FailureReason::CudaRestore,
        FailureReason::PidsHeld,
        FailureReason::Other,
    ];

    pub fn label(self) -> &'static str {
        match self {
            FailureReason::Uncheckpointable => "uncheckpointable",
            FailureReason::HostMemory => "host_memory",
            FailureReason::CudaCheckpoint => "cuda_checkpoint",
            FailureReason::ImageDir => "image_dir",
            FailureReason::Criu => "criu",
            FailureReason::GpuFileInDump => "gpu_file_in_dump",
            FailureReason::Seal => "seal",
            FailureReason::Manifest => "manifest",
            FailureReason::Staging => "staging",
            FailureReason::Image => "image",
            FailureReason::GpuMemory => "gpu_memory",
            FailureReason::Driver => "driver",
            FailureReason::Shm => "shm",
            FailureReason::RestoredCheck => "restored_check",
            FailureReason::CudaRestore => "cuda_restore",
            FailureReason::PidsHeld => "pids_held",
            FailureReason::Other => "other",
        }
    }
}

/// A checkpoint's or restore's error: refused before any work, or failed in it.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("{message}")]
    Refused { kind: RefusalKind, message: String },
    #[error("{message}")]
    Failed { reason: FailureReason, message: String },
    /// Failed for a reason of this node's, before anything was started:
    /// another node may do it (the wrapper moves the job, F7).
    #[error("{0}")]
    NotHere(String),
    /// A checkpoint failed after the tree was dumped and killed: nothing
    /// of it is left (protocol::Response::TreeLost).
    #[error("{message}")]
    TreeLost { reason: FailureReason, message: String },
}

impl RequestError {
    pub fn refused(kind: RefusalKind, message: impl Into<String>) -> RequestError {
        RequestError::Refused { kind, message: message.into() }
    }

    pub fn failed(reason: FailureReason, message: impl Into<String>) -> RequestError {
        RequestError::Failed { reason, message: message.into() }
    }

    /// The same error, its message extended by `note` (`<message>; <note>`).
    pub fn noting(self, note: &str) -> RequestError {
        let more = |m: String| format!("{m}; {note}");
        match self {
            RequestError::Refused { kind, message } => RequestError::Refused { kind, message: more(message) },
            RequestError::Failed { reason, message } => RequestError::Failed { reason, message: more(message) },
            RequestError::NotHere(message) => RequestError::NotHere(more(message)),
            RequestError::TreeLost { reason, message } => RequestError::TreeLost { reason, message: more(message) },
        }
    }

    /// The metrics' reason of a failure (`None`: a refusal, not counted).
    pub fn reason(&self) -> Option<FailureReason> {
        match self {
            RequestError::Refused { .. } => None,
            RequestError::Failed { reason, .. } | RequestError::TreeLost { reason, .. } => Some(*reason),
            RequestError::NotHere(_) => Some(FailureReason::PidsHeld),
        }
    }
}

/// Every error that is not built as a refusal or with its reason is a
/// failure of reason `other`.
impl From<String> for RequestError {
    fn from(message: String) -> RequestError {
        RequestError::failed(FailureReason::Other, message)
    }
}

/// `result.because(reason)?`: an error of a lower layer (a `String` or a
/// typed error) becomes a failure of `reason` with its Display as message.
pub(super) trait Because<T> {
    fn because(self, reason: FailureReason) -> Result<T, RequestError>;
}

/// The lower layers' errors `because` takes. A list, not every `Display`:
/// a `RequestError` already has its reason, and must never be given another.
pub(super) trait LowerError: std::fmt::Display {}

impl LowerError for gpu_mode_base::procfs::PinError {}

impl LowerError for String {}
impl LowerError for crate::tree::OwnerError {}
impl LowerError for crate::manifest::ManifestError {}
impl LowerError for gpu_mode_devices::criu::CgroupError {}
impl LowerError for gpu_mode_devices::cuda_ckpt::DeviceMapError {}

impl<T, E: LowerError> Because<T> for Result<T, E> {
    fn because(self, reason: FailureReason) -> Result<T, RequestError> {
        self.map_err(|e| RequestError::failed(reason, e.to_string()))
    }
}

impl Agent {
    /// Logs a refusal of `uid`'s `action` within the cap; nothing else.
    pub(super) fn refused(&self, uid: u32, action: &str, kind: RefusalKind, message: &str) {
        let verdict = self.refusal_log.lock().unwrap_or_else(|p| p.into_inner()).admit(uid, Instant::now());
        if verdict.suppressed_before > 0 {
            self.log_unlogged_refusals(uid, verdict.suppressed_before);
        }
        if verdict.log {
            self.action_line(action).field("peer_uid", uid).field("reason", kind.label()).field("detail", message).outcome(Outcome::Refused).emit(&self.settings.log);
        }
    }

    /// One request of `uid` from its budget; over it, why (its Display is
    /// the answer's message; the refusal is logged within the cap, nothing
    /// else is done).
    pub(super) fn within_budget(&self, uid: u32) -> Result<(), OverBudget> {
        let taken = self.budget.lock().unwrap_or_else(|p| p.into_inner()).take(uid, Instant::now());
        taken.inspect_err(|over| self.refused(uid, "request", RefusalKind::OverBudget, &over.to_string()))
    }

    /// At exit: the refusals of each uid that went unlogged, one line each.
    pub(super) fn report_unlogged_refusals(&self) {
        let left = self.refusal_log.lock().unwrap_or_else(|p| p.into_inner()).drain();
        for (uid, n) in left {
            self.log_unlogged_refusals(uid, n);
        }
    }

    fn log_unlogged_refusals(&self, uid: u32, n: u32) {
        let secs = REFUSAL_LOG_WINDOW.as_secs();
        let detail = format!("{n} more refused requests of uid {uid} were not logged (at most {REFUSAL_LOG_LINES} lines per {secs} s)");
        self.action_line("agent-refused").field("peer_uid", uid).field("detail", detail).outcome(Outcome::Refused).emit(&self.settings.log);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each reason is one fixed word of its own, listed in docs/metrics.md,
    /// and the message never decides it.
    #[test]
    fn failure_reasons_are_distinct_documented_words() {
        let labels: Vec<&str> = FailureReason::ALL.iter().map(|r| r.label()).collect();
        gpu_mode_testkit::labels::assert_metric_labels("checkpoint failure reasons", &labels, include_str!("../../../docs/metrics.md"));
        let e = RequestError::failed(FailureReason::Seal, "criu said no: manifest missing");
        assert_eq!(e.reason(), Some(FailureReason::Seal), "the words of the message count for nothing");
        assert_eq!(RequestError::from("criu failed".to_string()).reason(), Some(FailureReason::Other));
        assert_eq!(RequestError::NotHere("x".into()).reason(), Some(FailureReason::PidsHeld));
        assert_eq!(RequestError::refused(RefusalKind::Busy, "x").reason(), None, "refusals are not counted");
        let noted = RequestError::failed(FailureReason::Image, "bad").noting("the image is kept");
        assert!(matches!(&noted, RequestError::Failed { reason: FailureReason::Image, message } if message == "bad; the image is kept"), "{noted:?}");
    }
}
