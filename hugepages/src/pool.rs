//! A pool of host memory populated before the checkpoint (issue 39): the
//! driver's checkpoint buffer is served from memory whose pages already
//! exist, so that freeing the GPU is the driver's copy alone, without the
//! kernel's page supply before it.
//!
//! # Why
//!
//! The driver's checkpoint makes its buffer with `mmap(MAP_POPULATE)` at the
//! moment of the checkpoint, and the kernel hands one thread fresh pages at
//! 5-7 GiB/s at best (2 MiB pages): on an H200, 1.5-2.2 s of a 3.5-4.5 s
//! checkpoint of 11 GiB went there, the rest to the driver's own copy
//! (docs/preempt.md, "Host memory pool"). Pages populated before the signal
//! take the supply out of the path between the signal and a free GPU. Only
//! the process itself can hand the driver such pages (the buffer is the
//! process's own memory), so the shim keeps them: this module.
//!
//! # What it does
//!
//! When told a size (`GPU_MODE_POOL_MIB`, fixed, or a size link the agent
//! writes in `GPU_MODE_POOL_DIR`, see [`read_want`]), a thread of the shim
//! (started at once for a fixed size, else when the process first maps a
//! GPU file, see [`gpu_file_mapped`]) reserves address space (`PROT_NONE`,
//! `MAP_NORESERVE`, `MADV_DONTFORK`: a forked child has none of it), and
//! keeps a prefix of it writable, advised `MADV_HUGEPAGE` and populated, 64
//! MiB at a time, as the size asked grows or shrinks. The next private
//! anonymous writable `MAP_POPULATE` mapping of at least the shim's
//! threshold, made without an address (the driver's checkpoint buffer:
//! flags 0x8022), is the pool's start: what the pool lacks is made writable
//! and populated there and then, what it has beyond the request is given
//! back to the kernel (so that CRIU does not dump it), and the caller gets
//! memory that is zero and populated, as `MAP_POPULATE` gives. When the
//! driver unmaps that buffer (its restore frees it), the thread unmaps it
//! (off the restore's path) and builds a new pool: fresh pages are zero,
//! so nothing the previous buffer held can reach the next one.
//!
//! The pool is the process's own memory: charged to the job's cgroup, in
//! its RSS, and visible in /proc/<pid>/smaps as the anonymous mapping with
//! VmFlags `dc nr` (and `hg`), named `[anon:gpu-mode-pool]` where the kernel names
//! mappings (CONFIG_ANON_VMA_NAME).
//!
//! The hook side never allocates and never blocks longer than one 64 MiB
//! step of the thread (a mutex the thread holds for one step).

use libc::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicUsize, Ordering};
use std::sync::Mutex;

const MIB: usize = 1 << 20;
const HUGE_PAGE: usize = 2 * MIB;
/// What the thread populates between two looks at the pool's state.
const STEP: usize = 64 * MIB;

/// No pool (not asked, or being rebuilt).
const NONE: u8 = 0;
/// The reservation exists; the thread fills it up to [`WANT`].
const FILLING: u8 = 1;
/// The pool's start is the driver's buffer: nothing is filled until it is
/// unmapped.
const LENT: u8 = 2;
/// The driver unmapped its buffer; the thread does it for it (off the
/// restore's path: 0.1-0.15 s for 11 GiB on the H200) and builds anew.
const FREEING: u8 = 3;

static STATE: AtomicU8 = AtomicU8::new(NONE);
/// The process the pool belongs to: a forked child has none of its memory
/// (`MADV_DONTFORK`) and must not hand it out.
static OWNER: AtomicI32 = AtomicI32::new(0);
static BASE: AtomicUsize = AtomicUsize::new(0);
static RESERVED: AtomicUsize = AtomicUsize::new(0);
/// `[BASE, BASE + WRITABLE)` is writable and advised.
static WRITABLE: AtomicUsize = AtomicUsize::new(0);
/// `[BASE, BASE + POPULATED)` has its pages.
static POPULATED: AtomicUsize = AtomicUsize::new(0);
/// The size asked for, in bytes.
static WANT: AtomicUsize = AtomicUsize::new(0);
/// The length of the buffer lent.
static LENT_LEN: AtomicUsize = AtomicUsize::new(0);
/// Held by the thread for one step, and by the hook while it takes the pool.
static STEP_LOCK: Mutex<()> = Mutex::new(());

/// `GPU_MODE_POOL_MIB`'s value in bytes: decimal MiB, rounded up to whole
/// huge pages; 0 (no pool) for anything else.
pub fn parse_pool_mib(text: Option<&[u8]>) -> usize {
    crate::decimal(text, 8).map_or(0, |mib| (mib * MIB).next_multiple_of(HUGE_PAGE))
}

/// The address space reserved for a pool of `want` bytes: room for the
/// driver's buffer to outgrow it by half (what the pool lacks is populated
/// at the checkpoint, in place), plus one huge page to align the start.
pub fn reservation_for(want: usize) -> usize {
    (want + want / 2).next_multiple_of(HUGE_PAGE).max(256 * MIB) + HUGE_PAGE
}

/// What [`take`] does with a request of `len` bytes for a pool reserved for
/// `reserved` bytes, writable for `writable`: the bytes to make writable
/// after `writable` (the request beyond the pool), and the bytes given back
/// after the request (the pool beyond it).
pub fn plan_take(len: usize, writable: usize, reserved: usize) -> Option<(usize, usize)> {
    (len <= reserved).then(|| (len.saturating_sub(writable), writable.saturating_sub(len)))
}

/// Where the agent tells this process its pool's size: `<dir>/<pid>`, a
/// symbolic link whose target is the size in decimal MiB. A link, read with
/// `readlink`, because that holds no descriptor: a descriptor open when CRIU
/// freezes the process would be dumped and would need the file at restore.
const DIR_CAP: usize = 256;
static mut SIZE_PATH: [u8; DIR_CAP + 16] = [0; DIR_CAP + 16];
static SIZE_PATH_LEN: AtomicUsize = AtomicUsize::new(0);

/// How often the thread looks at its state, and every how many looks it
/// reads the size the agent asks.
const TICK_MS: u64 = 200;
const TICKS_PER_READ: u32 = 10;
/// A size link missing this many reads in a row (16 s) means no pool: a
/// restored process keeps its pool while the requeued run's agent comes up
/// and writes the link again.
const MISSING_READS: u32 = 8;
/// A pool this much larger than asked is cut down; less is left.
const SHRINK_SLACK: usize = 256 * MIB;

/// At load: the size from the environment (`GPU_MODE_POOL_MIB`, fixed, for
/// this process only: its thread starts now) or where to read it
/// (`GPU_MODE_POOL_DIR`, for every process of the job: the thread starts
/// when the process first maps a GPU file, or now with `eager`,
/// `GPU_MODE_POOL_EAGER=1`).
pub(crate) fn init(pool_mib: Option<&[u8]>, pool_dir: Option<&[u8]>, eager: bool) {
    let want = parse_pool_mib(pool_mib);
    if want > 0 {
        WANT.store(want, Ordering::Relaxed);
        // The size is this process's: a program it starts (a compiler, a
        // shell) does not inherit it. At load, before the program's threads
        // exist.
        // SAFETY: no other thread reads the environment yet.
        unsafe { libc::unsetenv(c"GPU_MODE_POOL_MIB".as_ptr()) };
    } else if !pool_dir.is_some_and(set_size_dir) {
        return;
    } else if !eager {
        // Only a process that uses the GPU gets a thread: the first mapping
        // of a GPU file starts it (`gpu_file_mapped`). A thread in every
        // process of the job would break programs that must be
        // single-threaded (unshare of a user namespace: rootless container
        // tools).
        LAZY.store(true, Ordering::Release);
        return;
    }
    start_thread();
}

/// The thread is not started yet: the first mapping of a GPU file starts it.
static LAZY: AtomicBool = AtomicBool::new(false);

/// Called from the mmap hook for a shared mapping of descriptor `fd`,
/// before it is made: the first one of a GPU file (a path under the
/// prefixes of fork.rs: the CUDA driver maps /dev/nvidiactl and
/// /dev/nvidia<N> as it starts) starts the pool's thread. Safe where it is
/// called: no allocator maps a device file, so the caller holds none of
/// the C library's locks that thread creation takes.
pub(crate) fn gpu_file_mapped(fd: c_int) {
    if !LAZY.load(Ordering::Acquire) || fd < 0 {
        return;
    }
    let mut link = [0u8; 32];
    let mut at = crate::put(&mut link, 0, b"/proc/self/fd/");
    at = crate::put_number(&mut link, at, fd as usize, 10);
    link[at.min(link.len() - 1)] = 0;
    let mut target = [0u8; 256];
    // SAFETY: a NUL-terminated path and a buffer of its length.
    let n = unsafe { libc::readlink(link.as_ptr().cast(), target.as_mut_ptr().cast(), target.len()) };
    if n > 0 && crate::fork::is_dropped(&target[..n as usize], crate::fork::prefixes()) && LAZY.swap(false, Ordering::AcqRel) {
        start_thread();
    }
}

fn start_thread() {
    // SAFETY: a thread running `keep_pool`, which takes no argument.
    unsafe {
        let mut thread: libc::pthread_t = 0;
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        libc::pthread_attr_init(&mut attr);
        libc::pthread_attr_setdetachstate(&mut attr, libc::PTHREAD_CREATE_DETACHED);
        libc::pthread_attr_setstacksize(&mut attr, 256 * 1024);
        libc::pthread_create(&mut thread, &attr, keep_pool, std::ptr::null_mut());
        libc::pthread_attr_destroy(&mut attr);
    }
}

/// Keeps `<dir>/` for [`read_want`]; false (no pool) for a path that is not
/// absolute or too long.
fn set_size_dir(dir: &[u8]) -> bool {
    if !dir.starts_with(b"/") || dir.len() > DIR_CAP || dir.contains(&0) {
        return false;
    }
    // SAFETY: written once at load, before the thread that reads it exists.
    unsafe {
        let path = &mut *std::ptr::addr_of_mut!(SIZE_PATH);
        path[..dir.len()].copy_from_slice(dir);
        path[dir.len()] = b'/';
    }
    SIZE_PATH_LEN.store(dir.len() + 1, Ordering::Release);
    true
}

/// The size the agent asks for this process, in bytes: 0 when it asks none
/// (no link: the process holds no GPU memory, or the agent is not there).
fn read_want(pid: i32) -> usize {
    let dir_len = SIZE_PATH_LEN.load(Ordering::Acquire);
    let mut path = [0u8; DIR_CAP + 16];
    // SAFETY: SIZE_PATH is only written before the thread started.
    path[..dir_len].copy_from_slice(unsafe { &(&*std::ptr::addr_of!(SIZE_PATH))[..dir_len] });
    let end = crate::put_number(&mut path, dir_len, pid as usize, 10);
    path[end] = 0;
    let mut target = [0u8; 16];
    // SAFETY: a NUL-terminated path and a buffer of its length.
    let n = unsafe { libc::readlink(path.as_ptr().cast(), target.as_mut_ptr().cast(), target.len()) };
    if n <= 0 {
        return 0;
    }
    parse_pool_mib(Some(&target[..n as usize]))
}

pub(crate) fn now_us() -> usize {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: writes the timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as usize * 1_000_000 + ts.tv_nsec as usize / 1000
}

fn sleep_ms(ms: u64) {
    let ts = libc::timespec { tv_sec: (ms / 1000) as libc::time_t, tv_nsec: ((ms % 1000) * 1_000_000) as libc::c_long };
    // SAFETY: sleeps; an interruption (CRIU's seize) only shortens it.
    unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
}

/// The size to keep after a read of the link (`None`: as it was), and the
/// reads missing in a row since.
pub fn after_read(read: usize, missing: u32) -> (Option<usize>, u32) {
    match read {
        0 if missing + 1 < MISSING_READS => (None, missing + 1),
        0 => (Some(0), MISSING_READS),
        want => (Some(want), 0),
    }
}

/// What the thread does next, from the pool's state and the sizes.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    Wait,
    Reserve,
    Fill,
    Shrink,
    /// Everything goes back: no pool is asked, or the one asked does not
    /// fit the reservation (made anew on the next turn).
    Release,
    /// The driver unmapped its buffer: the thread unmaps it.
    Free,
}

/// The thread's decision table.
pub fn next(state: u8, want: usize, populated: usize, reserved: usize) -> Next {
    match state {
        NONE if want > 0 => Next::Reserve,
        FILLING if want == 0 || want > reserved => Next::Release,
        FILLING if populated > want + SHRINK_SLACK => Next::Shrink,
        FILLING if populated < want => Next::Fill,
        FREEING => Next::Free,
        _ => Next::Wait,
    }
}

extern "C" fn keep_pool(_: *mut c_void) -> *mut c_void {
    // SAFETY: getpid has no preconditions; a forked child has no such thread.
    let pid = unsafe { libc::getpid() };
    let from_dir = SIZE_PATH_LEN.load(Ordering::Acquire) > 0;
    let (mut ticks, mut missing) = (0u32, 0u32);
    let mut fill_started = 0;
    loop {
        if from_dir && ticks % TICKS_PER_READ == 0 {
            let (want, now_missing) = after_read(read_want(pid), missing);
            missing = now_missing;
            if let Some(want) = want {
                WANT.store(want, Ordering::Relaxed);
            }
        }
        let state = STATE.load(Ordering::Acquire);
        let want = WANT.load(Ordering::Relaxed);
        let (populated, reserved) = (POPULATED.load(Ordering::Relaxed), RESERVED.load(Ordering::Relaxed));
        match next(state, want, populated, reserved) {
            Next::Reserve => {
                if !reserve() {
                    sleep_ms(5000);
                }
                continue;
            }
            Next::Fill => {
                if fill_started == 0 {
                    fill_started = now_us();
                }
                if fill_step() {
                    if POPULATED.load(Ordering::Relaxed) >= want {
                        log_event(b"gpu-mode-pool: ready ", want, now_us() - fill_started);
                        fill_started = 0;
                    }
                    continue;
                }
            }
            Next::Shrink => shrink(want),
            Next::Release => release(FILLING),
            Next::Free => release(FREEING),
            Next::Wait => fill_started = 0,
        }
        sleep_ms(TICK_MS);
        ticks = ticks.wrapping_add(1);
    }
}

/// The populated pool beyond `want` goes back to the kernel.
fn shrink(want: usize) {
    let _guard = STEP_LOCK.lock();
    if STATE.load(Ordering::Acquire) != FILLING {
        return;
    }
    let (base, writable) = (BASE.load(Ordering::Relaxed), WRITABLE.load(Ordering::Relaxed));
    // SAFETY: inside the pool's reservation, which only this module maps.
    unsafe {
        let at = (base + want) as *mut c_void;
        libc::madvise(at, writable - want, libc::MADV_DONTNEED);
        libc::mprotect(at, writable - want, libc::PROT_NONE);
    }
    WRITABLE.store(want, Ordering::Relaxed);
    POPULATED.store(want, Ordering::Relaxed);
    log_event(b"gpu-mode-pool: cut to ", want, 0);
}

/// The whole reservation (or the lent buffer, `FREEING`) unmapped; the next
/// turn reserves anew when a size is asked.
fn release(from: u8) {
    let _guard = STEP_LOCK.lock();
    if STATE.load(Ordering::Acquire) != from {
        return;
    }
    let (base, len) = (BASE.load(Ordering::Relaxed), RESERVED.load(Ordering::Relaxed));
    // SAFETY: the pool's own mapping (or the buffer it lent, which the
    // driver has unmapped as far as it knows).
    unsafe { libc::syscall(libc::SYS_munmap, base, len) };
    POPULATED.store(0, Ordering::Relaxed);
    WRITABLE.store(0, Ordering::Relaxed);
    STATE.store(NONE, Ordering::Release);
    log_event(if from == FREEING { b"gpu-mode-pool: buffer freed " } else { b"gpu-mode-pool: given back " }, len, 0);
}

/// A new reservation for the size asked; false when the kernel refused it.
fn reserve() -> bool {
    let want = WANT.load(Ordering::Relaxed);
    if want == 0 {
        return false;
    }
    let len = reservation_for(want);
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
    // SAFETY: a fresh reservation the shim owns; nothing else knows of it.
    unsafe {
        let p = raw_mmap(std::ptr::null_mut(), len, libc::PROT_NONE, flags);
        if p == libc::MAP_FAILED {
            return false;
        }
        let base = (p as usize).next_multiple_of(HUGE_PAGE);
        // The unaligned head is given back; the tail stays reserved.
        if base > p as usize {
            libc::munmap(p, base - p as usize);
        }
        let reserved = len - (base - p as usize);
        libc::madvise(base as *mut c_void, reserved, libc::MADV_DONTFORK);
        name_mapping(base, reserved);
        let _guard = STEP_LOCK.lock();
        BASE.store(base, Ordering::Relaxed);
        RESERVED.store(reserved, Ordering::Relaxed);
        WRITABLE.store(0, Ordering::Relaxed);
        POPULATED.store(0, Ordering::Relaxed);
        OWNER.store(libc::getpid(), Ordering::Relaxed);
        STATE.store(FILLING, Ordering::Release);
    }
    true
}

/// `[anon:gpu-mode-pool]` in /proc/<pid>/maps, where the kernel names
/// anonymous mappings (5.17+, CONFIG_ANON_VMA_NAME); elsewhere nothing.
fn name_mapping(base: usize, len: usize) {
    const PR_SET_VMA: c_int = 0x5356_4d41;
    const PR_SET_VMA_ANON_NAME: libc::c_ulong = 0;
    // SAFETY: names a mapping the shim owns; a failure changes nothing.
    unsafe { libc::prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, base, len, c"gpu-mode-pool".as_ptr()) };
}

/// One step of filling: false when there is nothing more to do now.
fn fill_step() -> bool {
    let _guard = STEP_LOCK.lock();
    if STATE.load(Ordering::Acquire) != FILLING {
        return false;
    }
    let (base, populated) = (BASE.load(Ordering::Relaxed), POPULATED.load(Ordering::Relaxed));
    let goal = WANT.load(Ordering::Relaxed).min(RESERVED.load(Ordering::Relaxed));
    if populated >= goal {
        return false;
    }
    let step = STEP.min(goal - populated);
    // SAFETY: inside the pool's reservation, which only this module maps.
    let ok = unsafe { make_writable(base, populated, populated + step) && populate(base + populated, step) };
    if ok {
        POPULATED.store(populated + step, Ordering::Relaxed);
    }
    ok
}

/// `[base + from, base + to)` made writable and advised huge pages, when it
/// is not yet.
unsafe fn make_writable(base: usize, from: usize, to: usize) -> bool {
    let writable = WRITABLE.load(Ordering::Relaxed);
    if to <= writable {
        return true;
    }
    let start = from.max(writable);
    let p = (base + start) as *mut c_void;
    if libc::mprotect(p, to - start, libc::PROT_READ | libc::PROT_WRITE) != 0 {
        return false;
    }
    libc::madvise(p, to - start, libc::MADV_HUGEPAGE);
    WRITABLE.store(to, Ordering::Relaxed);
    true
}

unsafe fn populate(at: usize, len: usize) -> bool {
    libc::madvise(at as *mut c_void, len, libc::MADV_POPULATE_WRITE) == 0
}

/// The C library's mmap (or the system call): the pool's own mappings do
/// not go through the shim's hook.
unsafe fn raw_mmap(addr: *mut c_void, len: usize, prot: c_int, flags: c_int) -> *mut c_void {
    libc::syscall(libc::SYS_mmap, addr, len, prot, flags, -1 as c_int, 0 as libc::off_t) as *mut c_void
}

/// The driver's buffer of `len` bytes from the pool, or None (no pool, not
/// this process's, lent already, or larger than the reservation): the
/// caller then maps as it would have.
///
/// # Safety
/// Called from the mmap hook for a private anonymous writable mapping.
pub(crate) unsafe fn take(len: usize, prot: c_int, flags: c_int) -> Option<*mut c_void> {
    if STATE.load(Ordering::Acquire) != FILLING || prot != libc::PROT_READ | libc::PROT_WRITE || OWNER.load(Ordering::Relaxed) != libc::getpid() {
        return None;
    }
    let t0 = now_us();
    let _guard = STEP_LOCK.lock();
    if STATE.load(Ordering::Acquire) != FILLING {
        return None;
    }
    let (base, reserved) = (BASE.load(Ordering::Relaxed), RESERVED.load(Ordering::Relaxed));
    let len = len.next_multiple_of(4096);
    let (extend, give_back) = plan_take(len, WRITABLE.load(Ordering::Relaxed), reserved)?;
    if !make_writable(base, 0, len) {
        return None;
    }
    // The rest of the reservation goes back: CRIU must not dump pool pages
    // the buffer does not use (`give_back` of them are populated), and the
    // buffer's unmapping must take the whole pool with it.
    if reserved > len {
        libc::syscall(libc::SYS_munmap, base + len, reserved - len);
    }
    let populated = POPULATED.load(Ordering::Relaxed).min(len);
    if flags & libc::MAP_POPULATE != 0 && populated < len {
        populate(base + populated, len - populated);
    }
    RESERVED.store(len, Ordering::Relaxed);
    LENT_LEN.store(len, Ordering::Relaxed);
    STATE.store(LENT, Ordering::Release);
    log_take(len, populated, extend, give_back, now_us() - t0);
    Some(base as *mut c_void)
}

/// Called from the munmap hook before the C library's munmap. The lent
/// buffer unmapped whole: true, the thread unmaps it (the caller returns
/// success without unmapping; the range stays the process's until then, so
/// nothing else is mapped there meanwhile). Unmapped in part (never seen):
/// false, the caller unmaps that part, and the pool is built anew beside
/// the rest, which stays mapped as the driver left it.
pub(crate) fn unmapped(addr: usize, len: usize) -> bool {
    if STATE.load(Ordering::Acquire) != LENT || OWNER.load(Ordering::Relaxed) != unsafe { libc::getpid() } {
        return false;
    }
    let _guard = STEP_LOCK.lock();
    let (base, lent) = (BASE.load(Ordering::Relaxed), LENT_LEN.load(Ordering::Relaxed));
    match unmap_of_buffer(addr, len, base, lent) {
        Some(true) => {
            STATE.store(FREEING, Ordering::Release);
            true
        }
        Some(false) => {
            log_event(b"gpu-mode-pool: buffer unmapped in part, of ", lent, 0);
            STATE.store(NONE, Ordering::Release);
            false
        }
        None => false,
    }
}

/// Whether an unmapping of `[addr, addr + len)` is of the lent buffer
/// `[base, base + lent)`: whole (`Some(true)`), in part, or not at all.
pub fn unmap_of_buffer(addr: usize, len: usize, base: usize, lent: usize) -> Option<bool> {
    let whole = addr == base && len.next_multiple_of(4096) == lent;
    (addr < base + lent && addr.saturating_add(len) > base).then_some(whole)
}

fn log_take(len: usize, from_pool: usize, extend: usize, give_back: usize, us: usize) {
    if !crate::logging() {
        return;
    }
    let mut buf = [0u8; 200];
    let mut at = crate::put(&mut buf, 0, b"gpu-mode-pool: lent ");
    at = crate::put_mib(&mut buf, at, len, b" MiB, ");
    at = crate::put_mib(&mut buf, at, from_pool, b" MiB populated before, ");
    at = crate::put_mib(&mut buf, at, extend, b" MiB made, ");
    at = crate::put_mib(&mut buf, at, give_back, b" MiB given back, in ");
    write_line(&mut buf, at, us);
}

fn log_event(what: &[u8], bytes: usize, us: usize) {
    if !crate::logging() {
        return;
    }
    let mut buf = [0u8; 200];
    let mut at = crate::put(&mut buf, 0, what);
    at = crate::put_mib(&mut buf, at, bytes, b" MiB in ");
    write_line(&mut buf, at, us);
}

/// A log line's end, `<us> us at t=<now>`, and its one write(2) to stderr.
pub(crate) fn write_line(buf: &mut [u8; 200], at: usize, us: usize) {
    let mut at = crate::put_number(buf, at, us, 10);
    at = crate::put(buf, at, b" us at t=");
    at = crate::put_number(buf, at, now_us(), 10);
    at = crate::put(buf, at, b"\n");
    // SAFETY: one write of a local buffer.
    unsafe { libc::write(2, buf.as_ptr().cast(), at) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_size_is_decimal_mib_in_whole_huge_pages() {
        let cases: &[(Option<&[u8]>, usize)] = &[
            (None, 0),
            (Some(b"0"), 0),
            (Some(b"1"), 2 * MIB),
            (Some(b"8192"), 8192 * MIB),
            (Some(b"8193"), 8194 * MIB),
            (Some(b""), 0),
            (Some(b"8G"), 0),
            (Some(b"-1"), 0),
            (Some(b"999999999"), 0),
        ];
        for (text, want) in cases {
            assert_eq!(parse_pool_mib(*text), *want, "{:?}", text.map(String::from_utf8_lossy));
        }
    }

    #[test]
    fn the_reservation_leaves_room_to_grow_and_to_align() {
        assert_eq!(reservation_for(8192 * MIB), 12288 * MIB + HUGE_PAGE);
        assert_eq!(reservation_for(2 * MIB), 256 * MIB + HUGE_PAGE);
    }

    #[test]
    fn the_thread_reserves_fills_cuts_gives_back_and_frees() {
        const G: usize = 1 << 30;
        let cases: &[(&str, u8, usize, usize, usize, Next)] = &[
            ("nothing asked, nothing held", NONE, 0, 0, 0, Next::Wait),
            ("asked: a reservation first", NONE, 8 * G, 0, 0, Next::Reserve),
            ("filling", FILLING, 8 * G, 2 * G, 12 * G, Next::Fill),
            ("full", FILLING, 8 * G, 8 * G, 12 * G, Next::Wait),
            ("a little more than asked: left", FILLING, 8 * G, 8 * G + SHRINK_SLACK, 12 * G, Next::Wait),
            ("much more than asked: cut", FILLING, 6 * G, 8 * G, 12 * G, Next::Shrink),
            ("no longer asked: all back", FILLING, 0, 8 * G, 12 * G, Next::Release),
            ("outgrew the reservation: made anew", FILLING, 13 * G, 8 * G, 12 * G, Next::Release),
            ("lent: the driver's", LENT, 20 * G, 8 * G, 8 * G, Next::Wait),
            ("the buffer unmapped: freed by the thread", FREEING, 8 * G, 8 * G, 8 * G, Next::Free),
        ];
        for (what, state, want, populated, reserved, action) in cases {
            assert_eq!(next(*state, *want, *populated, *reserved), *action, "{what}");
        }
    }

    #[test]
    fn a_missing_link_ends_the_pool_only_after_several_reads() {
        let mut missing = 0;
        for _ in 0..MISSING_READS - 1 {
            let (want, m) = after_read(0, missing);
            assert_eq!(want, None, "kept while the link may come back");
            missing = m;
        }
        assert_eq!(after_read(0, missing), (Some(0), MISSING_READS), "then no pool");
        assert_eq!(after_read(0, MISSING_READS), (Some(0), MISSING_READS), "and none after");
        assert_eq!(after_read(96 << 20, 5), (Some(96 << 20), 0), "a size counts at once");
    }

    #[test]
    fn only_the_whole_buffer_unmapped_is_left_to_the_thread() {
        let (base, lent) = (0x7f00_0000_0000, 11228 * MIB);
        let cases: &[(&str, usize, usize, Option<bool>)] = &[
            ("whole", base, lent, Some(true)),
            ("whole, length not page-rounded", base, lent - 100, Some(true)),
            ("its first half", base, lent / 2, Some(false)),
            ("its last page", base + lent - 4096, 4096, Some(false)),
            ("a range around it", base - 4096, lent + 8192, Some(false)),
            ("just before", base - 4096, 4096, None),
            ("just after", base + lent, 4096, None),
        ];
        for (what, addr, len, want) in cases {
            assert_eq!(unmap_of_buffer(*addr, *len, base, lent), *want, "{what}");
        }
    }

    #[test]
    fn a_take_extends_or_trims_the_pool_and_never_passes_the_reservation() {
        let cases: &[(&str, usize, usize, usize, Option<(usize, usize)>)] = &[
            ("the buffer is the pool", 8 << 30, 8 << 30, 12 << 30, Some((0, 0))),
            ("smaller: the rest goes back", 6 << 30, 8 << 30, 12 << 30, Some((0, 2 << 30))),
            ("larger: the rest is made", 10 << 30, 8 << 30, 12 << 30, Some((2 << 30, 0))),
            ("the pool not yet writable", 1 << 30, 0, 12 << 30, Some((1 << 30, 0))),
            ("past the reservation: not from the pool", 13 << 30, 8 << 30, 12 << 30, None),
        ];
        for (what, len, writable, reserved, want) in cases {
            assert_eq!(plan_take(*len, *writable, *reserved), *want, "{what}");
        }
    }
}
