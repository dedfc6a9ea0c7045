//! `gpu-mode-mig`'s verbs over the site config: which baseline (`[mig]
//! baseline`, or `-c FILE -l NAME`, or `-l @layout`), what the GPUs are,
//! and, at boot, draining the node when the baseline cannot be applied.
//! The binary (mig-tool/) only parses arguments and prints.

use super::plan::{Observed, Settings};
use super::{parted, Baseline, BaselineError, GpuIdentity};
use crate::config::Config;
use crate::drain::{NodeStatus, Scontrol};
use crate::gpu::{GpuError, GpuOps};
use std::path::Path;

/// Every drain reason of the boot unit starts with this (after `gpu-mode: `);
/// the node checker never resumes it, a later successful `apply --boot` does.
pub const DRAIN_DETAIL_PREFIX: &str = "MIG baseline";

/// What `[gpu]` and `[mig]` allow and name.
pub fn settings(cfg: &Config) -> Settings {
    Settings {
        mig_mode: cfg.gpu.mig_mode,
        mig_instances: cfg.gpu.mig_instances,
        services: cfg.mig.services.clone(),
        layout_services: cfg.mig.layout_services.clone(),
    }
}

/// The node's configured baseline: `[mig] baseline` (a `@layout` or a
/// config of `[mig] baseline_config`), else the old `[health]
/// mig_baseline` list, else none. The node checker and `gpu-mode-mig`
/// both call this: one definition.
pub fn configured(cfg: &Config) -> Result<Option<Baseline>, BaselineError> {
    match &cfg.mig.baseline {
        Some(name) => named(cfg, None, name).map(Some),
        None if !cfg.health.mig_baseline.is_empty() => Ok(Some(Baseline::from_profile_names(&cfg.health.mig_baseline))),
        None => Ok(None),
    }
}

/// The baseline the command line names, or the configured one when it
/// names none.
pub fn choose(cfg: &Config, file: Option<&Path>, name: Option<&str>) -> Result<Option<Baseline>, BaselineError> {
    match (file, name) {
        (None, None) => configured(cfg),
        (Some(f), None) => Err(BaselineError::FileWithoutName { file: f.to_path_buf() }),
        (f, Some(n)) => named(cfg, f, n).map(Some),
    }
}

/// `@layout` from `[mig.layouts]`, or config `name` of `file` (or of
/// `[mig] baseline_config`).
fn named(cfg: &Config, file: Option<&Path>, name: &str) -> Result<Baseline, BaselineError> {
    if let Some(layout) = name.strip_prefix('@') {
        if let Some(f) = file {
            return Err(BaselineError::LayoutWithFile { name: name.into(), file: f.to_path_buf() });
        }
        let Some(profiles) = cfg.mig.layouts.get(layout) else {
            let known: Vec<&str> = cfg.mig.layouts.keys().map(String::as_str).collect();
            let known = if known.is_empty() { "none".into() } else { known.join(", ") };
            return Err(BaselineError::UnknownLayout { layout: layout.into(), known });
        };
        return Baseline::from_layout(layout, profiles);
    }
    match file.or(cfg.mig.baseline_config.as_deref()) {
        Some(f) => Ok(parted::load(f, name)?),
        None => Err(BaselineError::NoFile { name: name.into() }),
    }
}

/// Every config name `plan --all` goes through: those of `file`, or the
/// `[mig.layouts]` layouts (as `@name`).
pub fn all_names(cfg: &Config, file: Option<&Path>) -> Result<Vec<String>, parted::PartedError> {
    match file.or(cfg.mig.baseline_config.as_deref()) {
        Some(f) => parted::config_names(&parted::read_checked(f)?, &f.display().to_string()),
        None => Ok(cfg.mig.layouts.keys().map(|k| format!("@{k}")).collect()),
    }
}

/// Reads every GPU, with the processes on it and the live jobs holding it.
pub fn observe(ops: &dyn GpuOps, runtime_dir: &Path) -> Result<Vec<Observed>, GpuError> {
    let jobs = crate::state::live_jobs(runtime_dir);
    (0..ops.count()?).map(|gpu| observe_gpu(ops, gpu, &jobs)).collect()
}

fn observe_gpu(ops: &dyn GpuOps, gpu: u32, jobs: &[crate::state::JobState]) -> Result<Observed, GpuError> {
    let inv = ops.inventory(gpu)?;
    let mig = ops.modes(gpu)?.mig;
    let profiles = if mig.is_some() { ops.mig_profiles(gpu)? } else { Vec::new() };
    let instances = if mig.is_some_and(|m| m.current) { ops.mig_instances(gpu)? } else { Vec::new() };
    Ok(Observed {
        identity: GpuIdentity { index: gpu, pci_device_id: inv.pci_device_id, pci_subsystem_id: inv.pci_subsystem_id },
        uuid: inv.uuid,
        pci_bus_id: inv.pci_bus_id,
        name: inv.name,
        mig,
        profiles,
        instances,
        processes: ops.processes(gpu)?.iter().map(|p| p.pid).collect(),
        jobs: jobs.iter().filter(|j| j.gpus.contains(&gpu)).map(|j| j.job_id).collect(),
    })
}

/// The GPUs' current layout in mig-parted's format, as config `name`.
pub fn export(ops: &dyn GpuOps, name: &str) -> Result<String, GpuError> {
    let mut gpus = Vec::new();
    for gpu in 0..ops.count()? {
        let Some(mig) = ops.modes(gpu)?.mig else { continue };
        let (instances, profiles) = if mig.current { (ops.mig_instances(gpu)?, ops.mig_profiles(gpu)?) } else { (vec![], vec![]) };
        gpus.push(parted::ExportGpu::new(gpu, mig.current, &instances, &profiles));
    }
    let total = gpus.len();
    Ok(parted::export(name, &gpus, total))
}

/// What [`drain_after_failure`] did: `said` for the log line, and the
/// whole reason of a drain it set, which the caller (the verb) remembers
/// and counts (`observe::drain_set`, source `mig-baseline`).
#[derive(Debug, PartialEq, Eq)]
pub struct AfterFailure {
    pub said: String,
    pub drain_set: Option<String>,
}

/// After a failed boot apply: drains the node with `gpu-mode: MIG baseline:
/// <detail>` unless it is already drained or down, or the site drains
/// through its own tooling. When slurmctld cannot be reached the unit still
/// fails and slurmd (ordered after it, `Requires=`) does not start: the
/// node shows as not responding.
pub fn drain_after_failure(cfg: &Config, node: Option<&str>, detail: &str) -> AfterFailure {
    let said = |said: String| AfterFailure { said, drain_set: None };
    if !cfg.slurm.drain_on_node_fault {
        return said("not drained ([slurm] drain_on_node_fault = false)".into());
    }
    let Some(node) = node else { return said("not drained: no node name (pass --node)".into()) };
    let reason = format!("{DRAIN_DETAIL_PREFIX}: {detail}");
    match Scontrol::new(&cfg.slurm.scontrol).drain_unless_drained(node, &reason) {
        Ok(crate::drain::DrainAction::Drained) => {
            AfterFailure { said: format!("node {node} drained"), drain_set: Some(crate::drain::drain_reason(&reason)) }
        }
        Ok(crate::drain::DrainAction::AlreadyDrained { reason }) => said(format!("node {node} was already drained ({reason})")),
        Err(e) => said(format!("node {node} not drained: {e}")),
    }
}

/// After a successful boot apply: resumes the node if the reason it is
/// drained for is this unit's own. Returns what happened, if anything.
pub fn resume_after_success(cfg: &Config, node: Option<&str>) -> Option<String> {
    let node = node?;
    let scontrol = Scontrol::new(&cfg.slurm.scontrol);
    let status = NodeStatus::parse(&scontrol.show_node(node).ok()?);
    let ours = format!("{} {DRAIN_DETAIL_PREFIX}", crate::drain::DRAIN_PREFIX);
    if !status.is_drained_or_down() || !status.reason.starts_with(&ours) {
        return None;
    }
    Some(match scontrol.resume(node) {
        Ok(()) => format!("node {node} resumed (it was drained for: {})", status.reason),
        Err(e) => format!("node {node} not resumed: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(text, std::path::Path::new("/etc/x.toml")).map_err(|e| e.to_string())
    }

    /// The config keys of the MIG baseline and the one definition this
    /// module makes of them (was in config's tests before configuration
    /// became its own crate).
    #[test]
    fn the_mig_baseline_keys_name_one_definition() {
        let cfg = parse("[mig.layouts]\nhalf = \"3g.40gbx2\"\n[mig]\nbaseline = \"@half\"\nservices = [\"slurmd.service\"]").unwrap();
        assert_eq!(cfg.mig.services, ["slurmd.service"]);
        assert_eq!(cfg.mig.layout_services, crate::config::MigConfig::default().layout_services);
        assert_eq!(configured(&cfg).unwrap().unwrap().source, "[mig.layouts] half");
        let old = parse("[health]\nmig_baseline = [\"1g.18gb\", \"1g.18gb\"]").unwrap();
        let b = configured(&old).unwrap().unwrap();
        assert_eq!((b.source.as_str(), b.entries[0].instances["1g.18gb"]), ("[health] mig_baseline", 2), "old configs keep working");
        assert!(configured(&Config::default()).unwrap().is_none());
        let missing = parse("[mig]\nbaseline = \"b\"\nbaseline_config = \"/nonexistent/m.yaml\"").unwrap();
        let err = configured(&missing).unwrap_err();
        assert!(matches!(err, BaselineError::Parted(parted::PartedError::Read { .. })), "{err:?}");
        assert!(err.to_string().starts_with("cannot read mig-parted config /nonexistent/m.yaml"));
    }

    #[test]
    fn the_command_line_names_a_baseline_or_the_config_does() {
        let mut cfg = Config::default();
        cfg.mig.layouts.insert("half".into(), "3g.40gbx2".into());
        let f = Path::new("/nonexistent/m.yaml");
        let err = |file: Option<&Path>, name: Option<&str>| choose(&cfg, file, name).unwrap_err().to_string();
        assert_eq!(err(Some(f), None), "-c /nonexistent/m.yaml needs -l <config name>");
        assert!(err(Some(f), Some("@half")).contains("names a [mig.layouts] layout, not a config of /nonexistent/m.yaml"));
        assert_eq!(err(None, Some("@full")), "no [mig.layouts] layout named \"full\" (layouts: half)");
        assert!(err(None, Some("all-1g")).contains("no file is given: pass -c FILE or set [mig] baseline_config (or write @all-1g"));
        assert!(err(Some(f), Some("all-1g")).starts_with("cannot read mig-parted config /nonexistent/m.yaml"));
        let kinds: [(Option<&Path>, Option<&str>, fn(&BaselineError) -> bool); 5] = [
            (Some(f), None, |e| matches!(e, BaselineError::FileWithoutName { .. })),
            (Some(f), Some("@half"), |e| matches!(e, BaselineError::LayoutWithFile { .. })),
            (None, Some("@full"), |e| matches!(e, BaselineError::UnknownLayout { layout, .. } if layout == "full")),
            (None, Some("all-1g"), |e| matches!(e, BaselineError::NoFile { name } if name == "all-1g")),
            (Some(f), Some("all-1g"), |e| matches!(e, BaselineError::Parted(parted::PartedError::Read { .. }))),
        ];
        for (file, name, kind) in kinds {
            let e = choose(&cfg, file, name).unwrap_err();
            assert!(kind(&e), "{file:?} {name:?}: {e:?}");
        }
        assert_eq!(choose(&cfg, None, Some("@half")).unwrap().unwrap().source, "[mig.layouts] half");
        assert!(choose(&cfg, None, None).unwrap().is_none(), "none configured");
    }
}
