//! A job's checkpoint and restore events in its Slurm record, where admins
//! already look: `scontrol show job`, and `sacct -o AdminComment` where
//! Slurm keeps accounting. The agent (root, so it may write AdminComment)
//! appends one event per checkpoint or restore to a section of its own,
//!
//! ```text
//! site text gpu-mode{ckpt=r0@n1:8.1s/9.3GiB;restore=r1@n2:5.2s;ckpt-failed=r1@n2:0.4s}
//! ```
//!
//! in the field `preempt.accounting` names (`admin_comment`, `comment` or
//! `off`). The site's own text outside the section is kept as it is (only
//! the blanks between it and the section are normalised to one space).
//!
//! Event: `<kind>=r<run>@<node>:<seconds>s[/<image size>]`; kinds `ckpt`,
//! `ckpt-failed`, `restore`, `restore-failed`; run is SLURM_RESTART_COUNT
//! (a restore in run 1 brings back the checkpoint of run 0); seconds are the
//! agent's own total (CUDA + CRIU + sealing, or checks + CRIU + CUDA). The
//! section stays within [`MAX_SECTION`] and the field within
//! [`FIELD_LIMIT`]: the oldest events then give way to a leading
//! `omitted=ckpt:3,restore:3` that keeps the counts, so "how many times was
//! this job checkpointed" stays answerable. When the site's text leaves no
//! room even for that, nothing is written (the site's text wins).
//!
//! The field is read with squeue, which prints it alone
//! ([`job_value`]): `scontrol show job` prints the user's JobName, Command,
//! WorkDir and SubmitLine raw before it, and a name holding
//! `\nAdminComment=...` was once read as the admin's text (issue 27 F2).
//! Reading and writing the field is two calls (squeue, then scontrol
//! update), not atomic: a site that changes the same field in the very same moment
//! may lose one of the two writes. Comment is the job owner's to change, so
//! a record there is only as trustworthy as the user; AdminComment is not.

use crate::drain::{DrainError, Scontrol};
use std::collections::BTreeMap;

/// Opens our section; it ends at the next `}`.
pub const SECTION_START: &str = "gpu-mode{";
const SECTION_END: char = '}';
/// Our section never grows past this (bytes): the field is the site's too.
pub const MAX_SECTION: usize = 400;
/// slurmctld refuses a Comment over 1024 bytes (job_mgr.c,
/// `_test_job_desc_fields`, 22.05 to 26.05) and stores AdminComment
/// unchecked; both are kept within it.
pub const FIELD_LIMIT: usize = 1024;
/// Node names are cut to this in an event.
const MAX_NODE: usize = 64;

/// `preempt.accounting`: configuration's; what it means for Slurm is here.
pub use crate::config::AccountingField;

/// The field's name in `scontrol show job` and `scontrol update`.
pub fn slurm_key(field: AccountingField) -> Option<&'static str> {
    match field {
        AccountingField::AdminComment => Some("AdminComment"),
        AccountingField::Comment => Some("Comment"),
        AccountingField::Off => None,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum EventKind {
    Checkpoint,
    CheckpointFailed,
    Restore,
    RestoreFailed,
}

const KINDS: [(EventKind, &str); 4] = [
    (EventKind::Checkpoint, "ckpt"),
    (EventKind::CheckpointFailed, "ckpt-failed"),
    (EventKind::Restore, "restore"),
    (EventKind::RestoreFailed, "restore-failed"),
];

impl EventKind {
    fn token(self) -> &'static str {
        KINDS.iter().find(|(k, _)| *k == self).map_or("?", |(_, t)| t)
    }

    fn from_token(t: &str) -> Option<EventKind> {
        KINDS.iter().find(|(_, n)| *n == t).map(|(k, _)| *k)
    }
}

/// One checkpoint or restore, as the agent saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub kind: EventKind,
    /// SLURM_RESTART_COUNT of the run it happened in.
    pub run: u32,
    pub node: String,
    pub seconds: f64,
    /// The image's size (checkpoints and restores that have one).
    pub image_bytes: Option<u64>,
}

impl Event {
    /// `ckpt=r0@n1:8.1s/9.3GiB`. The node name is reduced to the characters
    /// Slurm allows in one (anything else becomes `_`), so an event never
    /// holds a delimiter of the section.
    pub fn token(&self) -> String {
        let node: String =
            self.node.chars().take(MAX_NODE).map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).collect();
        let seconds = if self.seconds.is_finite() { self.seconds.max(0.0) } else { 0.0 };
        let size = self.image_bytes.map(|b| format!("/{}", size_text(b))).unwrap_or_default();
        format!("{}=r{}@{}:{seconds:.1}s{size}", self.kind.token(), self.run, if node.is_empty() { "_" } else { &node })
    }
}

/// `9.3GiB` from 1 GiB on, `12MiB` below (rounded up: a small image is not 0).
fn size_text(bytes: u64) -> String {
    const MIB: u64 = 1 << 20;
    if bytes >= 1 << 30 {
        format!("{:.1}GiB", bytes as f64 / (1u64 << 30) as f64)
    } else {
        format!("{}MiB", bytes.div_ceil(MIB))
    }
}

/// What [`token`](Event::token) writes: checked when our section is read
/// back, so text we did not write is never taken for ours.
fn is_event_token(t: &str) -> Option<EventKind> {
    let (kind, rest) = t.split_once('=')?;
    let kind = EventKind::from_token(kind)?;
    let rest = rest.strip_prefix('r')?;
    let (run, rest) = rest.split_once('@')?;
    let (node, rest) = rest.rsplit_once(':')?;
    let (seconds, size) = match rest.split_once('/') {
        Some((s, size)) => (s, Some(size)),
        None => (rest, None),
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let decimal = |s: &str| s.split_once('.').is_some_and(|(a, b)| digits(a) && digits(b));
    let node_ok = !node.is_empty() && node.len() <= MAX_NODE && node.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    let seconds_ok = seconds.strip_suffix('s').is_some_and(decimal);
    let size_ok = size.is_none_or(|s| s.strip_suffix("GiB").is_some_and(decimal) || s.strip_suffix("MiB").is_some_and(digits));
    (digits(run) && node_ok && seconds_ok && size_ok).then_some(kind)
}

/// Our section: counts of events that gave way, then the events, oldest first.
#[derive(Debug, Clone, Default, PartialEq)]
struct Section {
    omitted: BTreeMap<EventKind, u64>,
    events: Vec<(EventKind, String)>,
}

impl Section {
    /// The inside of `gpu-mode{...}`; `None` unless every item is ours.
    fn parse(inner: &str) -> Option<Section> {
        let mut s = Section::default();
        for (i, item) in inner.split(';').enumerate() {
            if let Some(counts) = item.strip_prefix("omitted=").filter(|_| i == 0) {
                for c in counts.split(',') {
                    let (kind, n) = c.split_once(':')?;
                    *s.omitted.entry(EventKind::from_token(kind)?).or_default() += n.parse::<u64>().ok()?;
                }
            } else {
                s.events.push((is_event_token(item)?, item.to_string()));
            }
        }
        Some(s)
    }

    /// A later section's events after this one's.
    fn append(&mut self, later: Section) {
        for (k, n) in later.omitted {
            *self.omitted.entry(k).or_default() += n;
        }
        self.events.extend(later.events);
    }

    fn text(&self) -> String {
        let mut items = Vec::new();
        if !self.omitted.is_empty() {
            let counts: Vec<String> = self.omitted.iter().map(|(k, n)| format!("{}:{n}", k.token())).collect();
            items.push(format!("omitted={}", counts.join(",")));
        }
        items.extend(self.events.iter().map(|(_, t)| t.clone()));
        format!("{SECTION_START}{}{SECTION_END}", items.join(";"))
    }

    /// Drops the oldest event into the counts; false when none is left.
    fn give_way(&mut self) -> bool {
        if self.events.is_empty() {
            return false;
        }
        let (kind, _) = self.events.remove(0);
        *self.omitted.entry(kind).or_default() += 1;
        true
    }
}

/// Splits a field into the site's text and our section(s). A `gpu-mode{`
/// whose inside is not entirely ours stays with the site's text.
fn split_field(field: &str) -> (String, Section) {
    let mut site: Vec<&str> = Vec::new();
    let mut ours = Section::default();
    // The site's current piece starts at `piece`; the next section is looked for from `from`.
    let (mut piece, mut from) = (0, 0);
    while let Some(found) = field[from..].find(SECTION_START) {
        let inner = from + found + SECTION_START.len();
        let Some(len) = field[inner..].find(SECTION_END) else { break };
        match Section::parse(&field[inner..inner + len]) {
            Some(section) => {
                site.push(&field[piece..from + found]);
                ours.append(section);
                piece = inner + len + 1;
                from = piece;
            }
            None => from = inner,
        }
    }
    site.push(&field[piece..]);
    // Pieces that met at a removed section join with one space; the site's
    // text inside each piece stays as it was.
    let last = site.len() - 1;
    let pieces: Vec<&str> = site
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let p = if i > 0 { p.trim_start() } else { p };
            if i < last { p.trim_end() } else { p }
        })
        .filter(|p| !p.is_empty())
        .collect();
    let text = pieces.join(" ");
    (text.trim().to_string(), ours)
}

/// Why an event was not recorded: the field was not read whole, or the
/// site's text leaves no room, or Slurm refused. Each leaves the field as it
/// is (never a rewrite of what was not read); the agent logs the words, and
/// the job's checkpoint or restore is not affected.
#[derive(Debug, thiserror::Error)]
pub enum AccountingError {
    /// merge: not even `omitted=...` fits beside the site's text.
    #[error("the field's own text ({site_bytes} bytes) leaves no room for the gpu-mode section within Slurm's {limit} bytes: left as it is", limit = FIELD_LIMIT)]
    NoRoom { site_bytes: usize },
    /// Several lines (an array's tasks, a value with a newline) or none.
    #[error("squeue printed {count} lines for the job, not one: left as it is")]
    Lines { count: usize },
    /// The value reaches squeue's width: it may have been cut there.
    #[error("the value may run past squeue's {width} bytes: left as it is", width = SQUEUE_WIDTH)]
    MayBeCut,
    /// squeue printed nothing, or said the job id is invalid.
    #[error("Slurm no longer knows job {job}: left as it is")]
    UnknownJob { job: u32 },
    /// squeue failed or timed out.
    #[error(transparent)]
    Read(DrainError),
    /// `scontrol update` failed or timed out.
    #[error(transparent)]
    Update(DrainError),
}

/// The field's new value: `current` with `event` added to our section.
/// Errors only when the site's text leaves no room for the section.
pub fn merge(current: &str, event: &Event) -> Result<String, AccountingError> {
    let (site, mut section) = split_field(current);
    section.events.push((event.kind, event.token()));
    let separator = usize::from(!site.is_empty());
    let room = MAX_SECTION.min(FIELD_LIMIT.saturating_sub(site.len() + separator));
    while section.text().len() > room {
        if !section.give_way() {
            return Err(AccountingError::NoRoom { site_bytes: site.len() });
        }
    }
    Ok(if site.is_empty() { section.text() } else { format!("{site} {}", section.text()) })
}

/// The width squeue is asked to print a field in (`-O <field>:<width>`):
/// it cuts a value there, so a value this long may have been cut.
const SQUEUE_WIDTH: usize = 8 * FIELD_LIMIT;

/// squeue's `-O` item that prints this field alone, so that no field of
/// the user's is printed ahead of it (issue 27 F2).
pub fn squeue_format(field: AccountingField) -> Option<String> {
    let name = match field {
        AccountingField::AdminComment => "admin_comment",
        AccountingField::Comment => "Comment",
        AccountingField::Off => return None,
    };
    Some(format!("{name}:{SQUEUE_WIDTH}"))
}

/// The field's value from what squeue printed for one job id (no header,
/// [`squeue_format`]): exactly one line, the value padded
/// with blanks (trailing blanks are dropped); an unset field is `(null)`.
/// Several lines (an array's tasks, or a value holding a newline: which is
/// which cannot be told), none, or a value that may have been cut at the
/// width are errors, so that an update never rewrites what was not read
/// whole. The value may hold anything (`AdminComment=`, `JobState=`):
/// squeue printed nothing else.
pub fn squeue_value(lines: &[String]) -> Result<String, AccountingError> {
    let [line] = lines else {
        return Err(AccountingError::Lines { count: lines.len() });
    };
    let value = line.trim_end_matches(' ');
    if value.len() >= SQUEUE_WIDTH {
        return Err(AccountingError::MayBeCut);
    }
    Ok(if value == "(null)" { String::new() } else { value.to_string() })
}

/// Job `job`'s `field` as Slurm holds it, read through squeue next to
/// `scontrol` ([`Scontrol::job_field`]), never from `scontrol show job`,
/// whose user fields come first and may hold `\nAdminComment=...`.
pub fn job_value(scontrol: &Scontrol, field: AccountingField, job: u32) -> Result<String, AccountingError> {
    let Some(format) = squeue_format(field) else { return Ok(String::new()) };
    match scontrol.job_field(job, &["-O", &format]).map_err(AccountingError::Read)? {
        Some(lines) => squeue_value(&lines),
        None => Err(AccountingError::UnknownJob { job }),
    }
}

/// Adds `event` to job `job`'s `field` through scontrol (as root).
pub fn record(scontrol: &Scontrol, field: AccountingField, job: u32, event: &Event) -> Result<(), AccountingError> {
    let Some(key) = slurm_key(field) else { return Ok(()) };
    let current = job_value(scontrol, field, job)?;
    let value = merge(&current, event)?;
    scontrol.update_job(job, key, &value).map_err(AccountingError::Update)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ckpt(run: u32, node: &str, seconds: f64, bytes: u64) -> Event {
        Event { kind: EventKind::Checkpoint, run, node: node.into(), seconds, image_bytes: Some(bytes) }
    }

    fn restore(run: u32, node: &str, seconds: f64) -> Event {
        Event { kind: EventKind::Restore, run, node: node.into(), seconds, image_bytes: None }
    }

    #[test]
    fn events_are_compact_tokens_whatever_the_node_is_called() {
        let cases = [
            (ckpt(0, "n1", 8.14, 10_000_000_000), "ckpt=r0@n1:8.1s/9.3GiB"),
            (ckpt(3, "gpu-a.b_c", 0.04, 8 << 20), "ckpt=r3@gpu-a.b_c:0.0s/8MiB"),
            (ckpt(1, "n1", 1.0, 1), "ckpt=r1@n1:1.0s/1MiB"),
            (restore(1, "n 1;}{=x", 5.25), "restore=r1@n_1____x:5.2s"),
            (restore(1, "", f64::NAN), "restore=r1@_:0.0s"),
            (Event { kind: EventKind::CheckpointFailed, run: 2, node: "n2".into(), seconds: 0.4, image_bytes: None }, "ckpt-failed=r2@n2:0.4s"),
            (Event { kind: EventKind::RestoreFailed, run: 2, node: "é".into(), seconds: 1.0, image_bytes: None }, "restore-failed=r2@_:1.0s"),
        ];
        for (event, want) in cases {
            assert_eq!(event.token(), want);
            assert_eq!(is_event_token(want), Some(event.kind), "{want} must read back as ours");
        }
    }

    #[test]
    fn merging_keeps_the_site_text_and_our_earlier_events() {
        let e = restore(1, "n2", 5.2);
        let cases: [(&str, &str); 10] = [
            ("", "gpu-mode{restore=r1@n2:5.2s}"),
            ("   ", "gpu-mode{restore=r1@n2:5.2s}"),
            ("ticket 4711", "ticket 4711 gpu-mode{restore=r1@n2:5.2s}"),
            ("gpu-mode{ckpt=r0@n1:8.1s/9.3GiB}", "gpu-mode{ckpt=r0@n1:8.1s/9.3GiB;restore=r1@n2:5.2s}"),
            ("a gpu-mode{ckpt=r0@n1:8.1s/9.3GiB} b", "a b gpu-mode{ckpt=r0@n1:8.1s/9.3GiB;restore=r1@n2:5.2s}"),
            ("a gpu-mode{ckpt=r0@n1:8.1s/9.3GiB}b", "a b gpu-mode{ckpt=r0@n1:8.1s/9.3GiB;restore=r1@n2:5.2s}"),
            (
                "gpu-mode{omitted=ckpt:4,restore:3;ckpt=r7@n1:1.0s/2MiB}",
                "gpu-mode{omitted=ckpt:4,restore:3;ckpt=r7@n1:1.0s/2MiB;restore=r1@n2:5.2s}",
            ),
            // Two sections (a lost race): one, in order.
            ("gpu-mode{ckpt=r0@a:1.0s} x gpu-mode{ckpt=r1@b:2.0s}", "x gpu-mode{ckpt=r0@a:1.0s;ckpt=r1@b:2.0s;restore=r1@n2:5.2s}"),
            // Not ours (a user's imitation, a typo): site text, untouched.
            ("gpu-mode{ckpt=r0@n1:lots} $(rm -rf /) \"'`", "gpu-mode{ckpt=r0@n1:lots} $(rm -rf /) \"'` gpu-mode{restore=r1@n2:5.2s}"),
            ("unclosed gpu-mode{ckpt=r0@n1:1.0s", "unclosed gpu-mode{ckpt=r0@n1:1.0s gpu-mode{restore=r1@n2:5.2s}"),
        ];
        for (current, want) in cases {
            assert_eq!(merge(current, &e).unwrap(), want, "from {current:?}");
        }
    }

    #[test]
    fn a_long_history_keeps_its_counts_within_the_bounds() {
        let mut field = "site".to_string();
        for run in 0..40u32 {
            field = merge(&field, &ckpt(run, "node-with-a-long-name-01", 123.4, 90 << 30)).unwrap();
            field = merge(&field, &restore(run + 1, "node-with-a-long-name-02", 56.7)).unwrap();
            assert!(field.len() <= "site ".len() + MAX_SECTION, "{} bytes: {field}", field.len());
        }
        let (site, section) = split_field(&field);
        assert_eq!(site, "site");
        let listed = |k: EventKind| section.events.iter().filter(|(e, _)| *e == k).count() as u64;
        for kind in [EventKind::Checkpoint, EventKind::Restore] {
            assert_eq!(section.omitted.get(&kind).copied().unwrap_or(0) + listed(kind), 40, "{kind:?}: {field}");
        }
        assert!(field.ends_with(";restore=r40@node-with-a-long-name-02:56.7s}"), "{field}");
    }

    #[test]
    fn the_site_text_wins_when_there_is_no_room() {
        let e = ckpt(0, "n1", 1.0, 1 << 20);
        let near_full = "x".repeat(FIELD_LIMIT - 50);
        let merged = merge(&near_full, &e).unwrap();
        assert!(merged.starts_with(&near_full) && merged.len() <= FIELD_LIMIT, "{merged}");
        // An older section gives way to counts only.
        let with_history = merge(&merge(&near_full, &e).unwrap(), &e).unwrap();
        assert_eq!(&with_history[near_full.len()..], " gpu-mode{omitted=ckpt:1;ckpt=r0@n1:1.0s/1MiB}");
        let full = "x".repeat(FIELD_LIMIT - 10);
        let err = merge(&full, &e).unwrap_err().to_string();
        assert!(err.contains("leaves no room") && err.contains("left as it is"), "{err}");
    }

    const SHOW_JOB: &str = "JobId=7 JobName=t\n   WorkDir=/tmp\n   AdminComment=ticket 1 a=b gpu-mode{ckpt=r0@n1:1.0s} \n   Comment=mine \n   StdErr=/tmp/x\n";

    #[test]
    fn the_value_is_squeues_one_line_whole() {
        let lines = |t: &str| t.lines().map(str::to_string).collect::<Vec<_>>();
        let cases: [(&str, Result<&str, &str>); 7] = [
            ("ticket 1 a=b gpu-mode{ckpt=r0@n1:1.0s}      \n", Ok("ticket 1 a=b gpu-mode{ckpt=r0@n1:1.0s}")),
            ("AdminComment=x JobState=PENDING  \n", Ok("AdminComment=x JobState=PENDING")),
            ("(null)              \n", Ok("")),
            ("                    \n", Ok("")),
            ("", Err("0 lines")),
            ("line one\nline two\n", Err("2 lines")),
            ("a\nb\nc\n", Err("3 lines")),
        ];
        for (text, want) in cases {
            let got = squeue_value(&lines(text)).map_err(|e| e.to_string());
            match want {
                Ok(v) => assert_eq!(got.as_deref(), Ok(v), "{text:?}"),
                Err(e) => assert!(got.as_ref().is_err_and(|g| g.contains(e) && g.contains("left as it is")), "{text:?}: {got:?}"),
            }
        }
        let err = squeue_value(&[format!("{} ", "x".repeat(SQUEUE_WIDTH))]).unwrap_err();
        assert!(matches!(err, AccountingError::MayBeCut), "{err:?}");
        assert!(err.to_string().contains("may run past"), "{err}");
    }

    /// Any read that is not one whole value writes nothing.
    #[test]
    fn a_failed_or_ambiguous_read_writes_nothing() {
        let cases = [
            "echo 'slurm_load_jobs error: Unable to contact slurm controller' >&2; exit 1",
            "echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1",
            "exit 0",
            "printf 'ticket 1\\nticket 2\\n'",
            "sleep 5",
        ];
        for squeue in cases {
            let dir = tempfile::tempdir().unwrap();
            let (s, log) = fake_slurm(dir.path(), SHOW_JOB, squeue, 0);
            let s = s.with_timeout(std::time::Duration::from_millis(300));
            assert!(record(&s, AccountingField::AdminComment, 7, &restore(1, "n2", 5.2)).is_err(), "{squeue}");
            assert!(!log.exists(), "{squeue}: nothing may be written");
        }
    }

    /// Slurm's record of job 7 as squeue prints each field alone (padded).
    const SQUEUE: &str = "case \"$*\" in\n\
        *admin_comment:*) printf '%-30s\\n' 'ticket 1 a=b gpu-mode{ckpt=r0@n1:1.0s}';;\n\
        *Comment:*) printf '%-30s\\n' mine;;\n\
        *) exit 9;;\nesac";

    /// A stand-in scontrol that shows `show` and records each update's
    /// argv, and beside it a squeue running `squeue` (a shell body).
    fn fake_slurm(dir: &std::path::Path, show: &str, squeue: &str, update_exit: i32) -> (Scontrol, std::path::PathBuf) {
        let log = dir.join("argv");
        std::fs::write(dir.join("show"), show).unwrap();
        let body = format!(
            "if [ \"$1\" = show ]; then cat {show}; exit 0; fi\nfor a in \"$@\"; do echo \"$a\"; done >> {log}\nexit {update_exit}",
            show = dir.join("show").display(),
            log = log.display()
        );
        gpu_mode_testkit::script(dir, "squeue", squeue);
        (Scontrol::new(&gpu_mode_testkit::script(dir, "scontrol", &body)), log)
    }

    fn fake_scontrol(dir: &std::path::Path, show: &str, update_exit: i32) -> (Scontrol, std::path::PathBuf) {
        fake_slurm(dir, show, SQUEUE, update_exit)
    }

    /// Issue 27 F2: `scontrol show job` prints the user's JobName, Comment,
    /// WorkDir, Command and SubmitLine raw, before AdminComment; a name with
    /// a newline and `AdminComment=` in it must never be what root writes
    /// back into the admin's field (dropping the site's text).
    #[test]
    fn the_users_fields_are_never_taken_for_the_admin_comment() {
        let real = "   AdminComment=ticket 1 a=b gpu-mode{ckpt=r0@n1:1.0s} \n   Comment=mine \n";
        let hostile = [
            "JobId=7 JobName=train\nAdminComment=billing=free\n   JobState=RUNNING\n",
            "JobId=7 JobName=x\n   Comment=c\nAdminComment=billing=free JobState=COMPLETED\n   WorkDir=/tmp\n",
            "JobId=7 JobName=x\n   WorkDir=/home/u/\nAdminComment=billing=free\n   StdErr=/x\n",
            "JobId=7 JobName=x\n   Command=/bin/sleep\n   SubmitLine=sbatch -J $'\nAdminComment=billing=free'\n   WorkDir=/tmp\n",
        ];
        for show in hostile {
            let dir = tempfile::tempdir().unwrap();
            let (s, log) = fake_scontrol(dir.path(), &format!("{show}{real}"), 0);
            record(&s, AccountingField::AdminComment, 7, &restore(1, "n2", 5.2)).unwrap();
            assert_eq!(
                std::fs::read_to_string(&log).unwrap(),
                "update\nJobId=7\nAdminComment=ticket 1 a=b gpu-mode{ckpt=r0@n1:1.0s;restore=r1@n2:5.2s}\n",
                "{show:?}"
            );
        }
    }

    #[test]
    fn record_updates_the_chosen_field_by_argument_vector() {
        let dir = tempfile::tempdir().unwrap();
        let (s, log) = fake_scontrol(dir.path(), SHOW_JOB, 0);
        record(&s, AccountingField::AdminComment, 7, &restore(1, "n2", 5.2)).unwrap();
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            "update\nJobId=7\nAdminComment=ticket 1 a=b gpu-mode{ckpt=r0@n1:1.0s;restore=r1@n2:5.2s}\n"
        );
        std::fs::remove_file(&log).unwrap();
        record(&s, AccountingField::Comment, 7, &restore(1, "n2", 5.2)).unwrap();
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "update\nJobId=7\nComment=mine gpu-mode{restore=r1@n2:5.2s}\n");
        std::fs::remove_file(&log).unwrap();
        record(&s, AccountingField::Off, 7, &restore(1, "n2", 5.2)).unwrap();
        assert!(!log.exists(), "off writes nothing");
    }

    #[test]
    fn a_refused_update_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let (s, _) = fake_scontrol(dir.path(), SHOW_JOB, 1);
        let err = record(&s, AccountingField::AdminComment, 7, &restore(1, "n2", 5.2)).unwrap_err();
        assert!(matches!(err, AccountingError::Update(DrainError::Failed { .. })), "{err:?}");
        let err = err.to_string();
        assert!(err.contains("update JobId=7 AdminComment=") && err.contains("failed"), "{err}");
    }

    /// Each reason an event is not recorded has its kind and the words the
    /// agent logged before.
    #[test]
    fn each_unrecorded_event_says_todays_words() {
        let failed = |path: &str, args: &str| DrainError::Failed { path: path.into(), args: args.into(), status: "exit status: 1".into(), stderr: "Unable to contact slurm controller".into() };
        let cases = [
            (AccountingError::NoRoom { site_bytes: 1014 }, "the field's own text (1014 bytes) leaves no room for the gpu-mode section within Slurm's 1024 bytes: left as it is"),
            (AccountingError::Lines { count: 0 }, "squeue printed 0 lines for the job, not one: left as it is"),
            (AccountingError::MayBeCut, "the value may run past squeue's 8192 bytes: left as it is"),
            (AccountingError::UnknownJob { job: 7 }, "Slurm no longer knows job 7: left as it is"),
            (
                AccountingError::Read(failed("/usr/bin/squeue", "-h -t all -j 7 -O admin_comment:8192")),
                "/usr/bin/squeue -h -t all -j 7 -O admin_comment:8192 failed (exit status: 1): Unable to contact slurm controller",
            ),
            (
                AccountingError::Update(failed("/usr/bin/scontrol", "update JobId=7 AdminComment=x")),
                "/usr/bin/scontrol update JobId=7 AdminComment=x failed (exit status: 1): Unable to contact slurm controller",
            ),
        ];
        for (e, text) in cases {
            assert_eq!(e.to_string(), text, "{e:?}");
        }
        // Where each comes from: the read's kinds.
        let read = |text: &str| squeue_value(&text.lines().map(str::to_string).collect::<Vec<_>>()).unwrap_err();
        assert!(matches!(read(""), AccountingError::Lines { count: 0 }));
        assert!(matches!(read("a\nb"), AccountingError::Lines { count: 2 }));
        let full = "x".repeat(FIELD_LIMIT - 10);
        assert!(matches!(merge(&full, &restore(1, "n2", 5.2)), Err(AccountingError::NoRoom { site_bytes }) if site_bytes == full.len()));
    }
}
