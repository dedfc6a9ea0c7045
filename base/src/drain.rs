//! Draining and resuming the node through scontrol, NHC-style: our reasons all
//! start with [`DRAIN_PREFIX`]; we never override another reason and never
//! resume a node someone else drained.

use std::path::{Path, PathBuf};
use crate::command::{run_with_timeout, CommandError};
use std::process::Command;
use std::time::Duration;

/// Every drain reason this project sets starts with this.
pub const DRAIN_PREFIX: &str = "gpu-mode:";
/// Slurm keeps reasons short in `sinfo -R`; longer ones are cut here, not there.
pub const MAX_REASON_LEN: usize = 200;
/// scontrol talks to slurmctld; a hung controller must not hang a prolog forever.
const SCONTROL_TIMEOUT: Duration = Duration::from_secs(20);

/// Whether `n` could be a Slurm node name (letters, digits, `-_.`): only
/// such a name is handed to scontrol as one.
pub fn is_node_name(n: &str) -> bool {
    !n.is_empty() && n.len() <= 64 && n.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// A `--node` value as given, checked: the error is the usage line.
pub fn explicit_node(node: Option<&str>) -> Result<Option<&str>, String> {
    match node {
        Some(n) if !is_node_name(n) => Err(format!("--node {n:?} is not a Slurm node name (letters, digits, -_.)")),
        other => Ok(other),
    }
}

/// The Slurm node name given: `--node`, else `SLURMD_NODENAME` (all a
/// HealthCheckProgram gets). Only names Slurm could have are used.
pub fn given_node_name(explicit: Option<&str>) -> Option<String> {
    match explicit {
        Some(n) => is_node_name(n).then(|| n.to_string()),
        None => std::env::var("SLURMD_NODENAME").ok().filter(|n| is_node_name(n)),
    }
}

/// [`given_node_name`], else (nothing given) the short host name, slurmd's
/// default.
pub fn node_name(explicit: Option<&str>) -> Option<String> {
    if explicit.is_some() {
        return given_node_name(explicit);
    }
    given_node_name(None).or_else(|| {
        let host = nix::unistd::gethostname().ok()?.into_string().ok()?;
        host.split('.').next().filter(|h| is_node_name(h)).map(str::to_string)
    })
}

/// Builds a drain reason: `gpu-mode: <detail>`, one line, printable ASCII, bounded.
pub fn drain_reason(detail: &str) -> String {
    let clean: String = detail
        .chars()
        .map(|c| if c.is_ascii_graphic() || c == ' ' { c } else { '?' })
        .collect();
    let mut reason = format!("{DRAIN_PREFIX} {clean}");
    if reason.len() > MAX_REASON_LEN {
        reason.truncate(MAX_REASON_LEN - 3);
        reason.push_str("...");
    }
    reason
}

/// The last drain this project set on the node, for `gpu-mode status`:
/// `<runtime_dir>/last-drain.json` (root-only; replaced at each drain).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LastDrain {
    pub version: u32,
    /// The whole reason as set (`gpu-mode: ...`).
    pub reason: String,
    pub unix: u64,
}

const LAST_DRAIN_VERSION: u32 = 1;

fn last_drain_path(runtime_dir: &Path) -> PathBuf {
    runtime_dir.join("last-drain.json")
}

/// Remembers a drain just set (`reason` as given to scontrol, prefix included).
pub fn remember(runtime_dir: &Path, reason: &str) -> Result<(), crate::persist::StateError> {
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    crate::fsutil::ensure_private_dir(runtime_dir, uid, gid, 0o755)
        .map_err(|source| crate::persist::StateError::Io { path: runtime_dir.to_path_buf(), source })?;
    let record = LastDrain { version: LAST_DRAIN_VERSION, reason: reason.to_string(), unix: crate::persist::now_unix() };
    crate::persist::write_json(&last_drain_path(runtime_dir), &record)
}

/// The last drain we set, if any since the runtime directory was made.
pub fn last_drain(runtime_dir: &Path) -> Result<Option<LastDrain>, String> {
    let path = last_drain_path(runtime_dir);
    match std::fs::read(&path) {
        Ok(text) => crate::persist::parse_versioned(&text, &path, LAST_DRAIN_VERSION).map(Some).map_err(|e| e.to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// What [`Scontrol::drain_unless_drained`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrainAction {
    Drained,
    AlreadyDrained { reason: String },
}

/// A node's state and reason, parsed from `scontrol show node`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeStatus {
    /// e.g. `IDLE+DRAIN`, `MIXED`, `DOWN*+DRAIN`.
    pub state: String,
    /// Empty when none. Slurm appends ` [user@time]`.
    pub reason: String,
}

impl NodeStatus {
    pub fn parse(show_node: &str) -> NodeStatus {
        let state = show_node
            .split_whitespace()
            .find_map(|w| w.strip_prefix("State="))
            .unwrap_or_default()
            .to_string();
        // Reason= runs to the end of its line and may contain spaces.
        let reason = show_node
            .lines()
            .find_map(|l| l.trim_start().strip_prefix("Reason="))
            .unwrap_or_default()
            .trim()
            .to_string();
        NodeStatus { state, reason }
    }

    pub fn is_drained_or_down(&self) -> bool {
        self.state.split('+').any(|f| matches!(f.trim_end_matches('*'), "DRAIN" | "DRAINED" | "DRAINING" | "DOWN" | "FAIL" | "FAILING"))
    }

    /// Whether the current reason is one of ours.
    pub fn reason_is_ours(&self) -> bool {
        self.reason.starts_with(DRAIN_PREFIX)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    #[error(transparent)]
    Run(#[from] CommandError),
    #[error("{path} {args} failed ({status}): {stderr}")]
    Failed { path: PathBuf, args: String, status: String, stderr: String },
}

/// Job states Slurm never leaves (a requeued job goes back to PENDING).
const FINAL_JOB_STATES: &[&str] =
    &["COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "DEADLINE", "BOOT_FAIL", "PREEMPTED"];

/// Runs scontrol by absolute path with an argument vector (no shell).
#[derive(Debug, Clone)]
pub struct Scontrol {
    path: PathBuf,
    timeout: Duration,
}

impl Scontrol {
    pub fn new(path: &Path) -> Self {
        Scontrol { path: path.to_path_buf(), timeout: SCONTROL_TIMEOUT }
    }

    /// The same with another bound on each call.
    pub fn with_timeout(self, timeout: Duration) -> Self {
        Scontrol { timeout, ..self }
    }

    /// `scontrol update NodeName=<node> State=DRAIN Reason=<gpu-mode: detail>`.
    pub fn drain(&self, node: &str, detail: &str) -> Result<(), DrainError> {
        let reason = drain_reason(detail);
        self.run(&["update", &format!("NodeName={node}"), "State=DRAIN", &format!("Reason={reason}")])
            .map(|_| ())
    }

    /// Drains unless the node is already drained or down, whoever did it: the
    /// first reason is the one that explains the node, and an admin's drain
    /// must never be overwritten. Returns what was done.
    pub fn drain_unless_drained(&self, node: &str, detail: &str) -> Result<DrainAction, DrainError> {
        let status = NodeStatus::parse(&self.show_node(node)?);
        if status.is_drained_or_down() {
            return Ok(DrainAction::AlreadyDrained { reason: status.reason });
        }
        self.drain(node, detail)?;
        Ok(DrainAction::Drained)
    }

    /// `scontrol update NodeName=<node> State=RESUME`.
    pub fn resume(&self, node: &str) -> Result<(), DrainError> {
        self.run(&["update", &format!("NodeName={node}"), "State=RESUME"]).map(|_| ())
    }

    /// `scontrol requeue <job>` (see crate::skipped_prolog).
    pub fn requeue(&self, job: u32) -> Result<(), DrainError> {
        self.run(&["requeue", &job.to_string()]).map(|_| ())
    }

    /// Whether Slurm has finished `job` for good: a final state, or no
    /// longer known (purged after MinJobAge). A pending, requeued, held or
    /// running job has not; an array whose job id lists several tasks has
    /// once every task has; an error (no controller) is an error, never
    /// taken as an end. The state is squeue's `%T` ([`Self::job_field`]):
    /// `scontrol show job` prints the job's name before its state, and a job
    /// named `x JobState=PENDING` must not stay unended (issue 27 F5).
    pub fn job_has_ended(&self, job: u32) -> Result<bool, DrainError> {
        Ok(match self.job_field(job, &["-o", "%T"])? {
            None => true,
            Some(states) => !states.is_empty() && states.iter().all(|s| FINAL_JOB_STATES.contains(&s.trim())),
        })
    }

    /// How many times Slurm has requeued `job`: squeue's `RestartCnt`, which
    /// Slurm counts up at the requeue itself, so an epilog that reads more
    /// than its own run's count knows the job comes back. `None`: Slurm no
    /// longer knows the job, or printed anything but one number (an array's
    /// tasks); an error (no controller) is an error.
    pub fn restart_count(&self, job: u32) -> Result<Option<u32>, DrainError> {
        Ok(match self.job_field(job, &["-O", "RestartCnt"])?.as_deref() {
            Some([line]) => line.trim().parse().ok(),
            _ => None,
        })
    }

    /// One field of job `job`, one line per job record Slurm lists under that
    /// id (an array's job id lists its tasks): `squeue -h -t all -j <job>
    /// <format>`, run from scontrol's directory (Slurm installs both in one).
    /// `format` names that field alone (`-o %T`, `-O admin_comment:N`), so
    /// no user text (the job's name, command, directory, comment) is printed
    /// around it and none can be taken for it, as it can in `scontrol show
    /// job`. `None`: Slurm no longer knows the job (squeue's "Invalid job id
    /// specified", or no line at all with every state asked for).
    pub fn job_field(&self, job: u32, format: &[&str]) -> Result<Option<Vec<String>>, DrainError> {
        let job = job.to_string();
        let args: Vec<&str> = ["-h", "-t", "all", "-j", &job].into_iter().chain(format.iter().copied()).collect();
        match self.run_program(&self.path.with_file_name("squeue"), &args) {
            Ok(text) if text.is_empty() => Ok(None),
            Ok(text) => Ok(Some(text.lines().map(str::to_string).collect())),
            Err(DrainError::Failed { stderr, .. }) if stderr.contains("Invalid job id specified") => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The nodes of partition `partition`, one name each: `sinfo -h -N -p
    /// <partition> -o %N`, run from scontrol's directory as squeue is.
    pub fn partition_nodes(&self, partition: &str) -> Result<Vec<String>, DrainError> {
        let text = self.run_program(&self.path.with_file_name("sinfo"), &["-h", "-N", "-p", partition, "-o", "%N"])?;
        let mut nodes: Vec<String> = text.lines().map(|l| l.trim().to_string()).filter(|l| !l.is_empty()).collect();
        nodes.dedup();
        Ok(nodes)
    }

    /// `scontrol show job <job>` (one field per line), raw text.
    pub fn show_job(&self, job: u32) -> Result<String, DrainError> {
        self.run(&["show", "job", &job.to_string()])
    }

    /// `scontrol update JobId=<job> <key>=<value>`, the value one argument
    /// whatever it holds (scontrol splits at the first `=`).
    pub fn update_job(&self, job: u32, key: &str, value: &str) -> Result<(), DrainError> {
        self.run(&["update", &format!("JobId={job}"), &format!("{key}={value}")]).map(|_| ())
    }

    /// `scontrol show node <node>`, raw text.
    pub fn show_node(&self, node: &str) -> Result<String, DrainError> {
        self.run(&["show", "node", node])
    }

    fn run(&self, args: &[&str]) -> Result<String, DrainError> {
        self.run_program(&self.path, args)
    }

    fn run_program(&self, program: &Path, args: &[&str]) -> Result<String, DrainError> {
        let mut cmd = Command::new(program);
        cmd.args(args);
        let out = run_with_timeout(cmd, None, self.timeout).map_err(DrainError::Run)?;
        if !out.status.success() {
            return Err(DrainError::Failed {
                path: program.to_path_buf(),
                args: args.join(" "),
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    use gpu_mode_testkit::script;

    #[test]
    fn node_names_must_look_like_slurm_node_names() {
        let cases = [
            (Some("gpu01"), Ok(Some("gpu01"))),
            (Some("a b"), Err("--node \"a b\" is not a Slurm node name (letters, digits, -_.)")),
            (Some("n=1"), Err("--node \"n=1\" is not a Slurm node name (letters, digits, -_.)")),
            (None, Ok(None)),
        ];
        for (given, want) in cases {
            gpu_mode_testkit::table::check_row(&format!("{given:?}"), explicit_node(given), want);
            assert_eq!(node_name(given).is_some(), given.is_none_or(is_node_name), "{given:?}");
        }
        assert!(node_name(None).is_some(), "SLURMD_NODENAME or the host name");
    }

    /// Issue 27 F5: the job's name (`x JobState=PENDING`) is printed before
    /// its state in `scontrol show job -o`; the state comes from squeue's
    /// `%T` alone, which holds no user text, whatever scontrol would show.
    #[test]
    fn a_job_has_ended_in_a_final_state_or_once_slurm_forgot_it_and_an_error_is_no_answer() {
        let dir = tempfile::tempdir().unwrap();
        let hostile = "echo 'JobId=7 JobName=x JobState=PENDING Comment=JobState=RUNNING JobState=CANCELLED Reason=None'";
        let scontrol = script(dir.path(), "scontrol", hostile);
        let cases: [(&str, Option<bool>); 10] = [
            ("echo CANCELLED", Some(true)),
            ("echo COMPLETED", Some(true)),
            ("echo PREEMPTED", Some(true)),
            ("echo PENDING", Some(false)),
            ("echo RUNNING", Some(false)),
            // An array's tasks: ended once every one has.
            ("printf 'COMPLETED\nRUNNING\n'", Some(false)),
            ("printf 'COMPLETED\nFAILED\n'", Some(true)),
            // Purged after MinJobAge: squeue's error, or nothing at all.
            ("echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1", Some(true)),
            ("exit 0", Some(true)),
            ("echo 'slurm_load_jobs error: Unable to contact slurm controller' >&2; exit 1", None),
        ];
        for (body, want) in cases {
            script(dir.path(), "squeue", &format!("echo \"$*\" > {}/argv\n{body}", dir.path().display()));
            assert_eq!(Scontrol::new(&scontrol).job_has_ended(7).ok(), want, "{body}");
            assert_eq!(std::fs::read_to_string(dir.path().join("argv")).unwrap(), "-h -t all -j 7 -o %T\n");
        }
    }

    #[test]
    fn a_restart_count_is_one_number_and_anything_else_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let scontrol = script(dir.path(), "scontrol", "exit 1");
        let cases: [(&str, Option<Option<u32>>); 7] = [
            ("echo '2                   '", Some(Some(2))),
            ("echo 0", Some(Some(0))),
            // An array's tasks, a word, nothing: no count.
            ("printf '1\n2\n'", Some(None)),
            ("echo N/A", Some(None)),
            ("exit 0", Some(None)),
            ("echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1", Some(None)),
            ("echo 'slurm_load_jobs error: Unable to contact slurm controller' >&2; exit 1", None),
        ];
        for (body, want) in cases {
            script(dir.path(), "squeue", &format!("echo \"$*\" > {}/argv\n{body}", dir.path().display()));
            assert_eq!(Scontrol::new(&scontrol).restart_count(7).ok(), want, "{body}");
            assert_eq!(std::fs::read_to_string(dir.path().join("argv")).unwrap(), "-h -t all -j 7 -O RestartCnt\n");
        }
    }

    #[test]
    fn reasons_carry_the_prefix_and_are_sanitised() {
        assert_eq!(drain_reason("MPS zombie pid 12"), "gpu-mode: MPS zombie pid 12");
        assert_eq!(drain_reason("a\nb\tc"), "gpu-mode: a?b?c");
        let long = drain_reason(&"x".repeat(500));
        assert_eq!(long.len(), MAX_REASON_LEN);
        assert!(long.ends_with("..."));
    }

    /// A stand-in scontrol that records its argv, one argument per line.
    fn fake_scontrol(dir: &Path, exit: i32) -> (PathBuf, PathBuf) {
        let log = dir.join("argv");
        let body = format!("for a in \"$@\"; do echo \"$a\"; done >> {}\necho oops >&2\nexit {exit}", log.display());
        (script(dir, "scontrol", &body), log)
    }

    const SHOW_DRAINED: &str = "NodeName=n1 Arch=x86_64 CoresPerSocket=1\n   State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0\n   Reason=gpu-mode: prolog: disk full [root@2026-11-21T05:16:06]\n";

    #[test]
    fn node_status_is_parsed_from_scontrol_show_node() {
        let cases = [
            (SHOW_DRAINED, "IDLE+DRAIN", "gpu-mode: prolog: disk full [root@2026-11-21T05:16:06]", true, true),
            ("NodeName=n1\n   State=IDLE ThreadsPerCore=1\n", "IDLE", "", false, false),
            ("   State=DOWN* ThreadsPerCore=1\n   Reason=Not responding [slurm@x]\n", "DOWN*", "Not responding [slurm@x]", true, false),
            ("   State=MIXED+DRAIN\n   Reason=admin: bad fan\n", "MIXED+DRAIN", "admin: bad fan", true, false),
            ("   State=ALLOCATED\n", "ALLOCATED", "", false, false),
        ];
        for (text, state, reason, drained, ours) in cases {
            let s = NodeStatus::parse(text);
            assert_eq!((s.state.as_str(), s.reason.as_str()), (state, reason));
            assert_eq!(s.is_drained_or_down(), drained, "{state}");
            assert_eq!(s.reason_is_ours(), ours, "{reason}");
        }
    }

    #[test]
    fn drain_unless_drained_keeps_the_first_reason() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("argv");
        let body = format!("echo \"$@\" >> {}\nif [ \"$1\" = show ]; then printf '%s' '{}'; fi", log.display(), SHOW_DRAINED);
        let script = script(dir.path(), "scontrol", &body);
        let action = Scontrol::new(&script).drain_unless_drained("n1", "epilog: other").unwrap();
        assert_eq!(
            action,
            DrainAction::AlreadyDrained { reason: "gpu-mode: prolog: disk full [root@2026-11-21T05:16:06]".into() }
        );
        assert_eq!(std::fs::read_to_string(&log).unwrap().trim(), "show node n1", "must not issue an update");
    }

    #[test]
    fn drain_passes_the_reason_as_one_argument() {
        let dir = tempfile::tempdir().unwrap();
        let (script, log) = fake_scontrol(dir.path(), 0);
        Scontrol::new(&script).drain("n1", "prolog: it's $(bad); `x`").unwrap();
        let argv = std::fs::read_to_string(log).unwrap();
        assert_eq!(
            argv.lines().collect::<Vec<_>>(),
            vec!["update", "NodeName=n1", "State=DRAIN", "Reason=gpu-mode: prolog: it's $(bad); `x`"]
        );
    }

    #[test]
    fn failures_are_reported_with_stderr() {
        let dir = tempfile::tempdir().unwrap();
        let (script, _) = fake_scontrol(dir.path(), 3);
        let err = Scontrol::new(&script).resume("n1").unwrap_err().to_string();
        assert!(err.contains("update NodeName=n1 State=RESUME failed") && err.contains("oops"), "{err}");
        let err = Scontrol::new(Path::new("/nonexistent/scontrol")).resume("n1").unwrap_err().to_string();
        assert!(err.contains("cannot run /nonexistent/scontrol"), "{err}");
    }
}
