//! Wake classes: who may wake whom, and through which kernel objects.
//!
//! Every publisher and every waiting subscriber of a channel belongs to one
//! of two classes, [`WakeClass::RealTime`] or [`WakeClass::BestEffort`],
//! decided from robot.yaml (never from the policy a thread happens to run
//! with: that is only checked against robot.yaml, see [`Attach`]). The rule
//! of this module: **no best-effort task touches a kernel object that a
//! real-time wake or wait needs.** On PREEMPT_RT every such object is a
//! lock that a preempted lower-priority holder keeps, and priority
//! inheritance lifts that holder only to its waiter's priority, which loses
//! to the threaded interrupt handlers above it.
//!
//! # The words
//!
//! A channel's header holds one futex word per class:
//!
//! | class | futex word | waiter count | bells rung | woken by |
//! | --- | --- | --- | --- | --- |
//! | best-effort | low 32 bits of the queue index (`next_index`) | `waiters` | listings without [`RT_LISTING`] | best-effort publishers |
//! | real-time | `rt_word`: the index after the last real-time message | `rt_waiters` | listings with [`RT_LISTING`] | real-time publishers |
//!
//! A real-time publisher moves the queue index (a compare-and-swap on
//! shared memory, which takes no kernel lock) but never `FUTEX_WAKE`s it,
//! and never rings a best-effort loop's bell. A best-effort publisher never
//! touches `rt_word`, `rt_waiters` or a real-time bell. Each subscriber arms
//! only its own class's word or bell.
//!
//! # Crossing classes
//!
//! A message still reaches every subscriber, of either class: a loop looks
//! at every channel it watches after each wake, and a loop watching a
//! channel that has publishers of the other class (the header counts live
//! publishers per class) sleeps at most half the channel's
//! `cross_class_latency` before it looks again. So a message crosses
//! classes within that bound plus the subscriber's own wakeup latency,
//! and nothing is lost (sequence accounting is the channel's, as for any
//! message). Neither side waits on anything the other wakes: the
//! best-effort side polls, it never arms a word a real-time publisher
//! wakes, and a real-time publisher's only trace for it is the index
//! itself, which nobody of that class waits on through the kernel.
//!
//! What it costs: an event-driven real-time subscriber of a best-effort
//! publisher (a bridge, a Python tool, a planner) sees its messages up to
//! the bound late, and a loop watching such a channel wakes every half
//! bound when nothing else wakes it (each look is a load per watched
//! channel: a few microseconds of CPU per wake).
//!
//! # The real-time wait: the doorbell, on every kernel
//!
//! A real-time loop sleeps in one `FUTEX_WAIT_BITSET` on its own bell (see
//! [`crate::doorbell`]), with its next deadline as the absolute timeout,
//! whatever io_uring or `futex_waitv` the kernel offers. Of the three ways
//! to sleep it is the only one that needs nothing beyond its own word:
//!
//! - `io_uring` futex waits: the wake callback runs in the waker, under the
//!   word's bucket lock, and adds task_work to the loop's ring; only the
//!   add that takes the ring's `->cq_wait_nr` credit wakes the loop, and
//!   that credit is per ring, not per word, so every adder shares it
//!   (background letter 02: a preempted adder holds the wake back, with no
//!   lock for priority inheritance to boost). `IORING_OP_TIMEOUT` expiries
//!   run in `ktimers/N` (SCHED_FIFO 1 on PREEMPT_RT) on the arming CPU and
//!   are adders too, which is why the loop's io_uring timers are the wait's
//!   own timeout instead (not an adder, but an hrtimer that is not a
//!   sleeper, so it still expires in `ktimers/N`: delayed by whatever runs
//!   above FIFO 1 on that CPU). The futex wait's data comes from the
//!   ring's cache, refilled from the slab when it runs dry.
//! - `futex_waitv(2)` allocates its vector with `kcalloc` on every call
//!   (`kernel/futex/syscalls.c`): the shared `kmalloc-*` caches, whose
//!   slow path takes the slab node's `list_lock`, a sleeping lock on
//!   PREEMPT_RT that any task may hold (the letter's MSG_RING finding).
//!   It also takes one bucket lock per watched word on every arm.
//! - `FUTEX_WAIT_BITSET` on the bell: no allocation, no task_work, one
//!   bucket; its timeout is an `hrtimer_sleeper`, which PREEMPT_RT makes a
//!   hard (hard-interrupt) timer for real-time tasks, so no `ktimers/N`.
//!
//! The letter's own fix (persistent futex waits in io_uring, and its
//! patch 1 for the credit) is not upstream; with it, an armed io_uring wait
//! would need no bucket at all. Until then real-time loops use the bell.
//! Forcing another backend (`RTDEPLOY_BACKEND`) keeps the class rule (the
//! words stay separate) with the leftovers above.
//!
//! # Every kernel object of the real-time wake and wait
//!
//! Default backend (the bell). "Who else" lists every task that may touch
//! the object besides the real-time loop and its real-time publishers.
//!
//! | object | touched by the real-time path | who else |
//! | --- | --- | --- |
//! | futex hash bucket of the loop's bell word (`hb->lock`, an rt_mutex-based lock on PREEMPT_RT) | the loop's `FUTEX_WAIT`, each real-time publisher's `FUTEX_WAKE` | any task whose futex hashes to the same bucket: the hash is global (`256 x CPUs` buckets, rounded up to a power of two: 2048 on an Orin Nano), keyed by file and offset for shared futexes; before Linux 6.16 every process's private futexes (glibc and Rust mutexes, ROS 2 nodes) use it too. User space cannot choose its bucket; `deploy check --census` measures the rate |
//! | futex hash bucket of `rt_word` (forced io_uring or `futex_waitv` only) | real-time subscribers' arms, real-time publishers' wakes | as above |
//! | the futex key of a shared page (`get_futex_key`: fast GUP of the page, the shmem inode's sequence number) | every wait and wake | lockless once the page is present; a page fault takes the process's `mmap_lock`, which any thread of the same process calling `mmap`/`munmap` holds for writing, and unmaps send TLB-shootdown IPIs to every CPU running the process. Hence: `mlockall`, channels prefaulted at open, and no map or unmap after start in a real-time process |
//! | the bell's `hrtimer_sleeper` (per-CPU hrtimer base, a raw spinlock) | the loop's timed sleep | timers of other tasks on the same CPU; raw spinlocks do not sleep on PREEMPT_RT |
//! | the run queue and `pi_lock` of the woken task (raw spinlocks) | `try_to_wake_up` from each wake | every wake of a task on that CPU (raw: not preemptible, bounded) |
//! | the io_uring ring, its task_work list and `->cq_wait_nr` credit (forced io_uring only) | real-time publishers' wakes add task_work | no one else: timers are the wait's own timeout, and best-effort publishers never wake `rt_word` |
//! | the ring's futex cache and the slab behind it (forced io_uring only) | each re-arm | the slab: any task |
//! | the `kmalloc-*` slab caches (forced `futex_waitv` only) | every sleep | any task |
//!
//! A best-effort publisher's wake (`FUTEX_WAKE` of the index word, bells
//! without [`RT_LISTING`]) and a best-effort subscriber's arm touch only
//! the buckets of those words, the best-effort loops' rings, and their
//! bells' buckets. What stays shared whatever we do: hash collisions
//! between unrelated words (a rate, not a design), and the slab behind
//! the kernel's own allocations on other paths.

use units::env::ProcessEnv;
use units::sched::Policy;

/// A bell listing of a real-time loop (bit 31 of the listing's low word;
/// the slot number below it never reaches it).
pub const RT_LISTING: u64 = 1 << 31;

/// The class of a publisher or subscriber (see the module docs), in
/// every signature of the runtime that takes one.
pub use units::wake::WakeClass;

/// Where a class lives in a channel's header and in a slot's `pid` word.
pub(crate) trait ClassWords: Sized {
    /// Index into per-class arrays of the channel header (0 best-effort,
    /// 1 real-time).
    fn index(self) -> usize;
    /// The class bit of a slot's `pid` word (bit 63; pids fit in 32 bits).
    fn pid_bit(self) -> u64;
    /// The class a slot's `pid` word records.
    fn of_pid_word(w: u64) -> Self;
}

impl ClassWords for WakeClass {
    fn index(self) -> usize {
        match self {
            WakeClass::BestEffort => 0,
            WakeClass::RealTime => 1,
        }
    }

    fn pid_bit(self) -> u64 {
        match self {
            WakeClass::RealTime => 1 << 63,
            WakeClass::BestEffort => 0,
        }
    }

    fn of_pid_word(w: u64) -> WakeClass {
        if w >> 63 == 1 {
            WakeClass::RealTime
        } else {
            WakeClass::BestEffort
        }
    }
}

/// What robot.yaml gives a process, as the supervisor passes it: its
/// class, and the policy and priority its class was decided from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attach {
    pub class: WakeClass,
    pub policy: Policy,
    /// 0 for the non-real-time policies.
    pub priority: u32,
}

/// The thread attaching runs with a policy robot.yaml does not give it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("this thread runs {found}, but robot.yaml gives the process {expected} (wake class {class}, decided from robot.yaml); set the policy robot.yaml names, or change robot.yaml")]
pub struct AttachMismatchError {
    pub found: String,
    pub expected: String,
    pub class: WakeClass,
}

fn describe(policy: Policy, priority: u32) -> String {
    match policy {
        Policy::Fifo => format!("SCHED_FIFO {priority}"),
        Policy::Rr => format!("SCHED_RR {priority}"),
        Policy::Other => "SCHED_OTHER".into(),
        Policy::Batch => "SCHED_BATCH".into(),
        Policy::Idle => "SCHED_IDLE".into(),
        Policy::Deadline => "SCHED_DEADLINE".into(),
    }
}

impl Attach {
    /// From the environment the supervisor set ([`units::env::WAKE_CLASS`]
    /// and [`units::env::SCHED`]); `None` when it set no class: a program
    /// run by hand, which is best-effort unless it says otherwise in its
    /// [`crate::event_loop::LoopOptions`].
    pub fn of_env(env: &ProcessEnv) -> Option<Attach> {
        let (class, sched) = (env.wake_class?, env.sched?);
        Some(Attach {
            class,
            policy: sched.policy,
            priority: sched.priority,
        })
    }

    /// Checks a thread's policy and priority against robot.yaml's: a
    /// thread still on a non-real-time policy passes (a controller may set
    /// its real-time policy after it attaches); one on a real-time policy
    /// must run robot.yaml's policy and priority exactly.
    pub fn check(&self, policy: Option<Policy>, priority: u32) -> Result<(), AttachMismatchError> {
        let rt =
            |p: Option<Policy>| matches!(p, Some(Policy::Fifo | Policy::Rr | Policy::Deadline));
        if !rt(policy) {
            return Ok(());
        }
        if policy == Some(self.policy) && priority == self.priority {
            return Ok(());
        }
        Err(AttachMismatchError {
            found: policy.map_or_else(|| "an unknown policy".into(), |p| describe(p, priority)),
            expected: describe(self.policy, self.priority),
            class: self.class,
        })
    }

    /// [`Attach::check`] of the calling thread, read from the kernel.
    pub fn check_current(&self) -> Result<(), AttachMismatchError> {
        match units::sched::get_attr(0) {
            Ok(a) => self.check(Some(a.policy), a.priority),
            // A policy we do not know is not a real-time one of ours, and
            // an unreadable one leaves nothing to compare with: the class
            // stands as robot.yaml says.
            Err(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_gives_the_class_and_the_policy_it_was_decided_from() {
        let env = ProcessEnv {
            wake_class: Some(WakeClass::RealTime),
            sched: Some(units::env::SchedSpec {
                policy: Policy::Fifo,
                priority: 80,
            }),
            ..ProcessEnv::default()
        };
        let a = Attach::of_env(&env).unwrap();
        assert_eq!(
            (a.class, a.policy, a.priority),
            (WakeClass::RealTime, Policy::Fifo, 80)
        );
        assert_eq!(Attach::of_env(&ProcessEnv::default()), None);
    }

    #[test]
    fn a_thread_may_attach_before_it_sets_its_policy_but_not_with_another() {
        let a = Attach {
            class: WakeClass::RealTime,
            policy: Policy::Fifo,
            priority: 80,
        };
        assert!(a.check(Some(Policy::Other), 0).is_ok());
        assert!(a.check(Some(Policy::Fifo), 80).is_ok());
        let e = a.check(Some(Policy::Fifo), 90).unwrap_err().to_string();
        assert!(
            e.contains("SCHED_FIFO 90") && e.contains("SCHED_FIFO 80") && e.contains("real-time"),
            "{e}"
        );
        let be = Attach {
            class: WakeClass::BestEffort,
            policy: Policy::Other,
            priority: 0,
        };
        let e = be.check(Some(Policy::Rr), 10).unwrap_err().to_string();
        assert!(
            e.contains("SCHED_RR 10") && e.contains("SCHED_OTHER"),
            "{e}"
        );
    }

    #[test]
    fn the_class_bit_of_a_pid_word_never_reaches_a_pid() {
        for c in WakeClass::ALL {
            let w = 4_194_304u64 | c.pid_bit();
            assert_eq!(WakeClass::of_pid_word(w), c);
            assert_eq!(w as u32, 4_194_304);
        }
        const { assert!(RT_LISTING > crate::doorbell::BELLS as u64) };
    }
}
