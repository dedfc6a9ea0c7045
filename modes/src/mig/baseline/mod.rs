//! The node's MIG baseline: the MIG mode and instances each GPU keeps
//! between jobs, applied at boot by `gpu-mode-mig apply` (the
//! gpu-mode-mig-baseline.service unit) and checked by the node checker's
//! stale-MIG check. One definition, [`Baseline`], for both.
//!
//! A baseline comes from a mig-parted config file ([`parted`]: sites keep
//! their nvidia-mig-parted files) or from a `[mig.layouts]` layout of the
//! site config (every MIG-capable GPU gets the layout). The rest:
//!
//! * [`plan`]: what `apply` would do on each GPU, decided from what NVML
//!   reports (pure; `plan` and `assert` print it);
//! * [`apply`]: carries a plan out through `GpuOps`, with the services
//!   stopped around MIG mode changes ([`services`]);
//! * [`tool`]: the `gpu-mode-mig` verbs over the site config.
//!
//! This module and [`parted`] import neither the config nor the health
//! checks: health takes a [`Baseline`] through its snapshot sources.

pub mod apply;
pub mod parted;
pub mod plan;
pub mod services;
pub mod tool;
#[cfg(test)]
mod apply_tests;
#[cfg(test)]
pub(crate) mod fake;

use crate::gpu::{MigInstance, MigProfile};
use crate::gpu_mode::{GpuMode, MigRequest};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Why no baseline could be chosen (the command line, `[mig]`, the
/// mig-parted file, a `[mig.layouts]` layout), or why one does not fit
/// this node's GPUs. `baseline` fields are [`Baseline::source`].
#[derive(Debug, thiserror::Error)]
pub enum BaselineError {
    #[error(transparent)]
    Parted(#[from] parted::PartedError),
    /// `problem`: what the `mig:` parser said of the layout.
    #[error("{baseline}: {problem}")]
    Layout { baseline: String, problem: String },
    #[error("{baseline}: a layout lists profiles, not another layout")]
    LayoutOfLayout { baseline: String },
    /// mig-parted would apply both entries in turn.
    #[error("{baseline}: GPU {gpu} is matched by entries {first} and {second}")]
    TwoEntries { baseline: String, gpu: u32, first: usize, second: usize },
    #[error("{baseline}: entry {entry} names GPU {gpu}, but this node has {count} GPU(s) (0-{})", .count.saturating_sub(1))]
    NoSuchGpu { baseline: String, entry: usize, gpu: u32, count: u32 },
    #[error("-c {} needs -l <config name>", .file.display())]
    FileWithoutName { file: PathBuf },
    #[error("-l {name} names a [mig.layouts] layout, not a config of {}", .file.display())]
    LayoutWithFile { name: String, file: PathBuf },
    /// `known`: the layouts there are, or `none`.
    #[error("no [mig.layouts] layout named \"{layout}\" (layouts: {known})")]
    UnknownLayout { layout: String, known: String },
    #[error("\"{name}\" names a mig-parted config, but no file is given: pass -c FILE or set [mig] baseline_config (or write @{name} for a [mig.layouts] layout)")]
    NoFile { name: String },
}

/// Where a baseline came from, for messages: `mig-parted config "x" in
/// /etc/...yaml` or `[mig.layouts] half`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Baseline {
    pub source: String,
    /// Applied in order; a GPU matched by two entries is an error.
    pub entries: Vec<Entry>,
}

/// One mig-parted `mig-configs.<name>[i]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub devices: Devices,
    /// mig-parted `device-filter`: PCI ids; empty matches every GPU.
    pub filter: Vec<DeviceFilter>,
    pub mig_enabled: bool,
    /// Profile name (NVIDIA's, e.g. `1g.10gb`) → count, counts above 0.
    pub instances: BTreeMap<String, u32>,
}

/// mig-parted `devices`: `all`, or NVML indices (PCI bus order, as
/// nvidia-smi and mig-parted number GPUs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Devices {
    All,
    Indices(Vec<u32>),
}

/// A `device-filter` item: `0xDDDDVVVV` (device, vendor), optionally with
/// `:0xSSSSssss` (subsystem device, subsystem vendor).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceFilter {
    pub device: u32,
    pub subsystem: Option<u32>,
}

/// What the baseline wants on one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuTarget {
    pub mig_enabled: bool,
    pub instances: BTreeMap<String, u32>,
    /// The GPU was named by index (not `devices: all`): a GPU without MIG
    /// is then an error rather than skipped, as mig-parted does.
    pub explicit: bool,
    /// 1-based entry number, for messages.
    pub entry: usize,
}

/// What a GPU is, for matching entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuIdentity {
    pub index: u32,
    pub pci_device_id: u32,
    pub pci_subsystem_id: u32,
}

impl DeviceFilter {
    fn matches(&self, gpu: &GpuIdentity) -> bool {
        let subsystem = match self.subsystem {
            Some(s) => s == gpu.pci_subsystem_id,
            None => true,
        };
        self.device == gpu.pci_device_id && subsystem
    }
}

impl Entry {
    fn matches(&self, gpu: &GpuIdentity) -> bool {
        let filtered = self.filter.is_empty() || self.filter.iter().any(|f| f.matches(gpu));
        let listed = match &self.devices {
            Devices::All => true,
            Devices::Indices(list) => list.contains(&gpu.index),
        };
        filtered && listed
    }
}

impl Baseline {
    /// A `[mig.layouts]` layout (`"3g.40gbx2,1g.10gb"`) on every MIG-capable GPU.
    pub fn from_layout(name: &str, profiles: &str) -> Result<Baseline, BaselineError> {
        let source = format!("[mig.layouts] {name}");
        let list = match GpuMode::parse(&format!("mig:{profiles}")) {
            Ok(GpuMode::Mig(MigRequest::Profiles(list))) => list,
            Ok(_) => return Err(BaselineError::LayoutOfLayout { baseline: source }),
            Err(e) => return Err(BaselineError::Layout { baseline: source, problem: e.problem }),
        };
        let instances = list.iter().map(|p| (p.profile.to_string(), u32::from(p.count))).collect();
        Ok(Baseline { source, entries: vec![Entry { devices: Devices::All, filter: vec![], mig_enabled: true, instances }] })
    }

    /// The old `[health] mig_baseline` list of profile names: those
    /// instances on every MIG-capable GPU.
    pub fn from_profile_names(names: &[String]) -> Baseline {
        let mut instances = BTreeMap::new();
        for n in names {
            *instances.entry(n.clone()).or_insert(0) += 1;
        }
        let entry = Entry { devices: Devices::All, filter: vec![], mig_enabled: true, instances };
        Baseline { source: "[health] mig_baseline".into(), entries: vec![entry] }
    }

    /// The entry for `gpu`; `None` when no entry names it (the baseline then
    /// leaves it alone). Two matching entries are an error: mig-parted would
    /// apply both in turn, which is never what a site means.
    pub fn target_for(&self, gpu: &GpuIdentity) -> Result<Option<GpuTarget>, BaselineError> {
        let mut found: Option<GpuTarget> = None;
        for (i, e) in self.entries.iter().enumerate().filter(|(_, e)| e.matches(gpu)) {
            if let Some(first) = &found {
                return Err(BaselineError::TwoEntries { baseline: self.source.clone(), gpu: gpu.index, first: first.entry, second: i + 1 });
            }
            let explicit = matches!(e.devices, Devices::Indices(_));
            found = Some(GpuTarget { mig_enabled: e.mig_enabled, instances: e.instances.clone(), explicit, entry: i + 1 });
        }
        Ok(found)
    }

    /// Entries naming GPU indices this node does not have.
    pub fn check_indices(&self, gpu_count: u32) -> Result<(), BaselineError> {
        for (i, e) in self.entries.iter().enumerate() {
            if let Devices::Indices(list) = &e.devices {
                if let Some(&gpu) = list.iter().find(|&&g| g >= gpu_count) {
                    return Err(BaselineError::NoSuchGpu { baseline: self.source.clone(), entry: i + 1, gpu, count: gpu_count });
                }
            }
        }
        Ok(())
    }
}

/// A GPU's instances sorted into the baseline's and the others.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    /// GPU instance ids that are the baseline's.
    pub baseline: Vec<u32>,
    /// GPU instance ids owned by jobs (as given).
    pub jobs: Vec<u32>,
    /// Neither: stale, or a job's that no grant records.
    pub other: Vec<u32>,
    /// Baseline instances that are not there: (profile name, how many).
    pub missing: Vec<(String, u32)>,
}

/// Which instances on one GPU belong to the baseline. Instances that a job
/// owns (`job_owned`, GI ids from the job grants) are set aside first; of the
/// rest, each baseline profile claims up to its count, lowest GI id first
/// (placements are not compared: a baseline is a multiset, as in mig-parted).
/// `target` is [`Baseline::target_for`] of the GPU; `None` (no entry) or a
/// MIG-disabled target means no baseline instances. Per-job MIG asks this to
/// know what it must never destroy and what a layout must fit around.
pub fn split_instances(target: Option<&GpuTarget>, instances: &[MigInstance], profiles: &[MigProfile], job_owned: &[u32]) -> Split {
    let mut want: BTreeMap<String, u32> = match target {
        Some(t) if t.mig_enabled => t.instances.clone(),
        _ => BTreeMap::new(),
    };
    let mut sorted: Vec<&MigInstance> = instances.iter().collect();
    sorted.sort_by_key(|i| i.gpu_instance);
    let mut split = Split::default();
    for i in sorted {
        if job_owned.contains(&i.gpu_instance) {
            split.jobs.push(i.gpu_instance);
            continue;
        }
        match want.get_mut(&profile_name(profiles, i.profile_id)) {
            Some(n) if *n > 0 => {
                *n -= 1;
                split.baseline.push(i.gpu_instance);
            }
            _ => split.other.push(i.gpu_instance),
        }
    }
    split.missing = want.into_iter().filter(|(_, n)| *n > 0).collect();
    split
}

/// A profile's name by id, or `profile <id>` for one the table lacks.
pub fn profile_name(profiles: &[MigProfile], id: u32) -> String {
    profiles.iter().find(|p| p.id == id).map_or_else(|| format!("profile {id}"), |p| p.name.clone())
}

/// `2x 1g.10gb, 1x 3g.40gb` (or `none`).
pub fn describe(instances: &BTreeMap<String, u32>) -> String {
    if instances.is_empty() {
        return "none".into();
    }
    instances.iter().map(|(p, n)| format!("{n}x {p}")).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::placement::tests::h100;

    fn gpu(index: u32) -> GpuIdentity {
        GpuIdentity { index, pci_device_id: 0x2330_10de, pci_subsystem_id: 0x16c1_10de }
    }

    fn entry(devices: Devices, filter: Vec<DeviceFilter>, list: &[(&str, u32)]) -> Entry {
        Entry { devices, filter, mig_enabled: true, instances: list.iter().map(|(p, n)| (p.to_string(), *n)).collect() }
    }

    #[test]
    fn entries_match_by_index_and_pci_filter() {
        let h100 = DeviceFilter { device: 0x2330_10de, subsystem: None };
        let other_board = DeviceFilter { device: 0x2330_10de, subsystem: Some(0x1111_10de) };
        let a100 = DeviceFilter { device: 0x20b2_10de, subsystem: None };
        let b = Baseline {
            source: "t".into(),
            entries: vec![
                entry(Devices::Indices(vec![0]), vec![], &[("7g.80gb", 1)]),
                entry(Devices::All, vec![a100], &[("1g.10gb", 7)]),
                entry(Devices::Indices(vec![1, 2]), vec![h100], &[("3g.40gb", 2)]),
                entry(Devices::Indices(vec![3]), vec![other_board], &[]),
            ],
        };
        let entry_of = |i| b.target_for(&gpu(i)).unwrap().map(|t| (t.entry, t.explicit));
        assert_eq!(entry_of(0), Some((1, true)));
        assert_eq!(entry_of(2), Some((3, true)));
        assert_eq!(entry_of(3), None, "subsystem differs");
        assert_eq!(entry_of(4), None, "no entry names GPU 4");
        let both = Baseline { source: "cfg".into(), entries: vec![entry(Devices::All, vec![], &[]), entry(Devices::Indices(vec![1]), vec![], &[])] };
        let two = both.target_for(&gpu(1)).unwrap_err();
        assert!(matches!(two, BaselineError::TwoEntries { gpu: 1, first: 1, second: 2, .. }), "{two:?}");
        assert_eq!(two.to_string(), "cfg: GPU 1 is matched by entries 1 and 2");
        let missing = b.check_indices(2).unwrap_err();
        assert!(matches!(missing, BaselineError::NoSuchGpu { entry: 3, gpu: 2, count: 2, .. }), "{missing:?}");
        assert_eq!(missing.to_string(), "t: entry 3 names GPU 2, but this node has 2 GPU(s) (0-1)");
        assert!(b.check_indices(4).is_ok());
    }

    #[test]
    fn layouts_and_old_profile_lists_become_baselines() {
        let b = Baseline::from_layout("half", "3g.40gbx2,1g.10gb").unwrap();
        assert_eq!(b.source, "[mig.layouts] half");
        let t = b.target_for(&gpu(5)).unwrap().unwrap();
        assert!(t.mig_enabled && !t.explicit);
        assert_eq!(describe(&t.instances), "1x 1g.10gb, 2x 3g.40gb");
        let err = Baseline::from_layout("x", "3g.40gbx9").unwrap_err();
        assert!(matches!(&err, BaselineError::Layout { baseline, .. } if baseline == "[mig.layouts] x"), "{err:?}");
        assert!(err.to_string().contains("[mig.layouts] x: count 9"));
        let err = Baseline::from_layout("x", "@half").unwrap_err();
        assert!(matches!(err, BaselineError::LayoutOfLayout { .. }), "{err:?}");
        assert_eq!(err.to_string(), "[mig.layouts] x: a layout lists profiles, not another layout");
        let old = Baseline::from_profile_names(&["1g.18gb".into(), "1g.18gb".into()]);
        assert_eq!(describe(&old.entries[0].instances), "2x 1g.18gb");
    }

    fn inst(gi: u32, profile_id: u32) -> MigInstance {
        MigInstance { gpu_instance: gi, profile_id, placement_start: 0, placement_size: 1, compute_instances: vec![] }
    }

    #[test]
    fn instances_split_into_baseline_jobs_and_stale() {
        let t = h100();
        let target = GpuTarget {
            mig_enabled: true,
            instances: [("1g.10gb".to_string(), 2), ("3g.40gb".to_string(), 1)].into(),
            explicit: false,
            entry: 1,
        };
        // (instances (gi, profile id), job-owned GIs) -> baseline, jobs, other, missing
        type Case = (Vec<(u32, u32)>, Vec<u32>, Vec<u32>, Vec<u32>, Vec<u32>, Vec<(&'static str, u32)>);
        let cases: Vec<Case> = vec![
            (vec![(1, 19), (2, 19), (3, 9)], vec![], vec![1, 2, 3], vec![], vec![], vec![]),
            (vec![(3, 19), (1, 19), (2, 19)], vec![], vec![1, 2], vec![], vec![3], vec![("3g.40gb", 1)]),
            (vec![(1, 19), (2, 19), (5, 19)], vec![1], vec![2, 5], vec![1], vec![], vec![("3g.40gb", 1)]),
            (vec![(4, 0)], vec![], vec![], vec![], vec![4], vec![("1g.10gb", 2), ("3g.40gb", 1)]),
            (vec![], vec![], vec![], vec![], vec![], vec![("1g.10gb", 2), ("3g.40gb", 1)]),
        ];
        for (list, jobs, baseline, owned, other, missing) in cases {
            let insts: Vec<MigInstance> = list.iter().map(|(g, p)| inst(*g, *p)).collect();
            let s = split_instances(Some(&target), &insts, &t, &jobs);
            let missing: Vec<(String, u32)> = missing.iter().map(|(p, n)| (p.to_string(), *n)).collect();
            assert_eq!((s.baseline, s.jobs, s.other, s.missing), (baseline, owned, other, missing), "{list:?}");
        }
        let none = split_instances(None, &[inst(1, 19)], &t, &[]);
        assert_eq!((none.baseline, none.other), (vec![], vec![1]));
    }
}
