#!/bin/sh
# The host side of the preemption benchmark (issue 17) on a machine without
# GPUs: gpu-mode-preempt-bench, ours and the plain sequence side by side
# with real CRIU, on the simulated driver and NVML (sim/), for
#   - a real framework process (JAX or PyTorch on the CPU,
#     tools/ckpt-bench/apps/framework_app.py: its threads, libraries, allocator and
#     data, dumped by CRIU), and
#   - the simulated CUDA counter (GPU memory through the simulated driver).
# Measures what the simulation can tell: CRIU dump, writeback, seal, the
# disk, restore. The GPU's own times come from the GPU machines
# (scripts/gpu/preempt-real.sh). Run as root after `cargo build --release
# --workspace`:   sh scripts/bench-preempt-host.sh [CASES] [APP]
#   CASES  e.g. 1x1,4x1 (default 1x1,4x1,1x4)
#   APP    jax | torch | counter | both (jax and counter; default both)
#   EARLY_WRITEBACK=false: the agent writes the image at the seal only (A/B).
#   HUGE_PAGES=false: ours without the huge-page shim (A/B; [preempt] huge_pages).
#   BENCH_REPEAT=N: N rounds per case, alternating which side goes first, and medians.
#   PLAIN_DRIVER=bounded: the plain sequence calls the driver as the agent does.
set -eu
cd "$(dirname "$0")/.."
CASES=${1:-1x1,4x1,1x4}
APP=${2:-both}
B=${GPU_MODE_BENCH_BIN:-$PWD/target/release}
W=${GPU_MODE_BENCH_DIR:-/var/tmp/gm-preempt-bench-host}
CRIU=$(command -v criu || echo /usr/local/sbin/criu)
rm -rf "$W"
mkdir -p "$W/run"
chmod 755 "$W"
GPU_MODE_SIM_STATE=$W/nvml-state.json
export GPU_MODE_SIM_STATE
"$B/nvml-sim-ctl" init sim/nvml/fixtures/node-1x-h100.toml
chmod 666 "$GPU_MODE_SIM_STATE"
cat > "$W/config.toml" <<EOF
runtime_dir = "$W/run"
[log]
syslog = false
[nvml]
library = "$B/libnvml_sim.so"
[cuda_ckpt]
cuda_library = "$B/libcuda_sim.so"
memory_margin_mib = 0
device_paths = ["/dev/nvidia", "$GPU_MODE_SIM_STATE.cuda/gpus/"]
[preempt]
criu = "$CRIU"
criu_timeout_ms = 600000
early_writeback = ${EARLY_WRITEBACK:-true}
huge_pages = ${HUGE_PAGES:-true}
huge_pages_library = "$B/libgpu_mode_hugepages.so"
EOF
# The programs run as nobody, and both sides run CRIU as that user (as the
# agent does): root without CAP_SYS_RESOURCE (containers, the GPU
# machines) cannot dump another user's processes itself. BENCH_UID=0: as
# root without capabilities, as before session 10.
uid=${BENCH_UID:-65534}
bench() { "$B/gpu-mode-preempt-bench" --config "$W/config.toml" --uid "$uid" --workdir "$W/bench" --cases "$CASES" --repeat "${BENCH_REPEAT:-1}" --plain-driver "${PLAIN_DRIVER:-raw}" "$@"; }
echo "== $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, kernel $(uname -r), images under $W ($(df -h "$W" | awk 'NR==2 {print $1}'))"
FW=$APP; [ "$APP" = both ] && FW=jax
if [ "$FW" = jax ] || [ "$FW" = torch ]; then
    PY=${GPU_MODE_BENCH_PYTHON:-python3}
    "$PY" -c "import $FW" 2>/dev/null || { echo "error: $PY has no $FW (pip install 'jax[cpu]' or torch, or GPU_MODE_BENCH_PYTHON=...)" >&2; exit 1; }
    echo "== $FW on the CPU (framework_app.py), $CASES"
    bench --app "$(command -v "$PY")" \
        --app-args "$PWD/tools/ckpt-bench/apps/framework_app.py --framework $FW --gib {gib} --device cpu --seed {i} --ready {ready} --go {go}"
fi
if [ "$APP" = counter ] || [ "$APP" = both ]; then
    echo "== simulated CUDA counter (sim/cuda), $CASES"
    bench --app "$B/cuda-sim-counter" --app-args "--steps 200 --interval-ms 20 --mib {mib} --device {device} --ready {ready}"
fi
