//! Preemption benchmark (issues 10 and 17), printed, never a timed test.
//! For each case (GiB per process × processes), side by side in one run:
//!
//! * ours: the agent (in this process, on a socket, as in production) is
//!   asked to checkpoint a launcher running N programs as `--uid`, then to
//!   restore it; the programs then verify their memory and exit 0. Its
//!   timeline (every phase, from the request) is printed too.
//! * plain: the plain sequence a site would script: per process the driver's
//!   lock+checkpoint, one after the other (what a shell loop of
//!   `cuda-checkpoint --toggle` does), `criu dump -t P -D dir --file-locks
//!   --ext-unix-sk`, then `sync` of the image file system (syncfs) for a
//!   durable image; restore: `criu restore -D dir -d`, then per process the
//!   driver's restore+unlock.
//! * the disk: the image's size written and fsynced (as `dd conv=fsync`),
//!   which gives the serial limit of a durable image:
//!   driver checkpoint time + image size / disk bandwidth.
//!
//! Then the ratios the issue's targets are stated in: GPU free (ours /
//! plain's driver time), durable image (ours / plain, ours / serial limit),
//! restore (ours / plain, and ours / its limit: ours' image read at the rate
//! the plain image was read back just before its restore, plus the driver's
//! restore alone; and, for what one reader can do, ours' image read into
//! fresh memory advised huge pages at the rate a probe did). With several processes, ours' line also gives
//! each process's lock and checkpoint times (the driver's calls run side by
//! side), and after the rounds a probe of the host's part: one process's
//! worth of memory populated in 2 MiB pages, as the driver's buffer is,
//! against N at once (issue 25 item 2: where the time of N goes).
//!
//! Programs: `gpu-mode-ckpt-testprog` (a bare cudarc pattern holder), or a
//! real framework process, `tools/ckpt-bench/apps/framework_app.py` (PyTorch or
//! JAX: their threads, libraries and allocators; `--device cpu` holds the
//! data in host memory, for the CRIU and disk side on a machine without
//! GPUs). Programs that hold no GPU files are left out of the driver calls.
//!
//! ```text
//! gpu-mode-preempt-bench --config C --app PATH --app-args "ARGS" [--cases 1x1,8x1,32x1,8x2,8x4]
//!     [--gpus 1] [--uid 65534] [--workdir DIR] [--no-plain] [--repeat 1] [--plain-driver raw]
//!     [--plain-huge-pages] [--cold]
//! ```
//! Ours' programs start as gpu-mode-run starts them: with the huge-page
//! shim preloaded when the config's `[preempt] huge_pages` is on
//! (preempt::hugepages). `--plain-huge-pages` preloads the same shim into
//! the plain sequence's programs: what a site could do by hand.
//! `--plain-driver bounded` makes the plain sequence call the driver the way
//! the agent does (each call on a thread of its own under a deadline,
//! checkpoint::BoundedDriver) instead of directly: on the H100 ours' driver
//! checkpoint call averaged 6 % longer than the plain side's (2026-11-25),
//! and this tells whether the calling path is why.
//! `--cold` drops each image from the page cache (fsync, then
//! POSIX_FADV_DONTNEED on every file) before each of its reads: ours' and the
//! plain restore, and the plain image's read-back probes, so that the
//! restores and their limit read from the storage (the issue's cold case).
//! `--repeat N` runs each case N times, plain first in every other round (the
//! driver's own time varies by ±15 % from one call to the next on an H100),
//! and ends each case with the medians of the rounds' ratios (`8x1#2p`: round
//! 2, the plain sequence first).
//! `--uid 0` runs the programs as root without capabilities (for sandboxes
//! where root lacks CAP_SYS_RESOURCE, which dumping another user needs).
//! ARGS placeholders: {gib} {mib} {device} {i} {ready} {go}. On a GPU
//! machine: `--app gpu-mode-ckpt-testprog --app-args "--gib {gib} --device
//! {device} --seed {i} --ready {ready} --go {go}"`. With the simulation:
//! `--app cuda-sim-counter --app-args "--steps 100 --interval-ms 20 --mib
//! {mib} --device {device} --ready {ready}"` and a config naming the
//! simulated libraries (see checkpoint/tests/preempt_criu.rs).
//! `launch N GPUS DIR APP ARGS...` is internal: the launcher itself.

use gpu_mode_core::cuda_ckpt::{CudaCkptDriver, CudaDriver};
use gpu_mode_core::preempt::agent::{gpu_facts, listen, node_gpus, real_backends, AgentSettings};
use gpu_mode_core::preempt::hugepages::{preload_value, PRELOAD};
use gpu_mode_core::preempt::protocol::{request, CheckpointSummary, Request, Response, RestoreSummary};
use gpu_mode_core::job_env::JobRun;
use gpu_mode_core::preempt::{now_ms, socket_path, Agent, AgentParams, NodeFacts};
use gpu_mode_core::privdrop::{run_as, without_capabilities, Identity};
use gpu_mode_core::Config;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

const GIB: f64 = (1u64 << 30) as f64;

struct Opts {
    config: Option<PathBuf>,
    app: PathBuf,
    app_args: String,
    cases: Vec<(f64, usize)>,
    gpus: usize,
    uid: u32,
    workdir: PathBuf,
    plain: bool,
    repeat: usize,
    /// The plain sequence calls the driver through checkpoint::BoundedDriver.
    plain_bounded: bool,
    /// The huge-page shim for ours' programs, as gpu-mode-run preloads it
    /// (`[preempt] huge_pages`).
    ours_preload: Option<PathBuf>,
    /// The plain sequence's programs with the same shim.
    plain_preload: bool,
    /// Every image read from the storage, not the page cache (`--cold`).
    cold: bool,
    /// Ours' programs keep a host memory pool (`--pool`: the job's
    /// `pool=on`, preempt::pool), full before each checkpoint.
    pool: bool,
    /// The copy engines' device-to-host rate into populated pageable memory,
    /// GiB/s, measured in the same run (`--d2h-gibs`, scripts/gpu/preempt-real.sh
    /// from ckpt_diag.py): the bound GPU free is compared with.
    d2h_gibs: Option<f64>,
    /// The same, host to device from populated pageable memory (`--h2d-gibs`):
    /// the bound the driver's restore is compared with.
    h2d_gibs: Option<f64>,
}

fn parse() -> anyhow::Result<Opts> {
    let mut o = Opts {
        config: None,
        app: PathBuf::new(),
        app_args: String::new(),
        cases: vec![(1.0, 1), (8.0, 1), (32.0, 1), (8.0, 2), (8.0, 4)],
        gpus: 1,
        uid: 65534,
        workdir: std::env::temp_dir().join("gpu-mode-preempt-bench"),
        plain: true,
        repeat: 1,
        plain_bounded: false,
        ours_preload: None,
        plain_preload: false,
        cold: false,
        pool: false,
        d2h_gibs: None,
        h2d_gibs: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        // --no-seed: its name before issue 17.
        if a == "--no-plain" || a == "--no-seed" {
            o.plain = false;
            continue;
        }
        if a == "--plain-huge-pages" {
            o.plain_preload = true;
            continue;
        }
        if a == "--cold" {
            o.cold = true;
            continue;
        }
        if a == "--pool" {
            o.pool = true;
            continue;
        }
        let v = it.next().ok_or_else(|| anyhow::anyhow!("{a} needs a value"))?;
        match a.as_str() {
            "--config" => o.config = Some(v.into()),
            "--app" => o.app = v.into(),
            "--app-args" => o.app_args = v,
            "--cases" => o.cases = v.split(',').map(parse_case).collect::<anyhow::Result<_>>()?,
            "--gpus" => o.gpus = v.parse()?,
            "--uid" => o.uid = v.parse()?,
            "--workdir" => o.workdir = v.into(),
            "--repeat" => o.repeat = v.parse::<usize>()?.max(1),
            "--d2h-gibs" => o.d2h_gibs = Some(v.parse()?),
            "--h2d-gibs" => o.h2d_gibs = Some(v.parse()?),
            "--plain-driver" => {
                o.plain_bounded = match v.as_str() {
                    "raw" => false,
                    "bounded" => true,
                    _ => anyhow::bail!("--plain-driver is raw or bounded, not {v:?}"),
                }
            }
            _ => anyhow::bail!("unknown argument {a:?}"),
        }
    }
    anyhow::ensure!(o.app.is_absolute(), "--app must be an absolute path");
    Ok(o)
}

/// `8x2`: two processes of 8 GiB each.
fn parse_case(text: &str) -> anyhow::Result<(f64, usize)> {
    let (gib, n) = text.split_once('x').ok_or_else(|| anyhow::anyhow!("case {text:?} is not GIBxPROCS"))?;
    Ok((gib.parse()?, n.parse()?))
}

/// `launch N GPUS DIR APP ARGS...`: starts N programs, waits for all; exit 0
/// only if every one exited 0. Runs as the benchmark user.
fn launcher(args: &[String]) -> i32 {
    let (Some(n), Some(gpus), Some(dir), Some(app)) = (args.first(), args.get(1), args.get(2), args.get(3)) else { return 2 };
    let (n, gpus): (usize, usize) = (n.parse().unwrap_or(1), gpus.parse().unwrap_or(1).max(1));
    let mut children = Vec::new();
    for i in 0..n {
        let fill = |a: &String| {
            a.replace("{i}", &i.to_string()).replace("{device}", &(i % gpus).to_string()).replace("{ready}", &format!("{dir}/ready{i}"))
        };
        match Command::new(app).args(args[4..].iter().map(fill)).spawn() {
            Ok(c) => children.push(c),
            Err(_) => return 3,
        }
    }
    // Wait for every one, then judge.
    let ok: Vec<bool> = children.iter_mut().map(|c| c.wait().map(|s| s.success()).unwrap_or(false)).collect();
    if ok.iter().all(|b| *b) {
        0
    } else {
        1
    }
}

/// The launcher and its programs of one case.
struct Fleet {
    launcher: Child,
    dir: PathBuf,
    n: usize,
}

impl Fleet {
    fn start(o: &Opts, tag: &str, gib: f64, n: usize, preload: Option<&Path>, pool_dir: Option<&Path>) -> anyhow::Result<Fleet> {
        let dir = o.workdir.join("fleets").join(tag);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o1777))?;
        let mib = ((gib * 1024.0) as u64).max(1).to_string();
        let go = dir.join("go").display().to_string();
        let args: Vec<String> = o.app_args.split_whitespace().map(|a| a.replace("{gib}", &gib.to_string()).replace("{mib}", &mib).replace("{go}", &go)).collect();
        let me = std::env::current_exe()?;
        let mut cmd = Command::new(me);
        let log = std::fs::File::create(dir.join("out.log"))?;
        // The programs' own log: CRIU, which runs as their user, reopens it at restore.
        std::os::unix::fs::chown(dir.join("out.log"), Some(o.uid), Some(o.uid))?;
        cmd.arg("launch").arg(n.to_string()).arg(o.gpus.to_string()).arg(&dir).arg(&o.app).args(args).current_dir(&dir);
        cmd.stdin(std::process::Stdio::null()).stdout(log.try_clone()?).stderr(log);
        if let Some(lib) = preload {
            cmd.env(PRELOAD, preload_value(lib, std::env::var_os(PRELOAD).as_deref()));
        }
        if let Some(dir) = pool_dir {
            cmd.env(gpu_mode_core::preempt::pool::DIR_ENV, dir);
            // The sizer finds a job's processes by their cgroup, else by
            // SLURM_JOB_ID in their environment (devices' ProcFs): the
            // bench's job is the pool directory's name.
            if let Some(job) = dir.file_name() {
                cmd.env("SLURM_JOB_ID", job);
            }
        }
        // SAFETY: setsid is async-signal-safe. The launcher leads its own
        // session, as gpu-mode-run's application does.
        unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        if o.uid == 0 {
            // Root without capabilities: see privdrop::without_capabilities.
            without_capabilities(&mut cmd);
        } else {
            run_as(&mut cmd, &Identity::of_user_or_bare(o.uid, o.uid));
        }
        let launcher = cmd.spawn()?;
        let fleet = Fleet { launcher, dir, n };
        fleet.wait_ready()?;
        Ok(fleet)
    }

    fn wait_ready(&self) -> anyhow::Result<()> {
        let start = Instant::now();
        while (0..self.n).any(|i| !self.dir.join(format!("ready{i}")).exists()) {
            anyhow::ensure!(start.elapsed() < Duration::from_secs(300), "test programs not ready after 300 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    fn pids(&self) -> Vec<i32> {
        (0..self.n).filter_map(|i| std::fs::read_to_string(self.dir.join(format!("ready{i}"))).ok()?.trim().parse().ok()).collect()
    }

    fn go(&self) {
        let _ = std::fs::write(self.dir.join("go"), b"go");
    }

    /// The launcher's session killed (it leads one), for a round given up
    /// before the checkpoint: its programs must not keep the GPU.
    fn kill(mut self) {
        // SAFETY: a signal to the process group the launcher leads.
        unsafe { libc::kill(-(self.launcher.id() as i32), libc::SIGKILL) };
        let _ = self.launcher.wait();
    }
}

/// Reaps the zombies of a dumped fleet: its programs were reparented to us
/// (a subreaper) and their pids must be free before a restore.
fn reap_orphans() {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    while let Ok(s) = waitpid(nix::unistd::Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
        if s == WaitStatus::StillAlive {
            break;
        }
    }
}

/// Reaps until every pid of `pids` is free. A large process that was
/// killed shows as a zombie while its other threads still tear its memory
/// down, and is reapable only after: one pass of [`reap_orphans`] right
/// after the kill can miss it, and nothing else would reap it before the
/// restore needs its pid (found with a 32 GiB PyTorch process on an H200).
fn reap_until_free(pids: &[i32], within: Duration) -> anyhow::Result<()> {
    let t = Instant::now();
    loop {
        reap_orphans();
        // The restore's own test of "free" (it names the holder), asked once per pass.
        match gpu_mode_core::preempt::tree::wait_pids_free(pids, Duration::ZERO) {
            Ok(()) => return Ok(()),
            Err(held) if t.elapsed() >= within => anyhow::bail!("{held}, after {within:?} of reaping"),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn wait_pid(pid: i32) -> Option<i32> {
    use nix::sys::wait::{waitpid, WaitStatus};
    match waitpid(nix::unistd::Pid::from_raw(pid), None) {
        Ok(WaitStatus::Exited(_, c)) => Some(c),
        Ok(WaitStatus::Signaled(_, s, _)) => Some(128 + s as i32),
        _ => None,
    }
}

/// One agent for the whole run, serving on a socket in the workdir; with
/// `--pool`, its pool sizer too, whose directory is returned.
fn start_agent(o: &Opts, cfg: &Config, job: u32) -> anyhow::Result<(PathBuf, Option<PathBuf>)> {
    let gpus: Vec<u32> = (0..o.gpus as u32).collect();
    let (facts, driver_version) = gpu_facts(cfg, &gpus).map_err(anyhow::Error::msg)?;
    let (backends, cuda_version) = real_backends(cfg).map_err(anyhow::Error::msg)?;
    let mut settings = AgentSettings::from_config(cfg);
    settings.socket_dir = o.workdir.join("agent");
    settings.images = gpu_mode_core::preempt::ImageStore::new(o.workdir.join("images"));
    settings.checkpoint.record_dir = o.workdir.join("records");
    let run = JobRun { job, restart_count: 0, uid: o.uid, gid: o.uid, node: "bench".into() };
    // With --pool the agent sizes the programs' pools, as for a pool=on job.
    let pool_dir = o.pool.then(|| cfg.preempt.pool_dir(&cfg.runtime_dir, job));
    let params = AgentParams { run, gpus: facts, deadline: None, nccl: gpu_mode_core::gpu_mode::NcclTransport::Native, pool: o.pool, job_nodes: vec![] };
    let agent = Arc::new(Agent::new(params, settings.clone(), NodeFacts { driver_version, cuda_version, node_gpus: node_gpus(cfg) }, backends));
    let listener = listen(&settings.socket_dir, job, o.uid, o.uid)?;
    std::thread::spawn(move || agent.serve(listener));
    Ok((socket_path(&settings.socket_dir, job), pool_dir))
}

/// Waits until each program's pool holds what the sizer asked (its link's
/// MiB, less 64), and says how long that took and how much it holds: the
/// pool's cost, paid while the job runs.
fn wait_pools(dir: &Path, pids: &[i32]) -> anyhow::Result<()> {
    let t = Instant::now();
    let asked = |pid: i32| std::fs::read_link(dir.join(pid.to_string())).ok()?.to_str()?.parse::<u64>().ok();
    let held = |pid: i32| gpu_mode_core::cuda_ckpt::host_room::pool_bytes(Path::new("/proc"), pid);
    // The sizes settle as the programs' footprints do (a framework grows its
    // GPU memory in its first steps): full means full of sizes that held
    // for three of the sizer's turns.
    let (mut last, mut since) = (Vec::new(), Instant::now());
    loop {
        let now: Vec<Option<u64>> = pids.iter().map(|&p| asked(p)).collect();
        if now != last {
            (last, since) = (now, Instant::now());
        }
        let settled = since.elapsed() >= 3 * gpu_mode_core::preempt::pool::INTERVAL;
        let full = settled && pids.iter().all(|&p| asked(p).is_some_and(|mib| held(p) + (64 << 20) >= mib << 20));
        if full {
            let total: u64 = pids.iter().map(|&p| held(p)).sum();
            println!(
                "ours   pool: {:.2} GiB populated before the signal, full {:.1} s after the programs were ready (its sizes unchanged for {:.0} s)",
                total as f64 / GIB,
                t.elapsed().as_secs_f64(),
                since.elapsed().as_secs_f64()
            );
            return Ok(());
        }
        let sized = pids.iter().all(|&p| asked(p).is_some());
        anyhow::ensure!(sized || t.elapsed() < Duration::from_secs(20), "no pool size for {pids:?} after 20 s in {} (the agent's sizer?)", dir.display());
        anyhow::ensure!(t.elapsed() < Duration::from_secs(180), "the pools were not full after 180 s (asked {:?})", pids.iter().map(|&p| asked(p)).collect::<Vec<_>>());
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn ours(o: &Opts, socket: &Path, pool_dir: Option<&Path>, case: &str, gib: f64, n: usize) -> anyhow::Result<(CheckpointSummary, RestoreSummary, i32)> {
    let fleet = Fleet::start(o, &format!("ours-{case}"), gib, n, o.ours_preload.as_deref(), pool_dir)?;
    let (root, pids) = (fleet.launcher.id() as i32, fleet.pids());
    if let Some(dir) = pool_dir {
        if let Err(e) = wait_pools(dir, &pids) {
            fleet.kill();
            return Err(e);
        }
    }
    let req = Request::Checkpoint { root_pid: root, signal_at_ms: Some(now_ms()) };
    let ck = match request(socket, &req, None).map_err(anyhow::Error::msg)?.0 {
        Response::Checkpointed(s) => s,
        other => anyhow::bail!("checkpoint: {other:?}"),
    };
    wait_pid(root);
    reap_until_free(&pids, Duration::from_secs(60))?;
    if o.cold {
        evict(&o.workdir.join("images"))?;
    }
    let (resp, mut reader) = request(socket, &Request::Restore, None).map_err(anyhow::Error::msg)?;
    let rs = match resp {
        Response::Restored { summary, .. } => summary,
        other => anyhow::bail!("restore: {other:?}"),
    };
    fleet.go();
    let status = match gpu_mode_core::preempt::protocol::receive::<Response>(&mut reader)? {
        Some(Response::Exited(e)) => e.shell_status(),
        other => anyhow::bail!("after restore: {other:?}"),
    };
    Ok((ck, rs, status))
}

#[derive(Default)]
struct Plain {
    /// The driver's lock+checkpoint of every process: GPU memory free.
    driver_ms: f64,
    dump_ms: f64,
    sync_ms: f64,
    image_bytes: u64,
    criu_restore_ms: f64,
    cuda_restore_ms: f64,
    /// Reading the image's files back once, just before its restore (from
    /// the page cache, as the restore reads them): the storage's read rate.
    read_ms: f64,
    /// The same, each file read into a fresh mapping advised MADV_HUGEPAGE,
    /// as a restore must (pages allocated and zeroed, then filled): the rate
    /// one reader can restore memory at, the page cache warm.
    read_fresh_ms: f64,
    status: i32,
}

impl Plain {
    fn durable_ms(&self) -> f64 {
        self.driver_ms + self.dump_ms + self.sync_ms
    }
    fn restore_ms(&self) -> f64 {
        self.criu_restore_ms + self.cuda_restore_ms
    }
}

/// `criu ARGS -D dir`, as root for root's programs; for a user's, as that
/// user with the capabilities the agent gives it (`--unprivileged`): root
/// may lack CAP_SYS_RESOURCE, without which CRIU as root cannot dump
/// another user's processes (the GPU machines), and the plain sequence
/// then runs CRIU as ours does.
fn criu(cfg: &Config, uid: u32, args: &[&str], dir: &Path) -> anyhow::Result<f64> {
    let mut cmd = Command::new(&cfg.preempt.criu);
    cmd.args(args).arg("-D").arg(dir);
    if uid != 0 {
        std::os::unix::fs::chown(dir, Some(uid), Some(uid))?;
        cmd.arg("--unprivileged");
        gpu_mode_core::privdrop::run_as_with_caps(&mut cmd, &Identity::of_user_or_bare(uid, uid), &gpu_mode_core::criu::capabilities(false), &Default::default());
    }
    let t = Instant::now();
    let out = cmd.output()?;
    anyhow::ensure!(out.status.success(), "criu {}: {}", args[0], String::from_utf8_lossy(&out.stderr));
    Ok(t.elapsed().as_secs_f64() * 1e3)
}

/// `sync` of the file system holding `dir`, timed.
fn sync_fs(dir: &Path) -> anyhow::Result<f64> {
    use std::os::fd::AsRawFd;
    let t = Instant::now();
    let d = std::fs::File::open(dir)?;
    // SAFETY: a plain syscall on a descriptor we own.
    anyhow::ensure!(unsafe { libc::syncfs(d.as_raw_fd()) } == 0, "syncfs: {}", std::io::Error::last_os_error());
    Ok(t.elapsed().as_secs_f64() * 1e3)
}

/// The programs the driver knows (a program holding no GPU memory, e.g. a
/// framework on the CPU, is left out of the driver calls).
fn cuda_pids(driver: &dyn CudaCkptDriver, pids: &[i32]) -> Vec<i32> {
    pids.iter().copied().filter(|p| driver.state(*p).is_ok()).collect()
}

fn plain(o: &Opts, cfg: &Config, driver: &dyn CudaCkptDriver, case: &str, gib: f64, n: usize) -> anyhow::Result<Plain> {
    let preload = o.plain_preload.then_some(o.ours_preload.as_deref()).flatten();
    let fleet = Fleet::start(o, &format!("plain-{case}"), gib, n, preload, None)?;
    let (root, pids) = (fleet.launcher.id() as i32, fleet.pids());
    let cuda = cuda_pids(driver, &pids);
    let dir = o.workdir.join("plain-images").join(case);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    sync_fs(&dir)?;
    let t = Instant::now();
    for &p in &cuda {
        driver.lock(p, 10_000)?;
        driver.checkpoint(p)?;
    }
    let mut s = Plain { driver_ms: t.elapsed().as_secs_f64() * 1e3, ..Plain::default() };
    s.dump_ms = criu(cfg, o.uid, &["dump", "-t", &root.to_string(), "--file-locks", "--ext-unix-sk", "-o", "dump.log"], &dir)?;
    s.sync_ms = sync_fs(&dir)?;
    s.image_bytes = std::fs::read_dir(&dir)?.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum();
    wait_pid(root);
    reap_until_free(&pids, Duration::from_secs(60))?;
    let cold = |dir: &Path| if o.cold { evict(dir) } else { Ok(()) };
    cold(&dir)?;
    s.read_ms = read_back_ms(&dir)?;
    cold(&dir)?;
    s.read_fresh_ms = read_into_fresh_huge_pages_ms(&dir)?;
    cold(&dir)?;
    s.criu_restore_ms = criu(cfg, o.uid, &["restore", "-d", "-o", "restore.log"], &dir)?;
    let t = Instant::now();
    for &p in &cuda {
        driver.restore(p, &[])?;
        driver.unlock(p)?;
    }
    s.cuda_restore_ms = t.elapsed().as_secs_f64() * 1e3;
    fleet.go();
    // Restored detached: our child only through the subreaper.
    s.status = wait_pid(root).unwrap_or(-1);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(s)
}

/// Drops every file under `dir` from the page cache (written back first:
/// only clean pages can be dropped), for a restore that reads the storage.
fn evict(dir: &Path) -> anyhow::Result<()> {
    use std::os::fd::AsRawFd;
    for entry in std::fs::read_dir(dir)?.flatten() {
        let kind = entry.file_type()?;
        if kind.is_dir() {
            evict(&entry.path())?;
        } else if kind.is_file() {
            let f = std::fs::File::open(entry.path())?;
            f.sync_all()?;
            // SAFETY: advice on a descriptor we own, over the whole file.
            let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            anyhow::ensure!(rc == 0, "posix_fadvise {}: {}", entry.path().display(), std::io::Error::from_raw_os_error(rc));
        }
    }
    Ok(())
}

/// Reads every file of `dir` once (16 MiB reads), timed: the rate the
/// image's storage gives a restore, here from the page cache the dump left.
fn read_back_ms(dir: &Path) -> anyhow::Result<f64> {
    use std::io::Read;
    let mut block = vec![0u8; 16 << 20];
    let t = Instant::now();
    for entry in std::fs::read_dir(dir)?.flatten() {
        if entry.file_type()?.is_file() {
            let mut f = std::fs::File::open(entry.path())?;
            while f.read(&mut block)? > 0 {}
        }
    }
    Ok(t.elapsed().as_secs_f64() * 1e3)
}

/// A fresh private anonymous mapping, to be advised MADV_HUGEPAGE as the
/// huge-page shim makes the driver's buffer and CRIU 0003 a restored one;
/// unmapped when dropped.
struct HugeMapping {
    at: *mut libc::c_void,
    len: usize,
}

impl HugeMapping {
    fn new(len: usize) -> std::io::Result<HugeMapping> {
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        // SAFETY: a fresh anonymous mapping, owned by the value returned.
        let at = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
        if at == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(HugeMapping { at, len })
    }

    fn advise(&self, advice: libc::c_int) -> std::io::Result<()> {
        // SAFETY: advice on our own mapping, whole.
        if unsafe { libc::madvise(self.at, self.len, advice) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is ours, readable and writable, `len` long, and
        // lives as long as the borrow.
        unsafe { std::slice::from_raw_parts_mut(self.at.cast::<u8>(), self.len) }
    }
}

impl Drop for HugeMapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once.
        unsafe { libc::munmap(self.at, self.len) };
    }
}

/// Reads every file of `dir` once into fresh memory advised MADV_HUGEPAGE
/// (one mapping per file, one reader, 16 MiB reads), timed: what CRIU's
/// restorer does for memory advised so (packaging/criu/0003), at best.
fn read_into_fresh_huge_pages_ms(dir: &Path) -> anyhow::Result<f64> {
    use std::io::Read;
    let t = Instant::now();
    for entry in std::fs::read_dir(dir)?.flatten() {
        if !entry.file_type()?.is_file() {
            continue;
        }
        let len = entry.metadata()?.len() as usize;
        if len == 0 {
            continue;
        }
        let mut memory = HugeMapping::new(len).map_err(|e| anyhow::anyhow!("mmap {len} bytes: {e}"))?;
        // Best effort, as CRIU's: without it the read fills 4 KiB pages.
        let _ = memory.advise(libc::MADV_HUGEPAGE);
        let mut f = std::fs::File::open(entry.path())?;
        for chunk in memory.bytes().chunks_mut(16 << 20) {
            f.read_exact(chunk)?;
        }
    }
    Ok(t.elapsed().as_secs_f64() * 1e3)
}

/// The disk's bandwidth for a durable write of `bytes` into `dir` (16 MiB
/// writes, then fsync: `dd bs=16M conv=fsync`), GiB/s.
fn disk_gibs(dir: &Path, bytes: u64) -> anyhow::Result<f64> {
    use std::io::Write;
    let path = dir.join("disk-probe");
    let block = vec![0x5au8; 16 << 20];
    let t = Instant::now();
    let mut f = std::fs::File::create(&path)?;
    let mut left = bytes;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        f.write_all(&block[..n])?;
        left -= n as u64;
    }
    f.sync_all()?;
    let secs = t.elapsed().as_secs_f64();
    drop(f);
    std::fs::remove_file(&path)?;
    sync_fs(dir)?;
    Ok(bytes as f64 / GIB / secs)
}

fn gibs(bytes: u64, ms: f64) -> f64 {
    if ms <= 0.0 {
        0.0
    } else {
        bytes as f64 / GIB / (ms / 1e3)
    }
}

fn print_ours(case: &str, c: &CheckpointSummary, r: &RestoreSummary, status: i32) {
    let t = &c.timings;
    println!(
        "{case:<7} ours   GPU free {:>7.3} s  durable {:>7.3} s  ({:.2} GiB image; criu-dump {:.3} s {:.2} GiB/s)  restore {:>7.3} s  exit {status}",
        t.signal_to_gpu_free_ms.unwrap_or(f64::NAN) / 1e3,
        t.signal_to_durable_ms.unwrap_or(t.total_ms) / 1e3,
        c.image_bytes as f64 / GIB,
        t.criu_dump_ms / 1e3,
        gibs(c.image_bytes, t.criu_dump_ms),
        r.total_ms / 1e3,
    );
    println!("{case:<7}        checkpoint: {}", c.timeline.render());
    if !c.processes.is_empty() {
        let each: Vec<String> = c
            .processes
            .iter()
            .map(|p| format!("pid {} {:.2} GiB lock {:.0} + checkpoint {:.0} ms", p.pid, p.gpu_bytes as f64 / GIB, p.lock_ms, p.checkpoint_ms))
            .collect();
        println!("{case:<7}        per process (side by side): {}", each.join("; "));
    }
    println!("{case:<7}        restore:    {}", r.timeline.render());
}

/// Ours against the copy engines' rates measured in the same run: GPU free
/// against the footprint at the device-to-host rate into populated memory,
/// the driver's restore against it at the host-to-device rate (issue 39).
fn print_copy_bounds(o: &Opts, case: &str, c: &CheckpointSummary, r: &RestoreSummary) {
    let bytes: u64 = c.processes.iter().map(|p| p.gpu_bytes).sum();
    if bytes == 0 {
        return;
    }
    let gib = bytes as f64 / GIB;
    if let Some(d2h) = o.d2h_gibs {
        let bound = gib / d2h;
        let free = c.timings.signal_to_gpu_free_ms.unwrap_or(f64::NAN) / 1e3;
        println!("{case:<7} bound  GPU free: {gib:.2} GiB at {d2h:.1} GiB/s (D2H into populated memory) = {bound:.3} s; ours/bound {:.2}", free / bound);
    }
    if let Some(h2d) = o.h2d_gibs {
        let bound = gib / h2d;
        println!("{case:<7} bound  CUDA restore: {gib:.2} GiB at {h2d:.1} GiB/s (H2D from populated memory) = {bound:.3} s; ours/bound {:.2}", r.cuda_restore_ms / 1e3 / bound);
    }
}

/// What the host's memory alone allows (issue 25 item 2: N processes
/// should free the GPU nearly as fast as one): the driver's checkpoint
/// copies each process's GPU memory into a new mapping of its own, which
/// the huge-page shim populates in 2 MiB pages. Here: one mapping of `gib`
/// GiB populated the same way (MADV_HUGEPAGE, MADV_POPULATE_WRITE), then `n`
/// at once on `n` threads. Returns the seconds of one and of `n` at once.
fn populate_probe(gib: f64, n: usize) -> anyhow::Result<(f64, f64)> {
    fn populate(len: usize) -> std::io::Result<()> {
        let memory = HugeMapping::new(len)?;
        memory.advise(libc::MADV_HUGEPAGE)?;
        memory.advise(libc::MADV_POPULATE_WRITE)
    }
    let len = (gib * GIB) as usize;
    let t = Instant::now();
    populate(len)?;
    let one = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let results: Vec<std::io::Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n).map(|_| s.spawn(|| populate(len))).collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(std::io::Error::other("panicked")))).collect()
    });
    let all = t.elapsed().as_secs_f64();
    results.into_iter().collect::<std::io::Result<Vec<()>>>()?;
    Ok((one, all))
}

fn print_plain(case: &str, s: &Plain) {
    println!(
        "{case:<7} plain  GPU free {:>7.3} s  durable {:>7.3} s  ({:.2} GiB image; criu-dump {:.3} s {:.2} GiB/s, sync {:.3} s)  restore {:>7.3} s (criu {:.3} + cuda {:.3}; the image read back at {:.2} GiB/s first, into fresh 2 MiB pages at {:.2} GiB/s)  exit {}",
        s.driver_ms / 1e3,
        s.durable_ms() / 1e3,
        s.image_bytes as f64 / GIB,
        s.dump_ms / 1e3,
        gibs(s.image_bytes, s.dump_ms),
        s.sync_ms / 1e3,
        s.restore_ms() / 1e3,
        s.criu_restore_ms / 1e3,
        s.cuda_restore_ms / 1e3,
        gibs(s.image_bytes, s.read_ms),
        gibs(s.image_bytes, s.read_fresh_ms),
        s.status
    );
}

/// One round's figures against the issue's targets.
#[derive(Clone, Copy)]
struct Ratios {
    /// GPU free / the driver alone (NaN without GPU memory).
    free: f64,
    durable: f64,
    /// Durable / the serial limit, when the disk was measured.
    limit: Option<f64>,
    restore: f64,
    /// Restore / its limit: ours' image read at the rate the plain image
    /// was read back, plus the driver's restore alone (the plain side's).
    restore_limit: f64,
    /// Restore / one reader's fill limit: ours' image read into fresh
    /// 2 MiB pages at the rate the probe did, plus the driver's restore.
    restore_fill: f64,
}

impl Ratios {
    fn of(c: &CheckpointSummary, r: &RestoreSummary, p: &Plain, disk: Option<f64>) -> (Ratios, Option<f64>) {
        let t = &c.timings;
        let durable = t.signal_to_durable_ms.unwrap_or(t.total_ms);
        let limit_ms = disk.map(|bw| p.driver_ms + c.image_bytes as f64 / GIB / bw * 1e3);
        // Programs without GPU memory (a framework on the CPU): no driver time.
        let free = if p.driver_ms < 1.0 { f64::NAN } else { t.signal_to_gpu_free_ms.unwrap_or(f64::NAN) / p.driver_ms };
        let ratios = Ratios {
            free,
            durable: durable / p.durable_ms(),
            limit: limit_ms.map(|l| durable / l),
            restore: r.total_ms / p.restore_ms().max(f64::MIN_POSITIVE),
            restore_limit: r.total_ms / (c.image_bytes as f64 / GIB / gibs(p.image_bytes, p.read_ms).max(f64::MIN_POSITIVE) * 1e3 + p.cuda_restore_ms),
            restore_fill: r.total_ms / (c.image_bytes as f64 / GIB / gibs(p.image_bytes, p.read_fresh_ms).max(f64::MIN_POSITIVE) * 1e3 + p.cuda_restore_ms),
        };
        (ratios, limit_ms)
    }

    /// The issues' targets: ≤ 1.05, ≤ 1.0, ≤ 1.1 (issue 17); restore ≤ 0.5
    /// of the plain sequence and ≤ 1.2 of its limit (issue 25 item 1).
    fn print(&self, label: &str, limit: &str) {
        let free = if self.free.is_nan() { "n/a (no GPU memory)".to_string() } else { format!("{:.2}", self.free) };
        let vs_limit = self.limit.map_or("n/a".to_string(), |l| format!("{l:.2}{limit}"));
        println!(
            "{label} GPU free/driver {free} (≤1.05)  durable/plain {:.2} (≤1.0)  durable/serial limit {vs_limit} (≤1.1)  restore/plain {:.2} (≤0.5)  restore/limit {:.2} (≤1.2)  restore/one reader's fill {:.2}",
            self.durable, self.restore, self.restore_limit, self.restore_fill,
        );
    }

    /// Each ratio's median over the rounds (of an even count, the mean of
    /// the two middle ones).
    fn median(all: &[Ratios]) -> Ratios {
        let mid = |f: &dyn Fn(&Ratios) -> f64| {
            let mut v: Vec<f64> = all.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            (v[(v.len() - 1) / 2] + v[v.len() / 2]) / 2.0
        };
        let limit = all.iter().all(|r| r.limit.is_some()).then(|| mid(&|r| r.limit.unwrap_or(f64::NAN)));
        Ratios {
            free: mid(&|r| r.free),
            durable: mid(&|r| r.durable),
            limit,
            restore: mid(&|r| r.restore),
            restore_limit: mid(&|r| r.restore_limit),
            restore_fill: mid(&|r| r.restore_fill),
        }
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("launch") {
        std::process::exit(launcher(&args[1..]));
    }
    let mut o = parse()?;
    anyhow::ensure!(unsafe { libc::geteuid() } == 0, "runs as root (CRIU, the agent)");
    let cfg = Config::load(o.config.as_deref())?;
    // As gpu-mode-run: a shim that cannot be used is said, and not used.
    // The bench's programs fork nothing: the library is preloaded for its
    // huge pages alone (the A/B switch is `huge_pages`).
    let huge_pages_only = gpu_mode_core::config::PreemptConfig { forked_children_drop_gpu_files: false, ..cfg.preempt.clone() };
    o.ours_preload = gpu_mode_core::preempt::hugepages::for_application(&huge_pages_only).unwrap_or_else(|e| {
        println!("ours: huge pages off ({e})");
        None
    });
    anyhow::ensure!(!o.plain_preload || o.ours_preload.is_some(), "--plain-huge-pages needs [preempt] huge_pages and its library");
    std::fs::create_dir_all(&o.workdir)?;
    // The plain sequence's `criu restore -d` reparents the tree to the nearest subreaper.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let raw = CudaDriver::load(cfg.cuda_ckpt.cuda_library.as_deref())?;
    let shim = |on: bool| if on { "with the huge-page shim" } else { "without huge pages" };
    println!(
        "driver CUDA {}, {} GPU(s), programs as uid {}, images under {}, plain driver calls {}; ours {}, plain {}; \
         restores read {}; ours' CRIU with {} page readers, the driver's buffer {}",
        raw.version(),
        o.gpus,
        o.uid,
        o.workdir.display(),
        if o.plain_bounded { "bounded (as the agent's)" } else { "direct" },
        shim(o.ours_preload.is_some()),
        shim(o.plain_preload),
        if o.cold { "the storage (the images dropped from the page cache)" } else { "the page cache the dump left" },
        cfg.preempt.restore_page_readers,
        if cfg.preempt.restore_map_buffers { "mapped from the image where it is cached" } else { "read" },
    );
    let driver: Box<dyn CudaCkptDriver> = if o.plain_bounded {
        let timeout = Duration::from_millis(cfg.cuda_ckpt.call_timeout_ms);
        Box::new(gpu_mode_core::cuda_ckpt::BoundedDriver::new(Arc::new(raw), timeout))
    } else {
        Box::new(raw)
    };
    let mut failed = 0;
    let mut job = 100;
    for &(gib, n) in &o.cases {
        let case = format!("{gib}x{n}");
        let mut rounds = Vec::new();
        let mut disk = None;
        for round in 0..o.repeat {
            // Plain first in every other round: neither side always finds the
            // page cache and the driver as the other left them.
            let plain_first = o.plain && round % 2 == 1;
            let label = match (o.repeat > 1, plain_first) {
                (false, _) => case.clone(),
                (true, false) => format!("{case}#{}", round + 1),
                // p: the plain sequence ran first in this round.
                (true, true) => format!("{case}#{}p", round + 1),
            };
            let plain_run = |o: &Opts| plain(o, &cfg, driver.as_ref(), &case, gib, n);
            let mut plain = if plain_first { Some(plain_run(&o)) } else { None };
            // One job per round: its image directory starts empty.
            let (socket, pool_dir) = start_agent(&o, &cfg, job)?;
            job += 1;
            let ours = ours(&o, &socket, pool_dir.as_deref(), &case, gib, n);
            match &ours {
                Ok((c, r, status)) => {
                    print_ours(&label, c, r, *status);
                    print_copy_bounds(&o, &label, c, r);
                    failed += usize::from(*status != 0);
                }
                Err(e) => {
                    println!("{label:<7} ours   FAILED: {e:#}");
                    failed += 1;
                }
            }
            // The agent's image of this round is of no more use; its disk
            // space is the plain sequence's.
            let _ = std::fs::remove_dir_all(o.workdir.join("images"));
            if !o.plain {
                continue;
            }
            let plain = plain.take().unwrap_or_else(|| plain_run(&o));
            match &plain {
                Ok(p) => print_plain(&label, p),
                Err(e) => println!("{label:<7} plain  FAILED: {e:#}"),
            }
            if let (Ok((c, r, _)), Ok(p)) = (&ours, &plain) {
                // The disk once per case: it takes as long as a dump.
                if disk.is_none() {
                    disk = disk_gibs(&o.workdir, c.image_bytes).map_err(|e| println!("{case:<7} disk   FAILED: {e:#}")).ok();
                    if let Some(bw) = disk {
                        println!("{case:<7} disk   {:.2} GiB written and fsynced at {bw:.2} GiB/s", c.image_bytes as f64 / GIB);
                    }
                }
                let (ratios, limit_ms) = Ratios::of(c, r, p, disk);
                let limit = limit_ms.map_or(String::new(), |l| format!(" (limit {:.3} s at {:.2} GiB/s)", l / 1e3, disk.unwrap_or(0.0)));
                ratios.print(&format!("{label:<7} ratios"), &limit);
                rounds.push(ratios);
            }
        }
        if rounds.len() > 1 {
            Ratios::median(&rounds).print(&format!("{case:<7} median of {} rounds:", rounds.len()), "");
        }
        if n > 1 {
            match populate_probe(gib, n) {
                Ok((one, all)) => println!(
                    "{case:<7} host   populating {gib} GiB in 2 MiB pages (as the driver's buffer): one {one:.3} s ({:.2} GiB/s), {n} at once {all:.3} s ({:.2}x one)",
                    gib / one,
                    all / one
                ),
                Err(e) => println!("{case:<7} host   populate probe FAILED: {e}"),
            }
        }
    }
    anyhow::ensure!(failed == 0, "{failed} case(s) failed");
    Ok(())
}
