//! `nvml-sim-ctl`: changes the simulated node from outside NVML, as the world
//! would (a fault, a process, an administrator's reset). Tests call it.
//!
//! ```text
//! nvml-sim-ctl init <fixture.toml>
//! nvml-sim-ctl inject <fault> [args] [--gpu N]     (GPU 0 by default)
//!     xid <48|79|94|...> | ecc [count] | retired-pages <count> [pending]
//!     remap pending|failed | lost | needs-reset | persistence off | pcie x<width>
//!     thermal | mig-in-use | mig-create-fails [after]
//! nvml-sim-ctl clear [--gpu N]                     (all GPUs without --gpu)
//! nvml-sim-ctl process add <pid> [--gpu N] [--mem-mib M] [--gi G --ci C]
//! nvml-sim-ctl process clear [--gpu N]
//! nvml-sim-ctl reset [--gpu N]
//! nvml-sim-ctl reboot                              (every GPU, as after a node reboot)
//! nvml-sim-ctl show
//! ```
//! `--gpu` takes an NVML index, a GPU UUID or a PCI bus id, as
//! `nvidia-smi -i` does (a stand-in nvidia-smi can pass its `-i` on).
//! ```text
//! ```
//! The state file is `$GPU_MODE_SIM_STATE`. Exit 0 on success, 1 when the
//! simulated GPU refuses (e.g. reset while in use), 2 on a usage error.

use nvml_sim::model::{code, Fault, NodeState, SimProcess};
use nvml_sim::store;
use std::path::Path;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => {}
        Err(Failure::Usage(m)) => {
            eprintln!("nvml-sim-ctl: {m}");
            std::process::exit(2);
        }
        Err(Failure::Refused(m)) => {
            eprintln!("nvml-sim-ctl: {m}");
            std::process::exit(1);
        }
    }
}

enum Failure {
    Usage(String),
    Refused(String),
}

fn usage(m: impl Into<String>) -> Failure {
    Failure::Usage(m.into())
}

/// Splits off `--name value` options; the rest are positional words.
struct Args<'a> {
    words: Vec<&'a str>,
    opts: Vec<(&'a str, &'a str)>,
}

impl<'a> Args<'a> {
    fn parse(args: &'a [String]) -> Result<Args<'a>, Failure> {
        let (mut words, mut opts) = (Vec::new(), Vec::new());
        let mut it = args.iter();
        while let Some(a) = it.next() {
            if let Some(name) = a.strip_prefix("--") {
                let v = it.next().ok_or_else(|| usage(format!("--{name} needs a value")))?;
                opts.push((name, v.as_str()));
            } else {
                words.push(a.as_str());
            }
        }
        Ok(Args { words, opts })
    }

    fn opt<T: std::str::FromStr>(&self, name: &str) -> Result<Option<T>, Failure> {
        match self.opts.iter().find(|(n, _)| *n == name) {
            None => Ok(None),
            Some((_, v)) => v.parse().map(Some).map_err(|_| usage(format!("--{name} {v}: not a number"))),
        }
    }

    fn word(&self, i: usize) -> Option<&'a str> {
        self.words.get(i).copied()
    }

    fn number<T: std::str::FromStr>(&self, i: usize, what: &str) -> Result<T, Failure> {
        let w = self.word(i).ok_or_else(|| usage(format!("missing {what}")))?;
        w.parse().map_err(|_| usage(format!("{what} {w:?} is not a number")))
    }
}

fn run(raw: &[String]) -> Result<(), Failure> {
    let args = Args::parse(raw)?;
    let path = store::state_path_from_env().map_err(|e| usage(e.to_string()))?;
    let gpu: Option<&str> = args.opts.iter().find(|(n, _)| *n == "gpu").map(|(_, v)| *v);
    match args.word(0) {
        Some("init") => {
            let fixture = args.word(1).ok_or_else(|| usage("init needs a fixture file"))?;
            store::create(&path, Path::new(fixture)).map(|_| ()).map_err(|e| usage(e.to_string()))
        }
        Some("inject") => {
            let fault = parse_fault(&args)?;
            edit(&path, |s| s.inject(pick(s, gpu)?, &fault))
        }
        Some("clear") => edit(&path, |s| {
            let one = gpu.map(|g| pick(s, Some(g))).transpose()?;
            s.clear(one)
        }),
        Some("process") => process(&args, &path, gpu),
        Some("reset") => edit(&path, |s| s.gpu_mut(pick(s, gpu)?)?.reset()),
        Some("reboot") => edit(&path, |s| {
            s.reboot();
            Ok(())
        }),
        Some("show") => {
            let text = store::update(&path, |s| serde_json::to_string_pretty(s)).map_err(|e| usage(e.to_string()))?;
            println!("{}", text.map_err(|e| usage(e.to_string()))?);
            Ok(())
        }
        other => Err(usage(format!("unknown command {other:?}: init | inject | clear | process | reset | reboot | show"))),
    }
}

/// The GPU `--gpu` names (GPU 0 without it): an index, a UUID or a PCI
/// bus id; an unknown one is INVALID_ARGUMENT ("no such GPU").
fn pick(s: &NodeState, gpu: Option<&str>) -> Result<u32, u32> {
    let Some(sel) = gpu else { return Ok(0) };
    if let Ok(i) = sel.parse::<u32>() {
        return s.gpu(i).map(|_| i);
    }
    let matches = |g: &nvml_sim::model::GpuState| g.uuid.eq_ignore_ascii_case(sel) || g.pci_bus_id.eq_ignore_ascii_case(sel);
    s.gpus.iter().position(matches).map(|i| i as u32).ok_or(code::INVALID_ARGUMENT)
}

fn edit(path: &Path, f: impl FnOnce(&mut NodeState) -> Result<(), u32>) -> Result<(), Failure> {
    match store::update(path, f) {
        Err(e) => Err(usage(e.to_string())),
        Ok(Err(c)) if c == code::IN_USE => Err(Failure::Refused("refused: the GPU is in use (processes or clients hold it)".into())),
        Ok(Err(c)) if c == code::INVALID_ARGUMENT => Err(usage("no such GPU")),
        Ok(Err(c)) => Err(Failure::Refused(format!("refused with NVML code {c}"))),
        Ok(Ok(())) => Ok(()),
    }
}

fn parse_fault(args: &Args) -> Result<Fault, Failure> {
    let fault = match (args.word(1), args.word(2)) {
        (Some("xid"), _) => Fault::Xid { xid: args.number(2, "xid")? },
        (Some("ecc"), None) => Fault::Ecc { count: 1 },
        (Some("ecc"), Some(_)) => Fault::Ecc { count: args.number(2, "count")? },
        (Some("retired-pages"), _) => Fault::RetiredPages { count: args.number(2, "count")?, pending: args.word(3) == Some("pending") },
        (Some("remap"), Some("pending")) => Fault::RemapPending,
        (Some("remap"), Some("failed")) => Fault::RemapFailed,
        (Some("lost"), None) => Fault::Lost,
        (Some("needs-reset"), None) => Fault::NeedsReset,
        (Some("persistence"), Some("off")) => Fault::PersistenceOff,
        (Some("pcie"), Some(w)) => {
            let width = w.strip_prefix('x').and_then(|n| n.parse().ok()).ok_or_else(|| usage(format!("pcie {w}: want x<width>, e.g. x8")))?;
            Fault::PcieWidth { width }
        }
        (Some("thermal"), None) => Fault::Thermal,
        (Some("mig-in-use"), None) => Fault::MigInUse,
        (Some("mig-create-fails"), None) => Fault::MigCreateFails { after: 0 },
        (Some("mig-create-fails"), Some(_)) => Fault::MigCreateFails { after: args.number(2, "after")? },
        _ => {
            return Err(usage(
                "inject: xid <n> | ecc [count] | retired-pages <n> [pending] | remap pending|failed | lost | \
                 needs-reset | persistence off | pcie x<width> | thermal | mig-in-use | mig-create-fails [after]",
            ))
        }
    };
    Ok(fault)
}

fn process(args: &Args, path: &Path, gpu: Option<&str>) -> Result<(), Failure> {
    match args.word(1) {
        Some(word @ ("add" | "add-live")) => {
            let p = SimProcess {
                pid: args.number(2, "pid")?,
                used_mib: args.opt("mem-mib")?.unwrap_or(512),
                gpu_instance: args.opt("gi")?,
                compute_instance: args.opt("ci")?,
                live: word == "add-live",
            };
            edit(path, |s| {
                s.gpu_mut(pick(s, gpu)?)?.processes.push(p);
                Ok(())
            })
        }
        Some("clear") => edit(path, |s| {
            s.gpu_mut(pick(s, gpu)?)?.processes.clear();
            Ok(())
        }),
        _ => Err(usage("process add|add-live <pid> [--mem-mib M] [--gi G --ci C] | process clear")),
    }
}
