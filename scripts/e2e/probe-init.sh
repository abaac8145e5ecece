#!/bin/sh
# /init of the probe initramfs: reports the kernel's real-time state on the
# virtio console (/dev/hvc0; the serial console when there is none) as
# "E2E <key> <value>" lines, optionally captures the files
# `deploy verify` reads (when /etc/e2e-capture exists) as a base64 tar between
# E2E-FIXTURE-BEGIN / E2E-FIXTURE-END lines, then powers off.
export PATH=/usr/bin:/bin:/usr/sbin:/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run

# The test's lines go to the virtio console when there is one: nothing else
# writes there.
[ -c /dev/hvc0 ] && exec >/dev/hvc0 2>&1

say() { echo "E2E $*"; }

# Only emergencies on the console from here: kernel messages must not land
# inside the lines the host parses.
echo 1 >/proc/sys/kernel/printk

say "begin"
say "uname $(uname -r)"
say "realtime $(cat /sys/kernel/realtime 2>/dev/null || echo missing)"
say "isolated $(cat /sys/devices/system/cpu/isolated)"
say "nohz_full $(cat /sys/devices/system/cpu/nohz_full 2>/dev/null || echo missing)"
say "online $(cat /sys/devices/system/cpu/online)"
say "cmdline $(cat /proc/cmdline)"

# Kernel interrupt threads: pid, comm, policy (stat field 41) and
# rt_priority (field 40). comm is taken from /proc/PID/comm; the fields after
# the ") " that closes comm in stat start at field 3.
for d in /proc/[0-9]*; do
    comm=$(cat "$d/comm" 2>/dev/null) || continue
    case $comm in irq/*) ;; *) continue ;; esac
    stat=$(cat "$d/stat" 2>/dev/null) || continue
    rest=${stat##*) }
    # shellcheck disable=SC2086
    set -- $rest
    shift 37
    say "irqthread ${d#/proc/} $comm policy=$2 prio=$1"
done

if [ -e /etc/e2e-capture ]; then
    fx=/tmp/fx
    mkdir -p $fx
    # grab PATH...: copies each readable file under its own path below $fx
    # (proc and sys files report size 0, so tar cannot read them directly).
    grab() {
        for f in "$@"; do
            [ -f "$f" ] || continue
            mkdir -p "$fx$(dirname "$f")"
            cat "$f" >"$fx$f" 2>/dev/null || rm -f "$fx$f"
        done
    }
    grab /proc/cmdline /proc/interrupts /proc/version /proc/stat /proc/softirqs \
        /proc/irq/default_smp_affinity \
        /proc/sys/kernel/sched_rt_runtime_us /proc/sys/kernel/sched_rt_period_us \
        /proc/sys/kernel/timer_migration /proc/sys/vm/stat_interval \
        /proc/sys/kernel/sched_autogroup_enabled /proc/sys/kernel/watchdog \
        /proc/sys/kernel/nmi_watchdog /proc/sys/kernel/watchdog_cpumask \
        /sys/kernel/realtime \
        /sys/devices/system/cpu/isolated /sys/devices/system/cpu/nohz_full \
        /sys/devices/system/cpu/online /sys/devices/system/cpu/possible \
        /sys/devices/system/cpu/present /sys/devices/system/cpu/offline \
        /sys/devices/system/cpu/kernel_max \
        /sys/devices/virtual/workqueue/cpumask \
        /sys/devices/virtual/workqueue/writeback/cpumask
    for c in /sys/devices/system/cpu/cpu[0-9]*; do
        grab "$c/online" "$c/topology/core_id" "$c/topology/physical_package_id" \
            "$c/topology/thread_siblings_list" "$c/topology/cluster_id"
        if [ -d "$c/cpufreq" ]; then
            for f in "$c"/cpufreq/*; do grab "$f"; done
        fi
        if [ -d "$c/cpuidle" ]; then
            for s in "$c"/cpuidle/state*; do grab "$s/name" "$s/latency" "$s/disable"; done
        fi
    done
    for i in /proc/irq/[0-9]*; do
        grab "$i/smp_affinity" "$i/smp_affinity_list" "$i/effective_affinity" \
            "$i/effective_affinity_list" "$i/node"
        # The directory per handler names the device (/proc/irq/4/ttyS0).
        for h in "$i"/*; do
            [ -d "$h" ] && mkdir -p "$fx$h"
        done
    done
    # Kernel threads (kthreadd and its children) and PID 1.
    for d in /proc/[0-9]*; do
        pid=${d#/proc/}
        ppid=$(sed -n 's/^PPid:[[:space:]]*//p' "$d/status" 2>/dev/null)
        if [ "$pid" = 1 ] || [ "$pid" = 2 ] || [ "$ppid" = 2 ]; then
            grab "$d/stat" "$d/status" "$d/comm" "$d/cmdline"
        fi
    done

    # cgroup v2 and the cpuset partition the supervisor asks for.
    mkdir -p /sys/fs/cgroup
    cg=/sys/fs/cgroup
    steps=$fx/_capture/cgroup-steps.txt
    mkdir -p $fx/_capture
    step() {
        # step DESCRIPTION VALUE FILE: writes VALUE to FILE, records the result
        if echo "$2" >"$3" 2>/tmp/err; then
            echo "ok: $1: echo '$2' > $3" >>$steps
        else
            echo "FAILED: $1: echo '$2' > $3: $(cat /tmp/err)" >>$steps
        fi
    }
    if mount -t cgroup2 cgroup2 $cg 2>/tmp/err; then
        echo "ok: mount -t cgroup2 cgroup2 $cg" >>$steps
        step "enable cpuset below the root" +cpuset $cg/cgroup.subtree_control
        # A child partition directly under the root.
        mkdir $cg/e2e-isolated
        step "cpus of e2e-isolated" 2-3 $cg/e2e-isolated/cpuset.cpus
        step "make e2e-isolated an isolated partition" isolated $cg/e2e-isolated/cpuset.cpus.partition
        echo "read back: e2e-isolated/cpuset.cpus.partition = $(cat $cg/e2e-isolated/cpuset.cpus.partition)" >>$steps
        grab $cg/cgroup.controllers $cg/cgroup.subtree_control $cg/cpuset.cpus.effective \
            $cg/cpuset.cpus.isolated $cg/cpuset.mems.effective
        for f in $cg/e2e-isolated/cgroup.* $cg/e2e-isolated/cpuset.*; do grab "$f"; done
        step "back to member" member $cg/e2e-isolated/cpuset.cpus.partition
        rmdir $cg/e2e-isolated
        # The agreed layout: rtdeploy (a root partition) with rt (isolated)
        # and housekeeping children.
        mkdir -p $fx/_capture/rtdeploy-layout
        mkdir $cg/rtdeploy
        step "cpus of rtdeploy" 0-3 $cg/rtdeploy/cpuset.cpus
        step "enable cpuset below rtdeploy" +cpuset $cg/rtdeploy/cgroup.subtree_control
        mkdir $cg/rtdeploy/rt $cg/rtdeploy/housekeeping
        step "cpus of rtdeploy/housekeeping" 0-1 $cg/rtdeploy/housekeeping/cpuset.cpus
        step "cpus of rtdeploy/rt" 2-3 $cg/rtdeploy/rt/cpuset.cpus
        step "rt isolated while rtdeploy is a member" isolated $cg/rtdeploy/rt/cpuset.cpus.partition
        echo "read back: rtdeploy/rt/cpuset.cpus.partition = $(cat $cg/rtdeploy/rt/cpuset.cpus.partition)" >>$steps
        step "rt back to member" member $cg/rtdeploy/rt/cpuset.cpus.partition
        step "make rtdeploy a root partition" root $cg/rtdeploy/cpuset.cpus.partition
        echo "read back: rtdeploy/cpuset.cpus.partition = $(cat $cg/rtdeploy/cpuset.cpus.partition)" >>$steps
        step "make rtdeploy/rt an isolated partition" isolated $cg/rtdeploy/rt/cpuset.cpus.partition
        echo "read back: rtdeploy/rt/cpuset.cpus.partition = $(cat $cg/rtdeploy/rt/cpuset.cpus.partition)" >>$steps
        for d in $cg/rtdeploy $cg/rtdeploy/rt $cg/rtdeploy/housekeeping; do
            for f in "$d"/cgroup.controllers "$d"/cgroup.subtree_control "$d"/cgroup.type "$d"/cpuset.*; do
                [ -f "$f" ] || continue
                mkdir -p "$fx/_capture/rtdeploy-layout$(dirname "$f")"
                cat "$f" >"$fx/_capture/rtdeploy-layout$f" 2>/dev/null
            done
        done
        grab $cg/cpuset.cpus.isolated
        cat $cg/cpuset.cpus.isolated >$fx/_capture/rtdeploy-layout/root-cpuset.cpus.isolated 2>/dev/null
        cat /sys/devices/system/cpu/isolated >$fx/_capture/rtdeploy-layout/sys-cpu-isolated 2>/dev/null
        step "rt back to member" member $cg/rtdeploy/rt/cpuset.cpus.partition
        step "rtdeploy back to member" member $cg/rtdeploy/cpuset.cpus.partition
        # A remote partition (6.7+): the CPUs are handed down through
        # cpuset.cpus.exclusive while rtdeploy itself stays a member.
        step "exclusive cpus of rtdeploy" 2-3 $cg/rtdeploy/cpuset.cpus.exclusive
        step "exclusive cpus of rtdeploy/rt" 2-3 $cg/rtdeploy/rt/cpuset.cpus.exclusive
        step "make rtdeploy/rt an isolated (remote) partition" isolated $cg/rtdeploy/rt/cpuset.cpus.partition
        echo "read back: rtdeploy/rt/cpuset.cpus.partition = $(cat $cg/rtdeploy/rt/cpuset.cpus.partition)" >>$steps
        echo "read back: root cpuset.cpus.isolated = $(cat $cg/cpuset.cpus.isolated 2>/dev/null)" >>$steps
        echo "read back: /sys/devices/system/cpu/isolated = $(cat /sys/devices/system/cpu/isolated)" >>$steps
        echo "read back: rtdeploy/housekeeping/cpuset.cpus.effective = $(cat $cg/rtdeploy/housekeeping/cpuset.cpus.effective)" >>$steps
        for d in $cg/rtdeploy $cg/rtdeploy/rt $cg/rtdeploy/housekeeping; do
            for f in "$d"/cgroup.controllers "$d"/cgroup.subtree_control "$d"/cgroup.type "$d"/cpuset.*; do
                [ -f "$f" ] || continue
                mkdir -p "$fx/_capture/rtdeploy-remote$(dirname "$f")"
                cat "$f" >"$fx/_capture/rtdeploy-remote$f" 2>/dev/null
            done
        done
        cat $cg/cpuset.cpus.isolated >$fx/_capture/rtdeploy-remote/root-cpuset.cpus.isolated 2>/dev/null
        cat /sys/devices/system/cpu/isolated >$fx/_capture/rtdeploy-remote/sys-cpu-isolated 2>/dev/null
        step "rt back to member" member $cg/rtdeploy/rt/cpuset.cpus.partition
        rmdir $cg/rtdeploy/rt $cg/rtdeploy/housekeeping $cg/rtdeploy
    else
        echo "FAILED: mount -t cgroup2: $(cat /tmp/err)" >>$steps
    fi
    grab /proc/mounts /proc/filesystems /proc/self/mountinfo

    # The second /proc/interrupts sample, a second after the first, as its
    # own sysroot.
    grab /proc/interrupts /proc/stat
    sleep 1
    mkdir -p $fx/_second/proc
    cat /proc/interrupts >$fx/_second/proc/interrupts
    cat /proc/stat >$fx/_second/proc/stat
    date -u >$fx/_capture/captured-at
    (cd $fx && tar -cf - . | gzip -9 >/tmp/fx.tar.gz)
    say "fixture bytes $(wc -c </tmp/fx.tar.gz)"
    echo "E2E-FIXTURE-BEGIN"
    base64 </tmp/fx.tar.gz
    echo "E2E-FIXTURE-END"
fi

say "end"
sync
poweroff -f
