//! The cluster's configuration files and where Slurm is installed.

use crate::accounting_db::AccountingDb;
use crate::Artifacts;
use anyhow::{bail, Context, Result};
use std::fs;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// What to start.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    /// Everything of this cluster lives here.
    pub dir: PathBuf,
    pub node_name: String,
    pub gpus: u32,
    /// CPUs announced to Slurm (config_overrides lets it exceed the host's).
    pub cpus: u32,
    pub ctld_port: u16,
    pub slurmd_port: u16,
    pub artifacts: Artifacts,
    /// Extra lines appended to the gpu-mode config file.
    pub extra_gpu_mode_config: String,
    /// GPU device files for gres.conf; `None` makes placeholders.
    pub gpu_device_files: Option<Vec<PathBuf>>,
    /// Placeholders only: gres.conf lists `nvidia<order[i]>` as Slurm's GPU
    /// i; `None` lists them in ascending order.
    pub gres_device_order: Option<Vec<u32>>,
    /// Device minor numbers of the simulated GPUs, by NVML index; `None`:
    /// the index. With `gres_device_order` it makes Slurm's, the device
    /// files' and NVML's numbering all differ, as on some real nodes.
    pub sim_minors: Option<Vec<u32>>,
    /// Real GPUs (NVML, MPS of the host, settings left as they are) instead
    /// of the simulated ones. Set by `GPU_MODE_GPU_DEVICES`.
    pub real_gpus: bool,
    /// Seconds between runs of gpu-mode-node-checker as HealthCheckProgram
    /// (through a wrapper like the prolog's); `None`: no health check.
    pub health_check_interval: Option<u32>,
    /// Jobs in cgroups with an extern step: proctrack/cgroup, task/cgroup,
    /// `PrologFlags=Alloc,Contain` (as production sites run).
    pub contain: bool,
    /// The hook wrappers time each run into `log/hook-times.log`
    /// (`hook=prolog job=N ms=M rc=R`): the churn's prolog/epilog figures.
    pub time_hooks: bool,
    /// Run from the installed package as a site would: the system's
    /// plugstack.conf (which includes the package's snippet), and no
    /// Prolog=/Epilog=/PrologFlags= and no gpu-mode config of ours: the
    /// Ansible role merges those lines into this slurm.conf and writes
    /// /etc/slurm-gpu-mode/config.toml from `ansible-vars.json`, which is
    /// written here for it (scripts/test-install.sh).
    pub installed: bool,
    /// Partitions `low` (preemptible) and `high` beside `debug`, for
    /// `--gpu-mode=checkpoint` jobs; `None`: `debug` only.
    pub preemption: Option<Preemption>,
    /// A second node of this name beside `node_name`: then each slurmd runs
    /// in namespaces of its own, with its own address, simulated GPUs (other
    /// UUIDs) and runtime directory (crate::netns); `None`: one node on
    /// localhost.
    pub second_node: Option<String>,
    /// Accounting in a real database: a private MariaDB and slurmdbd on
    /// these ports, `accounting_storage/slurmdbd` in slurm.conf, so `sacct`
    /// works (crate::accounting_db); `None`: no accounting storage.
    pub accounting_db: Option<AccountingDb>,
}

/// Preemption as docs/checkpoint.md "Site set-up" asks (Slurm 22.05, field
/// notes §8): preempt/partition_prio with PreemptMode=REQUEUE, `low`
/// (PriorityTier=1, GraceTime) preempted by `high` (PriorityTier=2) and
/// `debug` with PreemptMode=OFF (else it takes REQUEUE and `high` preempts
/// its jobs too: seen on 22.05.8), the
/// job's `--signal` sent instead of the first SIGTERM
/// (preempt_send_user_signal), and a short credential lifetime: a requeued
/// job cannot start again until its old credential expires (cred_expire + 1
/// s; Slurm's default is 120 s, too long for tests). Jobs pass `--requeue`
/// themselves (the plugin asks for it; JobRequeue stays at Slurm's default).
/// The simulated GPU side is made usable by job users (state file and
/// simulated driver folder writable by all, see [`crate::Cluster::sim_job_env`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preemption {
    /// GraceTime of `low`, seconds: how long a preempted job has to
    /// checkpoint before Slurm kills it.
    pub grace_time_s: u32,
    /// AuthInfo's cred_expire (Slurm accepts 5 or more).
    pub cred_expire_s: u32,
    /// `[cuda_ckpt] call_timeout_ms`: each driver call's bound, inside
    /// GraceTime as docs/checkpoint.md asks of sites. Short by default (the
    /// simulated calls take milliseconds; a hanging one fails in time); the
    /// churn's loaded node needs more (a restore waited 8 s for the simulated
    /// driver's thread at 500 jobs on two cores).
    pub call_timeout_ms: u64,
}

impl Default for Preemption {
    fn default() -> Self {
        Preemption { grace_time_s: 60, cred_expire_s: 10, call_timeout_ms: 8000 }
    }
}

impl ClusterSpec {
    /// A cluster in `/tmp/gpu-mode-cluster/<name>` on free ports.
    pub fn new(name: &str, gpus: u32, artifacts: Artifacts) -> ClusterSpec {
        let base = std::env::var_os("GPU_MODE_CLUSTER_BASE")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/tmp/gpu-mode-cluster"));
        ClusterSpec {
            dir: base.join(name),
            node_name: "localhost".into(),
            gpus,
            cpus: 8,
            ctld_port: free_port(),
            slurmd_port: free_port(),
            artifacts,
            extra_gpu_mode_config: String::new(),
            real_gpus: real_gpu_devices().is_some(),
            gpu_device_files: real_gpu_devices(),
            gres_device_order: None,
            sim_minors: None,
            health_check_interval: None,
            contain: false,
            time_hooks: false,
            installed: false,
            preemption: None,
            second_node: None,
            accounting_db: None,
        }
    }
}

impl ClusterSpec {
    /// The Slurm nodes: `node_name`, and `second_node` if any.
    pub fn node_names(&self) -> Vec<String> {
        std::iter::once(self.node_name.clone()).chain(self.second_node.clone()).collect()
    }

    /// The namespaces' network of a two-node cluster.
    pub fn node_net(&self) -> Option<crate::netns::NodeNet> {
        self.second_node.as_ref()?;
        let names = self.node_names();
        Some(crate::netns::NodeNet::new(self.ctld_port, &names.iter().map(String::as_str).collect::<Vec<_>>()))
    }

    /// Node `node`'s own folder (two-node clusters): its `sim/` and `run/`
    /// are bind-mounted over the cluster's in its namespace.
    pub fn node_dir(&self, node: &str) -> PathBuf {
        self.dir.join("nodes").join(node)
    }
}

/// `GPU_MODE_GPU_DEVICES=/dev/nvidia0,/dev/nvidia1`: real GPUs for gres.conf
/// (on the GPU machines) instead of placeholders.
fn real_gpu_devices() -> Option<Vec<PathBuf>> {
    let list = std::env::var("GPU_MODE_GPU_DEVICES").ok().filter(|v| !v.is_empty())?;
    Some(list.split(',').map(PathBuf::from).collect())
}

/// A port nobody listens on right now (the kernel picks it).
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("binding a local port")
}

/// Where Slurm's programs, plugins and libraries are.
#[derive(Debug, Clone)]
pub struct SlurmInstall {
    /// `/` for Debian's installed packages, or the prefix the .debs were
    /// unpacked under (`GPU_MODE_SLURM_PREFIX`).
    pub root: PathBuf,
    pub prefixed: bool,
}

const MULTIARCH_LIB: &str = "usr/lib/x86_64-linux-gnu";

impl SlurmInstall {
    pub fn detect() -> Result<SlurmInstall> {
        let install = match std::env::var_os("GPU_MODE_SLURM_PREFIX") {
            Some(p) => SlurmInstall { root: PathBuf::from(p), prefixed: true },
            None => SlurmInstall { root: PathBuf::from("/"), prefixed: false },
        };
        if install.prefixed {
            install.link_daemon_names()?;
        }
        for p in [install.sbin("slurmctld"), install.sbin("slurmd"), install.munged(), install.bin("sbatch")] {
            if !p.exists() {
                bail!("{} not found: install slurmctld slurmd slurm-client munge (see README)", p.display());
            }
        }
        Ok(install)
    }

    /// A daemon by its plain name. Slurm decides what it is from argv[0]
    /// (a `slurmd-wlm` does not load the node's GRES), so unpacked .debs,
    /// which only have the `-wlm` files, get `slurmd`-named links (see
    /// [`SlurmInstall::link_daemon_names`]).
    pub fn sbin(&self, name: &str) -> PathBuf {
        self.root.join("usr/sbin").join(name)
    }

    pub fn bin(&self, name: &str) -> PathBuf {
        self.root.join("usr/bin").join(name)
    }

    pub fn munged(&self) -> PathBuf {
        self.root.join("usr/sbin/munged")
    }

    pub fn plugin_dir(&self) -> PathBuf {
        self.root.join(MULTIARCH_LIB).join("slurm-wlm")
    }

    fn ld_library_path(&self) -> Option<String> {
        // Some .debs (libdbus-1-3) still install under /lib, not /usr/lib.
        self.prefixed.then(|| {
            let lib = self.root.join(MULTIARCH_LIB);
            let old_lib = self.root.join("lib/x86_64-linux-gnu");
            format!("{}:{}:{}", lib.display(), lib.join("slurm-wlm").display(), old_lib.display())
        })
    }

    pub fn daemon_env(&self) -> Vec<(String, String)> {
        self.ld_library_path().map(|p| vec![("LD_LIBRARY_PATH".to_string(), p)]).unwrap_or_default()
    }

    pub fn client_env(&self) -> Vec<(String, String)> {
        self.daemon_env()
    }

    /// `<prefix>/usr/sbin/slurmd -> slurmd-wlm` (and slurmctld, slurmstepd),
    /// and `/usr/sbin/slurmstepd`, which slurmd execs by absolute path
    /// (Debian's packages install them under /usr/sbin), when the host has none.
    fn link_daemon_names(&self) -> Result<()> {
        for name in ["slurmd", "slurmctld", "slurmstepd"] {
            let link = self.sbin(name);
            if !link.exists() {
                std::os::unix::fs::symlink(format!("{name}-wlm"), &link)
                    .with_context(|| format!("linking {}", link.display()))?;
            }
        }
        let system = Path::new("/usr/sbin/slurmstepd");
        if !system.exists() {
            std::os::unix::fs::symlink(self.sbin("slurmstepd"), system).context("linking /usr/sbin/slurmstepd")?;
        }
        self.register_libraries()
    }

    /// slurmd starts `slurmstepd spank prolog` with the job's environment,
    /// not its own, so LD_LIBRARY_PATH does not reach it (seen on the GPU
    /// machine: exit 127, "spank/prolog returned status 0x7f00"). The
    /// prefix's library directories go to the dynamic linker's cache instead.
    fn register_libraries(&self) -> Result<()> {
        let conf = Path::new("/etc/ld.so.conf.d/gpu-mode-slurm-prefix.conf");
        let dirs = self.ld_library_path().unwrap_or_default().replace(':', "\n") + "\n";
        if fs::read_to_string(conf).ok().as_deref() != Some(dirs.as_str()) {
            fs::write(conf, &dirs).with_context(|| format!("writing {}", conf.display()))?;
            let status = std::process::Command::new("/sbin/ldconfig").status().context("running ldconfig")?;
            if !status.success() {
                bail!("ldconfig failed ({status})");
            }
        }
        Ok(())
    }
}

/// Every parent of the munge socket must be reachable by non-root
/// submitters: those below /tmp get 0755, never /tmp itself (Path::starts_with
/// compares components, so "/tmp" starts with "/tmp/": that once turned /tmp
/// to 0755, and every job's TMPDIR unwritable).
fn open_parents_below_tmp(dir: &Path) -> Result<()> {
    for p in dir.ancestors().skip(1) {
        if p.starts_with("/tmp") && p != Path::new("/tmp") {
            fs::set_permissions(p, fs::Permissions::from_mode(0o755))?;
        }
    }
    Ok(())
}

/// Writes every file of the cluster under `spec.dir`.
pub fn write_all(spec: &ClusterSpec, install: &SlurmInstall) -> Result<()> {
    let d = &spec.dir;
    for (sub, mode) in [("", 0o755), ("munge", 0o755), ("log", 0o755), ("state", 0o700), ("spool", 0o755),
        ("hooks", 0o755), ("dev", 0o755), ("out", 0o1777), ("textfile", 0o755)]
    {
        let p = d.join(sub);
        fs::create_dir_all(&p)?;
        fs::set_permissions(&p, fs::Permissions::from_mode(mode))?;
    }
    open_parents_below_tmp(d)?;
    write_munge_key(&d.join("munge/munge.key"))?;
    let gpu_files = match &spec.gpu_device_files {
        Some(files) => files.clone(),
        None => make_placeholder_devices(&d.join("dev"), spec.gpus, spec.gres_device_order.as_deref())?,
    };
    write(d, "slurm.conf", &slurm_conf(spec, install, gpu_files.len()), 0o644)?;
    write(d, "gres.conf", &gres_conf(&gpu_files), 0o644)?;
    if let Some(db) = &spec.accounting_db {
        crate::accounting_db::write(d, db, install).context("setting up the accounting database")?;
    }
    if cgroup_v2_only() {
        write(d, "cgroup.conf", "CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\n", 0o644)?;
        prepare_cgroup_v2()?;
    } else if spec.contain {
        write(d, "cgroup.conf", "CgroupPlugin=cgroup/v1\nCgroupAutomount=yes\n", 0o644)?;
    }
    let sim = if spec.real_gpus { None } else { Some(write_sim(spec, gpu_files.len())?) };
    if spec.installed {
        return write_installed(spec, install, sim.as_ref());
    }
    write(
        d,
        "plugstack.conf",
        &format!("required {} config={}\n", spec.artifacts.plugin.display(), d.join("gpu-mode.toml").display()),
        0o644,
    )?;
    write(d, "gpu-mode.toml", &gpu_mode_config(spec, install, sim.as_ref()), 0o644)?;
    for (name, exe) in [("prolog", &spec.artifacts.prolog), ("epilog", &spec.artifacts.epilog)] {
        write(&d.join("hooks"), name, &hook_wrapper(spec, install, name, exe, sim.as_ref()), 0o755)?;
    }
    if spec.health_check_interval.is_some() {
        let text = hook_wrapper(spec, install, "node-checker", &spec.artifacts.node_checker, sim.as_ref());
        write(&d.join("hooks"), "node-checker", &text, 0o755)?;
    }
    if spec.second_node.is_some() {
        write_node_dirs(spec)?;
    }
    Ok(())
}

/// Two nodes: each gets a copy of the simulated GPU side (the second with
/// other UUIDs), a runtime directory and a spool; the cluster's own `sim/`
/// and `run/` are only mount points then.
fn write_node_dirs(spec: &ClusterSpec) -> Result<()> {
    let d = &spec.dir;
    fs::create_dir_all(d.join("run"))?;
    for (i, node) in spec.node_names().iter().enumerate() {
        let nd = spec.node_dir(node);
        fs::create_dir_all(nd.join("run"))?;
        fs::create_dir_all(d.join("spool").join(node))?;
        if d.join("sim").is_dir() {
            let out = std::process::Command::new("/bin/cp").arg("-a").arg(d.join("sim")).arg(&nd).output()?;
            if !out.status.success() {
                bail!("copying the simulated GPUs for {node}: {}", String::from_utf8_lossy(&out.stderr));
            }
            if i > 0 {
                crate::netns::rename_sim_gpus(&nd.join("sim/nvml-state.json"))?;
            }
        }
    }
    Ok(())
}

pub(crate) fn write(dir: &Path, name: &str, text: &str, mode: u32) -> Result<()> {
    let p = dir.join(name);
    fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
    fs::set_permissions(&p, fs::Permissions::from_mode(mode))?;
    Ok(())
}

fn write_munge_key(path: &Path) -> Result<()> {
    let mut key = vec![0u8; 1024];
    fs::File::open("/dev/urandom")?.read_exact(&mut key)?;
    fs::write(path, &key)?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600))?;
    Ok(())
}

/// Character devices named like the real ones (the number is the minor the
/// gpu-mode prolog looks for in NVML), in gres.conf order: `order`, or
/// ascending. They are copies of /dev/null: nothing opens them.
fn make_placeholder_devices(dir: &Path, gpus: u32, order: Option<&[u32]>) -> Result<Vec<PathBuf>> {
    let ascending: Vec<u32> = (0..gpus).collect();
    let order = order.unwrap_or(&ascending);
    if order.len() != gpus as usize {
        bail!("gres_device_order {order:?} must list {gpus} devices");
    }
    order
        .iter()
        .map(|&i| {
            let p = dir.join(format!("nvidia{i}"));
            let dev = nix::sys::stat::makedev(1, 3);
            nix::sys::stat::mknod(&p, nix::sys::stat::SFlag::S_IFCHR, nix::sys::stat::Mode::from_bits_truncate(0o666), dev)
                .or_else(|_| fs::write(&p, b"").map_err(|e| nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(0))))
                .with_context(|| format!("creating {}", p.display()))?;
            Ok(p)
        })
        .collect()
}

fn slurm_conf(spec: &ClusterSpec, install: &SlurmInstall, gpus: usize) -> String {
    let d = spec.dir.display();
    let health = spec
        .health_check_interval
        .map(|i| format!("HealthCheckProgram={d}/hooks/node-checker\nHealthCheckInterval={i}\n"))
        .unwrap_or_default();
    let (tracking, prolog_flags) = if spec.contain {
        ("ProctrackType=proctrack/cgroup\nTaskPlugin=task/cgroup\n", "Alloc,Contain")
    } else {
        ("ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n", "Alloc")
    };
    let plugin_dir = if install.prefixed { format!("PluginDir={}\n", install.plugin_dir().display()) } else { String::new() };
    // Installed: the role adds the gpu-mode lines and the system's
    // plugstack.conf loads the package's snippet.
    let (plugstack, hooks) = if spec.installed {
        (INSTALLED_PLUGSTACK.to_string(), String::new())
    } else {
        (format!("{d}/plugstack.conf"), format!("Prolog={d}/hooks/prolog\nEpilog={d}/hooks/epilog\nPrologFlags={prolog_flags}\n"))
    };
    let cred_expire = spec.preemption.as_ref().map(|p| format!(",cred_expire={}", p.cred_expire_s)).unwrap_or_default();
    let nodes = spec.node_names().join(",");
    let preemption = spec.preemption.as_ref().map(|p| preemption_conf(&nodes, p)).unwrap_or_default();
    // `debug` shares PriorityTier=1 with `low`: without its own PreemptMode
    // it takes the cluster's REQUEUE and `high` jobs preempt its jobs too.
    let debug_preempt = if spec.preemption.is_some() { " PreemptMode=OFF" } else { "" };
    let (ctld_host, slurmd_files, node_lines) = match spec.node_net() {
        // %n: each node's own spool, pid and log file.
        Some(net) => (
            format!("localhost({})", net.host_addr()),
            format!("SlurmdSpoolDir={d}/spool/%n\nSlurmdPidFile={d}/slurmd-%n.pid\nSlurmdLogFile={d}/log/slurmd-%n.log\n"),
            spec.node_names()
                .iter()
                .enumerate()
                .map(|(i, n)| format!("NodeName={n} NodeAddr={} CPUs={} RealMemory=4000 Gres=gpu:{gpus} State=UNKNOWN\n", net.node_addr(i), spec.cpus))
                .collect::<String>(),
        ),
        None => (
            "localhost".to_string(),
            format!("SlurmdSpoolDir={d}/spool\nSlurmdPidFile={d}/slurmd.pid\nSlurmdLogFile={d}/log/slurmd.log\n"),
            format!("NodeName={} NodeAddr=127.0.0.1 CPUs={} RealMemory=4000 Gres=gpu:{gpus} State=UNKNOWN\n", spec.node_name, spec.cpus),
        ),
    };
    format!(
        "# Generated by the slurm-gpu-mode test harness.
ClusterName=gpumode
SlurmctldHost={ctld_host}
SlurmctldPort={ctld}
SlurmdPort={slurmd}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={d}/munge/munge.socket{cred_expire}
CredType=cred/munge
{plugin_dir}StateSaveLocation={d}/state
SlurmctldPidFile={d}/slurmctld.pid
SlurmctldLogFile={d}/log/slurmctld.log
{slurmd_files}SlurmctldDebug=info
SlurmdDebug=verbose
{tracking}JobAcctGatherType=jobacct_gather/none
{accounting}JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
GresTypes=gpu
PlugStackConfig={plugstack}
{hooks}PrologEpilogTimeout=120
{health}SlurmdParameters=config_overrides
MinJobAge=600
KillWait=5
InactiveLimit=0
{node_lines}PartitionName=debug Nodes={nodes} Default=YES MaxTime=INFINITE State=UP{debug_preempt}
{preemption}",
        ctld = spec.ctld_port,
        slurmd = spec.slurmd_port,
        accounting = crate::accounting_db::slurm_conf_lines(&spec.dir, spec.accounting_db.as_ref()),
    )
}

/// The lines [`Preemption`] adds to slurm.conf.
fn preemption_conf(nodes: &str, p: &Preemption) -> String {
    format!(
        "PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
SlurmctldParameters=preempt_send_user_signal
# A requeued job becomes eligible when its credential expires; the main
# scheduler then starts it at its next pass (every 60 s by default).
SchedulerParameters=sched_interval=2
PartitionName=low Nodes={nodes} MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime={grace}
PartitionName=high Nodes={nodes} MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF
",
        grace = p.grace_time_s,
    )
}

fn gres_conf(files: &[PathBuf]) -> String {
    let mut s = String::from("AutoDetect=off\n");
    for f in files {
        s.push_str(&format!("Name=gpu File={}\n", f.display()));
    }
    s
}

/// The system's plugstack.conf (Debian: includes plugstack.conf.d/*.conf).
pub const INSTALLED_PLUGSTACK: &str = "/etc/slurm/plugstack.conf";

/// Installed mode: the simulated node is named through the sim's pointer
/// file (an installed Prolog gets no environment of ours), and the role's
/// variables for this cluster go to `ansible-vars.json`: the slurm.conf to
/// merge into and the site config (paths of this cluster, the simulated
/// driver, a fake sysfs and kernel log matching the simulated GPUs).
fn write_installed(spec: &ClusterSpec, install: &SlurmInstall, sim: Option<&SimPaths>) -> Result<()> {
    let d = &spec.dir;
    let mut settings = serde_json::json!({
        "runtime_dir": d.join("run"),
        "slurm": { "scontrol": install.bin("scontrol"), "gres_conf": d.join("gres.conf") },
        "log": { "syslog": false, "stderr": true },
        "mig": { "layouts": { "half": "3g.71gbx2" } },
        "preempt": { "image_dir": d.join("images") },
    });
    if let Some(s) = sim {
        let pointer = Path::new(nvml_sim_pointer());
        fs::create_dir_all(pointer.parent().unwrap())?;
        fs::write(pointer, format!("{}\n", s.nvml_state.display())).with_context(|| format!("writing {}", pointer.display()))?;
        let sysfs = d.join("sysfs");
        for i in 0..spec.gpus {
            // The simulated GPUs' PCI bus ids (sim/nvml fixtures).
            let dev = sysfs.join("bus/pci/devices").join(SIM_PCI_BUS_IDS.get(i as usize).copied().unwrap_or("0000:ff:00.0"));
            fs::create_dir_all(&dev)?;
            fs::write(dev.join("vendor"), "0x10de\n")?;
            fs::write(dev.join("class"), "0x030200\n")?;
        }
        fs::write(d.join("kmsg"), "6,1,0,-;Linux version x\n")?;
        settings["nvml"] = serde_json::json!({ "library": s.nvml_library });
        settings["mps"] = serde_json::json!({ "control": s.mps_control, "quit_timeout_ms": 2000, "kill_timeout_ms": 1000 });
        settings["preempt"] = serde_json::json!({ "image_dir": d.join("images") });
        settings["cuda_ckpt"] = serde_json::json!({
            "cuda_library": s.nvml_library.with_file_name("libcuda_sim.so"),
            "device_paths": ["/dev/nvidia", format!("{}.cuda/gpus/", s.nvml_state.display())],
        });
        settings["health"] = serde_json::json!({
            "sysfs_root": sysfs, "kmsg_path": d.join("kmsg"), "expected_gpus": spec.gpus,
            // The CI machine runs no nvidia-persistenced (no driver, and
            // systemd is not PID 1 there): judged by the GPUs' flag alone.
            "require_persistenced": false,
            // Other tests' MPS daemons may share the machine.
            "disabled": ["mps"],
        });
    }
    let vars = serde_json::json!({
        "gpu_mode_slurm_conf": d.join("slurm.conf"),
        "gpu_mode_settings": settings,
        "gpu_mode_verify_environment": { "SLURM_CONF": d.join("slurm.conf"), "SLURMD_NODENAME": spec.node_name },
    });
    write(d, "ansible-vars.json", &serde_json::to_string_pretty(&vars)?, 0o644)
}

/// The simulated NVML's pointer file (sim/nvml, `store::STATE_POINTER`).
pub fn nvml_sim_pointer() -> &'static str {
    "/run/gpu-mode-sim/state-path"
}

/// PCI bus ids of the simulated H200s, in NVML order (sim/nvml fixture).
const SIM_PCI_BUS_IDS: &[&str] = &["0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0"];

/// Where a simulated cluster's GPU side lives.
#[derive(Debug, Clone)]
pub struct SimPaths {
    /// The simulated NVML's shared state file.
    pub nvml_state: PathBuf,
    pub nvml_library: PathBuf,
    /// Copies of the MPS stand-ins: their `mps-sim.toml` is per cluster.
    pub mps_control: PathBuf,
}

/// The simulated GPUs: an NVML node of `gpus` H200s, and per-cluster copies
/// of the MPS stand-ins.
fn write_sim(spec: &ClusterSpec, gpus: usize) -> Result<SimPaths> {
    let Some(sim) = &spec.artifacts.sim else {
        bail!("the simulated GPU side is not built (sim/nvml, sim/mps): run `cargo build --workspace`");
    };
    let dir = spec.dir.join("sim");
    fs::create_dir_all(&dir)?;
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))?;
    let fixture = dir.join("node.toml");
    let model = sim.fixtures.join("h200-141gb.toml");
    let minors = spec.sim_minors.as_ref().map(|m| format!("minors = {m:?}\n")).unwrap_or_default();
    write(&dir, "node.toml", &format!("driver_version = \"580.159.04\"\nnvml_version = \"13.580.159.04\"\ncuda_driver_version = 13000\n\n[[gpus]]\nmodel = \"{}\"\ncount = {gpus}\n{minors}", model.display()), 0o644)?;
    let state = dir.join("nvml-state.json");
    let out = std::process::Command::new(&sim.nvml_ctl)
        .args(["init", fixture.to_str().unwrap()])
        .env("GPU_MODE_SIM_STATE", &state)
        .output()?;
    if !out.status.success() {
        bail!("nvml-sim-ctl init failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    fs::set_permissions(&state, fs::Permissions::from_mode(0o644))?;
    if spec.preemption.is_some() {
        // Checkpoint jobs run simulated CUDA programs as the job's user: they
        // update the NVML state (in place, under an flock) and meet the
        // agent in the simulated driver's folder (`<state>.cuda`, which
        // cuda-sim would otherwise create as whoever comes first, here
        // where only root may).
        fs::set_permissions(&state, fs::Permissions::from_mode(0o666))?;
        let cuda = dir.join("nvml-state.json.cuda");
        for d in [cuda.clone(), cuda.join("procs"), cuda.join("gpus")] {
            fs::create_dir_all(&d)?;
            fs::set_permissions(&d, fs::Permissions::from_mode(0o1777))?;
        }
    }
    for (src, name) in [(&sim.mps_control, "nvidia-cuda-mps-control"), (&sim.mps_server, "nvidia-cuda-mps-server")] {
        fs::copy(src, dir.join(name)).with_context(|| format!("copying {}", src.display()))?;
    }
    Ok(SimPaths { nvml_state: state, nvml_library: sim.nvml_library.clone(), mps_control: dir.join("nvidia-cuda-mps-control") })
}

fn gpu_mode_config(spec: &ClusterSpec, install: &SlurmInstall, sim: Option<&SimPaths>) -> String {
    // Simulated GPUs: the simulated NVML, MPS and CUDA driver, short
    // timeouts. Real GPUs: the host's, and every GPU setting left as it is
    // (the GPU machines allow no change to them).
    let bin = spec.artifacts.prolog.parent().unwrap_or(Path::new("/"));
    // [preempt] comes last: extra_gpu_mode_config may add keys to it.
    let preempt = format!(
        "[preempt]\nagent = \"{}\"\nimage_dir = \"{}\"\nhuge_pages_library = \"{}\"\nhuge_pages_dir = \"{}\"\n",
        bin.join("gpu-mode-ckpt-agent").display(),
        spec.dir.join("images").display(),
        bin.join("libgpu_mode_hugepages.so").display(),
        spec.dir.join("hugepages").display(),
    );
    let gpu_side = match sim {
        Some(s) => format!(
            "[nvml]\nlibrary = \"{}\"\n\n[mps]\ncontrol = \"{}\"\nquit_timeout_ms = 2000\nkill_timeout_ms = 1000\n\n[cuda_ckpt]\n\
             cuda_library = \"{}\"\ndevice_paths = [\"/dev/nvidia\", \"{}.cuda/gpus/\"]\nlock_timeout_ms = 2000\nmemory_margin_mib = 0\n{}\n{preempt}",
            s.nvml_library.display(),
            s.mps_control.display(),
            bin.join("libcuda_sim.so").display(),
            s.nvml_state.display(),
            spec.preemption.as_ref().map(|p| format!("call_timeout_ms = {}\n", p.call_timeout_ms)).unwrap_or_default(),
        ),
        None => format!(
            "[gpu]\nmps_compute_mode = \"leave\"\nmig_mode = \"leave\"\nmig_instances = \"leave\"\n\n{preempt}"
        ),
    };
    format!(
        "# Generated by the slurm-gpu-mode test harness.
runtime_dir = \"{run}\"

[slurm]
scontrol = \"{scontrol}\"
gres_conf = \"{gres_conf}\"

[log]
syslog = false
stderr = true

[mig.layouts]
half = \"3g.71gbx2\"

[metrics]
textfile = \"{textfile}\"

{gpu_side}
{extra}",
        run = spec.dir.join("run").display(),
        scontrol = install.bin("scontrol").display(),
        gres_conf = spec.dir.join("gres.conf").display(),
        textfile = spec.dir.join("textfile/gpu-mode.prom").display(),
        extra = spec.extra_gpu_mode_config,
    )
}

/// slurmd runs Prolog=/Epilog= without arguments, so the harness points them
/// at a wrapper that passes this cluster's config and keeps their log lines.
/// Production installs need no wrapper (the default config path is used).
fn hook_wrapper(spec: &ClusterSpec, install: &SlurmInstall, name: &str, exe: &Path, sim: Option<&SimPaths>) -> String {
    let d = spec.dir.display();
    let ld = install.ld_library_path().map(|p| format!("LD_LIBRARY_PATH={p}\nexport LD_LIBRARY_PATH\n")).unwrap_or_default();
    let sim = sim
        .map(|s| format!("GPU_MODE_SIM_STATE={}\nexport GPU_MODE_SIM_STATE\n", s.nvml_state.display()))
        .unwrap_or_default();
    let run = format!("{exe} --config {d}/gpu-mode.toml \"$@\" 2>>{d}/log/hooks.log", exe = exe.display());
    // Timed: the wall time slurmd waits for, process start included.
    let run = if spec.time_hooks {
        format!(
            "start=$(/bin/date +%s%N)\n{run}\nrc=$?\nend=$(/bin/date +%s%N)\n\
             echo \"hook={name} job=$SLURM_JOB_ID ms=$(( (end - start) / 1000000 )) rc=$rc\" >> {d}/log/hook-times.log\nexit $rc"
        )
    } else {
        format!("exec {run}")
    };
    // A test can make slurmd's next prolog do nothing, as Slurm at times
    // does for a requeued job (core::skipped_prolog): Cluster::skip_next_prolog.
    let delay = if name == "prolog" {
        format!("if [ -f {d}/hooks/prolog-skip-once ]; then /bin/rm -f {d}/hooks/prolog-skip-once; exit 0; fi\n")
    } else {
        String::new()
    };
    format!(
        "#!/bin/sh
# Generated by the slurm-gpu-mode test harness.
SLURM_CONF={d}/slurm.conf
export SLURM_CONF
{ld}{sim}{delay}{run}
"
    )
}

fn cgroup_v2_only() -> bool {
    Path::new("/sys/fs/cgroup/cgroup.controllers").exists() && !Path::new("/sys/fs/cgroup/cpu").exists()
}

/// On cgroup v2-only hosts slurmd needs the controllers delegated and a
/// system.slice to exist (seen on the development and CI machines).
fn prepare_cgroup_v2() -> Result<()> {
    let _ = fs::write("/sys/fs/cgroup/cgroup.subtree_control", "+cpuset +cpu +memory +pids");
    fs::create_dir_all("/sys/fs/cgroup/system.slice").context("creating /sys/fs/cgroup/system.slice")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parents_below_tmp_are_opened_and_tmp_itself_is_left_alone() {
        let base = Path::new("/tmp").join(format!("gm-parents-{}", std::process::id()));
        let dir = base.join("a/cluster");
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(&base, fs::Permissions::from_mode(0o700)).unwrap();
        let tmp_before = fs::metadata("/tmp").unwrap().permissions().mode();
        open_parents_below_tmp(&dir).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&base), 0o755);
        assert_eq!(fs::metadata("/tmp").unwrap().permissions().mode(), tmp_before, "/tmp's mode changed");
        fs::remove_dir_all(&base).unwrap();
    }
}
