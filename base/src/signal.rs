//! Signals by name: the ones a site may name for the checkpoint
//! (`preempt.signal`), checked by the configuration and used by the
//! preemption code. A leaf: the standard library and libc only.

/// The signals a site may name in `preempt.signal`, by name or number.
const SIGNALS: &[(&str, i32)] = &[
    ("USR1", libc::SIGUSR1),
    ("USR2", libc::SIGUSR2),
    ("TERM", libc::SIGTERM),
    ("INT", libc::SIGINT),
    ("HUP", libc::SIGHUP),
    ("URG", libc::SIGURG),
    ("XCPU", libc::SIGXCPU),
];

/// `USR1`, `SIGUSR1` or `10` → 10. Only signals a job may safely be sent
/// without dying by default being useful here, the set is small on purpose.
pub fn signal_number(name: &str) -> Result<i32, String> {
    let bare = name.trim().trim_start_matches("SIG");
    if let Ok(n) = bare.parse::<i32>() {
        if let Some((_, v)) = SIGNALS.iter().find(|(_, v)| *v == n) {
            return Ok(*v);
        }
    }
    SIGNALS
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(bare))
        .map(|(_, v)| *v)
        .ok_or_else(|| format!("{name:?} is not one of {}", SIGNALS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")))
}

/// The name of a signal number (for messages): `USR1`.
pub fn signal_name(n: i32) -> String {
    SIGNALS.iter().find(|(_, v)| *v == n).map_or_else(|| format!("signal {n}"), |(name, _)| format!("SIG{name}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_by_name_or_number() {
        assert_eq!(signal_number("USR1"), Ok(libc::SIGUSR1));
        assert_eq!(signal_number("SIGusr2"), Ok(libc::SIGUSR2));
        assert_eq!(signal_number("10"), Ok(libc::SIGUSR1));
        assert!(signal_number("KILL").unwrap_err().contains("is not one of USR1"));
        assert!(signal_number("9").is_err());
        assert_eq!(signal_name(libc::SIGUSR1), "SIGUSR1");
    }
}
