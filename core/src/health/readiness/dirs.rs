//! `ckpt_dirs`: `preempt.image_dir` and `preempt.staging_dir` take a file
//! from root (the agent writes the images as root's; a read-only mount, a
//! root-squashing NFS export or a full disk stop a dump), and each has room
//! for the largest GPU's memory, the least a job that fills that GPU dumps.
//! A directory not made yet is judged by the nearest one above it: the
//! agent makes it at the first checkpoint (preempt::images).

use super::super::{combine, Check, CheckResult, Ctx, Status};
use super::{gib, largest_gpu, Inputs};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

pub const NAME: &str = "ckpt_dirs";

pub struct Dirs;

impl Check for Dirs {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&self, ctx: &Ctx) -> Vec<CheckResult> {
        super::judged(ctx, NAME, |f| judge(&f.dirs, largest_gpu(ctx)))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirFacts {
    /// The config key: `preempt.image_dir`.
    pub key: &'static str,
    pub path: PathBuf,
    pub probe: Result<Probed, String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probed {
    /// The directory written to: `path`, or the nearest existing one above.
    pub at: PathBuf,
    pub free_bytes: u64,
}

pub fn probe(inputs: &Inputs) -> Vec<DirFacts> {
    let mut dirs = vec![("preempt.image_dir", inputs.image_dir.clone())];
    dirs.extend(inputs.staging_dir.clone().map(|d| ("preempt.staging_dir", d)));
    dirs.into_iter().map(|(key, path)| DirFacts { key, probe: probe_dir(&path), path }).collect()
}

/// Writes and removes a file in `dir` (or the nearest directory above it
/// that exists) as this process, root; then its free space.
fn probe_dir(dir: &Path) -> Result<Probed, String> {
    let at = dir.ancestors().find(|d| d.exists()).unwrap_or(Path::new("/")).to_path_buf();
    let file = at.join(format!(".gpu-mode-readiness.{}", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .mode(0o600)
        .open(&file)
        .and_then(|mut f| f.write_all(b"readiness\n"));
    let _ = std::fs::remove_file(&file);
    written.map_err(|e| format!("cannot write a file in {}: {e}", at.display()))?;
    let stat = nix::sys::statvfs::statvfs(&at).map_err(|e| format!("statvfs {}: {e}", at.display()))?;
    Ok(Probed { free_bytes: stat.blocks_available() as u64 * stat.fragment_size() as u64, at })
}

/// Each directory's findings; `largest_gpu`: (index, bytes).
pub fn judge(dirs: &[DirFacts], largest_gpu: Option<(u32, u64)>) -> CheckResult {
    let mut findings = Vec::new();
    let mut fine = Vec::new();
    let mut unwritable = false;
    for d in dirs {
        match &d.probe {
            Err(e) => {
                unwritable = true;
                findings.push((
                Status::Warn,
                    format!("{} {}: {e}; fix: make it writable by root (a read-write mount, no root squash) or set {} in /etc/slurm-gpu-mode/config.toml", d.key, d.path.display(), d.key),
                ))
            }
            Ok(p) => match largest_gpu {
                Some((gpu, need)) if p.free_bytes < need => findings.push((
                    Status::Warn,
                    format!(
                        "{} {} has {} free, less than GPU {gpu}'s {} of memory: a job that fills the GPU cannot be dumped; fix: free space on {} or set {} to a larger file system",
                        d.key,
                        d.path.display(),
                        gib(p.free_bytes),
                        gib(need),
                        p.at.display(),
                        d.key
                    ),
                )),
                _ => fine.push(format!("{} {} writable, {} free", d.key, d.path.display(), gib(p.free_bytes))),
            },
        }
    }
    let only_space = !findings.is_empty() && !unwritable;
    let result = combine(NAME, None, findings, fine.join("; "));
    // Too little space bounds the jobs that can be dumped; a directory that
    // cannot be written stops them all.
    if only_space {
        result.bounding()
    } else {
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn dir(key: &'static str, path: &str, probe: Result<u64, &str>) -> DirFacts {
        DirFacts { key, path: path.into(), probe: probe.map(|free_bytes| Probed { at: path.into(), free_bytes }).map_err(String::from) }
    }

    #[test]
    fn each_directory_must_take_a_file_and_the_largest_gpu() {
        let h200 = Some((1, 139 * GIB + GIB / 2));
        let cases: Vec<(Vec<DirFacts>, Option<(u32, u64)>, Status, &str)> = vec![
            (vec![dir("preempt.image_dir", "/img", Ok(900 * GIB))], h200, Status::Ok, "preempt.image_dir /img writable, 900.0 GiB free"),
            (
                vec![dir("preempt.image_dir", "/img", Ok(900 * GIB)), dir("preempt.staging_dir", "/stage", Ok(200 * GIB))],
                h200,
                Status::Ok,
                "preempt.image_dir /img writable, 900.0 GiB free; preempt.staging_dir /stage writable, 200.0 GiB free",
            ),
            (vec![dir("preempt.image_dir", "/img", Ok(GIB))], None, Status::Ok, "preempt.image_dir /img writable, 1.0 GiB free"),
            (
                vec![dir("preempt.image_dir", "/img", Err("cannot write a file in /img: Read-only file system (os error 30)"))],
                h200,
                Status::Warn,
                "preempt.image_dir /img: cannot write a file in /img: Read-only file system (os error 30); fix: make it writable by root (a read-write mount, no root squash) or set preempt.image_dir in /etc/slurm-gpu-mode/config.toml",
            ),
            (
                vec![dir("preempt.image_dir", "/img", Ok(900 * GIB)), dir("preempt.staging_dir", "/stage", Ok(100 * GIB))],
                h200,
                Status::Warn,
                "preempt.staging_dir /stage has 100.0 GiB free, less than GPU 1's 139.5 GiB of memory: a job that fills the GPU cannot be dumped; fix: free space on /stage or set preempt.staging_dir to a larger file system",
            ),
        ];
        for (dirs, gpu, status, text) in cases {
            let got = judge(&dirs, gpu);
            assert_eq!((got.status, got.message.as_str()), (status, text), "{dirs:?}");
            // Only space findings bound; an unwritable directory forbids.
            assert_eq!(got.bounds_only, text.contains("free, less than"), "{dirs:?}");
        }
    }

    #[test]
    fn the_probe_writes_where_the_agent_would_and_leaves_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let got = probe_dir(&tmp.path().join("images/not/made")).unwrap();
        assert_eq!(got.at, tmp.path(), "a directory not made yet is judged by the one above");
        assert!(got.free_bytes > 0);
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0, "the probe's file is gone");
        let file = tmp.path().join("a-file");
        std::fs::write(&file, "").unwrap();
        let err = probe_dir(&file.join("images")).unwrap_err();
        assert!(err.starts_with(&format!("cannot write a file in {}: ", file.display())), "{err}");
    }
}
