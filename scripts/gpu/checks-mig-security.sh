#!/bin/bash
# GPU-machine validation of the MIG (issue 9) and security (issue 13) work,
# read-only for the GPUs (the GPU machines' rule): compute mode, MIG mode,
# persistence, clocks and power are never changed and no GPU is reset.
#   1. the node MIG baseline's read-only verbs (scripts/gpu/mig-readonly.sh);
#   2. the per-job prolog's MIG plan for every layout of the tests, on the
#      real profile table and on the simulated table of the same model: the
#      two must place or refuse alike;
#   3. the node checker;
#   4. a real Slurm 22.05 (Debian .debs under /opt/sroot) on this machine's
#      cgroup v2: the plugin end to end (task_init_privileged reading the
#      root-only state) and the MPS daemon moved into the job's extern step
#      (simulated GPUs), then the same with the real GPUs and the real MPS.
# Usage (device machine, repo root): bash scripts/gpu/checks-mig-security.sh CARRY_DIR
#   CARRY_DIR: release binaries, test binaries (tests/), Slurm .debs (debs/),
#   the simulated NVML's fixtures (fixtures/), mps_client.py.
set -u
A=$(cd "${1:?carry dir}" && pwd)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/checks-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/checks.log") 2>&1
t0=$(date +%s)
say() { echo "[$(( $(date +%s) - t0 ))s] == $*"; }
modes() { nvidia-smi --query-gpu=index,name,compute_mode,persistence_mode,mig.mode.current,mig.mode.pending --format=csv,noheader; }

say "machine"; modes | tee "$OUT/modes-before.txt"; uname -r; grep -c . /proc/cpuinfo >/dev/null
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1)
case "$NAME" in *H200*) MODEL=h200-141gb ;; *H100*) MODEL=h100-80gb ;; *) MODEL="" ;; esac

say "1. MIG baseline, read-only verbs"
OUT=$OUT/mig-readonly timeout 240 bash "$ROOT/scripts/gpu/mig-readonly.sh" "$A" > "$OUT/mig-readonly.txt" 2>&1; echo "mig-readonly rc=$?"
tail -n 25 "$OUT/mig-readonly.txt"

say "2. per-job MIG plan: real table vs simulated $MODEL"
LAYOUTS="mig:3g.40gbx2 mig:4g.40gb,2g.20gb,1g.10gb mig:1g.10gbx7 mig:3g.40gb,2g.20gbx2 mig:7g.80gb mig:3g.40gbx3 mig:1g.10gb+mex2 mig:2g.20gbx3,1g.20gb mig:4g.40gb,3g.40gb mig:2g.20gbx4
 mig:3g.71gb,2g.35gbx2 mig:3g.71gbx2 mig:1g.18gbx3 mig:3g.71gbx3 mig:7g.141gb mig:1g.18gbx2,3g.71gb mig:1g.18gbx7 mig:4g.71gb,3g.71gb"
W=$(mktemp -d)
printf 'runtime_dir = "%s/run"\n[log]\nsyslog = false\n[gpu]\nmps_compute_mode = "leave"\nmig_mode = "leave"\nmig_instances = "leave"\n' "$W" > "$W/real.toml"
printf 'runtime_dir = "%s/simrun"\n[log]\nsyslog = false\n[nvml]\nlibrary = "%s/libnvml_sim.so"\n' "$W" "$A" > "$W/sim.toml"
chmod 644 "$W"/*.toml
N=$(nvidia-smi -L | grep -c '^GPU ')
"$A/gpu-mode-mig" --config "$W/real.toml" job-plan $LAYOUTS > "$OUT/jobplan-real.txt" 2>&1; echo "real rc=$?"
if [ -n "$MODEL" ]; then
    printf 'driver_version = "580.159.04"\nnvml_version = "13.580.159.04"\ncuda_driver_version = 13000\n[[gpus]]\nmodel = "%s/%s.toml"\ncount = %s\n' "$A/fixtures" "$MODEL" "$N" > "$W/node.toml"
    GPU_MODE_SIM_STATE=$W/sim.json GPU_MODE_SIM_FIXTURE=$W/node.toml "$A/gpu-mode-mig" --config "$W/sim.toml" job-plan $LAYOUTS > "$OUT/jobplan-sim.txt" 2>&1; echo "sim rc=$?"
    norm() { sed -E 's/GPU-[0-9a-f-]+/GPU-x/g' "$1"; }
    if diff <(norm "$OUT/jobplan-real.txt") <(norm "$OUT/jobplan-sim.txt") > "$OUT/jobplan-diff.txt"; then echo "job plans: real and simulated $MODEL agree on all layouts"; else echo "job plans DIFFER:"; cat "$OUT/jobplan-diff.txt"; fi
fi
cat "$OUT/jobplan-real.txt"

say "3. node checker"
"$A/gpu-mode-node-checker" check --no-drain --config "$W/real.toml" --node "$(hostname -s)" | tee "$OUT/node-checker.txt"; echo "checker rc=${PIPESTATUS[0]}"

say "4. real Slurm on cgroup v2"
P=/opt/sroot; mkdir -p $P; for f in "$A"/debs/*.deb; do dpkg -x "$f" $P; done
export GPU_MODE_SLURM_PREFIX=$P GPU_MODE_ARTIFACTS=$A GPU_MODE_CLUSTER_BASE=/tmp/gmc
for t in mode_reaches_node submit_validation mps_cgroup; do
    say "test $t (simulated GPUs)"
    timeout 200 "$A/tests/$t" --test-threads 4 2>&1 | grep -E "^test |test result|panicked|assert" | head -30
done
say "4b. real GPUs, real MPS, PrologFlags=Contain: the daemon in the job's extern step"
L=$P/usr/lib/x86_64-linux-gnu; S=$P/usr/bin
DEVS=$(seq -s, -f /dev/nvidia%g 0 $((N-1)))
GPU_MODE_GPU_DEVICES=$DEVS "$A/gpu-mode-cluster" up --name real --gpus "$N" --contain || { tail -n 30 /tmp/gmc/real/log/*.log; }
D=/tmp/gmc/real
export SLURM_CONF=$D/slurm.conf LD_LIBRARY_PATH=$L:$L/slurm-wlm:$P/lib/x86_64-linux-gnu
cp "$A/mps_client.py" /tmp/mps_client.py; chmod 755 /tmp/mps_client.py
cat > /tmp/mps-cg.sh <<'EOF'
#!/bin/sh
python3 /tmp/mps_client.py 8 &
sleep 5
for p in $(pgrep -u "$(id -u)" nvidia-cuda-mps); do
  tr '\0' '\n' < /proc/$p/environ | grep -qx "CUDA_MPS_PIPE_DIRECTORY=$CUDA_MPS_PIPE_DIRECTORY" && echo "mps $p $(cat /proc/$p/comm) $(head -n1 /proc/$p/cgroup)"
done
wait
EOF
chmod 755 /tmp/mps-cg.sh
runuser -u gmtest1 -- env SLURM_CONF=$SLURM_CONF LD_LIBRARY_PATH=$LD_LIBRARY_PATH $S/srun --gpu-mode=mps --gres=gpu:1 /tmp/mps-cg.sh > "$OUT/mps-cgroup-real.txt" 2>&1; echo "job rc=$?"
cat "$OUT/mps-cgroup-real.txt"
sleep 3; echo "MPS processes after the job:"; ps -eo pid,user,stat,args | grep -E "nvidia-cuda-mps-(control|server)" | grep -v grep || echo none
$S/scontrol show node | grep -E "State=|Reason="
cp "$D/log/hooks.log" "$OUT/hooks-real.log"; grep -E "extern step|cgroup" "$D/log/slurmd.log" | tail -5
"$A/gpu-mode-cluster" down --name real
say "final GPU modes (must equal the first ones)"
modes | tee "$OUT/modes-after.txt"
diff "$OUT/modes-before.txt" "$OUT/modes-after.txt" && echo "GPU modes unchanged"
