#!/bin/sh
# Builds what scripts/gpu/preempt-real.sh needs on a GPU machine into one
# git-ignored folder (default .dev-carry/preempt, ~40 MB): x86-64 release
# builds from this machine (the GPU machines have no Rust and a newer glibc,
# and no network), Slurm 22.05's .debs (fetched here: they cannot), and the CRIU 4.1.1
# tree (scripts/install-criu.sh --bundle). Run as root on the development
# machine, from anywhere:   sh scripts/gpu/preempt-carry.sh [DIR]
set -eu
cd "$(dirname "$0")/../.."
D=${1:-.dev-carry/preempt}
BINS="libgpu_mode_spank.so libgpu_mode_hugepages.so gpu-mode-prolog gpu-mode-epilog gpu-mode-node-checker gpu-mode-cluster gpu-mode-run
 gpu-mode-ckpt-agent gpu-mode-ckpt-testprog gpu-mode-preempt-bench"
DEBS="slurmd slurmctld slurm-client slurm-wlm-basic-plugins munge libmunge2 libhwloc15 libjson-c5 liblua5.1-0
 libyaml-0-2 libnuma1 libreadline8 readline-common libdbus-1-3"

cargo build --workspace --release
rm -rf "$D"
mkdir -p "$D/debs"
for b in $BINS; do
    cp "target/release/$b" "$D/"
    # Debug symbols are most of their size; the carry is limited.
    strip --strip-debug "$D/$b"
done
(cd "$D/debs" && apt-get download $DEBS >/dev/null)
sh scripts/install-criu.sh --bundle "$D/criu"
du -sh "$D"
