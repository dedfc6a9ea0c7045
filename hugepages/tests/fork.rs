//! The preload library in a real forked child (issue 24, item 2): with
//! `GPU_MODE_FORK_DROP=1`, a child forked without exec no longer holds the
//! descriptors and mappings of files under the prefixes that its parent
//! holds; other files stay, and the parent keeps everything. Without the
//! variable the child keeps them all (the state CRIU could not dump).
//!
//! The program is python3 (a DataLoader worker is a forked Python): it
//! opens and maps a file under the prefix and one outside it, forks, and
//! prints what each process holds.

mod common;

use std::path::Path;
use std::process::Command;

const PROGRAM: &str = r#"
import mmap, os, sys
def target(pid, fd):
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:  # listdir's own descriptor, gone by now
        return ""
def held(pid, needle):
    fds = sum(1 for fd in os.listdir(f"/proc/{pid}/fd") if needle in target(pid, fd))
    maps = sum(1 for l in open(f"/proc/{pid}/maps") if needle in l)
    return f"{fds} fds {maps} maps"
dev, other = sys.argv[1], sys.argv[2]
maps = []
for path in (dev, other):
    fd = os.open(path, os.O_RDWR)
    maps.append(mmap.mmap(fd, 4096, mmap.MAP_SHARED))
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(w, f"child dev {held('self', dev)}; other {held('self', other)}\n".encode())
    os._exit(0)
os.close(w)
print(os.read(r, 200).decode().strip())
os.waitpid(pid, 0)
print(f"parent dev {held('self', dev)}; other {held('self', other)}")
"#;

fn run(dir: &Path, drop: bool) -> String {
    let dev_dir = dir.join("dev");
    std::fs::create_dir_all(&dev_dir).unwrap();
    let (dev, other) = (dev_dir.join("nvidiactl"), dir.join("data"));
    for f in [&dev, &other] {
        std::fs::write(f, vec![0u8; 4096]).unwrap();
    }
    let mut cmd = Command::new("python3");
    cmd.args(["-c", PROGRAM]).arg(&dev).arg(&other).env("LD_PRELOAD", common::built_library()).env("GPU_MODE_HUGEPAGES", "0");
    cmd.env("GPU_MODE_FORK_DROP_PREFIXES", format!("/nonexistent/:{}/", dev_dir.display()));
    if drop {
        cmd.env("GPU_MODE_FORK_DROP", "1");
    }
    let out = cmd.output().expect("python3 (the CI machines have it)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn a_forked_child_drops_what_its_parent_holds_under_the_prefixes_only() {
    let dir = tempfile::tempdir().unwrap();
    // Two descriptors a file: the program's, and the one Python's mmap keeps.
    assert_eq!(run(dir.path(), true), "child dev 0 fds 0 maps; other 2 fds 1 maps\nparent dev 2 fds 1 maps; other 2 fds 1 maps\n");
}

#[test]
fn without_the_setting_a_forked_child_keeps_them() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(run(dir.path(), false), "child dev 2 fds 1 maps; other 2 fds 1 maps\nparent dev 2 fds 1 maps; other 2 fds 1 maps\n");
}
