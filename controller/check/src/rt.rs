//! The few real-time calls the check makes for its own threads and
//! workers: SCHED_FIFO, CPU pinning, memory locking, absolute sleeps on
//! `CLOCK_MONOTONIC`, and holding a `/dev/cpu_dma_latency` request.
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

use controller::rt::{Policy, RtSetupError};

/// Puts the calling thread under SCHED_FIFO at `priority` (through the
/// runtime's [`controller::rt::set_sched`]). `Ok(false)` when the kernel refuses
/// for lack of permission (not root, no CAP_SYS_NICE, RLIMIT_RTPRIO 0): the
/// caller runs on at normal priority and the report says so.
pub fn set_fifo(priority: u32) -> io::Result<bool> {
    match controller::rt::set_sched(Policy::Fifo, priority) {
        Ok(()) => Ok(true),
        Err(RtSetupError::Sched { source, .. }) if source.raw_os_error() == Some(libc::EPERM) => {
            Ok(false)
        }
        Err(e) => Err(io::Error::other(e.to_string())),
    }
}

/// Pins the calling thread to `cpus` (the runtime's [`controller::rt::pin_cpus`]).
pub fn pin_to_set(cpus: &[usize]) -> io::Result<()> {
    controller::rt::pin_cpus(cpus).map_err(|e| io::Error::other(e.to_string()))
}

/// Locks and prefaults memory (the runtime's
/// [`controller::rt::lock_and_prefault`]) so the measuring path takes no page
/// fault. Returns whether it worked; without permission the run goes on.
pub fn lock_memory() -> bool {
    controller::rt::lock_and_prefault(256 << 10, 0).is_ok()
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
