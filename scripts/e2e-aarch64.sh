#!/usr/bin/env bash
# End-to-end test on aarch64, the Jetson's architecture, along the real boot
# path: U-Boot reads the extlinux.conf `deploy image` wrote into an ext4 root
# filesystem on a GPT disk, boots Debian's arm64 PREEMPT_RT kernel with its
# APPEND line, systemd starts rtdeploy.service, and the host talks to the
# guest over ssh as it would to a robot.
#
# Usage: scripts/e2e-aarch64.sh     (as root on Debian 12; installs what it needs)
#
# Boots (QEMU virt machine, -cpu max, 4 CPUs, TCG: no KVM; no -kernel and no
# -append: U-Boot as -bios finds everything on the disk):
#   1. the image: command line, systemd unit (READY=1, watchdog), the CPU
#      plan and `deploy verify`, the controllers on their planned policy,
#      priority and CPUs on the doorbell backend (real-time processes), `deploy status`, a field
#      update with `deploy update --host` over ssh (trial -> committed) and a
#      crashing release that rolls back by itself; then a system update
#      (2.): release 4 isolates CPUs 1-3 and moves the talker from CPU 2 to
#      CPU 1, `deploy update --reboot` installs it (a new extlinux.conf
#      label made DEFAULT) and reboots the guest, which comes up with the
#      new command line, the new plan applied and verified, and the trial
#      committed; the runtime's unit, channel and event-loop test suites,
#      built for aarch64, then run in the guest;
#   3. the fallback labels: autoboot interrupted at U-Boot's prompt,
#      `setenv pxe_label_override rtdeploy-original; boot`: the kernel gets
#      the base's original command line; the same with the image's own
#      label, kept by the system update: release 1's plan's line;
#   4. bad input: a disk whose extlinux.conf names a kernel that is not
#      there: the boot fails within its time limit with the console shown.
#
# Inputs (built here when missing; each cached, keyed by content):
#   scripts/build-aarch64.sh --tests   aarch64 deploy, talker, listener, tests
#   scripts/e2e/arm64-base.sh          the Debian arm64 base (rootfs.tar,
#                                      u-boot.bin, the ssh key)
#   x86_64 deploy (host side: plan, keygen, bundle, image, update), built
#   into $E2E_TARGET_DIR as scripts/e2e-qemu.sh builds it.
#
# Environment:
#   RTDEPLOY_CACHE     cache directory (default /var/cache/rtdeploy)
#   E2E_TARGET_DIR     cargo target directory for the host build
#   E2E_KEEP=1         keep the work directory (serial logs, disk) and say where
#   E2E_BOOT_LIMIT     seconds a boot may take to reach ssh (default 600)
#   E2E_ARM64_BASE     a base directory laid out as arm64-base.sh makes it,
#                      used instead of building or finding one
#
# Every assertion prints PASS or FAIL. Exit status: 0 when none failed, 1
# when one did, 2 on a setup error. On failure the serial console of the
# failing boot is printed.
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export RTDEPLOY_CACHE=${RTDEPLOY_CACHE:-/var/cache/rtdeploy}
export E2E_TARGET_DIR=${E2E_TARGET_DIR:-$RTDEPLOY_CACHE/target-e2e}
BOOT_LIMIT=${E2E_BOOT_LIMIT:-600}
OUTA=${RTDEPLOY_AARCH64_OUT:-$REPO/target-aarch64}
TRIPLE=x86_64-unknown-linux-gnu
WORK=$(mktemp -d /tmp/rtdeploy-e2e-arm64.XXXXXX)
QEMU_PID=
cleanup() {
    [ -n "$QEMU_PID" ] && kill "$QEMU_PID" 2>/dev/null
    if [ "${E2E_KEEP:-0}" = 1 ]; then
        log "work directory kept: $WORK"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT

log() { printf '[e2e-aarch64 %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
N_PASS=0 N_FAIL=0
FAILED_LOGS=()
pass() { N_PASS=$((N_PASS + 1)); printf 'PASS: %s\n' "$1"; }
fail() {
    N_FAIL=$((N_FAIL + 1))
    printf 'FAIL: %s: %s\n' "$1" "$2"
    [ -n "${3:-}" ] && log_failed "$3"
}
log_failed() {
    local l
    for l in "${FAILED_LOGS[@]}"; do [ "$l" = "$1" ] && return; done
    FAILED_LOGS+=("$1")
}
check() { if [ "$2" = "$3" ]; then pass "$1 ($3)"; else fail "$1" "expected '$2', got '$3'" "${4:-}"; fi; }

PHASES=()
now_ms() { echo $(($(date +%s%N) / 1000000)); }
secs() { printf '%d.%d' $(($1 / 1000)) $((($1 % 1000) / 100)); }
# missing_tokens LINE TOKENS: the words of TOKENS that LINE lacks.
missing_tokens() {
    local t out=''
    for t in $2; do
        case " $1 " in *" $t "*) ;; *) out="$out $t" ;; esac
    done
    printf '%s' "$out"
}
T0=$(now_ms)
phase_start() { PHASE_NAME=$1; PHASE_T=$(now_ms); log "phase $1"; }
phase_end() { PHASES+=("$(printf '%-44s %7s s' "$PHASE_NAME" "$(secs $(($(now_ms) - PHASE_T)))")"); }

finish() {
    local l
    [ -n "$QEMU_PID" ] && kill "$QEMU_PID" 2>/dev/null
    for l in "${FAILED_LOGS[@]}"; do
        printf '\n===== serial console %s =====\n' "${l##*/}"
        tr -d '\r' <"$l" | tail -n 300
        printf '===== end of %s =====\n' "${l##*/}"
        [ -s "$l.qemu" ] && { printf '===== qemu output =====\n'; cat "$l.qemu"; }
    done
    printf '\nphase timings:\n'
    printf '  %s\n' "${PHASES[@]}"
    printf '  %-44s %7s s\n' total "$(secs $(($(now_ms) - T0)))"
    printf 'e2e-aarch64: %d passed, %d failed\n' "$N_PASS" "$N_FAIL"
    [ "$N_FAIL" -eq 0 ] || exit 1
    exit 0
}
setup_failed() {
    fail "$1" "$2"
    finish
}

# ------------------------------------------------------------ host tools
phase_start "host tools"
need=()
command -v qemu-system-aarch64 >/dev/null || need+=(qemu-system-arm)
command -v sfdisk >/dev/null || need+=(fdisk)
command -v ssh >/dev/null || need+=(openssh-client)
command -v jq >/dev/null || need+=(jq)
command -v python3 >/dev/null || need+=(python3)
if ((${#need[@]})); then
    log "installing ${need[*]}"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; } ||
        { log "cannot install ${need[*]}"; exit 2; }
fi
phase_end

# ---------------------------------------------------------------- builds
phase_start "aarch64 build (deploy, controllers, tests)"
if RTDEPLOY_AARCH64_OUT=$OUTA bash "$REPO/scripts/build-aarch64.sh" --tests >"$WORK/build-aarch64.log" 2>&1; then
    pass "deploy, talker, listener and the runtime's tests build for aarch64 ($(tail -n1 "$WORK/build-aarch64.log" | sed 's/^\[[^]]*\] //'))"
else
    tail -n 40 "$WORK/build-aarch64.log"
    setup_failed "aarch64 build" "scripts/build-aarch64.sh failed (above)"
fi
phase_end

phase_start "host deploy (x86_64)"
if (cd "$REPO" && RUSTFLAGS='-C target-feature=+crt-static' CARGO_TARGET_DIR=$E2E_TARGET_DIR \
    cargo build -q --release --locked --target $TRIPLE -p deploy --bin deploy) >"$WORK/build-host.log" 2>&1; then
    DEPLOY=$E2E_TARGET_DIR/$TRIPLE/release/deploy
else
    tail -n 40 "$WORK/build-host.log"
    setup_failed "host deploy" "cargo build failed (above)"
fi
phase_end

phase_start "arm64 base (mmdebstrap, cached)"
if [ -n "${E2E_ARM64_BASE:-}" ]; then
    BASE=$E2E_ARM64_BASE
else
    BASE=$(bash "$REPO/scripts/e2e/arm64-base.sh" 2>"$WORK/base.log" | tail -n1)
fi
if [ -z "$BASE" ] || [ ! -e "$BASE/.complete" ]; then
    cat "$WORK/base.log"
    setup_failed "arm64 base root filesystem" "scripts/e2e/arm64-base.sh failed (above)"
fi
KREL=$(cat "$BASE/kernel-release")
pass "Debian arm64 base with systemd, openssh-server and $KREL ($(du -h "$BASE/rootfs.tar" | cut -f1))"
phase_end

# ----------------------------------------------------------------- plan
phase_start "plan, keys, releases, image, disk"
KEY=$WORK/key
"$DEPLOY" -q keygen --out "$KEY" >/dev/null || setup_failed "deploy keygen" "failed"
CONFIG=$WORK/robot.yaml
# The example, trusting the key the releases are signed with (its update:
# section is last).
cp "$REPO/examples/qemu-aarch64.yaml" "$CONFIG"
printf '  public_keys: ["%s"]\n' "$(tr -d ' \n' <"$KEY.pub")" >>"$CONFIG"
"$DEPLOY" config check -c "$CONFIG" >"$WORK/config.log" 2>&1 || setup_failed "deploy config" "$(cat "$WORK/config.log")"
PLAN_JSON=$("$DEPLOY" plan -c "$CONFIG" --json 2>"$WORK/plan.err") || setup_failed "deploy plan" "$(cat "$WORK/plan.err")"
PLAN_CMDLINE=$(jq -r '.cmdline.line' <<<"$PLAN_JSON")
PLAN_ISOLATED=$(jq -r '.cpus.isolated' <<<"$PLAN_JSON")
ORIG_APPEND=$(tar -xOf "$BASE/rootfs.tar" ./boot/extlinux/extlinux.conf | sed -n 's/^[[:space:]]*APPEND[[:space:]]*//p' | head -n1)

# release DIR VERSION [crash]: a release directory with the aarch64
# controllers; with `crash`, a talker that exits at once. A bundle's
# release carries its robot.yaml (`deploy image` writes the image's own).
release() {
    local dir=$1
    mkdir -p "$dir/bin"
    cp "$OUTA/listener" "$dir/bin/listener"
    if [ "${3:-}" = crash ]; then
        printf '#!/bin/sh\necho "talker: release %s crashes on purpose" >&2\nexit 3\n' "$2" >"$dir/bin/talker"
        chmod 755 "$dir/bin/talker"
    else
        cp "$OUTA/talker" "$dir/bin/talker"
    fi
}
release "$WORK/r1" 1
release "$WORK/r2" 2
release "$WORK/r3" 3 crash
release "$WORK/r4" 4
# Release 4 is a system update: CPUs 1-3 isolated (a new kernel command
# line) and the talker moved from CPU 2 to CPU 1.
CONFIG4=$WORK/robot4.yaml
sed -e 's/^  housekeeping: 0-1$/  housekeeping: 0/' -e 's/^  isolated: 2-3$/  isolated: 1-3/' \
    -e 's/^      cpus: 0-1$/      cpus: 0/' -e 's/^    cpus: 2$/    cpus: 1/' "$CONFIG" >"$CONFIG4"
[ "$(grep -c -E '^  housekeeping: 0$|^  isolated: 1-3$|^      cpus: 0$|^    cpus: 1$' "$CONFIG4")" = 4 ] ||
    setup_failed "release 4's robot.yaml" "the example changed shape: $(diff "$CONFIG" "$CONFIG4")"
for v in 2 3 4; do
    c=$CONFIG
    [ "$v" = 4 ] && c=$CONFIG4
    cp "$c" "$WORK/r$v/robot.yaml"
    "$DEPLOY" -q bundle -c "$c" --release "$WORK/r$v" --version "$v" --key "$KEY" --out "$WORK/v$v.bundle" >/dev/null 2>"$WORK/bundle$v.err" ||
        setup_failed "deploy bundle v$v" "$(cat "$WORK/bundle$v.err")"
done
PLAN4_JSON=$("$DEPLOY" plan -c "$CONFIG4" --json 2>"$WORK/plan4.err") || setup_failed "deploy plan (release 4)" "$(cat "$WORK/plan4.err")"
PLAN4_CMDLINE=$(jq -r '.cmdline.line' <<<"$PLAN4_JSON")

IMG=$WORK/root.ext4
if "$DEPLOY" image -c "$CONFIG" --base "$BASE/rootfs.tar" --release "$WORK/r1" --release-version 1 \
    --deploy-binary "$OUTA/deploy" --format ext4 --size 1536MiB --out "$IMG" >"$WORK/image.log" 2>&1; then
    pass "deploy image --format ext4 on the arm64 base ($(du -h --apparent-size "$IMG" | cut -f1), $(du -h "$IMG" | cut -f1) written)"
else
    cat "$WORK/image.log"
    setup_failed "deploy image --format ext4" "failed (above)"
fi
# The extlinux.conf the image carries: read back with debugfs.
debugfs -R 'cat /boot/extlinux/extlinux.conf' "$IMG" 2>/dev/null >"$WORK/extlinux.conf"
default=$(sed -n 's/^[[:space:]]*DEFAULT[[:space:]]*//p' "$WORK/extlinux.conf" | head -n1)
append_of() {
    awk -v l="$1" '$1 == "LABEL" { on = ($2 == l) } on && $1 == "APPEND" { sub(/^[ \t]*APPEND[ \t]*/, ""); print; exit }' "$WORK/extlinux.conf"
}
missing=$(missing_tokens "$(append_of "$default")" "$PLAN_CMDLINE")
if [ -n "$default" ] && [ -z "$missing" ]; then
    pass "the image's extlinux.conf: DEFAULT $default carries the planned APPEND"
else
    fail "the image's extlinux.conf: the default label carries the planned APPEND" "DEFAULT '$default', missing:$missing ($(cat "$WORK/extlinux.conf"))"
fi
check "the image's extlinux.conf: label rtdeploy-original keeps the base's line" "$ORIG_APPEND" "$(append_of rtdeploy-original)"

# The GPT disk: one Linux partition at 1 MiB holding the ext4 image.
DISK=$WORK/disk.img
img_bytes=$(stat -c %s "$IMG")
truncate -s $((img_bytes + 2 * 1048576)) "$DISK"
printf 'label: gpt\nstart=2048, size=%d, type=0FC63DAF-8483-4772-8E79-3D69D8477DE4, name=rootfs, attrs=LegacyBIOSBootable\n' \
    $((img_bytes / 512)) | sfdisk -q "$DISK" >"$WORK/sfdisk.log" 2>&1 || setup_failed "GPT disk" "$(cat "$WORK/sfdisk.log")"
dd if="$IMG" of="$DISK" bs=4M seek=1M oflag=seek_bytes conv=notrunc,sparse status=none || setup_failed "GPT disk" "dd failed"
rm -f "$IMG"
pass "GPT disk with the image as partition 1 ($(du -h --apparent-size "$DISK" | cut -f1))"
phase_end

# ------------------------------------------------------------ QEMU, ssh
UBOOT=$BASE/u-boot.bin
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
SSH_KEY=$BASE/ssh/id_ed25519
chmod 600 "$SSH_KEY"
SSH_OPTS=(-o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR
    -o ConnectTimeout=10 -o ServerAliveInterval=5 -o ServerAliveCountMax=6 -o IdentityFile="$SSH_KEY" -o Port="$PORT")
# g LIMIT COMMAND: runs COMMAND in the guest as root, within LIMIT seconds.
g() {
    local limit=$1
    shift
    timeout -k 5 "$limit" ssh "${SSH_OPTS[@]}" root@127.0.0.1 "$@"
}
# q LIMIT COMMAND: g for a query (no standard input), tried up to three
# times when ssh itself failed (exit 255) or the limit hit (124): under
# emulation a busy guest can be slow to take a connection.
q() {
    local i rc=0
    for i in 1 2 3; do
        g "$@" </dev/null
        rc=$?
        case $rc in 124 | 255) [ "$i" -lt 3 ] && sleep 5 ;; *) return "$rc" ;; esac
    done
    return "$rc"
}
# qemu_args DISK [NET]: the machine; with NET, a user network with the
# guest's ssh port forwarded to 127.0.0.1:$PORT.
qemu_args() {
    QEMU_ARGS=(qemu-system-aarch64 -M virt -cpu max,pauth-impdef=on -smp 4 -m 2G
        -bios "$UBOOT" -display none -monitor none
        -drive "if=none,id=hd0,file=$1,format=raw" -device virtio-blk-pci,drive=hd0)
    if [ "${2:-}" = net ]; then
        QEMU_ARGS+=(-netdev "user,id=n0,hostfwd=tcp:127.0.0.1:$PORT-:22" -device virtio-net-pci,netdev=n0)
    else
        QEMU_ARGS+=(-nic none)
    fi
}
# wait_ssh LOG LIMIT [OLD_BOOT_ID]: until the guest answers over ssh (and,
# with OLD_BOOT_ID, has booted again), QEMU exits, or LIMIT seconds pass.
wait_ssh() {
    local log=$1 limit=$(($(date +%s) + $2)) id
    while [ "$(date +%s)" -lt "$limit" ]; do
        if ! kill -0 "$QEMU_PID" 2>/dev/null; then
            echo "QEMU exited"
            return 1
        fi
        # grep reads the file itself: under pipefail, `tr | grep -q` fails
        # whenever grep quits early and tr dies of SIGPIPE on a long log.
        if grep -a -q -e 'initrd: cannot mount' -e 'Kernel panic' "$log"; then
            echo "the guest failed to boot: $(tr -d '\r' <"$log" | grep -m1 -e 'initrd: cannot mount' -e 'Kernel panic')"
            return 1
        fi
        id=$(g 15 cat /proc/sys/kernel/random/boot_id 2>/dev/null) && [ -n "$id" ] && [ "$id" != "${3:-}" ] && {
            echo "$id"
            return 0
        }
        sleep 3
    done
    echo "no ssh within $2 s"
    return 1
}

# ------------------------------------------------------ boot 1: the image
phase_start "boot 1: U-Boot -> extlinux -> kernel -> systemd"
LOG1=$WORK/serial-boot.log
: >"$LOG1"
qemu_args "$DISK" net
timeout -k 10 $((BOOT_LIMIT + 1500)) "${QEMU_ARGS[@]}" -serial "file:$LOG1" </dev/null >"$LOG1.qemu" 2>&1 &
QEMU_PID=$!
BOOT_T=$(now_ms)
if ! BOOT_ID=$(wait_ssh "$LOG1" "$BOOT_LIMIT"); then
    log_failed "$LOG1"
    phase_end
    setup_failed "the guest boots from the disk and answers over ssh" "$BOOT_ID"
fi
pass "U-Boot booted the disk, systemd came up, ssh answers ($(secs $(($(now_ms) - BOOT_T))) s after power-on)"
phase_end

phase_start "boot 1: assertions"
# U-Boot booted our label, from our extlinux.conf.
if grep -a -q "extlinux" "$LOG1"; then
    pass "U-Boot read /boot/extlinux/extlinux.conf ($(tr -d '\r' <"$LOG1" | grep -m1 -i -e 'Retrieving file: /boot/Image' -e 'extlinux' | head -c 120))"
else
    fail "U-Boot read /boot/extlinux/extlinux.conf" "no sign of it on the console" "$LOG1"
fi
CMDLINE=$(q 60 cat /proc/cmdline)
missing=$(missing_tokens "$CMDLINE" "$PLAN_CMDLINE")
if [ -z "$missing" ] && [ -n "$CMDLINE" ]; then
    pass "/proc/cmdline carries every planned token, from extlinux.conf ($CMDLINE)"
else
    fail "/proc/cmdline carries every planned token" "missing:$missing (cmdline: $CMDLINE)" "$LOG1"
fi
check "the kernel is PREEMPT_RT (/sys/kernel/realtime)" 1 "$(q 60 cat /sys/kernel/realtime)" "$LOG1"
check "/sys/devices/system/cpu/isolated equals the plan" "$PLAN_ISOLATED" "$(q 60 cat /sys/devices/system/cpu/isolated)" "$LOG1"
check "uname -m" aarch64 "$(q 60 uname -m)" "$LOG1"

# systemd: the unit reached READY=1 (Type=notify: active, not activating)
# and the watchdog is fed (its timestamp moves; no restart).
unit_state() { q 60 systemctl show rtdeploy.service -p ActiveState -p SubState -p Type -p NRestarts -p WatchdogUSec -p WatchdogTimestampMonotonic; }
limit=$(($(date +%s) + 240))
while :; do
    st=$(unit_state)
    grep -q '^ActiveState=active' <<<"$st" && break
    [ "$(date +%s)" -ge "$limit" ] && break
    sleep 3
done
prop() { sed -n "s/^$1=//p" <<<"$2"; }
if [ "$(prop ActiveState "$st")/$(prop SubState "$st")/$(prop Type "$st")" = active/running/notify ]; then
    pass "systemd: rtdeploy.service is active (Type=notify, READY=1 reached)"
else
    fail "systemd: rtdeploy.service is active (Type=notify, READY=1 reached)" "$(tr '\n' ' ' <<<"$st"); $(q 60 systemctl status --no-pager -n 30 rtdeploy.service)" "$LOG1"
fi
w1=$(prop WatchdogTimestampMonotonic "$st")
sleep 12
st2=$(unit_state)
w2=$(prop WatchdogTimestampMonotonic "$st2")
if [ "$(prop WatchdogUSec "$st2")" != 0 ] && [ -n "$w1" ] && [ -n "$w2" ] && [ "$w2" -gt "$w1" ] &&
    [ "$(prop NRestarts "$st2")" = 0 ] && grep -q '^ActiveState=active' <<<"$st2"; then
    pass "systemd: the watchdog is fed (WatchdogSec $(prop WatchdogUSec "$st2"), last ping moved ${w1} -> ${w2} us, no restart)"
else
    fail "systemd: the watchdog is fed" "$(tr '\n' ' ' <<<"$st2") (before: $w1)" "$LOG1"
fi

# The supervisor's work: plan applied, verify, processes, messages, backend.
wait_running() {
    local limit=$(($(date +%s) + $1)) s
    while [ "$(date +%s)" -lt "$limit" ]; do
        s=$(q 60 deploy --json status 2>/dev/null)
        [ "$(jq -r '[.processes[] | select(.state == "running")] | length' <<<"$s" 2>/dev/null)" = 2 ] && {
            printf '%s\n' "$s"
            return 0
        }
        sleep 3
    done
    printf '%s\n' "$s"
    return 1
}
STATUS=$(wait_running 180) || fail "talker and listener run" "deploy status: $STATUS" "$LOG1"
step=$(jq -c '[.startup[]? | select(.step == "cpu plan")][0] // empty' <<<"$STATUS")
if [ "$(jq -r '.result' <<<"$step" 2>/dev/null)" = ok ]; then
    pass "the supervisor applied the CPU plan ($(jq -r '.detail' <<<"$step"))"
else
    fail "the supervisor applied the CPU plan" "startup step: ${step:-missing}" "$LOG1"
fi
# plan_in_force PLAN_JSON WHOSE: `deploy verify` exits 0 in the guest, and
# each process of PLAN_JSON runs with its policy, priority and CPUs as
# $STATUS read them back from the kernel; WHOSE names the plan.
plan_in_force() {
    local vout name want got
    if vout=$(q 60 deploy verify 2>&1); then
        pass "deploy verify exits 0 in the guest against $2 plan"
    else
        fail "deploy verify exits 0 in the guest against $2 plan" "$vout" "$LOG1"
    fi
    for name in $(jq -r '.processes[].name' <<<"$1"); do
        want=$(jq -c --arg n "$name" '.processes[] | select(.name == $n) | {policy, priority, cpus}' <<<"$1")
        got=$(jq -c --arg n "$name" '.processes[] | select(.name == $n) | .in_force // {} | {policy, priority, cpus}' <<<"$STATUS")
        check "$name runs with $2 policy, priority and CPUs (read back from the kernel)" "$want" "$got" "$LOG1"
    done
}
plan_in_force "$PLAN_JSON" "the image's"
got=$(jq -r '[.processes[] | "\(.name)=\(.backend // "none")"] | sort | join(" ")' <<<"$STATUS")
check "deploy status names each process's backend (real-time processes sleep on their doorbell)" "listener=doorbell talker=doorbell" "$got" "$LOG1"
# The listener prints a count every 1000 messages; wait for one.
limit=$(($(date +%s) + 120))
count=
while [ "$(date +%s)" -lt "$limit" ]; do
    count=$(q 60 deploy logs listener 2>/dev/null | grep -Eo 'received [0-9]+' | grep -Eo '[0-9]+' | sort -n | tail -n1)
    [ -n "$count" ] && [ "$count" -ge 1000 ] && break
    sleep 3
done
if [ -n "$count" ] && [ "$count" -ge 1000 ]; then
    pass "the controllers exchanged at least 1000 messages ($count, $(q 60 deploy logs listener | grep -o 'backend [a-z_-]*' | tail -n1))"
else
    fail "the controllers exchanged at least 1000 messages" "${count:-no count}: $(q 60 deploy logs listener | tail -n 5)" "$LOG1"
fi
bc=$(jq -r '.boot_check // empty' <<<"$STATUS")
case $bc in
passed* | failed*) pass "the boot check ran ($bc)" ;;
*) fail "the boot check ran" "boot_check='$bc'" "$LOG1" ;;
esac
phase_end

# --------------------------------------------------- field updates over ssh
phase_start "boot 1: deploy update over ssh"
UPDATE_OPTS=(--ssh-option BatchMode=yes --ssh-option StrictHostKeyChecking=no --ssh-option UserKnownHostsFile=/dev/null
    --ssh-option LogLevel=ERROR --ssh-option "IdentityFile=$SSH_KEY" --ssh-option "Port=$PORT" --ssh-option ConnectTimeout=10)
update() {
    timeout -k 10 600 "$DEPLOY" --json update --host root@127.0.0.1 "${UPDATE_OPTS[@]}" "$1" 2>"$WORK/update.err"
}
# release_verdict LIMIT VERSION: the supervisor's release status (deploy
# status --json .release) once it has judged the trial of VERSION
# (committed with VERSION current, or rolled back), or the last one seen
# when LIMIT seconds pass.
release_verdict() {
    local limit=$(($(date +%s) + $1)) r='' st cur other
    while [ "$(date +%s)" -lt "$limit" ]; do
        r=$(q 60 deploy --json status 2>/dev/null | jq -c '.release // empty' 2>/dev/null)
        st=$(jq -r '.state' <<<"$r" 2>/dev/null)
        cur=$(jq -r '.current // empty' <<<"$r" 2>/dev/null)
        other=$(jq -r '.other // empty' <<<"$r" 2>/dev/null)
        { [ "$st" = committed ] && [ "${cur%%-*}" = "$2" ]; } ||
            { [ "$st" = rolled-back ] && [ "${other%%-*}" = "$2" ]; } && break
        sleep 3
    done
    printf '%s\n' "$r"
}
# update_and_judge BUNDLE VERSION WANT NAME: deploy update installs the
# bundle in trial; the supervisor then judges it (health_window): WANT is
# the release state it must reach, `committed` with VERSION current, or
# `rolled-back` away from VERSION.
update_and_judge() {
    local u state r cur
    u=$(update "$1")
    state=$(jq -r '.robots[0] | "\(.ok) \(.state)"' <<<"$u" 2>/dev/null)
    if [ "$state" != "true trial" ]; then
        fail "$4" "deploy update: ${u:-no JSON} $(tail -n 20 "$WORK/update.err")" "$LOG1"
        return
    fi
    r=$(release_verdict 240 "$2")
    cur=$(jq -r '.current // empty' <<<"$r")
    case "$3 $(jq -r '.state' <<<"$r") $cur" in
    "committed committed $2-"* | "rolled-back rolled-back "*)
        [ "$3" = rolled-back ] && [ "${cur%%-*}" = "$2" ] && {
            fail "$4" "rolled back but $cur is current: $r" "$LOG1"
            return
        }
        pass "$4 ($(jq -r '.robots[0] | "\(.release) sent in \(.seconds | floor) s"' <<<"$u"); supervisor: $(jq -r '[.state, .current, .detail // empty] | join(" ")' <<<"$r" | cut -c1-160))"
        ;;
    *) fail "$4" "the supervisor says: ${r:-nothing}" "$LOG1" ;;
    esac
}
update_and_judge "$WORK/v2.bundle" 2 committed "deploy update --host over ssh: release 2 installed, trial -> committed"
update_and_judge "$WORK/v3.bundle" 3 rolled-back "deploy update --host over ssh: release 3 crashes in its trial and rolls back by itself"
REL=$(q 60 deploy --json releases)
CUR=$(jq -r '.releases[]? | select(.current) | .name' <<<"$REL")
case $CUR in
2-*) pass "after the rollback release 2 is current again ($CUR, $(jq -r '.state.state' <<<"$REL"))" ;;
*) fail "after the rollback release 2 is current again" "deploy releases: $REL" "$LOG1" ;;
esac
STATUS=$(wait_running 120) || fail "talker and listener run release 2 after the rollback" "$STATUS" "$LOG1"
phase_end

# ------------------------------- boot 2: a system update through a reboot
phase_start "boot 1: system update to release 4, deploy update --reboot"
IMAGE_DEFAULT=$default
IMAGE_APPEND=$(append_of "$default")
U4=$(timeout -k 10 600 "$DEPLOY" --json update --reboot --host root@127.0.0.1 "${UPDATE_OPTS[@]}" "$WORK/v4.bundle" 2>"$WORK/update.err")
REBOOT_T=$(now_ms)
if [ "$(jq -r '.robots[0] | "\(.ok) \(.state) \(.reboot) \(.rebooted)"' <<<"$U4" 2>/dev/null)" = "true trial true true" ]; then
    pass "deploy update --reboot: release 4 installed in trial as a system update, the guest asked to reboot ($(jq -r '.robots[0].release' <<<"$U4"))"
else
    fail "deploy update --reboot: release 4 installed as a system update and the guest asked to reboot" "${U4:-no JSON} $(tail -n 20 "$WORK/update.err")" "$LOG1"
fi
phase_end
phase_start "boot 2: the reboot into release 4's plan"
if BOOT_ID2=$(wait_ssh "$LOG1" "$BOOT_LIMIT" "$BOOT_ID"); then
    pass "the guest rebooted through U-Boot and answers over ssh ($(secs $(($(now_ms) - REBOOT_T))) s)"
else
    fail "the guest reboots" "$BOOT_ID2" "$LOG1"
    BOOT_ID2=
fi
phase_end
if [ -n "${BOOT_ID2:-}" ] && [ "$BOOT_ID2" != "$BOOT_ID" ]; then
    phase_start "boot 2: assertions, the runtime's tests in the guest"
    # The boot loader took the new label: the new line is running.
    q 60 cat /boot/extlinux/extlinux.conf >"$WORK/extlinux.conf"
    new_default=$(sed -n 's/^[[:space:]]*DEFAULT[[:space:]]*//p' "$WORK/extlinux.conf" | head -n1)
    labels=$(awk '$1 == "LABEL" { printf "%s%s", sep, $2; sep = " " }' "$WORK/extlinux.conf")
    if [[ $new_default == rtdeploy-release-4-* ]] && [ "$labels" = "$IMAGE_DEFAULT rtdeploy-original $new_default" ] &&
        [ "$(append_of "$IMAGE_DEFAULT")" = "$IMAGE_APPEND" ]; then
        pass "extlinux.conf after the update: DEFAULT $new_default, the image's $IMAGE_DEFAULT (its line unchanged) and rtdeploy-original kept as fallbacks"
    else
        fail "extlinux.conf after the update: DEFAULT release 4's label, the previous labels kept" "DEFAULT '$new_default', labels '$labels' ($(cat "$WORK/extlinux.conf"))" "$LOG1"
    fi
    CMDLINE=$(q 60 cat /proc/cmdline)
    missing=$(missing_tokens "$CMDLINE" "$PLAN4_CMDLINE")
    if [ -z "$missing" ] && [ -n "$CMDLINE" ]; then
        pass "/proc/cmdline carries every token of release 4's plan ($CMDLINE)"
    else
        fail "/proc/cmdline carries every token of release 4's plan" "missing:$missing (cmdline: $CMDLINE)" "$LOG1"
    fi
    check "/sys/devices/system/cpu/isolated equals release 4's plan" "$(jq -r '.cpus.isolated' <<<"$PLAN4_JSON")" "$(q 60 cat /sys/devices/system/cpu/isolated)" "$LOG1"
    # The trial, judged after the reboot with the new plan in force.
    r=$(release_verdict 300 4)
    case "$(jq -r '.state' <<<"$r" 2>/dev/null) $(jq -r '.current // empty' <<<"$r" 2>/dev/null)" in
    "committed 4-"*) pass "release 4's trial is judged after the reboot and committed ($(jq -r '.detail // empty' <<<"$r" | cut -c1-160))" ;;
    *) fail "release 4's trial is judged after the reboot and committed" "the supervisor says: ${r:-nothing}" "$LOG1" ;;
    esac
    STATUS=$(wait_running 240) || fail "after the reboot talker and listener run" "$STATUS" "$LOG1"
    REL=$(q 60 deploy --json releases)
    CUR=$(jq -r '.releases[]? | select(.current) | .name' <<<"$REL")
    case "$CUR $(jq -r '.state.state' <<<"$REL") $(jq -r '.release.current // empty' <<<"$STATUS")" in
    "4-"*" committed 4-"*) pass "after the reboot the committed release 4 runs ($CUR)" ;;
    *) fail "after the reboot the committed release 4 runs" "deploy releases: $REL; status: $(jq -c .release <<<"$STATUS")" "$LOG1" ;;
    esac
    plan_in_force "$PLAN4_JSON" "release 4's"
    check "the reboot request is gone" absent "$(q 60 'test -e /run/rtdeploy/reboot-required && echo present || echo absent')" "$LOG1"
    check "after the reboot rtdeploy.service is active" active "$(q 60 systemctl is-active rtdeploy.service)" "$LOG1"

    # The runtime's suites, cross-built, run in the guest.
    TESTS_DIR=/root/rtdeploy-tests
    mapfile -t SUITES < <(grep -E '^(controller|channel|event_loop)-' "$OUTA/tests.txt")
    if [ "${#SUITES[@]}" -gt 0 ] && g 60 mkdir -p "$TESTS_DIR" &&
        tar -C "$OUTA/tests" -cf - "${SUITES[@]}" | g 300 tar -C "$TESTS_DIR" -xf -; then
        : >"$WORK/guest-tests.txt"
        total_ok=0 total_failed=0 bad=''
        while read -r t; do
            [ -n "$t" ] || continue
            out=$(g 900 "cd $TESTS_DIR && ./$t --test-threads=1 2>&1" </dev/null)
            rc=$?
            printf '== %s (exit %d)\n%s\n' "$t" "$rc" "$out" >>"$WORK/guest-tests.txt"
            res=$(grep -E '^test result:' <<<"$out" | tail -n1)
            p=$(sed -n 's/.* \([0-9]*\) passed.*/\1/p' <<<"$res")
            f=$(sed -n 's/.* \([0-9]*\) failed.*/\1/p' <<<"$res")
            total_ok=$((total_ok + ${p:-0}))
            total_failed=$((total_failed + ${f:-0}))
            [ "$rc" = 0 ] || bad="$bad ${t%-*}(exit $rc: $(grep -E '^test .* FAILED$' <<<"$out" | head -n 5 | tr '\n' ' '))"
            log "guest test $t: exit $rc, ${res:-no result line}"
        done < <(printf '%s\n' "${SUITES[@]}")
        if [ -z "$bad" ] && [ "$total_ok" -gt 0 ]; then
            pass "the runtime's test suites pass in the aarch64 guest ($total_ok tests: the controller crate's unit tests, channel and event_loop)"
        else
            fail "the runtime's test suites pass in the aarch64 guest" "$total_ok passed, $total_failed failed:$bad"
            sed -n '/FAILED\|panicked/p' "$WORK/guest-tests.txt" | head -n 40
        fi
    else
        fail "the runtime's test suites pass in the aarch64 guest" "could not copy them in"
    fi
    phase_end

    # The census on PREEMPT_RT (multi-threaded TCG: holders and waiters
    # really overlap here, unlike the x86 guest's thread=single): the
    # letter's scenario for about 60 s per mechanism, two best-effort
    # threads hammering the best-effort word, the kprobe on futex_hash.
    phase_start "boot 2: the wake census on PREEMPT_RT"
    q 60 deploy stop --all >/dev/null 2>&1
    CENSUS=$WORK/census.json
    g 900 "deploy check --census --hammer 2 --mechanisms doorbell,io_uring,futex_waitv,io_uring_shared --duration ${CENSUS_DURATION:-80s} --json -q --no-verify" </dev/null >"$CENSUS" 2>"$WORK/census.err"
    rc=$?
    if [ "$rc" != 0 ] && [ "$rc" != 1 ] || ! jq -e .census.enabled "$CENSUS" >/dev/null 2>&1; then
        fail "the census runs in the guest" "exit $rc: $(tail -n 5 "$WORK/census.err") $(jq -c .census.reason "$CENSUS" 2>/dev/null)"
    else
        phase_of() { jq -c --arg l "$1" '.census.phases[] | select(.label == $l)' "$CENSUS"; }
        jq -r '.census | "census: \(.events_lost) events lost; buckets: \(.bucket_probe)"' "$CENSUS"
        jq -r '.census.phases[] | "census \(.label): \(.counted_waits) counted, words \(.words | length) (\(.shared_words) shared); buckets \(.buckets // "none" | tostring)"' "$CENSUS"
        check "the census probes futex_hash in the guest (kprobes)" "futex_hash (kprobe: key on entry, bucket on return)" "$(jq -r .census.bucket_probe "$CENSUS")"
        control=$(phase_of "positive control: PI futex" | jq '.counted_waits')
        if [ "${control:-0}" -gt 0 ]; then
            pass "the census counts the positive control's PI boosts ($control)"
        else
            fail "the census counts the positive control's PI boosts" "$(phase_of "positive control: PI futex" | cut -c1-400)"
        fi
        reference=$(phase_of io_uring_shared | jq '.counted_waits')
        if [ "${reference:-0}" -gt 0 ]; then
            pass "the one-word reference under the hammer shows real-time waits on lower-priority holders ($reference)"
        else
            fail "the one-word reference under the hammer shows real-time waits on lower-priority holders" "$(phase_of io_uring_shared | cut -c1-400)"
        fi
        for m in doorbell io_uring futex_waitv; do
            got=$(phase_of "$m" | jq -r '"\(.counted_waits) \(.shared_words) \(.buckets.shared_same_word // "none")"')
            check "$m: no counted wait, no word and no bucket shared with a best-effort task for the same word" "0 0 0" "$got"
        done
    fi
    phase_end
fi

phase_start "power off"
g 20 systemctl poweroff >/dev/null 2>&1
for _ in $(seq 1 120); do kill -0 "$QEMU_PID" 2>/dev/null || break; sleep 1; done
if kill -0 "$QEMU_PID" 2>/dev/null; then
    fail "the guest powers off" "QEMU still running after 120 s" "$LOG1"
    kill "$QEMU_PID"
else
    pass "the guest powers off"
fi
wait "$QEMU_PID" 2>/dev/null
QEMU_PID=
phase_end

# -------------------------------------------- boot 3: the fallback labels
# Autoboot interrupted at U-Boot's prompt, a label named: the base's
# original line, and the label release 4's system update kept as the
# fallback (the image's DEFAULT, release 1's plan).
boot_label() {
    local label=$1 want=$2 name=$3 log=$WORK/serial-fallback-$1.log line got
    qemu_args "$DISK"
    if line=$(python3 "$REPO/scripts/e2e/console.py" --log "$log" --limit 300 \
        --expect 'Hit any key to stop autoboot' --send ' ' --expect '=> ' \
        --send "setenv pxe_label_override $label\r" --expect '=> ' --send 'boot\r' \
        --fail 'No more bootdevs|Kernel panic' \
        --until 'Kernel command line: .*\n' -- "${QEMU_ARGS[@]}" -serial stdio 2>"$WORK/console-$label.err"); then
        got=$(sed 's/.*Kernel command line: //' <<<"$line" | sed 's/[[:space:]]*$//')
        check "$name" "$want" "$got" "$log"
    else
        fail "$name" "$(head -n 5 "$WORK/console-$label.err")" "$log"
    fi
}
phase_start "boot 3: the fallback labels"
boot_label rtdeploy-original "$ORIG_APPEND" "the fallback label rtdeploy-original boots the base's original command line"
if [ -n "${IMAGE_DEFAULT:-}" ]; then
    boot_label "$IMAGE_DEFAULT" "$IMAGE_APPEND" "the label the system update kept ($IMAGE_DEFAULT) boots the previous plan's command line"
fi
phase_end

# ------------------------------------------ bad input: no kernel under /boot
phase_start "bad input: a kernel missing under /boot"
BAD=$WORK/bad.img
mkdir -p "$WORK/bad/boot/extlinux"
printf 'TIMEOUT 30\nDEFAULT primary\nLABEL primary\n      LINUX /boot/Image\n      APPEND %s\n' "$ORIG_APPEND" >"$WORK/bad/boot/extlinux/extlinux.conf"
truncate -s 40M "$WORK/bad.ext4"
mke2fs -q -t ext4 -d "$WORK/bad" "$WORK/bad.ext4" >/dev/null 2>&1
truncate -s 42M "$BAD"
printf 'label: gpt\nstart=2048, type=0FC63DAF-8483-4772-8E79-3D69D8477DE4, name=rootfs\n' | sfdisk -q "$BAD" >/dev/null 2>&1
dd if="$WORK/bad.ext4" of="$BAD" bs=1M seek=1 conv=notrunc status=none
qemu_args "$BAD"
t=$(now_ms)
LOG4=$WORK/serial-bad.log
if python3 "$REPO/scripts/e2e/console.py" --log "$LOG4" --limit 120 --fail 'No more bootdevs' \
    --until 'Kernel command line: .*\n' -- "${QEMU_ARGS[@]}" -serial stdio >/dev/null 2>"$WORK/console4.err"; then
    fail "a missing kernel fails the boot, with the console shown" "a kernel booted" "$LOG4"
elif said=$(grep -m1 'failure retrieving kernel' "$WORK/console4.err"); then
    pass "a missing kernel fails the boot in $(secs $(($(now_ms) - t))) s, with the console shown (${said#  | })"
    sed -n '1p;/Retrieving file/,/No more bootdevs/p' "$WORK/console4.err"
else
    fail "a missing kernel fails the boot, with the console shown" "no 'failure retrieving kernel' from U-Boot: $(cat "$WORK/console4.err")" "$LOG4"
fi
phase_end

finish
