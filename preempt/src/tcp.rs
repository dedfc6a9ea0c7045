//! Does a tree hold TCP connections? Only then does CRIU get
//! `--tcp-established`, its network lock and CAP_NET_ADMIN (security review
//! N1: CRIU held CAP_NET_ADMIN for every tree, and a forged image handed it
//! on; N2: every dump left an nftables lock table). A listening or unbound
//! TCP socket needs no repair: CRIU dumps and restores it as it is.
//!
//! And are its connections' peers all inside it (issue 37 N2)? Both ends of
//! such a connection (torch's TCPStore between ranks on one node) are frozen,
//! dumped and killed with the tree, so nothing can reach or answer either
//! end meanwhile: CRIU needs no network lock (`--network-lock skip`), and
//! leaves no nftables table behind. A connection to an outside peer keeps
//! the lock (netlock.rs records and removes its table).
//!
//! Read from /proc as root: the tree's socket inodes (`/proc/<pid>/fd`,
//! `socket:[N]`) against the TCP tables of its network namespace
//! (`/proc/<pid>/net/tcp` and `tcp6`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// One end of a TCP connection: address (IPv4-mapped IPv6 read as IPv4,
/// so that both families' views of one connection compare) and port.
pub type Endpoint = (IpAddr, u16);

/// What a tree's TCP sockets need from CRIU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TreeTcp {
    /// No connection: no `--tcp-established`, no lock, no CAP_NET_ADMIN.
    None,
    /// Connections whose peers are all sockets of the tree itself:
    /// `--tcp-established --network-lock skip`.
    InsideOnly,
    /// A connection to a peer outside the tree (or tables that could not be
    /// read): `--tcp-established --network-lock nftables`.
    Outside,
}

/// TCP states (include/net/tcp_states.h) that need no repair.
const LISTEN: u8 = 0x0A;
const CLOSE: u8 = 0x07;

/// The socket inodes of a `/proc/net/tcp` or `tcp6` table that are in a
/// state other than LISTEN or CLOSE (established, or on their way in or
/// out). Lines that do not parse are skipped (the header among them).
pub fn connected_inodes(table: &str) -> Vec<u64> {
    table.lines().filter_map(connection_row).map(|(inode, _, _)| inode).collect()
}

/// A table row of a socket past LISTEN and CLOSE held by a descriptor:
/// its inode and its local and remote address texts.
fn connection_row(line: &str) -> Option<(u64, &str, &str)> {
    let f: Vec<&str> = line.split_whitespace().collect();
    // sl local rem st tx:rx tr:when retrnsmt uid timeout inode ...
    let state = u8::from_str_radix(f.get(3)?, 16).ok()?;
    let inode = f.get(9)?.parse::<u64>().ok()?;
    (state != LISTEN && state != CLOSE && inode != 0).then_some((inode, *f.get(1)?, *f.get(2)?))
}

/// A `/proc/net/tcp{,6}` address, `0100007F:0CEA` or 32 hex digits and a
/// port: the kernel prints the address's 32-bit words as native integers
/// (`%08X`), the port in host order.
pub fn parse_endpoint(text: &str) -> Option<Endpoint> {
    let (addr, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        let hex = addr.get(i * 8..i * 8 + 8)?;
        Some(u32::from_str_radix(hex, 16).ok()?.to_ne_bytes())
    };
    let ip = match addr.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut bytes = [0u8; 16];
            for i in 0..4 {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            let v6 = Ipv6Addr::from(bytes);
            v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
        }
        _ => return None,
    };
    Some((ip, port))
}

/// The connections of a `/proc/net/tcp` or `tcp6` table (as
/// [`connected_inodes`] finds them): inode → (local, remote).
pub fn connections(table: &str) -> BTreeMap<u64, (Endpoint, Endpoint)> {
    table
        .lines()
        .filter_map(connection_row)
        .filter_map(|(inode, local, remote)| Some((inode, (parse_endpoint(local)?, parse_endpoint(remote)?))))
        .collect()
}

/// Whether every one of `ours` (the tree's connections, one network
/// namespace) has its peer among them: another of `ours` whose local end
/// is this one's remote end and whose remote end is this one's local end.
/// Empty: no connection, nothing outside.
pub fn peers_all_inside(ours: &BTreeMap<u64, (Endpoint, Endpoint)>) -> bool {
    let ends: BTreeSet<(Endpoint, Endpoint)> = ours.values().copied().collect();
    ours.values().all(|(local, remote)| ends.contains(&(*remote, *local)))
}

/// `socket:[N]` → N.
fn socket_inode(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// The socket inodes `pids` hold.
pub(crate) fn sockets_of(pids: &[i32]) -> BTreeSet<u64> {
    let mut sockets = BTreeSet::new();
    for pid in pids {
        let Ok(links) = crate::procfs::fd_links(std::path::Path::new(&format!("/proc/{pid}/fd"))) else { continue };
        sockets.extend(links.iter().filter_map(|(_, target)| socket_inode(target)));
    }
    sockets
}

/// A tree's socket inodes and the TCP tables of its network namespaces,
/// read once for a dump: what CRIU needs ([`TreeSockets::tcp`]) and the
/// local ports a restore rebinds ([`TreeSockets::ports`], timewait.rs) are
/// both answered from the same reads (each had read `/proc/<pid>/fd` and
/// `/proc/<pid>/net/tcp{,6}` itself before).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeSockets {
    sockets: BTreeSet<u64>,
    /// Each network namespace's `tcp` and `tcp6` tables, read through the
    /// first of `pids` in it (a pid whose namespace cannot be read is
    /// passed over), in the order of those pids. None read when the tree
    /// holds no socket.
    namespaces: Vec<[Table; 2]>,
}

/// One `/proc/<pid>/net/tcp{,6}` table as read.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Table {
    Text(String),
    /// No such table (no IPv6 on this node).
    Absent,
    Unreadable,
}

impl Table {
    fn read(pid: i32, name: &str) -> Table {
        match std::fs::read_to_string(format!("/proc/{pid}/net/{name}")) {
            Ok(text) => Table::Text(text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Table::Absent,
            Err(_) => Table::Unreadable,
        }
    }
}

impl TreeSockets {
    /// The sockets `pids` hold and their namespaces' tables.
    pub fn read(pids: &[i32]) -> TreeSockets {
        TreeSockets::of_sockets(sockets_of(pids), pids)
    }

    /// `sockets` and the tables of `pids`' network namespaces (one read
    /// per namespace: normally the node's, for all).
    fn of_sockets(sockets: BTreeSet<u64>, pids: &[i32]) -> TreeSockets {
        let mut namespaces = Vec::new();
        if !sockets.is_empty() {
            let mut seen = BTreeSet::new();
            for &pid in pids {
                let Ok(ns) = std::fs::read_link(format!("/proc/{pid}/ns/net")) else { continue };
                if seen.insert(ns) {
                    namespaces.push(["tcp", "tcp6"].map(|name| Table::read(pid, name)));
                }
            }
        }
        TreeSockets { sockets, namespaces }
    }

    /// Whether one of the sockets is a TCP connection in the tables. When
    /// a table cannot be read (or no namespace could) it says yes: the dump
    /// then goes as it always went, never failing for want of the option.
    fn has_connection(&self) -> bool {
        if self.sockets.is_empty() {
            return false;
        }
        self.namespaces.is_empty()
            || self.namespaces.iter().flatten().any(|table| match table {
                Table::Text(text) => connected_inodes(text).iter().any(|i| self.sockets.contains(i)),
                Table::Absent => false,
                Table::Unreadable => true,
            })
    }

    /// What the tree's TCP sockets need (see [`TreeTcp`]). A table that
    /// cannot be read, or a tree in more than one network namespace, is
    /// [`TreeTcp::Outside`]: the lock is kept whenever in doubt.
    pub fn tcp(&self) -> TreeTcp {
        if !self.has_connection() {
            return TreeTcp::None;
        }
        let [tables] = &self.namespaces[..] else { return TreeTcp::Outside };
        let mut ours = BTreeMap::new();
        for table in tables {
            match table {
                Table::Text(text) => ours.extend(connections(text).into_iter().filter(|(inode, _)| self.sockets.contains(inode))),
                Table::Absent => {}
                Table::Unreadable => return TreeTcp::Outside,
            }
        }
        if !ours.is_empty() && peers_all_inside(&ours) {
            TreeTcp::InsideOnly
        } else {
            TreeTcp::Outside
        }
    }

    /// The local TCP ports of the sockets, whatever their state, from the
    /// first namespace's tables (the tree's root's), ascending.
    pub fn ports(&self) -> Vec<u16> {
        let mut ports = BTreeSet::new();
        for table in self.namespaces.first().into_iter().flatten() {
            if let Table::Text(text) = table {
                ports.extend(local_ports(text, &self.sockets));
            }
        }
        ports.into_iter().collect()
    }
}

/// The local ports of the sockets `inodes` in a `/proc/net/tcp` or `tcp6`
/// table, whatever their state (a listener's port is the one that fails).
pub fn local_ports(table: &str, inodes: &BTreeSet<u64>) -> BTreeSet<u16> {
    table
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let inode = f.get(9)?.parse::<u64>().ok()?;
            inodes.contains(&inode).then(|| parse_endpoint(f.get(1)?).map(|e| e.1)).flatten()
        })
        .filter(|port| *port != 0)
        .collect()
}

/// Whether any process of `pids` holds a TCP connection that CRIU can only
/// dump with `--tcp-established` (see [`TreeSockets::has_connection`]).
pub fn tree_has_connections(pids: &[i32]) -> bool {
    TreeSockets::read(pids).has_connection()
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
        let only = |fd: i32| TreeSockets::of_sockets(BTreeSet::from([inode(fd)]), &me);
        assert!(!only(listener.as_raw_fd()).has_connection());
        assert!(only(server.as_raw_fd()).has_connection());
        assert!(only(client.as_raw_fd()).has_connection());
        // The ports from the same reads: the listener's, whatever its state.
        let port = listener.local_addr().unwrap().port();
        assert_eq!(only(listener.as_raw_fd()).ports(), [port]);
        assert!(tree_has_connections(&me));
        assert!(!tree_has_connections(&[]));
        // Both ends are this process's: inside. (Other tests of this binary
        // may hold connections of their own: the table form is below.)
        let tables = std::fs::read_to_string("/proc/self/net/tcp").unwrap();
        let all = connections(&tables);
        let pair: BTreeMap<_, _> = all.iter().filter(|(i, _)| [inode(server.as_raw_fd()), inode(client.as_raw_fd())].contains(i)).map(|(i, c)| (*i, *c)).collect();
        assert_eq!(pair.len(), 2, "{all:?}");
        assert!(peers_all_inside(&pair));
        let one: BTreeMap<_, _> = pair.iter().take(1).map(|(i, c)| (*i, *c)).collect();
        assert!(!peers_all_inside(&one));
    }

    #[test]
    fn addresses_are_read_as_the_kernel_prints_them() {
        let v4 = |a: [u8; 4], p| Some((IpAddr::V4(Ipv4Addr::from(a)), p));
        let cases: [(&str, Option<Endpoint>); 7] = [
            ("0100007F:0CEA", v4([127, 0, 0, 1], 3306)),
            ("0A00A8C0:1F90", v4([192, 168, 0, 10], 8080)),
            // ::1, and ::ffff:127.0.0.1 read as IPv4.
            ("00000000000000000000000001000000:0016", Some((IpAddr::V6(Ipv6Addr::LOCALHOST), 22))),
            ("0000000000000000FFFF00000100007F:0CEA", v4([127, 0, 0, 1], 3306)),
            ("0100007F", None),
            ("0100007:0CEA", None),
            ("0100007F:XYZ", None),
        ];
        for (text, want) in cases {
            assert_eq!(parse_endpoint(text), want, "{text}");
        }
    }

    /// Table-driven: which trees' connections all have their peer inside.
    #[test]
    fn a_tree_needs_no_lock_only_when_every_peer_is_its_own() {
        let e = |port| (IpAddr::V4(Ipv4Addr::LOCALHOST), port);
        let out = (IpAddr::V4(Ipv4Addr::new(10, 0, 0, 9)), 443);
        let c = |a: Endpoint, b: Endpoint| (a, b);
        let cases: [(&str, Vec<(Endpoint, Endpoint)>, bool); 6] = [
            ("nothing", vec![], true),
            ("a pair on localhost", vec![c(e(40000), e(29500)), c(e(29500), e(40000))], true),
            ("two pairs", vec![c(e(40000), e(29500)), c(e(29500), e(40000)), c(e(40001), e(29500)), c(e(29500), e(40001))], true),
            ("one end only (the server is outside)", vec![c(e(40000), e(29500))], false),
            ("a pair and an outside peer", vec![c(e(40000), e(29500)), c(e(29500), e(40000)), c(e(40002), out)], false),
            ("same ports, other direction missing", vec![c(e(40000), e(29500)), c(e(40000), e(29500))], false),
        ];
        for (what, conns, inside) in cases {
            let ours: BTreeMap<u64, _> = conns.into_iter().enumerate().map(|(i, c)| (i as u64 + 1, c)).collect();
            assert_eq!(peers_all_inside(&ours), inside, "{what}");
        }
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:7354 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1001        0 111 1\n\
   1: 0100007F:9C40 0100007F:7354 01 00000000:00000000 00:00000000 00000000  1001        0 222 1\n\
   2: 0100007F:7354 0100007F:9C40 01 00000000:00000000 00:00000000 00000000  1001        0 333 1\n";
        let conns = connections(table);
        assert_eq!(conns.keys().copied().collect::<Vec<_>>(), [222, 333]);
        assert_eq!(conns[&222], (e(40000), e(29524)));
        assert!(peers_all_inside(&conns));
    }
}
