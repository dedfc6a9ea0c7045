//! A test that cannot do what its name says on this machine (no CRIU, not
//! root, a kernel without transparent huge pages) says so here, where CI's
//! log shows it, instead of passing quietly.
//!
//! libtest captures `println!`/`eprintln!` of a passing test, so a skip said
//! that way never reaches CI's log. These functions write straight to the
//! process's standard error (which libtest does not capture) and append one
//! line to the notes file that `scripts/test.sh` counts at the end
//! (`tests: N passed, N failed, N skipped` and `substituted: N`).
//!
//! * [`skipped`]: the test's assertions did not run.
//! * [`substituted`]: they ran, on something else than the test's name says
//!   (e.g. a capability-less root in place of a plain job user).
//!
//! Where a skip would hide a regression in CI, the test asks
//! [`required`] first: a variable such as `GPU_MODE_REQUIRE_CRIU=1` turns
//! the skip into a failure.

use std::io::Write;

pub mod criu_image;
pub mod labels;
pub mod n1;
pub mod table;
pub mod user;
use std::path::PathBuf;

/// Whether this process is root, for a test whose assertions need it.
/// When not, says that the running test ([`this_test`]) was skipped and
/// `why` root is needed; where CI runs the tests (`CI=true`, as root) that
/// is a failure instead.
pub fn root_or_skip(why: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    let test = this_test();
    assert!(!required("CI"), "{test}: needs root ({why}), and CI runs the tests as root");
    skipped(&test, &format!("needs root ({why})"));
    false
}

/// The notes file: `$GPU_MODE_TEST_NOTES`, else `target/test-notes.log` in
/// the workspace (found from this crate's own location at build time).
pub fn notes_file() -> PathBuf {
    match std::env::var_os("GPU_MODE_TEST_NOTES") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/test-notes.log"),
    }
}

/// The test's assertions did not run, and why.
pub fn skipped(test: &str, reason: &str) {
    note("SKIPPED", test, reason);
}

/// The test's assertions ran on a substitute, named in `reason`.
pub fn substituted(test: &str, reason: &str) {
    note("SUBSTITUTED", test, reason);
}

/// Whether the environment variable `var` asks that what a test needs be
/// present (`1`, `true` or `yes`): then the test fails instead of skipping.
pub fn required(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| matches!(v.trim(), "1" | "true" | "yes"))
}

/// The running test as `<test binary>::<test>`: libtest runs each test on
/// a thread it names after the test, and the binary's name (its cargo hash
/// cut off) says which file it is in. For notes said from a helper that
/// does not know its caller.
pub fn this_test() -> String {
    let binary = std::env::args_os().next().map(PathBuf::from);
    let binary = binary.as_ref().and_then(|b| b.file_name()).map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let thread = std::thread::current();
    test_path(&binary, thread.name().unwrap_or("?"))
}

fn test_path(binary: &str, thread: &str) -> String {
    // cargo names test binaries `<file>-<16 hex digits>`.
    let file = match binary.rsplit_once('-') {
        Some((file, hash)) if hash.len() == 16 && hash.chars().all(|c| c.is_ascii_hexdigit()) => file,
        _ => binary,
    };
    match thread {
        "main" => file.to_string(),
        test => format!("{file}::{test}"),
    }
}

/// `SKIPPED <test>: <reason>` on standard error and in the notes file. The
/// reason is one line: control characters become spaces. Said once per
/// process: a helper that several calls of one test reach (who runs its
/// jobs, whether CRIU works) notes it once, so the count is of tests.
fn note(kind: &str, test: &str, reason: &str) {
    static SAID: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let line = format_line(kind, test, reason);
    {
        let mut said = SAID.lock().unwrap_or_else(|p| p.into_inner());
        if said.contains(&line) {
            return;
        }
        said.push(line.clone());
    }
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
    let path = notes_file();
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    // One write of a short line with O_APPEND: lines of tests running in
    // parallel (threads or processes) do not interleave.
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(&path) {
        let _ = f.write_all(line.as_bytes());
    }
}

fn format_line(kind: &str, test: &str, reason: &str) -> String {
    let clean = |s: &str| s.chars().map(|c| if c.is_control() { ' ' } else { c }).collect::<String>();
    format!("{kind} {}: {}\n", clean(test), clean(reason))
}

/// Writes an executable `/bin/sh` script `name` into `dir` (a stand-in for
/// scontrol, squeue and the like).
pub fn script(dir: &std::path::Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// Runs one test of the current test binary in a child process (for a test
/// whose scenario exits the process or arms a watchdog), with `env` added;
/// killed after `timeout`. Returns what it printed and how it ended.
pub fn run_test_in_child(test: &str, env: &[(&str, &std::ffi::OsStr)], timeout: std::time::Duration) -> std::process::Output {
    use std::process::{Command, Stdio};
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", test, "--test-threads=1", "--nocapture"]).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().unwrap();
    let pid = child.id() as i32;
    let (done, wait) = std::sync::mpsc::channel::<()>();
    let killer = std::thread::spawn(move || {
        if wait.recv_timeout(timeout).is_err() {
            // SAFETY: a signal to our own child, not yet waited for.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    });
    let out = child.wait_with_output().unwrap();
    let _ = done.send(());
    let _ = killer.join();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_is_one_line_that_names_the_test_and_the_reason() {
        assert_eq!(format_line("SKIPPED", "churn", "no CRIU\nat /opt"), "SKIPPED churn: no CRIU at /opt\n");
        assert_eq!(format_line("SUBSTITUTED", "a\tb", "root"), "SUBSTITUTED a b: root\n");
    }

    #[test]
    fn a_test_is_named_by_its_file_and_its_thread() {
        assert_eq!(test_path("churn-0123456789abcdef", "a_hundred_jobs"), "churn::a_hundred_jobs");
        assert_eq!(test_path("preempt_checkpoint", "tests::x"), "preempt_checkpoint::tests::x");
        assert_eq!(test_path("gpu-mode-run", "main"), "gpu-mode-run");
    }

    #[test]
    fn notes_reach_the_file_named_by_the_environment() {
        let dir = std::env::temp_dir().join(format!("testkit-{}", std::process::id()));
        let file = dir.join("notes.log");
        // SAFETY: this crate's only test that touches the environment.
        unsafe { std::env::set_var("GPU_MODE_TEST_NOTES", &file) };
        skipped("t1", "why");
        substituted("t2", "instead");
        // Said again by the same test: counted once.
        skipped("t1", "why");
        let text = std::fs::read_to_string(&file).unwrap();
        assert_eq!(text, "SKIPPED t1: why\nSUBSTITUTED t2: instead\n");
        unsafe { std::env::remove_var("GPU_MODE_TEST_NOTES") };
        std::fs::remove_dir_all(dir).unwrap();
    }
}
