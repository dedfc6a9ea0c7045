#!/bin/bash
# Validation of slurm-gpu-mode on a GPU machine (see docs/validation.md):
#   1. the GPU inventory and the node checker (read-only);
#   2. a real Slurm 22.05 from Debian .debs unpacked under /opt/sroot, with the
#      built plugin and helpers, on the real GPUs, and --gpu-mode=mps jobs
#      using the real MPS: two clients of one job, a second user at once,
#      threads=25, a client killed mid-kernel, a daemon forced to hang;
#   3. the mps prolog/epilog benchmark against the shell baseline.
# Every GPU setting is left as it is ([gpu] ... = "leave"); nothing resets a GPU.
# Usage (device machine, repo root): bash .dev-carry/real/real-gpu.sh TAG
set -u
TAG=${1:?tag}
A=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/real-out}
R=/tmp/results-$TAG
rm -rf "$R"; mkdir -p "$R"
exec > >(tee "$OUT/main-$TAG.log") 2>&1
t0=$(date +%s)
say() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
finish() { tar -C /tmp -czf "$OUT/results-$TAG.tgz" "results-$TAG"; say "done"; }
trap finish EXIT

say "== machine"
nvidia-smi --query-gpu=index,name,uuid,compute_mode,persistence_mode,mig.mode.current --format=csv
N=$(nvidia-smi -L | wc -l)

say "== 1. inventory and node checker"
OUT=$R bash "$A/run-inventory.sh" "$TAG" > "$R/inventory.log" 2>&1; say "inventory rc=$?"
mkdir -p "$R/health"; OUT=$R/health bash "$A/run-health.sh" > "$R/health.log" 2>&1; say "health rc=$?"
cat "$R/health/summary.txt"

say "== 2. real Slurm under a prefix"
P=/opt/sroot; mkdir -p $P; for f in "$A"/debs/*.deb; do dpkg -x "$f" $P; done
export GPU_MODE_SLURM_PREFIX=$P GPU_MODE_ARTIFACTS=$A
L=$P/usr/lib/x86_64-linux-gnu; S=$P/usr/bin
(
  # The project's end-to-end tests (simulated GPUs) on this machine's cgroup v2 and prefix install.
  for t in "$A"/tests/submit_validation "$A"/tests/mode_reaches_node "$A"/tests/mps_mode; do say "test $(basename "$t")"; timeout 240 "$t" --test-threads 4 2>&1 | grep -E -A4 "^test |test result|panicked|did not start" | head -60; done
) > "$R/e2e-tests.log" 2>&1
grep -E "test result|FAILED|panicked" "$R/e2e-tests.log"

DEVS=$(seq -s, -f /dev/nvidia%g 0 $((N-1)))
GPU_MODE_GPU_DEVICES=$DEVS "$A/gpu-mode-cluster" up --name real --gpus "$N" || { tail -n 30 /tmp/gpu-mode-cluster/real/log/*.log; exit 1; }
D=/tmp/gpu-mode-cluster/real
export SLURM_CONF=$D/slurm.conf LD_LIBRARY_PATH=$L:$L/slurm-wlm:$P/lib/x86_64-linux-gnu
as() { local u=$1; shift; runuser -u "$u" -- env SLURM_CONF=$SLURM_CONF LD_LIBRARY_PATH=$LD_LIBRARY_PATH "$@"; }
ctl() { CUDA_MPS_PIPE_DIRECTORY=$1 /usr/bin/nvidia-cuda-mps-control; }
pipe_of() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pipe_dir"])' "$1"; }
mps_ps() { ps -eo pid,ppid,stat,user,args | grep -E "nvidia-cuda-mps-(control|server)" | grep -v grep; }
monitor() {
  for rec in "$D"/run/mps-daemons/*.json; do
    [ -f "$rec" ] || continue
    p=$(pipe_of "$rec"); echo "-- daemon record $(basename "$rec"): $(tr -d '\n ' < "$rec" | cut -c1-400)"
    s=$(echo get_server_list | ctl "$p"); echo "server list: $s"
    for sv in $s; do echo "clients of server $sv: $(echo "get_client_list $sv" | ctl "$p" | tr '\n' ' ')"; done
    echo "ps: $(echo ps | ctl "$p" | tr '\n' '|')"
  done
  mps_ps
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader
}
cp "$A/mps_client.py" /tmp/mps_client.py; chmod 755 /tmp/mps_client.py

say "== 2a. mps:threads=25, two clients of one job (gmtest1) + a second user's job (gmtest2) at once"
as gmtest1 $S/srun --gpu-mode=mps:threads=25 --gres=gpu:1 -n2 python3 /tmp/mps_client.py 25 > "$R/job-u1.out" 2>&1 &
U1=$!
if [ "$N" -ge 2 ]; then as gmtest2 $S/srun --gpu-mode=mps --gres=gpu:1 -n1 python3 /tmp/mps_client.py 25 > "$R/job-u2.out" 2>&1 & U2=$!; fi
for i in $(seq 1 60); do sleep 1; grep -q "sms=" "$R/job-u1.out" 2>/dev/null && break; done
sleep 3; say "while the jobs run:"; monitor
wait $U1; say "job u1 rc=$?"; [ "$N" -ge 2 ] && { wait $U2; say "job u2 rc=$?"; }
cat "$R/job-u1.out"; [ "$N" -ge 2 ] && cat "$R/job-u2.out"
sleep 3; say "after the jobs (expect no MPS process):"; mps_ps || echo "no MPS process"

say "== 2b. a client killed mid-kernel"
as gmtest1 $S/srun --gpu-mode=mps --gres=gpu:1 python3 /tmp/mps_client.py 60 > "$R/job-kill.out" 2>&1 &
K=$!
for i in $(seq 1 60); do sleep 1; grep -q "sms=" "$R/job-kill.out" 2>/dev/null && break; done
sleep 2; monitor
pkill -9 -f "^python3 /tmp/mps_client.py 60"; say "client killed"; wait $K; say "job rc=$?"
sleep 8; mps_ps || echo "no MPS process"; $S/scontrol show node | grep -E "State=|Reason="

say "== 2c. a daemon forced to hang (SIGSTOP) before the epilog"
as gmtest1 $S/srun --gpu-mode=mps --gres=gpu:1 sleep 8 > "$R/job-hang.out" 2>&1 &
H=$!
for i in $(seq 1 20); do sleep 0.5; ls "$D"/run/mps-daemons/*.json >/dev/null 2>&1 && break; done
dp=$(python3 -c 'import json,glob; print(json.load(open(glob.glob("'"$D"'/run/mps-daemons/*.json")[0]))["daemon"]["pid"])')
kill -STOP "$dp"; say "daemon $dp stopped"; ps -o pid,stat,args -p "$dp"
wait $H; say "job rc=$?"; sleep 22; mps_ps || echo "no MPS process"; $S/scontrol show node | grep -E "State=|Reason="

say "== prolog/epilog lines"; cat "$D/log/hooks.log"
cp "$D/log/hooks.log" "$R/hooks.log"; cp "$D/log/slurmd.log" "$R/slurmd.log"
"$A/gpu-mode-cluster" down --name real

say "== 3. benchmark (real MPS, compute mode left as is)"
for n in 1 $N; do "$A/gpu-mode-mps-bench" --real "$n" --iterations 10; done 2>&1 | tee "$R/mps-bench.txt"
say "== final GPU state"; nvidia-smi --query-gpu=index,compute_mode,persistence_mode,mig.mode.current --format=csv; mps_ps || echo "no MPS process"
