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

/// `text` with control characters written as escapes (`\n`, `\r`,
/// `\u{1b}`, `\u{7f}`, `\u{9b}`): C0, DEL and C1, so that text from a file
/// or a user stays one line and sends no sequence to a terminal.
pub fn printable(text: &str) -> String {
    text.chars().map(|c| if c.is_control() { c.escape_debug().to_string() } else { c.to_string() }).collect()
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

    #[test]
    fn outcomes_have_names() {
        assert_eq!(Outcome::Refused.as_str(), "refused");
        assert_eq!(ActionLine::new("epilog").outcome(Outcome::Failed).as_str(), "gpu-mode: action=epilog outcome=failed");
    }
}
