#!/bin/sh
# Slurm 24.11 (Debian trixie): scripts/test-slurm-debian.sh trixie 24.11.
# Usage (as root): scripts/test-slurm-2411.sh [--root]; GPU_MODE_TRIXIE_ROOT
# names the root to use or make.
exec sh "$(dirname "$0")/test-slurm-debian.sh" trixie 24.11 "$@"
