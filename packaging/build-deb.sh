#!/bin/sh
# Builds slurm-gpu-mode_<version>_amd64.deb from a release build with dpkg-deb.
# Layout (matches etc/ and docs/):
#   /usr/lib/x86_64-linux-gnu/slurm-wlm/gpu_mode.so          the SPANK plugin
#   /usr/libexec/slurm-gpu-mode/gpu-mode-{prolog,epilog,node-checker}
#   /etc/slurm-gpu-mode/config.toml                          (conffile)
#   /etc/slurm/plugstack.conf.d/gpu-mode.conf                (conffile)
#   /usr/share/doc/slurm-gpu-mode/{slurm.conf,gres.conf}.snippet
# Usage: packaging/build-deb.sh [OUTDIR]
set -eu
cd "$(dirname "$0")/.."
out=${1:-target/deb}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
cargo build --release --workspace
root=$(mktemp -d)
chmod 0755 "$root"  # mktemp makes it 0700; the package root must be 0755
trap 'rm -rf "$root"' EXIT
install -D -m 0755 target/release/libgpu_mode_spank.so "$root/usr/lib/x86_64-linux-gnu/slurm-wlm/gpu_mode.so"
for b in gpu-mode-prolog gpu-mode-epilog gpu-mode-node-checker; do
    install -D -m 0755 "target/release/$b" "$root/usr/libexec/slurm-gpu-mode/$b"
done
install -D -m 0644 etc/config.toml "$root/etc/slurm-gpu-mode/config.toml"
install -D -m 0644 etc/plugstack.conf.d/gpu-mode.conf "$root/etc/slurm/plugstack.conf.d/gpu-mode.conf"
install -D -m 0644 etc/slurm.conf.snippet "$root/usr/share/doc/slurm-gpu-mode/slurm.conf.snippet"
install -D -m 0644 etc/gres.conf.snippet "$root/usr/share/doc/slurm-gpu-mode/gres.conf.snippet"
mkdir -p "$root/DEBIAN"
cat > "$root/DEBIAN/control" <<CTRL
Package: slurm-gpu-mode
Version: $version
Architecture: amd64
Maintainer: slurm-gpu-mode developers <root@localhost>
Depends: libc6, slurm-client (>= 22.05)
Section: admin
Priority: optional
Description: Per-job GPU modes for Slurm (MPS, MIG, checkpoint)
 A SPANK plugin (--gpu-mode=mps|mig:<profile>|checkpoint) with Prolog,
 Epilog and HealthCheckProgram helpers that prepare and restore each
 job's GPU mode and keep the node healthy.
CTRL
printf '/etc/slurm-gpu-mode/config.toml\n/etc/slurm/plugstack.conf.d/gpu-mode.conf\n' > "$root/DEBIAN/conffiles"
mkdir -p "$out"
dpkg-deb --root-owner-group --build "$root" "$out/slurm-gpu-mode_${version}_amd64.deb"
