//! Bounds on calls that can block forever: a driver call (NVML, the CUDA
//! checkpoint API) or a read of /proc of a process stuck in the kernel.
//!
//! * [`call_with_deadline`] runs one call on its own thread and gives up
//!   waiting at a deadline.
//! * [`HookWatchdog`] bounds a whole prolog/epilog run: past its deadline it
//!   reports the step in progress (see [`step`]) and ends the process.
//!
//! Neither can stop the stuck call itself. A thread blocked inside the kernel
//! (an ioctl on /dev/nvidia*, a read of /proc/<pid>/maps of a process whose
//! memory map is locked) cannot be cancelled from user space: signals wait
//! until it leaves the kernel, and pthread_cancel would skip Rust destructors
//! and leave locks held. What a process can do is stop *waiting* for it,
//! report which call hung, and leave the thread detached; the caller then
//! decides (fail the step, drain the node, exit). Even `_exit` completes only
//! once such a thread can be killed (at once for an interruptible wait;
//! never while it sleeps uninterruptibly), which is why the report (log
//! line, drain reason) always comes first.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Seconds as the messages print them: `60`, `0.2`.
pub fn seconds(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// Why [`call_with_deadline`] has no value for the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeadlineError {
    /// The call is still running; its thread was left detached.
    #[error("{what} did not return within {} s", seconds(*after))]
    Timeout { what: String, after: Duration },
    /// No thread could be started (the process is out of threads or memory).
    #[error("cannot start a thread to run {what}: {detail}")]
    Spawn { what: String, detail: String },
    /// The call panicked on its thread.
    #[error("{what} panicked: {detail}")]
    Panicked { what: String, detail: String },
    /// The caller stopped waiting because what the call was about is gone
    /// ([`call_until`]); its thread was left detached.
    #[error("{what} abandoned: {why}")]
    Abandoned { what: String, why: String },
}

/// Runs `f` on a new thread and waits at most `deadline` for its value.
/// Past the deadline the thread is left running, detached (see the module
/// docs for why nothing better exists), and `Timeout` names `what`.
pub fn call_with_deadline<T, F>(what: &str, deadline: Duration, f: F) -> Result<T, DeadlineError>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    call_until(what, deadline, || None, f)
}

/// How long an answer is still waited for once `gone` has said why it no
/// longer matters ([`call_until`]).
const GONE_GRACE: Duration = Duration::from_millis(250);

/// [`call_with_deadline`] that also stops waiting soon after `gone` says
/// why the answer no longer matters (looked at before the call and every
/// 50 ms), e.g. the process a driver call is about has ended: `Abandoned`,
/// unless the answer comes within [`GONE_GRACE`] of that.
pub fn call_until<T, F>(what: &str, deadline: Duration, gone: impl Fn() -> Option<String>, f: F) -> Result<T, DeadlineError>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    if let Some(why) = gone() {
        return Err(DeadlineError::Abandoned { what: what.to_string(), why });
    }
    // Capacity 1: a call that finishes after the deadline must not block on
    // a receiver that is gone; its send just fails.
    let (tx, rx) = mpsc::sync_channel(1);
    let handle = std::thread::Builder::new()
        .name("deadline call".into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .map_err(|e| DeadlineError::Spawn { what: what.to_string(), detail: e.to_string() })?;
    let start = std::time::Instant::now();
    let received = loop {
        let left = deadline.saturating_sub(start.elapsed());
        match rx.recv_timeout(left.min(Duration::from_millis(50))) {
            Err(RecvTimeoutError::Timeout) if !left.is_zero() => {
                if let Some(why) = gone() {
                    // An answer that came meanwhile, or comes within
                    // GONE_GRACE, stands: the process may end as soon as the
                    // call lets it go (an unlocked process that exits at
                    // once), before the call's thread has passed the answer
                    // on. (A driver that never answers for it is abandoned
                    // all the same: cuda_ckpt::after_criu takes such an
                    // unlock as the process's own end.)
                    if let Ok(value) = rx.recv_timeout(GONE_GRACE.min(deadline.saturating_sub(start.elapsed()))) {
                        return Ok(value);
                    }
                    return Err(DeadlineError::Abandoned { what: what.to_string(), why });
                }
            }
            other => break other,
        }
    };
    match received {
        Ok(value) => Ok(value),
        Err(RecvTimeoutError::Timeout) => Err(DeadlineError::Timeout { what: what.to_string(), after: deadline }),
        // The sender went away without a value: `f` panicked.
        Err(RecvTimeoutError::Disconnected) => {
            let detail = handle.join().err().map_or_else(|| "no value".to_string(), |p| panic_text(&*p));
            Err(DeadlineError::Panicked { what: what.to_string(), detail })
        }
    }
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// The step the process is in, for the hook watchdog's report. Process-wide:
/// the hooks are single-threaded, and the watchdog thread must read it.
static STEP: Mutex<&'static str> = Mutex::new("starting");

fn set_step(name: &'static str) -> &'static str {
    // A poisoned lock still holds a valid name.
    std::mem::replace(&mut *STEP.lock().unwrap_or_else(|e| e.into_inner()), name)
}

/// The step recorded last (`"starting"` before any).
pub fn current_step() -> &'static str {
    *STEP.lock().unwrap_or_else(|e| e.into_inner())
}

/// Puts the previous step back when dropped, so nested steps report the
/// innermost one while it runs and the outer one after.
#[must_use = "the step ends when the guard is dropped"]
pub struct StepGuard {
    previous: &'static str,
}

impl Drop for StepGuard {
    fn drop(&mut self) {
        set_step(self.previous);
    }
}

/// Records `name` as the step in progress until the guard is dropped:
/// `let _step = watchdog::step("nvml: open");`. One mutex store: cheap.
pub fn step(name: &'static str) -> StepGuard {
    StepGuard { previous: set_step(name) }
}

/// How long `on_fire` may take (logging, two scontrol calls of 20 s at most)
/// before the process exits anyway.
pub const FIRE_GRACE: Duration = Duration::from_secs(60);

/// Bounds a whole run of a root helper. Past the deadline, unless disarmed
/// (or dropped) first, it calls `on_fire` with the step in progress and ends
/// the process with `libc::_exit(exit_code)`; should `on_fire` itself hang,
/// the process ends [`FIRE_GRACE`] later all the same.
pub struct HookWatchdog {
    disarmed: Arc<(Mutex<bool>, Condvar)>,
}

impl HookWatchdog {
    /// Both its threads start here, not when it fires: a call stuck inside
    /// the dynamic loader (dlopen of a library on a hung file system) holds
    /// the lock that creating a thread needs, so no thread could start then.
    pub fn arm(
        deadline: Duration,
        exit_code: i32,
        on_fire: impl FnOnce(&str) + Send + 'static,
    ) -> Result<HookWatchdog, DeadlineError> {
        // Built first: if a spawn below fails, dropping it disarms the other.
        let dog = HookWatchdog { disarmed: Arc::new((Mutex::new(false), Condvar::new())) };
        dog.spawn_waiter("hook backstop", deadline + FIRE_GRACE, move || exit_now(exit_code))?;
        dog.spawn_waiter("hook watchdog", deadline, move || {
            on_fire(current_step());
            exit_now(exit_code)
        })?;
        Ok(dog)
    }

    /// Stops the watchdog; it will not fire. (Dropping it does the same.)
    pub fn disarm(self) {}

    /// A thread that runs `then` after `after`, unless disarmed first.
    fn spawn_waiter(&self, name: &str, after: Duration, then: impl FnOnce() + Send + 'static) -> Result<(), DeadlineError> {
        let disarmed = Arc::clone(&self.disarmed);
        let wait = move || {
            let (flag, cvar) = &*disarmed;
            let guard = flag.lock().unwrap_or_else(|e| e.into_inner());
            let (guard, _) = cvar.wait_timeout_while(guard, after, |d| !*d).unwrap_or_else(|e| e.into_inner());
            if !*guard {
                drop(guard);
                then();
            }
        };
        std::thread::Builder::new()
            .name(name.into())
            .spawn(wait)
            .map(drop)
            .map_err(|e| DeadlineError::Spawn { what: "the hook watchdog".into(), detail: e.to_string() })
    }
}

impl Drop for HookWatchdog {
    fn drop(&mut self) {
        let (flag, cvar) = &*self.disarmed;
        *flag.lock().unwrap_or_else(|e| e.into_inner()) = true;
        cvar.notify_all();
    }
}

/// Exits without unwinding: `_exit` runs no atexit handler or destructor,
/// which could wait on the very lock the stuck thread holds (NVML's
/// shutdown, stdout's lock).
fn exit_now(code: i32) -> ! {
    // SAFETY: _exit only ends the process; it touches no Rust state.
    unsafe { libc::_exit(code) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_about_something_gone_is_abandoned_at_once() {
        let start = std::time::Instant::now();
        let gone = || (start.elapsed() > Duration::from_millis(100)).then(|| "the process ended".to_string());
        let r = call_until("slow(pid 7)", Duration::from_secs(30), gone, || std::thread::sleep(Duration::from_secs(5)));
        assert_eq!(r, Err(DeadlineError::Abandoned { what: "slow(pid 7)".into(), why: "the process ended".into() }));
        assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
        // Nothing gone: the value as before.
        assert_eq!(call_until("quick", Duration::from_secs(5), || None, || 42), Ok(42));
    }
    use std::time::Instant;

    /// The call answers, and only then is the thing found gone (a process
    /// that ended right after its driver call returned): the answer stands.
    #[test]
    fn an_answer_that_came_before_the_end_was_seen_stands() {
        let (answered_tx, answered) = mpsc::channel::<()>();
        let calls = std::cell::Cell::new(0);
        let gone = || {
            calls.set(calls.get() + 1);
            // The first look is before the call starts; the next waits until
            // the call is returning (and its answer is sent a moment after),
            // then sees the end.
            (calls.get() > 1).then(|| {
                let _ = answered.recv_timeout(Duration::from_secs(10));
                std::thread::sleep(Duration::from_millis(200));
                "the process ended".to_string()
            })
        };
        let call = move || {
            // Past the first 50 ms wait, so that `gone` is asked meanwhile.
            std::thread::sleep(Duration::from_millis(120));
            let _ = answered_tx.send(());
            42
        };
        assert_eq!(call_until("restore(pid 7)", Duration::from_secs(30), gone, call), Ok(42));
    }

    /// The end is seen first, and the answer comes a moment later (the
    /// call let the process go, it exited at once, and the call's thread
    /// passed the answer on after): the answer stands.
    #[test]
    fn an_answer_that_comes_just_after_the_end_was_seen_stands() {
        let start = Instant::now();
        let gone = || (start.elapsed() > Duration::from_millis(60)).then(|| "the process ended".to_string());
        let call = || {
            std::thread::sleep(Duration::from_millis(140));
            42
        };
        assert_eq!(call_until("unlock(pid 7)", Duration::from_secs(30), gone, call), Ok(42));
    }

    #[test]
    fn a_fast_call_returns_its_value() {
        assert_eq!(call_with_deadline("add", Duration::from_secs(5), || 2 + 2), Ok(4));
    }

    #[test]
    fn a_call_past_its_deadline_is_a_timeout_returned_at_the_deadline() {
        let start = Instant::now();
        let err = call_with_deadline("cuCheckpointProcessCheckpoint(pid 7)", Duration::from_millis(100), || {
            std::thread::sleep(Duration::from_secs(10));
        })
        .unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(2), "waited {:?}", start.elapsed());
        assert_eq!(err.to_string(), "cuCheckpointProcessCheckpoint(pid 7) did not return within 0.1 s");
        assert!(matches!(err, DeadlineError::Timeout { after, .. } if after == Duration::from_millis(100)));
    }

    #[test]
    fn a_panicking_call_is_an_error_not_a_panic() {
        let err = call_with_deadline("boom", Duration::from_secs(5), || -> u8 { panic!("scripted") }).unwrap_err();
        assert_eq!(err.to_string(), "boom panicked: scripted");
    }

    /// Set in the child process that runs one watchdog scenario.
    const CHILD_VAR: &str = "GPU_MODE_WATCHDOG_TEST_CHILD";

    fn run_child(test: &str, report: &std::path::Path) -> std::process::Output {
        gpu_mode_testkit::run_test_in_child(test, &[(CHILD_VAR, report.as_os_str())], Duration::from_secs(60))
    }

    fn in_child() -> Option<std::path::PathBuf> {
        std::env::var_os(CHILD_VAR).map(Into::into)
    }

    #[test]
    fn the_hook_watchdog_fires_with_the_step_in_progress_and_exits() {
        if let Some(report) = in_child() {
            {
                let _done = step("job state: load");
            }
            let _outer = step("mps: setup");
            let _inner = step("nvml: open");
            let _dog = HookWatchdog::arm(Duration::from_millis(200), 42, move |step| {
                std::fs::write(&report, step).unwrap();
            })
            .unwrap();
            std::thread::sleep(Duration::from_secs(20));
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let report = dir.path().join("fired");
        let start = Instant::now();
        let out = run_child("watchdog::tests::the_hook_watchdog_fires_with_the_step_in_progress_and_exits", &report);
        assert_eq!(out.status.code(), Some(42), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(start.elapsed() < Duration::from_secs(10), "took {:?}", start.elapsed());
        assert_eq!(std::fs::read_to_string(&report).unwrap(), "nvml: open");
    }

    #[test]
    fn a_disarmed_hook_watchdog_never_fires() {
        if let Some(report) = in_child() {
            let fired = report.clone();
            let dog = HookWatchdog::arm(Duration::from_millis(100), 42, move |_| {
                std::fs::write(&fired, "fired").unwrap();
            })
            .unwrap();
            dog.disarm();
            std::thread::sleep(Duration::from_millis(400));
            std::fs::write(&report, "quiet").unwrap();
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let report = dir.path().join("fired");
        let out = run_child("watchdog::tests::a_disarmed_hook_watchdog_never_fires", &report);
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
        assert_eq!(std::fs::read_to_string(&report).unwrap(), "quiet", "the child ran and the watchdog stayed silent");
    }
}
