#!/bin/bash
# Session 21, call 1: issue 39 item 2 with the driver's buffer mapped from the image (packaging/criu/0007,
# restore_map_buffers = true, the default): pool=on 8 GiB then 32 GiB PyTorch jobs under Slurm as gmtest1,
# each preempted and restored once. Budgeted: torch8 first, so a short call still brings back the 8 GiB figures.
OUT=$OUT BUDGET_S=200 E2E_CASES="torch8 torch32" PREEMPT_MODE=checkpoint:pool=on PREEMPT_SHIM_LOG=1 PREEMPT_SETTLE_S=25 \
    timeout 215 bash scripts/gpu/preempt-real.sh .dev-carry/preempt e2e > $OUT/e2e-map.txt 2>&1
echo "e2e rc $?"
grep -E "CASE|GPU memory free|restored|restore phases|gpu-mode-copy|gpu-mode-pool: (lent|ready)|intact|Mapped" $OUT/e2e-map.txt | cut -c1-300 | tail -24
