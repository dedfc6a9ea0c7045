//! A simulated node for tests: a state file from an nvml-sim fixture, and
//! a config whose `[nvml] library` is the simulated libnvidia-ml, so the GPU
//! layer runs its production path (nvml-wrapper loading a library).
//!
//! libnvml_sim.so is built by cargo because nvml-sim is a dev-dependency of
//! gpu-mode-core; it lands in target/<profile>/deps, next to this test binary.

#![allow(dead_code)]

use gpu_mode_core::gpu::NvmlGpus;
use nvml_sim::model::{Fault, NodeState, SimProcess};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

/// The environment is per process and the simulated library is loaded once
/// per process: tests that use a simulated node run one at a time.
static ONE_NODE_AT_A_TIME: Mutex<()> = Mutex::new(());

pub fn sim_library() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("test binary directory");
    let candidates = [deps.join("libnvml_sim.so"), deps.parent().unwrap_or(deps).join("libnvml_sim.so")];
    candidates.iter().find(|p| p.exists()).cloned().unwrap_or_else(|| {
        panic!(
            "libnvml_sim.so not found in {} or its parent: build the simulated NVML first \
             (`cargo build --workspace`; `cargo test -p gpu-mode-core` builds it as a dev-dependency)",
            deps.display()
        )
    })
}

/// A site config whose `[nvml] library` is the simulated one.
pub fn config() -> gpu_mode_core::Config {
    let mut cfg = gpu_mode_core::Config::default();
    cfg.nvml.library = Some(sim_library());
    cfg
}

pub struct SimNode {
    _dir: tempfile::TempDir,
    pub state: PathBuf,
    _lock: MutexGuard<'static, ()>,
}

impl SimNode {
    /// A fresh node from `sim/nvml/fixtures/<fixture>`.
    pub fn new(fixture: &str) -> SimNode {
        let lock = ONE_NODE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state.json");
        nvml_sim::store::create(&state, &nvml_sim::fixtures_dir().join(fixture)).unwrap();
        std::env::set_var(nvml_sim::store::STATE_ENV, &state);
        std::env::remove_var(nvml_sim::store::FIXTURE_ENV);
        SimNode { _dir: dir, state, _lock: lock }
    }

    /// The GPU layer, opened the way the helpers open it: from the config.
    pub fn gpus(&self) -> NvmlGpus {
        NvmlGpus::from_config(&config()).expect("open the simulated NVML")
    }

    /// Changes the node as nvml-sim-ctl would.
    pub fn edit<R>(&self, f: impl FnOnce(&mut NodeState) -> R) -> R {
        nvml_sim::store::update(&self.state, f).unwrap()
    }

    pub fn inject(&self, gpu: u32, fault: Fault) {
        self.edit(|s| s.inject(gpu, &fault)).unwrap();
    }

    pub fn add_process(&self, gpu: u32, pid: u32) {
        let p = SimProcess { pid, used_mib: 1024, gpu_instance: None, compute_instance: None, live: false };
        self.edit(|s| s.gpus[gpu as usize].processes.push(p));
    }
}
