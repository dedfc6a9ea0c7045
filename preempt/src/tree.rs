//! Facts about the processes the agent is asked to dump or restore, from
//! /proc: who they run as, who their ancestors are, whether their pids are
//! free. The agent runs as root and dumps whatever CRIU is pointed at, so
//! everything a request names is checked here first.

use crate::privdrop::Identity;
use crate::procfs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Why a process may not be dumped, or run restored: it has more than its
/// user's rights, which CRIU would give back (check_owned).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OwnerError {
    #[error("pid {pid} runs as uids {uids:?}, not only as the job's user (uid {uid}): refused")]
    Uids { pid: i32, uids: Vec<u32>, uid: u32 },
    /// A setgid program.
    #[error("pid {pid} runs with gid {gid}, which is not one of the job user's groups (a setgid program?): refused")]
    Gid { pid: i32, gid: u32 },
    /// `caps`: CapEff | CapPrm | CapAmb.
    #[error("pid {pid} holds capabilities ({caps:x}), which its user does not have: refused")]
    Capabilities { pid: i32, caps: u64 },
    /// Restored with less confinement than it was dumped with: fewer
    /// restrictions (no_new_privs, seccomp) or more inheritable
    /// capabilities (security review N1b: a forged image dropped
    /// no_new_privs and was restored).
    #[error("pid {pid} was restored with {field} {now}, but was dumped with {then}: refused")]
    LessConfined { pid: i32, field: &'static str, now: String, then: String },
    /// A user or pid namespace CRIU would recreate (security review F9).
    #[error("pid {pid} runs in a {ns} namespace of its own ({}), not the node's ({}): CRIU would recreate it; refused", theirs.display(), mine.display())]
    Namespace { pid: i32, ns: &'static str, theirs: PathBuf, mine: PathBuf },
}

/// Real, effective, saved and filesystem ids, and capabilities, of a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Creds {
    pub uids: Vec<u32>,
    pub gids: Vec<u32>,
    /// CapEff and CapPrm, hex as /proc shows them.
    pub cap_eff: u64,
    pub cap_prm: u64,
    /// CapAmb (0 where the kernel shows none).
    pub cap_amb: u64,
    /// What the process may not shed: a restore must give it back.
    pub privs: Privs,
}

/// What confines a process beyond its ids, as /proc shows it: recorded per
/// pid at the dump (the manifest's `privs`), compared after a restore.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Privs {
    /// `NoNewPrivs`.
    pub no_new_privs: bool,
    /// `Seccomp`: 0 none, 1 strict, 2 filter.
    pub seccomp: u8,
    /// `CapInh`.
    pub cap_inh: u64,
}

impl Privs {
    /// The first way `self` (now) is less confined than `then`: its field,
    /// now and then.
    pub fn weaker_than(&self, then: &Privs) -> Option<(&'static str, String, String)> {
        if then.no_new_privs && !self.no_new_privs {
            return Some(("NoNewPrivs", "0".into(), "1".into()));
        }
        if self.seccomp < then.seccomp {
            return Some(("Seccomp", self.seccomp.to_string(), then.seccomp.to_string()));
        }
        if self.cap_inh & !then.cap_inh != 0 {
            return Some(("CapInh", format!("{:x}", self.cap_inh), format!("{:x}", then.cap_inh)));
        }
        None
    }

    /// The least confinement among `all`: what a process the dump never
    /// listed (forked between the listing and CRIU's freeze) inherits at least.
    pub fn weakest(all: impl Iterator<Item = Privs>) -> Privs {
        all.reduce(|a, b| Privs { no_new_privs: a.no_new_privs && b.no_new_privs, seccomp: a.seccomp.min(b.seccomp), cap_inh: a.cap_inh | b.cap_inh })
            .unwrap_or_default()
    }
}

pub fn parse_status(status: &str) -> Option<Creds> {
    let ids = |key: &str| -> Option<Vec<u32>> {
        let line = status.lines().find_map(|l| l.strip_prefix(key))?;
        line.split_whitespace().map(|v| v.parse().ok()).collect()
    };
    let cap = |key: &str| -> Option<u64> {
        u64::from_str_radix(status.lines().find_map(|l| l.strip_prefix(key))?.trim(), 16).ok()
    };
    let flag = |key: &str| -> u8 { status.lines().find_map(|l| l.strip_prefix(key)).and_then(|v| v.trim().parse().ok()).unwrap_or(0) };
    let privs = Privs { no_new_privs: flag("NoNewPrivs:") != 0, seccomp: flag("Seccomp:"), cap_inh: cap("CapInh:").unwrap_or(0) };
    Some(Creds {
        uids: ids("Uid:")?,
        gids: ids("Gid:")?,
        cap_eff: cap("CapEff:")?,
        cap_prm: cap("CapPrm:")?,
        cap_amb: cap("CapAmb:").unwrap_or(0),
        privs,
    })
}

/// A restored tree has no hard resource limit above the tree's at its
/// dump (`recorded`; empty for older manifests: nothing compared). CRIU,
/// run with those limits, can set none higher; this is the second line.
pub fn check_limits(pids: &[i32], recorded: &crate::privdrop::HardLimits) -> Result<(), OwnerError> {
    for &pid in pids {
        let now = crate::privdrop::HardLimits::of_processes(&[pid]);
        if let Some((name, now, then)) = now.above(recorded) {
            return Err(OwnerError::LessConfined { pid, field: "a hard limit", now: format!("{name} {now}"), then: format!("{name} {then}") });
        }
    }
    Ok(())
}

/// The memory of `pids` a dump can write: resident, swapped and hugetlb
/// pages (`VmRSS`, `VmSwap`, `HugetlbPages` of /proc/<pid>/status), in
/// bytes, summed (pages shared between them count twice: an upper bound).
pub fn memory_bytes(pids: &[i32]) -> u64 {
    pids.iter().filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/status")).ok()).map(|s| status_memory_bytes(&s)).sum()
}

fn status_memory_bytes(status: &str) -> u64 {
    let kib = |key: &str| -> u64 {
        status.lines().find_map(|l| l.strip_prefix(key)).and_then(|v| v.split_whitespace().next()?.parse().ok()).unwrap_or(0)
    };
    (kib("VmRSS:") + kib("VmSwap:") + kib("HugetlbPages:")) * 1024
}

/// The thread ids of `pids` that are not themselves among `pids` (a
/// process's other threads), ascending: CRIU restores them with their ids
/// too, so a restore waits for them as for the pids (security review N3).
pub fn thread_ids(pids: &[i32]) -> Vec<i32> {
    let mut out: Vec<i32> = pids
        .iter()
        .flat_map(|p| std::fs::read_dir(format!("/proc/{p}/task")).into_iter().flatten().flatten())
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|t| !pids.contains(t))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// Each process's [`Privs`] now (a process gone meanwhile is left out).
pub fn privs_of(pids: &[i32]) -> std::collections::BTreeMap<i32, Privs> {
    pids.iter().filter_map(|p| Some((*p, creds(*p)?.privs))).collect()
}

/// A restored tree (after [`check_owned`]) is at least as confined as it
/// was dumped: each process compared with its own record, a process the
/// dump did not list with the least confined one recorded. An image with
/// no record (older manifests) has nothing to compare.
pub fn check_confined(pids: &[i32], recorded: &std::collections::BTreeMap<i32, Privs>) -> Result<(), OwnerError> {
    if recorded.is_empty() {
        return Ok(());
    }
    let weakest = Privs::weakest(recorded.values().copied());
    for &pid in pids {
        let Some(c) = creds(pid) else { continue };
        let then = recorded.get(&pid).unwrap_or(&weakest);
        if let Some((field, now, then)) = c.privs.weaker_than(then) {
            return Err(OwnerError::LessConfined { pid, field, now, then });
        }
    }
    Ok(())
}

pub fn creds(pid: i32) -> Option<Creds> {
    parse_status(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
}

/// Every process of `pids` runs as `who` (all four uids its uid, all four
/// gids among its groups) without capabilities, in this agent's user and
/// pid namespaces. A process with more than its user's rights (a setuid or
/// setgid program, file capabilities) would ask CRIU to give them back; one
/// in a user namespace the user made would have CRIU recreate its
/// namespaces and mounts (security review F9). Refused at dump time, and
/// the restored tree is checked again.
pub fn check_owned(pids: &[i32], who: &Identity) -> Result<(), OwnerError> {
    let uid = who.uid;
    for &pid in pids {
        let Some(c) = creds(pid) else { continue };
        if c.uids.iter().any(|u| *u != uid) {
            return Err(OwnerError::Uids { pid, uids: c.uids, uid });
        }
        if let Some(g) = c.gids.iter().find(|g| **g != who.gid && !who.groups.contains(g)) {
            return Err(OwnerError::Gid { pid, gid: *g });
        }
        if c.cap_eff != 0 || c.cap_prm != 0 || c.cap_amb != 0 {
            return Err(OwnerError::Capabilities { pid, caps: c.cap_eff | c.cap_prm | c.cap_amb });
        }
        check_namespaces(pid)?;
    }
    Ok(())
}

/// The namespaces a tree must share with the agent: CRIU would recreate a
/// user namespace (and what its owner may do in it) or restore pids in
/// another pid namespace.
const SHARED_NAMESPACES: [&str; 2] = ["user", "pid"];

fn check_namespaces(pid: i32) -> Result<(), OwnerError> {
    for ns in SHARED_NAMESPACES {
        let mine = std::fs::read_link(format!("/proc/self/ns/{ns}")).ok();
        let theirs = std::fs::read_link(format!("/proc/{pid}/ns/{ns}")).ok();
        // Gone meanwhile: the caller's next step finds it gone.
        if let (Some(mine), Some(theirs)) = (mine, theirs) {
            if mine != theirs {
                return Err(OwnerError::Namespace { pid, ns, theirs, mine });
            }
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

/// A pid of the image held by another process on this node: the restore
/// may succeed on another node (RequestError::NotHere, security review F7).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pid {} is in use on this node ({}, uid {}, state {}): CRIU restores processes with their original pids", holder.pid, holder.comm, holder.uid, holder.state)]
pub struct PidInUse {
    pub holder: procfs::ProcInfo,
}

/// Waits until no process holds any of `pids` (CRIU restores the original
/// pids). Zombies of the dumped tree are normally reaped within moments by
/// the wrapper (a subreaper); a live stranger is named when time is up.
pub fn wait_pids_free(pids: &[i32], timeout: Duration) -> Result<(), PidInUse> {
    let start = Instant::now();
    loop {
        let Some(first) = pids.iter().find_map(|p| procfs::read(*p)) else { return Ok(()) };
        if start.elapsed() >= timeout {
            return Err(PidInUse { holder: first });
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

/// Waits (at most `timeout`) until none of `ids` runs any more: each gone
/// or a zombie, its memory given back. Returns the first still alive.
/// Exiting a process of many GiB takes a moment, and its parent can reap it
/// (and a restore take its pid) only after that.
pub fn wait_dead(ids: &[procfs::ProcId], timeout: Duration) -> Result<(), i32> {
    let start = Instant::now();
    loop {
        let Some(alive) = ids.iter().find(|id| procfs::find(**id).is_some_and(|p| !matches!(p.state, 'Z' | 'X'))) else { return Ok(()) };
        if start.elapsed() >= timeout {
            return Err(alive.pid);
        }
        std::thread::sleep(Duration::from_millis(5));
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

    /// N1b: the fields a forged image could drop are read, and a restored
    /// process less confined than its record is refused, field by field.
    #[test]
    fn a_restored_process_less_confined_than_it_was_dumped_is_refused() {
        let full = format!("{STATUS}CapInh:\t0000000000000000\nCapAmb:\t0000000000001000\nNoNewPrivs:\t1\nSeccomp:\t2\n");
        let c = parse_status(&full).unwrap();
        assert_eq!((c.cap_amb, c.privs), (0x1000, Privs { no_new_privs: true, seccomp: 2, cap_inh: 0 }));
        // An old kernel's status without the fields: nothing, not an error.
        assert_eq!(parse_status(STATUS).unwrap().privs, Privs::default());
        let then = Privs { no_new_privs: true, seccomp: 2, cap_inh: 0x1 };
        let cases = [
            (then, None),
            (Privs { no_new_privs: true, seccomp: 2, cap_inh: 0 }, None),
            (Privs { no_new_privs: false, ..then }, Some("NoNewPrivs")),
            (Privs { seccomp: 0, ..then }, Some("Seccomp")),
            (Privs { seccomp: 1, ..then }, Some("Seccomp")),
            (Privs { cap_inh: 0x1001, ..then }, Some("CapInh")),
        ];
        for (now, want) in cases {
            assert_eq!(now.weaker_than(&then).map(|w| w.0), want, "{now:?}");
        }
        let weakest = Privs::weakest([then, Privs { no_new_privs: false, seccomp: 1, cap_inh: 0x2 }].into_iter());
        assert_eq!(weakest, Privs { no_new_privs: false, seccomp: 1, cap_inh: 0x3 });
        let err = OwnerError::LessConfined { pid: 9, field: "NoNewPrivs", now: "0".into(), then: "1".into() };
        assert_eq!(err.to_string(), "pid 9 was restored with NoNewPrivs 0, but was dumped with 1: refused");
    }

    /// A real process that set no_new_privs: its record holds it; compared
    /// with a record that said more (seccomp), it is refused; with none, passed.
    #[test]
    fn confinement_of_real_processes_against_their_record() {
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new("/bin/sleep");
        cmd.arg("5");
        // SAFETY: prctl is async-signal-safe.
        unsafe { cmd.pre_exec(|| if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }) };
        let mut child = cmd.spawn().unwrap();
        let pid = child.id() as i32;
        let recorded = privs_of(&[pid]);
        assert!(recorded[&pid].no_new_privs, "{recorded:?}");
        assert_eq!(check_confined(&[pid], &recorded), Ok(()));
        assert_eq!(check_confined(&[pid], &Default::default()), Ok(()));
        let stricter = [(pid, Privs { seccomp: 2, ..recorded[&pid] })].into_iter().collect();
        assert!(matches!(check_confined(&[pid], &stricter), Err(OwnerError::LessConfined { field: "Seccomp", .. })));
        // Not listed: compared with the least confined record.
        let other = [(i32::MAX, Privs { no_new_privs: true, seccomp: 0, cap_inh: 0 })].into_iter().collect();
        assert_eq!(check_confined(&[pid], &other), Ok(()));
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn a_trees_memory_is_its_resident_swapped_and_hugetlb_pages() {
        let status = "Name:\tx\nVmRSS:\t  1000 kB\nVmSwap:\t  24 kB\nHugetlbPages:\t 2048 kB\n";
        assert_eq!(status_memory_bytes(status), (1000 + 24 + 2048) * 1024);
        assert_eq!(status_memory_bytes("Name:\tkthread\n"), 0);
        let me = std::process::id() as i32;
        assert!(memory_bytes(&[me]) > 1 << 20);
        assert_eq!(memory_bytes(&[i32::MAX]), 0);
    }

    #[test]
    fn a_processs_other_threads_are_its_thread_ids() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            ready_tx.send(unsafe { libc::gettid() }).unwrap();
            let _ = rx.recv();
        });
        let tid = ready_rx.recv().unwrap();
        let me = std::process::id() as i32;
        let tids = thread_ids(&[me]);
        assert!(tids.contains(&tid) && !tids.contains(&me), "{tids:?}");
        assert!(thread_ids(&[i32::MAX]).is_empty());
        tx.send(()).unwrap();
        t.join().unwrap();
    }

    #[test]
    fn ownership_and_ancestry_of_real_processes() {
        let me = std::process::id() as i32;
        let my_uid = unsafe { libc::getuid() };
        let mut child = std::process::Command::new("/bin/sleep").arg("5").spawn().unwrap();
        let pid = child.id() as i32;
        assert!(descends_from(pid, me));
        assert!(!descends_from(me, pid));
        let my_gid = unsafe { libc::getgid() };
        let as_me = Identity { uid: my_uid, gid: my_gid, groups: vec![my_gid] };
        if my_uid == 0 {
            // Root holds capabilities: refused, as a setuid program would be.
            let err = check_owned(&[pid], &as_me).unwrap_err();
            assert!(matches!(err, OwnerError::Capabilities { .. }) && err.to_string().contains("holds capabilities"), "{err:?}");
        }
        let other = Identity { uid: my_uid + 1, ..as_me.clone() };
        let err = check_owned(&[pid], &other).unwrap_err();
        assert!(matches!(err, OwnerError::Uids { .. }), "{err:?}");
        let u = my_uid;
        let text = format!("pid {pid} runs as uids [{u}, {u}, {u}, {u}], not only as the job's user (uid {}): refused", u + 1);
        assert_eq!(err.to_string(), text);
        let other_group = Identity { gid: my_gid + 1, groups: vec![my_gid + 1, my_gid + 2], ..as_me.clone() };
        let err = check_owned(&[pid], &other_group).unwrap_err();
        assert!(matches!(err, OwnerError::Gid { .. }), "{err:?}");
        assert!(err.to_string().contains("which is not one of the job user's groups"), "{err}");
        let pinned = procfs::Pinned::new(pid).unwrap();
        pinned.still_there().unwrap();
        let err = wait_pids_free(&[pid], Duration::from_millis(50)).unwrap_err();
        assert_eq!(err.holder.pid, pid);
        let (uid, state) = (err.holder.uid, err.holder.state);
        let text = format!("pid {pid} is in use on this node (sleep, uid {uid}, state {state}): CRIU restores processes with their original pids");
        assert_eq!(err.to_string(), text);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(pinned.still_there().unwrap_err().to_string().contains("ended after it was checked"));
        wait_pids_free(&[pid], Duration::from_secs(5)).unwrap();
    }

    #[test]
    fn a_process_in_a_user_namespace_of_its_own_is_refused() {
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        // unshare(1) as nobody: an unprivileged user namespace, as a user makes one.
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("/usr/bin/unshare").args(["--user", "--", "/bin/sleep", "5"]).uid(65534).gid(65534).spawn().unwrap();
        let pid = child.id() as i32;
        let start = Instant::now();
        // unshare execs sleep once the namespace is made.
        while procfs::read(pid).is_none_or(|p| p.comm != "sleep") && start.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let nobody = Identity { uid: 65534, gid: 65534, groups: vec![65534] };
        let err = check_owned(&[pid], &nobody);
        child.kill().unwrap();
        child.wait().unwrap();
        let err = err.unwrap_err();
        assert!(matches!(err, OwnerError::Namespace { ns: "user", .. }), "{err:?}");
        assert!(err.to_string().contains("runs in a user namespace of its own"), "{err}");
    }
}
