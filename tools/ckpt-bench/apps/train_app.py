"""A training job as people write it, for checkpoint mode on real GPUs (issue 24).

A small model (two Linear layers with GELU, or a 2-layer transformer encoder)
trained with AdamW on a synthetic data set served by a DataLoader with
workers, fixed seeds and deterministic algorithms. Each step prints

    step <n> loss <float.hex()> batch <first sample index>

so two runs can be compared bitwise (`--compare OTHER.out`), and checks that
the batch is the one the sampler's order gives (a worker restored with the
wrong state would hand another). After the last step it prints
`DONE steps=<n>` and exits 0; the DataLoader's workers are ended by Python at
exit (SIGTERM), which is what issue 24's item 1 was about.

    python3 train_app.py --steps 60 --interval 0.5 --workers 2 \
        --start-method fork|spawn|forkserver --pin-memory --persistent \
        [--nvml] [--model mlp|transformer] [--compile] [--cuda-graph] [--events] [--ready FILE]
        [--ddp gloo|nccl [--fsdp]] [--cpu]
    python3 train_app.py --compare RUN.out REFERENCE.out   # every step once, losses bitwise equal

--nvml starts a monitoring thread that calls torch.cuda.utilization() and
torch.cuda.memory_usage() every 0.2 s (NVML users, issue 24 item 3).

--ddp gloo|nccl: several processes of one job (issue 24 item 5), run under
torchrun (RANK, WORLD_SIZE, LOCAL_RANK from its environment):

    torchrun --standalone --nproc_per_node=2 train_app.py --ddp nccl ...

Each rank uses GPU LOCAL_RANK (modulo the GPUs it sees: with gloo and one GPU
visible, every rank uses cuda:0; NCCL needs a GPU per rank and says so), wraps
the same model (same seed) in DistributedDataParallel and trains on its share
of each batch of 64 (rank r: samples r*64/W .. (r+1)*64/W - 1 of the
sampler's batch, checked as above). Rank 0 alone prints the step lines (its
own loss; `batch` is the batch's first sample, as without --ddp), writes
--ready after its first step and prints DONE, so --compare works unchanged
against a reference run of the same command. Each rank's `ddp: rank ...`
line (stderr) ends with the NCCL_* variables of its environment
(`NCCL env: NAME=VALUE ...` or `NCCL env: none`): what NCCL read at init,
so a run under --gpu-mode=checkpoint:nccl=portable can be checked for them.

--fsdp (with --ddp): FullyShardedDataParallel with FULL_SHARD instead of
DDP (every parameter sharded over the ranks, gathered for each forward and
backward, gradients reduce-scattered), the same seeds, data and step lines.

--cpu: no GPU (the model on the CPU; with --ddp, gloo only): for checking
the script's paths on a machine without one. --fsdp, --nvml, --events,
--cuda-graph and --pin-memory need a GPU and are refused with it.
"""

import argparse
import os
import sys
import threading
import time


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--interval", type=float, default=0.5)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--start-method", default="fork", choices=["fork", "spawn", "forkserver"])
    p.add_argument("--pin-memory", action="store_true")
    p.add_argument("--persistent", action="store_true")
    p.add_argument("--nvml", action="store_true")
    p.add_argument("--model", default="mlp", choices=["mlp", "transformer"])
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--cuda-graph", action="store_true", help="capture the whole step (forward, backward, AdamW) in a CUDA graph")
    p.add_argument("--events", action="store_true", help="time each step with torch.cuda.Event")
    p.add_argument("--ready", default=None)
    p.add_argument("--ddp", default=None, choices=["gloo", "nccl"], help="under torchrun: DistributedDataParallel with this backend")
    p.add_argument("--fsdp", action="store_true", help="with --ddp: FullyShardedDataParallel (FULL_SHARD) instead of DDP")
    p.add_argument("--cpu", action="store_true", help="no GPU: check the paths on a machine without one (gloo only)")
    p.add_argument("--compare", nargs=2, metavar=("RUN", "REFERENCE"), help="no training: compare two outputs' losses bitwise")
    a = p.parse_args()
    if a.fsdp and not a.ddp:
        p.error("--fsdp needs --ddp BACKEND (it runs under torchrun)")
    if a.cpu and (a.ddp == "nccl" or a.fsdp or a.nvml or a.events or a.cuda_graph or a.pin_memory):
        p.error("--cpu: no GPU, so no --ddp nccl, --fsdp (PyTorch's FSDP needs an accelerator), --nvml, --events, --cuda-graph or --pin-memory")
    return a


class Synthetic:
    """Samples made from their index alone: any worker makes the same ones."""

    def __init__(self, n, dim):
        self.n, self.dim = n, dim

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch

        g = torch.Generator().manual_seed(1000 + i)
        x = torch.randn(self.dim, generator=g)
        return i, x, (x.sum() > 0).long()


def model_of(kind, dim):
    import torch

    if kind == "mlp":
        return torch.nn.Sequential(torch.nn.Linear(dim, 512), torch.nn.GELU(), torch.nn.Linear(512, 2))
    # The sample as 4 tokens of dim/4 features.
    layer = torch.nn.TransformerEncoderLayer(d_model=dim // 4, nhead=4, dim_feedforward=128, dropout=0.0, batch_first=True)
    return torch.nn.Sequential(
        torch.nn.Unflatten(1, (4, dim // 4)), torch.nn.TransformerEncoder(layer, 2), torch.nn.Flatten(), torch.nn.Linear(dim, 2)
    )


def monitor(stop):
    import torch

    while not stop.is_set():
        torch.cuda.utilization()
        torch.cuda.memory_usage()
        time.sleep(0.2)


def eager_step(torch, model, opt):
    def step(x, y):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    return step


def graph_step(torch, model, opt, dim, dev):
    """The whole step captured in a CUDA graph (PyTorch's "whole network
    capture"): a few warm-up steps on a side stream, then the capture; each
    step copies its batch into the static inputs and replays."""
    static_x = torch.zeros(64, dim, device=dev)
    static_y = torch.zeros(64, dtype=torch.long, device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(static_x), static_y).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = torch.nn.functional.cross_entropy(model(static_x), static_y)
        static_loss.backward()
        opt.step()

    def step(x, y):
        static_x.copy_(x)
        static_y.copy_(y)
        graph.replay()
        return static_loss

    return step


def compare(a, b):
    def losses(path):
        out = {}
        for line in open(path, errors="replace"):
            w = line.split()
            if len(w) >= 4 and w[0] == "step" and w[2] == "loss":
                out.setdefault(int(w[1]), []).append(w[3])
        return out

    la, lb = losses(a), losses(b)
    twice = sorted(n for n, v in la.items() if len(v) > 1)
    differ = sorted(n for n in la.keys() & lb.keys() if la[n][:1] != lb[n][:1])
    missing = sorted(lb.keys() - la.keys())
    print(f"compare: {len(la)} steps; logged twice {twice[:10]}; differing {differ[:10]}; missing {missing[:10]}")
    return 0 if not (twice or differ or missing) else 1


def nccl_env():
    """The NCCL_* variables of this process's environment, as one line's end."""
    env = sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith("NCCL_"))
    return "NCCL env: " + (" ".join(env) if env else "none")


def wrap_fsdp(torch, model, dev):
    """FULL_SHARD: each rank keeps 1/W of every parameter (one flat
    parameter for the whole model, no wrap policy), all-gathers them for the
    forward and the backward, and reduce-scatters the gradients."""
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

    return FullyShardedDataParallel(
        model, sharding_strategy=ShardingStrategy.FULL_SHARD, device_id=dev if dev.type == "cuda" else None
    )


def ddp_init(torch, a):
    """torchrun's environment -> (rank, world size, this rank's GPU), the
    process group initialised."""
    import torch.distributed as dist

    if a.cuda_graph:
        raise SystemExit("train_app: --cuda-graph is not supported with --ddp")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    if 64 % world:
        raise SystemExit(f"train_app: a batch of 64 does not split over {world} ranks")
    if a.cpu:
        dist.init_process_group(a.ddp, rank=rank, world_size=world)
        if rank == 0:
            print(f"ddp: backend {a.ddp}{' (FSDP FULL_SHARD)' if a.fsdp else ''}, {world} ranks, no GPU (--cpu)", file=sys.stderr, flush=True)
        print(f"ddp: rank {rank} pid {os.getpid()} on cpu; {nccl_env()}", file=sys.stderr, flush=True)
        return rank, world, torch.device("cpu")
    count = torch.cuda.device_count()
    if count == 0:
        raise SystemExit(f"train_app: rank {rank}: no GPU visible")
    if a.ddp == "nccl" and count < local_world:
        raise SystemExit(
            f"train_app: rank {rank}: NCCL needs a GPU per rank: {count} visible "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}) for {local_world} ranks on this node"
        )
    dev = torch.device("cuda", local % count)
    torch.cuda.set_device(dev)
    dist.init_process_group(a.ddp, rank=rank, world_size=world)
    if rank == 0:
        print(f"ddp: backend {a.ddp}{' (FSDP FULL_SHARD)' if a.fsdp else ''}, {world} ranks, {count} GPU(s) visible", file=sys.stderr, flush=True)
    print(f"ddp: rank {rank} pid {os.getpid()} on {dev} ({torch.cuda.get_device_name(dev)}); {nccl_env()}", file=sys.stderr, flush=True)
    return rank, world, dev


def main():
    a = parse()
    if a.compare:
        return compare(*a.compare)
    # cuBLAS is deterministic only with a fixed workspace (PyTorch's docs on
    # use_deterministic_algorithms); set before CUDA starts.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    # The fused attention kernels' backward passes are not deterministic:
    # the math one is.
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    dim = 64
    dev = torch.device("cpu" if a.cpu else "cuda")
    rank, world = 0, 1
    if a.ddp:
        rank, world, dev = ddp_init(torch, a)
    model = model_of(a.model, dim).to(dev)
    if a.ddp and a.fsdp:
        # The optimizer below is made after the wrap: it holds FSDP's
        # flat (sharded) parameters.
        model = wrap_fsdp(torch, model, dev)
    elif a.ddp:
        # The same seed made the same weights on every rank; DDP broadcasts
        # rank 0's anyway.
        ids = None if a.cpu else [dev.index]
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids, output_device=None if a.cpu else dev.index)
    if a.compile:
        model = torch.compile(model)
    # capturable: the optimizer's state stays on the GPU, as a graph needs.
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=a.cuda_graph)
    step = graph_step(torch, model, opt, dim, dev) if a.cuda_graph else eager_step(torch, model, opt)
    data = Synthetic(64 * (a.steps + 1), dim)
    # The order as an explicit sampler: each batch can be checked against it.
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(7)).tolist()
    # Under --ddp each rank takes its share of every batch of 64.
    per = 64 // world
    mine = order if world == 1 else [i for b in range(0, len(order), 64) for i in order[b + rank * per : b + (rank + 1) * per]]
    kw = dict(batch_size=per, sampler=mine, num_workers=a.workers, pin_memory=a.pin_memory)
    if a.workers > 0:
        kw.update(persistent_workers=a.persistent, multiprocessing_context=a.start_method)
    loader = torch.utils.data.DataLoader(data, **kw)
    stop = threading.Event()
    if a.nvml:
        threading.Thread(target=monitor, args=(stop,), daemon=True).start()
    n = 0
    for idx, x, y in loader:
        n += 1
        if idx.tolist() != order[(n - 1) * 64 + rank * per : (n - 1) * 64 + (rank + 1) * per]:
            print(f"MISMATCH batch {n}: not the sampler's order" + (f" (rank {rank})" if a.ddp else ""), flush=True)
            return 3
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        if a.events:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        loss = step(x, y)
        timing = ""
        if a.events:
            end.record()
            end.synchronize()
            timing = f" ms {start.elapsed_time(end):.2f}"
        value = loss.item()
        if rank == 0:
            print(f"step {n} loss {value.hex()} batch {idx[0].item()}{timing}", flush=True)
        if n == 1 and a.ready and rank == 0:
            with open(a.ready + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.rename(a.ready + ".tmp", a.ready)
        if n == a.steps:
            break
        time.sleep(a.interval)
    stop.set()
    if a.ddp:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    if rank == 0:
        print(f"DONE steps={n}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
