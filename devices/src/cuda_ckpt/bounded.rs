//! The driver with every call under a deadline. A process whose GPU is hung
//! can keep a cuCheckpointProcess* call in the kernel for good; a root helper
//! must then report which call on which process hung, not hang with it.

use super::driver::{calls, CudaCkptDriver, DriverError, GpuPair, ProcessState};
use crate::watchdog::call_until;
use std::sync::Arc;
use std::time::Duration;

/// Runs each call of `inner` on a thread of its own and waits at most
/// `call_timeout` for it (Lock: its own timeout plus `call_timeout`, since
/// the driver itself gives up at its timeout). A call that does not return
/// is [`DriverError::NoAnswer`], naming the call and the pid. A call about a
/// process that ends meanwhile (killed by its user, or by the OOM killer
/// while the driver stages its memory) is waited for no longer than a
/// moment (an answer already on its way stands: an unlocked process may
/// exit at once): the driver may never answer for a process that is gone,
/// and the job should start over now rather than at the deadline
/// (`DeadlineError::Abandoned`).
#[derive(Clone)]
pub struct BoundedDriver {
    inner: Arc<dyn CudaCkptDriver>,
    call_timeout: Duration,
}

impl BoundedDriver {
    pub fn new(inner: Arc<dyn CudaCkptDriver>, call_timeout: Duration) -> Self {
        BoundedDriver { inner, call_timeout }
    }

    fn call<T: Send + 'static>(
        &self,
        name: &'static str,
        pid: i32,
        deadline: Duration,
        f: impl FnOnce(&dyn CudaCkptDriver) -> Result<T, DriverError> + Send + 'static,
    ) -> Result<T, DriverError> {
        let inner = Arc::clone(&self.inner);
        // A pid /proc does not show is not watched (the fakes' pids in tests);
        // one that has ended already (a zombie) is not called at all.
        let ended = crate::procfs::read(pid).is_some_and(|p| p.state == 'Z');
        let process = if ended { None } else { crate::procfs::Pinned::new(pid).ok() };
        let gone = || {
            let over = ended || process.as_ref().is_some_and(|p| p.still_there().is_err());
            over.then(|| format!("pid {pid} ended during the call"))
        };
        call_until(&format!("{name}(pid {pid})"), deadline, gone, move || f(&*inner)).unwrap_or_else(|e| Err(DriverError::NoAnswer(e)))
    }
}

impl CudaCkptDriver for BoundedDriver {
    fn state(&self, pid: i32) -> Result<ProcessState, DriverError> {
        self.call(calls::GET_STATE, pid, self.call_timeout, move |d| d.state(pid))
    }
    fn restore_thread_id(&self, pid: i32) -> Result<i32, DriverError> {
        self.call(calls::GET_RESTORE_THREAD_ID, pid, self.call_timeout, move |d| d.restore_thread_id(pid))
    }
    fn lock(&self, pid: i32, timeout_ms: u32) -> Result<(), DriverError> {
        let deadline = Duration::from_millis(timeout_ms.into()) + self.call_timeout;
        self.call(calls::LOCK, pid, deadline, move |d| d.lock(pid, timeout_ms))
    }
    fn checkpoint(&self, pid: i32) -> Result<(), DriverError> {
        self.call(calls::CHECKPOINT, pid, self.call_timeout, move |d| d.checkpoint(pid))
    }
    fn restore(&self, pid: i32, pairs: &[GpuPair]) -> Result<(), DriverError> {
        let pairs = pairs.to_vec();
        self.call(calls::RESTORE, pid, self.call_timeout, move |d| d.restore(pid, &pairs))
    }
    fn unlock(&self, pid: i32) -> Result<(), DriverError> {
        self.call(calls::UNLOCK, pid, self.call_timeout, move |d| d.unlock(pid))
    }
}
