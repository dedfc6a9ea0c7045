#!/bin/sh
# The plugin against Slurm 24.11: builds it from the same sources against
# Debian trixie's Slurm 24.11 headers, and runs the end-to-end tests
# submit_validation and mode_reaches_node on a 24.11 cluster. Trixie's Slurm
# needs trixie's glibc, so it lives in a debootstrap'd trixie root
# (GPU_MODE_TRIXIE_ROOT, made fresh unless it already holds Slurm). The
# plugin and the test binaries are built on this machine (bookworm's glibc
# is older than trixie's, so they run there); bindgen reads the root's
# <slurm/spank.h> and plugin_version comes from its slurm_version.h.
# Usage (root): scripts/test-slurm-2411.sh [--root]
set -eu
cd "$(dirname "$0")/.."
. scripts/common.sh
prepare debootstrap

root=${GPU_MODE_TRIXIE_ROOT:-/var/tmp/slurm-gpu-mode-trixie}

if [ ! -x "$root/usr/sbin/slurmd-wlm" ] || [ ! -f "$root/usr/include/slurm/spank.h" ]; then
    step "debootstrap trixie with Slurm 24.11 into $root"
    rm -rf "$root"
    debootstrap --variant=minbase --include=slurmctld,slurmd,slurm-client,munge,libslurm-dev,passwd \
        trixie "$root" http://deb.debian.org/debian > "$root.debootstrap.log" 2>&1 ||
        { tail -n 30 "$root.debootstrap.log"; die "debootstrap of trixie failed (log: $root.debootstrap.log)"; }
fi
num=$(sed -n 's/^#define SLURM_VERSION_NUMBER 0x\([0-9a-fA-F]*\).*/\1/p' "$root/usr/include/slurm/slurm_version.h")
version=$(printf '%d.%02d.%d' "0x$(echo "$num" | cut -c1-2)" "0x$(echo "$num" | cut -c3-4)" "0x$(echo "$num" | cut -c5-6)")
case "$version" in 24.11.*) ;; *) die "the trixie root has Slurm $version, not 24.11" ;; esac
step "Slurm $version in $root"
# --root: only the trixie root (test.sh makes it while other tests run).
[ "${1:-}" = --root ] && exit 0
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
    nvidia-cuda-mps-control nvidia-cuda-mps-server; do
    cp "target/debug/$f" "$art/"
done
cp -r sim/nvml/fixtures "$art/fixtures"
tests=""
for t in submit_validation mode_reaches_node; do
    exe=$(cargo test --workspace --test "$t" --no-run 2>&1 | sed -n "s|.*(\(target/debug/deps/$t-[0-9a-f]*\)).*|\1|p" | tail -n1)
    [ -x "$exe" ] || die "no test binary for $t"
    cp "$exe" "$root/opt/gpu-mode/tests/$t"
    tests="$tests $t"
done

step "run$tests in the trixie root"
# /proc, /sys and /dev of this machine; everything else is trixie's.
mounted=""
cleanup() {
    for m in $mounted; do umount -l "$m" 2>/dev/null || true; done
}
trap cleanup EXIT
for m in proc sys dev; do
    if ! mountpoint -q "$root/$m"; then
        case $m in
            proc) mount -t proc proc "$root/proc" ;;
            *) mount --rbind "/$m" "$root/$m"; mount --make-rslave "$root/$m" ;;
        esac
        mounted="$root/$m $mounted"
    fi
done
failed=0
for t in $tests; do
    echo "-- $t (Slurm $version)"
    chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
        GPU_MODE_ARTIFACTS=/opt/gpu-mode/artifacts GPU_MODE_CLUSTER_BASE=/tmp/gpu-mode-cluster-2411 \
        "/opt/gpu-mode/tests/$t" || failed=1
done
[ "$failed" = 0 ] || die "end-to-end tests failed on Slurm $version (cluster logs: $root/tmp/gpu-mode-cluster-2411/)"
step "done"
