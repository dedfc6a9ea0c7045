//! Refused requests are cheap for root (security review F3). A refusal
//! (rejected before any real work started) costs a log line within
//! [`LogLimit`]'s cap and nothing else: no scontrol call (slurmctld exempts
//! root from its rate limit) and no metrics render (a global flock, a walk
//! of the image store, two fsyncs). Refusals are not counted in the metrics
//! at all: counting them is what made them dear, and the log lines (with the
//! number left out) tell an admin that a user is looping. A *failure* (real
//! work started: driver, CRIU, the image's checks) is logged, counted and
//! accounted as before (server.rs).

use super::ratelimit::{Budget, LogLimit, RequestBudget};
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

/// A checkpoint's or restore's error: refused before any work, or failed in it.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("{message}")]
    Refused { kind: RefusalKind, message: String },
    #[error("{0}")]
    Failed(String),
    /// Failed for a reason of this node's, before anything was started:
    /// another node may do it (the wrapper moves the job, F7).
    #[error("{0}")]
    NotHere(String),
    /// A checkpoint failed after the tree was dumped and killed: nothing
    /// of it is left (protocol::Response::TreeLost).
    #[error("{0}")]
    TreeLost(String),
}

impl RequestError {
    pub fn refused(kind: RefusalKind, message: impl Into<String>) -> RequestError {
        RequestError::Refused { kind, message: message.into() }
    }
}

/// Every error that is not built as a refusal is a failure.
impl From<String> for RequestError {
    fn from(message: String) -> RequestError {
        RequestError::Failed(message)
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

    /// One request of `uid` from its budget; over it, the answer's message
    /// (the refusal is logged within the cap, nothing else is done).
    pub(super) fn within_budget(&self, uid: u32) -> Result<(), String> {
        let taken = self.budget.lock().unwrap_or_else(|p| p.into_inner()).take(uid, Instant::now());
        taken.map_err(|over| {
            let message = over.to_string();
            self.refused(uid, "request", RefusalKind::OverBudget, &message);
            message
        })
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
