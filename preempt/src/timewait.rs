//! The ports a restore binds, freed of TIME_WAIT entries (issue 38).
//!
//! A restore rebinds every TCP socket of the image to its address and port.
//! CRIU sets SO_REUSEADDR on each for that, but Linux still refuses the
//! bind while a TIME_WAIT entry holds the port and the socket that left it
//! had no SO_REUSEADDR of its own. NCCL's listening sockets (its bootstrap
//! and its socket transport, on ephemeral ports) have none, and a
//! connection they accepted that closed first (at NCCL's init, or when the
//! dumped tree was killed) leaves such an entry for 60 s. Seen on 2×H200,
//! an FSDP job over NCCL restored 12 s after its dump:
//! `inet: Can't bind inet socket (id 179): Address already in use`, the job
//! FAILED; the same job by hand restored 65 s after the dump.
//!
//! So the dump records the local ports of the tree's TCP sockets in the
//! root-owned manifest, and before CRIU restores, the agent deletes the
//! TIME_WAIT entries on those ports with iproute2's `ss -K` (SOCK_DESTROY;
//! root's CAP_NET_ADMIN; the kernel's `CONFIG_INET_DIAG_DESTROY`), never
//! through a shell. A TIME_WAIT entry only guards against late packets of a
//! closed connection; on these ports the connections were the tree's own.
//! Without ss, or a kernel without SOCK_DESTROY, the entries stay and the
//! restore may fail as before: said in the restore's line, never an error.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

/// How long one ss run may take.
const SS_WAIT: Duration = Duration::from_secs(10);
/// Ports per ss run: its filter is one argument per word.
const PORTS_PER_RUN: usize = 64;

/// The local ports of the sockets `inodes` in a `/proc/net/tcp` or `tcp6`
/// table, whatever their state (a listener's port is the one that fails).
pub fn local_ports(table: &str, inodes: &BTreeSet<u64>) -> BTreeSet<u16> {
    table
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let inode = f.get(9)?.parse::<u64>().ok()?;
            inodes.contains(&inode).then(|| crate::tcp::parse_endpoint(f.get(1)?).map(|e| e.1)).flatten()
        })
        .filter(|port| *port != 0)
        .collect()
}

/// The local TCP ports of the sockets `pids` hold (their network namespace's
/// tables, read through the first of them), ascending.
pub fn tree_ports(pids: &[i32]) -> Vec<u16> {
    let inodes = crate::tcp::sockets_of(pids);
    let Some(pid) = pids.first().filter(|_| !inodes.is_empty()) else { return Vec::new() };
    let mut ports = BTreeSet::new();
    for table in ["tcp", "tcp6"] {
        if let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) {
            ports.extend(local_ports(&text, &inodes));
        }
    }
    ports.into_iter().collect()
}

/// ss's arguments that delete the TIME_WAIT entries whose local port is one
/// of `ports` (non-empty): `-K -tn state time-wait ( sport = :P or ... )`.
pub fn ss_args(ports: &[u16]) -> Vec<String> {
    let mut args: Vec<String> = ["-K", "-tn", "state", "time-wait", "("].iter().map(|s| s.to_string()).collect();
    for (i, port) in ports.iter().enumerate() {
        if i > 0 {
            args.push("or".into());
        }
        args.extend(["sport".to_string(), "=".to_string(), format!(":{port}")]);
    }
    args.push(")".into());
    args
}

/// The entries an ss run listed (it lists what it deletes): its lines but
/// the header.
pub fn listed(stdout: &str) -> usize {
    stdout.lines().filter(|l| !l.trim().is_empty() && !l.starts_with("Recv-Q") && !l.starts_with("State")).count()
}

/// The node's ss, by absolute path (`preempt.ss`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ss {
    pub binary: PathBuf,
}

impl Ss {
    /// Deletes the TIME_WAIT entries on `ports`; how many there were.
    pub fn clear(&self, ports: &[u16]) -> Result<usize, String> {
        if !self.binary.is_absolute() {
            return Err(format!("{} is not an absolute path", self.binary.display()));
        }
        let mut cleared = 0;
        for chunk in ports.chunks(PORTS_PER_RUN) {
            let mut cmd = std::process::Command::new(&self.binary);
            cmd.args(ss_args(chunk)).env_clear().current_dir("/");
            let out = crate::command::run_with_timeout(cmd, None, SS_WAIT).map_err(|e| format!("{}: {e}", self.binary.display()))?;
            if !out.status.success() {
                return Err(format!("{} -K: {}", self.binary.display(), String::from_utf8_lossy(&out.stderr).trim()));
            }
            cleared += listed(&String::from_utf8_lossy(&out.stdout));
        }
        Ok(cleared)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trees_ports_are_read_from_the_table_whatever_their_state() {
        // A listener (0A) on 0x9C41, a connection (01) from 0xA5F2, another
        // process's socket, and a socket bound to no port yet.
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
           0: 0100007F:9C41 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1001        0 501 1 0000\n\
           1: 0100007F:A5F2 0100007F:9C41 01 00000000:00000000 00:00000000 00000000  1001        0 502 1 0000\n\
           2: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 777 1 0000\n\
           3: 00000000:0000 00000000:0000 07 00000000:00000000 00:00000000 00000000  1001        0 503 1 0000\n";
        let ours: BTreeSet<u64> = [501, 502, 503].into();
        assert_eq!(local_ports(table, &ours), BTreeSet::from([0x9C41, 0xA5F2]));
        assert_eq!(local_ports(table, &BTreeSet::new()), BTreeSet::new());
    }

    #[test]
    fn ss_is_asked_for_time_wait_entries_on_exactly_these_ports() {
        assert_eq!(ss_args(&[42465]).join(" "), "-K -tn state time-wait ( sport = :42465 )");
        assert_eq!(ss_args(&[1, 2]).join(" "), "-K -tn state time-wait ( sport = :1 or sport = :2 )");
        let out = "Recv-Q Send-Q Local Address:Port  Peer Address:Port Process\n0      0          127.0.0.1:42465    127.0.0.1:47484\n";
        assert_eq!(listed(out), 1);
        assert_eq!(listed("Recv-Q Send-Q Local Address:Port Peer Address:PortProcess\n"), 0);
    }

    /// Issue 38's bind failure, made here: a listener without SO_REUSEADDR
    /// (as NCCL's) whose accepted connection closes first leaves a
    /// TIME_WAIT entry on the listener's port, and a new socket cannot bind
    /// it even with SO_REUSEADDR (as CRIU's restore binds) until [`Ss::clear`].
    #[test]
    fn a_time_wait_entry_that_blocks_a_rebind_is_cleared() {
        let ss = Ss { binary: "/usr/bin/ss".into() };
        if unsafe { libc::geteuid() } != 0 || !ss.binary.exists() {
            return gpu_mode_testkit::skipped(&gpu_mode_testkit::this_test(), "needs root and /usr/bin/ss");
        }
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        // SAFETY: plain socket calls on descriptors this test owns.
        let listener = unsafe { OwnedFd::from_raw_fd(libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0)) };
        let any = libc::sockaddr_in { sin_family: libc::AF_INET as u16, sin_port: 0, sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes([127, 0, 0, 1]) }, sin_zero: [0; 8] };
        let len = std::mem::size_of::<libc::sockaddr_in>() as u32;
        let bind = |fd: i32, addr: &libc::sockaddr_in| unsafe { libc::bind(fd, (addr as *const libc::sockaddr_in).cast(), len) };
        assert_eq!(bind(listener.as_raw_fd(), &any), 0);
        assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 4) }, 0);
        let mut bound = any;
        let mut blen = len;
        assert_eq!(unsafe { libc::getsockname(listener.as_raw_fd(), (&mut bound as *mut libc::sockaddr_in).cast(), &mut blen) }, 0);
        let port = u16::from_be(bound.sin_port);
        let client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let accepted = unsafe { libc::accept(listener.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut()) };
        assert!(accepted >= 0);
        // The accepted end closes first: TIME_WAIT on the listener's port.
        unsafe { libc::close(accepted) };
        std::thread::sleep(Duration::from_millis(100));
        drop(client);
        drop(listener);
        std::thread::sleep(Duration::from_millis(100));
        let rebind = || {
            let fd = unsafe { OwnedFd::from_raw_fd(libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0)) };
            let one: libc::c_int = 1;
            unsafe { libc::setsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_REUSEADDR, (&one as *const libc::c_int).cast(), 4) };
            (bind(fd.as_raw_fd(), &bound) == 0).then_some(()).ok_or_else(std::io::Error::last_os_error)
        };
        let before = rebind();
        let cleared = ss.clear(&[port]);
        let after = rebind();
        if matches!(&cleared, Ok(0)) && before.is_err() {
            return gpu_mode_testkit::skipped(&gpu_mode_testkit::this_test(), "ss -K deleted nothing: a kernel without CONFIG_INET_DIAG_DESTROY");
        }
        assert_eq!(before.map_err(|e| e.raw_os_error()), Err(Some(libc::EADDRINUSE)), "the TIME_WAIT entry blocks the rebind");
        assert_eq!(cleared, Ok(1), "one entry on port {port}");
        assert!(after.is_ok(), "the rebind after the clearing: {after:?}");
    }
}
