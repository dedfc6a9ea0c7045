#!/usr/bin/env python3
"""Baseline for gpu-mode-ckpt-bench: the same lock/checkpoint/restore/unlock
cycle through NVIDIA's own Python binding (cuda.bindings.driver), one thread
per process, each phase timed. Prints one JSON object on stdout.

Usage: baseline.py --pids 123,456 [--lock-timeout-ms 10000]
"""
import argparse
import json
import threading
import time

from cuda.bindings import driver as cu


def check(result, what, pid):
    err = result[0] if isinstance(result, tuple) else result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what}(pid {pid}) failed: {err}")


def lock(pid, timeout_ms):
    args = cu.CUcheckpointLockArgs()
    args.timeoutMs = timeout_ms
    check(cu.cuCheckpointProcessLock(pid, args), "cuCheckpointProcessLock", pid)


def checkpoint(pid, _):
    check(cu.cuCheckpointProcessCheckpoint(pid, cu.CUcheckpointCheckpointArgs()), "cuCheckpointProcessCheckpoint", pid)


def leftover(pid):
    """/dev/nvidia* descriptors and mappings the process still holds."""
    import os
    fds = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            fds += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/dev/nvidia")
        except OSError:
            pass
    with open(f"/proc/{pid}/maps") as f:
        maps = sum(1 for line in f if " /dev/nvidia" in line)
    return {"fds": fds, "maps": maps}


def restore(pid, _):
    check(cu.cuCheckpointProcessRestore(pid, cu.CUcheckpointRestoreArgs()), "cuCheckpointProcessRestore", pid)


def unlock(pid, _):
    check(cu.cuCheckpointProcessUnlock(pid, cu.CUcheckpointUnlockArgs()), "cuCheckpointProcessUnlock", pid)


def phase(fn, pids, arg):
    """Runs fn on every pid at once; returns wall ms and per-pid ms."""
    per_pid, errors = {}, []

    def worker(pid):
        t = time.perf_counter()
        try:
            fn(pid, arg)
        except Exception as e:  # reported, never swallowed
            errors.append(str(e))
        per_pid[pid] = (time.perf_counter() - t) * 1000.0

    start = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(p,)) for p in pids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = (time.perf_counter() - start) * 1000.0
    if errors:
        raise RuntimeError("; ".join(errors))
    return {"wall_ms": wall, "per_pid_ms": per_pid}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pids", required=True)
    ap.add_argument("--lock-timeout-ms", type=int, default=10000)
    a = ap.parse_args()
    pids = [int(p) for p in a.pids.split(",")]
    check(cu.cuInit(0), "cuInit", 0)
    out = {}
    for name, fn in (("lock", lock), ("checkpoint", checkpoint), ("restore", restore), ("unlock", unlock)):
        out[name] = phase(fn, pids, a.lock_timeout_ms)
        if name == "checkpoint":
            out["gpu_files_after_checkpoint"] = {p: leftover(p) for p in pids}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
