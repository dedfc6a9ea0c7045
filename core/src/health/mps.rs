//! MPS daemons and servers no live job owns (including one on the default
//! pipe directory /tmp/nvidia-mps), through [`crate::mps::find_orphans`].

use super::{Check, CheckResult, Ctx, Status};
use crate::mps::orphans::Blame;

pub struct Mps;

const NAME: &str = "mps";

impl Check for Mps {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&self, ctx: &Ctx) -> Vec<CheckResult> {
        match crate::mps::find_orphans(&ctx.runtime_dir, &ctx.mps_binaries) {
            Err(e) => vec![CheckResult::new(NAME, None, Status::Fail, format!("cannot list MPS daemons: {e}"))],
            Ok(orphans) => vec![judge(&orphans)],
        }
    }
}

/// The node's orphans fail it; users' own daemons only warn: a user must
/// not be able to drain a node by starting MPS by hand (audit item M3).
pub fn judge(orphans: &[crate::mps::OrphanMps]) -> CheckResult {
    let (node, user): (Vec<_>, Vec<_>) = orphans.iter().partition(|o| o.blame == Blame::Node);
    let (status, list, what) = match (node.is_empty(), user.is_empty()) {
        (true, true) => return CheckResult::new(NAME, None, Status::Ok, "no MPS process without a live job"),
        (false, _) => (Status::Fail, node, "orphan MPS"),
        (true, false) => (Status::Warn, user, "MPS started by a user outside slurm-gpu-mode (not a node fault):"),
    };
    let o = list[0];
    let more = if list.len() > 1 { format!(" (+{} more)", list.len() - 1) } else { String::new() };
    CheckResult::new(NAME, None, status, format!("{what} pid {} uid {}: {}{more}", o.pid, o.uid, o.why))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mps::OrphanMps;

    #[test]
    fn the_nodes_orphans_fail_and_users_own_daemons_warn() {
        let o = |pid, blame| OrphanMps { pid, uid: 7, state: 'S', pipe_dir: None, why: "serves the default pipe directory".into(), blame };
        let (node, user) = (Blame::Node, Blame::User);
        let cases = [
            (vec![], Status::Ok, "no MPS process without a live job"),
            (vec![o(5, node)], Status::Fail, "orphan MPS pid 5 uid 7: serves the default pipe directory"),
            (vec![o(5, node), o(6, node)], Status::Fail, "orphan MPS pid 5 uid 7: serves the default pipe directory (+1 more)"),
            (vec![o(4, user), o(5, node)], Status::Fail, "orphan MPS pid 5 uid 7: serves the default pipe directory"),
            (vec![o(4, user)], Status::Warn, "MPS started by a user outside slurm-gpu-mode (not a node fault): pid 4 uid 7: serves the default pipe directory"),
        ];
        for (orphans, status, text) in cases {
            let r = judge(&orphans);
            assert_eq!((r.status, r.message.as_str()), (status, text));
        }
    }
}
