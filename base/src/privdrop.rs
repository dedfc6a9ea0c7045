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

/// Linux's resource limits by name (RLIMIT_CPU .. RLIMIT_RTTIME, in their
/// numeric order), as a manifest records them.
pub const LIMIT_NAMES: [&str; 16] = [
    "cpu", "fsize", "data", "stack", "core", "rss", "nproc", "nofile", "memlock", "as", "locks", "sigpending", "msgqueue", "nice",
    "rtprio", "rttime",
];

/// Hard resource limits by name ([`LIMIT_NAMES`]; `u64::MAX` is unlimited),
/// for a program run as a user ([`run_as_with_caps`]): a limit not named is
/// inherited. A dump records its tree's ([`HardLimits::of_processes`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct HardLimits(pub BTreeMap<String, u64>);

impl HardLimits {
    /// The highest hard limit of each resource over `pids`, read from
    /// `/proc/<pid>/limits` (prlimit(2) would need CAP_SYS_RESOURCE, which
    /// root lacks in some containers); a process that is gone counts for
    /// nothing. Empty when none could be read.
    pub fn of_processes(pids: &[i32]) -> HardLimits {
        let mut out = BTreeMap::new();
        for &pid in pids {
            let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/limits")) else { continue };
            for (name, max) in parse_limits(&text) {
                let v = out.entry(name.to_string()).or_insert(0u64);
                *v = (*v).max(max);
            }
        }
        HardLimits(out)
    }

    /// The first resource whose limit here is above `ceiling`'s (only
    /// resources both name): its name, this limit and the ceiling.
    pub fn above(&self, ceiling: &HardLimits) -> Option<(&str, u64, u64)> {
        self.0.iter().find_map(|(name, v)| ceiling.0.get(name).filter(|c| v > c).map(|c| (name.as_str(), *v, *c)))
    }

    /// Each resource's limit by number, `None` where not named.
    fn by_resource(&self) -> [Option<libc::rlim_t>; 16] {
        let mut out = [None; 16];
        for (i, name) in LIMIT_NAMES.iter().enumerate() {
            out[i] = self.0.get(*name).map(|v| *v as libc::rlim_t);
        }
        out
    }
}

/// `/proc/<pid>/limits`: the kernel prints one line per resource in
/// [`LIMIT_NAMES`]' order after a header, the description in 25 columns,
/// then the soft and hard limits (`unlimited` or a number) and the unit.
fn parse_limits(text: &str) -> Vec<(&'static str, u64)> {
    text.lines()
        .skip(1)
        .zip(LIMIT_NAMES)
        .filter_map(|(line, name)| {
            let hard = line.get(25..)?.split_whitespace().nth(1)?;
            let v = if hard == "unlimited" { u64::MAX } else { hard.parse().ok()? };
            Some((name, v))
        })
        .collect()
}

/// Makes `cmd` run as `who` keeping exactly `caps` (as ambient
/// capabilities, so they survive the exec of a program without file
/// capabilities), and nothing else. For CRIU's unprivileged mode: the kernel
/// checks every file it opens against the user's rights, and the user's own
/// processes cannot ptrace it (its capabilities are not a subset of theirs).
/// Hard resource limits are set first, while root, to `limits` (the tree's
/// own, recorded at its dump): CRIU, without CAP_SYS_RESOURCE, can then
/// give a restored task no limit above what the tree had (security review
/// N1b: with every limit unlimited, a forged image got RLIMIT_RTPRIO,
/// MEMLOCK and NPROC raised). RLIMIT_NOFILE alone is raised to the
/// kernel's bound: CRIU needs descriptors of its own beside the tree's.
///
/// Hand-written: std's `Command::uid` drops every capability, and no crate
/// keeps ambient capabilities across a uid change between fork and exec.
pub fn run_as_with_caps(cmd: &mut Command, who: &Identity, caps: &[u32], limits: &HardLimits) {
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
    let mut wanted = limits.by_resource();
    wanted[libc::RLIMIT_NOFILE as usize] = Some(nr_open);
    // SAFETY: only async-signal-safe system calls on memory prepared before
    // the fork. Order: limits and groups/gid while root; KEEPCAPS so the uid
    // change keeps the permitted set; then exactly `caps`, raised ambient.
    unsafe {
        cmd.pre_exec(move || {
            for (r, max) in wanted.iter().enumerate() {
                let mut cur = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
                let Some(max) = *max else { continue };
                if libc::getrlimit(r as _, &mut cur) == 0 && cur.rlim_max != max {
                    let limit = libc::rlimit { rlim_cur: cur.rlim_cur.min(max), rlim_max: max };
                    // Lowering always works and must; a raise root may not
                    // make (no CAP_SYS_RESOURCE) leaves the lower limit,
                    // which can only fail the restore, never widen it.
                    if libc::setrlimit(r as _, &limit) != 0 && max < cur.rlim_max {
                        return Err(std::io::Error::last_os_error());
                    }
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
        run_as_with_caps(&mut cmd, &nobody, &[CAP_CHECKPOINT_RESTORE, CAP_NET_ADMIN], &HardLimits::default());
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
        run_as_with_caps(&mut cmd, &nobody, &[], &HardLimits::default());
        let text = String::from_utf8(cmd.output().unwrap().stdout).unwrap();
        assert!(text.lines().any(|l| l == "CapEff:\t0000000000000000"), "{text}");
    }

    /// The program gets the tree's hard limits, not unlimited ones (N1b):
    /// a named limit is set (lowered here), one not named is inherited, and
    /// RLIMIT_NOFILE is the kernel's bound whatever was named.
    #[test]
    fn a_program_run_with_caps_gets_the_recorded_hard_limits_and_no_more() {
        if !gpu_mode_testkit::root_or_skip("it changes uid") {
            return;
        }
        let nobody = Identity::of_user_or_bare(65534, 65534);
        let limits = HardLimits([("rtprio".to_string(), 0u64), ("memlock".to_string(), 65536), ("nofile".to_string(), 64)].into_iter().collect());
        let mut cmd = Command::new("/bin/cat");
        cmd.arg("/proc/self/limits").stdout(Stdio::piped());
        run_as_with_caps(&mut cmd, &nobody, &[CAP_CHECKPOINT_RESTORE], &limits);
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        let hard = |name: &str| -> String {
            let line = text.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{name} in {text}"));
            line[name.len()..].split_whitespace().nth(1).unwrap().to_string()
        };
        assert_eq!(hard("Max realtime priority"), "0", "{text}");
        assert_eq!(hard("Max locked memory"), "65536", "{text}");
        // The kernel's bound where root may raise it (CAP_SYS_RESOURCE; not
        // in some containers), else ours: never the 64 named.
        let nr_open: u64 = std::fs::read_to_string("/proc/sys/fs/nr_open").unwrap().trim().parse().unwrap();
        let mut mine = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut mine) };
        let nofile: u64 = hard("Max open files").parse().unwrap();
        assert!(nofile == nr_open || nofile == mine.rlim_max as u64, "{text}");
        unsafe { libc::getrlimit(libc::RLIMIT_NPROC, &mut mine) };
        let inherited = if mine.rlim_max == libc::RLIM_INFINITY { "unlimited".to_string() } else { mine.rlim_max.to_string() };
        assert_eq!(hard("Max processes"), inherited, "{text}");
    }

    #[test]
    fn limits_are_read_as_the_kernel_prints_them() {
        let text = "Limit                     Soft Limit           Hard Limit           Units     \n\
Max cpu time              unlimited            unlimited            seconds   \n\
Max file size             unlimited            4096                 bytes     \n\
Max data size             garbage\n";
        assert_eq!(parse_limits(text), [("cpu", u64::MAX), ("fsize", 4096)]);
        assert!(parse_limits("").is_empty());
    }

    #[test]
    fn a_limit_above_the_ceiling_is_named() {
        let l = |pairs: &[(&str, u64)]| HardLimits(pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect());
        let ceiling = l(&[("memlock", 65536), ("rtprio", 0)]);
        assert_eq!(l(&[("memlock", 65536), ("rtprio", 0)]).above(&ceiling), None);
        assert_eq!(l(&[("memlock", 1024)]).above(&ceiling), None);
        assert_eq!(l(&[("rtprio", 99)]).above(&ceiling), Some(("rtprio", 99, 0)));
        assert_eq!(l(&[("memlock", u64::MAX)]).above(&ceiling), Some(("memlock", u64::MAX, 65536)));
        assert_eq!(l(&[("nproc", 5)]).above(&ceiling), None, "a resource the ceiling does not name");
    }

    #[test]
    fn a_trees_hard_limits_are_the_highest_of_its_processes() {
        let me = std::process::id() as i32;
        let limits = HardLimits::of_processes(&[me, i32::MAX]);
        let mut mine = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut mine) };
        assert_eq!(limits.0.get("memlock"), Some(&(mine.rlim_max as u64)));
        assert_eq!(limits.0.len(), 16);
        assert!(HardLimits::of_processes(&[i32::MAX]).0.is_empty());
    }

    #[test]
    fn unknown_uids_are_named() {
        let err = Identity::of_user(3_999_999_999, 1).unwrap_err().to_string();
        assert!(err.contains("uid 3999999999 has no entry"), "{err}");
    }
}
