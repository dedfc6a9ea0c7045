//! Stale MIG instances: on a GPU with MIG on, instances beyond the node's
//! configured baseline (`[health] mig_baseline`, profile names) on a GPU that
//! no live job holds. A job's epilog should have destroyed them.

use super::{per_gpu, Check, CheckResult, Ctx, Status};

pub struct StaleMig;

const NAME: &str = "mig";

impl Check for StaleMig {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&self, ctx: &Ctx) -> Vec<CheckResult> {
        per_gpu(ctx, NAME, |g, _| {
            if !g.modes.and_then(|m| m.mig).is_some_and(|m| m.current) {
                return CheckResult::new(NAME, Some(g.index), Status::Skipped, "MIG off");
            }
            if ctx.job_holds(g.index) {
                return CheckResult::new(NAME, Some(g.index), Status::Ok, format!("{} instance(s), held by a job", g.mig_instances.len()));
            }
            let name = |id: u32| g.mig_profiles.iter().find(|p| p.id == id).map_or(format!("profile {id}"), |p| p.name.clone());
            let mut baseline = ctx.config.mig_baseline.clone();
            let mut stale = Vec::new();
            for i in &g.mig_instances {
                let n = name(i.profile_id);
                match baseline.iter().position(|b| *b == n) {
                    Some(k) => {
                        baseline.remove(k);
                    }
                    None => stale.push(format!("GI {} ({n})", i.gpu_instance)),
                }
            }
            match stale.is_empty() {
                true => CheckResult::new(NAME, Some(g.index), Status::Ok, format!("{} instance(s), all in the baseline", g.mig_instances.len())),
                false => CheckResult::new(NAME, Some(g.index), Status::Fail, format!("stale MIG instance(s) no job owns: {}", stale.join(", "))),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::fake::*;
    use super::*;
    use crate::gpu::{MigInstance, MigModes, MigProfile};

    fn profile(id: u32, name: &str) -> MigProfile {
        MigProfile { profile: 0, id, name: name.into(), slices: 1, instance_count: 7, memory_mb: 1, sms: 1, copy_engines: 1, placement_starts: vec![], placement_size: 1 }
    }

    fn inst(gi: u32, profile_id: u32) -> MigInstance {
        MigInstance { gpu_instance: gi, profile_id, placement_start: 0, placement_size: 1, compute_instances: vec![] }
    }

    #[test]
    fn instances_outside_the_baseline_and_without_a_job_fail() {
        // (MIG on, instances (gi, profile id), baseline, held) -> status, message
        type Case = (bool, Vec<(u32, u32)>, Vec<&'static str>, bool, Status, &'static str);
        let cases: Vec<Case> = vec![
            (false, vec![], vec![], false, Status::Skipped, "MIG off"),
            (true, vec![], vec![], false, Status::Ok, "0 instance(s)"),
            (true, vec![(1, 19), (2, 19)], vec!["1g.18gb", "1g.18gb"], false, Status::Ok, "2 instance(s), all in the baseline"),
            (true, vec![(1, 19), (2, 19)], vec!["1g.18gb"], false, Status::Fail, "stale MIG instance(s) no job owns: GI 2 (1g.18gb)"),
            (true, vec![(3, 9)], vec![], false, Status::Fail, "stale MIG instance(s) no job owns: GI 3 (3g.71gb)"),
            (true, vec![(3, 9)], vec![], true, Status::Ok, "1 instance(s), held by a job"),
        ];
        for (on, insts, baseline, held, status, text) in cases {
            let mut g = healthy_gpu(0);
            g.modes.as_mut().unwrap().mig = Some(MigModes { current: on, pending: on });
            g.mig_profiles = vec![profile(19, "1g.18gb"), profile(9, "3g.71gb")];
            g.mig_instances = insts.iter().map(|(gi, p)| inst(*gi, *p)).collect();
            let mut fx = Fixture::new(vec![g]);
            fx.config.mig_baseline = baseline.iter().map(|s| s.to_string()).collect();
            if held {
                fx.jobs.push(job(3, &[0], "mig:3g.71gb"));
            }
            let r = &StaleMig.run(&fx.ctx())[0];
            assert_eq!(r.status, status, "{r:?}");
            assert!(r.message.starts_with(text), "{r:?}");
        }
    }
}
