//! Memory errors (DCGM's rules): volatile uncorrectable
//! ECC above the baseline, pending page retirement, retired pages at the
//! limit, and row remapping (pending: reset needed; failed: replace the GPU).

use super::{combine, per_gpu, Check, CheckResult, Ctx, GpuSnap, Status};
use crate::gpu::HealthReadings;

pub struct Memory;

const NAME: &str = "memory";

impl Check for Memory {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&self, ctx: &Ctx) -> Vec<CheckResult> {
        per_gpu(ctx, NAME, |g, h| judge(ctx, g, h))
    }
}

fn judge(ctx: &Ctx, g: &GpuSnap, h: &HealthReadings) -> CheckResult {
    let mut f = Vec::new();
    if let Some(v) = h.ecc_uncorrected_volatile {
        let uuid = g.inventory.as_ref().map(|i| i.uuid.as_str()).unwrap_or_default();
        let base = ctx.cursor.ecc_baseline.get(uuid).copied().unwrap_or(0);
        if v > base {
            f.push((Status::Fail, format!("{} new uncorrectable ECC error(s) (volatile count {v}, accepted {base})", v - base)));
        }
    }
    if h.retired_pages_pending == Some(true) {
        f.push((Status::Fail, "page retirement pending: GPU reset needed".to_string()));
    }
    let retired = h.retired_pages_dbe.unwrap_or(0) + h.retired_pages_sbe.unwrap_or(0);
    if retired >= ctx.config.retired_pages_fail {
        f.push((Status::Fail, format!("{retired} retired pages (limit {}): replace the GPU", ctx.config.retired_pages_fail)));
    }
    if let Some(r) = &h.remapped_rows {
        if r.failed {
            f.push((Status::Fail, "row remapping failed: replace the GPU".to_string()));
        } else if r.pending {
            f.push((Status::Fail, "row remap pending: GPU reset needed".to_string()));
        }
    }
    let ok = match h.remapped_rows.as_ref() {
        Some(r) => format!("no uncorrectable errors; {} row(s) remapped", r.correctable + r.uncorrectable),
        None => "no uncorrectable errors".to_string(),
    };
    combine(NAME, Some(g.index), f, ok)
}

#[cfg(test)]
mod tests {
    use super::super::fake::*;
    use super::*;
    use crate::gpu::RemappedRows;

    #[test]
    fn memory_faults_are_judged() {
        type Edit = fn(&mut crate::gpu::HealthReadings);
        let cases: Vec<(Edit, Status, &str)> = vec![
            (|_| {}, Status::Ok, "no uncorrectable errors"),
            (|h| h.ecc_uncorrected_volatile = Some(2), Status::Fail, "2 new uncorrectable ECC error(s)"),
            (|h| h.retired_pages_pending = Some(true), Status::Fail, "page retirement pending: GPU reset needed"),
            (|h| { h.retired_pages_dbe = Some(40); h.retired_pages_sbe = Some(23) }, Status::Fail, "63 retired pages (limit 63)"),
            (|h| h.retired_pages_dbe = Some(62), Status::Ok, "no uncorrectable"),
            (|h| h.remapped_rows = Some(RemappedRows { correctable: 0, uncorrectable: 1, pending: true, failed: false }), Status::Fail, "row remap pending: GPU reset needed"),
            (|h| h.remapped_rows = Some(RemappedRows { correctable: 0, uncorrectable: 1, pending: false, failed: true }), Status::Fail, "row remapping failed: replace the GPU"),
        ];
        for (edit, status, text) in cases {
            let mut g = healthy_gpu(0);
            edit(g.health.as_mut().unwrap());
            let fx = Fixture::new(vec![g]);
            let r = Memory.run(&fx.ctx());
            assert_eq!((r[0].status, r[0].gpu), (status, Some(0)), "{r:?}");
            assert!(r[0].message.starts_with(text), "{r:?}");
        }
    }

    #[test]
    fn an_acknowledged_ecc_count_passes_until_it_grows() {
        let mut g = healthy_gpu(0);
        g.health.as_mut().unwrap().ecc_uncorrected_volatile = Some(2);
        let mut fx = Fixture::new(vec![g]);
        fx.cursor.ecc_baseline.insert("GPU-0".into(), 2);
        assert_eq!(Memory.run(&fx.ctx())[0].status, Status::Ok);
        fx.gpus[0].health.as_mut().unwrap().ecc_uncorrected_volatile = Some(3);
        let r = Memory.run(&fx.ctx());
        assert!(r[0].status == Status::Fail && r[0].message.starts_with("1 new"), "{r:?}");
    }
}
