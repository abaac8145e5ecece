//! The scheduling policy, priority, nice value and CPU affinity of one
//! thread, set and read back:
//! [sched_setattr(2)](https://man7.org/linux/man-pages/man2/sched_setattr.2.html),
//! [sched_getattr(2)](https://man7.org/linux/man-pages/man2/sched_getattr.2.html),
//! [sched_setaffinity(2)](https://man7.org/linux/man-pages/man2/sched_setaffinity.2.html)
//! and [sched_getaffinity(2)](https://man7.org/linux/man-pages/man2/sched_getaffinity.2.html),
//! which std does not wrap.
//!
//! The one wrapper of these calls: the supervisor between `fork` and
//! `exec`, the CPU plan on kernel threads, the runtime checking what a
//! process runs with, the check's workers and the benchmarks all go
//! through it. A thread is named by its id (`tid`, as in `/proc/PID/task`);
//! 0 is the calling thread.
//!
//! Every function here makes its system calls on values on its own stack
//! and allocates nothing, its errors included (an [`io::Error`] made from
//! an errno holds no allocation): each may be called between `fork` and
//! `exec`, provided the [`CpuSet`] it reads was built before the fork.
#![allow(unsafe_code)]

use std::fmt;
use std::io;

use serde::{Deserialize, Serialize};

use crate::cpu::CpuSet;

/// `SCHED_DEADLINE`, which the libc crate does not name on every target.
const SCHED_DEADLINE: i32 = 6;

/// A scheduling policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    Other,
    Fifo,
    Rr,
    Batch,
    Idle,
    Deadline,
}

impl Policy {
    /// The policy of the kernel's number (`SCHED_*`; the
    /// `SCHED_RESET_ON_FORK` flag ignored), if it is one of ours.
    pub fn from_raw(raw: i32) -> Option<Policy> {
        Some(match raw & !libc::SCHED_RESET_ON_FORK {
            libc::SCHED_OTHER => Policy::Other,
            libc::SCHED_FIFO => Policy::Fifo,
            libc::SCHED_RR => Policy::Rr,
            libc::SCHED_BATCH => Policy::Batch,
            libc::SCHED_IDLE => Policy::Idle,
            SCHED_DEADLINE => Policy::Deadline,
            _ => return None,
        })
    }

    /// The kernel's number for this policy (`SCHED_*`).
    pub fn raw(self) -> i32 {
        match self {
            Policy::Other => libc::SCHED_OTHER,
            Policy::Fifo => libc::SCHED_FIFO,
            Policy::Rr => libc::SCHED_RR,
            Policy::Batch => libc::SCHED_BATCH,
            Policy::Idle => libc::SCHED_IDLE,
            Policy::Deadline => SCHED_DEADLINE,
        }
    }

    /// `other`, `fifo`, `rr`, `batch`, `idle` or `deadline`.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Other => "other",
            Policy::Fifo => "fifo",
            Policy::Rr => "rr",
            Policy::Batch => "batch",
            Policy::Idle => "idle",
            Policy::Deadline => "deadline",
        }
    }

    /// A real-time priority (1 to 99) is what orders threads of this
    /// policy (`fifo`, `rr`).
    pub fn has_priority(self) -> bool {
        matches!(self, Policy::Fifo | Policy::Rr)
    }

    /// Threads of this policy are ordered by their nice value (`other`,
    /// `batch`, `idle`: the fair policies).
    pub fn has_nice(self) -> bool {
        matches!(self, Policy::Other | Policy::Batch | Policy::Idle)
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a thread is scheduled with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedAttr {
    pub policy: Policy,
    /// 1 to 99 for `fifo` and `rr`, 0 for the other policies.
    pub priority: u32,
    /// The nice value (-20 to 19), which only the fair policies use.
    /// Setting `None` keeps the one the thread has, as
    /// sched_setscheduler(2) does; reading always gives it.
    pub nice: Option<i32>,
}

impl SchedAttr {
    /// `policy` at `priority`, the thread's nice value kept.
    pub const fn new(policy: Policy, priority: u32) -> SchedAttr {
        SchedAttr {
            policy,
            priority,
            nice: None,
        }
    }
}

/// `fifo 80`, `other`, `other nice -5`.
impl fmt::Display for SchedAttr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.policy.name())?;
        if self.policy.has_priority() || self.priority != 0 {
            write!(f, " {}", self.priority)?;
        }
        match self.nice {
            Some(n) if self.policy.has_nice() => write!(f, " nice {n}"),
            _ => Ok(()),
        }
    }
}

/// The kernel's `struct sched_attr`, first version (48 bytes), which every
/// kernel since 3.14 takes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
// Every field is the kernel's: some only it reads, some only it writes.
#[allow(dead_code)]
struct RawSchedAttr {
    size: u32,
    sched_policy: u32,
    sched_flags: u64,
    sched_nice: i32,
    sched_priority: u32,
    sched_runtime: u64,
    sched_deadline: u64,
    sched_period: u64,
}

const RAW_SIZE: u32 = std::mem::size_of::<RawSchedAttr>() as u32;

/// `the calling thread` or `thread 1234`.
struct Thread(u32);

impl fmt::Display for Thread {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            0 => f.write_str("the calling thread"),
            tid => write!(f, "thread {tid}"),
        }
    }
}

fn thread(tid: &u32) -> Thread {
    Thread(*tid)
}

/// A thread's policy could not be set.
#[derive(Debug, thiserror::Error)]
#[error("cannot set {} to {attr}", thread(.tid))]
pub struct SchedSetError {
    pub tid: u32,
    pub attr: SchedAttr,
    pub source: io::Error,
}

/// A thread's policy could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SchedGetError {
    #[error("cannot read the scheduling policy of {}", thread(.tid))]
    Read { tid: u32, source: io::Error },
    #[error("{} runs scheduling policy {policy}, which is none of other, fifo, rr, batch, idle or deadline", thread(.tid))]
    UnknownPolicy { tid: u32, policy: u32 },
}

/// A thread's CPUs could not be set.
#[derive(Debug, thiserror::Error)]
pub enum AffinitySetError {
    #[error(
        "CPU {cpu} is beyond the {} CPUs an affinity mask holds",
        libc::CPU_SETSIZE
    )]
    BeyondMask { tid: u32, cpu: u32 },
    #[error("cannot set the CPUs of {}", thread(.tid))]
    Set { tid: u32, source: io::Error },
}

/// A thread's CPUs could not be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot read the CPUs of {}", thread(.tid))]
pub struct AffinityGetError {
    pub tid: u32,
    pub source: io::Error,
}

impl SchedSetError {
    /// The errno the kernel answered.
    pub fn raw_os_error(&self) -> Option<i32> {
        self.source.raw_os_error()
    }
}

impl SchedGetError {
    /// The errno the kernel answered, if it refused.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            SchedGetError::Read { source, .. } => source.raw_os_error(),
            SchedGetError::UnknownPolicy { .. } => None,
        }
    }
}

impl AffinitySetError {
    /// The errno the kernel answered, if it was asked.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            AffinitySetError::Set { source, .. } => source.raw_os_error(),
            AffinitySetError::BeyondMask { .. } => None,
        }
    }
}

/// sched_getattr(2) of `tid`, as the kernel has it.
fn get_raw(tid: u32) -> io::Result<RawSchedAttr> {
    let mut raw = RawSchedAttr::default();
    // SAFETY: `raw` is a writable `struct sched_attr` of the size passed,
    // alive for the whole call; the flags argument must be 0.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            tid as libc::c_long,
            &mut raw as *mut RawSchedAttr,
            RAW_SIZE as libc::c_long,
            0 as libc::c_long,
        )
    };
    if rc == 0 {
        Ok(raw)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Reads the policy, priority and nice value of thread `tid`.
pub fn get_attr(tid: u32) -> Result<SchedAttr, SchedGetError> {
    let raw = get_raw(tid).map_err(|source| SchedGetError::Read { tid, source })?;
    let policy = Policy::from_raw(raw.sched_policy as i32).ok_or(SchedGetError::UnknownPolicy {
        tid,
        policy: raw.sched_policy,
    })?;
    Ok(SchedAttr {
        policy,
        priority: raw.sched_priority,
        nice: Some(raw.sched_nice),
    })
}

/// Sets the policy, priority and nice value of thread `tid`; a nice value
/// of `None` keeps the thread's own (read first, for the fair policies).
pub fn set_attr(tid: u32, attr: &SchedAttr) -> Result<(), SchedSetError> {
    let err = |source| SchedSetError {
        tid,
        attr: *attr,
        source,
    };
    let nice = match attr.nice {
        Some(n) => n,
        None if attr.policy.has_nice() => get_raw(tid).map_err(err)?.sched_nice,
        // The real-time and deadline policies do not use it.
        None => 0,
    };
    let raw = RawSchedAttr {
        size: RAW_SIZE,
        sched_policy: attr.policy.raw() as u32,
        sched_nice: nice,
        sched_priority: attr.priority,
        ..RawSchedAttr::default()
    };
    // SAFETY: `raw` is an initialised `struct sched_attr` whose `size`
    // field is its size, alive for the whole call; the kernel only reads
    // it. The flags argument must be 0.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_sched_setattr,
            tid as libc::c_long,
            &raw as *const RawSchedAttr,
            0 as libc::c_long,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(err(io::Error::last_os_error()))
    }
}

/// Restricts thread `tid` to `cpus`.
pub fn set_affinity(tid: u32, cpus: &CpuSet) -> Result<(), AffinitySetError> {
    // SAFETY: cpu_set_t is a plain bit array for which all zeroes is the
    // empty set, a valid value.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for cpu in cpus.iter() {
        if cpu as usize >= libc::CPU_SETSIZE as usize {
            return Err(AffinitySetError::BeyondMask { tid, cpu });
        }
        // SAFETY: `cpu` is below CPU_SETSIZE, checked above, so the bit is
        // inside `set`.
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
        Err(AffinitySetError::Set {
            tid,
            source: io::Error::last_os_error(),
        })
    }
}

/// The CPUs thread `tid` may run on.
///
/// The one function here that allocates (the set it returns).
pub fn get_affinity(tid: u32) -> Result<CpuSet, AffinityGetError> {
    // SAFETY: all zeroes is the empty set, a valid cpu_set_t.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is writable and the size passed is its exact size.
    let rc = unsafe {
        libc::sched_getaffinity(
            tid as libc::pid_t,
            std::mem::size_of::<libc::cpu_set_t>(),
            &mut set,
        )
    };
    if rc != 0 {
        return Err(AffinityGetError {
            tid,
            source: io::Error::last_os_error(),
        });
    }
    Ok((0..libc::CPU_SETSIZE as u32)
        // SAFETY: `c` is below CPU_SETSIZE, so the bit is inside `set`.
        .filter(|&c| unsafe { libc::CPU_ISSET(c as usize, &set) })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_round_trip_through_the_kernels_numbers() {
        for p in [
            Policy::Other,
            Policy::Fifo,
            Policy::Rr,
            Policy::Batch,
            Policy::Idle,
            Policy::Deadline,
        ] {
            assert_eq!(Policy::from_raw(p.raw()), Some(p));
            assert_eq!(
                Policy::from_raw(p.raw() | libc::SCHED_RESET_ON_FORK),
                Some(p)
            );
        }
        assert_eq!(Policy::from_raw(7), None);
        assert_eq!(SchedAttr::new(Policy::Fifo, 80).to_string(), "fifo 80");
        let nice = SchedAttr {
            nice: Some(-5),
            ..SchedAttr::new(Policy::Other, 0)
        };
        assert_eq!(nice.to_string(), "other nice -5");
    }

    #[test]
    fn what_is_set_in_a_thread_is_read_back() {
        std::thread::spawn(|| {
            let before = get_attr(0).unwrap();
            // The policy a thread has, set again with its nice value kept.
            set_attr(0, &SchedAttr::new(before.policy, before.priority)).unwrap();
            assert_eq!(get_attr(0).unwrap(), before);
            let cpus = get_affinity(0).unwrap();
            let first: CpuSet = cpus.iter().take(1).collect();
            set_affinity(0, &first).unwrap();
            assert_eq!(get_affinity(0).unwrap(), first);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn errors_name_the_thread_and_keep_the_errno() {
        let e = set_affinity(0, &std::iter::once(5000).collect()).unwrap_err();
        assert!(
            matches!(e, AffinitySetError::BeyondMask { cpu: 5000, .. }),
            "{e}"
        );
        // No thread has id 2^31 - 1 (pid_max is at most 2^22).
        let tid = i32::MAX as u32;
        let e = get_attr(tid).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ESRCH));
        assert_eq!(
            e.to_string(),
            "cannot read the scheduling policy of thread 2147483647"
        );
        let e = set_attr(0, &SchedAttr::new(Policy::Fifo, 100)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
        assert_eq!(e.to_string(), "cannot set the calling thread to fifo 100");
    }
}
