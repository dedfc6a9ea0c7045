//! The two things `apply` does outside NVML, each behind a small trait so
//! tests record them: stopping and starting systemd units around a GPU
//! reset, and the reset itself. Both run programs by absolute path with an
//! argument vector (no shell) and a timeout.
//!
//! Why a reset at all: turning MIG on or off only takes effect after a GPU
//! reset, which the driver refuses while any client holds the GPU
//! (nvidia-persistenced, DCGM, slurmd's NVML handle, processes); NVML tries
//! one itself and reports the mode "pending" when it could not. NVML has no
//! call to reset a GPU, so it is `nvidia-smi --gpu-reset`.

use crate::command::{run_with_timeout, CommandError};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

/// Unit names are checked where the config is read (crate::config).
pub use crate::config::{check_unit_name, BadUnitName};

/// Why a program the baseline runs (systemctl, `nvidia-smi --gpu-reset`)
/// did not do its part, or was not run: an apply's step error holds it, so
/// what failed is told apart by kind, not by words.
#[derive(Debug, thiserror::Error)]
pub enum ProgramError {
    /// It could not be started, or did not finish in time.
    #[error(transparent)]
    Command(#[from] CommandError),
    /// It ran and exited non-zero; `output` is what it said, trimmed.
    #[error("{} {args} failed ({status}): {output}", .path.display())]
    Failed { path: PathBuf, args: String, status: ExitStatus, output: String },
    /// Refused before running: the name could be read as an option or path.
    #[error(transparent)]
    BadUnitName(#[from] BadUnitName),
    /// Refused before running: not hex digits, `:` and `.`.
    #[error("\"{0}\" is not a PCI bus id")]
    BadPciBusId(String),
}

/// Stops and starts units.
pub trait Services {
    fn is_active(&self, unit: &str) -> Result<bool, ProgramError>;
    fn stop(&self, unit: &str) -> Result<(), ProgramError>;
    fn start(&self, unit: &str) -> Result<(), ProgramError>;
}

/// Resets GPUs, by PCI bus id, all in one call (GPUs joined by NVLink or
/// NVSwitch may only reset together).
pub trait GpuReset {
    fn reset(&self, pci_bus_ids: &[String]) -> Result<(), ProgramError>;
}

/// systemctl by absolute path.
pub struct Systemctl {
    pub path: PathBuf,
    /// `start --no-block`: at boot this runs from a unit that other units
    /// (slurmd, DCGM) are ordered after; waiting for their start job from
    /// inside it would wait for ourselves.
    pub no_block: bool,
    pub timeout: Duration,
}

impl Systemctl {
    pub fn new(path: &Path, no_block: bool) -> Systemctl {
        Systemctl { path: path.to_path_buf(), no_block, timeout: Duration::from_secs(120) }
    }

    fn run(&self, args: &[&str]) -> Result<std::process::Output, ProgramError> {
        let mut cmd = Command::new(&self.path);
        cmd.args(args);
        Ok(run_with_timeout(cmd, None, self.timeout)?)
    }

    fn run_ok(&self, args: &[&str]) -> Result<(), ProgramError> {
        let out = self.run(args)?;
        if out.status.success() {
            return Ok(());
        }
        let output = String::from_utf8_lossy(&out.stderr).trim().to_string();
        Err(ProgramError::Failed { path: self.path.clone(), args: args.join(" "), status: out.status, output })
    }
}

impl Services for Systemctl {
    /// `is-active --quiet`: exit 0 when active, non-zero otherwise
    /// (inactive, failed, or no such unit: nothing to stop).
    fn is_active(&self, unit: &str) -> Result<bool, ProgramError> {
        check_unit_name(unit)?;
        Ok(self.run(&["is-active", "--quiet", "--", unit])?.status.success())
    }

    fn stop(&self, unit: &str) -> Result<(), ProgramError> {
        check_unit_name(unit)?;
        self.run_ok(&["stop", "--", unit])
    }

    fn start(&self, unit: &str) -> Result<(), ProgramError> {
        check_unit_name(unit)?;
        if self.no_block {
            self.run_ok(&["start", "--no-block", "--", unit])
        } else {
            self.run_ok(&["start", "--", unit])
        }
    }
}

/// `nvidia-smi --gpu-reset -i <bus id>[,<bus id>...]` by absolute path.
pub struct NvidiaSmiReset {
    pub path: PathBuf,
    pub timeout: Duration,
}

impl NvidiaSmiReset {
    pub fn new(path: &Path) -> NvidiaSmiReset {
        NvidiaSmiReset { path: path.to_path_buf(), timeout: Duration::from_secs(300) }
    }
}

impl GpuReset for NvidiaSmiReset {
    fn reset(&self, pci_bus_ids: &[String]) -> Result<(), ProgramError> {
        if let Some(bad) = pci_bus_ids.iter().find(|b| b.is_empty() || !b.chars().all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')) {
            return Err(ProgramError::BadPciBusId(bad.clone()));
        }
        let ids = pci_bus_ids.join(",");
        let mut cmd = Command::new(&self.path);
        cmd.args(["--gpu-reset", "-i", &ids]);
        let out = run_with_timeout(cmd, None, self.timeout)?;
        if out.status.success() {
            return Ok(());
        }
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let output: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
        Err(ProgramError::Failed { path: self.path.clone(), args: format!("--gpu-reset -i {ids}"), status: out.status, output })
    }
}

/// Test doubles: a recording service manager and reset.
#[cfg(test)]
pub mod record {
    use super::*;
    use std::cell::RefCell;
    use std::collections::BTreeSet;

    /// Records `is-active X`, `stop X`, `start X`; units in `active` are
    /// active; `fail` lists `stop X`/`start X` calls that fail.
    #[derive(Default)]
    pub struct RecordingServices {
        pub calls: RefCell<Vec<String>>,
        pub active: RefCell<BTreeSet<String>>,
        pub fail: Vec<String>,
    }

    impl RecordingServices {
        pub fn with_active(units: &[&str]) -> RecordingServices {
            RecordingServices { active: RefCell::new(units.iter().map(|s| s.to_string()).collect()), ..Default::default() }
        }

        /// The stop and start calls, in order.
        pub fn changes(&self) -> Vec<String> {
            self.calls.borrow().iter().filter(|c| !c.starts_with("is-active")).cloned().collect()
        }

        fn call(&self, what: &str, unit: &str) -> Result<(), ProgramError> {
            let c = format!("{what} {unit}");
            self.calls.borrow_mut().push(c.clone());
            if self.fail.contains(&c) {
                return Err(failed("systemctl", &c, "why"));
            }
            Ok(())
        }
    }

    impl Services for RecordingServices {
        fn is_active(&self, unit: &str) -> Result<bool, ProgramError> {
            self.calls.borrow_mut().push(format!("is-active {unit}"));
            Ok(self.active.borrow().contains(unit))
        }
        fn stop(&self, unit: &str) -> Result<(), ProgramError> {
            self.call("stop", unit)?;
            self.active.borrow_mut().remove(unit);
            Ok(())
        }
        fn start(&self, unit: &str) -> Result<(), ProgramError> {
            self.call("start", unit)?;
            self.active.borrow_mut().insert(unit.to_string());
            Ok(())
        }
    }

    /// A failed run of `path args` (exit status 1) that said `output`.
    pub fn failed(path: &str, args: &str, output: &str) -> ProgramError {
        use std::os::unix::process::ExitStatusExt;
        ProgramError::Failed { path: path.into(), args: args.into(), status: ExitStatus::from_raw(1 << 8), output: output.into() }
    }

    /// What a recorded reset then does (the fake GPUs' reset).
    pub type ResetFn<'a> = Box<dyn Fn(&[String]) -> Result<(), ProgramError> + 'a>;

    /// Records resets and hands them to `then`.
    pub struct RecordingReset<'a> {
        pub calls: RefCell<Vec<Vec<String>>>,
        pub then: ResetFn<'a>,
    }

    impl<'a> RecordingReset<'a> {
        pub fn new(then: impl Fn(&[String]) -> Result<(), ProgramError> + 'a) -> RecordingReset<'a> {
            RecordingReset { calls: RefCell::new(Vec::new()), then: Box::new(then) }
        }
    }

    impl GpuReset for RecordingReset<'_> {
        fn reset(&self, ids: &[String]) -> Result<(), ProgramError> {
            self.calls.borrow_mut().push(ids.to_vec());
            (self.then)(ids)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn unit_names_cannot_become_options_or_paths() {
        for ok in ["slurmd.service", "nvidia-dcgm", "dcgm-exporter.service", "getty@tty1.service"] {
            assert!(check_unit_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "--now", "-x", "a b", "../x", "x;reboot", "slurmd\n"] {
            assert!(check_unit_name(bad).is_err(), "{bad:?}");
        }
    }

    /// A stand-in program that logs its argv, one call per line.
    fn logger(dir: &Path, name: &str, exit: i32) -> (PathBuf, PathBuf) {
        let log = dir.join(format!("{name}.log"));
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\necho \"$@\" >> {}\necho why >&2\nexit {exit}\n", log.display())).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        (path, log)
    }

    #[test]
    fn systemctl_and_nvidia_smi_get_argument_vectors() {
        let dir = tempfile::tempdir().unwrap();
        let (path, log) = logger(dir.path(), "systemctl", 0);
        let s = Systemctl::new(&path, true);
        assert!(s.is_active("slurmd.service").unwrap());
        s.stop("slurmd.service").unwrap();
        s.start("slurmd.service").unwrap();
        assert!(s.stop("--all").unwrap_err().to_string().contains("not a systemd unit name"));
        let blocking = Systemctl::new(&path, false);
        blocking.start("x.service").unwrap();
        let text = std::fs::read_to_string(&log).unwrap();
        assert_eq!(
            text,
            "is-active --quiet -- slurmd.service\nstop -- slurmd.service\nstart --no-block -- slurmd.service\nstart -- x.service\n"
        );
        let (smi, smi_log) = logger(dir.path(), "nvidia-smi", 0);
        let r = NvidiaSmiReset::new(&smi);
        r.reset(&["00000000:18:00.0".into(), "00000000:2A:00.0".into()]).unwrap();
        assert_eq!(std::fs::read_to_string(&smi_log).unwrap(), "--gpu-reset -i 00000000:18:00.0,00000000:2A:00.0\n");
        assert!(r.reset(&["0;reboot".into()]).unwrap_err().to_string().contains("not a PCI bus id"));
        let (failing, _) = logger(dir.path(), "failing", 3);
        let err = NvidiaSmiReset::new(&failing).reset(&["00000000:18:00.0".into()]).unwrap_err().to_string();
        assert!(err.contains("--gpu-reset -i 00000000:18:00.0 failed") && err.contains("why"), "{err}");
        assert!(!Systemctl::new(&failing, false).is_active("a.service").unwrap());
        assert!(Systemctl::new(&failing, false).stop("a.service").unwrap_err().to_string().contains("stop -- a.service failed"));
    }

    /// Each way a run goes wrong is its own kind, and says what it said
    /// when it was a string.
    #[test]
    fn failed_runs_are_told_apart_by_kind() {
        let dir = tempfile::tempdir().unwrap();
        let (failing, _) = logger(dir.path(), "failing", 3);
        let slow = dir.path().join("slow");
        std::fs::write(&slow, "#!/bin/sh\nsleep 5\n").unwrap();
        std::fs::set_permissions(&slow, std::fs::Permissions::from_mode(0o755)).unwrap();
        let quick = |path: &Path| Systemctl { timeout: Duration::from_millis(100), ..Systemctl::new(path, false) };
        let missing = dir.path().join("missing");
        let bus = "00000000:18:00.0".to_string();
        let cases: Vec<(&str, ProgramError, fn(&ProgramError) -> bool, String)> = vec![
            (
                "exit 3",
                Systemctl::new(&failing, false).stop("a.service").unwrap_err(),
                |e| matches!(e, ProgramError::Failed { status, output, .. } if status.code() == Some(3) && output == "why"),
                format!("{} stop -- a.service failed (exit status: 3): why", failing.display()),
            ),
            (
                "nvidia-smi exit 3",
                NvidiaSmiReset::new(&failing).reset(std::slice::from_ref(&bus)).unwrap_err(),
                |e| matches!(e, ProgramError::Failed { args, .. } if args == "--gpu-reset -i 00000000:18:00.0"),
                format!("{} --gpu-reset -i 00000000:18:00.0 failed (exit status: 3): why", failing.display()),
            ),
            (
                "timeout",
                quick(&slow).start("a.service").unwrap_err(),
                |e| matches!(e, ProgramError::Command(CommandError::Timeout { ms: 100, .. })),
                format!("{} start -- a.service timed out after 100 ms", slow.display()),
            ),
            (
                "no program",
                Systemctl::new(&missing, false).is_active("a.service").unwrap_err(),
                |e| matches!(e, ProgramError::Command(CommandError::Spawn { .. })),
                format!("cannot run {}: No such file or directory (os error 2)", missing.display()),
            ),
            (
                "unit name",
                Systemctl::new(&failing, false).start("-a").unwrap_err(),
                |e| matches!(e, ProgramError::BadUnitName(BadUnitName(n)) if n == "-a"),
                "\"-a\" is not a systemd unit name (letters, digits and :_.@-\\ only, not starting with -)".into(),
            ),
            (
                "bus id",
                NvidiaSmiReset::new(&failing).reset(&[bus.clone(), String::new()]).unwrap_err(),
                |e| matches!(e, ProgramError::BadPciBusId(b) if b.is_empty()),
                "\"\" is not a PCI bus id".into(),
            ),
        ];
        for (what, err, kind, said) in cases {
            assert!(kind(&err), "{what}: {err:?}");
            assert_eq!(err.to_string(), said, "{what}");
        }
    }
}
