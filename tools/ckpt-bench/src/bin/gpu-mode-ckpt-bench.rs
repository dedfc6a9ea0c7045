//! Checkpoint/restore benchmark on real GPUs: for each case (GiB per process ×
//! process count), starts test programs holding a known pattern, then
//! (1) our library: lock+checkpoint, NVML shows the memory freed, restore+unlock,
//! (2) the same cycle through Python's cuda.bindings (the driver's own speed),
//! then lets the programs verify their pattern. Prints GiB/s and where time goes.
//!
//! Usage: gpu-mode-ckpt-bench --testprog PATH --baseline PATH [--python python3]
//!        [--workdir DIR] [--gpus 2] [--cases 1x1,8x1,32x1,8x2] [--warmup-gib 32]

use gpu_mode_checkpoint::gib_per_s;
use gpu_mode_core::cuda_ckpt::{
    CheckpointReport, Checkpointer, CudaDriver, DeviceMap, GpuInfo, Nvml, ProcFs, RestoreReport, Settings, Step, Target,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Opts {
    testprog: PathBuf,
    baseline: PathBuf,
    python: String,
    workdir: PathBuf,
    gpus: usize,
    cases: Vec<(f64, usize)>,
    warmup_gib: f64,
}

fn parse_args() -> anyhow::Result<Opts> {
    let mut o = Opts {
        testprog: PathBuf::new(),
        baseline: PathBuf::new(),
        python: "python3".into(),
        workdir: std::env::temp_dir().join("gpu-mode-ckpt-bench"),
        gpus: 1,
        cases: vec![(1.0, 1), (8.0, 1), (32.0, 1), (8.0, 2)],
        warmup_gib: 0.0,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().ok_or_else(|| anyhow::anyhow!("{a} needs a value"))?;
        match a.as_str() {
            "--testprog" => o.testprog = v.into(),
            "--baseline" => o.baseline = v.into(),
            "--python" => o.python = v,
            "--workdir" => o.workdir = v.into(),
            "--gpus" => o.gpus = v.parse()?,
            "--warmup-gib" => o.warmup_gib = v.parse()?,
            "--cases" => o.cases = v.split(',').map(parse_case).collect::<anyhow::Result<_>>()?,
            _ => anyhow::bail!("unknown argument {a:?}"),
        }
    }
    Ok(o)
}

/// `8x2`: two processes of 8 GiB each.
fn parse_case(text: &str) -> anyhow::Result<(f64, usize)> {
    let (gib, n) = text.split_once('x').ok_or_else(|| anyhow::anyhow!("case {text:?} is not GIBxPROCS"))?;
    Ok((gib.parse()?, n.parse()?))
}

/// The test programs of one case.
struct Fleet {
    children: Vec<Child>,
    pids: Vec<i32>,
    go: PathBuf,
    logs: Vec<PathBuf>,
}

impl Fleet {
    fn start(o: &Opts, tag: &str, gib: f64, n: usize) -> anyhow::Result<Fleet> {
        let dir = o.workdir.join(tag);
        std::fs::create_dir_all(&dir)?;
        let go = dir.join("go");
        let _ = std::fs::remove_file(&go);
        let mut fleet = Fleet { children: Vec::new(), pids: Vec::new(), go, logs: Vec::new() };
        for i in 0..n {
            let (ready, log) = (dir.join(format!("ready{i}")), dir.join(format!("out{i}")));
            let _ = std::fs::remove_file(&ready);
            let child = Command::new(&o.testprog)
                .args(["--gib", &gib.to_string(), "--device", &(i % o.gpus).to_string(), "--seed", &(1000 + i).to_string()])
                .arg("--ready")
                .arg(&ready)
                .arg("--go")
                .arg(&fleet.go)
                .stdout(std::fs::File::create(&log)?)
                .stderr(Stdio::inherit())
                .spawn()?;
            fleet.pids.push(child.id() as i32);
            fleet.children.push(child);
            fleet.logs.push(log);
            wait_ready(&ready, fleet.children.last_mut().unwrap())?;
        }
        Ok(fleet)
    }

    /// Lets the programs verify; returns each one's verdict line.
    fn finish(mut self) -> Vec<String> {
        let _ = std::fs::write(&self.go, b"go");
        let mut out = Vec::new();
        for (child, log) in self.children.iter_mut().zip(&self.logs) {
            let status = child.wait();
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let verdict = text.lines().find(|l| l.starts_with("VERIFY")).unwrap_or("no verdict").to_string();
            out.push(format!("{verdict} (exit {:?})", status.ok().and_then(|s| s.code())));
        }
        out
    }
}

fn wait_ready(ready: &Path, child: &mut Child) -> anyhow::Result<()> {
    let start = Instant::now();
    while !ready.exists() {
        if let Some(status) = child.try_wait()? {
            anyhow::bail!("test program exited before ready: {status}");
        }
        if start.elapsed() > Duration::from_secs(180) {
            anyhow::bail!("test program not ready after 180 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn phase_ms(phases: &[gpu_mode_core::cuda_ckpt::Phase], step: Step) -> f64 {
    phases.iter().find(|p| p.step == step).map_or(0.0, |p| p.wall_ms)
}

/// Bytes NVML lists for these pids.
fn on_gpu(nvml: &Nvml, pids: &[i32]) -> u64 {
    nvml.compute_processes().unwrap_or_default().iter().filter(|p| pids.contains(&p.pid)).map(|p| p.used_bytes).sum()
}

#[derive(Default)]
struct Row {
    lock: f64,
    ckpt: f64,
    restore: f64,
    unlock: f64,
}

fn ours(c: &Checkpointer, nvml: &Nvml, pids: &[i32]) -> anyhow::Result<(Row, String)> {
    let target = Target::Pids(pids.to_vec());
    let before = on_gpu(nvml, pids);
    let r: CheckpointReport = c.checkpoint(&target)?;
    let during = on_gpu(nvml, pids);
    let s: RestoreReport = c.restore(&target, &DeviceMap::default())?;
    let after = on_gpu(nvml, pids);
    let mib = |b: u64| b >> 20;
    let nvml_note = format!("NVML MiB on GPU: before {} / checkpointed {} / restored {}", mib(before), mib(during), mib(after));
    let row = Row {
        lock: phase_ms(&r.phases, Step::Lock),
        ckpt: phase_ms(&r.phases, Step::Checkpoint),
        restore: phase_ms(&s.phases, Step::Restore),
        unlock: phase_ms(&s.phases, Step::Unlock),
    };
    Ok((row, nvml_note))
}

fn python(o: &Opts, pids: &[i32]) -> anyhow::Result<Row> {
    let list = pids.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(",");
    let out = Command::new(&o.python).arg(&o.baseline).args(["--pids", &list]).output()?;
    if !out.status.success() {
        anyhow::bail!("baseline failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    let v: BTreeMap<String, serde_json::Value> = serde_json::from_slice(&out.stdout)?;
    println!("{:<17} python: GPU files after checkpoint {}", "", v.get("gpu_files_after_checkpoint").map(|x| x.to_string()).unwrap_or_default());
    let wall = |k: &str| v.get(k).and_then(|p| p["wall_ms"].as_f64()).unwrap_or(f64::NAN);
    Ok(Row { lock: wall("lock"), ckpt: wall("checkpoint"), restore: wall("restore"), unlock: wall("unlock") })
}

fn print_row(case: &str, who: &str, bytes: u64, r: &Row) {
    let total = r.lock + r.ckpt + r.restore + r.unlock;
    println!(
        "{case:<8} {who:<7} lock {:>7.3} s  checkpoint {:>7.3} s {:>6.2} GiB/s  restore {:>7.3} s {:>6.2} GiB/s  unlock {:>6.3} s  cycle {:>7.3} s",
        r.lock / 1e3,
        r.ckpt / 1e3,
        gib_per_s(bytes, r.ckpt),
        r.restore / 1e3,
        gib_per_s(bytes, r.restore),
        r.unlock / 1e3,
        total / 1e3
    );
}

fn run_case(o: &Opts, c: &Checkpointer, nvml: &Nvml, gib: f64, n: usize, with_python: bool) -> anyhow::Result<()> {
    let case = format!("{gib}x{n}");
    let fleet = Fleet::start(o, &case, gib, n)?;
    let bytes = (gib * n as f64 * (1u64 << 30) as f64) as u64;
    // Each side runs even when the other failed: both outcomes are evidence.
    let mine = ours(c, nvml, &fleet.pids);
    match &mine {
        Ok((row, note)) => {
            print_row(&case, "ours", bytes, row);
            println!("{case:<8} {:<7} {note}", "");
        }
        Err(e) => println!("{case:<8} ours    FAILED: {e:#}"),
    }
    if with_python {
        match python(o, &fleet.pids) {
            Ok(row) => print_row(&case, "python", bytes, &row),
            Err(e) => println!("{case:<8} python  FAILED: {e:#}"),
        }
    }
    let result = mine.map(|_| ());
    let verdicts = fleet.finish();
    for v in &verdicts {
        println!("{case:<8} {:<7} {v}", "");
    }
    result?;
    anyhow::ensure!(verdicts.iter().all(|v| v.starts_with("VERIFY OK")), "{case}: pattern not intact");
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let o = parse_args()?;
    let driver = Arc::new(CudaDriver::load(None)?);
    let nvml = Nvml::load(None).map_err(anyhow::Error::msg)?;
    let host = ProcFs::default();
    let settings = Settings {
        lock_timeout_ms: 10_000,
        memory_margin_bytes: 512 << 20,
        record_dir: o.workdir.join("records"),
        call_timeout: Duration::from_secs(300),
    };
    let c = Checkpointer::new(driver.clone(), &host, &nvml, settings);
    println!("driver CUDA version {}, {} GPU(s)", driver.version(), o.gpus);
    if o.warmup_gib > 0.0 {
        // The VM grows its memory on first touch: pay that once, untimed.
        println!("warm-up ({} GiB, not a measurement):", o.warmup_gib);
        run_case(&o, &c, &nvml, o.warmup_gib, 1, false)?;
    }
    let mut failed = 0;
    for &(gib, n) in &o.cases {
        if let Err(e) = run_case(&o, &c, &nvml, gib, n, true) {
            println!("{gib}x{n} FAILED: {e:#}");
            failed += 1;
        }
    }
    anyhow::ensure!(failed == 0, "{failed} case(s) failed");
    Ok(())
}
