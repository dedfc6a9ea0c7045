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

cargo build --workspace --all-targets
cargo test --workspace
