//! `gpu-mode-run <app> [args]`: the user's side, run as the user inside the
//! job (`exec gpu-mode-run ./train` in the batch script, so it *is* the batch
//! shell that `--signal=B:USR1@N` reaches).
//!
//! * A first run starts the application as the leader of a session of its
//!   own (no terminal, not the batch shell's session: CRIU can dump it
//!   without `--shell-job`) and is a child subreaper, so every zombie of the
//!   tree is reaped here at once (a dumped tree's pids must be free before it
//!   can be restored: CRIU restores the original pids).
//! * A requeued run (`SLURM_RESTART_COUNT` > 0, or the agent has an image)
//!   asks the agent to restore instead, and relays the restored tree's exit
//!   status, which the agent (its parent) reports.
//! * The checkpoint signal asks the agent to checkpoint; then `scontrol
//!   requeue` (a script that exits within the grace time may otherwise end
//!   COMPLETED), then it waits for Slurm to end the job (its SIGTERM, not
//!   the SIGKILL a KillWait later). In a preemption on
//!   Slurm 24.05 and later it exits instead and Slurm requeues the job
//!   ([`slurm_requeues_in_grace`]). When the checkpoint
//!   fails, the application is killed and the job requeued to start over,
//!   with the reason on the job's stderr; unless the application ended on
//!   its own meanwhile (the dump then fails for want of it), whose status
//!   then ends the job. The requeue is skipped when Slurm
//!   is already ending the job (a cancel during the dump): requeueing then
//!   would bring a cancelled job back.
//! * Every other signal it may take (TERM, INT, HUP, QUIT, USR1/USR2, ALRM,
//!   CONT, TSTP, WINCH, the real-time ones...: [`forwarded_signals`]) is
//!   passed on to the application's process group, which otherwise runs
//!   with the signal mask and ignored set the wrapper inherited
//!   (signals.rs): nothing the wrapper blocks for itself reaches it. SIGTERM in particular is how `scancel` and the time limit
//!   end a job (a preemption with `preempt_send_user_signal` sends the
//!   job's `--signal` instead): seen on Slurm 22.05, checkpointing on it
//!   and requeueing turned every `scancel` of a running job into a requeue.

use super::protocol::{self, request, ExitInfo, Request, Response};
use super::signal_name;
use crate::command::run_with_timeout;
use crate::signal_state::InheritedSignals;
use super::slurm_view::SlurmView;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

/// Exit status when the wrapper itself fails (bad use, no agent for a restore).
pub const EXIT_FAILED: i32 = 1;
pub use super::pool::DIR_ENV as POOL_DIR_VAR;

/// Why gpu-mode-run cannot run the application at all: the command line or
/// the job's environment is not a checkpoint job's, or the wrapper's own
/// start failed. gpu-mode-run says it (a usage error, or a line of the job's
/// output) and fails; each Display is the words said before.
#[derive(Debug, thiserror::Error)]
pub enum WrapperError {
    /// No application named.
    #[error("usage: gpu-mode-run <application> [arguments...]")]
    Usage,
    /// Run outside a Slurm job.
    #[error("SLURM_JOB_ID is not set: gpu-mode-run runs inside a Slurm job (sbatch --gpu-mode=checkpoint)")]
    NoJob,
    #[error("SLURM_JOB_ID is not a job id")]
    BadJobId,
    /// `preempt.signal` names no signal (signal_number's words).
    #[error("{0}")]
    Signal(String),
    /// pthread_sigmask failed: the signals could not be waited for.
    #[error("cannot block signals: {0}")]
    BlockSignals(std::io::Error),
    /// The application could not be spawned (`app` its name as given).
    #[error("cannot start {app}: {source}")]
    Start { app: String, source: std::io::Error },
}

/// Not Clone: the preload's error may hold an io::Error (nothing copies
/// the options).
#[derive(Debug)]
pub struct RunOptions {
    /// The application and its arguments.
    pub app: Vec<OsString>,
    pub job: u32,
    pub restart_count: u32,
    /// This node's name in Slurm (SLURMD_NODENAME), for moving the job off it.
    pub node: Option<String>,
    pub socket: PathBuf,
    /// The node checker's checkpoint-readiness verdict (preempt::readiness).
    pub readiness: PathBuf,
    /// `preempt.signal` as a number.
    pub checkpoint_signal: i32,
    pub scontrol: PathBuf,
    /// After a requeue, how long to wait for Slurm to end the job.
    pub linger: Duration,
    /// How long the agent may take to answer `hello`: it waits there for a
    /// staged image's copy from another node (`staging_wait_s`, where this
    /// node stages too).
    pub hello_wait: Duration,
    /// The library to preload into the application, for huge pages and
    /// for forked children's GPU files (`Ok(None)`: both off; `Err`: on,
    /// but unusable, and why), preempt::hugepages.
    pub preload: Result<Option<PathBuf>, super::hugepages::HugepagesError>,
    /// What the preloaded library is told to do (its variables).
    pub preload_env: Vec<(&'static str, String)>,
    /// What the application starts with: the mask and ignored set the
    /// wrapper inherited.
    pub signals: InheritedSignals,
    /// The plugin held the checkpoint signal back in the batch step
    /// (signal_state::hold): one sent before the wrapper ran may have
    /// been dropped (dash), so the wrapper asks Slurm once it runs.
    pub signal_held: bool,
    /// NCCL's portable variables to set in the application's environment
    /// (the job's `GPU_MODE_CKPT_NCCL` is `portable`; those the job leaves
    /// unset), and those the job sets otherwise, kept (crate::nccl).
    pub nccl: NcclPlan,
    /// The job's host memory pool directory when the prolog said the job
    /// gets one (`GPU_MODE_TASK_POOL` is `on`, crate::pool::TASK_POOL_VAR):
    /// `<runtime_dir>/pool/<job>`, given to the application in
    /// [`POOL_DIR_VAR`] ([`RunOptions::pool_env`]).
    pub pool_dir: Option<PathBuf>,
}

/// What gpu-mode-run does for the job's NCCL transport.
#[derive(Debug, Default)]
pub struct NcclPlan {
    pub set: Vec<(&'static str, &'static str)>,
    pub overrides: Vec<super::nccl::Override>,
}

impl NcclPlan {
    /// From the job's environment: nothing unless the prolog said
    /// `portable` (crate::nccl::TASK_NCCL_VAR).
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>) -> NcclPlan {
        if env(super::nccl::TASK_NCCL_VAR).as_deref() != Some("portable") {
            return NcclPlan::default();
        }
        let (set, overrides) = super::nccl::plan_portable_env(env);
        NcclPlan { set, overrides }
    }

    /// The warning for overridden variables, if any: the user's values are
    /// kept and the checkpoint will refuse the job (the agent checks).
    pub fn warning(&self) -> Option<String> {
        (!self.overrides.is_empty()).then(|| {
            let list: Vec<String> = self.overrides.iter().map(|o| o.to_string()).collect();
            format!(
                "warning: --gpu-mode=checkpoint:nccl=portable, but the job's environment sets {}: kept as the job set it; \
                 NCCL ranks may then use CUDA IPC, which this driver cannot restore, so a preemption will refuse the \
                 checkpoint and the application will start over (unset the variable to be checkpointed)",
                list.join(", ")
            )
        })
    }
}

impl RunOptions {
    /// From the job's environment and the site config: SLURM_JOB_ID,
    /// SLURM_RESTART_COUNT, and the socket `GPU_MODE_CKPT_SOCKET` or the
    /// config's.
    pub fn from_env(cfg: &crate::Config, app: Vec<OsString>, env: &dyn Fn(&str) -> Option<String>) -> Result<RunOptions, WrapperError> {
        if app.is_empty() {
            return Err(WrapperError::Usage);
        }
        let job: u32 = env("SLURM_JOB_ID").ok_or(WrapperError::NoJob)?.parse().map_err(|_| WrapperError::BadJobId)?;
        let restart_count = env("SLURM_RESTART_COUNT").and_then(|v| v.parse().ok()).unwrap_or(0);
        let checkpoint_signal = super::signal_number(&cfg.preempt.signal).map_err(WrapperError::Signal)?;
        let signal_held = crate::signal_state::held_back(env(crate::signal_state::HELD_SIGNAL_VAR).as_deref(), checkpoint_signal);
        let inherited = InheritedSignals::inherited();
        let socket = env("GPU_MODE_CKPT_SOCKET")
            .map(PathBuf::from)
            .unwrap_or_else(|| super::socket_path(&cfg.preempt.agent_socket_dir(&cfg.runtime_dir), job));
        Ok(RunOptions {
            app,
            job,
            restart_count,
            node: env("SLURMD_NODENAME"),
            socket,
            readiness: super::readiness::path(&cfg.runtime_dir),
            checkpoint_signal,
            scontrol: cfg.slurm.scontrol.clone(),
            linger: Duration::from_secs(300),
            // Unset staging_dir: 30 s, as before the staging tier.
            hello_wait: HELLO_WAIT + if cfg.preempt.staging_dir.is_some() { super::staging::wait_bound(&cfg.preempt) } else { Duration::ZERO },
            preload: super::hugepages::for_application(&cfg.preempt),
            preload_env: super::hugepages::preload_env(&cfg.preempt, &cfg.cuda_ckpt.device_paths),
            signals: if signal_held { inherited.without(checkpoint_signal) } else { inherited },
            signal_held,
            nccl: NcclPlan::from_env(env),
            pool_dir: (env(super::pool::TASK_POOL_VAR).as_deref() == Some("on")).then(|| cfg.preempt.pool_dir(&cfg.runtime_dir, job)),
        })
    }

    /// The application's variable for the job's host memory pool: none
    /// without a pool; the pool directory when the huge-page shim, where the
    /// pool lives, is preloaded with its huge pages on; else the one warning
    /// line that says why the job runs without its pool.
    pub fn pool_env(&self) -> Result<Option<(&'static str, &Path)>, String> {
        let Some(dir) = &self.pool_dir else { return Ok(None) };
        // preempt::hugepages::preload_env turns the huge pages off with this.
        let huge_pages = !self.preload_env.iter().any(|(k, v)| *k == "GPU_MODE_HUGEPAGES" && v == "0");
        match &self.preload {
            Ok(Some(_)) if huge_pages => Ok(Some((POOL_DIR_VAR, dir.as_path()))),
            _ => Err("warning: --gpu-mode=checkpoint:pool=on, but the huge-page shim is not preloaded with its huge pages: \
                      the host memory pool needs [preempt] huge_pages = true (and its library); the job runs without one"
                .to_string()),
        }
    }
}

/// How long the agent may take to answer `hello`, beyond waiting for a copy.
const HELLO_WAIT: Duration = Duration::from_secs(30);

/// How long a failed checkpoint waits for the application's own end before
/// the job is requeued to start over: an application that ends as the
/// signal comes (its lock fails, or CRIU finds it gone) ends the job with
/// its own status. Seen in a 400-job churn: `DONE count=18`, the lock
/// failed, and the job ran again from its first step (the wait was one
/// look at the first event, 200 ms at most). Against a checkpoint that
/// failed with the application running on, it delays the requeue by this.
const ENDING_WAIT: Duration = Duration::from_secs(1);

/// Why a restore did not happen; `movable`: another node may do it.
struct NotRestored {
    message: String,
    movable: bool,
}

/// Whether `event`, after the wrapper requeued its job, is Slurm ending
/// the run (its SIGTERM): the checkpoint signal again, USR2, CONT or the
/// agent's words are not.
fn ends_the_requeued_run(event: &Event) -> bool {
    matches!(event, Event::Signal(libc::SIGTERM))
}

enum Event {
    Signal(i32),
    Agent(Response),
    AgentLost(String),
}

/// One line on the job's stderr, in one write (log::stderr_line): the
/// application writes to the same file, and `eprintln!` writes a line in
/// pieces, between which a line of the application's can land (seen: a
/// restored counter's `step 16` line split ours in two, and the test lost
/// the step).
fn say(text: &str) {
    crate::log::stderr_line(&format!("gpu-mode-run: {text}"));
}

/// The signals the wrapper passes on to the application: every one a
/// process can be sent from outside (scancel, `--signal`, a time limit)
/// except those it keeps for itself: CHLD (it reaps the tree), PIPE (its
/// own stderr), the faults of its own code (ILL, TRAP, ABRT, BUS, FPE,
/// SEGV, SYS, STKFLT) and KILL/STOP, which no process can take.
fn forwarded_signals() -> Vec<i32> {
    let mut v = vec![
        libc::SIGHUP,
        libc::SIGINT,
        libc::SIGQUIT,
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGALRM,
        libc::SIGTERM,
        libc::SIGCONT,
        libc::SIGTSTP,
        libc::SIGTTIN,
        libc::SIGTTOU,
        libc::SIGURG,
        libc::SIGXCPU,
        libc::SIGXFSZ,
        libc::SIGVTALRM,
        libc::SIGPROF,
        libc::SIGWINCH,
        libc::SIGPOLL,
        libc::SIGPWR,
    ];
    v.extend(libc::SIGRTMIN()..=libc::SIGRTMAX());
    v
}

/// The signals the wrapper takes (the checkpoint signal and those it
/// forwards): blocked in every thread of the wrapper and consumed by one
/// sigwait thread. The application's child unblocks them again
/// ([`InheritedSignals::apply`]).
fn handled(checkpoint_signal: i32) -> libc::sigset_t {
    // SAFETY: a local set filled with valid signal numbers.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in forwarded_signals().into_iter().chain([checkpoint_signal]) {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

fn start_signal_thread(set: libc::sigset_t, tx: Sender<Event>) -> Result<(), WrapperError> {
    // SAFETY: blocks the set in this thread, whose later threads inherit it.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(WrapperError::BlockSignals(std::io::Error::from_raw_os_error(rc)));
    }
    // Taken by sigwait, so never ignored: the plugin may have held the
    // checkpoint signal back as ignored (signal_state::hold), and what
    // an ignored signal does while blocked is the kernel's choice.
    for sig in 1..=64 {
        // SAFETY: sigismember on the set; sigaction with a local, default action.
        unsafe {
            if libc::sigismember(&set, sig) == 1 {
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN {
                    let mut dfl: libc::sigaction = std::mem::zeroed();
                    dfl.sa_sigaction = libc::SIG_DFL;
                    libc::sigaction(sig, &dfl, std::ptr::null_mut());
                }
            }
        }
    }
    std::thread::spawn(move || loop {
        let mut sig = 0;
        // SAFETY: waits for a signal of the set, all blocked in every thread.
        if unsafe { libc::sigwait(&set, &mut sig) } == 0 && tx.send(Event::Signal(sig)).is_err() {
            return;
        }
    });
    Ok(())
}

/// Runs the application (or restores it) and returns the exit status the
/// job should end with.
pub fn run(o: &RunOptions) -> i32 {
    let (tx, rx) = channel();
    if let Err(e) = start_signal_thread(handled(o.checkpoint_signal), tx.clone()) {
        say(&e.to_string());
        return EXIT_FAILED;
    }
    // SAFETY: plain prctl on this process.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    warn_if_node_not_ready(&o.readiness);
    let hello = request(&o.socket, &Request::Hello, Some(o.hello_wait));
    let mut w = Wrapper { o, rx, tx, root: 0, restored: false, agent: hello.is_ok() };
    match hello {
        Ok((Response::Hello { image: Some(img), .. }, _)) => {
            say(&format!("job {} run {}: restoring the checkpoint taken in run {} on {}", o.job, o.restart_count, img.restart_count, img.node));
            match w.restore() {
                Ok(()) => {}
                Err(NotRestored { message, movable: true }) => return w.restore_elsewhere(&message),
                Err(NotRestored { message, .. }) => {
                    say(&format!("cannot restore job {}: {message}", o.job));
                    return EXIT_FAILED;
                }
            }
        }
        Ok((Response::Hello { image: None, criu, note, .. }, _)) => {
            if let Some(note) = note {
                say(&format!("job {} run {}: {note}: starting the application from the beginning", o.job, o.restart_count));
            } else if o.restart_count > 0 {
                say(&format!("job {} run {}: no checkpoint image to restore: starting the application from the beginning", o.job, o.restart_count));
            }
            if let Err(e) = criu {
                say(&format!("warning: checkpointing will fail on this node: {e}"));
            }
            if let Err(e) = w.start() {
                say(&e.to_string());
                return EXIT_FAILED;
            }
        }
        other => {
            let why = match other {
                Err(e) => e.to_string(),
                Ok((r, _)) => format!("unexpected answer {r:?}"),
            };
            say(&format!("warning: no checkpoint agent for job {} ({why}): the application runs, but a preemption will restart it from the beginning", o.job));
            if let Err(e) = w.start() {
                say(&e.to_string());
                return EXIT_FAILED;
            }
        }
    }
    w.catch_up_on_preemption();
    w.watch()
}

/// One line on the job's stderr when the node checker found that this node
/// cannot checkpoint: the job runs anyway, and its owner knows a preemption
/// would start it over. No verdict (the checker has not run): nothing.
fn warn_if_node_not_ready(verdict: &Path) {
    if let Some(line) = super::readiness::read(verdict).and_then(|v| v.job_start_line()) {
        say(&line);
    }
}

struct Wrapper<'a> {
    o: &'a RunOptions,
    rx: Receiver<Event>,
    tx: Sender<Event>,
    /// The application's root (our child), or the restored root (the agent's).
    root: i32,
    restored: bool,
    agent: bool,
}

impl Wrapper<'_> {
    fn start(&mut self) -> Result<(), WrapperError> {
        let mut cmd = std::process::Command::new(&self.o.app[0]);
        cmd.args(&self.o.app[1..]);
        // The plugin's note that it held the checkpoint signal back is ours.
        cmd.env_remove(crate::signal_state::HELD_SIGNAL_VAR);
        // Before the application starts, so every rank it launches inherits
        // them; NCCL reads them once, at init.
        cmd.envs(self.o.nccl.set.iter().copied());
        if let Some(warning) = self.o.nccl.warning() {
            say(&warning);
        }
        match self.o.pool_env() {
            Ok(Some((name, dir))) => {
                cmd.env(name, dir);
            }
            Ok(None) => {}
            Err(warning) => say(&warning),
        }
        match &self.o.preload {
            Ok(Some(lib)) => {
                let value = super::hugepages::preload_value(lib, std::env::var_os(super::hugepages::PRELOAD).as_deref());
                cmd.env(super::hugepages::PRELOAD, value);
                cmd.envs(self.o.preload_env.iter().map(|(k, v)| (*k, v)));
            }
            Ok(None) => {}
            Err(e) => say(&format!(
                "the preload library is unusable ({e}): the application runs without huge pages for the checkpoint, and \
                 forked children keep their GPU files (a tree with them cannot be checkpointed)"
            )),
        }
        let signals = self.o.signals;
        // SAFETY: setsid, sigaction and sigprocmask are async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                crate::command::new_session()?;
                signals.apply()
            });
        }
        let child = cmd.spawn().map_err(|source| WrapperError::Start { app: self.o.app[0].to_string_lossy().into_owned(), source })?;
        self.root = child.id() as i32;
        Ok(())
    }

    /// A preemption whose checkpoint signal came before the wrapper ran and
    /// was dropped (the plugin holds it back ignored and blocked; dash
    /// clears its mask at start, so there it was dropped): Slurm says the
    /// job is being preempted, and the wrapper checkpoints now, as if the
    /// signal had come. Where it was kept pending (bash), the signal itself
    /// follows and finds the checkpoint taken. One squeue call, only where
    /// the plugin held the signal.
    fn catch_up_on_preemption(&self) {
        if !self.o.signal_held {
            return;
        }
        let view = SlurmView::new(&self.o.scontrol);
        if view.job_state(self.o.job).is_some_and(|s| s.being_preempted && s.state == "RUNNING") {
            say(&format!("job {} was preempted before gpu-mode-run could take its checkpoint signal: checkpointing now", self.o.job));
            let _ = self.tx.send(Event::Signal(self.o.checkpoint_signal));
        }
    }

    /// Asks for a restore; the agent answers `restored`, and later how the
    /// tree ended, which a reader thread turns into an event.
    fn restore(&mut self) -> Result<(), NotRestored> {
        let here = |message| NotRestored { message, movable: false };
        let (resp, mut reader) = request(&self.o.socket, &Request::Restore, None).map_err(|e| here(e.to_string()))?;
        match resp {
            Response::Restored { pid, summary } => {
                self.root = pid;
                self.restored = true;
                let moved = if summary.device_map.is_empty() { String::new() } else { format!(", GPUs {:?}", summary.device_map) };
                let copy = if summary.from_local { "'s node-local copy" } else { "" };
                say(&format!(
                    "job {} restored (pid {pid}, {:.2} GiB image from {}{copy}) in {:.1} s: checks {:.1} s, CRIU {:.1} s, CUDA {:.1} s{moved}",
                    self.o.job,
                    summary.image_bytes as f64 / (1u64 << 30) as f64,
                    summary.from_node,
                    summary.total_ms / 1e3,
                    summary.check_ms / 1e3,
                    summary.criu_restore_ms / 1e3,
                    summary.cuda_restore_ms / 1e3
                ));
                if !summary.timeline.phases.is_empty() {
                    say(&format!("job {} restore phases: {}", self.o.job, summary.timeline.render()));
                }
                let tx = self.tx.clone();
                std::thread::spawn(move || {
                    let ev = match protocol::receive::<Response>(&mut reader) {
                        Ok(Some(r)) => Event::Agent(r),
                        Ok(None) => Event::AgentLost("the agent closed the connection".into()),
                        Err(e) => Event::AgentLost(e.to_string()),
                    };
                    let _ = tx.send(ev);
                });
                Ok(())
            }
            Response::Error { message } => Err(here(message)),
            Response::NotHere { message } => Err(NotRestored { message, movable: true }),
            other => Err(here(format!("unexpected answer {other:?}"))),
        }
    }

    /// The agent could not restore the image on this node for a reason of
    /// the node's (a pid of the image held by another process: security
    /// review F7): the job is requeued with this node excluded, the image
    /// kept, so that another node restores it. Where no other node is left,
    /// or Slurm cannot be asked, the job fails as for any refused restore.
    fn restore_elsewhere(&self, why: &str) -> i32 {
        let job = self.o.job;
        let Some(node) = self.o.node.as_deref() else {
            say(&format!("cannot restore job {job}: {why} (SLURMD_NODENAME is not set: not moved to another node)"));
            return EXIT_FAILED;
        };
        let view = SlurmView::new(&self.o.scontrol);
        let nodes = match view.exclusion_with(job, node) {
            Ok(nodes) => nodes,
            Err(e) => {
                say(&format!("cannot restore job {job} on {node}: {why}; not moved to another node: {e}"));
                return EXIT_FAILED;
            }
        };
        say(&format!("cannot restore job {job} on {node}: {why}; requeueing it to be restored on another node (ExcNodeList={nodes})"));
        self.plain_requeue();
        if let Err(e) = view.exclude(job, &nodes) {
            say(&format!("job {job}: {e}: requeued without excluding {node}"));
        }
        self.linger();
        EXIT_FAILED
    }

    /// Until the application ends (its status) or a preemption is handled.
    fn watch(&mut self) -> i32 {
        loop {
            if let Some(status) = self.reap() {
                return status;
            }
            match self.rx.recv_timeout(Duration::from_millis(100)) {
                Ok(Event::Signal(s)) if s == self.o.checkpoint_signal => return self.preempted(s),
                Ok(Event::Signal(s)) => {
                    // The application leads its own process group.
                    unsafe { libc::kill(-self.root, s) };
                }
                Ok(Event::Agent(Response::Exited(info))) => return self.ended(info),
                Ok(Event::Agent(other)) => say(&format!("unexpected message from the agent: {other:?}")),
                Ok(Event::AgentLost(e)) => return self.agent_lost(&e),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return EXIT_FAILED,
            }
        }
    }

    /// Reaps every finished child (orphans of the tree included); the
    /// application's own end gives its status.
    fn reap(&self) -> Option<i32> {
        let mut status = None;
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) if !self.restored && pid.as_raw() == self.root => status = Some(code),
                Ok(WaitStatus::Signaled(pid, sig, _)) if !self.restored && pid.as_raw() == self.root => status = Some(128 + sig as i32),
                Ok(WaitStatus::StillAlive) | Err(_) => return status,
                Ok(_) => {}
            }
        }
    }

    fn ended(&self, info: ExitInfo) -> i32 {
        info.shell_status()
    }

    /// The agent went away while a restored tree runs: wait for the tree
    /// ourselves (we cannot learn its status).
    fn agent_lost(&self, why: &str) -> i32 {
        say(&format!("lost the checkpoint agent ({why}): waiting for pid {} without its exit status", self.root));
        while crate::procfs::read(self.root).is_some_and(|p| p.state != 'Z') {
            std::thread::sleep(Duration::from_millis(200));
        }
        EXIT_FAILED
    }

    /// The checkpoint signal: checkpoint, requeue, wait for Slurm.
    fn preempted(&mut self, sig: i32) -> i32 {
        let at = super::now_ms();
        say(&format!("{} received: checkpointing job {} (pid {})", signal_name(sig), self.o.job, self.root));
        // `tree_lost`: the agent killed the tree after dumping it, then failed.
        let mut tree_lost = false;
        let result = if self.agent {
            let req = Request::Checkpoint { root_pid: self.root, signal_at_ms: Some(at) };
            match request(&self.o.socket, &req, None) {
                Ok((Response::Checkpointed(s), _)) => Ok(s),
                Ok((Response::Error { message }, _)) => Err(message),
                Ok((Response::TreeLost { message }, _)) => {
                    tree_lost = true;
                    Err(message)
                }
                Ok((other, _)) => Err(format!("unexpected answer {other:?}")),
                Err(e) => Err(e.to_string()),
            }
        } else {
            Err("no checkpoint agent runs for this job".into())
        };
        let status = match result {
            Ok(s) => {
                if let Some(line) = first_attempt_line(self.o.job, &s) {
                    say(&line);
                }
                say(&checkpointed_line(self.o.job, &s));
                if !s.timeline.phases.is_empty() {
                    say(&format!("job {} checkpoint phases: {}", self.o.job, s.timeline.render()));
                }
                0
            }
            Err(e) => {
                // The application may have ended on its own while it was being
                // dumped (CRIU then fails, the process gone): its end stands,
                // and the job ends with its status instead of starting over.
                // Not when the agent killed it: that end is the checkpoint's.
                if let Some(status) = (!tree_lost).then(|| self.ended_meanwhile()).flatten() {
                    say(&format!(
                        "job {}: the application ended (status {status}) while it was being checkpointed ({e}); not requeued",
                        self.o.job
                    ));
                    return status;
                }
                say(&format!("checkpoint of job {} failed: {e}. The job is requeued and will start over from the beginning.", self.o.job));
                unsafe { libc::kill(-self.root, libc::SIGKILL) };
                EXIT_FAILED
            }
        };
        self.reap();
        if self.requeue() {
            self.linger();
        }
        status
    }

    /// The application's status if it ends within [`ENDING_WAIT`]: our
    /// child reaped, or, for a restored tree, the agent's report of its end.
    /// Every event is looked at (one that is no end is kept, in order, for
    /// whoever reads next), not only the first.
    fn ended_meanwhile(&mut self) -> Option<i32> {
        let deadline = Instant::now() + ENDING_WAIT;
        let mut kept = Vec::new();
        let status = loop {
            if !self.restored {
                if let Some(status) = self.reap() {
                    break Some(status);
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break None;
            }
            match self.rx.recv_timeout(left.min(Duration::from_millis(50))) {
                Ok(Event::Agent(Response::Exited(info))) if self.restored => break Some(self.ended(info)),
                Ok(other) => kept.push(other),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break None,
            }
        };
        for event in kept {
            let _ = self.tx.send(event);
        }
        status
    }

    /// `scontrol requeue <job>` as the user (owners may requeue their jobs),
    /// unless Slurm is ending the job already, or will requeue it itself as
    /// this run ends (see [`slurm_requeues_in_grace`]). Whether to wait for
    /// Slurm to end the job afterwards (not when Slurm waits for us).
    fn requeue(&self) -> bool {
        let shown = SlurmView::new(&self.o.scontrol).job_state(self.o.job);
        if let Some(state) = shown.as_ref().map(|s| s.state.clone()).filter(|s| s != "RUNNING") {
            say(&format!(
                "job {} is {state} in Slurm (cancelled, or ended at its time or grace limit): not requeued by gpu-mode-run",
                self.o.job
            ));
            return true;
        }
        let version = self.scontrol(&["--version"]).as_deref().and_then(slurm_version_of);
        if shown.is_some_and(|s| s.being_preempted) && version.is_some_and(slurm_requeues_in_grace) {
            say(&format!("job {} is being preempted: Slurm requeues it as this run ends", self.o.job));
            return false;
        }
        self.plain_requeue();
        true
    }

    /// `scontrol requeue <job>`; a failure is said, not fatal.
    fn plain_requeue(&self) {
        let mut cmd = std::process::Command::new(&self.o.scontrol);
        cmd.args(["requeue", &self.o.job.to_string()]);
        match run_with_timeout(cmd, None, Duration::from_secs(30)) {
            Ok(out) if out.status.success() => {}
            Ok(out) => say(&format!(
                "scontrol requeue {} failed ({}): {}: the job may end COMPLETED instead of being requeued",
                self.o.job,
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )),
            Err(e) => say(&format!("{e}: the job may end COMPLETED instead of being requeued")),
        }
    }

    /// scontrol's output, or `None` when it cannot be run or fails: then the
    /// requeue goes ahead, as losing the checkpoint is the worse mistake.
    fn scontrol(&self, args: &[&str]) -> Option<String> {
        let mut cmd = std::process::Command::new(&self.o.scontrol);
        cmd.args(args);
        let out = run_with_timeout(cmd, None, Duration::from_secs(30)).ok().filter(|o| o.status.success())?;
        Some(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Waits for Slurm to end the requeued job, reaping what is left.
    /// Returns at Slurm's SIGTERM, which ends this run for the requeue:
    /// the tree is gone, and waiting on for the SIGKILL that follows
    /// KillWait later (30 s by default) only kept the job COMPLETING and the
    /// preemptor waiting for its node. Other signals are dropped.
    fn linger(&self) {
        let start = Instant::now();
        while start.elapsed() < self.o.linger {
            self.reap();
            if self.rx.recv_timeout(Duration::from_millis(200)).is_ok_and(|e| ends_the_requeued_run(&e)) {
                self.reap();
                return;
            }
        }
        if !self.o.linger.is_zero() {
            say(&format!("still running {} s after the requeue; exiting", self.o.linger.as_secs()));
        }
    }
}

/// `job 7 checkpointed: 8.58 GiB image durable 12.1 s after the signal, GPU
/// memory free 3.9 s after the signal; requeueing` (without a signal time:
/// `... image in 12.0 s; requeueing`).
fn checkpointed_line(job: u32, s: &protocol::CheckpointSummary) -> String {
    let gib = s.image_bytes as f64 / (1u64 << 30) as f64;
    let t = &s.timings;
    match (t.signal_to_durable_ms, t.signal_to_gpu_free_ms) {
        (Some(durable), Some(free)) => format!(
            "job {job} checkpointed: {gib:.2} GiB image durable {:.1} s after the signal, GPU memory free {:.1} s after the signal{}; requeueing",
            durable / 1e3,
            free / 1e3,
            pool_words(s.pool_bytes)
        ),
        _ => format!("job {job} checkpointed: {gib:.2} GiB image in {:.1} s; requeueing", t.total_ms / 1e3),
    }
}

/// A checkpoint taken at a second attempt: why the first was dropped (the
/// job keeps its progress all the same).
fn first_attempt_line(job: u32, s: &protocol::CheckpointSummary) -> Option<String> {
    let why = s.first_attempt.as_deref()?;
    Some(format!("job {job}: the first checkpoint attempt was dropped and a second one taken: {why}"))
}

/// What the job's host memory pool gave the driver's checkpoint (issue 39):
/// memory populated while the job ran, not at the signal.
fn pool_words(bytes: u64) -> String {
    match bytes {
        0 => String::new(),
        b => format!(" (its buffers' {:.2} GiB populated before the signal, in the host memory pool)", b as f64 / (1u64 << 30) as f64),
    }
}

/// Slurm 24.05 and later requeue a preempted job themselves when its batch
/// script ends within the grace time (slurmctld's GRACE_PREEMPT flag,
/// proc_req.c), and an `scontrol requeue` meanwhile does not clear that
/// flag: seen on 24.11.5, the restored run was requeued once more when it
/// ended and ran again from the beginning. There the wrapper leaves the
/// requeue to Slurm. 22.05 has no such path: a script that ends in the
/// grace time may end COMPLETED, so the wrapper requeues.
fn slurm_requeues_in_grace(version: (u32, u32)) -> bool {
    version >= (24, 5)
}

/// `(24, 11)` from `scontrol --version` (`slurm 24.11.5`, `slurm-wlm 22.05.8`).
fn slurm_version_of(text: &str) -> Option<(u32, u32)> {
    let mut parts = text.split_whitespace().nth(1)?.split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}


#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checkpoint_line_says_when_the_gpu_was_free_and_the_image_durable() {
        let mut s = protocol::CheckpointSummary {
            image_dir: "/img/7/0".into(),
            image_bytes: 9_215_479_287,
            gpu_bytes: 8 << 30,
            cuda_processes: 1,
            timings: Default::default(),
            timeline: Default::default(),
            processes: vec![],
            pool_bytes: 0,
            first_attempt: None,
        };
        assert_eq!(first_attempt_line(7, &s), None);
        s.timings.total_ms = 12_000.0;
        assert_eq!(checkpointed_line(7, &s), "job 7 checkpointed: 8.58 GiB image in 12.0 s; requeueing");
        s.timings.signal_to_durable_ms = Some(12_100.0);
        s.timings.signal_to_gpu_free_ms = Some(3_900.0);
        assert_eq!(
            checkpointed_line(7, &s),
            "job 7 checkpointed: 8.58 GiB image durable 12.1 s after the signal, GPU memory free 3.9 s after the signal; requeueing"
        );
        // A pool job's: what the pool gave the driver.
        s.pool_bytes = 11228 << 20;
        assert_eq!(
            checkpointed_line(7, &s),
            "job 7 checkpointed: 8.58 GiB image durable 12.1 s after the signal, GPU memory free 3.9 s after the signal \
             (its buffers' 10.96 GiB populated before the signal, in the host memory pool); requeueing"
        );
        s.first_attempt = Some("pid 9 opened /dev/nvidia0 (fd 3) after the GPU scan".into());
        assert_eq!(
            first_attempt_line(7, &s).as_deref(),
            Some("job 7: the first checkpoint attempt was dropped and a second one taken: pid 9 opened /dev/nvidia0 (fd 3) after the GPU scan")
        );
    }

    #[test]
    fn every_signal_from_outside_is_taken_and_those_of_the_wrappers_own_are_not() {
        let set = handled(libc::SIGUSR1);
        let has = |s: i32| unsafe { libc::sigismember(&set, s) == 1 };
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT, libc::SIGUSR1, libc::SIGUSR2, libc::SIGCONT, libc::SIGALRM, libc::SIGRTMIN()] {
            assert!(has(s), "signal {s} is not taken");
        }
        for s in [libc::SIGCHLD, libc::SIGPIPE, libc::SIGSEGV, libc::SIGBUS, libc::SIGKILL, libc::SIGSTOP] {
            assert!(!has(s), "signal {s} is taken");
        }
        // The checkpoint signal is taken even where it is not one forwarded.
        assert!(unsafe { libc::sigismember(&handled(libc::SIGSYS), libc::SIGSYS) } == 1);
    }

    #[test]
    fn slurm_24_05_and_later_requeue_a_preempted_job_themselves() {
        let cases = [
            ("slurm 24.11.5\n", Some((24, 11)), true),
            ("slurm-wlm 22.05.8\n", Some((22, 5)), false),
            ("slurm 24.05.0", Some((24, 5)), true),
            ("slurm 23.11.10", Some((23, 11)), false),
            ("slurm 26.05.5", Some((26, 5)), true),
            ("garbage", None, false),
        ];
        for (text, version, requeues) in cases {
            assert_eq!(slurm_version_of(text), version, "{text}");
            assert_eq!(version.is_some_and(slurm_requeues_in_grace), requeues, "{text}");
        }
    }

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    /// After its requeue the wrapper waits for Slurm to end the run, and
    /// ends at Slurm's SIGTERM instead of KillWait later; nothing else ends
    /// the wait.
    #[test]
    fn only_slurms_sigterm_ends_a_requeued_runs_wait() {
        let rows = [
            (Event::Signal(libc::SIGTERM), true),
            (Event::Signal(libc::SIGUSR1), false),
            (Event::Signal(libc::SIGUSR2), false),
            (Event::Signal(libc::SIGCONT), false),
            (Event::Signal(libc::SIGINT), false),
            (Event::AgentLost("gone".into()), false),
        ];
        for (event, ends) in rows {
            let name = match &event {
                Event::Signal(s) => crate::signal_name(*s),
                _ => "agent".into(),
            };
            assert_eq!(ends_the_requeued_run(&event), ends, "{name}");
        }
    }

    #[test]
    fn options_come_from_the_job_environment() {
        let cfg = crate::Config::default();
        let app = vec![OsString::from("./train")];
        let o = RunOptions::from_env(&cfg, app.clone(), &env(&[("SLURM_JOB_ID", "42"), ("SLURM_RESTART_COUNT", "2")])).unwrap();
        assert_eq!((o.job, o.restart_count, o.checkpoint_signal), (42, 2, libc::SIGUSR1));
        assert_eq!(o.socket, PathBuf::from("/run/slurm-gpu-mode/agent/job-42.sock"));
        let o = RunOptions::from_env(&cfg, app.clone(), &env(&[("SLURM_JOB_ID", "42"), ("GPU_MODE_CKPT_SOCKET", "/x.sock")])).unwrap();
        assert_eq!((o.restart_count, o.socket), (0, PathBuf::from("/x.sock")));
        let err = RunOptions::from_env(&cfg, app, &env(&[])).unwrap_err();
        assert!(err.to_string().contains("SLURM_JOB_ID is not set"), "{err}");
        assert!(RunOptions::from_env(&cfg, vec![], &env(&[("SLURM_JOB_ID", "1")])).unwrap_err().to_string().starts_with("usage"));
    }

    /// The portable mode sets what the job leaves unset, keeps (and warns
    /// of) what it sets otherwise; without the mode nothing.
    #[test]
    fn the_nccl_plan_follows_the_mode_and_the_job_environment() {
        let cfg = crate::Config::default();
        let plan = |vars: &[(&str, &str)]| {
            let mut all = vec![("SLURM_JOB_ID", "42")];
            all.extend_from_slice(vars);
            let vars = env(&all);
            RunOptions::from_env(&cfg, vec![OsString::from("./train")], &vars).unwrap().nccl
        };
        let none = plan(&[]);
        assert!(none.set.is_empty() && none.overrides.is_empty() && none.warning().is_none());
        assert!(plan(&[("GPU_MODE_CKPT_NCCL", "native")]).set.is_empty());
        let all = plan(&[("GPU_MODE_CKPT_NCCL", "portable")]);
        assert_eq!(all.set, super::super::nccl::PORTABLE_ENV.iter().map(|v| (v.name, v.value)).collect::<Vec<_>>());
        assert!(all.warning().is_none());
        let over = plan(&[("GPU_MODE_CKPT_NCCL", "portable"), ("NCCL_P2P_DISABLE", "0"), ("NCCL_SHM_DISABLE", "1")]);
        assert!(!over.set.iter().any(|(n, _)| n.starts_with("NCCL_P2P") || n.starts_with("NCCL_SHM")), "{:?}", over.set);
        let warning = over.warning().unwrap();
        assert!(warning.contains("sets NCCL_P2P_DISABLE=0 (the mode needs NCCL_P2P_DISABLE=1): kept") && warning.contains("start over"), "{warning}");
    }

    /// The pool directory follows the prolog's variable and the job id; the
    /// application gets it only with the huge-page shim preloaded and its
    /// huge pages on, else one warning line.
    #[test]
    fn the_pool_dir_follows_the_mode_and_the_huge_page_shim() {
        let dir = tempfile::tempdir().unwrap();
        let lib = dir.path().join("lib.so");
        std::fs::write(&lib, b"\x7fELF").unwrap();
        let mut cfg = crate::Config { runtime_dir: "/run/gm".into(), ..crate::Config::default() };
        cfg.preempt.huge_pages_library = lib;
        cfg.preempt.huge_pages_dir = dir.path().join("kept");
        let options = |cfg: &crate::Config, vars: &[(&str, &str)]| {
            let mut all = vec![("SLURM_JOB_ID", "42")];
            all.extend_from_slice(vars);
            let vars = env(&all);
            RunOptions::from_env(cfg, vec![OsString::from("./train")], &vars).unwrap()
        };
        assert_eq!(options(&cfg, &[]).pool_dir, None);
        assert_eq!(options(&cfg, &[]).pool_env(), Ok(None));
        assert_eq!(options(&cfg, &[("GPU_MODE_TASK_POOL", "off")]).pool_dir, None);
        assert_eq!(options(&cfg, &[("GPU_MODE_TASK_POOL", "1")]).pool_dir, None);
        let on = options(&cfg, &[("GPU_MODE_TASK_POOL", "on")]);
        assert_eq!(on.pool_dir, Some(PathBuf::from("/run/gm/pool/42")));
        assert_eq!(on.pool_env(), Ok(Some(("GPU_MODE_POOL_DIR", Path::new("/run/gm/pool/42")))));
        // The shim preloaded for its other jobs, its huge pages off: no pool.
        cfg.preempt.huge_pages = false;
        let off = options(&cfg, &[("GPU_MODE_TASK_POOL", "on")]);
        assert!(matches!(off.preload, Ok(Some(_))), "{:?}", off.preload);
        let warning = off.pool_env().unwrap_err();
        assert!(warning.contains("needs [preempt] huge_pages = true") && !warning.contains('\n'), "{warning}");
        // No shim at all, or an unusable one: the same.
        cfg.preempt.forked_children_drop_gpu_files = false;
        cfg.preempt.hide_io_uring = false;
        assert!(options(&cfg, &[("GPU_MODE_TASK_POOL", "on")]).pool_env().unwrap_err().contains("huge_pages = true"));
        cfg.preempt.huge_pages = true;
        cfg.preempt.huge_pages_library = "/nonexistent/lib.so".into();
        assert!(options(&cfg, &[("GPU_MODE_TASK_POOL", "on")]).pool_env().unwrap_err().contains("huge_pages = true"));
        assert_eq!(options(&cfg, &[]).pool_env(), Ok(None));
    }

    /// Each reason the wrapper cannot run has its kind and the words it
    /// said before.
    #[test]
    fn each_wrapper_failure_says_todays_words() {
        let cfg = crate::Config::default();
        let app = || vec![OsString::from("./train")];
        let from = |app, vars: &[(&str, &str)]| RunOptions::from_env(&cfg, app, &env(vars)).unwrap_err();
        assert!(matches!(from(vec![], &[("SLURM_JOB_ID", "1")]), WrapperError::Usage));
        assert!(matches!(from(app(), &[]), WrapperError::NoJob));
        assert!(matches!(from(app(), &[("SLURM_JOB_ID", "42.1")]), WrapperError::BadJobId));
        let mut bad = crate::Config::default();
        bad.preempt.signal = "NOSUCH".into();
        let err = RunOptions::from_env(&bad, app(), &env(&[("SLURM_JOB_ID", "42")])).unwrap_err();
        assert!(matches!(err, WrapperError::Signal(_)), "{err:?}");
        let signal_text = crate::signal_number("NOSUCH").unwrap_err();
        // An application that is not there: Start, with the spawn's error.
        let o = RunOptions::from_env(&cfg, vec![OsString::from("/nonexistent/train")], &env(&[("SLURM_JOB_ID", "42")])).unwrap();
        let (tx, rx) = channel();
        let mut w = Wrapper { o: &o, rx, tx, root: 0, restored: false, agent: false };
        let started = w.start().unwrap_err();
        assert!(matches!(&started, WrapperError::Start { app, source } if app == "/nonexistent/train" && source.kind() == std::io::ErrorKind::NotFound), "{started:?}");
        let cases = [
            (WrapperError::Usage, "usage: gpu-mode-run <application> [arguments...]".to_string()),
            (WrapperError::NoJob, "SLURM_JOB_ID is not set: gpu-mode-run runs inside a Slurm job (sbatch --gpu-mode=checkpoint)".into()),
            (WrapperError::BadJobId, "SLURM_JOB_ID is not a job id".into()),
            (err, signal_text),
            (WrapperError::BlockSignals(std::io::Error::from_raw_os_error(libc::EINVAL)), "cannot block signals: Invalid argument (os error 22)".into()),
            (
                WrapperError::Start { app: "./train".into(), source: std::io::Error::from_raw_os_error(libc::ENOENT) },
                "cannot start ./train: No such file or directory (os error 2)".into(),
            ),
        ];
        for (e, text) in cases {
            assert_eq!(e.to_string(), text, "{e:?}");
        }
    }

    #[test]
    fn the_huge_page_shim_follows_the_config() {
        let app = vec![OsString::from("./train")];
        let job = [("SLURM_JOB_ID", "42")];
        let mut cfg = crate::Config::default();
        cfg.preempt.huge_pages_library = "/nonexistent/libgpu_mode_hugepages.so".into();
        let o = RunOptions::from_env(&cfg, app.clone(), &env(&job)).unwrap();
        let err = o.preload.unwrap_err();
        assert!(err.to_string().contains("/nonexistent/libgpu_mode_hugepages.so"), "{err}");
        cfg.preempt.huge_pages = false;
        cfg.preempt.forked_children_drop_gpu_files = false;
        cfg.preempt.hide_io_uring = false;
        assert_eq!(RunOptions::from_env(&cfg, app, &env(&job)).unwrap().preload.map_err(|e| e.to_string()), Ok(None));
    }
}
