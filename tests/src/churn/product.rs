//! What the product's hooks said they did, from their own log lines in the
//! cluster's `log/hooks.log` (`gpu-mode: action=prolog job=N ... mode=M
//! ... outcome=O`), not from the harness's wrapper around them: each job
//! that Slurm ran has a prolog and an epilog line of its mode, with the
//! outcome its mode calls for.

use std::collections::BTreeMap;

/// One `action=prolog|epilog` line of the product.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookLine {
    pub action: String,
    pub job: String,
    /// The canonical mode, `none` for a job without one.
    pub mode: String,
    pub outcome: String,
}

impl HookLine {
    /// A prolog or epilog line of the product; `None` for anything else
    /// (other actions, the wrapper's own output).
    pub fn parse(line: &str) -> Option<HookLine> {
        let rest = line.strip_prefix("gpu-mode: action=")?;
        let action = rest.split(' ').next()?;
        if action != "prolog" && action != "epilog" {
            return None;
        }
        let word = |key: &str| rest.split(' ').find_map(|w| w.strip_prefix(key)).map(|v| v.trim_matches('"').to_string());
        Some(HookLine { action: action.into(), job: word("job=")?, mode: word("mode=")?, outcome: line.rsplit_once(" outcome=")?.1.to_string() })
    }

    pub fn family(&self) -> &str {
        family(&self.mode)
    }

    /// What the hook did for a job of its mode: `ok`, or `skipped` for a
    /// job without a mode (which the hooks leave alone).
    fn did_its_work(&self) -> bool {
        self.outcome == if self.mode == "none" { "skipped" } else { "ok" }
    }
}

/// `mps` of `mps:threads=25`; `none` stays `none`.
pub fn family(mode: &str) -> &str {
    mode.split(':').next().unwrap_or(mode)
}

/// The product's hook lines of every job, by job id.
pub fn by_job(hooks_log: &str) -> BTreeMap<String, Vec<HookLine>> {
    let mut m: BTreeMap<String, Vec<HookLine>> = BTreeMap::new();
    for l in hooks_log.lines().filter_map(HookLine::parse) {
        m.entry(l.job.clone()).or_default().push(l);
    }
    m
}

/// Why the lines of a job that Slurm ran (planned mode family `family`)
/// do not show both hooks doing their work for that mode, if they do not.
pub fn missing_work(lines: &[HookLine], family: &str) -> Option<String> {
    let done = |action: &str| lines.iter().any(|l| l.action == action && l.family() == family && l.did_its_work());
    match (done("prolog"), done("epilog")) {
        (true, true) => None,
        (prolog, epilog) => Some(format!("the product's hooks did not both do their work for mode family {family} (prolog {prolog}, epilog {epilog}): {lines:?}")),
    }
}

/// Whether a prolog ran for the job (whatever it did) and no epilog followed.
pub fn prolog_without_epilog(lines: &[HookLine]) -> bool {
    let count = |action: &str| lines.iter().filter(|l| l.action == action).count();
    count("prolog") > count("epilog")
}

/// Per canonical mode: jobs whose prolog did its work, jobs whose epilog did.
pub fn work_by_mode(all: &BTreeMap<String, Vec<HookLine>>) -> BTreeMap<String, (usize, usize)> {
    let mut m: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for lines in all.values() {
        for (i, action) in ["prolog", "epilog"].into_iter().enumerate() {
            let mut modes: Vec<&str> = lines.iter().filter(|l| l.action == action && l.did_its_work()).map(|l| l.mode.as_str()).collect();
            modes.dedup();
            for mode in modes {
                let e = m.entry(mode.to_string()).or_default();
                if i == 0 {
                    e.0 += 1;
                } else {
                    e.1 += 1;
                }
            }
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "\
gpu-mode: action=prolog job=3 node=n1 user=gmtest1 uid=1001 gpu=0 mode=\"mps:threads=25\" outcome=ok
hook=prolog job=3 ms=12 rc=0
gpu-mode: action=epilog job=3 node=n1 user=gmtest1 uid=1001 gpu=0 mode=\"mps:threads=25\" detail=\"mps daemon stopped; mode=x\" outcome=ok
gpu-mode: action=prolog job=4 node=n1 user=gmtest2 uid=1002 gpu=1 mode=none outcome=skipped
gpu-mode: action=drain node=n1 reason=\"gpu-mode: x\" outcome=ok
gpu-mode: action=prolog job=5 node=n1 user=gmtest2 uid=1002 gpu=1 mode=checkpoint outcome=ok
gpu-mode: action=epilog job=5 node=n1 user=gmtest2 uid=1002 gpu=1 mode=checkpoint outcome=failed
";

    #[test]
    fn only_the_products_prolog_and_epilog_lines_count() {
        let all = by_job(LOG);
        assert_eq!(all.keys().collect::<Vec<_>>(), ["3", "4", "5"]);
        assert_eq!(all["3"][1], HookLine { action: "epilog".into(), job: "3".into(), mode: "mps:threads=25".into(), outcome: "ok".into() });
        assert_eq!(missing_work(&all["3"], "mps"), None);
        assert!(missing_work(&all["3"], "mig").is_some(), "another family's lines do not count");
        // A prolog without its epilog, and an epilog that failed.
        assert!(prolog_without_epilog(&all["4"]) && missing_work(&all["4"], "none").is_some());
        assert!(!prolog_without_epilog(&all["5"]) && missing_work(&all["5"], "checkpoint").unwrap().contains("epilog false"));
        let work = work_by_mode(&all);
        assert_eq!(work["mps:threads=25"], (1, 1));
        assert_eq!((work["none"], work["checkpoint"]), ((1, 0), (1, 0)));
    }
}
