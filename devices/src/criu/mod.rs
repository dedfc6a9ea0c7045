//! CRIU: dumping a process tree to image files and restoring it, behind the
//! [`Criu`] trait so the checkpoint agent's orchestration is tested against a
//! recording double ([`RecordingCriu`]) and runs the real binary ([`CriuCli`]).
//!
//! # CLI, not RPC
//!
//! youki drives CRIU through its RPC (the rust-criu crate: `criu swrk` on a
//! socketpair, protobuf messages). We run the `criu` binary with an argument
//! vector instead, because:
//!
//! * the restored tree must be *our* child so the agent can relay its exit
//!   status to the job: `--restore-detached --restore-sibling` makes it a
//!   sibling of criu, i.e. a child of the agent, and `--pidfile` names it;
//! * the tree must land in the new job's cgroup, not the one it was dumped
//!   from: we start criu inside that cgroup (written to `cgroup.procs`
//!   between fork and exec) and pass `--manage-cgroups=ignore`, so CRIU
//!   neither recreates the old job's cgroup path (what `soft`/`full` do, seen)
//!   nor moves anything; the caller checks /proc/<pid>/cgroup afterwards;
//! * every run is one line an operator can repeat by hand with the same
//!   options, and leaves `dump.log`/`restore.log` beside the images;
//! * no protobuf code generation or extra crates on 2-core build machines,
//!   and no coupling to the .proto of one CRIU release.
//!
//! No shell is ever involved: the binary is an absolute path from the config
//! and every argument is a separate argv element.
//!
//! # Options, and why
//!
//! * `--file-locks`: jobs hold flock/POSIX locks (checkpoint files, sqlite).
//! * `--ext-unix-sk`: unix sockets connected outside the tree (syslog,
//!   nscd) would otherwise fail the dump.
//! * `--tcp-established` when asked: a tree with TCP connections between its
//!   own processes (torch.distributed's store) fails to dump without it.
//!   Connections to outside peers only restore where their addresses exist.
//!   With it `--network-lock` ([`NetworkLock`]): `skip` when every peer is a
//!   socket of the tree (all of it is frozen, dumped and killed together),
//!   else `nftables` (which needs no iptables binary): CRIU then leaves a
//!   table `inet CRIU-<run id>` that only a restore on the same node removes
//!   (preempt::netlock records and removes it otherwise; issue 37 N2).
//! * `--ghost-limit N`: a deleted file the tree holds is copied into the
//!   image (a ghost file) only up to N bytes of blocks (the site's
//!   `preempt.ghost_limit_mib`; CRIU's own default is 1 MiB); how many
//!   such files a tree may hold is bounded before the dump
//!   (preempt::uncheckpointable).
//! * no `--shell-job`: the wrapper starts the application as the leader of a
//!   session of its own, with no controlling terminal, so the tree shares no
//!   session or terminal with the batch shell and CRIU needs no shell-job
//!   handling (which would tie the restore to the restoring shell's session).
//! * `--leave-stopped` on dump: the tree stays as CRIU froze it, so the
//!   agent can see what the image holds (a GPU file opened after its scan
//!   makes an image that can never be restored) before it kills the tree:
//!   the job is being preempted; its memory now lives in the images.
//! * `--leave-stopped` on restore: the tree does not run before the agent
//!   has checked it (the job's user, no capabilities, in the job's cgroup,
//!   files the user may hold: preempt::held).
//!
//! # As the job's user (`--unprivileged`)
//!
//! CRIU never runs as root: dump and restore run with the job user's uid,
//! gids and groups and only the capabilities CRIU's unprivileged mode needs
//! (CAP_CHECKPOINT_RESTORE, kernel 5.9 or newer, and CAP_NET_ADMIN for
//! `--tcp-established`), as ambient capabilities (privdrop::run_as_with_caps).
//! So every file CRIU opens, at dump and at restore, is opened with the
//! user's rights: a path the user swapped for a link to a root file is not
//! opened (security review F1, R1, R2), and nothing root opened is ever
//! handed to the user. The user's own processes cannot ptrace CRIU (it has
//! capabilities they lack) and cannot reach the images: the run directory
//! is lent to the user only for the dump (preempt::images::Lent), whose
//! seal takes every file back; a restore reads root's read-only files
//! (preempt::images::ImageStore::open_for_restore). Both lie under root's 0700 directories;
//! CRIU gets the run directory as an inherited descriptor (`--images-dir
//! /proc/self/fd/N`). Everything CRIU writes besides images (its log, the
//! restored root's pid `--pidfile restore.pid`, caches) goes to a separate
//! work directory lent to the user (`--work-dir /proc/self/fd/M`), also
//! CRIU's working directory, so restored tasks, which start with CRIU's
//! working directory, never hold the images' (security review N1). Root
//! reads that directory back only through bounded, `O_NOFOLLOW`,
//! owner-checked reads. CRIU's hard resource limits are the tree's own,
//! recorded at the dump (privdrop::HardLimits). The cgroup is joined as
//! root before the identity changes.

mod cgroup;
mod check_cache;
mod cli;
pub mod patches;
mod recording;
mod version;

pub use cgroup::{CgroupError, CgroupLine, TargetCgroup};
pub use check_cache::{CheckCache, FILE as CHECK_CACHE_FILE};
pub use cli::{capabilities, CriuCli, DUMP_LOG, INVENTORY};
pub use recording::{CriuCall, RecordingCriu};
/// In CRIU's environment for the hold script: the agent's socket.
pub const HOLD_SOCKET_ENV: &str = "GPU_MODE_HOLD_SOCKET";
pub use version::{CriuVersion, MIN_MAJOR};

use crate::privdrop::{HardLimits, Identity};
use std::path::PathBuf;

/// Dump the tree rooted at `pid` into `images_dir` (which must exist, empty,
/// and be writable by `user`), as `user`, writing its log in `work_dir`
/// (empty, writable by `user`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DumpRequest {
    pub pid: i32,
    pub images_dir: PathBuf,
    pub work_dir: PathBuf,
    /// `--tcp-established` and CAP_NET_ADMIN: only for a tree that holds
    /// TCP connections (preempt::tcp).
    pub tcp_established: bool,
    /// With `tcp_established`: how CRIU keeps the connections quiet.
    pub network_lock: NetworkLock,
    /// `--ghost-limit`: the most blocks of one deleted file the image
    /// carries (issue 37 N5; the count is bounded before the dump).
    pub ghost_limit_bytes: u64,
    /// The job's user: CRIU runs as them (module docs).
    pub user: Identity,
    /// CRIU's hard resource limits: the tree's.
    pub limits: HardLimits,
    /// The most the images may take while CRIU writes them (N5;
    /// [`image_bound`]); past it CRIU is killed and the dump fails.
    pub max_image_bytes: Option<u64>,
}

/// `--network-lock` of a dump with `--tcp-established` (a restore takes the
/// dump's, which CRIU records in the image).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkLock {
    /// An nftables table `inet CRIU-<run id>` dropping the connections'
    /// packets both ways, left in place after the dump.
    #[default]
    Nftables,
    /// None: every peer is inside the frozen tree (preempt::tcp).
    Skip,
}

impl NetworkLock {
    pub fn as_arg(self) -> &'static str {
        match self {
            NetworkLock::Nftables => "nftables",
            NetworkLock::Skip => "skip",
        }
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DumpReport {
    pub ms: f64,
    /// CRIU's log of the run, in the work directory.
    pub log: PathBuf,
}

/// Restore the tree in `images_dir` (readable by `user`, writable by no
/// one but root), detached, as a child of the caller, inside `cgroup`, as
/// `user`, with its log and pid file in `work_dir` (empty, writable by `user`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreRequest {
    pub images_dir: PathBuf,
    pub work_dir: PathBuf,
    pub cgroup: TargetCgroup,
    pub tcp_established: bool,
    /// The job's user: CRIU runs as them (module docs).
    pub user: Identity,
    /// CRIU's hard resource limits: the tree's, as its manifest recorded
    /// them (what a restored task can get at most).
    pub limits: HardLimits,
    /// The agent's hold (preempt::agent::hold): CRIU runs `script` as its
    /// action script, with `socket` (the agent's) in its environment.
    pub hold: Option<HoldScript>,
    /// The driver's checkpoint buffer mapped from the image instead of read
    /// (`CRIU_MAP_SEQUENTIAL_PAGES`, packaging/criu/0007): the agent's
    /// choice for this image (preempt::page_cache).
    pub map_buffers: bool,
}

/// An action script that holds the restore at `pre-resume`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldScript {
    pub script: PathBuf,
    pub socket: PathBuf,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RestoreReport {
    /// The restored tree's root (the dumped root's pid: CRIU keeps pids).
    pub pid: i32,
    pub ms: f64,
    pub log: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CriuError {
    #[error("CRIU is not installed at {path} ({detail}): run scripts/install-criu.sh, or set preempt.criu")]
    Missing { path: PathBuf, detail: String },
    #[error(
        "CRIU at {path} is version {version}; checkpointing needs CRIU {MIN_MAJOR}.0 or later (Debian bookworm's 3.17 \
         fails on current kernels): scripts/install-criu.sh builds 4.1.1"
    )]
    TooOld { path: PathBuf, version: String },
    #[error("`{path} check` fails on this node: {detail}")]
    CheckFailed { path: PathBuf, detail: String },
    #[error("criu {verb} failed ({status}): {detail} (log: {})", log.display())]
    Failed { verb: &'static str, status: String, detail: String, log: PathBuf },
    #[error("criu {verb} did not finish within {} s and was killed (log: {})", ms / 1000, log.display())]
    Timeout { verb: &'static str, ms: u64, log: PathBuf },
    #[error("criu {verb}: {detail}")]
    Other { verb: &'static str, detail: String },
    /// Killed while it ran (the dump's image bound, N5).
    #[error("criu {verb} was stopped: {why} (log: {})", log.display())]
    Stopped { verb: &'static str, why: String, log: PathBuf },
}

impl CriuError {
    /// A restore that failed because a pid or thread id of the image is
    /// held on this node (CRIU's fork or clone3 with set_tid: EEXIST):
    /// another node may have it free (security review N3: a second user
    /// held a thread id, and the job failed instead of moving).
    pub fn pid_taken(&self) -> bool {
        let CriuError::Failed { detail, .. } = self else { return false };
        detail.contains("Unable to create a thread: -17") || (detail.contains("Can't fork for") && detail.contains("File exists"))
    }

    /// A restore that failed where the restorer mapped the driver's buffer
    /// from the image (packaging/criu/0007): read instead, it may succeed.
    pub fn buffer_mapping_failed(&self) -> bool {
        matches!(self, CriuError::Failed { detail, .. } if detail.contains("Can't map pages from the image"))
    }
}

/// The most a dump's images may take: the tree's memory (resident and
/// swapped, after the driver's checkpoint has copied GPU memory into it)
/// and half again (CRIU's own files, page alignment), its ghost files
/// (`ghost_limit` each, at most `max_deleted` of them: the agent refuses
/// more), and 64 MiB.
pub fn image_bound(memory_bytes: u64, ghost_limit: u64, max_deleted: u64) -> u64 {
    memory_bytes.saturating_add(memory_bytes / 2).saturating_add(ghost_limit.saturating_mul(max_deleted)).saturating_add(64 << 20)
}

/// What the agent needs from CRIU.
pub trait Criu: Send + Sync {
    /// The binary exists, is new enough, and `criu check` passes here.
    fn check(&self) -> Result<CriuVersion, CriuError>;
    /// Dumps the tree and leaves it stopped (the caller kills it). On
    /// failure CRIU resumes it.
    fn dump(&self, req: &DumpRequest) -> Result<DumpReport, CriuError>;
    /// Restores the tree detached, as the caller's child, in `req.cgroup`.
    fn restore(&self, req: &RestoreRequest) -> Result<RestoreReport, CriuError>;
}
