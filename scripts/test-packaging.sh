#!/bin/sh
# Builds the .deb and the .rpm (packaging/build-packages.sh) and checks them:
# lintian has no errors on the .deb, `rpm -qlp` shows each file where the
# distro's Slurm expects it, and the systemd units pass `systemd-analyze
# verify` (any message fails). Installs what it needs: lintian, rpm and
# systemd (Debian packages), cargo-deb and cargo-generate-rpm (crates.io).
# Usage (root): scripts/test-packaging.sh [--tools]
set -eu
cd "$(dirname "$0")/.."
. scripts/common.sh
prepare lintian rpm systemd


# Pinned: their metadata keys are what spank-plugin/Cargo.toml uses.
if ! cargo deb --version 2>/dev/null | grep -q '3\.8\.0' || ! cargo generate-rpm --version 2>/dev/null | grep -q '0\.21\.1'; then
    step "cargo install cargo-deb 3.8.0, cargo-generate-rpm 0.21.1"
    cargo install -q --locked cargo-deb@3.8.0 cargo-generate-rpm@0.21.1
fi
# --tools: only the above (test.sh installs them while other tests run).
[ "${1:-}" = --tools ] && exit 0

step "build the packages"
out=target/packages
rm -rf "$out"
sh packaging/build-packages.sh "$out" >/dev/null
deb=$(ls "$out"/slurm-gpu-mode_*_amd64.deb)
rpm=$(ls "$out"/slurm-gpu-mode-*.x86_64.rpm)
ls -l "$deb" "$rpm" | sed 's/^/   /'

step "lintian (no errors allowed)"
# lintian says it should not run as root; the check is the same.
lintian --fail-on error --suppress-tags initial-upload-closes-no-bugs "$deb" 2>&1 | grep -v 'running with root privileges' | sed 's/^/   /' || true
lintian --fail-on error "$deb" >/dev/null 2>&1 || die "lintian reports errors on $deb"

# Each file where that distro's Slurm and systemd look for it.
expect() { # LISTING PATH...
    listing=$1; shift
    for p in "$@"; do
        grep -qx "$p" "$listing" || { cat "$listing"; die "$p is not in the package"; }
    done
}
step "the .deb's layout (Debian: PluginDir /usr/lib/x86_64-linux-gnu/slurm-wlm)"
dpkg-deb -c "$deb" | awk '{print substr($6, 2)}' | sed 's|/$||' > "$out/deb.list"
expect "$out/deb.list" \
    /usr/lib/x86_64-linux-gnu/slurm-wlm/gpu_mode.so \
    /usr/libexec/slurm-gpu-mode/gpu-mode-prolog /usr/libexec/slurm-gpu-mode/gpu-mode-epilog \
    /usr/libexec/slurm-gpu-mode/gpu-mode-node-checker /usr/sbin/gpu-mode-cuda-ckpt /usr/sbin/gpu-mode-checkpoint \
    /usr/sbin/gpu-mode-mig /usr/libexec/slurm-gpu-mode/gpu-mode-ckpt-agent /usr/bin/gpu-mode-run \
    /usr/libexec/slurm-gpu-mode/libgpu_mode_hugepages.so \
    /usr/lib/systemd/system/gpu-mode-mig-baseline.service /etc/default/gpu-mode-mig-baseline \
    /usr/share/man/man8/gpu-mode-mig.8.gz /usr/share/man/man1/gpu-mode-run.1.gz \
    /etc/slurm-gpu-mode/config.toml /usr/share/slurm-gpu-mode/plugstack.conf \
    /usr/lib/systemd/system/nvidia-persistenced.service.d/50-slurm-gpu-mode.conf \
    /usr/lib/sysctl.d/60-slurm-gpu-mode.conf \
    /usr/share/man/man8/gpu-mode.8.gz /usr/share/man/man8/gpu-mode-prolog.8.gz \
    /usr/share/man/man8/gpu-mode-epilog.8.gz /usr/share/man/man8/gpu-mode-node-checker.8.gz \
    /usr/share/man/man8/gpu-mode-cuda-ckpt.8.gz \
    /usr/sbin/gpu-mode-status /usr/share/man/man8/gpu-mode-status.8.gz \
    /usr/share/doc/slurm-gpu-mode/examples/gpu-mode-dashboard.json
dpkg-deb -I "$deb" conffiles | grep -qx /etc/slurm-gpu-mode/config.toml || die "config.toml is not a conffile"
dpkg-deb -I "$deb" postinst | grep -q 'ln -s "$snippet" "$link"' || die "postinst does not link the plugstack snippet"
dpkg-deb -I "$deb" postinst | grep -q 'sysctl -q -p /usr/lib/sysctl.d/60-slurm-gpu-mode.conf' || die "postinst does not apply the sysctl defaults"
dpkg-deb -f "$deb" Depends | sed 's/^/   Depends: /'

step "rpm -qlp (SchedMD's rpms: PluginDir /usr/lib64/slurm, /etc/slurm)"
rpm -qlp "$rpm" 2>/dev/null > "$out/rpm.list"
sed 's/^/   /' "$out/rpm.list"
expect "$out/rpm.list" \
    /usr/lib64/slurm/gpu_mode.so /etc/slurm/plugstack.conf.d/gpu-mode.conf /etc/slurm-gpu-mode/config.toml \
    /usr/libexec/slurm-gpu-mode/gpu-mode-prolog /usr/libexec/slurm-gpu-mode/gpu-mode-epilog \
    /usr/libexec/slurm-gpu-mode/gpu-mode-node-checker /usr/sbin/gpu-mode-cuda-ckpt /usr/sbin/gpu-mode-checkpoint \
    /usr/sbin/gpu-mode-mig /usr/libexec/slurm-gpu-mode/gpu-mode-ckpt-agent /usr/bin/gpu-mode-run \
    /usr/libexec/slurm-gpu-mode/libgpu_mode_hugepages.so \
    /usr/lib/systemd/system/gpu-mode-mig-baseline.service /etc/default/gpu-mode-mig-baseline \
    /usr/lib/systemd/system/nvidia-persistenced.service.d/50-slurm-gpu-mode.conf /usr/share/man/man8/gpu-mode.8 \
    /usr/lib/sysctl.d/60-slurm-gpu-mode.conf /usr/sbin/gpu-mode-status
rpm -qcp "$rpm" 2>/dev/null | grep -qx /etc/slurm/plugstack.conf.d/gpu-mode.conf || die "the rpm's plugstack snippet is not %config"
rpm -qp --requires "$rpm" 2>/dev/null | grep '^slurm' | sed 's/^/   Requires: /'

step "systemd-analyze verify"
# A root with this host's units, the .deb unpacked, and a stand-in for the
# driver's binary (verify checks that ExecStart= exists). Two cases: the
# full unit for .run-installed drivers, and a packaged driver's unit that
# passes --no-persistence-mode (as some distributions' do) under our drop-in.
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/usr/lib/systemd" "$root/usr/bin" "$root/etc/systemd/system"
cp -a /lib/systemd/system "$root/usr/lib/systemd/"
ln -s usr/bin "$root/bin"
cp /bin/rm "$root/usr/bin/rm"
printf '#!/bin/sh\nexit 0\n' > "$root/usr/bin/nvidia-persistenced"
chmod 755 "$root/usr/bin/nvidia-persistenced"
dpkg-deb -x "$deb" "$root"
verify() { # CASE
    msgs=$(systemd-analyze verify --root="$root" nvidia-persistenced.service 2>&1) || { echo "$msgs"; die "systemd-analyze verify failed ($1)"; }
    [ -z "$msgs" ] || { echo "$msgs"; die "systemd-analyze verify is not clean ($1)"; }
    echo "   clean: $1"
}
cp "$root/usr/share/doc/slurm-gpu-mode/examples/nvidia-persistenced.service" "$root/etc/systemd/system/"
verify "examples/nvidia-persistenced.service + 50-slurm-gpu-mode.conf"
rm "$root/etc/systemd/system/nvidia-persistenced.service"
printf '[Unit]\nDescription=NVIDIA Persistence Daemon\n[Service]\nType=forking\nExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced --no-persistence-mode --verbose\nExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced\n' \
    > "$root/usr/lib/systemd/system/nvidia-persistenced.service"
verify "a driver's packaged unit + 50-slurm-gpu-mode.conf"
# The MIG baseline unit, with the slurmd drop-in the role installs where a
# baseline is set (a stand-in slurmd unit: this host has none).
printf '[Unit]\nDescription=slurmd\n[Service]\nExecStart=/usr/bin/rm --version\n' > "$root/usr/lib/systemd/system/slurmd.service"
mkdir -p "$root/etc/systemd/system/slurmd.service.d"
cp "$root/usr/share/doc/slurm-gpu-mode/examples/slurmd.service.d/gpu-mode-mig-baseline.conf" "$root/etc/systemd/system/slurmd.service.d/"
# --man=no: the man page is checked in the package listing above.
msgs=$(systemd-analyze verify --man=no --root="$root" gpu-mode-mig-baseline.service slurmd.service 2>&1) || { echo "$msgs"; die "systemd-analyze verify failed (MIG baseline unit)"; }
[ -z "$msgs" ] || { echo "$msgs"; die "systemd-analyze verify is not clean (MIG baseline unit)"; }
echo "   clean: gpu-mode-mig-baseline.service + slurmd drop-in"

step "done"
echo "test-packaging: 1 passed, 0 failed"
