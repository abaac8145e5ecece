#!/usr/bin/env bash
# A small bootable base root filesystem to try `deploy image` with: Debian
# trixie for this machine's architecture, made by mmdebstrap, with systemd,
# udev, kmod, the PREEMPT_RT kernel (linux-image-rt-<arch>) and the initrd
# its package builds, under /boot. For a Jetson, use NVIDIA's sample root
# filesystem of the board's Jetson Linux release instead (the README says
# where); for an arm64 base on an x86_64 machine, the end-to-end test's
# scripts/e2e/arm64-base.sh.
#
# Usage: scripts/make-base.sh OUT.tar
#
# As root mmdebstrap runs as root; as a user it needs user namespaces and
# newuidmap (`--mode=unshare`, Debian's uidmap package). It downloads the
# packages from RTDEPLOY_DEBIAN_MIRROR (default deb.debian.org).
#
# Exit status: 0 written; 2 cannot (no mmdebstrap, a failed download).
set -euo pipefail

out=${1:?usage: scripts/make-base.sh OUT.tar}
mirror=${RTDEPLOY_DEBIAN_MIRROR:-http://deb.debian.org/debian}
command -v mmdebstrap >/dev/null || {
    echo "make-base: mmdebstrap is not installed (Debian: apt install mmdebstrap)" >&2
    exit 2
}
arch=$(dpkg --print-architecture 2>/dev/null || uname -m)
case $arch in
    amd64 | x86_64) arch=amd64 ;;
    arm64 | aarch64) arch=arm64 ;;
    *) echo "make-base: no PREEMPT_RT kernel package for $arch" >&2; exit 2 ;;
esac
mode=auto
[[ $(id -u) == 0 ]] || mode=unshare
start=$SECONDS
mmdebstrap --mode="$mode" --variant=apt --architectures="$arch" \
    --include=systemd-sysv,udev,kmod,iproute2,procps,"linux-image-rt-$arch" \
    trixie "$out" "$mirror" || {
    echo "make-base: mmdebstrap failed (see above)" >&2
    exit 2
}
echo "make-base: $out ($(du -h "$out" | cut -f1), Debian trixie $arch, kernel $(tar -tf "$out" | sed -n 's|^\./boot/vmlinuz-||p' | head -n1)) in $((SECONDS - start))s"
