#!/bin/sh
# The package as a site installs it: applies the Ansible role
# (packaging/ansible) for real to this machine, `-c local`, with the .deb that
# scripts/test-packaging.sh built, twice (the second run must change
# nothing); starts the project's local Slurm on the
# INSTALLED files (system plugstack.conf and the package's snippet, the
# slurm.conf lines the role merged, /usr/libexec/slurm-gpu-mode/*,
# /etc/slurm-gpu-mode/config.toml from the role's variables); runs one job per
# mode; installs the package over a config and a site script that use the
# previous names ([checkpoint], gpu-mode-checkpoint) and checkpoints,
# requeues and restores a job under them (docs/install.md, "From the previous
# names"); checks that the role
# fails on a bring-up script with `nvidia-smi -pm 1`; removes the package and
# checks srun still works. GPUs are the simulated ones (the role's variables
# come from the harness: <cluster>/ansible-vars.json).
#
# systemd is not PID 1 on the CI machine: the role enables units offline
# (systemctl enable works on files, checked with is-enabled) and reports the
# starts as skipped; its `gpu_mode_systemd: true` path is not run here.
# It installs and purges the package on this machine and removes the
# persistenced unit files the role wrote: a CI or development machine, never
# a production node.
# Usage (root): scripts/test-install.sh [DEB | --tools]   (default target/packages/*.deb)
set -eu
cd "$(dirname "$0")/.."
. scripts/common.sh
prepare python3-venv python3-apt

base=${GPU_MODE_CLUSTER_BASE:-/tmp/gpu-mode-cluster}
name=installed
dir=$base/$name


step "ansible-core from PyPI"
venv=target/ansible-venv
[ -x "$venv/bin/ansible-playbook" ] || {
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q 'ansible-core==2.17.*'
}
# --tools: only the above (test.sh installs it while other tests run).
[ "${1:-}" = --tools ] && exit 0

deb=${1:-$(ls target/packages/slurm-gpu-mode_*_amd64.deb 2>/dev/null | head -n1)}
[ -f "$deb" ] || die "no .deb: run scripts/test-packaging.sh first (or pass its path)"
deb=$(readlink -f "$deb")

# The simulated GPU side and the harness (test.sh built them). The whole
# workspace: a -p subset would build gpu-mode-core with other features, so
# anew.
cargo build -q --workspace
cluster=target/debug/gpu-mode-cluster

cleanup() {
    "$cluster" down --name "$name" >/dev/null 2>&1 || true
    # What the role put outside the package (this machine may be a developer's).
    rm -f /etc/systemd/system/nvidia-persistenced.service \
        /etc/systemd/system/multi-user.target.wants/nvidia-persistenced.service
    rm -rf /etc/systemd/system/nvidia-persistenced.service.d
    if dpkg-query -W slurm-gpu-mode >/dev/null 2>&1; then
        DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq slurm-gpu-mode >/dev/null 2>&1 || true
    fi
}
trap cleanup EXIT
cleanup

logs=target/test-logs/install
rm -rf "$logs"; mkdir -p "$logs"

step "a cluster for the installed package ($dir)"
# --preempt: partitions low and high, for the upgrade step's checkpoint job.
"$cluster" write --installed --name "$name" --gpus 2 --preempt
# Stand-in for the driver's daemon binary: only its path is used (nothing
# can start it without systemd as PID 1).
stub=$dir/sim/nvidia-persistenced
cp /bin/true "$stub"

play() {
    ANSIBLE_NOCOLOR=1 ANSIBLE_STDOUT_CALLBACK=default ANSIBLE_LOCALHOST_WARNING=0 \
        "$venv/bin/ansible-playbook" -i localhost, -c local packaging/ansible/site.yml \
        -e ansible_python_interpreter=/usr/bin/python3 \
        -e "@$dir/ansible-vars.json" -e "gpu_mode_package_file=$deb" \
        -e "gpu_mode_persistenced_binary=$stub" "$@"
}
recap() { sed -n 's/.*localhost *: *\(ok=.*\)/\1/p' "$1" | tr -s ' '; }

step "role, first run"
play > "$logs/ansible-1.log" 2>&1 || { cat "$logs/ansible-1.log"; die "the role failed on its first run"; }
echo "   recap: $(recap "$logs/ansible-1.log")"
grep -q 'changed=0 ' "$logs/ansible-1.log" && die "the first run changed nothing: was the package already installed?"

step "role, second run: nothing may change"
play > "$logs/ansible-2.log" 2>&1 || { cat "$logs/ansible-2.log"; die "the role failed on its second run"; }
echo "   recap: $(recap "$logs/ansible-2.log")"
grep -q 'changed=0 ' "$logs/ansible-2.log" || { grep -B2 '^changed:' "$logs/ansible-2.log"; die "the second run changed something (not idempotent)"; }

step "what the role left"
test -L /etc/slurm/plugstack.conf.d/gpu-mode.conf || die "the package's plugstack link is missing"
for line in "Prolog=/usr/libexec/slurm-gpu-mode/gpu-mode-prolog" "Epilog=/usr/libexec/slurm-gpu-mode/gpu-mode-epilog" \
    "PrologFlags=Alloc" "HealthCheckProgram=/usr/libexec/slurm-gpu-mode/gpu-mode-node-checker" "HealthCheckInterval=300"; do
    grep -qx "$line" "$dir/slurm.conf" || die "slurm.conf lacks $line"
done
[ "$(systemctl is-enabled nvidia-persistenced.service)" = enabled ] || die "nvidia-persistenced is not enabled"
/usr/libexec/slurm-gpu-mode/gpu-mode-node-checker check-config >/dev/null

step "the local Slurm on the installed files"
"$cluster" start --installed --name "$name"
SLURM_CONF=$dir/slurm.conf
export SLURM_CONF
/usr/bin/scontrol show config | grep -E '^(Prolog|Epilog|PrologFlags|PlugStackConfig) ' | sed 's/^/   /'

job() { # MODE "SBATCH-OPTIONS" EXPECTED-LINE...: one job as gmtest1, its output must hold each line
    mode=$1; opts=$2; shift 2
    out=$dir/out/installed-$(echo "$mode" | tr -c 'a-z0-9\n' _).out
    # shellcheck disable=SC2086 # $opts: option words of this script's own
    if ! runuser -u gmtest1 -- /usr/bin/sbatch --wait --quiet --gres=gpu:1 --output="$out" --gpu-mode="$mode" $opts \
        --wrap 'echo "mode=$SLURM_GPU_MODE gpus=$SLURM_GPU_MODE_GPUS mps_pipe=${CUDA_MPS_PIPE_DIRECTORY:+set}"'; then
        cat "$out" 2>/dev/null; tail -n 20 "$dir/log/slurmd.log"; die "the --gpu-mode=$mode job failed"
    fi
    for want in "$@"; do
        grep -q -- "$want" "$out" || { cat "$out"; die "--gpu-mode=$mode: the job's output lacks $want"; }
    done
    echo "   --gpu-mode=$mode: $(cat "$out")"
}
step "one job per mode (as gmtest1)"
# The simulated GPUs are H200s: their MIG profiles are 1g.18gb ... 7g.141gb.
job mps:threads=50 "" "mode=mps:threads=50 " "mps_pipe=set"
job mig:1g.18gbx2 "" "mode=mig:1g.18gbx2 "
job mig:@half "" "mode=mig:@half "
job checkpoint "--signal=B:USR1@60 --requeue" "mode=checkpoint "
if runuser -u gmtest1 -- /usr/bin/sbatch --gpu-mode=mig:1g.10gbx9 --wrap true 2>"$dir/out/bad.err"; then
    die "sbatch accepted --gpu-mode=mig:1g.10gbx9"
fi
grep -q 'count 9 in "1g.10gbx9" is out of range' "$dir/out/bad.err" || { cat "$dir/out/bad.err"; die "no clear error for a bad value"; }
echo "   a bad value is refused by sbatch: $(head -n1 "$dir/out/bad.err")"

step "upgrade over the previous names: a [checkpoint] config, a site script calling gpu-mode-checkpoint"
# A node set up before the renames (docs/install.md, "From the previous
# names"): its config has one [checkpoint] section where the role wrote
# [preempt] and [cuda_ckpt], and an admin's script calls the CUDA checkpoint
# tool by its old name. The package is then installed over both; checkpoint
# jobs must keep being checkpointed, requeued and restored under that config.
cfg=/etc/slurm-gpu-mode/config.toml
cp "$cfg" "$dir/config.toml.new-names"
awk '
    /^\[(preempt|cuda_ckpt)\]$/ { moving = 1; next }
    /^\[/ { moving = 0 }
    moving { if (NF) old = old $0 "\n"; next }
    { print }
    END { printf "\n[checkpoint]\n%s", old }
' "$dir/config.toml.new-names" > "$cfg"
grep -qx '\[checkpoint\]' "$cfg" && ! grep -qE '^\[(preempt|cuda_ckpt)\]' "$cfg" ||
    { cat "$cfg"; die "the old-names config was not written as one [checkpoint] section"; }
mkdir -p "$dir/site-bin"
site_script=$dir/site-bin/cuda-state.sh
printf '#!/bin/sh\n# An admin helper written before the rename.\nexec /usr/sbin/gpu-mode-checkpoint state --pid "$1"\n' > "$site_script"
chmod 755 "$site_script"
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --reinstall -o Dpkg::Options::=--force-confold "$deb" > "$logs/reinstall.log" 2>&1 ||
    { cat "$logs/reinstall.log"; die "installing the package over the old names failed"; }
grep -qx '\[checkpoint\]' "$cfg" || die "installing the package replaced the site's config"
/usr/libexec/slurm-gpu-mode/gpu-mode-node-checker check-config > /dev/null 2> "$logs/check-config-old.err" ||
    { cat "$logs/check-config-old.err"; die "check-config refuses the [checkpoint] section"; }
grep -q 'warning: .*the \[checkpoint\] section is now \[preempt\], its .* in \[cuda_ckpt\]' "$logs/check-config-old.err" ||
    { cat "$logs/check-config-old.err"; die "check-config does not say the [checkpoint] section is renamed"; }
echo "   check-config: $(cat "$logs/check-config-old.err")"
rc=0; /usr/sbin/gpu-mode-status --node "$(/usr/bin/scontrol show node -o | sed -n 's/^NodeName=\([^ ]*\).*/\1/p')" \
    > "$logs/status-old.out" 2> "$logs/status-old.err" || rc=$?
[ "$rc" -le 1 ] && grep -q 'the \[checkpoint\] section is now \[preempt\]' "$logs/status-old.err" ||
    { cat "$logs/status-old.out" "$logs/status-old.err"; die "gpu-mode-status (exit $rc) does not warn of the old section"; }
echo "   gpu-mode-status (exit $rc): $(grep -m1 warning "$logs/status-old.err")"

# The counter (simulated CUDA) where gmtest1 may run it, wrapped by the
# installed gpu-mode-run, which reads the old config. Nothing here names the
# simulated node: the counter, the agent and the site script find it through
# the simulation's pointer file, as the installed hooks do.
mkdir -p "$dir/bin" && cp target/debug/cuda-sim-counter "$dir/bin/"
ready=$dir/out/upgrade-ready out=$dir/out/upgrade-ckpt.out script=$dir/out/upgrade-ckpt.sh
rm -f "$ready" "$out"
printf '#!/bin/sh\nexec /usr/bin/gpu-mode-run -- %s --steps 30 --interval-ms 100 --mib 8 --ready %s\n' "$dir/bin/cuda-sim-counter" "$ready" > "$script"
chmod 755 "$script"
ckpt_job=$(runuser -u gmtest1 -- /usr/bin/sbatch --parsable -p low \
    --gpu-mode=checkpoint --signal=B:USR1@60 --requeue --open-mode=append --gres=gpu:1 --output="$out" "$script")
field() { /usr/bin/scontrol show job -o "$ckpt_job" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
i=0; until grep -q '^step 5 ' "$out" 2>/dev/null || [ $i -ge 300 ]; do sleep 0.1; i=$((i + 1)); done
[ -s "$ready" ] || { cat "$out"; die "the checkpoint job did not start counting"; }
"$site_script" "$(cat "$ready")" > "$logs/site-script.out" 2> "$logs/site-script.err" ||
    { cat "$logs/site-script.out" "$logs/site-script.err"; die "the site script calling gpu-mode-checkpoint failed"; }
grep -qx 'gpu-mode-checkpoint: warning: this tool is now gpu-mode-cuda-ckpt; the old name goes in a later release' "$logs/site-script.err" ||
    { cat "$logs/site-script.err"; die "gpu-mode-checkpoint does not name its new name"; }
echo "   site script (gpu-mode-checkpoint state): $(head -n3 "$logs/site-script.out" | tr '\n' ' ')"
runuser -u gmtest2 -- /usr/bin/sbatch --quiet -p high --gres=gpu:2 --output=/dev/null --wrap 'sleep 3'
# Requeued, then (after the credential delay) restored; at most 2 min.
i=0; until [ "$(field JobState)" = COMPLETED ] || [ "$(field JobState)" = FAILED ] || [ $i -ge 600 ]; do sleep 0.2; i=$((i + 1)); done
state="$(field JobState) $(field ExitCode) restarts=$(field Restarts)"
# Restored where it stopped, not started over: 30 step lines, each step once.
counted=$(grep -c '^step' "$out")
distinct=$(grep '^step' "$out" | awk '{print $2}' | sort -n | uniq | wc -l)
comment=$(field AdminComment)
if [ "$state" != "COMPLETED 0:0 restarts=1" ] || [ "$counted/$distinct" != 30/30 ] || ! echo "$comment" | grep -q 'ckpt=r0@.*restore=r1@'; then
    cat "$out"; tail -n 30 "$dir/log/slurmd.log"
    die "the checkpoint job under the old names: $state, $counted step lines and $distinct distinct steps (want 30 and 30), AdminComment '$comment'"
fi
echo "   job $ckpt_job under [checkpoint]: preempted, $state, steps 1-30 each counted, AdminComment $comment"

# The rename done (the role's config back): no warning any more.
cp "$dir/config.toml.new-names" "$cfg"
/usr/libexec/slurm-gpu-mode/gpu-mode-node-checker check-config > /dev/null 2> "$logs/check-config-new.err" ||
    { cat "$logs/check-config-new.err"; die "check-config refuses the renamed config"; }
! grep -q 'warning' "$logs/check-config-new.err" || { cat "$logs/check-config-new.err"; die "check-config still warns after the rename"; }
echo "   after the rename: check-config says nothing"

step "the role fails on a bring-up script that uses nvidia-smi -pm 1"
legacy=$dir/legacy-bringup
mkdir -p "$legacy"
printf '#!/bin/sh\nnvidia-smi -pm 1\n' > "$legacy/gpu-setup.sh"
if play --tags persistenced -e "{\"gpu_mode_legacy_persistence_paths\": [\"$legacy\"]}" > "$logs/ansible-legacy.log" 2>&1; then
    die "the role accepted a bring-up script with nvidia-smi -pm 1"
fi
grep -q "gpu-setup.sh" "$logs/ansible-legacy.log" || { cat "$logs/ansible-legacy.log"; die "the failure does not name the script"; }
echo "   failed naming $legacy/gpu-setup.sh"

step "removing the package leaves the submit commands working"
# (On a node, slurm.conf's Prolog=/Epilog= lines go first: docs/install.md.)
DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq slurm-gpu-mode >/dev/null
[ ! -e /etc/slurm/plugstack.conf.d/gpu-mode.conf ] && [ ! -L /etc/slurm/plugstack.conf.d/gpu-mode.conf ] ||
    die "the plugstack snippet outlived the package"
runuser -u gmtest1 -- /usr/bin/sbatch --test-only --wrap true 2>"$dir/out/removed.err" ||
    { cat "$dir/out/removed.err"; die "sbatch fails after the package was removed"; }
if runuser -u gmtest1 -- /usr/bin/sbatch --test-only --gpu-mode=mps --wrap true 2>/dev/null; then
    die "--gpu-mode still accepted after the package was removed"
fi
echo "   sbatch works; --gpu-mode is gone with the plugin"

step "done"
echo "test-install: 1 passed, 0 failed"
