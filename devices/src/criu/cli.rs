//! The real CRIU: the `criu` binary, by absolute path, with argument vectors,
//! a clean environment and a bound on every run (module docs: why the CLI).

use super::check_cache::CheckCache;
use super::{Criu, CriuError, CriuVersion, DumpReport, DumpRequest, RestoreReport, RestoreRequest};
use crate::command::{run_with_timeout, CommandError};
use crate::privdrop::{HardLimits, Identity};
use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

pub const DUMP_LOG: &str = "dump.log";
/// The image CRIU records the dump's run id in (`dump_criu_run_id`), which
/// names its nftables table (preempt::netlock).
pub const INVENTORY: &str = "inventory.img";
pub const RESTORE_LOG: &str = "restore.log";
/// Where CRIU writes the restored root's pid, in the work directory.
pub const PIDFILE: &str = "restore.pid";
/// How much of a CRIU log root reads back (its end: the verdict is last).
/// The log is the user's file: a bound, not trust, keeps it small.
const LOG_TAIL_BYTES: usize = 1 << 20;
/// CAP_CHECKPOINT_RESTORE exists from Linux 5.9 (capability 40).
const CAP_LAST_NEEDED: u32 = crate::privdrop::CAP_CHECKPOINT_RESTORE;
/// How many threads read a restored process's large mappings, in the
/// environment of the CRIU that scripts/install-criu.sh builds
/// (packaging/criu/0004); other CRIUs ignore it and read with one.
pub const PAGE_READERS_ENV: &str = "CRIU_PAGE_READERS";
/// In the same CRIU's environment ("1"): a large mapping advised
/// MADV_SEQUENTIAL (the driver's buffer, which the huge-page library marks
/// so) is mapped from the pages image, not read (packaging/criu/0007).
pub const MAP_BUFFERS_ENV: &str = "CRIU_MAP_SEQUENTIAL_PAGES";
/// `criu --version` and `criu check` take well under a second.
const QUICK: Duration = Duration::from_secs(30);

pub struct CriuCli {
    pub binary: PathBuf,
    /// Bound on one dump or restore (`preempt.criu_timeout_ms`).
    pub timeout: Duration,
    /// Where a passed check is remembered for the boot (check_cache.rs);
    /// none: every check runs CRIU.
    pub check_cache: Option<CheckCache>,
    /// Threads that read a restored process's large mappings
    /// (`preempt.restore_page_readers`, [`PAGE_READERS_ENV`]).
    pub page_readers: u32,
}

/// Where CRIU (as the user) finds a directory: the descriptor the agent
/// opened and CRIU inherits (module docs).
fn fd_arg(dir_fd: RawFd) -> OsString {
    format!("/proc/self/fd/{dir_fd}").into()
}

/// The two directories of a CRIU run, as the descriptors CRIU inherits.
#[derive(Debug, Clone, Copy)]
pub struct Dirs {
    pub images: RawFd,
    pub work: RawFd,
}

/// `criu dump`'s arguments, the directories being inherited descriptors.
/// The tree is left stopped, as CRIU dumped it: the agent looks at it once
/// more, then kills it (preempt::agent::dump).
pub fn dump_args(req: &DumpRequest, dirs: Dirs) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec!["dump".into(), "--unprivileged".into(), "--tree".into(), req.pid.to_string().into()];
    a.extend(common(dirs, DUMP_LOG, "-v2"));
    a.extend(["--leave-stopped".into(), "--ghost-limit".into(), req.ghost_limit_bytes.to_string().into()]);
    if req.tcp_established {
        a.extend(["--tcp-established".into(), "--network-lock".into(), req.network_lock.as_arg().into()]);
    }
    a
}

/// `criu restore`'s arguments: detached, as the caller's child (sibling of
/// criu), cgroups left alone (criu already runs in the target cgroup), and
/// stopped: the agent checks the tree before it runs, then sends SIGCONT.
/// The root's pid goes to [`PIDFILE`] in the work directory (CRIU's
/// working directory, `--work-dir`).
pub fn restore_args(req: &RestoreRequest, dirs: Dirs) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec!["restore".into(), "--unprivileged".into()];
    // Info level: the restore log then says, with CRIU's other steps, how
    // many page readers read each task's large mappings (packaging/criu/0004),
    // for a restore that takes longer than it should.
    a.extend(common(dirs, RESTORE_LOG, "-v3"));
    a.extend(["--restore-detached".into(), "--restore-sibling".into(), "--leave-stopped".into(), "--pidfile".into(), PIDFILE.into()]);
    if req.tcp_established {
        a.extend(["--tcp-established".into(), "--network-lock".into(), "nftables".into()]);
    }
    if let Some(hold) = &req.hold {
        a.extend(["--action-script".into(), hold.script.clone().into_os_string()]);
    }
    a
}

/// The capabilities CRIU keeps as the user: CAP_CHECKPOINT_RESTORE always
/// (pids, /proc/<pid>/map_files), CAP_NET_ADMIN for TCP repair.
pub fn capabilities(tcp_established: bool) -> Vec<u32> {
    let mut caps = vec![crate::privdrop::CAP_CHECKPOINT_RESTORE];
    if tcp_established {
        caps.push(crate::privdrop::CAP_NET_ADMIN);
    }
    caps
}

fn common(dirs: Dirs, log: &str, verbosity: &str) -> Vec<OsString> {
    vec![
        "--images-dir".into(),
        fd_arg(dirs.images),
        "--work-dir".into(),
        fd_arg(dirs.work),
        "--log-file".into(),
        log.into(),
        verbosity.into(),
        "--file-locks".into(),
        "--ext-unix-sk".into(),
        "--manage-cgroups=ignore".into(),
    ]
}

/// A CRIU log's error lines for the message: the first two (the cause,
/// e.g. the file a task could not open) and the last (the verdict). Lines
/// of restored tasks carry a pid prefix (` 123: Error (...)`). The log is
/// the user's (CRIU wrote it as them, in a directory lent to them): read
/// without following a link, only a regular file of `owner`, and only its
/// last [`LOG_TAIL_BYTES`] (security review N1: a link to /dev/zero, a
/// FIFO or a root file planted as the log).
pub fn log_errors(log: &Path, owner: u32) -> String {
    let (Some(dir), Some(name)) = (log.parent(), log.file_name().and_then(|n| n.to_str())) else { return "no log".into() };
    let text = match crate::fsutil::read_user_file_tail(dir, &[name], owner, LOG_TAIL_BYTES) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return format!("its log was not read: {e}"),
    };
    // RLIMIT_NOFILE is raised best-effort and reported as an error when the
    // hard limit forbids it; it does not fail the run.
    let is_error = |l: &str| l.contains("Error (") && !l.contains("RLIMIT_NOFILE");
    let errors: Vec<&str> = text.lines().filter(|l| is_error(l)).map(str::trim).collect();
    let picked: Vec<&str> = if errors.len() <= 3 { errors } else { vec![errors[0], errors[1], errors[errors.len() - 1]] };
    if picked.is_empty() {
        "no error in its log".into()
    } else {
        picked.join("; ")
    }
}

impl CriuCli {
    fn command(&self, args: &[OsString]) -> Command {
        let mut cmd = Command::new(&self.binary);
        cmd.args(args).env_clear().env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin").current_dir("/");
        cmd
    }

    /// `criu restore` with its arguments, the page readers asked for and
    /// whether the driver's buffer is mapped from the image (the request's).
    fn restore_command(&self, req: &RestoreRequest, dirs: Dirs) -> Command {
        let mut cmd = self.command(&restore_args(req, dirs));
        cmd.env(PAGE_READERS_ENV, self.page_readers.to_string());
        if req.map_buffers {
            cmd.env(MAP_BUFFERS_ENV, "1");
        }
        if let Some(hold) = &req.hold {
            cmd.env(super::HOLD_SOCKET_ENV, &hold.socket);
        }
        cmd
    }

    /// `criu args` as `user` with `caps` and `limits`, inheriting `dirs`
    /// (opened by root; CRIU reopens them through /proc/self/fd). Call
    /// after anything else that must run as root between fork and exec.
    fn as_user(cmd: &mut Command, dirs: [&OwnedFd; 2], user: &Identity, caps: &[u32], limits: &HardLimits) {
        let fds = dirs.map(|d| d.as_raw_fd());
        // SAFETY: fcntl is async-signal-safe; it clears close-on-exec on
        // descriptors this process owns until the exec.
        unsafe {
            cmd.pre_exec(move || {
                for fd in fds {
                    if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        crate::privdrop::run_as_with_caps(cmd, user, caps, limits);
    }

    fn run(&self, verb: &'static str, cmd: Command, log: &Path, owner: u32, bound: Duration) -> Result<(), CriuError> {
        self.run_watched(verb, cmd, log, owner, bound, &mut || None)
    }

    /// [`Self::run`], CRIU killed as soon as `watch` gives a reason.
    fn run_watched(
        &self,
        verb: &'static str,
        cmd: Command,
        log: &Path,
        owner: u32,
        bound: Duration,
        watch: &mut dyn FnMut() -> Option<String>,
    ) -> Result<(), CriuError> {
        let out = crate::command::run_watched(cmd, None, bound, watch).map_err(|e| match e {
            CommandError::Timeout { ms, .. } => CriuError::Timeout { verb, ms: ms as u64, log: log.to_path_buf() },
            CommandError::Stopped { why, .. } => CriuError::Stopped { verb, why, log: log.to_path_buf() },
            CommandError::Spawn { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                CriuError::Missing { path: self.binary.clone(), detail: source.to_string() }
            }
            other => CriuError::Other { verb, detail: other.to_string() },
        })?;
        if out.status.success() {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        let detail = if stderr.is_empty() { log_errors(log, owner) } else { format!("{}; {stderr}", log_errors(log, owner)) };
        Err(CriuError::Failed { verb, status: out.status.to_string(), detail, log: log.to_path_buf() })
    }

    fn version(&self, bound: Duration) -> Result<CriuVersion, CriuError> {
        if !self.binary.is_absolute() {
            return Err(CriuError::Missing { path: self.binary.clone(), detail: "not an absolute path".into() });
        }
        let out = run_with_timeout(self.command(&["--version".into()]), None, bound).map_err(|e| match e {
            CommandError::Spawn { source, .. } => CriuError::Missing { path: self.binary.clone(), detail: source.to_string() },
            other => CriuError::Other { verb: "--version", detail: other.to_string() },
        })?;
        let text = String::from_utf8_lossy(&out.stdout);
        CriuVersion::parse(&text)
            .ok_or_else(|| CriuError::Missing { path: self.binary.clone(), detail: format!("no version in {:?}", text.trim()) })
    }

    /// `criu --version` and `criu check` (with the kernel's capability
    /// floor first).
    fn check_now(&self, bound: Duration) -> Result<CriuVersion, CriuError> {
        let last = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap").ok().and_then(|s| s.trim().parse::<u32>().ok()).unwrap_or(0);
        if last < CAP_LAST_NEEDED {
            return Err(CriuError::CheckFailed {
                path: self.binary.clone(),
                detail: format!(
                    "CRIU runs as the job's user with CAP_CHECKPOINT_RESTORE, which this kernel lacks (its last capability is {last}): \
                     checkpoint mode needs Linux 5.9 or newer"
                ),
            });
        }
        let version = self.version(bound)?;
        if !version.new_enough() {
            return Err(CriuError::TooOld { path: self.binary.clone(), version: version.to_string() });
        }
        let out = run_with_timeout(self.command(&["check".into()]), None, bound)
            .map_err(|e| CriuError::CheckFailed { path: self.binary.clone(), detail: e.to_string() })?;
        if !out.status.success() {
            let text = String::from_utf8_lossy(&out.stderr).lines().filter(|l| l.starts_with("Error")).collect::<Vec<_>>().join("; ");
            return Err(CriuError::CheckFailed { path: self.binary.clone(), detail: text });
        }
        Ok(version)
    }
}

impl CriuCli {
    /// [`Criu::check`] with each of `criu --version` and `criu check`
    /// bounded by `bound`: the node checker's readiness check must end
    /// well within its own deadline.
    pub fn check_within(&self, bound: Duration) -> Result<CriuVersion, CriuError> {
        if let Some(version) = self.check_cache.as_ref().and_then(|c| c.passed(&self.binary)) {
            return Ok(version);
        }
        let version = self.check_now(bound)?;
        if let Some(cache) = &self.check_cache {
            cache.remember(&self.binary, &version);
        }
        Ok(version)
    }
}

impl Criu for CriuCli {
    fn check(&self) -> Result<CriuVersion, CriuError> {
        self.check_within(QUICK)
    }

    fn dump(&self, req: &DumpRequest) -> Result<DumpReport, CriuError> {
        let log = req.work_dir.join(DUMP_LOG);
        let images = open_dir(&req.images_dir, "dump")?;
        let work = open_dir(&req.work_dir, "dump")?;
        let mut cmd = self.command(&dump_args(req, Dirs { images: images.as_raw_fd(), work: work.as_raw_fd() }));
        Self::as_user(&mut cmd, [&images, &work], &req.user, &capabilities(req.tcp_established), &req.limits);
        let start = Instant::now();
        // The images may not outgrow the tree (N5): measured as CRIU writes.
        let mut watch = || {
            let bound = req.max_image_bytes?;
            let bytes = allocated_bytes(&req.images_dir);
            (bytes > bound).then(|| format!("its images took {bytes} bytes, past this tree's bound of {bound} bytes (the tree's memory x 1.5 and its ghost files)"))
        };
        self.run_watched("dump", cmd, &log, req.user.uid, self.timeout, &mut watch)?;
        Ok(DumpReport { ms: start.elapsed().as_secs_f64() * 1000.0, log })
    }

    fn restore(&self, req: &RestoreRequest) -> Result<RestoreReport, CriuError> {
        let log = req.work_dir.join(RESTORE_LOG);
        let other = |detail: String| CriuError::Other { verb: "restore", detail };
        let images = open_dir(&req.images_dir, "restore")?;
        let work = open_dir(&req.work_dir, "restore")?;
        let mut cmd = self.restore_command(req, Dirs { images: images.as_raw_fd(), work: work.as_raw_fd() });
        req.cgroup.join_before_exec(&mut cmd).map_err(|e| other(e.to_string()))?;
        Self::as_user(&mut cmd, [&images, &work], &req.user, &capabilities(req.tcp_established), &req.limits);
        let start = Instant::now();
        self.run("restore", cmd, &log, req.user.uid, self.timeout)?;
        let ms = start.elapsed().as_secs_f64() * 1000.0;
        // Written by CRIU as the user: read without following links, owned
        // by the user, bounded; the caller compares it with the image's root.
        let text = crate::fsutil::read_user_file(&req.work_dir, &[PIDFILE], req.user.uid, 32)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .map_err(|e| other(e.to_string()))?;
        let pid = text.trim().parse().map_err(|_| other(format!("no root pid in {} ({:?})", req.work_dir.join(PIDFILE).display(), text.trim())))?;
        Ok(RestoreReport { pid, ms, log })
    }
}

/// The blocks the files directly in `dir` take (not their apparent sizes:
/// ghost files are sparse), each looked at without following a link. CRIU
/// writes the images flat; what else may be there is the user's and counts
/// the same.
pub fn allocated_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries.flatten().filter_map(|e| std::fs::symlink_metadata(e.path()).ok()).map(|m| m.blocks() * 512).sum()
}

/// A directory of the run, opened by root without following a link, for
/// CRIU to inherit.
fn open_dir(dir: &Path, verb: &'static str) -> Result<OwnedFd, CriuError> {
    crate::fsutil::open_dir_nofollow(dir).map_err(|e| CriuError::Other { verb, detail: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::criu::{NetworkLock, TargetCgroup};

    fn strings(a: Vec<OsString>) -> Vec<String> {
        a.into_iter().map(|s| s.to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn argument_vectors_say_what_the_module_docs_promise() {
        let user = Identity { uid: 1001, gid: 1001, groups: vec![1001] };
        let limits = HardLimits::default();
        let dirs = Dirs { images: 9, work: 10 };
        let dump = DumpRequest {
            pid: 42,
            images_dir: "/img/7/0".into(),
            work_dir: "/img/7/.criu-0-dump".into(),
            tcp_established: false,
            network_lock: NetworkLock::Nftables,
            ghost_limit_bytes: 1 << 20,
            user: user.clone(),
            limits: limits.clone(),
            max_image_bytes: None,
        };
        assert_eq!(
            strings(dump_args(&dump, dirs)).join(" "),
            "dump --unprivileged --tree 42 --images-dir /proc/self/fd/9 --work-dir /proc/self/fd/10 --log-file dump.log -v2 \
             --file-locks --ext-unix-sk --manage-cgroups=ignore --leave-stopped --ghost-limit 1048576"
        );
        let tcp = DumpRequest { tcp_established: true, ..dump };
        assert!(strings(dump_args(&tcp, dirs)).join(" ").ends_with("--tcp-established --network-lock nftables"));
        // Every peer inside the tree (issue 37 N2): no lock, no table left.
        let inside = DumpRequest { network_lock: NetworkLock::Skip, ..tcp.clone() };
        assert!(strings(dump_args(&inside, dirs)).join(" ").ends_with("--tcp-established --network-lock skip"));
        let restore = RestoreRequest {
            images_dir: "/img/7/0".into(),
            work_dir: "/img/7/.criu-0-restore".into(),
            cgroup: TargetCgroup { lines: vec![], procs_files: vec![] },
            tcp_established: false,
            user,
            limits,
            hold: None,
            map_buffers: true,
        };
        let dirs = Dirs { images: 11, work: 12 };
        let text = strings(restore_args(&restore, dirs)).join(" ");
        assert_eq!(
            text,
            "restore --unprivileged --images-dir /proc/self/fd/11 --work-dir /proc/self/fd/12 --log-file restore.log -v3 \
             --file-locks --ext-unix-sk --manage-cgroups=ignore --restore-detached --restore-sibling --leave-stopped --pidfile restore.pid"
        );
        assert!(!text.contains("--shell-job"));
        let cli = CriuCli { binary: "/usr/sbin/criu".into(), timeout: Duration::from_secs(5), check_cache: None, page_readers: 6 };
        let cmd = cli.restore_command(&restore, dirs);
        let mut env: Vec<(String, String)> =
            cmd.get_envs().map(|(k, v)| (k.to_string_lossy().into_owned(), v.unwrap_or_default().to_string_lossy().into_owned())).collect();
        env.sort();
        assert_eq!(
            env,
            [
                ("CRIU_MAP_SEQUENTIAL_PAGES".to_string(), "1".to_string()),
                ("CRIU_PAGE_READERS".into(), "6".into()),
                ("PATH".into(), "/usr/sbin:/usr/bin:/sbin:/bin".into())
            ]
        );
        // The agent's hold: its binary as the action script, its socket in the environment.
        let held = RestoreRequest {
            hold: Some(super::super::HoldScript { script: "/usr/libexec/a".into(), socket: "/run/s/job-7.sock".into() }),
            ..restore.clone()
        };
        assert!(strings(restore_args(&held, dirs)).join(" ").ends_with("--pidfile restore.pid --action-script /usr/libexec/a"));
        let cmd = cli.restore_command(&held, dirs);
        assert!(cmd.get_envs().any(|(k, v)| k == "GPU_MODE_HOLD_SOCKET" && v == Some("/run/s/job-7.sock".as_ref())));
        // A buffer the agent wants read (a cold image): no variable.
        let read = RestoreRequest { map_buffers: false, ..restore.clone() };
        assert!(!cli.restore_command(&read, dirs).get_envs().any(|(k, _)| k == MAP_BUFFERS_ENV), "CRIU_MAP_SEQUENTIAL_PAGES without map_buffers");
        assert_eq!(capabilities(false), [40]);
        assert_eq!(capabilities(true), [40, 12]);
    }

    /// N5: the bound, and a "CRIU" whose images outgrow it is stopped.
    #[test]
    fn a_dump_whose_images_outgrow_the_trees_bound_is_stopped() {
        assert_eq!(super::super::image_bound(100 << 20, 1 << 20, 64), (150 << 20) + (64 << 20) + (64 << 20));
        assert_eq!(super::super::image_bound(u64::MAX, 1, 1), u64::MAX);
        let dir = tempfile::tempdir().unwrap();
        let (images, work) = (dir.path().join("images"), dir.path().join("work"));
        std::fs::create_dir(&images).unwrap();
        std::fs::create_dir(&work).unwrap();
        // Writes 1 MiB into the images every 50 ms, for 10 s at most.
        let fake = dir.path().join("criu");
        std::fs::write(&fake, "#!/bin/sh\nfor i in $(seq 200); do head -c 1048576 /dev/urandom > \"$IMAGES/pages-$i.img\"; sleep 0.05; done\n").unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let cli = CriuCli { binary: fake, timeout: Duration::from_secs(30), check_cache: None, page_readers: 1 };
        let mut cmd = cli.command(&["dump".into()]);
        cmd.env("IMAGES", &images);
        let start = Instant::now();
        let mut watch = || {
            let bytes = allocated_bytes(&images);
            (bytes > 4 << 20).then(|| format!("{bytes} bytes"))
        };
        let me = unsafe { libc::geteuid() };
        let err = cli.run_watched("dump", cmd, &work.join(DUMP_LOG), me, cli.timeout, &mut watch).unwrap_err();
        assert!(matches!(&err, CriuError::Stopped { verb: "dump", .. }), "{err:?}");
        assert!(start.elapsed() < Duration::from_secs(5), "stopped after {:?}", start.elapsed());
        let kept = allocated_bytes(&images);
        assert!(kept > 4 << 20 && kept < 16 << 20, "{kept} bytes written before the stop");
    }

    /// N3: CRIU's words for a pid or thread id held here, and only those.
    #[test]
    fn a_pid_or_thread_id_held_here_is_told_apart() {
        let failed = |detail: &str| CriuError::Failed { verb: "restore", status: "exit status: 1".into(), detail: detail.into(), log: "/l".into() };
        let cases = [
            ("  4242: Error (criu/pie/restorer.c:2105): Unable to create a thread: -17; Error (criu/cr-restore.c:2344): Restoring FAILED.", true),
            ("Error (criu/cr-restore.c:1230): Can't fork for 4242: File exists; Error (criu/cr-restore.c:2344): Restoring FAILED.", true),
            ("Error (criu/cr-restore.c:1230): Can't fork for 4242: Resource temporarily unavailable", false),
            ("  4242: Error (criu/pie/restorer.c:2105): Unable to create a thread: -12", false),
            ("Error (criu/files-reg.c:2294): File x has bad mode", false),
        ];
        for (detail, taken) in cases {
            assert_eq!(failed(detail).pid_taken(), taken, "{detail}");
        }
        assert!(!CriuError::Other { verb: "restore", detail: "Unable to create a thread: -17".into() }.pid_taken());
        // packaging/criu/0007's restorer, where mapping the buffer failed.
        let mapped = "  4242: Error (criu/pie/restorer.c:2190): Can't map pages from the image (-12); Error (criu/cr-restore.c:2344): Restoring FAILED.";
        assert!(failed(mapped).buffer_mapping_failed() && !failed(mapped).pid_taken());
        assert!(!failed("Error (criu/files-reg.c:2294): File x has bad mode").buffer_mapping_failed());
    }

    #[test]
    fn a_missing_or_relative_binary_is_named() {
        let cli = CriuCli { binary: "/nonexistent/criu".into(), timeout: Duration::from_secs(5), check_cache: None, page_readers: 1 };
        let err = cli.check().unwrap_err().to_string();
        assert!(err.contains("CRIU is not installed at /nonexistent/criu") && err.contains("install-criu.sh"), "{err}");
        let cli = CriuCli { binary: "criu".into(), timeout: Duration::from_secs(5), check_cache: None, page_readers: 1 };
        assert!(matches!(cli.check(), Err(CriuError::Missing { .. })));
    }

    #[test]
    fn an_old_criu_is_refused_by_version() {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("criu");
        std::fs::write(&fake, "#!/bin/sh\necho 'Version: 3.17.1'\n").unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let err = CriuCli { binary: fake, timeout: Duration::from_secs(5), check_cache: None, page_readers: 1 }.check().unwrap_err().to_string();
        assert!(err.contains("is version 3.17.1") && err.contains("needs CRIU 4.0 or later"), "{err}");
    }

    #[test]
    fn log_errors_skip_the_rlimit_noise() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("dump.log");
        let me = unsafe { libc::geteuid() };
        std::fs::write(
            &log,
            "Warn (a): x\nError (criu/util.c:1533): rlimit: Can't setup RLIMIT_NOFILE for self\nError (b): No space left on device\n",
        )
        .unwrap();
        assert_eq!(log_errors(&log, me), "Error (b): No space left on device");
        std::fs::write(
            &log,
            " 12999: Error (criu/files-reg.c:2353): Can't open file x/bait on restore: Permission denied\n\
             pie: 1: Warn (x): y\n 12999: Error (criu/files.c:1221): Unable to open fd=3 id=0x9\n\
             Error (a): step\nError (criu/cr-restore.c:2320): Restoring FAILED.\n",
        )
        .unwrap();
        assert_eq!(
            log_errors(&log, me),
            "12999: Error (criu/files-reg.c:2353): Can't open file x/bait on restore: Permission denied; \
             12999: Error (criu/files.c:1221): Unable to open fd=3 id=0x9; Error (criu/cr-restore.c:2320): Restoring FAILED."
        );
        assert_eq!(log_errors(&dir.path().join("none"), me), "no error in its log");
        // The user's file, read as one (N1): a link, a FIFO, another owner's.
        std::os::unix::fs::symlink("/etc/shadow", dir.path().join("link.log")).unwrap();
        assert!(log_errors(&dir.path().join("link.log"), me).contains("is a symlink"));
        nix::unistd::mkfifo(&dir.path().join("fifo.log"), nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert!(log_errors(&dir.path().join("fifo.log"), me).contains("not a regular file"));
        assert!(log_errors(&log, me + 1).contains("expected uid"));
    }
}
