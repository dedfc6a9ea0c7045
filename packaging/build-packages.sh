#!/bin/sh
# Builds slurm-gpu-mode's .deb (cargo-deb) and .rpm (cargo-generate-rpm) from
# one release build. Metadata: [package.metadata.deb] and
# [package.metadata.generate-rpm] in spank-plugin/Cargo.toml; layout:
# docs/install.md. The plugin is built against the Slurm headers found
# (/usr/include, or SLURM_INCLUDE_DIR) and only loads into that Slurm's
# major.minor, so the .deb's dependency is pinned to it.
# Usage: packaging/build-packages.sh [OUTDIR]   (default target/packages)
# Needs: cargo-deb, cargo-generate-rpm (scripts/test-packaging.sh installs them).
set -eu
cd "$(dirname "$0")/.."
out=${1:-target/packages}
header=${SLURM_INCLUDE_DIR:-/usr/include}/slurm/slurm_version.h
[ -f "$header" ] || { echo "error: $header not found: install libslurm-dev (or slurm-devel), or set SLURM_INCLUDE_DIR" >&2; exit 1; }
# SLURM_VERSION_NUMBER 0xMMmmuu -> major, minor (e.g. 0x160508 -> 22 05).
num=$(sed -n 's/^#define SLURM_VERSION_NUMBER 0x\([0-9a-fA-F]*\).*/\1/p' "$header")
[ -n "$num" ] || { echo "error: no SLURM_VERSION_NUMBER in $header" >&2; exit 1; }
major=$(printf '%d' "0x$(echo "$num" | cut -c1-2)")
minor=$(printf '%02d' "0x$(echo "$num" | cut -c3-4)")
variant="slurm-$major-$minor"
grep -q "^\[package.metadata.deb.variants.$variant\]" spank-plugin/Cargo.toml ||
    { echo "error: Slurm $major.$minor is not a supported version (no [package.metadata.deb.variants.$variant] in spank-plugin/Cargo.toml); supported: 22.05, 24.11, 26.05" >&2; exit 1; }
echo "== building for Slurm $major.$minor ($header)"
cargo build --release --locked -p gpu-mode-spank -p gpu-mode-prolog -p gpu-mode-epilog \
    -p gpu-mode-node-checker -p gpu-mode-checkpoint -p gpu-mode-mig -p gpu-mode-status -p gpu-mode-man \
    -p gpu-mode-hugepages
rm -rf target/man
target/release/gpu-mode-man target/man >/dev/null
mkdir -p "$out"
cargo deb --no-build --locked -p gpu-mode-spank --variant "$variant" --output "$out/"
cargo generate-rpm -p spank-plugin --variant "$variant" -o "$out/"
ls -l "$out"
