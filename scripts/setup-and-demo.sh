#!/bin/sh
# Command (a) of the README: on a fresh Debian/Ubuntu machine, install what is
# missing, build, start the project's local Slurm cluster (simulated GPUs),
# and run one demo job per --gpu-mode, as a non-root user; then a checkpoint
# job preempted, requeued and restored to completion, and the admin's view of
# the node (gpu-mode-status, the metrics' counters, the job's AdminComment).
# Run as root.
#   --keep   leave the cluster running afterwards and print the admin's
#            commands with this cluster's paths (stop: gpu-mode-cluster down)
set -eu
cd "$(dirname "$0")/.."
. scripts/common.sh
prepare

echo "== building"
cargo build --workspace --release
bin=target/release
# CRIU 4 for the checkpoint demo (built from source, ~1 min, once; a failure
# only skips that demo).
sh scripts/install-criu.sh || echo "CRIU could not be installed: the checkpoint demo will be skipped"
"$bin/gpu-mode-cluster" down >/dev/null 2>&1 || true
# The cluster's directory (gpu-mode-cluster puts it under GPU_MODE_CLUSTER_BASE too).
D=${GPU_MODE_CLUSTER_BASE:-/tmp/gpu-mode-cluster}/demo
# Real GPUs where present (every GPU setting is then left as it is), else
# four simulated ones.
if command -v nvidia-smi >/dev/null && n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU') && [ "$n" -gt 0 ]; then
    GPU_MODE_GPU_DEVICES=$(seq -s, -f /dev/nvidia%g 0 $((n - 1)))
    export GPU_MODE_GPU_DEVICES
    echo "== starting the local cluster (munged, slurmctld, slurmd; $n real GPUs)"
    "$bin/gpu-mode-cluster" up --gpus "$n" --preempt
else
    echo "== starting the local cluster (munged, slurmctld, slurmd; 4 simulated GPUs)"
    "$bin/gpu-mode-cluster" up --gpus 4 --preempt
fi
SLURM_CONF=$D/slurm.conf
export SLURM_CONF
keep=no; [ "${1:-}" = --keep ] && keep=yes
trap '[ "$keep" = yes ] || "$bin/gpu-mode-cluster" down' EXIT

demo() {
    echo
    echo "== sbatch --gpu-mode=$* (as user gmtest1)"
    out=$D/out/demo-$$.out
    runuser -u gmtest1 -- /usr/bin/sbatch --wait --quiet --gres=gpu:1 --output="$out" --gpu-mode="$@" \
        --wrap 'echo "job $SLURM_JOB_ID on $(hostname): SLURM_GPU_MODE=$SLURM_GPU_MODE GPUs=$SLURM_GPU_MODE_GPUS"' \
        && cat "$out" || { echo "job failed:"; cat "$out"; }
}
demo mps:threads=50
demo checkpoint --signal=B:USR1@60 --requeue
echo
echo "== sbatch -n2 --gpu-mode=mig:3g.71gbx2 (as user gmtest1): each task gets one MIG device"
out=$D/out/demo-mig-$$.out
runuser -u gmtest1 -- /usr/bin/sbatch --wait --quiet -n2 --gres=gpu:1 --output="$out" --gpu-mode=mig:3g.71gbx2 \
    --wrap 'srun -n2 sh -c "echo task \$SLURM_LOCALID: CUDA_VISIBLE_DEVICES=\$CUDA_VISIBLE_DEVICES, the job has \$SLURM_GPU_MODE_MIG_UUIDS"' \
    && cat "$out" || { echo "job failed (on real GPUs, left as they are, MIG is off and the job is refused):"; cat "$out"; }

# The story's end: a low-priority checkpoint job of gmtest1's preempted by a
# high-priority one, checkpointed (CUDA, then CRIU run as gmtest1), requeued
# and restored where it stopped (docs/checkpoint.md). The counter exits 0
# here, so the job ends COMPLETED; that a non-zero exit code is relayed after
# a restore is tests/tests/preempt_checkpoint.rs's
# a_preempted_job_is_checkpointed_requeued_and_restored_with_its_count_and_exit_code.
preempt_demo() {
    echo
    echo "== sbatch -p low --gpu-mode=checkpoint --signal=B:USR1@60 --requeue --open-mode=append (as gmtest1),"
    echo "   preempted by sbatch -p high --gres=gpu:$gpus (as gmtest2)"
    script=$D/out/demo-ckpt-$$.sh out=$D/out/demo-ckpt-$$.out
    # The job's user may not reach the build tree (e.g. under /root).
    mkdir -p "$D/bin" && cp "$bin/gpu-mode-run" "$bin/cuda-sim-counter" "$D/bin/"
    printf '#!/bin/sh\nexec %s --config %s -- %s --steps 40 --interval-ms 100 --mib 8\n' \
        "$D/bin/gpu-mode-run" "$D/gpu-mode.toml" "$D/bin/cuda-sim-counter" > "$script"
    chmod 755 "$script"
    ckpt_job=$(runuser -u gmtest1 -- env SLURM_CONF="$SLURM_CONF" GPU_MODE_SIM_STATE="$D/sim/nvml-state.json" /usr/bin/sbatch --parsable -p low \
        --gpu-mode=checkpoint --signal=B:USR1@60 --requeue --open-mode=append --gres=gpu:1 --output="$out" "$script")
    field() { /usr/bin/scontrol show job -o "$ckpt_job" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
    i=0; until grep -q '^step 5 ' "$out" 2>/dev/null || [ $i -ge 300 ]; do sleep 0.1; i=$((i + 1)); done
    runuser -u gmtest2 -- env SLURM_CONF="$SLURM_CONF" /usr/bin/sbatch --quiet -p high --gres=gpu:$gpus \
        --output=/dev/null --wrap 'sleep 3'
    # Requeued, then (after Slurm's credential delay) restored; at most 2 min.
    i=0; until [ "$(field JobState)" = FAILED ] || [ "$(field JobState)" = COMPLETED ] || [ $i -ge 600 ]; do sleep 0.2; i=$((i + 1)); done
    grep -v '^step' "$out"
    echo "counted: $(grep -c '^step' "$out") step lines, steps 1-40 each once: $(grep '^step' "$out" | awk '{print $2}' | sort -n | uniq | wc -l) distinct"
    echo "job $ckpt_job: $(field JobState), exit code $(field ExitCode), restarts $(field Restarts)"
}

# What the admin sees of the same node afterwards, and the same commands
# printed for --keep (with this cluster's paths: the simulated NVML is found
# through GPU_MODE_SIM_STATE, and the node is named localhost, not this
# machine's host name).
node=$(/usr/bin/scontrol show node -o | sed -n 's/^NodeName=\([^ ]*\).*/\1/p' | head -n1)
checker_cmd="GPU_MODE_SIM_STATE=$D/sim/nvml-state.json $PWD/$bin/gpu-mode-node-checker --config $D/gpu-mode.toml --node $node --no-drain"
status_cmd="GPU_MODE_SIM_STATE=$D/sim/nvml-state.json $PWD/$bin/gpu-mode-status --config $D/gpu-mode.toml --node $node"
metrics_cmd="grep -E '^gpu_mode_(checkpoints|restores)_total' $D/textfile/gpu-mode.prom"
comment_cmd() { echo "scontrol show job $1 | grep -o 'AdminComment=.*'"; }
# The node checker reads the PCI bus and the kernel log, which simulated GPUs
# lack: the demo gives it those of the simulated GPUs (their bus ids in the
# NVML simulation's fixture), as the harness's installed mode does, so that
# it judges the simulated node as it would a real one.
simulated_node_for_the_checker() {
    for id in 0000:18:00.0 0000:2a:00.0 0000:3a:00.0 0000:5d:00.0; do
        mkdir -p "$D/sysfs/bus/pci/devices/$id"
        echo 0x10de > "$D/sysfs/bus/pci/devices/$id/vendor"
        echo 0x030200 > "$D/sysfs/bus/pci/devices/$id/class"
    done
    printf '6,1,0,-;Linux version x\n' > "$D/kmsg"
    grep -q '^\[health\]' "$D/gpu-mode.toml" ||
        printf '\n[health]\nsysfs_root = "%s"\nkmsg_path = "%s"\nexpected_gpus = %s\nrequire_persistenced = false\n' \
            "$D/sysfs" "$D/kmsg" "$gpus" >> "$D/gpu-mode.toml"
}
admin_view() {
    echo
    echo "== the admin's view of the node (as root)"
    simulated_node_for_the_checker
    # The node checker, as slurmd runs it (HealthCheckProgram) but without
    # draining: GPU health, and whether this node can checkpoint (the
    # ckpt_* lines, docs/node-checker.md); its verdict is what
    # gpu-mode-status shows and what a checkpoint job is told at its start.
    echo "\$ $checker_cmd"
    sh -c "$checker_cmd" || echo "(gpu-mode-node-checker exit $?)"
    echo
    # gpu-mode-status: the node's GPUs, jobs, agents, images kept and why,
    # and whatever else it reports (one screen; exit 1 lists problems).
    echo "\$ $status_cmd"
    sh -c "$status_cmd" || echo "(gpu-mode-status exit $?: see PROBLEMS above)"
    echo
    echo "\$ $metrics_cmd      # the agents' counters (docs/metrics.md)"
    sh -c "$metrics_cmd" || echo "(no checkpoint or restore counted)"
    if [ -n "${ckpt_job:-}" ]; then
        echo
        echo "\$ $(comment_cmd "$ckpt_job")      # the checkpoint and restore in Slurm's record (docs/checkpoint.md, Accounting)"
        sh -c "$(comment_cmd "$ckpt_job")" || echo "(job $ckpt_job has no AdminComment)"
    fi
}
echo
echo "== a bad value is refused at submit time"
runuser -u gmtest1 -- /usr/bin/sbatch --gpu-mode=mig:1g.18gbx9 --wrap true || true
echo
echo "== prolog/epilog log lines so far"
cat "$D/log/hooks.log"

gpus=$(/usr/bin/scontrol show node -o | tr ' ' '\n' | sed -n 's/^Gres=gpu:\([0-9]*\).*/\1/p')
if [ -n "${GPU_MODE_GPU_DEVICES:-}" ]; then
    echo
    echo "== checkpoint demo skipped: it runs a simulated CUDA program; on real GPUs see scripts/gpu/preempt-real.sh"
elif ! /opt/slurm-gpu-mode/criu/bin/criu check >/dev/null 2>&1; then
    echo
    echo "== checkpoint demo skipped: CRIU 4 is not installed (sh scripts/install-criu.sh)"
else
    preempt_demo
fi
admin_view

if [ "$keep" = yes ]; then
    echo
    echo "== the cluster keeps running (--keep). The admin's view again, by hand, as root:"
    echo "export SLURM_CONF=$SLURM_CONF"
    echo "$checker_cmd"
    echo "$status_cmd"
    echo "$metrics_cmd"
    # slurmctld forgets a finished job MinJobAge after its end.
    min_job_age=$(/usr/bin/scontrol show config | sed -n 's/^MinJobAge *= *//p')
    [ -n "${ckpt_job:-}" ] && echo "$(comment_cmd "$ckpt_job")      # until slurmctld forgets the job: MinJobAge, $min_job_age"
    echo "${GPU_MODE_CLUSTER_BASE:+GPU_MODE_CLUSTER_BASE=$GPU_MODE_CLUSTER_BASE }$PWD/$bin/gpu-mode-cluster down      # stop it"
fi
