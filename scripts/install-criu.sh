#!/bin/sh
# Installs CRIU 4.1.1 for --gpu-mode=checkpoint under /opt/slurm-gpu-mode/criu
# (bin/criu plus the non-glibc libraries it needs in lib/), and links
# /usr/local/sbin/criu to it. Idempotent: does nothing when a working criu 4
# or newer is already installed there.
#
# Why build it: Debian bookworm's criu 3.17 fails `criu check` on current
# kernels (6.x: "Unexpected rt vDSO area bounds"), and trixie's criu 4.1.1
# binary needs glibc 2.38. So we fetch trixie's upstream tarball through apt
# (a private source list: the system's apt configuration is not changed),
# check its SHA-256, install bookworm's build dependencies and build only the
# criu binary (~1 min on 2 cores). Why this CRIU: docs/checkpoint.md, "Site set-up".
#
# Patches: every packaging/criu/*.patch is applied before the build (each
# says why and where it comes from in its header; today seven: an
# unprivileged restore works where the node's tasks lack a capability, as in
# containers without CAP_SYS_RESOURCE; upstream's fix for dumping TCP/UDP
# sockets on Linux 6.16 and later; memory advised MADV_HUGEPAGE is
# restored into huge pages; a large mapping's pages are read back by
# several threads where CRIU_PAGE_READERS asks for it; and an unprivileged
# restore refuses a task whose image gives it a uid or gid that is not
# criu's, or any capability; and a failed pre-resume action script aborts
# the restore, where the agent holds the stopped tree for its checks; and
# the driver's checkpoint buffer, marked MADV_SEQUENTIAL by the huge-page
# library, is mapped from the image instead of read where
# CRIU_MAP_SEQUENTIAL_PAGES asks for it). The installed tree
# records them in PATCHES (name and SHA-256); a criu installed without
# exactly these is rebuilt.
#
#   scripts/install-criu.sh                      fetch, build, install (root, Debian/Ubuntu with apt)
#   scripts/install-criu.sh --bundle DIR         also copy the installed tree to DIR (e.g. .dev-carry/criu)
#   scripts/install-criu.sh --from DIR           install a bundle made by --bundle (no apt, no build:
#                                                 for machines without a package registry)
#   scripts/install-criu.sh --prefix DIR         install somewhere else (default /opt/slurm-gpu-mode/criu)
#   scripts/install-criu.sh --force              rebuild even if a working criu is installed
#
# The binary's RUNPATH is $ORIGIN/../lib (each bundled library's is $ORIGIN),
# so the tree runs wherever it is copied, on any glibc at least as new as the
# build machine's. Nothing here is committed: source and binaries are fetched
# and built at install time.
set -eu

CRIU_VERSION=4.1.1
CRIU_ORIG=criu_${CRIU_VERSION}.orig.tar.xz
# SHA-256 of Debian trixie's criu_4.1.1.orig.tar.xz (= upstream's v4.1.1 tarball).
CRIU_SHA256=f80a66cb3726bb2116266d4759ce3bcbfab7abdb6b6d430bf20dd41911717afe
BUILD_DEPS="build-essential pkg-config libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler
 python3-protobuf libnl-3-dev libnet1-dev libcap-dev libbsd-dev uuid-dev libnftables-dev libgnutls28-dev
 libaio-dev patchelf patch xz-utils ca-certificates"
# The C library itself comes from the target machine, never from the bundle.
GLIBC_LIBS='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv)\.so'

PATCH_DIR=$(cd "$(dirname "$0")/.." && pwd)/packaging/criu

PREFIX=/opt/slurm-gpu-mode/criu
BUNDLE=""
FROM=""
FORCE=0
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) PREFIX=$2; shift 2 ;;
        --bundle) BUNDLE=$2; shift 2 ;;
        --from) FROM=$2; shift 2 ;;
        --force) FORCE=1; shift ;;
        *) echo "usage: $0 [--prefix DIR] [--bundle DIR] [--from DIR] [--force]" >&2; exit 2 ;;
    esac
done

die() { echo "install-criu: error: $*" >&2; exit 1; }
say() { echo "install-criu: $*"; }

[ "$(id -u)" = 0 ] || die "run as root: it installs packages and writes $PREFIX"

# The major version of the criu at $1, or nothing when it does not run.
criu_major() {
    "$1" --version 2>/dev/null | sed -n 's/^Version: *\([0-9][0-9]*\)\..*/\1/p'
}

# The patches this script applies, one "sha256  name" line each.
expected_patches() {
    for p in "$PATCH_DIR"/*.patch; do
        [ -f "$p" ] && (cd "$PATCH_DIR" && sha256sum "$(basename "$p")")
    done
}

# A criu is "working" when it is 4 or newer, `criu check` passes, and it was
# built with exactly this script's patches.
working() {
    [ -x "$1" ] || return 1
    major=$(criu_major "$1")
    [ -n "$major" ] && [ "$major" -ge 4 ] && "$1" check >/dev/null 2>&1 || return 1
    [ "$(cat "$(dirname "$1")/../PATCHES" 2>/dev/null)" = "$(expected_patches)" ]
}

link_sbin() {
    mkdir -p /usr/local/sbin
    ln -sfn "$PREFIX/bin/criu" /usr/local/sbin/criu
}

make_bundle() {
    [ -n "$BUNDLE" ] || return 0
    rm -rf "$BUNDLE"
    mkdir -p "$BUNDLE"
    cp -a "$PREFIX/bin" "$PREFIX/lib" "$PREFIX/PATCHES" "$BUNDLE/"
    say "bundle in $BUNDLE ($(du -sh "$BUNDLE" | cut -f1)): on the target run $0 --from $BUNDLE"
}

# --from: copy a bundle into place; no network, no compiler.
if [ -n "$FROM" ]; then
    [ -x "$FROM/bin/criu" ] || die "$FROM/bin/criu is missing: make the bundle with --bundle DIR"
    rm -rf "$PREFIX.new"
    mkdir -p "$PREFIX.new"
    cp -a "$FROM/bin" "$FROM/lib" "$PREFIX.new/"
    cp "$FROM/PATCHES" "$PREFIX.new/PATCHES" 2>/dev/null || say "warning: $FROM has no PATCHES list (a bundle of an unpatched criu)"
    rm -rf "$PREFIX"
    mv "$PREFIX.new" "$PREFIX"
    link_sbin
    "$PREFIX/bin/criu" check || die "$PREFIX/bin/criu was installed but 'criu check' fails on this kernel (output above)"
    say "installed $("$PREFIX/bin/criu" --version | head -1) from $FROM"
    exit 0
fi

if [ "$FORCE" = 0 ] && working "$PREFIX/bin/criu"; then
    say "$PREFIX/bin/criu ($("$PREFIX/bin/criu" --version | head -1)) works: nothing to do"
    link_sbin
    make_bundle
    exit 0
fi

command -v apt-get >/dev/null || die "apt-get not found: build CRIU $CRIU_VERSION by hand, or use --from DIR with a bundle"

missing=""
for p in $BUILD_DEPS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    say "installing build dependencies:$missing"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

work=$(mktemp -d /tmp/install-criu.XXXXXX)
trap 'rm -rf "$work"' EXIT

# A private apt configuration that knows only trixie's sources: the system's
# own sources and lists are left alone.
mkdir -p "$work/lists/partial" "$work/src"
echo "deb-src http://deb.debian.org/debian trixie main" >"$work/sources.list"
APT_PRIVATE="-o Dir::Etc::SourceList=$work/sources.list -o Dir::Etc::SourceParts=/dev/null
 -o Dir::State::Lists=$work/lists -o APT::Sandbox::User=root"
say "fetching $CRIU_ORIG (Debian trixie's source package)"
# shellcheck disable=SC2086
apt-get $APT_PRIVATE update -qq || die "apt-get update of trixie's sources failed (is deb.debian.org reachable?)"
# The .debian.tar.xz part may be missing from the mirror; the orig tarball
# (upstream's) is all we build from, so apt's exit status alone does not decide.
# shellcheck disable=SC2086
(cd "$work/src" && apt-get $APT_PRIVATE source --download-only -qq criu >/dev/null 2>&1) || true
[ -f "$work/src/$CRIU_ORIG" ] || die "apt did not fetch $CRIU_ORIG (trixie may have moved past $CRIU_VERSION)"
sum=$(sha256sum "$work/src/$CRIU_ORIG" | cut -d' ' -f1)
if [ "$sum" != "$CRIU_SHA256" ]; then
    die "$CRIU_ORIG has SHA-256 $sum, expected $CRIU_SHA256: refusing to build it"
fi

tar -C "$work" -xJf "$work/src/$CRIU_ORIG"
srcdir=$(find "$work" -maxdepth 1 -type d -name 'criu-*' | head -1)
[ -n "$srcdir" ] || die "no criu-* directory in $CRIU_ORIG"
[ -d "$PATCH_DIR" ] || die "$PATCH_DIR is missing: run this script from a checkout of slurm-gpu-mode"
for p in "$PATCH_DIR"/*.patch; do
    [ -f "$p" ] || continue
    say "applying $(basename "$p")"
    patch -d "$srcdir" -p1 --forward --quiet <"$p" || die "$(basename "$p") does not apply to criu $CRIU_VERSION"
done
say "building criu in $srcdir (make criu)"
start=$(date +%s)
make -C "$srcdir" -j"$(nproc)" criu >"$work/build.log" 2>&1 || { tail -30 "$work/build.log" >&2; die "make criu failed (last lines above)"; }
say "built in $(( $(date +%s) - start )) s"

# Install: the binary, and every library it loads except glibc's own.
rm -rf "$PREFIX.new"
mkdir -p "$PREFIX.new/bin" "$PREFIX.new/lib"
install -m 0755 "$srcdir/criu/criu" "$PREFIX.new/bin/criu"
strip "$PREFIX.new/bin/criu"
ldd "$PREFIX.new/bin/criu" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | while read -r name path; do
    echo "$name" | grep -Eq "$GLIBC_LIBS" && continue
    cp -L "$path" "$PREFIX.new/lib/$name"
    patchelf --set-rpath '$ORIGIN' "$PREFIX.new/lib/$name"
done
patchelf --set-rpath '$ORIGIN/../lib' "$PREFIX.new/bin/criu"
expected_patches >"$PREFIX.new/PATCHES"
rm -rf "$PREFIX"
mv "$PREFIX.new" "$PREFIX"
link_sbin
"$PREFIX/bin/criu" check || die "$PREFIX/bin/criu was built but 'criu check' fails on this kernel (output above)"
say "installed $("$PREFIX/bin/criu" --version | head -1) in $PREFIX (sha256 of the source: $sum)"
make_bundle
