//! Facts about the processes the agent is asked to dump or restore, from
//! /proc: who they run as, who their ancestors are, whether their pids are
//! free. The agent runs as root and dumps whatever CRIU is pointed at, so
//! everything a request names is checked here first.

use crate::procfs;
use std::time::{Duration, Instant};

/// Real, effective, saved and filesystem ids, and capabilities, of a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Creds {
    pub uids: Vec<u32>,
    pub gids: Vec<u32>,
    /// CapEff and CapPrm, hex as /proc shows them.
    pub cap_eff: u64,
    pub cap_prm: u64,
}

pub fn parse_status(status: &str) -> Option<Creds> {
    let ids = |key: &str| -> Option<Vec<u32>> {
        let line = status.lines().find_map(|l| l.strip_prefix(key))?;
        line.split_whitespace().map(|v| v.parse().ok()).collect()
    };
    let cap = |key: &str| -> Option<u64> {
        u64::from_str_radix(status.lines().find_map(|l| l.strip_prefix(key))?.trim(), 16).ok()
    };
    Some(Creds { uids: ids("Uid:")?, gids: ids("Gid:")?, cap_eff: cap("CapEff:")?, cap_prm: cap("CapPrm:")? })
}

pub fn creds(pid: i32) -> Option<Creds> {
    parse_status(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
}

/// Every process of `pids` runs as `uid` (all four uids) without
/// capabilities. CRIU restores credentials as root: a process with more
/// than its user's rights (a setuid program, file capabilities) would get
/// them back from the image, so it is refused at dump time.
pub fn check_owned(pids: &[i32], uid: u32) -> Result<(), String> {
    for &pid in pids {
        let Some(c) = creds(pid) else { continue };
        if c.uids.iter().any(|u| *u != uid) {
            return Err(format!("pid {pid} runs as uids {:?}, not only as the job's user (uid {uid}): refused", c.uids));
        }
        if c.cap_eff != 0 || c.cap_prm != 0 {
            return Err(format!(
                "pid {pid} holds capabilities ({:x}): a restore as root would give them back; refused",
                c.cap_eff | c.cap_prm
            ));
        }
    }
    Ok(())
}

/// Whether `ancestor` is `pid` or one of its ancestors.
pub fn descends_from(pid: i32, ancestor: i32) -> bool {
    let mut p = pid;
    for _ in 0..4096 {
        if p == ancestor {
            return true;
        }
        match procfs::read(p) {
            Some(info) if info.ppid > 0 && info.ppid != p => p = info.ppid,
            _ => return false,
        }
    }
    false
}

/// Waits until no process holds any of `pids` (CRIU restores the original
/// pids). Zombies of the dumped tree are normally reaped within moments by
/// the wrapper (a subreaper); a live stranger is named when time is up.
pub fn wait_pids_free(pids: &[i32], timeout: Duration) -> Result<(), String> {
    let start = Instant::now();
    loop {
        let taken: Vec<procfs::ProcInfo> = pids.iter().filter_map(|p| procfs::read(*p)).collect();
        let Some(first) = taken.first() else { return Ok(()) };
        if start.elapsed() >= timeout {
            return Err(format!(
                "pid {} is in use on this node ({}, uid {}, state {}): CRIU restores processes with their original pids",
                first.pid, first.comm, first.uid, first.state
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// SIGCONT to every process of `pids`: a restored tree runs only once it
/// has been checked (CRIU leaves it stopped).
pub fn resume_all(pids: &[i32]) {
    let ids: Vec<procfs::ProcId> = pids.iter().filter_map(|p| procfs::read(*p)).map(|p| p.id()).collect();
    for id in ids {
        procfs::signal_exact(id, libc::SIGCONT);
    }
}

/// SIGKILL to every process of `pids` that still has its recorded identity.
pub fn kill_all(ids: &[procfs::ProcId]) {
    for id in ids {
        procfs::signal_exact(*id, libc::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Name:\tpython\nUid:\t1001\t1001\t1001\t1001\nGid:\t1001\t1001\t1001\t1001\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n";

    #[test]
    fn status_parsing() {
        let c = parse_status(STATUS).unwrap();
        assert_eq!((c.uids, c.gids, c.cap_eff), (vec![1001; 4], vec![1001; 4], 0));
        let setuid = STATUS.replace("Uid:\t1001\t1001\t1001\t1001", "Uid:\t1001\t0\t0\t0");
        assert_eq!(parse_status(&setuid).unwrap().uids, vec![1001, 0, 0, 0]);
        assert!(parse_status("Name:\tx\n").is_none());
    }

    #[test]
    fn ownership_and_ancestry_of_real_processes() {
        let me = std::process::id() as i32;
        let my_uid = unsafe { libc::getuid() };
        let mut child = std::process::Command::new("/bin/sleep").arg("5").spawn().unwrap();
        let pid = child.id() as i32;
        assert!(descends_from(pid, me));
        assert!(!descends_from(me, pid));
        if my_uid == 0 {
            // Root holds capabilities: refused, as a setuid program would be.
            assert!(check_owned(&[pid], 0).unwrap_err().contains("holds capabilities"));
        }
        assert!(check_owned(&[pid], my_uid + 1).unwrap_err().contains("not only as the job's user"));
        assert!(wait_pids_free(&[pid], Duration::from_millis(50)).unwrap_err().contains("in use on this node (sleep"));
        child.kill().unwrap();
        child.wait().unwrap();
        wait_pids_free(&[pid], Duration::from_secs(5)).unwrap();
    }
}
