#!/usr/bin/env python3
"""Where the driver's checkpoint spends its time in a real PyTorch process
(issue 17), on one GPU machine, in one bounded run. Prints one line per
measurement and a JSON summary at the end.

1. The node: transparent huge pages (THP) settings, the kernel command line.
2. Host memory first touch, with and without madvise(MADV_HUGEPAGE): the
   driver's checkpoint writes the GPU memory into fresh host memory of the
   process, and CRIU's restore reads the image into fresh memory again.
3. For each program variant (the plain framework_app.py, the same with
   glibc's malloc asked for huge pages, and with gpu-mode-run's huge-page
   shim preloaded, libgpu_mode_hugepages.so), N cycles of the driver's
   lock + checkpoint + restore + unlock on the same process, alternating
   "direct" with "nvml-before" (NVML's process query just before the lock,
   as the agent makes it): a paired test of whether that query slows the
   checkpoint. After the first checkpoint: where the process's host memory
   now is (its largest anonymous mappings, their huge pages and flags) and
   how much of it is zero pages.

    python3 ckpt_diag.py --app /abs/framework_app.py --gib 8 --cycles 4 \
        [--shim /abs/libgpu_mode_hugepages.so] [--variants plain,malloc-hugetlb,shim]

Read-only for the GPU's settings: it changes no compute mode, MIG,
persistence, clocks or power, and never resets a GPU.
"""

import argparse
import json
import mmap
import os
import subprocess
import sys
import tempfile
import time

from cuda.bindings import driver as cu

PAGE = 4096


def say(*a):
    print(*a, flush=True)


def check(result, what):
    err = result[0] if isinstance(result, tuple) else result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what} failed: {err}")


def timed(fn):
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def lock(pid):
    a = cu.CUcheckpointLockArgs()
    a.timeoutMs = 10000
    check(cu.cuCheckpointProcessLock(pid, a), "lock")


def checkpoint(pid):
    check(cu.cuCheckpointProcessCheckpoint(pid, cu.CUcheckpointCheckpointArgs()), "checkpoint")


def restore(pid):
    check(cu.cuCheckpointProcessRestore(pid, cu.CUcheckpointRestoreArgs()), "restore")


def unlock(pid):
    check(cu.cuCheckpointProcessUnlock(pid, cu.CUcheckpointUnlockArgs()), "unlock")


def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError as e:
        return f"unreadable: {e}"


def node_facts():
    thp = "/sys/kernel/mm/transparent_hugepage"
    facts = {name: read(f"{thp}/{name}") for name in ("enabled", "defrag", "shmem_enabled", "khugepaged/defrag")}
    facts["cmdline"] = read("/proc/cmdline")
    mem = {}
    for line in read("/proc/meminfo").splitlines():
        k, _, v = line.partition(":")
        if k in ("MemTotal", "MemFree", "AnonHugePages", "HugePages_Total", "Hugepagesize"):
            mem[k] = v.strip()
    facts["meminfo"] = mem
    return facts


def first_touch(gib, huge):
    """GiB/s of writing one byte per page of fresh anonymous memory."""
    import numpy as np

    n = int(gib * (1 << 30))
    m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if huge:
        m.madvise(mmap.MADV_HUGEPAGE)
    a = np.frombuffer(m, dtype=np.uint8)
    t = time.perf_counter()
    a[::PAGE] = 1
    secs = time.perf_counter() - t
    rollup = smaps_rollup(os.getpid())
    del a
    m.close()
    return gib / secs, rollup.get("AnonHugePages", 0)


def smaps_rollup(pid):
    out = {}
    for line in read(f"/proc/{pid}/smaps_rollup").splitlines()[1:]:
        k, _, v = line.partition(":")
        parts = v.split()
        if parts and parts[0].isdigit():
            out[k] = int(parts[0]) * 1024
    return out


def mappings(pid):
    """Every mapping of the process: start, end, perms, path, Rss, AnonHugePages, VmFlags."""
    vmas, cur = [], None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
                s, e = (int(x, 16) for x in head[0].split("-"))
                cur = {"start": s, "end": e, "perms": head[1], "path": " ".join(head[5:])}
                vmas.append(cur)
            elif cur is not None:
                k = head[0].rstrip(":")
                if k in ("Rss", "AnonHugePages"):
                    cur[k] = int(head[1]) * 1024
                elif k == "VmFlags":
                    cur["flags"] = " ".join(head[1:])
    return vmas


def zero_pages(pid, vmas):
    """Present pages of `vmas` and how many of them are all zero."""
    import numpy as np

    present = zero = 0
    with open(f"/proc/{pid}/pagemap", "rb") as pm, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for v in vmas:
            if not v.get("Rss"):
                continue
            addr = v["start"]
            while addr < v["end"]:
                n = min(v["end"] - addr, 64 << 20)
                pm.seek(addr // PAGE * 8)
                bits = np.frombuffer(pm.read(n // PAGE * 8), dtype=np.uint64)
                here = (bits >> np.uint64(63)) & np.uint64(1)
                if here.any():
                    mem.seek(addr)
                    try:
                        data = np.frombuffer(mem.read(n), dtype=np.uint64).reshape(-1, PAGE // 8)
                    except OSError:
                        addr += n
                        continue
                    empty = ~data.any(axis=1)
                    present += int(here.sum())
                    zero += int((empty & (here == 1)).sum())
                addr += n
    return present * PAGE, zero * PAGE


def nvml_query():
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    n = len(pynvml.nvmlDeviceGetComputeRunningProcesses(h))
    pynvml.nvmlShutdown()
    return n


def run_variant(a, name, env_extra, summary):
    work = tempfile.mkdtemp(prefix="ckpt-diag-")
    ready, go = f"{work}/ready", f"{work}/go"
    env = dict(os.environ, **env_extra)
    args = [sys.executable, a.app, "--framework", "torch", "--gib", str(a.gib), "--device", "0", "--ready", ready, "--go", go]
    app = subprocess.Popen(args, env=env)
    t = time.time()
    while not os.path.exists(ready):
        if app.poll() is not None or time.time() - t > 240:
            raise RuntimeError(f"{name}: the program did not become ready")
        time.sleep(0.05)
    pid = app.pid
    before = smaps_rollup(pid)
    say(f"{name}: pid {pid} ready; host Anonymous {before.get('Anonymous', 0) / 2**30:.2f} GiB, AnonHugePages {before.get('AnonHugePages', 0) / 2**30:.2f} GiB")
    rows = []
    for c in range(a.cycles):
        how = "nvml-before" if c % 2 else "direct"
        if how == "nvml-before":
            nvml_query()
        lock_ms = timed(lambda: lock(pid))
        ckpt_ms = timed(lambda: checkpoint(pid))
        after = smaps_rollup(pid)
        row = {"variant": name, "cycle": c, "how": how, "lock_ms": lock_ms, "checkpoint_ms": ckpt_ms,
               "anon_after_gib": after.get("Anonymous", 0) / 2**30, "thp_after_gib": after.get("AnonHugePages", 0) / 2**30}
        if c == 0:
            vmas = mappings(pid)
            big = sorted(vmas, key=lambda v: -v.get("Rss", 0))[:6]
            row["largest"] = [{"gib": (v["end"] - v["start"]) / 2**30, "rss_gib": v.get("Rss", 0) / 2**30,
                               "thp_gib": v.get("AnonHugePages", 0) / 2**30, "flags": v.get("flags", ""),
                               "perms": v["perms"], "path": v["path"]} for v in big]
            # What CRIU dumps page by page: private anonymous memory.
            vmas = [v for v in vmas if v["perms"][3] == "p" and v["path"] in ("", "[heap]", "[stack]")]
            t0 = time.perf_counter()
            present, zero = zero_pages(pid, vmas)
            row["present_gib"], row["zero_gib"] = present / 2**30, zero / 2**30
            row["zero_scan_s"] = time.perf_counter() - t0
        row["restore_ms"] = timed(lambda: restore(pid))
        row["unlock_ms"] = timed(lambda: unlock(pid))
        say(f"{name} #{c} {how:<11} lock {lock_ms:7.1f} ms  checkpoint {ckpt_ms:8.1f} ms ({a.gib / ckpt_ms * 1e3:.2f} GiB/s)  "
            f"restore {row['restore_ms']:8.1f} ms  host anon after ckpt {row['anon_after_gib']:.2f} GiB (THP {row['thp_after_gib']:.2f})")
        if "largest" in row:
            for v in row["largest"]:
                say(f"    mapping {v['gib']:8.3f} GiB {v['perms']} {v['path'] or '(anon)'}  rss {v['rss_gib']:7.3f}  thp {v['thp_gib']:7.3f}  flags {v['flags']}")
            say(f"    present {row['present_gib']:.2f} GiB of which zero pages {row['zero_gib']:.2f} GiB (scan {row['zero_scan_s']:.1f} s)")
        rows.append(row)
    open(go, "w").write("go")
    rc = app.wait(timeout=300)
    say(f"{name}: exit {rc} (0 = data intact)")
    summary["variants"].append({"name": name, "env": env_extra, "exit": rc, "rows": rows})


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--app", required=True)
    p.add_argument("--gib", type=float, default=8)
    p.add_argument("--cycles", type=int, default=4)
    p.add_argument("--touch-gib", type=float, default=4)
    p.add_argument("--json", default="")
    p.add_argument("--shim", default="", help="libgpu_mode_hugepages.so: a variant with it preloaded")
    p.add_argument("--variants", default="plain,malloc-hugetlb,shim")
    a = p.parse_args()
    check(cu.cuInit(0), "cuInit")
    summary = {"node": node_facts(), "first_touch": [], "variants": []}
    say("node:", json.dumps(summary["node"]))
    for i in range(4):
        huge = bool(i % 2)
        rate, thp = first_touch(a.touch_gib, huge)
        summary["first_touch"].append({"madv_hugepage": huge, "gib_s": rate})
        say(f"first touch of {a.touch_gib} GiB {'MADV_HUGEPAGE' if huge else 'plain        '}: {rate:.2f} GiB/s (AnonHugePages then {thp / 2**30:.2f} GiB)")
    variants = {
        "plain": {},
        "malloc-hugetlb": {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"},
        "shim": {"LD_PRELOAD": a.shim, "GPU_MODE_HUGEPAGES_LOG": "1"},
    }
    for name in a.variants.split(","):
        if name == "shim" and not a.shim:
            continue
        run_variant(a, name, variants[name], summary)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
