//! Benchmark: the MIG prolog and epilog (in process, the production code
//! path over the simulated libnvidia-ml) side by side with the NVML calls
//! themselves (MIG mode on, one create per instance at the same placements,
//! destroy, MIG off) on the same simulated node, and the placement solver.
//! Prints figures; asserts nothing.
//!
//!   gpu-mode-mig-bench [--iterations K]
//!
//! Target (issue 9): the prolog adds at most 50 ms per GPU over the NVML
//! calls themselves.

use anyhow::{Context, Result};
use gpu_mode_core::config::Config;
use gpu_mode_core::gpu::{GpuError, GpuOps, LazyGpus, NvmlGpus};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use gpu_mode_core::job_env::JobEnv;
use gpu_mode_core::lifecycle::{epilog, prolog};
use gpu_mode_core::mig::placement::{place, Occupied};
use gpu_mode_tests::{bench, Artifacts};
use std::time::{Duration, Instant};

const LAYOUTS: [&str; 2] = ["mig:1g.10gbx7", "mig:3g.40gbx2"];

fn main() {
    if let Err(e) = run() {
        eprintln!("gpu-mode-mig-bench: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let iterations: usize = match args.as_slice() {
        [] => 10,
        [flag, n] if flag == "--iterations" => n.parse()?,
        _ => anyhow::bail!("usage: gpu-mode-mig-bench [--iterations K]"),
    };
    let sim = Artifacts::locate()?.sim.context("the simulated NVML is not built")?;
    // On a node the runtime directory is under /run, a tmpfs; so are the
    // simulated driver's files here, so disk speed does not count.
    let dir = tempfile::Builder::new().prefix("gpu-mode-mig-bench").tempdir_in("/dev/shm")?;
    println!("MIG prolog/epilog on simulated H100s, {iterations} iterations, medians (ms)");
    println!("The prolog's own time is its wall time less the time inside NVML calls (timed around every");
    println!("GpuOps call it makes); \"NVML create\" is the bare create sequence with nothing around it.");
    println!(
        "{:<16} {:>4} {:>10} {:>12} {:>12} {:>10} {:>12} {:>12}",
        "layout", "GPUs", "prolog", "in NVML", "own per GPU", "epilog", "NVML create", "NVML destroy"
    );
    for layout in LAYOUTS {
        for gpus in [1u32, 8] {
            let state = bench::sim_node(dir.path(), &sim.fixtures, "h100-80gb.toml", gpus)?;
            std::env::set_var("GPU_MODE_SIM_STATE", &state);
            let mut cfg = Config::default();
            cfg.nvml.library = Some(sim.nvml_library.clone());
            cfg.runtime_dir = dir.path().join(format!("run-{gpus}"));
            cfg.slurm.gres_conf = dir.path().join("none.conf");
            cfg.log.syslog = false;
            cfg.log.stderr = false;
            let in_nvml = Arc::new(AtomicU64::new(0));
            let mut own = Vec::new();
            let ours = measure(iterations, |i| {
                let before = in_nvml.load(Ordering::Relaxed);
                let t = hooks(&cfg, layout, gpus, 800_000 + i as u32, &in_nvml)?;
                let nvml = Duration::from_nanos(in_nvml.load(Ordering::Relaxed) - before);
                own.push((t.0.saturating_sub(nvml).as_secs_f64() * 1e3, nvml.as_secs_f64() * 1e3));
                Ok(t)
            })?;
            let raw = measure(iterations, |_| raw_calls(&cfg, layout, gpus))?;
            let (p, e, c, d) = (median(&ours, 0), median(&ours, 1), median(&raw, 0), median(&raw, 1));
            let (own, nvml_ms) = (median(&own, 0) / gpus as f64, median(&own, 1));
            println!("{layout:<16} {gpus:>4} {p:>10.1} {nvml_ms:>12.1} {own:>12.1} {e:>10.1} {c:>12.1} {d:>12.1}");
        }
    }
    solver_times();
    Ok(())
}

/// Our prolog then epilog for one job on GPUs 0..gpus; the prolog's time
/// inside NVML calls is added to `in_nvml`.
fn hooks(cfg: &Config, layout: &str, gpus: u32, job: u32, in_nvml: &Arc<AtomicU64>) -> Result<(Duration, Duration)> {
    let env = JobEnv {
        job_id: job,
        uid: 1000,
        gid: 1000,
        user: "bench".into(),
        node: "n".into(),
        slurm_gpus: (0..gpus).collect(),
        mode_value: Some(layout.into()),
        restart_count: 0,
    };
    let t = Instant::now();
    let nvml = LazyGpus::new(|| Ok(Box::new(Timed { inner: NvmlGpus::from_config(cfg)?, spent: in_nvml.clone() }) as Box<dyn GpuOps>));
    prolog::run_with(cfg, &env, &nvml).map_err(|e| anyhow::anyhow!("prolog: {e}"))?;
    let p = t.elapsed();
    let t = Instant::now();
    epilog::run(cfg, &env).map_err(|e| anyhow::anyhow!("epilog: {e}"))?;
    Ok((p, t.elapsed()))
}

/// The same NVML work with nothing around it (the NVML open not counted).
fn raw_calls(cfg: &Config, layout: &str, gpus: u32) -> Result<(Duration, Duration)> {
    let ops = NvmlGpus::from_config(cfg)?;
    bench::mig_raw_calls(&ops, layout, &(0..gpus).collect::<Vec<_>>())
}

fn measure(n: usize, mut f: impl FnMut(usize) -> Result<(Duration, Duration)>) -> Result<Vec<(f64, f64)>> {
    (0..n).map(|i| f(i).map(|(a, b)| (a.as_secs_f64() * 1e3, b.as_secs_f64() * 1e3))).collect()
}

fn median(v: &[(f64, f64)], which: usize) -> f64 {
    let mut x: Vec<f64> = v.iter().map(|t| if which == 0 { t.0 } else { t.1 }).collect();
    x.sort_by(|a, b| a.total_cmp(b));
    x[x.len() / 2]
}

/// The solver over every multiset of up to 7 instances of an H100's profiles
/// (3432 layouts): the slowest single placement and the total.
fn solver_times() {
    let h100 = gpu_mode_core::mig::placement::h100_table();
    let mut counts = vec![0u32; h100.len()];
    let (mut worst, mut worst_layout, mut total, mut n) = (Duration::ZERO, String::new(), Duration::ZERO, 0);
    loop {
        let want: Vec<_> = h100.iter().zip(&counts).filter(|(_, c)| **c > 0).map(|(p, c)| (p, *c)).collect();
        let t = Instant::now();
        let _ = std::hint::black_box(place(&want, &Occupied::default(), 7));
        let d = t.elapsed();
        total += d;
        n += 1;
        if d > worst {
            worst = d;
            worst_layout = want.iter().map(|(p, c)| format!("{}x{c}", p.name)).collect::<Vec<_>>().join(",");
        }
        if !next(&mut counts) {
            break;
        }
    }
    println!("solver: {n} layouts in {:.2} ms; slowest {:.1} us ({worst_layout})", total.as_secs_f64() * 1e3, worst.as_secs_f64() * 1e6);
}

fn next(counts: &mut [u32]) -> bool {
    for i in 0..counts.len() {
        counts[i] += 1;
        if counts.iter().sum::<u32>() <= 7 {
            return true;
        }
        counts[i] = 0;
    }
    false
}

/// Times every call into NVML (the open included by the caller's clock).
struct Timed {
    inner: NvmlGpus,
    /// Nanoseconds inside NVML.
    spent: Arc<AtomicU64>,
}

impl Timed {
    fn time<T>(&self, f: impl FnOnce(&NvmlGpus) -> T) -> T {
        let t = Instant::now();
        let out = f(&self.inner);
        self.spent.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        out
    }
}

use gpu_mode_core::gpu::{ComputeMode, DriverVersions, GpuInventory, GpuModes, GpuProcess, HealthReadings, MigInstance, MigModeChange, MigProfile, XidEvent};

// Plain delegation: each call timed, nothing else.
impl GpuOps for Timed {
    fn driver(&self) -> Result<DriverVersions, GpuError> {
        self.time(|o| o.driver())
    }
    fn count(&self) -> Result<u32, GpuError> {
        self.time(|o| o.count())
    }
    fn inventory(&self, gpu: u32) -> Result<GpuInventory, GpuError> {
        self.time(|o| o.inventory(gpu))
    }
    fn minor_number(&self, gpu: u32) -> Result<u32, GpuError> {
        self.time(|o| o.minor_number(gpu))
    }
    fn modes(&self, gpu: u32) -> Result<GpuModes, GpuError> {
        self.time(|o| o.modes(gpu))
    }
    fn mig_profiles(&self, gpu: u32) -> Result<Vec<MigProfile>, GpuError> {
        self.time(|o| o.mig_profiles(gpu))
    }
    fn mig_instances(&self, gpu: u32) -> Result<Vec<MigInstance>, GpuError> {
        self.time(|o| o.mig_instances(gpu))
    }
    fn health(&self, gpu: u32) -> Result<HealthReadings, GpuError> {
        self.time(|o| o.health(gpu))
    }
    fn processes(&self, gpu: u32) -> Result<Vec<GpuProcess>, GpuError> {
        self.time(|o| o.processes(gpu))
    }
    fn wait_xid_events(&self, window: Duration) -> Result<Vec<XidEvent>, GpuError> {
        self.time(|o| o.wait_xid_events(window))
    }
    fn set_compute_mode(&self, gpu: u32, mode: ComputeMode) -> Result<(), GpuError> {
        self.time(|o| o.set_compute_mode(gpu, mode))
    }
    fn set_mig_mode(&self, gpu: u32, enable: bool) -> Result<MigModeChange, GpuError> {
        self.time(|o| o.set_mig_mode(gpu, enable))
    }
    fn create_mig_instance(&self, gpu: u32, profile_id: u32, placement: Option<u32>) -> Result<MigInstance, GpuError> {
        self.time(|o| o.create_mig_instance(gpu, profile_id, placement))
    }
    fn destroy_mig_instance(&self, gpu: u32, gpu_instance: u32) -> Result<(), GpuError> {
        self.time(|o| o.destroy_mig_instance(gpu, gpu_instance))
    }
}
