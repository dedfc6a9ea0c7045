//! The project's artifacts the cluster runs: the plugin and the helper
//! binaries, from the workspace's target directory, or the files a package
//! installed ([`Artifacts::installed`]).

use anyhow::{bail, Result};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone)]
pub struct Artifacts {
    pub plugin: PathBuf,
    pub prolog: PathBuf,
    pub epilog: PathBuf,
    pub node_checker: PathBuf,
    /// The simulated GPU side; `None` where it was not built (GPU machines).
    pub sim: Option<SimArtifacts>,
}

/// The simulated libnvidia-ml and MPS binaries (sim/nvml, sim/mps).
#[derive(Debug, Clone)]
pub struct SimArtifacts {
    pub nvml_library: PathBuf,
    pub nvml_ctl: PathBuf,
    pub mps_control: PathBuf,
    pub mps_server: PathBuf,
    /// sim/nvml/fixtures.
    pub fixtures: PathBuf,
}

impl Artifacts {
    /// Finds the artifacts of the current build profile, or those under
    /// `GPU_MODE_ARTIFACTS` (a directory holding them, as carried to the GPU
    /// machine). Missing files are named in the error with the fix.
    pub fn locate() -> Result<Artifacts> {
        let dir = match std::env::var_os("GPU_MODE_ARTIFACTS") {
            Some(d) => PathBuf::from(d),
            None => target_profile_dir(),
        };
        let a = Artifacts {
            plugin: dir.join("libgpu_mode_spank.so"),
            prolog: dir.join("gpu-mode-prolog"),
            epilog: dir.join("gpu-mode-epilog"),
            node_checker: dir.join("gpu-mode-node-checker"),
            sim: None,
        };
        for p in [&a.plugin, &a.prolog, &a.epilog, &a.node_checker] {
            if !p.is_file() {
                bail!("{} is missing: run `cargo build --workspace` first (or set GPU_MODE_ARTIFACTS)", p.display());
            }
        }
        let sim = SimArtifacts {
            nvml_library: dir.join("libnvml_sim.so"),
            nvml_ctl: dir.join("nvml-sim-ctl"),
            mps_control: dir.join("nvidia-cuda-mps-control"),
            mps_server: dir.join("nvidia-cuda-mps-server"),
            // Carried artifacts bring their fixtures along.
            fixtures: if dir.join("fixtures").is_dir() {
                dir.join("fixtures")
            } else {
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../sim/nvml/fixtures")
            },
        };
        let built = [&sim.nvml_library, &sim.nvml_ctl, &sim.mps_control, &sim.mps_server].iter().all(|p| p.is_file());
        Ok(Artifacts { sim: built.then_some(sim), ..a })
    }
}

impl SimArtifacts {
    /// Another program of the simulation, built beside nvml-sim-ctl
    /// (`cuda-sim-counter`, `cuda-sim-ctl`, `libcuda_sim.so`).
    pub fn beside(&self, name: &str) -> PathBuf {
        self.nvml_ctl.with_file_name(name)
    }
}

/// Where the .deb puts them (packaging: spank-plugin/Cargo.toml).
pub const INSTALLED_PLUGIN: &str = "/usr/lib/x86_64-linux-gnu/slurm-wlm/gpu_mode.so";
pub const INSTALLED_LIBEXEC: &str = "/usr/libexec/slurm-gpu-mode";

impl Artifacts {
    /// The installed package's plugin and helpers; the simulated GPU side
    /// still comes from the build (it stands for the NVIDIA driver).
    pub fn installed() -> Result<Artifacts> {
        let a = Artifacts::installed_unchecked();
        for p in [&a.plugin, &a.prolog, &a.epilog, &a.node_checker] {
            if !p.is_file() {
                bail!("{} is missing: install the slurm-gpu-mode package first (packaging/build-packages.sh)", p.display());
            }
        }
        Ok(a)
    }
}

impl Artifacts {
    /// [`Artifacts::installed`] before the package is there (a cluster is
    /// written before the role installs it).
    pub fn installed_unchecked() -> Artifacts {
        let dir = Path::new(INSTALLED_LIBEXEC);
        Artifacts {
            plugin: PathBuf::from(INSTALLED_PLUGIN),
            prolog: dir.join("gpu-mode-prolog"),
            epilog: dir.join("gpu-mode-epilog"),
            node_checker: dir.join("gpu-mode-node-checker"),
            sim: Artifacts::locate().ok().and_then(|a| a.sim),
        }
    }
}

/// `<target>/<profile>`: CARGO_TARGET_DIR or `<workspace>/target`, and the
/// profile this test binary was built with (its own path tells).
fn target_profile_dir() -> PathBuf {
    // Test binaries live in <target>/<profile>/deps/; the harness binary in
    // <target>/<profile>/.
    if let Ok(exe) = std::env::current_exe() {
        let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
        if dir.ends_with("deps") {
            dir.pop();
        }
        if dir.join("gpu-mode-prolog").exists() || dir.join("libgpu_mode_spank.so").exists() {
            return dir;
        }
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("debug")
}
