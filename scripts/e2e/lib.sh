# shellcheck shell=bash
# Shared helpers of the QEMU end-to-end scripts (sourced, not run).
# Every function reports on stderr; results go to files or stdout.

E2E_REPO=${E2E_REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
export E2E_CACHE=${RTDEPLOY_CACHE:-$E2E_REPO/.cache}

e2e_log() { printf '[e2e %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

# e2e_host_tools: installs (apt-get, as root) the host tools the QEMU test
# needs when any is missing: qemu-system-x86, busybox-static, cpio, jq,
# binutils (readelf, strip).
e2e_host_tools() {
    local need=()
    command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
    command -v cpio >/dev/null || need+=(cpio)
    command -v jq >/dev/null || need+=(jq)
    command -v dpkg-deb >/dev/null || need+=(dpkg)
    command -v readelf >/dev/null || need+=(binutils)
    # The dynamic busybox package would not run in the guest.
    dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -c 'ok installed' >/dev/null ||
        need+=(busybox-static)
    [ "${#need[@]}" -eq 0 ] && return 0
    if [ "$(id -u)" != 0 ]; then
        e2e_log "missing host packages: ${need[*]} (apt-get install ${need[*]}, or run as root)"
        return 2
    fi
    e2e_log "installing ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -q >&2 &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >&2
}

# e2e_is_static FILE: true when FILE is a statically linked ELF (no
# PT_INTERP program header).
e2e_is_static() {
    [ -f "$1" ] || return 1
    ! LC_ALL=C readelf -lW "$1" 2>/dev/null | grep -c 'INTERP' >/dev/null && LC_ALL=C readelf -h "$1" >/dev/null 2>&1
}

# e2e_base DIR: writes a minimal root filesystem into DIR (which must not
# exist or be empty): busybox-static with its applet links, the few files an
# init needs, and the usual empty mount points. Device nodes /dev/console and
# /dev/null are created when running as root (cpio.gz needs them before
# devtmpfs is mounted).
e2e_base() {
    local dir=$1 bb a
    bb=/bin/busybox
    mkdir -p "$dir"
    (
        cd "$dir" || exit 1
        mkdir -p usr/bin usr/lib etc dev proc sys tmp run root var/log var/lib mnt opt
        ln -sfn usr/bin bin
        ln -sfn usr/bin sbin
        ln -sfn bin usr/sbin
        ln -sfn usr/lib lib
        chmod 1777 tmp
        chmod 0700 root
        cp "$bb" usr/bin/busybox
        for a in $(usr/bin/busybox --list); do
            case $a in busybox) continue ;; esac
            [ -e "usr/bin/$a" ] || ln -s busybox "usr/bin/$a"
        done
        if [ -d "$E2E_REPO/examples/qemu-base" ]; then
            cp -a "$E2E_REPO/examples/qemu-base/." .
        fi
        [ -e etc/passwd ] || printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >etc/passwd
        [ -e etc/group ] || printf 'root:x:0:\nrtdeploy:x:900:\nnogroup:x:65534:\n' >etc/group
        [ -e etc/hostname ] || echo rtdeploy-qemu >etc/hostname
        if [ "$(id -u)" = 0 ]; then
            [ -e dev/console ] || mknod -m 600 dev/console c 5 1
            [ -e dev/null ] || mknod -m 666 dev/null c 1 3
        fi
    )
}

# e2e_cpio DIR OUT: packs DIR as a newc cpio.gz initramfs (owner root,
# sorted, mtimes as they are).
e2e_cpio() {
    local dir=$1 out=$2
    (cd "$dir" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) | gzip -n -6 >"$out"
}

# e2e_qemu KERNEL INITRD APPEND LOG LIMIT_SECONDS: boots QEMU (TCG, 4 CPUs,
# 1 GiB, no network; single-threaded TCG: with one host thread per vCPU the
# guest kernel's live code patching (int3 on static keys) sometimes oopsed
# on a busy host, and two host cores gain little from four threads) with the serial console (kernel and supervisor
# messages) written to LOG, and a virtio console (/dev/hvc0 in the guest,
# where the test's own lines go, so that nothing else can interleave with
# them) written to LOG.hvc (or, without a virtio console in the guest, the
# second serial port, /dev/ttyS1); the virtio-serial PCI device also gives the
# guest MSI interrupts. With E2E_TTY1_FLOOD=1 the second serial port is a
# pair of FIFOs instead: what the guest writes still goes to LOG.tty1, and the
# host feeds it input without a pause (a port whose receive interrupts never
# stop while the guest has it open). Returns QEMU's exit status, 124 when the
# time limit hit.
e2e_qemu() {
    local kernel=$1 initrd=$2 append=$3 log=$4 limit=$5 rc=0 tty1 pids=()
    : >"$log"
    : >"$log.hvc"
    tty1=(-serial "file:$log.tty1")
    if [ "${E2E_TTY1_FLOOD:-0}" = 1 ]; then
        rm -f "$log.pipe.in" "$log.pipe.out"
        mkfifo "$log.pipe.in" "$log.pipe.out"
        cat "$log.pipe.out" >"$log.tty1" &
        pids+=($!)
        # `yes` blocks while the pipe is full: no cost while the port is shut.
        yes 'rtdeploy e2e: receive interrupts on the second serial port' >"$log.pipe.in" 2>/dev/null &
        pids+=($!)
        tty1=(-chardev "pipe,id=tty1,path=$log.pipe" -serial chardev:tty1)
    fi
    timeout -k 10 "$limit" qemu-system-x86_64 \
        -accel tcg,thread=single -cpu max -smp 4 -m 1G \
        -nographic -no-reboot -nic none \
        -monitor "unix:$log.mon,server=on,wait=off" \
        -device virtio-serial-pci \
        -chardev "file,id=e2e,path=$log.hvc" -device virtconsole,chardev=e2e \
        -serial "file:$log" "${tty1[@]}" \
        -kernel "$kernel" -initrd "$initrd" \
        -append "$append" </dev/null >"$log.qemu" 2>&1 || rc=$?
    if [ "${#pids[@]}" -gt 0 ]; then
        kill "${pids[@]}" 2>/dev/null
        wait "${pids[@]}" 2>/dev/null
        rm -f "$log.pipe.in" "$log.pipe.out"
    fi
    # A kernel whose virtio console is a module (Debian's 5.10) has no
    # /dev/hvc0 in an image without modules: the guest's test lines then
    # go to the second serial port.
    [ -s "$log.hvc" ] || cat "$log.tty1" >"$log.hvc" 2>/dev/null
    return "$rc"
}

# e2e_monitor LOG COMMAND: sends one HMP command to the monitor of the
# QEMU writing LOG (e2e_qemu gives every VM one at LOG.mon) and prints the
# reply.
e2e_monitor() {
    python3 - "$1.mon" "$2" <<'PY'
import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
s.connect(sys.argv[1])
time.sleep(0.5)
s.recv(65536)  # the banner and prompt
s.sendall(sys.argv[2].encode() + b"\n")
time.sleep(1)
print(s.recv(65536).decode(errors="replace"))
PY
}

# e2e_serial_clean LOG: the serial log without carriage returns.
e2e_serial_clean() { tr -d '\r' <"$1"; }

# e2e_fixture_decode LOG DIR: decodes the base64 tar between the
# E2E-FIXTURE-BEGIN/END lines of LOG (the guest's test output) into DIR.
e2e_fixture_decode() {
    local log=$1 dir=$2
    mkdir -p "$dir"
    e2e_serial_clean "$log" | sed -n '/^E2E-FIXTURE-BEGIN$/,/^E2E-FIXTURE-END$/p' |
        grep -E '^[A-Za-z0-9+/=]+$' | base64 -d | tar -xzf - -C "$dir"
}

# e2e_guest_value LOG KEY: the value of the first "E2E KEY value" line.
e2e_guest_value() {
    e2e_serial_clean "$1" | sed -n "s/^E2E $2 //p" | head -n1
}

# e2e_plan_cmdline CONFIG: the kernel command line `deploy plan --json`
# gives for CONFIG (builds deploy as the end-to-end test does, so the two
# share the cargo cache).
e2e_plan_cmdline() {
    local cfg=$1 tdir=${E2E_TARGET_DIR:-$E2E_REPO/target-e2e}
    (cd "$E2E_REPO" && RUSTFLAGS='-C target-feature=+crt-static' CARGO_TARGET_DIR=$tdir \
        cargo build -q --release --target x86_64-unknown-linux-gnu -p deploy) >&2 || return 1
    "$tdir/x86_64-unknown-linux-gnu/release/deploy" plan -c "$cfg" --json | jq -r '.cmdline.line'
}
