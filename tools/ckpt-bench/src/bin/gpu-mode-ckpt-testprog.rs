//! A CUDA process holding a known pattern, for checkpoint tests on real GPUs.
//!
//! Allocates N GiB on one GPU, fills it with f(i) = (i·0x9E3779B1) ^ (i>>32) ^ seed
//! by a kernel, proves the verifier works (right seed: 0 mismatches; wrong seed:
//! all mismatch), writes `--ready FILE` (its pid), waits for `--go FILE`, then
//! verifies every word again and exits 0 only if all match.
//!
//! `--fork-child` forks a child without exec after the fill: the child keeps the
//! parent's /dev/nvidia* mappings and must make a checkpoint refuse.
//! `--hold` only holds the memory (a filler for the out-of-memory case).

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

// The grid-stride loop both kernels share: rd1 = buffer, rd2 = n, r1 = seed,
// rd3 = this thread's first index, rd5 = stride; r6 = pattern(rd3), rd7 = &buf[rd3].
macro_rules! grid_loop {
    ($body:literal) => {
        concat!(
            "    ld.param.u64 rd1, [p_buf];\n",
            "    cvta.to.global.u64 rd1, rd1;\n",
            "    ld.param.u64 rd2, [p_n];\n",
            "    ld.param.u32 r1, [p_seed];\n",
            "    mov.u32 r2, %ctaid.x;\n",
            "    mov.u32 r3, %ntid.x;\n",
            "    mov.u32 r4, %tid.x;\n",
            "    mul.wide.u32 rd3, r2, r3;\n",
            "    cvt.u64.u32 rd4, r4;\n",
            "    add.u64 rd3, rd3, rd4;\n",
            "    mov.u32 r5, %nctaid.x;\n",
            "    mul.wide.u32 rd5, r5, r3;\n",
            "LOOP:\n",
            "    setp.ge.u64 p, rd3, rd2;\n",
            "    @p bra DONE;\n",
            "    call (r6), pattern, (rd3, r1);\n",
            "    shl.b64 rd6, rd3, 2;\n",
            "    add.u64 rd7, rd1, rd6;\n",
            $body,
            "    add.u64 rd3, rd3, rd5;\n",
            "    bra.uni LOOP;\n",
            "DONE:\n",
            "    ret;\n",
            "}\n"
        )
    };
}

const PTX: &str = concat!(
    r#"
.version 8.0
.target sm_80
.address_size 64

.func (.reg .b32 v) pattern(.reg .b64 i, .reg .b32 seed)
{
    .reg .b32 lo, hi;
    .reg .b64 t;
    cvt.u32.u64 lo, i;
    mul.lo.u32 lo, lo, 0x9E3779B1;
    shr.u64 t, i, 32;
    cvt.u32.u64 hi, t;
    xor.b32 lo, lo, hi;
    xor.b32 v, lo, seed;
    ret;
}

.visible .entry fill(.param .u64 p_buf, .param .u64 p_n, .param .u32 p_seed)
{
    .reg .pred p;
    .reg .b32 r<8>;
    .reg .b64 rd<12>;
"#,
    grid_loop!("    st.global.u32 [rd7], r6;\n"),
    r#"
.visible .entry verify(.param .u64 p_buf, .param .u64 p_n, .param .u32 p_seed, .param .u64 p_bad)
{
    .reg .pred p, q;
    .reg .b32 r<8>;
    .reg .b64 rd<12>;
    ld.param.u64 rd9, [p_bad];
    cvta.to.global.u64 rd9, rd9;
"#,
    grid_loop!(
        "    ld.global.u32 r7, [rd7];\n    setp.ne.u32 q, r7, r6;\n    @q atom.global.add.u64 rd10, [rd9], 1;\n"
    ),
);

fn pattern(i: u64, seed: u32) -> u32 {
    (i as u32).wrapping_mul(0x9E37_79B1) ^ ((i >> 32) as u32) ^ seed
}

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
    fill: cudarc::driver::CudaFunction,
    verify: cudarc::driver::CudaFunction,
}

fn launch_cfg() -> LaunchConfig {
    LaunchConfig { grid_dim: (132 * 8, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}

impl Gpu {
    fn open(device: usize) -> Result<Gpu, String> {
        let ctx = CudaContext::new(device).map_err(|e| format!("CUDA device {device}: {e:?}"))?;
        let module = ctx.load_module(Ptx::from_src(PTX)).map_err(|e| format!("loading the pattern kernels: {e:?}"))?;
        let get = |name: &str| module.load_function(name).map_err(|e| format!("kernel {name}: {e:?}"));
        Ok(Gpu { stream: ctx.default_stream(), fill: get("fill")?, verify: get("verify")? })
    }

    fn fill(&self, buf: &mut CudaSlice<u32>, seed: u32) -> Result<(), String> {
        let n = buf.len() as u64;
        let mut b = self.stream.launch_builder(&self.fill);
        b.arg(buf).arg(&n).arg(&seed);
        unsafe { b.launch(launch_cfg()) }.map_err(|e| format!("fill: {e:?}"))?;
        self.stream.synchronize().map_err(|e| format!("fill: {e:?}"))
    }

    /// Words among the first `n` that differ from the pattern of `seed`.
    fn mismatches(&self, buf: &CudaSlice<u32>, n: u64, seed: u32) -> Result<u64, String> {
        let mut bad = self.stream.alloc_zeros::<u64>(1).map_err(|e| format!("{e:?}"))?;
        let mut b = self.stream.launch_builder(&self.verify);
        b.arg(buf).arg(&n).arg(&seed).arg(&mut bad);
        unsafe { b.launch(launch_cfg()) }.map_err(|e| format!("verify: {e:?}"))?;
        let host = self.stream.clone_dtoh(&bad).map_err(|e| format!("verify: {e:?}"))?;
        Ok(host[0])
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
