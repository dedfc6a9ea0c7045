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
        [--probe /abs/memcpy_probe.so --variants pool-probe,pool-par4]

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


class Sampler:
    """The process's RSS and the GPU's used memory every ~2 ms while the
    driver works: when the buffer's pages are made (RSS rises), when the
    copy ends (RSS flat), when the GPU memory falls, when it is back."""

    def __init__(self, pid):
        import threading
        import pynvml

        pynvml.nvmlInit()
        self.nv, self.dev = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        self.pid, self.rows, self.stop = pid, [], False
        self.t0 = time.perf_counter()
        self.th = threading.Thread(target=self.run, daemon=True)
        self.th.start()

    def rss(self):
        fields = {}
        for line in read(f"/proc/{self.pid}/status").splitlines():
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmPin", "VmLck"):
                fields[k] = int(v.split()[0]) * 1024
        self.pinned = max(self.pinned, fields.get("VmPin", 0) + fields.get("VmLck", 0))
        return fields.get("VmRSS", 0)

    def threads(self):
        """Each thread's (name, user ticks, system ticks)."""
        out = {}
        try:
            tids = os.listdir(f"/proc/{self.pid}/task")
        except OSError:
            return out
        for tid in tids:
            stat = read(f"/proc/{self.pid}/task/{tid}/stat")
            if ")" not in stat:
                continue
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            rest = stat[stat.rindex(")") + 2:].split()
            out[tid] = (name, int(rest[11]), int(rest[12]))
        return out

    def run(self):
        self.pinned, before = 0, self.threads()
        while not self.stop:
            self.rows.append((time.perf_counter() - self.t0, self.rss(), self.nv.nvmlDeviceGetMemoryInfo(self.dev).used))
            time.sleep(0.002)
        after, hz = self.threads(), os.sysconf("SC_CLK_TCK")
        busy = []
        for tid, (name, u, s) in after.items():
            u0, s0 = before.get(tid, (name, 0, 0))[1:]
            if (u - u0) + (s - s0) > 0:
                busy.append((name, tid, (u - u0) / hz, (s - s0) / hz))
        self.busy = sorted(busy, key=lambda b: -(b[2] + b[3]))[:4]

    def end(self):
        self.stop = True
        self.th.join()
        self.nv.nvmlShutdown()
        r = self.rows
        if len(r) < 3:
            return {}
        rss0, gpu0 = r[0][1], r[0][2]
        rss_max, rss_min = max(x[1] for x in r), min(x[1] for x in r)
        gpu_max, gpu_min = max(x[2] for x in r), min(x[2] for x in r)

        def first(cond):
            return next((x[0] for x in r if cond(x)), None)
        out = {"samples": len(r), "span_s": r[-1][0], "pinned_max_gib": self.pinned / 2**30,
               "busiest_threads": [f"{n}/{t}: user {u:.2f} s, system {k:.2f} s" for n, t, u, k in self.busy],
               "rss_start_gib": rss0 / 2**30, "rss_max_gib": rss_max / 2**30, "rss_min_gib": rss_min / 2**30,
               "gpu_start_gib": gpu0 / 2**30, "gpu_min_gib": gpu_min / 2**30, "gpu_max_gib": gpu_max / 2**30}
        if rss_max - rss0 > 256 << 20:  # the buffer's pages were made meanwhile
            out["rss_rise_start_s"] = first(lambda x: x[1] > rss0 + (64 << 20))
            out["rss_rise_end_s"] = first(lambda x: x[1] >= rss_max - (64 << 20))
        if rss0 - rss_min > 256 << 20:  # the buffer was freed meanwhile
            out["rss_fall_s"] = first(lambda x: x[1] < rss0 - (256 << 20))
        if gpu0 - gpu_min > 256 << 20:
            out["gpu_fall_start_s"] = first(lambda x: x[2] < gpu0 - (64 << 20))
            out["gpu_fall_end_s"] = first(lambda x: x[2] <= gpu_min + (64 << 20))
        if gpu_max - gpu0 > 256 << 20:
            out["gpu_rise_start_s"] = first(lambda x: x[2] > gpu0 + (64 << 20))
            out["gpu_rise_end_s"] = first(lambda x: x[2] >= gpu_max - (64 << 20))
        return out


def copy_bounds(gib):
    """GiB/s of the copy engines between this GPU and host memory of each
    kind: the bound a checkpoint (device to host) or restore (host to
    device) of `gib` GiB could reach."""
    import ctypes
    import numpy as np

    n = int(gib * (1 << 30))
    err, device = cu.cuDeviceGet(0)
    check(err, "cuDeviceGet")
    err, ctx = cu.cuDevicePrimaryCtxRetain(device)
    check(err, "ctx")
    check(cu.cuCtxSetCurrent(ctx), "set ctx")
    err, dev = cu.cuMemAlloc(n)
    check(err, "cuMemAlloc")
    check(cu.cuMemsetD8(dev, 7, n), "memset")
    err, pinned = cu.cuMemAllocHost(n)
    check(err, "cuMemAllocHost")
    out = {}

    def rate(fn):
        check(cu.cuCtxSynchronize(), "sync")
        t = time.perf_counter()
        check(fn(), "copy")
        check(cu.cuCtxSynchronize(), "sync")
        return gib / (time.perf_counter() - t)
    for i in range(2):
        out.setdefault("d2h_pinned", []).append(rate(lambda: cu.cuMemcpyDtoH(pinned, dev, n)))
        out.setdefault("h2d_pinned", []).append(rate(lambda: cu.cuMemcpyHtoD(dev, pinned, n)))
        populated = np.ones(n, dtype=np.uint8)
        out.setdefault("d2h_pageable_populated", []).append(rate(lambda: cu.cuMemcpyDtoH(populated.ctypes.data, dev, n)))
        out.setdefault("h2d_pageable_populated", []).append(rate(lambda: cu.cuMemcpyHtoD(dev, populated.ctypes.data, n)))
        del populated
        for huge in (False, True):
            m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            if huge:
                m.madvise(mmap.MADV_HUGEPAGE)
            view = ctypes.c_char.from_buffer(m)
            addr = ctypes.addressof(view)
            out.setdefault("d2h_pageable_fresh" + ("_thp" if huge else ""), []).append(rate(lambda: cu.cuMemcpyDtoH(addr, dev, n)))
            del view
            m.close()
    check(cu.cuMemFreeHost(pinned), "free host")
    check(cu.cuMemFree(dev), "free")
    check(cu.cuDevicePrimaryCtxRelease(device), "release")
    return {k: max(v) for k, v in out.items()}


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
        if a.pool_wait:
            time.sleep(a.pool_wait)
        lock_ms = timed(lambda: lock(pid))
        sampler = Sampler(pid)
        ckpt_ms = timed(lambda: checkpoint(pid))
        trace_ckpt = sampler.end()
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
        sampler = Sampler(pid)
        row["restore_ms"] = timed(lambda: restore(pid))
        row["unlock_ms"] = timed(lambda: unlock(pid))
        row["trace_checkpoint"], row["trace_restore"] = trace_ckpt, sampler.end()
        def shown(t):
            return json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in t.items()})
        say(f"    checkpoint trace {shown(trace_ckpt)}")
        say(f"    restore trace    {shown(row['trace_restore'])}")
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
    p.add_argument("--app", default="")
    p.add_argument("--bounds-only", action="store_true", help="measure the copy engines' rates (--bounds-gib) and stop")
    p.add_argument("--gib", type=float, default=8)
    p.add_argument("--cycles", type=int, default=4)
    p.add_argument("--touch-gib", type=float, default=4)
    p.add_argument("--json", default="")
    p.add_argument("--shim", default="", help="libgpu_mode_hugepages.so: a variant with it preloaded")
    p.add_argument("--variants", default="plain,malloc-hugetlb,shim")
    p.add_argument("--probe", default="", help="memcpy_probe.so: variants pool-probe and pool-par<N> (the driver's copies timed, or split across N threads)")
    p.add_argument("--pool-mib", type=int, default=0, help="the pool variant's GPU_MODE_POOL_MIB (default: GiB + 1 GiB)")
    p.add_argument("--pool-wait", type=float, default=0, help="seconds before each lock (the pool refilled after a restore)")
    p.add_argument("--bounds-gib", type=float, default=0, help="measure the copy engines' rates with this many GiB first")
    a = p.parse_args()
    check(cu.cuInit(0), "cuInit")
    summary = {"node": node_facts(), "first_touch": [], "variants": []}
    say("node:", json.dumps(summary["node"]))
    for i in range(4):
        huge = bool(i % 2)
        rate, thp = first_touch(a.touch_gib, huge)
        summary["first_touch"].append({"madv_hugepage": huge, "gib_s": rate})
        say(f"first touch of {a.touch_gib} GiB {'MADV_HUGEPAGE' if huge else 'plain        '}: {rate:.2f} GiB/s (AnonHugePages then {thp / 2**30:.2f} GiB)")
    if a.bounds_gib:
        summary["copy_bounds"] = copy_bounds(a.bounds_gib)
        say("copy bounds GiB/s:", json.dumps({k: round(v, 2) for k, v in summary["copy_bounds"].items()}))
    if a.bounds_only:
        if a.json:
            with open(a.json, "w") as f:
                json.dump(summary, f, indent=1)
        return
    pool_mib = a.pool_mib or int(a.gib * 1024) + 1024
    variants = {
        "pool": {"LD_PRELOAD": a.shim, "GPU_MODE_HUGEPAGES_LOG": "1", "GPU_MODE_POOL_MIB": str(pool_mib)},
        "plain": {},
        "malloc-hugetlb": {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"},
        "shim": {"LD_PRELOAD": a.shim, "GPU_MODE_HUGEPAGES_LOG": "1"},
    }
    # The shim splits the driver's copies across GPU_MODE_COPY_THREADS threads
    # (default 8, hugepages/src/copy.rs); "-copy1": the driver's thread alone.
    variants["pool-copy1"] = dict(variants["pool"], GPU_MODE_COPY_THREADS="1")
    variants["pool-copy16"] = dict(variants["pool"], GPU_MODE_COPY_THREADS="16")
    variants["shim-copy1"] = dict(variants["shim"], GPU_MODE_COPY_THREADS="1")
    if a.probe:
        pool = variants["pool"]
        variants["pool-probe"] = dict(pool, LD_PRELOAD=f"{a.shim}:{a.probe}", MEMCPY_PROBE_LOG="1")
        for n in (2, 4, 8, 16):
            variants[f"pool-par{n}"] = dict(variants["pool-probe"], MEMCPY_PROBE_THREADS=str(n))
    for name in a.variants.split(","):
        if name.startswith(("shim", "pool")) and not a.shim:
            continue
        run_variant(a, name, variants[name], summary)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
