//! A CUDA program on the simulated driver that counts steps in device memory,
//! for checkpoint/restore tests: the count lives on the (simulated) GPU, so a
//! count that goes on after dump and restore proves the memory came back.
//!
//! ```text
//! cuda-sim-counter --steps N [--interval-ms 100] [--mib 4] [--exit-code C] [--ready FILE] [--device 0]
//!                  [--signals yes] [--fork-worker yes] [--hold io-uring|io-uring-or-epoll|tcp-loopback|tcp-to:PORT|nccl-thread|thread|huge-pages]
//!                  [--keep-open FILE] [--nccl-setenv NAME=VALUE]
//! ```
//! Each step reads the counter from device memory, checks it is the previous
//! step, writes it back incremented, checks one 64 KiB window of a seeded
//! pattern filling the rest of the allocation, and prints
//! `step <n> gpu <uuid>`. After step N it checks the whole pattern, prints
//! `DONE count=<N>` and exits with `--exit-code` (0 by default). A mismatch
//! prints `MISMATCH ...` and exits 3. `--ready FILE` gets the pid after step 1.
//!
//! `--signals yes` prints `signals blocked=<hex> ignored=<hex>` (SigBlk and
//! SigIgn of /proc/self/status) after every step: a restored run's state
//! shows after the restore. It also catches SIGTERM: the next step prints
//! `received SIGTERM` and the program exits with 143 (what a training script
//! that saves its state on SIGTERM does). `--fork-worker yes` forks a child without exec
//! after the memory is filled, which holds the parent's descriptors and
//! waits for signals, as a DataLoader worker of PyTorch's default start
//! method does; at the end the parent ends it with SIGTERM and waits for it,
//! as Python's multiprocessing does at exit.
//!
//! `--hold io-uring` keeps an io_uring instance open (as torchrun's agent
//! does for PyTorch's libuv TCPStore), `--hold io-uring-or-epoll` does the
//! same where `io_uring_setup` works and otherwise falls back as libuv
//! does (says so, and runs on), `--hold tcp-loopback` keeps both ends of a
//! TCP connection over 127.0.0.1 and its listener open (as gloo ranks and
//! torchrun's store hold them), `--hold tcp-to:PORT` keeps a connection to
//! 127.0.0.1:PORT (a peer outside the tree), `--hold nccl-thread` runs a thread
//! named as PyTorch's NCCL watchdog and then does what NCCL's init does with
//! the environment: unless `NCCL_P2P_DISABLE=1`, the rank uses the P2P
//! transport and shares its memory with its peers through CUDA IPC
//! ([`Context::share_with_peers`]; the simulated r580 driver then cannot
//! restore it) and prints `nccl transport p2p`, else `nccl transport
//! portable`. `--nccl-setenv NAME=VALUE` sets a variable in the program's
//! own environment before that init, as a training script that assigns
//! `os.environ` does: invisible in /proc/<pid>/environ, which the agent
//! reads. Only NCCL_P2P_DISABLE counts here, the smallest model of what
//! the GPU showed (issue 38: on 2×H200 NCCL_SHM_DISABLE=1 was needed too;
//! preempt::nccl has the measure). `--hold thread` runs a second thread (`counter-worker`), whose
//! thread id the image carries and a restore must get back. `--hold huge-pages`
//! maps 64 MiB of private anonymous host memory, advises it MADV_HUGEPAGE
//! (as the huge-page shim does for the driver's checkpoint buffer), writes
//! every page and prints `huge-pages at 0x<address>`: what a restore must
//! bring back in 2 MiB pages (packaging/criu/0003).
//!
//! `--keep-open FILE` opens FILE for reading and writing and keeps it open
//! to the end (never writing it): the file a restore reopens, which the
//! churn swaps for a link to a root-owned file between dump and restore.

use cuda_sim::process::{Context, DevPtr};
use std::io::Write;
use std::time::Duration;

const WINDOW: usize = 64 << 10;

struct Opts {
    steps: u64,
    interval: Duration,
    bytes: u64,
    exit_code: i32,
    ready: Option<String>,
    device: usize,
    signals: bool,
    fork_worker: bool,
    hold: Option<String>,
    keep_open: Option<String>,
    nccl_setenv: Option<(String, String)>,
}

fn parse() -> Result<Opts, String> {
    let mut o = Opts { steps: 10, interval: Duration::from_millis(100), bytes: 4 << 20, exit_code: 0, ready: None, device: 0, signals: false, fork_worker: false, hold: None, keep_open: None, nccl_setenv: None };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().ok_or_else(|| format!("{a} needs a value"))?;
        let num = |v: &str| v.parse::<u64>().map_err(|_| format!("{a} {v}: not a number"));
        match a.as_str() {
            "--steps" => o.steps = num(&v)?,
            "--interval-ms" => o.interval = Duration::from_millis(num(&v)?),
            "--mib" => o.bytes = num(&v)?.max(1) << 20,
            "--exit-code" => o.exit_code = num(&v)? as i32,
            "--ready" => o.ready = Some(v),
            "--device" => o.device = num(&v)? as usize,
            "--signals" => o.signals = yes(&a, &v)?,
            "--fork-worker" => o.fork_worker = yes(&a, &v)?,
            "--hold" if ["io-uring", "io-uring-or-epoll", "tcp-loopback", "nccl-thread", "thread", "huge-pages"].contains(&v.as_str()) || v.starts_with("tcp-to:") => {
                o.hold = Some(v)
            }
            "--keep-open" => o.keep_open = Some(v),
            "--nccl-setenv" => {
                let (name, value) = v.split_once('=').ok_or_else(|| format!("{a} {v}: not NAME=VALUE"))?;
                o.nccl_setenv = Some((name.to_string(), value.to_string()));
            }
            _ => return Err(format!("unknown argument {a}")),
        }
    }
    Ok(o)
}

fn yes(arg: &str, v: &str) -> Result<bool, String> {
    match v {
        "yes" => Ok(true),
        "no" => Ok(false),
        _ => Err(format!("{arg} {v}: yes or no")),
    }
}

/// `signals blocked=<SigBlk> ignored=<SigIgn>` of this process.
fn signal_line() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).map_or("?", str::trim).to_string();
    format!("signals blocked={} ignored={}", field("SigBlk:"), field("SigIgn:"))
}

static TERM_RECEIVED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_term(_: libc::c_int) {
    TERM_RECEIVED.store(true, std::sync::atomic::Ordering::SeqCst);
}

fn catch_term() {
    // SAFETY: the handler only stores to an atomic.
    unsafe { libc::signal(libc::SIGTERM, on_term as extern "C" fn(libc::c_int) as libc::sighandler_t) };
}

/// A child forked without exec that waits for signals until one ends it.
fn fork_worker() -> Result<libc::pid_t, String> {
    // SAFETY: the child only calls pause() (async-signal-safe) until a
    // signal's default action ends it.
    match unsafe { libc::fork() } {
        -1 => Err(format!("fork: {}", std::io::Error::last_os_error())),
        0 => loop {
            unsafe { libc::pause() };
        },
        pid => Ok(pid),
    }
}

/// Ends the worker as Python's multiprocessing does at exit: SIGTERM, then
/// wait for it (forever, as Python does).
fn end_worker(pid: libc::pid_t) -> Result<(), String> {
    let mut status = 0;
    // SAFETY: plain kill and waitpid on our own child.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
        if libc::waitpid(pid, &mut status, 0) != pid {
            return Err(format!("waitpid {pid}: {}", std::io::Error::last_os_error()));
        }
    }
    println!("worker {pid} ended by signal {}", libc::WTERMSIG(status));
    Ok(())
}

/// The pattern's byte at `offset` (the first 8 bytes hold the counter).
fn pattern(offset: u64) -> u8 {
    (offset.wrapping_mul(0x9E37_79B1) >> 7) as u8
}

fn fill(ctx: &Context, ptr: DevPtr, bytes: u64) -> Result<(), String> {
    let mut off = 0;
    while off < bytes {
        let n = (bytes - off).min(1 << 20) as usize;
        let chunk: Vec<u8> = (off..off + n as u64).map(pattern).collect();
        ctx.write(ptr, off, &chunk).map_err(|c| format!("write: {}", cuda_sim::codes::name(c)))?;
        off += n as u64;
    }
    ctx.write(ptr, 0, &0u64.to_le_bytes()).map_err(|c| format!("write: {}", cuda_sim::codes::name(c)))
}

/// Checks `len` bytes of pattern from `start` (never the counter's 8 bytes).
fn check(ctx: &Context, ptr: DevPtr, start: u64, len: u64) -> Result<(), String> {
    let start = start.max(8);
    let mut buf = vec![0u8; len as usize];
    ctx.read(ptr, start, &mut buf).map_err(|c| format!("read: {}", cuda_sim::codes::name(c)))?;
    match buf.iter().enumerate().find(|(i, b)| **b != pattern(start + *i as u64)) {
        Some((i, b)) => Err(format!("MISMATCH pattern at byte {}: {b} != {}", start + i as u64, pattern(start + i as u64))),
        None => Ok(()),
    }
}

fn step(ctx: &Context, ptr: DevPtr, bytes: u64, n: u64) -> Result<(), String> {
    let mut c = [0u8; 8];
    ctx.read(ptr, 0, &mut c).map_err(|e| format!("read: {}", cuda_sim::codes::name(e)))?;
    let count = u64::from_le_bytes(c);
    if count != n - 1 {
        return Err(format!("MISMATCH counter {count} at step {n}"));
    }
    ctx.write(ptr, 0, &n.to_le_bytes()).map_err(|e| format!("write: {}", cuda_sim::codes::name(e)))?;
    let windows = (bytes / WINDOW as u64).max(1);
    let start = (n % windows) * WINDOW as u64;
    check(ctx, ptr, start, (WINDOW as u64).min(bytes - start.max(8)))
}

fn run(o: &Opts) -> Result<(), String> {
    let ctx = Context::init()?;
    let ptr = ctx.alloc(o.device, o.bytes).map_err(|c| format!("alloc {} bytes: {}", o.bytes, cuda_sim::codes::name(c)))?;
    fill(&ctx, ptr, o.bytes)?;
    let worker = if o.fork_worker { Some(fork_worker()?) } else { None };
    if let Some(what) = &o.hold {
        hold(what)?;
        if what == "nccl-thread" {
            nccl_init(&ctx, o.nccl_setenv.as_ref());
        }
    }
    // Held to the end of the run (the binding keeps it open).
    let _kept = match &o.keep_open {
        Some(path) => Some(std::fs::OpenOptions::new().read(true).write(true).open(path).map_err(|e| format!("{path}: {e}"))?),
        None => None,
    };
    if o.signals {
        catch_term();
    }
    for n in 1..=o.steps {
        step(&ctx, ptr, o.bytes, n)?;
        println!("step {n} gpu {}", ctx.device_uuid(o.device).unwrap_or_default());
        if o.signals {
            println!("{}", signal_line());
        }
        if TERM_RECEIVED.load(std::sync::atomic::Ordering::SeqCst) {
            println!("received SIGTERM");
            let _ = std::io::stdout().flush();
            std::process::exit(128 + libc::SIGTERM);
        }
        let _ = std::io::stdout().flush();
        if n == 1 {
            if let Some(ready) = &o.ready {
                std::fs::write(ready, std::process::id().to_string()).map_err(|e| format!("{ready}: {e}"))?;
            }
        }
        std::thread::sleep(o.interval);
    }
    check(&ctx, ptr, 8, o.bytes - 8)?;
    if let Some(pid) = worker {
        end_worker(pid)?;
    }
    println!("DONE count={}", o.steps);
    Ok(())
}

/// What NCCL's init does with the transports (module docs): P2P, whose
/// CUDA IPC the r580 driver cannot restore, unless NCCL_P2P_DISABLE=1.
fn nccl_init(ctx: &Context, setenv: Option<&(String, String)>) {
    if let Some((name, value)) = setenv {
        std::env::set_var(name, value);
    }
    let p2p = std::env::var("NCCL_P2P_DISABLE").as_deref() != Ok("1");
    if p2p {
        ctx.share_with_peers();
    }
    println!("nccl transport {}", if p2p { "p2p" } else { "portable" });
}

/// Keeps what `--hold` names for the rest of the run.
fn hold(what: &str) -> Result<(), String> {
    if what.starts_with("io-uring") {
        let mut params = [0u32; 30];
        // SAFETY: io_uring_setup with a zeroed parameter block we own; the
        // descriptor is kept open on purpose. Through the C library's
        // syscall(), as libuv makes it.
        let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 4u32, params.as_mut_ptr()) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            if what == "io-uring-or-epoll" {
                println!("no io_uring ({e}): epoll");
                return Ok(());
            }
            return Err(format!("io_uring_setup: {e}"));
        }
        return Ok(());
    }
    if what == "huge-pages" {
        const LEN: usize = 64 << 20;
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        // SAFETY: a fresh anonymous mapping, kept to the end on purpose.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), LEN, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
        if p == libc::MAP_FAILED || unsafe { libc::madvise(p, LEN, libc::MADV_HUGEPAGE) } != 0 {
            return Err(format!("huge pages: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: within the mapping just made.
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0x5a, LEN) };
        println!("huge-pages at {p:p}");
        return Ok(());
    }
    if let Some(port) = what.strip_prefix("tcp-to:") {
        let port: u16 = port.parse().map_err(|_| format!("tcp-to: no port in {what:?}"))?;
        let peer = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect: {e}"))?;
        std::mem::forget(peer);
        return Ok(());
    }
    if what == "tcp-loopback" {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("listen: {e}"))?;
        let client = std::net::TcpStream::connect(listener.local_addr().map_err(|e| e.to_string())?).map_err(|e| format!("connect: {e}"))?;
        let (server, _) = listener.accept().map_err(|e| format!("accept: {e}"))?;
        // Kept open to the end on purpose.
        std::mem::forget((listener, client, server));
        return Ok(());
    }
    let name = if what == "thread" { "counter-worker" } else { "pt_nccl_watchdg" };
    std::thread::Builder::new()
        .name(name.into())
        .spawn(|| loop {
            std::thread::sleep(Duration::from_secs(3600));
        })
        .map(|_| ())
        .map_err(|e| format!("thread: {e}"))
}

fn main() {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("cuda-sim-counter: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&o) {
        println!("{e}");
        eprintln!("cuda-sim-counter: {e}");
        std::process::exit(3);
    }
    let _ = std::io::stdout().flush();
    std::process::exit(o.exit_code);
}
