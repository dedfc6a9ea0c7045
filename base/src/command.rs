//! Running a helper program (scontrol, nvidia-cuda-mps-control) by absolute
//! path with an argument vector, optional stdin, and a timeout. Root code
//! must never wait forever on another program.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How long output may still arrive after the program exited.
const PIPE_GRACE: Duration = Duration::from_millis(500);

#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("cannot run {path}: {source}")]
    Spawn { path: PathBuf, source: std::io::Error },
    #[error("{path} {args} timed out after {ms} ms")]
    Timeout { path: PathBuf, args: String, ms: u128 },
    /// Killed because its watch said so ([`run_watched`]).
    #[error("{path} was stopped: {why}")]
    Stopped { path: PathBuf, why: String },
}

/// Spawns `cmd`, trying again for a moment on ETXTBSY: a program that was
/// just written (an installer, a test's stand-in) stays "busy" while any
/// process forked meanwhile has not yet exec'd and still holds the write
/// descriptor. The kernel clears it within microseconds.
pub fn spawn_retrying(cmd: &mut Command) -> std::io::Result<std::process::Child> {
    let mut tries = 0;
    loop {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 50 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

/// For a child between fork and exec (`pre_exec`): a session of its own,
/// so that no signal meant for the parent's process group or terminal
/// reaches it (the checkpoint agent under slurmd, the application under
/// gpu-mode-run). setsid is async-signal-safe.
pub fn new_session() -> std::io::Result<()> {
    // SAFETY: setsid has no preconditions and touches no Rust state.
    if unsafe { libc::setsid() } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Runs `cmd` to completion or kills it after `timeout`. Output is collected
/// on threads so a chatty program cannot block on a full pipe.
pub fn run_with_timeout(cmd: Command, stdin: Option<&[u8]>, timeout: Duration) -> Result<Output, CommandError> {
    run_watched(cmd, stdin, timeout, &mut || None)
}

/// How often [`run_watched`] asks its watch.
const WATCH_EVERY: Duration = Duration::from_millis(100);

/// [`run_with_timeout`], and killed as soon as `watch` (asked every 100 ms
/// while it runs) gives a reason: a CRIU dump whose images outgrow their
/// bound (preempt's N5).
pub fn run_watched(
    mut cmd: Command,
    stdin: Option<&[u8]>,
    timeout: Duration,
    watch: &mut dyn FnMut() -> Option<String>,
) -> Result<Output, CommandError> {
    let path = PathBuf::from(cmd.get_program());
    let args: Vec<String> = cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() }).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = spawn_retrying(&mut cmd).map_err(|source| CommandError::Spawn { path: path.clone(), source })?;
    if let (Some(data), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // Closing the pipe after writing is what ends the client's input.
        let _ = pipe.write_all(data);
    }
    // Each pipe is read on its own thread, which hands its bytes over a
    // channel: a program that leaves a grandchild holding the pipes open
    // (a daemon) must not keep us waiting for an end of file.
    let read_all = |mut r: Box<dyn Read + Send>| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            let _ = tx.send(buf);
        });
        rx
    };
    let out = read_all(Box::new(child.stdout.take().expect("piped")));
    let err = read_all(Box::new(child.stderr.take().expect("piped")));
    let start = Instant::now();
    let mut watched = start;
    let status = loop {
        if watched.elapsed() >= WATCH_EVERY {
            watched = Instant::now();
            if let Some(why) = watch() {
                let _ = child.kill();
                let _ = child.wait();
                return Err(CommandError::Stopped { path, why });
            }
        }
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if start.elapsed() < timeout => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(CommandError::Timeout { path, args: args.join(" "), ms: timeout.as_millis() });
            }
        }
    };
    let drain = |rx: std::sync::mpsc::Receiver<Vec<u8>>| rx.recv_timeout(PIPE_GRACE).unwrap_or_default();
    Ok(Output { status, stdout: drain(out), stderr: drain(err) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_stdin_and_timeouts() {
        let mut cat = Command::new("/bin/cat");
        cat.arg("-");
        let out = run_with_timeout(cat, Some(b"quit\n"), Duration::from_secs(5)).unwrap();
        assert_eq!(out.stdout, b"quit\n");
        let mut sleep = Command::new("/bin/sleep");
        sleep.arg("5");
        let err = run_with_timeout(sleep, None, Duration::from_millis(100)).unwrap_err().to_string();
        assert_eq!(err, "/bin/sleep 5 timed out after 100 ms");
        let err = run_with_timeout(Command::new("/nonexistent"), None, Duration::from_secs(1)).unwrap_err().to_string();
        assert!(err.starts_with("cannot run /nonexistent"), "{err}");
    }

    #[test]
    fn a_watch_that_gives_a_reason_stops_the_program() {
        let mut sleep = Command::new("/bin/sleep");
        sleep.arg("5");
        let mut asked = 0;
        let start = Instant::now();
        let err = run_watched(sleep, None, Duration::from_secs(10), &mut || {
            asked += 1;
            (asked == 3).then(|| "enough".to_string())
        })
        .unwrap_err();
        assert_eq!(err.to_string(), "/bin/sleep was stopped: enough");
        assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
        let out = run_watched(Command::new("/bin/true"), None, Duration::from_secs(5), &mut || None).unwrap();
        assert!(out.status.success());
    }

    #[test]
    fn a_background_child_holding_the_pipes_does_not_block() {
        let mut sh = Command::new("/bin/sh");
        sh.args(["-c", "echo started; sleep 5 &"]);
        let start = Instant::now();
        let out = run_with_timeout(sh, None, Duration::from_secs(4)).unwrap();
        assert!(start.elapsed() < Duration::from_secs(2), "waited for the background child");
        assert!(out.status.success());
    }
}
