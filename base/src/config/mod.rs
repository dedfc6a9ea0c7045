//! The site configuration file, `/etc/slurm-gpu-mode/config.toml` by default.
//! Every key is optional and documented in `etc/config.toml`. Unknown keys are
//! errors: a typo must not silently fall back to a default on a root helper.

use crate::fsutil::require_absolute;
use crate::gpu_mode::NcclTransport;

/// `[health]`, the node checker's own section.
pub mod health;
pub use health::{DeepConfig, HealthConfig, Severity};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// `[gpu] mps_compute_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ComputeModeSetting {
    ExclusiveProcess,
    Default,
    Prohibited,
    /// Never change the compute mode.
    Leave,
}

/// `[gpu] mig_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MigModeSetting {
    /// Enable/disable MIG as jobs ask.
    Switch,
    /// Never change MIG mode; a job that needs another mode is refused.
    Leave,
}

/// `[gpu] mig_instances`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MigInstanceSetting {
    /// Create and destroy instances as jobs ask.
    Manage,
    /// Never create or destroy; a job whose layout is not there is refused.
    Leave,
}

/// `[metrics]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// The textfile written for node_exporter's textfile collector (a
    /// `.prom` file in its `--collector.textfile.directory`); unset: no
    /// metrics are kept.
    pub textfile: Option<PathBuf>,
}

impl MetricsConfig {
    pub fn validate(&self, health_textfile: Option<&PathBuf>) -> Result<(), String> {
        if let Some(p) = &self.textfile {
            crate::fsutil::require_absolute("metrics.textfile", p)?;
            if p.extension().and_then(|e| e.to_str()) != Some("prom") {
                return Err(format!("metrics.textfile = {}: node_exporter reads only files ending in .prom", p.display()));
            }
            if Some(p) == health_textfile {
                return Err("metrics.textfile and health.prometheus_textfile name the same file: each writer would replace the other's".into());
            }
        }
        Ok(())
    }
}

/// A name refused by [`check_unit_name`]: it could be read as an option or
/// a path by systemctl, which root runs with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("\"{0}\" is not a systemd unit name (letters, digits and :_.@-\\ only, not starting with -)")]
pub struct BadUnitName(pub String);

/// systemd unit names as the config may give them: no options, no paths.
pub fn check_unit_name(name: &str) -> Result<(), BadUnitName> {
    let ok = !name.is_empty()
        && name.len() <= 256
        && !name.starts_with('-')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || ":_.@-\\".contains(c));
    if ok {
        Ok(())
    } else {
        Err(BadUnitName(name.to_string()))
    }
}

/// `preempt.accounting`: which field of the job gets the events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AccountingField {
    /// Only admins (root, SlurmUser) may set it: the agent is root.
    #[default]
    AdminComment,
    /// The job's owner may set it too; for sites that use AdminComment.
    Comment,
    Off,
}

/// `preempt.nccl_portable`: what the site does with
/// `--gpu-mode=checkpoint:nccl=portable` (docs/preempt.md, "NCCL by driver
/// branch").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NcclPortableSetting {
    /// A job may ask for it; without `nccl=` a job keeps NCCL's defaults.
    #[default]
    Allow,
    /// A job that asks for it is refused at submission (and in the prolog).
    Forbid,
    /// Every checkpoint job gets it unless it asks for `nccl=native`.
    Default,
}

/// `preempt.host_pool`: what the site does with
/// `--gpu-mode=checkpoint:pool=on`, the host memory pool that serves the
/// driver's checkpoint buffer (issue 39; preempt::pool).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostPoolSetting {
    /// A job may ask for it; without `pool=` a job gets none.
    #[default]
    Allow,
    /// A job that asks for it is refused at submission (and in the prolog).
    Forbid,
    /// Every checkpoint job gets it unless it asks for `pool=off`.
    Default,
}

/// The largest `cuda_ckpt.memory_margin_mib` accepted (1 TiB).
pub const MAX_MARGIN_MIB: u64 = 1 << 20;

/// Where the helpers look when no `--config` / `config=` is given.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/slurm-gpu-mode/config.toml";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The file this config was read from (`None`: the defaults), so helpers
    /// the prolog starts (the checkpoint agent) read the same one.
    #[serde(skip)]
    pub source: Option<PathBuf>,
    /// What the file still says in a form that is read for now but goes in
    /// a later release (the `[checkpoint]` section): one line each, for the
    /// node checker and the hooks to pass on ([`RENAMED_SECTION`]).
    #[serde(skip)]
    pub notices: Vec<String>,
    /// Root-owned directory for per-job state and per-job MPS directories.
    pub runtime_dir: PathBuf,
    /// Bound on a whole prolog/epilog run; past it the helper drains the node
    /// naming the step that hung and exits (slurmd waits forever by default).
    pub hook_deadline_ms: u64,
    pub slurm: SlurmConfig,
    pub log: LogConfig,
    pub nvml: NvmlConfig,
    pub mig: MigConfig,
    pub gpu: GpuConfig,
    pub cuda_ckpt: CudaCkptConfig,
    pub preempt: PreemptConfig,
    pub mps: MpsConfig,
    pub health: HealthConfig,
    /// `[metrics]`: the Prometheus textfile (docs/metrics.md).
    pub metrics: MetricsConfig,
}

/// `[mps]`: the per-job MPS daemons.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MpsConfig {
    /// Absolute path of nvidia-cuda-mps-control (no PATH under slurmd).
    pub control: PathBuf,
    /// Bound on starting a daemon: `-d` returning and its control socket answering.
    pub start_timeout_ms: u64,
    /// After `quit`, how long the daemon and its servers get to exit.
    pub quit_timeout_ms: u64,
    /// After SIGTERM (and again after SIGKILL), how long leftovers get to die.
    pub kill_timeout_ms: u64,
    /// How long a prolog/epilog waits for another job's hold on a GPU.
    pub lock_timeout_ms: u64,
}

impl Default for MpsConfig {
    fn default() -> Self {
        MpsConfig {
            control: PathBuf::from("/usr/bin/nvidia-cuda-mps-control"),
            start_timeout_ms: 10_000,
            quit_timeout_ms: 5_000,
            kill_timeout_ms: 3_000,
            lock_timeout_ms: 60_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SlurmConfig {
    /// Absolute path of scontrol: helpers run with no PATH. squeue is run
    /// from the same directory (`drain::Scontrol::job_field`).
    pub scontrol: PathBuf,
    /// The node's gres.conf, read by the prolog of jobs with a mode and GPUs
    /// to map Slurm's GPU indices to NVML's (`gpu::slurm_index`).
    pub gres_conf: PathBuf,
    /// Drain the node with a `gpu-mode:` reason when a node-level fault is
    /// found. Off only for sites that drain through their own tooling.
    pub drain_on_node_fault: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// Send each action line to syslog (the journal on systemd hosts).
    pub syslog: bool,
    /// Also print each action line on stderr (slurmd logs a failing Prolog's stderr).
    pub stderr: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NvmlConfig {
    /// libnvidia-ml to load; empty means the system's (`libnvidia-ml.so.1`).
    pub library: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MigConfig {
    /// Named layouts for `--gpu-mode=mig:@<name>`: name → profile list in the
    /// option's own syntax, e.g. `half = "3g.40gbx2"`.
    pub layouts: BTreeMap<String, String>,
    /// The node's MIG baseline (`gpu-mode-mig apply` at boot, the node
    /// checker's stale-MIG check): `@<layout>` of `layouts`, or the name of
    /// a config in `baseline_config`. Unset: no baseline.
    pub baseline: Option<String>,
    /// A mig-parted config file (`version: v1`, `mig-configs:`).
    pub baseline_config: Option<PathBuf>,
    /// Units stopped (if active) around MIG mode changes, in this order,
    /// and started again in reverse order: a GPU reset needs every client gone.
    pub services: Vec<String>,
    /// Units stopped around instance changes alone (slurmd reads the MIG
    /// devices only when it starts).
    pub layout_services: Vec<String>,
    /// Absolute paths of the programs gpu-mode-mig runs.
    pub systemctl: PathBuf,
    pub nvidia_smi: PathBuf,
}

impl Default for MigConfig {
    fn default() -> Self {
        let units = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
        MigConfig {
            layouts: BTreeMap::new(),
            baseline: None,
            baseline_config: None,
            // Consumers first, so nothing reconnects while the rest stop.
            services: units(&[
                "slurmd.service",
                "dcgm-exporter.service",
                "nvidia-dcgm.service",
                "nvidia-persistenced.service",
                "nvidia-fabricmanager.service",
            ]),
            layout_services: units(&["slurmd.service"]),
            systemctl: PathBuf::from("/usr/bin/systemctl"),
            nvidia_smi: PathBuf::from("/usr/bin/nvidia-smi"),
        }
    }
}

impl MigConfig {
    /// `[mig]`'s keys; `legacy` is `[health] mig_baseline` (one or the other).
    fn validate(&self, legacy: &[String]) -> Result<(), String> {
        require_absolute("mig.systemctl", &self.systemctl)?;
        require_absolute("mig.nvidia_smi", &self.nvidia_smi)?;
        if let Some(p) = &self.baseline_config {
            require_absolute("mig.baseline_config", p)?;
        }
        for (key, list) in [("mig.services", &self.services), ("mig.layout_services", &self.layout_services)] {
            for unit in list {
                check_unit_name(unit).map_err(|e| format!("{key}: {e}"))?;
            }
        }
        match (&self.baseline, &self.baseline_config) {
            (None, Some(p)) => return Err(format!("mig.baseline_config = {p:?} needs mig.baseline = \"<config name>\"")),
            (Some(b), None) if !b.starts_with('@') => {
                return Err(format!("mig.baseline = \"{b}\" names a mig-parted config, but mig.baseline_config is not set (for a [mig.layouts] layout write \"@{b}\")"))
            }
            (Some(b), _) if b.starts_with('@') && !self.layouts.contains_key(&b[1..]) => {
                return Err(format!("mig.baseline = \"{b}\": no [mig.layouts] layout named \"{}\"", &b[1..]))
            }
            (Some(b), _) if b.is_empty() || b.len() > 256 || b.chars().any(|c| c.is_control()) => {
                return Err(format!("mig.baseline = {b:?} is not a config name"))
            }
            _ => {}
        }
        if self.baseline.is_some() && !legacy.is_empty() {
            return Err("health.mig_baseline and mig.baseline are both set: keep mig.baseline (health.mig_baseline is its old form)".into());
        }
        Ok(())
    }
}

/// Which GPU settings the helpers may change. Each has a "leave" value that
/// never changes it (e.g. on shared machines where only reads are allowed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GpuConfig {
    /// Compute mode the prolog sets on an MPS job's GPUs. The epilog puts
    /// back the mode each GPU had before (the MPS registry records it), so
    /// there is no setting for that: see [`REMOVED_KEYS`].
    pub mps_compute_mode: ComputeModeSetting,
    /// Whether MIG mode may be switched on or off for jobs.
    pub mig_mode: MigModeSetting,
    /// Whether MIG instances may be created and destroyed for jobs.
    pub mig_instances: MigInstanceSetting,
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            mps_compute_mode: ComputeModeSetting::ExclusiveProcess,
            mig_mode: MigModeSetting::Switch,
            mig_instances: MigInstanceSetting::Manage,
        }
    }
}

/// `[cuda_ckpt]`: the CUDA driver's checkpoint verb (devices::cuda_ckpt),
/// wherever it runs: `gpu-mode-cuda-ckpt` by hand, the preemption agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CudaCkptConfig {
    /// How long cuCheckpointProcessLock waits for a process's GPU work to drain.
    pub lock_timeout_ms: u32,
    /// Free GPU memory a restore needs beyond the recorded footprint.
    pub memory_margin_mib: u64,
    /// libcuda to load; unset means the system's (`libcuda.so.1`).
    pub cuda_library: Option<PathBuf>,
    /// Bound on every other driver call (checkpoint, restore, unlock, state),
    /// and added to `lock_timeout_ms` for Lock.
    pub call_timeout_ms: u64,
    /// Path prefixes whose descriptors/mappings make a process a GPU holder.
    pub device_paths: Vec<String>,
}

impl Default for CudaCkptConfig {
    fn default() -> Self {
        CudaCkptConfig {
            lock_timeout_ms: 10_000,
            memory_margin_mib: 512,
            cuda_library: None,
            call_timeout_ms: 300_000,
            device_paths: vec!["/dev/nvidia".into()],
        }
    }
}

/// `[preempt]`: `--gpu-mode=checkpoint` on preemption (core::preempt): the
/// agent, CRIU, images, the wrapper; see etc/config.toml.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PreemptConfig {
    /// Where CRIU images go: `<image_dir>/<job>/<restart count>/`.
    pub image_dir: PathBuf,
    /// A node-local directory the dump lands in first; the agent then copies
    /// the image to `image_dir` in the background (core::preempt::staging).
    /// Unset: the dump goes straight to `image_dir`.
    pub staging_dir: Option<PathBuf>,
    /// How long a restore on another node waits for a staged image's copy
    /// to reach `image_dir` before the job starts over.
    pub staging_wait_s: u64,
    /// Bandwidth bound of the background copy, MiB/s; 0: none.
    pub staging_copy_mib_per_s: u64,
    /// The agents' sockets; unset: `<runtime_dir>/agent`.
    pub agent_socket_dir: Option<PathBuf>,
    /// The per-job agent the prolog starts.
    pub agent: PathBuf,
    pub criu: PathBuf,
    /// nft, which removes the nftables tables CRIU's network locks leave
    /// (core::preempt::netlock); a node without it keeps them (logged).
    pub nft: PathBuf,
    /// Bound on one `criu dump` or `criu restore`.
    pub criu_timeout_ms: u64,
    /// CRIU's `--ghost-limit`, MiB: the most of one deleted-but-open file
    /// a dump copies into the image (a larger one fails the dump).
    pub ghost_limit_mib: u64,
    /// A tree holding more deleted files (open or mapped) than this is
    /// refused before anything is locked (core::preempt::uncheckpointable).
    pub max_deleted_files: u32,
    /// Threads that read a restored process's large mappings (the driver's
    /// checkpoint buffer) from the image: `CRIU_PAGE_READERS` of the CRIU
    /// that scripts/install-criu.sh builds (packaging/criu/0004); 1: one.
    pub restore_page_readers: u32,
    /// The driver's checkpoint buffer is mapped from the image at a restore
    /// (`CRIU_MAP_SEQUENTIAL_PAGES=1` of packaging/criu/0007; the huge-page
    /// library marks the buffer) instead of read into fresh memory, where
    /// the image is in the page cache (preempt::page_cache); false: always
    /// read, by `restore_page_readers` threads.
    pub restore_map_buffers: bool,
    /// Signal (besides SIGTERM) that makes gpu-mode-run checkpoint: "USR1".
    pub signal: String,
    /// Least `@<secs>` of `--signal` the submission check accepts.
    pub min_signal_lead_s: u32,
    /// slurm.conf has JobRequeue=1: jobs are requeueable unless --no-requeue.
    pub site_job_requeue: bool,
    /// The site adds `--signal` to checkpoint jobs itself (job_submit plugin).
    pub site_signal: bool,
    /// Image directory limits for the epilog's sweep; 0: no limit.
    pub images_max_gib: u64,
    pub images_max_age_hours: u64,
    /// Start writing the image to disk while CRIU dumps it (see
    /// preempt/writeback.rs); off: all of it at the seal.
    pub early_writeback: bool,
    /// Which field of the job's Slurm record gets its checkpoint and
    /// restore events (core::preempt::accounting).
    pub accounting: AccountingField,
    /// gpu-mode-run preloads the huge-page shim into the application
    /// (core::preempt::hugepages).
    pub huge_pages: bool,
    pub huge_pages_library: PathBuf,
    /// Where the agent keeps a copy of each version of the shim, named by
    /// its content, so that images taken before an upgrade still restore.
    pub huge_pages_dir: PathBuf,
    /// The same preloaded library makes a child forked without exec drop
    /// the GPU files (`device_paths`) it inherited, so that a tree with
    /// DataLoader workers can be checkpointed (hugepages/src/fork.rs).
    pub forked_children_drop_gpu_files: bool,
    /// The same library answers the application's `io_uring_setup` through
    /// `syscall()` with ENOSYS, so that libraries that fall back to epoll
    /// (libuv: torchrun's TCPStore) hold no io_uring, which CRIU cannot
    /// dump (hugepages/src/io_uring.rs).
    pub hide_io_uring: bool,
    /// Threads that copy the driver's checkpoint buffer in and out (the
    /// same library splits the driver's memcpy, hugepages/src/copy.rs): 1,
    /// the driver's one thread; never more than the job's CPUs.
    pub copy_threads: u32,
    /// Whether checkpoint jobs may (or by default do) run NCCL over the
    /// transports the r580 driver can restore (preempt::nccl).
    pub nccl_portable: NcclPortableSetting,
    /// Whether checkpoint jobs may (or by default do) get a host memory
    /// pool for the driver's checkpoint buffer (preempt::pool).
    pub host_pool: HostPoolSetting,
    /// The most one job's pools may hold on a node, GiB (at least 1).
    pub host_pool_max_gib: u64,
    /// The pool never takes the node's MemAvailable below this, GiB.
    pub host_pool_reserve_gib: u64,
}

/// The most page readers CRIU starts for one restored process
/// (RESTORE_PAGE_READERS_MAX of packaging/criu/0004).
pub const MAX_RESTORE_PAGE_READERS: u32 = 16;

/// The most threads the shim splits one of the driver's copies across
/// (MAX_THREADS of hugepages/src/copy.rs).
pub const MAX_COPY_THREADS: u32 = 64;

/// Where the packages install the huge-page shim (beside the agent).
pub const DEFAULT_HUGE_PAGES_LIBRARY: &str = "/usr/libexec/slurm-gpu-mode/libgpu_mode_hugepages.so";

impl Default for PreemptConfig {
    fn default() -> Self {
        PreemptConfig {
            image_dir: PathBuf::from("/var/lib/slurm-gpu-mode/images"),
            staging_dir: None,
            staging_wait_s: 300,
            staging_copy_mib_per_s: 0,
            agent_socket_dir: None,
            agent: PathBuf::from("/usr/libexec/slurm-gpu-mode/gpu-mode-ckpt-agent"),
            criu: PathBuf::from("/opt/slurm-gpu-mode/criu/bin/criu"),
            nft: PathBuf::from("/usr/sbin/nft"),
            criu_timeout_ms: 600_000,
            ghost_limit_mib: 1,
            max_deleted_files: 64,
            restore_page_readers: 8,
            restore_map_buffers: true,
            signal: "USR1".into(),
            min_signal_lead_s: 60,
            site_job_requeue: false,
            site_signal: false,
            images_max_gib: 0,
            images_max_age_hours: 168,
            early_writeback: true,
            accounting: AccountingField::AdminComment,
            huge_pages: true,
            huge_pages_library: PathBuf::from(DEFAULT_HUGE_PAGES_LIBRARY),
            huge_pages_dir: PathBuf::from("/var/lib/slurm-gpu-mode/hugepages"),
            forked_children_drop_gpu_files: true,
            hide_io_uring: true,
            copy_threads: 8,
            nccl_portable: NcclPortableSetting::Allow,
            host_pool: HostPoolSetting::Allow,
            host_pool_max_gib: 64,
            host_pool_reserve_gib: 8,
        }
    }
}

impl PreemptConfig {
    /// Where the per-job agents listen.
    pub fn agent_socket_dir(&self, runtime_dir: &Path) -> PathBuf {
        self.agent_socket_dir.clone().unwrap_or_else(|| runtime_dir.join("agent"))
    }

    /// The NCCL transport a checkpoint job gets: what it asked for
    /// (`nccl=`), bounded by `nccl_portable`; an error (naming the setting)
    /// when the site forbids what it asked for.
    pub fn nccl_transport(&self, asked: Option<NcclTransport>) -> Result<NcclTransport, String> {
        match (asked, self.nccl_portable) {
            (Some(NcclTransport::Portable), NcclPortableSetting::Forbid) => Err(
                "--gpu-mode=checkpoint:nccl=portable is not allowed on this cluster (preempt.nccl_portable = \"forbid\" in the \
                 site config): use --gpu-mode=checkpoint, whose NCCL jobs start over when preempted on drivers before r610"
                    .into(),
            ),
            (Some(asked), _) => Ok(asked),
            (None, NcclPortableSetting::Default) => Ok(NcclTransport::Portable),
            (None, _) => Ok(NcclTransport::Native),
        }
    }

    /// Whether a checkpoint job gets a host memory pool: what it asked for
    /// (`pool=`), bounded by `host_pool`; an error (naming the setting)
    /// when the site forbids what it asked for.
    pub fn host_pool(&self, asked: Option<bool>) -> Result<bool, String> {
        match (asked, self.host_pool) {
            (Some(true), HostPoolSetting::Forbid) => Err(
                "--gpu-mode=checkpoint:pool=on is not allowed on this cluster (preempt.host_pool = \"forbid\" in the \
                 site config): use --gpu-mode=checkpoint, whose checkpoint buffer the driver allocates at preemption"
                    .into(),
            ),
            (Some(asked), _) => Ok(asked),
            (None, HostPoolSetting::Default) => Ok(true),
            (None, _) => Ok(false),
        }
    }

    /// Where a job's host memory pool lives on the node:
    /// `<runtime_dir>/pool/<job>`.
    pub fn pool_dir(&self, runtime_dir: &Path, job: u32) -> PathBuf {
        self.pool_root(runtime_dir).join(job.to_string())
    }

    /// The pool directories' parent, `<runtime_dir>/pool`.
    pub fn pool_root(&self, runtime_dir: &Path) -> PathBuf {
        runtime_dir.join("pool")
    }

    fn validate_preemption(&self) -> Result<(), String> {
        for (key, p) in [
            ("preempt.image_dir", &self.image_dir),
            ("preempt.agent", &self.agent),
            ("preempt.criu", &self.criu),
            ("preempt.nft", &self.nft),
            ("preempt.huge_pages_library", &self.huge_pages_library),
            ("preempt.huge_pages_dir", &self.huge_pages_dir),
        ] {
            require_absolute(key, p)?;
        }
        if let Some(dir) = &self.agent_socket_dir {
            require_absolute("preempt.agent_socket_dir", dir)?;
        }
        if let Some(dir) = &self.staging_dir {
            require_absolute("preempt.staging_dir", dir)?;
            if dir.starts_with(&self.image_dir) || self.image_dir.starts_with(dir) {
                return Err(format!(
                    "preempt.staging_dir = {dir:?} must be a directory of its own, neither inside nor around preempt.image_dir = {:?}",
                    self.image_dir
                ));
            }
        }
        if self.staging_wait_s == 0 || self.staging_wait_s > 3600 {
            return Err(format!("preempt.staging_wait_s = {} must be between 1 and 3600 (an hour)", self.staging_wait_s));
        }
        if self.criu_timeout_ms == 0 || self.criu_timeout_ms > 3_600_000 {
            return Err(format!("preempt.criu_timeout_ms = {} must be between 1 and 3600000 (an hour)", self.criu_timeout_ms));
        }
        if !(1..=1024).contains(&self.ghost_limit_mib) {
            return Err(format!("preempt.ghost_limit_mib = {} must be between 1 and 1024", self.ghost_limit_mib));
        }
        if self.max_deleted_files > 100_000 {
            return Err(format!("preempt.max_deleted_files = {} must be at most 100000", self.max_deleted_files));
        }
        if !(1..=MAX_RESTORE_PAGE_READERS).contains(&self.restore_page_readers) {
            return Err(format!(
                "preempt.restore_page_readers = {} must be between 1 and {MAX_RESTORE_PAGE_READERS}",
                self.restore_page_readers
            ));
        }
        if !(1..=MAX_COPY_THREADS).contains(&self.copy_threads) {
            return Err(format!(
                "preempt.copy_threads = {} must be between 1 (the driver's own thread) and {MAX_COPY_THREADS}",
                self.copy_threads
            ));
        }
        if self.host_pool_max_gib == 0 {
            return Err("preempt.host_pool_max_gib = 0 must be at least 1 (preempt.host_pool = \"forbid\" turns the pool off)".into());
        }
        crate::signal::signal_number(&self.signal).map_err(|e| format!("preempt.signal: {e}"))?;
        Ok(())
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            source: None,
            notices: Vec::new(),
            runtime_dir: PathBuf::from("/run/slurm-gpu-mode"),
            hook_deadline_ms: 300_000,
            slurm: SlurmConfig::default(),
            log: LogConfig::default(),
            nvml: NvmlConfig::default(),
            mig: MigConfig::default(),
            gpu: GpuConfig::default(),
            cuda_ckpt: CudaCkptConfig::default(),
            preempt: PreemptConfig::default(),
            mps: MpsConfig::default(),
            health: HealthConfig::default(),
            metrics: MetricsConfig::default(),
        }
    }
}

impl Default for SlurmConfig {
    fn default() -> Self {
        SlurmConfig {
            scontrol: PathBuf::from("/usr/bin/scontrol"),
            gres_conf: PathBuf::from("/etc/slurm/gres.conf"),
            drain_on_node_fault: true,
        }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig { syslog: true, stderr: true }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config file {path}: {detail}")]
    Invalid { path: PathBuf, detail: String },
    #[error("config file {path} is {detail}: root helpers run the programs and load the libraries it names, so only root may write it (chown root {path}; chmod go-w {path})")]
    Unsafe { path: PathBuf, detail: String },
}

impl Config {
    /// Loads `path`, or the default path when `None`. A missing file at the
    /// default path gives the defaults (a site need not write one); a missing
    /// file that was named explicitly is an error.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let (path, explicit) = match path {
            Some(p) => (p.to_path_buf(), true),
            None => (PathBuf::from(DEFAULT_CONFIG_PATH), false),
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                check_owner(&path)?;
                Config::parse(&text, &path).map(|cfg| Config { source: Some(path.clone()), ..cfg })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => Ok(Config::default()),
            Err(source) => Err(ConfigError::Read { path, source }),
        }
    }

    /// The file this config was read from, or the default path (for
    /// messages: the defaults stand for a file that is not there).
    pub fn path(&self) -> &Path {
        self.source.as_deref().unwrap_or(Path::new(DEFAULT_CONFIG_PATH))
    }

    /// For the prolog and epilog: the config, or, when it cannot be loaded,
    /// what can be salvaged from it (see [`Config::salvage`]) and the error.
    /// A typo in the site config must not fail jobs that asked for no mode
    /// (audit item H2): the hooks decide what the error means for each job.
    pub fn load_or_salvage(path: Option<&Path>) -> (Config, Option<ConfigError>) {
        match Config::load(path) {
            Ok(cfg) => (cfg, None),
            Err(e) => {
                let path = path.unwrap_or(Path::new(DEFAULT_CONFIG_PATH));
                let text = std::fs::read_to_string(path).unwrap_or_default();
                (Config { source: Some(path.to_path_buf()), ..Config::salvage(&text) }, Some(e))
            }
        }
    }

    /// The defaults, with each top-level setting or section of `text` that
    /// is valid on its own taken over: enough for an epilog to find and undo
    /// what earlier jobs left (the runtime directory above all) and to log
    /// and drain as the site asked. Never fails.
    pub fn salvage(text: &str) -> Config {
        let Ok(table) = text.parse::<toml::Table>() else { return Config::default() };
        fn take<T: serde::de::DeserializeOwned>(table: &toml::Table, key: &str, into: &mut T) {
            if let Some(v) = table.get(key).and_then(|v| T::deserialize(v.clone()).ok()) {
                *into = v;
            }
        }
        let mut cfg = Config::default();
        take(&table, "runtime_dir", &mut cfg.runtime_dir);
        take(&table, "hook_deadline_ms", &mut cfg.hook_deadline_ms);
        take(&table, "slurm", &mut cfg.slurm);
        take(&table, "log", &mut cfg.log);
        take(&table, "nvml", &mut cfg.nvml);
        take(&table, "mps", &mut cfg.mps);
        take(&table, "gpu", &mut cfg.gpu);
        if cfg.validate().is_err() {
            // A salvaged part is itself invalid: keep only what is checked
            // here, the rest stays at its default.
            let defaults = Config::default();
            let runtime_ok = require_absolute("runtime_dir", &cfg.runtime_dir).is_ok();
            // Every path of [slurm], not only scontrol: the config fuzz
            // target found a relative gres_conf kept (salvage must give a
            // config that is itself valid).
            let slurm_ok = require_absolute("slurm.scontrol", &cfg.slurm.scontrol).is_ok()
                && require_absolute("slurm.gres_conf", &cfg.slurm.gres_conf).is_ok();
            cfg = Config {
                runtime_dir: if runtime_ok { cfg.runtime_dir } else { defaults.runtime_dir.clone() },
                slurm: if slurm_ok { cfg.slurm } else { defaults.slurm.clone() },
                log: cfg.log,
                ..defaults
            };
        }
        debug_assert!(cfg.validate().is_ok(), "salvage gave an invalid config");
        cfg
    }

    /// The config as TOML with every key written out: its canonical form.
    /// Parsing it gives the same config back (a property test holds it to
    /// that), so `gpu-mode-node-checker` and the fuzzer can compare what a
    /// file means rather than how it is spelt.
    pub fn canonical(&self) -> String {
        // Serializing plain data (no maps with non-string keys) cannot fail.
        toml::to_string(self).unwrap_or_else(|e| format!("# cannot write the config as TOML: {e}\n"))
    }

    /// Parses and validates config text; `path` is only used in messages.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let invalid = |detail: String| ConfigError::Invalid { path: path.to_path_buf(), detail };
        if let Some(why) = removed_key(text) {
            return Err(invalid(why));
        }
        let serde_error = |e: toml::de::Error| e.to_string().trim().replace('\n', " ");
        let (cfg, notices): (Config, Vec<String>) = match split_checkpoint_section(text).map_err(invalid)? {
            None => (toml::from_str(text).map_err(|e| invalid(serde_error(e)))?, Vec::new()),
            Some((table, notice)) => {
                let cfg = toml::Value::Table(table).try_into().map_err(|e| invalid(format!("{} ({notice})", serde_error(e))))?;
                (cfg, vec![notice])
            }
        };
        cfg.validate().map_err(|e| match notices.first() {
            Some(notice) => invalid(format!("{e} ({notice})")),
            None => invalid(e),
        })?;
        Ok(Config { notices, ..cfg })
    }

    fn validate(&self) -> Result<(), String> {
        require_absolute("runtime_dir", &self.runtime_dir)?;
        require_absolute("slurm.scontrol", &self.slurm.scontrol)?;
        require_absolute("slurm.gres_conf", &self.slurm.gres_conf)?;
        require_absolute("mps.control", &self.mps.control)?;
        for (key, ms) in [
            ("mps.start_timeout_ms", self.mps.start_timeout_ms),
            ("mps.quit_timeout_ms", self.mps.quit_timeout_ms),
            ("mps.kill_timeout_ms", self.mps.kill_timeout_ms),
            ("mps.lock_timeout_ms", self.mps.lock_timeout_ms),
        ] {
            if ms == 0 || ms > 600_000 {
                return Err(format!("{key} = {ms} must be between 1 and 600000 (10 minutes)"));
            }
        }
        for (key, ms) in [("hook_deadline_ms", self.hook_deadline_ms), ("cuda_ckpt.call_timeout_ms", self.cuda_ckpt.call_timeout_ms)] {
            if ms == 0 || ms > 3_600_000 {
                return Err(format!("{key} = {ms} must be between 1 and 3600000 (an hour)"));
            }
        }
        if let Some(lib) = &self.nvml.library {
            require_absolute("nvml.library", lib)?;
        }
        if let Some(lib) = &self.cuda_ckpt.cuda_library {
            require_absolute("cuda_ckpt.cuda_library", lib)?;
        }
        for p in &self.cuda_ckpt.device_paths {
            require_absolute("cuda_ckpt.device_paths", Path::new(p))?;
        }
        self.preempt.validate_preemption()?;
        self.health.validate()?;
        self.metrics.validate(self.health.prometheus_textfile.as_ref())?;
        if self.cuda_ckpt.lock_timeout_ms == 0 {
            return Err("cuda_ckpt.lock_timeout_ms must be at least 1".into());
        }
        // Used as bytes (<< 20): bounded so that cannot overflow.
        if self.cuda_ckpt.memory_margin_mib > MAX_MARGIN_MIB {
            return Err(format!(
                "cuda_ckpt.memory_margin_mib = {} must be at most {MAX_MARGIN_MIB} (1 TiB)",
                self.cuda_ckpt.memory_margin_mib
            ));
        }
        self.mig.validate(&self.health.mig_baseline)?;
        for (name, profiles) in &self.mig.layouts {
            let value = format!("mig:{profiles}");
            match crate::gpu_mode::GpuMode::parse(&value) {
                Ok(crate::gpu_mode::GpuMode::Mig(crate::gpu_mode::MigRequest::Profiles(_))) => {}
                Ok(_) => return Err(format!("mig.layouts.{name}: a layout lists profiles, not another layout")),
                Err(e) => return Err(format!("mig.layouts.{name}: {}", e.problem)),
            }
            crate::gpu_mode::GpuMode::parse(&format!("mig:@{name}"))
                .map_err(|e| format!("mig.layouts: bad layout name: {}", e.problem))?;
        }
        Ok(())
    }

    /// The NVML library to load: the config's, or `None` for the system
    /// default. No environment variable overrides it: root helpers must not
    /// load a library whoever starts them names (audit, low items); tests
    /// set `[nvml] library` in the config they pass, as sites would.
    pub fn nvml_library(&self) -> Option<PathBuf> {
        self.nvml.library.clone()
    }
}

/// Keys that existed once, with why they went: a site's old config gets
/// this instead of serde's bare "unknown field".
pub const REMOVED_KEYS: &[(&str, &str, &str)] = &[(
    "gpu",
    "restore_compute_mode",
    "the epilog puts back the compute mode each GPU had before the job (the prolog records it), so the key was never read and is removed: delete it",
)];

/// The section that held both the CUDA driver verb's keys and preemption's
/// until they became `[cuda_ckpt]` and `[preempt]` (one name per concept,
/// issue 26). A file that still has it is read as before, with a notice,
/// until a later release.
pub const RENAMED_SECTION: &str = "checkpoint";
/// The keys of the old `[checkpoint]` that are `[cuda_ckpt]`'s; every other
/// one is `[preempt]`'s.
pub const CUDA_CKPT_KEYS: &[&str] = &["lock_timeout_ms", "memory_margin_mib", "cuda_library", "call_timeout_ms", "device_paths"];

/// `text` as a table whose old `[checkpoint]` section's keys are moved to
/// `[cuda_ckpt]` and `[preempt]`, with the notice that says so; `None` when
/// the text has no such section (or is no TOML: the parse says why). A key
/// set both in `[checkpoint]` and in its new section is an error.
fn split_checkpoint_section(text: &str) -> Result<Option<(toml::Table, String)>, String> {
    let Ok(mut table) = text.parse::<toml::Table>() else { return Ok(None) };
    let Some(old) = table.remove(RENAMED_SECTION) else { return Ok(None) };
    let toml::Value::Table(old) = old else {
        return Err(format!("{RENAMED_SECTION} must be a section, and is now [preempt] and [cuda_ckpt]"));
    };
    let mut to_cuda_ckpt = Vec::new();
    for (key, value) in old {
        let section = if CUDA_CKPT_KEYS.contains(&key.as_str()) { "cuda_ckpt" } else { "preempt" };
        let target = table.entry(section).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let Some(target) = target.as_table_mut() else { return Err(format!("{section} must be a section")) };
        if target.contains_key(&key) {
            return Err(format!("{RENAMED_SECTION}.{key} is now {section}.{key}, which this file sets too: keep one"));
        }
        if section == "cuda_ckpt" {
            to_cuda_ckpt.push(key.clone());
        }
        target.insert(key, value);
    }
    let cuda = if to_cuda_ckpt.is_empty() { String::new() } else { format!(", its {} in [cuda_ckpt]", to_cuda_ckpt.join(", ")) };
    let notice = format!(
        "the [{RENAMED_SECTION}] section is now [preempt]{cuda}: it is read as before for now, and a later release will not read it"
    );
    Ok(Some((table, notice)))
}

fn removed_key(text: &str) -> Option<String> {
    let table = text.parse::<toml::Table>().ok()?;
    REMOVED_KEYS.iter().find_map(|(section, key, why)| {
        table.get(*section)?.as_table()?.get(*key).map(|_| format!("{section}.{key}: {why}"))
    })
}

/// When running as root, the config must be root's and writable by root
/// alone: it names programs (scontrol, nvidia-cuda-mps-control) and
/// libraries (libnvidia-ml, libcuda) that root runs and loads.
fn check_owner(path: &Path) -> Result<(), ConfigError> {
    use std::os::unix::fs::MetadataExt;
    if unsafe { libc::geteuid() } != 0 {
        return Ok(());
    }
    let meta = std::fs::metadata(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
    let detail = if meta.uid() != 0 {
        format!("owned by uid {}", meta.uid())
    } else if meta.mode() & 0o022 != 0 {
        format!("writable by group or others (mode {:o})", meta.mode() & 0o7777)
    } else {
        return Ok(());
    };
    Err(ConfigError::Unsafe { path: path.to_path_buf(), detail })
}


#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(text, Path::new("/etc/x.toml")).map_err(|e| e.to_string())
    }

    /// Each text is refused, the error naming the file and saying `needle`.
    fn assert_refused(cases: &[(&str, &str)]) {
        for (text, needle) in cases {
            let err = parse(text).expect_err(text);
            assert!(err.contains(needle), "config {text:?}: {err:?} lacks {needle:?}");
            assert!(err.starts_with("config file /etc/x.toml"), "{err}");
        }
    }

    /// The old section's keys that go to [cuda_ckpt] are exactly its fields
    /// (a field added there and not to the list would be sent to [preempt]).
    #[test]
    fn the_keys_moved_to_cuda_ckpt_are_its_fields() {
        let all = CudaCkptConfig { cuda_library: Some("/lib/libcuda.so.1".into()), ..CudaCkptConfig::default() };
        let table: toml::Table = toml::Table::try_from(&all).unwrap();
        let mut keys: Vec<&str> = CUDA_CKPT_KEYS.to_vec();
        keys.sort();
        assert_eq!(table.keys().map(String::as_str).collect::<Vec<_>>(), keys);
    }

    #[test]
    fn empty_file_gives_defaults() {
        assert_eq!(parse("").unwrap(), Config::default());
    }

    #[test]
    fn the_documented_example_config_parses() {
        let text = include_str!("../../../etc/config.toml");
        let cfg = parse(text).expect("etc/config.toml must stay valid");
        assert_eq!(cfg.runtime_dir, PathBuf::from("/run/slurm-gpu-mode"));
        assert_eq!(cfg.health, HealthConfig::default(), "etc/config.toml documents the [health] defaults");
        assert_eq!(cfg.mig, MigConfig::default(), "etc/config.toml documents the [mig] defaults");
        assert_eq!(cfg.metrics, MetricsConfig::default(), "etc/config.toml documents the [metrics] defaults");
        let d = PreemptConfig::default();
        assert_eq!(
            (cfg.preempt.huge_pages, &cfg.preempt.huge_pages_library, &cfg.preempt.huge_pages_dir),
            (d.huge_pages, &d.huge_pages_library, &d.huge_pages_dir)
        );
        assert_eq!(cfg.preempt.forked_children_drop_gpu_files, d.forked_children_drop_gpu_files);
        assert_eq!(cfg.preempt.hide_io_uring, d.hide_io_uring);
        assert_eq!(cfg.preempt.copy_threads, d.copy_threads);
        assert_eq!(cfg.preempt.nccl_portable, d.nccl_portable);
        assert_eq!(
            (cfg.preempt.host_pool, cfg.preempt.host_pool_max_gib, cfg.preempt.host_pool_reserve_gib),
            (d.host_pool, d.host_pool_max_gib, d.host_pool_reserve_gib)
        );
    }

    /// Each row: the site's `[preempt] <key>` setting, what a job asked for
    /// and what it gets (`Err`: words of the refusal); then a value that is
    /// no setting is refused naming the key.
    fn assert_site_bounds<A: Copy + std::fmt::Debug, T: PartialEq + std::fmt::Debug>(
        key: &str,
        table: &[(&str, A, Result<T, &str>)],
        get: impl Fn(&PreemptConfig, A) -> Result<T, String>,
    ) {
        for (setting, asked, want) in table {
            let cfg = parse(&format!("[preempt]\n{key} = \"{setting}\"")).unwrap();
            let got = get(&cfg.preempt, *asked);
            match (want, &got) {
                (Ok(w), Ok(g)) => assert_eq!(w, g, "{setting} {asked:?}"),
                (Err(w), Err(g)) => assert!(g.contains(w), "{setting} {asked:?}: {g}"),
                _ => panic!("{setting} {asked:?}: {got:?}, want {want:?}"),
            }
        }
        let err = parse(&format!("[preempt]\n{key} = \"yes\"")).unwrap_err();
        assert!(err.contains("unknown variant `yes`") && err.contains("forbid") && err.contains(key), "{err}");
    }

    /// What a job asked for (`nccl=`) against the site's setting.
    #[test]
    fn the_site_bounds_the_nccl_transport_a_job_gets() {
        use NcclTransport::*;
        let table: &[(&str, Option<NcclTransport>, Result<NcclTransport, &str>)] = &[
            ("allow", None, Ok(Native)),
            ("allow", Some(Portable), Ok(Portable)),
            ("allow", Some(Native), Ok(Native)),
            ("default", None, Ok(Portable)),
            ("default", Some(Portable), Ok(Portable)),
            ("default", Some(Native), Ok(Native)),
            ("forbid", None, Ok(Native)),
            ("forbid", Some(Native), Ok(Native)),
            ("forbid", Some(Portable), Err("not allowed on this cluster (preempt.nccl_portable = \"forbid\"")),
        ];
        assert_site_bounds("nccl_portable", table, PreemptConfig::nccl_transport);
    }

    /// What a job asked for (`pool=`) against the site's setting, and the
    /// pool's bounds.
    #[test]
    fn the_site_bounds_the_host_pool_a_job_gets() {
        use HostPoolSetting::*;
        let table: &[(&str, Option<bool>, Result<bool, &str>)] = &[
            ("allow", None, Ok(false)),
            ("allow", Some(true), Ok(true)),
            ("allow", Some(false), Ok(false)),
            ("default", None, Ok(true)),
            ("default", Some(true), Ok(true)),
            ("default", Some(false), Ok(false)),
            ("forbid", None, Ok(false)),
            ("forbid", Some(false), Ok(false)),
            ("forbid", Some(true), Err("not allowed on this cluster (preempt.host_pool = \"forbid\"")),
        ];
        assert_site_bounds("host_pool", table, PreemptConfig::host_pool);
        let d = PreemptConfig::default();
        assert_eq!((d.host_pool, d.host_pool_max_gib, d.host_pool_reserve_gib), (Allow, 64, 8));
        let cfg = parse("[preempt]\nhost_pool_max_gib = 1\nhost_pool_reserve_gib = 0").unwrap();
        assert_eq!((cfg.preempt.host_pool_max_gib, cfg.preempt.host_pool_reserve_gib), (1, 0));
        assert_eq!(
            cfg.preempt.pool_dir(Path::new("/run/slurm-gpu-mode"), 4242),
            PathBuf::from("/run/slurm-gpu-mode/pool/4242")
        );
        assert_refused(&[
            ("[preempt]\nhost_pool_max_gib = 0", "preempt.host_pool_max_gib = 0 must be at least 1"),
            ("[preempt]\nhost_pool_max_gib = -1", "host_pool_max_gib"),
            ("[preempt]\nhost_pool_max_gib = \"64G\"", "host_pool_max_gib"),
            ("[preempt]\nhost_pool_reserve_gib = -8", "host_pool_reserve_gib"),
            ("[preempt]\nhost_pools = \"allow\"", "unknown field `host_pools`"),
        ]);
    }

    #[test]
    fn health_keys_are_read_and_checked() {
        let cfg = parse("[health]\nexpected_gpus = 8\nxid_fail = [79]\npcie_width_below_max = \"warn\"\ndisabled = [\"fabric\"]\n[health.deep]\nmemory_mib = 64").unwrap();
        assert_eq!((cfg.health.expected_gpus, cfg.health.xid_fail.clone()), (8, vec![79]));
        assert_eq!(cfg.health.pcie_width_below_max, Severity::Warn);
        assert_eq!(cfg.health.deep.memory_mib, 64);
        assert_eq!(cfg.health.state_dir(Path::new("/run/x")), PathBuf::from("/run/x/health"));
        let cases = [
            ("[health]\ndisabled = [\"fabrik\"]", "health.disabled: no check named \"fabrik\""),
            ("[health]\ndeadline_ms = 60000", "health.deadline_ms = 60000 must be between 1 and 40000"),
            ("[health]\nkmsg_path = \"kmsg\"", "health.kmsg_path"),
            ("[health]\nprometheus_textfile = \"x.prom\"", "health.prometheus_textfile"),
            ("[health.deep]\nmemory_mib = 0", "health.deep.memory_mib"),
            ("[health]\nxid = [1]", "unknown field `xid`"),
        ];
        assert_refused(&cases);
    }

    #[test]
    fn keys_are_read() {
        let cfg = parse(
            r#"
            runtime_dir = "/var/run/gm"
            hook_deadline_ms = 90000
            [slurm]
            scontrol = "/opt/slurm/bin/scontrol"
            gres_conf = "/opt/slurm/etc/gres.conf"
            drain_on_node_fault = false
            [log]
            syslog = false
            [nvml]
            library = "/opt/sim/libnvidia-ml.so"
            [mig.layouts]
            half = "3g.40gbx2"
            [cuda_ckpt]
            lock_timeout_ms = 2500
            memory_margin_mib = 64
            cuda_library = "/opt/drv/libcuda.so.1"
            call_timeout_ms = 60000
            "#,
        )
        .unwrap();
        assert_eq!(cfg.runtime_dir, PathBuf::from("/var/run/gm"));
        assert_eq!(cfg.slurm.scontrol, PathBuf::from("/opt/slurm/bin/scontrol"));
        assert_eq!(cfg.slurm.gres_conf, PathBuf::from("/opt/slurm/etc/gres.conf"));
        assert!(!cfg.slurm.drain_on_node_fault);
        assert!(!cfg.log.syslog);
        assert!(cfg.log.stderr);
        assert_eq!(cfg.nvml.library, Some(PathBuf::from("/opt/sim/libnvidia-ml.so")));
        assert_eq!(cfg.mig.layouts["half"], "3g.40gbx2");
        assert_eq!(cfg.cuda_ckpt.lock_timeout_ms, 2500);
        assert_eq!(cfg.cuda_ckpt.memory_margin_mib, 64);
        assert_eq!(cfg.cuda_ckpt.cuda_library, Some(PathBuf::from("/opt/drv/libcuda.so.1")));
        assert_eq!((cfg.hook_deadline_ms, cfg.cuda_ckpt.call_timeout_ms), (90_000, 60_000));
        assert_eq!(cfg.gpu, GpuConfig::default());
        assert!(cfg.notices.is_empty(), "{:?}", cfg.notices);
    }

    #[test]
    fn preemption_keys_are_read() {
        let cfg = parse(
            "runtime_dir = \"/run/gm\"\n[preempt]\nimage_dir = \"/shared/ckpt\"\nsignal = \"SIGUSR2\"\nsite_job_requeue = true\n\
             images_max_gib = 500\n[cuda_ckpt]\ndevice_paths = [\"/dev/nvidia\", \"/tmp/sim/gpus\"]",
        )
        .unwrap();
        let c = &cfg.preempt;
        assert_eq!((c.image_dir.as_path(), c.signal.as_str(), c.site_job_requeue, c.images_max_gib), (Path::new("/shared/ckpt"), "SIGUSR2", true, 500));
        assert_eq!(cfg.cuda_ckpt.device_paths, ["/dev/nvidia", "/tmp/sim/gpus"]);
        assert_eq!(c.agent_socket_dir(&cfg.runtime_dir), PathBuf::from("/run/gm/agent"));
        assert_eq!(c.criu, PathBuf::from("/opt/slurm-gpu-mode/criu/bin/criu"));
        assert_eq!(c.nft, PathBuf::from("/usr/sbin/nft"));
        assert_eq!((c.ghost_limit_mib, c.max_deleted_files), (1, 64));
        assert!(cfg.notices.is_empty(), "{:?}", cfg.notices);
        let nft = parse("[preempt]\nnft = \"/opt/nft/sbin/nft\"").unwrap();
        assert_eq!(nft.preempt.nft, PathBuf::from("/opt/nft/sbin/nft"));
    }

    /// A file written before `[checkpoint]` became `[preempt]` and
    /// `[cuda_ckpt]` means what it meant, says so once, and a key set in both
    /// the old and the new place is refused.
    #[test]
    fn the_old_checkpoint_section_is_read_into_its_new_sections_with_a_notice() {
        let old = "[checkpoint]\nlock_timeout_ms = 2500\ndevice_paths = [\"/dev/nvidia\", \"/tmp/sim/gpus\"]\n\
                   image_dir = \"/shared/ckpt\"\nrestore_page_readers = 4\n[preempt]\nsignal = \"USR2\"";
        let cfg = parse(old).unwrap();
        let new = parse(
            "[cuda_ckpt]\nlock_timeout_ms = 2500\ndevice_paths = [\"/dev/nvidia\", \"/tmp/sim/gpus\"]\n\
             [preempt]\nimage_dir = \"/shared/ckpt\"\nrestore_page_readers = 4\nsignal = \"USR2\"",
        )
        .unwrap();
        assert_eq!((&cfg.cuda_ckpt, &cfg.preempt), (&new.cuda_ckpt, &new.preempt));
        assert_eq!(
            cfg.notices,
            ["the [checkpoint] section is now [preempt], its device_paths, lock_timeout_ms in [cuda_ckpt]: \
              it is read as before for now, and a later release will not read it"]
        );
        assert_eq!(parse("[checkpoint]\nsignal = \"USR2\"").unwrap().notices[0].split(':').next(), Some("the [checkpoint] section is now [preempt]"));
        let cases = [
            ("[checkpoint]\nimage_dir = \"/a\"\n[preempt]\nimage_dir = \"/b\"", "checkpoint.image_dir is now preempt.image_dir, which this file sets too: keep one"),
            ("[checkpoint]\ncall_timeout_ms = 5\n[cuda_ckpt]\ncall_timeout_ms = 6", "checkpoint.call_timeout_ms is now cuda_ckpt.call_timeout_ms"),
            ("checkpoint = 3", "checkpoint must be a section, and is now [preempt] and [cuda_ckpt]"),
            ("[checkpoint]\ncriu = \"criu\"", "preempt.criu = \"criu\" must be an absolute path (the [checkpoint] section is now [preempt]"),
            ("[checkpoint]\nimage_dirs = \"/a\"", "unknown field `image_dirs`"),
        ];
        assert_refused(&cases);
    }

    #[test]
    fn every_gpu_setter_can_be_left_alone() {
        let cfg = parse(
            "[gpu]\nmps_compute_mode = \"leave\"\n\
             mig_mode = \"leave\"\nmig_instances = \"leave\"",
        )
        .unwrap();
        assert_eq!(cfg.gpu.mps_compute_mode, ComputeModeSetting::Leave);
        assert_eq!(cfg.gpu.mig_mode, MigModeSetting::Leave);
        assert_eq!(cfg.gpu.mig_instances, MigInstanceSetting::Leave);
        let err = parse("[gpu]\nmps_compute_mode = \"exclusive\"").unwrap_err();
        assert!(err.contains("unknown variant `exclusive`") && err.contains("exclusive_process"), "{err}");
        assert!(parse("[gpu]\nmig = \"leave\"").unwrap_err().contains("unknown field `mig`"));
        // Removed, with the reason: the epilog restores each GPU's own earlier mode.
        let err = parse("[gpu]\nrestore_compute_mode = \"default\"").unwrap_err();
        assert!(err.contains("gpu.restore_compute_mode: the epilog puts back the compute mode each GPU had before the job"), "{err}");
    }

    #[test]
    fn bad_configs_name_the_problem() {
        let cases = [
            ("runtime_dir = \"run/x\"", "runtime_dir = \"run/x\" must be an absolute path"),
            ("runtime_dir = \"/run/../etc\"", "must not contain '..'"),
            ("[slurm]\nscontrol = \"scontrol\"", "slurm.scontrol"),
            ("[slurm]\ngres_conf = \"gres.conf\"", "slurm.gres_conf = \"gres.conf\" must be an absolute path"),
            ("runtimedir = \"/x\"", "unknown field `runtimedir`"),
            ("[slurm]\ndrain_on_node_fault = \"yes\"", "invalid type"),
            ("[mig.layouts]\nhalf = \"3g.40gbx9\"", "mig.layouts.half: count 9"),
            ("[mig.layouts]\nx = \"@y\"", "mig.layouts.x: a layout lists profiles"),
            ("[mig.layouts]\n\"bad name\" = \"1g.10gb\"", "bad layout name"),
            ("runtime_dir = ", "/etc/x.toml"),
            ("[cuda_ckpt]\ncuda_library = \"libcuda.so.1\"", "cuda_ckpt.cuda_library"),
            ("[cuda_ckpt]\nlock_timeout_ms = 0", "cuda_ckpt.lock_timeout_ms must be at least 1"),
            ("[mps]\ncontrol = \"nvidia-cuda-mps-control\"", "mps.control"),
            ("hook_deadline_ms = 0", "hook_deadline_ms = 0 must be between 1 and 3600000"),
            ("[cuda_ckpt]\ncall_timeout_ms = 3600001", "cuda_ckpt.call_timeout_ms = 3600001 must be between 1 and 3600000"),
            ("[mps]\nquit_timeout_ms = 0", "mps.quit_timeout_ms = 0 must be between 1 and 600000"),
            ("[mps]\nthreads = 5", "unknown field `threads`"),
            ("[cuda_ckpt]\nmemory_margin_mib = 18446744073709551615", "cuda_ckpt.memory_margin_mib"),
            ("[health.deep.bandwidth_floor_gbps]\nH100 = -1.0", "bandwidth_floor_gbps.H100 = -1 must be a positive"),
            ("[health.deep.bandwidth_floor_gbps]\nH100 = nan", "bandwidth_floor_gbps.H100 = NaN"),
            ("[health.deep.bandwidth_floor_gbps]\nH100 = inf", "bandwidth_floor_gbps.H100 = inf"),
            ("[preempt]\ncriu = \"criu\"", "preempt.criu = \"criu\" must be an absolute path"),
            ("[preempt]\nnft = \"nft\"", "preempt.nft = \"nft\" must be an absolute path"),
            ("[preempt]\nhuge_pages_library = \"lib.so\"", "preempt.huge_pages_library = \"lib.so\" must be an absolute path"),
            ("[preempt]\nhuge_pages_dir = \"/var/../x\"", "preempt.huge_pages_dir"),
            ("[preempt]\nimage_dir = \"images\"", "preempt.image_dir"),
            ("[preempt]\nstaging_dir = \"staging\"", "preempt.staging_dir = \"staging\" must be an absolute path"),
            ("[preempt]\nstaging_dir = \"/var/lib/slurm-gpu-mode/images/s\"", "staging_dir = \"/var/lib/slurm-gpu-mode/images/s\" must be a directory of its own"),
            ("[preempt]\nstaging_dir = \"/var/lib\"", "neither inside nor around preempt.image_dir"),
            ("[preempt]\nstaging_wait_s = 0", "preempt.staging_wait_s = 0 must be between 1 and 3600"),
            ("[preempt]\nagent_socket_dir = \"/run/../x\"", "preempt.agent_socket_dir"),
            ("[cuda_ckpt]\ndevice_paths = [\"dev/nvidia\"]", "cuda_ckpt.device_paths"),
            ("[preempt]\nsignal = \"KILL\"", "preempt.signal: \"KILL\" is not one of USR1"),
            ("[preempt]\ncriu_timeout_ms = 0", "preempt.criu_timeout_ms = 0 must be between 1 and 3600000"),
            ("[preempt]\nghost_limit_mib = 0", "preempt.ghost_limit_mib = 0 must be between 1 and 1024"),
            ("[preempt]\nghost_limit_mib = 1025", "preempt.ghost_limit_mib = 1025 must be between 1 and 1024"),
            ("[preempt]\nmax_deleted_files = 100001", "preempt.max_deleted_files = 100001 must be at most 100000"),
            ("[preempt]\nrestore_page_readers = 0", "preempt.restore_page_readers = 0 must be between 1 and 16"),
            ("[preempt]\nrestore_page_readers = 17", "preempt.restore_page_readers = 17 must be between 1 and 16"),
            ("[preempt]\ncopy_threads = 0", "preempt.copy_threads = 0 must be between 1 (the driver's own thread) and 64"),
            ("[preempt]\ncopy_threads = 65", "preempt.copy_threads = 65 must be between 1 (the driver's own thread) and 64"),
            ("[preempt]\ncopy_threads = \"8\"", "copy_threads"),
            ("[mig]\nbaseline = \"all-1g\"", "mig.baseline = \"all-1g\" names a mig-parted config, but mig.baseline_config is not set"),
            ("[mig]\nbaseline = \"@nope\"", "mig.baseline = \"@nope\": no [mig.layouts] layout named \"nope\""),
            ("[mig]\nbaseline_config = \"/etc/m.yaml\"", "mig.baseline_config = \"/etc/m.yaml\" needs mig.baseline"),
            ("[mig]\nbaseline = \"x\"\nbaseline_config = \"m.yaml\"", "mig.baseline_config = \"m.yaml\" must be an absolute path"),
            ("[mig]\nservices = [\"--now\"]", "mig.services: \"--now\" is not a systemd unit name"),
            ("[mig]\nlayout_services = [\"a b\"]", "mig.layout_services"),
            ("[mig]\nsystemctl = \"systemctl\"", "mig.systemctl"),
            ("[mig]\nnvidia_smi = \"nvidia-smi\"", "mig.nvidia_smi"),
            ("[mig.layouts]\nb = \"1g.10gb\"\n[mig]\nbaseline = \"@b\"\n[health]\nmig_baseline = [\"1g.10gb\"]", "health.mig_baseline and mig.baseline are both set"),
        ];
        assert_refused(&cases);
    }

    #[test]
    fn a_broken_config_is_salvaged_section_by_section() {
        let cases: Vec<(&str, &str, bool)> = vec![
            // (text, runtime_dir we must still find, syslog kept as written)
            ("runtime_dir = \"/var/run/gm\"\nruntimedir = 1\n[log]\nsyslog = false", "/var/run/gm", false),
            ("runtime_dir = \"/var/run/gm\"\n[log]\nsyslog = false\n[health]\nxid = [1]", "/var/run/gm", false),
            ("runtime_dir = \"/var/run/gm\"\n[mps]\nquit_timeout_ms = 0", "/var/run/gm", true),
            ("runtime_dir = \"relative\"\n[log]\nsyslog = false", "/run/slurm-gpu-mode", false),
            ("this is not toml [", "/run/slurm-gpu-mode", true),
            // Found by the config fuzz target: a relative gres_conf was kept.
            ("runtime_dir = \"/var/run/gm\"\nx = 1\n[slurm]\ngres_conf = \"res.conf\"", "/var/run/gm", true),
        ];
        for (text, runtime, syslog) in cases {
            assert!(parse(text).is_err(), "{text:?} must be invalid for the test to mean anything");
            let cfg = Config::salvage(text);
            assert_eq!(cfg.runtime_dir, PathBuf::from(runtime), "{text:?}");
            assert_eq!(cfg.log.syslog, syslog, "{text:?}");
            assert!(cfg.validate().is_ok(), "{text:?}");
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "runtime_dir = \"/var/run/gm\"\n[health]\nxid = [1]").unwrap();
        let (cfg, err) = Config::load_or_salvage(Some(&path));
        assert_eq!(cfg.runtime_dir, PathBuf::from("/var/run/gm"));
        assert!(err.unwrap().to_string().contains("unknown field `xid`"));
    }

    #[test]
    fn as_root_a_config_others_can_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        if !gpu_mode_testkit::root_or_skip("the ownership rule applies to root only") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(Config::load(Some(&path)).is_ok());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let err = Config::load(Some(&path)).unwrap_err().to_string();
        assert!(err.contains("writable by group or others (mode 666)"), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::chown(&path, Some(65534), None).unwrap();
        let err = Config::load(Some(&path)).unwrap_err().to_string();
        assert!(err.contains("owned by uid 65534"), "{err}");
    }

    #[test]
    fn a_missing_file_named_explicitly_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.toml");
        let err = Config::load(Some(&missing)).unwrap_err().to_string();
        assert!(err.contains("cannot read config file") && err.contains("nope.toml"), "{err}");
    }
}
