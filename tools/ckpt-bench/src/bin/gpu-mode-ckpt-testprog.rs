//! A CUDA process holding a known pattern, for checkpoint tests on real GPUs.
//!
//! Allocates N GiB on one GPU, fills it with the pattern of
//! `gpu_mode_core::cuda_pattern` (f(i) = (i·0x9E3779B1) ^ (i>>32) ^ seed) by a kernel, proves the verifier works (right seed: 0 mismatches; wrong seed:
//! all mismatch), writes `--ready FILE` (its pid), waits for `--go FILE`, then
//! verifies every word again and exits 0 only if all match.
//!
//! `--fork-child` forks a child without exec after the fill: the child keeps the
//! parent's /dev/nvidia* mappings and must make a checkpoint refuse.
//! `--hold` only holds the memory (a filler for the out-of-memory case).

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use gpu_mode_core::cuda_pattern::{pattern, PatternKernels, PTX};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

struct Opts {
    gib: f64,
    device: usize,
    ready: PathBuf,
    go: PathBuf,
    seed: u32,
    fork_child: bool,
    hold: bool,
}

fn parse_args() -> Result<Opts, String> {
    let mut o = Opts {
        gib: 1.0,
        device: 0,
        ready: PathBuf::new(),
        go: PathBuf::new(),
        seed: 0x5eed,
        fork_child: false,
        hold: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--gib" => o.gib = val()?.parse().map_err(|e| format!("--gib: {e}"))?,
            "--device" => o.device = val()?.parse().map_err(|e| format!("--device: {e}"))?,
            "--ready" => o.ready = PathBuf::from(val()?),
            "--go" => o.go = PathBuf::from(val()?),
            "--seed" => o.seed = val()?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--fork-child" => o.fork_child = true,
            "--hold" => o.hold = true,
            "--print-ptx" => {
                print!("{PTX}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if o.ready.as_os_str().is_empty() || o.go.as_os_str().is_empty() {
        return Err("usage: gpu-mode-ckpt-testprog --gib N --device D --ready FILE --go FILE [--seed S] [--fork-child] [--hold]".into());
    }
    Ok(o)
}

struct Gpu {
    stream: Arc<CudaStream>,
    kernels: PatternKernels,
}

impl Gpu {
    fn open(device: usize) -> Result<Gpu, String> {
        let ctx = CudaContext::new(device).map_err(|e| format!("CUDA device {device}: {e:?}"))?;
        let kernels = PatternKernels::load(&ctx).map_err(|e| format!("loading the pattern kernels: {e:?}"))?;
        Ok(Gpu { stream: ctx.default_stream(), kernels })
    }

    fn fill(&self, buf: &mut CudaSlice<u32>, seed: u32) -> Result<(), String> {
        self.kernels.fill(&self.stream, buf, seed).map_err(|e| format!("fill: {e:?}"))?;
        self.stream.synchronize().map_err(|e| format!("fill: {e:?}"))
    }

    /// Words among the first `n` that differ from the pattern of `seed`.
    fn mismatches(&self, buf: &CudaSlice<u32>, n: u64, seed: u32) -> Result<u64, String> {
        self.kernels.mismatches(&self.stream, buf, n, seed).map_err(|e| format!("verify: {e:?}"))
    }

    /// Host-side check of the first and last words: the kernels agree with
    /// the host's own computation of the pattern.
    fn spot_check(&self, buf: &CudaSlice<u32>, seed: u32) -> Result<(), String> {
        let n = buf.len();
        let k = n.min(4096);
        for start in [0, n - k] {
            let words = self.stream.clone_dtoh(&buf.slice(start..start + k)).map_err(|e| format!("{e:?}"))?;
            for (j, w) in words.iter().enumerate() {
                let i = (start + j) as u64;
                if *w != pattern(i, seed) {
                    return Err(format!("word {i} is {w:#x}, expected {:#x}", pattern(i, seed)));
                }
            }
        }
        Ok(())
    }

    fn check(&self, buf: &CudaSlice<u32>, seed: u32) -> Result<(), String> {
        self.spot_check(buf, seed)?;
        let n = buf.len() as u64;
        let bad = self.mismatches(buf, n, seed)?;
        if bad != 0 {
            return Err(format!("{bad} of {n} words differ from the pattern"));
        }
        Ok(())
    }
}

fn wait_for(path: &Path) {
    while !path.exists() {
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn write_ready(path: &Path, text: &str) -> Result<(), String> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).and_then(|_| std::fs::rename(&tmp, path)).map_err(|e| format!("{}: {e}", path.display()))
}

fn run(o: &Opts) -> Result<(), String> {
    // cudarc's loader panics without libcuda; say so plainly instead.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("no CUDA driver library (libcuda.so.1) on this machine".into());
    }
    let gpu = Gpu::open(o.device)?;
    let words = (o.gib * (1u64 << 30) as f64) as usize / 4;
    let mut buf = unsafe { gpu.stream.alloc::<u32>(words) }.map_err(|e| format!("allocating {} GiB: {e:?}", o.gib))?;
    let pid = std::process::id();
    if o.hold {
        write_ready(&o.ready, &pid.to_string())?;
        println!("HOLD pid={pid} device={} gib={}", o.device, o.gib);
        wait_for(&o.go);
        return Ok(());
    }
    gpu.fill(&mut buf, o.seed)?;
    gpu.check(&buf, o.seed).map_err(|e| format!("self-test after fill: {e}"))?;
    let probe = (words as u64).min(1 << 20);
    let wrong = gpu.mismatches(&buf, probe, o.seed ^ 1)?;
    if wrong != probe {
        return Err(format!("self-test: a wrong seed gave {wrong} mismatches of {probe}: the verifier is broken"));
    }
    if o.fork_child {
        fork_child(&o.go);
    }
    write_ready(&o.ready, &pid.to_string())?;
    println!("READY pid={pid} device={} gib={}", o.device, o.gib);
    wait_for(&o.go);
    let t = std::time::Instant::now();
    gpu.check(&buf, o.seed)?;
    println!("VERIFY OK pid={pid} gib={} words={words} mismatches=0 verify_s={:.2}", o.gib, t.elapsed().as_secs_f64());
    Ok(())
}

/// Forks a child that never execs and never touches CUDA: it only holds the
/// inherited GPU mappings until the go file appears.
fn fork_child(go: &Path) {
    match unsafe { libc::fork() } {
        0 => {
            wait_for(go);
            unsafe { libc::_exit(0) };
        }
        -1 => eprintln!("fork failed: {}", std::io::Error::last_os_error()),
        child => println!("FORKED child={child} (no exec)"),
    }
}

fn main() {
    let opts = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("gpu-mode-ckpt-testprog: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&opts) {
        println!("VERIFY FAILED pid={} gib={}: {e}", std::process::id(), opts.gib);
        std::process::exit(1);
    }
}
