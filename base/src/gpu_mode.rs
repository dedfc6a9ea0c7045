//! The `--gpu-mode` option grammar: one value per job, parsed once into a typed
//! [`GpuMode`]. The SPANK plugin (at submit), the prolog and the epilog all call
//! [`GpuMode::parse`], so they can never disagree about what a value means.
//!
//! ```text
//! mps
//! mps:threads=<1-100>[,mem=<N>M|<N>G]      (keys in any order, each at most once)
//! mig:<profile>[x<count>][,<profile>[x<count>]...]   count 1-7
//! mig:@<layout>                             a layout named in the site config
//! checkpoint[:nccl=portable|native][,pool=on|off]   (keys in any order, each at most once)
//! ```
//!
//! A profile is NVIDIA's name, `<slices>g.<memory>gb` with an optional suffix
//! (`+me`, `+me.all`, `-me`, `+gfx`): `1g.10gb`, `1g.10gb+me`, `3g.40gb`,
//! `1g.18gb` (H200). Whether a node's GPU offers the profile is checked again in
//! the prolog, where the GPU is known.

use std::fmt;
use std::str::FromStr;

/// Longest value accepted, in bytes. Keeps error messages, environment
/// variables and log lines bounded whatever a user types.
pub const MAX_VALUE_LEN: usize = 256;
/// MPS active thread percentage bounds.
pub const THREADS_RANGE: std::ops::RangeInclusive<u8> = 1..=100;
/// MIG instances of one profile per request.
pub const MIG_COUNT_RANGE: std::ops::RangeInclusive<u8> = 1..=7;
/// Largest MPS pinned-memory limit accepted, in MiB (1 TiB: above any GPU sold).
pub const MAX_MEM_MIB: u64 = 1024 * 1024;
/// Longest MIG layout name.
pub const MAX_LAYOUT_NAME: usize = 64;

/// The valid forms, shown with every parse error.
pub const VALID_FORMS: &str = "valid forms: mps | mps:threads=<1-100>,mem=<N>M|<N>G | \
mig:<profile>[x<1-7>][,<profile>[x<1-7>]...] (e.g. mig:1g.10gbx2,3g.40gb) | mig:@<layout> | \
checkpoint[:nccl=portable|native][,pool=on|off]";

/// A job's requested GPU mode.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum GpuMode {
    Mps(MpsParams),
    Mig(MigRequest),
    Checkpoint(CheckpointParams),
}

/// Parameters of `checkpoint:`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct CheckpointParams {
    /// `nccl=`: how the job's NCCL ranks talk; `None` leaves it to the
    /// site (`preempt.nccl_portable`).
    pub nccl: Option<NcclTransport>,
    /// `pool=`: whether the job gets a host memory pool for the driver's
    /// checkpoint buffer (issue 39); `None` leaves it to the site
    /// (`preempt.host_pool`).
    pub pool: Option<bool>,
}

/// The NCCL transports a checkpoint job's ranks may use (docs/preempt.md,
/// "NCCL by driver branch").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NcclTransport {
    /// NCCL's own choice (CUDA IPC, NVLink SHARP, ...): the r580 driver
    /// checkpoints such ranks but cannot restore them, so they are refused
    /// at checkpoint time there.
    Native,
    /// Only transports the r580 driver can bring back (gpu-mode-run sets
    /// NCCL's variables): slower, but checkpointable.
    Portable,
}

impl NcclTransport {
    /// The value as `nccl=` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            NcclTransport::Native => "native",
            NcclTransport::Portable => "portable",
        }
    }
}

impl FromStr for NcclTransport {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "portable" => Ok(NcclTransport::Portable),
            "native" => Ok(NcclTransport::Native),
            "" => Err("nccl= has no value (nccl=portable or nccl=native)".into()),
            other => Err(format!("nccl={other} is not a transport (nccl=portable or nccl=native)")),
        }
    }
}

/// Parses a `pool=` value: `on` or `off`.
fn parse_pool(val: &str) -> Result<bool, String> {
    match val {
        "on" => Ok(true),
        "off" => Ok(false),
        "" => Err("pool= has no value (pool=on or pool=off)".into()),
        other => Err(format!("pool={other} is not a setting (pool=on or pool=off)")),
    }
}

/// Parameters of `mps:`; `None` leaves the MPS default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct MpsParams {
    /// `set_default_active_thread_percentage`.
    pub threads: Option<u8>,
    /// `set_default_device_pinned_mem_limit`, per device.
    pub mem: Option<MemLimit>,
}

/// A memory size as MPS takes it: a number with an M or G suffix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MemLimit {
    pub amount: u64,
    pub unit: MemUnit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemUnit {
    MiB,
    GiB,
}

impl MemLimit {
    /// The size in MiB; `None` when it does not fit in 64 bits (checked:
    /// an unchecked multiply wrapped `mps:mem=18014398509481984G` into range
    /// in release builds and panicked in debug ones, audit item M2).
    pub fn mebibytes(self) -> Option<u64> {
        match self.unit {
            MemUnit::MiB => Some(self.amount),
            MemUnit::GiB => self.amount.checked_mul(1024),
        }
    }
}

impl fmt::Display for MemLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let suffix = match self.unit {
            MemUnit::MiB => 'M',
            MemUnit::GiB => 'G',
        };
        write!(f, "{}{}", self.amount, suffix)
    }
}

/// What `mig:` asks for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum MigRequest {
    /// Explicit profiles with counts, in the order given.
    Profiles(Vec<MigProfileCount>),
    /// `@name`: a layout from the site config.
    Layout(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MigProfileCount {
    pub profile: MigProfileName,
    pub count: u8,
}

/// A syntactically valid MIG profile name such as `1g.10gb+me`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MigProfileName {
    /// Compute slices (the `<n>g` part).
    pub slices: u8,
    /// Memory in GB as NVIDIA names it (the `<m>gb` part).
    pub memory_gb: u32,
    /// Suffix after the memory part, e.g. `+me`; empty when none.
    pub suffix: String,
}

/// Suffixes NVIDIA uses on MIG profile names.
const PROFILE_SUFFIXES: &[&str] = &["", "+me", "+me.all", "-me", "+gfx"];
/// Slice counts NVIDIA GPUs offer (1g, 2g, 3g, 4g, 7g).
const PROFILE_SLICES: &[u8] = &[1, 2, 3, 4, 7];

impl fmt::Display for MigProfileName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}g.{}gb{}", self.slices, self.memory_gb, self.suffix)
    }
}

impl FromStr for MigProfileName {
    type Err = String;

    /// Parses `<slices>g.<memory>gb[suffix]`; the error says what is wrong.
    fn from_str(s: &str) -> Result<Self, String> {
        let (slices, rest) = s
            .split_once("g.")
            .ok_or_else(|| format!("profile \"{s}\" is not of the form <n>g.<m>gb, e.g. 1g.10gb"))?;
        let slices: u8 = parse_digits(slices)
            .ok_or_else(|| format!("profile \"{s}\": \"{slices}\" is not a slice count"))?;
        if !PROFILE_SLICES.contains(&slices) {
            return Err(format!("profile \"{s}\": {slices}g is not a MIG slice count (1g, 2g, 3g, 4g or 7g)"));
        }
        let gb_end = rest
            .find("gb")
            .ok_or_else(|| format!("profile \"{s}\" is not of the form <n>g.<m>gb, e.g. 1g.10gb"))?;
        let memory_gb: u32 = parse_digits(&rest[..gb_end])
            .filter(|m| *m > 0)
            .ok_or_else(|| format!("profile \"{s}\": \"{}\" is not a memory size in GB", &rest[..gb_end]))?;
        let suffix = &rest[gb_end + 2..];
        if !PROFILE_SUFFIXES.contains(&suffix) {
            return Err(format!(
                "profile \"{s}\": unknown suffix \"{suffix}\" (known: +me, +me.all, -me, +gfx)"
            ));
        }
        Ok(MigProfileName { slices, memory_gb, suffix: suffix.to_string() })
    }
}

/// A value that is not a valid `--gpu-mode`. Display gives one line that names
/// the offending part and lists the valid forms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid --gpu-mode value {shown}: {problem}; {VALID_FORMS}")]
pub struct ModeError {
    /// The value as shown to the user (quoted, truncated, escaped).
    shown: String,
    /// What is wrong, naming the offending part.
    pub problem: String,
}

impl ModeError {
    fn new(value: &str, problem: impl Into<String>) -> Self {
        ModeError { shown: show_value(value), problem: problem.into() }
    }
}

/// Quotes a user value for an error message: escaped, at most 64 characters, so
/// a hostile value cannot forge log lines or flood the terminal.
fn show_value(value: &str) -> String {
    let mut shown: String = value.chars().take(64).flat_map(char::escape_default).collect();
    if value.chars().count() > 64 {
        shown.push_str("...");
    }
    format!("\"{shown}\"")
}

/// Parses a string of ASCII digits (no sign, no spaces) without overflow.
fn parse_digits<T: FromStr>(s: &str) -> Option<T> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

impl GpuMode {
    /// Parses a `--gpu-mode` value. See the module docs for the grammar.
    pub fn parse(value: &str) -> Result<GpuMode, ModeError> {
        let err = |problem: String| ModeError::new(value, problem);
        if value.is_empty() {
            return Err(err("the value is empty".into()));
        }
        if value.len() > MAX_VALUE_LEN {
            return Err(err(format!("the value is {} bytes long, the limit is {MAX_VALUE_LEN}", value.len())));
        }
        if let Some(c) = value.chars().find(|c| !c.is_ascii()) {
            return Err(err(format!("non-ASCII character {:?}", c)));
        }
        if let Some(c) = value.chars().find(|c| c.is_ascii_control() || *c == ' ') {
            return Err(err(format!("whitespace or control character {:?}", c)));
        }
        let (mode, params) = match value.split_once(':') {
            Some((m, p)) => (m, Some(p)),
            None => (value, None),
        };
        match (mode, params) {
            ("mps", None) => Ok(GpuMode::Mps(MpsParams::default())),
            ("mps", Some(p)) => parse_mps_params(p).map(GpuMode::Mps).map_err(err),
            ("mig", None) => Err(err("mig needs profiles, e.g. mig:1g.10gb or mig:@<layout>".into())),
            ("mig", Some(p)) => parse_mig(p).map(GpuMode::Mig).map_err(err),
            ("checkpoint", None) => Ok(GpuMode::Checkpoint(CheckpointParams::default())),
            ("checkpoint", Some(p)) => parse_checkpoint_params(p).map(GpuMode::Checkpoint).map_err(err),
            (other, _) => Err(err(format!("unknown mode \"{other}\" (modes: mps, mig, checkpoint)"))),
        }
    }

    /// The mode's keyword: `mps`, `mig` or `checkpoint`.
    pub fn kind(&self) -> &'static str {
        match self {
            GpuMode::Mps(_) => "mps",
            GpuMode::Mig(_) => "mig",
            GpuMode::Checkpoint(_) => "checkpoint",
        }
    }
}

impl FromStr for GpuMode {
    type Err = ModeError;
    fn from_str(s: &str) -> Result<Self, ModeError> {
        GpuMode::parse(s)
    }
}

/// Canonical form: parsing it gives the same value back.
impl fmt::Display for GpuMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuMode::Mps(p) => {
                f.write_str("mps")?;
                let mut sep = ':';
                if let Some(t) = p.threads {
                    write!(f, "{sep}threads={t}")?;
                    sep = ',';
                }
                if let Some(m) = p.mem {
                    write!(f, "{sep}mem={m}")?;
                }
                Ok(())
            }
            GpuMode::Mig(MigRequest::Layout(name)) => write!(f, "mig:@{name}"),
            GpuMode::Mig(MigRequest::Profiles(list)) => {
                f.write_str("mig:")?;
                for (i, pc) in list.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{}", pc.profile)?;
                    if pc.count != 1 {
                        write!(f, "x{}", pc.count)?;
                    }
                }
                Ok(())
            }
            GpuMode::Checkpoint(p) => {
                f.write_str("checkpoint")?;
                let mut sep = ':';
                if let Some(nccl) = p.nccl {
                    write!(f, "{sep}nccl={}", nccl.as_str())?;
                    sep = ',';
                }
                if let Some(pool) = p.pool {
                    write!(f, "{sep}pool={}", if pool { "on" } else { "off" })?;
                }
                Ok(())
            }
        }
    }
}

fn parse_mps_params(params: &str) -> Result<MpsParams, String> {
    if params.is_empty() {
        return Err("mps: has no parameters after the colon (keys: threads, mem)".into());
    }
    let mut out = MpsParams::default();
    for item in params.split(',') {
        if item.is_empty() {
            return Err(format!("empty parameter in \"mps:{params}\" (stray comma?)"));
        }
        let (key, val) = item
            .split_once('=')
            .ok_or_else(|| format!("parameter \"{item}\" is not key=value (keys: threads, mem)"))?;
        match key {
            "threads" => {
                if out.threads.is_some() {
                    return Err("key \"threads\" is given twice".into());
                }
                let t: u8 = parse_digits::<u32>(val)
                    .filter(|t| *t <= u8::MAX as u32)
                    .map(|t| t as u8)
                    .filter(|t| THREADS_RANGE.contains(t))
                    .ok_or_else(|| format!("threads={val} is out of range: a percentage 1-100"))?;
                out.threads = Some(t);
            }
            "mem" => {
                if out.mem.is_some() {
                    return Err("key \"mem\" is given twice".into());
                }
                out.mem = Some(parse_mem(val)?);
            }
            other => return Err(format!("unknown mps key \"{other}\" (keys: threads, mem)")),
        }
    }
    Ok(out)
}

fn parse_checkpoint_params(params: &str) -> Result<CheckpointParams, String> {
    if params.is_empty() {
        return Err("checkpoint: has no parameters after the colon (keys: nccl, pool)".into());
    }
    let mut out = CheckpointParams::default();
    for item in params.split(',') {
        if item.is_empty() {
            return Err(format!("empty parameter in \"checkpoint:{params}\" (stray comma?)"));
        }
        let (key, val) =
            item.split_once('=').ok_or_else(|| format!("parameter \"{item}\" is not key=value (keys: nccl, pool)"))?;
        match key {
            "nccl" if out.nccl.is_some() => return Err("key \"nccl\" is given twice".into()),
            "nccl" => out.nccl = Some(val.parse()?),
            "pool" if out.pool.is_some() => return Err("key \"pool\" is given twice".into()),
            "pool" => out.pool = Some(parse_pool(val)?),
            other => return Err(format!("unknown checkpoint key \"{other}\" (keys: nccl, pool)")),
        }
    }
    Ok(out)
}

fn parse_mem(val: &str) -> Result<MemLimit, String> {
    let bad = || format!("mem={val} is not a size such as 512M or 20G (1M to 1024G)");
    let unit = match val.as_bytes().last() {
        Some(b'M') => MemUnit::MiB,
        Some(b'G') => MemUnit::GiB,
        _ => return Err(bad()),
    };
    let amount: u64 = parse_digits(&val[..val.len() - 1]).ok_or_else(bad)?;
    let limit = MemLimit { amount, unit };
    if amount == 0 || !matches!(limit.mebibytes(), Some(m) if m <= MAX_MEM_MIB) {
        return Err(bad());
    }
    Ok(limit)
}

fn parse_mig(params: &str) -> Result<MigRequest, String> {
    if let Some(name) = params.strip_prefix('@') {
        return parse_layout_name(name).map(MigRequest::Layout);
    }
    if params.is_empty() {
        return Err("mig: has no profiles after the colon".into());
    }
    let mut list: Vec<MigProfileCount> = Vec::new();
    for item in params.split(',') {
        if item.is_empty() {
            return Err(format!("empty profile in \"mig:{params}\" (stray comma?)"));
        }
        let pc = parse_profile_count(item)?;
        if list.iter().any(|p| p.profile == pc.profile) {
            return Err(format!(
                "profile {} is given twice (write it once with a count, e.g. {}x2)",
                pc.profile, pc.profile
            ));
        }
        list.push(pc);
    }
    Ok(MigRequest::Profiles(list))
}

/// `<profile>[x<count>]`. The count separator is the last `x`: profile names
/// contain no `x`, so `1g.10gbx2` splits unambiguously.
fn parse_profile_count(item: &str) -> Result<MigProfileCount, String> {
    // "+gfx" ends in an x that is part of the name, not a count separator.
    let split = if item.ends_with("+gfx") { None } else { item.rsplit_once('x') };
    let (profile, count) = match split {
        Some((p, c)) => {
            if c.is_empty() || !c.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!("count \"{c}\" in \"{item}\" is not a number 1-7"));
            }
            // All digits: anything too big for u64 is simply out of range.
            let count: u64 = c.parse().unwrap_or(u64::MAX);
            if count == 0 || count > *MIG_COUNT_RANGE.end() as u64 {
                return Err(format!("count {count} in \"{item}\" is out of range: 1-7"));
            }
            (p, count as u8)
        }
        None => (item, 1),
    };
    let profile: MigProfileName = profile.parse()?;
    Ok(MigProfileCount { profile, count })
}

fn parse_layout_name(name: &str) -> Result<String, String> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if name.is_empty() {
        return Err("mig:@ needs a layout name, e.g. mig:@half".into());
    }
    if name.len() > MAX_LAYOUT_NAME || !name.chars().all(ok_char) {
        return Err(format!(
            "layout name \"{name}\" must be 1-{MAX_LAYOUT_NAME} letters, digits, '_' or '-'"
        ));
    }
    Ok(name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mps(threads: Option<u8>, mem: Option<(u64, MemUnit)>) -> GpuMode {
        GpuMode::Mps(MpsParams { threads, mem: mem.map(|(amount, unit)| MemLimit { amount, unit }) })
    }

    fn mig(list: &[(&str, u8)]) -> GpuMode {
        GpuMode::Mig(MigRequest::Profiles(
            list.iter()
                .map(|(p, c)| MigProfileCount { profile: p.parse().unwrap(), count: *c })
                .collect(),
        ))
    }

    fn checkpoint(nccl: Option<NcclTransport>) -> GpuMode {
        checkpoint_pool(nccl, None)
    }

    fn checkpoint_pool(nccl: Option<NcclTransport>, pool: Option<bool>) -> GpuMode {
        GpuMode::Checkpoint(CheckpointParams { nccl, pool })
    }

    #[test]
    fn valid_values_parse_to_the_expected_mode() {
        let cases: Vec<(&str, GpuMode)> = vec![
            ("mps", mps(None, None)),
            ("mps:threads=25", mps(Some(25), None)),
            ("mps:threads=1", mps(Some(1), None)),
            ("mps:threads=100", mps(Some(100), None)),
            ("mps:mem=20G", mps(None, Some((20, MemUnit::GiB)))),
            ("mps:mem=512M", mps(None, Some((512, MemUnit::MiB)))),
            ("mps:mem=1024G", mps(None, Some((1024, MemUnit::GiB)))),
            ("mps:threads=50,mem=8G", mps(Some(50), Some((8, MemUnit::GiB)))),
            ("mps:mem=8G,threads=50", mps(Some(50), Some((8, MemUnit::GiB)))),
            ("mig:1g.10gb", mig(&[("1g.10gb", 1)])),
            ("mig:1g.10gbx7", mig(&[("1g.10gb", 7)])),
            ("mig:1g.10gb+me", mig(&[("1g.10gb+me", 1)])),
            ("mig:1g.10gb+mex1", mig(&[("1g.10gb+me", 1)])),
            ("mig:1g.18gbx4,2g.35gb", mig(&[("1g.18gb", 4), ("2g.35gb", 1)])),
            ("mig:3g.40gb,1g.10gbx2", mig(&[("3g.40gb", 1), ("1g.10gb", 2)])),
            ("mig:7g.80gb", mig(&[("7g.80gb", 1)])),
            ("mig:4g.40gb-me", mig(&[("4g.40gb-me", 1)])),
            ("mig:1g.23gb+gfx", mig(&[("1g.23gb+gfx", 1)])),
            ("mig:1g.23gb+gfxx3", mig(&[("1g.23gb+gfx", 3)])),
            ("mig:@half", GpuMode::Mig(MigRequest::Layout("half".into()))),
            ("mig:@a-b_9", GpuMode::Mig(MigRequest::Layout("a-b_9".into()))),
            ("checkpoint", checkpoint(None)),
            ("checkpoint:nccl=portable", checkpoint(Some(NcclTransport::Portable))),
            ("checkpoint:nccl=native", checkpoint(Some(NcclTransport::Native))),
            ("checkpoint:pool=on", checkpoint_pool(None, Some(true))),
            ("checkpoint:pool=off", checkpoint_pool(None, Some(false))),
            ("checkpoint:nccl=portable,pool=on", checkpoint_pool(Some(NcclTransport::Portable), Some(true))),
            ("checkpoint:pool=off,nccl=native", checkpoint_pool(Some(NcclTransport::Native), Some(false))),
        ];
        for (value, want) in cases {
            assert_eq!(GpuMode::parse(value).as_ref(), Ok(&want), "value {value:?}");
        }
    }

    #[test]
    fn bad_values_are_rejected_naming_the_offending_part() {
        let long = format!("mig:@{}", "a".repeat(300));
        let cases: Vec<(&str, &str)> = vec![
            // unknown mode, empty
            ("", "empty"),
            ("gpu", "unknown mode \"gpu\""),
            ("MPS", "unknown mode \"MPS\""),
            ("mpsx", "unknown mode \"mpsx\""),
            // bad profile syntax
            ("mig", "mig needs profiles"),
            ("mig:", "no profiles"),
            ("mig:10gb", "not of the form"),
            ("mig:1g10gb", "not of the form"),
            ("mig:5g.10gb", "5g is not a MIG slice count"),
            ("mig:1g.0gb", "not a memory size"),
            ("mig:1g.10", "not of the form"),
            ("mig:1g.10gb+foo", "unknown suffix \"+foo\""),
            ("mig:1g.10gb,,2g.20gb", "empty profile"),
            ("mig:1g.10gb,1g.10gbx2", "given twice"),
            // count 0 or above 7
            ("mig:1g.10gbx0", "count 0 in \"1g.10gbx0\" is out of range"),
            ("mig:1g.10gbx8", "count 8 in \"1g.10gbx8\" is out of range"),
            ("mig:1g.10gbx99999999999", "out of range"),
            ("mig:1g.10gbx", "count \"\""),
            ("mig:1g.10gbx-1", "count \"-1\""),
            // unknown or repeated key
            ("mps:foo=1", "unknown mps key \"foo\""),
            ("mps:threads=5,threads=6", "\"threads\" is given twice"),
            ("mps:mem=1G,mem=2G", "\"mem\" is given twice"),
            ("mps:threads", "not key=value"),
            ("mps:", "no parameters"),
            // out-of-range number
            ("mps:threads=0", "threads=0 is out of range"),
            ("mps:threads=101", "threads=101 is out of range"),
            ("mps:threads=256", "threads=256 is out of range"),
            ("mps:threads=-5", "threads=-5"),
            ("mps:mem=0G", "mem=0G"),
            ("mps:mem=2000G", "mem=2000G"),
            // 2^54 GiB is 2^64 MiB: wrapped to 0 MiB before the checked multiply.
            ("mps:mem=18014398509481984G", "mem=18014398509481984G"),
            ("mps:mem=18014398509481985G", "mem=18014398509481985G"),
            ("mps:mem=99999999999999999999G", "mem=99999999999999999999G"),
            ("mps:mem=20", "mem=20 "),
            ("mps:mem=20g", "mem=20g"),
            ("mps:mem=G", "mem=G"),
            // trailing junk
            ("mps:threads=25,", "empty parameter"),
            ("mps:threads=25x", "threads=25x"),
            ("checkpoint:now", "parameter \"now\" is not key=value (keys: nccl, pool)"),
            ("checkpoint:", "checkpoint: has no parameters"),
            ("checkpoint:nccl=fast", "nccl=fast is not a transport (nccl=portable or nccl=native)"),
            ("checkpoint:nccl=", "nccl= has no value"),
            ("checkpoint:nccl=Portable", "nccl=Portable is not a transport"),
            ("checkpoint:nccl=portable,nccl=portable", "key \"nccl\" is given twice"),
            ("checkpoint:nccl=portable,nccl=native", "key \"nccl\" is given twice"),
            ("checkpoint:nccl=portable,", "empty parameter"),
            ("checkpoint:pool=yes", "pool=yes is not a setting (pool=on or pool=off)"),
            ("checkpoint:pool=maybe", "pool=maybe is not a setting"),
            ("checkpoint:pool=", "pool= has no value (pool=on or pool=off)"),
            ("checkpoint:pool=On", "pool=On is not a setting"),
            ("checkpoint:pool", "parameter \"pool\" is not key=value (keys: nccl, pool)"),
            ("checkpoint:pool=on,pool=on", "key \"pool\" is given twice"),
            ("checkpoint:pool=on,nccl=portable,pool=off", "key \"pool\" is given twice"),
            ("checkpoint:nccl=portable,pool=on,", "empty parameter"),
            ("checkpoint:p2p=off", "unknown checkpoint key \"p2p\" (keys: nccl, pool)"),
            ("checkpoint ", "whitespace"),
            ("mig:@half!", "layout name"),
            ("mig:@", "needs a layout name"),
            // non-ASCII, over 256 bytes
            ("mps:threads=２5", "non-ASCII"),
            ("mïg:1g.10gb", "non-ASCII"),
            (&long, "bytes long, the limit is 256"),
            ("mps\n", "control character"),
        ];
        for (value, needle) in cases {
            let err = GpuMode::parse(value).expect_err(value);
            let msg = err.to_string();
            assert!(msg.contains(needle), "value {value:?}: message {msg:?} lacks {needle:?}");
            assert!(msg.contains("valid forms: mps"), "value {value:?}: message lacks the valid forms");
            assert!(!msg.contains('\n'), "value {value:?}: message must be one line");
        }
    }

    #[test]
    fn display_is_canonical_and_round_trips() {
        for value in [
            "mps",
            "mps:threads=25",
            "mps:threads=25,mem=512M",
            "mig:1g.10gbx2,3g.40gb",
            "mig:1g.10gb+me",
            "mig:@half",
            "checkpoint",
            "checkpoint:nccl=portable",
            "checkpoint:nccl=native",
            "checkpoint:pool=on",
            "checkpoint:pool=off",
            "checkpoint:nccl=portable,pool=on",
            "checkpoint:nccl=native,pool=off",
        ] {
            let mode = GpuMode::parse(value).unwrap();
            assert_eq!(mode.to_string(), value);
            assert_eq!(GpuMode::parse(&mode.to_string()).unwrap(), mode);
        }
        // Key order and an explicit x1 are normalised.
        assert_eq!(GpuMode::parse("mps:mem=8G,threads=5").unwrap().to_string(), "mps:threads=5,mem=8G");
        assert_eq!(GpuMode::parse("mig:2g.20gbx1").unwrap().to_string(), "mig:2g.20gb");
        assert_eq!(
            GpuMode::parse("checkpoint:pool=on,nccl=portable").unwrap().to_string(),
            "checkpoint:nccl=portable,pool=on"
        );
    }

    #[test]
    fn error_messages_escape_and_truncate_the_value() {
        let err = GpuMode::parse(&"z".repeat(200)).unwrap_err().to_string();
        assert!(err.contains(&format!("\"{}...\"", "z".repeat(64))), "{err}");
        let err = GpuMode::parse("mps\u{1b}[2J").unwrap_err().to_string();
        assert!(!err.contains('\u{1b}'), "escape byte leaked: {err:?}");
    }

    #[test]
    fn mem_limit_converts_to_mebibytes() {
        assert_eq!(MemLimit { amount: 2, unit: MemUnit::GiB }.mebibytes(), Some(2048));
        assert_eq!(MemLimit { amount: 512, unit: MemUnit::MiB }.mebibytes(), Some(512));
        assert_eq!(MemLimit { amount: u64::MAX / 512, unit: MemUnit::GiB }.mebibytes(), None);
    }

    #[test]
    fn kind_names_the_mode() {
        assert_eq!(GpuMode::parse("mps:threads=5").unwrap().kind(), "mps");
        assert_eq!(GpuMode::parse("mig:@x").unwrap().kind(), "mig");
        assert_eq!(GpuMode::parse("checkpoint").unwrap().kind(), "checkpoint");
    }
}
