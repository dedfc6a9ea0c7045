//! Fault matrix (docs/faults.md): the runtime directory's file system full
//! (a 256 KiB tmpfs mounted there, filled up). A prolog that cannot save the
//! job state is a node fault: it drains naming ENOSPC, leaves no temporary
//! file, and Slurm requeues the job held; jobs without --gpu-mode run on.
//! An epilog on a full disk still undoes everything (it only removes).

use gpu_mode_tests::shared::cluster_with;
use gpu_mode_tests::Cluster;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

static TURN: Mutex<()> = Mutex::new(());
const WAIT: Duration = Duration::from_secs(60);

fn umount(dir: &Path) {
    // Lazily: a shell of a killed earlier run may still sit in it.
    let _ = Command::new("/bin/umount").arg("-l").arg(dir).output();
}

fn c() -> &'static Cluster {
    cluster_with("fault_disk_full", 1, |spec| umount(&spec.dir.join("run")))
}

/// The tmpfs on the runtime directory, filled to the last byte while it
/// lives; unmounted (and the node resumed) when it goes.
struct FullDisk {
    run: PathBuf,
    filler: PathBuf,
}

impl FullDisk {
    fn mount() -> FullDisk {
        let run = c().runtime_dir();
        std::fs::create_dir_all(&run).unwrap();
        let out = Command::new("/bin/mount").args(["-t", "tmpfs", "-o", "size=256k,mode=0755", "tmpfs"]).arg(&run).output().unwrap();
        assert!(out.status.success(), "mount: {}", String::from_utf8_lossy(&out.stderr));
        FullDisk { filler: run.join("filler"), run }
    }

    fn fill(&self) {
        use std::io::Write;
        let mut f = std::fs::File::create(&self.filler).unwrap();
        let block = vec![0u8; 4096];
        while f.write_all(&block).is_ok() {}
        // Also the last partial block and the inodes' room: small files.
        for i in 0.. {
            if std::fs::write(self.run.join(format!("f{i}")), b"x").is_err() {
                break;
            }
        }
    }

    fn empty(&self) {
        for e in std::fs::read_dir(&self.run).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name == "filler" || name.starts_with('f') && name[1..].parse::<u32>().is_ok() {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

impl Drop for FullDisk {
    fn drop(&mut self) {
        self.empty();
        c().cancel_all_and_resume();
        umount(&self.run);
    }
}

#[test]
fn a_prolog_on_a_full_runtime_dir_drains_naming_enospc_and_leaves_no_partial_state() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let disk = FullDisk::mount();
    disk.fill();
    let plain = c().sbatch_wait(Some("gmtest1"), &["--gres=gpu:1"], "#!/bin/sh\necho plain-ran\n").unwrap();
    assert_eq!(plain.exit_code, 0, "a job without --gpu-mode needs no disk: {}", plain.output);
    let job = c().sbatch(Some("gmtest1"), &["--gpu-mode=mps", "--gres=gpu:1"], "#!/bin/sh\necho mode-ran\n").unwrap();
    let (_, reason) = c().wait_drained(WAIT).unwrap();
    assert!(reason.starts_with("gpu-mode: prolog: cannot write job state") && reason.contains("No space left on device"), "{reason}");
    c().wait_job_info(job, WAIT, "requeue", |j| j.state == "PENDING").unwrap();
    // No half-written state, no temporary file, no daemon.
    let jobs = disk.run.join("jobs");
    let files: Vec<_> = std::fs::read_dir(&jobs).map(|d| d.flatten().map(|e| e.file_name()).collect()).unwrap_or_default();
    assert!(files.is_empty(), "left in {}: {files:?}", jobs.display());
    let left = c().leftovers(None);
    assert!(left.is_clean(), "left behind:\n{}", left.summary());
}

#[test]
fn an_epilog_on_a_full_runtime_dir_still_undoes_everything() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let disk = FullDisk::mount();
    let job = c().start_held_job("gmtest1", &["--gpu-mode=mps", "--gres=gpu:1"], "").unwrap();
    disk.fill();
    job.release();
    let done = c().wait_finished(job.id, WAIT).unwrap();
    assert_eq!(done.exit_code, 0, "{}", done.output);
    let lines = c().hook_log_lines(job.id);
    assert!(lines.iter().any(|l| l.contains("action=epilog") && l.ends_with("outcome=ok")), "{lines:#?}");
    let (state, reason) = c().node_state().unwrap();
    assert!(!state.contains("DRAIN"), "{state} {reason}");
    let left = c().leftovers(None);
    assert!(left.is_clean(), "left behind:\n{}", left.summary());
    assert_eq!(c().sim_compute_mode(0).unwrap(), 0);
}
