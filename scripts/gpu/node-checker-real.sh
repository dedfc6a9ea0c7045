#!/bin/bash
# The node checker on a GPU machine, read-only (docs/validation.md, issue 28
# item 5: the raw output behind the node-checker figures). Runs the quick
# check (table and --json), the deep check (--json), and times 10 quick
# checks, 3 deep checks and 10 `nvidia-smi -q` (the baseline) with the
# same clock. Never drains (--no-drain) and changes no GPU setting.
# Usage (device machine, repo root): bash scripts/gpu/node-checker-real.sh CHECKER
set -u
C=${1:?usage: node-checker-real.sh PATH-TO-gpu-mode-node-checker}
OUT=${OUT:-/tmp/node-checker-out}
mkdir -p "$OUT"
CFG=$OUT/config.toml
printf 'runtime_dir = "/tmp/gm-node-checker"\n[log]\nsyslog = false\nstderr = true\n' > "$CFG"
run() { "$C" --config "$CFG" --no-drain --node "$(hostname -s)" "$@"; }
{
    echo "== $(date -u +%FT%TZ) $(hostname -s)"
    nvidia-smi --query-gpu=index,name,driver_version,compute_mode,persistence_mode,mig.mode.current --format=csv
    echo "== quick check (table)"; run; echo "exit $?"
    echo "== quick check (--json)"; run --json; echo "exit $?"
    echo "== deep check (--json)"; run --deep --json; echo "exit $?"
} > "$OUT/node-checker.txt" 2>&1
python3 - "$C" "$CFG" > "$OUT/node-checker-timing.txt" 2>&1 <<'PY'
import statistics, subprocess, sys, time
checker, cfg = sys.argv[1], sys.argv[2]
def times(cmd, n):
    out = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        out.append((time.perf_counter() - t) * 1e3)
    return out
base = [checker, "--config", cfg, "--no-drain", "--node", "timing"]
for name, cmd, n in (("quick check", base, 10), ("deep check", base + ["--deep"], 3), ("nvidia-smi -q", ["nvidia-smi", "-q"], 10)):
    t = times(cmd, n)
    print(f"{name}: median {statistics.median(t):.1f} ms, min {min(t):.1f}, max {max(t):.1f}, runs {' '.join(f'{x:.1f}' for x in t)}")
PY
cat "$OUT/node-checker-timing.txt"
