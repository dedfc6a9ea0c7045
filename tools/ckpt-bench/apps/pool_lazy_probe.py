#!/usr/bin/env python3
"""Whether the huge-page shim's pool thread starts when a real CUDA process
starts its driver (issue 39: the thread starts at the first shared mapping
of a GPU file, /dev/nvidia*, and not before). A PyTorch child with the shim
preloaded and a pool directory holding a 512 MiB size link for it: prints
its thread count before and after CUDA starts, and whether its pool
(a mapping with VmFlags dc and nr, 512 MiB resident) was populated.

    python3 pool_lazy_probe.py /abs/libgpu_mode_hugepages.so
"""
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import time
def threads():
    return int(open('/proc/self/status').read().split('Threads:')[1].split()[0])
def pool_kib():
    total, flags_ok, rss = 0, False, 0
    for line in open('/proc/self/smaps'):
        if line.startswith('Rss:'):
            rss = int(line.split()[1])
        elif line.startswith('VmFlags:'):
            f = line.split()[1:]
            if 'dc' in f and 'nr' in f:
                total += rss
    return total
print('threads before CUDA', threads(), flush=True)
import torch
print('threads after import torch', threads(), flush=True)
x = torch.zeros(256 << 20, dtype=torch.uint8, device='cuda')
torch.cuda.synchronize()
for _ in range(100):
    if pool_kib() >= 512 << 10:
        break
    time.sleep(0.1)
print('threads after CUDA', threads(), 'pool KiB', pool_kib(), flush=True)
"""

shim = sys.argv[1]
d = tempfile.mkdtemp()
os.chmod(d, 0o755)
env = dict(os.environ, LD_PRELOAD=shim, GPU_MODE_POOL_DIR=d, GPU_MODE_HUGEPAGES_LOG="1")
child = subprocess.Popen([sys.executable, "-c", CHILD], env=env)
os.symlink("512", os.path.join(d, str(child.pid)))
sys.exit(child.wait())
