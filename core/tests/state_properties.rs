//! Properties of the job state file, the prolog → plugin → epilog channel
//! (the hardening issue's round-trip rule): every state written parses back
//! to itself; version 1 files convert to the same state as version 2; any
//! mangled file (a crash, a full disk, a hand edit) parses to a state whose
//! own text parses back to it, or is refused naming the file and, for a
//! field error, the field.

use gpu_mode_core::modes::mig::{GrantedInstance, MigGpuGrant, MigGrant};
use gpu_mode_core::modes::GrantRecord;
use gpu_mode_core::state::{JobState, JobStatus, STATE_VERSION};
use proptest::prelude::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

const PATH: &str = "/run/slurm-gpu-mode/jobs/42.json";
const JOB: u32 = 42;

fn parse(bytes: &[u8]) -> Result<JobState, String> {
    JobState::parse(bytes, Path::new(PATH), JOB).map_err(|e| e.to_string())
}

fn text() -> impl Strategy<Value = String> {
    // Any characters, control and non-ASCII included: users name things.
    "\\PC{0,12}|[\u{0}-\u{1f}\"\\\\]{0,4}"
}

fn grant() -> impl Strategy<Value = GrantRecord> {
    let instance = (any::<u32>(), any::<u32>(), text(), any::<u32>(), 0u32..8, 1u32..8, text(), any::<bool>()).prop_map(
        |(gpu_instance, compute_instance, profile, profile_id, placement_start, placement_size, uuid, made)| GrantedInstance {
            gpu_instance,
            compute_instance,
            profile,
            profile_id,
            placement_start,
            placement_size,
            uuid,
            made,
        },
    );
    let gpu = (any::<u32>(), text(), prop::collection::vec(instance, 0..3), any::<bool>())
        .prop_map(|(gpu, gpu_uuid, instances, enabled_mig)| MigGpuGrant { gpu, gpu_uuid, instances, enabled_mig });
    let mig = (any::<u32>(), prop::collection::vec(gpu, 0..3)).prop_map(|(uid, gpus)| GrantRecord::Mig(MigGrant { uid, gpus }));
    prop_oneof![
        Just(GrantRecord::None),
        text().prop_map(|daemon| GrantRecord::Mps { daemon }),
        mig,
        any::<u32>().prop_map(|restart_count| GrantRecord::Checkpoint { restart_count }),
    ]
}

fn env_map() -> impl Strategy<Value = BTreeMap<String, String>> {
    prop::collection::btree_map(text(), text(), 0..3)
}

fn state() -> impl Strategy<Value = JobState> {
    let who = (any::<u32>(), any::<u32>(), text(), text(), text());
    let what = (prop::collection::vec(any::<u32>(), 0..4), env_map(), prop::collection::btree_map(text(), prop::collection::vec(text(), 0..3), 0..2));
    (any::<bool>(), who, what, prop::option::of(text()), any::<u64>(), grant()).prop_map(|(ready, who, what, refusal, created_unix, grant)| JobState {
        version: STATE_VERSION,
        status: if ready { JobStatus::Ready } else { JobStatus::Preparing },
        job_id: JOB,
        uid: who.0,
        gid: who.1,
        user: who.2,
        node: who.3,
        mode: who.4,
        gpus: what.0,
        task_env: what.1,
        per_task_env: what.2,
        refusal,
        created_unix,
        grant,
    })
}

/// The state as a version 1 file said it: no status, no grant, no
/// per-task variables; an MPS daemon by key.
fn as_version_1(s: &JobState) -> Value {
    let mut v = serde_json::to_value(s).unwrap();
    let obj = v.as_object_mut().unwrap();
    obj.insert("version".into(), 1.into());
    obj.remove("status");
    obj.remove("grant");
    obj.remove("per_task_env");
    if let GrantRecord::Mps { daemon } = &s.grant {
        obj.insert("mps_daemon".into(), daemon.clone().into());
    }
    v
}

/// Ways a file gets mangled.
#[derive(Debug, Clone)]
enum Damage {
    Truncate(usize),
    DropField(usize),
    Retype(usize, Value),
    Extra(String),
    Version(u64),
    FlipByte(usize, u8),
}

fn damage() -> impl Strategy<Value = Damage> {
    let value = prop_oneof![Just(Value::Null), Just(Value::from(-1)), Just(Value::from("x")), Just(Value::from(vec![1, 2])), Just(serde_json::json!({}))];
    prop_oneof![
        any::<usize>().prop_map(Damage::Truncate),
        any::<usize>().prop_map(Damage::DropField),
        (any::<usize>(), value).prop_map(|(i, v)| Damage::Retype(i, v)),
        "[a-z_]{1,10}".prop_map(Damage::Extra),
        prop_oneof![Just(0u64), Just(1), Just(3), Just(u64::MAX)].prop_map(Damage::Version),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Damage::FlipByte(i, b)),
    ]
}

/// The damaged bytes and, for field damage, the field's name.
fn apply(s: &JobState, d: &Damage) -> (Vec<u8>, Option<String>) {
    let mut v = serde_json::to_value(s).unwrap();
    let keys: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
    let obj = v.as_object_mut().unwrap();
    let field = match d {
        Damage::DropField(i) => {
            let k = keys[i % keys.len()].clone();
            obj.remove(&k);
            Some(k)
        }
        Damage::Retype(i, val) => {
            let k = keys[i % keys.len()].clone();
            obj.insert(k.clone(), val.clone());
            Some(k)
        }
        Damage::Extra(k) => {
            obj.insert(k.clone(), 1.into());
            Some(k.clone())
        }
        Damage::Version(n) => {
            obj.insert("version".into(), (*n).into());
            None
        }
        Damage::Truncate(_) | Damage::FlipByte(..) => None,
    };
    let mut bytes = serde_json::to_vec_pretty(&v).unwrap();
    match d {
        Damage::Truncate(n) => bytes.truncate(n % bytes.len()),
        Damage::FlipByte(i, b) => {
            let i = i % bytes.len();
            bytes[i] = *b;
        }
        _ => {}
    }
    (bytes, field)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn a_written_state_parses_back_to_itself(s in state()) {
        let text = serde_json::to_vec_pretty(&s).unwrap();
        prop_assert_eq!(parse(&text), Ok(s));
    }

    #[test]
    fn a_version_1_file_reads_as_the_same_job_ready(s in state()) {
        let v1 = serde_json::to_vec(&as_version_1(&s)).unwrap();
        let got = parse(&v1).map_err(|e| TestCaseError::fail(format!("{e}: {}", String::from_utf8_lossy(&v1))))?;
        let grant = match &s.grant {
            GrantRecord::Mps { .. } => s.grant.clone(),
            _ => GrantRecord::None,
        };
        let want = JobState { status: JobStatus::Ready, per_task_env: BTreeMap::new(), grant, ..s };
        prop_assert_eq!(&got, &want);
        // And what it converts to is a version 2 state like any other.
        prop_assert_eq!(parse(&serde_json::to_vec(&got).unwrap()), Ok(want));
    }

    #[test]
    fn a_damaged_file_parses_to_a_fixed_point_or_is_refused_by_name(s in state(), d in damage()) {
        let (bytes, field) = apply(&s, &d);
        match parse(&bytes) {
            Ok(got) => {
                prop_assert_eq!(got.job_id, JOB);
                prop_assert_eq!(parse(&serde_json::to_vec(&got).unwrap()), Ok(got));
            }
            Err(e) => {
                prop_assert!(e.contains(PATH), "the file is named: {}", e);
                if let (Some(f), Damage::DropField(_) | Damage::Retype(..) | Damage::Extra(_)) = (field, &d) {
                    // A version error is named by the version, not the field.
                    let named = e.contains(&f) || (f == "version" && e.contains("version"));
                    prop_assert!(named, "{:?} not named in {}", f, e);
                }
            }
        }
    }
}
