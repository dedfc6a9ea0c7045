//! `gpu-mode-churn`: the soak bench (issue 12). Starts a local Slurm with a
//! simulated 8-GPU H200 node, runs N jobs (default 500) of four users in
//! every mode (none, MPS with and without limits, MIG layouts, checkpoint
//! jobs under gpu-mode-run on a preemptible partition), batch scripts,
//! batch scripts with srun steps and srun jobs, cancels some at random
//! moments, preempts some checkpoint jobs (high-priority jobs submitted at
//! drawn steps), and prints what is left, what drained, what failed
//! unexpectedly, how many checkpoint jobs were preempted and restored, and
//! the prolog/epilog times. Exit 1 when a figure that must be zero is not.
//! Root, CRIU (scripts/install-criu.sh); `cargo build --workspace` first.
//!
//!   gpu-mode-churn [--jobs N] [--seed S] [--cancel-percent P] [--preempt-percent P] [--max-secs F] [--keep]

use gpu_mode_tests::churn::{self, Options};
use gpu_mode_tests::{Artifacts, Cluster};

fn main() {
    match run() {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("gpu-mode-churn: {e:#}");
            std::process::exit(2);
        }
    }
}

fn run() -> anyhow::Result<bool> {
    let mut o = Options::with_jobs(500);
    let mut keep = false;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or_else(|| anyhow::anyhow!("{a} needs a value"));
        match a.as_str() {
            "--jobs" => {
                let n = value()?.parse()?;
                o = Options { seed: o.seed, cancel_percent: o.cancel_percent, max_secs: o.max_secs, preempt_percent: o.preempt_percent, ..Options::with_jobs(n) };
            }
            "--seed" => o.seed = value()?.parse()?,
            "--cancel-percent" => o.cancel_percent = value()?.parse()?,
            "--preempt-percent" => o.preempt_percent = value()?.parse()?,
            "--max-secs" => o.max_secs = value()?.parse()?,
            "--keep" => keep = true,
            other => anyhow::bail!("unknown argument {other} (--jobs N --seed S --cancel-percent P --preempt-percent P --max-secs F --keep)"),
        }
    }
    if !gpu_mode_tests::ckpt_jobs::criu_ready() {
        anyhow::bail!("checkpoint jobs need CRIU");
    }
    gpu_mode_tests::users::ensure_test_users()?;
    let cluster = Cluster::start(churn::spec("churn-bench", Artifacts::locate()?))?;
    let report = churn::run(&cluster, &o)?;
    println!("{}", report.text());
    let problems = report.problems();
    for p in &problems {
        println!("PROBLEM: {p}");
    }
    if keep {
        println!("cluster kept: export SLURM_CONF={}", cluster.dir.join("slurm.conf").display());
        std::mem::forget(cluster);
    }
    Ok(problems.is_empty())
}
