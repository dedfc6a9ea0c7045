//! What the results mean for the node, as a pure function of (node state,
//! current reason, results). NHC's rules: drain with
//! a `gpu-mode: <check>: <detail>` reason; resume only a node whose reason is
//! the checker's own and only when nothing fails; never touch a node drained
//! or down for another reason (an admin's, or the prolog's and epilog's
//! `gpu-mode: prolog: ...`, `gpu-mode: MPS zombie ...`: faults the checker
//! cannot re-verify, so resuming them would hide them and make retrying an
//! attack easy, audit item M5); never re-drain with the reason already set.

use super::{CheckResult, Status};
use crate::drain::{drain_reason, NodeStatus};
use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Action {
    /// `reason` is the full reason, `gpu-mode: ...`.
    Drain { reason: String },
    Resume,
    Nothing,
}

/// The drain detail of the first failing result, in check order, with how
/// many more fail: `memory: GPU 1: row remap pending: GPU reset needed`.
pub fn fail_detail(results: &[CheckResult]) -> Option<String> {
    let fails: Vec<&CheckResult> = results.iter().filter(|r| r.status == Status::Fail).collect();
    let first = fails.first()?;
    let gpu = first.gpu.map(|g| format!("GPU {g}: ")).unwrap_or_default();
    let more = if fails.len() > 1 { format!(" (+{} more)", fails.len() - 1) } else { String::new() };
    Some(format!("{}: {gpu}{}{more}", first.check, first.message))
}

/// The check that names a drain (the first failing, as in [`fail_detail`]):
/// the drain's metric label, one of [`super::CHECK_NAMES`].
pub fn failing_check(results: &[CheckResult]) -> Option<&'static str> {
    let first = results.iter().find(|r| r.status == Status::Fail)?;
    Some(super::CHECK_NAMES.iter().copied().find(|name| *name == first.check).unwrap_or("other"))
}

/// Slurm shows a reason as `<text> [user@time]`; the text alone.
fn reason_text(reason: &str) -> &str {
    match reason.rfind(" [") {
        Some(i) if reason.ends_with(']') => &reason[..i],
        _ => reason,
    }
}

/// Whether a drain reason is one the checker set: `gpu-mode: <check>: ...`
/// with one of [`super::CHECK_NAMES`].
pub fn is_checker_reason(reason: &str) -> bool {
    let Some(rest) = reason_text(reason).strip_prefix(crate::drain::DRAIN_PREFIX) else { return false };
    rest.trim_start().split_once(':').is_some_and(|(check, _)| super::CHECK_NAMES.contains(&check))
}

pub fn decide(node: &NodeStatus, results: &[CheckResult]) -> Action {
    let out_of_service = node.is_drained_or_down();
    let ours = is_checker_reason(&node.reason);
    match fail_detail(results) {
        Some(detail) => {
            let reason = drain_reason(&detail);
            if out_of_service && (!ours || reason_text(&node.reason) == reason) {
                // Someone else's drain stays; ours with the same reason too.
                Action::Nothing
            } else {
                Action::Drain { reason }
            }
        }
        None if out_of_service && ours => Action::Resume,
        None => Action::Nothing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(check: &str, gpu: Option<u32>, status: Status, msg: &str) -> CheckResult {
        CheckResult::new(check, gpu, status, msg)
    }

    #[test]
    fn the_first_failing_check_labels_the_drain() {
        let cases: Vec<(Vec<CheckResult>, Option<&str>)> = vec![
            (vec![r("driver", None, Status::Ok, "ok")], None),
            (vec![r("driver", None, Status::Ok, "ok"), r("memory", Some(1), Status::Fail, "row remap pending")], Some("memory")),
            (vec![r("xid", Some(0), Status::Fail, "XID 79"), r("memory", Some(1), Status::Fail, "x")], Some("xid")),
            (vec![r("made-up", None, Status::Fail, "x")], Some("other")),
        ];
        for (results, want) in cases {
            assert_eq!(failing_check(&results), want, "{results:?}");
        }
    }

    #[test]
    fn the_decision_table() {
        let healthy = vec![r("driver", None, Status::Ok, "ok"), r("persistence", None, Status::Warn, "legacy persistence"), r("fabric", Some(0), Status::Skipped, "none")];
        let remap = vec![r("driver", None, Status::Ok, "ok"), r("memory", Some(1), Status::Fail, "row remap pending: GPU reset needed")];
        let two = vec![r("xid", Some(0), Status::Fail, "XID 79 this boot"), r("memory", Some(1), Status::Fail, "x")];
        let remap_reason = "gpu-mode: memory: GPU 1: row remap pending: GPU reset needed";
        let drain = |s: &str| Action::Drain { reason: s.to_string() };
        let cases: Vec<(&str, &str, &Vec<CheckResult>, Action)> = vec![
            // In service.
            ("IDLE", "", &healthy, Action::Nothing),
            ("MIXED", "", &remap, drain(remap_reason)),
            ("ALLOCATED", "", &two, drain("gpu-mode: xid: GPU 0: XID 79 this boot (+1 more)")),
            // Drained by us.
            ("IDLE+DRAIN", "gpu-mode: memory: GPU 1: row remap pending: GPU reset needed [root@2026-11-21T05:16:06]", &remap, Action::Nothing),
            ("IDLE+DRAIN", remap_reason, &remap, Action::Nothing),
            ("IDLE+DRAIN", "gpu-mode: xid: GPU 0: XID 79 this boot [root@t]", &remap, drain(remap_reason)),
            ("IDLE+DRAIN", "gpu-mode: memory: GPU 1: row remap pending [root@t]", &healthy, Action::Resume),
            // The prolog's and epilog's faults are not the checker's to clear
            // or to rewrite.
            ("DOWN*+DRAIN", "gpu-mode: prolog: cannot write job state [root@t]", &healthy, Action::Nothing),
            ("IDLE+DRAIN", "gpu-mode: MPS zombie pid 12 (job 7, GPU GPU-1) [root@t]", &healthy, Action::Nothing),
            ("IDLE+DRAIN", "gpu-mode: epilog: mps teardown: x [root@t]", &remap, Action::Nothing),
            ("MIXED+DRAIN", "gpu-mode: xid: x [root@t]", &healthy, Action::Resume),
            // Drained or down for someone else's reason: never touched.
            ("IDLE+DRAIN", "admin: bad fan [root@t]", &healthy, Action::Nothing),
            ("IDLE+DRAIN", "admin: bad fan [root@t]", &remap, Action::Nothing),
            ("DOWN*", "Not responding [slurm@t]", &healthy, Action::Nothing),
            ("DOWN", "", &remap, Action::Nothing),
            ("IDLE+DRAIN", "Kill task failed", &healthy, Action::Nothing),
        ];
        for (state, reason, results, want) in cases {
            let node = NodeStatus { state: state.into(), reason: reason.into() };
            assert_eq!(decide(&node, results), want, "state {state:?} reason {reason:?}");
        }
    }

    #[test]
    fn the_reason_is_one_bounded_line() {
        let long = vec![r("leftovers", Some(3), Status::Fail, &format!("pids {}\nmore", "1, ".repeat(200)))];
        let Action::Drain { reason } = decide(&NodeStatus::default(), &long) else { panic!("must drain") };
        assert!(reason.starts_with("gpu-mode: leftovers: GPU 3: pids 1, "), "{reason}");
        assert!(reason.len() <= crate::drain::MAX_REASON_LEN && !reason.contains('\n'), "{reason}");
    }
}
