#!/usr/bin/env python3
"""What NCCL's portable transports cost (issue 38, item 3): all-reduce bus
bandwidth and a DDP step's time, run once with NCCL's default transports and
once with the variables of --gpu-mode=checkpoint:nccl=portable, each a
torchrun launch of its own (scripts/gpu/preempt-real.sh's nccl-bench part
does both and prints the table):

    torchrun --standalone --nproc_per_node=2 nccl_bench.py --mode default --out default.jsonl
    NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NVLS_ENABLE=0 \\
        torchrun --standalone --nproc_per_node=2 nccl_bench.py --mode portable --out portable.jsonl
    python3 nccl_bench.py --table default.jsonl portable.jsonl

All-reduce (float32, in place, sum) from --min-mib to --max-mib, the size
times --factor each time: after --warmup calls, a trial call sizes the run
(as many calls as fit in --seconds-per-size, at least --min-iters, at most
--max-iters, the same count on every rank); each call is timed between CUDA
events on the rank's current stream (which waits for NCCL's), the median
taken per rank and the slowest rank's median kept. As nccl-tests define them:
algbw = bytes / time, busbw = algbw * 2(n-1)/n (n ranks), in GB/s (1e9).

DDP step: forward, backward (DDP's gradient all-reduce overlapped with it)
and AdamW, a fixed batch per rank, --step-warmup steps, then up to --steps
steps (fewer if they would pass --seconds-per-model) timed between CUDA
events at each step's start; the median, slowest rank's. Models:
  * train_app: train_app.py's 2-layer transformer (the checkpoint cases'
    model: 64 features as 4 tokens, a batch of 32 per rank; float32), tiny:
    its step is mostly latency;
  * gpt: a GPT-like decoder stack (6 pre-norm layers, d_model 768, 12 heads,
    a causal mask, vocabulary 8192, sequence 256, batch 4 per rank, bfloat16
    autocast; about 55 M parameters, 220 MB of float32 gradients per step).

Rank 0 writes one JSON line per figure to --out (first a "meta" line: mode,
NCCL_* variables, ranks, GPU, torch and NCCL versions) and prints them.
--table prints the two runs side by side (ratios: portable busbw / default
busbw, portable step ms / default step ms) and JSON lines of the same rows.
Read-only for the GPUs' settings.
"""

import argparse
import json
import os
import statistics
import sys
import time


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", help="the run's label (default, portable)")
    p.add_argument("--out", help="JSON lines file (rank 0)")
    p.add_argument("--min-mib", type=int, default=1)
    p.add_argument("--max-mib", type=int, default=1024)
    p.add_argument("--factor", type=int, default=2)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--min-iters", type=int, default=3)
    p.add_argument("--max-iters", type=int, default=50)
    p.add_argument("--seconds-per-size", type=float, default=0.8)
    p.add_argument("--models", default="train_app,gpt")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--step-warmup", type=int, default=5)
    p.add_argument("--seconds-per-model", type=float, default=12.0)
    p.add_argument("--table", nargs=2, metavar=("A.jsonl", "B.jsonl"), help="no run: print the two runs side by side")
    a = p.parse_args()
    if not a.table and not (a.mode and a.out):
        p.error("--mode and --out (a run under torchrun), or --table A B")
    if a.factor < 2 or a.min_mib < 1 or a.max_mib < a.min_mib:
        p.error("sizes: --factor >= 2, 1 <= --min-mib <= --max-mib")
    return a


def sizes(a):
    s, out = a.min_mib, []
    while s <= a.max_mib:
        out.append(s << 20)
        s *= a.factor
    return out


def fmt_size(b):
    return f"{b >> 30} GiB" if b >= 1 << 30 else f"{b >> 20} MiB"


class Run:
    def __init__(self, a):
        import torch
        import torch.distributed as dist

        self.a, self.torch, self.dist = a, torch, dist
        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if torch.cuda.device_count() < int(os.environ.get("LOCAL_WORLD_SIZE", self.world)):
            raise SystemExit(f"nccl_bench: rank {self.rank}: a GPU per rank needed, {torch.cuda.device_count()} visible")
        self.dev = torch.device("cuda", local)
        torch.cuda.set_device(self.dev)
        dist.init_process_group("nccl", device_id=self.dev)
        self.out = open(a.out, "w") if self.rank == 0 else None

    def emit(self, rec):
        if self.rank == 0:
            rec = {"mode": self.a.mode, **rec}
            line = json.dumps(rec, sort_keys=True)
            print(line, flush=True)
            self.out.write(line + "\n")
            self.out.flush()

    def slowest(self, value):
        """The largest of the ranks' values (every rank gets it)."""
        t = self.torch.tensor([float(value)], device=self.dev, dtype=self.torch.float64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return t.item()

    def timed(self, fn, n):
        """n calls of fn, each between two CUDA events: the per-call ms."""
        torch = self.torch
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
        for i in range(n):
            ev[i].record()
            fn()
        ev[n].record()
        torch.cuda.synchronize()
        return [ev[i].elapsed_time(ev[i + 1]) for i in range(n)]

    def meta(self):
        torch = self.torch
        nccl = torch.cuda.nccl.version()
        self.emit(
            {
                "kind": "meta",
                "ranks": self.world,
                "gpu": torch.cuda.get_device_name(self.dev),
                "torch": torch.__version__,
                "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl),
                "nccl_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_") and not k.startswith("NCCL_DEBUG")},
            }
        )

    def allreduce(self):
        torch, dist, a = self.torch, self.dist, self.a
        for b in sizes(a):
            x = torch.zeros(b // 4, dtype=torch.float32, device=self.dev)  # zeros: sums stay finite
            for _ in range(a.warmup):
                dist.all_reduce(x)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            torch.cuda.synchronize()
            trial = self.slowest(time.perf_counter() - t0)
            iters = max(a.min_iters, min(a.max_iters, int(a.seconds_per_size / max(trial, 1e-6))))
            med = self.slowest(statistics.median(self.timed(lambda: dist.all_reduce(x), iters)))
            algbw = b / (med / 1e3) / 1e9
            busbw = algbw * 2 * (self.world - 1) / self.world
            self.emit({"kind": "allreduce", "bytes": b, "iters": iters, "median_us": round(med * 1e3, 1),
                       "algbw_GBps": round(algbw, 3), "busbw_GBps": round(busbw, 3)})
            del x

    def model(self, name):
        torch = self.torch
        torch.manual_seed(0)
        if name == "train_app":
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            from train_app import model_of

            net = model_of("transformer", 64).to(self.dev)
            x = torch.randn(32, 64, device=self.dev)
            y = torch.randint(0, 2, (32,), device=self.dev)
            return net, (lambda m: torch.nn.functional.cross_entropy(m(x), y)), "float32, batch 32 x 64 per rank"
        if name == "gpt":
            vocab, d, heads, layers, seq, batch = 8192, 768, 12, 6, 256, 4

            class GPT(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.tok = torch.nn.Embedding(vocab, d)
                    self.pos = torch.nn.Embedding(seq, d)
                    layer = torch.nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, activation="gelu", batch_first=True, norm_first=True)
                    self.blocks = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
                    self.norm = torch.nn.LayerNorm(d)
                    self.head = torch.nn.Linear(d, vocab, bias=False)
                    self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

                def forward(self, t):
                    h = self.tok(t) + self.pos(torch.arange(t.shape[1], device=t.device))
                    return self.head(self.norm(self.blocks(h, mask=self.mask, is_causal=True)))

            net = GPT().to(self.dev)
            t = torch.randint(0, vocab, (batch, seq + 1), device=self.dev)

            def loss(m):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    logits = m(t[:, :-1])
                return torch.nn.functional.cross_entropy(logits.float().reshape(-1, vocab), t[:, 1:].reshape(-1))

            return net, loss, f"{layers} layers, d_model {d}, {heads} heads, seq {seq}, batch {batch} per rank, bf16 autocast"
        raise SystemExit(f"nccl_bench: unknown model {name!r}")

    def ddp_step(self, name):
        torch, a = self.torch, self.a
        net, loss_of, shape = self.model(name)
        params = sum(p.numel() for p in net.parameters())
        ddp = torch.nn.parallel.DistributedDataParallel(net, device_ids=[self.dev.index])
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)

        def step():
            loss = loss_of(ddp)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        for _ in range(a.step_warmup):
            step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        trial = self.slowest(time.perf_counter() - t0)
        steps = max(5, min(a.steps, int(a.seconds_per_model / max(trial, 1e-6))))
        med = self.slowest(statistics.median(self.timed(step, steps)))
        self.emit({"kind": "ddp_step", "model": name, "shape": shape, "params": params, "grad_MB": round(params * 4 / 1e6, 1),
                   "steps": steps, "warmup": a.step_warmup, "median_ms": round(med, 3)})
        del ddp, opt, net


def run(a):
    r = Run(a)
    t0 = time.perf_counter()
    r.meta()
    r.allreduce()
    for m in [m for m in a.models.split(",") if m]:
        r.ddp_step(m)
    r.dist.barrier()
    if r.rank == 0:
        print(f"nccl_bench: {a.mode}: done in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    r.dist.destroy_process_group()
    return 0


def table(pa, pb):
    def load(p):
        try:
            recs = [json.loads(l) for l in open(p) if l.strip().startswith("{")]
        except (OSError, ValueError) as e:
            print(f"nccl_bench: {p}: {e}", file=sys.stderr)
            recs = []
        meta = next((r for r in recs if r.get("kind") == "meta"), {})
        ar = {r["bytes"]: r for r in recs if r.get("kind") == "allreduce"}
        st = {r["model"]: r for r in recs if r.get("kind") == "ddp_step"}
        return meta, ar, st

    (ma, ara, sta), (mb, arb, stb) = load(pa), load(pb)
    na, nb = ma.get("mode", "A"), mb.get("mode", "B")
    for m in (ma, mb):
        if m:
            env = " ".join(f"{k}={v}" for k, v in m.get("nccl_env", {}).items()) or "no NCCL_* variable"
            print(f"{m.get('mode')}: {m.get('ranks')} ranks, {m.get('gpu')}, torch {m.get('torch')}, NCCL {m.get('nccl')}; {env}")
    rows = []
    print(f"\nall-reduce (float32, sum), busbw = algbw * 2(n-1)/n in GB/s, slowest rank's median; ratio = {nb} / {na}")
    print(f"{'size':>9} {'busbw ' + na:>18} {'busbw ' + nb:>18} {'ratio':>7}   iterations")
    for b in sorted(ara.keys() | arb.keys()):
        x, y = ara.get(b, {}).get("busbw_GBps"), arb.get(b, {}).get("busbw_GBps")
        ratio = round(y / x, 3) if x and y else None
        print(f"{fmt_size(b):>9} {x if x is not None else '-':>18} {y if y is not None else '-':>18} {ratio if ratio is not None else '-':>7}   "
              f"{ara.get(b, {}).get('iters', '-')}/{arb.get(b, {}).get('iters', '-')}")
        rows.append({"table": "allreduce", "bytes": b, f"busbw_GBps_{na}": x, f"busbw_GBps_{nb}": y, "ratio": ratio})
    print(f"\nDDP step (forward, backward, AdamW), median ms, slowest rank's; ratio = {nb} / {na}")
    print(f"{'model':>10} {'ms ' + na:>14} {'ms ' + nb:>14} {'ratio':>7}   steps, shape")
    for m in sorted(sta.keys() | stb.keys()):
        x, y = sta.get(m, {}).get("median_ms"), stb.get(m, {}).get("median_ms")
        ratio = round(y / x, 3) if x and y else None
        shape = (sta.get(m) or stb.get(m))["shape"]
        print(f"{m:>10} {x if x is not None else '-':>14} {y if y is not None else '-':>14} {ratio if ratio is not None else '-':>7}   "
              f"{sta.get(m, {}).get('steps', '-')}/{stb.get(m, {}).get('steps', '-')}, {shape}")
        rows.append({"table": "ddp_step", "model": m, f"median_ms_{na}": x, f"median_ms_{nb}": y, "ratio": ratio})
    print()
    for r in rows:
        print(json.dumps(r, sort_keys=True))
    complete = bool(rows) and all(r["ratio"] is not None for r in rows)
    return 0 if complete else 1


def main():
    a = parse()
    if a.table:
        return table(*a.table)
    return run(a)


if __name__ == "__main__":
    sys.exit(main())
