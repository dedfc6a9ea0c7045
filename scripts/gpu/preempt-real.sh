#!/bin/bash
# --gpu-mode=checkpoint on real GPUs under a real Slurm (issue 10), one
# bounded command for a GPU machine (2 or 4 GPUs; root):
#   e2e:   Slurm 22.05 (the carried .debs under /opt/sroot) with partitions
#          low/high (gpu-mode-cluster up --preempt), real CRIU, and
#          gpu-mode-ckpt-testprog holding a known pattern: a low-priority job
#          (1 GiB; 16 GiB; 2 ranks on 2 GPUs) is preempted by gmtest2's
#          high-priority job, checkpointed, requeued, restored onto the other
#          GPU(s) (a second high job holds the first ones; the 2-rank job moves
#          only with 4 GPUs), and its pattern verified. E2E_CASES picks
#          (default 1gib 16gib 2ranks); torch8 is a PyTorch process of 8 GiB
#          (checkpoint/bench/framework_app.py) preempted the same way;
#          train-end, train-fork, train-spawn: a training job with DataLoader
#          workers (checkpoint/bench/train_app.py, issue 24; see train_case).
#   bench: gpu-mode-preempt-bench, ours and the plain sequence (driver toggle,
#          criu dump, sync; criu restore, driver restore) side by side, with
#          the disk's fsync bandwidth and the ratios of issue 17's targets
#          (cases GiBxprocesses, default 8x1,32x1,4x4). BENCH_APP picks the
#          program: torch (default: a real PyTorch process,
#          checkpoint/bench/framework_app.py), jax, or testprog
#          (gpu-mode-ckpt-testprog, the bare pattern holder). BENCH_REPEAT=N
#          runs each case N times, alternating which side goes first, and
#          prints the medians of the ratios (the driver's own time varies).
#          WARM_GIB=N first touches N GiB of host memory once and frees it:
#          on a freshly started VM the first use of each page of guest memory
#          is slower, and whichever side ran first paid for it (a node in
#          service has long touched its memory). EARLY_WRITEBACK=false sets
#          [checkpoint] early_writeback = false for ours (A/B).
#          PLAIN_DRIVER=bounded: the plain sequence calls the driver as the
#          agent does (a thread per call, under a deadline).
#          HUGE_PAGES=false sets [checkpoint] huge_pages = false for ours
#          (A/B); PLAIN_HUGE_PAGES=1 preloads the same huge-page shim into
#          the plain sequence's programs.
# Usage (repo root of the GPU machine):
#   bash scripts/gpu/preempt-real.sh CARRY [all|e2e|bench] [CASES]
# CARRY is the folder scripts/gpu/preempt-carry.sh made (.dev-carry/preempt).
# Everything is logged to $OUT (preempt-real.log, per-case files). The run
# stays within BUDGET_S (default 510 s): bench cases that would not fit are
# skipped and the command that runs them is printed.
# Never changes compute mode, MIG, persistence, clocks or power limits, never
# resets a GPU (the cluster's config leaves every GPU setting as it is).
set -u
CARRY=${1:?usage: preempt-real.sh CARRY [all|e2e|bench] [CASES]}
PART=${2:-all}
CASES=${3:-8x1,32x1,4x4}
BENCH_APP=${BENCH_APP:-torch}
A=$(cd "$CARRY" && pwd)
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/preempt-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/preempt-real.log") 2>&1
BUDGET_S=${BUDGET_S:-510}
t0=$(date +%s)
say() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { echo $(( BUDGET_S - ($(date +%s) - t0) )); }
FAILS=0
verdict() { if [ "$2" = 0 ]; then say "CASE $1: PASS"; else say "CASE $1: FAIL ($3)"; FAILS=$((FAILS + 1)); fi; }

say "== GPUs before (nothing below changes these settings)"
nvidia-smi --query-gpu=index,name,uuid,compute_mode,persistence_mode,mig.mode.current,memory.used --format=csv
nvidia-smi --query-gpu=index,compute_mode,persistence_mode,mig.mode.current --format=csv,noheader > "$OUT/gpu-settings-before.txt"
N=$(nvidia-smi -L | grep -c '^GPU')
mapfile -t UUID < <(nvidia-smi --query-gpu=uuid --format=csv,noheader)

say "== installing the carried pieces"
# The job users must reach the programs: not under the repo (maybe /root).
B=/opt/gm-preempt
rm -rf "$B"; mkdir -p "$B"; cp "$A"/lib*.so "$A"/gpu-mode-* "$REPO/checkpoint/bench/framework_app.py" "$REPO/checkpoint/bench/train_app.py" "$B/"; chmod 755 "$B" "$B"/*
sh "$REPO/scripts/install-criu.sh" --from "$A/criu" || { say "CRIU install failed"; exit 1; }
/opt/slurm-gpu-mode/criu/bin/criu check || say "warning: criu check failed"
P=/opt/sroot
[ -x $P/usr/sbin/slurmctld-wlm ] || { mkdir -p $P; for f in "$A"/debs/*.deb; do dpkg -x "$f" $P; done; }
L=$P/usr/lib/x86_64-linux-gnu
S=$P/usr/bin
export GPU_MODE_SLURM_PREFIX=$P GPU_MODE_ARTIFACTS=$B GPU_MODE_CLUSTER_BASE=/tmp/gmc-preempt-real
export LD_LIBRARY_PATH=$L:$L/slurm-wlm:$P/lib/x86_64-linux-gnu
D=$GPU_MODE_CLUSTER_BASE/real
export SLURM_CONF=$D/slurm.conf
U=/tmp/gm-preempt-user
rm -rf "$U"; mkdir -p "$U"; chmod 1777 "$U"

# Who runs the preempted jobs: gmtest1 where root has CAP_SYS_RESOURCE
# (criu dump of another user's processes needs it), else root without
# capabilities (setpriv), which CRIU can dump and the agent accepts.
cap=$(sed -n 's/^CapEff:[[:space:]]*//p' /proc/self/status)
if [ $(( 0x$cap >> 24 & 1 )) = 1 ]; then JOBUSER=gmtest1; DROP=""; else JOBUSER=root; DROP="/usr/bin/setpriv --bounding-set=-all --inh-caps=-all --"; fi
as() { local u=$1; shift; if [ "$u" = root ]; then "$@"; else runuser -u "$u" -- env SLURM_CONF="$SLURM_CONF" LD_LIBRARY_PATH="$LD_LIBRARY_PATH" "$@"; fi; }
field() { $S/scontrol show job -o "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
state_is() { [ "$(field "$1" JobState)" = "$2" ]; }
requeued() { state_is "$1" PENDING && [ "$(field "$1" Restarts)" = 1 ]; }
finished() { case "$(field "$1" JobState)" in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY) return 0 ;; esac; return 1; }
ready_all() { local i; for i in $(seq 0 $(($2 - 1))); do [ -s "$1/ready$i" ] || return 1; done; }
wait_until() {
    local limit=$1 what=$2 i=0; shift 2
    until "$@"; do sleep 0.5; i=$((i + 1)); [ $i -ge $((limit * 2)) ] && { say "timed out after $limit s waiting for $what"; return 1; }; done
    return 0  # (an until loop's status is its body's last, here the failed test)
}
apps() { nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader; }


# preempt_case NAME GIB RANKS [torch]: one preemption, end to end (see the header).
preempt_case() {
    local name=$1 gib=$2 ranks=$3 fw=${4:-} W=$U/$1 app job pre hold="" moved=0 why="" intact="^VERIFY OK"
    mkdir -p "$W"; chmod 1777 "$W"
    # The ranks' launcher is the benchmark's (`launch N GPUS DIR APP ARGS`, a
    # Rust parent that waits for them); rank i runs on the job's GPU i and
    # writes its pid to $W/ready<i>. (A shell parent was seen to hang after a
    # restore when a short-lived child of it died during the dump.)
    app="$B/gpu-mode-preempt-bench launch $ranks $ranks $W $B/gpu-mode-ckpt-testprog --gib $gib --device {device} --seed {i} --ready {ready} --go $W/go"
    if [ -n "$fw" ]; then
        app="$B/gpu-mode-preempt-bench launch $ranks $ranks $W $(command -v python3) $B/framework_app.py --framework $fw --gib $gib --device {device} --seed {i} --ready {ready} --go $W/go"
        intact="^framework_app: .*: intact"
    fi
    # exec: gpu-mode-run must be the batch shell, which --signal=B:USR1 reaches.
    printf '#!/bin/sh\nexec %s %s/gpu-mode-run --config %s/gpu-mode.toml -- %s\n' "$DROP" "$B" "$D" "$app" > "$W/job.sh"
    chmod 755 "$W/job.sh"
    job=$(cd "$W" && as $JOBUSER $S/sbatch --parsable -J "$name" -p low --gpu-mode=checkpoint --signal=B:USR1@60 --requeue \
        --open-mode=append --gres=gpu:"$ranks" --output="$W/job.out" "$W/job.sh")
    say "$name: job $job ($gib GiB x $ranks, as $JOBUSER) submitted"
    if ! wait_until 300 "the pattern" ready_all "$W" "$ranks"; then cat "$W/job.out"; verdict "$name" 1 "never ready"; $S/scancel "$job"; return; fi
    apps > "$W/apps-before.txt"; say "$name: holding its pattern:"; cat "$W/apps-before.txt"
    local pids="" f; for f in "$W"/ready?; do pids="$pids $(cat "$f")"; done
    pre=$(as gmtest2 $S/sbatch --parsable -J preemptor -p high --gres=gpu:"$N" --output="$W/preemptor.out" --wrap 'sleep 5')
    say "$name: preemptor $pre (gmtest2, $N GPUs) submitted"
    if ! wait_until 240 "the requeue" requeued "$job"; then cat "$W/job.out"; verdict "$name" 1 "not requeued"; $S/scancel "$job" "$pre"; return; fi
    say "$name: requeued; while it waits:"
    apps | tee "$W/apps-pending.txt"
    for p in $pids; do grep -q "^$p," "$W/apps-pending.txt" && why="$why pid $p still holds GPU memory;"; done
    python3 - "$D/images/$job/0/manifest.json" <<'EOF' | tee "$W/manifest-summary.txt"
import json, sys
m = json.load(open(sys.argv[1]))
print("manifest: job", m["job"], "run", m["restart_count"], "uid", m["uid"], "node", m["node"], "driver", m["driver_version"],
      "cuda", m["cuda_version"], "criu", m["criu_version"])
print("  image", round(m["image_bytes"] / 2**30, 2), "GiB in", len(m["images"]), "files; GPUs", [g["uuid"] for g in m["gpus"]])
for p in m["cuda"]:
    print("  cuda pid", p["pid"], [(f["gpu"], round(f["bytes"] / 2**30, 2)) for f in p["footprint"]])
print("  timings (ms):", m["timings"])
EOF
    [ -s "$W/manifest-summary.txt" ] || why="$why no manifest;"
    # Hold the job's first GPUs with a second high job queued now (it starts
    # when the preemptor ends, before the job may): the job must move.
    if [ "$N" -ge $((2 * ranks)) ]; then
        wait_until 60 "the preemptor to run" state_is "$pre" RUNNING
        hold=$(as gmtest2 $S/sbatch --parsable -J hold -p high --gres=gpu:"$ranks" --output=/dev/null --wrap 'sleep 600')
        moved=1
    fi
    if ! wait_until 240 "the restore" grep -q "restored (pid" "$W/job.out"; then
        cat "$W/job.out"; verdict "$name" 1 "not restored"; $S/scancel "$job" $hold; return
    fi
    apps > "$W/apps-restored.txt"; say "$name: restored:"; cat "$W/apps-restored.txt"
    for p in $pids; do
        grep -q "^$p," "$W/apps-restored.txt" || why="$why pid $p holds no GPU memory after the restore;"
        if [ $moved = 1 ]; then
            local was now
            was=$(grep "^$p," "$W/apps-before.txt" | cut -d, -f2 | tr -d ' '); now=$(grep "^$p," "$W/apps-restored.txt" | cut -d, -f2 | tr -d ' ')
            [ -n "$now" ] && [ "$was" != "$now" ] || why="$why pid $p did not move ($was -> $now);"
        fi
    done
    touch "$W/go"
    wait_until 300 "the job's end" finished "$job"
    [ -n "$hold" ] && $S/scancel "$hold"
    say "$name: job $job $(field "$job" JobState), exit code $(field "$job" ExitCode), restarts $(field "$job" Restarts); its output:"
    grep -v '^$' "$W/job.out"
    [ "$(grep -c "$intact" "$W/job.out")" = "$ranks" ] || why="$why pattern not verified;"
    [ "$(field "$job" ExitCode)" = 0:0 ] || why="$why exit code $(field "$job" ExitCode);"
    grep -q "checkpointed:" "$W/job.out" || why="$why no checkpoint line;"
    [ -d "$D/images/$job" ] && why="$why images left after the end;"
    [ -z "$why" ]; verdict "$name" $? "$why"
}

# train_case NAME PREEMPTS ARGS...: checkpoint/bench/train_app.py ARGS (issue 24: DataLoader
# workers, pinned memory, NVML) as a plain job (no gpu-mode-run: the reference), then under
# gpu-mode-run, preempted PREEMPTS times (0, 1 or 2: after step 5, and after step 15 of the
# restored run). PASS: the wrapped job completes on its own, restored after each preemption,
# and every step's loss is logged once and bitwise equal to the reference's. The workers' GPU
# files before the first preemption go to worker-files.txt.
train_case() {
    local name=$1 preempt=$2 W=$U/$1 job pre pid why="" k
    shift 2
    mkdir -p "$W"; chmod 1777 "$W"
    for k in plain job; do
        local app="$(command -v python3) $B/train_app.py --ready $W/ready-$k $*" wrap=""
        [ $k = job ] && wrap="$B/gpu-mode-run --config $D/gpu-mode.toml --"
        printf '#!/bin/sh\nexec %s %s %s\n' "$DROP" "$wrap" "$app" > "$W/$k.sh"; chmod 755 "$W/$k.sh"
    done
    submit() { (cd "$W" && as $JOBUSER $S/sbatch --parsable -J "$name-$1" -p low --gpu-mode=checkpoint --signal=B:USR1@60 \
        --requeue --open-mode=append --gres=gpu:1 --time=10 --output="$W/$1.out" "$W/$1.sh"); }
    steps_at_least() { [ "$(grep -c '^step ' "$1")" -ge "$2" ]; }
    job=$(submit plain)
    wait_until 240 "the reference run" finished "$job"
    say "$name: reference job $job $(field "$job" JobState) $(field "$job" ExitCode), $(grep -c '^step ' "$W/plain.out") steps"
    job=$(submit job)
    say "$name: job $job (as $JOBUSER): $*"
    restored_at_least() { [ "$(grep -c 'restored (pid' "$W/job.out")" -ge "$1" ]; }
    requeued_times() { state_is "$1" PENDING && [ "$(field "$1" Restarts)" = "$2" ]; }
    if [ "$preempt" -ge 1 ]; then
        wait_until 240 "step 5" steps_at_least "$W/job.out" 5 || why="$why never reached step 5;"
        pid=$(cat "$W/ready-job" 2>/dev/null)
        for k in $(pgrep -P "${pid:-0}") ; do
            echo "worker $k ($(tr '\0' ' ' < /proc/$k/cmdline | cut -c1-80)):"
            ls -l /proc/$k/fd 2>/dev/null | grep -E 'nvidia|/dev/shm' | sed 's/^.* \([0-9]*\) -> /  fd \1 -> /'
            grep -E 'nvidia|/dev/shm' /proc/$k/maps | sed 's/^/  map /'
        done > "$W/worker-files.txt"
        say "$name: the workers' GPU and /dev/shm files:"; cat "$W/worker-files.txt"
        pre=$(as gmtest2 $S/sbatch --parsable -J preemptor -p high --gres=gpu:"$N" --output="$W/preemptor.out" --wrap 'sleep 5')
        wait_until 240 "the requeue" requeued "$job" || why="$why not requeued;"
    fi
    if [ "$preempt" -ge 2 ]; then
        wait_until 300 "the first restore" restored_at_least 1 || why="$why not restored once;"
        wait_until 240 "step 15" steps_at_least "$W/job.out" 15 || why="$why never reached step 15;"
        pre=$(as gmtest2 $S/sbatch --parsable -J preemptor -p high --gres=gpu:"$N" --output="$W/preemptor2.out" --wrap 'sleep 5')
        wait_until 240 "the second requeue" requeued_times "$job" 2 || why="$why not requeued twice;"
    fi
    wait_until 400 "the job's end" finished "$job" || { why="$why did not end;"; $S/scancel "$job"; }
    say "$name: job $job $(field "$job" JobState), exit code $(field "$job" ExitCode), restarts $(field "$job" Restarts); gpu-mode-run said:"
    grep -E '^gpu-mode-run|Error|Traceback|MISMATCH|DONE' "$W/job.out" | cut -c1-400
    [ "$(field "$job" ExitCode)" = 0:0 ] || why="$why exit code $(field "$job" ExitCode);"
    [ "$preempt" -ge 1 ] && ! restored_at_least "$preempt" && why="$why restored $(grep -c 'restored (pid' "$W/job.out") of $preempt times;"
    python3 "$B/train_app.py" --compare "$W/job.out" "$W/plain.out" || why="$why losses differ from the reference;"
    [ -z "$why" ]; verdict "$name" $? "$why"
}

if [ "$PART" = all ] || [ "$PART" = e2e ]; then
    say "== e2e: the cluster"
    "$B/gpu-mode-cluster" down --name real >/dev/null 2>&1
    GPU_MODE_GPU_DEVICES=$(seq -s, -f /dev/nvidia%g 0 $((N - 1))) "$B/gpu-mode-cluster" up --name real --gpus "$N" --preempt \
        || { tail -n 30 "$D"/log/*.log; exit 1; }
    say "jobs run as $JOBUSER"
    for c in ${E2E_CASES:-1gib 16gib 2ranks}; do
        case $c in
            1gib) preempt_case ckpt-1gib 1 1 ;;
            torch8) preempt_case ckpt-torch8 8 1 torch ;;
            16gib) preempt_case ckpt-16gib 16 1 ;;
            2ranks) [ "$N" -ge 2 ] && preempt_case ckpt-2ranks 1 2 ;;
            train-end) train_case train-end 0 --steps 20 --interval 0.2 --workers 2 --persistent --pin-memory --nvml ;;
            train-fork) train_case train-fork 1 --steps 40 --interval 0.3 --workers 2 --persistent --pin-memory --nvml ;;
            train-spawn) train_case train-spawn 1 --steps 40 --interval 0.3 --workers 2 --persistent --start-method spawn ;;
            # Issue 24's acceptance shape: a 2-layer transformer, 4 workers, pinned memory, NVML, preempted twice.
            train-accept) train_case train-accept 2 --steps 60 --interval 0.3 --model transformer --workers 4 --persistent --pin-memory --nvml ;;
            # Issue 24 item 4: a torch.compile'd model, a CUDA-graph-captured step, CUDA events.
            train-compile) train_case train-compile 1 --steps 40 --interval 0.3 --workers 2 --persistent --pin-memory --compile --events ;;
            train-graph) train_case train-graph 1 --steps 40 --interval 0.3 --workers 2 --persistent --pin-memory --cuda-graph --events ;;
        esac
    done
    say "== prolog/epilog lines"; cat "$D/log/hooks.log"
    cp "$D/log/hooks.log" "$D/log/slurmctld.log" "$D/log/slurmd.log" "$OUT/" 2>/dev/null
    "$B/gpu-mode-cluster" down --name real
    tar -C /tmp -czf "$OUT/e2e-cases.tgz" gm-preempt-user
fi

if [ "$PART" = all ] || [ "$PART" = bench ]; then
    say "== bench ($BENCH_APP: ours vs the plain sequence), within $(left) s"
    W=/tmp/gm-preempt-bench; rm -rf "$W"; mkdir -p "$W"
    printf 'runtime_dir = "%s/run"\n[log]\nsyslog = false\nstderr = true\n[checkpoint]\nlock_timeout_ms = 5000\nearly_writeback = %s\nhuge_pages = %s\nhuge_pages_library = "%s"\n' \
        "$W" "${EARLY_WRITEBACK:-true}" "${HUGE_PAGES:-true}" "$B/libgpu_mode_hugepages.so" > "$W/config.toml"
    if [ "${WARM_GIB:-0}" -gt 0 ]; then
        say "touching $WARM_GIB GiB of host memory once (WARM_GIB)"
        python3 -c "import torch, sys; torch.empty(int(sys.argv[1]) << 30, dtype=torch.uint8).fill_(1)" "$WARM_GIB" || say "warm-up failed"
        say "warm-up done"; free -g | head -2
    fi
    BUID=0; [ "$JOBUSER" = gmtest1 ] && BUID=$(id -u gmtest1 2>/dev/null || echo 0)
    SKIPPED=""
    for c in ${CASES//,/ }; do
        g=${c%x*} n=${c#*x}
        # H100, PyTorch (measured 2026-11-25): about 6 s per GiB for both
        # sequences and 1 for the disk probe (once per case), plus 30 s of
        # start-ups per round.
        R=${BENCH_REPEAT:-1}
        est=$(( (g * n * 6 + 30) * R + g * n ))
        if [ "$est" -gt "$(left)" ]; then say "bench $c skipped: estimated $est s, $(left) s left"; SKIPPED="$SKIPPED,$c"; continue; fi
        if [ "$BENCH_APP" = testprog ]; then
            app=$B/gpu-mode-ckpt-testprog; args="--gib {gib} --device {device} --seed {i} --ready {ready} --go {go}"
        else
            app=$(command -v python3)
            args="$REPO/checkpoint/bench/framework_app.py --framework $BENCH_APP --gib {gib} --device {device} --seed {i} --ready {ready} --go {go}"
        fi
        timeout "$(left)" "$B/gpu-mode-preempt-bench" --config "$W/config.toml" --app "$app" --app-args "$args" \
            --cases "$c" --repeat "$R" --plain-driver "${PLAIN_DRIVER:-raw}" --gpus "$N" --uid "$BUID" --workdir "$W" \
            ${PLAIN_HUGE_PAGES:+--plain-huge-pages} 2>&1 | tee -a "$OUT/bench.txt"
        rm -rf "$W/images" "$W/plain-images"
    done
    [ -n "$SKIPPED" ] && say "not run (time bound): bash scripts/gpu/preempt-real.sh $CARRY bench ${SKIPPED#,}"
fi

say "== GPUs after"
nvidia-smi --query-gpu=index,compute_mode,persistence_mode,mig.mode.current --format=csv,noheader > "$OUT/gpu-settings-after.txt"
cmp -s "$OUT/gpu-settings-before.txt" "$OUT/gpu-settings-after.txt" && say "GPU settings unchanged" || say "GPU SETTINGS CHANGED"
apps || true
say "done: $FAILS failed case(s)"
