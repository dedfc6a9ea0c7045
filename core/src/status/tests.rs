use super::records::{JobRow, MpsRow, Records};
use super::*;
use crate::drain::LastDrain;
use crate::log::is_unsafe_for_terminal;

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

/// [`busy`] with `text` in every field a user's text can reach.
fn with_user_text(text: &str) -> StatusReport {
    let mut r = busy();
    r.records.jobs[0].mode = text.into();
    r.records.jobs[0].refusal = Some(format!("mode {text:?}... {text}"));
    r.records.jobs[0].user = text.into();
    r.records.images.push(super::records::ImageRow {
        job: 5,
        run: 0,
        state: text.into(),
        bytes: 1,
        kept_because: vec![format!("restore refused: /home/u/{text}/ckpt")],
    });
    r.records.problems.push(format!("job 5: {text}"));
    r.records.last_drain.as_mut().unwrap().reason = text.into();
    r.slurm.as_mut().unwrap().reason = text.into();
    r.gpu_error = Some(text.into());
    r
}

/// Issue 27 F4: a refused `--gpu-mode` value is kept raw and restore
/// refusals quote the user's paths; the table goes to the admin's terminal,
/// so no control character of theirs reaches it: ESC (colours, cursor
/// moves), OSC 52 (writes the admin's clipboard), CR (overwrites a line),
/// a newline (forges a row), DEL and C1's CSI (U+009B) are written as
/// escapes, and every record stays on its own line. Issue 37 N4: nor does a
/// bidirectional control (an override or isolate reorders the row the admin
/// reads: `alice` shown where `ecila` is), a line separator, or an invisible
/// character (a zero-width space makes a user look like another).
#[test]
fn user_text_in_the_table_cannot_reach_the_terminal_as_control_characters() {
    for (name, text, shown) in HOSTILE {
        let clean = with_user_text("plain").to_table();
        let r = with_user_text(text);
        let t = r.to_table();
        let bad: Vec<char> = t.chars().filter(|c| is_unsafe_for_terminal(*c) && *c != '\n').collect();
        assert!(bad.is_empty(), "{name}: {bad:?} reach the terminal in\n{t}");
        for row in [format!("restore refused: /home/u/{shown}/ckpt"), format!("job 5: {shown}"), format!("last drain we set: {shown} (")] {
            assert!(t.contains(&row), "{name}: {row:?} missing in\n{t}");
        }
        assert_eq!(t.lines().count(), clean.lines().count(), "{name}: a forged line in\n{t}");
    }
}

/// Issue 37 N4: `--json` of the same text. serde_json escapes only C0: DEL,
/// C1, the bidirectional controls and the invisible characters were written
/// raw to the admin's terminal. They are `\uXXXX` escapes now, and a JSON
/// parser still reads every field back as the user's text.
#[test]
fn user_text_in_the_json_reaches_the_terminal_only_as_escapes_and_parses_back_whole() {
    for (name, text, _) in HOSTILE {
        let json = with_user_text(text).to_json();
        let bad: Vec<char> = json.chars().filter(|c| is_unsafe_for_terminal(*c) && *c != '\n').collect();
        assert!(bad.is_empty(), "{name}: {bad:?} reach the terminal in\n{json}");
        let v: serde_json::Value = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{name}: {e} in\n{json}"));
        let got = [
            &v["jobs"][0]["mode"],
            &v["jobs"][0]["user"],
            &v["images"][0]["state"],
            &v["last_drain"]["reason"],
            &v["slurm"]["reason"],
            &v["gpu_error"],
        ];
        for field in got {
            assert_eq!(field.as_str(), Some(text), "{name}: in\n{json}");
        }
        assert_eq!(v["images"][0]["kept_because"][0].as_str(), Some(format!("restore refused: /home/u/{text}/ckpt").as_str()), "{name}");
        assert!(v["problems"].as_array().unwrap().iter().any(|p| p.as_str() == Some(&format!("job 5: {text}"))), "{name}: {json}");
    }
}

/// A user's text, hostile to the admin's terminal, and how the table shows
/// it.
const HOSTILE: [(&str, &str, &str); 15] = [
    ("ESC", "\u{1b}[2J\u{1b}[31m", "\\u{1b}[2J\\u{1b}[31m"),
    ("OSC 52", "\u{1b}]52;c;cm0gLXJmIH4=\u{7}", "\\u{1b}]52;c;cm0gLXJmIH4=\\u{7}"),
    ("CR", "mps\rOK  ", "mps\\rOK  "),
    ("newline", "x\n  7    bob  mps  ready", "x\\n  7    bob  mps  ready"),
    ("DEL", "a\u{7f}b", "a\\u{7f}b"),
    ("C1 CSI", "\u{9b}2J", "\\u{9b}2J"),
    ("line separator", "x\u{2028}  7    bob", "x\\u{2028}  7    bob"),
    ("RLO", "\u{202e}ecila", "\\u{202e}ecila"),
    ("LRE and PDF", "\u{202a}mps\u{202c}", "\\u{202a}mps\\u{202c}"),
    ("RLI and PDI", "\u{2067}ready\u{2069}", "\\u{2067}ready\\u{2069}"),
    ("LRM, RLM and ALM", "\u{200e}a\u{200f}b\u{61c}", "\\u{200e}a\\u{200f}b\\u{61c}"),
    ("zero-width space", "ali\u{200b}ce", "ali\\u{200b}ce"),
    ("ZWNJ and ZWJ", "a\u{200c}b\u{200d}", "a\\u{200c}b\\u{200d}"),
    ("word joiner", "a\u{2060}b", "a\\u{2060}b"),
    ("BOM", "\u{feff}alice", "\\u{feff}alice"),
];

/// The node checker's readiness verdict is shown with each finding, and a
/// node that cannot checkpoint stays "OK" (flagged, not a problem).
#[test]
fn the_readiness_section_shows_each_check_and_does_not_make_a_problem() {
    use crate::preempt::readiness::{Item, Verdict, VERSION};
    let mut r = busy();
    assert!(r.to_table().contains("CHECKPOINT READINESS\n  (not checked yet: gpu-mode-node-checker writes it at each run)"), "{}", r.to_table());
    r.checkpoint_readiness = Some(Verdict {
        version: VERSION,
        checked_unix: crate::persist::now_unix(),
        items: vec![
            Item { check: "ckpt_kernel".into(), ready: true, message: "Linux 6.18 has CAP_CHECKPOINT_RESTORE (5.9 or newer)".into(), bounds_only: false },
            Item { check: "ckpt_criu".into(), ready: false, message: "CRIU is not installed at /x; fix: scripts/install-criu.sh --force".into(), bounds_only: false },
            Item { check: "ckpt_memory".into(), ready: false, message: "host memory 125.0 GiB is less than GPU 0's 139.5 GiB".into(), bounds_only: true },
        ],
    });
    let t = r.to_table();
    for want in [
        "CHECKPOINT READINESS: NOT READY (node checker, 0s ago)",
        "  CHECK        VERDICT    FINDING AND FIX",
        "  ckpt_kernel  ok         Linux 6.18 has CAP_CHECKPOINT_RESTORE (5.9 or newer)",
        "  ckpt_criu    NOT READY  CRIU is not installed at /x; fix: scripts/install-criu.sh --force",
        "  ckpt_memory  BOUNDED    host memory 125.0 GiB is less than GPU 0's 139.5 GiB",
        "gpu-mode status of n1: OK",
    ] {
        assert!(t.contains(want), "{want:?} missing in\n{t}");
    }
    assert_eq!(r.exit_code(), EXIT_OK);
    let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    assert_eq!(v["checkpoint_readiness"]["items"][1], serde_json::json!({"check": "ckpt_criu", "ready": false, "message": "CRIU is not installed at /x; fix: scripts/install-criu.sh --force"}));
    assert_eq!(v["checkpoint_readiness"]["items"][2]["bounds_only"], serde_json::json!(true));
    // Only the bound left: ready, bounded.
    r.checkpoint_readiness.as_mut().unwrap().items.remove(1);
    let t = r.to_table();
    assert!(t.contains("CHECKPOINT READINESS: ready, bounded (node checker, 0s ago)"), "{t}");
}
