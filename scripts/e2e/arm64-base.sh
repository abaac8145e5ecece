#!/usr/bin/env bash
# Builds the Debian arm64 base of the aarch64 end-to-end test, as a board
# vendor's sample root filesystem comes: a tar with systemd, udev and
# openssh-server, the PREEMPT_RT kernel and its initrd under /boot, and an
# extlinux.conf that boots them (LINUX, INITRD, APPEND, as Jetson Linux's
# rootfs ships one). `deploy image` then merges the plan into that file.
#
# Usage: scripts/e2e/arm64-base.sh       (as root on Debian 12; prints the
#                                         directory it made or found)
#
# Result, in $RTDEPLOY_CACHE/arm64-base-<key>/ (key: this script's text and
# the suite, so a change to either builds a new base; a warm run reuses it):
#   rootfs.tar          the base root filesystem
#   u-boot.bin          trixie's u-boot-qemu qemu_arm64 build (-bios)
#   kernel-release      uname -r of the kernel under /boot
#   ssh/id_ed25519      the key the test logs in with (root's authorized key)
#
# How, and why this way:
# - mmdebstrap --architectures=arm64 runs the packages' scripts under
#   qemu-user (binfmt_misc, registered here when missing);
# - the kernel package is unpacked on the host (dpkg-deb -x) and depmod
#   runs on the host, instead of installing it in the emulated chroot,
#   where initramfs-tools takes over ten minutes to build its image; the
#   initrd is ours instead, a busybox that loads the modules the root
#   device needs (virtio-blk, ext4: modules in Debian's kernel) and
#   switches to the root filesystem, as Jetson Linux's own initrd does;
#   it honours `init=`, and reboots when the root cannot be mounted (a
#   wrong `root=` is then one boot attempt, never a shell nobody sees);
# - the initrd starts the hardware watchdog before user space, as a
#   board's firmware or initramfs does: QEMU's i6300esb (`-device
#   i6300esb`), its driver loaded with nowayout and a heartbeat of
#   WATCHDOG_S seconds, opened once and left running. A boot has that
#   long until the supervisor opens it, sets robot.yaml's timeout and
#   feeds it; one that hangs before (an `init=` that never starts user
#   space, a driver) is reset. WATCHDOG_S covers the boot here (systemd
#   under TCG: the supervisor's start-up done and the login prompt about
#   40 s after the kernel started, 63 s at the slowest seen) with about
#   twice that as the margin;
# - the disk is a FAT boot partition (1: the boot-attempts script and its
#   state, which `deploy image` puts in /usr/lib/rtdeploy/boot-partition;
#   mounted at /boot/rtboot) before the root file system (2: /dev/vda2);
# - the network is configured by a unit of the base with a fixed address
#   (QEMU's user network: 10.0.2.15/24, gateway 10.0.2.2), no DHCP wait.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CACHE=${RTDEPLOY_CACHE:-/var/cache/rtdeploy}
SUITE=trixie
MIRROR=${RTDEPLOY_DEBIAN_MIRROR:-http://deb.debian.org/debian}
PACKAGES=(systemd-sysv udev openssh-server kmod iproute2 procps)
WATCHDOG_S=120

log() { printf '[arm64-base %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() {
    log "$*"
    exit 2
}

KEY=$( (cat "${BASH_SOURCE[0]}"; printf '%s\n' "$SUITE" "${PACKAGES[@]}" "$WATCHDOG_S") | sha256sum | cut -c1-16)
OUT=$CACHE/arm64-base-$KEY
if [ -e "$OUT/.complete" ]; then
    log "cached: $OUT ($(cat "$OUT/kernel-release"))"
    echo "$OUT"
    exit 0
fi

need=()
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
command -v arch-test >/dev/null || need+=(arch-test)
[ -x /usr/libexec/qemu-binfmt/aarch64-binfmt-P ] || need+=(qemu-user-static)
command -v depmod >/dev/null || need+=(kmod)
command -v ssh-keygen >/dev/null || need+=(openssh-client)
command -v cpio >/dev/null || need+=(cpio)
command -v xz >/dev/null || need+=(xz-utils)
if ((${#need[@]})); then
    log "installing ${need[*]}"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; } ||
        die "cannot install ${need[*]}"
fi

# binfmt_misc: mounted, and aarch64 ELF files run by qemu-user.
if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc || die "cannot mount binfmt_misc"
fi
if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
    conf=/usr/lib/binfmt.d/qemu-aarch64.conf
    [ -s "$conf" ] || die "no $conf (qemu-user-static)"
    cat "$conf" >/proc/sys/fs/binfmt_misc/register || die "cannot register qemu-aarch64 with binfmt_misc"
fi
grep -qx enabled /proc/sys/fs/binfmt_misc/qemu-aarch64 || die "binfmt_misc: qemu-aarch64 is not enabled"

mkdir -p "$CACHE"
TMP=$(mktemp -d "$CACHE/.arm64-base.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$TMP/out/ssh"
ssh-keygen -q -t ed25519 -N '' -C rtdeploy-e2e -f "$TMP/out/ssh/id_ed25519"

# The customize hook runs on the host with the new root as $1.
cat >"$TMP/hook.sh" <<'HOOK'
#!/bin/sh
set -eu
root=$1 tmp=$2 watchdog_s=$3
# 1. the kernel: the rt flavour's unsigned image, unpacked, depmod on the host
meta=$(chroot "$root" apt-cache depends linux-image-rt-arm64 | sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*-rt-arm64\)$/\1/p' | head -n1)
[ -n "$meta" ] || { echo "hook: no linux-image-*-rt-arm64 in linux-image-rt-arm64's dependencies" >&2; exit 1; }
mkdir -p "$tmp/debs"
chroot "$root" sh -c "cd /tmp && apt-get download -q ${meta}-unsigned busybox-static u-boot-qemu" >&2
mv "$root"/tmp/*.deb "$tmp/debs/"
dpkg-deb -x "$tmp/debs/${meta}-unsigned_"*.deb "$root"
kver=$(ls "$root/usr/lib/modules" | head -n1)
echo "$kver" >"$tmp/out/kernel-release"
depmod -b "$root" "$kver"
cp "$root/boot/vmlinuz-$kver" "$root/boot/Image"
grep -q '^CONFIG_PREEMPT_RT=y' "$root/boot/config-$kver" || { echo "hook: $kver is not PREEMPT_RT" >&2; exit 1; }
# 2. U-Boot for QEMU's virt machine
mkdir -p "$tmp/uboot"
dpkg-deb -x "$tmp/debs/"u-boot-qemu_*.deb "$tmp/uboot"
cp "$tmp/uboot/usr/lib/u-boot/qemu_arm64/u-boot.bin" "$tmp/out/u-boot.bin"
# 3. the initrd: busybox, the root device's modules (in dependency order,
#    uncompressed for busybox insmod), an init that mounts root= and
#    switches to it
ird=$tmp/initrd
mkdir -p "$ird/bin" "$ird/proc" "$ird/sys" "$ird/dev" "$ird/newroot" "$ird/lib/modules" "$tmp/bb"
dpkg-deb -x "$tmp/debs/"busybox-static_*.deb "$tmp/bb"
cp "$tmp/bb/usr/bin/busybox" "$ird/bin/busybox"
# initrd_modules LIST MODULE...: MODULE and what it needs, in loading
# order, into the initrd's lib/modules (uncompressed), their names into
# the file LIST.
initrd_modules() {
    list=$1
    shift
    modprobe -a -d "$root" -S "$kver" --show-depends "$@" |
        awk '$1 == "insmod" { print $2 }' | awk '!seen[$0]++' >"$tmp/mods"
    [ -s "$tmp/mods" ] || { echo "hook: no module $* in $kver" >&2; exit 1; }
    : >"$list"
    while read -r m; do
        b=${m##*/}
        b=${b%.xz}
        b=${b%.zst}
        case $m in
        *.xz) xz -dc "$m" >"$ird/lib/modules/$b" ;;
        *.zst) zstd -qdc "$m" >"$ird/lib/modules/$b" ;;
        *) cp "$m" "$ird/lib/modules/$b" ;;
        esac
        echo "$b" >>"$list"
    done <"$tmp/mods"
}
initrd_modules "$ird/modules" virtio_mmio virtio_pci virtio_blk ext4
# The watchdog's driver and what it needs, loaded apart (with its
# parameters).
initrd_modules "$ird/watchdog" i6300esb
echo "$watchdog_s" >"$ird/watchdog-seconds"
cat >"$ird/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in $(cat /modules); do
    insmod "/lib/modules/$m" 2>/dev/null || echo "initrd: insmod $m failed"
done
# The watchdog, started here and left running (nowayout: only a reset
# stops it): user space has its heartbeat to open and feed it.
hb=$(cat /watchdog-seconds)
for m in $(cat /watchdog); do
    case $m in i6300esb.ko) arg="nowayout=1 heartbeat=$hb" ;; *) arg= ;; esac
    # shellcheck disable=SC2086
    insmod "/lib/modules/$m" $arg 2>/dev/null || echo "initrd: insmod $m failed"
done
i=0
while [ ! -c /dev/watchdog ] && [ $i -lt 50 ]; do
    sleep 0.1
    i=$((i + 1))
done
if [ -c /dev/watchdog ] && : >/dev/watchdog; then
    echo "initrd: watchdog started: ${hb}s until user space feeds it"
else
    echo "initrd: no watchdog (no i6300esb device): a boot that hangs is not reset"
fi
root=
init=/sbin/init
for t in $(cat /proc/cmdline); do
    case $t in
    root=*) root=${t#root=} ;;
    init=*) init=${t#init=} ;;
    esac
done
i=0
while [ -n "$root" ] && [ ! -b "$root" ] && [ $i -lt 200 ]; do
    sleep 0.1
    i=$((i + 1))
done
if ! mount -t ext4 -o rw,noatime "$root" /newroot; then
    # A boot attempt that failed: the boot loader counts it.
    echo "initrd: cannot mount root=$root; rebooting"
    sleep 5
    reboot -f
fi
umount /proc /sys
mount --move /dev /newroot/dev
echo "initrd: starting $init"
exec switch_root /newroot "$init"
INIT
chmod 755 "$ird/init" "$ird/bin/busybox"
(cd "$ird" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) | gzip -n -6 >"$root/boot/initrd"
# 4. the boot loader's file, as a vendor rootfs ships it
mkdir -p "$root/boot/extlinux"
cat >"$root/boot/extlinux/extlinux.conf" <<'EXT'
TIMEOUT 30
DEFAULT primary

MENU TITLE rtdeploy arm64 test boot options

LABEL primary
      MENU LABEL primary kernel
      LINUX /boot/Image
      INITRD /boot/initrd
      APPEND root=/dev/vda2 rw rootwait console=ttyAMA0 net.ifnames=0
EXT
# 5. the system around it
echo rtdeploy-arm64 >"$root/etc/hostname"
# The boot partition's device may wait: under emulation, udev's coldplug
# after a watchdog reset took 28 s, and a 30 s timeout left the supervisor
# reading an empty mount point (the boot loader's count unread). nofail:
# a partition that never comes leaves the boot going, the supervisor
# saying so.
printf '/dev/vda2 / ext4 rw,noatime 0 0\n/dev/vda1 /boot/rtboot vfat rw,noatime,nofail,x-systemd.device-timeout=150s 0 0\n' >"$root/etc/fstab"
mkdir -p "$root/boot/rtboot"
# An init that never starts user space: a system update whose command
# line names it (init=) hangs its boot until the watchdog resets it.
mkdir -p "$root/usr/lib/rtdeploy-e2e"
cat >"$root/usr/lib/rtdeploy-e2e/hang" <<'HANG'
#!/bin/sh
echo "hang: an init that never starts user space (the watchdog resets the machine)"
exec sleep infinity
HANG
chmod 755 "$root/usr/lib/rtdeploy-e2e/hang"
mkdir -p "$root/root/.ssh"
chmod 700 "$root/root/.ssh"
cp "$tmp/out/ssh/id_ed25519.pub" "$root/root/.ssh/authorized_keys"
chmod 600 "$root/root/.ssh/authorized_keys"
cat >"$root/etc/systemd/system/e2e-net.service" <<'UNIT'
[Unit]
Description=Network for the end-to-end test (QEMU user network, fixed address)
Before=ssh.service network.target
Wants=network.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'for i in $(seq 1 300); do [ -e /sys/class/net/eth0 ] && break; sleep 0.1; done; ip link set lo up; ip link set eth0 up && ip addr add 10.0.2.15/24 dev eth0 && ip route add default via 10.0.2.2'

[Install]
WantedBy=multi-user.target
UNIT
ln -sf /etc/systemd/system/e2e-net.service "$root/etc/systemd/system/multi-user.target.wants/e2e-net.service"
# Timers nobody needs in a test boot under emulation.
for u in apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer fstrim.timer; do
    ln -sf /dev/null "$root/etc/systemd/system/$u"
done
rm -f "$root/etc/machine-id" && : >"$root/etc/machine-id"
HOOK
chmod 755 "$TMP/hook.sh"

log "mmdebstrap $SUITE arm64 (${PACKAGES[*]}): several minutes, the packages' scripts run under qemu-user"
inc=$(IFS=,; echo "${PACKAGES[*]}")
timeout 2400 mmdebstrap --quiet --variant=minbase --architectures=arm64 --include="$inc" \
    --customize-hook="$TMP/hook.sh \"\$1\" $TMP $WATCHDOG_S" \
    "$SUITE" "$TMP/out/rootfs.tar" "$MIRROR" || die "mmdebstrap failed"
for f in rootfs.tar u-boot.bin kernel-release; do
    [ -s "$TMP/out/$f" ] || die "the base has no $f"
done
rm -rf "$OUT"
mv "$TMP/out" "$OUT"
touch "$OUT/.complete"
log "made $OUT ($(cat "$OUT/kernel-release"), $(du -h "$OUT/rootfs.tar" | cut -f1))"
echo "$OUT"
