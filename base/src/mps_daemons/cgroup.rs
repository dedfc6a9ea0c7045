//! Putting a job's MPS daemon into the job's own cgroup (audit item M9).
//!
//! The prolog starts the daemon, but Slurm creates the job's cgroup only
//! after the Prolog has run (slurmd's req.c: `_run_prolog`, then
//! `_spawn_prolog_stepd` for the extern step), so the daemon starts outside
//! it: outside the job's memory limit, outside Slurm's kill at job end, and
//! outside its device rules (ConstrainDevices). The plugin therefore moves
//! the daemon and its servers into the job's *extern step* as soon as the
//! job's first task starts (task_init_privileged, as root, in a process that
//! is in the job's cgroup), exactly where pam_slurm_adopt puts processes it
//! adopts: `<job>/step_extern` on cgroup v1 (each controller), and
//! `<job>/step_extern/user/task_special` on cgroup v2. The extern step lives
//! as long as the job and Slurm kills what is in it when the job ends; our
//! epilog then finds the daemon gone and only undoes the rest.
//!
//! It needs `PrologFlags=Contain` (which makes the extern step). Without it,
//! or with proctrack/linuxproc, there is no job cgroup and the daemon stays
//! where it is (logged). A daemon shared by several jobs of one user is not
//! moved: it must outlive the job whose extern step would hold it.

use std::path::{Path, PathBuf};

/// The `cgroup.procs` files of job `job_id`'s extern step, derived from a
/// process of the job's `/proc/<pid>/cgroup` text; only those whose
/// directory exists under `root` (normally /sys/fs/cgroup).
pub fn extern_step_procs(proc_cgroup: &str, root: &Path, job_id: u32) -> Vec<PathBuf> {
    let job = format!("job_{job_id}");
    let mut out = Vec::new();
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(hid), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else { continue };
        // The job's part of the path, up to and including `job_<id>`.
        let Some(at) = path.split('/').position(|c| c == job) else { continue };
        let job_path: PathBuf = path.split('/').take(at + 1).filter(|c| !c.is_empty()).collect();
        let dir = if hid == "0" && controllers.is_empty() {
            root.join(&job_path).join("step_extern/user/task_special")
        } else if controllers.starts_with("name=") {
            // systemd's named hierarchy: not Slurm's.
            continue;
        } else {
            root.join(controllers).join(&job_path).join("step_extern")
        };
        if dir.is_dir() && !out.contains(&dir.join("cgroup.procs")) {
            out.push(dir.join("cgroup.procs"));
        }
    }
    out
}

/// Writes each pid into each `cgroup.procs` file. Returns the errors (the
/// caller logs them: a daemon left outside is no reason to fail the job).
pub fn move_pids(procs_files: &[PathBuf], pids: &[i32]) -> Vec<String> {
    use std::io::Write;
    let mut errors = Vec::new();
    for file in procs_files {
        for pid in pids {
            // One pid per write(2): the kernel takes exactly one per call.
            let written = std::fs::OpenOptions::new()
                .write(true)
                .open(file)
                .and_then(|mut f| f.write_all(format!("{pid}\n").as_bytes()));
            if let Err(e) = written {
                errors.push(format!("pid {pid} into {}: {e}", file.display()));
            }
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_root(dirs: &[&str]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        for d in dirs {
            std::fs::create_dir_all(root.path().join(d)).unwrap();
            std::fs::write(root.path().join(d).join("cgroup.procs"), b"").unwrap();
        }
        root
    }

    #[test]
    fn v2_targets_the_extern_steps_task_special() {
        let root = fake_root(&["system.slice/slurmstepd.scope/job_7/step_extern/user/task_special"]);
        let text = "0::/system.slice/slurmstepd.scope/job_7/step_0/user/task_0\n";
        assert_eq!(
            extern_step_procs(text, root.path(), 7),
            vec![root.path().join("system.slice/slurmstepd.scope/job_7/step_extern/user/task_special/cgroup.procs")]
        );
        // Another job's id, or no extern step (no PrologFlags=Contain): none.
        assert!(extern_step_procs(text, root.path(), 8).is_empty());
        let bare = fake_root(&[]);
        assert!(extern_step_procs(text, bare.path(), 7).is_empty());
    }

    #[test]
    fn v1_targets_each_controllers_extern_step() {
        let root = fake_root(&["freezer/slurm/uid_1000/job_7/step_extern", "memory/slurm/uid_1000/job_7/step_extern"]);
        let text = "12:freezer:/slurm/uid_1000/job_7/step_batch\n\
                    9:memory:/slurm/uid_1000/job_7/step_batch/task_0\n\
                    5:devices:/slurm/uid_1000/job_7/step_batch\n\
                    1:name=systemd:/system.slice/slurmd.service\n\
                    4:pids:/\n";
        let got = extern_step_procs(text, root.path(), 7);
        assert_eq!(
            got,
            vec![
                root.path().join("freezer/slurm/uid_1000/job_7/step_extern/cgroup.procs"),
                root.path().join("memory/slurm/uid_1000/job_7/step_extern/cgroup.procs"),
            ]
        );
        // A job id that is a prefix of another is not matched.
        assert!(extern_step_procs("12:freezer:/slurm/uid_1000/job_77/step_0\n", root.path(), 7).is_empty());
    }

    #[test]
    fn pids_are_written_one_per_write_and_errors_are_named() {
        let root = fake_root(&["a"]);
        let file = root.path().join("a/cgroup.procs");
        assert!(move_pids(std::slice::from_ref(&file), &[12]).is_empty());
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "12\n");
        let missing = root.path().join("gone/cgroup.procs");
        let errors = move_pids(&[missing], &[12]);
        assert!(errors[0].starts_with("pid 12 into ") && errors[0].contains("gone/cgroup.procs"), "{errors:?}");
    }
}
