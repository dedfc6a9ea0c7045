//! Two Slurm nodes on one machine ([`crate::ClusterSpec::second_node`]): each
//! slurmd runs in a network namespace of its own, on a private bridge
//! (10.213.<n>.0/24: the host end is slurmctld's address, nothing is routed
//! off the machine), and in a mount namespace of its own where the cluster's
//! `sim/` and `run/` folders are the node's (`nodes/<node>/`): its own
//! simulated GPUs (other UUIDs) and runtime directory, while the image
//! directory, the job output and everything else are shared, as on nodes
//! with shared storage. Everything slurmd starts (prolog, epilog, the
//! checkpoint agent, CRIU, the jobs) inherits both namespaces. Debian's
//! Slurm is not built for several slurmds per host, hence one address each.

use anyhow::{bail, Context, Result};
use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The network of a two-node cluster, named after its slurmctld port (unique
/// among running clusters).
#[derive(Debug, Clone)]
pub struct NodeNet {
    pub bridge: String,
    /// The third octet of 10.213.x.0/24.
    pub subnet: u8,
    /// `(node, netns, host-side veth)`, in node order.
    pub nodes: Vec<(String, String, String)>,
}

fn ip_tool() -> Result<&'static str> {
    ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .context("`ip` (iproute2) is needed for a two-node cluster")
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new(ip_tool()?).args(args).output()?;
    if !out.status.success() {
        bail!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

impl NodeNet {
    pub fn new(ctld_port: u16, nodes: &[&str]) -> NodeNet {
        NodeNet {
            bridge: format!("gmbr{ctld_port}"),
            subnet: (ctld_port % 200 + 20) as u8,
            nodes: nodes
                .iter()
                .enumerate()
                .map(|(i, n)| (n.to_string(), format!("gmc{ctld_port}{i}"), format!("gmv{ctld_port}{i}")))
                .collect(),
        }
    }

    /// slurmctld's address (the bridge's).
    pub fn host_addr(&self) -> String {
        format!("10.213.{}.1", self.subnet)
    }

    /// Node `i`'s address.
    pub fn node_addr(&self, i: usize) -> String {
        format!("10.213.{}.{}", self.subnet, i + 2)
    }

    /// Creates the bridge, the namespaces and their links (after removing
    /// what an earlier run with the same names left).
    pub fn create(&self) -> Result<()> {
        self.remove();
        ip(&["link", "add", &self.bridge, "type", "bridge"])?;
        ip(&["addr", "add", &format!("{}/24", self.host_addr()), "dev", &self.bridge])?;
        ip(&["link", "set", &self.bridge, "up"])?;
        for (i, (_, ns, veth)) in self.nodes.iter().enumerate() {
            let peer = format!("{veth}p");
            ip(&["netns", "add", ns])?;
            ip(&["link", "add", veth, "type", "veth", "peer", "name", &peer])?;
            ip(&["link", "set", veth, "master", &self.bridge])?;
            ip(&["link", "set", veth, "up"])?;
            ip(&["link", "set", &peer, "netns", ns])?;
            ip(&["-n", ns, "link", "set", &peer, "name", "eth0"])?;
            ip(&["-n", ns, "addr", "add", &format!("{}/24", self.node_addr(i)), "dev", "eth0"])?;
            ip(&["-n", ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(())
    }

    /// Removes the namespaces and the bridge (the veths go with them).
    pub fn remove(&self) {
        for (_, ns, _) in &self.nodes {
            let _ = ip(&["netns", "del", ns]);
        }
        let _ = ip(&["link", "del", &self.bridge]);
    }

    /// Makes `cmd` run in node `i`'s namespaces: its network namespace, and a
    /// private mount namespace with `binds` (node folder → cluster path) mounted.
    pub fn enter(&self, i: usize, cmd: &mut Command, binds: &[(PathBuf, PathBuf)]) -> Result<std::fs::File> {
        let ns = std::fs::File::open(format!("/run/netns/{}", self.nodes[i].1)).context("opening the node's netns")?;
        let fd = ns.as_raw_fd();
        let cstr = |p: &Path| CString::new(p.as_os_str().as_encoded_bytes()).context("a path with a NUL");
        let binds: Vec<(CString, CString)> = binds.iter().map(|(s, d)| Ok((cstr(s)?, cstr(d)?))).collect::<Result<_>>()?;
        let root = CString::new("/").unwrap();
        // SAFETY: only system calls between fork and exec; every string was
        // made before the fork. The returned File keeps the fd open until
        // the caller has spawned.
        unsafe {
            cmd.pre_exec(move || {
                let fail = || Err(std::io::Error::last_os_error());
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 || libc::unshare(libc::CLONE_NEWNS) != 0 {
                    return fail();
                }
                // Private first: the binds must not leak into the host's namespace.
                if libc::mount(std::ptr::null(), root.as_ptr(), std::ptr::null(), libc::MS_REC | libc::MS_PRIVATE, std::ptr::null()) != 0 {
                    return fail();
                }
                for (src, dst) in &binds {
                    if libc::mount(src.as_ptr(), dst.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()) != 0 {
                        return fail();
                    }
                }
                Ok(())
            });
        }
        Ok(ns)
    }
}

/// Gives node `b`'s simulated GPUs UUIDs of their own (the fixture's are
/// the same on every simulated node): the first field becomes `0b0b0b0b`.
pub fn rename_sim_gpus(state: &Path) -> Result<()> {
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(state)?)?;
    for g in v["gpus"].as_array_mut().context("no gpus in the simulated state")? {
        let uuid = g["uuid"].as_str().context("a GPU without uuid")?.to_string();
        let rest = uuid.splitn(3, '-').nth(2).context("an odd uuid")?;
        g["uuid"] = format!("GPU-0b0b0b0b-{rest}").into();
    }
    std::fs::write(state, serde_json::to_vec_pretty(&v)?)?;
    Ok(())
}
