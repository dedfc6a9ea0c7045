#!/bin/sh
# Command (b) of the README: every test. Unit tests, then the end-to-end tests
# that start a real Slurm (munged, slurmctld, slurmd) on localhost with the
# built plugin and helpers, and submit jobs as root and as test users.
# Run as root.
set -eu
cd "$(dirname "$0")/.."
. scripts/common.sh
require_root
ensure_packages
ensure_rust

# CRIU 4.1.1 for --gpu-mode=checkpoint (built from Debian trixie's source;
# skipped when a working one is installed). Its tests must then run.
sh scripts/install-criu.sh
GPU_MODE_REQUIRE_CRIU=1
export GPU_MODE_REQUIRE_CRIU

cargo build --workspace --all-targets
cargo test --workspace
