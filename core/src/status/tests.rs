use super::records::{JobRow, MpsRow, Records};
use super::*;
use crate::drain::LastDrain;

fn gpu(index: u32) -> GpuFacts {
    GpuFacts { index, uuid: format!("GPU-{index}"), name: "NVIDIA H100".into(), compute_mode: Some("default".into()), mig: Some(false), error: None }
}

fn job(job: u32, mode: &str, gpus: &[u32]) -> JobRow {
    JobRow { job, user: "alice".into(), uid: 1000, mode: mode.into(), status: "ready".into(), gpus: gpus.to_vec(), refusal: None, since_unix: 0 }
}

fn node(state: &str, reason: &str) -> Result<NodeStatus, String> {
    Ok(NodeStatus { state: state.into(), reason: reason.into() })
}

/// What the pieces say → healthy or not, and the problem named.
#[test]
fn problems_decide_the_exit_code() {
    let idle = || node("IDLE", "");
    let cases: Vec<(&str, Records, Result<Vec<GpuFacts>, String>, Result<NodeStatus, String>, Option<&str>)> = vec![
        ("all quiet", Records::default(), Ok(vec![gpu(0), gpu(1)]), idle(), None),
        ("jobs running", Records { jobs: vec![job(5, "mps", &[0])], ..Default::default() }, Ok(vec![gpu(0)]), node("MIXED", ""), None),
        ("no NVML", Records::default(), Err("libnvidia-ml.so.1: not found".into()), idle(), Some("NVML: libnvidia-ml.so.1: not found")),
        ("a lost GPU", Records::default(), Ok(vec![GpuFacts { error: Some("GPU is lost".into()), ..gpu(1) }]), idle(), Some("GPU 1: GPU is lost")),
        ("drained by us", Records::default(), Ok(vec![gpu(0)]), node("IDLE+DRAIN", "gpu-mode: prolog: disk full [root@x]"), Some("node is IDLE+DRAIN by gpu-mode: gpu-mode: prolog: disk full")),
        ("drained by an admin: theirs to explain", Records::default(), Ok(vec![gpu(0)]), node("IDLE+DRAIN", "maintenance"), None),
        ("slurm unreachable: not ours", Records::default(), Ok(vec![gpu(0)]), Err("scontrol timed out".into()), None),
        (
            "a stale record",
            Records { problems: vec!["MPS daemon 1000-0 (uid 1000) is recorded for jobs [3], none of which is on this node".into()], ..Default::default() },
            Ok(vec![gpu(0)]),
            idle(),
            Some("MPS daemon 1000-0"),
        ),
    ];
    for (name, records, gpus, slurm, problem) in cases {
        let r = assemble(Some("n1".into()), records, gpus, slurm);
        match problem {
            None => assert!(r.healthy && r.exit_code() == EXIT_OK && r.records.problems.is_empty(), "{name}: {:?}", r.records.problems),
            Some(p) => {
                assert_eq!((r.healthy, r.exit_code()), (false, EXIT_NEEDS_ADMIN), "{name}");
                assert!(r.records.problems.iter().any(|x| x.starts_with(p)), "{name}: {:?}", r.records.problems);
            }
        }
    }
}

fn busy() -> StatusReport {
    let records = Records {
        jobs: vec![job(5, "mps:threads=30", &[0]), job(6, "mig:1g.10gb", &[1])],
        mps_daemons: vec![MpsRow { key: "1000-0".into(), uid: 1000, gpus: vec![0], pid: Some(4711), running: true, jobs: vec![5] }],
        last_drain: Some(LastDrain { version: 1, reason: "gpu-mode: epilog: MPS zombie pid 9".into(), unix: 0 }),
        ..Default::default()
    };
    assemble(Some("n1".into()), records, Ok(vec![gpu(0), gpu(1), gpu(2)]), node("MIXED", ""))
}

#[test]
fn the_table_shows_each_gpu_with_its_job_and_mode() {
    let t = busy().to_table();
    for want in [
        "gpu-mode status of n1: OK",
        "slurm: MIXED",
        "last drain we set: gpu-mode: epilog: MPS zombie pid 9 (",
        "  0    NVIDIA H100  GPU-0  default  off  5 mps:threads=30 (alice)",
        "  1    NVIDIA H100  GPU-1  default  off  6 mig:1g.10gb (alice)",
        "  2    NVIDIA H100  GPU-2  default  off  -",
        "  1000-0  1000  0     4711  true     5",
        "MIG INSTANCES\n  (none)",
        "PROBLEMS\n  (none)",
    ] {
        assert!(t.contains(want), "{want:?} missing in\n{t}");
    }
}

#[test]
fn the_json_has_every_section() {
    let v: serde_json::Value = serde_json::from_str(&busy().to_json()).unwrap();
    assert_eq!((v["version"].as_u64(), v["healthy"].as_bool(), v["node"].as_str()), (Some(1), Some(true), Some("n1")));
    assert_eq!(v["gpus"][0]["jobs"][0], serde_json::json!({"job": 5, "mode": "mps:threads=30", "user": "alice"}));
    assert_eq!(v["gpus"][0]["uuid"], "GPU-0");
    for key in ["jobs", "mps_daemons", "mig_instances", "agents", "images", "last_drain", "problems", "slurm"] {
        assert!(!v[key].is_null(), "{key} missing: {v}");
    }
    assert_eq!(v["slurm"]["drained_by_us"], false);
}
