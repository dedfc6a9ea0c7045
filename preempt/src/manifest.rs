//! The manifest: what a successful dump promises, written last (after every
//! image file is fsynced), so its presence means "this image is complete".
//! A restore trusts nothing else: it checks the job, the user, the format
//! version, that every file is there with its size and checksum, and that
//! this node can take it (driver version, GPU models, free memory).
//!
//! Checksums are FNV-1a 64 over each file: whole for files up to 8 MiB (all
//! of CRIU's metadata images), sampled for bigger ones (the pages images:
//! the first and last MiB and 64 KiB every 256 MiB, plus the size), which
//! catches truncation, a swapped file and most corruption at a cost
//! independent of the job's memory size. `sampled` says which.

use crate::cuda_ckpt::record::ProcessRecord;
use crate::cuda_ckpt::GpuUuid;
use crate::fsutil;
use crate::timeline::Timeline;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::OwnedFd;
use std::path::Path;

pub const MANIFEST_VERSION: u32 = 1;
pub const MANIFEST_FILE: &str = "manifest.json";
/// A manifest whose image has been restored once: never used again (the
/// application has run on since, and its files no longer match the image).
pub const CONSUMED_FILE: &str = "manifest.consumed.json";

const WHOLE_LIMIT: u64 = 8 << 20;
const EDGE: u64 = 1 << 20;
const SAMPLE: u64 = 64 << 10;
const STRIDE: u64 = 256 << 20;
/// The manifest of a big tree is still small; this bounds a read.
const MAX_MANIFEST: usize = 16 << 20;

/// One GPU of the job, in allocation order (the device map pairs by position).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuFacts {
    pub uuid: GpuUuid,
    /// NVML's name, e.g. "NVIDIA H200": a restore needs the same model.
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageFile {
    pub name: String,
    pub bytes: u64,
    /// FNV-1a 64, hex.
    pub fnv64: String,
    pub sampled: bool,
}

/// Where the time of a dump went, ms: the summary figures of its
/// [`Timeline`] (which has every phase).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DumpTimings {
    /// From the preemption signal (as the wrapper saw it) to GPU memory free:
    /// the driver's checkpoint call has returned.
    pub signal_to_gpu_free_ms: Option<f64>,
    pub cuda_lock_ms: f64,
    pub cuda_checkpoint_ms: f64,
    pub criu_dump_ms: f64,
    /// fsync of every image file, checksums, modes.
    pub seal_ms: f64,
    /// From the request to the durable manifest (in the manifest itself: to
    /// the end of the seal).
    pub total_ms: f64,
    /// From the signal to the durable image (absent in older manifests).
    #[serde(default)]
    pub signal_to_durable_ms: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub version: u32,
    // The run's fields one by one, not a flattened `job_env::JobRun`: read
    // through serde's flatten, a manifest without `restart_count` was said
    // to miss `created_unix` (its errors must name the field).
    pub job: u32,
    /// The run that was dumped (SLURM_RESTART_COUNT then).
    pub restart_count: u32,
    pub uid: u32,
    pub gid: u32,
    pub node: String,
    pub created_unix: u64,
    /// The dumped tree: its root, and every pid (CRIU restores the same pids).
    pub root_pid: i32,
    pub pids: Vec<i32>,
    /// The tree's other thread ids (absent in older manifests): CRIU
    /// restores them with their ids too, and a restore waits for them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tids: Vec<i32>,
    /// Its CUDA processes with their GPU footprints.
    pub cuda: Vec<ProcessRecord>,
    pub gpus: Vec<GpuFacts>,
    /// Every GPU of the node that dumped it (absent in older manifests).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_gpus: Vec<GpuUuid>,
    /// NVML's driver version ("580.159.04"): a CUDA checkpoint restores only
    /// on the same driver.
    pub driver_version: String,
    /// cuDriverGetVersion (13000 = 13.0).
    pub cuda_version: i32,
    pub criu_version: String,
    pub tcp_established: bool,
    /// The local ports of the tree's TCP sockets: a restore clears them of
    /// TIME_WAIT entries first (timewait.rs; absent in older manifests).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tcp_ports: Vec<u16>,
    pub images: Vec<ImageFile>,
    pub image_bytes: u64,
    /// The job's /dev/shm files carried in the image (shm.rs; absent when none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shm: Vec<crate::shm::ShmObject>,
    /// Each dumped process's confinement (no_new_privs, seccomp, CapInh): a
    /// restored one may have no less (tree::check_confined). Absent in
    /// older manifests: nothing is compared.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub privs: std::collections::BTreeMap<i32, crate::tree::Privs>,
    /// The tree's hard resource limits at the dump: CRIU restores with
    /// these, so no restored task gets more (privdrop::HardLimits). Absent
    /// in older manifests: CRIU inherits the agent's limits, unraised.
    #[serde(default, skip_serializing_if = "is_unlimited_record")]
    pub limits: crate::privdrop::HardLimits,
    pub timings: DumpTimings,
    /// Every phase of the dump up to the seal (absent in older manifests).
    #[serde(default)]
    pub timeline: Timeline,
}

fn is_unlimited_record(l: &crate::privdrop::HardLimits) -> bool {
    l.0.is_empty()
}

/// Why a manifest cannot be used; every variant keeps the image.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error("cannot read {path}: {detail}")]
    Unreadable { path: String, detail: String },
    #[error("{path} is corrupt: {detail}")]
    Corrupt { path: String, detail: String },
    #[error("{path} has format version {found}; this gpu-mode reads version {MANIFEST_VERSION}: restore with the version that wrote it")]
    Version { path: String, found: u32 },
    #[error("{path} belongs to job {found}, not job {job}")]
    OtherJob { path: String, found: u32, job: u32 },
    #[error("{path} belongs to uid {found}, not to job {job}'s user (uid {uid}): refused")]
    OtherUser { path: String, found: u32, job: u32, uid: u32 },
    #[error("image file {name} in {dir} {problem}")]
    File { dir: String, name: String, problem: String },
}

#[derive(Deserialize)]
struct Header {
    version: u32,
}

impl Manifest {
    /// Reads `dir/manifest.json` without following symlinks; it must be a
    /// regular file owned by the agent's user, root (only the agent writes
    /// images).
    pub fn load(dir: &Path) -> Result<Manifest, ManifestError> {
        let path = dir.join(MANIFEST_FILE).display().to_string();
        let me = unsafe { libc::geteuid() };
        let bytes = fsutil::read_user_file(dir, &[MANIFEST_FILE], me, MAX_MANIFEST)
            .map_err(|e| ManifestError::Unreadable { path: path.clone(), detail: e.to_string() })?;
        Self::parse(&bytes, &path)
    }

    /// Parses manifest text (`path` names it in errors): the version
    /// first, so a future format is a version error, not a field error.
    pub fn parse(bytes: &[u8], path: &str) -> Result<Manifest, ManifestError> {
        let corrupt = |e: serde_json::Error| ManifestError::Corrupt { path: path.to_string(), detail: e.to_string() };
        let header: Header = serde_json::from_slice(bytes).map_err(corrupt)?;
        if header.version != MANIFEST_VERSION {
            return Err(ManifestError::Version { path: path.to_string(), found: header.version });
        }
        // The failing field is named (`cuda[0].pid: invalid type ...`).
        let mut de = serde_json::Deserializer::from_slice(bytes);
        serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let field = e.path().to_string();
            let detail = if field == "." { e.into_inner().to_string() } else { format!("{field}: {}", e.into_inner()) };
            ManifestError::Corrupt { path: path.to_string(), detail }
        })
    }

    /// Writes it durably (temporary file, fsync, rename, fsync directory),
    /// root-only. The caller has sealed every image file first.
    pub fn save(&self, dir: &Path) -> std::io::Result<()> {
        let text = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        fsutil::write_atomic(&dir.join(MANIFEST_FILE), &text, 0o600)
    }

    /// This job's and this user's, or refused.
    pub fn check_owner(&self, dir: &Path, job: u32, uid: u32) -> Result<(), ManifestError> {
        let path = dir.join(MANIFEST_FILE).display().to_string();
        if self.job != job {
            return Err(ManifestError::OtherJob { path, found: self.job, job });
        }
        if self.uid != uid {
            return Err(ManifestError::OtherUser { path, found: self.uid, job, uid });
        }
        Ok(())
    }

    /// Every listed image file is present, a regular file, the recorded
    /// size, with the recorded checksum.
    pub fn check_files(&self, dir: &Path) -> Result<(), ManifestError> {
        let dir_fd = fsutil::open_dir_nofollow(dir)
            .map_err(|e| ManifestError::Unreadable { path: dir.display().to_string(), detail: e.to_string() })?;
        for f in &self.images {
            let problem = |p: String| ManifestError::File { dir: dir.display().to_string(), name: f.name.clone(), problem: p };
            let now = describe_file(&dir_fd, &f.name).map_err(|e| problem(format!("cannot be read: {e}")))?;
            if now.bytes != f.bytes {
                return Err(problem(format!("has {} bytes, the manifest says {}", now.bytes, f.bytes)));
            }
            if now.fnv64 != f.fnv64 {
                return Err(problem(format!("has checksum {}, the manifest says {}", now.fnv64, f.fnv64)));
            }
        }
        Ok(())
    }
}

/// FNV-1a 64 over `data`, continuing from `h`.
fn fnv(mut h: u64, data: &[u8]) -> u64 {
    for b in data {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a 64 of `data` (a name for content, not a defence against forgery).
pub(crate) fn fnv64(data: &[u8]) -> u64 {
    fnv(FNV_OFFSET, data)
}

/// Size and checksum of an open file (see module docs).
fn checksum(file: &mut File, bytes: u64) -> std::io::Result<(String, bool)> {
    let mut h = fnv(FNV_OFFSET, &bytes.to_le_bytes());
    let sampled = bytes > WHOLE_LIMIT;
    let ranges: Vec<(u64, u64)> = if sampled {
        let mut r = vec![(0, EDGE)];
        r.extend((1..).map(|i| i * STRIDE).take_while(|o| o + SAMPLE < bytes - EDGE).map(|o| (o, SAMPLE)));
        r.push((bytes - EDGE, EDGE));
        r
    } else {
        vec![(0, bytes)]
    };
    let mut buf = Vec::new();
    for (off, len) in ranges {
        file.seek(SeekFrom::Start(off))?;
        buf.clear();
        file.by_ref().take(len).read_to_end(&mut buf)?;
        h = fnv(h, &buf);
    }
    Ok((format!("{h:016x}"), sampled))
}

/// Opens `name` in `dir` without following symlinks, checks it is a
/// regular file, and describes it.
pub fn describe_file(dir: &OwnedFd, name: &str) -> std::io::Result<ImageFile> {
    use nix::fcntl::{openat, OFlag};
    use nix::sys::stat::Mode;
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(std::io::Error::other(format!("{name:?} is not a plain file name")));
    }
    let fd = openat(dir, name, OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK, Mode::empty())
        .map_err(std::io::Error::from)?;
    let mut file = File::from(fd);
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let (fnv64, sampled) = checksum(&mut file, meta.len())?;
    Ok(ImageFile { name: name.to_string(), bytes: meta.len(), fnv64, sampled })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda_ckpt::record::{Footprint, ProcessPhase};

    pub(crate) fn sample(dir: &Path) -> Manifest {
        let gpu = GpuUuid::parse("GPU-5a3c1f2e-0b9d-4e11-8a2b-c0ffee123456").unwrap();
        std::fs::write(dir.join("core-1.img"), b"core").unwrap();
        let fd = fsutil::open_dir_nofollow(dir).unwrap();
        let images = vec![describe_file(&fd, "core-1.img").unwrap()];
        Manifest {
            version: MANIFEST_VERSION,
            job: 7,
            restart_count: 0,
            uid: 1001,
            gid: 1001,
            node: "n1".into(),
            created_unix: 1,
            root_pid: 100,
            pids: vec![100, 101],
            cuda: vec![ProcessRecord {
                pid: 100,
                start_time: 5,
                footprint: vec![Footprint { gpu, bytes: 1 << 30 }],
                phase: ProcessPhase::Checkpointed,
                unanswered: None,
            }],
            gpus: vec![GpuFacts { uuid: gpu, name: "NVIDIA H200".into() }],
            node_gpus: vec![gpu],
            driver_version: "580.159.04".into(),
            cuda_version: 13000,
            criu_version: "4.1.1".into(),
            tcp_established: false,
            tcp_ports: vec![],
            image_bytes: 4,
            images,
            shm: vec![],
            tids: vec![],
            privs: Default::default(),
            limits: Default::default(),
            timings: DumpTimings::default(),
            timeline: Timeline::default(),
        }
    }

    #[test]
    fn round_trip_and_owner_checks() {
        let dir = tempfile::tempdir().unwrap();
        let m = sample(dir.path());
        m.save(dir.path()).unwrap();
        let back = Manifest::load(dir.path()).unwrap();
        assert_eq!(back, m);
        back.check_owner(dir.path(), 7, 1001).unwrap();
        back.check_files(dir.path()).unwrap();
        let err = back.check_owner(dir.path(), 8, 1001).unwrap_err().to_string();
        assert!(err.contains("belongs to job 7, not job 8"), "{err}");
        let err = back.check_owner(dir.path(), 7, 1002).unwrap_err().to_string();
        assert!(err.contains("belongs to uid 1001, not to job 7's user (uid 1002): refused"), "{err}");
    }

    #[test]
    fn versions_and_corruption_are_named() {
        let cases: [(&[u8], &str); 5] = [
            (br#"{"version": 2, "job": 7}"#, "format version 2; this gpu-mode reads version 1"),
            (br#"{"version": 1, "job": 7}"#, "is corrupt: missing field `restart_count`"),
            (br#"{"version": 1, "job": "7"}"#, "is corrupt: job: invalid type: string \"7\", expected u32"),
            (b"{\"version\": 1, \"job\"", "is corrupt"),
            (b"", "is corrupt"),
        ];
        for (bytes, needle) in cases {
            let err = Manifest::parse(bytes, "/img/7/0/manifest.json").unwrap_err().to_string();
            assert!(err.contains(needle), "{}: {err}", String::from_utf8_lossy(bytes));
        }
    }

    /// Found by the manifest fuzz target: serde_json's default float parser
    /// read `1e73` one ulp off, so a manifest's own text did not read back
    /// equal (the workspace enables `float_roundtrip`).
    #[test]
    fn floats_read_back_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = sample(dir.path());
        for ms in [1e73, 0.1, 640.25, 1.7976931348623157e308, 5e-324] {
            m.timings.total_ms = ms;
            let text = serde_json::to_vec(&m).unwrap();
            assert_eq!(Manifest::parse(&text, "m").unwrap(), m, "{ms}");
        }
        let literal = br#"{"x": 1e73}"#;
        let v: serde_json::Value = serde_json::from_slice(literal).unwrap();
        assert_eq!(v["x"].as_f64(), Some(1e73));
    }

    #[test]
    fn changed_missing_or_swapped_files_are_caught() {
        let dir = tempfile::tempdir().unwrap();
        let m = sample(dir.path());
        std::fs::write(dir.path().join("core-1.img"), b"CORE").unwrap();
        assert!(m.check_files(dir.path()).unwrap_err().to_string().contains("has checksum"));
        std::fs::write(dir.path().join("core-1.img"), b"core!").unwrap();
        assert!(m.check_files(dir.path()).unwrap_err().to_string().contains("has 5 bytes, the manifest says 4"));
        std::fs::remove_file(dir.path().join("core-1.img")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("core-1.img")).unwrap();
        assert!(m.check_files(dir.path()).unwrap_err().to_string().contains("cannot be read"));
    }

    #[test]
    fn big_files_are_sampled_and_still_catch_a_change_in_a_sample() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pages-1.img");
        let f = File::create(&path).unwrap();
        f.set_len(600 << 20).unwrap();
        let fd = fsutil::open_dir_nofollow(dir.path()).unwrap();
        let before = describe_file(&fd, "pages-1.img").unwrap();
        assert!(before.sampled);
        // A byte inside the sample at 256 MiB.
        use std::os::unix::fs::FileExt;
        f.write_all_at(b"x", 256 << 20).unwrap();
        assert_ne!(describe_file(&fd, "pages-1.img").unwrap().fnv64, before.fnv64);
        f.set_len(599 << 20).unwrap();
        assert_ne!(describe_file(&fd, "pages-1.img").unwrap().bytes, before.bytes);
    }
}
