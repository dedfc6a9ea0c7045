//! `[health]`: the node checker's section of the site config, with the
//! names of the checks it may turn off. Configuration is a leaf: the checks
//! (crate::health) read this section, never the other way round.

use crate::fsutil::require_absolute;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Every check by name, in the order they run and are reported. The drain
/// reason names the first failing one. Here, with the section that names
/// them (`health.disabled`); the checks themselves are in crate::health.
pub const CHECK_NAMES: &[&str] =
    &["driver", "gpu_count", "memory", "xid", "pcie", "clocks", "persistence", "fabric", "mps", "criu_locks", "leftovers", "mig", "ckpt_kernel", "ckpt_criu", "ckpt_caps",
      "ckpt_dirs", "ckpt_memory", "ckpt_driver", "deep"];

/// `[health]`: gpu-mode-node-checker's thresholds and files. Defaults follow
/// the practice of DCGM's and gpud's health checks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    /// GPUs this node must have; 0 means "do not compare with a number"
    /// (NVML and sysfs are still compared with each other).
    pub expected_gpus: u32,
    /// Root of sysfs, where NVIDIA PCI devices (vendor 0x10de) are counted.
    pub sysfs_root: PathBuf,
    /// The kernel log the XID check reads (`NVRM: Xid` lines).
    pub kmsg_path: PathBuf,
    /// Cursor and baselines kept between runs (XID position, ECC baselines).
    /// Empty means `<runtime_dir>/health`.
    pub state_dir: Option<PathBuf>,
    /// Retired pages (DBE + SBE) at or above this fail the GPU.
    pub retired_pages_fail: u32,
    /// XIDs that fail the node; XIDs that only warn. Others are ignored
    /// (application XIDs such as 13, 31, 43, 45, 68, 109 are the job's fault).
    pub xid_fail: Vec<u64>,
    pub xid_warn: Vec<u64>,
    /// A temperature within this many degrees of the slowdown threshold warns.
    pub temperature_margin_c: u32,
    /// Clock event reason bits that fail / warn (NVML bits; 0x1 "idle" never counts).
    pub clocks_fail_mask: u64,
    pub clocks_warn_mask: u64,
    /// PCIe link narrower than its maximum: "fail" or "warn". (A lower
    /// generation on an idle GPU is power saving and never counts.)
    pub pcie_width_below_max: Severity,
    /// Require a running nvidia-persistenced (comm `nvidia-persiste`).
    pub require_persistenced: bool,
    /// Deprecated: the old form of `[mig] baseline` (profile names the node
    /// keeps between jobs on every MIG GPU, e.g. "1g.18gb"). Still read, as
    /// that baseline, when `[mig] baseline` is unset.
    pub mig_baseline: Vec<String>,
    /// Whole check run bound (the HealthCheckProgram is killed at 60 s).
    pub deadline_ms: u64,
    /// Prometheus textfile written atomically after each run; unset: none.
    pub prometheus_textfile: Option<PathBuf>,
    /// Checks not run at all (by name, e.g. "fabric").
    pub disabled: Vec<String>,
    /// Run the quick checks in the epilog after teardown (drain/resume as
    /// the HealthCheckProgram would). Off by default: it adds an NVML
    /// round trip to every job's end.
    pub after_epilog: bool,
    pub deep: DeepConfig,
}

/// `[health.deep]`: the opt-in `--deep` CUDA checks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeepConfig {
    /// Time to the first CUDA context above this fails (a de-initialized GPU
    /// costs 1-3 s: persistence is off).
    pub context_ms_max: u64,
    /// Memory written and read back with a pattern, per GPU.
    pub memory_mib: u64,
    /// Device-to-device copy bandwidth floor in GB/s, per model name
    /// substring (e.g. "H100" = 1500); models not listed are not judged.
    pub bandwidth_floor_gbps: BTreeMap<String, f64>,
}

impl Default for DeepConfig {
    fn default() -> Self {
        let floors = [("H100", 1500.0), ("H200", 1800.0), ("A100", 800.0)];
        DeepConfig {
            context_ms_max: 1000,
            memory_mib: 1024,
            bandwidth_floor_gbps: floors.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        }
    }
}

/// How bad a condition is where a site may choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Fail,
    Warn,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            expected_gpus: 0,
            sysfs_root: PathBuf::from("/sys"),
            kmsg_path: PathBuf::from("/dev/kmsg"),
            state_dir: None,
            retired_pages_fail: 63,
            xid_fail: vec![48, 74, 79, 95, 119, 120, 140],
            xid_warn: vec![63, 94],
            temperature_margin_c: 5,
            // HW slowdown, HW thermal slowdown, HW power brake.
            clocks_fail_mask: 0x8 | 0x40 | 0x80,
            // SW thermal slowdown.
            clocks_warn_mask: 0x20,
            pcie_width_below_max: Severity::Fail,
            require_persistenced: true,
            mig_baseline: Vec::new(),
            deadline_ms: 30_000,
            prometheus_textfile: None,
            disabled: Vec::new(),
            after_epilog: false,
            deep: DeepConfig::default(),
        }
    }
}

impl HealthConfig {
    /// Where the checker keeps its cursor between runs.
    pub fn state_dir(&self, runtime_dir: &Path) -> PathBuf {
        self.state_dir.clone().unwrap_or_else(|| runtime_dir.join("health"))
    }

    /// Checks the section; the error names the key.
    pub fn validate(&self) -> Result<(), String> {
        let h = self;
        require_absolute("health.sysfs_root", &h.sysfs_root)?;
        require_absolute("health.kmsg_path", &h.kmsg_path)?;
        for (key, p) in [("health.state_dir", &h.state_dir), ("health.prometheus_textfile", &h.prometheus_textfile)] {
            if let Some(p) = p {
                require_absolute(key, p)?;
            }
        }
        // Leaves room for two scontrol calls before slurmd's 60 s kill.
        if h.deadline_ms == 0 || h.deadline_ms > 40_000 {
            return Err(format!("health.deadline_ms = {} must be between 1 and 40000", h.deadline_ms));
        }
        if h.deep.memory_mib == 0 || h.deep.context_ms_max == 0 {
            return Err("health.deep.memory_mib and health.deep.context_ms_max must be at least 1".into());
        }
        for (model, floor) in &h.deep.bandwidth_floor_gbps {
            // NaN compares false with everything: it would pass every GPU.
            if !floor.is_finite() || *floor <= 0.0 {
                return Err(format!("health.deep.bandwidth_floor_gbps.{model} = {floor} must be a positive number of GB/s"));
            }
        }
        for name in &h.disabled {
            if !CHECK_NAMES.contains(&name.as_str()) {
                return Err(format!("health.disabled: no check named {name:?}; checks: {}", CHECK_NAMES.join(", ")));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_mode_testkit::table::check_row;

    /// `[health]` as the site config holds it, read the way the config
    /// file reads it (unknown keys refused, the rest defaulted).
    fn section(toml_text: &str) -> Result<HealthConfig, String> {
        toml::from_str::<HealthConfig>(toml_text).map_err(|e| e.to_string())
    }

    #[test]
    fn the_section_is_checked_key_by_key() {
        // (what, [health] text, the error's part; None: valid)
        let cases: &[(&str, &str, Option<&str>)] = &[
            ("empty: the defaults", "", None),
            ("every path absolute", "sysfs_root = \"/host/sys\"\nstate_dir = \"/var/lib/gm\"\nprometheus_textfile = \"/var/lib/ne/gm.prom\"", None),
            ("a relative sysfs", "sysfs_root = \"sys\"", Some("health.sysfs_root = \"sys\" must be an absolute path")),
            ("kmsg through ..", "kmsg_path = \"/dev/../tmp/kmsg\"", Some("health.kmsg_path = \"/dev/../tmp/kmsg\" must not contain '..'")),
            ("a relative state dir", "state_dir = \"health\"", Some("health.state_dir = \"health\" must be an absolute path")),
            ("a relative textfile", "prometheus_textfile = \"gm.prom\"", Some("health.prometheus_textfile = \"gm.prom\" must be an absolute path")),
            ("no deadline", "deadline_ms = 0", Some("health.deadline_ms = 0 must be between 1 and 40000")),
            ("the longest deadline", "deadline_ms = 40000", None),
            ("past slurmd's kill", "deadline_ms = 40001", Some("health.deadline_ms = 40001 must be between 1 and 40000")),
            ("no deep memory", "[deep]\nmemory_mib = 0", Some("health.deep.memory_mib and health.deep.context_ms_max must be at least 1")),
            ("no context time", "[deep]\ncontext_ms_max = 0", Some("must be at least 1")),
            ("a floor of zero", "[deep.bandwidth_floor_gbps]\nL40S = 0.0", Some("health.deep.bandwidth_floor_gbps.L40S = 0 must be a positive number of GB/s")),
            ("a NaN floor", "[deep.bandwidth_floor_gbps]\nL40S = nan", Some("bandwidth_floor_gbps.L40S = NaN must be")),
            ("an infinite floor", "[deep.bandwidth_floor_gbps]\nL40S = inf", Some("bandwidth_floor_gbps.L40S = inf must be")),
            ("known checks disabled", "disabled = [\"fabric\", \"deep\"]", None),
            ("an unknown check disabled", "disabled = [\"fabrics\"]", Some("health.disabled: no check named \"fabrics\"; checks: driver, gpu_count,")),
            ("an unknown key", "xid_fatal = [48]", Some("unknown field `xid_fatal`")),
            ("an unknown deep key", "[deep]\nmemory_gib = 1", Some("unknown field `memory_gib`")),
            ("a severity that is neither", "pcie_width_below_max = \"ignore\"", Some("unknown variant `ignore`")),
        ];
        for (what, text, want) in cases {
            check_row(what, section(text).and_then(|h| h.validate()), want.map_or(Ok(()), Err));
        }
    }

    #[test]
    fn keys_left_out_keep_their_defaults_and_a_deep_table_replaces_the_floors() {
        let h = section("expected_gpus = 8\npcie_width_below_max = \"warn\"\n[deep.bandwidth_floor_gbps]\nL40S = 400.0").unwrap();
        assert_eq!((h.expected_gpus, h.pcie_width_below_max), (8, Severity::Warn));
        assert_eq!((h.retired_pages_fail, h.deadline_ms, h.require_persistenced), (63, 30_000, true));
        assert_eq!(h.xid_fail, vec![48, 74, 79, 95, 119, 120, 140]);
        assert_eq!((h.clocks_fail_mask, h.clocks_warn_mask), (0xc8, 0x20), "HW slowdown, thermal, power brake fail; SW thermal warns");
        // A site's floors are the whole table: H100's default is gone.
        assert_eq!(h.deep.bandwidth_floor_gbps, [("L40S".to_string(), 400.0)].into());
        assert_eq!((h.deep.memory_mib, h.deep.context_ms_max), (1024, 1000));
    }

    #[test]
    fn the_cursor_lives_in_the_state_dir_or_under_the_runtime_dir() {
        let runtime = Path::new("/run/slurm-gpu-mode");
        let cases: &[(Option<&str>, &str)] = &[(None, "/run/slurm-gpu-mode/health"), (Some("/var/lib/gm-health"), "/var/lib/gm-health")];
        for (state_dir, want) in cases {
            let h = HealthConfig { state_dir: state_dir.map(PathBuf::from), ..HealthConfig::default() };
            assert_eq!(h.state_dir(runtime), Path::new(want), "{state_dir:?}");
        }
    }
}
