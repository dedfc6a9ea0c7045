//! Audit item C1: a user must never get root to chown or chmod a path of
//! the user's choosing while the MPS directories `<runtime>/mps/<key>/{pipe,
//! log}` are made for them.
//!
//! The attack: once `<key>/` belongs to the user, rename the fresh `pipe`
//! away and put a symlink to a root-owned directory in its place, hoping to
//! land between root's mkdir and its chown by path. Before the fix, an
//! unprivileged loop like the one below won 31 times in 20,000 tries on a
//! 2-core machine. This test runs the real attacker (another process, uid
//! 65534) against the real directory code for a bounded time and fails if
//! root ever touched the target.
//!
//! Needs root (to create directories for another uid); skipped otherwise.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const ATTACKER_UID: u32 = 65534;
const ATTACK_DIR_VAR: &str = "GPU_MODE_C1_ATTACK_DIR";
/// Bounds for CI: whichever comes first.
const MAX_TRIES: u32 = 20_000;
const MAX_TIME: Duration = Duration::from_secs(25);

/// The attacker: run as uid 65534 by the test below (this same test binary,
/// re-executed). Loops swapping `<key>/pipe` and `<key>/log` for symlinks
/// to the target until the stop file appears.
#[test]
fn attacker_process() {
    let Some(dir) = std::env::var_os(ATTACK_DIR_VAR).map(PathBuf::from) else { return };
    let (key, target, stop) = (dir.join("mps/key"), dir.join("target"), dir.join("stop"));
    let mut n = 0u64;
    while !n.is_multiple_of(256) || !stop.exists() {
        n += 1;
        for sub in ["pipe", "log"] {
            let (p, moved) = (key.join(sub), key.join(format!("{sub}.old")));
            if std::fs::rename(&p, &moved).is_ok() {
                let _ = std::os::unix::fs::symlink(&target, &p);
                let _ = std::fs::remove_dir(&moved);
            }
        }
    }
}

#[test]
fn root_never_chowns_a_path_the_user_planted() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root");
        return;
    }
    let base = tempfile::Builder::new().prefix("gpu-mode-c1-").tempdir().unwrap();
    let dir = base.path();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let target = dir.join("target");
    std::fs::create_dir(&target).unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).unwrap();
    let runtime = dir.to_path_buf();
    let mut attacker = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "attacker_process", "--test-threads=1", "--quiet"])
        .env(ATTACK_DIR_VAR, dir)
        .uid(ATTACKER_UID)
        .gid(ATTACKER_UID)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let (tries, wins) = race(&runtime, &target);
    std::fs::write(dir.join("stop"), b"").unwrap();
    let _ = attacker.wait();
    eprintln!("C1 race: {tries} tries, {wins} times root touched the target");
    assert!(tries > 1000, "the race ran only {tries} times: it proves nothing");
    assert_eq!(wins, 0, "root chowned or chmodded the attacker's symlink target {wins} times in {tries} tries");
}

use std::os::unix::process::CommandExt;

/// Makes the directories again and again; counts the times the target
/// changed owner or mode (and repairs it, so every win is counted).
fn race(runtime: &Path, target: &Path) -> (u32, u32) {
    let start = Instant::now();
    let (mut tries, mut wins) = (0, 0);
    while tries < MAX_TRIES && start.elapsed() < MAX_TIME {
        tries += 1;
        // Each try is a new daemon, as after the previous job's teardown.
        let _ = std::fs::remove_dir_all(runtime.join("mps/key"));
        // Errors are expected: the attacker breaks the user's own tree.
        let _ = gpu_mode_core::mps::registry::create_daemon_dirs(runtime, "key", ATTACKER_UID, ATTACKER_UID);
        let m = std::fs::metadata(target).unwrap();
        if m.uid() != 0 || m.mode() & 0o7777 != 0o755 {
            wins += 1;
            std::os::unix::fs::chown(target, Some(0), Some(0)).unwrap();
            std::fs::set_permissions(target, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
    (tries, wins)
}
