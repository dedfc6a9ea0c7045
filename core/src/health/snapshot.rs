//! Everything the checks read, taken once per run: NVML (each GPU's
//! inventory, modes, health readings, MIG instances), processes, live jobs,
//! new kernel-log XIDs and the cursor kept between runs.

use super::cursor::{Cursor, CursorError};
use super::kmsg;
use super::config::HealthConfig;
use crate::gpu::{DriverVersions, GpuError, GpuInventory, GpuModes, GpuOps, HealthReadings, MigInstance, MigProfile};
use crate::mig_baseline::Baseline;
use crate::procfs::ProcInfo;
use crate::state::JobState;
use std::path::{Path, PathBuf};

/// One GPU as read at the start of the run.
#[derive(Debug, Clone, Default)]
pub struct GpuSnap {
    pub index: u32,
    pub inventory: Option<GpuInventory>,
    pub modes: Option<GpuModes>,
    pub health: Option<HealthReadings>,
    /// Only read while MIG is on.
    pub mig_instances: Vec<MigInstance>,
    pub mig_profiles: Vec<MigProfile>,
    /// Why the GPU could not be read completely (lost, needs reset, ...).
    pub error: Option<ReadError>,
}

/// A GPU read failure, kept with its kind so checks can name the fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadError {
    Lost(String),
    ResetRequired(String),
    Other(String),
}

impl From<&GpuError> for ReadError {
    fn from(e: &GpuError) -> Self {
        match e {
            GpuError::GpuLost { .. } => ReadError::Lost(e.to_string()),
            GpuError::ResetRequired { .. } => ReadError::ResetRequired(e.to_string()),
            _ => ReadError::Other(e.to_string()),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct NvmlSnap {
    pub driver: Option<DriverVersions>,
    pub gpus: Vec<GpuSnap>,
}

/// The inputs of every check.
pub struct Ctx<'a> {
    pub config: &'a HealthConfig,
    pub runtime_dir: PathBuf,
    /// NVML, or why it could not be initialized.
    pub nvml: Result<NvmlSnap, String>,
    pub processes: Vec<ProcInfo>,
    /// The node's MPS binaries ([`crate::mps::orphans::mps_binaries`]).
    pub mps_binaries: Vec<PathBuf>,
    /// Jobs whose state file exists: they hold their GPUs.
    pub live_jobs: Vec<JobState>,
    /// XIDs (new and remembered) and ECC baselines, updated for this run.
    pub cursor: Cursor,
    /// Why the kernel log could not be read, if it could not.
    pub kmsg_error: Option<kmsg::KmsgError>,
    /// Why the cursor file could not be read (it was started afresh).
    pub cursor_error: Option<CursorError>,
    /// The node's MIG baseline (`None`: none configured), or why it could
    /// not be read. The same definition `gpu-mode-mig` applies.
    pub mig_baseline: Result<Option<Baseline>, String>,
    /// CRIU's network locks of this node (`None`: no checkpoint mode here).
    pub netlocks: Option<crate::preempt::netlock::NetLocks>,
    /// The checkpoint readiness probes' findings (`None`: not probed).
    pub readiness: Option<super::readiness::Facts>,
}

impl Ctx<'_> {
    /// Whether a live job lists `gpu`.
    pub fn job_holds(&self, gpu: u32) -> bool {
        self.live_jobs.iter().any(|j| j.gpus.contains(&gpu))
    }

    pub fn gpus(&self) -> &[GpuSnap] {
        self.nvml.as_ref().map(|n| n.gpus.as_slice()).unwrap_or(&[])
    }
}

/// Reads one GPU; a failure stops at the first fatal error and is kept.
pub fn read_gpu(ops: &dyn GpuOps, gpu: u32) -> GpuSnap {
    let mut s = GpuSnap { index: gpu, ..GpuSnap::default() };
    let result = (|| -> Result<(), GpuError> {
        s.inventory = Some(ops.inventory(gpu)?);
        let modes = ops.modes(gpu)?;
        s.modes = Some(modes);
        s.health = Some(ops.health(gpu)?);
        if modes.mig.is_some_and(|m| m.current) {
            s.mig_instances = ops.mig_instances(gpu)?;
            s.mig_profiles = ops.mig_profiles(gpu)?;
        }
        Ok(())
    })();
    s.error = result.err().as_ref().map(ReadError::from);
    s
}

/// Reads NVML: the driver, then every GPU.
pub fn read_nvml(ops: &dyn GpuOps) -> Result<NvmlSnap, String> {
    let count = ops.count().map_err(|e| e.to_string())?;
    let driver = ops.driver().ok();
    Ok(NvmlSnap { driver, gpus: (0..count).map(|g| read_gpu(ops, g)).collect() })
}

/// Live job states (the job state's own reading, which the MIG baseline
/// uses too).
pub use crate::state::live_jobs;

/// Where a snapshot reads from, besides NVML: the checker's section of the
/// config, the two node paths it needs, and the node's MIG baseline (read
/// by the caller from the site config: health never sees the whole config).
pub struct Sources<'a> {
    pub health: &'a HealthConfig,
    pub runtime_dir: &'a Path,
    /// nvidia-cuda-mps-control (the MPS binaries are it and its sibling).
    pub mps_control: &'a Path,
    pub mig_baseline: Result<Option<Baseline>, String>,
    /// CRIU's network locks' records and nft (preempt::netlock).
    pub netlocks: Option<crate::preempt::netlock::NetLocks>,
    /// What the checkpoint readiness probes read (`[preempt]`'s paths).
    pub readiness: Option<super::readiness::Inputs>,
}

/// Takes the snapshot: `nvml` is what opening NVML gave.
pub fn take<'a>(src: &Sources<'a>, nvml: Result<&dyn GpuOps, String>) -> Ctx<'a> {
    let h = src.health;
    let nvml = nvml.and_then(read_nvml);
    let state_dir = h.state_dir(src.runtime_dir);
    let (mut cursor, cursor_error) = match Cursor::load(&state_dir) {
        Ok(c) => (c, None),
        Err(e) => (Cursor::default(), Some(e)),
    };
    let boot = kmsg::boot_id();
    let kmsg_error = match kmsg::read_records(&h.kmsg_path) {
        Ok(records) => {
            let buses: Vec<(u32, String)> = nvml_buses(&nvml);
            cursor.absorb(&boot, &records, &buses, h);
            None
        }
        Err(e) => {
            cursor.start_boot(&boot);
            Some(e)
        }
    };
    if let Ok(n) = &nvml {
        for g in &n.gpus {
            if let (Some(inv), Some(v)) = (&g.inventory, g.health.as_ref().and_then(|h| h.ecc_uncorrected_volatile)) {
                cursor.observe_ecc(&inv.uuid, v);
            }
        }
    }
    Ctx {
        config: h,
        runtime_dir: src.runtime_dir.to_path_buf(),
        nvml,
        processes: crate::procfs::all(),
        live_jobs: live_jobs(src.runtime_dir),
        mps_binaries: crate::mps::orphans::mps_binaries(src.mps_control),
        cursor,
        kmsg_error,
        cursor_error,
        mig_baseline: src.mig_baseline.clone(),
        netlocks: src.netlocks.clone(),
        readiness: src.readiness.as_ref().map(super::readiness::gather),
    }
}

fn nvml_buses(nvml: &Result<NvmlSnap, String>) -> Vec<(u32, String)> {
    let Ok(n) = nvml else { return Vec::new() };
    n.gpus.iter().filter_map(|g| Some((g.index, g.inventory.as_ref()?.pci_bus_id.clone()))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{ComputeInstance, ErrorKind, GpuLabel, GpuProcess, MigModeChange, MigModes, XidEvent};
    use crate::health::fake::{healthy_gpu, job, Fixture};
    use std::cell::RefCell;
    use std::time::Duration;

    /// Healthy GPUs (health/fake.rs) whose reads answer from a snapshot,
    /// one call failing on one GPU where asked; records the calls made.
    struct Scripted {
        gpus: Vec<GpuSnap>,
        /// (call, GPU, the error it returns once).
        fail: RefCell<Option<(&'static str, u32, GpuError)>>,
        calls: RefCell<Vec<String>>,
    }

    impl Scripted {
        fn new(gpus: Vec<GpuSnap>) -> Scripted {
            Scripted { gpus, fail: RefCell::new(None), calls: RefCell::new(Vec::new()) }
        }

        fn fail(&self, call: &'static str, gpu: u32, error: GpuError) {
            *self.fail.borrow_mut() = Some((call, gpu, error));
        }

        fn answer<T>(&self, call: &'static str, gpu: u32, value: impl FnOnce(&GpuSnap) -> T) -> Result<T, GpuError> {
            self.calls.borrow_mut().push(format!("{call} {gpu}"));
            let mut fail = self.fail.borrow_mut();
            match fail.take() {
                Some((c, g, e)) if c == call && g == gpu => Err(e),
                other => {
                    *fail = other;
                    Ok(value(&self.gpus[gpu as usize]))
                }
            }
        }
    }

    impl GpuOps for Scripted {
        fn driver(&self) -> Result<DriverVersions, GpuError> {
            self.answer("driver", 0, |_| DriverVersions { driver: "580.159.04".into(), nvml: "13".into(), cuda: "13.0".into() })
        }
        fn count(&self) -> Result<u32, GpuError> {
            self.answer("count", 0, |_| ()).map(|()| self.gpus.len() as u32)
        }
        fn inventory(&self, gpu: u32) -> Result<GpuInventory, GpuError> {
            self.answer("inventory", gpu, |g| g.inventory.clone().unwrap())
        }
        fn minor_number(&self, gpu: u32) -> Result<u32, GpuError> {
            Ok(gpu)
        }
        fn modes(&self, gpu: u32) -> Result<GpuModes, GpuError> {
            self.answer("modes", gpu, |g| g.modes.unwrap())
        }
        fn mig_profiles(&self, gpu: u32) -> Result<Vec<MigProfile>, GpuError> {
            self.answer("mig_profiles", gpu, |_| crate::mig::placement::h100_table())
        }
        fn mig_instances(&self, gpu: u32) -> Result<Vec<MigInstance>, GpuError> {
            let one = MigInstance { gpu_instance: 1, profile_id: 19, placement_start: 0, placement_size: 1, compute_instances: Vec::<ComputeInstance>::new() };
            self.answer("mig_instances", gpu, |_| vec![one])
        }
        fn health(&self, gpu: u32) -> Result<HealthReadings, GpuError> {
            self.answer("health", gpu, |g| g.health.clone().unwrap())
        }
        fn processes(&self, _gpu: u32) -> Result<Vec<GpuProcess>, GpuError> {
            unreachable!("the snapshot reads processes from /proc")
        }
        fn wait_xid_events(&self, _window: Duration) -> Result<Vec<XidEvent>, GpuError> {
            unreachable!("the snapshot reads XIDs from the kernel log")
        }
        fn set_compute_mode(&self, _gpu: u32, _mode: crate::gpu::ComputeMode) -> Result<(), GpuError> {
            unreachable!("a snapshot changes nothing")
        }
        fn set_mig_mode(&self, _gpu: u32, _enable: bool) -> Result<MigModeChange, GpuError> {
            unreachable!("a snapshot changes nothing")
        }
        fn create_mig_instance(&self, _gpu: u32, _profile_id: u32, _placement: Option<u32>) -> Result<MigInstance, GpuError> {
            unreachable!("a snapshot changes nothing")
        }
        fn destroy_mig_instance(&self, _gpu: u32, _gpu_instance: u32) -> Result<(), GpuError> {
            unreachable!("a snapshot changes nothing")
        }
    }

    fn with_mig(current: bool, pending: bool) -> GpuSnap {
        let mut g = healthy_gpu(0);
        g.modes.as_mut().unwrap().mig = Some(MigModes { current, pending });
        g
    }

    fn lost(call: &'static str) -> GpuError {
        GpuError::GpuLost { call, gpu: GpuLabel(Some(0)) }
    }

    /// What a row expects of the GPU read: which parts were read, the MIG
    /// instances' count and the error's kind.
    type Read = (bool, bool, bool, usize, Option<&'static str>);

    fn kind(e: &ReadError) -> &'static str {
        match e {
            ReadError::Lost(_) => "lost",
            ReadError::ResetRequired(_) => "reset",
            ReadError::Other(_) => "other",
        }
    }

    #[test]
    fn a_gpu_read_stops_at_the_first_failure_and_keeps_its_kind() {
        let reset = GpuError::ResetRequired { call: "nvmlDeviceGetMigMode", gpu: GpuLabel(Some(0)) };
        let other = GpuError::Nvml { call: "nvmlDeviceGetTemperature", gpu: GpuLabel(Some(0)), kind: ErrorKind::NotSupported };
        // (what, the GPU, the call that fails and its error, what is read)
        type Case = (&'static str, GpuSnap, Option<(&'static str, GpuError)>, Read);
        let cases: Vec<Case> = vec![
            ("a GPU without MIG: no MIG reads", healthy_gpu(0), None, (true, true, true, 0, None)),
            ("MIG on: its instances are read", with_mig(true, true), None, (true, true, true, 1, None)),
            ("MIG on only after a reset: none read", with_mig(false, true), None, (true, true, true, 0, None)),
            ("lost at the inventory: nothing more", healthy_gpu(0), Some(("inventory", lost("nvmlDeviceGetUUID"))), (false, false, false, 0, Some("lost"))),
            ("a reset needed at the modes", healthy_gpu(0), Some(("modes", reset)), (true, false, false, 0, Some("reset"))),
            ("another error at the health readings", healthy_gpu(0), Some(("health", other)), (true, true, false, 0, Some("other"))),
            ("lost at the MIG instances", with_mig(true, true), Some(("mig_instances", lost("nvmlDeviceGetGpuInstances"))), (true, true, true, 0, Some("lost"))),
        ];
        for (what, gpu, fail, want) in cases {
            let ops = Scripted::new(vec![gpu]);
            if let Some((call, e)) = fail {
                ops.fail(call, 0, e);
            }
            let s = read_gpu(&ops, 0);
            let got = (s.inventory.is_some(), s.modes.is_some(), s.health.is_some(), s.mig_instances.len(), s.error.as_ref().map(kind));
            assert_eq!(got, want, "{what}: calls {:?}", ops.calls.borrow());
            let read_profiles = ops.calls.borrow().iter().any(|c| c.starts_with("mig_profiles"));
            assert_eq!(read_profiles, want.3 > 0, "{what}: profiles are read with the instances");
        }
    }

    #[test]
    fn nvml_is_unusable_only_without_a_count() {
        let ops = Scripted::new(vec![healthy_gpu(0), healthy_gpu(1)]);
        let n = read_nvml(&ops).unwrap();
        assert_eq!((n.driver.is_some(), n.gpus.len()), (true, 2));
        ops.fail("driver", 0, GpuError::MissingSymbol { call: "nvmlSystemGetDriverVersion" });
        let n = read_nvml(&ops).unwrap();
        assert_eq!((n.driver.is_some(), n.gpus.iter().map(|g| g.index).collect::<Vec<_>>()), (false, vec![0, 1]), "no driver version: still every GPU");
        ops.fail("count", 0, GpuError::DriverNotLoaded { call: "nvmlDeviceGetCount" });
        let err = read_nvml(&ops).unwrap_err();
        assert!(err.contains("nvmlDeviceGetCount: the NVIDIA driver is not loaded"), "{err}");
    }

    #[test]
    fn live_jobs_are_the_readable_states_of_numbered_files() {
        let dir = tempfile::tempdir().unwrap();
        let runtime = dir.path();
        assert!(live_jobs(runtime).is_empty(), "no jobs directory: no jobs");
        job(3, &[0], "mps").save(runtime).unwrap();
        job(12, &[1, 2], "checkpoint").save(runtime).unwrap();
        let jobs = crate::state::jobs_dir(runtime);
        for (name, text) in [("4.json", "{ corrupt"), ("notes.json", "{}"), ("5.json.tmp", "{}"), ("6.txt", "{}")] {
            std::fs::write(jobs.join(name), text).unwrap();
        }
        let mut ids: Vec<u32> = live_jobs(runtime).iter().map(|j| j.job_id).collect();
        ids.sort();
        assert_eq!(ids, vec![3, 12]);
    }

    #[test]
    fn a_gpu_is_held_while_a_live_job_lists_it() {
        let mut f = Fixture::new(vec![healthy_gpu(0), healthy_gpu(1), healthy_gpu(2)]);
        f.jobs = vec![job(3, &[0], "mps"), job(4, &[2], "mig:1g.10gb")];
        let held: Vec<bool> = (0..4).map(|g| f.ctx().job_holds(g)).collect();
        assert_eq!(held, vec![true, false, true, false]);
        assert_eq!(f.ctx().gpus().len(), 3);
        f.nvml_error = Some("no NVML".into());
        assert!(f.ctx().gpus().is_empty(), "without NVML no GPU is known");
    }

    #[test]
    fn a_snapshot_names_what_it_could_not_read_and_starts_afresh() {
        let dir = tempfile::tempdir().unwrap();
        let health = HealthConfig { kmsg_path: dir.path().join("no-kmsg"), state_dir: Some(dir.path().join("state")), ..HealthConfig::default() };
        let mut ops = Scripted::new(vec![healthy_gpu(0)]);
        ops.gpus[0].health.as_mut().unwrap().ecc_uncorrected_volatile = Some(5);
        let mps_control = dir.path().join("nvidia-cuda-mps-control");
        std::fs::create_dir(dir.path().join("state")).unwrap();
        std::fs::write(dir.path().join("state").join(super::super::cursor::CURSOR_FILE), b"{ corrupt").unwrap();
        let src = |h| Sources { health: h, runtime_dir: dir.path(), mps_control: &mps_control, mig_baseline: Ok(None), netlocks: None, readiness: None };
        let ctx = take(&src(&health), Ok(&ops));
        assert!(ctx.kmsg_error.as_ref().is_some_and(|e| e.to_string().contains("no-kmsg")), "{:?}", ctx.kmsg_error);
        assert!(ctx.cursor_error.as_ref().is_some_and(|e| e.to_string().contains("cursor.json")), "{:?}", ctx.cursor_error);
        assert_eq!(ctx.cursor.boot_id, kmsg::boot_id(), "a fresh cursor for this boot");
        assert_eq!(ctx.cursor.ecc_baseline.get("GPU-0"), Some(&0), "a new GPU's ECC baseline starts at 0, not at its count");
        assert_eq!(ctx.gpus().len(), 1);
        let fresh = HealthConfig { state_dir: Some(dir.path().join("empty")), ..health.clone() };
        let ctx = take(&src(&fresh), Err("libnvidia-ml.so.1: not found".into()));
        assert_eq!((ctx.nvml.unwrap_err().as_str(), ctx.cursor_error.map(|e| e.to_string())), ("libnvidia-ml.so.1: not found", None));
    }
}
