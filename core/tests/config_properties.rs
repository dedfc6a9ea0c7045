//! Properties of the site config (the hardening issue's round-trip rule):
//! every valid config prints in canonical form (`Config::canonical`) and
//! parses back to itself; any text either parses, and then its canonical
//! form is a fixed point, or is refused with one message naming the file;
//! every out-of-range value is refused naming its key.

use gpu_mode_core::config::Config;
use gpu_mode_core::gpu::{ComputeModeSetting, MigInstanceSetting, MigModeSetting};
use proptest::prelude::*;
use std::path::{Path, PathBuf};

const FILE: &str = "/etc/slurm-gpu-mode/config.toml";

fn parse(text: &str) -> Result<Config, String> {
    Config::parse(text, Path::new(FILE)).map_err(|e| e.to_string())
}

/// Absolute paths without `..`, with any characters TOML must escape.
fn abs_path() -> impl Strategy<Value = PathBuf> {
    prop::collection::vec("[^\u{0}/]{1,8}".prop_filter("no ..", |s| s != ".." && s != "."), 1..4)
        .prop_map(|parts| PathBuf::from(format!("/{}", parts.join("/"))))
}

fn ms(max: u64) -> impl Strategy<Value = u64> {
    1..=max
}

fn compute() -> impl Strategy<Value = ComputeModeSetting> {
    prop::sample::select(vec![
        ComputeModeSetting::ExclusiveProcess,
        ComputeModeSetting::Default,
        ComputeModeSetting::Prohibited,
        ComputeModeSetting::Leave,
    ])
}

/// `[mig.layouts]`: names the option grammar takes, lists of valid profiles.
fn layouts() -> impl Strategy<Value = std::collections::BTreeMap<String, String>> {
    // Each profile once (a repeat must be written with a count).
    let profile = (prop::sample::select(vec![1u8, 2, 3, 4, 7]), 1u32..=200).prop_map(|(s, m)| format!("{s}g.{m}gb"));
    let list = prop::collection::btree_map(profile, 1u8..=7, 1..3)
        .prop_map(|m| m.into_iter().map(|(p, n)| if n == 1 { p } else { format!("{p}x{n}") }).collect::<Vec<_>>().join(","));
    prop::collection::btree_map("[a-zA-Z0-9_-]{1,16}", list, 0..3)
}

/// Valid configs, built as values (every section touched).
fn config() -> impl Strategy<Value = Config> {
    let top = (abs_path(), ms(3_600_000), abs_path(), abs_path(), any::<bool>(), any::<bool>(), any::<bool>());
    let gpu = (compute(), any::<bool>(), any::<bool>(), prop::option::of(abs_path()));
    let mps = (abs_path(), ms(600_000), ms(600_000), ms(600_000), ms(600_000));
    let ckpt = (1u32..=u32::MAX, 0u64..=1 << 20, ms(3_600_000), ms(3_600_000), abs_path(), prop::option::of(abs_path()), any::<u32>());
    let health = (any::<u32>(), prop::collection::vec(0u64..1000, 0..4), 1u64..=40_000, prop::option::of(abs_path()), 0u64..=i64::MAX as u64);
    (top, gpu, mps, ckpt, health, layouts()).prop_map(|(top, gpu, mps, ckpt, health, layouts)| {
        let mut c = Config { runtime_dir: top.0, hook_deadline_ms: top.1, ..Config::default() };
        (c.slurm.scontrol, c.slurm.gres_conf, c.slurm.drain_on_node_fault) = (top.2, top.3, top.4);
        (c.log.syslog, c.log.stderr) = (top.5, top.6);
        c.gpu.mps_compute_mode = gpu.0;
        c.gpu.mig_mode = if gpu.1 { MigModeSetting::Switch } else { MigModeSetting::Leave };
        c.gpu.mig_instances = if gpu.2 { MigInstanceSetting::Manage } else { MigInstanceSetting::Leave };
        c.nvml.library = gpu.3;
        (c.mps.control, c.mps.start_timeout_ms, c.mps.quit_timeout_ms, c.mps.kill_timeout_ms, c.mps.lock_timeout_ms) = mps;
        let (k, p) = (&mut c.cuda_ckpt, &mut c.preempt);
        (k.lock_timeout_ms, k.memory_margin_mib, k.call_timeout_ms, p.criu_timeout_ms, p.image_dir, p.agent_socket_dir, p.min_signal_lead_s) = ckpt;
        let h = &mut c.health;
        (h.expected_gpus, h.xid_fail, h.deadline_ms, h.state_dir, h.clocks_warn_mask) = health;
        if let Some(first) = layouts.keys().next() {
            c.mig.baseline = Some(format!("@{first}"));
        }
        c.mig.layouts = layouts;
        c
    })
}

/// (key as the error must name it, TOML that sets it out of range).
const BAD_VALUES: &[(&str, &str)] = &[
    ("runtime_dir", "runtime_dir = \"relative/run\""),
    ("runtime_dir", "runtime_dir = \"/run/../etc\""),
    ("hook_deadline_ms", "hook_deadline_ms = 0"),
    ("hook_deadline_ms", "hook_deadline_ms = 3600001"),
    ("slurm.scontrol", "[slurm]\nscontrol = \"scontrol\""),
    ("slurm.gres_conf", "[slurm]\ngres_conf = \"gres.conf\""),
    ("mps.control", "[mps]\ncontrol = \"bin/mps\""),
    ("mps.start_timeout_ms", "[mps]\nstart_timeout_ms = 0"),
    ("mps.kill_timeout_ms", "[mps]\nkill_timeout_ms = 600001"),
    ("nvml.library", "[nvml]\nlibrary = \"libnvidia-ml.so.1\""),
    ("cuda_ckpt.lock_timeout_ms", "[cuda_ckpt]\nlock_timeout_ms = 0"),
    ("cuda_ckpt.memory_margin_mib", "[cuda_ckpt]\nmemory_margin_mib = 1048577"),
    ("cuda_ckpt.call_timeout_ms", "[cuda_ckpt]\ncall_timeout_ms = 0"),
    ("preempt.criu_timeout_ms", "[preempt]\ncriu_timeout_ms = 3600001"),
    ("preempt.signal", "[preempt]\nsignal = \"KILL\""),
    ("preempt.image_dir", "[preempt]\nimage_dir = \"img\""),
    ("preempt.agent_socket_dir", "[preempt]\nagent_socket_dir = \"sock\""),
    // The old section's keys are named by their new place.
    ("cuda_ckpt.lock_timeout_ms", "[checkpoint]\nlock_timeout_ms = 0"),
    ("preempt.image_dir", "[checkpoint]\nimage_dir = \"img\""),
    ("health.deadline_ms", "[health]\ndeadline_ms = 40001"),
    ("health.kmsg_path", "[health]\nkmsg_path = \"kmsg\""),
    ("health.disabled", "[health]\ndisabled = [\"xids\"]"),
    ("bandwidth_floor_gbps.H100", "[health.deep.bandwidth_floor_gbps]\nH100 = -2.0"),
    ("mig.layouts.half", "[mig.layouts]\nhalf = \"9g.10gb\""),
    ("mig.baseline", "[mig]\nbaseline = \"@missing\""),
    ("mig.services", "[mig]\nservices = [\"../x.service\"]"),
    ("gpu.restore_compute_mode", "[gpu]\nrestore_compute_mode = \"default\""),
    ("drain_on_node_fault", "[slurm]\ndrain_on_node_fault = \"yes\""),
    ("expected_gpus", "[health]\nexpected_gpus = -1"),
    ("runtimedir", "runtimedir = \"/run/x\""),
];

/// Lines the text generator draws from: valid and invalid keys, values of
/// the right and the wrong type, section headers, duplicates, junk.
fn line() -> impl Strategy<Value = String> {
    let bad: Vec<String> = BAD_VALUES.iter().map(|(_, t)| t.to_string()).collect();
    let good = vec![
        "runtime_dir = \"/run/gm\"".to_string(),
        "hook_deadline_ms = 9000".into(),
        "[slurm]".into(),
        "drain_on_node_fault = false".into(),
        "[log]".into(),
        "syslog = false".into(),
        "[mps]".into(),
        "quit_timeout_ms = 100".into(),
        "[mig.layouts]".into(),
        "half = \"3g.71gbx2\"".into(),
        "[mig]".into(),
        "baseline = \"@half\"".into(),
        "[health]".into(),
        "xid_warn = [1, 2]".into(),
        "[preempt]".into(),
        "signal = \"SIGUSR2\"".into(),
        "[cuda_ckpt]".into(),
        "lock_timeout_ms = 2000".into(),
        // The old section, read into the two above with a notice.
        "[checkpoint]".into(),
        "image_dir = \"/srv/ckpt\"".into(),
    ];
    prop_oneof![
        4 => prop::sample::select(good),
        1 => prop::sample::select(bad),
        1 => "[ -~]{0,30}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn valid_configs_round_trip_through_their_canonical_form(c in config()) {
        let text = c.canonical();
        prop_assert_eq!(parse(&text).map_err(|e| format!("{e}\n{text}")), Ok(c));
    }

    #[test]
    fn any_text_parses_to_a_canonical_fixed_point_or_is_refused_naming_the_file(lines in prop::collection::vec(line(), 0..12)) {
        let text = lines.join("\n");
        match parse(&text) {
            Ok(mut c) => {
                let canonical = c.canonical();
                let again = parse(&canonical);
                // The same meaning, in today's sections (the notices are
                // about how the text was written: an old [checkpoint]).
                prop_assert!(again.as_ref().is_ok_and(|a| a.notices.is_empty()), "{:?}", again);
                c.notices.clear();
                prop_assert_eq!(again.as_ref(), Ok(&c), "{}", canonical);
                prop_assert_eq!(again.unwrap().canonical(), canonical);
            }
            Err(e) => {
                prop_assert!(e.starts_with(&format!("config file {FILE}: ")), "{}", e);
                prop_assert!(!e.contains('\n'), "one line: {:?}", e);
            }
        }
    }

    #[test]
    fn an_out_of_range_value_is_refused_naming_its_key(c in config(), i in 0..BAD_VALUES.len()) {
        // A valid config with one key set wrong: appended as its own
        // section, the bad line wins or duplicates; either way it is named.
        let (key, bad) = BAD_VALUES[i];
        let text = format!("{bad}\n");
        let err = parse(&text).unwrap_err();
        let leaf = key.rsplit('.').next().unwrap();
        prop_assert!(err.contains(key) || err.contains(leaf), "{} not named in {}", key, err);
        // The same line inside a full valid config is refused too.
        let full = merge(&c.canonical(), bad);
        prop_assert!(parse(&full).is_err(), "{} accepted in\n{}", bad, full);
    }
}

/// `base` (canonical TOML) with `bad` set in it: the key's own line is
/// replaced if present, else the line is added to its section.
fn merge(base: &str, bad: &str) -> String {
    let mut table: toml::Table = base.parse().unwrap();
    let patch: toml::Table = bad.parse().unwrap();
    fn apply(into: &mut toml::Table, patch: &toml::Table) {
        for (k, v) in patch {
            match (into.get_mut(k), v) {
                (Some(toml::Value::Table(t)), toml::Value::Table(p)) => apply(t, p),
                _ => {
                    into.insert(k.clone(), v.clone());
                }
            }
        }
    }
    apply(&mut table, &patch);
    toml::to_string(&table).unwrap()
}

#[test]
fn the_shipped_example_is_canonical_in_meaning() {
    let text = include_str!("../../etc/config.toml");
    let c = parse(text).unwrap();
    assert_eq!(parse(&c.canonical()).unwrap(), c);
}
