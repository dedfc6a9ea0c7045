//! What this project has on the node, read from its own records only (no
//! NVML, no Slurm): job states, the MPS daemon registry, MIG journals,
//! checkpoint agents' sockets, the image store and the last drain we set.
//! Shared by `gpu-mode status` and the metrics' gauges, so both count the
//! same things. Readers only: nothing here takes a lock or changes a file.

use crate::config::Config;
use crate::modes::mig::journal::MigJournal;
use crate::modes::mps::registry::DaemonRecord;
use crate::persist::now_unix;
use crate::preempt::images::ImageStore;
use crate::runtime::job_is_live;
use crate::state::{JobState, JobStatus};
use serde::Serialize;
use std::path::Path;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobRow {
    pub job: u32,
    pub user: String,
    pub uid: u32,
    /// Canonical mode (`mps:threads=30`, `mig:1g.10gb`).
    pub mode: String,
    /// `preparing` (prolog running) or `ready`.
    pub status: String,
    /// NVML indices.
    pub gpus: Vec<u32>,
    pub refusal: Option<String>,
    pub since_unix: u64,
}

impl JobRow {
    /// The mode's kind (`mps`, `mig`, `checkpoint`): the metrics' label.
    pub fn mode_kind(&self) -> &str {
        mode_kind(&self.mode)
    }
}

/// `mig:1g.10gb` → `mig`.
pub fn mode_kind(mode: &str) -> &str {
    mode.split(':').next().unwrap_or(mode)
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MpsRow {
    pub key: String,
    pub uid: u32,
    pub gpus: Vec<u32>,
    /// The control daemon's pid; `None` while it is being started.
    pub pid: Option<i32>,
    /// The recorded daemon process is there (same pid and start time).
    pub running: bool,
    pub jobs: Vec<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MigRow {
    pub job: u32,
    pub gpu: u32,
    pub profile: String,
    pub uuid: String,
    /// Made for the job (its epilog destroys it), or found there.
    pub made: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentRow {
    pub job: u32,
    pub socket: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ImageRow {
    pub job: u32,
    /// Restart count of the run that wrote it.
    pub run: u32,
    /// `complete` (restorable), `consumed` (restored once) or `partial` (an
    /// interrupted dump: never restored).
    pub state: String,
    pub bytes: u64,
    /// Why it is kept: each later run whose restore was refused, with the reason.
    pub kept_because: Vec<String>,
}

/// The last drain this project set, as remembered by [`crate::drain::remember`].
pub use crate::drain::LastDrain;

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Records {
    pub jobs: Vec<JobRow>,
    pub mps_daemons: Vec<MpsRow>,
    pub mig_instances: Vec<MigRow>,
    pub agents: Vec<AgentRow>,
    pub images: Vec<ImageRow>,
    pub last_drain: Option<LastDrain>,
    /// Records that cannot be read, or that outlived their job: each one
    /// needs the admin.
    pub problems: Vec<String>,
}

/// A `preparing` job state older than this is a prolog that died or hangs
/// (the hook watchdog ends every prolog long before).
const STUCK_PROLOG_SECS: u64 = 3600;

pub fn gather(cfg: &Config) -> Records {
    let rd = &cfg.runtime_dir;
    let mut r = Records::default();
    jobs(rd, &mut r);
    mps(rd, &mut r);
    mig(rd, &mut r);
    agents(&cfg.preempt.agent_socket_dir(rd), rd, &mut r);
    images(&ImageStore::new(&cfg.preempt.image_dir), &mut r);
    match crate::drain::last_drain(rd) {
        Ok(d) => r.last_drain = d,
        Err(e) => r.problems.push(e),
    }
    r
}

fn jobs(rd: &Path, r: &mut Records) {
    let Ok(entries) = std::fs::read_dir(crate::runtime::jobs_dir(rd)) else { return };
    let now = now_unix();
    let mut ids: Vec<u32> = entries.flatten().filter_map(|e| e.file_name().to_str()?.strip_suffix(".json")?.parse().ok()).collect();
    ids.sort_unstable();
    for job in ids {
        match JobState::load(rd, job) {
            Ok(s) => {
                let status = match s.status {
                    JobStatus::Preparing => "preparing",
                    JobStatus::Ready => "ready",
                };
                if s.status == JobStatus::Preparing && now.saturating_sub(s.created_unix) > STUCK_PROLOG_SECS {
                    r.problems.push(format!("job {job}: its prolog started at {} and never finished", s.created_unix));
                }
                r.jobs.push(JobRow { job, user: s.user, uid: s.uid, mode: s.mode, status: status.into(), gpus: s.gpus, refusal: s.refusal, since_unix: s.created_unix });
            }
            // Gone between the listing and the read: its epilog just ended.
            Err(crate::state::StateError::Missing { .. }) => {}
            Err(e) => r.problems.push(format!("job {job}: {e}")),
        }
    }
}

fn mps(rd: &Path, r: &mut Records) {
    let records = match DaemonRecord::all(rd) {
        Ok(v) => v,
        Err(e) => return r.problems.push(format!("MPS registry: {e}")),
    };
    for rec in records {
        let running = rec.daemon.is_some_and(|d| crate::procfs::find(d).is_some());
        let live: Vec<u32> = rec.jobs.iter().copied().filter(|j| job_is_live(rd, *j)).collect();
        if live.is_empty() {
            r.problems.push(format!("MPS daemon {} (uid {}) is recorded for jobs {:?}, none of which is on this node", rec.key, rec.uid, rec.jobs));
        } else if !running && rec.daemon.is_some() {
            r.problems.push(format!("MPS daemon {} of jobs {live:?} is not running", rec.key));
        }
        r.mps_daemons.push(MpsRow { key: rec.key, uid: rec.uid, gpus: rec.gpus, pid: rec.daemon.map(|d| d.pid), running, jobs: rec.jobs });
    }
}

fn mig(rd: &Path, r: &mut Records) {
    for job in MigJournal::jobs(rd) {
        let journal = match MigJournal::load(rd, job) {
            Ok(Some(j)) => j,
            Ok(None) => continue,
            Err(e) => {
                r.problems.push(format!("MIG journal of job {job}: {e}"));
                continue;
            }
        };
        if !job_is_live(rd, job) {
            r.problems.push(format!("MIG journal of job {job} outlived the job (its epilog did not finish): its instances are still recorded"));
        }
        for g in &journal.grant.gpus {
            for i in &g.instances {
                r.mig_instances.push(MigRow { job, gpu: g.gpu, profile: i.profile.clone(), uuid: i.uuid.clone(), made: i.made });
            }
        }
    }
}

fn agents(socket_dir: &Path, rd: &Path, r: &mut Records) {
    let Ok(entries) = std::fs::read_dir(socket_dir) else { return };
    let mut jobs: Vec<(u32, String)> = entries
        .flatten()
        .filter_map(|e| {
            let job = e.file_name().to_str()?.strip_prefix("job-")?.strip_suffix(".sock")?.parse().ok()?;
            Some((job, e.path().display().to_string()))
        })
        .collect();
    jobs.sort();
    for (job, socket) in jobs {
        if !job_is_live(rd, job) {
            r.problems.push(format!("checkpoint agent socket {socket} outlived job {job}"));
        }
        r.agents.push(AgentRow { job, socket });
    }
}

fn images(store: &ImageStore, r: &mut Records) {
    for job in store.jobs() {
        let kept_because: Vec<String> = store.refusals(job).into_iter().map(|(run, why)| format!("restore by run {run} refused: {why}")).collect();
        for (run, dir) in store.runs_of(job) {
            let state = crate::preempt::images::run_state(&dir);
            r.images.push(ImageRow { job, run, state: state.into(), bytes: crate::preempt::images::tree_bytes(&dir), kept_because: kept_because.clone() });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::modes::mig::{GrantedInstance, MigGpuGrant};

    fn cfg(dir: &Path) -> Config {
        let mut c = Config::default();
        c.runtime_dir = dir.join("run");
        c.preempt.image_dir = dir.join("images");
        c
    }

    fn job_state(job: u32, mode: &str, status: JobStatus, created_unix: u64) -> JobState {
        JobState {
            version: crate::state::STATE_VERSION,
            status,
            job_id: job,
            uid: 1000,
            gid: 1000,
            user: "alice".into(),
            node: "n1".into(),
            mode: mode.into(),
            gpus: vec![0],
            task_env: Default::default(),
            per_task_env: Default::default(),
            refusal: None,
            created_unix,
            grant: Default::default(),
        }
    }

    fn journal(job: u32) -> MigJournal {
        let mut j = MigJournal::new(job, 1000);
        let inst = GrantedInstance { gpu_instance: 1, compute_instance: 0, profile: "1g.10gb".into(), profile_id: 19, placement_start: 0, placement_size: 1, uuid: "MIG-a".into(), made: true };
        j.grant.gpus.push(MigGpuGrant { gpu: 0, gpu_uuid: "GPU-0".into(), instances: vec![inst], enabled_mig: false });
        j
    }

    /// One table: what is planted in the records → the rows and problems seen.
    #[test]
    fn records_are_gathered_and_leftovers_are_problems() {
        struct Case {
            name: &'static str,
            plant: fn(&Config),
            want_rows: fn(&Records) -> bool,
            problem: Option<&'static str>,
        }
        let cases = [
            Case { name: "nothing", plant: |_| {}, want_rows: |r| r.jobs.is_empty() && r.images.is_empty(), problem: None },
            Case {
                name: "a ready mps job",
                plant: |c| {
                    job_state(7, "mps", JobStatus::Ready, now_unix()).save(&c.runtime_dir).unwrap();
                },
                want_rows: |r| r.jobs.len() == 1 && r.jobs[0].mode_kind() == "mps" && r.jobs[0].status == "ready",
                problem: None,
            },
            Case {
                name: "a prolog that never finished",
                plant: |c| {
                    job_state(8, "mig:1g.10gb", JobStatus::Preparing, 1).save(&c.runtime_dir).unwrap();
                },
                want_rows: |r| r.jobs[0].mode_kind() == "mig",
                problem: Some("job 8: its prolog started at 1 and never finished"),
            },
            Case {
                name: "a corrupt job state",
                plant: |c| {
                    std::fs::create_dir_all(crate::runtime::jobs_dir(&c.runtime_dir)).unwrap();
                    std::fs::write(crate::runtime::state_path(&c.runtime_dir, 9), b"{").unwrap();
                },
                want_rows: |r| r.jobs.is_empty(),
                problem: Some("job 9:"),
            },
            Case {
                name: "MIG instances of a live job",
                plant: |c| {
                    job_state(10, "mig:1g.10gb", JobStatus::Ready, now_unix()).save(&c.runtime_dir).unwrap();
                    journal(10).save(&c.runtime_dir).unwrap();
                },
                want_rows: |r| r.mig_instances.len() == 1 && r.mig_instances[0].profile == "1g.10gb",
                problem: None,
            },
            Case {
                name: "MIG journal of an ended job",
                plant: |c| journal(11).save(&c.runtime_dir).unwrap(),
                want_rows: |r| r.mig_instances.len() == 1,
                problem: Some("MIG journal of job 11 outlived the job"),
            },
            Case {
                name: "an MPS daemon no live job uses",
                plant: |c| {
                    let rec = crate::modes::mps::registry::test_record_for(1000, &[0], &[12], crate::procfs::ProcId { pid: 1, start_time: 0 }, &c.runtime_dir);
                    rec.save(&c.runtime_dir).unwrap();
                },
                want_rows: |r| r.mps_daemons.len() == 1 && r.mps_daemons[0].jobs == vec![12],
                problem: Some("none of which is on this node"),
            },
            Case {
                name: "an agent socket of an ended job",
                plant: |c| {
                    let dir = c.preempt.agent_socket_dir(&c.runtime_dir);
                    std::fs::create_dir_all(&dir).unwrap();
                    std::fs::write(dir.join("job-13.sock"), b"").unwrap();
                },
                want_rows: |r| r.agents.len() == 1 && r.agents[0].job == 13,
                problem: Some("outlived job 13"),
            },
            Case {
                name: "an image kept because a restore was refused",
                plant: |c| {
                    let store = ImageStore::new(&c.preempt.image_dir);
                    let run = store.prepare_run(14, 0).unwrap();
                    std::fs::write(run.join("pages-1.img"), vec![0u8; 100]).unwrap();
                    std::fs::write(run.join(crate::preempt::manifest::MANIFEST_FILE), b"{}").unwrap();
                    store.mark_refused(14, 1, "driver 570 here, 580 in the image").unwrap();
                },
                want_rows: |r| {
                    r.images.len() == 1
                        && r.images[0].state == "complete"
                        && r.images[0].bytes == 102
                        && r.images[0].kept_because == vec!["restore by run 1 refused: driver 570 here, 580 in the image".to_string()]
                },
                problem: None,
            },
            Case {
                name: "a drain we set",
                plant: |c| crate::drain::remember(&c.runtime_dir, "gpu-mode: prolog: disk full").unwrap(),
                want_rows: |r| r.last_drain.as_ref().is_some_and(|d| d.reason == "gpu-mode: prolog: disk full"),
                problem: None,
            },
        ];
        for case in cases {
            let dir = tempfile::tempdir().unwrap();
            let c = cfg(dir.path());
            (case.plant)(&c);
            let r = gather(&c);
            assert!((case.want_rows)(&r), "{}: {r:#?}", case.name);
            match case.problem {
                None => assert!(r.problems.is_empty(), "{}: {:?}", case.name, r.problems),
                Some(p) => assert!(r.problems.len() == 1 && r.problems[0].contains(p), "{}: {:?}", case.name, r.problems),
            }
        }
    }
}
