//! The node-side lifecycle verbs, one file each (prolog, epilog), and how their
//! failures turn into exit codes and drains.
//!
//! # Failure policy (deliberate; see docs/architecture.md, "Failures")
//!
//! * [`Failure::Job`]: the job asked for something this node cannot give it
//!   (a bad or unsupported value, a MIG profile the GPU lacks, a GPU another
//!   user's MPS daemon holds). The node is healthy, so it must not be drained.
//!   The prolog records a *refusal* in the job state and exits 0; the plugin
//!   then fails the job's tasks in slurmstepd with the message.
//! * [`Failure::Node`]: something is wrong with the node (state directory not
//!   writable, NVML gone, a setting that would not apply or undo). Whatever was
//!   done is undone first; then the helper drains the node itself with a
//!   precise `gpu-mode: <verb>: <detail>` reason and exits non-zero. Exiting
//!   non-zero keeps Slurm's own semantics (a failed Prolog requeues the job
//!   held; a failed Epilog keeps the node out of service), and because our
//!   drain came first, slurmctld's generic "Prolog error"/"Epilog error" does
//!   not replace our reason. Should scontrol itself fail, the non-zero exit
//!   still gets the node drained by Slurm.

#[cfg(feature = "cli")]
pub mod cli;
pub mod epilog;
pub mod prolog;

use crate::config::Config;
use crate::drain::{DrainAction, Scontrol};
use crate::job_env::{format_gpu_list, JobEnv};
use crate::log::{ActionLine, Outcome};
use crate::watchdog::{self, HookWatchdog};

pub use crate::failure::{Failure, Fault};

/// What a verb did, for its log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub outcome: Outcome,
    /// Mode in canonical form, or the raw value when it did not parse.
    pub mode: Option<String>,
    /// Extra detail for the log line (e.g. the refusal).
    pub detail: Option<String>,
}

/// Exit code slurmd sees for a node fault.
pub const EXIT_NODE_FAULT: i32 = 1;

/// Logs the verb's line, drains on a node fault, counts the run (metrics)
/// and returns the exit code.
pub fn finish(verb: &'static str, cfg: &Config, env: &JobEnv, result: Result<Report, Failure>) -> i32 {
    let line = ActionLine::new(verb)
        .field("job", env.job_id)
        .field("node", &env.node)
        .field("user", &env.user)
        .field("uid", env.uid)
        .field("gpu", format_gpu_list(&env.slurm_gpus));
    let (code, outcome) = match result {
        Ok(report) => {
            let mut line = line.field("mode", report.mode.as_deref().unwrap_or("none"));
            if let Some(d) = &report.detail {
                line = line.field("detail", d);
            }
            line.outcome(report.outcome).emit(&cfg.log);
            (0, report.outcome)
        }
        Err(Failure::Job(msg)) => {
            // A verb that returns Failure::Job has already recorded the refusal.
            line.field("detail", &msg).outcome(Outcome::Refused).emit(&cfg.log);
            (0, Outcome::Refused)
        }
        Err(Failure::Node(fault, msg)) => {
            line.field("detail", &msg).outcome(Outcome::Failed).emit(&cfg.log);
            drain_for(cfg, verb, fault, &env.node, &format!("{verb}: {msg}"));
            (EXIT_NODE_FAULT, Outcome::Failed)
        }
        Err(Failure::Drain(fault, reason)) => {
            line.field("detail", &reason).outcome(Outcome::Failed).emit(&cfg.log);
            drain_for(cfg, verb, fault, &env.node, &reason);
            (EXIT_NODE_FAULT, Outcome::Failed)
        }
    };
    count_run(verb, cfg, env, outcome);
    code
}

/// What a mode did (its grant's or release's events), recorded by the verb
/// as soon as the mode returns: modes never write the metrics themselves.
pub(crate) fn record_events(cfg: &Config, events: &[crate::metrics::Event]) {
    if !events.is_empty() {
        crate::observe::record(cfg, events);
    }
}

/// `gpu_mode_{prolog,epilog}_runs_total{mode,outcome}`, for jobs with a mode
/// only: jobs without one must stay as cheap as they are.
fn count_run(verb: &'static str, cfg: &Config, env: &JobEnv, outcome: Outcome) {
    let Some(value) = &env.mode_value else { return };
    let family = if verb == Verb::Epilog.name() { crate::metrics::EPILOG_RUNS } else { crate::metrics::PROLOG_RUNS };
    // The kind of a mode that parses; user text never becomes a label.
    let mode = crate::gpu_mode::GpuMode::parse(value).map_or("invalid".to_string(), |m| crate::status::records::mode_kind(&m.to_string()).to_string());
    let labels = vec![("mode", mode), ("outcome", outcome.as_str().to_string())];
    crate::observe::record(cfg, &[crate::metrics::Event::count(family, labels)]);
}

/// Drains the node with `gpu-mode: <reason>` (when the config allows) and
/// logs that action too; a drain set is remembered and counted under
/// `source` with `fault`'s label.
pub fn drain_for(cfg: &Config, source: &'static str, fault: Fault, node: &str, reason: &str) {
    if !cfg.slurm.drain_on_node_fault {
        return;
    }
    let result = Scontrol::new(&cfg.slurm.scontrol).drain_unless_drained(node, reason);
    let full_reason = crate::drain::drain_reason(reason);
    let line = ActionLine::new("drain").field("node", node).field("reason", &full_reason);
    match result {
        Ok(DrainAction::Drained) => {
            line.outcome(Outcome::Ok).emit(&cfg.log);
            crate::observe::drain_set(cfg, source, fault.label(), &full_reason);
        }
        Ok(DrainAction::AlreadyDrained { reason }) => {
            line.field("detail", format!("already drained: {reason}")).outcome(Outcome::Skipped).emit(&cfg.log)
        }
        Err(e) => line.field("detail", e).outcome(Outcome::Failed).emit(&cfg.log),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn env() -> JobEnv {
        JobEnv {
            job_id: 3,
            uid: 1000,
            gid: 1000,
            user: "u".into(),
            node: "n9".into(),
            slurm_gpus: vec![0],
            mode_value: Some("mps".into()),
            restart_count: 0,
        }
    }

    pub(super) fn cfg_with_fake_scontrol(dir: &std::path::Path) -> (Config, PathBuf) {
        let log = dir.join("argv");
        // Answers `show node` with an idle node; records every call.
        let body = format!("echo \"$@\" >> {}\nif [ \"$1\" = show ]; then echo '   State=IDLE'; fi", log.display());
        let script = gpu_mode_testkit::script(dir, "scontrol", &body);
        let mut cfg = Config::default();
        cfg.slurm.scontrol = script;
        cfg.log.syslog = false;
        // A drain set is remembered there: never in the machine's own /run.
        cfg.runtime_dir = dir.join("run");
        (cfg, log)
    }

    #[test]
    fn exit_codes_and_drains_follow_the_failure_class() {
        let dir = tempfile::tempdir().unwrap();
        let (cfg, log) = cfg_with_fake_scontrol(dir.path());
        let ok = Report { outcome: Outcome::Ok, mode: Some("mps".into()), detail: None };
        assert_eq!(finish("prolog", &cfg, &env(), Ok(ok)), 0);
        assert_eq!(finish("prolog", &cfg, &env(), Err(Failure::Job("no such profile".into()))), 0);
        assert!(!log.exists(), "neither success nor a job refusal may drain");
        assert_eq!(finish("prolog", &cfg, &env(), Err(Failure::node(Fault::JobState, "disk full"))), EXIT_NODE_FAULT);
        let argv = std::fs::read_to_string(&log).unwrap();
        assert_eq!(
            argv.lines().collect::<Vec<_>>(),
            vec!["show node n9", "update NodeName=n9 State=DRAIN Reason=gpu-mode: prolog: disk full"]
        );
        let last = crate::drain::last_drain(&cfg.runtime_dir).unwrap().expect("the drain is remembered for gpu-mode status");
        assert_eq!(last.reason, "gpu-mode: prolog: disk full");
    }

    /// Each run of a job with a mode is counted by mode kind and outcome;
    /// jobs without a mode are not (and user text never becomes a label).
    #[test]
    fn runs_are_counted_by_mode_kind_and_outcome() {
        let dir = tempfile::tempdir().unwrap();
        let (mut cfg, _) = cfg_with_fake_scontrol(dir.path());
        cfg.metrics.textfile = Some(dir.path().join("gpu-mode.prom"));
        let ok = || Ok(Report { outcome: Outcome::Ok, mode: Some("mps".into()), detail: None });
        let with_mode = |m: Option<&str>| JobEnv { mode_value: m.map(String::from), ..env() };
        finish("prolog", &cfg, &with_mode(Some("mps:threads=30")), ok());
        finish("prolog", &cfg, &with_mode(Some("mps")), ok());
        finish("prolog", &cfg, &with_mode(Some("mig:1g.10gb")), Err(Failure::Job("no such profile".into())));
        finish("epilog", &cfg, &with_mode(Some("mig:1g.10gb")), Err(Failure::node(Fault::Mig, "teardown")));
        finish("prolog", &cfg, &with_mode(Some("$(evil)")), Err(Failure::Job("bad value".into())));
        finish("prolog", &cfg, &with_mode(None), ok());
        let text = std::fs::read_to_string(dir.path().join("gpu-mode.prom")).unwrap();
        let counted = |l: &&str| (l.starts_with("gpu_mode_prolog_runs_total") || l.starts_with("gpu_mode_epilog_runs_total")) && !l.ends_with(" 0");
        let runs: Vec<&str> = text.lines().filter(counted).collect();
        assert_eq!(
            runs,
            [
                "gpu_mode_prolog_runs_total{mode=\"invalid\",outcome=\"refused\"} 1",
                "gpu_mode_prolog_runs_total{mode=\"mig\",outcome=\"refused\"} 1",
                "gpu_mode_prolog_runs_total{mode=\"mps\",outcome=\"ok\"} 2",
                "gpu_mode_epilog_runs_total{mode=\"mig\",outcome=\"failed\"} 1",
            ]
        );
        assert!(text.lines().any(|l| l == "gpu_mode_drains_total{source=\"epilog\",reason=\"mig\"} 1"), "{text}");
    }

    #[test]
    fn drain_can_be_turned_off_but_the_exit_code_stays() {
        let dir = tempfile::tempdir().unwrap();
        let (mut cfg, log) = cfg_with_fake_scontrol(dir.path());
        cfg.slurm.drain_on_node_fault = false;
        assert_eq!(finish("epilog", &cfg, &env(), Err(Failure::node(Fault::Mps, "x"))), EXIT_NODE_FAULT);
        assert!(!log.exists());
    }
}

/// Which verb a hook binary runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Prolog,
    Epilog,
}

impl Verb {
    pub fn name(self) -> &'static str {
        match self {
            Verb::Prolog => "prolog",
            Verb::Epilog => "epilog",
        }
    }
}

/// Exit code for a helper started wrongly (bad arguments, not under slurmd).
pub const EXIT_USAGE: i32 = 2;

/// The whole of `gpu-mode-prolog` / `gpu-mode-epilog` after their arguments
/// (`cli`): config, job environment, the verb, and [`finish`]. Returns the
/// process exit code.
pub fn run_hook(verb: Verb, config_path: Option<std::path::PathBuf>) -> i32 {
    let env = match JobEnv::from_process_env() {
        Ok(e) => e,
        Err(e) => {
            crate::log::stderr_line(&format!("gpu-mode-{}: {e}", verb.name()));
            return EXIT_USAGE;
        }
    };
    let (cfg, config_error) = Config::load_or_salvage(config_path.as_deref());
    log_config_notices(&cfg, &env);
    let dog = arm_watchdog(verb, &cfg, &env);
    let result = match &config_error {
        None => match verb {
            Verb::Prolog => prolog::run(&cfg, &env),
            Verb::Epilog => epilog::run(&cfg, &env),
        },
        Some(e) => with_broken_config(verb, &cfg, &env, &e.to_string()),
    };
    let code = {
        let _step = watchdog::step("log and drain");
        finish(verb.name(), &cfg, &env, result)
    };
    if let Some(dog) = dog {
        dog.disarm();
    }
    code
}

/// What the site config still says in a form that goes in a later release
/// (`Config::notices`): one `action=config` line each, as for a config that
/// cannot be read, so that the admin reads it where the hooks' lines go.
fn log_config_notices(cfg: &Config, env: &JobEnv) {
    for notice in &cfg.notices {
        ActionLine::new("config")
            .field("job", env.job_id)
            .field("node", &env.node)
            .field("detail", format!("{}: deprecated: {notice}", cfg.path().display()))
            .outcome(Outcome::Ok)
            .emit(&cfg.log);
    }
}

/// Bounds the whole run by `hook_deadline_ms`: slurmd waits for a Prolog or
/// Epilog forever by default, so a hung NVML or driver call would hold the
/// node with no reason given. On fire: the verb's failure line and a drain
/// naming the step that hung, then exit [`EXIT_NODE_FAULT`].
fn arm_watchdog(verb: Verb, cfg: &Config, env: &JobEnv) -> Option<HookWatchdog> {
    let deadline = std::time::Duration::from_millis(cfg.hook_deadline_ms);
    let (fire_cfg, fire_env) = (cfg.clone(), env.clone());
    let on_fire = move |step: &str| {
        let msg = format!("{step} did not finish within {} s", watchdog::seconds(deadline));
        finish(verb.name(), &fire_cfg, &fire_env, Err(Failure::Node(Fault::Hang, msg)));
    };
    match HookWatchdog::arm(deadline, EXIT_NODE_FAULT, on_fire) {
        Ok(w) => Some(w),
        // Without a thread to spare the run still goes on: refusing the job
        // for it would help no one.
        Err(e) => {
            let line = ActionLine::new("watchdog").field("job", env.job_id).field("detail", format!("running unbounded: {e}"));
            line.outcome(Outcome::Failed).emit(&cfg.log);
            None
        }
    }
}

/// What a hook does when the site config does not load (audit item H2). A
/// config typo must not fail or drain for jobs that asked for no mode: those
/// pass untouched. A job with a mode is refused with a message that says
/// why (its tasks fail; the node stays up for everyone else). The epilog
/// still undoes what earlier jobs left, with the salvaged settings. Every
/// time, the error is logged loudly so the admin sees it.
fn with_broken_config(verb: Verb, cfg: &Config, env: &JobEnv, error: &str) -> Result<Report, Failure> {
    ActionLine::new("config")
        .field("job", env.job_id)
        .field("node", &env.node)
        .field("detail", format!("{error}; jobs without --gpu-mode are unaffected, jobs with one are refused until it is fixed"))
        .outcome(Outcome::Failed)
        .emit(&cfg.log);
    match verb {
        Verb::Prolog if env.mode_value.is_none() => prolog::run(cfg, env),
        Verb::Prolog => {
            let mode = env.mode_value.as_deref().unwrap_or_default();
            let why = format!("the gpu-mode site configuration of node {} is invalid, so no GPU mode can be set up there: ask the site admin to fix it ({error})", env.node);
            prolog::refuse(cfg, env, mode, why)
        }
        // Health checks after the epilog need the thresholds: skipped.
        Verb::Epilog => epilog::undo_job(cfg, env),
    }
}

#[cfg(test)]
mod watchdog_tests {
    use super::*;
    use std::ffi::OsStr;
    use std::time::{Duration, Instant};

    /// Set (to the test directory) in the child that runs the prolog.
    const CHILD_VAR: &str = "GPU_MODE_HOOK_WATCHDOG_TEST_DIR";

    /// The simulated NVML, its state file locked by this test: nvmlInit
    /// waits for the lock for good, like a driver that never answers.
    #[test]
    fn a_prolog_stuck_opening_nvml_drains_the_node_naming_the_step_and_exits() {
        if let Some(dir) = std::env::var_os(CHILD_VAR) {
            let config = std::path::Path::new(&dir).join("config.toml");
            std::process::exit(run_hook(Verb::Prolog, Some(config)));
        }
        let dir = tempfile::tempdir().unwrap();
        let sim_state = std::fs::File::create(dir.path().join("sim-state.json")).unwrap();
        let _held = nix::fcntl::Flock::lock(sim_state, nix::fcntl::FlockArg::LockExclusive).unwrap();
        let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
        let sim = [deps.join("libnvml_sim.so"), deps.join("../libnvml_sim.so")].into_iter().find(|p| p.exists()).unwrap();
        let (cfg, argv) = tests::cfg_with_fake_scontrol(dir.path());
        let config = format!(
            "runtime_dir = \"{}\"\nhook_deadline_ms = 300\n[slurm]\nscontrol = \"{}\"\n[log]\nsyslog = false\n[nvml]\nlibrary = \"{}\"\n",
            dir.path().join("run").display(),
            cfg.slurm.scontrol.display(),
            sim.display(),
        );
        std::fs::write(dir.path().join("config.toml"), config).unwrap();
        let job = [
            ("SLURM_JOB_ID", "5"),
            ("SLURM_JOB_UID", "1000"),
            ("SLURM_JOB_GID", "1000"),
            ("SLURMD_NODENAME", "n9"),
            ("SLURM_JOB_GPUS", "0"),
            (crate::job_env::PROLOG_MODE_VAR, "mps"),
        ];
        let mut env: Vec<(&str, &OsStr)> = job.iter().map(|(k, v)| (*k, OsStr::new(*v))).collect();
        let state = dir.path().join("sim-state.json");
        env.extend([
            ("GPU_MODE_SIM_STATE", state.as_os_str()),
            (CHILD_VAR, dir.path().as_os_str()),
        ]);
        let start = Instant::now();
        let test = "lifecycle::watchdog_tests::a_prolog_stuck_opening_nvml_drains_the_node_naming_the_step_and_exits";
        let out = gpu_mode_testkit::run_test_in_child(test, &env, Duration::from_secs(30));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(EXIT_NODE_FAULT), "{stderr}");
        assert!(start.elapsed() < Duration::from_secs(20), "took {:?}", start.elapsed());
        let drain = "update NodeName=n9 State=DRAIN Reason=gpu-mode: prolog: nvml: open did not finish within 0.3 s";
        assert!(std::fs::read_to_string(&argv).unwrap().lines().any(|l| l == drain), "{stderr}");
        assert!(stderr.contains("action=prolog job=5 node=n9") && stderr.contains("outcome=failed"), "{stderr}");
    }
}
