//! PCIe link: a width below the maximum is a seating or riser problem
//! (`[health] pcie_width_below_max`, fail by default). A generation below the
//! maximum is normal power saving on an idle GPU, so it only warns while the
//! GPU is busy.

use super::{combine, per_gpu, Check, CheckResult, Ctx, Status};
use super::config::Severity;

pub struct PcieLink;

const NAME: &str = "pcie";
const IDLE: u64 = 0x1;

impl Check for PcieLink {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&self, ctx: &Ctx) -> Vec<CheckResult> {
        per_gpu(ctx, NAME, |g, h| {
            let Some(p) = &h.pcie else { return CheckResult::new(NAME, Some(g.index), Status::Skipped, "PCIe link not reported") };
            let mut f = Vec::new();
            if p.current_width < p.max_width {
                let s = match ctx.config.pcie_width_below_max { Severity::Fail => Status::Fail, Severity::Warn => Status::Warn };
                f.push((s, format!("link width x{} below max x{}: reseat or check the riser", p.current_width, p.max_width)));
            }
            let idle = h.clocks_event_reasons.is_some_and(|r| r & IDLE != 0);
            if p.current_gen < p.max_gen && !idle {
                f.push((Status::Warn, format!("link gen {} below max {} while busy", p.current_gen, p.max_gen)));
            }
            combine(NAME, Some(g.index), f, format!("gen {}/{} x{}/x{}", p.current_gen, p.max_gen, p.current_width, p.max_width))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::fake::*;
    use super::*;
    use crate::gpu::Pcie;

    #[test]
    fn links_are_judged() {
        let cases = [
            (5, 16, 0x1, Severity::Fail, Status::Ok, "gen 5/5 x16/x16"),
            (1, 16, 0x1, Severity::Fail, Status::Ok, "gen 1/5"),
            (1, 16, 0x0, Severity::Fail, Status::Warn, "link gen 1 below max 5 while busy"),
            (5, 8, 0x1, Severity::Fail, Status::Fail, "link width x8 below max x16"),
            (5, 8, 0x1, Severity::Warn, Status::Warn, "link width x8 below max x16"),
        ];
        for (gen, width, reasons, sev, status, text) in cases {
            let mut g = healthy_gpu(0);
            let h = g.health.as_mut().unwrap();
            h.pcie = Some(Pcie { current_gen: gen, max_gen: 5, current_width: width, max_width: 16, replay_counter: 0 });
            h.clocks_event_reasons = Some(reasons);
            let mut fx = Fixture::new(vec![g]);
            fx.config.pcie_width_below_max = sev;
            let r = &PcieLink.run(&fx.ctx())[0];
            assert_eq!(r.status, status, "{r:?}");
            assert!(r.message.starts_with(text), "{r:?}");
        }
    }
}
