#!/bin/sh
# The in-guest half of the end-to-end test: waits for the supervisor to run
# the controllers, then prints what the host asserts on, as
#   E2E <key> <value>                          single values
#   E2E-BLOCK-BEGIN <name> ... E2E-BLOCK-END <name> rc=<exit status> at=<uptime ms>
# and finally asks the supervisor (PID 1) for an orderly shutdown.
export PATH=/usr/bin:/bin:/usr/sbin:/sbin
say() { echo "E2E $*"; }
# block NAME COMMAND...: runs COMMAND; its stdout between marker lines,
# then its stderr as block NAME-stderr.
block() {
    name=$1
    shift
    echo "E2E-BLOCK-BEGIN $name"
    "$@" 2>/tmp/e2e-stderr
    rc=$?
    echo ""
    echo "E2E-BLOCK-END $name rc=$rc at=$(now_ms)"
    echo "E2E-BLOCK-BEGIN $name-stderr"
    cat /tmp/e2e-stderr
    echo "E2E-BLOCK-END $name-stderr rc=0"
}
# uptime in milliseconds (/proc/uptime has centiseconds)
now_ms() {
    read -r up _ </proc/uptime
    cs=${up#*.}
    cs=${cs#0}
    echo $((${up%.*} * 1000 + cs * 10))
}
# wait_for SECONDS COMMAND...: polls COMMAND every 0.2 s
wait_for() {
    limit=$(($(now_ms) + $1 * 1000))
    shift
    while ! "$@" >/dev/null 2>&1; do
        [ "$(now_ms)" -ge "$limit" ] && return 1
        sleep 0.2
    done
}
both_running() { pidof talker && pidof listener; }

# The supervisor mounts /proc; wait for it.
n=0
while [ ! -e /proc/self/stat ] && [ $n -lt 600 ]; do sleep 0.1; n=$((n + 1)); done
say "driver-start $(now_ms)"
say "realtime $(cat /sys/kernel/realtime 2>/dev/null || echo missing)"
say "isolated $(cat /sys/devices/system/cpu/isolated)"
say "cmdline $(cat /proc/cmdline)"

if wait_for 240 test -S /run/rtdeploy/control.sock; then
    say "control-socket up $(now_ms)"
else
    say "control-socket missing"
fi
if wait_for 240 both_running; then
    say "controllers-running $(now_ms)"
else
    say "controllers-not-running"
fi
# Let the controllers exchange messages (the talker sends one per ms) and
# send at least one timing report (once a second).
sleep "${E2E_RUN_SECONDS:-5}"

block status-json deploy status --json
block verify deploy verify
block verify-json deploy verify --json
# IRQ threads as the supervisor left them (after applying the plan).
irqthreads() {
    for d in /proc/[0-9]*; do
        comm=$(cat "$d/comm" 2>/dev/null) || continue
        case $comm in irq/*) ;; *) continue ;; esac
        stat=$(cat "$d/stat" 2>/dev/null) || continue
        rest=${stat##*) }
        # shellcheck disable=SC2086
        set -- $rest
        shift 37
        echo "${d#/proc/} $comm policy=$2 prio=$1 cpus=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' "$d/status")"
    done
}
block irqthreads irqthreads

# A device hot-added while the supervisor runs (the host adds a
# virtio-serial PCI device through the QEMU monitor when it reads
# hotplug-ready, on boots whose command line says e2e.hotplug=1): its
# MSI-X interrupts and their irq/* threads appear now, and the
# supervisor's next scan must place them as robot.yaml says.
case " $(cat /proc/cmdline) " in
*" e2e.hotplug=1 "*)
    before=$(irqthreads | awk '{print $2}' | sort | tr '\n' ' ')
    say "hotplug-ready $(now_ms)"
    new_threads() {
        irqthreads | awk '{print $2}' | sort | while read -r c; do
            case " $before " in *" $c "*) ;; *) echo "$c" ;; esac
        done | grep .
    }
    if wait_for 60 new_threads; then
        say "hotplug-appeared $(now_ms) $(new_threads | tr '\n' ' ')"
        # The scan runs every second; give it three.
        sleep 3
        block irqthreads-hotplug irqthreads
        block status-hotplug-json deploy status --json
        say "hotplug-new $(new_threads | tr '\n' ' ')"
    else
        say "hotplug-appeared none"
    fi
    ;;
esac
block talker-log cat /var/log/rtdeploy/talker.log
block listener-log cat /var/log/rtdeploy/listener.log
block boot-check cat /var/lib/rtdeploy/boot-check.json
block state-dir ls -lR /var/lib/rtdeploy /run/rtdeploy

# Kill the talker with SIGKILL and time its return.
old=$(pidof talker)
if [ -n "$old" ]; then
    t0=$(now_ms)
    kill -KILL "$old"
    new=
    limit=$((t0 + 60000))
    while [ "$(now_ms)" -lt "$limit" ]; do
        new=$(pidof talker)
        [ -n "$new" ] && [ "$new" != "$old" ] && break
        new=
        sleep 0.05
    done
    if [ -n "$new" ]; then
        say "restart old=$old new=$new ms=$(($(now_ms) - t0))"
    else
        say "restart old=$old new=none ms=-1"
    fi
    sleep 2
    block status-after-kill-json deploy status --json
    block status-after-kill deploy status
else
    say "restart old=none"
fi

# Why was it late (on boots whose command line says e2e.trace=1): the
# check traced, twice, each time with one planted interferer above its
# real-time priority (70) on the receiver's CPU (the second isolated one):
#   1. planted-spin, a SCHED_FIFO 90 process spinning 40 ms of every 100;
#   2. the IRQ thread of the second serial port, moved there at FIFO 95
#      by a robot.yaml that says so (deploy apply), the port kept busy by
#      input the host feeds it without a pause (the x86 runner's flooded second port).
# Under emulation the spins are longer than a board would need and the
# budgets wider (5 ms, 2 ms): emulation's own stalls must not hide them.
# The timer budget (5 ms) has the timer phase traced as well: the
# spinner must be named for the timer on its CPU too. That holds for a
# reason, not by luck: TCG's own stalls make timer misses on the other
# isolated CPU as well, and the first miss on either stops the trace
# until the engine has taken it (a few a second under emulation), so the
# spinner keeps its CPU's timer late for 40% of the time (every wake due
# in a spin is late by up to 40 ms, eight budgets), and the check runs
# 16 s: its timer phase (a quarter) has 4 s, some 40 spins, for the
# engine to take several misses, most of them on the spinner's CPU.
# The host asserts that a verdict names each.
case " $(cat /proc/cmdline) " in
*" e2e.trace=1 "*)
    iso=$(cat /sys/devices/system/cpu/isolated)
    rcpu=$(echo "$iso" | tr ',-' '  ' | awk '{print ($2 != "" ? $2 : $1)}')
    say "trace-receiver-cpu $rcpu"
    awk '
        /^check:$/ { print; print "  trace_on_miss: 40"; next }
        /^    delivery_max: / { print "    delivery_max: 5ms"; next }
        /^    timer_max: / { print "    timer_max: 5ms"; next }
        { print }
    ' /etc/rtdeploy/robot.yaml >/tmp/trace.yaml
    tools=/usr/lib/rtdeploy-e2e
    "$tools/planted-spin" --cpu "$rcpu" --priority 90 --busy-us 40000 --every-us 100000 \
        --seconds 90 >/tmp/planted-spin.log 2>&1 &
    spin=$!
    sleep 1
    block trace-spin-started cat /tmp/planted-spin.log
    block trace-spin deploy check -c /tmp/trace.yaml --duration 16s --json -q --no-verify \
        --trace=/tmp/trace-spin

    # The supervisor's tracing of its running processes: a second
    # supervisor in a prefix (its own channel and processes, the release's
    # programs) with check.trace_on_miss, whose listener waits on the
    # receiver's CPU with a 5 ms wakeup budget; the spinner makes it late
    # and its status names the spinner.
    rt=/tmp/rtsup
    mkdir -p "$rt/etc/rtdeploy"
    cat >"$rt/etc/rtdeploy/robot.yaml" <<YAML
robot:
  name: runtime-trace
board:
  model: qemu-x86_64
cpus:
  housekeeping: 0-1
  isolated: 2-3
boot_check:
  enabled: false
check:
  trace_on_miss: 3
channels:
  - name: /demo/ping
    max_size: 64
    rate: 2000
    retention: 100ms
processes:
  - name: talker
    exec: $(readlink "/proc/$(pidof talker | cut -d' ' -f1)/exe")
    args: [--channel, /demo/ping, --period-us, "1000"]
    policy: fifo
    priority: 70
    cpus: 2
    publishes: [/demo/ping]
  - name: listener
    exec: $(readlink "/proc/$(pidof listener | cut -d' ' -f1)/exe")
    args: [--channel, /demo/ping]
    policy: fifo
    priority: 70
    cpus: $rcpu
    subscribes: [/demo/ping]
    budgets: {wakeup: 5ms}
    after: [talker]
YAML
    deploy -q --prefix "$rt" supervise --skip-cpu-plan >/tmp/rtsup.log 2>&1 &
    rtsup=$!
    n=0
    while [ $n -lt 60 ] && ! deploy --prefix "$rt" status --json 2>/dev/null | grep -q 'planted-spin ('; do
        sleep 0.5
        n=$((n + 1))
    done
    block trace-runtime deploy --prefix "$rt" status --json
    kill -TERM "$rtsup" 2>/dev/null
    wait "$rtsup" 2>/dev/null
    block trace-runtime-log cat /tmp/rtsup.log
    block trace-runtime-instances ls /sys/kernel/tracing/instances
    kill "$spin" 2>/dev/null
    wait "$spin" 2>/dev/null

    # The port's interrupt is requested when it is opened; the supervisor's
    # scan places its new thread as robot.yaml says, then the interfering
    # robot.yaml moves both onto the receiver's CPU. Raw and without echo:
    # the input the host feeds is read by the handler and dropped by the
    # tty, never written back.
    stty -F /dev/ttyS1 raw -echo 2>/dev/null
    exec 4</dev/ttyS1
    sleep 3
    awk -v cpu="$rcpu" '
        { print }
        /^irqs:$/ { print "  overrides:\n    - name: ttyS1\n      cpus: " cpu }
        /^      cpus: 0-1$/ && !done { print "    - match: \"irq/*-ttyS1\"\n      policy: fifo\n      priority: 95\n      cpus: " cpu; done = 1 }
    ' /tmp/trace.yaml >/tmp/trace-irq.yaml
    block trace-irq-apply deploy apply -c /tmp/trace-irq.yaml
    irq=$(awk '/ttyS1/ { sub(":", "", $1); print $1; exit }' /proc/interrupts)
    say "trace-irq-affinity irq ${irq:-none} $(cat "/proc/irq/$irq/smp_affinity_list" 2>/dev/null) effective $(cat "/proc/irq/$irq/effective_affinity_list" 2>/dev/null)"
    # The host's input keeps the port's receive interrupts coming while it
    # is open; the budget is 2 ms.
    sed 's/delivery_max: 5ms/delivery_max: 2ms/' /tmp/trace-irq.yaml >/tmp/trace-irq2.yaml
    block trace-irq deploy check -c /tmp/trace-irq2.yaml --duration 5s --json -q --no-verify \
        --trace=/tmp/trace-irq
    block trace-irq-threads irqthreads
    exec 4>&-
    block trace-restore deploy apply
    ;;
esac

block status-end-json deploy status --json
say "driver-done $(now_ms)"
case " $(cat /proc/cmdline) " in
*" e2e.freeze=1 "*)
    # The supervisor (a child of /init on this boot) frozen: it stops
    # feeding the watchdog, which resets the machine after its timeout.
    sup=$(cat /run/e2e-supervisor.pid)
    block watchdog-before-freeze deploy status
    say "freezing $sup $(now_ms)"
    kill -STOP "$sup"
    say "frozen $(sed -n 's/^State:[[:space:]]*//p' "/proc/$sup/status") $(now_ms)"
    sleep 1000
    ;;
esac
# Orderly shutdown: SIGTERM to the supervisor, which is PID 1.
kill -TERM 1
sleep 1000
