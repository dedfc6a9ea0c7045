//! Benchmark: the hooks' own cost (issue 25 item 5). On local Slurm clusters
//! of the harness (simulated 8-GPU H200 node), in one run, side by side:
//!
//! 1. prolog and epilog wall time per mode (none, mps, checkpoint, mig), one
//!    GPU per job, with `[metrics] textfile` set and without, alternating;
//!    the metrics cost per hook is the p50 with less the p50 without;
//! 2. 1 and 8 concurrent prologs (8 jobs, one GPU each) of mps and checkpoint;
//! 3. the MIG prolog against the NVML calls alone (open, MIG on, the
//!    instances at the same placements) on the same simulated node;
//! 4. `srun true` on a cluster without slurm-gpu-mode (no plugin in
//!    plugstack.conf, no Prolog=/Epilog=) and on clusters with it (plugin and
//!    hooks, with and without `[metrics]`), interleaved.
//!
//!   gpu-mode-hook-bench [--iterations K] [--sruns N]
//!
//! Root (the harness starts slurmd). The hooks run as slurmd runs them: the
//! harness's hook wrapper, the built gpu-mode-prolog/epilog, made-up jobs of
//! user gmtest1. Prints figures, the targets and PASS/MISS; asserts nothing.
//! Its clusters are /tmp/gpu-mode-cluster/hookbench-*.

use anyhow::{bail, Context, Result};
use gpu_mode_core::config::Config;
use gpu_mode_core::gpu::NvmlGpus;
use gpu_mode_tests::bench::{mig_raw_calls, ms, percentile};
use gpu_mode_tests::{users, Artifacts, Cluster, ClusterSpec};
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const GPUS: u32 = 8;
const USER: &str = "gmtest1";
/// The harness's `half` layout on an H200.
const MIG_LAYOUT: &str = "mig:3g.71gbx2";
const MODES: [(&str, &str); 4] = [("none", ""), ("mps", "mps"), ("checkpoint", "checkpoint"), ("mig", MIG_LAYOUT)];

// Issue 25 item 5's targets (2-core machine).
const SRUN_RATIO: f64 = 1.03;
const X8_P99_MS: f64 = 150.0;
const MIG_OVER_NVML_MS: f64 = 100.0;
const METRICS_MS: f64 = 5.0;

static NEXT_JOB: AtomicU32 = AtomicU32::new(910_000);

fn main() {
    if let Err(e) = run() {
        eprintln!("gpu-mode-hook-bench: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let (mut iterations, mut sruns) = (20usize, 30usize);
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || -> Result<usize> { Ok(it.next().with_context(|| format!("{a} needs a count"))?.parse()?) };
        match a.as_str() {
            "--iterations" => iterations = value()?,
            "--sruns" => sruns = value()?,
            other => bail!("unexpected argument {other:?}; usage: gpu-mode-hook-bench [--iterations K] [--sruns N]"),
        }
    }
    users::ensure_test_users()?;
    let artifacts = Artifacts::locate()?;
    println!(
        "gpu-mode-hook-bench: {} CPUs, load average {} (at start); {GPUS} simulated H200s; {iterations} iterations, {sruns} sruns",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_average()
    );
    println!("prolog/epilog: {}", artifacts.prolog.display());
    // Three clusters side by side, so the srun runs can be interleaved.
    let plain = start("hookbench-plain", &artifacts, without_gpu_mode)?;
    let full = start("hookbench-metrics", &artifacts, add_nometrics_hooks)?;
    let nometrics = start("hookbench-nometrics", &artifacts, |d| strip_metrics(&d.join("gpu-mode.toml"), &d.join("gpu-mode.toml")))?;

    let single = per_mode(&full, iterations)?;
    concurrent(&full, iterations, &single)?;
    mig_vs_nvml(&full, iterations, &single)?;
    srun(&[("without slurm-gpu-mode", &plain), ("plugin + hooks, [metrics]", &full), ("plugin + hooks, no [metrics]", &nometrics)], sruns)?;
    println!("load average at the end: {}", load_average());
    Ok(())
}

/// Writes a cluster of the harness, lets `edit` change its files, starts it.
fn start(name: &str, artifacts: &Artifacts, edit: impl FnOnce(&Path) -> Result<()>) -> Result<Cluster> {
    let spec = ClusterSpec::new(name, GPUS, artifacts.clone());
    Cluster::write(&spec)?;
    edit(&spec.dir).with_context(|| format!("editing cluster {name}"))?;
    Cluster::start_written(spec).with_context(|| format!("starting cluster {name}"))
}

/// No plugin in plugstack.conf and no Prolog=/Epilog= (PrologFlags stay):
/// Slurm as it runs without slurm-gpu-mode.
fn without_gpu_mode(dir: &Path) -> Result<()> {
    std::fs::write(dir.join("plugstack.conf"), "# hook bench: no slurm-gpu-mode\n")?;
    let conf = std::fs::read_to_string(dir.join("slurm.conf"))?;
    let kept: String = conf.lines().filter(|l| !l.starts_with("Prolog=") && !l.starts_with("Epilog=")).map(|l| format!("{l}\n")).collect();
    if kept.len() == conf.len() {
        bail!("slurm.conf names no Prolog=/Epilog=");
    }
    std::fs::write(dir.join("slurm.conf"), kept)?;
    Ok(())
}

/// Copies `from` to `to` without `[metrics] textfile` (no metrics kept).
fn strip_metrics(from: &Path, to: &Path) -> Result<()> {
    let text = std::fs::read_to_string(from)?;
    let kept: String = text.lines().filter(|l| !l.trim_start().starts_with("textfile")).map(|l| format!("{l}\n")).collect();
    if kept.len() == text.len() {
        bail!("{} sets no [metrics] textfile", from.display());
    }
    std::fs::write(to, kept)?;
    Ok(())
}

/// `hooks/prolog-nometrics` and `hooks/epilog-nometrics`: the harness's
/// wrappers on a copy of the config without `[metrics]`.
fn add_nometrics_hooks(dir: &Path) -> Result<()> {
    strip_metrics(&dir.join("gpu-mode.toml"), &dir.join("gpu-mode-nometrics.toml"))?;
    for hook in ["prolog", "epilog"] {
        let text = std::fs::read_to_string(dir.join("hooks").join(hook))?;
        let changed = text.replace("/gpu-mode.toml", "/gpu-mode-nometrics.toml");
        if changed == text {
            bail!("the {hook} wrapper names no gpu-mode.toml");
        }
        let path = dir.join("hooks").join(format!("{hook}-nometrics"));
        std::fs::write(&path, changed)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(())
}

/// One hook run through the harness's wrapper, timed as slurmd waits for it.
fn hook(c: &Cluster, hook: &str, job: u32, gpus: &str, mode: &str) -> Result<f64> {
    let t = Instant::now();
    let out = c.run_hook(hook, job, USER, gpus, mode)?;
    let took = ms(t.elapsed());
    if !out.status.success() {
        bail!("{hook} of job {job} ({mode:?}) failed ({}):\n{}", out.status, c.hook_log_lines(job).join("\n"));
    }
    Ok(took)
}

fn job_id() -> u32 {
    NEXT_JOB.fetch_add(1, Ordering::Relaxed)
}

/// Prolog and epilog times (ms) of one mode with or without metrics.
#[derive(Default)]
struct Times {
    prolog: Vec<f64>,
    epilog: Vec<f64>,
}

/// Key: (mode, metrics on).
type PerMode = BTreeMap<(&'static str, bool), Times>;

fn verdict(ok: bool) -> &'static str {
    if ok {
        "PASS"
    } else {
        "MISS"
    }
}

/// Section 1: one job at a time on GPU 0, metrics on and off alternating.
fn per_mode(c: &Cluster, iterations: usize) -> Result<PerMode> {
    let mut all = PerMode::new();
    for (name, value) in MODES {
        for _ in 0..iterations {
            for (metrics, suffix) in [(true, ""), (false, "-nometrics")] {
                let job = job_id();
                let p = hook(c, &format!("prolog{suffix}"), job, "0", value)?;
                let e = hook(c, &format!("epilog{suffix}"), job, "0", value)?;
                let t = all.entry((name, metrics)).or_default();
                t.prolog.push(p);
                t.epilog.push(e);
            }
        }
    }
    println!("\n1. prolog and epilog per mode, one job at a time, 1 GPU, ms");
    println!("{:<12} {:<9} {:>10} {:>10} {:>10} {:>10}", "mode", "metrics", "prolog p50", "p99", "epilog p50", "p99");
    for ((name, _), metrics) in MODES.iter().flat_map(|m| [(m, true), (m, false)]) {
        let t = &all[&(*name, metrics)];
        let m = if metrics { "on" } else { "off" };
        println!(
            "{name:<12} {m:<9} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
            percentile(&t.prolog, 50.0),
            percentile(&t.prolog, 99.0),
            percentile(&t.epilog, 50.0),
            percentile(&t.epilog, 99.0)
        );
    }
    println!("metrics cost per hook (p50 with less p50 without; target <= {METRICS_MS} ms):");
    for (name, _) in MODES {
        let (on, off) = (&all[&(name, true)], &all[&(name, false)]);
        for (hook, a, b) in [("prolog", &on.prolog, &off.prolog), ("epilog", &on.epilog, &off.epilog)] {
            let cost = percentile(a, 50.0) - percentile(b, 50.0);
            println!("  {name} {hook} metrics {cost:+.1} ms (target <= {METRICS_MS} ms): {}", verdict(cost <= METRICS_MS));
        }
    }
    Ok(all)
}

/// Section 2: 8 prologs at once (8 jobs, GPU 0..7), then their 8 epilogs
/// at once; against section 1's one at a time.
fn concurrent(c: &Cluster, iterations: usize, single: &PerMode) -> Result<()> {
    println!("\n2. 1 and 8 concurrent prologs/epilogs (8 jobs, one GPU each), ms");
    println!(
        "{:<12} {:<9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "mode", "metrics", "x1 p50", "x1 p99", "x8 p50", "x8 p99", "x8 ep p50", "x8 ep p99"
    );
    let mut verdicts = Vec::new();
    for mode in ["mps", "checkpoint"] {
        for (metrics, suffix) in [(true, ""), (false, "-nometrics")] {
            let (mut prologs, mut epilogs) = (Vec::new(), Vec::new());
            for _ in 0..iterations {
                let jobs: Vec<u32> = (0..GPUS).map(|_| job_id()).collect();
                prologs.extend(all_at_once(c, &format!("prolog{suffix}"), &jobs, mode)?);
                epilogs.extend(all_at_once(c, &format!("epilog{suffix}"), &jobs, mode)?);
            }
            let one = &single[&(mode, metrics)].prolog;
            let p99 = percentile(&prologs, 99.0);
            println!(
                "{mode:<12} {:<9} {:>10.1} {:>10.1} {:>10.1} {p99:>10.1} {:>10.1} {:>10.1}",
                if metrics { "on" } else { "off" },
                percentile(one, 50.0),
                percentile(one, 99.0),
                percentile(&prologs, 50.0),
                percentile(&epilogs, 50.0),
                percentile(&epilogs, 99.0)
            );
            if metrics {
                verdicts.push(format!(
                    "  {mode} prolog x8 p99 {p99:.0} ms (target <= {X8_P99_MS} ms): {}",
                    verdict(p99 <= X8_P99_MS)
                ));
            }
        }
    }
    println!("{}", verdicts.join("\n"));
    Ok(())
}

/// `hook` of each of `jobs` (job i on GPU i) started together; their times.
fn all_at_once(c: &Cluster, hook_name: &str, jobs: &[u32], mode: &str) -> Result<Vec<f64>> {
    let barrier = Arc::new(Barrier::new(jobs.len()));
    std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .iter()
            .enumerate()
            .map(|(gpu, &job)| {
                let barrier = barrier.clone();
                s.spawn(move || {
                    barrier.wait();
                    hook(c, hook_name, job, &gpu.to_string(), mode)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("hook thread panicked")).collect()
    })
}

/// Section 3: the MIG prolog (section 1) against the NVML calls alone on the
/// same simulated node: NVML open, MIG on, the layout's instances at the
/// solver's placements (the destroy and MIG off after it are not counted).
fn mig_vs_nvml(c: &Cluster, iterations: usize, single: &PerMode) -> Result<()> {
    let cfg = Config::load(Some(&c.dir.join("gpu-mode.toml"))).map_err(|e| anyhow::anyhow!("{e}"))?;
    std::env::set_var("GPU_MODE_SIM_STATE", c.dir.join("sim/nvml-state.json"));
    let mut calls = Vec::new();
    for _ in 0..iterations {
        let t = Instant::now();
        let ops = NvmlGpus::from_config(&cfg)?;
        let open = t.elapsed();
        let (create, _destroy) = mig_raw_calls(&ops, MIG_LAYOUT, &[0])?;
        calls.push(ms(open + create));
    }
    let nvml = percentile(&calls, 50.0);
    println!("\n3. MIG prolog ({MIG_LAYOUT}, 1 GPU) against the NVML calls alone, p50 ms");
    for metrics in [true, false] {
        let prolog = percentile(&single[&("mig", metrics)].prolog, 50.0);
        let over = prolog - nvml;
        println!(
            "  mig prolog {prolog:.1} ms, metrics {}, NVML calls {nvml:.1} ms: overhead {over:.1} ms (target <= {MIG_OVER_NVML_MS} ms): {}",
            if metrics { "on" } else { "off" },
            verdict(over <= MIG_OVER_NVML_MS)
        );
    }
    Ok(())
}

/// Section 4: `srun true` as gmtest1 on each cluster in turn, `n` rounds
/// after one warm-up round; ratios against the first cluster.
fn srun(clusters: &[(&str, &Cluster)], n: usize) -> Result<()> {
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); clusters.len()];
    for round in 0..=n {
        for (i, (name, c)) in clusters.iter().enumerate() {
            let t = Instant::now();
            let out = c.client("srun", &["-N1", "-n1", "true"]).timeout(Duration::from_secs(60)).run_as(Some(USER))?;
            let took = ms(t.elapsed());
            if !out.status.success() {
                bail!("srun true on {name} failed ({}): {}\n{}", out.status, String::from_utf8_lossy(&out.stderr), c.logs_tail());
            }
            if round > 0 {
                times[i].push(took);
            }
        }
    }
    let base = percentile(&times[0], 50.0);
    println!("\n4. srun true ({n} runs each, interleaved), ms");
    println!("{:<30} {:>8} {:>8} {:>8}", "", "p50", "p99", "ratio");
    for ((name, _), t) in clusters.iter().zip(&times) {
        let p50 = percentile(t, 50.0);
        println!("{name:<30} {p50:>8.1} {:>8.1} {:>8.3}", percentile(t, 99.0), p50 / base);
    }
    for ((name, _), t) in clusters.iter().zip(&times).skip(1) {
        let ratio = percentile(t, 50.0) / base;
        println!("  srun true, {name}, no mode: {ratio:.3}x without (target <= {SRUN_RATIO}x): {}", verdict(ratio <= SRUN_RATIO));
    }
    Ok(())
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").unwrap_or_default().split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}
