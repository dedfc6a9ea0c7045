//! What slurmd tells a Prolog/Epilog about the job, read from its environment.
//!
//! slurmd runs them with a minimal environment and no PATH:
//! SLURM_JOB_ID, SLURM_JOB_UID, SLURM_JOB_GID, SLURM_JOB_USER, SLURMD_NODENAME,
//! SLURM_JOB_GPUS / CUDA_VISIBLE_DEVICES (Slurm's GPU indices), SLURM_SCRIPT_CONTEXT,
//! and `SPANK_GPU_MODE` from the plugin's `spank_job_control_setenv`.

use crate::gpu_mode::{GpuMode, ModeError};
use std::collections::HashMap;

/// Name the plugin passes to `spank_job_control_setenv`; slurmd prefixes `SPANK_`.
pub const JOB_CONTROL_VAR: &str = "GPU_MODE";
/// What the Prolog/Epilog see.
pub const PROLOG_MODE_VAR: &str = "SPANK_GPU_MODE";
/// What the job's own environment holds (set by Slurm from the job control env).
pub const JOB_MODE_VAR: &str = "SLURM_SPANK_GPU_MODE";
/// The checkpoint signal's number, in a checkpoint job's task environment,
/// for the SPANK plugin to hold it back in the batch step until gpu-mode-run
/// takes it (signal_state::hold). Set by modes::checkpoint.
pub const TASK_SIGNAL_VAR: &str = "GPU_MODE_CKPT_SIGNAL";
/// Task variables the plugin must not override when Slurm already set them:
/// gres/mps gives each job its share of the GPU this way (modes::mps).
pub const KEEP_IF_SET: &[&str] = &["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobEnv {
    pub job_id: u32,
    pub uid: u32,
    pub gid: u32,
    pub user: String,
    pub node: String,
    /// Slurm's indices of the job's GPUs on this node: positions in
    /// gres.conf's device list, not NVML indices. Only
    /// `gpu::slurm_index::resolve` turns them into GPUs.
    pub slurm_gpus: Vec<u32>,
    /// The raw `SPANK_GPU_MODE` value, if the job asked for a mode.
    pub mode_value: Option<String>,
    /// How often Slurm requeued the job (`SLURM_JOB_RESTART_COUNT`, 0 when
    /// unset): a checkpoint job restores from the image of an earlier run.
    pub restart_count: u32,
}

/// One run of a job on this node, as the checkpoint agent, the prolog's
/// launch of it and a checkpoint image's manifest name it: the job, the run
/// (Slurm's restart count), its user's ids and the node. One type, so the
/// three never drift apart; in a manifest its fields sit at the top level.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct JobRun {
    pub job: u32,
    /// SLURM_JOB_RESTART_COUNT of this run (0 for a first run).
    pub restart_count: u32,
    pub uid: u32,
    pub gid: u32,
    pub node: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobEnvError {
    #[error("{0} is not set: not started by slurmd as Prolog/Epilog?")]
    Missing(&'static str),
    #[error("{var}={value:?} is not a valid {what}")]
    Invalid { var: &'static str, value: String, what: &'static str },
}

impl JobEnv {
    /// This run of the job.
    pub fn run(&self) -> JobRun {
        JobRun { job: self.job_id, restart_count: self.restart_count, uid: self.uid, gid: self.gid, node: self.node.clone() }
    }

    /// Reads the job from the current process environment.
    pub fn from_process_env() -> Result<JobEnv, JobEnvError> {
        let vars: HashMap<String, String> = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .collect();
        Self::from_vars(&vars)
    }

    pub fn from_vars(vars: &HashMap<String, String>) -> Result<JobEnv, JobEnvError> {
        let get = |k: &'static str| vars.get(k).filter(|v| !v.is_empty()).ok_or(JobEnvError::Missing(k));
        let num = |k: &'static str, what: &'static str| -> Result<u32, JobEnvError> {
            let v = get(k)?;
            v.parse().map_err(|_| JobEnvError::Invalid { var: k, value: v.clone(), what })
        };
        let job_id = num("SLURM_JOB_ID", "job id")?;
        if job_id == 0 {
            return Err(JobEnvError::Invalid { var: "SLURM_JOB_ID", value: "0".into(), what: "job id" });
        }
        let slurm_gpus = match vars.get("SLURM_JOB_GPUS").or_else(|| vars.get("CUDA_VISIBLE_DEVICES")) {
            Some(list) => parse_gpu_list(list).map_err(|_| JobEnvError::Invalid {
                var: "SLURM_JOB_GPUS",
                value: list.clone(),
                what: "GPU index list",
            })?,
            None => Vec::new(),
        };
        Ok(JobEnv {
            job_id,
            uid: num("SLURM_JOB_UID", "uid")?,
            gid: num("SLURM_JOB_GID", "gid")?,
            user: vars.get("SLURM_JOB_USER").cloned().unwrap_or_default(),
            node: get("SLURMD_NODENAME")?.clone(),
            slurm_gpus,
            mode_value: vars.get(PROLOG_MODE_VAR).filter(|v| !v.is_empty()).cloned(),
            restart_count: match vars.get("SLURM_JOB_RESTART_COUNT").filter(|v| !v.is_empty()) {
                None => 0,
                Some(_) => num("SLURM_JOB_RESTART_COUNT", "restart count")?,
            },
        })
    }

    /// The job's mode, parsed with the same parser the plugin used at submit.
    /// `Ok(None)`: the job did not ask for a mode and must be left untouched.
    pub fn mode(&self) -> Result<Option<GpuMode>, ModeError> {
        self.mode_value.as_deref().map(GpuMode::parse).transpose()
    }
}

/// The job's nodes, as slurmd tells its Prolog and Epilog: 22.05 sets
/// SLURM_NODELIST, later versions SLURM_JOB_NODELIST too (a hostlist
/// expression). Empty when neither is set or the list does not expand:
/// unknown, which no caller takes for "several".
pub fn job_nodes(vars: &HashMap<String, String>) -> Vec<String> {
    let list = ["SLURM_JOB_NODELIST", "SLURM_NODELIST"].iter().find_map(|k| vars.get(*k).filter(|v| !v.is_empty()));
    list.and_then(|l| crate::hostlist::expand(l).ok()).unwrap_or_default()
}

/// [`job_nodes`] of the current process's environment (the prolog's).
pub fn job_nodes_of_process() -> Vec<String> {
    let vars: HashMap<String, String> =
        std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))).collect();
    job_nodes(&vars)
}

/// Parses `0,2,3` (Slurm's GPU index list). An empty string or `NoDevFiles`
/// means no GPUs. Duplicates are refused: they would make us lock a GPU twice.
pub fn parse_gpu_list(list: &str) -> Result<Vec<u32>, String> {
    let list = list.trim();
    if list.is_empty() || list == "NoDevFiles" {
        return Ok(Vec::new());
    }
    let mut out: Vec<u32> = Vec::new();
    for item in list.split(',') {
        let idx: u32 = item
            .parse()
            .ok()
            .filter(|_| item.bytes().all(|b| b.is_ascii_digit()))
            .ok_or_else(|| format!("bad GPU index {item:?}"))?;
        if out.contains(&idx) {
            return Err(format!("GPU {idx} listed twice"));
        }
        out.push(idx);
    }
    Ok(out)
}

/// `0,2,3` for log lines and environment values.
pub fn format_gpu_list(gpus: &[u32]) -> String {
    gpus.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(extra: &[(&str, &str)]) -> HashMap<String, String> {
        let mut v: HashMap<String, String> = [
            ("SLURM_JOB_ID", "17"),
            ("SLURM_JOB_UID", "1001"),
            ("SLURM_JOB_GID", "1002"),
            ("SLURM_JOB_USER", "bob"),
            ("SLURMD_NODENAME", "gpu07"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        for (k, val) in extra {
            v.insert(k.to_string(), val.to_string());
        }
        v
    }

    #[test]
    fn the_job_nodes_come_from_slurmds_node_list() {
        let nodes = |pairs: &[(&str, &str)]| job_nodes(&pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        assert_eq!(nodes(&[("SLURM_NODELIST", "gma,gmb")]), ["gma", "gmb"]);
        assert_eq!(nodes(&[("SLURM_NODELIST", "gpu[07-08]")]), ["gpu07", "gpu08"]);
        assert_eq!(nodes(&[("SLURM_JOB_NODELIST", "n1"), ("SLURM_NODELIST", "n[1-2]")]), ["n1"], "the newer name first");
        assert_eq!(nodes(&[("SLURM_JOB_NODELIST", ""), ("SLURM_NODELIST", "n1,n2")]), ["n1", "n2"]);
        // Unknown, never "several".
        assert!(nodes(&[]).is_empty());
        assert!(nodes(&[("SLURM_NODELIST", "n[2-1]")]).is_empty());
    }

    #[test]
    fn reads_a_prolog_environment() {
        let env = JobEnv::from_vars(&vars(&[("SLURM_JOB_GPUS", "1,3"), ("SPANK_GPU_MODE", "mps")])).unwrap();
        assert_eq!(env.job_id, 17);
        assert_eq!((env.uid, env.gid), (1001, 1002));
        assert_eq!(env.user, "bob");
        assert_eq!(env.node, "gpu07");
        assert_eq!(env.slurm_gpus, vec![1, 3]);
        assert_eq!(env.mode().unwrap().unwrap().kind(), "mps");
        assert_eq!(env.restart_count, 0);
        let requeued = JobEnv::from_vars(&vars(&[("SLURM_JOB_RESTART_COUNT", "2")])).unwrap();
        assert_eq!(requeued.restart_count, 2);
        assert!(JobEnv::from_vars(&vars(&[("SLURM_JOB_RESTART_COUNT", "x")])).unwrap_err().to_string().contains("restart count"));
    }

    #[test]
    fn falls_back_to_cuda_visible_devices_and_allows_no_gpus() {
        let env = JobEnv::from_vars(&vars(&[("CUDA_VISIBLE_DEVICES", "2")])).unwrap();
        assert_eq!(env.slurm_gpus, vec![2]);
        let env = JobEnv::from_vars(&vars(&[])).unwrap();
        assert!(env.slurm_gpus.is_empty());
        assert_eq!(env.mode().unwrap(), None);
    }

    #[test]
    fn bad_environments_name_the_variable() {
        let cases: Vec<(HashMap<String, String>, &str)> = vec![
            ({ let mut v = vars(&[]); v.remove("SLURM_JOB_ID"); v }, "SLURM_JOB_ID is not set"),
            (vars(&[("SLURM_JOB_ID", "12a")]), "SLURM_JOB_ID=\"12a\""),
            (vars(&[("SLURM_JOB_ID", "0")]), "SLURM_JOB_ID=\"0\""),
            (vars(&[("SLURM_JOB_UID", "-1")]), "SLURM_JOB_UID"),
            ({ let mut v = vars(&[]); v.remove("SLURMD_NODENAME"); v }, "SLURMD_NODENAME is not set"),
            (vars(&[("SLURM_JOB_GPUS", "0,x")]), "GPU index list"),
        ];
        for (v, needle) in cases {
            let err = JobEnv::from_vars(&v).unwrap_err().to_string();
            assert!(err.contains(needle), "{err:?} lacks {needle:?}");
        }
    }

    #[test]
    fn a_bad_mode_value_is_reported_by_the_shared_parser() {
        let env = JobEnv::from_vars(&vars(&[("SPANK_GPU_MODE", "mps:threads=0")])).unwrap();
        assert!(env.mode().unwrap_err().to_string().contains("threads=0 is out of range"));
    }

    #[test]
    fn gpu_lists() {
        assert_eq!(parse_gpu_list("0,1,7").unwrap(), vec![0, 1, 7]);
        assert_eq!(parse_gpu_list("").unwrap(), Vec::<u32>::new());
        assert_eq!(parse_gpu_list("NoDevFiles").unwrap(), Vec::<u32>::new());
        assert!(parse_gpu_list("0,0").unwrap_err().contains("twice"));
        assert!(parse_gpu_list("+1").is_err());
        assert!(parse_gpu_list("1,").is_err());
        assert_eq!(format_gpu_list(&[0, 2]), "0,2");
    }
}
