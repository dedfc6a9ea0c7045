#!/bin/sh
# Command (b) of the README: every test. Unit tests, then the end-to-end tests
# that start a real Slurm (munged, slurmctld, slurmd) on localhost with the
# built plugin and helpers, and submit jobs as root and as test users; then
# the packages (test-packaging.sh), the Ansible role applied to this machine
# with jobs on the installed files (test-install.sh), and the plugin built
# and tested against the newer Slurms Debian serves, each in a debootstrap'd
# root of its suite (test-slurm-debian.sh): 24.11 (trixie) and 26.05 (forky).
# Ends with the count of tests passed, failed, skipped and substituted
# (scripts/test-count.sh), also when a part fails; .ci/run prints it again
# last. Run as root.
set -eu
cd "$(dirname "$0")/.."
. scripts/common.sh
# Every Debian package of every part at once: the parts started in the
# background below must not race for apt's lock. slurmdbd and mariadb-server:
# the cluster with accounting in a real database
# (tests/tests/preempt_accounting_db.rs). nftables: the nft binary, with
# which the epilog removes CRIU's network locks and the node checker lists
# them (preempt_criu.rs's network-lock test needs it, else it is skipped).
prepare lintian rpm systemd debootstrap python3-venv python3-apt prometheus slurmdbd mariadb-server nftables

# promtool (Debian package prometheus) lints the rendered metrics textfile
# (core::metrics tests); here it must run, not skip.
GPU_MODE_REQUIRE_PROMTOOL=1
export GPU_MODE_REQUIRE_PROMTOOL

# CRIU 4.1.1 for --gpu-mode=checkpoint (built from Debian trixie's source;
# skipped when a working one is installed). Its tests must then run.
sh scripts/install-criu.sh
GPU_MODE_REQUIRE_CRIU=1
export GPU_MODE_REQUIRE_CRIU
# fs.protected_symlinks and fs.protected_hardlinks are left as the machine
# has them: the agent no longer depends on them (preempt/src/shm.rs; its
# tests and preempt_criu's spawn-worker test pass with both at 0).
# The huge-page shim's tests must check huge pages, not skip (the kernel's
# transparent huge pages must be "madvise" or "always").
GPU_MODE_REQUIRE_THP=1
export GPU_MODE_REQUIRE_THP

# What tests note as skipped or substituted (tools/testkit), from this run
# only; test-slurm-debian.sh adds its roots' notes.
mkdir -p target/test-logs
GPU_MODE_TEST_NOTES=$PWD/target/test-notes.log
export GPU_MODE_TEST_NOTES
: > "$GPU_MODE_TEST_NOTES"
# Every part's output, counted at the end into target/test-summary.txt.
output=target/test-logs/test-output.log
: > "$output"
rm -f target/test-summary.txt
summary() {
    sh scripts/test-count.sh "$output" "$GPU_MODE_TEST_NOTES" > target/test-summary.txt
    cat target/test-summary.txt
}
trap summary EXIT

t0=$(date +%s)
part() { # NAME COMMAND...: runs one part, its output also into $output; prints how long it took
    name=$1; shift
    s=$(date +%s)
    { rc=0; "$@" 2>&1 || rc=$?; echo "$rc" > target/test-logs/part.rc; } | tee -a "$output"
    rc=$(cat target/test-logs/part.rc)
    echo "== $name took $(( $(date +%s) - s )) s"
    [ "$rc" = 0 ] || { echo "== $name failed (exit $rc)"; exit "$rc"; }
}
part "build" cargo build --workspace --all-targets

# The end-to-end tests mostly wait on Slurm: meanwhile, at the lowest CPU
# priority, the later parts' tools (cargo-deb, cargo-generate-rpm,
# ansible-core) and the trixie and forky roots are fetched and built. Each
# part checks for them again and redoes what a failure here left undone.
nice -n 19 sh scripts/test-packaging.sh --tools > target/test-logs/tools-packaging.log 2>&1 &
tools_pid=$!
nice -n 19 sh scripts/test-install.sh --tools > target/test-logs/tools-ansible.log 2>&1 &
ansible_pid=$!
nice -n 19 sh scripts/test-slurm-debian.sh trixie 24.11 --root > target/test-logs/trixie-root.log 2>&1 &
trixie_pid=$!
nice -n 19 sh scripts/test-slurm-debian.sh forky 26.05 --root > target/test-logs/forky-root.log 2>&1 &
forky_pid=$!
background() { # PID NAME: waits for a background preparation
    wait "$1" || echo "== $2 failed in the background (log: target/test-logs/); the part retries it"
}

part "unit and end-to-end tests (Slurm 22.05)" cargo test --workspace
background "$tools_pid" "cargo-deb/cargo-generate-rpm"
part "packages (test-packaging.sh)" sh scripts/test-packaging.sh
background "$ansible_pid" "ansible-core"
part "Ansible role and installed files (test-install.sh)" sh scripts/test-install.sh
background "$trixie_pid" "the trixie root"
part "Slurm 24.11 (test-slurm-debian.sh trixie)" sh scripts/test-slurm-debian.sh trixie 24.11
background "$forky_pid" "the forky root"
part "Slurm 26.05 (test-slurm-debian.sh forky)" sh scripts/test-slurm-debian.sh forky 26.05
echo "== all tests took $(( $(date +%s) - t0 )) s"
