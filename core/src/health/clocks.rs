//! Clocks event reasons and temperature. HW slowdown, HW thermal slowdown and
//! HW power brake fail (the GPU is being held back by hardware); SW thermal
//! slowdown warns; "GPU idle" (0x1) and the power cap are normal. A
//! temperature within the margin of the slowdown threshold warns.

use super::{combine, per_gpu, Check, CheckResult, Ctx, Status};
use crate::gpu::health::reason_names;

pub struct Clocks;

const NAME: &str = "clocks";

impl Check for Clocks {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&self, ctx: &Ctx) -> Vec<CheckResult> {
        per_gpu(ctx, NAME, |g, h| {
            let c = ctx.config;
            let reasons = h.clocks_event_reasons.unwrap_or(0);
            let mut f = Vec::new();
            if reasons & c.clocks_fail_mask != 0 {
                f.push((Status::Fail, format!("clocks held back: {}", reason_names(reasons & c.clocks_fail_mask).join(","))));
            }
            if reasons & c.clocks_warn_mask != 0 {
                f.push((Status::Warn, format!("clocks held back: {}", reason_names(reasons & c.clocks_warn_mask).join(","))));
            }
            if let (Some(t), Some(slow)) = (h.temperature_c, h.slowdown_temp_c) {
                if t + c.temperature_margin_c >= slow {
                    f.push((Status::Warn, format!("temperature {t} C within {} C of slowdown {slow} C", c.temperature_margin_c)));
                }
            }
            let temp = h.temperature_c.map_or("n/a".into(), |t| format!("{t} C"));
            combine(NAME, Some(g.index), f, format!("reasons {reasons:#x}, {temp}"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::fake::*;
    use super::*;

    #[test]
    fn reasons_and_temperature_are_judged() {
        let cases = [
            (0x1, 31, Status::Ok, "reasons 0x1, 31 C"),
            (0x0, 60, Status::Ok, "reasons 0x0"),
            (0x4, 60, Status::Ok, "reasons 0x4"),
            (0x1 | 0x8, 31, Status::Fail, "clocks held back: hw_slowdown"),
            (0x20 | 0x40, 90, Status::Fail, "clocks held back: hw_thermal_slowdown; clocks held back: sw_thermal_slowdown; temperature 90 C"),
            (0x80, 31, Status::Fail, "clocks held back: hw_power_brake_slowdown"),
            (0x20, 31, Status::Warn, "clocks held back: sw_thermal_slowdown"),
            (0x1, 84, Status::Warn, "temperature 84 C within 5 C of slowdown 89 C"),
        ];
        for (reasons, temp, status, text) in cases {
            let mut g = healthy_gpu(0);
            let h = g.health.as_mut().unwrap();
            h.clocks_event_reasons = Some(reasons);
            h.temperature_c = Some(temp);
            let fx = Fixture::new(vec![g]);
            let r = &Clocks.run(&fx.ctx())[0];
            assert_eq!(r.status, status, "{r:?}");
            assert!(r.message.starts_with(text), "{r:?}");
        }
    }
}
