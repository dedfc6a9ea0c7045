//! The agent's two limits on what a refused request may cost root
//! (security review F3): a request budget per uid (a token bucket) and a
//! cap on refusal log lines per uid and window. Both take the time as an
//! argument, so the tests drive them with made-up instants, never sleeps.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A token bucket's shape: `burst` requests at once, refilled at
/// `per_second` up to `burst` again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Budget {
    pub burst: f64,
    pub per_second: f64,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    filled_at: Instant,
    /// Requests refused since `refused_since` (reported to the caller).
    refused: u32,
    refused_since: Instant,
}

impl Bucket {
    fn full(budget: Budget, now: Instant) -> Bucket {
        Bucket { tokens: budget.burst, filled_at: now, refused: 0, refused_since: now }
    }

    fn refill(&mut self, budget: Budget, now: Instant) {
        let elapsed = now.saturating_duration_since(self.filled_at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * budget.per_second).min(budget.burst);
        self.filled_at = now;
    }

    /// Counts a refusal; the count starts again once `window` has passed.
    fn refuse(&mut self, window: Duration, now: Instant) -> u32 {
        if now.saturating_duration_since(self.refused_since) >= window {
            self.refused = 0;
            self.refused_since = now;
        }
        self.refused += 1;
        self.refused
    }
}

/// A request over its uid's budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverBudget {
    pub uid: u32,
    /// Requests of `uid` refused for the budget within the last `window`.
    pub refused: u32,
    pub window: Duration,
}

impl std::fmt::Display for OverBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (uid, refused, secs) = (self.uid, self.refused, self.window.as_secs());
        write!(f, "too many requests from uid {uid}: {refused} refused in the last {secs} s; try again later")
    }
}

/// A token bucket per peer uid. Root is exempt: the epilog's `stop` must
/// always get through. Only the job's user and root can connect (the
/// socket is the user's, 0600), so the map stays small.
pub struct RequestBudget {
    budget: Budget,
    window: Duration,
    buckets: HashMap<u32, Bucket>,
}

impl RequestBudget {
    pub fn new(budget: Budget, window: Duration) -> RequestBudget {
        RequestBudget { budget, window, buckets: HashMap::new() }
    }

    /// Takes one request of `uid` from its bucket, or says it is over budget.
    pub fn take(&mut self, uid: u32, now: Instant) -> Result<(), OverBudget> {
        if uid == 0 {
            return Ok(());
        }
        let bucket = self.buckets.entry(uid).or_insert_with(|| Bucket::full(self.budget, now));
        bucket.refill(self.budget, now);
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Ok(());
        }
        Err(OverBudget { uid, refused: bucket.refuse(self.window, now), window: self.window })
    }
}

/// What to log for one refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogVerdict {
    /// Whether this refusal gets its line.
    pub log: bool,
    /// Refusals of an earlier window that went unlogged: one line says so.
    pub suppressed_before: u32,
}

#[derive(Debug)]
struct Window {
    start: Instant,
    logged: u32,
    suppressed: u32,
}

/// At most `lines` refusal lines per uid in each `window`; the rest are
/// counted, and their number is logged in one line once the window has
/// ended (with the uid's next refusal, or at the agent's exit: [`LogLimit::drain`]).
pub struct LogLimit {
    lines: u32,
    window: Duration,
    windows: HashMap<u32, Window>,
}

impl LogLimit {
    pub fn new(lines: u32, window: Duration) -> LogLimit {
        LogLimit { lines, window, windows: HashMap::new() }
    }

    pub fn admit(&mut self, uid: u32, now: Instant) -> LogVerdict {
        let fresh = || Window { start: now, logged: 0, suppressed: 0 };
        let w = self.windows.entry(uid).or_insert_with(fresh);
        let mut suppressed_before = 0;
        if now.saturating_duration_since(w.start) >= self.window {
            suppressed_before = w.suppressed;
            *w = fresh();
        }
        let log = w.logged < self.lines;
        if log {
            w.logged += 1;
        } else {
            w.suppressed += 1;
        }
        LogVerdict { log, suppressed_before }
    }

    /// The unlogged refusals of each uid, not yet reported; forgets them.
    pub fn drain(&mut self) -> Vec<(u32, u32)> {
        let mut left: Vec<(u32, u32)> = self.windows.iter_mut().map(|(uid, w)| (*uid, std::mem::take(&mut w.suppressed))).collect();
        left.retain(|(_, n)| *n > 0);
        left.sort_unstable();
        left
    }

    /// (logged, suppressed) in `uid`'s current window.
    #[cfg(test)]
    pub fn counts(&self, uid: u32) -> (u32, u32) {
        self.windows.get(&uid).map_or((0, 0), |w| (w.logged, w.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUDGET: Budget = Budget { burst: 3.0, per_second: 2.0 };
    const WINDOW: Duration = Duration::from_secs(60);

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    #[test]
    fn the_budget_allows_a_burst_then_its_refill_rate_and_root_always() {
        // (uid, ms since start, admitted?)
        let cases: &[(u32, u64, bool)] = &[
            (1000, 0, true),
            (1000, 0, true),
            (1000, 0, true),
            (1000, 0, false), // the burst is spent
            (0, 0, true),     // root is exempt
            (1001, 0, true),  // another uid has its own bucket
            (1000, 400, false),
            (1000, 500, true), // one token back after 0.5 s at 2/s
            (1000, 500, false),
            (1000, 60_000, true), // full again, never above the burst
            (1000, 60_000, true),
            (1000, 60_000, true),
            (1000, 60_000, false),
        ];
        let base = Instant::now();
        let mut budget = RequestBudget::new(BUDGET, WINDOW);
        for (i, (uid, ms, admitted)) in cases.iter().enumerate() {
            assert_eq!(budget.take(*uid, at(base, *ms)).is_ok(), *admitted, "case {i}: uid {uid} at {ms} ms");
        }
        for _ in 0..10_000 {
            assert!(budget.take(0, base).is_ok(), "root is never over budget");
        }
    }

    #[test]
    fn an_over_budget_answer_says_how_many_were_refused_in_the_window() {
        let base = Instant::now();
        let mut budget = RequestBudget::new(Budget { burst: 1.0, per_second: 0.0 }, WINDOW);
        budget.take(1000, base).unwrap();
        let refused: Vec<u32> = [0, 1, 59_999, 60_000, 60_001].iter().map(|ms| budget.take(1000, at(base, *ms)).unwrap_err().refused).collect();
        assert_eq!(refused, [1, 2, 3, 1, 2], "the count starts again after the window");
        let over = budget.take(1000, at(base, 60_002)).unwrap_err();
        assert_eq!(over.to_string(), "too many requests from uid 1000: 3 refused in the last 60 s; try again later");
    }

    #[test]
    fn refusal_lines_are_capped_per_uid_and_window_and_the_rest_reported_once() {
        // (uid, seconds since start, logged?, suppressed_before)
        let cases: &[(u32, u64, bool, u32)] = &[
            (1000, 0, true, 0),
            (1000, 1, true, 0),
            (1000, 2, false, 0),
            (1000, 3, false, 0),
            (1001, 3, true, 0), // another uid has its own lines
            (1000, 59, false, 0),
            (1000, 60, true, 3), // a new window: the 3 unlogged are reported
            (1000, 61, true, 0),
            (1000, 62, false, 0),
            (1000, 200, true, 1),
            (1000, 300, true, 0), // a window without suppressed lines reports nothing
        ];
        let base = Instant::now();
        let mut limit = LogLimit::new(2, WINDOW);
        for (i, (uid, s, log, before)) in cases.iter().enumerate() {
            let want = LogVerdict { log: *log, suppressed_before: *before };
            assert_eq!(limit.admit(*uid, at(base, s * 1000)), want, "case {i}: uid {uid} at {s} s");
        }
    }

    #[test]
    fn draining_reports_each_uids_unlogged_refusals_once() {
        let base = Instant::now();
        let mut limit = LogLimit::new(1, WINDOW);
        for uid in [1000, 1000, 1000, 1001, 1002, 1002] {
            limit.admit(uid, base);
        }
        assert_eq!(limit.drain(), [(1000, 2), (1002, 1)]);
        assert_eq!(limit.drain(), [], "reported once");
        assert_eq!(limit.admit(1000, at(base, 60_000)), LogVerdict { log: true, suppressed_before: 0 });
    }
}
