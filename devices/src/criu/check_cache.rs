//! A passed `criu check`, remembered for the rest of the boot.
//!
//! `criu --version` and `criu check` take a CPU for 100 to 170 ms (the
//! check probes the kernel and runs iptables); every checkpoint job's agent
//! ran them, so eight jobs starting at once on a 2-core node waited on eight
//! checks (issue 25 item 5: checkpoint prolog x8 p99 219 to 291 ms). Their
//! answer cannot change while the kernel and the binary stay the same, so
//! the first pass is written to `<runtime_dir>/criu-check` (root's, like the
//! directory) with what it depends on: the boot (`boot_id`: a new kernel or
//! sysctl state after a reboot) and the binary's identity (device, inode,
//! size, modification time: an upgrade or a rebuild). A later agent that
//! finds the same key takes the version from it and runs nothing. A failed
//! check is never remembered: the admin's fix takes effect at the next job.

use super::CriuVersion;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The file under the runtime directory.
pub const FILE: &str = "criu-check";

pub struct CheckCache {
    pub path: PathBuf,
}

impl CheckCache {
    /// What a check of `binary` now depends on, as one line; `None` when the
    /// boot or the binary cannot be named (then nothing is remembered).
    fn key(binary: &Path) -> Option<String> {
        let boot = crate::runtime::current_boot_id();
        let m = std::fs::metadata(binary).ok()?;
        (!boot.is_empty()).then(|| {
            format!("boot={boot} binary={} id={}:{}:{}:{}.{}", binary.display(), m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec())
        })
    }

    /// The version a check of `binary` passed with earlier in this boot.
    pub fn passed(&self, binary: &Path) -> Option<CriuVersion> {
        let key = Self::key(binary)?;
        let text = std::fs::read_to_string(&self.path).ok()?;
        let (stored, version) = text.trim_end().rsplit_once(" version=")?;
        (stored == key).then(|| CriuVersion::parse(&format!("Version: {version}"))).flatten()
    }

    /// Remembers that a check of `binary` passed with `version`. Best effort:
    /// without the file the next agent checks again.
    pub fn remember(&self, binary: &Path, version: &CriuVersion) {
        if let Some(key) = Self::key(binary) {
            let _ = crate::fsutil::write_atomic(&self.path, format!("{key} version={version}\n").as_bytes(), 0o644);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_is_found_for_the_same_binary_and_boot_only() {
        let dir = tempfile::tempdir().unwrap();
        let binary = dir.path().join("criu");
        std::fs::write(&binary, b"v1").unwrap();
        let cache = CheckCache { path: dir.path().join(FILE) };
        assert_eq!(cache.passed(&binary), None, "nothing remembered yet");
        let version = CriuVersion::parse("Version: 4.1.1\n").unwrap();
        cache.remember(&binary, &version);
        assert_eq!(cache.passed(&binary).map(|v| v.to_string()), Some("4.1.1".into()));
        // Another binary at another path, and the same path rebuilt: checked again.
        let other = dir.path().join("criu2");
        std::fs::write(&other, b"v1").unwrap();
        assert_eq!(cache.passed(&other), None);
        std::fs::write(&binary, b"v2, rebuilt").unwrap();
        assert_eq!(cache.passed(&binary), None, "a changed binary is checked again");
        // Another boot's line.
        cache.remember(&binary, &version);
        let text = std::fs::read_to_string(&cache.path).unwrap();
        std::fs::write(&cache.path, text.replacen("boot=", "boot=0", 1)).unwrap();
        assert_eq!(cache.passed(&binary), None, "another boot's pass is not this boot's");
        // A damaged file is no pass.
        std::fs::write(&cache.path, "garbage").unwrap();
        assert_eq!(cache.passed(&binary), None);
    }
}
