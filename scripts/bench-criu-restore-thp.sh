#!/bin/bash
# CRIU's restore of memory a process advised MADV_HUGEPAGE, with and without
# packaging/criu/0003 (issue 25 item 1), side by side on one image:
#   bash scripts/bench-bench-criu-restore-thp.sh CRIU_WITHOUT CRIU_WITH [GIB] [ROUNDS]
# CRIU_* are criu binaries (e.g. a tree of install-criu.sh --bundle built
# before 0003, and /opt/slurm-gpu-mode/criu/bin/criu). A C program (built
# here with cc) maps GIB GiB (default 8) of private anonymous memory, advises
# it MADV_HUGEPAGE as the huge-page shim does for the CUDA driver's buffer,
# and writes every page; it is dumped once (as root), then restored ROUNDS
# times (default 2) by each CRIU, alternating which goes first, and killed
# after each restore. Prints each restore's wall time and the restored
# process's AnonHugePages (what the patch changes), then the medians.
# Root; needs about 2 x GIB GiB of free memory and GIB GiB of disk in $TMPDIR.
set -eu
WITHOUT=${1:?usage: bench-criu-restore-thp.sh CRIU_WITHOUT CRIU_WITH [GIB] [ROUNDS]}
WITH=${2:?usage: bench-criu-restore-thp.sh CRIU_WITHOUT CRIU_WITH [GIB] [ROUNDS]}
GIB=${3:-8}
ROUNDS=${4:-2}
W=$(mktemp -d "${TMPDIR:-/tmp}/criu-thp.XXXXXX")
trap 'pkill -9 -f "$W/hold" 2>/dev/null; rm -rf "$W"' EXIT
cat > "$W/hold.c" <<'C'
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
int main(int argc, char **argv) {
    size_t len = (size_t)atoi(argv[1]) << 30;
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED || madvise(p, len, MADV_HUGEPAGE)) { perror("mmap/madvise"); return 1; }
    for (size_t i = 0; i < len; i += 4096) p[i] = (char)(i >> 12) | 1;
    printf("ready\n");
    fflush(stdout);
    for (;;) pause();
}
C
cc -O2 -o "$W/hold" "$W/hold.c"
mkdir "$W/img"
setsid "$W/hold" "$GIB" </dev/null >"$W/hold.out" 2>&1 &
for _ in $(seq 600); do grep -q ready "$W/hold.out" && break; sleep 0.1; done
grep -q ready "$W/hold.out" || { echo "the program never filled its memory: $(cat "$W/hold.out")"; exit 1; }
PID=$(pgrep -f "$W/hold")
echo "criu-restore-thp: $GIB GiB advised MADV_HUGEPAGE, pid $PID, $(grep AnonHugePages /proc/$PID/smaps_rollup | tr -s ' ')"
echo "criu-restore-thp: THP enabled=$(cat /sys/kernel/mm/transparent_hugepage/enabled) defrag=$(cat /sys/kernel/mm/transparent_hugepage/defrag)"
"$WITHOUT" dump -t "$PID" -D "$W/img" -o dump.log
echo "criu-restore-thp: image $(du -sh "$W/img" | cut -f1)"
restore() { # $1 label, $2 criu
    local s e
    s=$(date +%s%N)
    "$2" restore -d -D "$W/img" -o "restore-$1.log" || { tail -5 "$W/img/restore-$1.log"; exit 1; }
    e=$(date +%s%N)
    echo "$1 $(( (e - s) / 1000000 )) $(awk '/AnonHugePages/ {print $2}' /proc/$PID/smaps_rollup)" >> "$W/times"
    echo "criu-restore-thp: $1 restore $(( (e - s) / 1000000 )) ms, AnonHugePages $(awk '/AnonHugePages/ {print $2}' /proc/$PID/smaps_rollup) kB"
    kill -9 "$PID"
    while kill -0 "$PID" 2>/dev/null; do sleep 0.02; done
}
for r in $(seq "$ROUNDS"); do
    if [ $((r % 2)) = 1 ]; then restore without "$WITHOUT"; restore with "$WITH"; else restore with "$WITH"; restore without "$WITHOUT"; fi
done
for side in without with; do
    awk -v s=$side '$1 == s {print $2}' "$W/times" | sort -n | awk -v s=$side -v g="$GIB" \
        '{a[NR]=$1} END {m = (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2; printf "criu-restore-thp: median %s %.0f ms (%.2f GiB/s)\n", s, m, g * 1000 / m}'
done
