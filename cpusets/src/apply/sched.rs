//! The two scheduler syscalls `apply` needs, which std does not wrap:
//! [sched_setscheduler(2)](https://man7.org/linux/man-pages/man2/sched_setscheduler.2.html)
//! and [sched_setaffinity(2)](https://man7.org/linux/man-pages/man2/sched_setaffinity.2.html).
#![allow(unsafe_code)]

use std::io;

use units::cpu::CpuSet;

/// Sets the scheduling policy and real-time priority of thread `tid`.
pub fn set_scheduler(tid: u32, policy: u32, priority: u32) -> io::Result<()> {
    let param = libc::sched_param {
        sched_priority: priority as libc::c_int,
    };
    // SAFETY: `param` is a valid, initialised sched_param that lives for the
    // whole call; the kernel only reads it.
    let rc = unsafe { libc::sched_setscheduler(tid as libc::pid_t, policy as libc::c_int, &param) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Restricts thread `tid` to `cpus`.
pub fn set_affinity(tid: u32, cpus: &CpuSet) -> io::Result<()> {
    // SAFETY: cpu_set_t is a plain bit array for which all-zero is the empty
    // set, a valid value.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let max = 8 * std::mem::size_of::<libc::cpu_set_t>() as u32;
    for cpu in cpus.iter() {
        if cpu >= max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cpu {cpu} is beyond the {max} CPUs cpu_set_t holds"),
            ));
        }
        // SAFETY: `cpu` is below the bit count of `set`, checked above, so
        // CPU_SET stays inside the array.
        unsafe { libc::CPU_SET(cpu as usize, &mut set) };
    }
    // SAFETY: `set` is initialised and the size passed is its exact size;
    // the kernel only reads it.
    let rc = unsafe {
        libc::sched_setaffinity(
            tid as libc::pid_t,
            std::mem::size_of::<libc::cpu_set_t>(),
            &set,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
