//! What jobs may leave behind on a node, counted from outside: the fault
//! tests and the churn end with "nothing left". Each list names what it
//! found, so a failure says what leaked.

use crate::Cluster;
use std::os::unix::io::AsRawFd;
use std::path::Path;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Leftovers {
    /// Live (not zombie) processes of this cluster's MPS binaries.
    pub mps_processes: Vec<String>,
    /// MPS registry records and daemon directories.
    pub mps_records: Vec<String>,
    /// Job state files.
    pub state_files: Vec<String>,
    /// MIG journals.
    pub mig_journals: Vec<String>,
    /// MIG instances no baseline keeps (this harness configures none), and
    /// GPUs left in MIG mode.
    pub mig_instances: Vec<String>,
    /// Checkpoint image directories of jobs that are not live.
    pub images: Vec<String>,
    /// Per-GPU locks someone still holds.
    pub locks_held: Vec<String>,
    /// Checkpoint agent sockets.
    pub agent_sockets: Vec<String>,
    /// gpu-mode-cuda-ckpt's records (a checkpoint or restore in progress).
    pub checkpoint_records: Vec<String>,
}

impl Leftovers {
    pub fn is_clean(&self) -> bool {
        self == &Leftovers::default()
    }

    /// One line per kind with its count, then what was found.
    pub fn summary(&self) -> String {
        let rows: [(&str, &Vec<String>); 9] = [
            ("MPS daemons/servers", &self.mps_processes),
            ("MPS records/dirs", &self.mps_records),
            ("job state files", &self.state_files),
            ("MIG journals", &self.mig_journals),
            ("MIG instances/modes off baseline", &self.mig_instances),
            ("checkpoint images of finished jobs", &self.images),
            ("GPU locks held", &self.locks_held),
            ("agent sockets", &self.agent_sockets),
            ("checkpoint records", &self.checkpoint_records),
        ];
        rows.iter()
            .map(|(what, v)| {
                if v.is_empty() {
                    format!("{what}: 0")
                } else {
                    format!("{what}: {} ({})", v.len(), v.join("; "))
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().display().to_string())
        .collect();
    v.sort();
    v
}

impl Cluster {
    /// Everything jobs left on the node (see [`Leftovers`]). `image_dir` is
    /// the checkpoint image directory when the test configured one.
    pub fn leftovers(&self, image_dir: Option<&Path>) -> Leftovers {
        let run = self.runtime_dir();
        let live = |job: &str| job.parse::<u32>().is_ok_and(|j| gpu_mode_core::runtime::job_is_live(&run, j));
        Leftovers {
            mps_processes: self.mps_processes(),
            mps_records: [names(&run.join("mps-daemons")), names(&run.join("mps"))].concat(),
            state_files: names(&run.join("jobs")),
            mig_journals: names(&run.join("mig")),
            mig_instances: self.mig_off_baseline(),
            images: image_dir
                .map(names)
                .unwrap_or_default()
                .into_iter()
                .filter(|p| !live(Path::new(p).file_name().and_then(|n| n.to_str()).unwrap_or("")))
                .collect(),
            locks_held: locks_held(&run.join("locks")),
            agent_sockets: names(&run.join("agent")).into_iter().filter(|p| p.ends_with(".sock")).collect(),
            checkpoint_records: names(&run.join("checkpoint")),
        }
    }

    /// Live processes running this cluster's simulated MPS binaries.
    pub fn mps_processes(&self) -> Vec<String> {
        let sim = self.dir.join("sim").display().to_string();
        gpu_mode_core::procfs::all()
            .into_iter()
            .filter(|p| p.state != 'Z')
            .filter_map(|p| {
                let exe = std::fs::read_link(format!("/proc/{}/exe", p.pid)).ok()?;
                exe.display().to_string().starts_with(&sim).then(|| format!("pid {} {}", p.pid, exe.display()))
            })
            .collect()
    }

    /// MIG instances on the simulated GPUs and GPUs in MIG mode: with no
    /// baseline configured, every one is a job's leftover.
    fn mig_off_baseline(&self) -> Vec<String> {
        let Ok(text) = self.sim_ctl(&["show"]) else { return Vec::new() };
        let Ok(state) = serde_json::from_str::<serde_json::Value>(&text) else { return vec!["unreadable simulated state".into()] };
        let mut out = Vec::new();
        for (i, g) in state["gpus"].as_array().into_iter().flatten().enumerate() {
            for inst in g["instances"].as_array().into_iter().flatten() {
                out.push(format!("GPU {i} instance {} (profile {} at {})", inst["id"], inst["profile_id"], inst["start"]));
            }
            if g["mig_current"] == true || g["mig_pending"] == true {
                out.push(format!("GPU {i} MIG mode on"));
            }
        }
        out
    }
}

/// Lock files someone holds: a non-blocking flock from here fails.
fn locks_held(dir: &Path) -> Vec<String> {
    names(dir)
        .into_iter()
        .filter(|p| {
            let Ok(f) = std::fs::File::open(p) else { return false };
            // SAFETY: flock on a descriptor we own; released when it closes.
            let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            rc != 0
        })
        .collect()
}
