//! Audit item C1: a user must never get root to chown or chmod a path of
//! the user's choosing while the MPS directories `<runtime>/mps/<key>/{pipe,
//! log}` are made for them.
//!
//! The attack: once `<key>/` belongs to the user, rename the fresh `pipe`
//! away and put a symlink to a root-owned directory in its place, hoping to
//! land between root's mkdir and its chown by path. Before the fix, an
//! unprivileged loop like the one below won 31 times in 20,000 tries on a
//! 2-core machine. This test runs the real attacker (a thread whose
//! credentials alone are uid 65534: Linux checks each thread's own, see
//! gpu_mode_testkit::user) against the real directory code for a bounded
//! time and fails if root ever touched the target.
//!
//! A race proves nothing unless both sides ran at once: the attacker counts
//! its swaps where root's loop reads them, and the test fails unless
//! enough of root's tries had a swap land while root was making the
//! directories.
//!
//! Needs root (to create directories for another uid and to become it):
//! reported as skipped otherwise, and a failure under CI (`CI=true`), which
//! runs as root.

use gpu_mode_testkit::user;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const ATTACKER_UID: u32 = user::NOBODY;
/// Bounds for CI: whichever comes first.
const MAX_TRIES: u32 = 20_000;
const MAX_TIME: Duration = Duration::from_secs(25);
/// Tries during which at least one swap landed, at the least. A 2-core
/// machine shared with other builds saw 9,880 of 17,717; fewer than this
/// means the attacker hardly ran, and a zero-win result would say nothing.
const MIN_CONTESTED_TRIES: u32 = 500;

/// What the two sides share: the attacker's swap count and root's request
/// to stop.
#[derive(Default)]
struct Shared {
    swaps: AtomicU64,
    stop: AtomicBool,
}

/// The attacker, on a thread that has become the user: swaps
/// `<key>/pipe` and `<key>/log` for symlinks to the target until root says
/// stop, counting each swap that put a symlink in place.
fn attack(runtime: &Path, target: &Path, shared: &Shared) {
    let key = runtime.join("mps/key");
    let subs = ["pipe", "log"].map(|sub| (key.join(sub), key.join(format!("{sub}.old"))));
    while !shared.stop.load(Ordering::Relaxed) {
        for (path, moved) in &subs {
            if std::fs::rename(path, moved).is_ok() {
                if std::os::unix::fs::symlink(target, path).is_ok() {
                    shared.swaps.fetch_add(1, Ordering::Relaxed);
                }
                let _ = std::fs::remove_dir(moved);
            }
        }
    }
}

#[test]
fn root_never_chowns_a_path_the_user_planted() {
    if !gpu_mode_testkit::root_or_skip("to make directories for uid 65534 and to become it") {
        return;
    }
    let base = tempfile::Builder::new().prefix("gpu-mode-c1-").tempdir().unwrap();
    let runtime = base.path();
    std::fs::set_permissions(runtime, std::fs::Permissions::from_mode(0o755)).unwrap();
    let target = runtime.join("target");
    std::fs::create_dir(&target).unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).unwrap();
    let shared = Shared::default();
    let (outcome, attacker) = std::thread::scope(|s| {
        let attacker = s.spawn(|| {
            user::become_user(ATTACKER_UID, ATTACKER_UID)?;
            attack(runtime, &target, &shared);
            Ok::<(), String>(())
        });
        let outcome = race(runtime, &target, &shared);
        shared.stop.store(true, Ordering::Relaxed);
        (outcome, attacker.join())
    });
    let swaps = shared.swaps.load(Ordering::Relaxed);
    eprintln!("C1 race: {outcome:?}, {swaps} swaps by the attacker in all");
    assert_eq!(attacker.expect("the attacker panicked"), Ok(()), "the attacker could not become uid {ATTACKER_UID}");
    assert!(outcome.tries > 1000, "the race ran only {} times: it proves nothing", outcome.tries);
    assert!(
        outcome.contested >= MIN_CONTESTED_TRIES,
        "a swap landed during only {} of root's {} tries (at least {MIN_CONTESTED_TRIES} wanted): no race happened",
        outcome.contested,
        outcome.tries
    );
    assert_eq!(outcome.wins, 0, "root chowned or chmodded the attacker's symlink target: {outcome:?}");
}

/// What root's side of the race saw.
#[derive(Debug, Default)]
struct Outcome {
    /// Times the directories were made.
    tries: u32,
    /// Tries during which the attacker completed at least one swap.
    contested: u32,
    /// Tries after which the target had another owner or mode.
    wins: u32,
}

/// Makes the directories again and again; counts the tries the attacker
/// contested and the times the target changed owner or mode (repairing it,
/// so every win is counted).
fn race(runtime: &Path, target: &Path, shared: &Shared) -> Outcome {
    let start = Instant::now();
    let mut out = Outcome::default();
    while out.tries < MAX_TRIES && start.elapsed() < MAX_TIME {
        out.tries += 1;
        // Each try is a new daemon, as after the previous job's teardown.
        let _ = std::fs::remove_dir_all(runtime.join("mps/key"));
        let before = shared.swaps.load(Ordering::Relaxed);
        // Errors are expected: the attacker breaks the user's own tree.
        let _ = gpu_mode_core::mps::registry::create_daemon_dirs(runtime, "key", ATTACKER_UID, ATTACKER_UID);
        if shared.swaps.load(Ordering::Relaxed) > before {
            out.contested += 1;
        }
        let m = std::fs::metadata(target).unwrap();
        if m.uid() != 0 || m.mode() & 0o7777 != 0o755 {
            out.wins += 1;
            std::os::unix::fs::chown(target, Some(0), Some(0)).unwrap();
            std::fs::set_permissions(target, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
    out
}
