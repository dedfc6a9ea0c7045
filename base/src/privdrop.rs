//! Running a program on a user's behalf: as that user, with that user's
//! groups, a given minimal environment, by absolute path and an argument
//! vector. Never through a shell.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Who to run as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (from the group database, computed before fork).
    pub groups: Vec<u32>,
}

#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("{path} must be an absolute path to an executable")]
    NotAbsolute { path: PathBuf },
    #[error("uid {uid} has no entry in the user database")]
    UnknownUser { uid: u32 },
    #[error("cannot start {path} as uid {uid}: {source}")]
    Spawn { path: PathBuf, uid: u32, source: std::io::Error },
}

impl Identity {
    /// The user's identity with the supplementary groups the group database
    /// gives (what initgroups would set).
    pub fn of_user(uid: u32, gid: u32) -> Result<Identity, SpawnError> {
        let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
            .ok()
            .flatten()
            .ok_or(SpawnError::UnknownUser { uid })?;
        let name = CString::new(user.name.as_bytes()).map_err(|_| SpawnError::UnknownUser { uid })?;
        let groups = nix::unistd::getgrouplist(&name, nix::unistd::Gid::from_raw(gid))
            .map(|g| g.into_iter().map(|g| g.as_raw()).collect())
            .unwrap_or_else(|_| vec![gid]);
        Ok(Identity { uid, gid, groups })
    }
}

impl Identity {
    /// As [`Identity::of_user`], or the bare uid/gid when the user has left
    /// the user database (a teardown must still drop privileges then).
    pub fn of_user_or_bare(uid: u32, gid: u32) -> Identity {
        Identity::of_user(uid, gid).unwrap_or(Identity { uid, gid, groups: vec![gid] })
    }
}

/// Makes `cmd` run as `who`: groups, gid, then uid are set between fork and
/// exec, so the program never runs with root's privileges.
pub fn run_as(cmd: &mut Command, who: &Identity) {
    let (uid, gid, groups) = (who.uid, who.gid, who.groups.clone());
    // SAFETY: only async-signal-safe system calls run between fork and exec;
    // the group list was computed before the fork. Order matters: groups and
    // gid while still root, uid last.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                || libc::setgid(gid) != 0
                || libc::setuid(uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Capabilities by number (linux/capability.h), for [`run_as_with_caps`].
pub const CAP_NET_ADMIN: u32 = 12;
pub const CAP_CHECKPOINT_RESTORE: u32 = 40;

/// Makes `cmd` run as `who` keeping exactly `caps` (as ambient
/// capabilities, so they survive the exec of a program without file
/// capabilities), and nothing else. For CRIU's unprivileged mode: the kernel
/// checks every file it opens against the user's rights, and the user's own
/// processes cannot ptrace it (its capabilities are not a subset of theirs).
/// Hard resource limits are raised first where root may (so CRIU can give
/// the restored tasks any limit they had); a limit that cannot be raised is
/// left as it is.
///
/// Hand-written: std's `Command::uid` drops every capability, and no crate
/// keeps ambient capabilities across a uid change between fork and exec.
pub fn run_as_with_caps(cmd: &mut Command, who: &Identity, caps: &[u32]) {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let (uid, gid, groups, caps) = (who.uid, who.gid, who.groups.clone(), caps.to_vec());
    let mut mask = [0u32; 2];
    for c in &caps {
        mask[(*c / 32) as usize] |= 1 << (c % 32);
    }
    let nr_open: libc::rlim_t = std::fs::read_to_string("/proc/sys/fs/nr_open").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(1 << 20);
    // SAFETY: only async-signal-safe system calls on memory prepared before
    // the fork. Order: limits and groups/gid while root; KEEPCAPS so the uid
    // change keeps the permitted set; then exactly `caps`, raised ambient.
    unsafe {
        cmd.pre_exec(move || {
            // Linux's 16 limits (RLIMIT_CPU .. RLIMIT_RTTIME).
            for r in 0..16 {
                let max = if r == libc::RLIMIT_NOFILE { nr_open } else { libc::RLIM_INFINITY };
                let mut cur = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
                if libc::getrlimit(r, &mut cur) == 0 && cur.rlim_max < max {
                    let _ = libc::setrlimit(r, &libc::rlimit { rlim_cur: cur.rlim_cur, rlim_max: max });
                }
            }
            let fail = || Err(std::io::Error::last_os_error());
            if libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0
                || libc::setgroups(groups.len(), groups.as_ptr()) != 0
                || libc::setresgid(gid, gid, gid) != 0
                || libc::setresuid(uid, uid, uid) != 0
            {
                return fail();
            }
            let header = Header { version: 0x2008_0522, pid: 0 };
            let data = [0, 1].map(|i| Data { effective: mask[i], permitted: mask[i], inheritable: mask[i] });
            if libc::syscall(libc::SYS_capset, &header as *const Header, data.as_ptr()) != 0 {
                return fail();
            }
            for c in &caps {
                if libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_RAISE, *c as libc::c_ulong, 0, 0) != 0 {
                    return fail();
                }
            }
            Ok(())
        });
    }
}

/// Makes `cmd` run with an empty capability bounding set: a root program
/// then execs with no capabilities at all. For tests and benchmarks where
/// root lacks CAP_SYS_RESOURCE (which `criu dump` needs to read another
/// user's resource limits): a capability-less root process stands in for a
/// user's.
pub fn without_capabilities(cmd: &mut Command) {
    // SAFETY: prctl is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            for cap in 0..=63 {
                libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0);
            }
            Ok(())
        });
    }
}

/// Starts `program args` as `who` with exactly `env` as its environment,
/// stdin from /dev/null, and output discarded (daemons log to their own files).
pub fn spawn_as(program: &Path, args: &[&str], env: &BTreeMap<String, String>, who: &Identity) -> Result<Child, SpawnError> {
    if !program.is_absolute() {
        return Err(SpawnError::NotAbsolute { path: program.to_path_buf() });
    }
    let mut cmd = Command::new(program);
    cmd.args(args).env_clear().envs(env).current_dir("/").stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    run_as(&mut cmd, who);
    crate::command::spawn_retrying(&mut cmd).map_err(|source| SpawnError::Spawn { path: program.to_path_buf(), uid: who.uid, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_programs_are_refused() {
        let me = Identity { uid: 0, gid: 0, groups: vec![] };
        let err = spawn_as(Path::new("true"), &[], &BTreeMap::new(), &me).unwrap_err().to_string();
        assert!(err.contains("must be an absolute path"), "{err}");
    }

    #[test]
    fn the_child_gets_exactly_the_given_environment() {
        let me = Identity::of_user(unsafe { libc::getuid() }, unsafe { libc::getgid() }).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("env");
        let env: BTreeMap<String, String> = [("ONLY".to_string(), "this".to_string())].into();
        // A script that writes its environment where the test can read it.
        let script = dir.path().join("dump");
        std::fs::write(&script, format!("#!/bin/sh\n/usr/bin/env > {}\n", out.display())).unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let status = spawn_as(&script, &[], &env, &me).unwrap().wait().unwrap();
        assert!(status.success());
        let text = std::fs::read_to_string(&out).unwrap();
        let mut vars: Vec<&str> = text.lines().filter(|l| !l.starts_with("PWD=") && !l.starts_with("SHLVL=") && !l.starts_with("_=")).collect();
        vars.sort();
        assert_eq!(vars, vec!["ONLY=this"]);
    }

    #[test]
    fn a_program_run_with_caps_has_the_user_and_exactly_those_capabilities() {
        if !gpu_mode_testkit::root_or_skip("it changes uid") {
            return;
        }
        let nobody = Identity::of_user_or_bare(65534, 65534);
        let mut cmd = Command::new("/bin/cat");
        cmd.arg("/proc/self/status").stdout(Stdio::piped());
        run_as_with_caps(&mut cmd, &nobody, &[CAP_CHECKPOINT_RESTORE, CAP_NET_ADMIN]);
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        let field = |k: &str| text.lines().find_map(|l| l.strip_prefix(k)).unwrap().trim().to_string();
        assert_eq!(field("Uid:").split_whitespace().collect::<Vec<_>>(), ["65534"; 4]);
        assert_eq!(field("Gid:").split_whitespace().collect::<Vec<_>>(), ["65534"; 4]);
        let want = format!("{:016x}", (1u64 << 40) | (1 << 12));
        for k in ["CapEff:", "CapPrm:", "CapInh:", "CapAmb:"] {
            assert_eq!(field(k), want, "{k}");
        }
        // None at all: the same call with no capability keeps none.
        let mut cmd = Command::new("/bin/cat");
        cmd.arg("/proc/self/status").stdout(Stdio::piped());
        run_as_with_caps(&mut cmd, &nobody, &[]);
        let text = String::from_utf8(cmd.output().unwrap().stdout).unwrap();
        assert!(text.lines().any(|l| l == "CapEff:\t0000000000000000"), "{text}");
    }

    #[test]
    fn unknown_uids_are_named() {
        let err = Identity::of_user(3_999_999_999, 1).unwrap_err().to_string();
        assert!(err.contains("uid 3999999999 has no entry"), "{err}");
    }
}
