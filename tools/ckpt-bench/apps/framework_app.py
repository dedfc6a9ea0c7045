"""A real framework process for gpu-mode-preempt-bench (issue 17).

Holds GIB GiB of data in the framework's own tensors (on the GPU with
--device N, in host memory with --device cpu), with what a training process
carries besides: the framework's threads, libraries, allocator pools, a small
model and its optimizer state after a few steps. Writes its pid to READY,
waits for the file GO, then checks every tensor against the checksums it took
before the checkpoint and exits 0 (intact) or 1.

    python3 framework_app.py --framework torch|jax --gib 8 --device 0 \
        --seed 3 --ready DIR/ready0 --go DIR/go [--workers 4 --start-method fork|spawn]

The bench passes it as: --app /usr/bin/python3 --app-args "/abs/framework_app.py
--framework torch --gib {gib} --device {device} --seed {i} --ready {ready} --go {go}".
"""

import argparse
import os
import sys
import time

CHUNK_GIB = 1  # tensors of at most 1 GiB: a framework's memory comes in many blocks


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--framework", choices=["torch", "jax"], required=True)
    p.add_argument("--gib", type=float, required=True)
    p.add_argument("--device", required=True, help="GPU index, or cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ready", required=True)
    p.add_argument("--go", required=True)
    p.add_argument("--workers", type=int, default=0, help="torch: a DataLoader with this many workers alive across the checkpoint (issue 24)")
    p.add_argument("--start-method", default="fork", choices=["fork", "spawn", "forkserver"])
    return p.parse_args()


def chunks(gib):
    left = int(gib * (1 << 30))
    while left > 0:
        n = min(left, CHUNK_GIB << 30)
        yield n
        left -= n


def torch_state(a):
    import torch

    dev = torch.device("cpu" if a.device == "cpu" else f"cuda:{a.device}")
    g = torch.Generator(device=dev).manual_seed(a.seed)
    data = [torch.randint(0, 2**31 - 1, (n // 4,), dtype=torch.int32, device=dev, generator=g) for n in chunks(a.gib)]
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(5):
        loss = model(torch.randn(256, 1024, device=dev, generator=g)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    sums = lambda: [int(t.to(torch.int64).sum().item()) for t in data] + [float(p.double().sum().item()) for p in model.parameters()]
    return sums, (data, model, opt)


class Counting:
    """A dataset whose item i is i: batches must come in the sampler's order."""

    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        import torch

        return torch.tensor([i], dtype=torch.int64)


def loader(a):
    """The DataLoader shape of a training job: persistent workers of the
    chosen start method, started (one batch taken) before the checkpoint.
    Returns a check to run after GO: the next batches continue the order."""
    import torch

    dl = torch.utils.data.DataLoader(
        Counting(), batch_size=8, num_workers=a.workers, persistent_workers=True, multiprocessing_context=a.start_method
    )
    it = iter(dl)
    first = next(it)
    assert first.flatten().tolist() == list(range(8)), first

    def check():
        got = [next(it).flatten().tolist() for _ in range(4)]
        return got == [list(range(8 * k, 8 * k + 8)) for k in range(1, 5)]

    return check, (dl, it)


def jax_state(a):
    import jax
    import jax.numpy as jnp

    if a.device == "cpu":
        dev = jax.devices("cpu")[0]
    else:
        dev = jax.devices("gpu")[int(a.device)]
    key = jax.random.PRNGKey(a.seed)
    data = []
    for n in chunks(a.gib):
        key, sub = jax.random.split(key)
        data.append(jax.device_put(jax.random.randint(sub, (n // 4,), 0, 2**31 - 1, dtype=jnp.int32), dev))
    w = jax.device_put(jax.random.normal(key, (1024, 1024)), dev)
    step = jax.jit(lambda w, x: w - 1e-3 * jax.grad(lambda w: jnp.mean((x @ w) ** 2))(w))
    for _ in range(5):
        w = step(w, jnp.ones((256, 1024)))
    w.block_until_ready()
    # uint32 sums wrap, the same way each time: equal sums, equal data (as far as a checksum tells).
    sums = lambda: [int(jnp.sum(t.astype(jnp.uint32))) for t in data] + [float(jnp.sum(w))]
    return sums, (data, w)


def main():
    a = parse()
    state = torch_state if a.framework == "torch" else jax_state
    sums, keep = state(a)
    batches_ok, workers = loader(a) if a.workers and a.framework == "torch" else (lambda: True, None)
    before = sums()
    tmp = a.ready + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(os.getpid()))
    os.rename(tmp, a.ready)
    while not os.path.exists(a.go):
        time.sleep(0.05)
    after = sums()
    if not batches_ok():
        print(f"framework_app: the DataLoader's {a.workers} {a.start_method} workers lost their order across the checkpoint", file=sys.stderr)
        return 1
    if after != before:
        print(f"framework_app: data changed across the checkpoint: {before} -> {after}", file=sys.stderr)
        return 1
    shape = f", {a.workers} {a.start_method} workers" if workers else ""
    print(f"framework_app: {a.framework} {a.gib} GiB on {a.device}{shape}: intact", file=sys.stderr)
    del keep, workers
    return 0


if __name__ == "__main__":
    sys.exit(main())
