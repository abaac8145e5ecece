#!/usr/bin/env bash
# Fetch Debian trixie's PREEMPT_RT kernel (linux-image-6.12.*-rt-amd64-unsigned)
# into a cache directory, for the QEMU end-to-end test.
#
# Usage: scripts/fetch-rt-kernel.sh [--print-dir]
#
# RTDEPLOY_KERNEL_SERIES=5.10 fetches bullseye's 5.10 PREEMPT_RT kernel
# instead (linux-image-5.10.*-rt-amd64-unsigned: the series of JetPack 5,
# with neither io_uring futex waits nor futex_waitv) into rt-kernel-5.10.
#
# Cache: $RTDEPLOY_CACHE/rt-kernel (default <repo>/.cache/rt-kernel). When the
# cache already holds an extracted kernel nothing touches the network.
# Result, in the cache directory:
#   vmlinuz       the kernel image
#   config        the kernel's build configuration
#   modules/      modules.builtin* of the package, plus the loadable modules
#                 named in $RTDEPLOY_KERNEL_MODULES (space-separated, e.g.
#                 "e1000 ext4"; default none: serial 8250 console, virtio-pci,
#                 virtio-console, tmpfs, gzip initramfs, cgroups/cpusets and
#                 io_uring are all built into Debian's kernel, so an initramfs
#                 boot needs no module)
#   watchdog/     the hardware watchdog's driver for QEMU (i6300esb) and the
#                 modules it needs, uncompressed (busybox's insmod loads
#                 them), and `order`: their file names in loading order
#   release       the kernel release string (uname -r)
#   package       the package file name it came from
#
# Also installs qemu-system-x86, busybox-static, cpio and binutils when they are
# missing (apt-get, needs root).
#
# Why trixie: io_uring futex operations (IORING_OP_FUTEX_WAIT) arrived in 6.7;
# bookworm's 6.1-rt lacks them.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE_ROOT=${RTDEPLOY_CACHE:-$REPO/.cache}
SERIES=${RTDEPLOY_KERNEL_SERIES:-}
case $SERIES in
'') DIR=$CACHE_ROOT/rt-kernel DEFAULT_SUITE=trixie
    PKG_RE='^linux-image-6\.(1[2-9]|[2-9][0-9])\.[^ ]*-rt-amd64-unsigned$' ;;
5.10) DIR=$CACHE_ROOT/rt-kernel-5.10 DEFAULT_SUITE=bullseye
    PKG_RE='^linux-image-5\.10\.[^ ]*-rt-amd64-unsigned$' ;;
*) echo "fetch-rt-kernel: RTDEPLOY_KERNEL_SERIES=$SERIES: only 5.10 (or unset)" >&2
    exit 2 ;;
esac
# The Debian archive this machine's apt already uses (deb822 `URIs:` or
# one-line `deb` entries), not the security archive.
system_mirror() {
    local uri
    uri=$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources |
        awk '{for (i = 2; i <= NF; i++) print $i}' | grep -v -- '-security' | head -n1)
    if [ -z "$uri" ]; then
        uri=$(grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list |
            awk '{for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; break}}' |
            grep -v -- '-security' | head -n1)
    fi
    printf '%s' "$uri"
}
MIRROR=${RTDEPLOY_DEBIAN_MIRROR:-$(system_mirror)}
SUITE=${RTDEPLOY_KERNEL_SUITE:-$DEFAULT_SUITE}

log() { printf 'fetch-rt-kernel: %s\n' "$*" >&2; }

if [ -z "$MIRROR" ]; then
    log "no Debian archive in this machine's apt sources: set RTDEPLOY_DEBIAN_MIRROR"
    exit 2
fi

# Host tools the end-to-end test needs: qemu-system-x86, busybox-static
# (the dynamic busybox would not run in the guest), cpio, dpkg-deb,
# binutils (strip).
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v cpio >/dev/null || need+=(cpio)
command -v dpkg-deb >/dev/null || need+=(dpkg)
command -v strip >/dev/null || need+=(binutils)
command -v depmod >/dev/null || need+=(kmod)
command -v xz >/dev/null || need+=(xz-utils)
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -c 'ok installed' >/dev/null || need+=(busybox-static)
if [ "${#need[@]}" -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        log "missing host packages: ${need[*]} (apt-get install ${need[*]}, or run as root)"
        exit 2
    fi
    log "installing ${need[*]}"
    { DEBIAN_FRONTEND=noninteractive apt-get update -q >&2 &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >&2; } || exit 2
fi

if [ -s "$DIR/vmlinuz" ] && [ -s "$DIR/release" ] && [ -d "$DIR/modules" ] && [ -s "$DIR/watchdog/order" ]; then
    log "cached: $(cat "$DIR/package") in $DIR"
    [ "${1:-}" = --print-dir ] && echo "$DIR"
    exit 0
fi

mkdir -p "$CACHE_ROOT"
WORK=$(mktemp -d "$CACHE_ROOT/.rt-kernel-fetch.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/etc/sources.list.d" "$WORK/etc/preferences.d" "$WORK/state/lists/partial" \
    "$WORK/cache/archives/partial" "$WORK/dl" "$WORK/x"
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
if [ ! -s "$KEYRING" ]; then
    log "no $KEYRING: apt-get install debian-archive-keyring"
    exit 2
fi
echo "deb [signed-by=$KEYRING] $MIRROR $SUITE main" >"$WORK/etc/sources.list"
: >"$WORK/state/status"
APT_OPTS=(
    -o "Dir::Etc::sourcelist=$WORK/etc/sources.list"
    -o "Dir::Etc::sourceparts=$WORK/etc/sources.list.d"
    -o "Dir::Etc::preferencesparts=$WORK/etc/preferences.d"
    -o "Dir::State=$WORK/state"
    -o "Dir::State::status=$WORK/state/status"
    -o "Dir::Cache=$WORK/cache"
    -o "APT::Architecture=amd64"
    -o "APT::Architectures::=amd64"
    -o "Acquire::Languages=none"
    -o "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false"
    -o "Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false"
    -o "Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled=false"
    -o "APT::Sandbox::User=root"
)
log "apt-get update ($SUITE main, private state)"
apt-get "${APT_OPTS[@]}" update -q >&2
PKG=$(apt-cache "${APT_OPTS[@]}" pkgnames linux-image- | grep -E "$PKG_RE" | sort -V | tail -n1 || true)
if [ -z "$PKG" ]; then
    log "no package matching $PKG_RE in $SUITE"
    exit 2
fi
log "downloading $PKG"
(cd "$WORK/dl" && apt-get "${APT_OPTS[@]}" download -q "$PKG" >&2)
DEB=$(ls "$WORK/dl"/*.deb)
dpkg-deb -x "$DEB" "$WORK/x"
VMLINUZ=$(find "$WORK/x/boot" -name "vmlinuz-*" | head -n1)
REL=${VMLINUZ##*/vmlinuz-}
mkdir -p "$WORK/out"
cp "$VMLINUZ" "$WORK/out/vmlinuz"
cp "$WORK/x/boot/config-$REL" "$WORK/out/config"
MODSRC=
for d in "$WORK/x/lib/modules/$REL" "$WORK/x/usr/lib/modules/$REL"; do
    [ -d "$d" ] && MODSRC=$d
done
mkdir "$WORK/out/modules"
if [ -n "$MODSRC" ]; then
    cp "$MODSRC"/modules.builtin* "$MODSRC"/modules.order "$WORK/out/modules/" 2>/dev/null || true
    for m in ${RTDEPLOY_KERNEL_MODULES:-}; do
        f=$(find "$MODSRC/kernel" -name "$m.ko*" | head -n1)
        if [ -z "$f" ]; then
            log "module $m not in $PKG"
            exit 2
        fi
        mkdir -p "$WORK/out/modules/$(dirname "${f#"$MODSRC"/}")"
        cp "$f" "$WORK/out/modules/${f#"$MODSRC"/}"
    done
fi
# The watchdog's driver, after the modules it depends on (modules.dep
# lists a module's dependencies, the one to load first last).
mkdir "$WORK/out/watchdog"
# The package ships no modules.dep (depmod makes it at install): made
# here, on the unpacked tree (/lib is /usr/lib there).
[ -n "$MODSRC" ] || {
    log "$PKG has no modules: cannot find the watchdog's driver"
    exit 2
}
command -v depmod >/dev/null || {
    log "no depmod (apt-get install kmod)"
    exit 2
}
[ -e "$WORK/x/lib" ] || ln -s usr/lib "$WORK/x/lib"
depmod -b "$WORK/x" "$REL" || {
    log "depmod failed on $PKG"
    exit 2
}
line=$(grep -E '(^|/)i6300esb\.ko(\.xz|\.zst|\.gz)?:' "$MODSRC/modules.dep" | head -n1)
if [ -z "$line" ]; then
    log "$PKG has no i6300esb module (QEMU's watchdog)"
    exit 2
fi
deps=$(echo "${line#*:}" | tr ' ' '\n' | sed '/^$/d' | tac)
for rel in $deps "${line%%:*}"; do
    b=${rel##*/}
    b=${b%.xz}
    b=${b%.zst}
    b=${b%.gz}
    case $rel in
    *.xz) xz -dc "$MODSRC/$rel" >"$WORK/out/watchdog/$b" ;;
    *.zst) zstd -qdc "$MODSRC/$rel" >"$WORK/out/watchdog/$b" ;;
    *.gz) gzip -dc "$MODSRC/$rel" >"$WORK/out/watchdog/$b" ;;
    *) cp "$MODSRC/$rel" "$WORK/out/watchdog/$b" ;;
    esac
    echo "$b" >>"$WORK/out/watchdog/order"
done
echo "$REL" >"$WORK/out/release"
basename "$DEB" >"$WORK/out/package"
sha256sum "$DEB" | sed 's,  .*/,  ,' >"$WORK/out/package.sha256"
if ! grep -q '^CONFIG_PREEMPT_RT=y' "$WORK/out/config"; then
    log "$PKG is not a PREEMPT_RT kernel (no CONFIG_PREEMPT_RT=y)"
    exit 2
fi
rm -rf "$DIR"
mv "$WORK/out" "$DIR"
log "cached $PKG ($REL) in $DIR"
[ "${1:-}" = --print-dir ] && echo "$DIR"
exit 0
