#!/bin/bash
# Real-GPU cases for gpu-mode-cuda-ckpt (needs 2 GPUs, root, driver r580+).
# Usage: gpu-cases.sh BIN_DIR [CASE...]   (BIN_DIR holds gpu-mode-cuda-ckpt
# and gpu-mode-ckpt-testprog; no CASE runs them all). Each case prints
# CASE <name>: PASS|FAIL.
# Reads only; never changes compute mode, MIG, persistence, clocks or power.
set -u
BIN=$1; shift
CASES=${*:-cli-1gib device-map job fork-child no-room cgroup-job}
W=$(mktemp -d /tmp/ckpt-cases.XXXX)
CFG=$W/config.toml
printf 'runtime_dir = "%s/run"\n[log]\nsyslog = false\nstderr = true\n[cuda_ckpt]\nlock_timeout_ms = 5000\n' "$W" >"$CFG"
CK() { "$BIN/gpu-mode-cuda-ckpt" --config "$CFG" "$@"; }
mapfile -t UUID < <(nvidia-smi --query-gpu=uuid --format=csv,noheader)
FAILS=0
verdict() { if [ "$2" = 0 ]; then echo "CASE $1: PASS"; else echo "CASE $1: FAIL"; FAILS=$((FAILS + 1)); fi; }

# start NAME GIB DEVICE [testprog args...]: runs a test program in the
# background and waits until it holds its pattern; sets PID.
start() {
  local name=$1 gib=$2 dev=$3; shift 3
  rm -f "$W/$name.ready" "$W/$name.go"
  "$BIN/gpu-mode-ckpt-testprog" --gib "$gib" --device "$dev" --ready "$W/$name.ready" --go "$W/$name.go" "$@" >"$W/$name.out" 2>&1 &
  local bg=$!
  for _ in $(seq 1500); do [ -e "$W/$name.ready" ] && break; kill -0 $bg 2>/dev/null || break; sleep 0.1; done
  PID=$(cat "$W/$name.ready" 2>/dev/null || echo none)
}
# finish NAME: lets it verify; 0 when its pattern was intact.
finish() {
  touch "$W/$1.go"; wait "$(cat "$W/$1.ready")" 2>/dev/null
  sleep 0.5; cat "$W/$1.out"; grep -q "^VERIFY OK" "$W/$1.out"
}
apps() { nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader; }

echo "== GPUs"; nvidia-smi --query-gpu=index,uuid,memory.used,memory.free,compute_mode,persistence_mode --format=csv

case_cli_1gib() {
  echo "== case cli-1gib: checkpoint/state/restore one pid through the CLI"
  start a 1 0; P=$PID
  CK state --pid "$P"
  CK checkpoint --pid "$P"; rc=$?
  CK state --pid "$P"; echo "nvidia-smi while checkpointed:"; apps | grep "^$P," || echo "  pid $P holds no GPU memory"
  CK restore --pid "$P" && finish a && [ $rc = 0 ]; verdict cli-1gib $?
}

case_device_map() {
  echo "== case device-map: checkpointed on GPU0, restored onto GPU1"
  start b 8 0; P=$PID; apps | grep "^$P,"
  CK checkpoint --pid "$P" >/dev/null
  CK restore --pid "$P" --device-map "${UUID[0]}=${UUID[1]},${UUID[1]}=${UUID[0]}"; rc=$?
  apps | grep "^$P,"; apps | grep "^$P, ${UUID[1]}" >/dev/null && moved=0 || moved=1
  finish b && [ $rc = 0 ] && [ $moved = 0 ]; verdict device-map $?
}

case_job() {
  echo "== case job: two processes of job 4242 (found through SLURM_JOB_ID, no cgroup here), 4 GiB on each GPU"
  SLURM_JOB_ID=4242 start j0 4 0; SLURM_JOB_ID=4242 start j1 4 1
  CK checkpoint --job 4242; rc1=$?
  CK state --job 4242
  CK restore --job 4242; rc2=$?
  finish j0 && finish j1 && [ $rc1 = 0 ] && [ $rc2 = 0 ]; verdict job $?
}

case_fork_child() {
  echo "== case fork-child: a child forked without exec must make checkpoint refuse, nothing harmed"
  start f 1 0 --fork-child; P=$PID; cat "$W/f.out"
  CK checkpoint --pid "$P"; rc=$?
  CK state --pid "$P"
  finish f && [ $rc = 1 ]; verdict fork-child $?
}

case_no_room() {
  echo "== case no-room: restore refused while GPU1 lacks free memory, then done once it has"
  start big 32 1; P=$PID
  CK checkpoint --pid "$P" >/dev/null; rc1=$?
  FREE=$(nvidia-smi -i 1 --query-gpu=memory.free --format=csv,noheader,nounits)
  FILL=$(( (FREE - 20 * 1024) / 1024 ))
  echo "GPU1 free ${FREE} MiB; filler takes ${FILL} GiB"
  start filler "$FILL" 1 --hold
  nvidia-smi -i 1 --query-gpu=memory.free --format=csv,noheader
  CK restore --pid "$P"; rc2=$?
  CK state --pid "$P"
  touch "$W/filler.go"; wait "$(cat "$W/filler.ready")" 2>/dev/null; sleep 1
  CK restore --pid "$P"; rc3=$?
  finish big && [ $rc1 = 0 ] && [ $rc2 = 1 ] && [ $rc3 = 0 ]; verdict no-room $?
}

case_cgroup_job() {
  echo "== case cgroup-job: job 4343's processes found through a Slurm-style cgroup v2 path, no SLURM_JOB_ID"
  local cg=/sys/fs/cgroup/ckpt-test.slice/slurmstepd.scope/job_4343/step_0
  mkdir -p $cg || { verdict cgroup-job 1; return; }
  start c0 2 0; local p0=$PID; start c1 2 1; local p1=$PID
  sleep 300 & local s=$!
  for p in $p0 $p1 $s; do echo $p >$cg/cgroup.procs; done
  grep -H . /proc/$p0/cgroup
  CK --json checkpoint --job 4343 >$W/cg.json; local rc1=$?
  grep -E '"(found_by|pid|total_ms)"' $W/cg.json
  CK state --job 4343
  CK restore --job 4343; local rc2=$?
  kill $s; finish c0 && finish c1 && [ $rc1 = 0 ] && [ $rc2 = 0 ] && grep -q '"found_by": "cgroup"' $W/cg.json
  verdict cgroup-job $?
  sleep 0.5; rmdir $cg /sys/fs/cgroup/ckpt-test.slice/slurmstepd.scope/job_4343 /sys/fs/cgroup/ckpt-test.slice/slurmstepd.scope /sys/fs/cgroup/ckpt-test.slice
}

for c in $CASES; do "case_${c//-/_}"; done

echo "== GPUs after"; nvidia-smi --query-gpu=index,memory.used,compute_mode,persistence_mode --format=csv
apps
echo "CASES FAILED: $FAILS"
rm -rf "$W"
