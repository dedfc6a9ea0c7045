//! One structured line per action, to syslog (the journal on systemd hosts)
//! and stderr: `gpu-mode: action=prolog job=12 node=n1 gpu=0,1 mode=mps outcome=ok`.
//!
//! logfmt (key=value, values quoted when needed) so `journalctl -t slurm-gpu-mode`
//! output can be grepped and parsed by log shippers without a schema.

use crate::config::LogConfig;
use std::ffi::CString;
use std::fmt::Write as _;
use std::sync::Once;

/// The syslog identifier (`journalctl -t slurm-gpu-mode`).
pub const SYSLOG_IDENT: &str = "slurm-gpu-mode";

/// The outcome of an action, the `outcome=` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// Nothing to do (e.g. teardown of a job that left nothing behind).
    Skipped,
    /// The job was refused on this node; the node is fine.
    Refused,
    Failed,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Skipped => "skipped",
            Outcome::Refused => "refused",
            Outcome::Failed => "failed",
        }
    }

    fn priority(self) -> libc::c_int {
        match self {
            Outcome::Ok | Outcome::Skipped => libc::LOG_INFO,
            Outcome::Refused => libc::LOG_WARNING,
            Outcome::Failed => libc::LOG_ERR,
        }
    }
}

/// A log line under construction: `ActionLine::new("prolog").field("job", 12)...`.
#[derive(Debug, Clone)]
pub struct ActionLine {
    text: String,
}

impl ActionLine {
    pub fn new(action: &str) -> Self {
        let mut line = ActionLine { text: String::from("gpu-mode:") };
        line.push("action", action);
        line
    }

    pub fn field(mut self, key: &str, value: impl std::fmt::Display) -> Self {
        self.push(key, &value.to_string());
        self
    }

    fn push(&mut self, key: &str, value: &str) {
        let plain = !value.is_empty()
            && value.chars().all(|c| c.is_ascii_graphic() && c != '"' && c != '=' && c != '\\');
        if plain {
            let _ = write!(self.text, " {key}={value}");
        } else {
            // Debug-quoting escapes quotes, backslashes and control characters,
            // so user-supplied text can never break the line in two.
            let _ = write!(self.text, " {key}={value:?}");
        }
    }

    /// Finishes the line with `outcome=` and returns it.
    pub fn outcome(self, outcome: Outcome) -> FinishedLine {
        let line = self.field("outcome", outcome.as_str());
        FinishedLine { text: line.text, outcome }
    }
}

#[derive(Debug, Clone)]
pub struct FinishedLine {
    text: String,
    outcome: Outcome,
}

impl FinishedLine {
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Writes the line where the config says.
    pub fn emit(&self, cfg: &LogConfig) {
        if cfg.stderr {
            stderr_line(&self.text);
        }
        if cfg.syslog {
            to_syslog(self.outcome.priority(), &self.text);
        }
    }
}

/// Whether `c` must not reach an admin's terminal raw, in text a user wrote
/// (issue 27 F4, issue 37 N4): C0, DEL and C1 (escape sequences, CR, a
/// forged line); the line and paragraph separators U+2028 and U+2029; the
/// bidirectional controls, which reorder what the terminal shows (embeddings
/// and overrides U+202A-U+202E, isolates U+2066-U+2069, the marks U+200E,
/// U+200F and U+061C); and the invisible format characters, which make two
/// texts that look the same differ (zero-width space, joiners, word joiner
/// and invisible operators U+200B-U+200D and U+2060-U+2064, the deprecated
/// U+206A-U+206F, the byte order mark U+FEFF, the soft hyphen U+00AD, U+180E,
/// the interlinear annotations U+FFF9-U+FFFB and the tags U+E0000-U+E007F).
/// The one policy of [`printable`] (the status table, error lines) and
/// [`terminal_json`] (`gpu-mode-status --json`).
pub fn is_unsafe_for_terminal(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{ad}'
                | '\u{61c}'
                | '\u{180e}'
                | '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{206f}'
                | '\u{feff}'
                | '\u{fff9}'..='\u{fffb}'
                | '\u{e0000}'..='\u{e007f}'
        )
}

/// `text` with every character [`is_unsafe_for_terminal`] written as a Rust
/// escape (`\n`, `\r`, `\u{1b}`, `\u{7f}`, `\u{9b}`, `\u{202e}`,
/// `\u{200b}`), so that text from a file or a user stays one line, sends no
/// sequence to a terminal and shows what it holds.
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if !is_unsafe_for_terminal(c) {
            out.push(c);
        } else if c.escape_debug().eq([c]) {
            // Not one Rust's Debug escapes: the escape is written anyway.
            let _ = write!(out, "{}", c.escape_unicode());
        } else {
            let _ = write!(out, "{}", c.escape_debug());
        }
    }
    out
}

/// `value` as pretty JSON whose bytes hold no character
/// [`is_unsafe_for_terminal`]: serde_json escapes only C0, quotes and
/// backslashes; DEL, C1, the bidirectional controls and the invisible
/// characters become `\uXXXX` escapes too (a surrogate pair above U+FFFF),
/// so a JSON parser reads the same text back and a terminal shows escapes.
pub fn terminal_json<T: serde::Serialize + ?Sized>(value: &T) -> serde_json::Result<String> {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, TerminalFormatter(serde_json::ser::PrettyFormatter::new()));
    value.serialize(&mut ser)?;
    // serde_json writes only UTF-8 (the escapes are ASCII).
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// serde_json's pretty layout, with [`terminal_json`]'s escapes in strings.
struct TerminalFormatter(serde_json::ser::PrettyFormatter<'static>);

/// The layout is the pretty formatter's (the methods it overrides).
macro_rules! pretty_layout {
    ($($name:ident($($arg:ident: $ty:ty),*);)*) => {$(
        fn $name<W: ?Sized + std::io::Write>(&mut self, w: &mut W $(, $arg: $ty)*) -> std::io::Result<()> {
            self.0.$name(w $(, $arg)*)
        }
    )*};
}

impl serde_json::ser::Formatter for TerminalFormatter {
    pretty_layout! {
        begin_array();
        end_array();
        begin_array_value(first: bool);
        end_array_value();
        begin_object();
        end_object();
        begin_object_key(first: bool);
        begin_object_value();
        end_object_value();
    }

    fn write_string_fragment<W: ?Sized + std::io::Write>(&mut self, w: &mut W, fragment: &str) -> std::io::Result<()> {
        let mut start = 0;
        for (i, c) in fragment.char_indices().filter(|(_, c)| is_unsafe_for_terminal(*c)) {
            w.write_all(&fragment.as_bytes()[start..i])?;
            for unit in c.encode_utf16(&mut [0; 2]) {
                write!(w, "\\u{unit:04x}")?;
            }
            start = i + c.len_utf8();
        }
        w.write_all(&fragment.as_bytes()[start..])
    }
}

/// Writes one line to stderr and ignores failure: slurmd may have closed the
/// pipe, and `eprintln!` would panic on EPIPE (exit 101, a "Prolog error"
/// drain). Logging must never fail a hook.
pub fn stderr_line(text: &str) {
    let _ = write_line(&mut std::io::stderr().lock(), text);
}

/// The same for stdout (the node checker's report).
pub fn stdout_line(text: &str) {
    let _ = write_line(&mut std::io::stdout().lock(), text);
}

/// `text` and its newline in one `write_all`: stderr is unbuffered, and
/// `writeln!` writes the text and the newline in two calls, between which
/// another hook's line lands in the shared log file (seen in the churn:
/// `outcome=okgpu-mode: action=prolog job=54 ...`, one job's prolog line lost
/// inside another's).
pub fn write_line(out: &mut impl std::io::Write, text: &str) -> std::io::Result<()> {
    let mut line = String::with_capacity(text.len() + 1);
    line.push_str(text);
    line.push('\n');
    out.write_all(line.as_bytes())
}

fn to_syslog(priority: libc::c_int, text: &str) {
    static OPEN: Once = Once::new();
    // openlog keeps the ident pointer: it must live for the whole process.
    static IDENT: &[u8] = b"slurm-gpu-mode\0";
    OPEN.call_once(|| unsafe {
        libc::openlog(IDENT.as_ptr().cast(), libc::LOG_PID, libc::LOG_DAEMON);
    });
    let Ok(msg) = CString::new(text.replace('\0', "")) else { return };
    // A "%s" format: the message is data, never a format string.
    unsafe { libc::syslog(priority, c"%s".as_ptr(), msg.as_ptr()) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records each write call, as a file shared with other processes
    /// sees them.
    #[derive(Default)]
    struct Writes(Vec<Vec<u8>>);

    impl std::io::Write for Writes {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.push(buf.to_vec());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_line_and_its_newline_are_one_write() {
        for text in ["gpu-mode: action=prolog job=54 outcome=ok", "", "x y=\"z\""] {
            let mut out = Writes::default();
            write_line(&mut out, text).unwrap();
            assert_eq!(out.0, vec![format!("{text}\n").into_bytes()], "{text:?}");
        }
    }

    #[test]
    fn fields_are_logfmt_and_hostile_values_are_quoted() {
        let line = ActionLine::new("prolog")
            .field("job", 12)
            .field("node", "n1")
            .field("mode", "mps:threads=5")
            .field("user", "ev il\n\"x\"")
            .field("empty", "")
            .outcome(Outcome::Ok);
        assert_eq!(
            line.as_str(),
            "gpu-mode: action=prolog job=12 node=n1 mode=\"mps:threads=5\" user=\"ev il\\n\\\"x\\\"\" empty=\"\" outcome=ok"
        );
        assert!(!line.as_str().contains('\n'));
    }

    /// Issue 37 N4: one policy for the table and `--json`. Each class of
    /// character a user's text may carry to an admin's terminal, as
    /// [`printable`] shows it; [`terminal_json`] escapes exactly those and a
    /// JSON parser reads the text back whole.
    #[test]
    fn text_reaches_a_terminal_without_controls_bidi_or_invisible_characters() {
        let cases = [
            ("plain", "alice mps:threads=30 \"x\" \\ é 日本 ✓", false, "alice mps:threads=30 \"x\" \\ é 日本 ✓"),
            ("ESC", "\u{1b}[31m", true, "\\u{1b}[31m"),
            ("newline and CR", "a\nb\rc", true, "a\\nb\\rc"),
            ("NUL", "a\0b", true, "a\\0b"),
            ("DEL", "a\u{7f}b", true, "a\\u{7f}b"),
            ("C1 CSI", "\u{9b}2J", true, "\\u{9b}2J"),
            ("NEL", "a\u{85}b", true, "a\\u{85}b"),
            ("line separator", "a\u{2028}b", true, "a\\u{2028}b"),
            ("paragraph separator", "a\u{2029}b", true, "a\\u{2029}b"),
            ("RLO", "job\u{202e}txt.exe", true, "job\\u{202e}txt.exe"),
            ("LRE and PDF", "\u{202a}x\u{202c}", true, "\\u{202a}x\\u{202c}"),
            ("RLI", "\u{2067}x\u{2069}", true, "\\u{2067}x\\u{2069}"),
            ("LRI and FSI", "\u{2066}\u{2068}", true, "\\u{2066}\\u{2068}"),
            ("LRM and RLM", "\u{200e}\u{200f}", true, "\\u{200e}\\u{200f}"),
            ("ALM", "\u{61c}", true, "\\u{61c}"),
            ("zero-width space", "ali\u{200b}ce", true, "ali\\u{200b}ce"),
            ("ZWNJ and ZWJ", "\u{200c}\u{200d}", true, "\\u{200c}\\u{200d}"),
            ("word joiner", "a\u{2060}b", true, "a\\u{2060}b"),
            ("BOM", "\u{feff}alice", true, "\\u{feff}alice"),
            ("soft hyphen", "al\u{ad}ice", true, "al\\u{ad}ice"),
            ("tag characters", "a\u{e0041}\u{e007f}", true, "a\\u{e0041}\\u{e007f}"),
        ];
        for (name, text, unsafe_, shown) in cases {
            assert_eq!(text.chars().any(is_unsafe_for_terminal), unsafe_, "{name}");
            assert_eq!(printable(text), shown, "{name}");
            assert!(!printable(text).chars().any(is_unsafe_for_terminal), "{name}");
            let json = terminal_json(&serde_json::json!({ text: [text] })).unwrap();
            let bad: Vec<char> = json.chars().filter(|c| is_unsafe_for_terminal(*c) && *c != '\n').collect();
            assert!(bad.is_empty(), "{name}: {bad:?} raw in {json}");
            let back: serde_json::Value = serde_json::from_str(&json).unwrap();
            assert_eq!(back, serde_json::json!({ text: [text] }), "{name}: {json}");
        }
        // The layout is serde_json's pretty one.
        let v = serde_json::json!({"a": [1, {"b": "c\u{9b}"}], "d": {}});
        assert_eq!(terminal_json(&v).unwrap(), serde_json::to_string_pretty(&v).unwrap().replace('\u{9b}', "\\u009b"));
    }

    #[test]
    fn outcomes_have_names() {
        assert_eq!(Outcome::Refused.as_str(), "refused");
        assert_eq!(ActionLine::new("epilog").outcome(Outcome::Failed).as_str(), "gpu-mode: action=epilog outcome=failed");
    }
}
