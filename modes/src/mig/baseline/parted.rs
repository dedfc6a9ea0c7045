//! nvidia-mig-parted's config format (`version: v1`), read so sites keep
//! their mig-parted files, and written by `gpu-mode-mig export`:
//!
//! ```yaml
//! version: v1
//! mig-configs:
//!   all-1g.10gb:                # a config name, chosen with -l
//!     - devices: all            # or [0, 1]: NVML indices
//!       device-filter: "0x233010DE"   # optional: PCI device+vendor id(s)
//!       mig-enabled: true
//!       mig-devices:
//!         "1g.10gb": 7
//! ```
//!
//! The rules are mig-parted's (its api/spec/v1): `version` must be `v1`;
//! every config has at least one entry; `devices` and `mig-enabled` are
//! required; `mig-devices` is required when MIG is enabled and must be empty
//! when it is not; counts are not negative and not all zero; unknown keys
//! are errors. Profiles with a compute-instance part (`1c.2g.10gb`) are
//! refused unless it spans the GPU instance (`2c.2g.10gb` is `2g.10gb`):
//! slurm-gpu-mode makes one compute instance per GPU instance. Whether a
//! profile exists on the GPU and the layout fits is decided per GPU by
//! [`super::plan`].

use super::{Baseline, DeviceFilter, Devices, Entry};
use crate::gpu::MigInstance;
use crate::gpu_mode::MigProfileName;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// Files larger than this are refused before parsing (real ones are a few KiB).
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// Why a mig-parted config file could not be read, or a config in it not
/// taken. Every message names the file (and the config and entry where
/// there is one); those of parsing quote the file's text through
/// [`printable`], so one from a root helper at boot stays one line.
#[derive(Debug, thiserror::Error)]
pub enum PartedError {
    #[error("cannot read mig-parted config {file}: {source}")]
    Read { file: String, source: std::io::Error },
    #[error("mig-parted config {file} is not a regular file")]
    NotAFile { file: String },
    #[error("mig-parted config {file} is {bytes} bytes, more than the {} accepted", MAX_FILE_BYTES)]
    TooLarge { file: String, bytes: u64 },
    /// Root reads a file someone else may write.
    #[error("mig-parted config {file} is owned by uid {uid} with mode {mode:o}: it decides what root does to the GPUs, so only root may write it")]
    Unsafe { file: String, uid: u32, mode: u32 },
    /// Not YAML, or not the file's shape (unknown keys, wrong types,
    /// `devices` neither `all` nor indices): the YAML reader's message.
    #[error("mig-parted config {}: {}", printable(.file), printable(.detail))]
    Syntax { file: String, detail: String },
    #[error("mig-parted config {}: unknown version \"{}\" (only v1 exists)", printable(.file), printable(.version))]
    Version { file: String, version: String },
    /// `known`: the file's config names, or `none`.
    #[error("mig-parted config {}: no config named \"{}\" (configs: {})", printable(.file), printable(.name), printable(.known))]
    UnknownConfig { file: String, name: String, known: String },
    /// `start`: the name's first 40 characters.
    #[error("mig-parted config {}: the config name \"{}...\" has {chars} characters; at most {}", printable(.file), printable(.start), MAX_NAME_CHARS)]
    NameTooLong { file: String, start: String, chars: usize },
    /// `config`: the baseline's source (`mig-parted config "x" in FILE`).
    #[error("{}: at least one entry is required", printable(.config))]
    NoEntries { config: String },
    /// `entry`: 1-based.
    #[error("{}, entry {entry}: {problem}", printable(.config))]
    Entry { config: String, entry: usize, #[source] problem: EntryError },
}

/// What is wrong with one entry of a config (`mig-configs.<name>[i]`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    #[error("mig-devices: count {count} of \"{}\" is not a number of instances", printable(.profile))]
    Count { profile: String, count: i64 },
    #[error("mig-devices is required when mig-enabled is true (write `mig-devices: {{}}` for none)")]
    DevicesRequired,
    #[error("mig-devices: all counts are 0")]
    AllZero,
    #[error("mig-devices are listed but mig-enabled is false")]
    DevicesWhenOff,
    /// `part`: the device or subsystem half of `filter` that is not hex.
    #[error("device-filter \"{}\": \"{}\" is not a hex PCI id such as 0x233010DE", printable(.filter), printable(.part))]
    DeviceFilter { filter: String, part: String },
    /// A compute-instance profile smaller than its GPU instance; `gi` is
    /// the GPU-instance part.
    #[error("mig-devices: \"{}\": compute-instance profiles are not supported: slurm-gpu-mode makes one compute instance spanning each GPU instance (write \"{}\")", printable(.key), printable(.gi))]
    ComputeInstance { key: String, gi: String },
    /// `why`: what the profile-name parser said.
    #[error("mig-devices: \"{}\": {}", printable(.key), printable(.why))]
    Profile { key: String, why: String },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SpecFile {
    version: String,
    #[serde(rename = "mig-configs")]
    mig_configs: BTreeMap<String, Vec<EntryFile>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryFile {
    #[serde(rename = "device-filter", default)]
    device_filter: Option<Filter>,
    devices: DevicesFile,
    #[serde(rename = "mig-enabled")]
    mig_enabled: bool,
    #[serde(rename = "mig-devices", default)]
    mig_devices: Option<BTreeMap<String, i64>>,
}

/// `device-filter`: one string or a list of them.
#[derive(Deserialize)]
#[serde(untagged)]
enum Filter {
    One(String),
    Many(Vec<String>),
}

/// `devices`: `all` or a list of indices, with a message that says so.
struct DevicesFile(Devices);

impl<'de> Deserialize<'de> for DevicesFile {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = DevicesFile;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("`all` or a list of GPU indices such as [0, 1]")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<DevicesFile, E> {
                match v {
                    "all" => Ok(DevicesFile(Devices::All)),
                    other => Err(E::custom(format!("devices: \"{other}\" is not `all` or a list of GPU indices"))),
                }
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<DevicesFile, A::Error> {
                let mut list = Vec::new();
                while let Some(i) = seq.next_element::<i64>()? {
                    let i = u32::try_from(i).map_err(|_| de::Error::custom(format!("devices: {i} is not a GPU index")))?;
                    if !list.contains(&i) {
                        list.push(i);
                    }
                }
                Ok(DevicesFile(Devices::Indices(list)))
            }
        }
        d.deserialize_any(V)
    }
}

/// The longest config name taken. YAML allows implicit keys of at most 1024
/// characters, and the canonical form writes a name with control characters
/// as `\u0009` escapes (six each), so a longer name would not read back
/// (found by the mig_parted fuzz target: a 300-character name full of tabs).
pub const MAX_NAME_CHARS: usize = 128;

/// Parses mig-parted config text and picks config `name`. `file` is only
/// used in messages, which name the file, the config and the problem.
pub fn parse(text: &str, file: &str, name: &str) -> Result<Baseline, PartedError> {
    let spec = read_spec(text, file)?;
    if spec.version != "v1" {
        return Err(PartedError::Version { file: file.into(), version: spec.version });
    }
    let Some(entries) = spec.mig_configs.get(name) else {
        let known: Vec<&str> = spec.mig_configs.keys().map(String::as_str).collect();
        let known = if known.is_empty() { "none".to_string() } else { known.join(", ") };
        return Err(PartedError::UnknownConfig { file: file.into(), name: name.into(), known });
    };
    if name.chars().count() > MAX_NAME_CHARS {
        return Err(PartedError::NameTooLong { file: file.into(), start: name.chars().take(40).collect(), chars: name.chars().count() });
    }
    let source = format!("mig-parted config \"{}\" in {file}", printable(name));
    if entries.is_empty() {
        return Err(PartedError::NoEntries { config: source });
    }
    let entries = entries.iter().enumerate().map(|(i, e)| entry(e).map_err(|problem| PartedError::Entry { config: source.clone(), entry: i + 1, problem }));
    Ok(Baseline { source: source.clone(), entries: entries.collect::<Result<_, _>>()? })
}

/// Messages quote names, keys and values from the file, and one from a
/// root helper at boot must stay one line (found by the mig_parted fuzz
/// target: a device-filter spanning lines gave a message spanning lines).
pub use crate::log::printable;

/// The config names in a file, for `plan --all`.
pub fn config_names(text: &str, file: &str) -> Result<Vec<String>, PartedError> {
    Ok(read_spec(text, file)?.mig_configs.into_keys().collect())
}

/// YAML to the file's shape. serde-saphyr's defaults are what we want:
/// duplicate keys are errors, and its budget bounds alias expansion and
/// sizes (a root helper parses this). Snippets off: errors are one line.
fn read_spec(text: &str, file: &str) -> Result<SpecFile, PartedError> {
    let mut options = serde_saphyr::Options::default();
    options.with_snippet = false;
    serde_saphyr::from_str_with_options(text, options).map_err(|e| PartedError::Syntax { file: file.into(), detail: one_line(&e.to_string()) })
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn entry(e: &EntryFile) -> Result<Entry, EntryError> {
    let filter = match &e.device_filter {
        None => vec![],
        Some(Filter::One(s)) if s.is_empty() => vec![],
        Some(Filter::One(s)) => vec![device_filter(s)?],
        Some(Filter::Many(list)) => list.iter().map(|s| device_filter(s)).collect::<Result<_, _>>()?,
    };
    let mut instances = BTreeMap::new();
    for (profile, count) in e.mig_devices.iter().flatten() {
        let count = u32::try_from(*count).map_err(|_| EntryError::Count { profile: profile.clone(), count: *count })?;
        if count > 0 {
            *instances.entry(profile_name(profile)?).or_insert(0) += count;
        }
    }
    match (e.mig_enabled, &e.mig_devices) {
        (true, None) => return Err(EntryError::DevicesRequired),
        (true, Some(m)) if !m.is_empty() && instances.is_empty() => return Err(EntryError::AllZero),
        (false, Some(m)) if !m.is_empty() => return Err(EntryError::DevicesWhenOff),
        _ => {}
    }
    Ok(Entry { devices: e.devices.0.clone(), filter, mig_enabled: e.mig_enabled, instances })
}

/// `0x233010DE` or `0x233010DE:0x16C110DE` (mig-parted's DeviceID form).
fn device_filter(s: &str) -> Result<DeviceFilter, EntryError> {
    let hex = |part: &str| {
        let digits = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")).unwrap_or(part);
        u32::from_str_radix(digits, 16).map_err(|_| EntryError::DeviceFilter { filter: s.into(), part: part.into() })
    };
    match s.split_once(':') {
        None => Ok(DeviceFilter { device: hex(s)?, subsystem: None }),
        Some((d, sub)) => Ok(DeviceFilter { device: hex(d)?, subsystem: Some(hex(sub)?) }),
    }
}

/// Checks a mig-devices key and gives NVIDIA's GPU-instance profile name.
fn profile_name(key: &str) -> Result<String, EntryError> {
    let gi = match key.split_once('.') {
        Some((c, rest)) if c.ends_with('c') => {
            let cs = c.trim_end_matches('c');
            let gs = rest.split_once('g').map(|(g, _)| g).unwrap_or_default();
            if cs != gs {
                return Err(EntryError::ComputeInstance { key: key.into(), gi: rest.into() });
            }
            rest
        }
        _ => key,
    };
    gi.parse::<MigProfileName>().map(|p| p.to_string()).map_err(|why| EntryError::Profile { key: key.into(), why })
}

/// Reads and parses a mig-parted file. As root the file must be root's and
/// writable by root alone: it decides what root does to the GPUs.
pub fn load(path: &Path, name: &str) -> Result<Baseline, PartedError> {
    let text = read_checked(path)?;
    parse(&text, &path.display().to_string(), name)
}

/// The file's text after the ownership and size checks.
pub fn read_checked(path: &Path) -> Result<String, PartedError> {
    use std::os::unix::fs::MetadataExt;
    let file = || path.display().to_string();
    let meta = std::fs::metadata(path).map_err(|source| PartedError::Read { file: file(), source })?;
    if !meta.is_file() {
        return Err(PartedError::NotAFile { file: file() });
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(PartedError::TooLarge { file: file(), bytes: meta.len() });
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 && (meta.uid() != 0 || meta.mode() & 0o022 != 0) {
        return Err(PartedError::Unsafe { file: file(), uid: meta.uid(), mode: meta.mode() & 0o7777 });
    }
    std::fs::read_to_string(path).map_err(|source| PartedError::Read { file: file(), source })
}

/// One GPU as `export` writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportGpu {
    pub index: u32,
    pub mig_enabled: bool,
    pub instances: BTreeMap<String, u32>,
    /// `name@start` per instance, for the comment line.
    pub placements: Vec<String>,
}

impl ExportGpu {
    /// From what NVML reports; profile names from the GPU's table.
    pub fn new(index: u32, mig_enabled: bool, instances: &[MigInstance], profiles: &[crate::gpu::MigProfile]) -> ExportGpu {
        let mut counts = BTreeMap::new();
        let mut placements = Vec::new();
        let mut sorted: Vec<&MigInstance> = instances.iter().collect();
        sorted.sort_by_key(|i| i.placement_start);
        for i in sorted {
            let name = super::profile_name(profiles, i.profile_id);
            placements.push(format!("{name}@{}", i.placement_start));
            *counts.entry(name).or_insert(0) += 1;
        }
        ExportGpu { index, mig_enabled, instances: counts, placements }
    }
}

/// The GPUs' current layout as a mig-parted file with one config, `name`.
/// GPUs with the same mode and profiles share an entry; `devices: all` when
/// one entry covers every GPU given (pass MIG-capable GPUs only: mig-parted
/// skips the others under `all`). Placements go in comments.
pub fn export(name: &str, gpus: &[ExportGpu], total_gpus: usize) -> String {
    let mut groups: Vec<(bool, &BTreeMap<String, u32>, Vec<&ExportGpu>)> = Vec::new();
    for g in gpus {
        match groups.iter_mut().find(|(m, i, _)| *m == g.mig_enabled && *i == &g.instances) {
            Some(group) => group.2.push(g),
            None => groups.push((g.mig_enabled, &g.instances, vec![g])),
        }
    }
    let mut s = header(name);
    if groups.is_empty() {
        s.push_str("    []\n");
    }
    for (enabled, instances, members) in &groups {
        for g in members {
            let _ = writeln!(s, "    # GPU {}: {}", g.index, if g.placements.is_empty() { "no instances".into() } else { g.placements.join(" ") });
        }
        let devices = if groups.len() == 1 && members.len() == total_gpus {
            Devices::All
        } else {
            Devices::Indices(members.iter().map(|g| g.index).collect())
        };
        write_entry(&mut s, &Entry { devices, filter: vec![], mig_enabled: *enabled, instances: (*instances).clone() });
    }
    s
}

/// A baseline as a mig-parted file with one config, `name`: the canonical
/// form, which [`parse`] reads back to the same entries (a property test
/// holds it to that).
pub fn write(name: &str, baseline: &Baseline) -> String {
    let mut s = header(name);
    if baseline.entries.is_empty() {
        s.push_str("    []\n");
    }
    for e in &baseline.entries {
        write_entry(&mut s, e);
    }
    s
}

fn header(name: &str) -> String {
    format!("version: v1\nmig-configs:\n  {}:\n", quote_key(name))
}

fn write_entry(s: &mut String, e: &Entry) {
    let devices = match &e.devices {
        Devices::All => "all".to_string(),
        Devices::Indices(list) => format!("[{}]", list.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")),
    };
    let _ = writeln!(s, "    - devices: {devices}");
    if !e.filter.is_empty() {
        let ids: Vec<String> = e
            .filter
            .iter()
            .map(|f| match f.subsystem {
                None => format!("\"0x{:08X}\"", f.device),
                Some(sub) => format!("\"0x{:08X}:0x{sub:08X}\"", f.device),
            })
            .collect();
        let _ = writeln!(s, "      device-filter: [{}]", ids.join(", "));
    }
    let _ = writeln!(s, "      mig-enabled: {}", e.mig_enabled);
    if e.mig_enabled {
        s.push_str(if e.instances.is_empty() { "      mig-devices: {}\n" } else { "      mig-devices:\n" });
        for (p, n) in &e.instances {
            let _ = writeln!(s, "        {}: {n}", yaml_quoted(p));
        }
    }
}

/// Config names are plain in practice; anything else is double-quoted.
fn quote_key(name: &str) -> String {
    if !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
        name.to_string()
    } else {
        yaml_quoted(name)
    }
}

/// A YAML double-quoted scalar. Not Rust's `{:?}`: its `\u{1b}` is no YAML
/// escape, so an exported name with a control character did not read back
/// (found by tests/mig_parted_properties.rs). Line and paragraph separators
/// and byte-order marks are escaped too: YAML folds or drops them.
fn yaml_quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}' | '\u{feff}' | '\u{fffe}' | '\u{ffff}') => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_overlong_config_name_is_refused_naming_its_length() {
        let name = format!("a{}b", "\t".repeat(300));
        let text = format!("version: v1\nmig-configs:\n  \"{}\":\n    - devices: all\n      mig-enabled: false\n", name.replace('\t', "\\t"));
        let err = super::parse(&text, "/f", &name).unwrap_err().to_string();
        assert!(err.contains("has 302 characters; at most 128") && !err.contains('\n'), "{err}");
        // At the bound, a name of nothing but tabs reads back from its canonical form.
        let name = "\t".repeat(super::MAX_NAME_CHARS);
        let text = format!("version: v1\nmig-configs:\n  \"{}\":\n    - devices: all\n      mig-enabled: false\n", name.replace('\t', "\\t"));
        let b = super::parse(&text, "/f", &name).unwrap();
        assert_eq!(super::parse(&super::write(&name, &b), "/f", &name).unwrap(), b);
    }

    use super::*;

    fn fixture(name: &str) -> (String, String) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mig-parted").join(name);
        (std::fs::read_to_string(&path).unwrap(), path.display().to_string())
    }

    fn counts(e: &Entry) -> Vec<(String, u32)> {
        e.instances.iter().map(|(p, n)| (p.clone(), *n)).collect()
    }

    #[test]
    fn the_example_configs_parse_as_mig_parted_reads_them() {
        let (text, file) = fixture("examples.yaml");
        let names = config_names(&text, &file).unwrap();
        assert!(names.len() >= 8, "{names:?}");
        for n in &names {
            parse(&text, &file, n).unwrap_or_else(|e| panic!("{n}: {e}"));
        }
        let b = parse(&text, &file, "all-balanced").unwrap();
        assert_eq!(b.entries.len(), 1);
        assert_eq!(b.entries[0].devices, Devices::All);
        assert_eq!(counts(&b.entries[0]), [("1g.10gb".to_string(), 2), ("2g.20gb".into(), 1), ("3g.40gb".into(), 1)]);
        let d = parse(&text, &file, "all-disabled").unwrap();
        assert!(!d.entries[0].mig_enabled && d.entries[0].instances.is_empty());
        let e = parse(&text, &file, "all-enabled").unwrap();
        assert!(e.entries[0].mig_enabled && e.entries[0].instances.is_empty());
        let c = parse(&text, &file, "custom-config").unwrap();
        assert_eq!(c.entries[0].devices, Devices::Indices(vec![0, 1, 2, 3]));
        assert_eq!(c.entries[2].devices, Devices::Indices(vec![5]));
        assert_eq!(c.source, format!("mig-parted config \"custom-config\" in {file}"));
    }

    #[test]
    fn device_filters_and_compute_profiles_are_read() {
        let (text, file) = fixture("filters.yaml");
        let b = parse(&text, &file, "dgx-station-3g").unwrap();
        assert_eq!(b.entries[0].filter, vec![DeviceFilter { device: 0x20B2_10DE, subsystem: None }]);
        assert_eq!(b.entries[1].filter, vec![DeviceFilter { device: 0x1FB0_10DE, subsystem: None }]);
        let m = parse(&text, &file, "two-boards").unwrap();
        assert_eq!(m.entries[0].filter.len(), 2);
        assert_eq!(m.entries[0].filter[1].subsystem, Some(0x16C1_10DE));
        assert_eq!(counts(&m.entries[0]), [("2g.20gb".to_string(), 3)], "2c.2g.20gb is the 2g.20gb GPU instance");
        let y = parse(&text, &file, "yes-no").unwrap();
        assert!(y.entries[0].mig_enabled, "YAML 1.1 booleans, as mig-parted's YAML reader takes them");
    }

    #[test]
    fn bad_files_name_file_config_entry_and_problem() {
        let (text, file) = fixture("invalid.yaml");
        let cases = [
            ("no-mig-devices", "entry 1: mig-devices is required when mig-enabled is true"),
            ("devices-when-disabled", "entry 1: mig-devices are listed but mig-enabled is false"),
            ("negative-count", "entry 1: mig-devices: count -2 of \"1g.10gb\""),
            ("all-zero", "entry 2: mig-devices: all counts are 0"),
            ("bad-profile", "mig-devices: \"1g.10\": profile \"1g.10\""),
            ("compute-profile", "\"1c.3g.40gb\": compute-instance profiles are not supported"),
            ("bad-filter", "device-filter \"H100\": \"H100\" is not a hex PCI id"),
            ("empty", "\"empty\" in"),
            ("nope", "no config named \"nope\" (configs: "),
        ];
        for (name, needle) in cases {
            let err = parse(&text, &file, name).expect_err(name).to_string();
            assert!(err.contains(needle), "{name}: {err}");
            assert!(err.contains(&file), "{name}: the message names the file: {err}");
            assert!(!err.contains('\n'), "{name}: one line: {err}");
        }
        // Text from the file with line breaks or control characters in it
        // is escaped: one line whatever the file holds.
        let multi = "version: v1\nmig-configs:\n  a:\n    - devices: all\n      device-filter: \"0x\\r\\nzz\\u0007\"\n      mig-enabled: false\n";
        let err = parse(multi, "m.yaml", "a").unwrap_err().to_string();
        assert!(err.contains("device-filter \"0x\\r\\nzz\\u{7}\"") && !err.contains('\n'), "{err}");
        let name = "a\nb";
        let err = parse("version: v1\nmig-configs:\n  \"a\\nb\": []\n", "m.yaml", name).unwrap_err().to_string();
        assert!(err.starts_with("mig-parted config \"a\\nb\" in m.yaml: at least one entry"), "{err}");
        let shapes = [
            ("bad-devices.yaml", "devices: \"some\" is not `all` or a list of GPU indices"),
            ("negative-index.yaml", "devices: -1 is not a GPU index"),
            ("typo-key.yaml", "unknown field `mig-device`"),
            ("missing-enabled.yaml", "missing field `mig-enabled`"),
            ("version-2.yaml", "unknown version \"v2\""),
            ("duplicate-key.yaml", "uplicate"),
        ];
        for (f, needle) in shapes {
            let (text, file) = fixture(&format!("invalid-shape/{f}"));
            let err = parse(&text, &file, "a").expect_err(f).to_string();
            assert!(err.contains(needle) && err.starts_with(&format!("mig-parted config {file}")), "{f}: {err}");
        }
        for (text, needle) in [("mig-configs:\n  a: []\n", "missing field `version`"), (": : :\n\t- [", "bad.yaml"), ("version: v1\nextra: 1\nmig-configs: {}\n", "unknown field `extra`")] {
            let err = parse(text, "bad.yaml", "a").expect_err(text).to_string();
            assert!(err.contains(needle) && err.starts_with("mig-parted config bad.yaml"), "{text:?}: {err}");
        }
    }

    /// Each refusal is its own kind, and says what it said as a string.
    #[test]
    fn refusals_are_told_apart_by_kind() {
        let one = |body: &str| format!("version: v1\nmig-configs:\n  a:\n    - devices: all\n{body}");
        let entry = |problem: EntryError| move |e: &PartedError| matches!(e, PartedError::Entry { entry: 1, problem: p, .. } if *p == problem);
        type Case = (String, &'static str, Box<dyn Fn(&PartedError) -> bool>, &'static str);
        let cases: Vec<Case> = vec![
            (": : :\n\t- [".into(), "a", Box::new(|e| matches!(e, PartedError::Syntax { .. })), "mig-parted config m.yaml: "),
            ("version: v2\nmig-configs: {}\n".into(), "a", Box::new(|e| matches!(e, PartedError::Version { version, .. } if version == "v2")), "mig-parted config m.yaml: unknown version \"v2\" (only v1 exists)"),
            (one("      mig-enabled: false\n"), "b\u{1b}", Box::new(|e| matches!(e, PartedError::UnknownConfig { name, .. } if name == "b\u{1b}")), "mig-parted config m.yaml: no config named \"b\\u{1b}\" (configs: a)"),
            ("version: v1\nmig-configs:\n  a: []\n".into(), "a", Box::new(|e| matches!(e, PartedError::NoEntries { .. })), "mig-parted config \"a\" in m.yaml: at least one entry is required"),
            (one("      mig-enabled: true\n"), "a", Box::new(entry(EntryError::DevicesRequired)), "mig-parted config \"a\" in m.yaml, entry 1: mig-devices is required when mig-enabled is true (write `mig-devices: {}` for none)"),
            (one("      mig-enabled: true\n      mig-devices: {\"1g.10gb\": 0}\n"), "a", Box::new(entry(EntryError::AllZero)), "mig-parted config \"a\" in m.yaml, entry 1: mig-devices: all counts are 0"),
            (one("      mig-enabled: false\n      mig-devices: {\"1g.10gb\": 1}\n"), "a", Box::new(entry(EntryError::DevicesWhenOff)), "mig-parted config \"a\" in m.yaml, entry 1: mig-devices are listed but mig-enabled is false"),
            (
                one("      mig-enabled: true\n      mig-devices: {\"1g.10gb\": -2}\n"),
                "a",
                Box::new(entry(EntryError::Count { profile: "1g.10gb".into(), count: -2 })),
                "mig-parted config \"a\" in m.yaml, entry 1: mig-devices: count -2 of \"1g.10gb\" is not a number of instances",
            ),
            (
                one("      device-filter: \"0x233010DE:zz\"\n      mig-enabled: false\n"),
                "a",
                Box::new(entry(EntryError::DeviceFilter { filter: "0x233010DE:zz".into(), part: "zz".into() })),
                "mig-parted config \"a\" in m.yaml, entry 1: device-filter \"0x233010DE:zz\": \"zz\" is not a hex PCI id such as 0x233010DE",
            ),
            (
                one("      mig-enabled: true\n      mig-devices: {\"1c.3g.40gb\": 1}\n"),
                "a",
                Box::new(entry(EntryError::ComputeInstance { key: "1c.3g.40gb".into(), gi: "3g.40gb".into() })),
                "mig-parted config \"a\" in m.yaml, entry 1: mig-devices: \"1c.3g.40gb\": compute-instance profiles are not supported: slurm-gpu-mode makes one compute instance spanning each GPU instance (write \"3g.40gb\")",
            ),
            (
                one("      mig-enabled: true\n      mig-devices: {\"1g.10\": 1}\n"),
                "a",
                Box::new(|e| matches!(e, PartedError::Entry { problem: EntryError::Profile { key, .. }, .. } if key == "1g.10")),
                "mig-parted config \"a\" in m.yaml, entry 1: mig-devices: \"1g.10\": profile \"1g.10\"",
            ),
        ];
        for (text, name, kind, said) in cases {
            let err = parse(&text, "m.yaml", name).unwrap_err();
            assert!(kind(&err), "{text}: {err:?}");
            assert!(err.to_string().starts_with(said), "{text}: {err}");
        }
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("m.yaml");
        let err = read_checked(&missing).unwrap_err();
        assert!(matches!(&err, PartedError::Read { source, .. } if source.kind() == std::io::ErrorKind::NotFound), "{err:?}");
        assert_eq!(err.to_string(), format!("cannot read mig-parted config {}: No such file or directory (os error 2)", missing.display()));
        let err = load(dir.path(), "a").unwrap_err();
        assert!(matches!(err, PartedError::NotAFile { .. }), "{err:?}");
        assert_eq!(err.to_string(), format!("mig-parted config {} is not a regular file", dir.path().display()));
        let big = dir.path().join("big.yaml");
        std::fs::write(&big, vec![b'#'; MAX_FILE_BYTES as usize + 1]).unwrap();
        let err = read_checked(&big).unwrap_err();
        assert!(matches!(err, PartedError::TooLarge { bytes: 1_048_577, .. }), "{err:?}");
        assert_eq!(err.to_string(), format!("mig-parted config {} is 1048577 bytes, more than the 1048576 accepted", big.display()));
        let unsafe_file = PartedError::Unsafe { file: "/etc/m.yaml".into(), uid: 1000, mode: 0o664 };
        assert_eq!(unsafe_file.to_string(), "mig-parted config /etc/m.yaml is owned by uid 1000 with mode 664: it decides what root does to the GPUs, so only root may write it");
    }

    #[test]
    fn an_export_reads_back_as_the_same_baseline() {
        let p = crate::mig::placement::tests::h100();
        let mk = |gi, id, start| MigInstance { gpu_instance: gi, profile_id: id, placement_start: start, placement_size: 1, compute_instances: vec![] };
        let gpus = vec![
            ExportGpu::new(0, true, &[mk(1, 9, 4), mk(2, 14, 0), mk(3, 14, 2)], &p),
            ExportGpu::new(1, true, &[mk(1, 14, 2), mk(2, 9, 4), mk(3, 14, 0)], &p),
            ExportGpu::new(2, false, &[], &p),
        ];
        let text = export("current", &gpus, 3);
        assert!(text.contains("# GPU 0: 2g.20gb@0 2g.20gb@2 3g.40gb@4"), "{text}");
        let b = parse(&text, "export", "current").unwrap();
        assert_eq!(b.entries.len(), 2);
        assert_eq!(b.entries[0].devices, Devices::Indices(vec![0, 1]));
        assert_eq!(counts(&b.entries[0]), [("2g.20gb".to_string(), 2), ("3g.40gb".into(), 1)]);
        assert_eq!((b.entries[1].devices.clone(), b.entries[1].mig_enabled), (Devices::Indices(vec![2]), false));
        let same = export("current", &gpus[..2], 2);
        assert!(same.contains("- devices: all"), "{same}");
        let empty_mig = export("x y", &[ExportGpu::new(0, true, &[], &p)], 1);
        assert!(empty_mig.contains("\"x y\":") && empty_mig.contains("mig-devices: {}"), "{empty_mig}");
        assert!(parse(&empty_mig, "e", "x y").is_ok());
        // Names Rust's {:?} escapes (a control character, an unprintable
        // letter) were written as `\u{1b}`, which YAML cannot read.
        for name in ["a\u{1b}b", "\u{1171f}", "tab\there \"q\" \\", "line\u{2028}sep"] {
            let text = export(name, &gpus[..1], 1);
            assert_eq!(config_names(&text, "e").unwrap(), [name], "{text}");
        }
    }
}
