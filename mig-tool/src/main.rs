//! `gpu-mode-mig`: the node's MIG baseline (docs/mig.md). Thin: the
//! baseline, the plan and the apply are `gpu_mode_core::mig_baseline`.

use clap::Parser;
use gpu_mode_core::gpu::{GpuOps, NvmlGpus};
use gpu_mode_core::gpu_lock::GpuLocks;
use gpu_mode_core::log::{stderr_line, ActionLine, Outcome};
use gpu_mode_core::mig_baseline::apply::{apply, ApplyError, Done};
use gpu_mode_core::mig_baseline::plan::{plan, Plan};
use gpu_mode_core::mig_baseline::services::{NvidiaSmiReset, Systemctl};
use gpu_mode_core::mig_baseline::{tool, Baseline};
use gpu_mode_core::Config;
use gpu_mode_mig::cli::{drain_label, job_request, Choice, Cli, Command, EXIT_DIFFERS, EXIT_NVML, EXIT_USAGE};
use std::process::ExitCode;
use std::time::Duration;


/// A failure: exit code, one line, and the kind a drain it causes is
/// counted under (`gpu_mode_drains_total{source="mig-baseline",reason}`).
struct Fail {
    code: u8,
    msg: String,
    label: &'static str,
}

impl Fail {
    /// A failure of the exit code's class (its label: cli::drain_label).
    fn new(code: u8, msg: impl Into<String>) -> Fail {
        Fail { code, msg: msg.into(), label: drain_label(code) }
    }

    /// A failed apply of `source`: labelled by the step that failed.
    fn apply(source: &str, e: ApplyError) -> Fail {
        Fail { code: EXIT_DIFFERS, msg: format!("{source}: {e}"), label: e.label() }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (cfg, config_error) = Config::load_or_salvage(cli.config.as_deref());
    match (cli.command, config_error) {
        (command, Some(e)) if command.stops_on_config_error() => fail(Fail::new(EXIT_USAGE, e.to_string())),
        (Command::Apply { baseline, boot, node }, config_error) => {
            apply_cmd(&cfg, config_error.map(|e| e.to_string()), &baseline, boot, node.as_deref())
        }
        (other, _) => read_only(&cfg, other).unwrap_or_else(fail),
    }
}

fn fail(f: Fail) -> ExitCode {
    stderr_line(&format!("gpu-mode-mig: {}", f.msg));
    ExitCode::from(f.code)
}

/// Prints as `print!` would; a closed stdout is no panic.
fn out(text: &str) {
    use std::io::Write as _;
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

fn read_only(cfg: &Config, command: Command) -> Result<ExitCode, Fail> {
    match command {
        Command::Export { name } => {
            out(&tool::export(&open(cfg)?, &name).map_err(|e| Fail::new(EXIT_NVML, e.to_string()))?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Assert { baseline } => assert_cmd(cfg, &baseline),
        Command::Plan { baseline, all: true } => plan_all(cfg, &baseline),
        Command::Plan { baseline, all: false } => {
            let p = make_plan(cfg, &open(cfg)?, &required(cfg, &baseline)?)?;
            out(&p.text());
            Ok(if p.problems().is_empty() { ExitCode::SUCCESS } else { ExitCode::from(EXIT_DIFFERS) })
        }
        Command::JobPlan { values } => job_plan(cfg, &values),
        Command::Apply { .. } => Err(Fail::new(EXIT_USAGE, "apply changes the GPUs; it is not a read-only verb")),
    }
}

/// The per-job prolog's plan (core::modes::mig::setup::plan_gpu) for each
/// value on every GPU: one line each, `placed` with the placements or
/// `refused` with the job's message. Reads only.
fn job_plan(cfg: &Config, values: &[String]) -> Result<ExitCode, Fail> {
    use gpu_mode_core::modes::mig::{layout::requested, setup::plan_gpu};
    let ops = open(cfg)?;
    let count = ops.count().map_err(|e| Fail::new(EXIT_NVML, e.to_string()))?;
    // Plan as a node whose jobs may switch MIG on and make instances would:
    // the GPU's profile table decides, not this node's settings.
    let mut planning = cfg.clone();
    planning.gpu.mig_mode = gpu_mode_core::gpu::MigModeSetting::Switch;
    planning.gpu.mig_instances = gpu_mode_core::gpu::MigInstanceSetting::Manage;
    let mut refused = false;
    for value in values {
        let request = job_request(value).map_err(|e| Fail::new(EXIT_USAGE, e))?;
        let list = match requested(&planning, &request) {
            Ok(l) => l,
            Err(e) => {
                out(&format!("{value} refused: {e}\n"));
                refused = true;
                continue;
            }
        };
        for gpu in 0..count {
            let line = match plan_gpu(&planning, gpu, &list, &ops) {
                Ok(p) => {
                    let at: Vec<String> = p.create.iter().map(|c| format!("{}@{}", c.name, c.start)).collect();
                    format!("{value} GPU {gpu} ({}): placed {}", p.model, at.join(","))
                }
                Err(f) => {
                    refused = true;
                    format!("{value} GPU {gpu}: refused: {f}")
                }
            };
            out(&format!("{line}\n"));
        }
    }
    Ok(if refused { ExitCode::from(EXIT_DIFFERS) } else { ExitCode::SUCCESS })
}

fn open(cfg: &Config) -> Result<NvmlGpus, Fail> {
    NvmlGpus::from_config(cfg).map_err(|e| Fail::new(EXIT_NVML, e.to_string()))
}

/// The chosen baseline; none configured or named is a usage error.
fn required(cfg: &Config, c: &Choice) -> Result<Baseline, Fail> {
    match tool::choose(cfg, c.file.as_deref(), c.layout.as_deref()) {
        Ok(Some(b)) => Ok(b),
        Ok(None) => Err(Fail::new(EXIT_USAGE, "no baseline: set [mig] baseline in the site config, or pass -c FILE -l NAME or -l @LAYOUT")),
        Err(e) => Err(Fail::new(EXIT_USAGE, e.to_string())),
    }
}

fn make_plan(cfg: &Config, ops: &dyn GpuOps, b: &Baseline) -> Result<Plan, Fail> {
    let observed = tool::observe(ops, &cfg.runtime_dir).map_err(|e| Fail::new(EXIT_NVML, e.to_string()))?;
    Ok(plan(b, &observed, &tool::settings(cfg)))
}

fn assert_cmd(cfg: &Config, c: &Choice) -> Result<ExitCode, Fail> {
    let b = required(cfg, c)?;
    let p = make_plan(cfg, &open(cfg)?, &b)?;
    let line = ActionLine::new("mig-baseline").field("verb", "assert").field("baseline", &b.source);
    if p.matches() {
        out(&format!("the GPUs match {}\n", b.source));
        line.outcome(Outcome::Ok).emit(&cfg.log);
        return Ok(ExitCode::SUCCESS);
    }
    let d = p.differences();
    out(&format!("the GPUs differ from {}:\n{d}", b.source));
    line.field("differs", d.trim().replace('\n', "; ")).outcome(Outcome::Failed).emit(&cfg.log);
    Ok(ExitCode::from(EXIT_DIFFERS))
}

/// `plan --all`: every config of the file (or every layout), one after the other.
fn plan_all(cfg: &Config, c: &Choice) -> Result<ExitCode, Fail> {
    let names = tool::all_names(cfg, c.file.as_deref()).map_err(|e| Fail::new(EXIT_USAGE, e.to_string()))?;
    let gpus = open(cfg)?;
    let mut refused = 0;
    for name in &names {
        let choice = Choice { file: c.file.clone(), layout: Some(name.clone()) };
        let p = make_plan(cfg, &gpus, &required(cfg, &choice)?)?;
        refused += usize::from(!p.problems().is_empty());
        out(&format!("== {name}\n{}\n", p.text()));
    }
    out(&format!("{} config(s) planned, {refused} refused\n", names.len()));
    Ok(if refused == 0 { ExitCode::SUCCESS } else { ExitCode::from(EXIT_DIFFERS) })
}

fn apply_cmd(cfg: &Config, config_error: Option<String>, c: &Choice, boot: bool, node: Option<&str>) -> ExitCode {
    let node = if boot { gpu_mode_core::drain::node_name(node) } else { None };
    if boot {
        clear_previous_boot(cfg);
    }
    let line = ActionLine::new("mig-baseline").field("verb", "apply");
    let result = match config_error {
        Some(e) => Err(Fail::new(EXIT_USAGE, e)),
        None => apply_baseline(cfg, c, boot),
    };
    match result {
        Ok((source, Some(done))) => {
            let mut line = line.field("baseline", source);
            line = match &done {
                Done::Unchanged => line.field("changed", "none"),
                Done::Changed(gpus) => line.field("changed", gpus.iter().map(u32::to_string).collect::<Vec<_>>().join(",")),
            };
            if let Some(r) = boot.then(|| tool::resume_after_success(cfg, node.as_deref())).flatten() {
                line = line.field("node", r);
            }
            line.outcome(Outcome::Ok).emit(&cfg.log);
            ExitCode::SUCCESS
        }
        Ok((_, None)) => {
            line.field("baseline", "none configured").outcome(Outcome::Skipped).emit(&cfg.log);
            ExitCode::SUCCESS
        }
        Err(f) => {
            let mut line = line.field("error", &f.msg);
            if boot {
                let after = tool::drain_after_failure(cfg, node.as_deref(), &f.msg);
                if let Some(reason) = &after.drain_set {
                    gpu_mode_core::observe::drain_set(cfg, "mig-baseline", f.label, reason);
                }
                line = line.field("node", after.said);
            }
            line.outcome(Outcome::Failed).emit(&cfg.log);
            fail(f)
        }
    }
}

/// At boot, before anything reads the runtime directory: the records of
/// jobs an earlier boot ended go, so the baseline sees no job holding a GPU
/// and a late epilog finds nothing (core::runtime::clear_previous_boot).
/// A failure is logged, not fatal: the baseline still applies.
fn clear_previous_boot(cfg: &Config) {
    let line = ActionLine::new("boot-records").field("runtime_dir", cfg.runtime_dir.display().to_string());
    match gpu_mode_core::runtime::clear_previous_boot(&cfg.runtime_dir, &gpu_mode_core::runtime::current_boot_id()) {
        Ok(r) if r.removed.is_empty() => line.field("detail", r.kept_because.unwrap_or_default()).outcome(Outcome::Skipped).emit(&cfg.log),
        Ok(r) => line.field("removed", r.removed.join(",")).outcome(Outcome::Ok).emit(&cfg.log),
        Err(e) => line.field("detail", e.to_string()).outcome(Outcome::Failed).emit(&cfg.log),
    }
}

/// Chooses, plans and applies with every GPU locked (prologs and epilogs
/// take the same per-GPU locks). `Ok((_, None))`: at boot, no baseline.
fn apply_baseline(cfg: &Config, c: &Choice, boot: bool) -> Result<(String, Option<Done>), Fail> {
    let b = match tool::choose(cfg, c.file.as_deref(), c.layout.as_deref()) {
        Ok(None) if boot => return Ok((String::new(), None)),
        _ => required(cfg, c)?,
    };
    let gpus = open(cfg)?;
    let count = gpus.count().map_err(|e| Fail::new(EXIT_NVML, e.to_string()))?;
    let all: Vec<u32> = (0..count).collect();
    let _locks = GpuLocks::acquire(&cfg.runtime_dir, &all, Duration::from_millis(cfg.mps.lock_timeout_ms))
        .map_err(|e| Fail::new(EXIT_DIFFERS, e.to_string()))?;
    let p = make_plan(cfg, &gpus, &b)?;
    if p.changes() || !p.problems().is_empty() {
        out(&p.text());
    }
    let services = Systemctl::new(&cfg.mig.systemctl, boot);
    let reset = NvidiaSmiReset::new(&cfg.mig.nvidia_smi);
    let done = apply(&gpus, &p, &services, &reset, &mut |l| l.emit(&cfg.log)).map_err(|e| Fail::apply(&b.source, e))?;
    if done == Done::Unchanged {
        out(&format!("the GPUs already match {}: nothing changed\n", b.source));
    }
    Ok((b.source, Some(done)))
}
