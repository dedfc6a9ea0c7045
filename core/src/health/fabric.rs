//! NVSwitch fabric (HGX/DGX): GPUs that report a fabric must have it
//! completed, which needs nvidia-fabricmanager. GPUs without a fabric skip.

use super::{per_gpu, Check, CheckResult, Ctx, Status};

pub struct Fabric;

const NAME: &str = "fabric";

impl Check for Fabric {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&self, ctx: &Ctx) -> Vec<CheckResult> {
        per_gpu(ctx, NAME, |g, h| {
            let state = h.fabric_state.clone();
            let (status, text) = match state.as_deref() {
                None | Some("not_supported") => (Status::Skipped, "no NVSwitch fabric".to_string()),
                Some("completed") => (Status::Ok, "fabric registered".to_string()),
                Some(s) => (Status::Fail, format!("fabric {s}: is nvidia-fabricmanager running? (systemctl status nvidia-fabricmanager)")),
            };
            CheckResult::new(NAME, Some(g.index), status, text)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::fake::*;
    use super::*;

    #[test]
    fn fabric_states_are_judged() {
        for (state, status) in [(None, Status::Skipped), (Some("not_supported"), Status::Skipped), (Some("completed"), Status::Ok),
            (Some("in_progress"), Status::Fail), (Some("not_started"), Status::Fail)]
        {
            let mut g = healthy_gpu(0);
            g.health.as_mut().unwrap().fabric_state = state.map(String::from);
            let fx = Fixture::new(vec![g]);
            assert_eq!(Fabric.run(&fx.ctx())[0].status, status, "{state:?}");
        }
    }
}
