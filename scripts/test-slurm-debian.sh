#!/bin/sh
# The plugin against a newer Slurm from Debian: builds it from the same
# sources against the Slurm headers of a Debian suite (trixie: 24.11, forky:
# 26.05), and runs the end-to-end tests submit_validation and
# mode_reaches_node on a cluster of that Slurm. A newer suite's Slurm needs
# its glibc, so it lives in a debootstrap'd root of the suite
# (GPU_MODE_<SUITE>_ROOT such as GPU_MODE_TRIXIE_ROOT, default
# /var/tmp/slurm-gpu-mode-<suite>; made fresh
# unless it already holds Slurm). The plugin and the test binaries are built
# on this machine (bookworm's glibc is older than the suite's, so they run
# there); bindgen reads the root's <slurm/spank.h> and plugin_version comes
# from its slurm_version.h.
# Usage (as root): scripts/test-slurm-debian.sh SUITE MAJOR.MINOR [--root]
#   SUITE MAJOR.MINOR: e.g. trixie 24.11, forky 26.05 (the root must hold
#   that Slurm: a suite that moved on is named, not silently tested).
#   --root: only make the root (test.sh does it while other tests run).
set -eu
cd "$(dirname "$0")/.."
. scripts/common.sh
[ $# -ge 2 ] || die "usage: $0 SUITE MAJOR.MINOR [--root]"
suite=$1 want=$2 only_root=${3:-}
case "$suite" in *[!a-z]*|"") die "suite \"$suite\": a Debian codename such as trixie or forky" ;; esac
case "$want" in [0-9][0-9].[0-9][0-9]) ;; *) die "version \"$want\": MAJOR.MINOR such as 24.11" ;; esac
prepare debootstrap

# $suite is letters only (checked above): safe to name a variable with.
eval "root=\${GPU_MODE_$(echo "$suite" | tr a-z A-Z)_ROOT:-/var/tmp/slurm-gpu-mode-$suite}"
tag=$(echo "$want" | tr -d .)

if [ ! -x "$root/usr/sbin/slurmd-wlm" ] || [ ! -f "$root/usr/include/slurm/spank.h" ] || [ ! -x "$root/usr/sbin/criu" ]; then
    step "debootstrap $suite with Slurm $want into $root"
    rm -rf "$root"
    # Suites newer than this debootstrap knows (forky on bookworm's) use
    # the script of sid, which every newer suite follows.
    script=/usr/share/debootstrap/scripts/$suite
    [ -e "$script" ] || script=/usr/share/debootstrap/scripts/sid
    debootstrap --variant=minbase --include=slurmctld,slurmd,slurm-client,munge,libslurm-dev,passwd,criu \
        "$suite" "$root" http://deb.debian.org/debian "$script" > "$root.debootstrap.log" 2>&1 ||
        { tail -n 30 "$root.debootstrap.log"; die "debootstrap of $suite failed (log: $root.debootstrap.log)"; }
fi
num=$(sed -n 's/^#define SLURM_VERSION_NUMBER 0x\([0-9a-fA-F]*\).*/\1/p' "$root/usr/include/slurm/slurm_version.h")
version=$(printf '%d.%02d.%d' "0x$(echo "$num" | cut -c1-2)" "0x$(echo "$num" | cut -c3-4)" "0x$(echo "$num" | cut -c5-6)")
case "$version" in "$want".*) ;; *) die "the $suite root $root has Slurm $version, not $want" ;; esac
step "Slurm $version in $root"
[ "$only_root" = --root ] && exit 0
# debootstrap writes no /etc/hosts: the cluster's node and controller are
# "localhost", and srun/salloc give slurmctld this machine's hostname to
# answer to (unresolvable, each waits ~10 s of retries).
printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\tlocalhost ip6-localhost ip6-loopback\n' "$(hostname)" > "$root/etc/hosts"

step "build the plugin against $root/usr/include (and the test binaries)"
# Same target dir and the whole workspace (a -p subset would build
# gpu-mode-core with other features, so anew): only the plugin is rebuilt
# (build.rs reruns when SLURM_INCLUDE_DIR changes), and again for 22.05 by
# the next plain build.
SLURM_INCLUDE_DIR=$root/usr/include cargo build -q --workspace
art=$root/opt/gpu-mode/artifacts
rm -rf "$root/opt/gpu-mode"
mkdir -p "$art" "$root/opt/gpu-mode/tests"
cp target/debug/libgpu_mode_spank.so "$art/"
# plugin_version is the root's SLURM_VERSION_NUMBER; the exports are Slurm's.
out=$(SLURM_INCLUDE_DIR=$root/usr/include cargo test -q --workspace --lib --test exports -- version exports 2>&1) ||
    { echo "$out"; die "the plugin's version or export tests failed against Slurm $version's headers"; }
echo "$out" | grep '^test result' | sed 's/^/   /'
for f in gpu-mode-prolog gpu-mode-epilog gpu-mode-node-checker libnvml_sim.so nvml-sim-ctl \
    nvidia-cuda-mps-control nvidia-cuda-mps-server gpu-mode-ckpt-agent gpu-mode-run libcuda_sim.so \
    cuda-sim-counter cuda-sim-ctl libgpu_mode_hugepages.so; do
    cp "target/debug/$f" "$art/"
done
# Checkpoint jobs use the suite's own CRIU (trixie 4.1.1, forky 4.2.1) at the
# path the config names by default. Not this machine's 4.1.1 build: with
# forky's glibc 2.43 it cannot dump any threaded process on this kernel
# (6.18): "Can't splice all pages to pipe" in the parasite, seen with a
# two-thread C program, while forky's 4.2.1 dumps it.
mkdir -p "$root/opt/slurm-gpu-mode/criu/bin"
ln -sfn /usr/sbin/criu "$root/opt/slurm-gpu-mode/criu/bin/criu"
cp -r sim/nvml/fixtures "$art/fixtures"
# Two test files and one preemption scenario (Slurm's preemption, requeue
# and job record, real CRIU, the accounting record): what changes between
# releases. GPU_MODE_SUITE_TESTS: others, FILE or FILE:TEST (one test of the
# file by its exact name).
preemption=preempt_checkpoint:a_preempted_job_is_checkpointed_requeued_and_restored_with_its_count_and_exit_code
tests=${GPU_MODE_SUITE_TESTS:-"submit_validation mode_reaches_node $preemption"}
for t in $tests; do
    file=${t%%:*}
    [ -x "$root/opt/gpu-mode/tests/$file" ] && continue
    exe=$(cargo test --workspace --test "$file" --no-run 2>&1 | sed -n "s|.*(\(target/debug/deps/$file-[0-9a-f]*\)).*|\1|p" | tail -n1)
    [ -x "$exe" ] || die "no test binary for $file"
    cp "$exe" "$root/opt/gpu-mode/tests/$file"
done

step "run $tests in the $suite root"
# In a mount namespace of its own (gone with the last process in it, so
# nothing is left mounted): the root bind-mounted onto itself (CRIU reads
# mountinfo and refuses a root that is not a mount point: "No parent found
# for mountpoint"), with this machine's /proc, /sys and /dev; everything else
# is the suite's.
in_root() { # COMMAND...
    unshare -m --propagation private sh -c 'root=$1; shift
        mount --bind "$root" "$root" && mount -t proc proc "$root/proc" &&
        mount --rbind /sys "$root/sys" && mount --rbind /dev "$root/dev" && exec chroot "$root" "$@"' sh "$root" "$@"
}
# CRIU runs as the job's user. The suite's own CRIU lacks this project's
# restorer patch (packaging/criu/), so where this machine's tasks miss a
# capability in their bounding set (containers without CAP_SYS_RESOURCE)
# its restore as a user fails ("Unable to drop capability 24"): there the
# jobs run as root without capabilities, and each test says SUBSTITUTED.
as_root=""
bnd=$(sed -n 's/^CapBnd:[[:space:]]*//p' /proc/self/status)
full=$(( (1 << ($(cat /proc/sys/kernel/cap_last_cap) + 1)) - 1 ))
[ $(( 0x$bnd )) = "$full" ] || as_root=GPU_MODE_TEST_JOBS_AS_ROOT=1
failed=0
for t in $tests; do
    file=${t%%:*}
    filter=""
    [ "$file" = "$t" ] || filter="--exact ${t#*:}"
    echo "-- $t (Slurm $version)"
    # shellcheck disable=SC2086 # $filter: none, or two words
    in_root /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
        GPU_MODE_ARTIFACTS=/opt/gpu-mode/artifacts GPU_MODE_CLUSTER_BASE=/tmp/gpu-mode-cluster-$tag \
        ${GPU_MODE_REQUIRE_CRIU:+GPU_MODE_REQUIRE_CRIU=1} $as_root GPU_MODE_TEST_NOTES=/opt/gpu-mode/test-notes.log \
        "/opt/gpu-mode/tests/$file" $filter || failed=1
done
# The tests' skipped and substituted notes (tools/testkit), into this
# machine's notes file that test.sh counts.
if [ -n "${GPU_MODE_TEST_NOTES:-}" ] && [ -f "$root/opt/gpu-mode/test-notes.log" ]; then
    cat "$root/opt/gpu-mode/test-notes.log" >> "$GPU_MODE_TEST_NOTES"
fi
[ "$failed" = 0 ] || die "end-to-end tests failed on Slurm $version (cluster logs: $root/tmp/gpu-mode-cluster-$tag/)"
step "done"
