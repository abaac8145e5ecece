//! The analysis against fixture traces: each verdict from the events
//! that make it.

use super::super::model::parse;
use super::*;

fn ctx(send_us: u64, handler_us: u64) -> MissContext {
    MissContext {
        kind: Default::default(),
        mechanism: "io_uring".into(),
        seq: 41,
        send_ns: 100_000_000_000 + send_us * 1000,
        handler_ns: 100_000_000_000 + handler_us * 1000,
        budget_ns: 100_000,
        sender_pid: 900,
        sender_cpu: 1,
        receiver_pid: 901,
        receiver_cpu: 1,
        policies: [(777, "FIFO".to_string()), (901, "FIFO".to_string())]
            .into_iter()
            .collect(),
        complete_since_ns: None,
    }
}

/// The sender and the receiver on CPU 1 (one isolated CPU); a FIFO 81
/// spinner wakes just after the send and holds the CPU for 380us; a
/// network interrupt hits it for 12us.
const SPIN: &str = "\
# tracer: nop
#
     rt-send-900     [001] d..2.   99.999990: sched_switch: prev_comm=swapper/1 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=rt-send next_pid=900 next_prio=19
     rt-send-900     [001] ...1.  100.000000: tracing_mark_write: rtdeploy send seq=41 t=100000000000
     rt-send-900     [001] d..2.  100.000002: sched_wakeup: comm=planted-spin pid=777 prio=18 target_cpu=001
     rt-send-900     [001] d..2.  100.000003: sched_switch: prev_comm=rt-send prev_pid=900 prev_prio=19 prev_state=R+ ==> next_comm=planted-spin next_pid=777 next_prio=18
planted-spin-777     [001] d.h1.  100.000100: irq_handler_entry: irq=42 name=eth0
planted-spin-777     [001] d.h1.  100.000112: irq_handler_exit: irq=42 ret=handled
planted-spin-777     [001] d..2.  100.000395: sched_switch: prev_comm=planted-spin prev_pid=777 prev_prio=18 prev_state=S ==> next_comm=rt-send next_pid=900 next_prio=19
     rt-send-900     [001] d..2.  100.000398: sched_wakeup: comm=rt-recv pid=901 prio=19 target_cpu=001
     rt-send-900     [001] d..2.  100.000401: sched_switch: prev_comm=rt-send prev_pid=900 prev_prio=19 prev_state=S ==> next_comm=rt-recv next_pid=901 next_prio=19
     rt-recv-901     [001] ...1.  100.000412: tracing_mark_write: rtdeploy handler seq=41 t=100000000412000
";

#[test]
fn a_spinning_fifo_thread_is_named() {
    let p = parse(SPIN);
    assert_eq!(p.skipped, 0);
    let a = analyse(&p.events, &ctx(0, 412));
    assert_eq!(a.latency_ns, 412_000);
    let c = a.culprit.as_ref().expect("a culprit");
    assert_eq!(c.name, "planted-spin");
    assert_eq!(c.priority.as_deref(), Some("FIFO 81"));
    // 392us on the CPU, 12 of them in the interrupt.
    assert_eq!(c.time_ns, 380_000);
    assert_eq!(a.wake_ns, Some(100_000_398_000));
    assert_eq!(a.part, LatePart::WokenLate);
    assert_eq!(
        a.verdict,
        "late 412us (budget 100us): planted-spin (FIFO 81, pid 777) ran 380us on CPU 1 before the wake (woken 398us after the send, on CPU 1 3.0us later)"
    );
    assert!(a
        .receiver_cpu
        .iter()
        .any(|o| o.kind == OccupantKind::Hardirq && o.name == "eth0" && o.time_ns == 12_000));
    assert!(a.limits.is_empty(), "{:?}", a.limits);
    let text = a.to_text();
    assert!(text.contains("hardirq 42 (eth0)"), "{text}");
}

/// Receiver on CPU 3, woken at once from CPU 2, but an IRQ thread at
/// FIFO 90 holds CPU 3; a softirq runs inside it.
const IRQ_THREAD: &str = "\
      <idle>-0       [003] d..2.   99.999900: sched_switch: prev_comm=rt-recv prev_pid=901 prev_prio=19 prev_state=S ==> next_comm=swapper/3 next_pid=0 next_prio=120
      <idle>-0       [003] d..2.   99.999990: sched_switch: prev_comm=swapper/3 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=irq/130-eqos next_pid=512 next_prio=9
     rt-send-900     [002] ...1.  100.000000: tracing_mark_write: rtdeploy send seq=41 t=100000000000
     rt-send-900     [002] d..2.  100.000004: sched_wakeup: comm=rt-recv pid=901 prio=19 target_cpu=003
irq/130-eqos-512     [003] ..s1.  100.000050: softirq_entry: vec=3 [action=NET_RX]
irq/130-eqos-512     [003] ..s1.  100.000070: softirq_exit: vec=3 [action=NET_RX]
irq/130-eqos-512     [003] d..2.  100.000404: sched_switch: prev_comm=irq/130-eqos prev_pid=512 prev_prio=9 prev_state=S ==> next_comm=rt-recv next_pid=901 next_prio=19
     rt-recv-901     [003] ...1.  100.000410: tracing_mark_write: rtdeploy handler seq=41 t=100000000410000
";

#[test]
fn an_irq_thread_after_the_wake() {
    let mut c = ctx(0, 410);
    c.sender_cpu = 2;
    c.receiver_cpu = 3;
    c.policies.insert(512, "FIFO".into());
    let a = analyse(&parse(IRQ_THREAD).events, &c);
    assert_eq!(a.part, LatePart::RanLate);
    assert_eq!(a.run_ns, Some(100_000_404_000));
    let cul = a.culprit.unwrap();
    assert_eq!(cul.label(), "irq/130-eqos (FIFO 90, pid 512)");
    assert_eq!(cul.time_ns, 384_000);
    assert!(a.verdict.starts_with(
        "late 410us (budget 100us): irq/130-eqos (FIFO 90, pid 512) ran 384us on CPU 3 after the wake"
    ), "{}", a.verdict);
    assert!(a.limits.is_empty(), "{:?}", a.limits);
}

#[test]
fn nothing_in_the_way_is_unexplained_and_pi_boosts_are_named() {
    let text = "\
      <idle>-0       [003] d..2.   99.999900: sched_switch: prev_comm=rt-recv prev_pid=901 prev_prio=19 prev_state=S ==> next_comm=swapper/3 next_pid=0 next_prio=120
     rt-send-900     [002] ...1.  100.000000: tracing_mark_write: rtdeploy send seq=41 t=100000000000
     rt-send-900     [002] d..2.  100.000001: sched_pi_setprio: comm=low-pub pid=950 oldprio=120 newprio=19
     rt-send-900     [002] d..2.  100.000300: sched_wakeup: comm=rt-recv pid=901 prio=19 target_cpu=003
      <idle>-0       [003] d..2.  100.000302: sched_switch: prev_comm=swapper/3 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=rt-recv next_pid=901 next_prio=19
";
    let mut c = ctx(0, 305);
    c.sender_cpu = 2;
    c.receiver_cpu = 3;
    let a = analyse(&parse(text).events, &c);
    assert!(a.culprit.is_none());
    assert_eq!(a.part, LatePart::WokenLate);
    assert_eq!(
        a.verdict,
        "late 305us (budget 100us): unexplained (woken 300us after the send, on CPU 3 2.0us later; nothing else ran on CPU 3); PI boost of low-pub (pid 950) nice 0 -> FIFO 80"
    );
}

#[test]
fn an_overwritten_start_is_said() {
    let p = parse(IRQ_THREAD);
    let mut c = ctx(0, 410);
    c.sender_cpu = 2;
    c.receiver_cpu = 3;
    // The send happened before anything the buffer kept.
    c.send_ns -= 10_000_000;
    let a = analyse(&p.events, &c);
    assert!(a.verdict.ends_with("[partial trace]"), "{}", a.verdict);
    assert!(
        a.limits.iter().any(|l| l.contains("CPU 3")),
        "{:?}",
        a.limits
    );
}

#[test]
fn a_switch_the_buffer_lacks_is_taken_from_the_current_task_column() {
    // As kernel 6.18 in a VM printed it: the idle CPU's switch to the
    // sender is missing; its lines name it as the current task.
    let text = "\
      <idle>-0       [001] d.h1.  99.999990: hrtimer_expire_entry: hrtimer=00000000bcab0c94 function=hrtimer_wakeup now=99999989000
      <idle>-0       [001] dNh4.  99.999995: sched_wakeup: comm=rt-send pid=900 prio=19 target_cpu=001
      <idle>-0       [001] dNh1.  99.999996: hrtimer_expire_exit: hrtimer=00000000bcab0c94
     rt-send-900     [001] ...1.  100.000000: tracing_mark_write: rtdeploy send seq=41 t=100000000000
     rt-send-900     [001] d..4.  100.000005: sched_wakeup: comm=rt-recv pid=901 prio=19 target_cpu=001
     rt-send-900     [001] d..2.  100.000080: sched_switch: prev_comm=rt-send prev_pid=900 prev_prio=19 prev_state=S ==> next_comm=rt-recv next_pid=901 next_prio=19
";
    let a = analyse(&parse(text).events, &ctx(0, 90));
    let c = a.culprit.expect("the sender");
    assert_eq!(c.label(), "the sender rt-send (RT 80, pid 900)");
    assert_eq!(c.time_ns, 80_000);
    assert_eq!(c.after_wake_ns, 75_000);
    assert!(
        !a.receiver_cpu.iter().any(|o| o.id == 0),
        "{:?}",
        a.receiver_cpu
    );
}

#[test]
fn a_long_stretch_without_events_is_said() {
    // As recorded on a VM: the sender wakes the receiver, then its
    // wake call runs 528us before the next wakeup it makes.
    let text = "\
      <idle>-0       [001] dNh4. 11205.512165: sched_wakeup: comm=deploy pid=900 prio=19 target_cpu=001
      deploy-900    [001] ...1. 11205.512183: tracing_mark_write: rtdeploy send seq=31636 t=11205512179289
      deploy-900    [001] d..4. 11205.512188: sched_wakeup: comm=deploy pid=901 prio=19 target_cpu=001
      deploy-900    [001] d..4. 11205.512716: sched_wakeup: comm=deploy pid=975 prio=120 target_cpu=000
      deploy-900    [001] d..2. 11205.512732: sched_switch: prev_comm=deploy prev_pid=900 prev_prio=19 prev_state=S ==> next_comm=deploy next_pid=901 next_prio=19
      deploy-901    [001] ..... 11205.512736: io_uring_complete: ring 00000000fa4e8a87, req 000000000d8b7db9, user_data 0x100000000000000, result 0, cflags 0x0 extra1 0 extra2 0
      deploy-901    [001] ..... 11205.512737: io_uring_local_work_run: ring 00000000fa4e8a87, count 1, loops 1
      deploy-901    [001] ...1. 11205.512749: tracing_mark_write: rtdeploy handler seq=31636 t=11205512742135
";
    let mut c = ctx(0, 0);
    c.send_ns = 11_205_512_185_000;
    c.handler_ns = 11_205_512_742_135;
    let a = analyse(&parse(text).events, &c);
    assert_eq!(a.silent, Some((11_205_512_188_000, 528_000)));
    assert!(
        a.verdict
            .ends_with("; no event on CPU 1 for 528us from +3.0us while deploy ran"),
        "{}",
        a.verdict
    );
    assert!(
        a.verdict
            .starts_with("late 557us (budget 100us): the sender deploy"),
        "{}",
        a.verdict
    );
    assert_eq!(a.io_uring.len(), 2);
    assert_eq!(a.io_uring[1].event, "io_uring_local_work_run");
    let text = a.to_text();
    assert!(
        text.contains("io_uring at +551us on CPU 1 in deploy (pid 901): io_uring_complete ring 00000000fa4e8a87"),
        "{text}"
    );
}

#[test]
fn a_receiver_preempted_before_the_send_needs_no_wakeup() {
    let text = "\
     rt-recv-901     [001] d..2.   99.999990: sched_switch: prev_comm=rt-recv prev_pid=901 prev_prio=19 prev_state=R+ ==> next_comm=rt-send next_pid=900 next_prio=19
     rt-send-900     [001] ...1.  100.000000: tracing_mark_write: rtdeploy send seq=41 t=100000000000
     rt-send-900     [001] d..2.  100.000060: sched_switch: prev_comm=rt-send prev_pid=900 prev_prio=19 prev_state=S ==> next_comm=rt-recv next_pid=901 next_prio=19
";
    let a = analyse(&parse(text).events, &ctx(0, 70));
    assert_eq!(a.part, LatePart::Busy);
    assert!(
        a.verdict.contains(
            "(the receiver was preempted (runnable, not waiting) when the message was sent)"
        ),
        "{}",
        a.verdict
    );
}

/// The timer worker (pid 950, FIFO 80) on CPU 3 sleeps to a deadline;
/// its hrtimer fires on time and wakes it, but a FIFO 90 spinner holds
/// the CPU for 1.2ms more.
const TIMER_SPIN: &str = "\
 check-timer-950     [003] d..2.   99.999500: sched_switch: prev_comm=check-timer prev_pid=950 prev_prio=19 prev_state=S ==> next_comm=planted-spin next_pid=777 next_prio=9
planted-spin-777     [003] d.h1.  100.000002: hrtimer_expire_entry: hrtimer=00000000b1c2d3e4 function=hrtimer_wakeup now=100000001500
planted-spin-777     [003] d.h2.  100.000003: sched_wakeup: comm=check-timer pid=950 prio=19 target_cpu=003
planted-spin-777     [003] d.h1.  100.000004: hrtimer_expire_exit: hrtimer=00000000b1c2d3e4
planted-spin-777     [003] d..2.  100.001204: sched_switch: prev_comm=planted-spin prev_pid=777 prev_prio=9 prev_state=S ==> next_comm=check-timer next_pid=950 next_prio=19
 check-timer-950     [003] ...1.  100.001208: tracing_mark_write: rtdeploy timer seq=7 t=100001208000
";

#[test]
fn a_late_timer_names_what_held_its_cpu() {
    let c = MissContext {
        kind: MissKind::Timer,
        mechanism: "timer".into(),
        seq: 7,
        send_ns: 100_000_000_000,
        handler_ns: 100_001_208_000,
        budget_ns: 200_000,
        sender_pid: 950,
        sender_cpu: 3,
        receiver_pid: 950,
        receiver_cpu: 3,
        policies: [(777, "FIFO".to_string()), (950, "FIFO".to_string())]
            .into_iter()
            .collect(),
        complete_since_ns: None,
    };
    let p = parse(TIMER_SPIN);
    assert_eq!(p.skipped, 0);
    let a = analyse(&p.events, &c);
    assert_eq!(a.part, LatePart::RanLate);
    assert_eq!(a.wake_ns, Some(100_000_003_000));
    assert_eq!(a.run_ns, Some(100_001_204_000));
    let cul = a.culprit.as_ref().expect("a culprit");
    assert_eq!(cul.label(), "planted-spin (FIFO 90, pid 777)");
    assert_eq!(
        a.verdict,
        "late 1.21ms (budget 200us): planted-spin (FIFO 90, pid 777) ran 1.20ms on CPU 3 after the wake (woken 3.0us after the deadline, on CPU 3 1.20ms later)"
    );
    // The timer thread is named as such, not as a sender.
    assert!(a
        .receiver_cpu
        .iter()
        .all(|o| o.id != 950 || o.role.as_deref() == Some("timer")));
    let text = a.to_text();
    assert!(text.contains("timer wake 7 of pid 950 on CPU 3"), "{text}");
    assert!(
        text.contains("deadline +0, wakeup +3.0us, on CPU +1.20ms, read on waking +1.21ms"),
        "{text}"
    );
    assert!(
        text.contains("on the timer thread's CPU 3 from the deadline to its wake:"),
        "{text}"
    );
    assert!(text.contains("hrtimer hrtimer_wakeup"), "{text}");
    // A saved context without `kind` (older files) is a delivery.
    let mut j = serde_json::to_value(&c).unwrap();
    j.as_object_mut().unwrap().remove("kind");
    let back: MissContext = serde_json::from_value(j).unwrap();
    assert_eq!(back.kind, MissKind::Delivery);
}

/// PREEMPT_RT: the sender's futex wake finds the hash bucket's lock
/// (an rt_mutex-based spinlock) held by a kworker on CPU 1; the
/// kworker is boosted to the sender's priority, the sender sleeps on
/// the lock for 40us, then wakes the receiver on CPU 3.
const LOCK_WAIT: &str = "\
     rt-recv-901     [003] d..2.   99.999900: sched_switch: prev_comm=rt-recv prev_pid=901 prev_prio=19 prev_state=S ==> next_comm=swapper/3 next_pid=0 next_prio=120
     rt-send-900     [002] ...1.  100.000000: tracing_mark_write: rtdeploy send seq=41 t=100000000000
     rt-send-900     [002] d..1.  100.000003: contention_begin: 00000000a1b2c3d4 (flags=RT)
     rt-send-900     [002] d..2.  100.000004: sched_pi_setprio: comm=kworker/1:2 pid=88 oldprio=120 newprio=19
     rt-send-900     [002] d..2.  100.000005: sched_switch: prev_comm=rt-send prev_pid=900 prev_prio=19 prev_state=D ==> next_comm=swapper/2 next_pid=0 next_prio=120
      <idle>-0       [002] d..2.  100.000042: sched_switch: prev_comm=swapper/2 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=rt-send next_pid=900 next_prio=19
     rt-send-900     [002] d..1.  100.000043: contention_end: 00000000a1b2c3d4 (ret=0)
     rt-send-900     [002] d..2.  100.000045: sched_wakeup: comm=rt-recv pid=901 prio=19 target_cpu=003
      <idle>-0       [003] d..2.  100.000050: sched_switch: prev_comm=swapper/3 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=rt-recv next_pid=901 next_prio=19
     rt-recv-901     [003] ...1.  100.000055: tracing_mark_write: rtdeploy handler seq=41 t=100000055000
";

#[test]
fn a_lock_wait_of_the_sender_names_the_holder_priority_inheritance_boosted() {
    let p = parse(LOCK_WAIT);
    assert_eq!(p.skipped, 0);
    let mut c = ctx(0, 55);
    c.budget_ns = 20_000;
    c.sender_cpu = 2;
    c.receiver_cpu = 3;
    let a = analyse(&p.events, &c);
    assert_eq!(a.lock_waits.len(), 1, "{:?}", a.lock_waits);
    let w = &a.lock_waits[0];
    assert_eq!(
        (
            w.role.as_str(),
            w.pid,
            w.cpu,
            w.flags.as_str(),
            w.lock.as_str()
        ),
        ("sender", 900, 2, "RT", "00000000a1b2c3d4")
    );
    assert_eq!((w.start_ns, w.wait_ns), (100_000_003_000, 40_000));
    assert_eq!(
        w.holder.as_deref(),
        Some("kworker/1:2 (pid 88, nice 0 -> FIFO 80)")
    );
    assert!(
        a.verdict.ends_with(
            "; the sender waited 40.0us for a lock (RT) held by kworker/1:2 (pid 88, nice 0 -> FIFO 80); PI boost of kworker/1:2 (pid 88) nice 0 -> FIFO 80"
        ),
        "{}",
        a.verdict
    );
    let text = a.to_text();
    assert!(
        text.contains("lock: the sender rt-send (pid 900) on CPU 2 at +3.0us waited 40.0us for lock 00000000a1b2c3d4 (RT), held by kworker/1:2"),
        "{text}"
    );
    // A wait that ends before the window, and one of another task,
    // are not the pair's.
    let mut c2 = c.clone();
    c2.send_ns = 100_000_045_000;
    assert!(analyse(&p.events, &c2).lock_waits.is_empty());
    let mut c3 = c;
    c3.sender_pid = 4242;
    assert!(analyse(&p.events, &c3).lock_waits.is_empty());
}

/// The receiver on CPU 3 is woken from CPU 2 at once, but CPU 3 stays
/// idle for 1.8ms before it runs it (seen on a virtual machine whose
/// host did not run the vCPU).
const SLOW_IDLE: &str = "\
     rt-recv-901     [003] d..2.   99.999900: sched_switch: prev_comm=rt-recv prev_pid=901 prev_prio=19 prev_state=S ==> next_comm=swapper/3 next_pid=0 next_prio=120
     rt-send-900     [002] ...1.  100.000000: tracing_mark_write: rtdeploy send seq=41 t=100000000000
     rt-send-900     [002] d..2.  100.000002: sched_wakeup: comm=rt-recv pid=901 prio=19 target_cpu=003
      <idle>-0       [003] d..2.  100.001822: sched_switch: prev_comm=swapper/3 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=rt-recv next_pid=901 next_prio=19
     rt-recv-901     [003] ...1.  100.001830: tracing_mark_write: rtdeploy handler seq=41 t=100001830000
";

#[test]
fn a_cpu_that_stays_idle_after_the_wake_is_said() {
    let mut c = ctx(0, 1830);
    c.sender_cpu = 2;
    c.receiver_cpu = 3;
    let a = analyse(&parse(SLOW_IDLE).events, &c);
    assert!(a.culprit.is_none());
    assert_eq!(a.part, LatePart::RanLate);
    assert_eq!(a.idle_after_wake_ns, Some(1_820_000));
    assert_eq!(
        a.verdict,
        "late 1.83ms (budget 100us): CPU 3 stayed idle 1.82ms after the wake (woken 2.0us after the send, on CPU 3 1.82ms later): slow to leave idle (a deep C-state, which cpu_dma_latency bounds, or a virtual CPU its host did not run)"
    );
    // A short idle stretch is not the story.
    let mut c2 = c.clone();
    c2.handler_ns = 100_004_000_000;
    let a = analyse(&parse(SLOW_IDLE).events, &c2);
    assert_eq!(a.idle_after_wake_ns, None);
    assert!(a.verdict.contains("unexplained"), "{}", a.verdict);
}

/// Recording started at 99.990 (the buffers cleared); the spinner on
/// CPU 3 spins without an event until 100.001200: CPU 3's first event
/// comes after the send, yet nothing is missing.
const SPIN_SINCE_RESUME: &str = "\
     rt-send-900     [002] ...1.  100.000000: tracing_mark_write: rtdeploy send seq=41 t=100000000000
     rt-send-900     [002] d..2.  100.000004: sched_wakeup: comm=rt-recv pid=901 prio=19 target_cpu=003
planted-spin-777     [003] d..2.  100.001200: sched_switch: prev_comm=planted-spin prev_pid=777 prev_prio=9 prev_state=S ==> next_comm=rt-recv next_pid=901 next_prio=19
     rt-recv-901     [003] ...1.  100.001205: tracing_mark_write: rtdeploy handler seq=41 t=100001205000
";

#[test]
fn a_task_that_ran_without_events_since_recording_started_is_counted() {
    let events = parse(SPIN_SINCE_RESUME).events;
    let mut c = ctx(0, 1205);
    c.sender_cpu = 2;
    c.receiver_cpu = 3;
    c.policies.insert(777, "FIFO".into());
    // Unknown start: CPU 3's history may be overwritten; said so.
    let a = analyse(&events, &c);
    assert!(a.verdict.ends_with("[partial trace]"), "{}", a.verdict);
    // Recording since 99.990: the spinner ran all along.
    c.complete_since_ns = Some(99_990_000_000);
    let a = analyse(&events, &c);
    assert!(a.limits.is_empty(), "{:?}", a.limits);
    assert_eq!(
        a.verdict,
        "late 1.21ms (budget 100us): planted-spin (FIFO 90, pid 777) ran 1.20ms on CPU 3 after the wake (woken 4.0us after the send, on CPU 3 1.20ms later)"
    );
    // Recording that started after the send: the window is cut.
    c.complete_since_ns = Some(100_000_500_000);
    assert!(analyse(&events, &c).verdict.ends_with("[partial trace]"));
}

#[test]
fn an_empty_trace_is_unexplained_not_a_panic() {
    let a = analyse(&[], &ctx(0, 500));
    assert!(a.verdict.contains("unexplained"), "{}", a.verdict);
    assert_eq!(a.part, LatePart::NoWakeup);
    let mut c = ctx(0, 500);
    c.handler_ns = 0;
    let a = analyse(&[], &c);
    assert_eq!(a.latency_ns, 0);
}
