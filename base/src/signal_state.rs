//! The application's signal state: exactly what it would have had without
//! `gpu-mode-run` (issue 24).
//!
//! The wrapper blocks the signals it takes for itself (one thread consumes
//! them with sigwait), and Rust's runtime ignores SIGPIPE before `main`.
//! Both are inherited across fork and exec: std's `Command` keeps the
//! parent's mask since Rust 1.66. Seen on an H100 under Slurm: the
//! application and its DataLoader workers ran with HUP, INT, QUIT, USR1, USR2
//! and TERM blocked (`SigBlk: 0000000000004a07`), so Python's multiprocessing
//! could not end its workers with SIGTERM at exit and the job never ended.
//!
//! So the wrapper records the mask and the ignored set it inherited, in an
//! ELF constructor of its binary (`.init_array` runs before Rust's runtime
//! touches SIGPIPE), and puts them back in the application's child between
//! fork and exec. A restored tree keeps the state CRIU dumped, which is
//! this one.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The highest signal number the kernel has (SIGRTMAX on Linux).
const LAST_SIGNAL: i32 = 64;

/// A set of signals 1..=64 as bits (bit n-1 for signal n), as
/// `/proc/<pid>/status` prints `SigBlk` and `SigIgn`.
pub type SignalBits = u64;

/// The mask and the ignored set a process inherited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InheritedSignals {
    pub blocked: SignalBits,
    pub ignored: SignalBits,
}

static AT_LOAD_TAKEN: AtomicBool = AtomicBool::new(false);
static AT_LOAD_BLOCKED: AtomicU64 = AtomicU64::new(0);
static AT_LOAD_IGNORED: AtomicU64 = AtomicU64::new(0);

/// For a binary's `.init_array`: records the state before Rust's runtime
/// changes it. Only libc calls, no allocation (the runtime is not up yet).
pub extern "C" fn record_at_load() {
    let now = InheritedSignals::current();
    AT_LOAD_BLOCKED.store(now.blocked, Ordering::Relaxed);
    AT_LOAD_IGNORED.store(now.ignored, Ordering::Relaxed);
    AT_LOAD_TAKEN.store(true, Ordering::Release);
}

impl InheritedSignals {
    /// What [`record_at_load`] recorded, else the state now (a caller with
    /// no constructor: the SIGPIPE that Rust's runtime ignored then counts
    /// as inherited).
    pub fn inherited() -> InheritedSignals {
        if AT_LOAD_TAKEN.load(Ordering::Acquire) {
            InheritedSignals { blocked: AT_LOAD_BLOCKED.load(Ordering::Relaxed), ignored: AT_LOAD_IGNORED.load(Ordering::Relaxed) }
        } else {
            InheritedSignals::current()
        }
    }

    /// This thread's mask and the process's ignored signals, now.
    pub fn current() -> InheritedSignals {
        let mut blocked = 0;
        let mut ignored = 0;
        // SAFETY: sigprocmask, sigismember and sigaction only read here into
        // local storage.
        unsafe {
            let mut mask: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_SETMASK, std::ptr::null(), &mut mask);
            for sig in 1..=LAST_SIGNAL {
                if libc::sigismember(&mask, sig) == 1 {
                    blocked |= bit(sig);
                }
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN {
                    ignored |= bit(sig);
                }
            }
        }
        InheritedSignals { blocked, ignored }
    }

    /// Makes this process's state `self`: each signal ignored or not as
    /// recorded (a caught one becomes default at exec anyway), then the mask.
    /// For a child between fork and exec: async-signal-safe, no allocation.
    /// Signals the C library keeps for itself (32, 33) refuse changes; that
    /// is no error here.
    pub fn apply(&self) -> std::io::Result<()> {
        // SAFETY: sigaction and sigprocmask on this (single-threaded,
        // forked) process with stack-local arguments.
        unsafe {
            for sig in 1..=LAST_SIGNAL {
                if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                    continue;
                }
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
                    continue;
                }
                let want_ignored = self.ignored & bit(sig) != 0;
                let is_ignored = old.sa_sigaction == libc::SIG_IGN;
                if want_ignored != is_ignored {
                    let mut new: libc::sigaction = std::mem::zeroed();
                    new.sa_sigaction = if want_ignored { libc::SIG_IGN } else { libc::SIG_DFL };
                    libc::sigemptyset(&mut new.sa_mask);
                    libc::sigaction(sig, &new, std::ptr::null_mut());
                }
            }
            let mut mask: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut mask);
            for sig in 1..=LAST_SIGNAL {
                if self.blocked & bit(sig) != 0 {
                    libc::sigaddset(&mut mask, sig);
                }
            }
            if libc::pthread_sigmask(libc::SIG_SETMASK, &mask, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

fn bit(sig: i32) -> SignalBits {
    1u64 << (sig - 1)
}

/// The variable the SPANK plugin sets in the batch step when it held the
/// checkpoint signal back ([`hold`]); its value is the signal's number.
pub const HELD_SIGNAL_VAR: &str = "GPU_MODE_SIGNAL_HELD";

/// The checkpoint signal the prolog recorded in the job's task variables
/// (`GPU_MODE_CKPT_SIGNAL`), if it is one a process may block.
pub fn recorded_signal(value: Option<&str>) -> Option<i32> {
    let sig: i32 = value?.parse().ok()?;
    ((1..=LAST_SIGNAL).contains(&sig) && sig != libc::SIGKILL && sig != libc::SIGSTOP).then_some(sig)
}

/// Holds `sig` back in this process (the batch step's task, before exec):
/// ignored and blocked, so that a checkpoint signal sent before
/// `gpu-mode-run` took it never ends the batch shell (`--signal=B:`; issue
/// 24's churn: a job preempted as it started ended FAILED 0:10, its shell
/// ended by SIGUSR1). Both, because shells differ: bash keeps the mask it
/// was started with, so the signal stays pending and `gpu-mode-run`
/// checkpoints on it once it runs; dash clears its mask at start but keeps
/// a signal ignored on entry ignored (POSIX), so the signal is dropped and
/// the shell lives (a preempted job is then requeued by Slurm at the end of
/// its grace time and starts over, with no progress to lose). Either way
/// `gpu-mode-run` gives the application the signal as a job without
/// slurm-gpu-mode has it ([`InheritedSignals::without`]).
pub fn hold(sig: i32) -> std::io::Result<()> {
    // SAFETY: this process's disposition and this thread's mask, local sets.
    unsafe {
        let mut ignore: libc::sigaction = std::mem::zeroed();
        ignore.sa_sigaction = libc::SIG_IGN;
        libc::sigemptyset(&mut ignore.sa_mask);
        if libc::sigaction(sig, &ignore, std::ptr::null_mut()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(rc));
        }
    }
    Ok(())
}

/// Whether the plugin held `checkpoint_signal` back ([`hold`]; `held`: the
/// value of [`HELD_SIGNAL_VAR`]).
pub fn held_back(held: Option<&str>, checkpoint_signal: i32) -> bool {
    recorded_signal(held) == Some(checkpoint_signal)
}

impl InheritedSignals {
    /// The state with `sig` neither blocked nor ignored: the checkpoint
    /// signal the plugin held back, as a job without slurm-gpu-mode has it.
    pub fn without(self, sig: i32) -> InheritedSignals {
        InheritedSignals { blocked: self.blocked & !bit(sig), ignored: self.ignored & !bit(sig) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    /// `SigBlk` and `SigIgn` of a `/proc/<pid>/status` text.
    fn from_proc_status(status: &str) -> Option<InheritedSignals> {
        let field = |name: &str| {
            status.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        };
        Some(InheritedSignals { blocked: field("SigBlk:")?, ignored: field("SigIgn:")? })
    }

    #[test]
    fn only_the_checkpoint_signal_the_plugin_held_is_unblocked() {
        let both = bit(libc::SIGUSR1) | bit(libc::SIGUSR2);
        let inherited = InheritedSignals { blocked: both, ignored: both | bit(libc::SIGPIPE) };
        let cases: &[(Option<&str>, i32, SignalBits, SignalBits)] = &[
            (Some("10"), libc::SIGUSR1, bit(libc::SIGUSR2), bit(libc::SIGUSR2) | bit(libc::SIGPIPE)),
            // Held by someone else, or another signal: left as inherited.
            (None, libc::SIGUSR1, inherited.blocked, inherited.ignored),
            (Some("12"), libc::SIGUSR1, inherited.blocked, inherited.ignored),
            (Some("x"), libc::SIGUSR1, inherited.blocked, inherited.ignored),
            (Some("9"), libc::SIGKILL, inherited.blocked, inherited.ignored),
        ];
        for (held, sig, blocked, ignored) in cases {
            let got = if held_back(*held, *sig) { inherited.without(*sig) } else { inherited };
            assert_eq!((got.blocked, got.ignored), (*blocked, *ignored), "{held:?} {sig}");
        }
        for (text, want) in [(Some("10"), Some(10)), (Some("64"), Some(64)), (Some("0"), None), (Some("65"), None), (Some("19"), None), (None, None)] {
            assert_eq!(recorded_signal(text), want, "{text:?}");
        }
    }

    #[test]
    fn proc_status_fields_are_read_as_the_kernel_prints_them() {
        let text = "Name:\tpython3\nSigPnd:\t0000000000000000\nSigBlk:\t0000000000004a07\nSigIgn:\t0000000001001000\n";
        let s = from_proc_status(text).unwrap();
        assert_eq!(s.blocked, bit(libc::SIGHUP) | bit(libc::SIGINT) | bit(libc::SIGQUIT) | bit(libc::SIGUSR1) | bit(libc::SIGUSR2) | bit(libc::SIGTERM));
        assert_eq!(s.ignored, bit(libc::SIGPIPE) | bit(libc::SIGXFSZ));
        assert_eq!(from_proc_status("Name: x\n"), None);
    }

    /// A child started with `apply` in its pre_exec has exactly the state
    /// asked for, whatever the parent's (here: this test process, whose
    /// SIGPIPE Rust ignores, and a mask the test blocks around the spawn).
    #[test]
    fn a_child_gets_the_recorded_state_not_the_parents() {
        let wanted = InheritedSignals { blocked: bit(libc::SIGUSR2), ignored: bit(libc::SIGHUP) | bit(libc::SIGINT) };
        let parent_block = [libc::SIGTERM, libc::SIGUSR1];
        let status = with_blocked(&parent_block, || {
            let mut cmd = std::process::Command::new("/bin/cat");
            cmd.arg("/proc/self/status");
            // SAFETY: apply is async-signal-safe.
            unsafe { cmd.pre_exec(move || wanted.apply()) };
            String::from_utf8(cmd.output().unwrap().stdout).unwrap()
        });
        // Signals 32 and 33 are the C library's: it neither reports nor
        // changes them, so the child keeps whatever the test runner had.
        let libc_own = bit(32) | bit(33);
        let got = from_proc_status(&status).map(|s| InheritedSignals { blocked: s.blocked & !libc_own, ignored: s.ignored & !libc_own });
        assert_eq!(got, Some(wanted), "{status}");
        // Without apply, a child started through fork (std's path once there
        // is a pre_exec, as the wrapper's setsid makes it) inherits the
        // parent's mask: what the wrapper handed its application before the
        // fix. (std's posix_spawn path, without pre_exec, clears the mask.)
        let status = with_blocked(&parent_block, || {
            let mut cmd = std::process::Command::new("/bin/cat");
            cmd.arg("/proc/self/status");
            // SAFETY: does nothing.
            unsafe { cmd.pre_exec(|| Ok(())) };
            String::from_utf8(cmd.output().unwrap().stdout).unwrap()
        });
        let inherited = from_proc_status(&status).unwrap();
        assert_eq!(inherited.blocked & (bit(libc::SIGTERM) | bit(libc::SIGUSR1)), bit(libc::SIGTERM) | bit(libc::SIGUSR1));
    }

    fn with_blocked<R>(signals: &[i32], f: impl FnOnce() -> R) -> R {
        // SAFETY: this thread's mask only, restored below.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for s in signals {
                libc::sigaddset(&mut set, *s);
            }
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
            let r = f();
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
            r
        }
    }

    #[test]
    fn without_a_constructor_the_state_now_counts_as_inherited() {
        // The test binary registers no constructor: `inherited` is `current`.
        assert!(!AT_LOAD_TAKEN.load(Ordering::Acquire));
        assert_eq!(InheritedSignals::inherited(), InheritedSignals::current());
    }
}
