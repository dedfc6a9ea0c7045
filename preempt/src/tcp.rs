//! Does a tree hold TCP connections? Only then does CRIU get
//! `--tcp-established`, its network lock and CAP_NET_ADMIN (security review
//! N1: CRIU held CAP_NET_ADMIN for every tree, and a forged image handed it
//! on; N2: every dump left an nftables lock table). A listening or unbound
//! TCP socket needs no repair: CRIU dumps and restores it as it is.
//!
//! Read from /proc as root: the tree's socket inodes (`/proc/<pid>/fd`,
//! `socket:[N]`) against the TCP tables of its network namespace
//! (`/proc/<pid>/net/tcp` and `tcp6`).

use std::collections::BTreeSet;

/// TCP states (include/net/tcp_states.h) that need no repair.
const LISTEN: u8 = 0x0A;
const CLOSE: u8 = 0x07;

/// The socket inodes of a `/proc/net/tcp` or `tcp6` table that are in a
/// state other than LISTEN or CLOSE (established, or on their way in or
/// out). Lines that do not parse are skipped (the header among them).
pub fn connected_inodes(table: &str) -> Vec<u64> {
    table
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode ...
            let state = u8::from_str_radix(f.get(3)?, 16).ok()?;
            let inode = f.get(9)?.parse::<u64>().ok()?;
            (state != LISTEN && state != CLOSE && inode != 0).then_some(inode)
        })
        .collect()
}

/// `socket:[N]` → N.
fn socket_inode(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// Whether any process of `pids` holds a TCP connection that CRIU can only
/// dump with `--tcp-established`. When the tables cannot be read it says
/// yes: the dump then goes as it always went, never failing for want of
/// the option.
pub fn tree_has_connections(pids: &[i32]) -> bool {
    let mut sockets = BTreeSet::new();
    for pid in pids {
        let Ok(links) = crate::procfs::fd_links(std::path::Path::new(&format!("/proc/{pid}/fd"))) else { continue };
        sockets.extend(links.iter().filter_map(|(_, target)| socket_inode(target)));
    }
    connection_among(&sockets, pids)
}

/// Whether one of `sockets` is a TCP connection in the tables of `pids`'
/// network namespaces.
fn connection_among(sockets: &BTreeSet<u64>, pids: &[i32]) -> bool {
    if sockets.is_empty() {
        return false;
    }
    let mut namespaces_seen = BTreeSet::new();
    for pid in pids {
        // One read per network namespace (normally the node's, for all).
        let Ok(ns) = std::fs::read_link(format!("/proc/{pid}/ns/net")) else { continue };
        if !namespaces_seen.insert(ns) {
            continue;
        }
        for table in ["tcp", "tcp6"] {
            match std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) {
                Ok(text) if connected_inodes(&text).iter().any(|i| sockets.contains(i)) => return true,
                Ok(_) => {}
                // No IPv6 on this node: no tcp6 table.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(_) => return true,
            }
        }
    }
    namespaces_seen.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_sockets_past_listen_and_close_are_connections() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:0CEA 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1 0000000000000000 100 0 0 10 0\n\
   1: 0100007F:9C40 0100007F:0CEA 01 00000000:00000000 00:00000000 00000000  1001        0 222 1 0000000000000000 20 4 30 10 -1\n\
   2: 0100007F:9C41 0100007F:0CEB 02 00000000:00000000 00:00000000 00000000  1001        0 333 1 0000000000000000 20 4 30 10 -1\n\
   3: 0100007F:9C42 00000000:0000 07 00000000:00000000 00:00000000 00000000  1001        0 444 1 0000000000000000 20 4 30 10 -1\n\
   4: 0100007F:9C43 0100007F:0CEA 06 00000000:00000000 03:00000F8B 00000000     0        0 0 3 0000000000000000\n\
   5: garbage\n";
        // ESTABLISHED (01) and SYN_SENT (02); not LISTEN (0A), CLOSE (07) or
        // a TIME_WAIT entry, which no descriptor holds (inode 0).
        assert_eq!(connected_inodes(table), [222, 333]);
        assert_eq!(connected_inodes(""), Vec::<u64>::new());
        assert_eq!(socket_inode("socket:[222]"), Some(222));
        assert_eq!(socket_inode("pipe:[222]"), None);
        assert_eq!(socket_inode("/tmp/socket:[1]"), None);
    }

    /// Real sockets of this process: a listener is no connection, an
    /// accepted one and its client are. (By inode: other tests of this
    /// binary may hold sockets of their own meanwhile.)
    #[test]
    fn a_listener_is_not_a_connection_and_an_accepted_one_is() {
        use std::os::fd::AsRawFd;
        let inode = |fd: i32| -> u64 {
            let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).unwrap();
            socket_inode(&link.to_string_lossy()).unwrap()
        };
        let me = [std::process::id() as i32];
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let only = |fd: i32| BTreeSet::from([inode(fd)]);
        assert!(!connection_among(&only(listener.as_raw_fd()), &me));
        assert!(connection_among(&only(server.as_raw_fd()), &me));
        assert!(connection_among(&only(client.as_raw_fd()), &me));
        assert!(tree_has_connections(&me));
        assert!(!tree_has_connections(&[]));
    }
}
