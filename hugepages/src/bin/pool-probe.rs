//! `pool-probe MIB [WAIT_S]`: the process that `tests/pool.rs` starts with the shim
//! preloaded and a pool asked for (`GPU_MODE_POOL_MIB`, or a size link in
//! `GPU_MODE_POOL_DIR`). Not installed. It does what the CUDA driver's
//! checkpoint does to the process's memory, and reports what it found:
//!
//! 0. with `POOL_PROBE_GPU_FILE=<path>`, maps that file shared, as the CUDA
//!    driver maps /dev/nvidiactl when it starts (the shim's thread starts
//!    then), and says how many threads it has: `threads=<n>`;
//! 1. waits (WAIT_S, default 10 s, at most) until a pool mapping (`dc nr`, resident
//!    MIB MiB) exists: `pool=<start address>` (or `pool=none`);
//! 2. maps MIB MiB private, anonymous, `MAP_POPULATE`, as the driver's buffer:
//!    `buffer=<address>`, `rss=<kB>` at once, `zero=<1 if every byte is 0>`;
//! 3. forks: the child says whether the buffer's range is mapped in it
//!    (`child_mapped=0|1`; MADV_DONTFORK leaves it out);
//! 4. writes the buffer, unmaps it (`munmap=0` its result; `kept=1`: its
//!    range still holds what was written, the shim's thread unmaps it later),
//!    and waits (WAIT_S, default 10 s, at most) until that range no longer holds it and a new
//!    pool is resident: `rebuilt=1` (or 0).

use std::time::{Duration, Instant};

/// Start and resident kB of each mapping whose VmFlags hold `dc` and `nr`.
fn pools() -> Vec<(usize, u64)> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let (mut out, mut start, mut rss) = (Vec::new(), 0usize, 0u64);
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            start = usize::from_str_radix(first.split('-').next().unwrap(), 16).unwrap();
        } else if let Some(v) = line.strip_prefix("Rss:") {
            rss = v.trim().trim_end_matches("kB").trim().parse().unwrap();
        } else if let Some(v) = line.strip_prefix("VmFlags:") {
            let flags: Vec<&str> = v.split_whitespace().collect();
            if flags.contains(&"dc") && flags.contains(&"nr") {
                out.push((start, rss));
            }
        }
    }
    out
}

fn wait_for_pool(kib: u64, within: Duration) -> Option<usize> {
    let t = Instant::now();
    while t.elapsed() < within {
        if let Some((start, _)) = pools().into_iter().find(|(_, rss)| *rss >= kib) {
            return Some(start);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

fn main() {
    let mib: usize = std::env::args().nth(1).expect("usage: pool-probe MIB").parse().expect("MIB");
    let within = Duration::from_secs(std::env::args().nth(2).map_or(10, |s| s.parse().expect("WAIT_S")));
    let len = mib << 20;
    if let Some(path) = std::env::var_os("POOL_PROBE_GPU_FILE") {
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).unwrap();
        file.set_len(4096).unwrap();
        // SAFETY: a shared mapping of a file of that length, kept to the end.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, std::os::fd::AsRawFd::as_raw_fd(&file), 0) };
        assert_ne!(p, libc::MAP_FAILED);
        std::mem::forget(file);
    }
    std::thread::sleep(Duration::from_millis(100));
    println!("threads={}", threads());
    let pool = wait_for_pool((mib as u64) << 10, within);
    println!("pool={}", pool.map_or("none".into(), |p| format!("{p:#x}")));
    // SAFETY: a fresh mapping, used within its length, unmapped once.
    unsafe {
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE;
        let p = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0);
        assert_ne!(p, libc::MAP_FAILED);
        println!("buffer={:#x}", p as usize);
        let rss: u64 = pools().iter().filter(|(s, _)| *s == p as usize).map(|(_, r)| *r).sum();
        println!("rss={rss}");
        let bytes = std::slice::from_raw_parts_mut(p.cast::<u8>(), len);
        println!("zero={}", u8::from(bytes.iter().all(|b| *b == 0)));
        match libc::fork() {
            0 => {
                let mut vec = [0u8; 1];
                let mapped = libc::mincore(p, 4096, vec.as_mut_ptr()) == 0;
                println!("child_mapped={}", u8::from(mapped));
                libc::_exit(0);
            }
            child => {
                libc::waitpid(child, std::ptr::null_mut(), 0);
            }
        }
        bytes.fill(0x5a);
        println!("munmap={}", libc::munmap(p, len));
        println!("kept={}", u8::from(byte_at(p as usize) == Some(0x5a)));
        let t = Instant::now();
        while byte_at(p as usize) == Some(0x5a) && t.elapsed() < within {
            std::thread::sleep(Duration::from_millis(20));
        }
        let gone = byte_at(p as usize) != Some(0x5a);
        println!("rebuilt={}", u8::from(gone && wait_for_pool((mib as u64) << 10, within).is_some()));
    }
}

/// This process's threads (/proc/self/status).
fn threads() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status.lines().find_map(|l| l.strip_prefix("Threads:")).unwrap().trim().parse().unwrap()
}

/// The byte at `addr` of this process, read through /proc/self/mem: `None`
/// where nothing is mapped (no fault).
fn byte_at(addr: usize) -> Option<u8> {
    use std::os::unix::fs::FileExt;
    let mem = std::fs::File::open("/proc/self/mem").ok()?;
    let mut b = [0u8; 1];
    mem.read_exact_at(&mut b, addr as u64).ok()?;
    Some(b[0])
}
