#!/bin/bash
# Read-only checks of the node MIG baseline on a real GPU machine
# (docs/mig.md, "On real GPUs"). The GPU machines forbid MIG mode changes,
# instance creation and GPU resets, so this runs ONLY
# read-only verbs:
#   1. `gpu-mode-mig plan --all` for every config of the test fixtures
#      (modes/tests/fixtures/mig-parted/*.yaml) against the real profile table,
#      and the same against the simulated table of the same model; the two
#      must place or refuse every layout alike (diffed);
#   2. `gpu-mode-mig export`, and `assert` against the export, against
#      all-disabled (both exit 0 on MIG-disabled GPUs) and against a MIG-on
#      config (exit 1, saying how the GPUs differ);
#   3. the node checker's mig check with a baseline configured;
#   4. nvidia-smi's MIG mode before and after, which must be identical.
# Never apply. The config below also sets every [gpu] setter to "leave" and
# points systemctl and nvidia-smi at /bin/false, so even a mistaken `apply`
# would refuse before touching anything.
#
# Usage (device machine, repo root, with the build carried):
#   OUT=/tmp/out bash scripts/gpu/mig-readonly.sh [BIN_DIR]   (default target/debug)
# BIN_DIR holds gpu-mode-mig, gpu-mode-node-checker and libnvml_sim.so.
set -u
B=$(cd "${1:-target/debug}" && pwd)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/mig-readonly}
mkdir -p "$OUT"
W=$(mktemp -d)
exec > >(tee "$OUT/mig-readonly.log") 2>&1
FIX=$ROOT/modes/tests/fixtures/mig-parted
MIG=$B/gpu-mode-mig
for f in "$MIG" "$B/gpu-mode-node-checker" "$B/libnvml_sim.so"; do
    [ -e "$f" ] || { echo "missing $f: build the workspace (cargo build --workspace) and carry $B"; exit 2; }
done

say() { echo "== $*"; }
modes() { nvidia-smi --query-gpu=index,name,uuid,mig.mode.current,mig.mode.pending --format=csv,noheader; }

say "machine"
modes | tee "$W/modes-before.txt"
N=$(nvidia-smi -L | grep -c '^GPU ')
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1)
case "$NAME" in
    *H200*) MODEL=h200-141gb ;;
    *H100*) MODEL=h100-80gb ;;
    *) MODEL=""; echo "no simulated model for $NAME: plans are not compared" ;;
esac

# A site config that can change nothing: every setter left, no services,
# programs that always fail; the layouts the end-to-end tests use.
config() { # $1 file, $2 NVML library line
    cat > "$1" <<EOF
runtime_dir = "$W/run"
[log]
syslog = false
stderr = true
[nvml]
$2
[gpu]
mps_compute_mode = "leave"
mig_mode = "leave"
mig_instances = "leave"
[mig]
services = []
layout_services = []
systemctl = "/bin/false"
nvidia_smi = "/bin/false"
[mig.layouts]
half = "3g.40gbx2"
h200-half = "3g.71gbx2"
sevenths = "1g.18gbx7"
EOF
}
config "$W/real.toml" ""
config "$W/sim.toml" "library = \"$B/libnvml_sim.so\""
chmod 0644 "$W"/*.toml

say "1. plan every fixture config: real profile table vs simulated $MODEL"
if [ -n "$MODEL" ]; then
    printf 'driver_version = "sim"\nnvml_version = "sim"\ncuda_driver_version = 13000\n[[gpus]]\nmodel = "%s"\ncount = %s\n' \
        "$ROOT/sim/nvml/fixtures/$MODEL.toml" "$N" > "$W/node.toml"
fi
# UUIDs differ between the two; everything else must not.
norm() { sed -E 's/GPU-[0-9a-fA-F-]+/GPU-x/g'; }
for f in "$FIX"/examples.yaml "$FIX"/h200.yaml; do
    b=$(basename "$f" .yaml)
    t0=$(date +%s%N)
    "$MIG" --config "$W/real.toml" plan --all -c "$f" > "$OUT/plan-real-$b.txt" 2> "$OUT/plan-real-$b.err"
    rc=$?
    echo "plan --all -c $b.yaml (real): rc=$rc in $(( ($(date +%s%N) - t0) / 1000000 )) ms; $(tail -n1 "$OUT/plan-real-$b.txt")"
    [ -n "$MODEL" ] || continue
    GPU_MODE_SIM_STATE=$W/sim-$b.json GPU_MODE_SIM_FIXTURE=$W/node.toml \
        "$MIG" --config "$W/sim.toml" plan --all -c "$f" > "$OUT/plan-sim-$b.txt" 2> "$OUT/plan-sim-$b.err"
    if diff -u <(norm < "$OUT/plan-sim-$b.txt") <(norm < "$OUT/plan-real-$b.txt") > "$OUT/plan-$b.diff"; then
        echo "  real and simulated plans are identical"
    else
        echo "  real and simulated plans DIFFER:"; head -n 40 "$OUT/plan-$b.diff"
    fi
done

say "2. export and assert"
"$MIG" --config "$W/real.toml" export > "$OUT/export.yaml"; echo "export rc=$?"; cat "$OUT/export.yaml"
"$MIG" --config "$W/real.toml" assert -c "$OUT/export.yaml" -l current; echo "assert (against the export) rc=$? (want 0)"
"$MIG" --config "$W/real.toml" assert -c "$FIX/examples.yaml" -l all-disabled; echo "assert all-disabled rc=$? (want 0 where MIG is disabled)"
"$MIG" --config "$W/real.toml" assert -l @h200-half; echo "assert @h200-half rc=$? (want 1 where MIG is disabled)"
"$MIG" --config "$W/real.toml" plan -l @h200-half; echo "plan @h200-half rc=$? (1: [gpu] mig_mode = leave refuses the switch)"

say "3. node checker, mig check, baseline @h200-half"
cp "$W/real.toml" "$W/checker.toml"
sed -i 's/^\[mig\]$/[mig]\nbaseline = "@h200-half"/' "$W/checker.toml"
"$B/gpu-mode-node-checker" check --only mig --no-drain --config "$W/checker.toml"; echo "node checker rc=$?"

say "4. nothing changed"
modes > "$W/modes-after.txt"
if diff "$W/modes-before.txt" "$W/modes-after.txt"; then echo "MIG modes unchanged"; else echo "MIG MODES CHANGED"; exit 1; fi
rm -rf "$W"
