//! Unprivileged test users, created on demand with useradd.

use anyhow::{anyhow, bail, Context, Result};
use std::process::Command;

/// The non-root users the tests submit as (the churn uses all four).
pub const TEST_USERS: &[&str] = &["gmtest1", "gmtest2", "gmtest3", "gmtest4"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
}

pub fn lookup(name: &str) -> Result<User> {
    let u = nix::unistd::User::from_name(name)
        .context("reading the user database")?
        .ok_or_else(|| anyhow!("user {name} does not exist (the harness creates the test users)"))?;
    Ok(User { uid: u.uid.as_raw(), gid: u.gid.as_raw() })
}

/// Creates the test users if missing (idempotent).
pub fn ensure_test_users() -> Result<()> {
    for name in TEST_USERS {
        if lookup(name).is_ok() {
            continue;
        }
        let useradd = ["/usr/sbin/useradd", "/sbin/useradd"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .ok_or_else(|| anyhow!("useradd not found"))?;
        let out = Command::new(useradd).args(["--no-create-home", "--shell", "/bin/sh", name]).output()?;
        if !out.status.success() && lookup(name).is_err() {
            bail!("useradd {name} failed: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
    Ok(())
}
