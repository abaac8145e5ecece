#!/bin/sh
# /init of the end-to-end image: mounts /dev (devtmpfs; the supervisor
# mounts /proc, /sys, cgroup2, /dev/shm and /run itself when they are
# missing), loads the hardware watchdog's driver, starts the test driver
# in the background, then execs `deploy supervise`, which runs as PID 1
# from there on.
#
# With e2e.freeze=1 on the command line the supervisor runs as a child of
# this shell instead (PID 1 ignores SIGSTOP), with what it would mount
# mounted here, so that the driver can freeze it and the host can see the
# watchdog reset the machine.
export PATH=/usr/bin:/bin:/usr/sbin:/sbin
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /proc && mount -t proc proc /proc
# Warnings and worse only on the console: the host parses it line by line.
echo 4 >/proc/sys/kernel/printk
freeze=0
case " $(cat /proc/cmdline) " in *" e2e.freeze=1 "*) freeze=1 ;; esac
# The watchdog's driver, as udev would load it on a board: QEMU's i6300esb
# (the host adds the device), with nowayout, so that once the supervisor
# opened it only a reset stops it. A kernel the modules were not built for
# refuses them: the supervisor then runs without a watchdog and says so.
mods=/usr/lib/rtdeploy-e2e/modules
if [ -s $mods/order ]; then
    for m in $(cat $mods/order); do
        case $m in i6300esb.ko) arg=nowayout=1 ;; *) arg= ;; esac
        # shellcheck disable=SC2086
        insmod "$mods/$m" $arg 2>/dev/null || echo "init: insmod $m failed"
    done
fi
[ "$freeze" = 1 ] || umount /proc
# The driver writes to the virtio console (/dev/hvc0), where nothing else
# writes; the serial console keeps the kernel's and the supervisor's lines.
# Without a virtio console (a kernel with virtio as modules), the second
# serial port. (A redirection to a missing device would make a file.)
if [ -c /dev/hvc0 ]; then
    exec 3>/dev/hvc0
elif [ -c /dev/ttyS1 ]; then
    exec 3>/dev/ttyS1
else
    exec 3>/dev/console
fi
if [ "$freeze" = 0 ]; then
    /usr/lib/rtdeploy-e2e/driver.sh </dev/null >&3 2>&1 &
    exec 3>&-
    exec /usr/bin/deploy supervise --poweroff-on-exit
fi
mkdir -p /sys /dev/shm /run
mount -t sysfs sysfs /sys
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=0755 tmpfs /run
/usr/bin/deploy supervise </dev/null &
sup=$!
echo "$sup" >/run/e2e-supervisor.pid
/usr/lib/rtdeploy-e2e/driver.sh </dev/null >&3 2>&1 &
exec 3>&-
# A stopped child does not end `wait`; one that exits ends the boot.
while kill -0 "$sup" 2>/dev/null; do
    wait "$sup"
    sleep 1
done
echo "init: the supervisor exited; powering off"
poweroff -f
