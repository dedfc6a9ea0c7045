//! The submission check for `--gpu-mode=checkpoint`, as a pure function of
//! the submitting command line, its environment and the batch script's
//! `#SBATCH` lines. The plugin calls it in allocator/local context and fails
//! the submission with its message.
//!
//! A checkpoint job must be requeueable (`--requeue`, or JobRequeue=1 and no
//! `--no-requeue`) and must get the warning signal in its batch shell before
//! preemption (`--signal=B:USR1@<secs>`, with
//! `SlurmctldParameters=preempt_send_user_signal`), unless the site adds it.
//! Without the signal the application is killed at the end of the grace time
//! without a checkpoint; without requeue a preempted job is cancelled, and
//! its checkpoint is useless. `--open-mode=append` keeps the first run's
//! output (a requeue truncates it otherwise): advised, not required.
//!
//! A checkpoint job must also stay on one node: the agent checkpoints the
//! processes of the batch step's node, so every shape that can give the job
//! several nodes is refused here (`several_nodes`): a node count above one
//! (`-N 2`, `--nodes=2-4`) or a range that allows more (`-N 1-2`), several
//! names (`-w a,b`), more tasks than `--ntasks-per-node` puts on one node
//! (`-n 2 --ntasks-per-node=1`), `--spread-job` with several tasks, and a
//! heterogeneous job (`:`, `#SBATCH hetjob`). What depends on the nodes'
//! size (`-n 9` on nodes of 8 CPUs, `--gpus=4` on nodes of 2) cannot be
//! known here: such a job is refused at the checkpoint instead, and starts
//! over (preempt's agent, `dump.rs`).
//!
//! sbatch's precedence is followed: command line over environment over
//! `#SBATCH` lines.

use std::collections::BTreeMap;

/// What the site configuration says (`[preempt]` keys).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubmitSite {
    /// slurm.conf has JobRequeue=1 (`site_job_requeue`).
    pub job_requeue: bool,
    /// A job_submit plugin adds `--signal` (`site_signal`).
    pub adds_signal: bool,
    /// The signal gpu-mode-run checkpoints on (`signal`): its number.
    pub signal: i32,
    /// Least lead time accepted, seconds (`min_signal_lead_s`).
    pub min_lead_s: u32,
}

impl SubmitSite {
    pub fn from_config(cfg: &crate::config::PreemptConfig) -> SubmitSite {
        SubmitSite {
            job_requeue: cfg.site_job_requeue,
            adds_signal: cfg.site_signal,
            signal: crate::signal::signal_number(&cfg.signal).unwrap_or(libc::SIGUSR1),
            min_lead_s: cfg.min_signal_lead_s,
        }
    }
}

/// The options that matter, as the submission gives them (`None`: not said).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Said {
    requeue: Option<bool>,
    signal: Option<String>,
    open_mode: Option<String>,
    /// `-N`/`--nodes`, as given.
    nodes: Option<String>,
    /// `-w`/`--nodelist`, as given.
    nodelist: Option<String>,
    /// `-n`/`--ntasks`, as given.
    ntasks: Option<String>,
    /// `--ntasks-per-node`, as given.
    ntasks_per_node: Option<String>,
    /// `--spread-job` (or `SBATCH_SPREAD_JOB`).
    spread_job: Option<bool>,
    /// A heterogeneous job: `:` between components on the command line,
    /// `#SBATCH hetjob` (or `packjob`) in the script.
    hetjob: bool,
}

impl Said {
    /// Later sources override earlier ones, option by option.
    fn over(self, earlier: Said) -> Said {
        Said {
            requeue: self.requeue.or(earlier.requeue),
            signal: self.signal.or(earlier.signal),
            open_mode: self.open_mode.or(earlier.open_mode),
            nodes: self.nodes.or(earlier.nodes),
            nodelist: self.nodelist.or(earlier.nodelist),
            ntasks: self.ntasks.or(earlier.ntasks),
            ntasks_per_node: self.ntasks_per_node.or(earlier.ntasks_per_node),
            spread_job: self.spread_job.or(earlier.spread_job),
            hetjob: self.hetjob || earlier.hetjob,
        }
    }
}

/// The options of one argument list (a command line or `#SBATCH` words).
/// sbatch's short options that take their value in the next word (`-p low`).
const SHORT_WITH_VALUE: &str = "AabcCDdeFGiJLMmNnopqStwx";
/// sbatch's long options that take no value, or only one after `=`.
const LONG_FLAGS: &[&str] = &[
    "--contiguous", "--exclusive", "--get-user-env", "--help", "--hold", "--ignore-pbs", "--no-kill", "--no-requeue",
    "--overcommit", "--oversubscribe", "--parsable", "--quiet", "--reboot", "--requeue", "--spread-job", "--test-only",
    "--usage", "--use-min-nodes", "--verbose", "--version", "--wait",
];

/// sbatch's long options that this check reads, or that take no value: what
/// an abbreviation is resolved against ([`canonical`]).
const LONG_NAMES: &[&str] =
    &["--signal", "--open-mode", "--nodes", "--nodelist", "--ntasks", "--ntasks-per-node", "--gpu-mode", "--wrap"];

/// A long option's full name, as sbatch's getopt_long takes it: an exact
/// name is itself, and an abbreviation (`--ntasks-per-n`) is the one option
/// of [`LONG_NAMES`] or [`LONG_FLAGS`] it begins. sbatch accepts only an
/// abbreviation that begins one option of all of its own, so one that
/// begins exactly one of these is that option; one that begins none is
/// another option (or refused by sbatch), and one that begins several
/// is refused by sbatch as ambiguous: both are left as they are.
fn canonical(name: &str) -> &str {
    let known = || LONG_NAMES.iter().chain(LONG_FLAGS);
    if !name.starts_with("--") || name.len() < 3 || known().any(|k| *k == name) {
        return name;
    }
    let mut begun = known().filter(|k| k.starts_with(name));
    match (begun.next(), begun.next()) {
        (Some(full), None) => full,
        _ => name,
    }
}

/// What separates a heterogeneous job's components on the command line.
const HETJOB_SEPARATOR: &str = ":";

/// Where sbatch's own arguments end: the index of the batch script (the
/// first word that is neither an option nor an option's value, nor the
/// `:` between a heterogeneous job's components), if any.
fn script_index(args: &[String]) -> Option<usize> {
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        if a == "--" {
            return (i + 1 < args.len()).then_some(i + 1);
        }
        if a == HETJOB_SEPARATOR {
            i += 1;
            continue;
        }
        if !a.starts_with('-') || a == "-" {
            return Some(i);
        }
        let takes_next = if let Some(long) = a.strip_prefix("--") {
            !long.contains('=') && !LONG_FLAGS.contains(&canonical(a))
        } else {
            // -p low, but -plow and flags such as -H, -k, -Q, -s, -v.
            let mut chars = a.chars().skip(1);
            matches!((chars.next(), chars.next()), (Some(c), None) if SHORT_WITH_VALUE.contains(c))
        };
        i += if takes_next { 2 } else { 1 };
    }
    None
}

/// The batch script sbatch was given (`None` with --wrap or from stdin), to
/// read its `#SBATCH` lines.
pub fn script_path(argv: &[String]) -> Option<&str> {
    let args = argv.get(1..)?;
    if args.iter().any(|a| split_option(a).0 == "--wrap") {
        return None;
    }
    script_index(args).map(|i| args[i].as_str())
}

fn from_args(args: &[String]) -> Said {
    let mut said = Said::default();
    let own = &args[..script_index(args).unwrap_or(args.len())];
    let mut it = own.iter().peekable();
    while let Some(a) = it.next() {
        let (name, inline) = split_option(a);
        let mut value = || inline.clone().or_else(|| it.next().cloned());
        match name {
            "--requeue" => said.requeue = Some(true),
            "--no-requeue" => said.requeue = Some(false),
            "--signal" => said.signal = value(),
            "--open-mode" => said.open_mode = value(),
            "-N" | "--nodes" => said.nodes = value(),
            "-w" | "--nodelist" => said.nodelist = value(),
            "-n" | "--ntasks" => said.ntasks = value(),
            "--ntasks-per-node" => said.ntasks_per_node = value(),
            "--spread-job" => said.spread_job = Some(true),
            HETJOB_SEPARATOR => said.hetjob = true,
            _ => {}
        }
    }
    said
}

/// An option's name (a long one in full: [`canonical`]) and its value when
/// given in the same word: `--x=v`, and the short options whose value may
/// follow at once (`-N2`, `-wn1`, `-n4`).
fn split_option(a: &str) -> (&str, Option<String>) {
    if let Some(short @ ("-N" | "-w" | "-n")) = a.get(..2) {
        if a.len() > 2 && !a.starts_with("--") {
            return (short, Some(a[2..].to_string()));
        }
    }
    match a.split_once('=') {
        Some((n, v)) => (canonical(n), Some(v.to_string())),
        None => (canonical(a), None),
    }
}

fn from_env(env: &BTreeMap<String, String>) -> Said {
    let requeue = if env.contains_key("SBATCH_NO_REQUEUE") {
        Some(false)
    } else if env.contains_key("SBATCH_REQUEUE") {
        Some(true)
    } else {
        None
    };
    // sbatch reads no node or task count from its environment (22.05's
    // man page and opt.c list no SBATCH_NODES or SBATCH_NTASKS; srun's
    // SLURM_NNODES and SLURM_NTASKS are not sbatch's): the command line and
    // the script say them. SBATCH_SPREAD_JOB is read, whatever its value.
    Said {
        requeue,
        signal: env.get("SBATCH_SIGNAL").cloned(),
        open_mode: env.get("SBATCH_OPEN_MODE").cloned(),
        spread_job: env.contains_key("SBATCH_SPREAD_JOB").then_some(true),
        ..Said::default()
    }
}

/// The words of the `#SBATCH` lines at the top of a batch script (sbatch
/// stops reading them at the first command). A `hetjob` (22.05's older
/// name: `packjob`) line starts a heterogeneous job's next component: the
/// first component's words are read, and the job is marked heterogeneous.
fn from_script(script: &str) -> Said {
    let mut words = Vec::new();
    let mut hetjob = false;
    for line in script.lines().skip_while(|l| l.starts_with("#!")) {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("#SBATCH") {
            let lower = rest.to_ascii_lowercase();
            if lower.contains("hetjob") || lower.contains("packjob") {
                hetjob = true;
                break;
            }
            words.extend(rest.split_whitespace().take_while(|w| !w.starts_with('#')).map(String::from));
        } else if !(t.is_empty() || t.starts_with('#')) {
            break;
        }
    }
    Said { hetjob, ..from_args(&words) }
}

/// A parsed `--signal=[{R|B}:]<sig>[@<secs>]`.
#[derive(Debug, PartialEq, Eq)]
struct SignalSpec {
    batch: bool,
    signal: i32,
    lead_s: u32,
}

fn parse_signal(text: &str) -> Result<SignalSpec, String> {
    let (flags, rest) = match text.split_once(':') {
        Some((f, r)) => (f, r),
        None => ("", text),
    };
    if !flags.chars().all(|c| c == 'B' || c == 'R') {
        return Err(format!("--signal={text}: {flags:?} is not B or R"));
    }
    let (sig, lead) = match rest.split_once('@') {
        Some((s, l)) => (s, l.parse::<u32>().map_err(|_| format!("--signal={text}: {l:?} is not a number of seconds"))?),
        // Slurm's default lead time.
        None => (rest, 60),
    };
    let signal = crate::signal::signal_number(sig).map_err(|e| format!("--signal={text}: {e}"))?;
    Ok(SignalSpec { batch: flags.contains('B'), signal, lead_s: lead })
}

/// Checks a `--gpu-mode=checkpoint` submission. `argv[0]` is the command
/// (sbatch, srun, salloc); `script` the batch script's text when known.
/// `Ok` carries advice to print (nothing refused); `Err` the refusal.
pub fn checkpoint_submit_check(
    argv: &[String],
    env: &BTreeMap<String, String>,
    script: Option<&str>,
    site: &SubmitSite,
) -> Result<Vec<String>, String> {
    let command = argv.first().map(|a| a.rsplit('/').next().unwrap_or(a)).unwrap_or("sbatch");
    let args = argv.get(1..).unwrap_or(&[]);
    if command != "sbatch" {
        // A step inside a checkpoint job was checked when the job was submitted.
        if command == "srun" && env.contains_key("SLURM_JOB_ID") {
            return Ok(Vec::new());
        }
        // Its node options, said too: the batch job must not repeat them.
        // srun's and salloc's -N, -n, -w, --ntasks-per-node, --spread-job
        // and `:` read as sbatch's; their environment is not read here.
        let nodes = several_nodes(&from_args(args)).map(|n| format!("; and {n}")).unwrap_or_default();
        return Err(format!(
            "--gpu-mode=checkpoint needs a batch job: Slurm requeues only batch jobs, so an interactive {command} \
             job cannot be checkpointed on preemption and restored{nodes}. Submit it as:\n  {}",
            suggestion(&[], false, site)
        ));
    }
    let said = from_args(args).over(from_env(env).over(script.map(from_script).unwrap_or_default()));
    let several = several_nodes(&said);
    let problems: Vec<String> = several.iter().cloned().chain(problems(&said, site)).collect();
    if problems.is_empty() {
        return Ok(advice(&said));
    }
    Err(format!(
        "--gpu-mode=checkpoint: {}. Submit it as:\n  {}\nand start the application in the script with \
         `exec gpu-mode-run ./app` (--open-mode=append keeps the output of the runs before a requeue)",
        problems.join("; "),
        suggestion(args, several.is_some(), site)
    ))
}

/// What is wrong with a submission besides its nodes.
fn problems(said: &Said, site: &SubmitSite) -> Vec<String> {
    let mut out = Vec::new();
    match said.requeue {
        Some(false) => out.push("--no-requeue: a preempted job must be requeued to be restored".to_string()),
        None if !site.job_requeue => out.push("the job is not requeueable (add --requeue)".into()),
        _ => {}
    }
    match said.signal.as_deref().map(parse_signal) {
        None if !site.adds_signal => {
            out.push(format!("no warning signal before preemption (add --signal=B:{}@<secs>)", short(site.signal)))
        }
        None => {}
        Some(Err(e)) => out.push(e),
        Some(Ok(s)) if s.signal != site.signal => out.push(format!(
            "--signal sends {}, but gpu-mode-run checkpoints on {}",
            crate::signal::signal_name(s.signal),
            crate::signal::signal_name(site.signal)
        )),
        Some(Ok(s)) if s.lead_s < site.min_lead_s => {
            out.push(format!("--signal gives {} s to checkpoint; this site needs at least {} s", s.lead_s, site.min_lead_s))
        }
        Some(Ok(s)) if !s.batch => {
            out.push("--signal without B: is not sent to the batch shell, where gpu-mode-run runs (use B:)".into())
        }
        Some(Ok(_)) => {}
    }
    out
}

/// The refusal of a job whose options can give it more than one node, if
/// they can; the option is named. What Slurm would refuse itself (`-N two`,
/// `--ntasks-per-node=0`) is left to its own message.
fn several_nodes(said: &Said) -> Option<String> {
    let why = "checkpoint mode checkpoints the processes of one node, so a job on several nodes could not be restored \
               (use -N 1, or drop --gpu-mode=checkpoint and the job starts over when preempted)";
    if said.hetjob {
        return Some(format!(
            "a heterogeneous job (`:` between components, or `#SBATCH hetjob`) has each component placed on nodes of its own: {why}"
        ));
    }
    let range = said.nodes.as_deref().and_then(node_range);
    if let (Some((least, most)), Some(given)) = (range, said.nodes.as_deref()) {
        if least > 1 {
            return Some(format!("--nodes={given} asks for at least {least} nodes: {why}"));
        }
        if most > 1 {
            return Some(format!("--nodes={given} allows up to {most} nodes: {why}"));
        }
    }
    if let Some(names) = said.nodelist.as_deref().and_then(nodelist_names).filter(|n| n.len() > 1) {
        return Some(format!("--nodelist={} names {} nodes: {why}", names.join(","), names.len()));
    }
    if range.is_some() {
        // At most one node, whatever the tasks: Slurm holds the job to it.
        return None;
    }
    let ntasks = said.ntasks.as_deref().and_then(|n| n.parse::<u64>().ok()).filter(|n| *n > 1)?;
    if let Some(per_node) = said.ntasks_per_node.as_deref().and_then(|n| n.parse::<u64>().ok()).filter(|n| *n > 0) {
        let nodes = ntasks.div_ceil(per_node);
        if nodes > 1 {
            return Some(format!("--ntasks={ntasks} with --ntasks-per-node={per_node} needs {nodes} nodes: {why}"));
        }
    }
    (said.spread_job == Some(true))
        .then(|| format!("--spread-job spreads the --ntasks={ntasks} tasks over as many nodes as it can: {why}"))
}

/// The least and the largest node count of `-N`'s value: `2`, `2-4`
/// (min-max), `1,2,4` (sizes; newer Slurm), each with an optional `k`/`m`
/// multiplier as Slurm reads them. `None` for what Slurm would refuse
/// itself: sbatch's own message says it better than a guess here.
fn node_range(value: &str) -> Option<(u64, u64)> {
    let mut bounds = Vec::new();
    for size in value.split(',') {
        let (min, max) = size.split_once('-').unwrap_or((size, size));
        bounds.push((node_count(min)?, node_count(max)?));
    }
    Some((bounds.iter().map(|b| b.0).min()?, bounds.iter().map(|b| b.1).max()?))
}

fn node_count(text: &str) -> Option<u64> {
    let (digits, unit) = match text.char_indices().last()? {
        (i, 'k' | 'K') => (&text[..i], 1024),
        (i, 'm' | 'M') => (&text[..i], 1024 * 1024),
        _ => (text, 1),
    };
    digits.parse::<u64>().ok()?.checked_mul(unit)
}

/// The node names of `-w`'s value, a hostlist (`a,b`, `n[1-2]`); `None`
/// for a file of names (a `/` in it: not read here) or what does not expand.
fn nodelist_names(value: &str) -> Option<Vec<String>> {
    if value.contains('/') {
        return None;
    }
    let mut names = crate::hostlist::expand(value).ok()?;
    names.sort();
    names.dedup();
    Some(names)
}

fn advice(said: &Said) -> Vec<String> {
    if said.open_mode.as_deref() == Some("append") {
        return Vec::new();
    }
    vec!["add --open-mode=append: a requeued checkpoint job otherwise truncates the output of its earlier runs".into()]
}

/// `USR1` for SIGUSR1.
fn short(signal: i32) -> String {
    crate::signal::signal_name(signal).trim_start_matches("SIG").to_string()
}

/// The sbatch line to use: the user's own arguments with the options this
/// check decides replaced. `one_node`: the job was refused for the nodes it
/// can get, so the line asks for one (`-N 1`) and leaves out what spread it
/// (`--ntasks-per-node`, `--spread-job`, a `-w` of several names, the
/// heterogeneous job's other components). Shown only, never run: quoted for
/// the reader.
fn suggestion(args: &[String], one_node: bool, site: &SubmitSite) -> String {
    let lead = site.min_lead_s.max(120);
    let mut line = vec![
        "sbatch".to_string(),
        "--gpu-mode=checkpoint".into(),
        format!("--signal=B:{}@{lead}", short(site.signal)),
        "--requeue".into(),
        "--open-mode=append".into(),
    ];
    let script = script_index(args).unwrap_or(args.len());
    let asks_nodes = args[..script].iter().any(|a| matches!(split_option(a).0, "-N" | "--nodes"));
    if one_node && !asks_nodes {
        line.extend(["-N".to_string(), "1".into()]);
    }
    // Words up to here are left out (a heterogeneous job's other components).
    let mut skip_to = 0;
    let mut it = args.iter().enumerate();
    while let Some((i, a)) = it.next() {
        let (name, inline) = split_option(a);
        if i < skip_to {
            continue;
        }
        if i >= script {
            line.push(quote(a));
            continue;
        }
        if name == "-N" || name == "--nodes" {
            // One node: the only count a checkpoint job may ask for.
            if inline.is_none() {
                it.next();
            }
            line.extend(["-N".to_string(), "1".into()]);
            continue;
        }
        if one_node {
            if a == HETJOB_SEPARATOR {
                // The first component alone.
                skip_to = script;
                continue;
            }
            let value = || inline.clone().or_else(|| args.get(i + 1).cloned());
            let spreads = match name {
                "--spread-job" => true,
                "--ntasks-per-node" => true,
                "-w" | "--nodelist" => value().and_then(|v| nodelist_names(&v)).is_some_and(|n| n.len() > 1),
                _ => false,
            };
            if spreads {
                if inline.is_none() && name != "--spread-job" {
                    it.next();
                }
                continue;
            }
        }
        let takes_value = !a.contains('=') && matches!(name, "--signal" | "--open-mode");
        match name {
            "--requeue" | "--no-requeue" | "--signal" | "--open-mode" | "--gpu-mode" => {
                if takes_value || (name == "--gpu-mode" && !a.contains('=')) {
                    it.next();
                }
            }
            _ => line.push(quote(a)),
        }
    }
    if args.iter().all(|a| a.starts_with('-') && split_option(a).0 != "--wrap") {
        line.push("job.sh".into());
    }
    line.join(" ")
}

fn quote(a: &str) -> String {
    if !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:@,+%".contains(c)) {
        a.to_string()
    } else {
        format!("'{}'", a.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_is_found_after_options_with_separate_values() {
        let argv = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let cases: Vec<(Vec<String>, Option<&str>)> = vec![
            (argv(&["sbatch", "job.sh"]), Some("job.sh")),
            (argv(&["sbatch", "-p", "low", "--gres=gpu:1", "job.sh", "-p", "arg"]), Some("job.sh")),
            (argv(&["sbatch", "--partition", "low", "--requeue", "-n2", "job.sh"]), Some("job.sh")),
            (argv(&["sbatch", "-Q", "-t", "10", "--parsable", "./run.sh"]), Some("./run.sh")),
            (argv(&["sbatch", "--wrap", "sleep 1"]), None),
            (argv(&["sbatch", "--wrap=true", "-p", "low"]), None),
            (argv(&["sbatch", "-p", "low"]), None),
            (argv(&["sbatch", "--", "job.sh"]), Some("job.sh")),
        ];
        for (a, want) in cases {
            assert_eq!(script_path(&a), want, "{a:?}");
        }
        // Options after a separated value still count; the script's own do not.
        let said = from_args(&argv(&["-p", "low", "--signal=B:USR1@90", "job.sh", "--no-requeue"])[..]);
        assert_eq!((said.signal.as_deref(), said.requeue), (Some("B:USR1@90"), None));
    }

    fn site() -> SubmitSite {
        SubmitSite { job_requeue: false, adds_signal: false, signal: libc::SIGUSR1, min_lead_s: 60 }
    }

    fn check(cmd: &str, env: &[(&str, &str)], script: Option<&str>, site: &SubmitSite) -> Result<Vec<String>, String> {
        let argv: Vec<String> = cmd.split_whitespace().map(String::from).collect();
        let env: BTreeMap<String, String> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        checkpoint_submit_check(&argv, &env, script, site)
    }

    #[test]
    fn the_table() {
        let s = site();
        let jr = SubmitSite { job_requeue: true, ..site() };
        let added = SubmitSite { adds_signal: true, ..site() };
        let script = "#!/bin/bash\n#SBATCH --requeue\n#SBATCH --signal=B:USR1@300 # comment\n\nexec gpu-mode-run ./a\n#SBATCH --no-requeue\n";
        // (command line, env, script, site, Ok or a needle of the refusal)
        type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, Option<&'a str>, &'a SubmitSite, Result<(), &'a str>);
        let cases: Vec<Case> = vec![
            ("sbatch --gpu-mode=checkpoint --signal=B:USR1@120 --requeue --open-mode=append job.sh", vec![], None, &s, Ok(())),
            ("sbatch --signal B:SIGUSR1@90 --requeue job.sh", vec![], None, &s, Ok(())),
            ("sbatch --signal=B:10@61 --requeue job.sh", vec![], None, &s, Ok(())),
            ("sbatch --signal=B:USR1@120 job.sh", vec![], None, &jr, Ok(())),
            ("sbatch --requeue job.sh", vec![], None, &added, Ok(())),
            ("sbatch job.sh", vec![], Some(script), &s, Ok(())),
            ("sbatch job.sh", vec![("SBATCH_REQUEUE", "1"), ("SBATCH_SIGNAL", "B:USR1@100")], None, &s, Ok(())),
            ("sbatch --signal=B:USR1@120 job.sh", vec![], None, &s, Err("not requeueable (add --requeue)")),
            ("sbatch --signal=B:USR1@120 --no-requeue job.sh", vec![], None, &jr, Err("--no-requeue: a preempted job")),
            ("sbatch --requeue job.sh", vec![], None, &s, Err("no warning signal before preemption (add --signal=B:USR1@<secs>)")),
            ("sbatch --requeue --signal=B:USR2@120 job.sh", vec![], None, &s, Err("sends SIGUSR2, but gpu-mode-run checkpoints on SIGUSR1")),
            ("sbatch --requeue --signal=B:USR1@30 job.sh", vec![], None, &s, Err("gives 30 s to checkpoint; this site needs at least 60 s")),
            ("sbatch --requeue --signal=B:USR1 job.sh", vec![], None, &s, Ok(())),
            ("sbatch --requeue --signal=USR1@120 job.sh", vec![], None, &s, Err("without B:")),
            ("sbatch --requeue --signal=X:USR1@120 job.sh", vec![], None, &s, Err("is not B or R")),
            ("sbatch --requeue --signal=B:USR1@soon job.sh", vec![], None, &s, Err("not a number of seconds")),
            // The command line overrides the environment, which overrides the script.
            ("sbatch --no-requeue job.sh", vec![("SBATCH_REQUEUE", "1")], Some(script), &s, Err("--no-requeue")),
            ("sbatch job.sh", vec![("SBATCH_NO_REQUEUE", "1")], Some(script), &s, Err("--no-requeue")),
            // Options after the script name are the script's, not sbatch's.
            ("sbatch --signal=B:USR1@120 job.sh --requeue", vec![], None, &s, Err("add --requeue")),
            ("salloc --gpu-mode=checkpoint", vec![], None, &s, Err("needs a batch job")),
            ("srun --gpu-mode=checkpoint ./a", vec![], None, &s, Err("interactive srun job")),
            ("/usr/bin/srun ./a", vec![("SLURM_JOB_ID", "7")], None, &s, Ok(())),
        ];
        for (cmd, env, script, site, want) in cases {
            let got = check(cmd, &env, script, site);
            match want {
                Ok(()) => assert!(got.is_ok(), "{cmd}: {got:?}"),
                Err(needle) => {
                    let err = got.expect_err(cmd);
                    assert!(err.contains(needle), "{cmd}: {err}");
                }
            }
        }
    }

    #[test]
    fn the_refusal_shows_the_line_to_use() {
        let err = check("sbatch --gpu-mode=checkpoint -N 1 --time=1:00:00 --comment=a;b job.sh arg", &[], None, &site()).unwrap_err();
        let line = "sbatch --gpu-mode=checkpoint --signal=B:USR1@120 --requeue --open-mode=append -N 1 --time=1:00:00 '--comment=a;b' job.sh arg";
        assert!(err.contains(&format!("Submit it as:\n  {line}\n")), "{err}");
        assert!(err.contains("exec gpu-mode-run ./app") && err.contains("--open-mode=append keeps"), "{err}");
        let err = check("sbatch --signal B:USR2@5 --gpu-mode checkpoint --wrap=x", &[], None, &site()).unwrap_err();
        assert!(err.contains("  sbatch --gpu-mode=checkpoint --signal=B:USR1@120 --requeue --open-mode=append --wrap=x\n"), "{err}");
    }

    /// Every shape that can give a job several nodes is refused, naming the
    /// option; one node, a shape whose node count depends on the nodes'
    /// size (`-n 8`), or what Slurm itself would refuse, is not this
    /// check's to refuse.
    #[test]
    fn a_job_on_several_nodes_is_refused() {
        let ok = "--signal=B:USR1@120 --requeue";
        let script = |n: &str| format!("#!/bin/bash\n#SBATCH {n}\nexec gpu-mode-run ./a\n");
        // (options before job.sh, the script's #SBATCH options, refused with this needle or Ok)
        let cases: Vec<(&str, Option<&str>, Option<&str>)> = vec![
            ("", None, None),
            ("-N 1", None, None),
            ("-N1", None, None),
            ("--nodes=1", None, None),
            ("--nodes 1-1", None, None),
            ("-n 4", None, None),
            ("-n 8", None, None),
            ("-n4 -c 2", None, None),
            ("-w gma", None, None),
            ("--nodelist=gma,gma", None, None),
            ("-w ./hosts", None, None),
            // Tasks that fit --ntasks-per-node on one node, or held to one by -N.
            ("-n 4 --ntasks-per-node=4", None, None),
            ("-n 3 --ntasks-per-node 8", None, None),
            ("--ntasks-per-node=1", None, None),
            ("-N 1 -n 2 --ntasks-per-node=1", None, None),
            ("-n 1 --spread-job", None, None),
            ("--spread-job", None, None),
            ("-N 1 -n 4 --spread-job", None, None),
            ("-n 2 --ntasks-per-node=1", None, Some("--ntasks=2 with --ntasks-per-node=1 needs 2 nodes")),
            ("--ntasks-per-node=1 -n 3", None, Some("--ntasks=3 with --ntasks-per-node=1 needs 3 nodes")),
            ("-n9 --ntasks-per-node=8", None, Some("--ntasks=9 with --ntasks-per-node=8 needs 2 nodes")),
            ("--ntasks 4 --ntasks-per-node 2", None, Some("--ntasks=4 with --ntasks-per-node=2 needs 2 nodes")),
            ("-n 2 --spread-job", None, Some("--spread-job spreads the --ntasks=2 tasks over as many nodes as it can")),
            ("-N 1-2", None, Some("--nodes=1-2 allows up to 2 nodes")),
            ("--nodes=1-4", None, Some("--nodes=1-4 allows up to 4 nodes")),
            ("--nodes=1,2", None, Some("--nodes=1,2 allows up to 2 nodes")),
            ("-N 1-2 --use-min-nodes", None, Some("--nodes=1-2 allows up to 2 nodes")),
            ("-N 2", None, Some("--nodes=2 asks for at least 2 nodes")),
            ("-N2", None, Some("--nodes=2 asks for at least 2 nodes")),
            ("--nodes=2", None, Some("--nodes=2 asks for at least 2 nodes")),
            ("--nodes 2-4", None, Some("--nodes=2-4 asks for at least 2 nodes")),
            ("--nodes=4,2", None, Some("--nodes=4,2 asks for at least 2 nodes")),
            ("-N 1k", None, Some("--nodes=1k asks for at least 1024 nodes")),
            ("-w gpu[07-08]", None, Some("--nodelist=gpu07,gpu08 names 2 nodes")),
            ("--nodelist=n1,n2", None, Some("--nodelist=n1,n2 names 2 nodes")),
            // From the script; the command line wins over it.
            ("", Some("-N 2"), Some("--nodes=2 asks")),
            ("", Some("--nodes=3"), Some("--nodes=3 asks")),
            ("-N 1", Some("-N 2"), None),
            ("-N 2", Some("-N 1"), Some("--nodes=2 asks")),
            ("", Some("-n 2 --ntasks-per-node=1"), Some("--ntasks=2 with --ntasks-per-node=1 needs 2 nodes")),
            ("-n 2", Some("--ntasks-per-node=1"), Some("--ntasks=2 with --ntasks-per-node=1 needs 2 nodes")),
            ("-n 1", Some("-n 2 --ntasks-per-node=1"), None),
            ("", Some("-N 1-2"), Some("--nodes=1-2 allows up to 2 nodes")),
            ("-N 1", Some("-N 1-2"), None),
            // Heterogeneous jobs: components on nodes of their own.
            ("-N 1 : -N 1", None, Some("a heterogeneous job")),
            ("", Some("-N 1\n#SBATCH hetjob\n#SBATCH -N 1"), Some("a heterogeneous job")),
            ("", Some("-N 1\n#SBATCH packjob"), Some("a heterogeneous job")),
            // What Slurm refuses itself is left to its own message.
            ("-N two", None, None),
            ("-N 0x2", None, None),
            ("--nodes=-2", None, None),
            ("-N 1-", None, None),
            ("-n 2 --ntasks-per-node=0", None, None),
            ("-n two --ntasks-per-node=1", None, None),
            ("-N 99999999999999999999", None, None),
            ("-w n[2-1]", None, None),
        ];
        for (opts, in_script, want) in cases {
            let cmd = format!("sbatch {ok} {opts} job.sh");
            let text = in_script.map(script);
            let got = check(&cmd, &[], text.as_deref(), &site());
            match want {
                None => assert!(got.is_ok(), "{cmd} {in_script:?}: {got:?}"),
                Some(needle) => {
                    let err = got.expect_err(&cmd);
                    assert!(err.contains(needle), "{cmd}: {err}");
                    assert!(err.contains("a job on several nodes could not be restored (use -N 1, or drop --gpu-mode=checkpoint"), "{err}");
                }
            }
        }
    }

    #[test]
    fn the_line_to_use_asks_for_one_node() {
        let err = check("sbatch --requeue -N 2 -p low --nodes=2-4 -N3 job.sh", &[], None, &site()).unwrap_err();
        let line = "sbatch --gpu-mode=checkpoint --signal=B:USR1@120 --requeue --open-mode=append -N 1 -p low -N 1 -N 1 job.sh";
        assert!(err.contains(&format!("Submit it as:\n  {line}\n")), "{err}");
        assert!(err.contains("--nodes=3 asks for at least 3 nodes") && err.contains("no warning signal"), "{err}");
        // What spread the job is left out, and -N 1 asked for; the script's
        // own arguments are kept as they are.
        let head = "sbatch --gpu-mode=checkpoint --signal=B:USR1@120 --requeue --open-mode=append";
        let cases = [
            ("sbatch -n 2 --ntasks-per-node=1 -p low job.sh --ntasks-per-node=1", "-N 1 -n 2 -p low job.sh --ntasks-per-node=1"),
            ("sbatch -n 2 --ntasks-per-node 1 job.sh", "-N 1 -n 2 job.sh"),
            ("sbatch --spread-job -n2 job.sh", "-N 1 -n2 job.sh"),
            ("sbatch -w n[1-2] -p low job.sh", "-N 1 -p low job.sh"),
            ("sbatch --nodelist=n1 -n 2 --ntasks-per-node=1 job.sh", "-N 1 --nodelist=n1 -n 2 job.sh"),
            ("sbatch -N 1-2 -n 2 job.sh", "-N 1 -n 2 job.sh"),
            ("sbatch -N 1 -p a : -N 1 -p b job.sh arg", "-N 1 -p a job.sh arg"),
            ("sbatch -p a : -p b --wrap=x", "-N 1 -p a"),
        ];
        for (cmd, want) in cases {
            let err = check(cmd, &[], None, &site()).unwrap_err();
            assert!(err.contains(&format!("Submit it as:\n  {head} {want}\n")), "{cmd}: {err}");
        }
        // Not refused for its nodes: the line keeps its options.
        let err = check("sbatch -n 4 --ntasks-per-node=4 job.sh", &[], None, &site()).unwrap_err();
        assert!(err.contains(&format!("Submit it as:\n  {head} -n 4 --ntasks-per-node=4 job.sh\n")), "{err}");
    }

    /// srun and salloc are refused as interactive jobs; the node options
    /// they were given are named too, so the batch job does not repeat them.
    #[test]
    fn srun_and_salloc_name_their_node_options_too() {
        let cases = [
            ("srun --gpu-mode=checkpoint -n 2 --ntasks-per-node=1 ./a", Some("--ntasks=2 with --ntasks-per-node=1 needs 2 nodes")),
            ("srun --gpu-mode=checkpoint -N 1-2 ./a -N 5", Some("--nodes=1-2 allows up to 2 nodes")),
            ("salloc --gpu-mode=checkpoint -N2", Some("--nodes=2 asks for at least 2 nodes")),
            ("salloc --gpu-mode=checkpoint --ntasks-per-node=1 -n 3", Some("--ntasks=3 with --ntasks-per-node=1 needs 3 nodes")),
            ("salloc --gpu-mode=checkpoint -N 1 : -N 1", Some("a heterogeneous job")),
            ("srun --gpu-mode=checkpoint -n 4 ./a", None),
            ("salloc --gpu-mode=checkpoint -N 1-1", None),
        ];
        for (cmd, needle) in cases {
            let err = check(cmd, &[], None, &site()).unwrap_err();
            assert!(err.contains("needs a batch job"), "{cmd}: {err}");
            match needle {
                Some(n) => assert!(err.contains(&format!("; and {n}")) && err.contains(": checkpoint mode checkpoints the processes of one node"), "{cmd}: {err}"),
                None => assert!(!err.contains("; and"), "{cmd}: {err}"),
            }
            assert!(err.contains("\n  sbatch --gpu-mode=checkpoint --signal=B:USR1@120 --requeue --open-mode=append job.sh"), "{cmd}: {err}");
        }
        // A step inside a job is the job's: its allocation holds it.
        assert!(check("srun -n 2 --ntasks-per-node=1 ./a", &[("SLURM_JOB_ID", "7")], None, &site()).is_ok());
    }

    /// sbatch's getopt_long takes a long option by any abbreviation that
    /// begins it alone (`--ntasks-per-n=1`); the check reads them as sbatch
    /// does, and leaves alone what sbatch would refuse as ambiguous.
    #[test]
    fn abbreviated_long_options_are_read_as_sbatch_reads_them() {
        let names = [
            ("--ntasks-per-n", "--ntasks-per-node"),
            ("--ntasks-per-node", "--ntasks-per-node"),
            ("--ntasks", "--ntasks"),
            ("--nodel", "--nodelist"),
            ("--nodes", "--nodes"),
            ("--node", "--node"),
            ("--nt", "--nt"),
            ("--req", "--requeue"),
            ("--no-req", "--no-requeue"),
            ("--spread", "--spread-job"),
            ("--sig", "--signal"),
            ("--partition", "--partition"),
            ("--", "--"),
            ("-n", "-n"),
        ];
        for (given, full) in names {
            assert_eq!(canonical(given), full, "{given}");
        }
        let ok = "sbatch --sig=B:USR1@120 --req job.sh";
        assert!(check(ok, &[], None, &site()).is_ok(), "abbreviated --signal and --requeue");
        let cases = [
            ("sbatch --sig=B:USR1@120 --req -n 2 --ntasks-per-n=1 job.sh", "--ntasks=2 with --ntasks-per-node=1 needs 2 nodes"),
            ("sbatch --sig=B:USR1@120 --req --ntasks-per-n 1 --ntasks=3 job.sh", "--ntasks=3 with --ntasks-per-node=1 needs 3 nodes"),
            ("sbatch --sig=B:USR1@120 --req --nodel=a,b job.sh", "--nodelist=a,b names 2 nodes"),
            ("sbatch --sig=B:USR1@120 --req --spread -n 2 job.sh", "--spread-job spreads the --ntasks=2 tasks"),
        ];
        for (cmd, needle) in cases {
            let err = check(cmd, &[], None, &site()).map(|ok| format!("accepted: {ok:?}")).unwrap_or_else(|e| e);
            assert!(err.contains(needle), "{cmd}: {err}");
        }
        // An abbreviated flag takes no value: the script after it is found.
        assert_eq!(script_path(&"sbatch --req job.sh -n 2".split_whitespace().map(String::from).collect::<Vec<_>>()), Some("job.sh"));
        assert_eq!(script_path(&"sbatch --wr=hostname".split_whitespace().map(String::from).collect::<Vec<_>>()), None);
        // The line to use drops what spread the job, abbreviated or not.
        let err = check("sbatch -n 2 --ntasks-per-n 1 job.sh", &[], None, &site()).unwrap_err();
        assert!(err.contains("--open-mode=append -N 1 -n 2 job.sh\n"), "{err}");
    }

    /// SBATCH_SPREAD_JOB counts as --spread-job (sbatch reads it).
    #[test]
    fn the_environment_can_spread_a_job() {
        let ok = "sbatch --signal=B:USR1@120 --requeue -n 2 job.sh";
        let err = check(ok, &[("SBATCH_SPREAD_JOB", "")], None, &site()).unwrap_err();
        assert!(err.contains("--spread-job spreads the --ntasks=2 tasks"), "{err}");
        assert!(check(ok, &[], None, &site()).is_ok());
        // srun's SLURM_NNODES is not sbatch's.
        assert!(check(ok, &[("SLURM_NNODES", "2"), ("SLURM_NTASKS_PER_NODE", "1")], None, &site()).is_ok());
    }

    #[test]
    fn append_is_advised_not_required() {
        let ok = check("sbatch --signal=B:USR1@120 --requeue job.sh", &[], None, &site()).unwrap();
        assert!(ok[0].contains("--open-mode=append"), "{ok:?}");
        assert!(check("sbatch --signal=B:USR1@120 --requeue --open-mode append job.sh", &[], None, &site()).unwrap().is_empty());
    }
}
