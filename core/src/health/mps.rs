//! MPS daemons and servers no live job owns (including one on the default
//! pipe directory /tmp/nvidia-mps), through [`crate::mps::find_orphans`].

use super::{Check, CheckResult, Ctx, Status};

pub struct Mps;

const NAME: &str = "mps";

impl Check for Mps {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&self, ctx: &Ctx) -> Vec<CheckResult> {
        match crate::mps::find_orphans(&ctx.runtime_dir) {
            Err(e) => vec![CheckResult::new(NAME, None, Status::Fail, format!("cannot list MPS daemons: {e}"))],
            Ok(orphans) => vec![judge(&orphans)],
        }
    }
}

pub fn judge(orphans: &[crate::mps::OrphanMps]) -> CheckResult {
    match orphans.first() {
        None => CheckResult::new(NAME, None, Status::Ok, "no MPS process without a live job"),
        Some(o) => {
            let more = if orphans.len() > 1 { format!(" (+{} more)", orphans.len() - 1) } else { String::new() };
            CheckResult::new(NAME, None, Status::Fail, format!("orphan MPS pid {} uid {}: {}{more}", o.pid, o.uid, o.why))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mps::OrphanMps;

    #[test]
    fn orphans_fail_the_node() {
        let o = |pid| OrphanMps { pid, uid: 7, state: 'S', pipe_dir: None, why: "serves the default pipe directory".into() };
        let cases = [
            (vec![], Status::Ok, "no MPS process without a live job"),
            (vec![o(5)], Status::Fail, "orphan MPS pid 5 uid 7: serves the default pipe directory"),
            (vec![o(5), o(6)], Status::Fail, "orphan MPS pid 5 uid 7: serves the default pipe directory (+1 more)"),
        ];
        for (orphans, status, text) in cases {
            let r = judge(&orphans);
            assert_eq!((r.status, r.message.as_str()), (status, text));
        }
    }
}
