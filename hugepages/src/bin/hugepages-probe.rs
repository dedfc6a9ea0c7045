//! `hugepages-probe MIB:KIND`: the process that `tests/preload.rs` starts
//! with the shim preloaded (or not). Not installed: a program of its own so
//! that no test of the suite doubles as the child and passes vacuously.
//!
//! KIND is anon, populate, noreserve or shared. It maps MIB MiB that way
//! through the C library's `mmap`, prints the mapping's resident and
//! huge-page kB, touches every byte, then prints its `VmFlags` from
//! /proc/self/smaps (`hg`: MADV_HUGEPAGE was applied) and the errno left
//! after the call (set to 1234 before it: the shim must not change it).
//!
//! It never names the gpu_mode_hugepages library: unused, the rlib is not
//! linked, so `mmap` here is the shim's only when the shim is preloaded.

/// The field `key` (`VmFlags`, `Rss`, ...) of the mapping that starts at `addr`.
fn smaps_field(addr: usize, key: &str) -> String {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let head = format!("{addr:x}-");
    let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&head)).skip(1);
    let key = format!("{key}:");
    lines.find_map(|l| l.strip_prefix(key.as_str()).map(str::trim).map(String::from)).unwrap_or_default()
}

fn main() {
    let spec = std::env::args().nth(1).expect("usage: hugepages-probe MIB:KIND");
    let (mib, kind) = spec.split_once(':').expect("MIB:KIND");
    let len = mib.parse::<usize>().expect("MIB") << 20;
    let flags = match kind {
        "anon" => libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
        "populate" => libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
        "noreserve" => libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
        "shared" => libc::MAP_SHARED | libc::MAP_ANONYMOUS,
        _ => panic!("unknown KIND {kind}"),
    };
    // SAFETY: a fresh anonymous mapping, written within its length.
    unsafe {
        *libc::__errno_location() = 1234;
        let p = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0);
        assert_ne!(p, libc::MAP_FAILED);
        let errno = *libc::__errno_location();
        println!("rss={}", smaps_field(p as usize, "Rss"));
        println!("thp={}", smaps_field(p as usize, "AnonHugePages"));
        std::ptr::write_bytes(p.cast::<u8>(), 7, len);
        println!("flags={}", smaps_field(p as usize, "VmFlags"));
        println!("errno={errno}");
    }
}
