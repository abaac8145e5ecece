//! The few real-time calls the check makes for its own workers: SCHED_FIFO
//! where permitted, memory locking, and dying with the engine. (A thread's
//! policy and CPUs are set through [`units::sched`], absolute sleeps are
//! the runtime's [`controller::time::sleep_until`], the
//! `/dev/cpu_dma_latency` request its [`controller::rt::DmaLatencyHold`].)
#![allow(unsafe_code)]

use units::sched::{self, Policy, SchedAttr, SchedSetError};

/// Puts the calling thread under SCHED_FIFO at `priority`. `Ok(false)`
/// when the kernel refuses for lack of permission (not root, no
/// CAP_SYS_NICE, RLIMIT_RTPRIO 0): the caller runs on at normal priority
/// and the report says so.
pub fn set_fifo(priority: u32) -> Result<bool, SchedSetError> {
    match sched::set_attr(0, &SchedAttr::new(Policy::Fifo, priority)) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Locks and prefaults memory (the runtime's
/// [`controller::rt::lock_and_prefault`]) so the measuring path takes no page
/// fault. Returns whether it worked; without permission the run goes on.
pub fn lock_memory() -> bool {
    controller::rt::lock_and_prefault(256 << 10, 0).is_ok()
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
