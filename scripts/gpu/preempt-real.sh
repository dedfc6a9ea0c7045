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
#          (default 1gib 16gib 2ranks); torch8 (torch32) is a PyTorch process of 8 (32) GiB
#          (tools/ckpt-bench/apps/framework_app.py) preempted the same way;
#          refuse130: a 130 GiB job on a 125 GiB host, refused before the lock (requeued, no image, no drain);
#          torch2-fork, torch2-spawn: 2 GiB of PyTorch with a DataLoader of 4
#          workers of that start method alive across the checkpoint;
#          train-end, train-fork, train-spawn: a training job with DataLoader
#          workers (tools/ckpt-bench/apps/train_app.py, issue 24; see train_case).
#          torchrun-gloo, torchrun-gloo2, torchrun-nccl: several processes of
#          one job (issue 24 item 5): torchrun --standalone --nproc_per_node=2
#          train_app.py --ddp gloo (both ranks on the job's one GPU), gloo on 2
#          GPUs, NCCL on 2 GPUs (the 2-GPU cases are skipped, with a line, on a
#          machine with fewer); see train_case. These turn the agent's syslog
#          lines on and keep them ($OUT/gpu-mode-syslog.txt, per job in
#          $OUT/<case>-agent.log).
#          nccl-ddp, nccl-fsdp (issue 38 item 4; 2 GPUs): torchrun
#          --nproc_per_node=2 train_app.py --ddp nccl (--fsdp: FSDP
#          FULL_SHARD), the transformer, 2 DataLoader workers per rank, NVML,
#          submitted with --gpu-mode=checkpoint:nccl=portable and preempted
#          twice; the reference run is under gpu-mode-run in the same mode
#          (never preempted), so both have NCCL's portable variables, which
#          every rank's `ddp:` line must show. These give up at the first sign
#          of failure (a "checkpoint of job J failed" or "cannot restore" line,
#          the job ended early, no output for 60 s while it runs) rather than
#          waiting out each step's limit. PREEMPT_CONFIG="key = value" adds
#          lines to the cluster's [preempt] section (e.g. ghost_limit_mib).
#          PREEMPT_MODE (default checkpoint) is the preempted case's --gpu-mode
#          (e.g. checkpoint:pool=on), PREEMPT_SHIM_LOG=1 puts the huge-page
#          shim's lines (its pool's) in job.out, PREEMPT_SETTLE_S=N lets the
#          job run N s before its preemptor (a pool fills meanwhile).
#          E2E waits never pass BUDGET_S; a case that starts with less than
#          60 s left is skipped, with a line.
#   bench: gpu-mode-preempt-bench, ours and the plain sequence (driver toggle,
#          criu dump, sync; criu restore, driver restore) side by side, with
#          the disk's fsync bandwidth and the ratios of issue 17's targets
#          (cases GiBxprocesses, default 8x1,32x1,4x4). BENCH_APP picks the
#          program: torch (default: a real PyTorch process,
#          tools/ckpt-bench/apps/framework_app.py), jax, or testprog
#          (gpu-mode-ckpt-testprog, the bare pattern holder); BENCH_APP_ARGS
#          adds framework_app.py arguments (e.g. "--workers 4 --start-method
#          spawn": the training shape of issue 24). BENCH_REPEAT=N
#          runs each case N times, alternating which side goes first, and
#          prints the medians of the ratios (the driver's own time varies).
#          WARM_GIB=N first touches N GiB of host memory once and frees it:
#          on a freshly started VM the first use of each page of guest memory
#          is slower, and whichever side ran first paid for it (a node in
#          service has long touched its memory). EARLY_WRITEBACK=false sets
#          [preempt] early_writeback = false for ours (A/B). BENCH_GPUS=N
#          places the bench's processes on the first N GPUs only (4x4 on one
#          GPU: issue 25 item 2's comparison).
#          PLAIN_DRIVER=bounded: the plain sequence calls the driver as the
#          agent does (a thread per call, under a deadline).
#          HUGE_PAGES=false sets [preempt] huge_pages = false for ours
#          (A/B); PLAIN_HUGE_PAGES=1 preloads the same huge-page shim into
#          the plain sequence's programs.
#          PAGE_READERS=N sets [preempt] restore_page_readers for ours
#          (default 8; the plain sequence's criu restore reads with one).
#          COLD=1: every restore, and the read-back probes, read the image
#          from the storage (dropped from the page cache first).
#          POOL=1: ours' programs keep a host memory pool (pool=on), full
#          before the signal; NO_PLAIN=1: ours alone; BOUNDS=1: the copy
#          engines' rates measured first (ckpt_diag.py --bounds-only), and
#          GPU free and the driver's restore printed against them.
#   nccl-bench: (2 GPUs, no Slurm, nothing installed) what NCCL's portable
#          transports cost: tools/ckpt-bench/apps/nccl_bench.py under
#          torchrun --nproc_per_node=2, once with NCCL's defaults and once
#          with the portable variables (read from preempt/src/nccl.rs, as
#          gpu-mode-run sets them): all-reduce busbw 1 MiB..1 GiB and a DDP
#          step's median ms (train_app's transformer, a GPT-like stack), side
#          by side ($OUT/nccl-bench.txt, JSON lines in $OUT/nccl-bench-*.jsonl,
#          NCCL's transport lines in $OUT/nccl-bench-<mode>-transports.txt).
#          About 1-2 min; each launch is bounded by NCCLBENCH_LIMIT_S (75 s)
#          and BUDGET_S; NCCLBENCH_ARGS adds nccl_bench.py arguments.
# Usage (repo root of the GPU machine):
#   bash scripts/gpu/preempt-real.sh CARRY [all|e2e|bench|nccl-bench] [CASES]
# CARRY is the folder scripts/gpu/preempt-carry.sh made (.dev-carry/preempt).
# Everything is logged to $OUT (preempt-real.log, per-case files). The run
# stays within BUDGET_S (default 510 s): bench cases that would not fit are
# skipped and the command that runs them is printed.
# Never changes compute mode, MIG, persistence, clocks or power limits, never
# resets a GPU (the cluster's config leaves every GPU setting as it is).
set -u
CARRY=${1:?usage: preempt-real.sh CARRY [all|e2e|bench|nccl-bench] [CASES]}
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
STARTED_OVER=0
SKIPPED_CASES=""
verdict() { if [ "$2" = 0 ]; then say "CASE $1: PASS"; else say "CASE $1: FAIL ($3)"; FAILS=$((FAILS + 1)); fi; }

say "== GPUs before (nothing below changes these settings)"
nvidia-smi --query-gpu=index,name,uuid,compute_mode,persistence_mode,mig.mode.current,memory.used --format=csv
nvidia-smi --query-gpu=index,compute_mode,persistence_mode,mig.mode.current --format=csv,noheader > "$OUT/gpu-settings-before.txt"
# The link protections the package's sysctl.d file sets (the distribution
# defaults, which this machine's image does not apply) are left as they are:
# the agent carries a job's semaphores in /dev/shm without them since issue 37
# (preempt/src/shm.rs), so the spawn cases run with this machine's own values.
say "link protections (left as they are): $(sysctl -n fs.protected_symlinks fs.protected_hardlinks | tr '\n' ' ')"
N=$(nvidia-smi -L | grep -c '^GPU')
mapfile -t UUID < <(nvidia-smi --query-gpu=uuid --format=csv,noheader)

say "== installing the carried pieces"
# The job users must reach the programs: not under the repo (maybe /root).
B=/opt/gm-preempt
P=/opt/sroot
if [ "$PART" = nccl-bench ]; then
    say "(nccl-bench: nothing to install)"
else
    rm -rf "$B"; mkdir -p "$B"; cp "$A"/lib*.so "$A"/gpu-mode-* "$REPO/tools/ckpt-bench/apps/framework_app.py" "$REPO/tools/ckpt-bench/apps/train_app.py" "$B/"; chmod 755 "$B" "$B"/*
    sh "$REPO/scripts/install-criu.sh" --from "$A/criu" || { say "CRIU install failed"; exit 1; }
    /opt/slurm-gpu-mode/criu/bin/criu check || say "warning: criu check failed"
    [ -x $P/usr/sbin/slurmctld-wlm ] || { mkdir -p $P; for f in "$A"/debs/*.deb; do dpkg -x "$f" $P; done; }
fi
L=$P/usr/lib/x86_64-linux-gnu
S=$P/usr/bin
export GPU_MODE_SLURM_PREFIX=$P GPU_MODE_ARTIFACTS=$B GPU_MODE_CLUSTER_BASE=/tmp/gmc-preempt-real
export LD_LIBRARY_PATH=$L:$L/slurm-wlm:$P/lib/x86_64-linux-gnu
D=$GPU_MODE_CLUSTER_BASE/real
export SLURM_CONF=$D/slurm.conf
U=/tmp/gm-preempt-user
rm -rf "$U"; mkdir -p "$U"; chmod 1777 "$U"

# Who runs the preempted jobs: gmtest1, as in production (CRIU runs as the
# job's user, issue 27). Root without capabilities (setpriv) only where
# GPU_MODE_TEST_JOBS_AS_ROOT=1 asks for it.
if [ "${GPU_MODE_TEST_JOBS_AS_ROOT:-0}" = 1 ]; then JOBUSER=root; DROP="/usr/bin/setpriv --bounding-set=-all --inh-caps=-all --"; else JOBUSER=gmtest1; DROP=""; fi
as() { local u=$1; shift; if [ "$u" = root ]; then "$@"; else runuser -u "$u" -- env SLURM_CONF="$SLURM_CONF" LD_LIBRARY_PATH="$LD_LIBRARY_PATH" "$@"; fi; }
field() { $S/scontrol show job -o "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
state_is() { [ "$(field "$1" JobState)" = "$2" ]; }
requeued() { state_is "$1" PENDING && [ "$(field "$1" Restarts)" = 1 ]; }
finished() { case "$(field "$1" JobState)" in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY) return 0 ;; esac; return 1; }
ready_all() { local i; for i in $(seq 0 $(($2 - 1))); do [ -s "$1/ready$i" ] || return 1; done; }
wait_until() {
    local limit=$1 what=$2 i=0; shift 2
    # Never past BUDGET_S (the caller's command has a hard limit).
    [ "$limit" -gt "$(left)" ] && limit=$(left)
    until "$@"; do sleep 0.5; i=$((i + 1)); [ $i -ge $((limit * 2)) ] && { say "timed out after $limit s waiting for $what"; return 1; }; done
    return 0  # (an until loop's status is its body's last, here the failed test)
}
apps() { nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader; }
# NCCL's portable variables as gpu-mode-run sets them (preempt/src/nccl.rs,
# PORTABLE_ENV), one NAME=VALUE per line: the one table, read, never copied.
portable_env() {
    python3 - "$REPO/preempt/src/nccl.rs" <<'PYEOF'
import re, sys
src = open(sys.argv[1]).read()
table = src[src.index("pub const PORTABLE_ENV"):]
table = table[: table.index("];")]
pairs = re.findall(r'name:\s*"(NCCL_\w+)",\s*value:\s*"([^"]*)"', table)
if not pairs:
    sys.exit("no NCCL variable found in PORTABLE_ENV of " + sys.argv[1])
print("\n".join(f"{k}={v}" for k, v in pairs))
PYEOF
}
# torchrun as installed with PyTorch, else the same module through python3.
TORCHRUN=$(command -v torchrun || echo "$(command -v python3) -m torch.distributed.run")


# preempt_case NAME GIB RANKS [torch [ARGS...]]: one preemption, end to end (see the header);
# ARGS go to framework_app.py (e.g. --workers 4 --start-method spawn: DataLoader workers, issue 24).
preempt_case() {
    local name=$1 gib=$2 ranks=$3 fw=${4:-} W=$U/$1 app job pre hold="" moved=0 why="" intact="^VERIFY OK"
    shift 3; [ $# -gt 0 ] && shift
    local extra="$*"
    mkdir -p "$W"; chmod 1777 "$W"
    # The ranks' launcher is the benchmark's (`launch N GPUS DIR APP ARGS`, a
    # Rust parent that waits for them); rank i runs on the job's GPU i and
    # writes its pid to $W/ready<i>. (A shell parent was seen to hang after a
    # restore when a short-lived child of it died during the dump.)
    app="$B/gpu-mode-preempt-bench launch $ranks $ranks $W $B/gpu-mode-ckpt-testprog --gib $gib --device {device} --seed {i} --ready {ready} --go $W/go"
    if [ -n "$fw" ]; then
        app="$B/gpu-mode-preempt-bench launch $ranks $ranks $W $(command -v python3) $B/framework_app.py --framework $fw --gib $gib --device {device} --seed {i} --ready {ready} --go $W/go $extra"
        intact="^framework_app: .*: intact"
    fi
    # exec: gpu-mode-run must be the batch shell, which --signal=B:USR1 reaches.
    # PREEMPT_SHIM_LOG=1: the huge-page shim's lines (its pool's) in job.out.
    printf '#!/bin/sh\n%bexec %s %s/gpu-mode-run --config %s/gpu-mode.toml -- %s\n' \
        "${PREEMPT_SHIM_LOG:+export GPU_MODE_HUGEPAGES_LOG=1\n}" "$DROP" "$B" "$D" "$app" > "$W/job.sh"
    chmod 755 "$W/job.sh"
    job=$(cd "$W" && as $JOBUSER $S/sbatch --parsable -J "$name" -p low --gpu-mode="${PREEMPT_MODE:-checkpoint}" --signal=B:USR1@60 --requeue \
        --open-mode=append --gres=gpu:"$ranks" --output="$W/job.out" "$W/job.sh")
    say "$name: job $job ($gib GiB x $ranks, as $JOBUSER) submitted"
    if ! wait_until 300 "the pattern" ready_all "$W" "$ranks"; then cat "$W/job.out"; verdict "$name" 1 "never ready"; $S/scancel "$job"; return; fi
    apps > "$W/apps-before.txt"; say "$name: holding its pattern:"; cat "$W/apps-before.txt"
    local pids="" f; for f in "$W"/ready?; do pids="$pids $(cat "$f")"; done
    # PREEMPT_SETTLE_S: a job runs this long before its preemption (a pool=on
    # job's pool fills meanwhile; a real job runs minutes to days first).
    if [ "${PREEMPT_SETTLE_S:-0}" -gt 0 ]; then sleep "$PREEMPT_SETTLE_S"; grep -h "gpu-mode-pool" "$W/job.out" | tail -n 3; fi
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
    # CRIU's own account of the restore (it goes with the image at the job's
    # end): kept in the case's folder, and where its time went, each step
    # that took 10 ms or more after the line before it.
    if cp "$D/images/$job/.criu-0-restore/restore.log" "$W/restore.log" 2>/dev/null; then
        say "$name: CRIU's restore, steps of 10 ms or more (restore.log):"
        grep -E "Mapped|Page readers read|Restore finished" "$W/restore.log" | cut -c1-160
        awk -F'[()]' '/^\(/ { t = $2 + 0; if (NR > 1 && t - p >= 0.010) printf "  +%.3f s before: %s\n", t - p, substr($0, 1, 140); p = t }' "$W/restore.log" | head -n 20
    fi
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

# refuse_case NAME GIB: issue 39 item 3. A job whose GPU memory cannot fit in
# the node's host memory (130 GiB on a 125 GiB host) is refused before anything
# is locked, with the words that say why, and starts over: requeued, no image,
# no drain. The requeued run is cancelled (it would only be refused again).
refuse_case() {
    local name=$1 gib=$2 W=$U/$1 job pre why=""
    mkdir -p "$W"; chmod 1777 "$W"
    local app="$B/gpu-mode-preempt-bench launch 1 1 $W $B/gpu-mode-ckpt-testprog --gib $gib --device {device} --seed {i} --ready {ready} --go $W/go"
    printf '#!/bin/sh\nexec %s %s/gpu-mode-run --config %s/gpu-mode.toml -- %s\n' "$DROP" "$B" "$D" "$app" > "$W/job.sh"
    chmod 755 "$W/job.sh"
    job=$(cd "$W" && as $JOBUSER $S/sbatch --parsable -J "$name" -p low --gpu-mode=checkpoint --signal=B:USR1@60 --requeue \
        --open-mode=append --gres=gpu:1 --output="$W/job.out" "$W/job.sh")
    say "$name: job $job ($gib GiB on the GPU, as $JOBUSER; host: $(free -g | awk '/^Mem/{print $2 " GiB, " $7 " GiB available"}')) submitted"
    if ! wait_until 300 "the pattern" ready_all "$W" 1; then cat "$W/job.out"; verdict "$name" 1 "never ready"; $S/scancel "$job"; return; fi
    pre=$(as gmtest2 $S/sbatch --parsable -J preemptor -p high --gres=gpu:"$N" --output="$W/preemptor.out" --wrap 'sleep 5')
    say "$name: preemptor $pre submitted"
    wait_until 240 "the requeue" requeued "$job" || why="$why not requeued;"
    grep -h "refused before anything was locked" "$W/job.out" "$D"/log/*.log 2>/dev/null | head -n 3 | tee "$W/refusal.txt"
    [ -s "$W/refusal.txt" ] || why="$why no refusal line;"
    [ -d "$D/images/$job/0" ] && why="$why an image was written;"
    $S/sinfo -h -o "%T %E" | tee "$W/sinfo.txt" | grep -qi drain && why="$why the node drained;"
    $S/scancel "$job"; wait_until 120 "the job's end" finished "$job"
    grep -v '^$' "$W/job.out" | tail -n 20
    [ -z "$why" ]; verdict "$name" $? "$why"
}

# tree_snapshot PID FILE: every process of the job PID belongs to (the tree under
# its slurmstepd, found by walking up from PID), each with pid, ppid, uid, cmdline,
# `ls -l /proc/PID/fd`, its maps lines of files under /dev/ (nvidia*, /dev/shm,
# /dev/zero ...), of memfds and of deleted files, and its sockets (ss, where
# present); then `ls -l /dev/shm`. Each process's whole maps go beside FILE
# (maps-PID.txt). Taken just before a preemption: what CRIU will be asked to dump.
tree_snapshot() {
    python3 - "$1" "$(dirname "$2")" > "$2" 2>&1 <<'EOF'
import os, shutil, subprocess, sys

def stat(p):
    try:
        s = open(f"/proc/{p}/stat").read()
    except OSError:
        return None
    r = s.rfind(")")
    return s[s.find("(") + 1 : r], int(s[r + 2 :].split()[1])

start, where = int(sys.argv[1]), sys.argv[2]
if start <= 1:
    sys.exit(f"no pid to start from ({start}): the ready file is missing")
top, p = start, start
while True:
    st = stat(p)
    if st is None:
        break
    top = p
    if st[0] == "slurmstepd" or st[1] <= 1:
        break
    p = st[1]
kids = {}
for d in os.listdir("/proc"):
    if d.isdigit():
        st = stat(int(d))
        if st:
            kids.setdefault(st[1], []).append(int(d))
order, todo = [], [(top, 0)]
while todo:
    p, depth = todo.pop()
    order.append((p, depth))
    todo.extend((c, depth + 1) for c in sorted(kids.get(p, []), reverse=True))
print(f"the job's tree, from pid {top} ({(stat(top) or ('?',))[0]}), walked up from pid {start}:")
for p, depth in order:
    st = stat(p) or ("?", -1)
    try:
        cmd = open(f"/proc/{p}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace").strip()
        uid = [l.split()[1] for l in open(f"/proc/{p}/status") if l.startswith("Uid:")][0]
    except OSError as e:
        cmd, uid = f"({e})", "?"
    print(f"{'  ' * depth}pid {p} ppid {st[1]} uid {uid} comm {st[0]}: {cmd[:300]}")
for p, _ in order:
    st = stat(p) or ("?", -1)
    if st[0] == "slurmstepd":
        continue
    print(f"\n===== pid {p} ({st[0]}), ppid {st[1]}")
    try:
        names = sorted({open(f"/proc/{p}/task/{t}/comm").read().strip() for t in os.listdir(f"/proc/{p}/task")})
        print(f"--- threads' names: {', '.join(names)}")
    except OSError as e:
        print(f"--- threads: ({e})")
    print(f"--- ls -l /proc/{p}/fd")
    print(subprocess.run(["ls", "-l", f"/proc/{p}/fd"], capture_output=True, text=True).stdout.rstrip())
    print(f"--- /proc/{p}/maps, paths under /dev/, memfds, deleted files (all of it: maps-{p}.txt)")
    try:
        shutil.copyfile(f"/proc/{p}/maps", os.path.join(where, f"maps-{p}.txt"))
        for line in open(f"/proc/{p}/maps"):
            w = line.split(None, 5)
            path = w[5].strip() if len(w) == 6 else ""
            if path.startswith(("/dev/", "/memfd:", "/SYSV", "/anon_hugepage")) or path.endswith("(deleted)"):
                print(line.rstrip())
    except OSError as e:
        print(f"({e})")
pids = {f"pid={p}," for p, _ in order}
print("\n===== sockets of the tree (ss -anp: tcp, unix)")
for kind in ("-t", "-x"):
    try:
        out = subprocess.run(["ss", "-anp", kind], capture_output=True, text=True).stdout.splitlines()
        print("\n".join(l for l in out if any(x in l for x in pids)))
    except OSError as e:
        print(f"(no ss: {e})")
        break
print("\n===== ls -l /dev/shm")
print(subprocess.run(["ls", "-la", "--full-time", "/dev/shm"], capture_output=True, text=True).stdout.rstrip())
EOF
}

# The agent logs to syslog only (its stderr is /dev/null) and the cluster's
# config turns syslog off. syslog_on turns it on for the agents started from
# now on, listening on /dev/log itself where nothing does (a socket found dead
# is set aside and put back by syslog_off); agent_log JOB... prints their lines.
SYSLOG_FILE=$OUT/gpu-mode-syslog.txt
SYSLOG_PID=""
SYSLOG_SINCE=""
syslog_on() {
    [ -n "$SYSLOG_SINCE" ] && return 0
    SYSLOG_SINCE=$(date '+%Y-%m-%d %H:%M:%S')
    sed -i 's/^syslog = false$/syslog = true/' "$D/gpu-mode.toml"
    grep -q '^syslog = true$' "$D/gpu-mode.toml" || say "warning: could not turn syslog on in $D/gpu-mode.toml"
    if python3 -c 'import socket; socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).connect("/dev/log")' 2>/dev/null; then
        say "syslog: /dev/log has a listener: the agent's lines are read back from it (journalctl or /var/log)"
        return 0
    fi
    if [ -e /dev/log ] || [ -L /dev/log ]; then mv /dev/log /dev/log.gm-preempt-saved && say "syslog: /dev/log had no listener: set aside"; fi
    python3 -u - "$SYSLOG_FILE" <<'EOF' &
import os, socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind("/dev/log")
os.chmod("/dev/log", 0o666)
with open(sys.argv[1], "ab", buffering=0) as f:
    while True:
        d = s.recv(1 << 16)
        f.write(time.strftime("%H:%M:%S ").encode() + d.rstrip(b"\0\n") + b"\n")
EOF
    SYSLOG_PID=$!
    trap syslog_off EXIT
    wait_until 10 "the syslog listener" test -S /dev/log && say "syslog: listening on /dev/log (pid $SYSLOG_PID) into $SYSLOG_FILE"
}
syslog_off() {
    [ -n "$SYSLOG_PID" ] || return 0
    kill "$SYSLOG_PID" 2>/dev/null; wait "$SYSLOG_PID" 2>/dev/null
    rm -f /dev/log
    if [ -e /dev/log.gm-preempt-saved ] || [ -L /dev/log.gm-preempt-saved ]; then mv /dev/log.gm-preempt-saved /dev/log; fi
    SYSLOG_PID=""
}
agent_log() {
    [ -n "$SYSLOG_SINCE" ] || return 0
    local re; re="job=($(echo "$*" | tr ' ' '|'))([^0-9]|$)"
    if [ -n "$SYSLOG_PID" ]; then
        grep -E "$re" "$SYSLOG_FILE" 2>/dev/null
        return 0
    fi
    command -v journalctl >/dev/null && journalctl -q -t slurm-gpu-mode --since "$SYSLOG_SINCE" -o short-precise 2>/dev/null | grep -E "$re"
    grep -hE "slurm-gpu-mode.*$re" /var/log/syslog /var/log/messages 2>/dev/null
    return 0
}

# train_case NAME PREEMPTS ARGS...: tools/ckpt-bench/apps/train_app.py ARGS (issue 24: DataLoader
# workers, pinned memory, NVML) as a plain job (no gpu-mode-run: the reference), then under
# gpu-mode-run, preempted PREEMPTS times (0, 1 or 2: after step 5, and after step 15 of the
# restored run). PASS: the wrapped job completes on its own, restored after each preemption,
# and every step's loss is logged once and bitwise equal to the reference's. The workers' GPU
# files before the first preemption go to worker-files.txt, the whole tree's files (fds, maps
# under /dev/, sockets, /dev/shm) to tree-before-preempt.txt (also $OUT/NAME-tree.txt).
# Each phase that ends is said with its time ("NAME: the requeue (+12 s, case at 48 s)").
# The caller may set, for one call: TC_LAUNCH, a launcher put before train_app.py (torchrun);
# TC_GPUS, the job's GPUs (--gres=gpu:N, default 1); TC_MODE, the --gpu-mode value of both
# jobs (default checkpoint): with checkpoint:nccl=portable the reference also runs under
# gpu-mode-run (never preempted), so it has NCCL's portable variables as the job does, and
# every rank's `ddp:` line of both runs must name each of them (portable_env);
# TC_FAILFAST=1: give up at the first sign of failure (gpu-mode-run's "checkpoint of job J
# failed", "cannot restore job J" or a later run "starting the application from the
# beginning"; the job ended before the phase; no output for TC_STALL_S, default 90, while
# the job runs), cancel the job and say why, instead of waiting out each phase's limit;
# TC_STARTOVER=1: a checkpoint the agent
# refused before locking anything (gpu-mode-run's "checkpoint of job J failed: ..." naming no
# rollback: neither "GPU state was restored", "could NOT be restored" nor "; rollback: "), after
# which the job started over and completed
# with the reference's losses, is reported as "refused cleanly, started over, completed" and
# not counted as a failure (issue 24 item 5's expected behaviour where the driver cannot).
train_case() {
    local name=$1 preempt=$2 W=$U/$1 job pre pid why="" k plainjob failed launch=${TC_LAUNCH:-} gpus=${TC_GPUS:-1}
    local mode=${TC_MODE:-checkpoint} refwrap=0 failfast=${TC_FAILFAST:-0} stall=${TC_STALL_S:-90} gaveup="" tstart tphase
    tstart=$(date +%s); tphase=$tstart
    case $mode in *nccl=portable*) refwrap=1 ;; esac
    shift 2
    mkdir -p "$W"; chmod 1777 "$W"
    for k in plain job; do
        local app="${launch:-$(command -v python3)} $B/train_app.py --ready $W/ready-$k $*" wrap=""
        { [ $k = job ] || [ $refwrap = 1 ]; } && wrap="$B/gpu-mode-run --config $D/gpu-mode.toml --"
        printf '#!/bin/sh\nexec %s %s %s\n' "$DROP" "$wrap" "$app" > "$W/$k.sh"; chmod 755 "$W/$k.sh"
    done
    submit() { (cd "$W" && as $JOBUSER $S/sbatch --parsable -J "$name-$1" -p low --gpu-mode="$mode" --signal=B:USR1@60 \
        --requeue --open-mode=append --gres=gpu:"$gpus" --time=10 --output="$W/$1.out" "$W/$1.sh"); }
    steps_at_least() { [ "$(grep -c '^step ' "$1")" -ge "$2" ]; }
    phase() { local now; now=$(date +%s); say "$name: $* (+$((now - tphase)) s, case at $((now - tstart)) s)"; tphase=$now; }
    # tc_wait LIMIT WHAT OUTFILE JOB CMD...: wait_until, which says how long the phase took;
    # with TC_FAILFAST=1 it gives up (sets gaveup, and every later tc_wait returns at once)
    # at the first sign of failure named above.
    tc_wait() {
        local limit=$1 what=$2 outf=$3 wjob=$4 i=0 age line; shift 4
        [ -n "$gaveup" ] && return 1
        [ "$limit" -gt "$(left)" ] && limit=$(left)
        until "$@"; do
            if [ "$failfast" = 1 ]; then
                line=$(grep -m1 -E "^gpu-mode-run: (checkpoint of job $wjob failed|cannot restore job $wjob[: ]|job $wjob run [1-9][0-9]*: .*starting the application from the beginning)" "$outf" 2>/dev/null)
                if [ -n "$line" ]; then gaveup="gpu-mode-run said: ${line#gpu-mode-run: }"; break; fi
                if finished "$wjob"; then gaveup="job $wjob ended ($(field "$wjob" JobState) $(field "$wjob" ExitCode)) before $what"; break; fi
                if state_is "$wjob" RUNNING && [ -f "$outf" ]; then
                    age=$(( $(date +%s) - $(stat -c %Y "$outf") ))
                    if [ "$age" -ge "$stall" ]; then gaveup="no output for $age s while job $wjob runs, waiting for $what"; break; fi
                fi
            fi
            sleep 0.5; i=$((i + 1))
            if [ $i -ge $((limit * 2)) ]; then
                say "$name: timed out after $limit s waiting for $what"
                [ "$failfast" = 1 ] && gaveup="timed out after $limit s waiting for $what"
                return 1
            fi
        done
        if [ -n "$gaveup" ]; then say "$name: giving up: $gaveup"; return 1; fi
        phase "$what"
        return 0
    }
    portable_env_seen() {  # FILE: every rank's `ddp:` line names each portable variable
        local f=$1 v n m
        n=$(grep -c '^ddp: rank ' "$f")
        [ "$n" -ge 1 ] || { echo "no rank's ddp line in $(basename "$f");"; return 1; }
        for v in $(portable_env); do
            m=$(grep '^ddp: rank ' "$f" | grep -cE "NCCL env:.* $v( |\$)")
            [ "$m" = "$n" ] || { echo "$v in $m of $n ranks' ddp lines of $(basename "$f");"; return 1; }
        done
    }
    job=$(submit plain); plainjob=$job
    say "$name: reference job $job (as $JOBUSER, --gpu-mode=$mode$([ $refwrap = 1 ] && echo ', under gpu-mode-run')) submitted"
    tc_wait "${TC_REF_LIMIT:-240}" "the reference run's end" "$W/plain.out" "$job" finished "$job"
    say "$name: reference job $job $(field "$job" JobState) $(field "$job" ExitCode), $(grep -c '^step ' "$W/plain.out") steps"
    [ -n "$launch" ] && grep -E '^ddp:|Error|Traceback' "$W/plain.out" | cut -c1-300
    if [ "$failfast" = 1 ] && { [ -n "$gaveup" ] || [ "$(field "$job" ExitCode)" != 0:0 ]; }; then
        finished "$job" || $S/scancel "$job"
        grep -E '^gpu-mode-run|Error|Traceback' "$W/plain.out" | tail -n 20 | cut -c1-400
        verdict "$name" 1 "the reference run failed: ${gaveup:-$(field "$job" JobState) $(field "$job" ExitCode)}"
        return
    fi
    if [ $refwrap = 1 ]; then k=$(portable_env_seen "$W/plain.out") || why="$why reference: $k"; fi
    job=$(submit job)
    say "$name: job $job (as $JOBUSER, --gpu-mode=$mode): $*"
    restored_at_least() { [ "$(grep -c 'restored (pid' "$W/job.out")" -ge "$1" ]; }
    requeued_times() { state_is "$1" PENDING && [ "$(field "$1" Restarts)" = "$2" ]; }
    if [ "$preempt" -ge 1 ]; then
        tc_wait 240 "step 5" "$W/job.out" "$job" steps_at_least "$W/job.out" 5 || why="$why never reached step 5;"
    fi
    if [ "$preempt" -ge 1 ] && [ -z "$gaveup" ]; then
        pid=$(cat "$W/ready-job" 2>/dev/null)
        for k in $(pgrep -P "${pid:-0}") ; do
            echo "worker $k ($(tr '\0' ' ' < /proc/$k/cmdline | cut -c1-80)):"
            ls -l /proc/$k/fd 2>/dev/null | grep -E 'nvidia|/dev/shm' | sed 's/^.* \([0-9]*\) -> /  fd \1 -> /'
            grep -E 'nvidia|/dev/shm' /proc/$k/maps | sed 's/^/  map /'
        done > "$W/worker-files.txt"
        say "$name: the workers' GPU and /dev/shm files:"; cat "$W/worker-files.txt"
        tree_snapshot "${pid:-0}" "$W/tree-before-preempt.txt"; cp "$W/tree-before-preempt.txt" "$OUT/$name-tree.txt"
        say "$name: the job's processes (fds, maps under /dev/, sockets, /dev/shm: $OUT/$name-tree.txt):"
        sed -n '2,/^$/p' "$W/tree-before-preempt.txt" | grep -v '^$'
        pre=$(as gmtest2 $S/sbatch --parsable -J preemptor -p high --gres=gpu:"$N" --output="$W/preemptor.out" --wrap 'sleep 5')
        phase "preemptor $pre submitted"
        tc_wait 240 "the requeue" "$W/job.out" "$job" requeued "$job" || why="$why not requeued;"
    fi
    if [ "$preempt" -ge 2 ] && [ -z "$gaveup" ]; then
        tc_wait 300 "the first restore" "$W/job.out" "$job" restored_at_least 1 || why="$why not restored once;"
        tc_wait 240 "step 15" "$W/job.out" "$job" steps_at_least "$W/job.out" 15 || why="$why never reached step 15;"
        if [ -z "$gaveup" ]; then
            pre=$(as gmtest2 $S/sbatch --parsable -J preemptor -p high --gres=gpu:"$N" --output="$W/preemptor2.out" --wrap 'sleep 5')
            phase "preemptor $pre submitted"
            tc_wait 240 "the second requeue" "$W/job.out" "$job" requeued_times "$job" 2 || why="$why not requeued twice;"
        fi
    fi
    # (TC_FAILFAST only: a job refused and started over is never restored.)
    if [ "$failfast" = 1 ] && [ "$preempt" -ge 1 ] && [ -z "$gaveup" ]; then
        tc_wait 300 "restore $preempt" "$W/job.out" "$job" restored_at_least "$preempt"
    fi
    tc_wait 400 "the job's end" "$W/job.out" "$job" finished "$job" || { why="$why did not end;"; $S/scancel "$job"; }
    if [ -n "$gaveup" ]; then
        why=" gave up: $gaveup;${why:+ then:$why}"
        # The cancel ends the job's processes (wherever they are): wait for that, bounded.
        wait_until 30 "the cancelled job's end" finished "$job"
    fi
    say "$name: job $job $(field "$job" JobState), exit code $(field "$job" ExitCode), restarts $(field "$job" Restarts); gpu-mode-run said:"
    grep -E '^gpu-mode-run|^ddp:|Error|Traceback|MISMATCH|DONE' "$W/job.out" | cut -c1-400
    agent_log "$plainjob" "$job" > "$W/agent.log"; [ -s "$W/agent.log" ] && cp "$W/agent.log" "$OUT/$name-agent.log"
    if [ -s "$W/agent.log" ]; then say "$name: the agent's lines (jobs $plainjob, $job):"; cut -c1-600 "$W/agent.log"; fi
    [ "$(field "$job" ExitCode)" = 0:0 ] || why="$why exit code $(field "$job" ExitCode);"
    failed=$(grep -m1 "^gpu-mode-run: checkpoint of job $job failed" "$W/job.out")
    if [ "${TC_STARTOVER:-0}" = 1 ] && [ -n "$failed" ] && ! restored_at_least 1; then
        # Started over: the last run's steps (after "starting the application from the
        # beginning") must be the reference's.
        local from; from=$(grep -n 'starting the application from the beginning' "$W/job.out" | tail -n 1 | cut -d: -f1)
        if [ -n "$from" ]; then tail -n +"$((from + 1))" "$W/job.out" > "$W/job-last.out"; else : > "$W/job-last.out"; why="$why no start-over line;"; fi
        python3 "$B/train_app.py" --compare "$W/job-last.out" "$W/plain.out" || why="$why the started-over run's losses differ from the reference;"
        grep -q 'DONE steps=' "$W/job-last.out" || why="$why the started-over run did not finish;"
        case $failed in
            *"could NOT be restored"*) why="$why the rollback failed (not refused before locking);" ;;
            *"GPU state was restored"*|*"; rollback: "*) why="$why locked, then rolled back (not refused before locking);" ;;
        esac
        if [ -z "$why" ]; then
            say "CASE $name: refused cleanly, started over, completed (${failed#gpu-mode-run: })"
            STARTED_OVER=$((STARTED_OVER + 1))
        else
            verdict "$name" 1 "$why checkpoint failed: ${failed#gpu-mode-run: }"
        fi
        return
    fi
    [ "$preempt" -ge 1 ] && ! restored_at_least "$preempt" && why="$why restored $(grep -c 'restored (pid' "$W/job.out") of $preempt times;"
    python3 "$B/train_app.py" --compare "$W/job.out" "$W/plain.out" || why="$why losses differ from the reference;"
    [ -n "$failed" ] && why="$why ${failed#gpu-mode-run: }"
    if [ $refwrap = 1 ]; then k=$(portable_env_seen "$W/job.out") || why="$why job: $k"; fi
    [ "$failfast" = 1 ] && ! grep -q 'DONE steps=' "$W/job.out" && why="$why no DONE line;"
    say "$name: case took $(( $(date +%s) - tstart )) s"
    [ -z "$why" ]; verdict "$name" $? "$why"
}

if [ "$PART" = all ] || [ "$PART" = e2e ]; then
    say "== e2e: the cluster"
    "$B/gpu-mode-cluster" down --name real >/dev/null 2>&1
    GPU_MODE_GPU_DEVICES=$(seq -s, -f /dev/nvidia%g 0 $((N - 1))) "$B/gpu-mode-cluster" up --name real --gpus "$N" --preempt \
        || { tail -n 30 "$D"/log/*.log; exit 1; }
    say "jobs run as $JOBUSER"
    # The test users have no home directory; torch.compile (Triton's cache
    # in ~/.triton) needs one.
    for u in gmtest1 gmtest2; do
        h=$(getent passwd "$u" | cut -d: -f6)
        [ -n "$h" ] && [ ! -d "$h" ] && mkdir -p "$h" && chown "$u:" "$h" && chmod 700 "$h"
    done
    # PREEMPT_CONFIG: lines for the cluster's [preempt] section, the config's
    # last (e.g. "ghost_limit_mib = 64"); the prolog reads it for each job.
    if [ -n "${PREEMPT_CONFIG:-}" ]; then
        printf '%s\n' "$PREEMPT_CONFIG" >> "$D/gpu-mode.toml"
        say "[preempt] gains: $(printf '%s' "$PREEMPT_CONFIG" | tr '\n' ';')"
    fi
    for c in ${E2E_CASES:-1gib 16gib 2ranks}; do
        if [ "$(left)" -lt 60 ]; then
            say "CASE $c: skipped: $(left) s left of BUDGET_S=$BUDGET_S"; SKIPPED_CASES="$SKIPPED_CASES $c"; continue
        fi
        case $c in
            1gib) preempt_case ckpt-1gib 1 1 ;;
            torch8) preempt_case ckpt-torch8 8 1 torch ;;
            torch32) preempt_case ckpt-torch32 32 1 torch ;;
            refuse130) refuse_case ckpt-refuse130 130 ;;
            torch2-fork) preempt_case ckpt-torch2-fork 2 1 torch --workers 4 --start-method fork ;;
            torch2-spawn) preempt_case ckpt-torch2-spawn 2 1 torch --workers 4 --start-method spawn ;;
            16gib) preempt_case ckpt-16gib 16 1 ;;
            2ranks) [ "$N" -ge 2 ] && preempt_case ckpt-2ranks 1 2 ;;
            train-end) train_case train-end 0 --steps 20 --interval 0.2 --workers 2 --persistent --pin-memory --nvml ;;
            train-fork) train_case train-fork 1 --steps 40 --interval 0.3 --workers 2 --persistent --pin-memory --nvml ;;
            train-spawn) train_case train-spawn 1 --steps 40 --interval 0.3 --workers 2 --persistent --start-method spawn ;;
            train-forkserver) train_case train-forkserver 1 --steps 40 --interval 0.3 --workers 2 --persistent --start-method forkserver ;;
            # Issue 24's acceptance shape: a 2-layer transformer, 4 workers, pinned memory, NVML, preempted twice.
            train-accept) train_case train-accept 2 --steps 60 --interval 0.3 --model transformer --workers 4 --persistent --pin-memory --nvml ;;
            # Issue 24 item 4: a torch.compile'd model, a CUDA-graph-captured step, CUDA events.
            train-compile) train_case train-compile 1 --steps 40 --interval 0.3 --workers 2 --persistent --pin-memory --compile --events ;;
            train-graph) train_case train-graph 1 --steps 40 --interval 0.3 --workers 2 --persistent --pin-memory --cuda-graph --events ;;
            # Issue 24 item 5: several processes of one job, torchrun's parent and 2 DDP ranks.
            # gloo: both ranks on the job's one GPU (cuda:0); gloo2: each on its own GPU; nccl:
            # each on its own GPU (NCCL refuses two ranks on one). No DataLoader workers: the
            # tree is torchrun's alone.
            torchrun-gloo|torchrun-gloo2|torchrun-nccl)
                tgpus=1 backend=gloo
                [ "$c" = torchrun-gloo ] || tgpus=2
                [ "$c" = torchrun-nccl ] && backend=nccl
                if [ "$N" -lt "$tgpus" ]; then say "CASE $c: skipped: needs $tgpus GPUs, this machine has $N"; continue; fi
                syslog_on
                TC_LAUNCH="$TORCHRUN --standalone --nproc_per_node=2" TC_GPUS=$tgpus TC_STARTOVER=1 \
                    train_case "$c" 1 --ddp "$backend" --steps 40 --interval 0.3 --workers 0 ;;
            # Issue 38 item 4: NCCL in the portable mode (2 GPUs, a rank on each), DDP or
            # FSDP (FULL_SHARD), the transformer, 2 persistent fork workers per rank and
            # NVML, preempted twice; the reference also under gpu-mode-run in the mode.
            nccl-ddp|nccl-fsdp)
                if [ "$N" -lt 2 ]; then say "CASE $c: skipped: needs 2 GPUs, this machine has $N"; continue; fi
                syslog_on
                fsdp=""; [ "$c" = nccl-fsdp ] && fsdp=--fsdp
                TC_LAUNCH="$TORCHRUN --standalone --nproc_per_node=2" TC_GPUS=2 TC_MODE=checkpoint:nccl=portable \
                    TC_FAILFAST=1 TC_REF_LIMIT=150 \
                    train_case "$c" 2 --ddp nccl $fsdp --model transformer --steps 40 --interval 0.3 --workers 2 --persistent --nvml ;;
            *) say "CASE $c: unknown (no such case)" ;;
        esac
    done
    syslog_off
    say "== prolog/epilog lines"; cat "$D/log/hooks.log"
    cp "$D/log/hooks.log" "$D/log/slurmctld.log" "$D/log/slurmd.log" "$OUT/" 2>/dev/null
    "$B/gpu-mode-cluster" down --name real
    tar -C /tmp -czf "$OUT/e2e-cases.tgz" gm-preempt-user
fi

if [ "$PART" = all ] || [ "$PART" = bench ]; then
    say "== bench ($BENCH_APP: ours vs the plain sequence), within $(left) s"
    W=/tmp/gm-preempt-bench; rm -rf "$W"; mkdir -p "$W"
    printf 'runtime_dir = "%s/run"\n[log]\nsyslog = false\nstderr = true\n[cuda_ckpt]\nlock_timeout_ms = 5000\n[preempt]\nearly_writeback = %s\nhuge_pages = %s\nhuge_pages_library = "%s"\nrestore_page_readers = %s\nagent = "%s"\n' \
        "$W" "${EARLY_WRITEBACK:-true}" "${HUGE_PAGES:-true}" "$B/libgpu_mode_hugepages.so" "${PAGE_READERS:-8}" "$B/gpu-mode-ckpt-agent" > "$W/config.toml"
    if [ "${WARM_GIB:-0}" -gt 0 ]; then
        say "touching $WARM_GIB GiB of host memory once (WARM_GIB)"
        python3 -c "import torch, sys; torch.empty(int(sys.argv[1]) << 30, dtype=torch.uint8).fill_(1)" "$WARM_GIB" || say "warm-up failed"
        say "warm-up done"; free -g | head -2
    fi
    # The programs run as gmtest1, as a job's: the e2e part's cluster makes
    # that user; a bench alone on a fresh machine makes it here (it used to
    # fall back to root, and its figures were root's).
    if [ "$JOBUSER" = gmtest1 ] && ! id -u gmtest1 >/dev/null 2>&1; then
        useradd --no-create-home --shell /usr/sbin/nologin gmtest1 && say "made the user gmtest1 for the bench's programs"
    fi
    BUID=0; [ "$JOBUSER" = gmtest1 ] && BUID=$(id -u gmtest1)
    # BOUNDS=1: the copy engines' rates into populated host memory, measured
    # now (ckpt_diag.py --bounds-only), for the bench's GPU-free and restore bounds.
    if [ "${BOUNDS:-0}" = 1 ]; then
        python3 "$REPO/tools/ckpt-bench/apps/ckpt_diag.py" --bounds-only --bounds-gib 4 --touch-gib 1 --json "$OUT/copy-bounds.json" 2>&1 | tail -n 1
        D2H_GIBS=$(python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["copy_bounds"]["d2h_pageable_populated"], 2))' "$OUT/copy-bounds.json")
        H2D_GIBS=$(python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["copy_bounds"]["h2d_pageable_populated"], 2))' "$OUT/copy-bounds.json")
        say "copy bounds: D2H $D2H_GIBS GiB/s, H2D $H2D_GIBS GiB/s (into/from populated pageable memory)"
    fi
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
            args="$REPO/tools/ckpt-bench/apps/framework_app.py --framework $BENCH_APP --gib {gib} --device {device} --seed {i} --ready {ready} --go {go} ${BENCH_APP_ARGS:-}"
        fi
        timeout "$(left)" "$B/gpu-mode-preempt-bench" --config "$W/config.toml" --app "$app" --app-args "$args" \
            --cases "$c" --repeat "$R" --plain-driver "${PLAIN_DRIVER:-raw}" --gpus "${BENCH_GPUS:-$N}" --uid "$BUID" --workdir "$W" \
            ${PLAIN_HUGE_PAGES:+--plain-huge-pages} ${COLD:+--cold} ${POOL:+--pool} ${NO_PLAIN:+--no-plain} ${D2H_GIBS:+--d2h-gibs $D2H_GIBS} ${H2D_GIBS:+--h2d-gibs $H2D_GIBS} \
            2>&1 | tee -a "$OUT/bench.txt"
        rm -rf "$W/images" "$W/plain-images"
    done
    [ -n "$SKIPPED" ] && say "not run (time bound): bash scripts/gpu/preempt-real.sh $CARRY bench ${SKIPPED#,}"
fi

if [ "$PART" = nccl-bench ]; then
    say "== nccl-bench: NCCL's default transports vs the portable mode's variables, 2 ranks on 2 GPUs"
    if [ "$N" -lt 2 ]; then
        say "nccl-bench: skipped: needs 2 GPUs, this machine has $N"
    else
        mapfile -t PENV < <(portable_env)
        [ "${#PENV[@]}" -gt 0 ] || { say "nccl-bench: no portable variable read from $REPO/preempt/src/nccl.rs"; exit 1; }
        say "portable variables (preempt/src/nccl.rs): ${PENV[*]}"
        unset_env=(); for v in "${PENV[@]}"; do unset_env+=(-u "${v%%=*}"); done
        NB=/tmp/gm-nccl-bench; rm -rf "$NB"; mkdir -p "$NB"
        for mode in default portable; do
            if [ "$mode" = default ]; then menv=("${unset_env[@]}"); else menv=("${unset_env[@]}" "${PENV[@]}"); fi
            rm -f "$NB"/debug.*
            tb=$(date +%s) lim=${NCCLBENCH_LIMIT_S:-75}
            [ "$lim" -gt "$(left)" ] && lim=$(left)
            [ "$lim" -ge 10 ] || { say "nccl-bench $mode: skipped: $(left) s left of BUDGET_S=$BUDGET_S"; FAILS=$((FAILS + 1)); continue; }
            # NCCL_DEBUG=INFO into files: which transport each channel took ("via ...").
            # shellcheck disable=SC2086
            timeout -k 5 "$lim" env "${menv[@]}" NCCL_DEBUG=INFO NCCL_DEBUG_FILE="$NB/debug.%h.%p" \
                $TORCHRUN --standalone --nproc_per_node=2 "$REPO/tools/ckpt-bench/apps/nccl_bench.py" \
                --mode "$mode" --out "$OUT/nccl-bench-$mode.jsonl" ${NCCLBENCH_ARGS:-} > "$OUT/nccl-bench-$mode.log" 2>&1
            rc=$?
            say "nccl-bench $mode: rc $rc in $(( $(date +%s) - tb )) s ($OUT/nccl-bench-$mode.log)"
            [ "$rc" = 0 ] || { tail -n 20 "$OUT/nccl-bench-$mode.log"; FAILS=$((FAILS + 1)); }
            grep -hE 'NCCL version|Using network|via ' "$NB"/debug.* 2>/dev/null | sed -e 's/^.*NCCL INFO //' -e 's|^Channel [0-9]*/[0-9]* : |Channel N : |' | sort | uniq -c \
                > "$OUT/nccl-bench-$mode-transports.txt"
            say "nccl-bench $mode: NCCL's transports (count, line):"; head -n 12 "$OUT/nccl-bench-$mode-transports.txt"
        done
        say "nccl-bench: the table ($OUT/nccl-bench.txt)"
        python3 "$REPO/tools/ckpt-bench/apps/nccl_bench.py" --table "$OUT/nccl-bench-default.jsonl" "$OUT/nccl-bench-portable.jsonl" \
            | tee "$OUT/nccl-bench.txt"
        [ "${PIPESTATUS[0]}" = 0 ] || { say "nccl-bench: the table is incomplete"; FAILS=$((FAILS + 1)); }
    fi
fi

say "== GPUs after"
nvidia-smi --query-gpu=index,compute_mode,persistence_mode,mig.mode.current --format=csv,noheader > "$OUT/gpu-settings-after.txt"
cmp -s "$OUT/gpu-settings-before.txt" "$OUT/gpu-settings-after.txt" && say "GPU settings unchanged" || say "GPU SETTINGS CHANGED"
apps || true
say "done: $FAILS failed case(s)$([ "$STARTED_OVER" -gt 0 ] && echo ", $STARTED_OVER refused cleanly and started over")$([ -n "$SKIPPED_CASES" ] && echo "; not run (time bound):$SKIPPED_CASES")"
