//! Threat-model boundary (docs/security.md, "Boundaries and their tests"):
//! a file, symlink or directory planted where a root helper keeps its
//! runtime state (`jobs/`, `locks/`, `mps-daemons/`, `mps/`, `mig/`,
//! `health/`) is refused or replaced, never followed: the thing it points at
//! keeps its owner, mode and contents. Root only (the helpers are root's and
//! "another owner" needs a chown); noted SKIPPED through the testkit otherwise.

use gpu_mode_core::gpu_lock::GpuLocks;
use gpu_mode_core::health::cursor::Cursor;
use gpu_mode_core::modes::mig::journal::MigJournal;
use gpu_mode_core::mps::registry::{create_daemon_dirs, test_record_for};
use gpu_mode_core::procfs::ProcId;
use gpu_mode_core::state::{JobState, JobStatus, STATE_VERSION};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

const NOBODY: u32 = 65534;

/// Whether the test runs as root; when not, it is noted SKIPPED through
/// the testkit (CI's log and count show it).
fn root_or_skip() -> bool {
    gpu_mode_testkit::root_or_skip("planting paths of other owners")
}

/// A directory root cares about, with one file in it: what a planted
/// symlink would make a root helper write into.
struct Victim {
    dir: PathBuf,
    before: Vec<(String, u32, u32, u64)>,
}

impl Victim {
    fn new(base: &Path) -> Victim {
        let dir = base.join("victim");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(dir.join("precious"), b"do not touch").unwrap();
        let mut v = Victim { dir, before: vec![] };
        v.before = v.snapshot();
        v
    }

    /// Every entry (the directory itself first) with owner, mode, size.
    fn snapshot(&self) -> Vec<(String, u32, u32, u64)> {
        let mut out = vec![];
        let meta = std::fs::symlink_metadata(&self.dir).unwrap();
        out.push((".".into(), meta.uid(), meta.mode(), 0));
        let mut names: Vec<_> = std::fs::read_dir(&self.dir).unwrap().map(|e| e.unwrap()).collect();
        names.sort_by_key(|e| e.file_name());
        for e in names {
            let m = e.metadata().unwrap();
            out.push((e.file_name().to_string_lossy().into_owned(), m.uid(), m.mode(), m.len()));
        }
        out
    }

    fn assert_untouched(&self, what: &str) {
        assert_eq!(self.snapshot(), self.before, "{what}: the planted path was followed");
        assert_eq!(std::fs::read(self.dir.join("precious")).unwrap(), b"do not touch", "{what}");
    }
}

#[derive(Debug, Clone, Copy)]
enum Plant {
    /// A symlink to the victim directory.
    Symlink,
    /// A directory another user owns (and could fill).
    Foreign,
    /// A regular file where a directory belongs.
    File,
}

fn plant(at: &Path, how: Plant, victim: &Victim) {
    match how {
        Plant::Symlink => std::os::unix::fs::symlink(&victim.dir, at).unwrap(),
        Plant::Foreign => {
            std::fs::create_dir(at).unwrap();
            std::os::unix::fs::chown(at, Some(NOBODY), Some(NOBODY)).unwrap();
            std::fs::set_permissions(at, std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        Plant::File => std::fs::write(at, b"").unwrap(),
    }
}

fn state(job: u32) -> JobState {
    JobState {
        version: STATE_VERSION,
        status: JobStatus::Preparing,
        job_id: job,
        uid: 1001,
        gid: 1001,
        user: "u".into(),
        node: "n".into(),
        mode: "mps".into(),
        gpus: vec![0],
        task_env: Default::default(),
        per_task_env: Default::default(),
        refusal: None,
        created_unix: 0,
        grant: Default::default(),
    }
}

/// (runtime subdirectory, what a helper does there, rendered as its error).
type Use = (&'static str, fn(&Path) -> Result<(), String>);

fn uses() -> Vec<Use> {
    vec![
        ("jobs", |run| state(7).save(run).map(drop).map_err(|e| e.to_string())),
        ("locks", |run| GpuLocks::acquire(run, &[0], Duration::from_millis(100)).map(drop).map_err(|e| e.to_string())),
        ("mps-daemons", |run| {
            let me = ProcId { pid: std::process::id() as i32, start_time: 0 };
            test_record_for(1001, &[0], &[7], me, run).save(run).map_err(|e| e.to_string())
        }),
        ("mps", |run| create_daemon_dirs(run, "1001-0", 1001, 1001).map(drop).map_err(|e| e.to_string())),
        ("mig", |run| MigJournal::new(7, 1001).save(run).map_err(|e| e.to_string())),
        ("health", |run| Cursor::default().save(&run.join("health")).map_err(|e| e.to_string())),
    ]
}

#[test]
fn a_planted_runtime_subdirectory_is_refused_and_its_target_untouched() {
    if !root_or_skip() {
        return;
    }
    for (sub, act) in uses() {
        for how in [Plant::Symlink, Plant::Foreign, Plant::File] {
            let base = tempfile::tempdir().unwrap();
            let run = base.path().join("run");
            std::fs::create_dir(&run).unwrap();
            std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o755)).unwrap();
            let victim = Victim::new(base.path());
            let at = run.join(sub);
            plant(&at, how, &victim);
            let what = format!("{sub} planted as {how:?}");
            let err = act(&run).expect_err(&what);
            assert!(err.contains(&at.display().to_string()), "{what}: the error names the path: {err}");
            let why = match how {
                Plant::Symlink | Plant::File => "is not a directory (a symlink or file is in the way)",
                Plant::Foreign => "is owned by uid 65534, expected uid 0",
            };
            assert!(err.contains(why), "{what}: {err}");
            victim.assert_untouched(&what);
        }
    }
}

#[test]
fn a_planted_runtime_directory_itself_is_refused() {
    if !root_or_skip() {
        return;
    }
    for (sub, act) in uses().into_iter().filter(|(s, _)| *s != "health") {
        for how in [Plant::Symlink, Plant::Foreign] {
            let base = tempfile::tempdir().unwrap();
            let victim = Victim::new(base.path());
            let run = base.path().join("run");
            plant(&run, how, &victim);
            let what = format!("runtime dir planted as {how:?} ({sub})");
            let err = act(&run).expect_err(&what);
            assert!(err.contains("run"), "{what}: {err}");
            victim.assert_untouched(&what);
        }
    }
}

/// Files planted inside root's directories (only root can write there;
/// this is defence in depth against a crashed run's or an admin's leftover).
#[test]
fn planted_files_are_replaced_or_refused_never_written_through() {
    if !root_or_skip() {
        return;
    }
    let base = tempfile::tempdir().unwrap();
    let victim = Victim::new(base.path());
    let run = base.path().join("run");
    state(1).save(&run).unwrap();
    // A state file that is a symlink: the atomic rename replaces the link.
    let link = run.join("jobs/7.json");
    std::os::unix::fs::symlink(victim.dir.join("precious"), &link).unwrap();
    state(7).save(&run).unwrap();
    assert!(!std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    victim.assert_untouched("jobs/7.json as a symlink");
    // A lock file that is a symlink: refused, not opened through.
    GpuLocks::acquire(&run, &[0], Duration::from_millis(100)).unwrap();
    let lock = run.join("locks/gpu1.lock");
    std::os::unix::fs::symlink(victim.dir.join("precious"), &lock).unwrap();
    let err = GpuLocks::acquire(&run, &[1], Duration::from_millis(100)).map(drop).unwrap_err().to_string();
    assert!(err.contains("gpu1.lock"), "{err}");
    victim.assert_untouched("locks/gpu1.lock as a symlink");
    // A daemon directory that is a symlink: removed (the link, not its
    // target) and made afresh.
    create_daemon_dirs(&run, "1001-0", 1001, 1001).unwrap();
    let daemon = run.join("mps/1001-2");
    std::os::unix::fs::symlink(&victim.dir, &daemon).unwrap();
    create_daemon_dirs(&run, "1001-2", 1001, 1001).unwrap();
    let meta = std::fs::symlink_metadata(&daemon).unwrap();
    assert!(meta.is_dir() && meta.uid() == 1001, "{meta:?}");
    victim.assert_untouched("mps/<key> as a symlink");
}
