#!/bin/sh
# Command (b) of the README: every test. Unit tests, then the end-to-end tests
# that start a real Slurm (munged, slurmctld, slurmd) on localhost with the
# built plugin and helpers, and submit jobs as root and as test users; then
# the packages (test-packaging.sh), the Ansible role applied to this machine
# with jobs on the installed files (test-install.sh), and the plugin built
# and tested against Slurm 24.11 in a Debian trixie root (test-slurm-2411.sh).
# Run as root.
set -eu
cd "$(dirname "$0")/.."
. scripts/common.sh
require_root
ensure_packages
ensure_rust

t0=$(date +%s)
part() { # NAME COMMAND...: runs one part and prints how long it took
    name=$1; shift
    s=$(date +%s)
    "$@"
    echo "== $name took $(( $(date +%s) - s )) s"
}
part "build" cargo build --workspace --all-targets
part "unit and end-to-end tests (Slurm 22.05)" cargo test --workspace
part "packages (test-packaging.sh)" sh scripts/test-packaging.sh
part "Ansible role and installed files (test-install.sh)" sh scripts/test-install.sh
part "Slurm 24.11 (test-slurm-2411.sh)" sh scripts/test-slurm-2411.sh
echo "== all tests took $(( $(date +%s) - t0 )) s"
