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
//! processes of the batch step's node, so a job that asks for several
//! (`-N 2`, `--nodes=2-4`, `-w a,b`) is refused here. One that lands on
//! several nodes without asking (`--ntasks` spilling over) is refused at
//! the checkpoint instead, and starts over (preempt's agent, `dump.rs`).
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

/// Where sbatch's own arguments end: the index of the batch script (the
/// first word that is neither an option nor an option's value), if any.
fn script_index(args: &[String]) -> Option<usize> {
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        if a == "--" {
            return (i + 1 < args.len()).then_some(i + 1);
        }
        if !a.starts_with('-') || a == "-" {
            return Some(i);
        }
        let takes_next = if let Some(long) = a.strip_prefix("--") {
            !long.contains('=') && !LONG_FLAGS.contains(&a.as_str())
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
    if args.iter().any(|a| a == "--wrap" || a.starts_with("--wrap=")) {
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
            _ => {}
        }
    }
    said
}

/// An option's name and its value when given in the same word: `--x=v`,
/// and the short options whose value may follow at once (`-N2`, `-wn1`).
fn split_option(a: &str) -> (&str, Option<String>) {
    if let Some(short @ ("-N" | "-w")) = a.get(..2) {
        if a.len() > 2 && !a.starts_with("--") {
            return (short, Some(a[2..].to_string()));
        }
    }
    match a.split_once('=') {
        Some((n, v)) => (n, Some(v.to_string())),
        None => (a, None),
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
    // sbatch reads no node count from its environment (22.05's man page
    // lists no SBATCH_NODES): the command line and the script say it.
    Said {
        requeue,
        signal: env.get("SBATCH_SIGNAL").cloned(),
        open_mode: env.get("SBATCH_OPEN_MODE").cloned(),
        nodes: None,
        nodelist: None,
    }
}

/// The words of the `#SBATCH` lines at the top of a batch script (sbatch
/// stops reading them at the first command).
fn from_script(script: &str) -> Said {
    let mut words = Vec::new();
    for line in script.lines().skip_while(|l| l.starts_with("#!")) {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("#SBATCH") {
            words.extend(rest.split_whitespace().take_while(|w| !w.starts_with('#')).map(String::from));
        } else if !(t.is_empty() || t.starts_with('#')) {
            break;
        }
    }
    from_args(&words)
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
    if command != "sbatch" {
        // A step inside a checkpoint job was checked when the job was submitted.
        if command == "srun" && env.contains_key("SLURM_JOB_ID") {
            return Ok(Vec::new());
        }
        return Err(format!(
            "--gpu-mode=checkpoint needs a batch job: Slurm requeues only batch jobs, so an interactive {command} \
             job cannot be checkpointed on preemption and restored. Submit it as:\n  {}",
            suggestion(&[], site)
        ));
    }
    let args = argv.get(1..).unwrap_or(&[]);
    let said = from_args(args).over(from_env(env).over(script.map(from_script).unwrap_or_default()));
    let problems = problems(&said, site);
    if problems.is_empty() {
        return Ok(advice(&said));
    }
    Err(format!(
        "--gpu-mode=checkpoint: {}. Submit it as:\n  {}\nand start the application in the script with \
         `exec gpu-mode-run ./app` (--open-mode=append keeps the output of the runs before a requeue)",
        problems.join("; "),
        suggestion(args, site)
    ))
}

fn problems(said: &Said, site: &SubmitSite) -> Vec<String> {
    let mut out: Vec<String> = several_nodes(said).into_iter().collect();
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

/// The refusal of a job that asks for more than one node, if it does.
fn several_nodes(said: &Said) -> Option<String> {
    let why = "checkpoint mode checkpoints the processes of one node, so a job on several nodes could not be restored \
               (use -N 1, or drop --gpu-mode=checkpoint and the job starts over when preempted)";
    if let Some(n) = said.nodes.as_deref().and_then(least_nodes).filter(|n| *n > 1) {
        let given = said.nodes.as_deref().unwrap_or_default();
        return Some(format!("--nodes={given} asks for at least {n} nodes: {why}"));
    }
    let names = said.nodelist.as_deref().and_then(nodelist_names)?;
    (names.len() > 1).then(|| format!("--nodelist={} names {} nodes: {why}", names.join(","), names.len()))
}

/// The least node count of `-N`'s value: `2`, `2-4` (min-max), `1,2,4`
/// (sizes; newer Slurm), each with an optional `k`/`m` multiplier as
/// Slurm reads them. `None` for what Slurm would refuse itself: sbatch's
/// own message says it better than a guess here.
fn least_nodes(value: &str) -> Option<u64> {
    let sizes = value.split(',').map(|size| size.split_once('-').map_or(size, |(min, _)| min));
    sizes.map(node_count).collect::<Option<Vec<u64>>>()?.into_iter().min()
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
/// check decides replaced. Shown only, never run: quoted for the reader.
fn suggestion(args: &[String], site: &SubmitSite) -> String {
    let lead = site.min_lead_s.max(120);
    let mut line = vec![
        "sbatch".to_string(),
        "--gpu-mode=checkpoint".into(),
        format!("--signal=B:{}@{lead}", short(site.signal)),
        "--requeue".into(),
        "--open-mode=append".into(),
    ];
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (name, inline) = split_option(a);
        if name == "-N" || name == "--nodes" {
            // One node: the only count a checkpoint job may ask for.
            if inline.is_none() {
                it.next();
            }
            line.extend(["-N".to_string(), "1".into()]);
            continue;
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
    if args.iter().all(|a| a.starts_with('-') && !a.starts_with("--wrap")) {
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

    /// A job that asks for several nodes is refused; one node, or a count
    /// Slurm itself would refuse, is not this check's to refuse.
    #[test]
    fn a_job_on_several_nodes_is_refused() {
        let ok = "--signal=B:USR1@120 --requeue";
        let script = |n: &str| format!("#!/bin/bash\n#SBATCH {n}\nexec gpu-mode-run ./a\n");
        // (options before job.sh, the script's #SBATCH options, refused with this needle or Ok)
        let cases: Vec<(&str, Option<&str>, Option<&str>)> = vec![
            ("-N 1", None, None),
            ("-N1", None, None),
            ("--nodes=1", None, None),
            ("--nodes 1-1", None, None),
            ("--nodes=1-4", None, None),
            ("-n 8", None, None),
            ("-w gma", None, None),
            ("--nodelist=gma,gma", None, None),
            ("-w ./hosts", None, None),
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
            // What Slurm refuses itself is left to its own message.
            ("-N two", None, None),
            ("-N 0x2", None, None),
            ("--nodes=-2", None, None),
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
    }

    #[test]
    fn append_is_advised_not_required() {
        let ok = check("sbatch --signal=B:USR1@120 --requeue job.sh", &[], None, &site()).unwrap();
        assert!(ok[0].contains("--open-mode=append"), "{ok:?}");
        assert!(check("sbatch --signal=B:USR1@120 --requeue --open-mode append job.sh", &[], None, &site()).unwrap().is_empty());
    }
}
