#!/usr/bin/env bash
# End-to-end test: an image built by `deploy image` boots Debian's PREEMPT_RT
# kernel under QEMU (TCG, 4 CPUs, 1 GiB), the supervisor runs as PID 1, and
# the test reads the serial console.
#
# Usage: scripts/e2e-qemu.sh     (as root on Debian 12; installs what it needs)
#
# The guest's kernel and supervisor messages go to the serial console, the
# test's own lines (E2E ...) to a virtio console, each to its own log.
#
# Four boots:
#   1. probe: a busybox initramfs with the plan's kernel command line; shows
#      the kernel's own state (PREEMPT_RT, isolated CPUs, IRQ threads).
#   2. image: `deploy image --format cpio.gz -c examples/qemu.yaml`, booted
#      with /init -> `deploy supervise` as PID 1 and a test driver beside it.
#   3. the same image with RTDEPLOY_DENY_SYSCALLS=io_uring,futex_waitv on
#      the command line (init's environment): the supervisor starts every
#      process under a seccomp filter answering ENOSYS to them, as on a
#      system with io_uring off; the controllers must run on the doorbell
#      backend.
#   4. the same image on Debian bullseye's 5.10 PREEMPT_RT kernel (the
#      JetPack 5 kernel series: no io_uring futex waits, no futex_waitv):
#      the runtime must pick the doorbell backend by itself.
#
# Environment:
#   RTDEPLOY_CACHE   cache directory (default <repo>/.cache): the kernel package
#   E2E_TARGET_DIR   cargo target directory (default <repo>/target-e2e)
#   E2E_SRC          source tree to build (default: this repository)
#   E2E_KEEP=1       keep the work directory (serial logs, images) and say where
#   E2E_BOOT_LIMIT   seconds each QEMU boot may take (default 300)
#   E2E_OLD_KERNEL=0 skip boot 4 (the 5.10 kernel)
#
# Every assertion prints PASS, FAIL or SKIP (with the reason it cannot run).
# Exit status: 0 when no assertion failed, 1 when one did, 2 on a setup
# error. On failure the whole serial log of the failing boot is printed.
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/e2e/lib.sh
. "$REPO/scripts/e2e/lib.sh"

SRC=${E2E_SRC:-$REPO}
BOOT_LIMIT=${E2E_BOOT_LIMIT:-300}
CONFIG=$SRC/examples/qemu.yaml
TRIPLE=x86_64-unknown-linux-gnu
export CARGO_TARGET_DIR=${E2E_TARGET_DIR:-$REPO/target-e2e}
OUTBIN=$CARGO_TARGET_DIR/$TRIPLE/release
WORK=$(mktemp -d /tmp/rtdeploy-e2e.XXXXXX)
if [ "${E2E_KEEP:-0}" = 1 ]; then
    trap 'e2e_log "work directory kept: $WORK"' EXIT
else
    trap 'rm -rf "$WORK"' EXIT
fi

N_PASS=0 N_FAIL=0 N_SKIP=0
FAILED_LOGS=()
pass() { N_PASS=$((N_PASS + 1)); printf 'PASS: %s\n' "$1"; }
fail() { N_FAIL=$((N_FAIL + 1)); printf 'FAIL: %s: %s\n' "$1" "$2"; }
skip() { N_SKIP=$((N_SKIP + 1)); printf 'SKIP: %s: %s\n' "$1" "$2"; }
# check NAME EXPECTED ACTUAL [LOG]
check() {
    if [ "$2" = "$3" ]; then
        pass "$1 ($3)"
    else
        fail "$1" "expected '$2', got '$3'"
        [ -n "${4:-}" ] && log_failed "$4"
    fi
}
# A failing boot's serial log is printed once, at the end.
log_failed() {
    local l
    for l in "${FAILED_LOGS[@]}"; do [ "$l" = "$1" ] && return; done
    FAILED_LOGS+=("$1")
}

PHASES=()
now_ms() { echo $(($(date +%s%N) / 1000000)); }
secs() { printf '%d.%d' $(($1 / 1000)) $((($1 % 1000) / 100)); }
T0=$(now_ms)
phase_start() { PHASE_NAME=$1; PHASE_T=$(now_ms); e2e_log "phase $1"; }
phase_end() { PHASES+=("$(printf '%-34s %7s s' "$PHASE_NAME" "$(secs $(($(now_ms) - PHASE_T)))")"); }

finish() {
    local l
    for l in "${FAILED_LOGS[@]}"; do
        printf '\n===== serial console %s (kernel, supervisor) =====\n' "${l##*/}"
        e2e_serial_clean "$l"
        printf '===== end of %s =====\n' "${l##*/}"
        printf '\n===== virtio console %s (the test in the guest) =====\n' "${l##*/}.hvc"
        e2e_serial_clean "$l.hvc"
        printf '===== end of %s =====\n' "${l##*/}.hvc"
        if [ -s "$l.qemu" ]; then
            printf '===== qemu output =====\n'
            cat "$l.qemu"
        fi
    done
    printf '\nphase timings:\n'
    printf '  %s\n' "${PHASES[@]}"
    printf '  %-34s %7s s\n' total "$(secs $(($(now_ms) - T0)))"
    printf 'e2e-qemu: %d passed, %d failed, %d skipped\n' "$N_PASS" "$N_FAIL" "$N_SKIP"
    [ "$N_FAIL" -eq 0 ] || exit 1
    exit 0
}

# block LOG NAME: the output of the guest's block NAME (see driver.sh).
block() {
    e2e_serial_clean "$1" | awk -v n="$2" '
        $0 == "E2E-BLOCK-BEGIN " n { on = 1; next }
        on && index($0, "E2E-BLOCK-END " n " ") == 1 { exit }
        on { print }'
}
# block_rc LOG NAME: the exit status of the guest's block NAME.
block_rc() {
    e2e_serial_clean "$1" | sed -n "s/^E2E-BLOCK-END $2 rc=\([0-9]*\).*/\1/p" | head -n1
}
# json_of < TEXT: the first line of TEXT that is a JSON object, else the
# whole TEXT when it is one (pretty-printed) JSON document, compacted.
json_of() {
    local text line
    text=$(cat)
    while IFS= read -r line; do
        case $line in
        '{'*'}') if jq -e . >/dev/null 2>&1 <<<"$line"; then
            printf '%s\n' "$line"
            return 0
        fi ;;
        esac
    done <<<"$text"
    jq -c . 2>/dev/null <<<"$text" | head -n1
}

# ---------------------------------------------------------------- host tools
phase_start "host tools + kernel"
if ! bash "$REPO/scripts/fetch-rt-kernel.sh"; then
    e2e_log "could not fetch the PREEMPT_RT kernel"
    exit 2
fi
KDIR=$E2E_CACHE/rt-kernel
phase_end

# --------------------------------------------------------------------- build
# deploy and the two controllers examples/qemu.yaml runs (bin/talker and
# bin/listener, examples of the controller crate), static x86_64, in one
# cargo run so that the shared crates compile once.
phase_start "build deploy + controllers (static)"
has_example() {
    [ -f "$SRC/controller/examples/$1.rs" ] || [ -f "$SRC/controller/examples/$1/main.rs" ] ||
        grep -Eq "^name *= *\"$1\"" "$SRC/controller/Cargo.toml"
}
static_build() {
    (cd "$SRC" && RUSTFLAGS='-C target-feature=+crt-static' cargo build --release --target $TRIPLE "$@")
}
DEPLOY='' EXAMPLES_OK=0
if has_example talker && has_example listener; then
    if static_build -p deploy -p controller --bin deploy --example talker --example listener --example planted-spin \
        >"$WORK/build.log" 2>&1; then
        DEPLOY=$OUTBIN/deploy EXAMPLES_OK=1
    fi
fi
if [ -z "$DEPLOY" ] && static_build -p deploy --bin deploy >"$WORK/build-deploy.log" 2>&1; then
    DEPLOY=$OUTBIN/deploy
fi
if [ -z "$DEPLOY" ]; then
    tail -n 40 "$WORK/build-deploy.log"
    fail "deploy builds as a static x86_64 binary" "cargo build failed (above)"
elif e2e_is_static "$DEPLOY"; then
    pass "deploy builds as a static x86_64 binary"
else
    fail "deploy builds as a static x86_64 binary" "$DEPLOY has a program interpreter"
fi
if ! has_example talker || ! has_example listener; then
    skip "example controllers talker and listener build statically" "controller/examples has no talker and listener yet"
elif [ "$EXAMPLES_OK" = 1 ] && e2e_is_static "$OUTBIN/examples/talker" && e2e_is_static "$OUTBIN/examples/listener"; then
    pass "example controllers talker and listener build statically"
else
    [ -s "$WORK/build.log" ] && tail -n 40 "$WORK/build.log"
    fail "example controllers talker and listener build statically" "cargo build failed (above), or they are not static"
fi
phase_end

# ------------------------------------------------------------------ the plan
# The kernel command line, the isolated CPUs and the IRQ-thread rules all
# come from `deploy plan --json`.
phase_start "plan"
PLAN_JSON='' PLAN_CMDLINE='' PLAN_ISOLATED=''
if [ -n "$DEPLOY" ]; then
    if PLAN_JSON=$("$DEPLOY" plan -c "$CONFIG" --json 2>"$WORK/plan.err"); then
        PLAN_CMDLINE=$(jq -r '.cmdline.line' <<<"$PLAN_JSON")
        PLAN_ISOLATED=$(jq -r '.cpus.isolated' <<<"$PLAN_JSON")
        pass "deploy plan -c examples/qemu.yaml --json (cmdline: $PLAN_CMDLINE)"
    else
        fail "deploy plan -c examples/qemu.yaml --json" "$(cat "$WORK/plan.err")"
    fi
fi
phase_end
if [ -z "$PLAN_CMDLINE" ]; then
    skip "every boot" "no plan (deploy did not build or plan failed)"
    finish
fi

# irq_rules: "glob policy priority cpus" per IRQ-thread rule of the plan, in
# order ("-" when the rule leaves the CPUs alone).
jq -r '.irqs.threads[] | "\(.match) \(.policy) \(.priority) \(.cpus // "-")"' <<<"$PLAN_JSON" >"$WORK/irq-rules"
# policy number of /proc/PID/stat field 41
policy_no() { case $1 in other) echo 0 ;; fifo) echo 1 ;; rr) echo 2 ;; *) echo "?" ;; esac; }
# check_irq_threads LOG LINES NAME: every IRQ thread carries the policy,
# priority and (when the rule gives them, and LINES show them) CPUs of the
# first plan rule whose glob matches its name.
check_irq_threads() {
    local log=$1 lines=$2 name=$3 bad='' n=0 pid comm pol prio cpus glob rpol rprio rcpus
    while read -r pid comm pol prio cpus; do
        [ -n "$pid" ] || continue
        n=$((n + 1))
        while read -r glob rpol rprio rcpus; do
            # shellcheck disable=SC2053
            if [[ $comm == $glob ]]; then
                if [ "$pol" != "policy=$(policy_no "$rpol")" ] || [ "$prio" != "prio=$rprio" ] ||
                    { [ "$rcpus" != - ] && [ -n "$cpus" ] && [ "$cpus" != "cpus=$rcpus" ]; }; then
                    bad="$bad $comm($pol $prio $cpus, planned $rpol $rprio cpus $rcpus)"
                fi
                break
            fi
        done <"$WORK/irq-rules"
    done <<<"$lines"
    if [ "$n" = 0 ]; then
        fail "$name" "no irq/* thread listed"
        log_failed "$log"
    elif [ -z "$bad" ]; then
        pass "$name ($n threads)"
    else
        fail "$name" "$bad"
        log_failed "$log"
    fi
}
# check_cmdline LOG GOT: every planned token is in GOT.
check_cmdline() {
    local missing='' t
    for t in $PLAN_CMDLINE; do
        case " $2 " in *" $t "*) ;; *) missing="$missing $t" ;; esac
    done
    if [ -z "$missing" ] && [ -n "$2" ]; then
        pass "/proc/cmdline carries every planned token"
    else
        fail "/proc/cmdline carries every planned token" "missing:${missing:- (no cmdline line)}"
        log_failed "$1"
    fi
}

# ------------------------------------------------- boot 1: the kernel itself
phase_start "base rootfs + probe initramfs"
BASE=$WORK/base
e2e_base "$BASE"
PROBE=$WORK/probe-root
cp -a "$BASE" "$PROBE"
cp "$REPO/scripts/e2e/probe-init.sh" "$PROBE/init"
e2e_cpio "$PROBE" "$WORK/probe.cpio.gz"
phase_end

phase_start "boot 1: kernel probe"
LOG1=$WORK/serial-probe.log OUT1=$WORK/serial-probe.log.hvc
rc=0
e2e_qemu "$KDIR/vmlinuz" "$WORK/probe.cpio.gz" "console=ttyS0 panic=-1 $PLAN_CMDLINE" "$LOG1" "$BOOT_LIMIT" || rc=$?
phase_end
if [ "$rc" = 124 ]; then
    fail "probe boot finishes within ${BOOT_LIMIT}s" "time limit hit"
    log_failed "$LOG1"
elif [ "$rc" != 0 ]; then
    fail "probe boot" "qemu exited with $rc"
    log_failed "$LOG1"
fi
if e2e_serial_clean "$OUT1" | grep -cx 'E2E end' >/dev/null; then
    pass "probe guest ran to its end and powered off"
else
    fail "probe guest ran to its end" "no 'E2E end' line on the serial console"
    log_failed "$LOG1"
fi
check "kernel is PREEMPT_RT (/sys/kernel/realtime)" 1 "$(e2e_guest_value "$OUT1" realtime)" "$LOG1"
check "/sys/devices/system/cpu/isolated equals the plan" "$PLAN_ISOLATED" "$(e2e_guest_value "$OUT1" isolated)" "$LOG1"
check_cmdline "$LOG1" "$(e2e_guest_value "$OUT1" cmdline)"
# Before anything applies the plan every threaded handler runs SCHED_FIFO
# 50, the PREEMPT_RT default.
threads=$(e2e_serial_clean "$OUT1" | sed -n 's/^E2E irqthread //p')
if [ -z "$threads" ]; then
    fail "irq/* threads exist" "none listed"
    log_failed "$LOG1"
else
    pass "irq/* threads exist: $(awk '{print $2}' <<<"$threads" | tr '\n' ' ')"
    bad=$(grep -v 'policy=1 prio=50$' <<<"$threads" || true)
    if [ -z "$bad" ]; then
        pass "irq/* threads are SCHED_FIFO 50 (kernel default) before the plan is applied"
    else
        fail "irq/* threads are SCHED_FIFO 50 before the plan is applied" "$(tr '\n' ';' <<<"$bad")"
        log_failed "$LOG1"
    fi
fi

# ------------------------------------------------- boot 2: the built image
SUPERVISED_ASSERTIONS=(
    "the supervisor starts talker and listener"
    "the supervisor applied the CPU plan"
    "each process runs with the planned policy, priority and CPUs (read back from the kernel)"
    "supervisor as PID 1 applies the plan: IRQ threads carry the planned priorities and CPUs"
    "deploy verify exits 0 in the guest"
    "the boot check ran and its report has figures"
    "the example controllers exchanged at least 1000 messages"
    "the real-time controllers report the doorbell backend and the real-time wake class"
    "deploy status names each process's backend"
    "a controller killed with SIGKILL runs again within its backoff"
    "deploy status shows the restarted controller"
    "shutdown is orderly"
)
skip_supervised() {
    local a
    for a in "${SUPERVISED_ASSERTIONS[@]}"; do skip "$a" "$1"; done
    finish
}

has_command() { "$DEPLOY" "$1" --help >/dev/null 2>&1; }
if ! has_command image || ! "$DEPLOY" image --help 2>&1 | grep -c 'cpio.gz' >/dev/null; then
    skip "deploy image --format cpio.gz -c examples/qemu.yaml" "deploy has no image command with cpio.gz yet (issue 7)"
    skip_supervised "needs the image built by deploy image"
fi
if ! has_command supervise; then
    skip "deploy image --format cpio.gz -c examples/qemu.yaml" "not built: the image would have no supervisor"
    skip_supervised "deploy has no supervise command yet (issue 5)"
fi
if [ "$EXAMPLES_OK" != 1 ]; then
    skip "deploy image --format cpio.gz -c examples/qemu.yaml" "not built: the release needs the example controllers"
    skip_supervised "the example controllers do not build yet"
fi

phase_start "deploy image --format cpio.gz"
# The release directory holds the binaries robot.yaml names (bin/talker,
# bin/listener); debug info is stripped to keep the initramfs small.
REL=$WORK/release
mkdir -p "$REL/bin" "$WORK/bin"
strip_copy() { if command -v strip >/dev/null; then strip -o "$2" "$1"; else cp "$1" "$2"; fi; }
strip_copy "$OUTBIN/examples/talker" "$REL/bin/talker"
strip_copy "$OUTBIN/examples/listener" "$REL/bin/listener"
strip_copy "$DEPLOY" "$WORK/bin/deploy"
# The test's own files in the base: /init execs the supervisor, the driver
# runs beside it.
mkdir -p "$BASE/usr/lib/rtdeploy-e2e"
cp "$REPO/scripts/e2e/supervised-init.sh" "$BASE/init"
cp "$REPO/scripts/e2e/driver.sh" "$BASE/usr/lib/rtdeploy-e2e/driver.sh"
strip_copy "$OUTBIN/examples/planted-spin" "$BASE/usr/lib/rtdeploy-e2e/planted-spin"
IMAGE=$WORK/image.cpio.gz
irc=0
"$DEPLOY" image -c "$CONFIG" --base "$BASE" --release "$REL" --deploy-binary "$WORK/bin/deploy" \
    --out "$IMAGE" --format cpio.gz >"$WORK/image.log" 2>&1 || irc=$?
if [ "$irc" = 0 ]; then
    pass "deploy image --format cpio.gz -c examples/qemu.yaml ($(du -h "$IMAGE" | cut -f1))"
    # No extlinux.conf in the base: the image carries the planned line in
    # /etc/rtdeploy/cmdline.
    img_cmdline=$(zcat "$IMAGE" | (cd "$WORK" && cpio -i --quiet --to-stdout etc/rtdeploy/cmdline 2>/dev/null))
    check "the image's /etc/rtdeploy/cmdline is the planned line" "$PLAN_CMDLINE" "$(echo $img_cmdline)"
else
    cat "$WORK/image.log"
    fail "deploy image --format cpio.gz -c examples/qemu.yaml" "exit $irc (output above)"
    phase_end
    skip_supervised "the image did not build"
fi
phase_end

phase_start "boot 2: image, supervisor as PID 1"
LOG2=$WORK/serial-image.log OUT2=$WORK/serial-image.log.hvc
rc=0
# The host half of the hot-plug: when the guest says hotplug-ready, a
# virtio-serial PCI device (its driver is built into Debian's kernel) is
# added through the monitor.
(
    for _ in $(seq 1 "$BOOT_LIMIT"); do
        if grep -q '^E2E hotplug-ready' "$OUT2" 2>/dev/null; then
            e2e_monitor "$LOG2" "device_add virtio-serial-pci,id=hot0" >"$WORK/hotplug.monitor" 2>&1
            exit 0
        fi
        sleep 1
    done
) &
HOTPLUG_PID=$!
E2E_TTY1_FLOOD=1 e2e_qemu "$KDIR/vmlinuz" "$IMAGE" "console=ttyS0 panic=-1 $PLAN_CMDLINE e2e.hotplug=1 e2e.trace=1" "$LOG2" "$BOOT_LIMIT" || rc=$?
kill "$HOTPLUG_PID" 2>/dev/null
wait "$HOTPLUG_PID" 2>/dev/null
phase_end
if [ "$rc" = 124 ]; then
    fail "image boot finishes within ${BOOT_LIMIT}s" "time limit hit"
    log_failed "$LOG2"
elif [ "$rc" != 0 ]; then
    fail "image boot" "qemu exited with $rc"
    log_failed "$LOG2"
fi
check "image: kernel is PREEMPT_RT" 1 "$(e2e_guest_value "$OUT2" realtime)" "$LOG2"
check "image: /sys/devices/system/cpu/isolated equals the plan" "$PLAN_ISOLATED" "$(e2e_guest_value "$OUT2" isolated)" "$LOG2"
check_cmdline "$LOG2" "$(e2e_guest_value "$OUT2" cmdline)"
if ! e2e_serial_clean "$OUT2" | grep -c '^E2E controllers-running' >/dev/null; then
    fail "the supervisor starts talker and listener" "they were not both running within 240 s"
    log_failed "$LOG2"
else
    pass "the supervisor starts talker and listener"
fi

STATUS=$(block "$OUT2" status-json | json_of)
if [ -n "$STATUS" ]; then
    step=$(jq -c '[.startup[]? | select(.step == "cpu plan")][0] // empty' <<<"$STATUS")
    if [ "$(jq -r '.result' <<<"$step" 2>/dev/null)" = ok ]; then
        pass "the supervisor applied the CPU plan ($(jq -r '.detail' <<<"$step"))"
    else
        fail "the supervisor applied the CPU plan" "startup step: ${step:-missing}"
        log_failed "$LOG2"
    fi
    # Each process runs with the planned policy, priority and CPUs, as the
    # kernel reports them (deploy status reads them back from /proc).
    for name in $(jq -r '.processes[].name' <<<"$PLAN_JSON"); do
        want=$(jq -c --arg n "$name" '.processes[] | select(.name == $n) | {policy, priority, cpus}' <<<"$PLAN_JSON")
        got=$(jq -c --arg n "$name" '.processes[] | select(.name == $n) | .in_force // {} | {policy, priority, cpus}' <<<"$STATUS")
        check "$name runs with the planned policy, priority and CPUs (read back from the kernel)" "$want" "$got" "$LOG2"
    done
fi
check_irq_threads "$LOG2" "$(block "$OUT2" irqthreads)" "supervisor as PID 1 applies the plan: IRQ threads carry the planned priorities and CPUs"

# The hot-added device: its IRQ threads appeared after start-up and the
# supervisor's scan placed them.
HOT_NEW=$(e2e_guest_value "$OUT2" hotplug-new)
if [ -z "$HOT_NEW" ]; then
    fail "a device hot-added through the QEMU monitor shows new IRQ threads" "$(e2e_guest_value "$OUT2" hotplug-appeared); monitor: $(cat "$WORK/hotplug.monitor" 2>/dev/null)"
    log_failed "$LOG2"
else
    pass "a device hot-added through the QEMU monitor shows new IRQ threads ($HOT_NEW)"
    hot_lines=$(block "$OUT2" irqthreads-hotplug | while read -r pid comm rest; do
        case " $HOT_NEW " in *" $comm "*) echo "$pid $comm $rest" ;; esac
    done)
    check_irq_threads "$LOG2" "$hot_lines" "the running supervisor places the hot-added device's IRQ threads as robot.yaml says"
    scan=$(block "$OUT2" status-hotplug-json | json_of | jq -c '.irq_scan // empty' 2>/dev/null)
    if [ "$(jq -r '.result' <<<"$scan" 2>/dev/null)" = ok ]; then
        pass "deploy status says what the scan placed ($(jq -r '.detail' <<<"$scan" | cut -c1-160))"
    else
        fail "deploy status says what the scan placed" "irq_scan: ${scan:-missing}"
        log_failed "$LOG2"
    fi
fi

# Why was it late: a traced check with each planted interferer on the
# receiver's CPU (driver.sh) misses its budget, and a verdict names it.
# trace_named NAME PATTERN WHAT: the JSON report of block NAME.
trace_named() {
    local doc verdicts named
    doc=$(block "$OUT2" "$1" | json_of)
    if [ -z "$doc" ]; then
        fail "$3" "no JSON report (exit $(block_rc "$OUT2" "$1")): $(block "$OUT2" "$1-stderr" | head -n 20)"
        log_failed "$LOG2"
        return
    fi
    if [ "$(jq -r '.trace.enabled' <<<"$doc")" != true ]; then
        fail "$3" "the check ran untraced: $(jq -r '.trace.reason // "no reason given"' <<<"$doc")"
        log_failed "$LOG2"
        return
    fi
    # The deliveries' verdicts (the timer phase's are asserted apart).
    verdicts=$(jq -r '.trace.verdicts[]? | select(.timer_cpu == null) | .verdict' <<<"$doc")
    named=$(grep -F -m1 -- "$2" <<<"$verdicts")
    if [ "$(jq -r '.verdict' <<<"$doc")" = fail ] && [ -n "$named" ]; then
        pass "$3 ($(grep -c . <<<"$verdicts") miss(es) traced; $(cut -c1-400 <<<"$named"))"
    else
        fail "$3" "verdict $(jq -r '.verdict' <<<"$doc"), $(jq -r '.trace.over_threshold' <<<"$doc") over the threshold; verdicts: $(head -n 8 <<<"$verdicts")"
        log_failed "$LOG2"
    fi
}
TRACE_CPU=$(e2e_guest_value "$OUT2" trace-receiver-cpu)
trace_named trace-spin "planted-spin (FIFO 90, pid " \
    "deploy check --trace in the guest: a verdict names the planted SCHED_FIFO spinner on the receiver's CPU ${TRACE_CPU:-?}"
# The same run's timer phase (timer_max 5 ms): the timer on that CPU.
timer_doc=$(block "$OUT2" trace-spin | json_of)
[ -n "$timer_doc" ] || timer_doc='{}'
timer_verdicts=$(jq -r --argjson cpu "${TRACE_CPU:-null}" \
    '.trace.verdicts[]? | select(.timer_cpu == $cpu) | .verdict' <<<"$timer_doc" 2>/dev/null)
timer_named=$(grep -F -m1 -- "planted-spin (FIFO 90, pid " <<<"$timer_verdicts")
if [ -n "$timer_named" ]; then
    pass "deploy check --trace in the guest: a timer verdict on CPU ${TRACE_CPU:-?} names the planted spinner ($(grep -c . <<<"$timer_verdicts") timer miss(es) traced there; $(cut -c1-200 <<<"$timer_named"))"
else
    fail "deploy check --trace in the guest: a timer verdict on CPU ${TRACE_CPU:-?} names the planted spinner" \
        "$(jq -r '"\(.trace.timer_over_threshold) timer wake(s) over \(.trace.timer_miss_threshold_ns) ns"' <<<"$timer_doc" 2>/dev/null); timer misses traced per CPU: $(jq -r '[.trace.verdicts[]? | select(.timer_cpu != null) | .timer_cpu] | group_by(.) | map("cpu\(.[0]) \(length)") | join(", ")' <<<"$timer_doc" 2>/dev/null); verdicts: $(jq -r '.trace.verdicts[]? | "[\(.timer_cpu)] \(.verdict)"' <<<"$timer_doc" 2>/dev/null | head -n 8)"
fi
# The supervisor tracing its running processes (driver.sh: a supervisor
# in a prefix whose listener on that CPU has a 5 ms wakeup budget).
rt_doc=$(block "$OUT2" trace-runtime | json_of)
[ -n "$rt_doc" ] || rt_doc='{}'
rt_why=$(jq -r '.processes[]? | select(.name == "listener") | .last_trace // empty' <<<"$rt_doc" 2>/dev/null)
rt_left=$(block "$OUT2" trace-runtime-instances | grep -c '^rtdeploy-')
if grep -qF "planted-spin (FIFO 90, pid " <<<"$rt_why" && [ "$rt_left" = 0 ]; then
    pass "the supervisor traces its running listener on CPU ${TRACE_CPU:-?} and its status names the planted spinner ($(cut -c1-300 <<<"$rt_why"))"
else
    fail "the supervisor traces its running listener on CPU ${TRACE_CPU:-?} and its status names the planted spinner" \
        "last_trace: ${rt_why:-none}; instances left after it stopped: $rt_left; supervisor: $(block "$OUT2" trace-runtime-log | tail -n 8)"
fi
# The serial port's IRQ thread, moved onto the receiver's CPU at FIFO 95
# and kept busy by input the host feeds without a pause.
trace_named trace-irq "ttyS1" \
    "deploy check --trace in the guest: a verdict names the serial port's IRQ thread moved onto the receiver's CPU ${TRACE_CPU:-?} ($(e2e_guest_value "$OUT2" trace-irq-affinity); $(block "$OUT2" trace-irq-threads | awk '$2 ~ /ttyS1/ {print $2, $3, $4, $5}' | head -n1))"

# deploy verify
vrc=$(block_rc "$OUT2" verify)
if [ "$vrc" = 0 ]; then
    pass "deploy verify exits 0 in the guest"
else
    fail "deploy verify exits 0 in the guest" "exit ${vrc:-missing}: $(block "$OUT2" verify; block "$OUT2" verify-stderr | head -n 30)"
    log_failed "$LOG2"
fi

# The boot check
if [ -z "$STATUS" ]; then
    fail "deploy status --json in the guest" "no JSON document: $(block "$OUT2" status-json; block "$OUT2" status-json-stderr | head -n 20)"
    log_failed "$LOG2"
else
    pass "deploy status --json in the guest"
    # The supervisor's verdict is in deploy status; the figures are in the
    # report it wrote, /var/lib/rtdeploy/boot-check.json.
    bc=$(jq -r '.boot_check // empty' <<<"$STATUS")
    REPORT=$(block "$OUT2" boot-check | json_of)
    case $bc in
    passed* | failed*)
        figures=$(jq -r '[.measurements[]? | select(.count > 0) |
            "\(.name) n=\(.count) p99 \(.p99_ns / 1000)us max \(.max_ns / 1000)us"] | join("; ")' <<<"$REPORT" 2>/dev/null)
        judged=$(jq -r '[.budgets[]? | select(.figure_ns != null)] | length' <<<"$REPORT" 2>/dev/null)
        if [ -n "$figures" ] && [ "${judged:-0}" -gt 0 ]; then
            pass "the boot check ran and its report has figures (status '$bc', verdict $(jq -r .verdict <<<"$REPORT"), $judged budgets judged: $figures)"
        else
            fail "the boot check ran and its report has figures" "status '$bc'; boot-check.json: $(block "$OUT2" boot-check | head -c 600; block "$OUT2" boot-check-stderr)"
            log_failed "$LOG2"
        fi
        ;;
    skipped*) skip "the boot check ran and its report has figures" "the supervisor skipped it: $bc" ;;
    *)
        fail "the boot check ran and its report has figures" "boot_check='$bc'"
        log_failed "$LOG2"
        ;;
    esac
fi

# Messages and the wake backend: the listener's log.
LLOG=$(block "$OUT2" listener-log)
count=$(grep -Eo '(received|messages)[= :]+[0-9]+' <<<"$LLOG" | grep -Eo '[0-9]+$' | sort -n | tail -n1)
if [ -z "$count" ]; then
    fail "the example controllers exchanged at least 1000 messages" "no message count in the listener's log: $(head -n 20 <<<"$LLOG")"
    log_failed "$LOG2"
elif [ "$count" -ge 1000 ]; then
    pass "the example controllers exchanged at least 1000 messages ($count)"
else
    fail "the example controllers exchanged at least 1000 messages" "only $count"
    log_failed "$LOG2"
fi
TLOG=$(block "$OUT2" talker-log)
if grep -q 'backend doorbell, class real-time' <<<"$LLOG" && grep -q 'backend doorbell, class real-time' <<<"$TLOG"; then
    pass "the real-time controllers report the doorbell backend and the real-time wake class"
else
    fail "the real-time controllers report the doorbell backend and the real-time wake class" "$(grep -ih backend <<<"$LLOG$TLOG" | head -n 3)"
    log_failed "$LOG2"
fi
# check_status_backend LOG STATUS BACKEND NAME: deploy status --json names
# BACKEND for talker and listener.
check_status_backend() {
    local got
    got=$(jq -r '[.processes[] | select(.name == "talker" or .name == "listener") | "\(.name)=\(.backend // "none")"] | sort | join(" ")' <<<"$2" 2>/dev/null)
    check "$4" "listener=$3 talker=$3" "$got" "$1"
}
check_status_backend "$LOG2" "$STATUS" doorbell "deploy status names each process's backend (real-time processes sleep on their doorbell)"

# SIGKILL and restart within the backoff
restart=$(e2e_guest_value "$OUT2" restart)
ms=$(sed -n 's/.* ms=\([0-9-]*\).*/\1/p' <<<"$restart")
# The talker's largest backoff: from the plan when it shows restart
# policies, else from its restart line in robot.yaml.
backoff=$(jq -r '.processes[] | select(.name == "talker") | .restart.max_backoff // empty' <<<"$PLAN_JSON")
if [ -z "$backoff" ]; then
    backoff=$(awk '/^  - name: /{in_p = ($3 == "talker")} in_p && /max_backoff:/{
        sub(/.*max_backoff: */, ""); sub(/[ },].*/, ""); print; exit}' "$CONFIG")
fi
if [ -z "$ms" ] || [ "$ms" -lt 0 ]; then
    fail "a controller killed with SIGKILL runs again within its backoff" "not running again within 60 s ($restart)"
    log_failed "$LOG2"
else
    # The restart comes after the first backoff; the bound allows the
    # largest backoff plus 3 s for software emulation and polling.
    bound_ms=
    if [ -n "$backoff" ]; then
        case $backoff in
        *ms) bound_ms=${backoff%ms} ;;
        *s) bound_ms=$((${backoff%s} * 1000)) ;;
        esac
    fi
    if [ -z "$bound_ms" ]; then
        pass "a controller killed with SIGKILL runs again (${ms} ms; backoff bound not in the plan, not checked)"
    elif [ "$ms" -le $((bound_ms + 3000)) ]; then
        pass "a controller killed with SIGKILL runs again within its backoff (${ms} ms, max_backoff $backoff)"
    else
        fail "a controller killed with SIGKILL runs again within its backoff" "${ms} ms, max_backoff $backoff"
        log_failed "$LOG2"
    fi
fi
AFTER=$(block "$OUT2" status-after-kill-json | json_of)
new_pid=$(sed -n 's/.* new=\([0-9]*\).*/\1/p' <<<"$restart")
if [ -n "$AFTER" ] && [ -n "$new_pid" ]; then
    t=$(jq -c '.processes[] | select(.name == "talker") | {state, pid, restarts}' <<<"$AFTER")
    if [ "$(jq -r '.state' <<<"$t")" = running ] && [ "$(jq -r '.pid' <<<"$t")" = "$new_pid" ] &&
        [ "$(jq -r '.restarts' <<<"$t")" -ge 1 ]; then
        pass "deploy status shows the restarted controller ($t)"
    else
        fail "deploy status shows the restarted controller" "$t (new pid $new_pid)"
        log_failed "$LOG2"
    fi
else
    fail "deploy status shows the restarted controller" "no status after the kill, or no restart"
    log_failed "$LOG2"
fi

# Orderly shutdown: the driver sent SIGTERM to PID 1; the supervisor stops
# the controllers and powers off (QEMU exits 0 with -no-reboot); init must
# never die.
if e2e_serial_clean "$LOG2" | grep -c 'Attempted to kill init' >/dev/null; then
    fail "shutdown is orderly" "PID 1 exited: $(e2e_serial_clean "$LOG2" | grep -m1 'Attempted to kill init')"
    log_failed "$LOG2"
elif ! e2e_serial_clean "$OUT2" | grep -c '^E2E driver-done' >/dev/null; then
    fail "shutdown is orderly" "the driver did not finish"
    log_failed "$LOG2"
elif [ "$rc" = 0 ] && e2e_serial_clean "$LOG2" | grep -c 'reboot: Power down' >/dev/null; then
    pass "shutdown is orderly (SIGTERM to PID 1 -> processes stopped -> power off)"
else
    fail "shutdown is orderly" "no power-off after SIGTERM (qemu exit $rc)"
    log_failed "$LOG2"
fi

# backend_boot LOG OUT RC WHAT BACKEND: the controllers of a boot of the
# image exchanged messages on BACKEND, and deploy status says so.
backend_boot() {
    local log=$1 out=$2 rc=$3 what=$4 backend=$5 llog count st
    if [ "$rc" = 124 ]; then
        fail "$what: boot finishes within ${BOOT_LIMIT}s" "time limit hit"
        log_failed "$log"
    elif [ "$rc" != 0 ]; then
        fail "$what: boot" "qemu exited with $rc"
        log_failed "$log"
    fi
    llog=$(block "$out" listener-log)
    count=$(grep -Eo '(received|messages)[= :]+[0-9]+' <<<"$llog" | grep -Eo '[0-9]+$' | sort -n | tail -n1)
    if [ -n "$count" ] && [ "$count" -ge 1000 ]; then
        pass "$what: the controllers exchanged at least 1000 messages ($count)"
    else
        fail "$what: the controllers exchanged at least 1000 messages" "${count:-no count}: $(head -n 5 <<<"$llog")"
        log_failed "$log"
    fi
    if grep -Eq "backend $backend" <<<"$llog$(block "$out" talker-log)"; then
        pass "$what: the controllers report the $backend backend"
    else
        fail "$what: the controllers report the $backend backend" "$(grep -i backend <<<"$llog" | head -n 2)"
        log_failed "$log"
    fi
    st=$(block "$out" status-json | json_of)
    check_status_backend "$log" "$st" "$backend" "$what: deploy status names the $backend backend"
    LAST_STATUS=$st
}

# ------------------------------- boot 3: io_uring and futex_waitv denied
phase_start "boot 3: image, io_uring + futex_waitv denied"
LOG3=$WORK/serial-deny.log OUT3=$WORK/serial-deny.log.hvc
rc=0
e2e_qemu "$KDIR/vmlinuz" "$IMAGE" "console=ttyS0 panic=-1 $PLAN_CMDLINE RTDEPLOY_DENY_SYSCALLS=io_uring,futex_waitv" "$LOG3" "$BOOT_LIMIT" || rc=$?
phase_end
backend_boot "$LOG3" "$OUT3" "$rc" "io_uring and futex_waitv denied" doorbell
step=$(jq -c '[.startup[]? | select(.step == "syscall filter")][0] // empty' <<<"$LAST_STATUS")
if [ "$(jq -r '.result' <<<"$step" 2>/dev/null)" = ok ]; then
    pass "io_uring and futex_waitv denied: the supervisor says so ($(jq -r '.detail' <<<"$step"))"
else
    fail "io_uring and futex_waitv denied: the supervisor says so" "startup step: ${step:-missing}"
    log_failed "$LOG3"
fi

# ----------------------------------------- boot 4: a 5.10 PREEMPT_RT kernel
if [ "${E2E_OLD_KERNEL:-1}" = 0 ]; then
    skip "5.10 kernel: the runtime picks the doorbell backend by itself" "E2E_OLD_KERNEL=0"
    finish
fi
phase_start "5.10 kernel (bullseye)"
if RTDEPLOY_KERNEL_SERIES=5.10 bash "$REPO/scripts/fetch-rt-kernel.sh"; then
    KDIR510=$E2E_CACHE/rt-kernel-5.10
else
    KDIR510=
fi
phase_end
if [ -z "$KDIR510" ]; then
    fail "5.10 kernel: fetched" "scripts/fetch-rt-kernel.sh failed (above)"
    finish
fi
phase_start "boot 4: image on 5.10-rt"
LOG4=$WORK/serial-5.10.log OUT4=$WORK/serial-5.10.log.hvc
rc=0
e2e_qemu "$KDIR510/vmlinuz" "$IMAGE" "console=ttyS0 panic=-1 $PLAN_CMDLINE" "$LOG4" "$BOOT_LIMIT" || rc=$?
phase_end
check "5.10 kernel: it is $(cat "$KDIR510/release"), PREEMPT_RT" 1 "$(e2e_guest_value "$OUT4" realtime)" "$LOG4"
backend_boot "$LOG4" "$OUT4" "$rc" "5.10 kernel" doorbell
# What the supervisor made of the plan on a kernel without isolated
# partitions (said, not asserted: robot.yaml's kernel: makes it an error
# before flashing).
e2e_log "5.10 kernel: cpu plan step: $(jq -c '[.startup[]? | select(.step == "cpu plan")][0]' <<<"$LAST_STATUS" 2>/dev/null)"

finish
