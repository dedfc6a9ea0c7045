//! nftables tables CRIU's network locks left on the node (issue 37 N2): a
//! `CRIU-*` table no record of this node's claims for an image that is
//! still complete drops the packets of the connections it names, both
//! ways, for good (a root program reusing one of those ports times out).
//! The epilogs' sweep deletes them (preempt::netlock); this check only
//! warns, never drains: the tables are the node's to clean, not a fault of
//! its GPUs.

use super::{Check, CheckResult, Ctx, Status};
use crate::preempt::netlock::{Claim, NftError};

pub struct NetLocks;

const NAME: &str = "criu_locks";

impl Check for NetLocks {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&self, ctx: &Ctx) -> Vec<CheckResult> {
        let Some(locks) = &ctx.netlocks else {
            return vec![CheckResult::new(NAME, None, Status::Skipped, "checkpoint mode is not configured")];
        };
        vec![judge(locks.claims())]
    }
}

/// Ok while every CRIU table is claimed by a complete image (or may be a
/// dump's under way); a warning naming the others; skipped without nft.
pub fn judge(claims: Result<Vec<(String, Claim)>, NftError>) -> CheckResult {
    let claims = match claims {
        Ok(c) => c,
        Err(e @ NftError::Missing(_)) => return CheckResult::new(NAME, None, Status::Skipped, e.to_string()),
        Err(e) => return CheckResult::new(NAME, None, Status::Warn, format!("cannot list nftables tables: {e}")),
    };
    let stray: Vec<String> = claims
        .iter()
        .filter_map(|(t, c)| match c {
            Claim::Unclaimed => Some(format!("{t} (no record)")),
            Claim::Stale(r) => Some(format!("{t} (job {}: its image is gone)", r.job)),
            Claim::Image(_) | Claim::MaybeDumping => None,
        })
        .collect();
    if stray.is_empty() {
        let held = claims.len();
        return CheckResult::new(NAME, None, Status::Ok, format!("{held} CRIU network lock(s), each kept for an image of this node"));
    }
    CheckResult::new(
        NAME,
        None,
        Status::Warn,
        format!(
            "{} stray CRIU network lock(s) drop their connections' packets (a checkpoint job's epilog removes them): {}",
            stray.len(),
            stray.join(", ")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preempt::netlock::LockRecord;

    #[test]
    fn stray_tables_warn_and_claimed_ones_do_not() {
        let r = || LockRecord { job: 7, run_dir: "/img/7/0".into() };
        let t = |n: u8| format!("CRIU-{0}{0}{0}{0}{0}{0}{0}{0}-1111-4111-81", n);
        let cases: Vec<(Result<Vec<(String, Claim)>, NftError>, Status, String)> = vec![
            (Ok(vec![]), Status::Ok, "0 CRIU network lock(s), each kept for an image of this node".into()),
            (Ok(vec![(t(1), Claim::Image(r())), (t(2), Claim::MaybeDumping)]), Status::Ok, "2 CRIU network lock(s), each kept for an image of this node".into()),
            (
                Ok(vec![(t(1), Claim::Image(r())), (t(2), Claim::Unclaimed), (t(3), Claim::Stale(r()))]),
                Status::Warn,
                format!(
                    "2 stray CRIU network lock(s) drop their connections' packets (a checkpoint job's epilog removes them): {} (no record), {} (job 7: its image is gone)",
                    t(2),
                    t(3)
                ),
            ),
            (Err(NftError::Missing("/usr/sbin/nft".into())), Status::Skipped, "/usr/sbin/nft is missing: CRIU's network locks cannot be listed or removed here".into()),
            (Err(NftError::Failed("nft list tables: Operation not permitted".into())), Status::Warn, "cannot list nftables tables: nft list tables: Operation not permitted".into()),
        ];
        for (claims, status, text) in cases {
            let got = judge(claims);
            assert_eq!((got.status, got.message.as_str()), (status, text.as_str()));
        }
    }
}
