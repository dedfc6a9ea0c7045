#!/usr/bin/env python3
"""Which NCCL variables make a 2-rank NCCL job restorable by the CUDA
driver's checkpoint on this node (issue 38, item 1: "find the smallest set
of variables that makes restore work, testing each one").

For each variable set (all five the first probe used, none, and each one
left out in turn, plus any --extra sets), two runs of the same DDP job
(2 ranks, one GPU each, NCCL, a fixed seed, STEPS steps):
  * reference: uninterrupted;
  * interrupted: at step PAUSE_AT both ranks are locked and checkpointed at
    once (their GPU memory goes to the host), held HOLD_S seconds, then
    restored and unlocked at once, and the job goes on.
A set "works" when every driver call succeeded, the job ended within its
time, and every loss of the interrupted run is bitwise equal to the
reference run's. One JSON line per run, a table at the end.

    python3 nccl_env_probe.py [--steps 30] [--sets all,none,drop-each]
                              [--extra 'NCCL_P2P_DISABLE=1 NCCL_CUMEM_ENABLE=0']

Driver calls only (cuda-python's cuCheckpointProcess*), no CRIU. Needs two
GPUs. Read-only for the GPUs' settings: it changes no compute mode, MIG,
persistence, clocks or power, and never resets a GPU.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

FIVE = {
    "NCCL_P2P_DISABLE": "1",
    "NCCL_SHM_DISABLE": "1",
    "NCCL_NVLS_ENABLE": "0",
    "NCCL_CUMEM_ENABLE": "0",
    "NCCL_CUMEM_HOST_ENABLE": "0",
}

RANK = r'''
import os, sys, time, torch, torch.distributed as dist
rank = int(os.environ["RANK"]); steps = int(sys.argv[1]); progress = sys.argv[2]
torch.cuda.set_device(rank)
dist.init_process_group("nccl")
torch.manual_seed(1234 + rank)
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
g = torch.Generator(device="cuda").manual_seed(99 + rank)
for step in range(1, steps + 1):
    x = torch.randn(256, 1024, device="cuda", generator=g)
    loss = (ddp(x) - x).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    # The loss's exact bits: a float32's hex form.
    print(f"step {step} loss {loss.item().hex()}", flush=True)
    with open(progress, "w") as f:
        f.write(str(step))
    time.sleep(0.05)
dist.barrier()
dist.destroy_process_group()
print("DONE", flush=True)
'''


def say(*a):
    print(*a, flush=True)


def driver():
    from cuda.bindings import driver as cu
    err, = cu.cuInit(0)
    return cu


def call(cu, what, pid):
    t = time.monotonic()
    if what == "lock":
        a = cu.CUcheckpointLockArgs()
        a.timeoutMs = 20000
        r = cu.cuCheckpointProcessLock(pid, a)
    elif what == "checkpoint":
        r = cu.cuCheckpointProcessCheckpoint(pid, cu.CUcheckpointCheckpointArgs())
    elif what == "restore":
        r = cu.cuCheckpointProcessRestore(pid, cu.CUcheckpointRestoreArgs())
    else:
        r = cu.cuCheckpointProcessUnlock(pid, cu.CUcheckpointUnlockArgs())
    err = r[0] if isinstance(r, tuple) else r
    return int(err), round(time.monotonic() - t, 3)


def on_both(cu, what, pids):
    """`what` on every pid at once (a rank blocked in a collective waits for
    its peer); [(code, seconds)] per pid."""
    out = [None] * len(pids)

    def one(i):
        out[i] = call(cu, what, pids[i])

    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(pids))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    return [o if o is not None else (-1, 60.0) for o in out]


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gpu_used_mib():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20).stdout
        return [int(x) for x in out.split()]
    except Exception as e:  # noqa: BLE001 - a probe reports, never stops
        return str(e)


def run(cu, env_set, steps, pause_at, hold_s, limit_s, interrupt):
    work = tempfile.mkdtemp(prefix="nccl-probe-")
    script = os.path.join(work, "rank.py")
    with open(script, "w") as f:
        f.write(RANK)
    base = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    base.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"})
    base.update(env_set)
    procs, outs = [], []
    for rank in range(2):
        env = dict(base, RANK=str(rank), LOCAL_RANK=str(rank))
        out = open(os.path.join(work, f"rank{rank}.out"), "w+")
        outs.append(out)
        procs.append(subprocess.Popen([sys.executable, script, str(steps), os.path.join(work, f"progress{rank}")], env=env, stdout=out, stderr=subprocess.STDOUT))
    result = {"interrupt": interrupt, "calls": {}}
    start = time.monotonic()

    def progress(rank):
        try:
            with open(os.path.join(work, f"progress{rank}")) as f:
                return int(f.read() or 0)
        except (OSError, ValueError):
            return 0

    if interrupt:
        while min(progress(0), progress(1)) < pause_at and time.monotonic() - start < limit_s and all(p.poll() is None for p in procs):
            time.sleep(0.02)
        pids = [p.pid for p in procs]
        result["calls"]["lock"] = on_both(cu, "lock", pids)
        result["calls"]["checkpoint"] = on_both(cu, "checkpoint", pids)
        result["gpu_mib_checkpointed"] = gpu_used_mib()
        time.sleep(hold_s)
        result["calls"]["restore"] = on_both(cu, "restore", pids)
        result["calls"]["unlock"] = on_both(cu, "unlock", pids)
    for p in procs:
        left = max(1.0, limit_s - (time.monotonic() - start))
        try:
            p.wait(left)
        except subprocess.TimeoutExpired:
            result["hung"] = True
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    result["exit"] = [p.returncode for p in procs]
    result["losses"] = []
    for out in outs:
        out.seek(0)
        text = out.read()
        result["losses"].append([l.split()[3] for l in text.splitlines() if l.startswith("step ")])
        if "DONE" not in text:
            result.setdefault("tails", []).append(text[-600:])
    result["seconds"] = round(time.monotonic() - start, 1)
    return result


def verdict(ref, got):
    calls_ok = all(code == 0 for results in got["calls"].values() for code, _ in results)
    equal = ref["losses"] == got["losses"] and all(len(l) > 0 for l in ref["losses"])
    return calls_ok and equal and not got.get("hung") and got["exit"] == [0, 0]


def sets(names, extra):
    out = []
    for name in names.split(","):
        if name == "all":
            out.append(("all five", dict(FIVE)))
        elif name == "none":
            out.append(("none", {}))
        elif name == "drop-each":
            for k in FIVE:
                out.append((f"all but {k}", {x: v for x, v in FIVE.items() if x != k}))
    for e in extra:
        out.append((e, dict(kv.split("=", 1) for kv in e.split())))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--pause-at", type=int, default=10)
    ap.add_argument("--hold-s", type=float, default=2.0)
    ap.add_argument("--limit-s", type=float, default=45.0)
    ap.add_argument("--sets", default="all,none,drop-each")
    ap.add_argument("--extra", action="append", default=[])
    ap.add_argument("--budget-s", type=float, default=520.0, help="stop starting new sets after this")
    a = ap.parse_args()
    cu = driver()
    begin = time.monotonic()
    table = []
    for name, env_set in sets(a.sets, a.extra):
        if time.monotonic() - begin > a.budget_s:
            say(json.dumps({"set": name, "skipped": "budget"}))
            continue
        ref = run(cu, env_set, a.steps, a.pause_at, a.hold_s, a.limit_s, False)
        got = run(cu, env_set, a.steps, a.pause_at, a.hold_s, a.limit_s, True)
        ok = verdict(ref, got)
        say(json.dumps({"set": name, "env": env_set, "works": ok, "reference": {k: v for k, v in ref.items() if k != "losses"},
                        "interrupted": {k: v for k, v in got.items() if k != "losses"},
                        "losses_equal": ref["losses"] == got["losses"], "steps_seen": [len(l) for l in got["losses"]]}))
        table.append((name, ok, got["calls"].get("restore"), got.get("hung", False)))
    say("== NCCL variable sets (2 ranks, driver checkpoint at step %d, %d steps)" % (a.pause_at, a.steps))
    for name, ok, restore, hung in table:
        say(f"{'WORKS' if ok else 'FAILS':5}  {name:40}  restore {restore}  hung {hung}")


if __name__ == "__main__":
    main()
