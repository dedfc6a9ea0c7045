//! What `gpu-mode-mig apply` would do, decided from what NVML reports and
//! nothing else: a pure function, so `plan` and `assert` print exactly what
//! `apply` then carries out, and every decision has a table test.
//!
//! A GPU already matches its baseline entry when its MIG mode (current and
//! pending) is the wanted one and its instances are the wanted *multiset* of
//! profiles. Placements are not compared, as in mig-parted: a layout made
//! by hand or by mig-parted counts, and apply never recreates instances
//! (that jobs may be using) only to move them. When a GPU differs, the
//! instances that are part of the baseline are kept, the others destroyed,
//! and the missing ones placed around the kept ones by the placement solver
//! (every instance is created at an explicit slice); when they cannot be
//! placed around them, the whole GPU is cleared and the layout placed anew.

use super::{describe, profile_name, split_instances, Baseline, GpuIdentity, GpuTarget};
use crate::gpu::{MigInstance, MigInstanceSetting, MigModeSetting, MigModes, MigProfile};
use crate::mig::placement::{compute_slices, place, suggest, Occupied, Placed};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// One GPU as read before planning.
#[derive(Debug, Clone)]
pub struct Observed {
    pub identity: GpuIdentity,
    pub uuid: String,
    pub pci_bus_id: String,
    pub name: String,
    /// `None`: the GPU has no MIG mode.
    pub mig: Option<MigModes>,
    pub profiles: Vec<MigProfile>,
    pub instances: Vec<MigInstance>,
    /// Processes on the GPU (pids).
    pub processes: Vec<u32>,
    /// Live jobs whose state lists the GPU.
    pub jobs: Vec<u32>,
}

/// What the site config allows.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `[gpu] mig_mode`.
    pub mig_mode: MigModeSetting,
    /// `[gpu] mig_instances`.
    pub mig_instances: MigInstanceSetting,
    /// `[mig] services`: stopped around MIG mode changes (GPU resets).
    pub services: Vec<String>,
    /// `[mig] layout_services`: stopped around instance changes alone.
    pub layout_services: Vec<String>,
}

/// An instance apply destroys or keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Existing {
    pub gpu_instance: u32,
    pub profile: String,
    pub start: u32,
}

#[derive(Debug, Clone, Default)]
pub struct GpuPlan {
    pub gpu: u32,
    pub uuid: String,
    pub pci_bus_id: String,
    pub name: String,
    pub target: Option<GpuTarget>,
    /// Why apply leaves the GPU alone (no entry names it, no MIG).
    pub skipped: Option<String>,
    /// How the GPU differs from the baseline (empty: it matches).
    pub differs: Vec<String>,
    /// Switch MIG mode to this.
    pub mode: Option<bool>,
    pub destroy: Vec<Existing>,
    pub keep: Vec<Existing>,
    pub create: Vec<Placed>,
    /// Why apply must not touch the node (nothing is changed then).
    pub problems: Vec<String>,
}

#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub source: String,
    pub gpus: Vec<GpuPlan>,
    /// Problems of the node as a whole (an entry naming a missing GPU).
    pub problems: Vec<String>,
    /// Units stopped before the changes (in this order) and started after
    /// them in reverse order; only those active at the time are touched.
    pub services: Vec<String>,
}

impl GpuPlan {
    pub fn changes(&self) -> bool {
        self.mode.is_some() || !self.destroy.is_empty() || !self.create.is_empty()
    }
}

impl Plan {
    /// Every problem, GPU problems prefixed with their GPU.
    pub fn problems(&self) -> Vec<String> {
        let per_gpu = self.gpus.iter().flat_map(|g| g.problems.iter().map(move |p| format!("GPU {}: {p}", g.gpu)));
        self.problems.iter().cloned().chain(per_gpu).collect()
    }

    pub fn changes(&self) -> bool {
        self.gpus.iter().any(GpuPlan::changes)
    }

    /// Whether every GPU the baseline names already matches it.
    pub fn matches(&self) -> bool {
        self.problems.is_empty() && self.gpus.iter().all(|g| g.differs.is_empty())
    }
}

/// Decides what apply does on every GPU.
pub fn plan(baseline: &Baseline, observed: &[Observed], settings: &Settings) -> Plan {
    let mut plan = Plan { source: baseline.source.clone(), ..Plan::default() };
    if let Err(e) = baseline.check_indices(observed.len() as u32) {
        plan.problems.push(e.to_string());
    }
    for o in observed {
        let g = match baseline.target_for(&o.identity) {
            Ok(target) => plan_gpu(o, target, settings),
            Err(e) => GpuPlan { problems: vec![e.to_string()], differs: vec![e.to_string()], ..blank(o) },
        };
        plan.gpus.push(g);
    }
    plan.services = services_for(&plan, settings);
    plan
}

fn blank(o: &Observed) -> GpuPlan {
    GpuPlan {
        gpu: o.identity.index,
        uuid: o.uuid.clone(),
        pci_bus_id: o.pci_bus_id.clone(),
        name: o.name.clone(),
        ..GpuPlan::default()
    }
}

fn on_off(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

fn plan_gpu(o: &Observed, target: Option<GpuTarget>, settings: &Settings) -> GpuPlan {
    let mut g = blank(o);
    let Some(t) = target else {
        g.skipped = Some("no entry of the baseline names it".into());
        return g;
    };
    g.target = Some(t.clone());
    let Some(mig) = o.mig else {
        if t.explicit && t.mig_enabled {
            let e = format!("{} has no MIG mode, but entry {} enables MIG on it", o.name, t.entry);
            g.differs.push(e.clone());
            g.problems.push(e);
        } else {
            g.skipped = Some(format!("{} has no MIG mode", o.name));
        }
        return g;
    };
    if mig.current != t.mig_enabled || mig.pending != t.mig_enabled {
        let pending = if mig.pending != mig.current { format!(" ({} after the next reset)", on_off(mig.pending)) } else { String::new() };
        g.differs.push(format!("MIG is {}{pending}, the baseline wants it {}", on_off(mig.current), on_off(t.mig_enabled)));
        g.mode = Some(t.mig_enabled);
    }
    if t.mig_enabled {
        plan_instances(o, &t, mig.current, &mut g);
    } else if mig.current {
        g.destroy = o.instances.iter().map(|i| existing(o, i)).collect();
    }
    check_allowed(o, settings, &mut g);
    g
}

fn existing(o: &Observed, i: &MigInstance) -> Existing {
    Existing { gpu_instance: i.gpu_instance, profile: profile_name(&o.profiles, i.profile_id), start: i.placement_start }
}

/// The wanted profiles in the GPU's table; unknown names are problems.
fn resolve<'a>(o: &'a Observed, t: &GpuTarget, g: &mut GpuPlan) -> Option<Vec<(&'a MigProfile, u32)>> {
    let mut want = Vec::new();
    for (name, n) in &t.instances {
        match o.profiles.iter().find(|p| &p.name == name) {
            Some(p) => want.push((p, *n)),
            None => {
                let offered: Vec<&str> = o.profiles.iter().map(|p| p.name.as_str()).collect();
                let e = format!("profile {name} (entry {}) is not offered by {}; its profiles: {}", t.entry, o.name, offered.join(", "));
                g.differs.push(e.clone());
                g.problems.push(e);
            }
        }
    }
    g.problems.is_empty().then_some(want)
}

/// Instances for a MIG-on target. Across a mode change (or with MIG off)
/// the GPU starts empty: a reset destroys instances, so whatever is there
/// goes first and the whole layout is placed.
fn plan_instances(o: &Observed, t: &GpuTarget, mig_on: bool, g: &mut GpuPlan) {
    let Some(want) = resolve(o, t, g) else { return };
    let total = compute_slices(&o.profiles);
    let current: &[MigInstance] = if mig_on { &o.instances } else { &[] };
    if g.mode.is_some() {
        g.destroy = current.iter().map(|i| existing(o, i)).collect();
        match place(&want, &Occupied::default(), total) {
            Some(placed) => g.create = placed,
            None => g.problems.push(does_not_fit(o, t, &want, total)),
        }
        return;
    }
    let split = split_instances(Some(t), current, &o.profiles, &[]);
    let kept: Vec<&MigInstance> = split.baseline.iter().filter_map(|gi| current.iter().find(|i| i.gpu_instance == *gi)).collect();
    g.keep = kept.iter().map(|i| existing(o, i)).collect();
    if split.other.is_empty() && split.missing.is_empty() {
        return;
    }
    let have = super::parted::ExportGpu::new(o.identity.index, true, current, &o.profiles).instances;
    g.differs.push(format!("instances: {}, the baseline wants {}", describe(&have), describe(&t.instances)));
    let missing: Vec<(&MigProfile, u32)> =
        split.missing.iter().filter_map(|(name, n)| Some((o.profiles.iter().find(|p| &p.name == name)?, *n))).collect();
    if let Some(placed) = place(&missing, &occupied(&kept, &o.profiles), total) {
        g.destroy = split.other.iter().filter_map(|gi| current.iter().find(|i| i.gpu_instance == *gi)).map(|i| existing(o, i)).collect();
        g.create = placed;
        return;
    }
    // The kept instances block the rest: start over on an empty GPU.
    g.keep.clear();
    match place(&want, &Occupied::default(), total) {
        Some(placed) => {
            g.destroy = current.iter().map(|i| existing(o, i)).collect();
            g.create = placed;
        }
        None => g.problems.push(does_not_fit(o, t, &want, total)),
    }
}

fn does_not_fit(o: &Observed, t: &GpuTarget, want: &[(&MigProfile, u32)], total: u32) -> String {
    let hint = match suggest(want, total) {
        Some(s) => {
            let m: BTreeMap<String, u32> = s.into_iter().collect();
            format!("; a layout that fits: {}", describe(&m))
        }
        None => String::new(),
    };
    format!("{} (entry {}) does not fit the {}: no placement of these instances exists{hint}", describe(&t.instances), t.entry, o.name)
}

/// What kept instances take from the GPU, for the solver.
pub fn occupied(kept: &[&MigInstance], profiles: &[MigProfile]) -> Occupied {
    let mut o = Occupied::default();
    for i in kept {
        o.ranges.push((i.placement_start, i.placement_size));
        let p = profiles.iter().find(|p| p.id == i.profile_id);
        o.compute += p.map_or(0, |p| p.slices);
        match o.per_profile.iter_mut().find(|(id, _)| *id == i.profile_id) {
            Some((_, n)) => *n += 1,
            None => o.per_profile.push((i.profile_id, 1)),
        }
    }
    o
}

/// The leave settings and whatever holds the GPU, for a GPU that changes.
fn check_allowed(o: &Observed, settings: &Settings, g: &mut GpuPlan) {
    if let Some(want) = g.mode.filter(|_| settings.mig_mode == MigModeSetting::Leave) {
        g.problems.push(format!("MIG would have to be switched {}, but [gpu] mig_mode = \"leave\"", on_off(want)));
    }
    let instances_change = !g.destroy.is_empty() || !g.create.is_empty();
    if instances_change && settings.mig_instances == MigInstanceSetting::Leave {
        g.problems.push("MIG instances would have to be destroyed or created, but [gpu] mig_instances = \"leave\"".into());
    }
    if !g.changes() {
        return;
    }
    if !o.jobs.is_empty() {
        let jobs: Vec<String> = o.jobs.iter().map(u32::to_string).collect();
        g.problems.push(format!("held by job(s) {}: drain the node and wait for them first", jobs.join(", ")));
    }
    if !o.processes.is_empty() {
        let pids: Vec<String> = o.processes.iter().map(u32::to_string).collect();
        g.problems.push(format!("process(es) {} run on it: stop them first", pids.join(", ")));
    }
}

/// `[mig] services` (and then `layout_services`) when a MIG mode changes,
/// `layout_services` when only instances do, none when nothing changes.
fn services_for(plan: &Plan, settings: &Settings) -> Vec<String> {
    let mode_change = plan.gpus.iter().any(|g| g.mode.is_some());
    let mut list = if mode_change {
        settings.services.clone()
    } else if plan.changes() {
        Vec::new()
    } else {
        return Vec::new();
    };
    for s in &settings.layout_services {
        if !list.contains(s) {
            list.push(s.clone());
        }
    }
    list
}

/// `3g.40gb@4 2g.20gb@0` for placements.
fn placements(list: &[Placed]) -> String {
    list.iter().map(|p| format!("{}@{}", p.name, p.start)).collect::<Vec<_>>().join(" ")
}

fn existing_list(list: &[Existing]) -> String {
    list.iter().map(|e| format!("GI {} ({}@{})", e.gpu_instance, e.profile, e.start)).collect::<Vec<_>>().join(", ")
}

impl Plan {
    /// What `gpu-mode-mig plan` prints.
    pub fn text(&self) -> String {
        let mut s = format!("baseline: {}\n", self.source);
        for p in &self.problems {
            let _ = writeln!(s, "problem: {p}");
        }
        for g in &self.gpus {
            let _ = writeln!(s, "GPU {} {} {}:", g.gpu, g.name, g.uuid);
            gpu_text(g, &mut s);
        }
        let verdict = match (self.problems().is_empty(), self.changes()) {
            (false, _) => "apply would refuse: nothing would be changed".to_string(),
            (true, false) => "nothing to do: the GPUs match the baseline".to_string(),
            (true, true) if self.services.is_empty() => "apply would make these changes".to_string(),
            (true, true) => format!(
                "apply would stop the active ones of {} first and start them again after, in reverse order",
                self.services.join(", ")
            ),
        };
        let _ = writeln!(s, "{verdict}");
        s
    }

    /// What `gpu-mode-mig assert` prints: how each GPU differs.
    pub fn differences(&self) -> String {
        let mut s = String::new();
        for p in &self.problems {
            let _ = writeln!(s, "{p}");
        }
        for g in self.gpus.iter().filter(|g| !g.differs.is_empty()) {
            let _ = writeln!(s, "GPU {} ({}): {}", g.gpu, g.uuid, g.differs.join("; "));
        }
        s
    }
}

fn gpu_text(g: &GpuPlan, s: &mut String) {
    if let Some(why) = &g.skipped {
        let _ = writeln!(s, "  left alone: {why}");
        return;
    }
    if let Some(t) = &g.target {
        let want = if t.mig_enabled { format!("MIG on, {}", describe(&t.instances)) } else { "MIG off".into() };
        let _ = writeln!(s, "  baseline (entry {}): {want}", t.entry);
    }
    for d in &g.differs {
        let _ = writeln!(s, "  differs: {d}");
    }
    if let Some(m) = g.mode {
        let _ = writeln!(s, "  switch MIG {} (a GPU reset)", on_off(m));
    }
    if !g.destroy.is_empty() {
        let _ = writeln!(s, "  destroy: {}", existing_list(&g.destroy));
    }
    if !g.keep.is_empty() {
        let _ = writeln!(s, "  keep: {}", existing_list(&g.keep));
    }
    if !g.create.is_empty() {
        let _ = writeln!(s, "  create: {}", placements(&g.create));
    }
    for p in &g.problems {
        let _ = writeln!(s, "  problem: {p}");
    }
    if g.differs.is_empty() && g.problems.is_empty() {
        let _ = writeln!(s, "  matches");
    }
}

/// The decisions made from what NVML reports, on `Observed` values built
/// here (apply_tests.rs drives the same function through the MIG fake).
#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::baseline::{Devices, Entry};
    use crate::mig::placement::h100_table;

    const H100: u32 = 0x2330_10de;
    const A100: u32 = 0x20b2_10de;
    const G1: u32 = 19; // 1g.10gb, one slice
    const G3: u32 = 9; // 3g.40gb, four slices

    fn settings() -> Settings {
        Settings {
            mig_mode: MigModeSetting::Switch,
            mig_instances: MigInstanceSetting::Manage,
            services: vec!["a.service".into(), "b.service".into()],
            layout_services: vec!["b.service".into(), "c.service".into()],
        }
    }

    /// An H100 (or a GPU without MIG when `mig` is `None`) with these
    /// `(GPU instance, profile id, start)` instances.
    fn gpu(index: u32, mig: Option<(bool, bool)>, instances: &[(u32, u32, u32)]) -> Observed {
        let profiles = h100_table();
        let size = |id| profiles.iter().find(|p| p.id == id).unwrap().placement_size;
        Observed {
            identity: GpuIdentity { index, pci_device_id: H100, pci_subsystem_id: 0x16c1_10de },
            uuid: format!("GPU-{index}"),
            pci_bus_id: format!("00000000:0{index}:00.0"),
            name: if mig.is_some() { "NVIDIA H100 80GB HBM3".into() } else { "NVIDIA L40S".into() },
            mig: mig.map(|(current, pending)| MigModes { current, pending }),
            instances: instances
                .iter()
                .map(|&(gi, id, start)| MigInstance { gpu_instance: gi, profile_id: id, placement_start: start, placement_size: size(id), compute_instances: vec![] })
                .collect(),
            profiles: if mig.is_some() { profiles } else { vec![] },
            processes: vec![],
            jobs: vec![],
        }
    }

    fn entry(devices: Devices, filter_device: Option<u32>, mig_enabled: bool, list: &[(&str, u32)]) -> Entry {
        let filter = filter_device.map(|device| crate::mig::baseline::DeviceFilter { device, subsystem: None }).into_iter().collect();
        Entry { devices, filter, mig_enabled, instances: list.iter().map(|(p, n)| (p.to_string(), *n)).collect() }
    }

    fn baseline(entries: Vec<Entry>) -> Baseline {
        Baseline { source: "test".into(), entries }
    }

    /// What a row expects of GPU 0's plan.
    struct Want {
        skipped: Option<&'static str>,
        /// Each must be one of the GPU's differences; empty: it matches.
        differs: &'static [&'static str],
        mode: Option<bool>,
        destroy: &'static [u32],
        create: &'static [&'static str],
        /// Part of the plan's problems, all joined; `None`: no problem.
        problem: Option<&'static str>,
    }

    const NOTHING: Want = Want { skipped: None, differs: &[], mode: None, destroy: &[], create: &[], problem: None };

    #[test]
    fn each_gpu_is_left_alone_matched_changed_or_refused() {
        let all_on = |list: &[(&str, u32)]| baseline(vec![entry(Devices::All, None, true, list)]);
        let g0_off = baseline(vec![entry(Devices::Indices(vec![0]), None, false, &[])]);
        let mut held = gpu(0, Some((true, true)), &[(1, G1, 0)]);
        held.jobs = vec![7];
        held.processes = vec![4242];
        let cases: Vec<(&str, Observed, Baseline, Want)> = vec![
            (
                "no entry names it (another model's filter)",
                gpu(0, Some((false, false)), &[]),
                baseline(vec![entry(Devices::All, Some(A100), true, &[("1g.10gb", 1)])]),
                Want { skipped: Some("no entry of the baseline names it"), ..NOTHING },
            ),
            ("no MIG, an entry for all GPUs", gpu(0, None, &[]), all_on(&[("1g.10gb", 1)]), Want { skipped: Some("NVIDIA L40S has no MIG mode"), ..NOTHING }),
            ("no MIG, named with MIG off", gpu(0, None, &[]), g0_off.clone(), Want { skipped: Some("NVIDIA L40S has no MIG mode"), ..NOTHING }),
            (
                "no MIG, named with MIG on",
                gpu(0, None, &[]),
                baseline(vec![entry(Devices::Indices(vec![0]), None, true, &[])]),
                Want {
                    differs: &["NVIDIA L40S has no MIG mode, but entry 1 enables MIG on it"],
                    problem: Some("GPU 0: NVIDIA L40S has no MIG mode, but entry 1 enables MIG on it"),
                    ..NOTHING
                },
            ),
            ("off and wanted off", gpu(0, Some((false, false)), &[]), g0_off.clone(), NOTHING),
            (
                "on, but off after the next reset: switched on again, the layout made anew",
                gpu(0, Some((true, false)), &[(1, G1, 6)]),
                all_on(&[("1g.10gb", 1)]),
                Want { differs: &["MIG is on (off after the next reset), the baseline wants it on"], mode: Some(true), destroy: &[1], create: &["1g.10gb@0"], ..NOTHING },
            ),
            (
                "off, on after the next reset, wanted off",
                gpu(0, Some((false, true)), &[]),
                g0_off.clone(),
                Want { differs: &["MIG is off (on after the next reset), the baseline wants it off"], mode: Some(false), ..NOTHING },
            ),
            (
                "two entries name it",
                gpu(0, Some((false, false)), &[]),
                baseline(vec![entry(Devices::All, None, true, &[]), entry(Devices::Indices(vec![0]), None, false, &[])]),
                Want { differs: &["test: GPU 0 is matched by entries 1 and 2"], problem: Some("GPU 0: test: GPU 0 is matched by entries 1 and 2"), ..NOTHING },
            ),
            (
                "a matching GPU may be busy",
                held.clone(),
                all_on(&[("1g.10gb", 1)]),
                NOTHING,
            ),
            (
                "a GPU that must change may not be busy",
                held,
                g0_off,
                Want { differs: &["MIG is on, the baseline wants it off"], mode: Some(false), destroy: &[1], problem: Some("held by job(s) 7: drain the node and wait for them first; GPU 0: process(es) 4242 run on it"), ..NOTHING },
            ),
            (
                "the kept 3g leaves room: only the missing one is made",
                gpu(0, Some((true, true)), &[(2, G3, 4)]),
                all_on(&[("3g.40gb", 1), ("1g.10gb", 1)]),
                Want { differs: &["instances: 1x 3g.40gb, the baseline wants 1x 1g.10gb, 1x 3g.40gb"], create: &["1g.10gb@0"], ..NOTHING },
            ),
        ];
        for (what, observed, b, want) in cases {
            let p = plan(&b, &[observed], &settings());
            let g = &p.gpus[0];
            assert_eq!(g.skipped.as_deref(), want.skipped, "{what}");
            assert_eq!(g.differs, want.differs, "{what}");
            assert_eq!(g.mode, want.mode, "{what}");
            assert_eq!(g.destroy.iter().map(|e| e.gpu_instance).collect::<Vec<_>>(), want.destroy, "{what}");
            let created: Vec<String> = g.create.iter().map(|c| format!("{}@{}", c.name, c.start)).collect();
            assert_eq!(created, want.create, "{what}");
            let problems = p.problems().join("; ");
            match want.problem {
                Some(needle) => assert!(problems.contains(needle), "{what}: {problems}"),
                None => assert!(problems.is_empty(), "{what}: {problems}"),
            }
            assert_eq!(p.matches(), want.differs.is_empty() && want.problem.is_none(), "{what}");
        }
    }

    #[test]
    fn services_stop_for_a_mode_change_or_a_layout_change_only() {
        let one = |list: &[(&str, u32)]| baseline(vec![entry(Devices::All, None, true, list)]);
        let cases: Vec<(&str, Observed, Vec<&str>)> = vec![
            ("a mode change: services, then the layout's not already listed", gpu(0, Some((false, false)), &[]), vec!["a.service", "b.service", "c.service"]),
            ("instances only: the layout's", gpu(0, Some((true, true)), &[]), vec!["b.service", "c.service"]),
            ("nothing to do: none", gpu(0, Some((true, true)), &[(1, G1, 3)]), vec![]),
        ];
        for (what, observed, want) in cases {
            let p = plan(&one(&[("1g.10gb", 1)]), &[observed], &settings());
            assert_eq!(p.services, want, "{what}");
        }
    }

    #[test]
    fn the_printed_plan_says_what_each_gpu_gets_and_the_verdict() {
        let b = baseline(vec![entry(Devices::All, None, true, &[("1g.10gb", 1)])]);
        let matching = gpu(0, Some((true, true)), &[(1, G1, 3)]);
        let empty = gpu(1, Some((true, true)), &[]);
        let p = plan(&b, &[matching.clone(), empty], &settings());
        let text = p.text();
        assert!(text.starts_with("baseline: test\nGPU 0 NVIDIA H100 80GB HBM3 GPU-0:\n  baseline (entry 1): MIG on, 1x 1g.10gb\n  keep: GI 1 (1g.10gb@3)\n  matches\n"), "{text}");
        assert!(text.contains("GPU 1 NVIDIA H100 80GB HBM3 GPU-1:\n  baseline (entry 1): MIG on, 1x 1g.10gb\n  differs: instances: none, the baseline wants 1x 1g.10gb\n  create: 1g.10gb@0\n"), "{text}");
        assert!(text.ends_with("apply would stop the active ones of b.service, c.service first and start them again after, in reverse order\n"), "{text}");
        assert_eq!(p.differences(), "GPU 1 (GPU-1): instances: none, the baseline wants 1x 1g.10gb\n");
        let verdicts: Vec<(Settings, Vec<Observed>, &str)> = vec![
            (settings(), vec![matching.clone()], "nothing to do: the GPUs match the baseline\n"),
            (Settings { layout_services: vec![], ..settings() }, vec![gpu(0, Some((true, true)), &[])], "apply would make these changes\n"),
            (Settings { mig_instances: MigInstanceSetting::Leave, ..settings() }, vec![gpu(0, Some((true, true)), &[])], "apply would refuse: nothing would be changed\n"),
        ];
        for (s, observed, verdict) in verdicts {
            let text = plan(&b, &observed, &s).text();
            assert!(text.ends_with(verdict), "{verdict}: {text}");
        }
    }
}
