//! XIDs from the kernel log since the last run (see [`super::kmsg`] and
//! [`super::cursor`]). Failing XIDs (48, 74, 79, 95, 119, 120, 140 by
//! default) keep failing their GPU until a reboot or `ack`; warning XIDs
//! (63, 94) warn; application XIDs (13, 31, 43, 45, 68, 109) are the job's
//! problem and are never counted.

use super::cursor::{LostRecords, SeenXid};
use super::{Check, CheckResult, Ctx, Status};

pub struct Xid;

const NAME: &str = "xid";

impl Check for Xid {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&self, ctx: &Ctx) -> Vec<CheckResult> {
        if let Some(e) = &ctx.kmsg_error {
            return vec![CheckResult::new(NAME, None, Status::Warn, format!("XIDs not checked: {e}"))];
        }
        let mut out: Vec<CheckResult> = ctx.gpus().iter().map(|g| judge(ctx, Some(g.index), &ctx.cursor.xids)).collect();
        // XIDs of a PCI address NVML does not know (a GPU it lost) fail the node.
        if ctx.cursor.xids.iter().any(|x| x.gpu.is_none()) {
            out.push(judge(ctx, None, &ctx.cursor.xids));
        } else if out.is_empty() {
            out.push(CheckResult::new(NAME, None, Status::Ok, "no critical XIDs this boot"));
        }
        if let Some(lost) = ctx.cursor.kmsg_lost {
            out.push(CheckResult::new(NAME, None, Status::Warn, lost_message(lost)));
        }
        out
    }
}

fn judge(ctx: &Ctx, gpu: Option<u32>, seen: &[SeenXid]) -> CheckResult {
    let mine: Vec<&SeenXid> = seen.iter().filter(|x| x.gpu == gpu).collect();
    let fail: Vec<u64> = dedup(mine.iter().filter(|x| ctx.config.xid_fail.contains(&x.xid)).map(|x| x.xid));
    let warn: Vec<u64> = dedup(mine.iter().filter(|x| ctx.config.xid_warn.contains(&x.xid)).map(|x| x.xid));
    let list = |v: &[u64]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",");
    let at = mine.first().filter(|_| gpu.is_none()).map(|x| format!(" at PCI {}", x.pci)).unwrap_or_default();
    let (status, text) = if !fail.is_empty() {
        (Status::Fail, format!("XID {}{at} this boot (gpu-mode-node-checker ack after repair)", list(&fail)))
    } else if !warn.is_empty() {
        (Status::Warn, format!("XID {}{at} this boot", list(&warn)))
    } else {
        (Status::Ok, "no critical XIDs this boot".to_string())
    };
    CheckResult::new(NAME, gpu, status, text)
}

/// The kernel log wrapped between checks: XIDs in the lost records went
/// unseen. A warning with what to do, kept until `ack` or a reboot.
fn lost_message(lost: LostRecords) -> String {
    let which = if lost.first == lost.last { format!("record {}", lost.first) } else { format!("records {}-{}", lost.first, lost.last) };
    format!(
        "XIDs may have been missed: {} kernel log {} this boot were overwritten before a check read them \
         (check the node's logs for that time; a larger log_buf_len or a shorter HealthCheckInterval helps; gpu-mode-node-checker ack clears this)",
        lost.count,
        if lost.count == 1 { which } else { format!("records ({which})") }
    )
}

fn dedup(it: impl Iterator<Item = u64>) -> Vec<u64> {
    let mut v: Vec<u64> = it.collect();
    v.sort_unstable();
    v.dedup();
    v
}

#[cfg(test)]
mod tests {
    use super::super::fake::*;
    use super::*;

    fn seen(gpu: Option<u32>, xid: u64) -> SeenXid {
        SeenXid { seq: 1, gpu, pci: "0000:99:00".into(), xid }
    }

    #[test]
    fn xids_are_judged_per_gpu() {
        type Case = (Vec<SeenXid>, Vec<(Option<u32>, Status, &'static str)>);
        let cases: Vec<Case> = vec![
            (vec![], vec![(Some(0), Status::Ok, "no critical"), (Some(1), Status::Ok, "no critical")]),
            (vec![seen(Some(1), 79), seen(Some(1), 79)], vec![(Some(0), Status::Ok, "no"), (Some(1), Status::Fail, "XID 79 this boot")]),
            (vec![seen(Some(0), 94), seen(Some(0), 63)], vec![(Some(0), Status::Warn, "XID 63,94 this boot"), (Some(1), Status::Ok, "no")]),
            (vec![seen(Some(0), 94), seen(Some(0), 48)], vec![(Some(0), Status::Fail, "XID 48 this"), (Some(1), Status::Ok, "no")]),
            (vec![seen(None, 79)], vec![(Some(0), Status::Ok, "no"), (Some(1), Status::Ok, "no"), (None, Status::Fail, "XID 79 at PCI 0000:99:00")]),
        ];
        for (xids, want) in cases {
            let mut fx = Fixture::new(vec![healthy_gpu(0), healthy_gpu(1)]);
            fx.cursor.xids = xids.clone();
            let got = Xid.run(&fx.ctx());
            assert_eq!(got.len(), want.len(), "{got:?}");
            for (r, (gpu, status, text)) in got.iter().zip(&want) {
                assert_eq!((r.gpu, r.status), (*gpu, *status), "{xids:?}: {r:?}");
                assert!(r.message.starts_with(text), "{r:?}");
            }
        }
    }

    #[test]
    fn records_lost_to_a_wrapped_log_warn_without_failing() {
        let mut fx = Fixture::new(vec![healthy_gpu(0)]);
        fx.cursor.kmsg_lost = Some(LostRecords { count: 58, first: 42, last: 99 });
        let r = Xid.run(&fx.ctx());
        assert_eq!(r.iter().map(|r| (r.gpu, r.status)).collect::<Vec<_>>(), vec![(Some(0), Status::Ok), (None, Status::Warn)]);
        assert!(r[1].message.starts_with("XIDs may have been missed: 58 kernel log records (records 42-99) this boot"), "{}", r[1].message);
        fx.cursor.kmsg_lost = Some(LostRecords { count: 1, first: 7, last: 7 });
        assert!(Xid.run(&fx.ctx())[1].message.contains("1 kernel log record 7 this boot"));
    }

    #[test]
    fn an_unreadable_kernel_log_warns() {
        let fx = Fixture::new(vec![healthy_gpu(0)]);
        let mut ctx = fx.ctx();
        let source = std::io::Error::from_raw_os_error(libc::EACCES);
        ctx.kmsg_error = Some(super::super::kmsg::KmsgError::Open { path: "/dev/kmsg".into(), source });
        let r = Xid.run(&ctx);
        assert_eq!((r.len(), r[0].status), (1, Status::Warn));
        assert!(r[0].message.starts_with("XIDs not checked: cannot open the kernel log /dev/kmsg: "), "{}", r[0].message);
    }
}
