//! `ckpt_criu`: CRIU at `preempt.criu` runs, is 4 or newer, passes `criu
//! check`, and was built with exactly the project's patches (the PATCHES
//! file scripts/install-criu.sh writes beside it, criu::patches).

use super::super::{combine, Check, CheckResult, Ctx, Status};
use crate::criu::{patches, CheckCache, CriuCli, CriuError, CriuVersion};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const NAME: &str = "ckpt_criu";
/// Bound on each of `criu --version` and `criu check` (well under a second
/// when they work), inside the checker's own deadline.
const CRIU_BOUND: Duration = Duration::from_secs(5);
/// The fix for every CRIU problem but a failing `criu check`.
const INSTALL: &str = "fix: scripts/install-criu.sh --force (or set preempt.criu in /etc/slurm-gpu-mode/config.toml to a CRIU it built)";

pub struct Criu;

impl Check for Criu {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&self, ctx: &Ctx) -> Vec<CheckResult> {
        super::judged(ctx, NAME, |f| judge(&f.criu))
    }
}

#[derive(Debug)]
pub struct CriuFacts {
    pub binary: PathBuf,
    /// `criu --version` and `criu check` (run by absolute path, no shell,
    /// bounded; a pass this boot is remembered).
    pub check: Result<CriuVersion, CriuError>,
    pub patches_file: PathBuf,
    /// The PATCHES file's text.
    pub patches: Result<String, String>,
}

impl CriuFacts {
    /// Whether the binary is there to run (a check may still fail).
    pub fn installed(&self) -> bool {
        !matches!(self.check, Err(CriuError::Missing { .. }))
    }
}

pub fn probe(binary: &Path, check_cache: &Path) -> CriuFacts {
    let cli = CriuCli { binary: binary.to_path_buf(), timeout: CRIU_BOUND, check_cache: Some(CheckCache { path: check_cache.to_path_buf() }), page_readers: 1 };
    let patches_file = patches::patches_file(binary);
    let patches = std::fs::read_to_string(&patches_file).map_err(|e| e.to_string());
    CriuFacts { binary: binary.to_path_buf(), check: cli.check_within(CRIU_BOUND), patches_file, patches }
}

pub fn judge(f: &CriuFacts) -> CheckResult {
    let version = match &f.check {
        Err(e @ CriuError::Missing { .. }) => return CheckResult::new(NAME, None, Status::Warn, format!("{e}; {INSTALL}")),
        Err(e @ CriuError::TooOld { .. }) => return CheckResult::new(NAME, None, Status::Warn, format!("{e}; {INSTALL}")),
        Err(e) => Err(format!("{e}; fix: run `{} check` as root and repair what it names", f.binary.display())),
        Ok(v) => Ok(v),
    };
    let mut findings: Vec<(Status, String)> = Vec::new();
    if let Err(problem) = &version {
        findings.push((Status::Warn, problem.clone()));
    }
    match &f.patches {
        Err(e) => findings.push((
            Status::Warn,
            format!("no list of the project's CRIU patches at {} ({e}): not a CRIU scripts/install-criu.sh built; {INSTALL}", f.patches_file.display()),
        )),
        Ok(text) => {
            if let Some(diff) = patches::difference(text) {
                findings.push((Status::Warn, format!("{} is not the patch set this release expects ({diff}); {INSTALL}", f.patches_file.display())));
            }
        }
    }
    let ok = match &version {
        Ok(v) => format!("CRIU {v} at {}: `criu check` passes, the {} project patches are recorded", f.binary.display(), patches::EXPECTED.len()),
        Err(_) => String::new(),
    };
    combine(NAME, None, findings, ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(check: Result<CriuVersion, CriuError>, patches: Result<String, String>) -> CriuFacts {
        CriuFacts { binary: "/opt/c/bin/criu".into(), check, patches_file: "/opt/c/PATCHES".into(), patches }
    }

    #[test]
    fn each_criu_problem_says_its_fix() {
        let ours: String = patches::EXPECTED.iter().map(|(h, n)| format!("{h}  {n}\n")).collect();
        let v411 = || Ok(CriuVersion { major: 4, minor: 1, patch: 1 });
        let missing = || Err(CriuError::Missing { path: "/opt/c/bin/criu".into(), detail: "No such file or directory (os error 2)".into() });
        let fails = || Err(CriuError::CheckFailed { path: "/opt/c/bin/criu".into(), detail: "Error (criu/cr-check.c:1): no vdso".into() });
        let old = || Err(CriuError::TooOld { path: "/usr/sbin/criu".into(), version: "3.17.1".into() });
        let (h6, n6) = patches::EXPECTED[5];
        let cases: Vec<(CriuFacts, Status, String)> = vec![
            (facts(v411(), Ok(ours.clone())), Status::Ok, format!("CRIU 4.1.1 at /opt/c/bin/criu: `criu check` passes, the {} project patches are recorded", patches::EXPECTED.len())),
            (
                facts(missing(), Err("No such file or directory (os error 2)".into())),
                Status::Warn,
                format!("CRIU is not installed at /opt/c/bin/criu (No such file or directory (os error 2)): run scripts/install-criu.sh, or set preempt.criu; {INSTALL}"),
            ),
            (facts(old(), Ok(ours.clone())), Status::Warn, format!("CRIU at /usr/sbin/criu is version 3.17.1; checkpointing needs CRIU 4.0 or later (Debian bookworm's 3.17 fails on current kernels): scripts/install-criu.sh builds 4.1.1; {INSTALL}")),
            (
                facts(fails(), Ok(ours.clone())),
                Status::Warn,
                "`/opt/c/bin/criu check` fails on this node: Error (criu/cr-check.c:1): no vdso; fix: run `/opt/c/bin/criu check` as root and repair what it names".into(),
            ),
            (
                facts(v411(), Err("No such file or directory (os error 2)".into())),
                Status::Warn,
                format!("no list of the project's CRIU patches at /opt/c/PATCHES (No such file or directory (os error 2)): not a CRIU scripts/install-criu.sh built; {INSTALL}"),
            ),
            (
                facts(v411(), Ok(ours.replace(h6, &"f".repeat(64)))),
                Status::Warn,
                format!("/opt/c/PATCHES is not the patch set this release expects (missing or changed: {n6}; not ours: {n6}); {INSTALL}"),
            ),
        ];
        for (f, status, text) in cases {
            let got = judge(&f);
            assert_eq!((got.status, got.message.as_str()), (status, text.as_str()), "{f:?}");
        }
    }

    #[test]
    fn a_failing_check_and_a_wrong_list_are_both_said() {
        let f = facts(Err(CriuError::CheckFailed { path: "/c".into(), detail: "x".into() }), Ok(String::new()));
        let got = judge(&f);
        assert_eq!(got.status, Status::Warn);
        assert!(got.message.starts_with("`/c check` fails on this node: x; fix:") && got.message.contains("; /opt/c/PATCHES is not the patch set"), "{}", got.message);
    }

    #[test]
    fn a_missing_binary_is_found_without_running_anything() {
        let dir = tempfile::tempdir().unwrap();
        let f = probe(&dir.path().join("bin/criu"), &dir.path().join("criu-check"));
        assert!(!f.installed(), "{:?}", f.check);
        assert!(f.patches.is_err());
        assert_eq!(f.patches_file, dir.path().join("PATCHES"));
    }
}
