//! One run of the node checker: snapshot, checks, cursor saved, optional
//! deep check, then the node decision through scontrol, all inside a
//! deadline (slurmd kills a HealthCheckProgram at 60 s; a hung NVML call
//! must still end in a report and, if so configured, a drain). The
//! orchestrator over [`crate::health`], as the lifecycle is over the modes:
//! health's checks never see the whole site config.

use crate::health::output::{Report, REPORT_VERSION};
use crate::health::policy::{decide, fail_detail, failing_check, Action};
use crate::health::snapshot::Sources;
use crate::health::{quick_checks, run_guarded, snapshot, CheckResult, Status};
use crate::drain::{NodeStatus, Scontrol};
use crate::gpu::{GpuOps, NvmlGpus};
use crate::log::{ActionLine, Outcome};
use crate::Config;
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn sources(config: &Config) -> Sources<'_> {
    Sources {
        health: &config.health,
        runtime_dir: &config.runtime_dir,
        mps_control: &config.mps.control,
        mig_baseline: crate::mig_baseline::tool::configured(config).map_err(|e| e.to_string()),
        netlocks: Some(crate::preempt::netlock::NetLocks::from_config(config)),
        readiness: Some(crate::health::readiness::Inputs::from_config(config)),
    }
}

#[derive(Debug, Clone, Default)]
pub struct CheckOptions {
    /// Also run the CUDA checks on idle GPUs.
    pub deep: bool,
    /// Drain/resume the node through scontrol.
    pub drain: bool,
    /// The Slurm node name (`SLURMD_NODENAME` when `None`).
    pub node: Option<String>,
    /// Run only this check.
    pub only: Option<String>,
}

pub struct NodeOutcome {
    pub report: Report,
}

/// Runs the checks (no drain): every result, in check order.
pub fn run_checks(config: &Config, opts: &CheckOptions) -> Vec<CheckResult> {
    let gpus = NvmlGpus::from_config(config);
    let ops: Result<&dyn GpuOps, String> = match &gpus {
        Ok(g) => Ok(g),
        Err(e) => Err(e.to_string()),
    };
    let ctx = snapshot::take(&sources(config), ops);
    let wanted = |name: &str| opts.only.as_deref().is_none_or(|o| o == name) && !config.health.disabled.iter().any(|d| d == name);
    let mut results: Vec<CheckResult> = Vec::new();
    for check in quick_checks().iter().filter(|c| wanted(c.name())) {
        results.extend(run_guarded(check.as_ref(), &ctx));
    }
    if let Some(e) = &ctx.cursor_error {
        results.push(CheckResult::new("xid", None, Status::Warn, format!("cursor file unreadable, started afresh: {e}")));
    }
    let state_dir = config.health.state_dir(&config.runtime_dir);
    if let Err(e) = ctx.cursor.save(&state_dir) {
        // Without the cursor the next run would count these XIDs again.
        results.push(CheckResult::new("xid", None, Status::Warn, format!("cannot save the cursor: {e}")));
    }
    if opts.deep && wanted("deep") {
        results.extend(crate::health::deep::run(&ctx, &config.health.deep));
    }
    if opts.only.is_none() {
        write_readiness(config, &results);
    }
    results
}

/// The checkpoint readiness verdict for the jobs' wrapper and the status,
/// from a full run only (`--only` would leave the other checks out of it).
fn write_readiness(config: &Config, results: &[CheckResult]) {
    if let Err(e) = crate::health::readiness::write_verdict(&config.runtime_dir, results) {
        ActionLine::new("node-check").field("readiness", e).outcome(Outcome::Failed).emit(&config.log);
    }
}

/// The node name: `--node`, else `SLURMD_NODENAME` (`drain::given_node_name`).
/// No host name: a check run by hand without either drains nothing.
pub fn node_name(opts: &CheckOptions) -> Option<String> {
    crate::drain::given_node_name(opts.node.as_deref())
}

/// Checks within `[health] deadline_ms`; past it, one failing result says so
/// (the stuck thread is left behind: the process is about to exit).
fn checks_within_deadline(config: &Config, opts: &CheckOptions) -> Vec<CheckResult> {
    let (tx, rx) = mpsc::channel();
    let (c, o) = (config.clone(), opts.clone());
    let spawned = std::thread::Builder::new().name("checks".into()).spawn(move || {
        let _ = tx.send(run_checks(&c, &o));
    });
    if let Err(e) = spawned {
        return vec![CheckResult::new("driver", None, Status::Fail, format!("cannot start the checks: {e}"))];
    }
    let limit = Duration::from_millis(config.health.deadline_ms + if opts.deep { 20_000 } else { 0 });
    match rx.recv_timeout(limit) {
        Ok(r) => r,
        Err(_) => vec![CheckResult::new("driver", None, Status::Fail, format!("checks did not finish within {} ms (NVML or a file system hung?)", limit.as_millis()))],
    }
}

/// The whole run: checks, then (with `opts.drain` and a node name) the
/// decision applied through scontrol, then the Prometheus textfile.
pub fn check_node(config: &Config, opts: &CheckOptions) -> NodeOutcome {
    let start = Instant::now();
    let results = checks_within_deadline(config, opts);
    let node = node_name(opts);
    let (action, action_error) = match (&node, opts.drain) {
        (Some(n), true) => apply(config, n, &results),
        _ => (None, None),
    };
    let report = Report {
        version: REPORT_VERSION,
        node,
        status: Report::worst(&results),
        duration_ms: start.elapsed().as_millis() as u64,
        deep: opts.deep,
        results,
        action,
        action_error,
    };
    if let Some(p) = &config.health.prometheus_textfile {
        if let Err(e) = report.write_prometheus(p) {
            ActionLine::new("node-check").field("prometheus", e).outcome(Outcome::Failed).emit(&config.log);
        }
    }
    // The gauges (jobs, daemons, images) change between hook runs too.
    crate::observe::refresh(config);
    log(config, &report);
    NodeOutcome { report }
}

/// Reads the node's state, decides, and drains or resumes.
fn apply(config: &Config, node: &str, results: &[CheckResult]) -> (Option<Action>, Option<String>) {
    let scontrol = Scontrol::new(&config.slurm.scontrol);
    let status = match scontrol.show_node(node) {
        Ok(text) => NodeStatus::parse(&text),
        Err(e) => return (None, Some(format!("cannot read the node's state: {e}"))),
    };
    let action = decide(&status, results);
    let done = match &action {
        Action::Drain { .. } => match fail_detail(results) {
            Some(detail) => scontrol.drain(node, &detail).inspect(|()| {
                let label = failing_check(results).unwrap_or("other");
                crate::observe::drain_set(config, "node-checker", label, &crate::drain::drain_reason(&detail));
            }),
            None => Ok(()),
        },
        Action::Resume => scontrol.resume(node),
        Action::Nothing => Ok(()),
    };
    (Some(action), done.err().map(|e| e.to_string()))
}

fn log(config: &Config, report: &Report) {
    let (what, detail) = match &report.action {
        Some(Action::Drain { reason }) => ("drain", reason.clone()),
        Some(Action::Resume) => ("resume", String::new()),
        _ if report.status == Status::Fail => ("node-check", fail_detail(&report.results).unwrap_or_default()),
        _ => return,
    };
    let outcome = if report.action_error.is_some() { Outcome::Failed } else { Outcome::Ok };
    let mut line = ActionLine::new(what).field("node", report.node.as_deref().unwrap_or("?"));
    if !detail.is_empty() {
        line = line.field("reason", detail);
    }
    if let Some(e) = &report.action_error {
        line = line.field("error", e);
    }
    line.outcome(outcome).emit(&config.log);
}

/// For the epilog, after teardown: the quick checks with the same drain and
/// resume rules as the HealthCheckProgram, applied when
/// `[slurm] drain_on_node_fault` is on. The epilog decides its exit code
/// from `report.status`.
pub fn check_after_epilog(config: &Config, node: &str) -> NodeOutcome {
    let opts = CheckOptions { deep: false, drain: config.slurm.drain_on_node_fault, node: Some(node.to_string()), only: None };
    check_node(config, &opts)
}

/// `gpu-mode-node-checker ack`: an administrator repaired the node; forget
/// this boot's XIDs and accept the GPUs' current volatile ECC counts.
pub fn acknowledge(config: &Config) -> Result<String, String> {
    let gpus = NvmlGpus::from_config(config);
    let ops: Result<&dyn GpuOps, String> = gpus.as_ref().map(|g| g as &dyn GpuOps).map_err(|e| e.to_string());
    let mut ctx = snapshot::take(&sources(config), ops);
    let counts = ctx
        .gpus()
        .iter()
        .filter_map(|g| Some((g.inventory.as_ref()?.uuid.clone(), g.health.as_ref()?.ecc_uncorrected_volatile?)))
        .collect();
    let forgotten = ctx.cursor.xids.len();
    ctx.cursor.acknowledge(&counts);
    ctx.cursor.save(&config.health.state_dir(&config.runtime_dir)).map_err(|e| e.to_string())?;
    Ok(format!("acknowledged: {forgotten} XID(s) forgotten, ECC baselines set for {} GPU(s)", counts.len()))
}
