//! What the checker remembers between runs, in `<state_dir>/cursor.json`:
//! the kernel log position (so no XID is counted twice or missed), the
//! critical XIDs seen this boot (they keep failing the node until a reboot or
//! `gpu-mode-node-checker ack`: an XID 79 does not heal because time passed),
//! and per GPU the volatile uncorrectable ECC count accepted as baseline.

use super::kmsg::{self, Record};
use super::config::HealthConfig;
use crate::state::{parse_versioned, write_json, StateError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub const CURSOR_VERSION: u32 = 1;
pub const CURSOR_FILE: &str = "cursor.json";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeenXid {
    /// Kernel log sequence number of the line.
    pub seq: u64,
    /// NVML index of the GPU; `None` when no GPU has that PCI address.
    pub gpu: Option<u32>,
    pub pci: String,
    pub xid: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    pub version: u32,
    pub boot_id: String,
    /// The last kernel log record read this boot.
    pub kmsg_seq: Option<u64>,
    /// Failing and warning XIDs of this boot, until acknowledged.
    pub xids: Vec<SeenXid>,
    /// GPU UUID → volatile uncorrectable ECC count accepted as normal.
    pub ecc_baseline: BTreeMap<String, u64>,
    /// Kernel log records of this boot that were overwritten before a run
    /// read them, until acknowledged (absent in files of older versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kmsg_lost: Option<LostRecords>,
}

/// Kernel log records nobody read: the ring buffer wrapped between two
/// checks (or during one read), so the sequence numbers jump. An XID among
/// them was never seen: the node checker cannot vouch for that time, and
/// says so (a warning: the GPU may be fine, and draining for a busy log
/// would let any chatty process drain nodes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostRecords {
    /// How many, this boot.
    pub count: u64,
    /// The lowest and highest lost sequence numbers.
    pub first: u64,
    pub last: u64,
}

impl Default for Cursor {
    fn default() -> Self {
        Cursor {
            version: CURSOR_VERSION,
            boot_id: String::new(),
            kmsg_seq: None,
            xids: Vec::new(),
            ecc_baseline: BTreeMap::new(),
            kmsg_lost: None,
        }
    }
}

/// Why the cursor could not be read (the checker starts afresh and warns)
/// or saved (it warns: the next run would count these XIDs again).
#[derive(Debug, thiserror::Error)]
pub enum CursorError {
    #[error("cannot read {}: {source}", .path.display())]
    Read { path: PathBuf, source: std::io::Error },
    /// Corrupt, or of another version.
    #[error(transparent)]
    Parse(StateError),
    #[error("{}: {source}", .dir.display())]
    Dir { dir: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Write(StateError),
}

pub fn cursor_path(state_dir: &Path) -> PathBuf {
    state_dir.join(CURSOR_FILE)
}

impl Cursor {
    /// The saved cursor; a missing file is a fresh one. A corrupt one is an
    /// error (the caller starts afresh and reports it).
    pub fn load(state_dir: &Path) -> Result<Cursor, CursorError> {
        let path = cursor_path(state_dir);
        match std::fs::read(&path) {
            Ok(text) => parse_versioned(&text, &path, CURSOR_VERSION).map_err(CursorError::Parse),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Cursor::default()),
            Err(source) => Err(CursorError::Read { path, source }),
        }
    }

    /// Writes the cursor atomically, creating the root-owned directory.
    pub fn save(&self, state_dir: &Path) -> Result<(), CursorError> {
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        crate::fsutil::ensure_private_dir(state_dir, uid, gid, 0o755).map_err(|source| CursorError::Dir { dir: state_dir.to_path_buf(), source })?;
        write_json(&cursor_path(state_dir), self).map_err(CursorError::Write)
    }

    /// A new boot: the kernel log and the XIDs start over.
    pub fn start_boot(&mut self, boot_id: &str) {
        if self.boot_id != boot_id {
            self.boot_id = boot_id.to_string();
            self.kmsg_seq = None;
            self.xids.clear();
            self.kmsg_lost = None;
        }
    }

    /// Takes in the records after the cursor: XIDs that fail or warn are
    /// remembered with their GPU (`buses`: NVML index and bus id).
    pub fn absorb(&mut self, boot_id: &str, records: &[Record], buses: &[(u32, String)], cfg: &HealthConfig) {
        self.start_boot(boot_id);
        let after = self.kmsg_seq;
        for r in records.iter().filter(|r| after.is_none_or(|s| r.seq > s)) {
            // Sequence numbers are consecutive: a jump past the last one
            // read is records overwritten unread. (The first run of a boot
            // has nothing to compare with.)
            if let Some(last) = self.kmsg_seq.filter(|last| r.seq > last + 1) {
                self.note_lost(last + 1, r.seq - 1);
            }
            self.kmsg_seq = Some(self.kmsg_seq.map_or(r.seq, |s| s.max(r.seq)));
            let Some(x) = kmsg::parse_xid(&r.text) else { continue };
            if !cfg.xid_fail.contains(&x.xid) && !cfg.xid_warn.contains(&x.xid) {
                continue;
            }
            let gpu = buses.iter().find(|(_, bus)| kmsg::same_device(bus, &x.pci)).map(|(i, _)| *i);
            self.xids.push(SeenXid { seq: r.seq, gpu, pci: x.pci, xid: x.xid });
        }
    }

    fn note_lost(&mut self, first: u64, last: u64) {
        let n = last - first + 1;
        self.kmsg_lost = Some(match self.kmsg_lost {
            None => LostRecords { count: n, first, last },
            Some(l) => LostRecords { count: l.count + n, first: l.first.min(first), last: l.last.max(last) },
        });
    }

    /// Records a GPU's volatile count: a count below the baseline means the
    /// counters were reset (driver reload, GPU reset), so it becomes the new
    /// baseline. A GPU seen for the first time has baseline 0: any
    /// uncorrectable error since the driver loaded counts.
    pub fn observe_ecc(&mut self, uuid: &str, volatile: u64) {
        let base = self.ecc_baseline.entry(uuid.to_string()).or_insert(0);
        if volatile < *base {
            *base = volatile;
        }
    }

    /// An administrator's "seen, handled": forget this boot's XIDs and accept
    /// the current ECC counts (`current`: UUID → volatile count).
    pub fn acknowledge(&mut self, current: &BTreeMap<String, u64>) {
        self.xids.clear();
        self.kmsg_lost = None;
        self.ecc_baseline.extend(current.iter().map(|(k, v)| (k.clone(), *v)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(seq: u64, text: &str) -> Record {
        Record { seq, text: text.into() }
    }

    #[test]
    fn each_xid_is_taken_once_and_kept_until_a_new_boot() {
        let cfg = HealthConfig::default();
        let buses = [(0, "00000000:3B:00.0".to_string()), (1, "00000000:3C:00.0".to_string())];
        let mut c = Cursor::default();
        let log1 = [rec(1, "hello"), rec(2, "NVRM: Xid (PCI:0000:3c:00): 79, off the bus"), rec(3, "NVRM: Xid (PCI:0000:3b:00): 13, app")];
        c.absorb("boot-a", &log1, &buses, &cfg);
        assert_eq!(c.xids, vec![SeenXid { seq: 2, gpu: Some(1), pci: "0000:3c:00".into(), xid: 79 }]);
        assert_eq!(c.kmsg_seq, Some(3));
        // The same log again plus one new line: only the new line counts.
        let log2 = [&log1[..], &[rec(4, "NVRM: Xid (PCI:0000:3b:00): 94, contained")]].concat();
        c.absorb("boot-a", &log2, &buses, &cfg);
        assert_eq!(c.xids.iter().map(|x| (x.seq, x.xid, x.gpu)).collect::<Vec<_>>(), vec![(2, 79, Some(1)), (4, 94, Some(0))]);
        // A reboot forgets them; the new boot's log is read from the start.
        c.absorb("boot-b", &[rec(1, "NVRM: Xid (PCI:0000:99:00): 48, DBE")], &buses, &cfg);
        assert_eq!(c.xids.iter().map(|x| (x.seq, x.xid, x.gpu)).collect::<Vec<_>>(), vec![(1, 48, None)]);
    }

    #[test]
    fn records_overwritten_between_checks_are_counted_until_acknowledged() {
        let cfg = HealthConfig::default();
        let mut c = Cursor::default();
        // The first run of a boot starts wherever the buffer starts.
        c.absorb("boot-a", &[rec(40, "a"), rec(41, "b")], &[], &cfg);
        assert_eq!(c.kmsg_lost, None);
        // Next run: 42..=99 were overwritten before anyone read them.
        c.absorb("boot-a", &[rec(100, "c"), rec(101, "d")], &[], &cfg);
        assert_eq!(c.kmsg_lost, Some(LostRecords { count: 58, first: 42, last: 99 }));
        // A jump inside one read (EPIPE on /dev/kmsg) counts too.
        c.absorb("boot-a", &[rec(101, "d"), rec(102, "e"), rec(110, "f")], &[], &cfg);
        assert_eq!(c.kmsg_lost, Some(LostRecords { count: 65, first: 42, last: 109 }));
        // Consecutive records lose nothing.
        c.absorb("boot-a", &[rec(110, "f"), rec(111, "g")], &[], &cfg);
        assert_eq!(c.kmsg_lost.unwrap().count, 65);
        c.acknowledge(&BTreeMap::new());
        assert_eq!(c.kmsg_lost, None);
        c.absorb("boot-a", &[rec(200, "h")], &[], &cfg);
        assert!(c.kmsg_lost.is_some());
        c.absorb("boot-b", &[rec(5, "i")], &[], &cfg);
        assert_eq!(c.kmsg_lost, None, "a new boot starts over");
    }

    #[test]
    fn a_cursor_of_the_version_before_lost_records_still_loads() {
        let dir = tempfile::tempdir().unwrap();
        let old = r#"{"version":1,"boot_id":"b","kmsg_seq":3,"xids":[],"ecc_baseline":{}}"#;
        std::fs::write(cursor_path(dir.path()), old).unwrap();
        assert_eq!(Cursor::load(dir.path()).unwrap().kmsg_lost, None);
    }

    #[test]
    fn ecc_baseline_follows_resets_and_acknowledgement() {
        let mut c = Cursor::default();
        c.observe_ecc("GPU-a", 2);
        assert_eq!(c.ecc_baseline["GPU-a"], 0, "first sight: any error since driver load counts");
        c.acknowledge(&[("GPU-a".to_string(), 2)].into());
        assert_eq!(c.ecc_baseline["GPU-a"], 2);
        c.observe_ecc("GPU-a", 0);
        assert_eq!(c.ecc_baseline["GPU-a"], 0, "a counter reset lowers the baseline");
    }

    #[test]
    fn save_and_load_round_trip_and_corruption_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let sd = dir.path().join("health");
        assert_eq!(Cursor::load(&sd).unwrap(), Cursor::default());
        let c = Cursor { kmsg_seq: Some(9), ..Cursor::default() };
        c.save(&sd).unwrap();
        assert_eq!(Cursor::load(&sd).unwrap(), c);
        std::fs::write(cursor_path(&sd), b"{").unwrap();
        let err = Cursor::load(&sd).unwrap_err();
        assert!(matches!(err, CursorError::Parse(StateError::Corrupt { .. })), "{err:?}");
        assert!(err.to_string().contains("is corrupt"), "{err}");
    }
}
