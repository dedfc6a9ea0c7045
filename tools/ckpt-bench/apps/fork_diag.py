"""What a child forked after CUDA started holds, and whether the tree can be
checkpointed once the child drops it (issue 24, item 2). For a GPU machine:

    python3 fork_diag.py --criu /opt/slurm-gpu-mode/criu/bin/criu --dir /tmp/fork-diag

1. A PyTorch process puts 256 MiB on the GPU and pins 64 MiB of host memory,
   then forks a child without exec (a DataLoader worker of the fork start
   method); the child waits for commands on a pipe.
2. Lists the /dev/nvidia* descriptors and mappings of both, and the child's
   CUDA state as the driver sees it.
3. The driver checkpoints the parent; what is left of /dev/nvidia* in each;
   `criu dump --leave-running` of the tree (expected to fail on the child's
   inherited files).
4. The child closes its /dev/nvidia* descriptors and unmaps its
   /dev/nvidia* mappings (what a pthread_atfork child handler would do);
   `criu dump --leave-running` again.
5. The driver restores and unlocks the parent; the parent's tensors are
   checked; the child is asked to end.
Prints one line per finding; exits 0 when the parent's data came back.
"""

import argparse
import os
import subprocess
import sys
import time

from cuda.bindings import driver as cu


def say(*a):
    print(*a, flush=True)


def call(result, what):
    err = result[0] if isinstance(result, tuple) else result
    ok = err == cu.CUresult.CUDA_SUCCESS
    return ok, (result[1] if isinstance(result, tuple) and len(result) > 1 else None), err


def nvidia_files(pid):
    out = []
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                t = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if t.startswith("/dev/nvidia"):
                out.append(f"fd {fd} {t}")
    except OSError as e:
        out.append(f"fds unreadable: {e}")
    for line in open(f"/proc/{pid}/maps"):
        if "/dev/nvidia" in line:
            w = line.split()
            out.append(f"map {w[0]} {w[1]} {w[-1]}")
    return out


def child_loop(r, w):
    """The forked child: answers commands until told to end."""
    f = os.fdopen(r)
    for cmd in f:
        cmd = cmd.strip()
        if cmd == "drop":
            closed, unmapped = [], []
            for fd in os.listdir("/proc/self/fd"):
                try:
                    if os.readlink(f"/proc/self/fd/{fd}").startswith("/dev/nvidia"):
                        os.close(int(fd))
                        closed.append(fd)
                except OSError:
                    pass
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
            for line in open("/proc/self/maps").read().splitlines():
                if "/dev/nvidia" in line:
                    a, b = (int(x, 16) for x in line.split()[0].split("-"))
                    rc = libc.munmap(a, b - a)
                    unmapped.append(f"{line.split()[0]}={rc}")
            os.write(w, f"dropped fds {closed} maps {unmapped}\n".encode())
        elif cmd == "end":
            os._exit(0)


def criu_dump(criu, pid, d, tag):
    os.makedirs(d, exist_ok=True)
    log = f"{tag}.log"
    rc_file = os.path.join(d, "rc")
    t = time.time()
    # CRIU must not be in the tree it dumps: `setsid -f` detaches the shell
    # that runs it from ours (its parent exits at once).
    line = f"{criu} dump -t {pid} -D {d} -o {log} -v4 --leave-running --shell-job --file-locks --ext-unix-sk; echo $? > {rc_file}"
    subprocess.run(["setsid", "-f", "sh", "-c", line], check=True)
    while not os.path.exists(rc_file) and time.time() - t < 120:
        time.sleep(0.1)
    time.sleep(0.1)
    rc = open(rc_file).read().strip() if os.path.exists(rc_file) else "none (timed out)"
    errs = [l for l in open(os.path.join(d, log), errors="replace") if "Error" in l or "rror (" in l][:8]
    say(f"criu dump ({tag}): rc {rc} in {time.time() - t:.1f} s; errors: {''.join(errs).strip() or 'none'}")
    return rc == "0"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--criu", required=True)
    ap.add_argument("--dir", required=True)
    a = ap.parse_args()
    import torch

    x = torch.arange(64 << 20, dtype=torch.int32, device="cuda")
    pinned = torch.ones(16 << 20, dtype=torch.int32).pin_memory()
    torch.cuda.synchronize()
    want = int(x.to(torch.int64).sum().item())
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(w1)
        os.close(r2)
        child_loop(r1, w2)
        os._exit(0)
    os.close(r1)
    os.close(w2)
    cmd = os.fdopen(w1, "w")
    ans = os.fdopen(r2)
    me = os.getpid()
    time.sleep(0.5)
    for who, p in (("parent", me), ("child", pid)):
        files = nvidia_files(p)
        say(f"{who} {p}: {len(files)} /dev/nvidia* files:")
        for f in files:
            say(f"  {f}")
    # The driver's view of each, from another process (as the agent asks).
    def state(p):
        q = subprocess.run([sys.executable, "-c", f"from cuda.bindings import driver as cu; cu.cuInit(0); print(cu.cuCheckpointProcessGetState({p}))"],
                           capture_output=True, text=True)
        return (q.stdout + q.stderr).strip()[-200:]
    say(f"driver state of the parent: {state(me)}")
    say(f"driver state of the child: {state(pid)}")
    ctl = f"""
import sys
from cuda.bindings import driver as cu
cu.cuInit(0)
p = {me}
verb = sys.argv[1]
if verb == 'checkpoint':
    a = cu.CUcheckpointLockArgs(); a.timeoutMs = 10000
    print(cu.cuCheckpointProcessLock(p, a), cu.cuCheckpointProcessCheckpoint(p, cu.CUcheckpointCheckpointArgs()))
else:
    print(cu.cuCheckpointProcessRestore(p, cu.CUcheckpointRestoreArgs()), cu.cuCheckpointProcessUnlock(p, cu.CUcheckpointUnlockArgs()))
"""
    q = subprocess.run([sys.executable, "-c", ctl, "checkpoint"], capture_output=True, text=True)
    say(f"driver checkpoint of the parent: {(q.stdout + q.stderr).strip()[-300:]}")
    for who, p in (("parent", me), ("child", pid)):
        files = nvidia_files(p)
        say(f"after the driver's checkpoint, {who}: {files}")
    # CRIU cannot dump its own caller: a helper process does, on our tree.
    first = criu_dump(a.criu, me, os.path.join(a.dir, "dump1"), "with-inherited") if a.criu else None
    cmd.write("drop\n")
    cmd.flush()
    say(f"child: {ans.readline().strip()}")
    say(f"after the drop, child: {nvidia_files(pid)}")
    second = criu_dump(a.criu, me, os.path.join(a.dir, "dump2"), "after-drop") if a.criu else None
    q = subprocess.run([sys.executable, "-c", ctl, "restore"], capture_output=True, text=True)
    say(f"driver restore+unlock of the parent: {(q.stdout + q.stderr).strip()[-300:]}")
    got = int(x.to(torch.int64).sum().item())
    ok = got == want and int(pinned.sum().item()) == 16 << 20
    cmd.write("end\n")
    cmd.flush()
    _, status = os.waitpid(pid, 0)
    say(f"RESULT: dump with inherited files {'ok' if first else 'FAILED'}; after the drop {'ok' if second else 'FAILED'}; "
        f"parent data {'intact' if ok else 'CHANGED'}; child exit status {status}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
