//! `--gpu-mode=mps` behind the [`ModeDriver`] interface.

use super::setup::setup;
use super::teardown::{teardown, TeardownOutcome};
use crate::config::Config;
use crate::failure::{Failure, Fault};
use crate::gpu_mode::MpsParams;
use crate::grant::GrantRecord;
use crate::mode_driver::{Grant, ModeDriver, PrepareCtx, Released};
use crate::watchdog;

/// The MPS mode; `params` only in the prolog (the epilog undoes by record).
pub struct MpsDriver<'a> {
    pub params: Option<&'a MpsParams>,
}

impl ModeDriver for MpsDriver<'_> {
    fn name(&self) -> &'static str {
        "mps"
    }

    fn prepare(&self, ctx: &PrepareCtx) -> Result<Grant, Failure> {
        let default = MpsParams::default();
        let params = self.params.unwrap_or(&default);
        let ops = {
            let _step = watchdog::step("nvml: open");
            ctx.nvml.get().map_err(|e| Failure::node(Fault::Nvml, format!("NVML: {e}")))?
        };
        let _step = watchdog::step("mps: setup");
        let job = setup(ctx.cfg, ctx.env, ctx.gpus, params, ops)?;
        Ok(Grant {
            detail: Some(format!("mps daemon {}", job.key)),
            record: GrantRecord::Mps { daemon: job.key },
            task_env: job.task_env,
            per_task_env: Default::default(),
            events: Vec::new(),
        })
    }

    fn release(&self, cfg: &Config, job_id: u32, grant: &GrantRecord) -> Result<Released, Failure> {
        let key = match grant {
            GrantRecord::Mps { daemon } => Some(daemon.as_str()),
            _ => None,
        };
        let _step = watchdog::step("mps: teardown");
        teardown(cfg, job_id, key).map(describe)
    }

    fn release_lost(&self, cfg: &Config, job_id: u32) -> Result<Released, Failure> {
        // The registry is searched: a daemon must never outlive its last job.
        let _step = watchdog::step("mps: teardown");
        teardown(cfg, job_id, None).map(describe)
    }

}

/// The epilog's log detail for a teardown.
fn describe(out: TeardownOutcome) -> Released {
    match out {
        TeardownOutcome::NoDaemon => Released::nothing(),
        TeardownOutcome::Released { key, remaining } => Released::did(format!("mps daemon {key} kept for job(s) {remaining:?}")),
        TeardownOutcome::Stopped { key, quit_worked, signalled, unreaped, already_gone } => {
            let mut text = if already_gone {
                // Killed or crashed mid-job: the admin should know, but it
                // held nothing any more (docs/faults.md).
                format!("mps daemon {key} was already gone (killed or crashed during the job); its directories and record removed")
            } else if quit_worked {
                format!("mps daemon {key} stopped")
            } else {
                format!("mps daemon {key} ignored quit; signalled pids {signalled:?}")
            };
            if !unreaped.is_empty() {
                // Ended processes the user's own process has not reaped: they
                // hold nothing, so this is the user's leftover, not a fault.
                let list: Vec<String> = unreaped.iter().map(|(z, p)| format!("{z} (parent {p})")).collect();
                text.push_str(&format!("; unreaped zombies {} left to their parents", list.join(", ")));
            }
            Released::did(text)
        }
    }
}
