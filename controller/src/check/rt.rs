//! The few real-time calls the check makes for its own threads and
//! workers: SCHED_FIFO, CPU pinning, memory locking, absolute sleeps on
//! `CLOCK_MONOTONIC`, and holding a `/dev/cpu_dma_latency` request.
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

/// Puts the calling thread under SCHED_FIFO at `priority`. `Ok(false)`
/// when the kernel refuses for lack of permission (not root, no
/// CAP_SYS_NICE, RLIMIT_RTPRIO 0): the caller runs on at normal priority
/// and says so.
pub fn set_fifo(priority: u32) -> io::Result<bool> {
    let param = libc::sched_param {
        sched_priority: priority as libc::c_int,
    };
    // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param
    // that outlives the call.
    let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
    if r == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EPERM) => Ok(false),
        _ => Err(e),
    }
}

/// The calling thread's scheduling policy is SCHED_FIFO.
pub fn is_fifo() -> bool {
    // SAFETY: pid 0 is the calling thread; the call has no pointers.
    unsafe { libc::sched_getscheduler(0) == libc::SCHED_FIFO }
}

/// Pins the calling thread to one CPU.
pub fn pin_to(cpu: usize) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("cpu {cpu} is out of range"),
        ));
    }
    // SAFETY: `cpu` is below CPU_SETSIZE (checked above), so the bit is
    // inside `set`.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pid 0 is the calling thread; `set` is a valid cpu_set_t of
    // the size passed.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Pins the calling thread to a set of CPUs.
pub fn pin_to_set(cpus: &[usize]) -> io::Result<()> {
    // SAFETY: as in `pin_to`.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
        // SAFETY: `c` is below CPU_SETSIZE (filtered), so the bit is inside
        // `set`.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: as in `pin_to`.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Locks current and future pages (no page fault on the measuring path).
/// Returns whether it worked; without permission the run goes on.
pub fn lock_memory() -> bool {
    // SAFETY: mlockall takes flags only.
    unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) == 0 }
}

/// Sleeps until `deadline_ns` on `CLOCK_MONOTONIC` (absolute), retrying on
/// signals.
#[inline]
pub fn sleep_until(deadline_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (deadline_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (deadline_ns % 1_000_000_000) as libc::c_long,
    };
    loop {
        // SAFETY: `ts` is a valid timespec; the remainder pointer may be
        // null with TIMER_ABSTIME.
        let r = unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_MONOTONIC,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            )
        };
        if r != libc::EINTR {
            return;
        }
    }
}

/// A `/dev/cpu_dma_latency` request, held while the file stays open.
#[derive(Debug)]
pub struct DmaLatencyHold {
    _file: File,
    pub value_us: u32,
}

/// Opens `<sysroot>/dev/cpu_dma_latency` and writes `value_us` (a binary
/// `s32`, as the PM QoS interface takes it). The request holds until the
/// returned value is dropped.
pub fn hold_dma_latency(sysroot: &Path, value_us: u32) -> io::Result<DmaLatencyHold> {
    let path = sysroot.join("dev/cpu_dma_latency");
    let mut f = OpenOptions::new().write(true).open(&path)?;
    f.write_all(&(value_us as i32).to_ne_bytes())?;
    Ok(DmaLatencyHold { _file: f, value_us })
}

/// Asks the kernel to SIGKILL the calling process when its parent dies, so
/// a worker never outlives the engine that started it.
pub fn die_with_parent() {
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes integer arguments only.
    unsafe {
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
}
