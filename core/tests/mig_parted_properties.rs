//! Properties of the mig-parted config reader (the hardening issue's
//! round-trip rule): every baseline written (`parted::write`, also what
//! `gpu-mode-mig export` writes) reads back as the same entries under any
//! config name; any text either parses, and then its canonical form is a
//! fixed point, or is refused in one line naming the file; a bad entry is
//! refused naming the config, the entry and the offending key.

use gpu_mode_core::mig_baseline::parted::{self, ExportGpu};
use gpu_mode_core::mig_baseline::{Baseline, DeviceFilter, Devices, Entry};
use proptest::prelude::*;
use std::collections::BTreeMap;

const FILE: &str = "/etc/slurm-gpu-mode/mig-parted.yaml";

fn profile() -> impl Strategy<Value = String> {
    (prop::sample::select(vec![1u8, 2, 3, 4, 7]), 1u32..=200, prop::sample::select(vec!["", "+me", "-me", "+gfx", "+me.all"]))
        .prop_map(|(s, m, suffix)| format!("{s}g.{m}gb{suffix}"))
}

fn instances() -> impl Strategy<Value = BTreeMap<String, u32>> {
    prop::collection::btree_map(profile(), 1u32..=7, 0..4)
}

fn entry() -> impl Strategy<Value = Entry> {
    let devices = prop_oneof![Just(Devices::All), prop::collection::btree_set(0u32..16, 0..4).prop_map(|s| Devices::Indices(s.into_iter().collect()))];
    let filter = prop::collection::vec((any::<u32>(), prop::option::of(any::<u32>())).prop_map(|(device, subsystem)| DeviceFilter { device, subsystem }), 0..3);
    (devices, filter, any::<bool>(), instances()).prop_map(|(devices, filter, mig_enabled, instances)| Entry {
        devices,
        filter,
        mig_enabled,
        instances: if mig_enabled { instances } else { BTreeMap::new() },
    })
}

/// Config names: plain ones, and anything a person might type, control
/// characters, quotes, separators and non-ASCII included.
fn name() -> impl Strategy<Value = String> {
    prop_oneof!["[a-z0-9-]{1,16}", "\\PC{1,12}", "[\u{0}-\u{1f}\u{7f}-\u{9f}\"\\\\:#\u{2028}\u{2029}\u{feff} -]{1,8}"]
}

fn source(name: &str) -> String {
    format!("mig-parted config \"{}\" in {FILE}", parted::printable(name))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn a_written_baseline_reads_back_as_the_same_entries(name in name(), entries in prop::collection::vec(entry(), 1..4)) {
        let b = Baseline { source: source(&name), entries };
        let text = parted::write(&name, &b);
        prop_assert_eq!(parted::parse(&text, FILE, &name).map_err(|e| format!("{e}\n{text}")), Ok(b));
        prop_assert_eq!(parted::config_names(&text, FILE).map_err(|e| e.to_string()), Ok(vec![name]));
    }

    #[test]
    fn an_export_reads_back_as_each_gpus_layout(name in name(), gpus in prop::collection::vec((any::<bool>(), instances()), 1..6)) {
        let gpus: Vec<ExportGpu> = gpus
            .into_iter()
            .enumerate()
            .map(|(i, (on, inst))| ExportGpu { index: i as u32, mig_enabled: on, instances: if on { inst } else { BTreeMap::new() }, placements: vec![] })
            .collect();
        let text = parted::export(&name, &gpus, gpus.len());
        let b = parted::parse(&text, FILE, &name).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        for g in &gpus {
            let covering: Vec<&Entry> = b.entries.iter().filter(|e| match &e.devices {
                Devices::All => true,
                Devices::Indices(l) => l.contains(&g.index),
            }).collect();
            prop_assert_eq!(covering.len(), 1, "GPU {} in exactly one entry:\n{}", g.index, text);
            prop_assert_eq!((covering[0].mig_enabled, &covering[0].instances), (g.mig_enabled, &g.instances), "{}", text);
        }
    }

    #[test]
    fn any_text_parses_to_a_fixed_point_or_is_refused_in_one_line(lines in prop::collection::vec(line(), 0..14)) {
        let text = lines.join("\n");
        let names = match parted::config_names(&text, FILE) {
            Ok(n) => n,
            Err(e) => {
                let e = e.to_string();
                prop_assert!(e.starts_with(&format!("mig-parted config {FILE}: ")) && !e.contains('\n'), "{:?}", e);
                return Ok(());
            }
        };
        for n in names {
            match parted::parse(&text, FILE, &n) {
                Ok(b) => {
                    let canonical = parted::write(&n, &b);
                    prop_assert_eq!(parted::parse(&canonical, FILE, &n).map_err(|e| e.to_string()), Ok(b), "{}", canonical);
                }
                Err(e) => {
                    let e = e.to_string();
                    prop_assert!(e.contains(FILE) && !e.contains('\n'), "{:?}", e)
                }
            }
        }
    }

    #[test]
    fn a_bad_entry_is_refused_naming_config_entry_and_key(
        name in "[a-z0-9-]{1,16}",
        entries in prop::collection::vec(entry(), 1..4),
        bad in 0..BAD.len(),
        at in any::<prop::sample::Index>(),
    ) {
        let which = at.index(entries.len());
        let mut text = String::from("version: v1\nmig-configs:\n");
        text.push_str(&format!("  {name}:\n"));
        for (i, e) in entries.iter().enumerate() {
            let one = parted::write("x", &Baseline { source: String::new(), entries: vec![e.clone()] });
            let mut body: String = one.lines().skip(3).map(|l| format!("{l}\n")).collect();
            if i == which {
                body = BAD[bad].1.to_string();
            }
            text.push_str(&body);
        }
        let err = parted::parse(&text, FILE, &name).unwrap_err().to_string();
        let (key, _) = BAD[bad];
        prop_assert!(err.contains(&source(&name)) || err.starts_with(&format!("mig-parted config {FILE}")), "{}", err);
        prop_assert!(err.contains(key), "{} not named in {}", key, err);
        if !err.contains("TOML") && err.contains(&source(&name)) {
            prop_assert!(err.contains(&format!("entry {}", which + 1)), "entry {} not named in {}", which + 1, err);
        }
    }
}

/// (what the error must name, an entry that is wrong there).
const BAD: &[(&str, &str)] = &[
    ("mig-devices", "    - devices: all\n      mig-enabled: true\n"),
    ("mig-devices", "    - devices: all\n      mig-enabled: false\n      mig-devices:\n        \"1g.10gb\": 1\n"),
    ("\"1g.10\"", "    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"1g.10\": 1\n"),
    ("count -1", "    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"1g.10gb\": -1\n"),
    ("all counts are 0", "    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"1g.10gb\": 0\n"),
    ("device-filter \"0xZZ\"", "    - devices: all\n      device-filter: \"0xZZ\"\n      mig-enabled: false\n"),
    ("devices: \"some\"", "    - devices: some\n      mig-enabled: false\n"),
    ("mig-enabled", "    - devices: all\n"),
    ("mig-device", "    - devices: all\n      mig-enabled: true\n      mig-device: {}\n"),
    ("compute-instance profiles", "    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"1c.3g.40gb\": 1\n"),
];

fn line() -> impl Strategy<Value = String> {
    let pieces = vec![
        "version: v1",
        "version: v2",
        "mig-configs:",
        "  a:",
        "  b-c:",
        "  \"x y\":",
        "    - devices: all",
        "    - devices: [0, 1]",
        "    - devices: [-1]",
        "      device-filter: \"0x233010DE\"",
        "      device-filter: [\"0x233010DE:0x16C110DE\"]",
        "      mig-enabled: true",
        "      mig-enabled: false",
        "      mig-enabled: yes",
        "      mig-devices: {}",
        "      mig-devices:",
        "        \"1g.10gb\": 7",
        "        3g.40gb: 2",
        "        \"2c.2g.20gb\": 3",
        "    []",
        "x: &a [*a]",
        "  a: &anchor",
        "  b: *anchor",
    ];
    prop_oneof![6 => prop::sample::select(pieces).prop_map(String::from), 1 => "[ -~]{0,20}"]
}
