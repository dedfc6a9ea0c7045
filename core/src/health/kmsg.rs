//! The kernel log, where the NVIDIA driver reports XIDs
//! (`NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus.`).
//! NVML's event API only sees events raised while a program listens; a
//! HealthCheckProgram runs for a moment every few minutes, so the kernel
//! log, read from a remembered sequence number, is what makes "every XID
//! since the last run, once" possible (gpud reads it too).

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// One kernel log record: `/dev/kmsg`'s `prio,seq,usec,flags;text`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub seq: u64,
    pub text: String,
}

/// An XID line's GPU (kernel PCI spelling) and number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidLine {
    pub pci: String,
    pub xid: u64,
}

/// Bounds on one read, so a flooded log cannot eat the 60 s budget.
const MAX_RECORDS: usize = 500_000;
const MAX_TIME: Duration = Duration::from_secs(3);

/// Parses one record; continuation lines (starting with a space) and
/// malformed lines give `None`.
pub fn parse_record(raw: &str) -> Option<Record> {
    let (header, text) = raw.split_once(';')?;
    let seq = header.split(',').nth(1)?.trim().parse().ok()?;
    Some(Record { seq, text: text.trim_end().to_string() })
}

/// `NVRM: Xid (PCI:0000:3b:00): 79, ...` → (pci "0000:3b:00", 79).
pub fn parse_xid(text: &str) -> Option<XidLine> {
    let rest = &text[text.find("NVRM: Xid (")? + "NVRM: Xid (".len()..];
    let (pci, rest) = rest.split_once(')')?;
    let pci = pci.trim().strip_prefix("PCI:").unwrap_or(pci.trim()).to_ascii_lowercase();
    let rest = rest.trim_start().strip_prefix(':')?.trim_start();
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    Some(XidLine { pci, xid: digits.parse().ok()? })
}

/// (domain, bus, device) of a PCI address in NVML's `00000000:3B:00.0` or
/// the kernel's `0000:3b:00` spelling.
fn pci_key(addr: &str) -> Option<(u64, u64, u64)> {
    let parts: Vec<&str> = addr.split(':').collect();
    let (dom, bus, dev) = match parts.as_slice() {
        [d, b, rest] => (*d, *b, *rest),
        [b, rest] => ("0", *b, *rest),
        _ => return None,
    };
    let dev = dev.split('.').next()?;
    let hex = |s: &str| u64::from_str_radix(s, 16).ok();
    Some((hex(dom)?, hex(bus)?, hex(dev)?))
}

/// Whether NVML's bus id and the kernel's PCI address name one device.
pub fn same_device(nvml_bus_id: &str, kernel_pci: &str) -> bool {
    matches!((pci_key(nvml_bus_id), pci_key(kernel_pci)), (Some(a), Some(b)) if a == b)
}

/// This boot's id: a new boot starts a new kernel log.
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").map(|s| s.trim().to_string()).unwrap_or_default()
}

/// Why the kernel log could not be read: the XID check warns with it and
/// the cursor starts the boot afresh.
#[derive(Debug, thiserror::Error)]
pub enum KmsgError {
    #[error("cannot read the kernel log {}: {source}", .path.display())]
    Stat { path: PathBuf, source: std::io::Error },
    #[error("cannot read {}: {source}", .path.display())]
    ReadFile { path: PathBuf, source: std::io::Error },
    #[error("cannot open the kernel log {}: {source}", .path.display())]
    Open { path: PathBuf, source: std::io::Error },
    #[error("reading the kernel log {}: {source}", .path.display())]
    Read { path: PathBuf, source: std::io::Error },
}

/// Every record in the log at `path`: `/dev/kmsg` (one record per read) or
/// a regular file of records, one per line (tests, saved logs).
pub fn read_records(path: &Path) -> Result<Vec<Record>, KmsgError> {
    let at = || path.to_path_buf();
    let meta = std::fs::metadata(path).map_err(|source| KmsgError::Stat { path: at(), source })?;
    if meta.file_type().is_char_device() {
        read_device(path)
    } else {
        let text = std::fs::read_to_string(path).map_err(|source| KmsgError::ReadFile { path: at(), source })?;
        Ok(text.lines().filter_map(parse_record).collect())
    }
}

fn read_device(path: &Path) -> Result<Vec<Record>, KmsgError> {
    let at = || path.to_path_buf();
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|source| KmsgError::Open { path: at(), source })?;
    let mut buf = vec![0u8; 16 * 1024];
    let (mut out, start) = (Vec::new(), Instant::now());
    while out.len() < MAX_RECORDS && start.elapsed() < MAX_TIME {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend(parse_record(&String::from_utf8_lossy(&buf[..n]))),
            // EPIPE: records were overwritten before we read them; go on.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(source) => return Err(KmsgError::Read { path: at(), source }),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_and_xid_lines_are_parsed() {
        let cases = [
            ("3,1234,567890,-;NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.", Some((1234, Some(("0000:3b:00", 79))))),
            ("4,7,1,-,caller=T12;NVRM: Xid (PCI:0000:18:00): 13, Graphics Exception", Some((7, Some(("0000:18:00", 13))))),
            ("6,8,2,-;usb 1-1: new device", Some((8, None))),
            (" SUBSYSTEM=pci", None),
            ("garbage", None),
            ("6,x,2,-;NVRM: Xid (PCI:0000:18:00): 13", None),
        ];
        for (raw, want) in cases {
            let got = parse_record(raw).map(|r| (r.seq, parse_xid(&r.text).map(|x| (x.pci, x.xid))));
            let want = want.map(|(s, x)| (s, x.map(|(p, n): (&str, u64)| (p.to_string(), n))));
            assert_eq!(got, want, "{raw}");
        }
    }

    #[test]
    fn nvml_and_kernel_pci_spellings_match() {
        assert!(same_device("00000000:3B:00.0", "0000:3b:00"));
        assert!(same_device("00000001:18:00.0", "0001:18:00"));
        assert!(!same_device("00000000:3B:00.0", "0000:3c:00"));
        assert!(!same_device("junk", "0000:3b:00"));
    }

    #[test]
    fn a_regular_file_is_read_line_by_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("kmsg");
        std::fs::write(&p, "6,1,0,-;hello\n SUBSYSTEM=x\n3,2,0,-;NVRM: Xid (PCI:0000:01:00): 48, DBE\n").unwrap();
        let r = read_records(&p).unwrap();
        assert_eq!(r.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![1, 2]);
        let err = read_records(&dir.path().join("none")).unwrap_err();
        assert!(matches!(&err, KmsgError::Stat { source, .. } if source.kind() == std::io::ErrorKind::NotFound), "{err:?}");
        assert!(err.to_string().contains("cannot read the kernel log"), "{err}");
    }
}
