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
//! TIME_WAIT entries on those ports through the kernel's sock_diag netlink
//! family (SOCK_DESTROY, as iproute2's `ss -K`; root's CAP_NET_ADMIN; the
//! kernel's `CONFIG_INET_DIAG_DESTROY`). A TIME_WAIT entry only guards
//! against late packets of a closed connection; on these ports the
//! connections were the tree's own. On a kernel without SOCK_DESTROY the
//! entries stay and the restore may fail as before: said in the restore's
//! line, never an error.

use std::time::Duration;

/// How long the kernel may take to answer one netlink request.
const SS_WAIT: Duration = Duration::from_secs(10);

// SOCK_DESTROY through the kernel's sock_diag netlink family, written here
// by hand: the project's dependencies hold no netlink crate, and iproute2's
// `ss -K`, which does the same, is missing on some nodes (the GPU machines
// had no /usr/bin/ss: the first version of this module asked it, and the
// restore failed as before). Layouts from linux/netlink.h and
// linux/inet_diag.h; host byte order but for the socket id's ports and
// addresses, which are copied as the kernel gave them.

/// sock_diag message types.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const SOCK_DESTROY: u16 = 21;
/// include/net/tcp_states.h.
const TCP_TIME_WAIT: u32 = 6;
/// `struct nlmsghdr`, `struct inet_diag_req_v2`, `struct inet_diag_msg`.
const NLMSG_HDR: usize = 16;
const REQ_V2: usize = 56;
const DIAG_MSG: usize = 72;
/// `struct inet_diag_sockid`: at offset 8 of a request, 4 of a message.
const SOCKID: usize = 48;

/// One TIME_WAIT entry: its family and socket id as the kernel gave them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub family: u8,
    pub sockid: [u8; SOCKID],
}

impl Entry {
    /// Its local port.
    pub fn sport(&self) -> u16 {
        u16::from_be_bytes([self.sockid[0], self.sockid[1]])
    }
}

/// A netlink message: header and `struct inet_diag_req_v2` (TCP, the
/// TIME_WAIT state, `sockid`).
pub fn request(kind: u16, flags: u16, seq: u32, family: u8, sockid: &[u8; SOCKID]) -> Vec<u8> {
    let mut m = Vec::with_capacity(NLMSG_HDR + REQ_V2);
    m.extend_from_slice(&((NLMSG_HDR + REQ_V2) as u32).to_ne_bytes());
    m.extend_from_slice(&kind.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&[family, libc::IPPROTO_TCP as u8, 0, 0]);
    m.extend_from_slice(&(1u32 << TCP_TIME_WAIT).to_ne_bytes());
    m.extend_from_slice(sockid);
    m
}

/// What one datagram of the kernel's answers says: the entries it lists,
/// whether the dump is done, and an error (a negative errno) or an ack (0).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Answer {
    pub entries: Vec<Entry>,
    pub done: bool,
    pub status: Option<i32>,
}

/// Parses one datagram of netlink messages.
pub fn parse(buf: &[u8]) -> Answer {
    let mut a = Answer::default();
    let mut at = 0;
    while at + NLMSG_HDR <= buf.len() {
        let u32_at = |i: usize| u32::from_ne_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
        let len = u32_at(at) as usize;
        let kind = u16::from_ne_bytes([buf[at + 4], buf[at + 5]]);
        if len < NLMSG_HDR || at + len > buf.len() {
            break;
        }
        let body = &buf[at + NLMSG_HDR..at + len];
        match kind as i32 {
            libc::NLMSG_DONE => a.done = true,
            libc::NLMSG_ERROR if body.len() >= 4 => a.status = Some(i32::from_ne_bytes([body[0], body[1], body[2], body[3]])),
            _ if kind == SOCK_DIAG_BY_FAMILY && body.len() >= DIAG_MSG && u32::from(body[1]) == TCP_TIME_WAIT => {
                let mut sockid = [0u8; SOCKID];
                sockid.copy_from_slice(&body[4..4 + SOCKID]);
                a.entries.push(Entry { family: body[0], sockid });
            }
            _ => {}
        }
        at += (len + 3) & !3;
    }
    a
}

/// A sock_diag netlink socket (closed when dropped).
struct Diag(std::os::fd::OwnedFd);

impl Diag {
    fn open() -> std::io::Result<Diag> {
        use std::os::fd::FromRawFd;
        // SAFETY: socket(2) with constant arguments; the descriptor is owned below.
        let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, libc::NETLINK_SOCK_DIAG) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor of ours; a receive waits at most SS_WAIT.
        let diag = Diag(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
        let tv = libc::timeval { tv_sec: SS_WAIT.as_secs() as libc::time_t, tv_usec: 0 };
        // SAFETY: setsockopt with a timeval of ours.
        unsafe { libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVTIMEO, (&tv as *const libc::timeval).cast(), std::mem::size_of::<libc::timeval>() as u32) };
        Ok(diag)
    }

    fn send(&self, msg: &[u8]) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        // SAFETY: a zeroed sockaddr_nl is the kernel's address once its family is set.
        let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        kernel.nl_family = libc::AF_NETLINK as u16;
        let len = std::mem::size_of::<libc::sockaddr_nl>() as u32;
        // SAFETY: sendto with a buffer and an address of ours.
        let sent = unsafe { libc::sendto(self.0.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0, (&kernel as *const libc::sockaddr_nl).cast(), len) };
        if sent < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    fn receive(&self) -> std::io::Result<Answer> {
        use std::os::fd::AsRawFd;
        let mut buf = vec![0u8; 64 << 10];
        // SAFETY: recv into a buffer of ours, of its length.
        let n = unsafe { libc::recv(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(parse(&buf[..n as usize]))
    }

    /// The node's TCP TIME_WAIT entries of `family`.
    fn time_wait(&self, family: u8, seq: u32) -> std::io::Result<Vec<Entry>> {
        let flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
        self.send(&request(SOCK_DIAG_BY_FAMILY, flags, seq, family, &[0; SOCKID]))?;
        let mut out = Vec::new();
        loop {
            let a = self.receive()?;
            out.extend(a.entries);
            if let Some(e) = a.status.filter(|e| *e < 0) {
                return Err(std::io::Error::from_raw_os_error(-e));
            }
            if a.done {
                return Ok(out);
            }
        }
    }

    /// Deletes one entry; the kernel's answer.
    fn destroy(&self, e: &Entry, seq: u32) -> std::io::Result<()> {
        let flags = (libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16;
        self.send(&request(SOCK_DESTROY, flags, seq, e.family, &e.sockid))?;
        match self.receive()?.status {
            Some(0) | None => Ok(()),
            Some(e) => Err(std::io::Error::from_raw_os_error(-e)),
        }
    }
}

/// The node's TCP TIME_WAIT entries whose local port is one of `ports`.
pub fn entries_on(ports: &[u16]) -> Result<Vec<Entry>, String> {
    let diag = Diag::open().map_err(|e| format!("no sock_diag netlink socket: {e}"))?;
    let mut out = Vec::new();
    for (seq, family) in [(1, libc::AF_INET as u8), (2, libc::AF_INET6 as u8)] {
        let entries = diag.time_wait(family, seq).map_err(|e| format!("cannot list TIME_WAIT entries: {e}"))?;
        out.extend(entries.into_iter().filter(|e| ports.contains(&e.sport())));
    }
    Ok(out)
}

/// Deletes the node's TCP TIME_WAIT entries whose local port is one of
/// `ports` (IPv4 and IPv6); how many. An entry gone meanwhile is not an
/// error; a kernel without SOCK_DESTROY (`CONFIG_INET_DIAG_DESTROY`) is.
pub fn clear(ports: &[u16]) -> Result<usize, String> {
    let diag = Diag::open().map_err(|e| format!("no sock_diag netlink socket: {e}"))?;
    let mut cleared = 0;
    let mut seq = 1;
    for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
        seq += 1;
        let entries = diag.time_wait(family, seq).map_err(|e| format!("cannot list TIME_WAIT entries: {e}"))?;
        for e in entries.iter().filter(|e| ports.contains(&e.sport())) {
            seq += 1;
            match diag.destroy(e, seq) {
                Ok(()) => cleared += 1,
                Err(err) if err.raw_os_error() == Some(libc::ENOENT) => {}
                Err(err) => return Err(format!("cannot delete the TIME_WAIT entry on port {}: {err} (SOCK_DESTROY)", e.sport())),
            }
        }
    }
    Ok(cleared)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_answers_have_the_kernels_layout() {
        let mut id = [0u8; SOCKID];
        id[..2].copy_from_slice(&42465u16.to_be_bytes());
        let m = request(SOCK_DESTROY, 5, 7, libc::AF_INET as u8, &id);
        assert_eq!(m.len(), 72);
        assert_eq!(u32::from_ne_bytes(m[0..4].try_into().unwrap()), 72);
        assert_eq!((u16::from_ne_bytes([m[4], m[5]]), u16::from_ne_bytes([m[6], m[7]]), u32::from_ne_bytes(m[8..12].try_into().unwrap())), (21, 5, 7));
        assert_eq!(&m[16..20], &[libc::AF_INET as u8, libc::IPPROTO_TCP as u8, 0, 0]);
        assert_eq!(u32::from_ne_bytes(m[20..24].try_into().unwrap()), 1 << 6, "TIME_WAIT only");
        assert_eq!(&m[24..72], &id);
        // An answer: one TIME_WAIT entry, one established one, then DONE.
        let diag = |state: u8, port: u16| {
            let mut body = vec![libc::AF_INET as u8, state, 0, 0];
            let mut sid = [0u8; SOCKID];
            sid[..2].copy_from_slice(&port.to_be_bytes());
            body.extend_from_slice(&sid);
            body.extend_from_slice(&[0u8; 20]);
            let mut h = ((NLMSG_HDR + body.len()) as u32).to_ne_bytes().to_vec();
            h.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
            h.extend_from_slice(&[0u8; 10]);
            h.extend(body);
            h
        };
        let mut buf = diag(6, 42465);
        buf.extend(diag(1, 80));
        let mut done = 20u32.to_ne_bytes().to_vec();
        done.extend_from_slice(&(libc::NLMSG_DONE as u16).to_ne_bytes());
        done.extend_from_slice(&[0u8; 14]);
        buf.extend(done);
        let a = parse(&buf);
        assert!(a.done);
        assert_eq!(a.entries.iter().map(Entry::sport).collect::<Vec<_>>(), [42465]);
        // An error answer: -EOPNOTSUPP.
        let mut err = 36u32.to_ne_bytes().to_vec();
        err.extend_from_slice(&(libc::NLMSG_ERROR as u16).to_ne_bytes());
        err.extend_from_slice(&[0u8; 10]);
        err.extend_from_slice(&(-libc::EOPNOTSUPP).to_ne_bytes());
        err.extend_from_slice(&[0u8; 16]);
        assert_eq!(parse(&err).status, Some(-libc::EOPNOTSUPP));
    }

    /// Issue 38's bind failure, made here: a listener without SO_REUSEADDR
    /// (as NCCL's) whose accepted connection closes first leaves a
    /// TIME_WAIT entry on the listener's port, and a new socket cannot bind
    /// it even with SO_REUSEADDR (as CRIU's restore binds) until [`clear`].
    #[test]
    fn a_time_wait_entry_that_blocks_a_rebind_is_cleared() {
        if unsafe { libc::geteuid() } != 0 {
            return gpu_mode_testkit::skipped(&gpu_mode_testkit::this_test(), "needs root (CAP_NET_ADMIN)");
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
        let cleared = clear(&[port]);
        let after = rebind();
        if matches!(&cleared, Err(e) if e.contains("Operation not supported")) {
            return gpu_mode_testkit::skipped(&gpu_mode_testkit::this_test(), "a kernel without CONFIG_INET_DIAG_DESTROY");
        }
        assert_eq!(before.map_err(|e| e.raw_os_error()), Err(Some(libc::EADDRINUSE)), "the TIME_WAIT entry blocks the rebind");
        assert_eq!(cleared, Ok(1), "one entry on port {port}");
        assert!(after.is_ok(), "the rebind after the clearing: {after:?}");
    }
}
