//! `gpu-mode-node-checker-bench`: wall time of whole quick-check runs (a new
//! process each, as slurmd starts it) on simulated GPUs (1 and 8) and/or the
//! node's real GPUs, with `nvidia-smi -q` timed in the same run as a baseline
//! where it exists. Printed figures, not a test: targets (issue 5) are
//! 200 ms per node for the quick check and 2 s for the deep one.
//!
//! usage: gpu-mode-node-checker-bench [--runs N] [--config PATH] [--deep]
//!        [--sim-lib libnvml_sim.so --sim-ctl nvml-sim-ctl --model h200-141gb.toml]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

struct Opts {
    runs: usize,
    config: Option<PathBuf>,
    deep: bool,
    sim: Option<(PathBuf, PathBuf, PathBuf)>,
}

fn parse() -> Result<Opts, String> {
    let mut o = Opts { runs: 10, config: None, deep: false, sim: None };
    let (mut lib, mut ctl, mut model) = (None, None, None);
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = || it.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--runs" => o.runs = val()?.parse().map_err(|_| "--runs needs a number")?,
            "--config" => o.config = Some(val()?.into()),
            "--deep" => o.deep = true,
            "--sim-lib" => lib = Some(PathBuf::from(val()?)),
            "--sim-ctl" => ctl = Some(PathBuf::from(val()?)),
            "--model" => model = Some(PathBuf::from(val()?)),
            other => return Err(format!("unexpected argument {other:?}")),
        }
    }
    if let (Some(l), Some(c), Some(m)) = (lib, ctl, model) {
        o.sim = Some((l, c, m));
    }
    Ok(o)
}

/// Milliseconds of each run of `cmd` (fresh process each time): min, median, max.
fn time(runs: usize, mut make: impl FnMut() -> Command) -> Result<(f64, f64, f64, Option<i32>), String> {
    let mut ms = Vec::new();
    let mut code = None;
    for _ in 0..runs.max(1) {
        let start = Instant::now();
        let out = make().output().map_err(|e| format!("cannot run: {e}"))?;
        ms.push(start.elapsed().as_secs_f64() * 1000.0);
        code = out.status.code();
    }
    ms.sort_by(|a, b| a.total_cmp(b));
    Ok((ms[0], ms[ms.len() / 2], ms[ms.len() - 1], code))
}

fn row(label: &str, r: Result<(f64, f64, f64, Option<i32>), String>) {
    match r {
        Ok((min, med, max, code)) => println!("{label:<40} min {min:>8.1} ms  median {med:>8.1} ms  max {max:>8.1} ms  (exit {code:?})"),
        Err(e) => println!("{label:<40} {e}"),
    }
}

fn checker() -> PathBuf {
    let me = std::env::current_exe().unwrap_or_default();
    me.with_file_name("gpu-mode-node-checker")
}

/// A simulated node of `n` GPUs in `dir`: state file, config, sysfs, kernel log.
fn sim_node(dir: &Path, n: u32, lib: &Path, ctl: &Path, model: &Path) -> Result<(PathBuf, PathBuf), String> {
    let d = dir.join(format!("sim{n}"));
    let io = |e: std::io::Error| format!("{}: {e}", d.display());
    std::fs::create_dir_all(d.join("sys/bus/pci/devices")).map_err(io)?;
    for i in 0..n {
        let dev = d.join(format!("sys/bus/pci/devices/0000:{:02x}:00.0", i));
        std::fs::create_dir_all(&dev).map_err(io)?;
        std::fs::write(dev.join("vendor"), "0x10de\n").map_err(io)?;
        std::fs::write(dev.join("class"), "0x030200\n").map_err(io)?;
    }
    std::fs::write(d.join("kmsg"), "").map_err(io)?;
    let fixture = d.join("node.toml");
    let text = format!("driver_version = \"580.159.04\"\nnvml_version = \"13.580.159.04\"\ncuda_driver_version = 13000\n[[gpus]]\nmodel = \"{}\"\ncount = {n}\n", model.display());
    std::fs::write(&fixture, text).map_err(io)?;
    let state = d.join("state.json");
    let _ = std::fs::remove_file(&state);
    let ok = Command::new(ctl).arg("init").arg(&fixture).env("GPU_MODE_SIM_STATE", &state).status().map_err(|e| format!("{}: {e}", ctl.display()))?;
    if !ok.success() {
        return Err("nvml-sim-ctl init failed".into());
    }
    let config = d.join("config.toml");
    let text = format!(
        "runtime_dir = \"{0}/run\"\n[log]\nsyslog = false\nstderr = false\n[nvml]\nlibrary = \"{1}\"\n[health]\nsysfs_root = \"{0}/sys\"\nkmsg_path = \"{0}/kmsg\"\n",
        d.display(),
        lib.display()
    );
    std::fs::write(&config, text).map_err(io)?;
    Ok((config, state))
}

fn main() {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("gpu-mode-node-checker-bench: {e}");
            std::process::exit(2);
        }
    };
    let exe = checker();
    println!("gpu-mode-node-checker quick check, {} runs each (fresh process per run)", o.runs);
    if let Some((lib, ctl, model)) = &o.sim {
        let dir = std::env::temp_dir().join(format!("gpu-mode-bench-{}", std::process::id()));
        for n in [1, 8] {
            match sim_node(&dir, n, lib, ctl, model) {
                Ok((config, state)) => row(&format!("simulated, {n} GPU(s)"), time(o.runs, || {
                    let mut c = Command::new(&exe);
                    c.args(["--no-drain", "--json", "--config"]).arg(&config).env_clear().env("GPU_MODE_SIM_STATE", &state);
                    c
                })),
                Err(e) => println!("simulated, {n} GPU(s): {e}"),
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    if let Some(config) = &o.config {
        row("real GPUs, quick check", time(o.runs, || {
            let mut c = Command::new(&exe);
            c.args(["--no-drain", "--json", "--config"]).arg(config);
            c
        }));
        if o.deep {
            row("real GPUs, --deep", time(o.runs.min(3), || {
                let mut c = Command::new(&exe);
                c.args(["--no-drain", "--json", "--deep", "--config"]).arg(config);
                c
            }));
        }
    }
    let smi = Path::new("/usr/bin/nvidia-smi");
    if smi.exists() {
        row("baseline: nvidia-smi -q", time(o.runs, || {
            let mut c = Command::new(smi);
            c.arg("-q");
            c
        }));
    } else {
        println!("baseline: /usr/bin/nvidia-smi not present on this machine");
    }
}
