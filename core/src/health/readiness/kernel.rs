//! `ckpt_kernel`: CRIU runs as the job's user with CAP_CHECKPOINT_RESTORE,
//! which Linux has from 5.9.

use super::super::{Check, CheckResult, Ctx, Status};

pub const NAME: &str = "ckpt_kernel";
/// The first Linux with CAP_CHECKPOINT_RESTORE.
const MIN: (u32, u32) = (5, 9);

pub struct Kernel;

impl Check for Kernel {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&self, ctx: &Ctx) -> Vec<CheckResult> {
        super::judged(ctx, NAME, |f| judge(&f.kernel_release))
    }
}

pub fn probe() -> Result<String, String> {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()).map_err(|e| format!("/proc/sys/kernel/osrelease: {e}"))
}

/// "6.18.44-fc-v657" → (6, 18).
fn major_minor(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

pub fn judge(release: &Result<String, String>) -> CheckResult {
    let release = match release {
        Ok(r) => r,
        Err(e) => return CheckResult::new(NAME, None, Status::Warn, format!("cannot read the kernel version: {e}")),
    };
    match major_minor(release) {
        Some(v) if v >= MIN => CheckResult::new(NAME, None, Status::Ok, format!("Linux {release} has CAP_CHECKPOINT_RESTORE (5.9 or newer)")),
        Some(_) => CheckResult::new(
            NAME,
            None,
            Status::Warn,
            format!("Linux {release} is older than 5.9: no CAP_CHECKPOINT_RESTORE, which CRIU runs with as the job's user; fix: boot a Linux 5.9 or newer kernel"),
        ),
        None => CheckResult::new(NAME, None, Status::Warn, format!("kernel version {release:?} is not a Linux version")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linux_5_9_and_later_are_ready() {
        let cases: &[(Result<&str, &str>, Status, &str)] = &[
            (Ok("6.18.44-fc-v657"), Status::Ok, "Linux 6.18.44-fc-v657 has CAP_CHECKPOINT_RESTORE (5.9 or newer)"),
            (Ok("5.9.0"), Status::Ok, "Linux 5.9.0 has CAP_CHECKPOINT_RESTORE (5.9 or newer)"),
            (Ok("5.10.0-28-amd64"), Status::Ok, "Linux 5.10.0-28-amd64 has CAP_CHECKPOINT_RESTORE (5.9 or newer)"),
            (
                Ok("5.4.0-150-generic"),
                Status::Warn,
                "Linux 5.4.0-150-generic is older than 5.9: no CAP_CHECKPOINT_RESTORE, which CRIU runs with as the job's user; fix: boot a Linux 5.9 or newer kernel",
            ),
            (Ok("4.18.0-553.el8"), Status::Warn, "Linux 4.18.0-553.el8 is older than 5.9: no CAP_CHECKPOINT_RESTORE, which CRIU runs with as the job's user; fix: boot a Linux 5.9 or newer kernel"),
            (Ok("garbage"), Status::Warn, "kernel version \"garbage\" is not a Linux version"),
            (Err("/proc/sys/kernel/osrelease: gone"), Status::Warn, "cannot read the kernel version: /proc/sys/kernel/osrelease: gone"),
        ];
        for (release, status, text) in cases {
            let got = judge(&release.map(String::from).map_err(String::from));
            assert_eq!((got.status, got.message.as_str()), (*status, *text), "{release:?}");
        }
    }
}
