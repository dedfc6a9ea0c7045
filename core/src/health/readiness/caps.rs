//! `ckpt_caps`: the capabilities CRIU runs with are usable here. The
//! product starts CRIU as the job's user with CAP_CHECKPOINT_RESTORE raised
//! as an ambient capability (privdrop::run_as_with_caps); that fails where
//! the kernel lacks the capability, or where slurmd (and so the agent) runs
//! without it in its bounding set (a systemd `CapabilityBoundingSet=`, a
//! container). The probe is the product's own start: `criu --version` as
//! `nobody` through the same function, with the capability checked as
//! ambient before the exec, bounded in time.

use super::super::{Check, CheckResult, Ctx, Status};
use crate::privdrop::{run_as_with_caps, HardLimits, Identity, CAP_CHECKPOINT_RESTORE};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

pub const NAME: &str = "ckpt_caps";
/// The probe's user: one every node has, and not the job's.
const NOBODY: u32 = 65534;
const PROBE_BOUND: Duration = Duration::from_secs(5);

pub struct Caps;

impl Check for Caps {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&self, ctx: &Ctx) -> Vec<CheckResult> {
        super::judged(ctx, NAME, |f| judge(&f.caps))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Spawn {
    /// CRIU ran as `nobody` holding the capability as ambient.
    Works,
    /// No CRIU to start (ckpt_criu says so).
    NoCriu,
    /// The start failed: the capability could not be raised (EPERM), or
    /// `nobody` may not run CRIU (EACCES), or CRIU did not answer.
    Failed { errno: Option<i32>, detail: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapsFacts {
    /// /proc/sys/kernel/cap_last_cap.
    pub last_cap: Option<u32>,
    pub spawn: Spawn,
}

pub fn probe(criu: &Path, criu_installed: bool) -> CapsFacts {
    let last_cap = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap").ok().and_then(|s| s.trim().parse().ok());
    let spawn = if criu_installed { spawn_as_nobody(criu) } else { Spawn::NoCriu };
    CapsFacts { last_cap, spawn }
}

/// `criu --version` started as CRIU is started for a job.
fn spawn_as_nobody(criu: &Path) -> Spawn {
    let mut cmd = Command::new(criu);
    cmd.arg("--version").stdin(Stdio::null()).env_clear();
    run_as_with_caps(&mut cmd, &Identity::of_user_or_bare(NOBODY, NOBODY), &[CAP_CHECKPOINT_RESTORE], &HardLimits::default());
    // SAFETY: prctl only. Runs after run_as_with_caps's own step: the
    // capability must be ambient now, or the exec would drop it.
    unsafe {
        cmd.pre_exec(|| {
            let set = libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_IS_SET, CAP_CHECKPOINT_RESTORE as libc::c_ulong, 0, 0);
            if set == 1 {
                Ok(())
            } else {
                Err(std::io::Error::from_raw_os_error(libc::EPERM))
            }
        });
    }
    match crate::command::run_with_timeout(cmd, None, PROBE_BOUND) {
        Ok(out) if out.status.success() => Spawn::Works,
        Ok(out) => Spawn::Failed { errno: None, detail: format!("`{} --version` as nobody exited with {}", criu.display(), out.status) },
        Err(crate::command::CommandError::Spawn { source, .. }) => Spawn::Failed { errno: source.raw_os_error(), detail: source.to_string() },
        Err(e) => Spawn::Failed { errno: None, detail: e.to_string() },
    }
}

pub fn judge(f: &CapsFacts) -> CheckResult {
    let cap = CAP_CHECKPOINT_RESTORE;
    match (f.last_cap, &f.spawn) {
        (Some(last), _) if last < cap => CheckResult::new(
            NAME,
            None,
            Status::Warn,
            format!("this kernel's last capability is {last}: it has no CAP_CHECKPOINT_RESTORE ({cap}), which CRIU runs with; fix: boot a Linux 5.9 or newer kernel"),
        ),
        (_, Spawn::Works) => CheckResult::new(NAME, None, Status::Ok, "CRIU starts as a user holding CAP_CHECKPOINT_RESTORE as an ambient capability (probe: criu --version as nobody)"),
        (_, Spawn::NoCriu) => CheckResult::new(NAME, None, Status::Skipped, "no CRIU to start (see ckpt_criu)"),
        (_, Spawn::Failed { errno: Some(libc::EACCES), detail }) => CheckResult::new(
            NAME,
            None,
            Status::Warn,
            format!("a user may not run CRIU ({detail}), and CRIU runs as the job's user; fix: chmod 0755 preempt.criu and every directory above it"),
        ),
        (_, Spawn::Failed { errno: Some(libc::EPERM), detail }) => CheckResult::new(
            NAME,
            None,
            Status::Warn,
            format!(
                "CAP_CHECKPOINT_RESTORE cannot be raised as an ambient capability for CRIU ({detail}); fix: run slurmd with CAP_CHECKPOINT_RESTORE in its bounding set \
                 (no systemd CapabilityBoundingSet= or container that drops it; `grep CapBnd /proc/$(pidof slurmd)/status` shows it)"
            ),
        ),
        (_, Spawn::Failed { detail, .. }) => CheckResult::new(NAME, None, Status::Warn, format!("CRIU could not be started as a user with CAP_CHECKPOINT_RESTORE: {detail}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_capability_must_exist_and_be_raised() {
        let failed = |errno, detail: &str| Spawn::Failed { errno, detail: detail.into() };
        let cases: Vec<(Option<u32>, Spawn, Status, &str)> = vec![
            (Some(40), Spawn::Works, Status::Ok, "CRIU starts as a user holding CAP_CHECKPOINT_RESTORE as an ambient capability (probe: criu --version as nobody)"),
            (None, Spawn::Works, Status::Ok, "CRIU starts as a user holding CAP_CHECKPOINT_RESTORE as an ambient capability (probe: criu --version as nobody)"),
            (Some(37), Spawn::Works, Status::Warn, "this kernel's last capability is 37: it has no CAP_CHECKPOINT_RESTORE (40), which CRIU runs with; fix: boot a Linux 5.9 or newer kernel"),
            (Some(40), Spawn::NoCriu, Status::Skipped, "no CRIU to start (see ckpt_criu)"),
            (
                Some(40),
                failed(Some(libc::EACCES), "Permission denied (os error 13)"),
                Status::Warn,
                "a user may not run CRIU (Permission denied (os error 13)), and CRIU runs as the job's user; fix: chmod 0755 preempt.criu and every directory above it",
            ),
            (
                Some(40),
                failed(Some(libc::EPERM), "Operation not permitted (os error 1)"),
                Status::Warn,
                "CAP_CHECKPOINT_RESTORE cannot be raised as an ambient capability for CRIU (Operation not permitted (os error 1)); fix: run slurmd with CAP_CHECKPOINT_RESTORE in its bounding set \
                 (no systemd CapabilityBoundingSet= or container that drops it; `grep CapBnd /proc/$(pidof slurmd)/status` shows it)",
            ),
            (Some(40), failed(None, "timed out"), Status::Warn, "CRIU could not be started as a user with CAP_CHECKPOINT_RESTORE: timed out"),
        ];
        for (last_cap, spawn, status, text) in cases {
            let got = judge(&CapsFacts { last_cap, spawn: spawn.clone() });
            assert_eq!((got.status, got.message.as_str()), (status, text), "{last_cap:?} {spawn:?}");
        }
    }

    /// The real probe, as root: a program nobody may run, and one nobody
    /// may, started with the capability (or, without it in this process's
    /// bounding set, refused with EPERM).
    #[test]
    fn the_probe_starts_a_program_as_nobody_with_the_capability() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let prog = dir.path().join("criu");
        std::fs::write(&prog, "#!/bin/sh\necho Version: 4.1.1\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(matches!(spawn_as_nobody(&prog), Spawn::Failed { errno: Some(libc::EACCES), .. }), "{:?}", spawn_as_nobody(&prog));
        std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
        let bounded = std::fs::read_to_string("/proc/self/status").unwrap().lines().any(|l| {
            l.strip_prefix("CapBnd:").and_then(|v| u64::from_str_radix(v.trim(), 16).ok()).is_some_and(|m| m & (1 << CAP_CHECKPOINT_RESTORE) != 0)
        });
        let want = if bounded { Spawn::Works } else { spawn_as_nobody(&prog) };
        assert_eq!(spawn_as_nobody(&prog), want);
        if !bounded {
            assert!(matches!(want, Spawn::Failed { errno: Some(libc::EPERM), .. }), "{want:?}");
        }
    }
}
