#!/usr/bin/env python3
"""A CUDA client for the MPS validation on real GPUs: reports what the
device looks like from inside the job (SM count under an MPS active thread
percentage, visible devices), then keeps the GPU busy for N seconds."""
import os
import sys
import time

secs = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
try:
    import torch
except Exception as e:  # a node without torch for this user
    print(f"client pid={os.getpid()} no torch: {e}", flush=True)
    sys.exit(3)
props = torch.cuda.get_device_properties(0)
print(
    f"client pid={os.getpid()} sms={props.multi_processor_count} name={props.name} "
    f"devices={torch.cuda.device_count()} CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')} "
    f"pipe={os.environ.get('CUDA_MPS_PIPE_DIRECTORY')} threads={os.environ.get('CUDA_MPS_ACTIVE_THREAD_PERCENTAGE')}",
    flush=True,
)
x = torch.randn(4096, 4096, device="cuda")
end = time.time() + secs
n = 0
while time.time() < end:
    y = x @ x
    torch.cuda.synchronize()
    n += 1
print(f"client pid={os.getpid()} done matmuls={n}", flush=True)
