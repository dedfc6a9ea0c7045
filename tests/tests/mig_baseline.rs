//! The node MIG baseline end to end (issue 9 part 3): `gpu-mode-mig` on the
//! simulated NVML of a real local Slurm, with a mig-parted config file;
//! `plan` changes nothing, `apply` stops the services around the MIG mode
//! change and starts them again in reverse order (a stand-in systemctl
//! records its argv), `assert` agrees, a changed config makes `assert` fail
//! and the node checker report stale MIG against the same baseline, a second
//! `apply` fixes both; after a reboot the boot unit's `apply --boot`
//! recreates the layout; a boot apply that fails drains the node with a
//! `gpu-mode: MIG baseline` reason and a later successful one resumes it.
//!
//! The stand-ins: `systemctl` keeps the active units in a file and models
//! DCGM as a GPU client (stopping nvidia-dcgm.service releases the GPUs,
//! starting it holds them again, through `nvml-sim-ctl`); `nvidia-smi
//! --gpu-reset -i <bus ids>` resets the simulated GPUs (`nvml-sim-ctl reset`
//! refuses while a client holds one).

use gpu_mode_tests::Cluster;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Output;
use std::sync::{Mutex, MutexGuard};

/// Both tests change the one node's GPUs: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

const CONFIGS: &str = r#"version: v1
mig-configs:
  base:
    # Fits only with the 3g at slice 4.
    - devices: [0]
      mig-enabled: true
      mig-devices:
        "3g.71gb": 1
        "2g.35gb": 2
    - devices: [1]
      mig-enabled: true
      mig-devices:
        "1g.18gb": 7
  off:
    - devices: all
      mig-enabled: false
"#;

/// GPU 1's entry after the site changed its mind.
const CHANGED_GPU1: &str = "\"1g.18gb\": 3\n        \"3g.71gb\": 1\n";

fn c() -> (MutexGuard<'static, ()>, &'static Cluster) {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = gpu_mode_tests::shared::cluster_with("mig_baseline", 2, |spec| {
        let d = spec.dir.display();
        spec.extra_gpu_mode_config = format!(
            "[mig]\nbaseline = \"base\"\nbaseline_config = \"{d}/mig/mig-parted.yaml\"\nsystemctl = \"{d}/mig/systemctl\"\n\
             nvidia_smi = \"{d}/mig/nvidia-smi\"\nservices = [\"slurmd.service\", \"nvidia-dcgm.service\", \"nvidia-persistenced.service\"]\n"
        );
    });
    write_stand_ins(c);
    (guard, c)
}

fn mig_dir(c: &Cluster) -> PathBuf {
    c.dir.join("mig")
}

fn write_exec(path: PathBuf, text: &str) {
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn write_stand_ins(c: &Cluster) {
    let m = mig_dir(c);
    if m.join("systemctl").exists() {
        return;
    }
    std::fs::create_dir_all(&m).unwrap();
    let ctl = c.spec.artifacts.sim.as_ref().expect("simulated GPUs").nvml_ctl.display().to_string();
    let state = c.dir.join("sim/nvml-state.json");
    let sim = format!("GPU_MODE_SIM_STATE={} {ctl}", state.display());
    let md = m.display();
    write_exec(
        m.join("systemctl"),
        &format!(
            r#"#!/bin/sh
echo "$@" >> {md}/systemctl.log
unit=$(eval echo \${{$#}})
case "$1" in
is-active) grep -qx "$unit" {md}/active ;;
stop) grep -vx "$unit" {md}/active > {md}/active.new; mv {md}/active.new {md}/active
      [ "$unit" = nvidia-dcgm.service ] && {{ {sim} clear --gpu 0; {sim} clear --gpu 1; }}; exit 0 ;;
start) echo "$unit" >> {md}/active
      [ "$unit" = nvidia-dcgm.service ] && {{ {sim} inject mig-in-use --gpu 0; {sim} inject mig-in-use --gpu 1; }}; exit 0 ;;
esac
"#
        ),
    );
    write_exec(
        m.join("nvidia-smi"),
        &format!(
            r#"#!/bin/sh
echo "$@" >> {md}/nvidia-smi.log
[ "$1" = --gpu-reset ] && [ "$2" = -i ] || exit 2
for id in $(echo "$3" | tr , ' '); do {sim} reset --gpu "$id" || {{ echo "Unable to reset GPU $id: in use"; exit 1; }}; done
"#
        ),
    );
    std::fs::write(m.join("mig-parted.yaml"), CONFIGS).unwrap();
}

/// Sets the stand-in systemd's active units and empties the logs.
fn services(c: &Cluster, active: &[&str]) {
    let m = mig_dir(c);
    std::fs::write(m.join("active"), active.iter().map(|u| format!("{u}\n")).collect::<String>()).unwrap();
    let _ = std::fs::remove_file(m.join("systemctl.log"));
    let _ = std::fs::remove_file(m.join("nvidia-smi.log"));
}

/// The stop/start calls the stand-in systemctl saw.
fn service_changes(c: &Cluster) -> Vec<String> {
    let text = std::fs::read_to_string(mig_dir(c).join("systemctl.log")).unwrap_or_default();
    text.lines().filter(|l| !l.starts_with("is-active")).map(String::from).collect()
}

fn tool(c: &Cluster, args: &[&str]) -> Output {
    c.mig_tool(args).unwrap()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn ok(c: &Cluster, args: &[&str]) -> String {
    let o = tool(c, args);
    assert!(o.status.success(), "gpu-mode-mig {args:?}: {}\n{}", text(&o), c.logs_tail());
    text(&o)
}

fn fails(c: &Cluster, args: &[&str], code: i32) -> String {
    let o = tool(c, args);
    assert_eq!(o.status.code(), Some(code), "gpu-mode-mig {args:?}: {}", text(&o));
    text(&o)
}

fn layout(c: &Cluster, gpu: usize) -> (bool, Vec<(u64, u64)>) {
    c.sim_mig_layout(gpu).unwrap()
}

/// The node checker's stale-MIG results (status, message) for GPU 0 and 1.
fn checker(c: &Cluster) -> Vec<(String, String)> {
    c.check_results("mig").unwrap()
}

// H200 profile ids (sim/nvml/fixtures/h200-141gb.toml).
const G1: u64 = 19;
const G2: u64 = 14;
const G3: u64 = 9;

#[test]
fn apply_assert_a_changed_config_and_the_node_checker_agree() {
    let (_g, c) = c();
    services(c, &[]);
    ok(c, &["apply", "-l", "off", "-c", mig_dir(c).join("mig-parted.yaml").to_str().unwrap()]);
    std::fs::write(mig_dir(c).join("mig-parted.yaml"), CONFIGS).unwrap();
    // slurmd, DCGM (which holds both GPUs) and persistenced run.
    services(c, &["slurmd.service", "nvidia-dcgm.service", "nvidia-persistenced.service"]);
    c.sim_ctl(&["inject", "mig-in-use", "--gpu", "0"]).unwrap();
    c.sim_ctl(&["inject", "mig-in-use", "--gpu", "1"]).unwrap();

    let plan = ok(c, &["plan"]);
    assert!(plan.contains("switch MIG on") && plan.contains("create: 3g.71gb@4 2g.35gb@0 2g.35gb@2"), "{plan}");
    assert_eq!(layout(c, 0), (false, vec![]), "plan touches nothing");
    assert!(service_changes(c).is_empty());
    let differs = fails(c, &["assert"], 1);
    assert!(differs.contains("GPU 0 (GPU-") && differs.contains("MIG is off, the baseline wants it on"), "{differs}");

    let applied = ok(c, &["apply"]);
    assert!(applied.contains("action=mig-baseline verb=apply") && applied.contains("changed=0,1 outcome=ok"), "{applied}");
    assert_eq!(
        service_changes(c),
        [
            "stop -- slurmd.service",
            "stop -- nvidia-dcgm.service",
            "stop -- nvidia-persistenced.service",
            "start -- nvidia-persistenced.service",
            "start -- nvidia-dcgm.service",
            "start -- slurmd.service"
        ]
    );
    assert_eq!(layout(c, 0), (true, vec![(G2, 0), (G2, 2), (G3, 4)]));
    assert_eq!(layout(c, 1).1.len(), 7);
    assert!(ok(c, &["assert"]).contains("the GPUs match mig-parted config \"base\""));
    let export = ok(c, &["export"]);
    assert!(export.contains("# GPU 0: 2g.35gb@0 2g.35gb@2 3g.71gb@4") && export.contains("\"1g.18gb\": 7"), "{export}");

    // Idempotent: nothing stopped, nothing changed.
    services(c, &["slurmd.service"]);
    assert!(ok(c, &["apply"]).contains("nothing changed"));
    assert!(service_changes(c).is_empty());
    assert!(checker(c).iter().all(|(s, m)| s == "ok" && m.ends_with("all in the baseline")), "{:?}", checker(c));

    // The site changes GPU 1's baseline: assert and the checker see it.
    std::fs::write(mig_dir(c).join("mig-parted.yaml"), CONFIGS.replace("\"1g.18gb\": 7\n", CHANGED_GPU1)).unwrap();
    let differs = fails(c, &["assert"], 1);
    assert!(differs.contains("instances: 7x 1g.18gb, the baseline wants 3x 1g.18gb, 1x 3g.71gb"), "{differs}");
    let r = checker(c);
    assert_eq!(r[0].0, "ok");
    assert_eq!(r[1].0, "fail");
    assert!(r[1].1.starts_with("stale MIG instance(s) no job owns: GI 4 (1g.18gb), GI 5 (1g.18gb)"), "{r:?}");
    // Only the instances change: only slurmd is restarted; three 1g stay.
    ok(c, &["apply"]);
    assert_eq!(service_changes(c), ["stop -- slurmd.service", "start -- slurmd.service"]);
    assert_eq!(layout(c, 1).1, vec![(G1, 0), (G1, 1), (G1, 2), (G3, 4)]);
    ok(c, &["assert"]);
    assert!(checker(c).iter().all(|(s, _)| s == "ok"), "{:?}", checker(c));

    // A reboot keeps the mode and loses the layouts; the checker warns,
    // the boot unit's apply puts them back (slurmd not started yet).
    c.sim_ctl(&["reboot"]).unwrap();
    services(c, &["nvidia-persistenced.service"]);
    assert!(checker(c).iter().all(|(s, m)| s == "warn" && m.starts_with("baseline MIG instance(s) missing")), "{:?}", checker(c));
    ok(c, &["apply", "--boot", "--node", &c.spec.node_name]);
    assert!(service_changes(c).is_empty(), "{:?}", service_changes(c));
    ok(c, &["assert"]);
    std::fs::write(mig_dir(c).join("mig-parted.yaml"), CONFIGS).unwrap();
}

#[test]
fn a_failed_boot_apply_drains_the_node_and_a_later_one_resumes_it() {
    let (_g, c) = c();
    services(c, &[]);
    ok(c, &["apply"]);
    let file = mig_dir(c).join("mig-parted.yaml");
    let off = ["apply", "--boot", "--node", &c.spec.node_name, "-c", file.to_str().unwrap(), "-l", "off"];
    // A client the services list does not name holds GPU 0: the reset that
    // turning MIG off needs is refused.
    services(c, &["slurmd.service", "nvidia-persistenced.service"]);
    c.sim_ctl(&["inject", "mig-in-use", "--gpu", "0"]).unwrap();
    let failed = fails(c, &off, 1);
    assert!(failed.contains("GPU reset to apply the MIG mode failed") && failed.contains("outcome=failed"), "{failed}");
    assert_eq!(
        service_changes(c),
        [
            "stop -- slurmd.service",
            "stop -- nvidia-persistenced.service",
            "start --no-block -- nvidia-persistenced.service",
            "start --no-block -- slurmd.service"
        ],
        "started again, without waiting, although the apply failed"
    );
    let (state, reason) = c.node_state().unwrap();
    assert!(state.contains("DRAIN") && reason.starts_with("gpu-mode: MIG baseline: mig-parted config \"off\""), "{state} {reason}");
    // gpu-mode-mig remembered the drain it set (for `gpu-mode status`).
    let remembered = gpu_mode_core::drain::last_drain(&c.runtime_dir()).unwrap().expect("the drain remembered");
    assert!(remembered.reason.starts_with("gpu-mode: MIG baseline: mig-parted config"), "{remembered:?}");
    assert!(std::fs::read_to_string(mig_dir(c).join("nvidia-smi.log")).unwrap().starts_with("--gpu-reset -i 00000000:18:00.0"));

    // The client gone, the next boot apply succeeds and resumes the node.
    c.sim_ctl(&["clear", "--gpu", "0"]).unwrap();
    services(c, &[]);
    let fixed = ok(c, &off);
    assert!(fixed.contains("resumed"), "{fixed}");
    c.wait_until("the node back in service", || c.node_state().is_ok_and(|(s, _)| !s.contains("DRAIN")));
    assert_eq!((layout(c, 0).0, layout(c, 1).0), (false, false));
    ok(c, &["apply"]);
}
