#!/bin/sh
# /init of the end-to-end image: mounts /dev (devtmpfs; the supervisor
# mounts /proc, /sys, cgroup2, /dev/shm and /run itself when they are
# missing), starts the test driver in the background, then execs
# `deploy supervise`, which runs as PID 1 from there on.
export PATH=/usr/bin:/bin:/usr/sbin:/sbin
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /proc && mount -t proc proc /proc
# Warnings and worse only on the console: the host parses it line by line.
echo 4 >/proc/sys/kernel/printk
umount /proc
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
/usr/lib/rtdeploy-e2e/driver.sh </dev/null >&3 2>&1 &
exec 3>&-
exec /usr/bin/deploy supervise --poweroff-on-exit
