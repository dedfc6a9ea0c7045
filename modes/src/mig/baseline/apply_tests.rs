//! Decision tables for plan, apply and assert, against the MIG fake (the
//! simulated NVML's rules) and the recording services and reset.

use super::apply::{apply, ApplyError, Done, StepError};
use super::fake::FakeMig;
use super::plan::{plan, Observed, Plan, Settings};
use super::services::record::{failed as ran, RecordingReset, RecordingServices};
use super::services::ProgramError;
use super::{parted, tool, Baseline};
use crate::gpu::{GpuOps, MigInstanceSetting, MigModeSetting};
use crate::log::FinishedLine;

// H100 80GB profile ids.
const G1: u32 = 19;
const G2: u32 = 14;
const G3: u32 = 9;
const G4: u32 = 5;

const UNITS: [&str; 3] = ["slurmd.service", "nvidia-dcgm.service", "nvidia-persistenced.service"];

fn settings() -> Settings {
    Settings {
        mig_mode: MigModeSetting::Switch,
        mig_instances: MigInstanceSetting::Manage,
        services: UNITS.iter().map(|s| s.to_string()).collect(),
        layout_services: vec!["slurmd.service".into()],
    }
}

fn yaml(entries: &str) -> Baseline {
    let text = format!("version: v1\nmig-configs:\n  b:\n{entries}");
    parted::parse(&text, "test.yaml", "b").unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// `devices: all`, MIG on, these instances.
fn all_on(list: &str) -> Baseline {
    yaml(&format!("    - devices: all\n      mig-enabled: true\n      mig-devices: {{{list}}}\n"))
}

fn observe(ops: &FakeMig) -> Vec<Observed> {
    tool::observe(ops, std::path::Path::new("/nonexistent")).unwrap()
}

fn plan_for(ops: &FakeMig, b: &Baseline, s: &Settings) -> Plan {
    plan(b, &observe(ops), s)
}

/// (destroyed GI ids, created "name@start", mode) of GPU 0's plan.
fn summary(p: &Plan) -> (Vec<u32>, Vec<String>, Option<bool>) {
    let g = &p.gpus[0];
    (g.destroy.iter().map(|e| e.gpu_instance).collect(), g.create.iter().map(|c| format!("{}@{}", c.name, c.start)).collect(), g.mode)
}

#[test]
fn the_plan_decision_table() {
    let s = settings();
    let off = || FakeMig::new("h100-80gb", 1);
    let on = || FakeMig::new("h100-80gb", 1).mig_on(0);
    type Case = (&'static str, FakeMig, Baseline, Vec<u32>, Vec<&'static str>, Option<bool>, bool);
    // (what, GPU, baseline) -> destroyed GIs, created, mode change, matches already
    let cases: Vec<Case> = vec![
        ("MIG off, the 3g only fits at slice 4", off(), all_on("\"3g.40gb\": 1, \"2g.20gb\": 2"), vec![], vec!["3g.40gb@4", "2g.20gb@0", "2g.20gb@2"], Some(true), false),
        ("same profiles at other placements match", on().with_instances(0, &[(G1, 5), (G1, 6)]), all_on("\"1g.10gb\": 2"), vec![], vec![], None, true),
        ("an extra instance goes, the rest stays", on().with_instances(0, &[(G1, 0), (G1, 1), (G3, 4)]), all_on("\"1g.10gb\": 2"), vec![3], vec![], None, false),
        ("a missing one is placed around the kept", on().with_instances(0, &[(G3, 4)]), all_on("\"3g.40gb\": 1, \"2g.20gb\": 2"), vec![], vec!["2g.20gb@0", "2g.20gb@2"], None, false),
        ("kept ones in the way: start over", on().with_instances(0, &[(G1, 0)]), all_on("\"4g.40gb\": 1, \"1g.10gb\": 1"), vec![1], vec!["4g.40gb@0", "1g.10gb@4"], None, false),
        ("MIG off wanted: instances go, then the mode", on().with_instances(0, &[(G2, 0), (G2, 2)]), yaml("    - devices: all\n      mig-enabled: false\n"), vec![1, 2], vec![], Some(false), false),
        ("MIG on with no instances wanted", off(), all_on(""), vec![], vec![], Some(true), false),
        ("already off", off(), yaml("    - devices: [0]\n      mig-enabled: false\n"), vec![], vec![], None, true),
    ];
    for (what, ops, b, destroyed, created, mode, matches) in cases {
        let p = plan_for(&ops, &b, &s);
        assert!(p.problems().is_empty(), "{what}: {:?}", p.problems());
        let created: Vec<String> = created.iter().map(|c| c.to_string()).collect();
        assert_eq!(summary(&p), (destroyed, created, mode), "{what}\n{}", p.text());
        assert_eq!(p.matches(), matches, "{what}");
        let services: Vec<&str> = p.services.iter().map(String::as_str).collect();
        let want: &[&str] = match (mode, p.changes()) {
            (Some(_), _) => &UNITS,
            (None, true) => &["slurmd.service"],
            (None, false) => &[],
        };
        assert_eq!(services, want, "{what}");
    }
}

#[test]
fn plans_that_apply_must_refuse_say_why() {
    let leave_mode = Settings { mig_mode: MigModeSetting::Leave, ..settings() };
    let leave_instances = Settings { mig_instances: MigInstanceSetting::Leave, ..settings() };
    let on = || FakeMig::new("h100-80gb", 1).mig_on(0);
    let held = on();
    held.gpus.borrow_mut()[0].processes.push(nvml_sim::model::SimProcess { pid: 4242, used_mib: 1, gpu_instance: None, compute_instance: None, live: false });
    let cases: Vec<(&str, FakeMig, Baseline, Settings, &str)> = vec![
        ("unknown profile", on(), all_on("\"1g.18gb\": 1"), settings(), "profile 1g.18gb (entry 1) is not offered by NVIDIA H100 80GB HBM3; its profiles: 1g.10gb,"),
        ("does not fit", on(), all_on("\"4g.40gb\": 1, \"3g.40gb\": 1, \"1g.10gb\": 1"), settings(), "does not fit the NVIDIA H100 80GB HBM3: no placement of these instances exists; a layout that fits: 1x 1g.10gb, 1x 3g.40gb"),
        ("too many", on(), all_on("\"1g.10gb\": 8"), settings(), "a layout that fits: 7x 1g.10gb"),
        ("mode left", FakeMig::new("h100-80gb", 1), all_on("\"1g.10gb\": 1"), leave_mode, "MIG would have to be switched on, but [gpu] mig_mode = \"leave\""),
        ("instances left", on(), all_on("\"1g.10gb\": 1"), leave_instances, "but [gpu] mig_instances = \"leave\""),
        ("a process", held, all_on("\"1g.10gb\": 1"), settings(), "process(es) 4242 run on it: stop them first"),
        ("index out of range", on(), yaml("    - devices: [0, 3]\n      mig-enabled: false\n"), settings(), "entry 1 names GPU 3, but this node has 1 GPU(s)"),
    ];
    for (what, ops, b, s, needle) in cases {
        let p = plan_for(&ops, &b, &s);
        let problems = p.problems().join("; ");
        assert!(problems.contains(needle), "{what}: {problems}");
        assert!(p.text().contains("apply would refuse"), "{what}");
        let svc = RecordingServices::with_active(&UNITS);
        let reset = RecordingReset::new(|_| Ok(()));
        let err = apply(&ops, &p, &svc, &reset, &mut |_| {}).unwrap_err();
        assert!(matches!(err, ApplyError::Refused(_)) && err.label() == "refused", "{what}: {err}");
        assert!(svc.calls.borrow().is_empty() && ops.calls.borrow().is_empty(), "{what}: nothing may be touched");
    }
    // A job holding the GPU (its state lists it) blocks changes.
    let ops = on();
    let mut obs = observe(&ops);
    obs[0].jobs = vec![17];
    let p = plan(&all_on("\"1g.10gb\": 1"), &obs, &settings());
    assert!(p.problems()[0].contains("held by job(s) 17: drain the node"), "{:?}", p.problems());
    // Leave settings do not stop a GPU that already matches.
    let ops = on().with_instances(0, &[(G1, 3)]);
    let p = plan_for(&ops, &all_on("\"1g.10gb\": 1"), &Settings { mig_mode: MigModeSetting::Leave, mig_instances: MigInstanceSetting::Leave, ..settings() });
    assert!(p.problems().is_empty() && p.matches());
}

fn run(ops: &FakeMig, b: &Baseline, svc: &RecordingServices) -> (Result<Done, ApplyError>, Vec<String>) {
    let reset = RecordingReset::new(|ids| ops.reset(ids));
    let mut lines: Vec<FinishedLine> = Vec::new();
    let r = apply(ops, &plan_for(ops, b, &settings()), svc, &reset, &mut |l| lines.push(l));
    (r, lines.iter().map(|l| l.as_str().to_string()).collect())
}

#[test]
fn apply_is_idempotent_and_restarts_services_in_reverse_order() {
    let ops = FakeMig::new("h100-80gb", 2);
    let b = all_on("\"3g.40gb\": 1, \"2g.20gb\": 2");
    // dcgm-exporter is not in the list; nvidia-dcgm is inactive.
    let svc = RecordingServices::with_active(&["slurmd.service", "nvidia-persistenced.service"]);
    let (r, lines) = run(&ops, &b, &svc);
    assert_eq!(r.unwrap(), Done::Changed(vec![0, 1]));
    assert_eq!(
        svc.changes(),
        ["stop slurmd.service", "stop nvidia-persistenced.service", "start nvidia-persistenced.service", "start slurmd.service"]
    );
    assert_eq!(ops.layout(0), [(G2, 0), (G2, 2), (G3, 4)]);
    assert!(lines.iter().any(|l| l.contains("step=create gpu=1 profile=3g.40gb start=4 gi=") && l.contains("mig_uuid=MIG-")), "{lines:#?}");
    assert!(lines.iter().all(|l| l.starts_with("gpu-mode: action=mig-baseline step=") && l.ends_with("outcome=ok")), "{lines:#?}");
    assert!(plan_for(&ops, &b, &settings()).matches());
    // Again: nothing to do, nothing touched.
    let again = RecordingServices::with_active(&["slurmd.service"]);
    ops.calls.borrow_mut().clear();
    let (r, lines) = run(&ops, &b, &again);
    assert_eq!(r.unwrap(), Done::Unchanged);
    assert!(again.calls.borrow().is_empty() && ops.calls.borrow().is_empty() && lines.is_empty());
}

#[test]
fn a_pending_mode_is_applied_by_a_reset_and_a_refused_reset_still_restarts_services() {
    // A client the services hook does not know holds GPU 0: NVML leaves the
    // mode pending, and the reset is refused.
    let ops = FakeMig::new("h100-80gb", 2);
    ops.gpus.borrow_mut()[0].health.held_by_client = true;
    let svc = RecordingServices::with_active(&UNITS);
    let (r, lines) = run(&ops, &all_on("\"7g.80gb\": 1"), &svc);
    let err = r.unwrap_err();
    assert_eq!(err.label(), "gpu_reset", "{err}");
    assert!(matches!(&err, ApplyError::Failed { step: StepError::Reset(ProgramError::Failed { .. }), .. }), "{err}");
    let err = err.to_string();
    assert!(err.starts_with("GPU reset to apply the MIG mode failed: nvidia-smi --gpu-reset -i 00000000:18:00.0 failed (exit status: 1): reset of 00000000:18:00.0 refused"), "{err}");
    assert_eq!(
        svc.changes(),
        [
            "stop slurmd.service",
            "stop nvidia-dcgm.service",
            "stop nvidia-persistenced.service",
            "start nvidia-persistenced.service",
            "start nvidia-dcgm.service",
            "start slurmd.service"
        ]
    );
    assert!(lines.iter().any(|l| l.contains("step=mig-mode gpu=0") && l.contains("pending=")), "{lines:#?}");
    assert!(lines.iter().any(|l| l.contains("step=gpu-reset") && l.ends_with("outcome=failed")), "{lines:#?}");
    // The client gone (e.g. it was one of the services), the reset applies it.
    ops.gpus.borrow_mut()[0].health.held_by_client = false;
    ops.gpus.borrow_mut()[0].processes.clear();
    let reset = RecordingReset::new(|ids| ops.reset(ids));
    let p = plan_for(&ops, &all_on("\"7g.80gb\": 1"), &settings());
    // GPU 1 switched on in the first run; GPU 0 is still pending.
    assert_eq!(p.gpus[0].mode, Some(true));
    ops.gpus.borrow_mut()[0].health.held_by_client = true;
    let release = RecordingReset::new(|ids| {
        ops.gpus.borrow_mut()[0].health.held_by_client = false;
        ops.reset(ids)
    });
    apply(&ops, &p, &RecordingServices::default(), &release, &mut |_| {}).unwrap();
    assert_eq!(release.calls.borrow().as_slice(), [vec!["00000000:18:00.0".to_string()]]);
    assert!(reset.calls.borrow().is_empty());
    assert_eq!(ops.layout(0), [(0, 0)]);
}

#[test]
fn failures_undo_what_they_can_and_always_restart_services() {
    // The second create fails: the first is destroyed again.
    let ops = FakeMig::new("h100-80gb", 1).mig_on(0);
    ops.fail_create.set(Some(1));
    let svc = RecordingServices::with_active(&UNITS);
    let (r, _) = run(&ops, &all_on("\"3g.40gb\": 2"), &svc);
    let err = r.unwrap_err();
    assert_eq!(err.label(), "create", "{err}");
    let err = err.to_string();
    assert!(err.contains("GPU 0: cannot create 3g.40gb at slice 4") && err.contains("the 1 made before it were destroyed again"), "{err}");
    assert_eq!(ops.layout(0), []);
    assert_eq!(svc.changes(), ["stop slurmd.service", "start slurmd.service"], "an instance change stops the layout services only");
    // A unit that will not stop: those stopped before it start again, the GPUs stay as they were.
    let ops = FakeMig::new("h100-80gb", 1);
    let svc = RecordingServices { fail: vec!["stop nvidia-persistenced.service".into()], ..RecordingServices::with_active(&UNITS) };
    let (r, _) = run(&ops, &all_on("\"7g.80gb\": 1"), &svc);
    let err = r.unwrap_err();
    assert!(err.label() == "services" && err.to_string().starts_with("cannot stop nvidia-persistenced.service"), "{err}");
    assert_eq!(
        svc.changes(),
        ["stop slurmd.service", "stop nvidia-dcgm.service", "stop nvidia-persistenced.service", "start nvidia-dcgm.service", "start slurmd.service"]
    );
    assert!(ops.calls.borrow().is_empty());
    // A unit that will not start again fails the apply but the others start.
    let ops = FakeMig::new("h100-80gb", 1);
    let svc = RecordingServices { fail: vec!["start nvidia-dcgm.service".into()], ..RecordingServices::with_active(&UNITS) };
    let (r, _) = run(&ops, &all_on("\"7g.80gb\": 1"), &svc);
    let err = r.unwrap_err();
    assert_eq!(err.label(), "services", "{err}");
    let err = err.to_string();
    assert!(err.starts_with("the GPUs were changed, but cannot start nvidia-dcgm.service again"), "{err}");
    assert!(svc.changes().ends_with(&["start nvidia-persistenced.service".into(), "start nvidia-dcgm.service".into(), "start slurmd.service".into()]));
}

#[test]
fn export_reads_back_as_a_baseline_the_gpus_match() {
    let ops = FakeMig::new("h100-80gb", 3).mig_on(0).mig_on(1).with_instances(0, &[(G4, 0), (G2, 4), (G1, 6)]).with_instances(1, &[(G3, 0)]);
    let text = tool::export(&ops, "current").unwrap();
    let b = parted::parse(&text, "export", "current").unwrap();
    let p = plan_for(&ops, &b, &settings());
    assert!(p.matches(), "{text}\n{}", p.differences());
    assert!(text.contains("devices: [2]\n      mig-enabled: false"), "{text}");
    // One instance gone: assert says how GPU 0 differs.
    ops.destroy_mig_instance(0, 3).unwrap();
    let p = plan_for(&ops, &b, &settings());
    assert!(!p.matches());
    let d = p.differences();
    assert!(d.contains("GPU 0 (GPU-") && d.contains("instances: 1x 2g.20gb, 1x 4g.40gb, the baseline wants 1x 1g.10gb, 1x 2g.20gb, 1x 4g.40gb"), "{d}");
}

/// Every config of the fixture files against the model it was written for
/// (the layouts scripts/gpu/mig-readonly.sh plans on real GPUs): which are
/// refused, and the placements of the others on a MIG-off GPU.
#[test]
fn every_fixture_config_is_placed_or_refused_on_its_model() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mig-parted");
    let cases: [(&str, &str, &[&str]); 2] = [
        ("examples.yaml", "h100-80gb", &["too-big"]),
        ("h200.yaml", "h200-141gb", &["too-big", "too-many", "h100-names"]),
    ];
    for (file, model, refused) in cases {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        let ops = FakeMig::new(model, 8);
        for name in parted::config_names(&text, file).unwrap() {
            let b = parted::parse(&text, file, &name).unwrap();
            let p = plan_for(&ops, &b, &settings());
            assert_eq!(!p.problems().is_empty(), refused.contains(&name.as_str()), "{file} {name}: {:?}", p.problems());
            // Placed layouts are valid: apply them on a fresh fake and assert.
            if p.problems().is_empty() {
                let fresh = FakeMig::new(model, 8);
                let reset = RecordingReset::new(|ids| fresh.reset(ids));
                apply(&fresh, &plan_for(&fresh, &b, &settings()), &RecordingServices::default(), &reset, &mut |_| {}).unwrap();
                assert!(plan_for(&fresh, &b, &settings()).matches(), "{file} {name}");
            }
        }
    }
}

#[test]
fn each_failed_step_has_its_label_and_says_what_it_acted_on() {
    let failed = |step: StepError| ApplyError::Failed { step, restart: vec![] };
    let cases = [
        (
            failed(StepError::ServiceState { unit: "a.service".into(), source: ran("/bin/systemctl", "is-active --quiet -- a.service", "x") }),
            "services",
            "cannot tell whether a.service is active: /bin/systemctl is-active --quiet -- a.service failed (exit status: 1): x",
        ),
        (
            failed(StepError::ServiceStop { unit: "a.service".into(), source: ProgramError::BadUnitName(crate::config::BadUnitName("-a".into())) }),
            "services",
            "cannot stop a.service: \"-a\" is not a systemd unit name (letters, digits and :_.@-\\ only, not starting with -)",
        ),
        (failed(StepError::MigMode { gpu: 1, enable: false, detail: "x".into() }), "mig_mode", "GPU 1: cannot switch MIG off: x"),
        (
            failed(StepError::ModeNotApplied { gpu: 0, enable: true, modes: "modes None".into() }),
            "mig_mode",
            "GPU 0: MIG is still not on after the reset (modes None); a passthrough VM may need a reboot",
        ),
        (failed(StepError::Destroy { gpu: 0, gpu_instance: 3, profile: "1g.10gb".into(), detail: "busy".into() }), "destroy", "GPU 0: cannot destroy GI 3 (1g.10gb): busy"),
        (
            failed(StepError::Create { gpu: 0, profile: "3g.40gb".into(), start: 4, detail: "x".into(), undone: Err("GI 1: y".into()) }),
            "create",
            "GPU 0: cannot create 3g.40gb at slice 4: x; undoing it failed too: GI 1: y",
        ),
        (failed(StepError::Verify { gpu: 2, detail: "after apply it has 7g.80gb, not 1g.10gb".into() }), "verify", "GPU 2: after apply it has 7g.80gb, not 1g.10gb"),
        (
            ApplyError::Failed { step: StepError::Reset(ran("/bin/nvidia-smi", "--gpu-reset -i 0", "refused")), restart: vec!["cannot start a.service again: x".into()] },
            "gpu_reset",
            "GPU reset to apply the MIG mode failed: /bin/nvidia-smi --gpu-reset -i 0 failed (exit status: 1): refused; and cannot start a.service again: x",
        ),
        (
            failed(StepError::Reset(ProgramError::BadPciBusId("0;reboot".into()))),
            "gpu_reset",
            "GPU reset to apply the MIG mode failed: \"0;reboot\" is not a PCI bus id",
        ),
    ];
    for (err, label, said) in cases {
        assert_eq!((err.label(), err.to_string().as_str()), (label, said));
    }
}
