//! Persistence (the runbook behind issue 5): every GPU must report
//! persistence Enabled and nvidia-persistenced must run. Without it a GPU
//! de-initializes when idle, costing 1-3 s at the next CUDA call and losing
//! clock/power settings. The fix is the daemon (its systemd unit), not
//! `nvidia-smi -pm 1`, whose legacy kernel flag is only a warning here.

use super::{Check, CheckResult, Ctx, Status};

pub struct Persistence;

const NAME: &str = "persistence";
/// The kernel keeps 15 bytes of a command name.
pub const DAEMON_COMM: &str = "nvidia-persiste";
const FIX: &str = "start nvidia-persistenced as a service (systemctl enable --now nvidia-persistenced)";

impl Check for Persistence {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&self, ctx: &Ctx) -> Vec<CheckResult> {
        let gpus = ctx.gpus();
        if ctx.nvml.is_err() {
            return vec![CheckResult::new(NAME, None, Status::Skipped, "NVML unavailable (see the driver check)")];
        }
        let daemon = ctx.processes.iter().find(|p| p.comm == DAEMON_COMM && p.state != 'Z').map(|p| p.pid);
        let mut out: Vec<CheckResult> = gpus
            .iter()
            .filter_map(|g| Some((g.index, g.modes?.persistence)))
            .map(|(i, on)| match on {
                true => CheckResult::new(NAME, Some(i), Status::Ok, "persistence Enabled"),
                false => CheckResult::new(NAME, Some(i), Status::Fail, format!("persistence Disabled: {FIX}")),
            })
            .collect();
        let all_on = out.iter().all(|r| r.status == Status::Ok);
        out.push(match (daemon, all_on) {
            (Some(pid), _) => CheckResult::new(NAME, None, Status::Ok, format!("nvidia-persistenced running (pid {pid})")),
            (None, _) if !ctx.config.require_persistenced => CheckResult::new(NAME, None, Status::Skipped, "daemon not required ([health] require_persistenced = false)"),
            (None, true) => CheckResult::new(NAME, None, Status::Warn, format!("legacy persistence: on through the kernel flag, no nvidia-persistenced running; {FIX}")),
            (None, false) => CheckResult::new(NAME, None, Status::Fail, format!("nvidia-persistenced not running: {FIX}")),
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::fake::*;
    use super::*;

    #[test]
    fn persistence_and_daemon_are_judged() {
        // (GPU 1 persistence, daemon running, daemon required) -> (GPU 1, node)
        let cases = [
            (true, true, true, Status::Ok, Status::Ok, "nvidia-persistenced running (pid 900)"),
            (true, false, true, Status::Ok, Status::Warn, "legacy persistence"),
            (false, true, true, Status::Fail, Status::Ok, "nvidia-persistenced running"),
            (false, false, true, Status::Fail, Status::Fail, "nvidia-persistenced not running: start nvidia-persistenced"),
            (true, false, false, Status::Ok, Status::Skipped, "daemon not required"),
        ];
        for (on, daemon, required, gpu_status, node_status, text) in cases {
            let mut g = healthy_gpu(1);
            g.modes.as_mut().unwrap().persistence = on;
            let mut fx = Fixture::new(vec![healthy_gpu(0), g]);
            fx.config.require_persistenced = required;
            if !daemon {
                fx.processes.retain(|p| p.comm != DAEMON_COMM);
            }
            let r = Persistence.run(&fx.ctx());
            assert_eq!((r[1].gpu, r[1].status), (Some(1), gpu_status), "{r:?}");
            assert_eq!((r[2].gpu, r[2].status), (None, node_status), "{r:?}");
            assert!(r[2].message.starts_with(text), "{r:?}");
            if !on {
                assert!(r[1].message.contains("nvidia-persistenced") && !r[1].message.contains("-pm 1"), "{r:?}");
            }
        }
    }
}
