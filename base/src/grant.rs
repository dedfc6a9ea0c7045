//! What a mode gave a job: plain data that the job state records for the
//! epilog and the plugin's task steps read. Below the modes (which make and
//! undo grants), so the job state and the plugin need none of them.

use serde::{Deserialize, Serialize};

/// What a mode gave a job, as the job state records it for the epilog (and
/// for the plugin's privileged task step). One variant per mode: the
/// serialized seam between prolog and epilog.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum GrantRecord {
    /// Nothing to undo (no mode, a refusal, a prolog that did not finish).
    #[default]
    None,
    /// The MPS daemon the job uses, by registry key.
    Mps { daemon: String },
    /// The MIG instances made for the job.
    Mig(MigGrant),
    /// A checkpoint job: its agent and this run's images are the epilog's
    /// to clean; `restart_count` says which run this was.
    Checkpoint { restart_count: u32 },
}

/// What the prolog made (or, with `mig_instances = "leave"`, found) on each
/// of the job's GPUs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigGrant {
    /// The job's user: only their processes are killed off an instance.
    pub uid: u32,
    pub gpus: Vec<MigGpuGrant>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigGpuGrant {
    /// NVML index.
    pub gpu: u32,
    pub gpu_uuid: String,
    pub instances: Vec<GrantedInstance>,
    /// The prolog switched MIG on for the job: the epilog switches it off.
    pub enabled_mig: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantedInstance {
    pub gpu_instance: u32,
    pub compute_instance: u32,
    pub profile: String,
    pub profile_id: u32,
    pub placement_start: u32,
    pub placement_size: u32,
    /// `MIG-...`, what the job's tasks get.
    pub uuid: String,
    /// Made for this job (destroyed by its epilog), or found there.
    pub made: bool,
}

/// The value task `local_id` gets from a per-task list.
pub fn per_task_value(values: &[String], local_id: u32) -> Option<&str> {
    (!values.is_empty()).then(|| values[local_id as usize % values.len()].as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_task_values_go_round_robin_by_local_id() {
        let v: Vec<String> = ["MIG-a", "MIG-b", "MIG-c"].iter().map(|s| s.to_string()).collect();
        let got: Vec<&str> = (0..7).map(|i| per_task_value(&v, i).unwrap()).collect();
        assert_eq!(got, ["MIG-a", "MIG-b", "MIG-c", "MIG-a", "MIG-b", "MIG-c", "MIG-a"]);
        assert_eq!(per_task_value(&[], 3), None);
    }

    #[test]
    fn grants_serialize_with_their_kind() {
        let g = GrantRecord::Mps { daemon: "1000-0".into() };
        let text = serde_json::to_string(&g).unwrap();
        assert_eq!(text, r#"{"kind":"mps","daemon":"1000-0"}"#);
        assert_eq!(serde_json::from_str::<GrantRecord>(&text).unwrap(), g);
        assert_eq!(serde_json::to_string(&GrantRecord::None).unwrap(), r#"{"kind":"none"}"#);
        assert!(serde_json::from_str::<GrantRecord>(r#"{"kind":"mps","daemon":"k","x":1}"#).is_err());
    }
}
