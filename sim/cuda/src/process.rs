//! The CUDA process side: what a program using the simulated driver holds,
//! and the driver thread that answers checkpoint calls from other processes.
//!
//! Device memory is a file per allocation under `<dir>/gpus/<uuid>/`, held
//! open while the process runs (the analogue of /dev/nvidia* descriptors) and
//! registered in the NVML simulation's process list. Checkpoint copies each
//! file into the process's own (host) memory, closes and deletes it, and
//! removes the process from NVML: the GPU is free and the process holds no
//! device file, so CRIU can dump it. Restore writes the host copy back onto
//! the GPU it was on, or the one a UUID pair maps it to.
//!
//! The driver's state machine: RUNNING -lock-> LOCKED -checkpoint->
//! CHECKPOINTED -restore-> LOCKED -unlock-> RUNNING. While not RUNNING, every
//! memory call of the program blocks (a locked process makes no GPU calls).
//! Lock waits at most its timeout for in-flight calls (CUDA_ERROR_TIMEOUT).
//!
//! A process that shared its memory with another process through CUDA IPC
//! or peer access ([`Context::share_with_peers`], what NCCL's P2P transport
//! does) is restored as the r580 driver restores it (seen on 2×H100 and
//! 2×H200, driver 580): the checkpoint succeeds, the restore returns
//! CUDA_ERROR_NOT_SUPPORTED and leaves it checkpointed, so an unlock
//! returns CUDA_ERROR_ILLEGAL_STATE and its memory calls wait for good (the
//! job hangs). Nothing the checkpointer can see tells such a process apart.

use crate::codes::{self, state};
use crate::files::{self, Call, Published, Request, Response, SimDir};
use crate::gpus;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How often the driver thread looks for a request.
const POLL: Duration = Duration::from_millis(2);
/// How often it republishes its state unasked.
const REPUBLISH: Duration = Duration::from_millis(500);

/// A device allocation, by index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DevPtr(usize);

enum Place {
    Device { path: PathBuf, file: Arc<File> },
    /// `bytes` at `offset` of the checkpoint's host copy.
    Host { copy: Arc<HostCopy>, offset: usize },
}

/// The host memory a checkpoint copies device memory into: one private
/// anonymous mapping made at that moment with `MAP_POPULATE`, through the C
/// library's mmap, as the real driver makes it (seen on an H100: one mapping
/// the size of the process's GPU memory, flags 0x8022), so that what the
/// production side does to it (the huge-page shim, core::preempt::hugepages)
/// meets the same call here.
struct HostCopy {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is owned by this value and only reached under the
// process's Mem lock.
unsafe impl Send for HostCopy {}
unsafe impl Sync for HostCopy {}

impl HostCopy {
    fn new(len: usize) -> Option<HostCopy> {
        let len = len.max(1);
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE;
        // SAFETY: a fresh anonymous mapping, owned by the value returned.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
        (p != libc::MAP_FAILED).then_some(HostCopy { ptr: p.cast(), len })
    }

    fn bytes(&self, offset: usize, len: usize) -> &[u8] {
        assert!(offset + len <= self.len);
        // SAFETY: within the mapping (checked), which lives as long as self.
        unsafe { std::slice::from_raw_parts(self.ptr.add(offset), len) }
    }

    #[allow(clippy::mut_from_ref)] // written once, under the Mem lock, before it is shared
    fn bytes_mut(&self, offset: usize, len: usize) -> &mut [u8] {
        assert!(offset + len <= self.len);
        // SAFETY: as bytes(); the checkpoint writes each range once before
        // any reader exists.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(offset), len) }
    }
}

impl Drop for HostCopy {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

struct Alloc {
    gpu: String,
    bytes: u64,
    place: Place,
}

struct Mem {
    state: i32,
    /// Memory calls in flight.
    busy: u32,
    /// Device ordinal → GPU UUID (a restore with pairs moves them).
    devices: Vec<String>,
    /// Every GPU of the node at cuInit, CUDA_VISIBLE_DEVICES or not: what the
    /// real driver counts as the process's checkpointed GPUs (seen on
    /// 2×H200: a map must name each of them, see `restore`).
    node: Vec<String>,
    allocs: Vec<Alloc>,
    /// Its memory was shared with other processes (CUDA IPC, P2P).
    shared_with_peers: bool,
}

struct Shared {
    sim: SimDir,
    pid: i32,
    mem: Mutex<Mem>,
    cv: Condvar,
}

/// The process's CUDA context. One per process: `init` starts the driver thread.
pub struct Context {
    shared: Arc<Shared>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Mem> {
        self.mem.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Context {
    /// cuInit in the program: finds the visible GPUs and starts the driver thread.
    pub fn init() -> Result<Context, String> {
        let sim = SimDir::from_env()?;
        gpus::prune_dead(&sim);
        let devices = gpus::visible()?;
        if devices.is_empty() {
            return Err(codes::name(codes::NO_DEVICE));
        }
        let pid = std::process::id() as i32;
        files::shared_dir(&sim.proc_dir(pid))?;
        let mem = Mem { state: state::RUNNING, busy: 0, devices, node: gpus::all()?, allocs: Vec::new(), shared_with_peers: false };
        let shared = Arc::new(Shared { sim, pid, mem: Mutex::new(mem), cv: Condvar::new() });
        let (tx, rx) = std::sync::mpsc::channel();
        let s = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("cuda-sim-driver".into())
            .spawn(move || {
                let _ = tx.send(unsafe { libc::gettid() });
                driver_loop(&s)
            })
            .map_err(|e| format!("cannot start the driver thread: {e}"))?;
        let tid = rx.recv().map_err(|_| "the driver thread died".to_string())?;
        let ctx = Context { shared };
        publish(&ctx.shared, &ctx.shared.lock(), tid);
        Ok(ctx)
    }

    /// cuIpcGetMemHandle / cuCtxEnablePeerAccess in the program: its memory
    /// is mapped by other processes from now on, which the r580 driver
    /// checkpoints but cannot restore (module docs).
    pub fn share_with_peers(&self) {
        self.shared.lock().shared_with_peers = true;
    }

    /// The UUID of device ordinal `device` now.
    pub fn device_uuid(&self, device: usize) -> Option<String> {
        self.shared.lock().devices.get(device).cloned()
    }

    /// cuMemAlloc on `device`: CUDA_ERROR_OUT_OF_MEMORY when the GPU lacks room.
    pub fn alloc(&self, device: usize, bytes: u64) -> Result<DevPtr, u32> {
        let mut m = self.begin();
        let result = self.alloc_locked(&mut m, device, bytes);
        self.end(m);
        result
    }

    fn alloc_locked(&self, m: &mut Mem, device: usize, bytes: u64) -> Result<DevPtr, u32> {
        let gpu = m.devices.get(device).cloned().ok_or(codes::INVALID_DEVICE)?;
        let path = self.shared.sim.gpu_dir(&gpu).join(format!("{}-{}.mem", self.shared.pid, m.allocs.len()));
        let file = device_file(&self.shared.sim, &gpu, &path, bytes, self.shared.pid)?;
        m.allocs.push(Alloc { gpu, bytes, place: Place::Device { path, file: Arc::new(file) } });
        Ok(DevPtr(m.allocs.len() - 1))
    }

    /// cuMemcpyHtoD into `ptr` at `offset`.
    pub fn write(&self, ptr: DevPtr, offset: u64, data: &[u8]) -> Result<(), u32> {
        self.with_file(ptr, offset, data.len(), |f| f.write_all_at(data, offset))
    }

    /// cuMemcpyDtoH from `ptr` at `offset`.
    pub fn read(&self, ptr: DevPtr, offset: u64, out: &mut [u8]) -> Result<(), u32> {
        let len = out.len();
        self.with_file(ptr, offset, len, |f| f.read_exact_at(out, offset))
    }

    /// Runs one memory call: waits until the process runs, marks it busy (so
    /// Lock waits for it), does the I/O without holding the state lock.
    fn with_file(&self, ptr: DevPtr, offset: u64, len: usize, io: impl FnOnce(&File) -> std::io::Result<()>) -> Result<(), u32> {
        let m = self.begin();
        let file = match m.allocs.get(ptr.0) {
            Some(Alloc { bytes, place: Place::Device { file, .. }, .. }) if offset + len as u64 <= *bytes => Ok(Arc::clone(file)),
            Some(Alloc { place: Place::Device { .. }, .. }) | None => Err(codes::INVALID_VALUE),
            Some(Alloc { place: Place::Host { .. }, .. }) => Err(codes::ILLEGAL_STATE),
        };
        drop(m);
        let result = file.and_then(|f| io(&f).map_err(|_| codes::UNKNOWN));
        self.end(self.shared.lock());
        result
    }

    fn begin(&self) -> MutexGuard<'_, Mem> {
        let mut m = self.shared.lock();
        while m.state != state::RUNNING {
            m = self.shared.cv.wait(m).unwrap_or_else(|p| p.into_inner());
        }
        m.busy += 1;
        m
    }

    fn end(&self, mut m: MutexGuard<'_, Mem>) {
        m.busy -= 1;
        self.shared.cv.notify_all();
    }
}

/// The runtime's teardown as the program ends (cudart's exit handler
/// releases its contexts): a driver call, so it waits while the process is
/// locked or checkpointed, as a real one does. Without it a program dumped
/// after its last memory call ran on after CRIU's restore and ended during
/// the driver's restore call (seen in the churn: `DONE count=19`, then
/// `cuCheckpointProcessRestore(pid P) abandoned: pid P ended during the call`).
impl Drop for Context {
    fn drop(&mut self) {
        let m = self.begin();
        self.end(m);
    }
}

/// A new device-memory file of `bytes` on `gpu`, reserved in NVML first.
fn device_file(sim: &SimDir, gpu: &str, path: &PathBuf, bytes: u64, pid: i32) -> Result<File, u32> {
    files::shared_dir(&sim.gpu_dir(gpu)).map_err(|_| codes::UNKNOWN)?;
    match gpus::take(gpu, pid, bytes) {
        Ok(true) => {}
        Ok(false) => return Err(codes::OUT_OF_MEMORY),
        Err(_) => return Err(codes::UNKNOWN),
    }
    let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(path).and_then(|f| {
        f.set_len(bytes)?;
        Ok(f)
    });
    file.map_err(|_| {
        let _ = gpus::give_back(gpu, pid, bytes);
        codes::UNKNOWN
    })
}

/// The driver thread: answers the checkpointer's requests and republishes
/// the process's state. A CRIU dump freezes the process at any moment, and
/// a descriptor open then is in the image: reopened by path at restore, it
/// fails where the file is gone (seen in CI, 2026-11-28: a restore on the
/// other node stopped at `Can't open file .../procs/<pid>/request.json`,
/// which the thread was reading 500 times a second). So the request file is
/// watched with stat (no descriptor) and read only when it changed; the
/// answer is the last file written for a request (state published first),
/// so the checkpointer, which waits for it, never runs CRIU while the
/// thread holds a file; and a checkpointed process, as the real driver's,
/// writes no file unasked (it only makes its folder again where a restore
/// on another node left it none).
fn driver_loop(s: &Shared) {
    let tid = unsafe { libc::gettid() };
    let mut last = 0u64;
    let mut seen = None;
    let mut published = Instant::now();
    loop {
        let dir = s.sim.proc_dir(s.pid);
        let request = dir.join("request.json");
        let now = stamp(&request);
        if now.is_some() && now != seen {
            seen = now;
            if let Some(req) = files::read_json::<Request>(&request).filter(|r| r.id != last) {
                last = req.id;
                let (code, value) = handle(s, &req.call, tid);
                // After a CRIU restore on another node the folder may be new.
                let _ = files::shared_dir(&dir);
                publish(s, &s.lock(), tid);
                published = Instant::now();
                let _ = files::write_json(&dir.join("response.json"), &Response { id: req.id, code, value });
            }
        } else if published.elapsed() > REPUBLISH {
            // The folder, made again after a restore on another node (a
            // mkdir: no descriptor), is where the checkpointer finds us.
            let _ = files::shared_dir(&dir);
            if s.lock().state != state::CHECKPOINTED {
                publish(s, &s.lock(), tid);
            }
            published = Instant::now();
        }
        std::thread::sleep(POLL);
    }
}

/// What tells a rewritten request file from the last one read, without
/// opening it: its inode (each request is a new file renamed over it), size
/// and change time.
fn stamp(path: &std::path::Path) -> Option<(u64, u64, i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.ino(), m.size(), m.ctime(), m.ctime_nsec()))
}

fn publish(s: &Shared, m: &Mem, tid: i32) {
    let memory = m.allocs.iter().map(|a| (a.gpu.clone(), a.bytes)).collect();
    let p = Published { pid: s.pid, start_time: files::start_time(s.pid).unwrap_or(0), state: m.state, restore_tid: tid, memory };
    let _ = files::write_json(&s.sim.proc_dir(s.pid).join("state.json"), &p);
}

fn handle(s: &Shared, call: &Call, tid: i32) -> (u32, i64) {
    let code = match call {
        Call::State => return (codes::SUCCESS, s.lock().state as i64),
        Call::RestoreThreadId => return (codes::SUCCESS, tid as i64),
        Call::Lock { timeout_ms } => lock(s, *timeout_ms),
        Call::Checkpoint => checkpoint(s),
        Call::Restore { pairs } => restore(s, pairs),
        Call::Unlock => transition(s, state::LOCKED, state::RUNNING),
    };
    (code, 0)
}

fn transition(s: &Shared, from: i32, to: i32) -> u32 {
    let mut m = s.lock();
    if m.state != from {
        return codes::ILLEGAL_STATE;
    }
    m.state = to;
    s.cv.notify_all();
    codes::SUCCESS
}

/// New calls block from now on; in-flight ones get `timeout_ms` to finish.
fn lock(s: &Shared, timeout_ms: u32) -> u32 {
    let mut m = s.lock();
    if m.state != state::RUNNING {
        return codes::ILLEGAL_STATE;
    }
    m.state = state::LOCKED;
    let deadline = Instant::now() + Duration::from_millis(timeout_ms.into());
    while m.busy > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            m.state = state::RUNNING;
            s.cv.notify_all();
            return codes::TIMEOUT;
        }
        m = s.cv.wait_timeout(m, left).unwrap_or_else(|p| p.into_inner()).0;
    }
    codes::SUCCESS
}

/// The real driver moves memory between the GPU and its checkpoint buffer
/// through staging memory of its own, with the C library's `memcpy`, 2 MiB
/// at a time (seen on an H200: tools/ckpt-bench/apps/memcpy_probe.c). This
/// one does too, so that what the production side does to those copies (the
/// shim splits them across threads, hugepages/src/copy.rs) meets the same
/// calls.
const STAGING: usize = 2 << 20;

/// `dst` from the start of `file`, through the staging memory.
fn read_staged(file: &File, dst: &mut [u8]) -> std::io::Result<()> {
    let mut staging = vec![0u8; STAGING.min(dst.len())];
    let mut at = 0;
    while at < dst.len() {
        let n = staging.len().min(dst.len() - at);
        file.read_exact_at(&mut staging[..n], at as u64)?;
        dst[at..at + n].copy_from_slice(&staging[..n]);
        at += n;
    }
    Ok(())
}

/// `src` to the start of `file`, through the staging memory.
fn write_staged(file: &File, src: &[u8]) -> std::io::Result<()> {
    let mut staging = vec![0u8; STAGING.min(src.len())];
    let mut at = 0;
    while at < src.len() {
        let n = staging.len().min(src.len() - at);
        staging[..n].copy_from_slice(&src[at..at + n]);
        file.write_all_at(&staging[..n], at as u64)?;
        at += n;
    }
    Ok(())
}

/// Device memory → host memory; the GPU and every device file are released.
fn checkpoint(s: &Shared) -> u32 {
    let mut m = s.lock();
    if m.state != state::LOCKED {
        return codes::ILLEGAL_STATE;
    }
    // Copy everything first: a failed read changes nothing.
    let total: u64 = m.allocs.iter().map(|a| a.bytes).sum();
    let Some(copy) = HostCopy::new(total as usize).map(Arc::new) else { return codes::OUT_OF_MEMORY };
    let mut offsets = Vec::new();
    let mut offset = 0usize;
    for a in &m.allocs {
        let Place::Device { file, .. } = &a.place else { return codes::ILLEGAL_STATE };
        if read_staged(file, copy.bytes_mut(offset, a.bytes as usize)).is_err() {
            return codes::UNKNOWN;
        }
        offsets.push(offset);
        offset += a.bytes as usize;
    }
    for (a, offset) in m.allocs.iter_mut().zip(offsets) {
        if let Place::Device { path, .. } = std::mem::replace(&mut a.place, Place::Host { copy: Arc::clone(&copy), offset }) {
            let _ = std::fs::remove_file(&path);
        }
        let _ = gpus::give_back(&a.gpu, s.pid, a.bytes);
    }
    m.state = state::CHECKPOINTED;
    codes::SUCCESS
}

/// Host memory → the GPU it came from or the one `pairs` maps it to. Every
/// GPU of the node the process started on must be mapped when pairs are
/// given, not only those holding its memory (the real driver's rule, seen on
/// 2×H200 with driver 580: CUDA_ERROR_INVALID_VALUE otherwise); a GPU without
/// room leaves the process checkpointed.
fn restore(s: &Shared, pairs: &[(String, String)]) -> u32 {
    let mut m = s.lock();
    if m.state != state::CHECKPOINTED {
        return codes::ILLEGAL_STATE;
    }
    if m.shared_with_peers {
        // r580 with CUDA IPC: refused, the process stays checkpointed.
        return codes::NOT_SUPPORTED;
    }
    let target = |gpu: &str| -> Option<String> {
        if pairs.is_empty() {
            return Some(gpu.to_string());
        }
        pairs.iter().find(|(old, _)| old == gpu).map(|(_, new)| new.clone())
    };
    if !pairs.is_empty() && m.node.iter().any(|g| target(g).is_none()) {
        return codes::INVALID_VALUE;
    }
    let mut allocs = Vec::new();
    for a in &m.allocs {
        let Some(new) = target(&a.gpu) else { return codes::INVALID_VALUE };
        if !gpus::exists(&new).unwrap_or(false) {
            return codes::INVALID_DEVICE;
        }
        allocs.push(new);
    }
    // Ordinals follow their GPU; one the process holds nothing on may stay unmapped.
    let devices: Vec<String> = m.devices.iter().map(|d| target(d).unwrap_or_else(|| d.clone())).collect();
    let mut placed: Vec<(usize, String, PathBuf, File)> = Vec::new();
    for (i, (a, new)) in m.allocs.iter().zip(&allocs).enumerate() {
        let Place::Host { copy, offset } = &a.place else { return codes::ILLEGAL_STATE };
        let buf = copy.bytes(*offset, a.bytes as usize);
        let path = s.sim.gpu_dir(new).join(format!("{}-{i}.mem", s.pid));
        let file = device_file(&s.sim, new, &path, a.bytes, s.pid).and_then(|f| write_staged(&f, buf).map(|_| f).map_err(|_| codes::UNKNOWN));
        match file {
            Ok(f) => placed.push((i, new.clone(), path, f)),
            Err(code) => {
                for (j, gpu, path, _) in placed {
                    let _ = std::fs::remove_file(&path);
                    let _ = gpus::give_back(&gpu, s.pid, m.allocs[j].bytes);
                }
                return code;
            }
        }
    }
    m.devices = devices;
    m.node = m.node.iter().map(|g| target(g).unwrap_or_else(|| g.clone())).collect();
    for (i, gpu, path, file) in placed {
        m.allocs[i].gpu = gpu;
        m.allocs[i].place = Place::Device { path, file: Arc::new(file) };
    }
    m.state = state::LOCKED;
    codes::SUCCESS
}
