//! Process plumbing for the harness: timeouts, pid files, waiting for paths.

use anyhow::{bail, Context, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs a command, killing it after `timeout`.
pub fn output_with_timeout(mut cmd: Command, timeout: Duration) -> Result<Output> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {:?}", cmd.get_program()))?;
    // Drain both pipes on threads so a chatty child cannot block on a full pipe.
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = so.read_to_end(&mut b);
        b
    });
    let t_err = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = se.read_to_end(&mut b);
        b
    });
    // A thread waits for the exit without reaping it (WNOWAIT): the caller
    // learns of it at once (the hook bench times these calls; polling every
    // 20 ms made its figures steps of 20 ms), and the pid stays ours to kill.
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        loop {
            let r = unsafe { libc::waitid(libc::P_PID, pid, &mut info, libc::WEXITED | libc::WNOWAIT) };
            if r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                break;
            }
        }
        let _ = tx.send(());
    });
    if rx.recv_timeout(timeout).is_err() {
        let _ = child.kill();
        let _ = child.wait();
        bail!("{:?} {:?} timed out after {:?}", cmd.get_program(), cmd.get_args().collect::<Vec<_>>(), timeout);
    }
    let status = child.wait()?;
    Ok(Output { status, stdout: t_out.join().unwrap_or_default(), stderr: t_err.join().unwrap_or_default() })
}

pub fn wait_for_path(path: &Path, timeout: Duration) -> Result<()> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if path.exists() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("{} did not appear within {:?}", path.display(), timeout)
}

/// Pid files of the daemons, in stop order: slurmctld before slurmdbd (it
/// sends its last records there), the database after slurmdbd.
const PID_FILES: &[&str] = &["slurmd.pid", "slurmctld.pid", "slurmdbd.pid", "db/mariadbd.pid", "munge/munged.pid"];

/// Stops the daemons whose pid files are in `dir`: SIGTERM, then SIGKILL
/// after 10 s. Also kills slurmstepds left by a slurmd of this directory.
pub fn stop_daemons_in(dir: &Path) {
    // The slurmds of a two-node cluster: slurmd-<node>.pid.
    let per_node = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("slurmd-") && n.ends_with(".pid")));
    for pid in per_node.filter_map(|p| read_pid(&p)) {
        terminate(pid);
    }
    for f in PID_FILES {
        if let Some(pid) = read_pid(&dir.join(f)) {
            terminate(pid);
        }
    }
    for pid in stepds_of(dir) {
        terminate(pid);
    }
}

fn read_pid(path: &Path) -> Option<Pid> {
    let text = std::fs::read_to_string(path).ok()?;
    let n: i32 = text.trim().parse().ok()?;
    (n > 1).then(|| Pid::from_raw(n))
}

fn terminate(pid: Pid) {
    if kill(pid, Signal::SIGTERM).is_err() {
        return;
    }
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        if kill(pid, None).is_err() || is_zombie(pid) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = kill(pid, Signal::SIGKILL);
}

fn is_zombie(pid: Pid) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.rsplit(')').next().map(|r| r.trim_start().starts_with('Z')).unwrap_or(false))
        .unwrap_or(true)
}

/// slurmstepd processes whose environment names this cluster's slurm.conf.
fn stepds_of(dir: &Path) -> Vec<Pid> {
    let conf = format!("SLURM_CONF={}", dir.join("slurm.conf").display());
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            comm.starts_with("slurmstepd")
                && std::fs::read(format!("/proc/{pid}/environ"))
                    .map(|e| e.split(|b| *b == 0).any(|v| v == conf.as_bytes()))
                    .unwrap_or(false)
        })
        .map(Pid::from_raw)
        .collect()
}

/// Stops the checkpoint agents of the cluster in `dir` (started by its
/// prolog with `--config <dir>/gpu-mode.toml`) and, first, every process
/// under them (a tree an agent restored is its child). Only processes that
/// name this cluster's config are touched.
pub fn stop_agents_in(dir: &Path) {
    let config = dir.join("gpu-mode.toml").display().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else { return };
    let all: Vec<(i32, i32)> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| Some((pid, ppid(pid)?)))
        .collect();
    let agents: Vec<i32> = all
        .iter()
        .map(|(pid, _)| *pid)
        .filter(|pid| {
            let argv = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let argv: Vec<&[u8]> = argv.split(|b| *b == 0).collect();
            argv.first().is_some_and(|a| a.ends_with(b"gpu-mode-ckpt-agent")) && argv.contains(&config.as_bytes())
        })
        .collect();
    for agent in agents {
        let mut under = Vec::new();
        let mut frontier = vec![agent];
        while let Some(p) = frontier.pop() {
            for (child, _) in all.iter().filter(|(_, pp)| *pp == p) {
                under.push(*child);
                frontier.push(*child);
            }
        }
        for pid in under.into_iter().rev() {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        terminate(Pid::from_raw(agent));
    }
}

fn ppid(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')').next()?.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod output_tests {
    use super::output_with_timeout;
    use std::process::Command;
    use std::time::Duration;

    #[test]
    fn a_command_is_returned_with_its_output_and_one_past_the_timeout_is_killed() {
        let mut echo = Command::new("/bin/sh");
        echo.args(["-c", "echo out; echo err >&2; exit 3"]);
        let out = output_with_timeout(echo, Duration::from_secs(10)).unwrap();
        assert_eq!((out.status.code(), &out.stdout[..], &out.stderr[..]), (Some(3), &b"out\n"[..], &b"err\n"[..]));
        let mut sleep = Command::new("/bin/sleep");
        sleep.arg("30");
        let err = output_with_timeout(sleep, Duration::from_millis(200)).unwrap_err();
        assert!(err.to_string().contains("timed out"), "{err}");
    }
}
