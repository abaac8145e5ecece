//! The few real-time calls the check makes for its own workers, through
//! the runtime's: SCHED_FIFO, CPU pinning, memory locking, and dying with
//! the engine. (Absolute sleeps are the runtime's
//! [`controller::time::sleep_until`], the `/dev/cpu_dma_latency` request
//! its [`controller::rt::DmaLatencyHold`].)
#![allow(unsafe_code)]

use controller::rt::{Policy, RtSetupError};

/// Puts the calling thread under SCHED_FIFO at `priority` (through the
/// runtime's [`controller::rt::set_sched`]). `Ok(false)` when the kernel refuses
/// for lack of permission (not root, no CAP_SYS_NICE, RLIMIT_RTPRIO 0): the
/// caller runs on at normal priority and the report says so.
pub fn set_fifo(priority: u32) -> Result<bool, RtSetupError> {
    match controller::rt::set_sched(Policy::Fifo, priority) {
        Ok(()) => Ok(true),
        Err(RtSetupError::Sched { source, .. }) if source.raw_os_error() == Some(libc::EPERM) => {
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// Pins the calling thread to `cpus` (the runtime's [`controller::rt::pin_cpus`]).
pub fn pin_to_set(cpus: &[usize]) -> Result<(), RtSetupError> {
    controller::rt::pin_cpus(cpus)
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
