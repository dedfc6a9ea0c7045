//! The node's gres.conf, read for one question: which device is Slurm's GPU
//! index N?
//!
//! Slurm 22.05 puts `gres_device->index` into SLURM_JOB_GPUS (and, without
//! UniqueId=, CUDA_VISIBLE_DEVICES) of the Prolog and Epilog: the position of
//! the device in slurmd's GPU list (src/plugins/gres/common/gres_common.c).
//! That list is built from gres.conf's records that apply to the node: first
//! every `Name=` record, then every matching `NodeName=` record (the parser
//! collects the two kinds separately), each `File=` expanded as a hostlist.
//! With `AutoDetect=nvml` slurmd instead merges the records with what NVML
//! found and sorts them in PCI bus order, which is NVML's order.
//!
//! So [`read_gpu_order`] answers with the device minors in Slurm's index
//! order ([`GpuOrder::Files`]), or says that Slurm's indices are NVML's
//! ([`GpuOrder::Nvml`]) and why. Mapping minors to NVML devices is
//! `gpu::slurm_index`'s job.

use crate::hostlist;
use std::path::{Path, PathBuf};

/// One GPU device file of gres.conf, at its Slurm index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GresDevice {
    /// The path as gres.conf gives it, after hostlist expansion.
    pub file: String,
    /// N of `nvidiaN`: the device's minor number.
    pub minor: u32,
    /// gres.conf line the device comes from.
    pub line: usize,
}

/// How Slurm numbers this node's GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuOrder {
    /// Slurm's index `i` is `devices[i]`.
    Files { path: PathBuf, devices: Vec<GresDevice> },
    /// Slurm's indices are NVML's; `reason` says why we take them so.
    Nvml { reason: String },
}

#[derive(Debug, thiserror::Error)]
pub enum GresError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} line {line}: {problem}")]
    Invalid { path: PathBuf, line: usize, problem: String },
}

/// Reads the gres.conf at `path` for node `node` (SLURMD_NODENAME). A missing
/// file means slurmd had none either: no device files, NVML's order.
pub fn read_gpu_order(path: &Path, node: &str) -> Result<GpuOrder, GresError> {
    match std::fs::read_to_string(path) {
        Ok(text) => parse_gpu_order(&text, path, node),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Ok(GpuOrder::Nvml { reason: format!("no {}: Slurm knows no GPU device files", path.display()) })
        }
        Err(source) => Err(GresError::Read { path: path.to_path_buf(), source }),
    }
}

/// Parses gres.conf text; `path` is only used in messages and the result.
pub fn parse_gpu_order(text: &str, path: &Path, node: &str) -> Result<GpuOrder, GresError> {
    let conf = NodeConf::parse(text, node).map_err(|(line, problem)| GresError::Invalid {
        path: path.to_path_buf(),
        line,
        problem,
    })?;
    conf.order(path).map_err(|(line, problem)| GresError::Invalid { path: path.to_path_buf(), line, problem })
}

/// A problem and the line it is on.
type LineError = (usize, String);

/// What gres.conf says about this node's GPUs.
#[derive(Debug, Default)]
struct NodeConf {
    /// `AutoDetect=` on a line of its own, with its line.
    global_autodetect: Option<(String, usize)>,
    /// `AutoDetect=` on a `NodeName=` line for this node (wins over global).
    local_autodetect: Option<(String, usize)>,
    /// `Name=` records, then this node's `NodeName=` records: Slurm's order.
    name_records: Vec<Record>,
    node_records: Vec<Record>,
}

/// One `Name=gpu ...` record that applies to the node.
#[derive(Debug)]
struct Record {
    line: usize,
    name: String,
    file: Option<String>,
    multiple_files: bool,
}

/// Keys a gres.conf record may hold (Slurm 22.05's `_gres_options`), lower case.
const RECORD_KEYS: &[&str] =
    &["autodetect", "count", "cpus", "cores", "file", "files", "flags", "link", "links", "multiplefiles", "name", "type"];

impl NodeConf {
    fn parse(text: &str, node: &str) -> Result<NodeConf, LineError> {
        let mut conf = NodeConf::default();
        for (line, content) in logical_lines(text) {
            let pairs = key_values(&content).map_err(|p| (line, p))?;
            conf.add_line(line, pairs, node).map_err(|p| (line, p))?;
        }
        Ok(conf)
    }

    /// A line is top-level `AutoDetect=` settings, then at most one record
    /// started by `Name=` or `NodeName=` that takes the rest of the line.
    fn add_line(&mut self, line: usize, pairs: Vec<(String, String)>, node: &str) -> Result<(), String> {
        for (i, (key, value)) in pairs.iter().enumerate() {
            match key.as_str() {
                "autodetect" => self.global_autodetect = Some((value.clone(), line)),
                "name" | "nodename" => return self.add_record(line, &pairs[i..], node),
                _ => return Err(format!("unexpected key {key:?}: a line starts with NodeName=, Name= or AutoDetect=")),
            }
        }
        Ok(())
    }

    fn add_record(&mut self, line: usize, pairs: &[(String, String)], node: &str) -> Result<(), String> {
        let get = |k: &str| pairs.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
        if let Some((key, _)) = pairs.iter().skip(1).find(|(k, _)| !RECORD_KEYS.contains(&k.as_str())) {
            return Err(format!("unknown key {key:?}"));
        }
        let (first_key, first_value) = &pairs[0];
        let by_node = first_key == "nodename";
        if by_node && !node_matches(first_value, node)? {
            return Ok(());
        }
        if by_node {
            if let Some(value) = get("autodetect") {
                self.set_local_autodetect(value, line)?;
            }
        }
        // Slurm skips a record without a name (e.g. a NodeName= line that
        // only sets AutoDetect=).
        let Some(name) = get("name") else { return Ok(()) };
        let file = get("file").or_else(|| get("files"));
        let multiple_files = get("multiplefiles").is_some();
        if file.is_some() && multiple_files {
            return Err("File= and MultipleFiles= exclude each other".into());
        }
        let record = Record { line, name, file, multiple_files };
        if by_node {
            self.node_records.push(record);
        } else {
            self.name_records.push(record);
        }
        Ok(())
    }

    fn set_local_autodetect(&mut self, value: String, line: usize) -> Result<(), String> {
        if let Some((first, first_line)) = &self.local_autodetect {
            if autodetect_kind(first) != autodetect_kind(&value) {
                return Err(format!("AutoDetect={value} contradicts AutoDetect={first} of line {first_line} for this node"));
            }
        }
        self.local_autodetect = Some((value, line));
        Ok(())
    }

    /// The node's GPU order, from its AutoDetect setting and GPU records.
    fn order(self, path: &Path) -> Result<GpuOrder, LineError> {
        let autodetect = self.local_autodetect.clone().or_else(|| self.global_autodetect.clone());
        if let Some((value, line)) = &autodetect {
            match autodetect_kind(value) {
                AutoDetect::Nvml => {
                    let reason = format!("{} line {line}: AutoDetect={value}: Slurm numbers GPUs as NVML does", path.display());
                    return Ok(GpuOrder::Nvml { reason });
                }
                AutoDetect::Off => {}
                AutoDetect::Other => {
                    return Err((*line, format!("AutoDetect={value} is not supported for NVIDIA GPUs (use nvml or off)")))
                }
            }
        }
        let devices = self.devices()?;
        if devices.is_empty() {
            return Ok(GpuOrder::Nvml { reason: format!("{} lists no GPU device files (File=) for this node", path.display()) });
        }
        let mut found = Vec::with_capacity(devices.len());
        for (file, line) in devices {
            let Some(minor) = nvidia_minor(&file) else {
                let reason = format!("{} line {line}: File={file} is not an NVIDIA device file (nvidia<N>)", path.display());
                return Ok(GpuOrder::Nvml { reason });
            };
            if let Some(twin) = found.iter().find(|d: &&GresDevice| d.minor == minor) {
                return Err((line, format!("{file} is GPU minor {minor}, like {} of line {}", twin.file, twin.line)));
            }
            found.push(GresDevice { file, minor, line });
        }
        Ok(GpuOrder::Files { path: path.to_path_buf(), devices: found })
    }

    /// Every GPU device file with its line, in Slurm's index order.
    fn devices(&self) -> Result<Vec<(String, usize)>, LineError> {
        let mut out = Vec::new();
        for r in self.name_records.iter().chain(&self.node_records).filter(|r| r.name == "gpu") {
            if r.multiple_files {
                return Err((r.line, "MultipleFiles= is not supported: give each GPU its own File=".into()));
            }
            let Some(file) = &r.file else { continue };
            let files = hostlist::expand(file).map_err(|e| (r.line, format!("File=: {e}")))?;
            out.extend(files.into_iter().map(|f| (f, r.line)));
        }
        Ok(out)
    }
}

#[derive(Debug, PartialEq, Eq)]
enum AutoDetect {
    Nvml,
    Off,
    Other,
}

/// Slurm's reading: "nvml" anywhere in the value (any case), or exactly "off".
fn autodetect_kind(value: &str) -> AutoDetect {
    let lower = value.to_ascii_lowercase();
    if lower.contains("nvml") {
        AutoDetect::Nvml
    } else if lower == "off" {
        AutoDetect::Off
    } else {
        AutoDetect::Other
    }
}

fn node_matches(expr: &str, node: &str) -> Result<bool, String> {
    let names = hostlist::expand(expr).map_err(|e| format!("NodeName=: {e}"))?;
    Ok(names.iter().any(|n| n == node))
}

/// `.../nvidia3` → 3. Other names (`nvidiactl`, `nvidia-caps/...`) → None.
fn nvidia_minor(file: &str) -> Option<u32> {
    let base = file.rsplit('/').next()?;
    let digits = base.strip_prefix("nvidia")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Lines as Slurm's config parser sees them: `#` starts a comment unless
/// escaped, a trailing `\` continues the line, other `\` escapes are
/// dropped, blank lines are skipped. Each comes with its first line number.
fn logical_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (i, raw) in text.lines().enumerate() {
        let stripped = strip_comment(raw);
        let (content, continues) = match stripped.strip_suffix('\\') {
            Some(head) => (head, true),
            None => (stripped, false),
        };
        let (start, mut joined) = pending.take().unwrap_or((i + 1, String::new()));
        joined.push_str(content);
        if continues {
            pending = Some((start, joined));
        } else if !joined.trim().is_empty() {
            out.push((start, strip_escapes(&joined)));
        }
    }
    if let Some((start, joined)) = pending.filter(|(_, j)| !j.trim().is_empty()) {
        out.push((start, strip_escapes(&joined)));
    }
    out
}

/// Cuts at the first `#` preceded by an even number of backslashes.
fn strip_comment(line: &str) -> &str {
    let mut backslashes = 0;
    for (i, c) in line.char_indices() {
        match c {
            '#' if backslashes % 2 == 0 => return &line[..i],
            '\\' => backslashes += 1,
            _ => backslashes = 0,
        }
    }
    line
}

fn strip_escapes(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        out.push(if c == '\\' { chars.next().unwrap_or('\\') } else { c });
    }
    out
}

/// `Key=Value` pairs separated by white space; values may be double-quoted.
/// Keys are lower-cased: Slurm's keys are case-insensitive.
fn key_values(line: &str) -> Result<Vec<(String, String)>, String> {
    let mut pairs = Vec::new();
    for token in split_words(line)? {
        if token.eq_ignore_ascii_case("include") {
            return Err("Include is not supported: keep the GPU lines in this file".into());
        }
        let Some((key, value)) = token.split_once('=') else {
            return Err(format!("expected Key=Value, found {token:?}"));
        };
        if key.is_empty() {
            return Err(format!("expected Key=Value, found {token:?}"));
        }
        pairs.push((key.to_ascii_lowercase(), value.to_string()));
    }
    Ok(pairs)
}

/// Splits at white space outside double quotes and drops the quotes.
fn split_words(line: &str) -> Result<Vec<String>, String> {
    let (mut words, mut word, mut quoted) = (Vec::new(), String::new(), false);
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            c if c.is_whitespace() && !quoted => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if quoted {
        return Err("unterminated '\"'".into());
    }
    if !word.is_empty() {
        words.push(word);
    }
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATH: &str = "/etc/slurm/gres.conf";

    fn order(text: &str, node: &str) -> Result<GpuOrder, String> {
        parse_gpu_order(text, Path::new(PATH), node).map_err(|e| e.to_string())
    }

    /// The minors in Slurm index order, or "nvml: <reason>".
    fn minors(text: &str, node: &str) -> Result<String, String> {
        Ok(match order(text, node)? {
            GpuOrder::Files { devices, .. } => {
                devices.iter().map(|d| d.minor.to_string()).collect::<Vec<_>>().join(",")
            }
            GpuOrder::Nvml { reason } => format!("nvml: {reason}"),
        })
    }

    #[test]
    fn device_order_follows_gres_conf() {
        let cases: &[(&str, &str, &str)] = &[
            // (gres.conf, node, minors in Slurm index order)
            ("Name=gpu File=/dev/nvidia[0-3]", "n1", "0,1,2,3"),
            ("AutoDetect=off\nName=gpu File=/dev/nvidia2,/dev/nvidia0", "n1", "2,0"),
            ("Name=gpu File=/dev/nvidia3\nName=gpu File=/dev/nvidia[1,0]\nName=gpu Type=h100 File=/dev/nvidia2", "n1", "3,1,0,2"),
            // keys and AutoDetect=off in any case; comments, blanks, continuations
            ("# GPUs\n\nautodetect=OFF\nNAME=gpu file=/dev/nvidia1 # second\nname=gpu \\\n  FILE=/dev/nvidia0", "n1", "1,0"),
            ("Name=gpu File=\"/dev/nvidia1\" Cores=0-3 Links=-1,0\nName=gpu Count=1 File=/dev/nvidia0", "n1", "1,0"),
            // NodeName= records of this node only, after every Name= record (Slurm's order)
            // n07 is not n7
            ("NodeName=n[01-04,7] Name=gpu File=/dev/nvidia1\nName=gpu File=/dev/nvidia0", "n07", "0"),
            ("NodeName=n[01-04,7] Name=gpu File=/dev/nvidia1\nName=gpu File=/dev/nvidia0", "n7", "0,1"),
            ("NodeName=a,b Name=gpu File=/dev/nvidia[0-1]\nNodeName=c Name=gpu File=/dev/nvidia[2-3]", "c", "2,3"),
            ("NodeName=r[1-2]-g[08-10] Name=gpu File=/dev/nvidia[3,2]", "r2-g09", "3,2"),
            // other GRES do not count
            ("Name=mps Count=100 File=/dev/nvidia0\nName=gpu File=/dev/nvidia1", "n1", "1"),
            // device files anywhere, named nvidia<N> (the test harness's placeholders)
            ("Name=gpu File=/tmp/c/dev/nvidia[1,0]", "n1", "1,0"),
        ];
        for (text, node, want) in cases {
            assert_eq!(minors(text, node).as_deref(), Ok(*want), "{text:?} on {node}");
        }
    }

    #[test]
    fn nvml_order_and_why() {
        let cases: &[(&str, &str, &str)] = &[
            ("AutoDetect=nvml\nName=gpu File=/dev/nvidia[1,0]", "n1", "line 1: AutoDetect=nvml"),
            ("AutoDetect=NVML", "n1", "line 1: AutoDetect=NVML"),
            // a node's own AutoDetect wins over the global one, either way
            ("AutoDetect=off\nNodeName=n1 AutoDetect=nvml\nName=gpu File=/dev/nvidia1", "n1", "line 2: AutoDetect=nvml"),
            ("AutoDetect=nvml\nNodeName=n2 AutoDetect=off", "n1", "line 1: AutoDetect=nvml"),
            ("# nothing\n", "n1", "lists no GPU device files"),
            ("Name=gpu Count=2", "n1", "lists no GPU device files"),
            ("Name=gpu File=/dev/dri/card[0-1]", "n1", "line 1: File=/dev/dri/card0 is not an NVIDIA device file"),
            ("Name=gpu File=/dev/nvidia0\nName=gpu File=/dev/nvidiactl", "n1", "line 2: File=/dev/nvidiactl is not"),
        ];
        for (text, node, needle) in cases {
            let got = minors(text, node).unwrap();
            assert!(got.starts_with("nvml: ") && got.contains(needle), "{text:?}: {got}");
        }
        let local = "AutoDetect=nvml\nNodeName=n1 AutoDetect=off Name=gpu File=/dev/nvidia[1,0]";
        assert_eq!(minors(local, "n1").unwrap(), "1,0");
    }

    #[test]
    fn bad_gres_conf_names_file_line_and_problem() {
        let cases = [
            ("Name=gpu File=/dev/nvidia0\nName=gpu File=/dev/nvidia[1-0]", "gres.conf line 2: File=: bad range [1-0]: 1-0 runs backwards"),
            ("Name=gpu File=/dev/nvidia[0-1", "line 1: File=: '[' without ']'"),
            ("NodeName=n[1-2 Name=gpu File=/dev/nvidia0", "line 1: NodeName=: '[' without ']'"),
            ("Name=gpu File=/dev/nvidia0\n\nName=gpu File=/x/nvidia0", "line 3: /x/nvidia0 is GPU minor 0, like /dev/nvidia0 of line 1"),
            ("Name=gpu Fil=/dev/nvidia0", "line 1: unknown key \"fil\""),
            ("File=/dev/nvidia0 Name=gpu", "line 1: unexpected key \"file\""),
            ("Name=gpu File=/dev/nvidia0 garbage", "line 1: expected Key=Value, found \"garbage\""),
            ("Name=gpu File=\"/dev/nvidia0", "line 1: unterminated"),
            ("Include /etc/slurm/gres.d/gpu.conf", "line 1: Include is not supported"),
            ("AutoDetect=rsmi\nName=gpu File=/dev/nvidia0", "line 1: AutoDetect=rsmi is not supported"),
            ("AutoDetect=nvlm", "line 1: AutoDetect=nvlm is not supported"),
            ("Name=gpu MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap1", "MultipleFiles= is not supported"),
            ("Name=gpu File=/dev/nvidia0 MultipleFiles=/dev/nvidia1,/dev/nvidia2", "exclude each other"),
            ("NodeName=n1 AutoDetect=off\nNodeName=n1 AutoDetect=nvml", "line 2: AutoDetect=nvml contradicts AutoDetect=off of line 1"),
        ];
        for (text, needle) in cases {
            let err = order(text, "n1").expect_err(text);
            assert!(err.starts_with(PATH) && err.contains(needle), "{text:?}: {err}");
        }
    }

    #[test]
    fn a_missing_file_means_nvml_order_and_an_unreadable_one_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("gres.conf");
        match read_gpu_order(&missing, "n1").unwrap() {
            GpuOrder::Nvml { reason } => assert!(reason.starts_with("no ") && reason.contains("gres.conf"), "{reason}"),
            other => panic!("{other:?}"),
        }
        let err = read_gpu_order(dir.path(), "n1").unwrap_err().to_string();
        assert!(err.starts_with("cannot read"), "{err}");
        std::fs::write(&missing, "Name=gpu File=/dev/nvidia[1,0]\n").unwrap();
        let GpuOrder::Files { path, devices } = read_gpu_order(&missing, "n1").unwrap() else { panic!() };
        assert_eq!(path, missing);
        assert_eq!(devices[0], GresDevice { file: "/dev/nvidia1".into(), minor: 1, line: 1 });
    }
}
