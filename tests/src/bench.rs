//! Pieces the benchmarks (src/bin/gpu-mode-*-bench.rs) share: percentiles,
//! a simulated node of N GPUs, and the bare MIG NVML calls a MIG prolog
//! is compared with.

use anyhow::{Context, Result};
use gpu_mode_core::gpu::GpuOps;
use gpu_mode_core::mig::placement::{place, Occupied};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Milliseconds of `d`.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The nearest-rank percentile `p` (0..=100) of `v`; NaN when empty.
pub fn percentile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
    s[rank.clamp(1, s.len()) - 1]
}

/// A simulated node of `gpus` GPUs of the fixture `model` (a file of
/// sim/nvml/fixtures, e.g. `h100-80gb.toml`) in `dir`; returns its state
/// file (for `GPU_MODE_SIM_STATE`).
pub fn sim_node(dir: &Path, fixtures: &Path, model: &str, gpus: u32) -> Result<PathBuf> {
    let fixture = dir.join(format!("node-{gpus}.toml"));
    std::fs::write(
        &fixture,
        format!(
            "driver_version = \"580.159.04\"\nnvml_version = \"13.580.159.04\"\ncuda_driver_version = 13000\n\n[[gpus]]\nmodel = \"{}\"\ncount = {gpus}\n",
            fixtures.join(model).display()
        ),
    )?;
    let state = dir.join(format!("state-{gpus}.json"));
    nvml_sim::store::create(&state, &fixture).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(state)
}

/// The NVML work of a MIG prolog and epilog with nothing around it, on
/// `gpus`: MIG on, `layout`'s instances (`mig:<profile>x<count>`) at the
/// solver's placements; then destroy, MIG off. Returns (create, destroy).
pub fn mig_raw_calls(ops: &dyn GpuOps, layout: &str, gpus: &[u32]) -> Result<(Duration, Duration)> {
    let (name, count) = layout.trim_start_matches("mig:").split_once('x').context("layout")?;
    let table = ops.mig_profiles(*gpus.first().context("no GPU")?)?;
    let profile = table.iter().find(|p| p.name == name).context("profile")?;
    let placed = place(&[(profile, count.parse()?)], &Occupied::default(), 7).context("placement")?;
    let t = Instant::now();
    for &g in gpus {
        ops.set_mig_mode(g, true)?;
        for p in &placed {
            ops.create_mig_instance(g, p.profile_id, Some(p.start))?;
        }
    }
    let create = t.elapsed();
    let t = Instant::now();
    for &g in gpus {
        for i in ops.mig_instances(g)? {
            ops.destroy_mig_instance(g, i.gpu_instance)?;
        }
        ops.set_mig_mode(g, false)?;
    }
    Ok((create, t.elapsed()))
}

#[cfg(test)]
mod tests {
    use super::percentile;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&[3.0, 1.0, 2.0], 50.0), 2.0);
        assert_eq!(percentile(&[3.0, 1.0, 2.0], 99.0), 3.0);
        assert!(percentile(&[], 50.0).is_nan());
    }
}
