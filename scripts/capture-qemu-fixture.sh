#!/usr/bin/env bash
# Boots Debian's PREEMPT_RT kernel under QEMU (the end-to-end test's probe
# guest) and captures the /proc and /sys files `deploy verify` reads into a
# directory laid out like / (OUT/proc/..., OUT/sys/...), for tests that point
# --sysroot at it.
#
# Usage: scripts/capture-qemu-fixture.sh OUT [KERNEL CMDLINE TOKENS...]
#
# Without tokens the command line is the one `deploy plan` gives for
# examples/qemu.yaml, as in the end-to-end test. Besides the / tree, OUT holds:
#   _second/proc/{interrupts,stat}  a second sample, one second after proc/...
#   _capture/cgroup-steps.txt       each cgroup2 cpuset write tried, its result
#   _capture/rtdeploy-layout/       cpuset files of rtdeploy/{rt,housekeeping}
#                                   while rt was asked to be an isolated partition
#   _capture/serial.log             the whole serial console (kernel messages)
#   _capture/probe-output.log       the probe's own lines (without the tar)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/e2e/lib.sh
. "$REPO/scripts/e2e/lib.sh"

if [ $# -lt 1 ]; then
    echo "usage: $0 OUT [KERNEL CMDLINE TOKENS...]" >&2
    exit 2
fi
OUT=$1
shift
if [ -e "$OUT" ] && [ -n "$(ls -A "$OUT" 2>/dev/null)" ]; then
    echo "capture-qemu-fixture: $OUT exists and is not empty" >&2
    exit 2
fi
if [ $# -gt 0 ]; then
    TOKENS="$*"
else
    TOKENS=$(e2e_plan_cmdline "$REPO/examples/qemu.yaml") || {
        echo "capture-qemu-fixture: deploy plan failed; give the tokens on the command line" >&2
        exit 2
    }
fi

bash "$REPO/scripts/fetch-rt-kernel.sh"
WORK=$(mktemp -d /tmp/rtdeploy-fixture.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
e2e_base "$WORK/root"
cp "$REPO/scripts/e2e/probe-init.sh" "$WORK/root/init"
touch "$WORK/root/etc/e2e-capture"
e2e_cpio "$WORK/root" "$WORK/probe.cpio.gz"
e2e_log "booting with: console=ttyS0 panic=-1 $TOKENS"
rc=0
e2e_qemu "$E2E_CACHE/rt-kernel/vmlinuz" "$WORK/probe.cpio.gz" "console=ttyS0 panic=-1 $TOKENS" \
    "$WORK/serial.log" "${E2E_BOOT_LIMIT:-300}" || rc=$?
if [ "$rc" != 0 ] || ! e2e_serial_clean "$WORK/serial.log.hvc" | grep -cx 'E2E-FIXTURE-END' >/dev/null; then
    e2e_serial_clean "$WORK/serial.log" >&2
    e2e_serial_clean "$WORK/serial.log.hvc" >&2
    echo "capture-qemu-fixture: the guest did not finish the capture (qemu exit $rc)" >&2
    exit 1
fi
mkdir -p "$OUT"
e2e_fixture_decode "$WORK/serial.log.hvc" "$OUT"
mkdir -p "$OUT/_capture"
e2e_serial_clean "$WORK/serial.log" >"$OUT/_capture/serial.log"
e2e_serial_clean "$WORK/serial.log.hvc" | sed '/^E2E-FIXTURE-BEGIN$/,/^E2E-FIXTURE-END$/{/^E2E-FIXTURE/!d}' >"$OUT/_capture/probe-output.log"
cp "$E2E_CACHE/rt-kernel/package" "$OUT/_capture/kernel-package"
e2e_log "fixture in $OUT ($(find "$OUT" -type f | wc -l) files)"
