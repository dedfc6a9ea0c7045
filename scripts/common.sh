# Shared by setup-and-demo.sh and test.sh: root check, Debian/Ubuntu packages,
# the Rust toolchain. Sourced, not run.

# Slurm 22.05+ daemons and clients, munge, the SPANK header, and libclang for
# bindgen (the plugin's bindings are generated from <slurm/spank.h>);
# iproute2 for the two-node test cluster (network namespaces).
GPU_MODE_APT_PACKAGES="slurmctld slurmd slurm-client munge libslurm-dev libclang-dev pkg-config build-essential passwd iproute2"

die() { echo "error: $*" >&2; exit 1; }

require_root() {
    [ "$(id -u)" = 0 ] || die "run as root: the local Slurm cluster starts munged, slurmctld and slurmd (try: sudo $0)"
}

ensure_packages() {
    missing=""
    for p in $GPU_MODE_APT_PACKAGES; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
    done
    if [ -n "$missing" ]; then
        command -v apt-get >/dev/null || die "apt-get not found: install$missing by hand"
        echo "installing:$missing"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
    fi
    # The Debian packages start no daemons here, but stop any that did: the
    # project's cluster uses its own private ports and directories (and
    # test.sh installs prometheus only for promtool, not its server, and
    # mariadb-server and slurmdbd for the accounting test, which runs a
    # private MariaDB and slurmdbd of its own).
    for svc in slurmd slurmctld slurmdbd munge prometheus mariadb; do
        if command -v systemctl >/dev/null && systemctl is-active -q "$svc" 2>/dev/null; then
            systemctl stop "$svc" || true
        fi
    done
}

ensure_rust() {
    [ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
    command -v cargo >/dev/null || die "cargo not found: install Rust 1.89 or newer (https://rustup.rs), then re-run"
}

# Root, the Debian packages above plus any named here, and Rust: the start
# of every script that runs a cluster or builds packages.
prepare() {
    require_root
    GPU_MODE_APT_PACKAGES="$GPU_MODE_APT_PACKAGES $*"
    ensure_packages
    ensure_rust
    step_t0=$(date +%s)
}

# `== [12s] what happens now`, seconds since prepare.
step() { echo "== [$(( $(date +%s) - step_t0 ))s] $*"; }
