//! The cgroup a restored tree must land in: the new job's, taken from a
//! process already in it (the wrapper), as the `cgroup.procs` files a child
//! writes "0" to between fork and exec to join it (cgroup v1 and v2).

use std::ffi::CString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

/// Why a restored tree cannot be put in, or was not found in, the job's
/// cgroups. The agent refuses the restore on each (a tree outside the job's
/// cgroup escapes its limits and accounting).
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// /proc/<pid>/cgroup or /proc/self/mountinfo.
    #[error("{path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    /// Another cgroup namespace: we could not put the tree there.
    #[error("cgroup {path} is outside the mounted {root} at {point}")]
    OutsideMount { path: String, root: String, point: PathBuf },
    #[error("cgroup path {path:?} contains '..'")]
    DotDot { path: String },
    #[error("{file} has a NUL byte")]
    NulByte { file: PathBuf },
    /// `hierarchy`: `cgroup v2` or `<controllers> hierarchy`.
    #[error("pid {pid} is in cgroup {found} ({hierarchy}), not the job's {want}")]
    Elsewhere { pid: i32, found: String, hierarchy: String, want: String },
    #[error("pid {pid} has no {hierarchy} cgroup")]
    Missing { pid: i32, hierarchy: String },
}

/// A /proc file read whole, its path named on failure.
fn read_proc(path: String) -> Result<String, CgroupError> {
    std::fs::read_to_string(&path).map_err(|source| CgroupError::Read { path: path.into(), source })
}

/// One line of /proc/<pid>/cgroup: `id:controllers:path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupLine {
    pub id: String,
    /// `memory`, `cpu,cpuacct`, `name=systemd`; empty for cgroup v2.
    pub controllers: String,
    pub path: String,
}

/// A cgroup mount from /proc/self/mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mount {
    /// The cgroup path mounted (not "/" inside a cgroup namespace).
    root: String,
    point: PathBuf,
    v2: bool,
    options: Vec<String>,
}

/// Where to put a process: the cgroups of a reference process, on every
/// mounted hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetCgroup {
    /// The reference process's lines on the hierarchies mounted here (the
    /// ones joined, and checked afterwards).
    pub lines: Vec<CgroupLine>,
    /// `cgroup.procs` of each hierarchy that is mounted here.
    pub procs_files: Vec<PathBuf>,
}

pub fn parse_proc_cgroup(text: &str) -> Vec<CgroupLine> {
    text.lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            Some(CgroupLine { id: parts.next()?.into(), controllers: parts.next()?.into(), path: parts.next()?.into() })
        })
        .collect()
}

fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let f: Vec<&str> = left.split(' ').collect();
            let r: Vec<&str> = right.split(' ').collect();
            let v2 = match *r.first()? {
                "cgroup2" => true,
                "cgroup" => false,
                _ => return None,
            };
            let options = r.get(2).map(|o| o.split(',').map(String::from).collect()).unwrap_or_default();
            Some(Mount { root: unescape(f.get(3)?), point: PathBuf::from(unescape(f.get(4)?)), v2, options })
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as \ooo.
fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        match u8::from_str_radix(rest.get(i + 1..i + 4).unwrap_or(""), 8) {
            Ok(b) => {
                out.push(b as char);
                rest = &rest[i + 4..];
            }
            Err(_) => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The mount holding `line`'s hierarchy, if it is mounted here.
fn mount_for<'a>(line: &CgroupLine, mounts: &'a [Mount]) -> Option<&'a Mount> {
    if line.controllers.is_empty() {
        return mounts.iter().find(|m| m.v2);
    }
    let wanted: Vec<&str> = line.controllers.split(',').collect();
    mounts.iter().find(|m| !m.v2 && wanted.iter().all(|c| m.options.iter().any(|o| o == c)))
}

/// The lines whose hierarchy is mounted here, each with its `cgroup.procs`.
/// A path outside a mount's root (another cgroup namespace) is an error: we
/// could not put the tree there.
fn joinable(lines: Vec<CgroupLine>, mounts: &[Mount]) -> Result<Vec<(CgroupLine, PathBuf)>, CgroupError> {
    let mut out = Vec::new();
    for line in lines {
        let Some(m) = mount_for(&line, mounts) else { continue };
        let rel = if m.root == "/" { Some(line.path.as_str()) } else { line.path.strip_prefix(m.root.as_str()) };
        let rel = rel.ok_or_else(|| CgroupError::OutsideMount { path: line.path.clone(), root: m.root.clone(), point: m.point.clone() })?;
        let rel = rel.trim_start_matches('/');
        if rel.split('/').any(|c| c == "..") {
            return Err(CgroupError::DotDot { path: line.path.clone() });
        }
        let file = m.point.join(rel).join("cgroup.procs");
        out.push((line, file));
    }
    Ok(out)
}

impl TargetCgroup {
    /// The cgroups `pid` is in now.
    pub fn of_pid(pid: i32) -> Result<TargetCgroup, CgroupError> {
        let text = read_proc(format!("/proc/{pid}/cgroup"))?;
        let mounts = read_proc("/proc/self/mountinfo".into())?;
        Self::from_texts(&text, &mounts)
    }

    fn from_texts(cgroup: &str, mountinfo: &str) -> Result<TargetCgroup, CgroupError> {
        let (lines, procs_files) = joinable(parse_proc_cgroup(cgroup), &parse_mountinfo(mountinfo))?.into_iter().unzip();
        Ok(TargetCgroup { lines, procs_files })
    }

    /// Makes `cmd`'s child join these cgroups before it execs.
    pub fn join_before_exec(&self, cmd: &mut Command) -> Result<(), CgroupError> {
        let files: Vec<CString> = self
            .procs_files
            .iter()
            .map(|p| CString::new(p.as_os_str().as_encoded_bytes()).map_err(|_| CgroupError::NulByte { file: p.clone() }))
            .collect::<Result<_, _>>()?;
        // SAFETY: open/write/close are async-signal-safe; the paths were
        // built before the fork.
        unsafe {
            cmd.pre_exec(move || {
                for f in &files {
                    let fd = libc::open(f.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    let ok = libc::write(fd, b"0".as_ptr().cast(), 1) == 1;
                    let err = std::io::Error::last_os_error();
                    libc::close(fd);
                    if !ok {
                        return Err(err);
                    }
                }
                Ok(())
            });
        }
        Ok(())
    }

    /// Checks that `pid` is in exactly these cgroups on every hierarchy we
    /// could join: a tree restored into another job's cgroup escapes this
    /// job's limits and accounting.
    pub fn verify(&self, pid: i32) -> Result<(), CgroupError> {
        let text = read_proc(format!("/proc/{pid}/cgroup"))?;
        self.verify_text(pid, &text)
    }

    fn verify_text(&self, pid: i32, text: &str) -> Result<(), CgroupError> {
        let now = parse_proc_cgroup(text);
        for want in &self.lines {
            match now.iter().find(|l| l.id == want.id && l.controllers == want.controllers) {
                Some(l) if l.path == want.path => {}
                Some(l) => {
                    return Err(CgroupError::Elsewhere { pid, found: l.path.clone(), hierarchy: hierarchy(want), want: want.path.clone() })
                }
                None => return Err(CgroupError::Missing { pid, hierarchy: hierarchy(want) }),
            }
        }
        Ok(())
    }
}

fn hierarchy(l: &CgroupLine) -> String {
    if l.controllers.is_empty() {
        "cgroup v2".into()
    } else {
        format!("{} hierarchy", l.controllers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1_MOUNTS: &str = "\
30 25 0:26 / /sys/fs/cgroup/cpu rw,relatime shared:9 - cgroup cgroup rw,cpu
31 25 0:27 / /sys/fs/cgroup/memory rw,relatime shared:10 - cgroup cgroup rw,memory
32 25 0:28 / /sys/fs/cgroup/systemd rw,relatime shared:11 - cgroup cgroup rw,name=systemd
33 25 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:12 - cgroup cgroup rw,cpuacct,cpu
40 22 0:5 / /proc rw - proc proc rw
";
    const V2_MOUNTS: &str = "35 24 0:30 / /sys/fs/cgroup rw,nosuid shared:6 - cgroup2 cgroup2 rw,nsdelegate\n";

    #[test]
    fn v2_lines_map_to_the_unified_mount() {
        let t = TargetCgroup::from_texts("0::/system.slice/slurmstepd.scope/job_7/step_batch/user/task_0\n", V2_MOUNTS).unwrap();
        assert_eq!(
            t.procs_files,
            vec![PathBuf::from("/sys/fs/cgroup/system.slice/slurmstepd.scope/job_7/step_batch/user/task_0/cgroup.procs")]
        );
    }

    #[test]
    fn v1_lines_map_to_their_controllers_mounts_and_unmounted_ones_are_skipped() {
        let text = "9:name=systemd:/\n4:memory:/slurm/uid_1001/job_7/step_batch\n2:cpuacct,cpu:/slurm/job_7\n0::/\n";
        let t = TargetCgroup::from_texts(text, V1_MOUNTS).unwrap();
        assert_eq!(
            t.procs_files,
            vec![
                PathBuf::from("/sys/fs/cgroup/systemd/cgroup.procs"),
                PathBuf::from("/sys/fs/cgroup/memory/slurm/uid_1001/job_7/step_batch/cgroup.procs"),
                PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/slurm/job_7/cgroup.procs"),
            ]
        );
    }

    #[test]
    fn paths_outside_a_namespaced_mount_or_with_dotdot_are_refused() {
        let ns = "35 24 0:30 /job_7 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            TargetCgroup::from_texts("0::/job_7/step_0\n", ns).unwrap().procs_files,
            vec![PathBuf::from("/sys/fs/cgroup/step_0/cgroup.procs")]
        );
        let err = TargetCgroup::from_texts("0::/job_8/step_0\n", ns).unwrap_err();
        assert!(matches!(err, CgroupError::OutsideMount { .. }), "{err:?}");
        assert_eq!(err.to_string(), "cgroup /job_8/step_0 is outside the mounted /job_7 at /sys/fs/cgroup");
        let err = TargetCgroup::from_texts("0::/a/../b\n", V2_MOUNTS).unwrap_err();
        assert!(matches!(err, CgroupError::DotDot { .. }), "{err:?}");
        assert_eq!(err.to_string(), r#"cgroup path "/a/../b" contains '..'"#);
        let nul = TargetCgroup { lines: vec![], procs_files: vec![PathBuf::from("/a\0b")] };
        let err = nul.join_before_exec(&mut Command::new("/bin/true")).unwrap_err();
        assert!(matches!(err, CgroupError::NulByte { .. }), "{err:?}");
        assert_eq!(err.to_string(), "/a\0b has a NUL byte");
    }

    #[test]
    fn verify_names_the_wrong_cgroup() {
        let t = TargetCgroup::from_texts("0::/job_9/step_batch\n", V2_MOUNTS).unwrap();
        assert!(t.verify_text(5, "0::/job_9/step_batch\n").is_ok());
        let err = t.verify_text(5, "0::/job_7/step_batch\n").unwrap_err();
        assert!(matches!(err, CgroupError::Elsewhere { pid: 5, .. }), "{err:?}");
        assert_eq!(err.to_string(), "pid 5 is in cgroup /job_7/step_batch (cgroup v2), not the job's /job_9/step_batch");
        let v1 = TargetCgroup::from_texts("4:memory:/slurm/job_9\n", V1_MOUNTS).unwrap();
        let err = v1.verify_text(5, "0::/\n").unwrap_err();
        assert!(matches!(err, CgroupError::Missing { pid: 5, .. }), "{err:?}");
        assert_eq!(err.to_string(), "pid 5 has no memory hierarchy cgroup");
        let err = TargetCgroup::of_pid(i32::MAX).unwrap_err();
        assert!(matches!(err, CgroupError::Read { .. }), "{err:?}");
        assert!(err.to_string().starts_with(&format!("/proc/{}/cgroup: ", i32::MAX)), "{err}");
    }

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape("/a\\040b"), "/a b");
        assert_eq!(unescape("/plain"), "/plain");
    }

    #[test]
    fn this_process_has_a_target() {
        let t = TargetCgroup::of_pid(std::process::id() as i32).unwrap();
        assert!(!t.lines.is_empty());
        t.verify(std::process::id() as i32).unwrap();
    }
}
