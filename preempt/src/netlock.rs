//! CRIU's nftables network locks, which outlive the dump (issue 37 N2).
//!
//! A dump with `--tcp-established --network-lock nftables` makes CRIU create
//! a table `inet CRIU-<run id>` that drops the dumped connections' packets
//! both ways, and leave it (`--leave-stopped`: cr_dump_finish unlocks only
//! on failure). Only a restore on the same node removes it (CRIU 4.1.1
//! net.c `nftables_network_unlock`, with the run id the dump recorded in
//! its inventory). A job moved to another node, started over, cancelled or
//! ended, and a CRIU the user killed, left the table for good, and a root
//! program reusing one of the ports then timed out.
//!
//! The name: CRIU 4.1.1 `nftables_get_table` prints `inet CRIU-%s` of the
//! run id (`uuid_unparse` of a random uuid, util.c `util_init`) into a
//! 32-byte buffer, so the table is `CRIU-` and the uuid's first 21
//! characters (`8-4-4-2` hex digits). The dump's run id is in
//! `inventory.img` (`dump_criu_run_id`, field 13); the agent reads it back
//! right after a dump that kept a lock and records the table here, in a
//! root-only directory of the node (`<runtime_dir>/netlocks`, a file named
//! by the table holding the image's run directory). Before the dump it
//! leaves a `dumping-<job>` marker, so that a table CRIU just made is not
//! taken for a stray one.
//!
//! [`NetLocks::sweep`] (the epilog of every checkpoint job, after the
//! image sweep) deletes each `CRIU-*` table of the node whose record names
//! an image that is no longer complete (removed, or consumed by a restore
//! here or elsewhere), and each one no record claims (a CRIU killed before
//! it wrote its inventory) unless a dump is under way; records whose table
//! is gone (a restore on this node removed it) go too. The tables are
//! deleted with `nft delete table inet <name>`: the binary by absolute path
//! from the config (`preempt.nft`), an argument vector, never a shell, and
//! only names of CRIU's exact form. A node without nft, or a table already
//! gone, is not an error.

use crate::images::run_state;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What every table of CRIU's starts with.
pub const TABLE_PREFIX: &str = "CRIU-";
/// Characters of the run id CRIU's 32-byte buffer keeps (`inet CRIU-` is 10).
const RUN_ID_KEPT: usize = 21;
/// The inventory's magic (criu/include/magic.h INVENTORY_MAGIC); the
/// inventory alone has no common magic before it.
const INVENTORY_MAGIC: u32 = 0x5831_3116;
/// `dump_criu_run_id` in images/inventory.proto.
const RUN_ID_FIELD: u64 = 13;
/// The most of an inventory root reads (it is a few dozen bytes).
const INVENTORY_MAX: usize = 64 << 10;
/// How long one nft call may take.
const NFT_WAIT: Duration = Duration::from_secs(10);
/// A record's file name prefix for a dump under way.
const DUMPING_PREFIX: &str = "dumping-";

/// Whether `name` is exactly a table name CRIU 4.1.1 makes for a dump:
/// `CRIU-` and `xxxxxxxx-xxxx-xxxx-xx` in lowercase hex. Nothing else is
/// ever passed to nft.
pub fn is_criu_table(name: &str) -> bool {
    let Some(id) = name.strip_prefix(TABLE_PREFIX) else { return false };
    id.len() == RUN_ID_KEPT
        && id.char_indices().all(|(i, c)| if [8, 13, 18].contains(&i) { c == '-' } else { c.is_ascii_digit() || ('a'..='f').contains(&c) })
}

/// The table CRIU names after a run id (a uuid), if that makes a valid name.
pub fn table_of_run_id(run_id: &str) -> Option<String> {
    let name = format!("{TABLE_PREFIX}{}", run_id.get(..RUN_ID_KEPT)?);
    is_criu_table(&name).then_some(name)
}

/// A protobuf varint at `*at`.
fn varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*at)?;
        *at += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// The dump's run id from `inventory.img`: the magic, the entry's size, then
/// the inventory_entry message, read for field 13 alone (every other field
/// skipped by its wire type). `None` for anything else.
pub fn run_id_from_inventory(bytes: &[u8]) -> Option<String> {
    let word = |i: usize| Some(u32::from_le_bytes(bytes.get(i..i + 4)?.try_into().ok()?));
    if word(0)? != INVENTORY_MAGIC {
        return None;
    }
    let size = word(4)? as usize;
    let msg = bytes.get(8..8usize.checked_add(size)?)?;
    let mut at = 0;
    while at < msg.len() {
        let key = varint(msg, &mut at)?;
        match key & 7 {
            0 => {
                varint(msg, &mut at)?;
            }
            1 => at = at.checked_add(8)?,
            5 => at = at.checked_add(4)?,
            2 => {
                let len = varint(msg, &mut at)? as usize;
                let value = msg.get(at..at.checked_add(len)?)?;
                at += len;
                if key >> 3 == RUN_ID_FIELD {
                    return String::from_utf8(value.to_vec()).ok();
                }
            }
            _ => return None,
        }
    }
    None
}

/// The table a dump left, read from its run directory's inventory (the
/// user's file right after CRIU, root's once sealed: `owner`).
pub fn table_of_dump(run: &Path, owner: u32) -> Result<String, String> {
    let bytes = crate::fsutil::read_user_file(run, &[crate::criu::INVENTORY], owner, INVENTORY_MAX)
        .map_err(|e| format!("cannot read {}: {e}", run.join(crate::criu::INVENTORY).display()))?;
    let id = run_id_from_inventory(&bytes).ok_or_else(|| format!("no run id in {}", run.join(crate::criu::INVENTORY).display()))?;
    table_of_run_id(&id).ok_or_else(|| format!("the run id {id:?} names no table of CRIU's"))
}

/// The `inet` tables of `nft list tables` output (`table inet NAME` lines).
pub fn inet_tables(listing: &str) -> Vec<String> {
    listing
        .lines()
        .filter_map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
            ["table", "inet", name] => Some(name.to_string()),
            _ => None,
        })
        .collect()
}

/// The node's nft, by absolute path (`preempt.nft`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nft {
    pub binary: PathBuf,
}

/// Why nft could not be asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NftError {
    /// No nft on the node: nothing can be listed or deleted, and no dump
    /// that kept a lock can have been made without nftables either.
    #[error("{0} is missing: CRIU's network locks cannot be listed or removed here")]
    Missing(PathBuf),
    #[error("{0}")]
    Failed(String),
}

impl Nft {
    fn run(&self, args: &[&str]) -> Result<std::process::Output, NftError> {
        if !self.binary.is_absolute() {
            return Err(NftError::Failed(format!("{} is not an absolute path", self.binary.display())));
        }
        let mut cmd = std::process::Command::new(&self.binary);
        cmd.args(args).env_clear().current_dir("/");
        crate::command::run_with_timeout(cmd, None, NFT_WAIT).map_err(|e| match e {
            crate::command::CommandError::Spawn { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                NftError::Missing(self.binary.clone())
            }
            other => NftError::Failed(other.to_string()),
        })
    }

    /// The node's `inet` tables whose name starts with `CRIU-`.
    pub fn criu_tables(&self) -> Result<Vec<String>, NftError> {
        let out = self.run(&["list", "tables"])?;
        if !out.status.success() {
            return Err(NftError::Failed(format!("nft list tables: {}", String::from_utf8_lossy(&out.stderr).trim())));
        }
        Ok(inet_tables(&String::from_utf8_lossy(&out.stdout)).into_iter().filter(|t| t.starts_with(TABLE_PREFIX)).collect())
    }

    /// `nft delete table inet <name>` for a name of CRIU's exact form.
    /// Ok(false): the table was already gone.
    pub fn delete(&self, name: &str) -> Result<bool, NftError> {
        if !is_criu_table(name) {
            return Err(NftError::Failed(format!("{name:?} is not a table of CRIU's: not deleted")));
        }
        let out = self.run(&["delete", "table", "inet", name])?;
        let err = String::from_utf8_lossy(&out.stderr);
        match (out.status.success(), err.contains("No such file or directory")) {
            (true, _) => Ok(true),
            (false, true) => Ok(false),
            (false, false) => Err(NftError::Failed(format!("nft delete table inet {name}: {}", err.trim()))),
        }
    }
}

/// One table's record: the image whose dump left it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LockRecord {
    pub job: u32,
    pub run_dir: PathBuf,
}

/// What the node's records say of one table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Its image is complete: a restore here will remove it. Kept.
    Image(LockRecord),
    /// Its image is gone or consumed: deleted.
    Stale(LockRecord),
    /// No record, and no dump under way: deleted.
    Unclaimed,
    /// No record, but a dump is under way (its table may be this): kept.
    MaybeDumping,
}

impl Claim {
    pub fn deleted(&self) -> bool {
        matches!(self, Claim::Stale(_) | Claim::Unclaimed)
    }
}

/// The decision for one table, given its record (if any), whether that
/// record's image is complete, and whether a dump is under way.
pub fn judge(record: Option<LockRecord>, image_complete: bool, dumping: bool) -> Claim {
    match (record, dumping) {
        (Some(r), _) if image_complete => Claim::Image(r),
        (Some(r), _) => Claim::Stale(r),
        (None, true) => Claim::MaybeDumping,
        (None, false) => Claim::Unclaimed,
    }
}

/// The node's records of CRIU's tables (`<runtime_dir>/netlocks`, root's
/// 0700) and its nft.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetLocks {
    pub dir: PathBuf,
    pub nft: Nft,
    /// How long a `dumping-` marker counts: a dump cannot last longer than
    /// CRIU's bound; a marker left by a crashed agent stops counting then.
    pub dump_bound: Duration,
}

/// A dump under way (removed when dropped).
pub struct Dumping(PathBuf);

impl Drop for Dumping {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// What a sweep did, for the epilog's line.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Swept {
    pub deleted: Vec<String>,
    pub kept: Vec<String>,
    /// Why nothing was done, or what failed (once).
    pub note: Option<String>,
}

impl NetLocks {
    pub fn from_config(cfg: &crate::Config) -> NetLocks {
        NetLocks {
            dir: cfg.runtime_dir.join("netlocks"),
            nft: Nft { binary: cfg.preempt.nft.clone() },
            dump_bound: Duration::from_millis(cfg.preempt.criu_timeout_ms) + Duration::from_secs(60),
        }
    }

    fn ensure_dir(&self) -> std::io::Result<()> {
        let runtime = self.dir.parent().unwrap_or(Path::new("/"));
        crate::fsutil::ensure_runtime_subdir(runtime, &self.dir)
    }

    /// Marks a dump of `job` under way, before CRIU runs.
    pub fn dumping(&self, job: u32) -> std::io::Result<Dumping> {
        self.ensure_dir()?;
        let path = self.dir.join(format!("{DUMPING_PREFIX}{job}"));
        crate::fsutil::write_atomic(&path, b"", 0o600)?;
        Ok(Dumping(path))
    }

    /// Records that `table` belongs to the image in `run_dir`.
    pub fn record(&self, table: &str, job: u32, run_dir: &Path) -> std::io::Result<()> {
        if !is_criu_table(table) {
            return Err(std::io::Error::other(format!("{table:?} is not a table of CRIU's")));
        }
        self.ensure_dir()?;
        let rec = LockRecord { job, run_dir: run_dir.to_path_buf() };
        crate::fsutil::write_atomic(&self.dir.join(table), &serde_json::to_vec(&rec).map_err(std::io::Error::other)?, 0o600)
    }

    /// The record of `table`, if any (root's directory: read as it is).
    pub fn record_of(&self, table: &str) -> Option<LockRecord> {
        if !is_criu_table(table) {
            return None;
        }
        serde_json::from_slice(&std::fs::read(self.dir.join(table)).ok()?).ok()
    }

    /// Whether a dump is under way on this node (a fresh marker).
    pub fn dump_under_way(&self) -> bool {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return false };
        entries.flatten().any(|e| {
            e.file_name().to_string_lossy().starts_with(DUMPING_PREFIX)
                && e.metadata().ok().and_then(|m| m.modified().ok()).and_then(|t| t.elapsed().ok()).is_some_and(|age| age < self.dump_bound)
        })
    }

    /// How each of the node's CRIU tables stands (no change made).
    pub fn claims(&self) -> Result<Vec<(String, Claim)>, NftError> {
        let tables = self.nft.criu_tables()?;
        let dumping = self.dump_under_way();
        Ok(tables
            .into_iter()
            .map(|t| {
                let record = self.record_of(&t);
                let complete = record.as_ref().is_some_and(|r| run_state(&r.run_dir) == "complete");
                let claim = judge(record, complete, dumping);
                (t, claim)
            })
            .collect())
    }

    /// Deletes the tables no complete image needs, and the records of
    /// tables that are gone (see the module docs).
    pub fn sweep(&self) -> Swept {
        let mut swept = Swept::default();
        let claims = match self.claims() {
            Ok(c) => c,
            Err(e) => {
                swept.note = Some(e.to_string());
                return swept;
            }
        };
        for (table, claim) in &claims {
            if !claim.deleted() {
                swept.kept.push(table.clone());
                continue;
            }
            match self.nft.delete(table) {
                Ok(_) => {
                    let _ = crate::fsutil::remove_if_present(&self.dir.join(table));
                    swept.deleted.push(table.clone());
                }
                Err(e) => {
                    swept.note.get_or_insert_with(|| e.to_string());
                }
            }
        }
        // Records of tables that no longer exist (a restore here removed it).
        let live: Vec<&String> = claims.iter().map(|(t, _)| t).collect();
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if is_criu_table(&name) && !live.contains(&&name) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        swept
    }

    /// Deletes one table now (a dump whose image was dropped after CRIU
    /// kept its lock), and its record.
    pub fn release(&self, table: &str) -> Result<bool, NftError> {
        let gone = self.nft.delete(table)?;
        let _ = crate::fsutil::remove_if_present(&self.dir.join(table));
        Ok(gone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_criu_s_exact_table_names_are_accepted() {
        let cases = [
            ("CRIU-6f1a2b3c-4d5e-4f70-81", true),
            ("CRIU-00000000-0000-0000-00", true),
            ("CRIU-6f1a2b3c-4d5e-4f70-819", false),
            ("CRIU-6f1a2b3c-4d5e-4f70-8", false),
            ("CRIU-6F1A2B3C-4D5E-4F70-81", false),
            ("CRIU-6f1a2b3c_4d5e-4f70-81", false),
            ("CRIU-6f1a2b3g-4d5e-4f70-81", false),
            ("CRIU-1234", false),
            ("criu-6f1a2b3c-4d5e-4f70-81", false),
            ("filter", false),
            ("CRIU-6f1a2b3c-4d5e-4f70-8;", false),
            ("CRIU-6f1a2b3c-4d5e-4f70 81", false),
            ("", false),
        ];
        for (name, ok) in cases {
            assert_eq!(is_criu_table(name), ok, "{name:?}");
        }
        assert_eq!(table_of_run_id("6f1a2b3c-4d5e-4f70-8192-a3b4c5d6e7f8").as_deref(), Some("CRIU-6f1a2b3c-4d5e-4f70-81"));
        assert_eq!(table_of_run_id("6f1a2b3c"), None);
        assert_eq!(table_of_run_id("../../etc/passwd-and-some-more-chars"), None);
    }

    /// An inventory as CRIU 4.1.1 writes it: magic, size, then the message
    /// (img_version, fdinfo_per_id, root_ids, ... network_lock_method,
    /// dump_criu_run_id).
    fn inventory(fields: &[u8]) -> Vec<u8> {
        let mut b = INVENTORY_MAGIC.to_le_bytes().to_vec();
        b.extend((fields.len() as u32).to_le_bytes());
        b.extend(fields);
        b
    }

    #[test]
    fn the_run_id_is_read_from_the_inventory() {
        let id = b"6f1a2b3c-4d5e-4f70-8192-a3b4c5d6e7f8";
        let mut fields = vec![0x08, 0x02, 0x10, 0x01, 0x1a, 0x02, 0x08, 0x05, 0x40, 0x80, 0x01, 0x58, 0x01, 0x62, 0x00];
        fields.extend([0x6a, id.len() as u8]);
        fields.extend(id);
        let cases: [(&str, Vec<u8>, Option<&str>); 6] = [
            ("whole", inventory(&fields), Some("6f1a2b3c-4d5e-4f70-8192-a3b4c5d6e7f8")),
            ("no run id (an older CRIU)", inventory(&fields[..15]), None),
            ("cut short", inventory(&fields)[..fields.len()].to_vec(), None),
            ("another magic", { let mut b = inventory(&fields); b[0] ^= 1; b }, None),
            ("empty", vec![], None),
            ("a length past the end", inventory(&[0x6a, 0xff, 0x01, b'a']), None),
        ];
        for (what, bytes, want) in cases {
            assert_eq!(run_id_from_inventory(&bytes).as_deref(), want, "{what}");
        }
        // Written by CRIU 4.1.1 here (`criu dump --tcp-established
        // --network-lock nftables`), whose table was
        // `inet CRIU-145388f9-d6e3-48ce-a8` (`nft list tables`).
        let real = [
            0x16, 0x31, 0x31, 0x58, 0x4e, 0x00, 0x00, 0x00, 0x08, 0x02, 0x10, 0x01, 0x1a, 0x18, 0x08, 0x01, 0x10, 0x01, 0x18, 0x01, 0x20, 0x01,
            0x28, 0x01, 0x30, 0x02, 0x38, 0x03, 0x40, 0x04, 0x48, 0x06, 0x50, 0x07, 0x58, 0x08, 0x60, 0x05, 0x20, 0x01, 0x28, 0x01, 0x30, 0x00,
            0x58, 0x01, 0x62, 0x00, 0x6a, 0x24, 0x31, 0x34, 0x35, 0x33, 0x38, 0x38, 0x66, 0x39, 0x2d, 0x64, 0x36, 0x65, 0x33, 0x2d, 0x34, 0x38,
            0x63, 0x65, 0x2d, 0x61, 0x38, 0x35, 0x65, 0x2d, 0x64, 0x31, 0x32, 0x65, 0x66, 0x66, 0x64, 0x31, 0x64, 0x39, 0x66, 0x39,
        ];
        let id = run_id_from_inventory(&real).unwrap();
        assert_eq!(table_of_run_id(&id).as_deref(), Some("CRIU-145388f9-d6e3-48ce-a8"));
    }

    #[test]
    fn nft_listings_give_inet_tables() {
        let listing = "table inet filter\ntable ip nat\ntable inet CRIU-6f1a2b3c-4d5e-4f70-81\ntable inet CRIU-odd name\n  table inet x y\n";
        assert_eq!(inet_tables(listing), ["filter", "CRIU-6f1a2b3c-4d5e-4f70-81"]);
        assert!(inet_tables("").is_empty());
    }

    #[test]
    fn each_table_is_kept_only_while_a_complete_image_or_a_dump_may_need_it() {
        let r = || LockRecord { job: 7, run_dir: "/img/7/0".into() };
        let cases = [
            (Some(r()), true, false, Claim::Image(r()), false),
            (Some(r()), true, true, Claim::Image(r()), false),
            (Some(r()), false, false, Claim::Stale(r()), true),
            (Some(r()), false, true, Claim::Stale(r()), true),
            (None, false, false, Claim::Unclaimed, true),
            (None, false, true, Claim::MaybeDumping, false),
        ];
        for (record, complete, dumping, claim, deleted) in cases {
            let got = judge(record, complete, dumping);
            assert_eq!((&got, got.deleted()), (&claim, deleted));
        }
    }

    /// With a stand-in nft that logs its argument vectors: which tables a
    /// sweep deletes, what it keeps, which records go.
    #[test]
    fn a_sweep_deletes_what_no_complete_image_claims() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let log = tmp.path().join("calls");
        let nft = tmp.path().join("nft");
        let (kept, stale, stray, gone) =
            ("CRIU-11111111-1111-4111-81", "CRIU-22222222-2222-4222-82", "CRIU-33333333-3333-4333-83", "CRIU-44444444-4444-4444-84");
        std::fs::write(
            &nft,
            format!(
                "#!/bin/sh\necho \"$@\" >> {}\nif [ \"$1\" = list ]; then printf 'table inet filter\\ntable inet {kept}\\ntable inet {stale}\\ntable inet {stray}\\n'; fi\n",
                log.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&nft, std::fs::Permissions::from_mode(0o755)).unwrap();
        let locks = NetLocks { dir: tmp.path().join("run/netlocks"), nft: Nft { binary: nft }, dump_bound: Duration::from_secs(60) };
        let store = crate::images::ImageStore::new(tmp.path().join("images"));
        let complete = store.prepare_run(7, 0).unwrap();
        std::fs::write(complete.join(crate::manifest::MANIFEST_FILE), b"{}").unwrap();
        locks.record(kept, 7, &complete).unwrap();
        locks.record(stale, 8, &store.run_dir(8, 0)).unwrap();
        locks.record(gone, 9, &complete).unwrap();
        assert!(locks.record("CRIU-x; rm -rf /", 9, &complete).is_err());
        let swept = locks.sweep();
        assert_eq!((swept.deleted.as_slice(), swept.kept.as_slice(), swept.note), (&[stale.to_string(), stray.to_string()][..], &[kept.to_string()][..], None));
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            format!("list tables\ndelete table inet {stale}\ndelete table inet {stray}\n")
        );
        // The kept table's record stays; the deleted one's and the gone one's go.
        let mut left: Vec<String> = std::fs::read_dir(&locks.dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        left.sort();
        assert_eq!(left, [kept]);
        // A dump under way: the stray one is kept, the stale one still goes.
        std::fs::write(&log, "").unwrap();
        locks.record(stale, 8, &store.run_dir(8, 0)).unwrap();
        let marker = locks.dumping(10).unwrap();
        let swept = locks.sweep();
        assert_eq!((swept.deleted, swept.kept), (vec![stale.to_string()], vec![kept.to_string(), stray.to_string()]));
        drop(marker);
        assert!(!locks.dump_under_way());
        // No nft on the node: said once, nothing else.
        let none = NetLocks { nft: Nft { binary: tmp.path().join("no-nft") }, ..locks.clone() };
        let swept = none.sweep();
        assert!(swept.deleted.is_empty() && swept.note.as_deref().is_some_and(|n| n.ends_with("is missing: CRIU's network locks cannot be listed or removed here")), "{swept:?}");
        assert!(matches!(none.nft.delete("not-criu"), Err(NftError::Failed(_))));
    }
}
