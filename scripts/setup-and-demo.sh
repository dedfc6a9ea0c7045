#!/bin/sh
# Command (a) of the README: on a fresh Debian/Ubuntu machine, install what is
# missing, build, start the project's local Slurm cluster (simulated GPUs),
# and run one demo job per --gpu-mode, as a non-root user. Run as root.
#   --keep   leave the cluster running afterwards (stop: gpu-mode-cluster down)
set -eu
cd "$(dirname "$0")/.."
. scripts/common.sh
prepare

echo "== building"
cargo build --workspace --release
bin=target/release
"$bin/gpu-mode-cluster" down >/dev/null 2>&1 || true
# Real GPUs where present (every GPU setting is then left as it is), else
# four simulated ones.
if command -v nvidia-smi >/dev/null && n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU') && [ "$n" -gt 0 ]; then
    GPU_MODE_GPU_DEVICES=$(seq -s, -f /dev/nvidia%g 0 $((n - 1)))
    export GPU_MODE_GPU_DEVICES
    echo "== starting the local cluster (munged, slurmctld, slurmd; $n real GPUs)"
    "$bin/gpu-mode-cluster" up --gpus "$n"
else
    echo "== starting the local cluster (munged, slurmctld, slurmd; 4 simulated GPUs)"
    "$bin/gpu-mode-cluster" up --gpus 4
fi
SLURM_CONF=/tmp/gpu-mode-cluster/demo/slurm.conf
export SLURM_CONF
trap '[ "${1:-}" = --keep ] || "$bin/gpu-mode-cluster" down' EXIT

demo() {
    echo
    echo "== sbatch --gpu-mode=$* (as user gmtest1)"
    out=/tmp/gpu-mode-cluster/demo/out/demo-$$.out
    runuser -u gmtest1 -- /usr/bin/sbatch --wait --quiet --gres=gpu:1 --output="$out" --gpu-mode="$@" \
        --wrap 'echo "job $SLURM_JOB_ID on $(hostname): SLURM_GPU_MODE=$SLURM_GPU_MODE GPUs=$SLURM_GPU_MODE_GPUS"' \
        && cat "$out" || { echo "job failed:"; cat "$out"; }
}
demo mps:threads=50
demo checkpoint --signal=B:USR1@60 --requeue
echo
echo "== sbatch -n2 --gpu-mode=mig:3g.71gbx2 (as user gmtest1): each task gets one MIG device"
out=/tmp/gpu-mode-cluster/demo/out/demo-mig-$$.out
runuser -u gmtest1 -- /usr/bin/sbatch --wait --quiet -n2 --gres=gpu:1 --output="$out" --gpu-mode=mig:3g.71gbx2 \
    --wrap 'srun -n2 sh -c "echo task \$SLURM_LOCALID: CUDA_VISIBLE_DEVICES=\$CUDA_VISIBLE_DEVICES, the job has \$SLURM_GPU_MODE_MIG_UUIDS"' \
    && cat "$out" || { echo "job failed (on real GPUs, left as they are, MIG is off and the job is refused):"; cat "$out"; }
echo
echo "== a bad value is refused at submit time"
runuser -u gmtest1 -- /usr/bin/sbatch --gpu-mode=mig:1g.18gbx9 --wrap true || true
echo
echo "== prolog/epilog log lines"
cat /tmp/gpu-mode-cluster/demo/log/hooks.log
