//! The status as one screen of text, or as JSON (schema: docs/admin.md).

use super::StatusReport;
use crate::log::{printable, terminal_json};
use std::fmt::Arguments;

impl StatusReport {
    /// The JSON for the admin's terminal (or a script): the user's text in
    /// it (see [`Self::to_table`]) holds no control, bidirectional or
    /// invisible character raw, only `\uXXXX` escapes, which a JSON parser
    /// reads back as the text itself (issue 37 N4; `log::terminal_json`).
    pub fn to_json(&self) -> String {
        terminal_json(self)
            .or_else(|e| terminal_json(&serde_json::json!({ "error": format!("cannot serialize: {e}") })))
            .unwrap_or_default()
            + "\n"
    }

    /// One screen of text for the admin's terminal. The job's user wrote
    /// some of it (a refused mode value, paths in restore refusals): every
    /// line goes through [`put`], so no control, bidirectional or invisible
    /// character reaches the terminal raw and no value spans lines (issue 27
    /// F4, issue 37 N4: `log::is_unsafe_for_terminal`).
    pub fn to_table(&self) -> String {
        let mut s = String::new();
        let node = self.node.as_deref().unwrap_or("(unknown node)");
        let verdict = if self.healthy { "OK".to_string() } else { format!("NEEDS THE ADMIN ({} problem(s))", self.records.problems.len()) };
        put(&mut s, format_args!("gpu-mode status of {node}: {verdict}"));
        match (&self.slurm, &self.slurm_error) {
            (Some(n), _) if n.reason.is_empty() => put(&mut s, format_args!("slurm: {}", n.state)),
            (Some(n), _) => put(&mut s, format_args!("slurm: {} ({})", n.state, n.reason)),
            // scontrol's last line says why (the first ones are its retries).
            (None, Some(e)) => put(&mut s, format_args!("slurm: unknown: {}", e.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or(e))),
            (None, None) => {}
        }
        match &self.records.last_drain {
            Some(d) => put(&mut s, format_args!("last drain we set: {} ({})", d.reason, ago(d.unix, crate::persist::now_unix()))),
            None => put(&mut s, format_args!("last drain we set: none since boot")),
        }
        self.gpu_section(&mut s);
        self.record_sections(&mut s);
        self.readiness_section(&mut s);
        title(&mut s, "PROBLEMS");
        if self.records.problems.is_empty() {
            put(&mut s, format_args!("  (none)"));
        }
        for p in &self.records.problems {
            put(&mut s, format_args!("  - {p}"));
        }
        s
    }

    fn gpu_section(&self, s: &mut String) {
        let rows: Vec<Vec<String>> = self
            .gpus
            .iter()
            .map(|r| {
                let g = &r.gpu;
                let jobs: Vec<String> = r.jobs.iter().map(|j| format!("{} {} ({})", j.job, j.mode, j.user)).collect();
                vec![
                    g.index.to_string(),
                    g.name.clone(),
                    g.uuid.clone(),
                    g.compute_mode.clone().unwrap_or_else(|| "?".into()),
                    g.mig.map_or("-".into(), |m| if m { "on".into() } else { "off".into() }),
                    if jobs.is_empty() { "-".into() } else { jobs.join(", ") },
                ]
            })
            .collect();
        section(s, "GPUS", &["GPU", "NAME", "UUID", "COMPUTE", "MIG", "JOBS"], rows);
        if let Some(e) = &self.gpu_error {
            put(s, format_args!("  NVML: {e}"));
        }
    }

    fn record_sections(&self, s: &mut String) {
        let r = &self.records;
        let list = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        let jobs = r
            .jobs
            .iter()
            .map(|j| vec![j.job.to_string(), j.user.clone(), j.mode.clone(), j.status.clone(), list(&j.gpus), j.refusal.clone().unwrap_or_else(|| "-".into())])
            .collect();
        section(s, "JOBS", &["JOB", "USER", "MODE", "STATUS", "GPUS", "REFUSED"], jobs);
        let mps = r
            .mps_daemons
            .iter()
            .map(|d| vec![d.key.clone(), d.uid.to_string(), list(&d.gpus), d.pid.map_or("-".into(), |p| p.to_string()), d.running.to_string(), list(&d.jobs)])
            .collect();
        section(s, "MPS DAEMONS", &["KEY", "UID", "GPUS", "PID", "RUNNING", "JOBS"], mps);
        let mig = r
            .mig_instances
            .iter()
            .map(|m| vec![m.job.to_string(), m.gpu.to_string(), m.profile.clone(), m.uuid.clone(), if m.made { "made".into() } else { "found".into() }])
            .collect();
        section(s, "MIG INSTANCES", &["JOB", "GPU", "PROFILE", "UUID", "ORIGIN"], mig);
        let agents = r.agents.iter().map(|a| vec![a.job.to_string(), a.socket.clone()]).collect();
        section(s, "CHECKPOINT AGENTS", &["JOB", "SOCKET"], agents);
        let images = r
            .images
            .iter()
            .map(|i| {
                let why = if i.kept_because.is_empty() { "-".to_string() } else { i.kept_because.join("; ") };
                vec![i.job.to_string(), i.run.to_string(), i.state.clone(), i.bytes.to_string(), why]
            })
            .collect();
        section(s, "CHECKPOINT IMAGES", &["JOB", "RUN", "STATE", "BYTES", "KEPT BECAUSE"], images);
    }
}

impl StatusReport {
    /// The node checker's last checkpoint readiness verdict, each check's
    /// line with its fix.
    fn readiness_section(&self, s: &mut String) {
        let Some(v) = &self.checkpoint_readiness else {
            title(s, "CHECKPOINT READINESS");
            put(s, format_args!("  (not checked yet: gpu-mode-node-checker writes it at each run)"));
            return;
        };
        let verdict = match (v.ready(), v.bounded()) {
            (false, _) => "NOT READY",
            (true, true) => "ready, bounded",
            (true, false) => "ready",
        };
        let word = |i: &crate::preempt::readiness::Item| match (i.ready, i.bounds_only) {
            (true, _) => "ok",
            (false, true) => "BOUNDED",
            (false, false) => "NOT READY",
        };
        let rows = v.items.iter().map(|i| vec![i.check.clone(), word(i).into(), i.message.clone()]).collect();
        let when = ago(v.checked_unix, crate::persist::now_unix());
        section(s, &format!("CHECKPOINT READINESS: {verdict} (node checker, {when})"), &["CHECK", "VERDICT", "FINDING AND FIX"], rows);
    }
}

/// One line of the table: the characters unsafe for a terminal escaped
/// (`log::printable`), then a newline.
fn put(s: &mut String, line: Arguments) {
    s.push_str(&printable(&line.to_string()));
    s.push('\n');
}

/// A blank line, then a section's title.
fn title(s: &mut String, title: &str) {
    put(s, format_args!(""));
    put(s, format_args!("{title}"));
}

/// A titled table with aligned columns, or `(none)`. Cells are escaped
/// before the columns are measured, so that they stay aligned.
fn section(s: &mut String, name: &str, header: &[&str], rows: Vec<Vec<String>>) {
    title(s, name);
    if rows.is_empty() {
        put(s, format_args!("  (none)"));
        return;
    }
    let rows: Vec<Vec<String>> = rows.iter().map(|r| r.iter().map(|c| printable(c)).collect()).collect();
    let widths: Vec<usize> = (0..header.len()).map(|c| rows.iter().map(|r| r[c].len()).chain([header[c].len()]).max().unwrap_or(0)).collect();
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        format!("  {}", padded.join("  ").trim_end())
    };
    put(s, format_args!("{}", line(header.to_vec())));
    for r in &rows {
        put(s, format_args!("{}", line(r.iter().map(String::as_str).collect())));
    }
}

/// How long ago a Unix time was, e.g. `3h 12m ago`: what an admin at the
/// node wants to know of a drain (JSON keeps the time itself).
fn ago(unix: u64, now: u64) -> String {
    let secs = now.saturating_sub(unix);
    match secs {
        0..=59 => format!("{secs}s ago"),
        60..=3599 => format!("{}m ago", secs / 60),
        3600..=86_399 => format!("{}h {}m ago", secs / 3600, secs / 60 % 60),
        _ => format!("{}d {}h ago", secs / 86_400, secs / 3600 % 24),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ages() {
        for (secs, want) in [(0, "0s ago"), (59, "59s ago"), (60, "1m ago"), (3_600 + 120, "1h 2m ago"), (2 * 86_400 + 3 * 3600, "2d 3h ago")] {
            assert_eq!(super::ago(1_000_000, 1_000_000 + secs), want);
        }
    }
}
