//! `--deep`: CUDA checks on every idle GPU, in parallel (GPUs a job holds,
//! or with processes on them, are skipped): time to the first CUDA context
//! (the cold-start symptom of a GPU without persistence), a kernel launch, a
//! pattern written and read back over `[health.deep] memory_mib`, and a
//! device-to-device copy bandwidth against the model's floor.

use super::{CheckResult, Ctx, GpuSnap, Status};
use super::config::DeepConfig;
use crate::cuda_pattern::PatternKernels;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use std::sync::Arc;
use std::time::Instant;

const NAME: &str = "deep";
const COPIES: u32 = 5;

/// Figures of one GPU's deep check.
#[derive(Debug, Clone, PartialEq)]
pub struct DeepFigures {
    pub context_ms: f64,
    pub bad_words: u64,
    pub words: u64,
    pub bandwidth_gbps: f64,
}

pub fn run(ctx: &Ctx, cfg: &DeepConfig) -> Vec<CheckResult> {
    // cudarc's loader panics without libcuda: ask first, and say so plainly.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return vec![CheckResult::new(NAME, None, Status::Fail, "libcuda.so.1 not found: is the NVIDIA driver installed?")];
    }
    if let Err(e) = cudarc::driver::result::init() {
        return vec![CheckResult::new(NAME, None, Status::Fail, format!("cuInit failed: {e:?}"))];
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = ctx
            .gpus()
            .iter()
            .map(|g| {
                let busy = ctx.job_holds(g.index) || g.health.as_ref().is_some_and(|h| !h.processes.is_empty());
                (g, (!busy && g.error.is_none()).then(|| s.spawn(move || guarded(g, cfg))))
            })
            .collect();
        handles
            .into_iter()
            .map(|(g, h)| match h {
                None => CheckResult::new(NAME, Some(g.index), Status::Skipped, "busy (a job or processes) or unreadable"),
                Some(h) => h.join().unwrap_or_else(|_| CheckResult::new(NAME, Some(g.index), Status::Fail, "deep check crashed")),
            })
            .collect()
    })
}

fn guarded(g: &GpuSnap, cfg: &DeepConfig) -> CheckResult {
    let model = g.inventory.as_ref().map(|i| i.name.clone()).unwrap_or_default();
    match std::panic::catch_unwind(|| measure(g, cfg)) {
        Ok(Ok(f)) => judge(g.index, &model, &f, cfg),
        Ok(Err(e)) => CheckResult::new(NAME, Some(g.index), Status::Fail, e),
        Err(_) => CheckResult::new(NAME, Some(g.index), Status::Fail, "deep check crashed"),
    }
}

/// The verdict from the figures: context time, pattern, bandwidth floor.
pub fn judge(gpu: u32, model: &str, f: &DeepFigures, cfg: &DeepConfig) -> CheckResult {
    let floor = cfg.bandwidth_floor_gbps.iter().find(|(k, _)| model.contains(k.as_str())).map(|(_, v)| *v);
    let mut found = Vec::new();
    if f.bad_words > 0 {
        found.push((Status::Fail, format!("memory pattern: {} of {} words wrong", f.bad_words, f.words)));
    }
    if f.context_ms > cfg.context_ms_max as f64 {
        found.push((Status::Fail, format!("first CUDA context took {:.0} ms (max {}): is nvidia-persistenced running?", f.context_ms, cfg.context_ms_max)));
    }
    if let Some(floor) = floor.filter(|fl| f.bandwidth_gbps < *fl) {
        found.push((Status::Fail, format!("device-to-device bandwidth {:.0} GB/s below the {model} floor {floor:.0}", f.bandwidth_gbps)));
    }
    let ok = format!("context {:.0} ms, {} MiB pattern ok, d2d {:.0} GB/s", f.context_ms, (f.words * 4) >> 20, f.bandwidth_gbps);
    super::combine(NAME, Some(gpu), found, ok)
}

fn err(what: &str) -> impl Fn(cudarc::driver::DriverError) -> String + '_ {
    move |e| format!("{what}: {e:?}")
}

/// The CUDA device of an NVML GPU, by PCI bus id (CUDA's order may differ).
fn ordinal(g: &GpuSnap) -> Result<usize, String> {
    let bus = g.inventory.as_ref().map(|i| i.pci_bus_id.clone()).ok_or("no PCI bus id")?;
    let c = std::ffi::CString::new(bus.clone()).map_err(|_| format!("bad bus id {bus:?}"))?;
    let mut dev: cudarc::driver::sys::CUdevice = 0;
    let r = unsafe { cudarc::driver::sys::cuDeviceGetByPCIBusId(&mut dev, c.as_ptr()) };
    if r != cudarc::driver::sys::CUresult::CUDA_SUCCESS {
        return Err(format!("no CUDA device at {bus}: {r:?}"));
    }
    Ok(dev as usize)
}

fn measure(g: &GpuSnap, cfg: &DeepConfig) -> Result<DeepFigures, String> {
    let start = Instant::now();
    let cuda = CudaContext::new(ordinal(g)?).map_err(err("creating a CUDA context"))?;
    let context_ms = start.elapsed().as_secs_f64() * 1000.0;
    let kernels = PatternKernels::load(&cuda).map_err(err("loading the test kernels"))?;
    let stream = cuda.default_stream();
    let words = cfg.memory_mib * (1 << 20) / 4;
    let mut a = stream.alloc_zeros::<u32>(words as usize).map_err(err("allocating the pattern buffer"))?;
    let bad_words = pattern(&stream, &kernels, &mut a, 0x5a5a_1234)?;
    let bandwidth_gbps = bandwidth(&stream, &a)?;
    Ok(DeepFigures { context_ms, bad_words, words, bandwidth_gbps })
}

/// Fills `buf` with the pattern of `seed` (crate::cuda_pattern) and counts wrong words.
fn pattern(stream: &Arc<CudaStream>, kernels: &PatternKernels, buf: &mut CudaSlice<u32>, seed: u32) -> Result<u64, String> {
    kernels.fill(stream, buf, seed).map_err(err("launching fill"))?;
    kernels.mismatches(stream, &*buf, buf.len() as u64, seed).map_err(err("verifying the pattern"))
}

/// Device-to-device copy GB/s, counting the read and the write (as CUDA's
/// bandwidthTest does).
fn bandwidth(stream: &Arc<CudaStream>, src: &CudaSlice<u32>) -> Result<f64, String> {
    let mut dst = stream.alloc_zeros::<u32>(src.len()).map_err(err("allocating the copy buffer"))?;
    stream.memcpy_dtod(src, &mut dst).map_err(err("warm-up copy"))?;
    stream.synchronize().map_err(err("synchronize"))?;
    let start = Instant::now();
    for _ in 0..COPIES {
        stream.memcpy_dtod(src, &mut dst).map_err(err("copy"))?;
    }
    stream.synchronize().map_err(err("synchronize"))?;
    let bytes = 2.0 * (src.len() * 4) as f64 * COPIES as f64;
    Ok(bytes / start.elapsed().as_secs_f64() / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_judged() {
        let cfg = DeepConfig::default();
        let f = |context_ms, bad_words, bandwidth_gbps| DeepFigures { context_ms, bad_words, words: 1 << 28, bandwidth_gbps };
        let cases = [
            ("NVIDIA H100 80GB HBM3", f(180.0, 0, 2600.0), Status::Ok, "context 180 ms, 1024 MiB pattern ok, d2d 2600 GB/s"),
            ("NVIDIA H100 80GB HBM3", f(2500.0, 0, 2600.0), Status::Fail, "first CUDA context took 2500 ms (max 1000): is nvidia-persistenced running?"),
            ("NVIDIA H200", f(100.0, 3, 3000.0), Status::Fail, "memory pattern: 3 of 268435456 words wrong"),
            ("NVIDIA H200", f(100.0, 0, 900.0), Status::Fail, "device-to-device bandwidth 900 GB/s below the NVIDIA H200 floor 1800"),
            ("Some Future GPU", f(100.0, 0, 10.0), Status::Ok, "context 100 ms"),
        ];
        for (model, figures, status, text) in cases {
            let r = judge(0, model, &figures, &cfg);
            assert_eq!(r.status, status, "{r:?}");
            assert!(r.message.starts_with(text), "{r:?}");
        }
    }

    #[test]
    fn a_node_without_libcuda_is_a_clear_failure_not_a_panic() {
        if unsafe { cudarc::driver::sys::is_culib_present() } {
            return; // a GPU machine: the real path is exercised by run-health.sh
        }
        let fx = super::super::fake::Fixture::new(vec![super::super::fake::healthy_gpu(0)]);
        let r = run(&fx.ctx(), &DeepConfig::default());
        assert_eq!((r.len(), r[0].status), (1, Status::Fail));
        assert!(r[0].message.contains("libcuda.so.1 not found"), "{r:?}");
    }
}
