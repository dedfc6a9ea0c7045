//! Benchmark: wall time of the mps prolog + epilog, side by side with a shell
//! prolog/epilog written the way Slurm's etc/prolog.example does it
//! (nvidia-smi, `nvidia-cuda-mps-control -d`, `start_server`; epilog
//! `echo quit`, then a ps check). Prints figures; asserts nothing.
//!
//!   gpu-mode-mps-bench --sim N [--iterations K]   N simulated GPUs (sim/nvml, sim/mps)
//!   gpu-mode-mps-bench --real N [--iterations K]  the host's first N GPUs, real MPS;
//!                                                 every GPU setting is left as it is
//!
//! Runs the built gpu-mode-prolog/epilog binaries as slurmd would (same
//! environment variables), as root, for made-up jobs of user gmtest1.

use anyhow::{bail, Context, Result};
use gpu_mode_tests::{users, Artifacts};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

struct Setup {
    dir: PathBuf,
    config: PathBuf,
    sim_state: Option<PathBuf>,
    mps_control: PathBuf,
    gpus: u32,
}

fn main() {
    if let Err(e) = run() {
        eprintln!("gpu-mode-mps-bench: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut mode, mut gpus, mut iterations) = (String::new(), 1u32, 10usize);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--sim" | "--real" => {
                mode = a.trim_start_matches("--").to_string();
                gpus = it.next().context("--sim/--real need a GPU count")?.parse()?;
            }
            "--iterations" => iterations = it.next().context("--iterations needs a count")?.parse()?,
            other => bail!("unexpected argument {other:?}"),
        }
    }
    if mode.is_empty() {
        bail!("usage: gpu-mode-mps-bench --sim N | --real N [--iterations K]");
    }
    users::ensure_test_users()?;
    let setup = prepare(&mode, gpus)?;
    let ours = measure(iterations, |i| run_ours(&setup, 700_000 + i as u32))?;
    let shell = measure(iterations, |_| run_shell(&setup))?;
    println!("mps prolog+epilog, {mode} GPUs: {gpus}, iterations: {iterations}");
    println!("{:<34} {:>10} {:>10} {:>10}", "", "median ms", "min ms", "max ms");
    report("gpu-mode prolog", &ours.iter().map(|t| t.0).collect::<Vec<_>>());
    report("gpu-mode epilog", &ours.iter().map(|t| t.1).collect::<Vec<_>>());
    report("shell prolog (prolog.example)", &shell.iter().map(|t| t.0).collect::<Vec<_>>());
    report("shell epilog (prolog.example)", &shell.iter().map(|t| t.1).collect::<Vec<_>>());
    let median = |v: Vec<Duration>| median(&v);
    let (op, sp) = (median(ours.iter().map(|t| t.0).collect()), median(shell.iter().map(|t| t.0).collect()));
    println!("prolog speed-up over the shell baseline: {:.2}x", sp.as_secs_f64() / op.as_secs_f64());
    let _ = std::fs::remove_dir_all(&setup.dir);
    Ok(())
}

fn prepare(mode: &str, gpus: u32) -> Result<Setup> {
    let dir = PathBuf::from(format!("/tmp/gpu-mode-mps-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let runtime = dir.join("run");
    let (nvml, mps_control, sim_state, gpu_settings) = if mode == "sim" {
        let sim = Artifacts::locate()?.sim.context("sim binaries not built")?;
        let state = dir.join("nvml-state.json");
        let fixture = dir.join("node.toml");
        std::fs::write(
            &fixture,
            format!(
                "driver_version = \"580.159.04\"\nnvml_version = \"13.580.159.04\"\ncuda_driver_version = 13000\n[[gpus]]\nmodel = \"{}\"\ncount = {gpus}\n",
                sim.fixtures.join("h200-141gb.toml").display()
            ),
        )?;
        let ok = Command::new(&sim.nvml_ctl).args(["init", fixture.to_str().unwrap()]).env("GPU_MODE_SIM_STATE", &state).status()?;
        if !ok.success() {
            bail!("nvml-sim-ctl init failed");
        }
        for name in ["nvidia-cuda-mps-control", "nvidia-cuda-mps-server"] {
            std::fs::copy(sim.mps_control.with_file_name(name), dir.join(name))?;
        }
        (format!("[nvml]\nlibrary = \"{}\"\n", sim.nvml_library.display()), dir.join("nvidia-cuda-mps-control"), Some(state), "")
    } else {
        (String::new(), PathBuf::from("/usr/bin/nvidia-cuda-mps-control"), None, "[gpu]\nmps_compute_mode = \"leave\"\n")
    };
    let config = dir.join("gpu-mode.toml");
    // No gres.conf in `dir`: Slurm's indices are taken as NVML's, whatever
    // gres.conf the host has.
    std::fs::write(
        &config,
        format!(
            "runtime_dir = \"{}\"\n[slurm]\ngres_conf = \"{}\"\n[log]\nsyslog = false\nstderr = false\n{nvml}{gpu_settings}[mps]\ncontrol = \"{}\"\n",
            runtime.display(),
            dir.join("gres.conf").display(),
            mps_control.display()
        ),
    )?;
    Ok(Setup { dir, config, sim_state, mps_control, gpus })
}

fn gpu_list(n: u32) -> String {
    (0..n).map(|g| g.to_string()).collect::<Vec<_>>().join(",")
}

/// One job's prolog then epilog through the built helpers.
fn run_ours(s: &Setup, job: u32) -> Result<(Duration, Duration)> {
    let a = Artifacts::locate()?;
    let u = users::lookup("gmtest1")?;
    let hook = |exe: &Path| {
        let mut c = Command::new(exe);
        c.arg("--config").arg(&s.config).env_clear();
        c.env("SLURM_JOB_ID", job.to_string())
            .env("SLURM_JOB_UID", u.uid.to_string())
            .env("SLURM_JOB_GID", u.gid.to_string())
            .env("SLURM_JOB_USER", "gmtest1")
            .env("SLURMD_NODENAME", "bench")
            .env("SLURM_JOB_GPUS", gpu_list(s.gpus))
            .env("SPANK_GPU_MODE", "mps");
        if let Some(st) = &s.sim_state {
            c.env("GPU_MODE_SIM_STATE", st);
        }
        c
    };
    let p = timed(hook(&a.prolog))?;
    let e = timed(hook(&a.epilog))?;
    Ok((p, e))
}

/// The shell baseline, as Slurm's prolog.example does MPS: query the GPUs
/// with nvidia-smi, start the daemon, start a server; epilog: quit, then
/// wait until ps shows no MPS process of this pipe directory.
fn run_shell(s: &Setup) -> Result<(Duration, Duration)> {
    let pipe = s.dir.join("shell-pipe");
    let log = s.dir.join("shell-log");
    let ctl = s.mps_control.display();
    let smi = if s.sim_state.is_some() { "true" } else { "nvidia-smi -L >/dev/null" };
    let uid = users::lookup("gmtest1")?.uid;
    let prolog = format!(
        "export CUDA_MPS_PIPE_DIRECTORY={p} CUDA_MPS_LOG_DIRECTORY={l} CUDA_VISIBLE_DEVICES={g}; mkdir -p {p} {l}; {smi}; {ctl} -d >/dev/null 2>&1; echo start_server -uid {uid} | {ctl} >/dev/null",
        p = pipe.display(),
        l = log.display(),
        g = gpu_list(s.gpus)
    );
    // The ps check, narrowed to this daemon (other MPS daemons may run).
    let epilog = format!(
        "export CUDA_MPS_PIPE_DIRECTORY={p}; pid=$(cat {p}/nvidia-cuda-mps-control.pid); echo quit | {ctl}; while ps -o stat= -p $pid | grep -qv Z; do sleep 0.01; done",
        p = pipe.display()
    );
    let sh = |script: String| {
        let mut c = Command::new("/bin/sh");
        c.args(["-c", &script]);
        c
    };
    let p = timed(sh(prolog))?;
    let e = timed(sh(epilog))?;
    Ok((p, e))
}

fn timed(cmd: Command) -> Result<Duration> {
    let program = cmd.get_program().to_os_string();
    let start = Instant::now();
    let out = gpu_mode_core::command::run_with_timeout(cmd, None, Duration::from_secs(60))?;
    let took = start.elapsed();
    if !out.status.success() {
        bail!("{program:?} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr));
    }
    Ok(took)
}

fn measure(n: usize, mut f: impl FnMut(usize) -> Result<(Duration, Duration)>) -> Result<Vec<(Duration, Duration)>> {
    (0..n).map(&mut f).collect()
}

fn median(v: &[Duration]) -> Duration {
    let mut s = v.to_vec();
    s.sort();
    s[s.len() / 2]
}

fn report(name: &str, v: &[Duration]) {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{name:<34} {:>10.1} {:>10.1} {:>10.1}",
        ms(median(v)),
        ms(*v.iter().min().unwrap()),
        ms(*v.iter().max().unwrap())
    );
}
