//! Several threads for the driver's copies into and out of its checkpoint
//! buffer (issue 39).
//!
//! # Why
//!
//! Once the buffer's pages exist (the [`crate::pool`], or huge pages), what
//! is left of the time to free the GPU is the driver's own copy: one CPU
//! thread of the driver moves the GPU memory from its staging memory into
//! the buffer at 5.6-5.8 GiB/s, and the restore moves it back at 6.3-7.8
//! GiB/s (an H200 VM, docs/preempt.md "Host memory pool"), while the copy
//! engine delivers 50 GiB/s and the node has idle cores. That thread copies
//! with the C library's `memcpy` (libcuda.so imports it), in pieces of 2
//! MiB: a preloaded `memcpy` reaches it, and no setting of the driver does.
//! Measured on the H200 (an 11 GiB buffer served from the pool,
//! tools/ckpt-bench/apps/ckpt_diag.py): the checkpoint 1.58-1.76 s with one
//! thread, 0.67-0.70 s with 8 (16: no faster); the restore 1.45-1.58 s
//! against 0.70-0.72 s. Under Slurm an 8 GiB PyTorch job's GPU was free 0.7 s
//! after the signal (docs/preempt.md, "Copy threads").
//!
//! # What it does, and nothing else
//!
//! The shim defines `memcpy`. A copy of at least [`SPLIT_MIN`] bytes whose
//! destination or source lies inside a buffer the shim saw made (the
//! driver's: [`buffer_made`], called for each `MAP_POPULATE` mapping the
//! shim advises or lends from its pool) is split into equal shares, one per
//! thread: the caller's and up to `GPU_MODE_COPY_THREADS - 1` helpers
//! (default [`DEFAULT_THREADS`], never more than the CPUs the process may
//! run on), each with the C library's `memcpy`; it returns when every share
//! is copied. Every other copy goes straight to the C library's `memcpy`:
//! one comparison and a jump more (about 1 ns a call). The helpers start at the first split copy, in the
//! process that makes it (a CUDA process being checkpointed), and wait on a
//! condition variable between copies; a process forked from it has none
//! and copies alone. One split copy at a time: another one meanwhile (a
//! second GPU's buffer) is copied by its own thread, as before.
//!
//! The bytes are the same, in the same place: only the threads differ. The
//! helpers are the job's threads, on the job's CPUs, charged to its cgroup;
//! they exist only in processes whose buffer was copied, and CRIU dumps and
//! restores them idle, with the rest of the process.

use libc::{c_void, size_t};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

/// Below this a copy is not split: the driver's pieces are 2 MiB.
pub const SPLIT_MIN: usize = 1 << 20;
/// Threads that copy one piece, the caller's included, unless told.
pub const DEFAULT_THREADS: usize = 8;
/// The most `GPU_MODE_COPY_THREADS` may ask.
pub const MAX_THREADS: usize = 64;
/// Each share is a whole number of pages.
const SHARE_ALIGN: usize = 4096;
/// Buffers tracked at once (the driver makes one per checkpoint of a
/// process; a process with contexts on several GPUs, one per context).
const SLOTS: usize = 8;

type MemcpyFn = unsafe extern "C" fn(*mut c_void, *const c_void, size_t) -> *mut c_void;

static REAL_MEMCPY: AtomicUsize = AtomicUsize::new(0);
/// Threads per split copy, the caller's included: 1 is off.
static THREADS: AtomicUsize = AtomicUsize::new(1);
/// The process whose helpers run; a forked child has none.
static OWNER: AtomicI32 = AtomicI32::new(0);
static HELPERS: AtomicUsize = AtomicUsize::new(0);

/// The buffers: start and length, 0 when free.
static STARTS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
static LENS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
/// What was copied into and out of each buffer by split copies, and the
/// microseconds those copies took: its log line at unmap.
static INTO: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
static OUT_OF: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
static MICROS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];

/// One split copy, as the helpers read it.
#[derive(Clone, Copy)]
struct Job {
    dst: usize,
    src: usize,
    len: usize,
    share: usize,
}

struct Shared {
    generation: u64,
    job: Job,
    pending: usize,
}

static SHARED: Mutex<Shared> = Mutex::new(Shared { generation: 0, job: Job { dst: 0, src: 0, len: 0, share: 0 }, pending: 0 });
static GO: Condvar = Condvar::new();
static DONE: Condvar = Condvar::new();
/// Held for one split copy.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// `GPU_MODE_COPY_THREADS`'s value: decimal, 1 to [`MAX_THREADS`] (1: the
/// driver's thread alone); anything else is [`DEFAULT_THREADS`].
pub fn parse_threads(text: Option<&[u8]>) -> usize {
    crate::decimal(text, 3).filter(|n| (1..=MAX_THREADS).contains(n)).unwrap_or(DEFAULT_THREADS)
}

/// At load: the C library's memcpy and the thread count (the CPUs the
/// process may run on bound it).
pub(crate) fn init(threads: Option<&[u8]>) {
    crate::next_definition(&REAL_MEMCPY, c"memcpy");
    THREADS.store(parse_threads(threads).min(cpus_allowed()).max(1), Ordering::Relaxed);
}

fn cpus_allowed() -> usize {
    // SAFETY: a zeroed cpu_set_t filled by the kernel.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return 1;
        }
        libc::CPU_COUNT(&set).max(1) as usize
    }
}

/// The shares of a copy of `len` bytes among `threads` threads: each a whole
/// number of pages, the last one what is left (some may be empty).
pub fn share_of(len: usize, threads: usize) -> usize {
    len.div_ceil(threads.max(1)).next_multiple_of(SHARE_ALIGN)
}

/// Share `index` of `job`: its offset and length (0 past the end).
fn part(job: &Job, index: usize) -> (usize, usize) {
    let offset = job.share.saturating_mul(index);
    (offset, job.len.saturating_sub(offset).min(job.share))
}

/// Whether `[start, start + len)` meets the buffer `[base, base + blen)`.
pub fn meets(start: usize, len: usize, base: usize, blen: usize) -> bool {
    blen != 0 && start < base.saturating_add(blen) && start.saturating_add(len) > base
}

/// The driver's buffer was just made (or lent from the pool) at `addr`.
pub(crate) fn buffer_made(addr: usize, len: usize) {
    if THREADS.load(Ordering::Relaxed) < 2 {
        return;
    }
    for i in 0..SLOTS {
        if STARTS[i].compare_exchange(0, addr, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            INTO[i].store(0, Ordering::Relaxed);
            OUT_OF[i].store(0, Ordering::Relaxed);
            MICROS[i].store(0, Ordering::Relaxed);
            LENS[i].store(len, Ordering::Release);
            return;
        }
    }
}

/// `[addr, addr + len)` is being unmapped: a buffer inside it is no longer
/// one (its line is logged).
pub(crate) fn unmapping(addr: usize, len: usize) {
    for i in 0..SLOTS {
        let (base, blen) = (STARTS[i].load(Ordering::Acquire), LENS[i].load(Ordering::Acquire));
        if base != 0 && meets(addr, len, base, blen) {
            log_buffer(blen, INTO[i].load(Ordering::Relaxed), OUT_OF[i].load(Ordering::Relaxed), MICROS[i].load(Ordering::Relaxed));
            LENS[i].store(0, Ordering::Release);
            STARTS[i].store(0, Ordering::Release);
        }
    }
}

/// The slot of the buffer a copy writes into (`true`) or reads from.
fn buffer_of(dst: usize, src: usize, len: usize) -> Option<(usize, bool)> {
    (0..SLOTS).find_map(|i| {
        let (base, blen) = (STARTS[i].load(Ordering::Acquire), LENS[i].load(Ordering::Acquire));
        if meets(dst, len, base, blen) {
            Some((i, true))
        } else if meets(src, len, base, blen) {
            Some((i, false))
        } else {
            None
        }
    })
}

fn real_memcpy(dst: usize, src: usize, len: usize) {
    let mut f = REAL_MEMCPY.load(Ordering::Acquire);
    if f == 0 {
        f = resolve();
    }
    match f {
        0 => byte_copy(dst, src, len),
        // SAFETY: the C library's memcpy, found by name; the caller's ranges.
        f => unsafe {
            std::mem::transmute::<usize, MemcpyFn>(f)(dst as *mut c_void, src as *const c_void, len);
        },
    }
}

static RESOLVING: AtomicBool = AtomicBool::new(false);

/// The C library's memcpy, asked for before this library's constructor ran
/// (another library's constructor copies): looked up now, unless a lookup
/// is under way (dlsym may copy, on this thread or another), whose copies
/// go byte by byte.
#[cold]
fn resolve() -> usize {
    if RESOLVING.swap(true, Ordering::AcqRel) {
        return 0;
    }
    let f = crate::next_definition(&REAL_MEMCPY, c"memcpy");
    RESOLVING.store(false, Ordering::Release);
    f
}

/// While the C library's memcpy is being looked up: byte by byte.
/// Volatile, so that the compiler does not make a call to memcpy of it.
fn byte_copy(dst: usize, src: usize, len: usize) {
    for i in 0..len {
        // SAFETY: the caller's ranges, as memcpy's.
        unsafe { std::ptr::write_volatile((dst + i) as *mut u8, std::ptr::read_volatile((src + i) as *const u8)) };
    }
}

/// Copies `len` bytes with the helpers, when the copy is one to split and
/// they can take it; false: the caller copies alone.
fn split(dst: usize, src: usize, len: usize) -> bool {
    let threads = THREADS.load(Ordering::Relaxed);
    if threads < 2 || len < SPLIT_MIN || meets(dst, len, src, len) {
        return false;
    }
    let Some((slot, into)) = buffer_of(dst, src, len) else { return false };
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    let Ok(_one) = ONE_AT_A_TIME.try_lock() else { return false };
    let owner = OWNER.load(Ordering::Acquire);
    if owner == 0 {
        start_helpers(threads - 1);
        OWNER.store(me, Ordering::Release);
    } else if owner != me {
        return false; // a forked child: no helpers here
    }
    let helpers = HELPERS.load(Ordering::Acquire);
    if helpers == 0 {
        return false;
    }
    let t0 = crate::pool::now_us();
    let job = Job { dst, src, len, share: share_of(len, helpers + 1) };
    {
        let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        shared.job = job;
        shared.pending = helpers;
        shared.generation = shared.generation.wrapping_add(1);
    }
    GO.notify_all();
    let (offset, n) = part(&job, 0);
    real_memcpy(dst + offset, src + offset, n);
    let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    while shared.pending != 0 {
        shared = DONE.wait(shared).unwrap_or_else(|e| e.into_inner());
    }
    drop(shared);
    (if into { &INTO[slot] } else { &OUT_OF[slot] }).fetch_add(len, Ordering::Relaxed);
    MICROS[slot].fetch_add(crate::pool::now_us() - t0, Ordering::Relaxed);
    true
}

fn start_helpers(n: usize) {
    for index in 1..=n {
        // SAFETY: a detached thread running `helper` with its share's index.
        let started = unsafe {
            let mut thread: libc::pthread_t = 0;
            let mut attr: libc::pthread_attr_t = std::mem::zeroed();
            libc::pthread_attr_init(&mut attr);
            libc::pthread_attr_setdetachstate(&mut attr, libc::PTHREAD_CREATE_DETACHED);
            libc::pthread_attr_setstacksize(&mut attr, 64 * 1024);
            let rc = libc::pthread_create(&mut thread, &attr, helper, index as *mut c_void);
            libc::pthread_attr_destroy(&mut attr);
            rc == 0
        };
        if !started {
            break;
        }
        HELPERS.store(index, Ordering::Release);
    }
}

/// A helper: copies share `index` of each job, then says so.
extern "C" fn helper(index: *mut c_void) -> *mut c_void {
    let index = index as usize;
    // No signal handler runs here: one that copied into the buffer would
    // wait for this very thread.
    // SAFETY: a full set, applied to this thread.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
    }
    // The helpers start before the first job is posted (generation 1).
    let mut seen = 0u64;
    loop {
        let job = {
            let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
            while shared.generation == seen {
                shared = GO.wait(shared).unwrap_or_else(|e| e.into_inner());
            }
            seen = shared.generation;
            shared.job
        };
        let (offset, n) = part(&job, index);
        if n != 0 {
            real_memcpy(job.dst + offset, job.src + offset, n);
        }
        let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        shared.pending -= 1;
        if shared.pending == 0 {
            DONE.notify_one();
        }
    }
}

/// `gpu-mode-copy: buffer 11228 MiB, 11228 MiB in and 11228 MiB out by 8
/// threads in 1012345 us at t=...`.
fn log_buffer(len: usize, into: usize, out_of: usize, us: usize) {
    if !crate::logging() || into + out_of == 0 {
        return;
    }
    let mut buf = [0u8; 200];
    let mut at = crate::put(&mut buf, 0, b"gpu-mode-copy: buffer ");
    at = crate::put_mib(&mut buf, at, len, b" MiB, ");
    at = crate::put_mib(&mut buf, at, into, b" MiB in and ");
    at = crate::put_mib(&mut buf, at, out_of, b" MiB out by ");
    at = crate::put_number(&mut buf, at, HELPERS.load(Ordering::Relaxed) + 1, 10);
    at = crate::put(&mut buf, at, b" threads in ");
    crate::pool::write_line(&mut buf, at, us);
}

/// `memcpy(3)` as the C library does it, split across threads where it
/// copies into or out of the driver's buffer (see the module docs).
///
/// # Safety
/// As `memcpy(3)`.
#[no_mangle]
pub unsafe extern "C" fn memcpy(dst: *mut c_void, src: *const c_void, len: size_t) -> *mut c_void {
    // The common case, every small copy of the process: a tail call of the
    // C library's, one comparison and one jump more than calling it directly.
    let f = REAL_MEMCPY.load(Ordering::Relaxed);
    if len < SPLIT_MIN && f != 0 {
        // SAFETY: the C library's memcpy, found by name; the caller's ranges.
        return std::mem::transmute::<usize, MemcpyFn>(f)(dst, src, len);
    }
    large_or_early(dst, src, len)
}

/// A copy of [`SPLIT_MIN`] or more (split where it meets a buffer), or one
/// before the C library's memcpy is known.
#[inline(never)]
fn large_or_early(dst: *mut c_void, src: *const c_void, len: size_t) -> *mut c_void {
    if len < SPLIT_MIN || !split(dst as usize, src as usize, len) {
        real_memcpy(dst as usize, src as usize, len);
    }
    dst
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_thread_count_is_decimal_between_1_and_64() {
        let cases: &[(Option<&[u8]>, usize)] = &[
            (None, DEFAULT_THREADS),
            (Some(b"1"), 1),
            (Some(b"4"), 4),
            (Some(b"64"), 64),
            (Some(b"0"), DEFAULT_THREADS),
            (Some(b"65"), DEFAULT_THREADS),
            (Some(b""), DEFAULT_THREADS),
            (Some(b"-2"), DEFAULT_THREADS),
            (Some(b"8x"), DEFAULT_THREADS),
            (Some(b"0008"), DEFAULT_THREADS),
        ];
        for (text, want) in cases {
            assert_eq!(parse_threads(*text), *want, "{:?}", text.map(String::from_utf8_lossy));
        }
    }

    #[test]
    fn the_shares_cover_the_copy_in_whole_pages() {
        let cases: &[(usize, usize)] = &[(2 << 20, 8), (2 << 20, 3), ((2 << 20) + 1, 8), (1 << 20, 64), (5 << 20, 1)];
        for &(len, threads) in cases {
            let job = Job { dst: 0, src: 0, len, share: share_of(len, threads) };
            assert_eq!(job.share % SHARE_ALIGN, 0, "{len} over {threads}");
            let mut next = 0;
            for i in 0..threads {
                let (offset, n) = part(&job, i);
                if n != 0 {
                    assert_eq!(offset, next, "{len} over {threads}: share {i} starts where the last ended");
                    next = offset + n;
                }
            }
            assert_eq!(next, len, "{len} over {threads}: every byte in one share");
        }
    }

    #[test]
    fn a_copy_is_the_buffers_when_it_meets_it() {
        let (base, blen) = (0x10000, 0x4000);
        let cases: &[(usize, usize, bool)] = &[
            (0x10000, 0x1000, true),
            (0x13fff, 0x1000, true),
            (0xf000, 0x1001, true),
            (0xf000, 0x1000, false),
            (0x14000, 0x1000, false),
            (0x0, usize::MAX, true),
        ];
        for &(start, len, want) in cases {
            assert_eq!(meets(start, len, base, blen), want, "{start:#x}+{len:#x}");
        }
        assert!(!meets(0x10000, 0x1000, base, 0), "a free slot meets nothing");
    }
}
