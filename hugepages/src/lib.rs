//! Huge pages for the CUDA driver's checkpoint buffer: an `LD_PRELOAD` shim
//! that `gpu-mode-run` preloads into a `--gpu-mode=checkpoint` job's
//! application (`[preempt] huge_pages`, on by default).
//!
//! # Why
//!
//! The driver's checkpoint (`cuCheckpointProcessCheckpoint`) copies the
//! process's GPU memory into host memory of the process, one anonymous
//! mapping made for it at that moment (seen on an H100, 2026-11-26: a
//! PyTorch process with 10.96 GiB on the GPU got one 10.97 GiB mapping).
//! Until that copy ends the GPU memory is not free, and the copy runs at
//! the speed of touching fresh memory page by page: on the H100 machine
//! 2.3-2.6 GiB/s with 4 KiB pages, 8.7-8.9 GiB/s with 2 MiB pages
//! (`madvise(MADV_HUGEPAGE)`); the driver's checkpoint ran at 1.5-1.8 GiB/s.
//! Where the node's transparent huge pages are `madvise` (Debian's and
//! Ubuntu's default), only the process itself can ask for them: the kernel
//! takes no `MADV_HUGEPAGE` from another process (`process_madvise` allows
//! only COLD, PAGEOUT, WILLNEED and COLLAPSE), the driver does not ask, and
//! a node-wide `always` is a site's choice, not a job's. So the shim asks
//! from inside, as the mapping is made.
//!
//! # What it does, and nothing else
//!
//! It defines `mmap` and `mmap64`, which call the C library's (found with
//! `dlsym(RTLD_NEXT)`) with the same arguments and return its result. When
//! that result is a private, anonymous, writable mapping without
//! `MAP_NORESERVE` of at least `GPU_MODE_HUGEPAGES_MIN_MIB` MiB (default
//! 64), it then calls `madvise(MADV_HUGEPAGE)` on it: the kernel may back
//! it with 2 MiB pages. Such a mapping asked with `MAP_POPULATE` is made
//! without it, advised, then populated (`MADV_POPULATE_WRITE`), so that its
//! pages are made after the advice (see [`map`]). `errno` is as the C
//! library left it. Reservations
//! (`PROT_NONE`, `MAP_NORESERVE`), hugetlbfs, file and shared mappings, and the C
//! library's own allocations (glibc's malloc maps memory internally, not
//! through `mmap`) are left alone. `GPU_MODE_HUGEPAGES_LOG=1` writes one
//! line to stderr per mapping advised.
//!
//! Huge pages cost memory only where a large mapping is touched sparsely,
//! and, with the kernel's default `defrag = madvise`, a fault may compact
//! memory when no free huge page is left (docs/preempt.md, "Huge pages").
//!
//! Never panics and never allocates: it runs inside every large `mmap` of
//! the application, on any thread, possibly before `main`.
//!
//! The same buffers are where the driver's copies go and come from: [`copy`]
//! (it defines `memcpy`) splits those copies across several threads
//! (`GPU_MODE_COPY_THREADS`), and [`pool`] serves the buffer from memory
//! populated before the checkpoint (`GPU_MODE_POOL_DIR`, `GPU_MODE_POOL_MIB`).
//!
//! `GPU_MODE_HUGEPAGES=0` turns the advice off, and with it the buffers'
//! copies and pool; the library then only does its other jobs: [`fork`],
//! children forked without exec drop the GPU files they inherited
//! (`GPU_MODE_FORK_DROP=1`), and [`io_uring`], the application gets no
//! io_uring from `syscall()` (`GPU_MODE_NO_IO_URING=1`).

pub mod copy;
pub mod fork;
pub mod io_uring;
pub mod pool;

use libc::{c_int, c_void, off64_t, off_t, size_t};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Below this, a mapping gains little from huge pages.
pub const DEFAULT_MIN_MIB: usize = 64;
const MIB: usize = 1 << 20;
/// A cache slot not read yet.
const UNSET: usize = usize::MAX;

type MmapFn = unsafe extern "C" fn(*mut c_void, size_t, c_int, c_int, c_int, off_t) -> *mut c_void;

static REAL_MMAP: AtomicUsize = AtomicUsize::new(0);
static MIN_BYTES: AtomicUsize = AtomicUsize::new(UNSET);
static LOG: AtomicUsize = AtomicUsize::new(UNSET);

/// The mapping `mmap` just made deserves `MADV_HUGEPAGE`.
pub fn wants_huge_pages(len: usize, prot: c_int, flags: c_int, min_bytes: usize) -> bool {
    let private_anonymous = flags & libc::MAP_ANONYMOUS != 0 && flags & libc::MAP_PRIVATE != 0 && flags & libc::MAP_SHARED == 0;
    // hugetlbfs pages are huge already, and no THP.
    let reserved_or_hugetlb = flags & (libc::MAP_NORESERVE | libc::MAP_HUGETLB) != 0;
    private_anonymous && !reserved_or_hugetlb && prot & libc::PROT_WRITE != 0 && len >= min_bytes
}

/// `GPU_MODE_HUGEPAGES_MIN_MIB`'s value in bytes: decimal MiB, at least 2
/// (one huge page); anything else is the default.
pub fn parse_min_mib(text: Option<&[u8]>) -> usize {
    decimal(text, 9).map_or(DEFAULT_MIN_MIB * MIB, |mib| mib.max(2) * MIB)
}

/// A setting's value in decimal, of 1 to `max_digits` digits and nothing
/// else (no sign, no unit); `None` for anything else, or when unset.
pub(crate) fn decimal(text: Option<&[u8]>, max_digits: usize) -> Option<usize> {
    let text = text?;
    if text.is_empty() || text.len() > max_digits || !text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(text.iter().fold(0usize, |n, d| n * 10 + usize::from(d - b'0')))
}

/// An environment variable's bytes, without allocating.
fn env_bytes(name: &std::ffi::CStr) -> Option<&'static [u8]> {
    // SAFETY: getenv returns a pointer into the environment or null; the
    // process's environment outlives this call (the shim never sets any).
    let p = unsafe { libc::getenv(name.as_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: a NUL-terminated string from the environment.
    Some(unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes())
}

fn cached(slot: &AtomicUsize, read: impl FnOnce() -> usize) -> usize {
    match slot.load(Ordering::Relaxed) {
        UNSET => {
            let v = read();
            slot.store(v, Ordering::Relaxed);
            v
        }
        v => v,
    }
}

/// No mapping is this large: the advice is off (`GPU_MODE_HUGEPAGES=0`,
/// gpu-mode-run's setting when only [`fork`] is wanted).
const OFF: usize = usize::MAX - 1;

fn min_bytes() -> usize {
    cached(&MIN_BYTES, || {
        if env_bytes(c"GPU_MODE_HUGEPAGES") == Some(b"0") {
            OFF
        } else {
            parse_min_mib(env_bytes(c"GPU_MODE_HUGEPAGES_MIN_MIB"))
        }
    })
}

fn logging() -> bool {
    cached(&LOG, || usize::from(env_bytes(c"GPU_MODE_HUGEPAGES_LOG").is_some_and(|v| v == b"1"))) == 1
}

/// At load time, before the application's threads exist: the settings
/// from the environment and the C library's mmap and munmap, so that no
/// later call of either calls getenv (not safe against another thread's
/// setenv) or dlsym (which may allocate).
extern "C" fn init() {
    let _ = (min_bytes(), logging(), real_mmap(), next_definition(&REAL_MUNMAP, c"munmap"));
    fork::init(env_bytes(c"GPU_MODE_FORK_DROP"), env_bytes(c"GPU_MODE_FORK_DROP_PREFIXES"));
    io_uring::init(env_bytes(c"GPU_MODE_NO_IO_URING"));
    copy::init(env_bytes(c"GPU_MODE_COPY_THREADS"));
    if min_bytes() != OFF {
        let eager = env_bytes(c"GPU_MODE_POOL_EAGER") == Some(b"1");
        pool::init(env_bytes(c"GPU_MODE_POOL_MIB"), env_bytes(c"GPU_MODE_POOL_DIR"), eager);
    }
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

/// The C library's `mmap` (the next definition after this library), or 0
/// when there is none.
fn real_mmap() -> usize {
    next_definition(&REAL_MMAP, c"mmap")
}

/// The next definition of `name` after this library (the C library's), or
/// 0 when there is none; looked up once and kept in `slot`.
pub(crate) fn next_definition(slot: &AtomicUsize, name: &std::ffi::CStr) -> usize {
    match slot.load(Ordering::Acquire) {
        0 => {
            // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT skips this
            // library, so it never returns our own definition.
            let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
            slot.store(p, Ordering::Release);
            p
        }
        p => p,
    }
}

/// Appends `n` in decimal (or hex) to `buf` at `at`; returns the new end.
fn put_number(buf: &mut [u8], at: usize, mut n: usize, radix: usize) -> usize {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b"0123456789abcdef"[n % radix];
        n /= radix;
        if n == 0 || i == 0 {
            break;
        }
    }
    put(buf, at, &digits[i..])
}

/// Appends `bytes` in whole MiB, then `after`; returns the new end.
fn put_mib(buf: &mut [u8], at: usize, bytes: usize, after: &[u8]) -> usize {
    let at = put_number(buf, at, bytes / MIB, 10);
    put(buf, at, after)
}

fn put(buf: &mut [u8], at: usize, bytes: &[u8]) -> usize {
    let at = at.min(buf.len());
    let n = bytes.len().min(buf.len() - at);
    buf[at..at + n].copy_from_slice(&bytes[..n]);
    at + n
}

/// `gpu-mode-hugepages: MADV_HUGEPAGE on 11228 MiB at 0x7f...: ok (flags
/// 0x8022, populated after) in 2512345 us` (or `errno N`; the time the
/// mmap took, populating included), for one write(2).
pub fn log_line(buf: &mut [u8; 160], addr: usize, len: usize, flags: c_int, errno: Option<c_int>, us: usize) -> usize {
    let mut at = put(buf, 0, b"gpu-mode-hugepages: MADV_HUGEPAGE on ");
    at = put_mib(buf, at, len, b" MiB at 0x");
    at = put_number(buf, at, addr, 16);
    match errno {
        None => at = put(buf, at, b": ok"),
        Some(e) => {
            at = put(buf, at, b": errno ");
            at = put_number(buf, at, e.unsigned_abs() as usize, 10);
        }
    }
    at = put(buf, at, b" (flags 0x");
    at = put_number(buf, at, flags as u32 as usize, 16);
    if flags & libc::MAP_POPULATE != 0 {
        at = put(buf, at, b", populated after");
    }
    at = put(buf, at, b") in ");
    at = put_number(buf, at, us, 10);
    put(buf, at, b" us\n")
}

/// The mmap itself, through `real` (the C library's, with the flags to
/// use): a mapping that deserves huge pages is advised before its first
/// page is touched. `MAP_POPULATE` would touch every page inside the mmap,
/// before any advice could apply (seen: the driver's checkpoint buffer got
/// the advice and still no huge page), so such a mapping is made without
/// it, advised, then populated for writing (`MADV_POPULATE_WRITE`, what
/// `MAP_POPULATE` does to a private writable mapping; failures are ignored,
/// as `MAP_POPULATE`'s are). `errno` is as the C library's mmap left it.
///
/// # Safety
/// As `mmap(2)`.
unsafe fn map(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, real: impl FnOnce(c_int) -> *mut c_void) -> *mut c_void {
    if !wants_huge_pages(len, prot, flags, min_bytes()) {
        return real(flags);
    }
    let buffer = addr.is_null() && flags & (libc::MAP_POPULATE | libc::MAP_FIXED) == libc::MAP_POPULATE;
    if buffer {
        if let Some(p) = pool::take(len, prot, flags) {
            buffer_made(p, len);
            return p;
        }
    }
    let t0 = pool::now_us();
    let p = real(flags & !libc::MAP_POPULATE);
    if p == libc::MAP_FAILED {
        return p;
    }
    let errno = libc::__errno_location();
    let saved = *errno;
    let failed = libc::madvise(p, len, libc::MADV_HUGEPAGE) != 0;
    let result = failed.then(|| *errno);
    if flags & libc::MAP_POPULATE != 0 && libc::madvise(p, len, libc::MADV_POPULATE_WRITE) != 0 && *errno == libc::EINVAL {
        // Kernels before 5.14 (no MADV_POPULATE_WRITE): a write fault on
        // each page, as the kernel's populate makes (the memory is fresh and
        // zero; zero is written). Other failures (no memory) are ignored,
        // as MAP_POPULATE ignores them.
        let mut page = 0;
        while page < len {
            std::ptr::write_volatile(p.cast::<u8>().add(page), 0);
            page += 4096;
        }
    }
    if buffer {
        buffer_made(p, len);
    }
    if logging() {
        let mut buf = [0u8; 160];
        let n = log_line(&mut buf, p as usize, len, flags, result, pool::now_us() - t0);
        let _ = libc::write(2, buf.as_ptr().cast(), n);
    }
    *errno = saved;
    p
}

/// The driver's checkpoint buffer was made at `p`: its copies are split
/// ([`copy`]), and it is advised `MADV_SEQUENTIAL`, the mark by which the
/// project's CRIU maps it from the image at a restore instead of reading it
/// into fresh memory (packaging/criu/0007, `CRIU_MAP_SEQUENTIAL_PAGES`): the
/// driver reads it once, front to back, and unmaps it, so no mapping of the
/// image outlives the restore. On anonymous memory the advice changes
/// nothing else the driver would notice (the kernel's reclaim ages such
/// pages differently). `errno` is left as it was.
///
/// # Safety
/// `[p, p + len)` is a mapping the caller just made.
unsafe fn buffer_made(p: *mut c_void, len: usize) {
    copy::buffer_made(p as usize, len);
    let errno = libc::__errno_location();
    let saved = *errno;
    libc::madvise(p, len, libc::MADV_SEQUENTIAL);
    *errno = saved;
}

/// `mmap(2)` as the C library does it, through [`map`].
///
/// # Safety
/// As `mmap(2)`: the caller owns what it maps.
#[no_mangle]
pub unsafe extern "C" fn mmap(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, offset: off_t) -> *mut c_void {
    let real = real_mmap();
    if flags & libc::MAP_SHARED != 0 {
        pool::gpu_file_mapped(fd);
    }
    map(addr, len, prot, flags, |flags| {
        if real == 0 {
            // No C library after us (never seen): the system call itself.
            libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, offset) as *mut c_void
        } else {
            // SAFETY: the C library's mmap, found by name.
            std::mem::transmute::<usize, MmapFn>(real)(addr, len, prot, flags, fd, offset)
        }
    })
}

/// `mmap64(3)`: on 64-bit systems the same function as `mmap` (glibc makes
/// one an alias of the other), so it is [`mmap`].
///
/// # Safety
/// As `mmap(2)`.
#[no_mangle]
pub unsafe extern "C" fn mmap64(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, offset: off64_t) -> *mut c_void {
    const _: () = assert!(std::mem::size_of::<off_t>() == std::mem::size_of::<off64_t>(), "a 64-bit off_t");
    mmap(addr, len, prot, flags, fd, offset as off_t)
}

static REAL_MUNMAP: AtomicUsize = AtomicUsize::new(0);

type MunmapFn = unsafe extern "C" fn(*mut c_void, size_t) -> c_int;

/// `munmap(2)` as the C library does it, but for the buffer the [`pool`]
/// lent, which the pool's thread unmaps (see [`pool::unmapped`]).
///
/// # Safety
/// As `munmap(2)`.
#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: size_t) -> c_int {
    copy::unmapping(addr as usize, len);
    if pool::unmapped(addr as usize, len) {
        return 0;
    }
    match next_definition(&REAL_MUNMAP, c"munmap") {
        0 => libc::syscall(libc::SYS_munmap, addr, len) as c_int,
        // SAFETY: the C library's munmap, found by name.
        real => std::mem::transmute::<usize, MunmapFn>(real)(addr, len),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use libc::{MAP_ANONYMOUS, MAP_FIXED, MAP_NORESERVE, MAP_PRIVATE, MAP_SHARED, PROT_NONE, PROT_READ, PROT_WRITE};

    const RW: c_int = PROT_READ | PROT_WRITE;
    const MIN: usize = 64 * MIB;

    #[test]
    fn only_large_private_anonymous_writable_committed_mappings_are_advised() {
        let cases: &[(&str, usize, c_int, c_int, bool)] = &[
            ("the driver's checkpoint buffer", 11 << 30, RW, MAP_PRIVATE | MAP_ANONYMOUS, true),
            ("at the threshold", MIN, RW, MAP_PRIVATE | MAP_ANONYMOUS, true),
            ("at a fixed address", MIN, RW, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, true),
            ("below the threshold", MIN - 4096, RW, MAP_PRIVATE | MAP_ANONYMOUS, false),
            ("a reservation (PROT_NONE)", 1 << 40, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, false),
            ("read-only", MIN, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, false),
            ("MAP_NORESERVE", MIN, RW, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, false),
            ("hugetlbfs pages", MIN, RW, MAP_PRIVATE | MAP_ANONYMOUS | libc::MAP_HUGETLB, false),
            ("shared anonymous", MIN, RW, MAP_SHARED | MAP_ANONYMOUS, false),
            ("a private file mapping", MIN, RW, MAP_PRIVATE, false),
        ];
        for (what, len, prot, flags, want) in cases {
            assert_eq!(wants_huge_pages(*len, *prot, *flags, MIN), *want, "{what}");
        }
    }

    #[test]
    fn the_threshold_is_decimal_mib_at_least_one_huge_page() {
        let cases: &[(Option<&[u8]>, usize)] = &[
            (None, DEFAULT_MIN_MIB * MIB),
            (Some(b"256"), 256 * MIB),
            (Some(b"0"), 2 * MIB),
            (Some(b"1"), 2 * MIB),
            (Some(b""), DEFAULT_MIN_MIB * MIB),
            (Some(b"-5"), DEFAULT_MIN_MIB * MIB),
            (Some(b"64M"), DEFAULT_MIN_MIB * MIB),
            (Some(b"9999999999"), DEFAULT_MIN_MIB * MIB),
        ];
        for (text, want) in cases {
            assert_eq!(parse_min_mib(*text), *want, "{:?}", text.map(String::from_utf8_lossy));
        }
    }

    #[test]
    fn the_log_line_names_size_address_outcome_and_flags() {
        let mut buf = [0u8; 160];
        let n = log_line(&mut buf, 0x7f00_dead_0000, 11 << 30, MAP_PRIVATE | MAP_ANONYMOUS | libc::MAP_POPULATE, None, 2_512_345);
        assert_eq!(
            std::str::from_utf8(&buf[..n]).unwrap(),
            "gpu-mode-hugepages: MADV_HUGEPAGE on 11264 MiB at 0x7f00dead0000: ok (flags 0x8022, populated after) in 2512345 us\n"
        );
        let n = log_line(&mut buf, 0, 64 << 20, MAP_PRIVATE | MAP_ANONYMOUS, Some(libc::EINVAL), 7);
        assert_eq!(std::str::from_utf8(&buf[..n]).unwrap(), "gpu-mode-hugepages: MADV_HUGEPAGE on 64 MiB at 0x0: errno 22 (flags 0x22) in 7 us\n");
    }

    #[test]
    fn a_number_that_does_not_fit_is_cut_not_a_panic() {
        let mut buf = [0u8; 4];
        assert_eq!(put_number(&mut buf, 2, usize::MAX, 10), 4);
        assert_eq!(put(&mut buf, 9, b"x"), 4);
    }
}
