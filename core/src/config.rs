//! The site configuration file, `/etc/slurm-gpu-mode/config.toml` by default.
//! Every key is optional and documented in `etc/config.toml`. Unknown keys are
//! errors: a typo must not silently fall back to a default on a root helper.

use crate::gpu::{ComputeModeSetting, MigInstanceSetting, MigModeSetting};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Where the helpers look when no `--config` / `config=` is given.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/slurm-gpu-mode/config.toml";

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Root-owned directory for per-job state and per-job MPS directories.
    pub runtime_dir: PathBuf,
    pub slurm: SlurmConfig,
    pub log: LogConfig,
    pub nvml: NvmlConfig,
    pub mig: MigConfig,
    pub gpu: GpuConfig,
    pub checkpoint: CheckpointConfig,
    pub mps: MpsConfig,
}

/// `[mps]`: the per-job MPS daemons.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MpsConfig {
    /// Absolute path of nvidia-cuda-mps-control (no PATH under slurmd).
    pub control: PathBuf,
    /// Bound on starting a daemon: `-d` returning and its control socket answering.
    pub start_timeout_ms: u64,
    /// After `quit`, how long the daemon and its servers get to exit.
    pub quit_timeout_ms: u64,
    /// After SIGTERM (and again after SIGKILL), how long leftovers get to die.
    pub kill_timeout_ms: u64,
    /// How long a prolog/epilog waits for another job's hold on a GPU.
    pub lock_timeout_ms: u64,
}

impl Default for MpsConfig {
    fn default() -> Self {
        MpsConfig {
            control: PathBuf::from("/usr/bin/nvidia-cuda-mps-control"),
            start_timeout_ms: 10_000,
            quit_timeout_ms: 5_000,
            kill_timeout_ms: 3_000,
            lock_timeout_ms: 60_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SlurmConfig {
    /// Absolute path of scontrol: helpers run with no PATH.
    pub scontrol: PathBuf,
    /// Drain the node with a `gpu-mode:` reason when a node-level fault is
    /// found. Off only for sites that drain through their own tooling.
    pub drain_on_node_fault: bool,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// Send each action line to syslog (the journal on systemd hosts).
    pub syslog: bool,
    /// Also print each action line on stderr (slurmd logs a failing Prolog's stderr).
    pub stderr: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NvmlConfig {
    /// libnvidia-ml to load; empty means the system's (`libnvidia-ml.so.1`).
    /// The environment variable `GPU_MODE_NVML_LIBRARY` overrides it (tests).
    pub library: Option<PathBuf>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MigConfig {
    /// Named layouts for `--gpu-mode=mig:@<name>`: name → profile list in the
    /// option's own syntax, e.g. `half = "3g.40gbx2"`.
    pub layouts: BTreeMap<String, String>,
}

/// Which GPU settings the helpers may change. Each has a "leave" value that
/// never changes it (e.g. on shared machines where only reads are allowed).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GpuConfig {
    /// Compute mode the prolog sets on an MPS job's GPUs.
    pub mps_compute_mode: ComputeModeSetting,
    /// Compute mode the epilog sets back after a job.
    pub restore_compute_mode: ComputeModeSetting,
    /// Whether MIG mode may be switched on or off for jobs.
    pub mig_mode: MigModeSetting,
    /// Whether MIG instances may be created and destroyed for jobs.
    pub mig_instances: MigInstanceSetting,
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            mps_compute_mode: ComputeModeSetting::ExclusiveProcess,
            restore_compute_mode: ComputeModeSetting::Default,
            mig_mode: MigModeSetting::Switch,
            mig_instances: MigInstanceSetting::Manage,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointConfig {
    /// How long cuCheckpointProcessLock waits for a process's GPU work to drain.
    pub lock_timeout_ms: u32,
    /// Free GPU memory a restore needs beyond the recorded footprint.
    pub memory_margin_mib: u64,
    /// libcuda to load; unset means the system's (`libcuda.so.1`).
    pub cuda_library: Option<PathBuf>,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig { lock_timeout_ms: 10_000, memory_margin_mib: 512, cuda_library: None }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            runtime_dir: PathBuf::from("/run/slurm-gpu-mode"),
            slurm: SlurmConfig::default(),
            log: LogConfig::default(),
            nvml: NvmlConfig::default(),
            mig: MigConfig::default(),
            gpu: GpuConfig::default(),
            checkpoint: CheckpointConfig::default(),
            mps: MpsConfig::default(),
        }
    }
}

impl Default for SlurmConfig {
    fn default() -> Self {
        SlurmConfig { scontrol: PathBuf::from("/usr/bin/scontrol"), drain_on_node_fault: true }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig { syslog: true, stderr: true }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config file {path}: {detail}")]
    Invalid { path: PathBuf, detail: String },
}

impl Config {
    /// Loads `path`, or the default path when `None`. A missing file at the
    /// default path gives the defaults (a site need not write one); a missing
    /// file that was named explicitly is an error.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let (path, explicit) = match path {
            Some(p) => (p.to_path_buf(), true),
            None => (PathBuf::from(DEFAULT_CONFIG_PATH), false),
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => Config::parse(&text, &path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => Ok(Config::default()),
            Err(source) => Err(ConfigError::Read { path, source }),
        }
    }

    /// Parses and validates config text; `path` is only used in messages.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let invalid = |detail: String| ConfigError::Invalid { path: path.to_path_buf(), detail };
        let cfg: Config = toml::from_str(text).map_err(|e| invalid(e.to_string().trim().replace('\n', " ")))?;
        cfg.validate().map_err(invalid)?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), String> {
        require_absolute("runtime_dir", &self.runtime_dir)?;
        require_absolute("slurm.scontrol", &self.slurm.scontrol)?;
        require_absolute("mps.control", &self.mps.control)?;
        for (key, ms) in [
            ("mps.start_timeout_ms", self.mps.start_timeout_ms),
            ("mps.quit_timeout_ms", self.mps.quit_timeout_ms),
            ("mps.kill_timeout_ms", self.mps.kill_timeout_ms),
            ("mps.lock_timeout_ms", self.mps.lock_timeout_ms),
        ] {
            if ms == 0 || ms > 600_000 {
                return Err(format!("{key} = {ms} must be between 1 and 600000 (10 minutes)"));
            }
        }
        if let Some(lib) = &self.nvml.library {
            require_absolute("nvml.library", lib)?;
        }
        if let Some(lib) = &self.checkpoint.cuda_library {
            require_absolute("checkpoint.cuda_library", lib)?;
        }
        if self.checkpoint.lock_timeout_ms == 0 {
            return Err("checkpoint.lock_timeout_ms must be at least 1".into());
        }
        for (name, profiles) in &self.mig.layouts {
            let value = format!("mig:{profiles}");
            match crate::mode::GpuMode::parse(&value) {
                Ok(crate::mode::GpuMode::Mig(crate::mode::MigRequest::Profiles(_))) => {}
                Ok(_) => return Err(format!("mig.layouts.{name}: a layout lists profiles, not another layout")),
                Err(e) => return Err(format!("mig.layouts.{name}: {}", e.problem)),
            }
            crate::mode::GpuMode::parse(&format!("mig:@{name}"))
                .map_err(|e| format!("mig.layouts: bad layout name: {}", e.problem))?;
        }
        Ok(())
    }

    /// The NVML library to load: the environment override, then the config,
    /// then `None` for the system default.
    pub fn nvml_library(&self) -> Option<PathBuf> {
        std::env::var_os("GPU_MODE_NVML_LIBRARY")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| self.nvml.library.clone())
    }
}

/// Paths in the config are used by root helpers with no PATH and no fixed
/// working directory, so relative paths are refused outright.
fn require_absolute(key: &str, path: &Path) -> Result<(), String> {
    if !path.is_absolute() {
        return Err(format!("{key} = {:?} must be an absolute path", path));
    }
    if path.components().any(|c| c == std::path::Component::ParentDir) {
        return Err(format!("{key} = {:?} must not contain '..'", path));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(text, Path::new("/etc/x.toml")).map_err(|e| e.to_string())
    }

    #[test]
    fn empty_file_gives_defaults() {
        assert_eq!(parse("").unwrap(), Config::default());
    }

    #[test]
    fn the_documented_example_config_parses() {
        let text = include_str!("../../etc/config.toml");
        let cfg = parse(text).expect("etc/config.toml must stay valid");
        assert_eq!(cfg.runtime_dir, PathBuf::from("/run/slurm-gpu-mode"));
    }

    #[test]
    fn keys_are_read() {
        let cfg = parse(
            r#"
            runtime_dir = "/var/run/gm"
            [slurm]
            scontrol = "/opt/slurm/bin/scontrol"
            drain_on_node_fault = false
            [log]
            syslog = false
            [nvml]
            library = "/opt/sim/libnvidia-ml.so"
            [mig.layouts]
            half = "3g.40gbx2"
            [checkpoint]
            lock_timeout_ms = 2500
            memory_margin_mib = 64
            cuda_library = "/opt/drv/libcuda.so.1"
            "#,
        )
        .unwrap();
        assert_eq!(cfg.runtime_dir, PathBuf::from("/var/run/gm"));
        assert_eq!(cfg.slurm.scontrol, PathBuf::from("/opt/slurm/bin/scontrol"));
        assert!(!cfg.slurm.drain_on_node_fault);
        assert!(!cfg.log.syslog);
        assert!(cfg.log.stderr);
        assert_eq!(cfg.nvml.library, Some(PathBuf::from("/opt/sim/libnvidia-ml.so")));
        assert_eq!(cfg.mig.layouts["half"], "3g.40gbx2");
        assert_eq!(cfg.checkpoint.lock_timeout_ms, 2500);
        assert_eq!(cfg.checkpoint.memory_margin_mib, 64);
        assert_eq!(cfg.checkpoint.cuda_library, Some(PathBuf::from("/opt/drv/libcuda.so.1")));
        assert_eq!(cfg.gpu, GpuConfig::default());
    }

    #[test]
    fn every_gpu_setter_can_be_left_alone() {
        let cfg = parse(
            "[gpu]\nmps_compute_mode = \"leave\"\nrestore_compute_mode = \"leave\"\n\
             mig_mode = \"leave\"\nmig_instances = \"leave\"",
        )
        .unwrap();
        assert_eq!(cfg.gpu.mps_compute_mode, ComputeModeSetting::Leave);
        assert_eq!(cfg.gpu.restore_compute_mode, ComputeModeSetting::Leave);
        assert_eq!(cfg.gpu.mig_mode, MigModeSetting::Leave);
        assert_eq!(cfg.gpu.mig_instances, MigInstanceSetting::Leave);
        let err = parse("[gpu]\nmps_compute_mode = \"exclusive\"").unwrap_err();
        assert!(err.contains("unknown variant `exclusive`") && err.contains("exclusive_process"), "{err}");
        assert!(parse("[gpu]\nmig = \"leave\"").unwrap_err().contains("unknown field `mig`"));
    }

    #[test]
    fn bad_configs_name_the_problem() {
        let cases = [
            ("runtime_dir = \"run/x\"", "runtime_dir = \"run/x\" must be an absolute path"),
            ("runtime_dir = \"/run/../etc\"", "must not contain '..'"),
            ("[slurm]\nscontrol = \"scontrol\"", "slurm.scontrol"),
            ("runtimedir = \"/x\"", "unknown field `runtimedir`"),
            ("[slurm]\ndrain_on_node_fault = \"yes\"", "invalid type"),
            ("[mig.layouts]\nhalf = \"3g.40gbx9\"", "mig.layouts.half: count 9"),
            ("[mig.layouts]\nx = \"@y\"", "mig.layouts.x: a layout lists profiles"),
            ("[mig.layouts]\n\"bad name\" = \"1g.10gb\"", "bad layout name"),
            ("runtime_dir = ", "/etc/x.toml"),
            ("[checkpoint]\ncuda_library = \"libcuda.so.1\"", "checkpoint.cuda_library"),
            ("[checkpoint]\nlock_timeout_ms = 0", "checkpoint.lock_timeout_ms must be at least 1"),
            ("[mps]\ncontrol = \"nvidia-cuda-mps-control\"", "mps.control"),
            ("[mps]\nquit_timeout_ms = 0", "mps.quit_timeout_ms = 0 must be between 1 and 600000"),
            ("[mps]\nthreads = 5", "unknown field `threads`"),
        ];
        for (text, needle) in cases {
            let err = parse(text).expect_err(text);
            assert!(err.contains(needle), "config {text:?}: {err:?} lacks {needle:?}");
            assert!(err.starts_with("config file /etc/x.toml"), "{err}");
        }
    }

    #[test]
    fn a_missing_file_named_explicitly_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.toml");
        let err = Config::load(Some(&missing)).unwrap_err().to_string();
        assert!(err.contains("cannot read config file") && err.contains("nope.toml"), "{err}");
    }
}
