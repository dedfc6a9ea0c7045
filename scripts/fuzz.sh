#!/bin/sh
# Runs every cargo-fuzz target of fuzz/ for a fixed time and prints, per
# target, the executions, the corpus and whether it found anything.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]      (default 60 s, every target)
#   scripts/fuzz.sh --build-only               (the toolchain, cargo-fuzz and
#                                               the targets, nothing run: .ci/run
#                                               builds them in the background)
#
# Needs the nightly toolchain and cargo-fuzz (installed when missing). The
# seeds in fuzz/corpus/<target> are read, never written: what a run adds goes
# to a scratch corpus under fuzz/target/work/. A finding is left in
# fuzz/artifacts/<target>/ (reproduce: cargo +nightly fuzz run <target> <file>)
# and makes the script exit 1. Builds with overflow checks (-a) and without a
# sanitizer: the targets are safe Rust, where ASAN finds nothing and costs
# executions; libFuzzer still catches panics, stack overflows, leaks of time
# (-timeout) and memory (-rss_limit_mb).
set -eu
cd "$(dirname "$0")/.."

build_only=false
if [ "${1:-}" = --build-only ]; then build_only=true; shift; fi
seconds=${1:-${GPU_MODE_FUZZ_SECONDS:-60}}
[ $# -gt 0 ] && shift
targets=${*:-mode config state manifest mig_parted}

if ! rustup toolchain list | grep -q '^nightly'; then
    rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

dict_of() {
    case $1 in
        mode) echo fuzz/dict/mode.dict ;;
        config) echo fuzz/dict/config.dict ;;
        state | manifest) echo fuzz/dict/json.dict ;;
        mig_parted) echo fuzz/dict/mig_parted.dict ;;
    esac
}

build_start=$(date +%s)
# Every target at once (cargo fuzz build takes one target or all).
(cd fuzz && cargo +nightly fuzz build -a -s none)
echo "fuzz: build took $(($(date +%s) - build_start)) s"
$build_only && exit 0

found=0
report=""
for t in $targets; do
    work=fuzz/target/work/$t
    mkdir -p "$work" "fuzz/artifacts/$t"
    log=fuzz/target/work/$t.log
    start=$(date +%s)
    status=ok
    # -rss_limit_mb and -timeout: a parser that balloons or hangs on one
    # input is a finding, not a slow run.
    if ! (cd fuzz && cargo +nightly fuzz run -a -s none "$t" "target/work/$t" "corpus/$t" -- \
        -max_total_time="$seconds" -dict="../$(dict_of "$t")" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1) >"$log" 2>&1; then
        status=FOUND
        found=1
    fi
    took=$(($(date +%s) - start))
    # libFuzzer's own figures (-print_final_stats): the wall time above also
    # holds cargo's check that the build is current.
    runs=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\)/\1/p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *\([0-9]*\)/\1/p' "$log" | tail -1)
    corpus=$(find "$work" -type f | wc -l)
    seeds=$(find "fuzz/corpus/$t" -type f | wc -l)
    line=$(printf '%-11s %4ss %12s execs %8s/s  corpus %5s (+%s seeds)  %s' "$t" "$took" "${runs:-?}" \
        "${rate:-?}" "$corpus" "$seeds" "$status")
    echo "fuzz: $line"
    report="$report$line
"
    if [ "$status" = FOUND ]; then
        echo "fuzz: $t found something; its output ends:" >&2
        tail -n 40 "$log" >&2
        ls -l "fuzz/artifacts/$t" >&2
    fi
done

echo
echo "fuzz summary (${seconds} s per target):"
printf '%s' "$report"
exit $found
