//! Stale MIG instances: on a GPU with MIG on that no live job holds,
//! instances that are not the node's baseline. A job's epilog should have
//! destroyed them. The baseline is the one `gpu-mode-mig` applies (`[mig]
//! baseline`, passed in through the snapshot's sources), split the same way
//! ([`crate::mig_baseline::split_instances`]). Baseline instances that are
//! missing only warn: the node can still run jobs, and `gpu-mode-mig apply`
//! puts them back.

use super::{per_gpu, Check, CheckResult, Ctx, GpuSnap, Status};
use crate::mig_baseline::{describe, split_instances, GpuIdentity, GpuTarget};

pub struct StaleMig;

const NAME: &str = "mig";

impl Check for StaleMig {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&self, ctx: &Ctx) -> Vec<CheckResult> {
        per_gpu(ctx, NAME, |g, _| {
            let result = |status, message: String| CheckResult::new(NAME, Some(g.index), status, message);
            if !g.modes.and_then(|m| m.mig).is_some_and(|m| m.current) {
                return result(Status::Skipped, "MIG off".into());
            }
            if ctx.job_holds(g.index) {
                return result(Status::Ok, format!("{} instance(s), held by a job", g.mig_instances.len()));
            }
            match target(ctx, g) {
                Ok(t) => judge(g, t.as_ref()),
                Err(e) => result(Status::Fail, format!("the MIG baseline cannot be read: {e}")),
            }
        })
    }
}

/// The baseline's entry for the GPU (`None`: no baseline, or no entry).
fn target(ctx: &Ctx, g: &GpuSnap) -> Result<Option<GpuTarget>, String> {
    let Some(baseline) = ctx.mig_baseline.clone()? else { return Ok(None) };
    let inv = g.inventory.as_ref();
    let id = GpuIdentity {
        index: g.index,
        pci_device_id: inv.map_or(0, |i| i.pci_device_id),
        pci_subsystem_id: inv.map_or(0, |i| i.pci_subsystem_id),
    };
    baseline.target_for(&id).map_err(|e| e.to_string())
}

fn judge(g: &GpuSnap, t: Option<&GpuTarget>) -> CheckResult {
    let s = split_instances(t, &g.mig_instances, &g.mig_profiles, &[]);
    let name = |gi: &u32| {
        let id = g.mig_instances.iter().find(|i| i.gpu_instance == *gi).map_or(u32::MAX, |i| i.profile_id);
        format!("GI {gi} ({})", crate::mig_baseline::profile_name(&g.mig_profiles, id))
    };
    if !s.other.is_empty() {
        let stale: Vec<String> = s.other.iter().map(name).collect();
        return CheckResult::new(NAME, Some(g.index), Status::Fail, format!("stale MIG instance(s) no job owns: {}", stale.join(", ")));
    }
    if !s.missing.is_empty() {
        let missing = describe(&s.missing.into_iter().collect());
        return CheckResult::new(NAME, Some(g.index), Status::Warn, format!("baseline MIG instance(s) missing: {missing} (gpu-mode-mig apply recreates them)"));
    }
    CheckResult::new(NAME, Some(g.index), Status::Ok, format!("{} instance(s), all in the baseline", g.mig_instances.len()))
}

#[cfg(test)]
mod tests {
    use super::super::fake::*;
    use super::*;
    use crate::gpu::{MigInstance, MigModes, MigProfile};
    use crate::mig_baseline::Baseline;

    fn profile(id: u32, name: &str) -> MigProfile {
        MigProfile { profile: 0, id, name: name.into(), slices: 1, instance_count: 7, memory_mb: 1, sms: 1, copy_engines: 1, placement_starts: vec![], placement_size: 1 }
    }

    fn inst(gi: u32, profile_id: u32) -> MigInstance {
        MigInstance { gpu_instance: gi, profile_id, placement_start: 0, placement_size: 1, compute_instances: vec![] }
    }

    #[test]
    fn instances_outside_the_baseline_and_without_a_job_fail() {
        // (MIG on, instances (gi, profile id), baseline, held) -> status, message
        type Case = (bool, Vec<(u32, u32)>, Option<&'static str>, bool, Status, &'static str);
        let cases: Vec<Case> = vec![
            (false, vec![], None, false, Status::Skipped, "MIG off"),
            (true, vec![], None, false, Status::Ok, "0 instance(s)"),
            (true, vec![(1, 19), (2, 19)], Some("1g.18gbx2"), false, Status::Ok, "2 instance(s), all in the baseline"),
            (true, vec![(1, 19), (2, 19)], Some("1g.18gb"), false, Status::Fail, "stale MIG instance(s) no job owns: GI 2 (1g.18gb)"),
            (true, vec![(3, 9)], None, false, Status::Fail, "stale MIG instance(s) no job owns: GI 3 (3g.71gb)"),
            (true, vec![(3, 9)], None, true, Status::Ok, "1 instance(s), held by a job"),
            (true, vec![(3, 9)], Some("3g.71gb,1g.18gbx2"), false, Status::Warn, "baseline MIG instance(s) missing: 2x 1g.18gb"),
        ];
        for (on, insts, baseline, held, status, text) in cases {
            let mut g = healthy_gpu(0);
            g.modes.as_mut().unwrap().mig = Some(MigModes { current: on, pending: on });
            g.mig_profiles = vec![profile(19, "1g.18gb"), profile(9, "3g.71gb")];
            g.mig_instances = insts.iter().map(|(gi, p)| inst(*gi, *p)).collect();
            let mut fx = Fixture::new(vec![g]);
            fx.mig_baseline = Ok(baseline.map(|b| Baseline::from_layout("base", b).unwrap()));
            if held {
                fx.jobs.push(job(3, &[0], "mig:3g.71gb"));
            }
            let r = &StaleMig.run(&fx.ctx())[0];
            assert_eq!(r.status, status, "{r:?}");
            assert!(r.message.starts_with(text), "{r:?}");
        }
    }

    #[test]
    fn the_baseline_is_per_gpu_and_a_broken_one_fails() {
        let text = "version: v1\nmig-configs:\n  b:\n    - devices: [1]\n      mig-enabled: true\n      mig-devices: {\"3g.71gb\": 1}\n";
        let b = crate::mig_baseline::parted::parse(text, "b.yaml", "b").unwrap();
        let gpus: Vec<_> = (0..2)
            .map(|i| {
                let mut g = healthy_gpu(i);
                g.modes.as_mut().unwrap().mig = Some(MigModes { current: true, pending: true });
                g.mig_profiles = vec![profile(9, "3g.71gb")];
                g.mig_instances = vec![inst(1, 9)];
                g
            })
            .collect();
        let mut fx = Fixture::new(gpus);
        fx.mig_baseline = Ok(Some(b));
        let r = StaleMig.run(&fx.ctx());
        assert_eq!((r[0].status, r[1].status), (Status::Fail, Status::Ok), "only GPU 1 keeps a 3g: {r:?}");
        fx.mig_baseline = Err("mig-parted config /etc/x.yaml: no config named \"b\"".into());
        let r = StaleMig.run(&fx.ctx());
        assert_eq!(r[0].status, Status::Fail);
        assert!(r[0].message.starts_with("the MIG baseline cannot be read: mig-parted config /etc/x.yaml"), "{r:?}");
    }
}
