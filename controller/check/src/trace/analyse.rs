//! Why one message was late: the events of the window from its send to
//! its handler, turned into what ran where, when the receiver was woken
//! and when it ran, and a one-line verdict (pure: no I/O).

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::model::{prio_label, Event, EventKind};
use crate::report::fmt_ns;

/// What missed its budget.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MissKind {
    /// A message: from its send to its receiver's handler.
    #[default]
    Delivery,
    /// A timer wake: from the deadline to the time the timer thread read
    /// on waking. The "sender" and the "receiver" are the same thread,
    /// `seq` numbers its wakes, `send_ns` is the deadline and
    /// `handler_ns` the wake.
    Timer,
}

impl MissKind {
    /// Where the window starts, the thread that was late, where it ends.
    fn words(self) -> (&'static str, &'static str, &'static str) {
        match self {
            MissKind::Delivery => ("the send", "the receiver", "the handler"),
            MissKind::Timer => ("the deadline", "the timer thread", "its wake"),
        }
    }
}

/// What is known of a miss besides the trace: the message, the two
/// real-time threads and their CPUs. Times are CLOCK_MONOTONIC
/// nanoseconds, the clock of the trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MissContext {
    /// A message's delivery (the default, also of files saved before
    /// timers were traced) or a timer's wake.
    #[serde(default)]
    pub kind: MissKind,
    /// The wake mechanism of the run (`timer` for a timer's wake).
    pub mechanism: String,
    /// The message's sequence number.
    pub seq: u64,
    /// Its send time (stamped in the message).
    pub send_ns: u64,
    /// The receiver's handler start.
    pub handler_ns: u64,
    /// The budget it missed.
    pub budget_ns: u64,
    pub sender_pid: i32,
    pub sender_cpu: u32,
    pub receiver_pid: i32,
    pub receiver_cpu: u32,
    /// Scheduling policy names (`FIFO`, `RR`, `OTHER`, ...) of the tasks
    /// seen, read when the snapshot was taken.
    #[serde(default)]
    pub policies: BTreeMap<i32, String>,
    /// Since when the buffers hold every event: recording started (the
    /// buffers cleared) then, or the saved window starts then if later.
    /// A CPU whose first event comes later had none before it (a task
    /// that ran on without an event, such as a spinning thread): nothing
    /// was overwritten, and that task ran from here. Unknown (`None`,
    /// older files): a late first event may be overwritten history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub complete_since_ns: Option<u64>,
}

impl MissContext {
    pub fn latency_ns(&self) -> u64 {
        self.handler_ns.saturating_sub(self.send_ns)
    }
}

/// What a stretch of CPU time was spent on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OccupantKind {
    /// A task (a thread, an IRQ thread, a kernel thread), its own time
    /// (without the interrupts that hit it).
    Thread,
    /// A hard interrupt handler (`irq_handler_entry` .. `exit`).
    Hardirq,
    /// A softirq (`softirq_entry` .. `exit`).
    Softirq,
    /// An hrtimer callback (`hrtimer_expire_entry` .. `exit`).
    Hrtimer,
}

/// One interval on a CPU: a task's run or an interrupt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interval {
    pub cpu: u32,
    pub kind: OccupantKind,
    /// comm for a task, the handler's name otherwise.
    pub name: String,
    /// The task's pid, the IRQ number, the softirq vector.
    pub id: i32,
    /// The task's kernel priority, when seen.
    pub prio: Option<i32>,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// Every CPU's intervals, from the switch and interrupt events.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    /// Task runs, per CPU in time order.
    pub runs: Vec<Interval>,
    /// Interrupts (hard, soft, hrtimer), per CPU in time order.
    pub irqs: Vec<Interval>,
    /// First and last event time per CPU.
    pub span: BTreeMap<u32, (u64, u64)>,
}

/// Builds the intervals of `events` (in any order). A task running when
/// the buffer begins starts at its CPU's first event, or at
/// `complete_since_ns` when the buffers hold every event from then (see
/// [`MissContext::complete_since_ns`]); what runs at its end ends at
/// `end_ns` (the stop), or its CPU's last event if later.
pub fn timeline(events: &[Event], complete_since_ns: Option<u64>, end_ns: u64) -> Timeline {
    let mut by_cpu: BTreeMap<u32, Vec<&Event>> = BTreeMap::new();
    for e in events {
        by_cpu.entry(e.cpu).or_default().push(e);
    }
    let mut prios: HashMap<i32, i32> = HashMap::new();
    for e in events {
        match &e.kind {
            EventKind::Switch {
                prev_pid,
                prev_prio,
                next_pid,
                next_prio,
                ..
            } => {
                prios.entry(*prev_pid).or_insert(*prev_prio);
                prios.entry(*next_pid).or_insert(*next_prio);
            }
            EventKind::Wakeup { pid, prio, .. } => {
                prios.entry(*pid).or_insert(*prio);
            }
            _ => {}
        }
    }
    let mut t = Timeline::default();
    for (cpu, mut evs) in by_cpu {
        evs.sort_by_key(|e| e.ts_ns);
        let (first, last) = (evs[0].ts_ns, evs[evs.len() - 1].ts_ns);
        t.span.insert(cpu, (first, last));
        let stop = end_ns.max(last);
        let mut cur: Option<(String, i32, Option<i32>, u64)> = Some((
            evs[0].comm.clone(),
            evs[0].pid,
            prios.get(&evs[0].pid).copied(),
            complete_since_ns.map_or(first, |s| s.min(first)),
        ));
        let mut open: Vec<(OccupantKind, String, i32, u64)> = vec![];
        for e in &evs {
            // Every line names the task current on its CPU: a switch the
            // buffer lacks (lost, or before it) shows as another task.
            if !matches!(e.kind, EventKind::Switch { .. }) {
                if let Some((name, id, prio, start)) = cur.take() {
                    if id != e.pid {
                        t.runs.push(Interval {
                            cpu,
                            kind: OccupantKind::Thread,
                            name,
                            id,
                            prio,
                            start_ns: start,
                            end_ns: e.ts_ns,
                        });
                        cur = Some((e.comm.clone(), e.pid, prios.get(&e.pid).copied(), e.ts_ns));
                    } else {
                        cur = Some((name, id, prio, start));
                    }
                }
            }
            match &e.kind {
                EventKind::Switch {
                    prev_comm,
                    prev_pid,
                    prev_prio,
                    next_comm,
                    next_pid,
                    next_prio,
                    ..
                } => {
                    let (name, id, prio, start) = cur.take().unwrap_or((
                        prev_comm.clone(),
                        *prev_pid,
                        Some(*prev_prio),
                        first,
                    ));
                    // The switch names who ran: trust it over the guess.
                    let (name, prio) = if id == *prev_pid {
                        (prev_comm.clone(), Some(*prev_prio))
                    } else {
                        (name, prio)
                    };
                    t.runs.push(Interval {
                        cpu,
                        kind: OccupantKind::Thread,
                        name,
                        id,
                        prio,
                        start_ns: start,
                        end_ns: e.ts_ns,
                    });
                    cur = Some((next_comm.clone(), *next_pid, Some(*next_prio), e.ts_ns));
                }
                EventKind::IrqEntry { irq, name } => {
                    open.push((OccupantKind::Hardirq, name.clone(), *irq as i32, e.ts_ns))
                }
                EventKind::SoftirqEntry { vec, action } => {
                    open.push((OccupantKind::Softirq, action.clone(), *vec as i32, e.ts_ns))
                }
                EventKind::HrtimerEntry { function } => {
                    open.push((OccupantKind::Hrtimer, function.clone(), 0, e.ts_ns))
                }
                EventKind::IrqExit { irq } => close(
                    &mut open,
                    &mut t.irqs,
                    cpu,
                    OccupantKind::Hardirq,
                    Some(*irq as i32),
                    e.ts_ns,
                ),
                EventKind::SoftirqExit { vec } => close(
                    &mut open,
                    &mut t.irqs,
                    cpu,
                    OccupantKind::Softirq,
                    Some(*vec as i32),
                    e.ts_ns,
                ),
                EventKind::HrtimerExit => close(
                    &mut open,
                    &mut t.irqs,
                    cpu,
                    OccupantKind::Hrtimer,
                    None,
                    e.ts_ns,
                ),
                _ => {}
            }
        }
        if let Some((name, id, prio, start)) = cur {
            t.runs.push(Interval {
                cpu,
                kind: OccupantKind::Thread,
                name,
                id,
                prio,
                start_ns: start,
                end_ns: stop,
            });
        }
        for (kind, name, id, start) in open {
            t.irqs.push(Interval {
                cpu,
                kind,
                name,
                id,
                prio: None,
                start_ns: start,
                end_ns: stop,
            });
        }
    }
    t
}

/// Closes the innermost open interrupt of `kind` (and `id`): entries
/// without an exit (overwritten, or a corrupt trace) are dropped.
fn close(
    open: &mut Vec<(OccupantKind, String, i32, u64)>,
    out: &mut Vec<Interval>,
    cpu: u32,
    kind: OccupantKind,
    id: Option<i32>,
    ts: u64,
) {
    if let Some(i) = open
        .iter()
        .rposition(|o| o.0 == kind && id.is_none_or(|id| o.2 == id))
    {
        let (kind, name, id, start) = open.remove(i);
        out.push(Interval {
            cpu,
            kind,
            name,
            id,
            prio: None,
            start_ns: start,
            end_ns: ts,
        });
    }
}

fn overlap(a0: u64, a1: u64, b0: u64, b1: u64) -> u64 {
    a1.min(b1).saturating_sub(a0.max(b0))
}

/// Who held a CPU in a window, and for how long.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Occupant {
    pub kind: OccupantKind,
    pub name: String,
    /// The pid (thread), IRQ number (hardirq), vector (softirq).
    pub id: i32,
    /// `FIFO 50`, `nice 0` (threads).
    pub priority: Option<String>,
    pub cpu: u32,
    /// `sender` or `receiver` for the two real-time threads.
    pub role: Option<String>,
    /// Time in the window (a thread's without its interrupts).
    pub time_ns: u64,
    /// Of it, after the receiver's wakeup.
    pub after_wake_ns: u64,
}

impl Occupant {
    /// `irq/130-eqos (FIFO 50, pid 512)`, `hardirq 42 (virtio3-tx)`.
    pub fn label(&self) -> String {
        match self.kind {
            OccupantKind::Thread => format!(
                "{}{} ({}, pid {})",
                self.role
                    .as_deref()
                    .map_or(String::new(), |r| format!("the {r} ")),
                self.name,
                self.priority.as_deref().unwrap_or("priority unknown"),
                self.id
            ),
            OccupantKind::Hardirq => format!("hardirq {} ({})", self.id, self.name),
            OccupantKind::Softirq => format!("softirq {}", self.name),
            OccupantKind::Hrtimer => format!("hrtimer {}", self.name),
        }
    }
}

/// Who ran on `cpu` in `[a, b)`, longest first; `wake` splits the time.
fn occupants(
    t: &Timeline,
    ctx: &MissContext,
    cpu: u32,
    a: u64,
    b: u64,
    wake: u64,
) -> Vec<Occupant> {
    let mut acc: BTreeMap<(OccupantKind, i32, String), Occupant> = BTreeMap::new();
    let irqs: Vec<&Interval> = t
        .irqs
        .iter()
        .filter(|i| i.cpu == cpu && overlap(i.start_ns, i.end_ns, a, b) > 0)
        .collect();
    let mut add = |iv: &Interval, time: u64, after: u64| {
        if time == 0 {
            return;
        }
        let key = (iv.kind, iv.id, iv.name.clone());
        let o = acc.entry(key).or_insert_with(|| Occupant {
            kind: iv.kind,
            name: iv.name.clone(),
            id: iv.id,
            priority: iv
                .prio
                .map(|p| prio_label(p, ctx.policies.get(&iv.id).map(|s| s.as_str()))),
            cpu,
            role: (iv.kind == OccupantKind::Thread)
                .then(|| {
                    if ctx.kind == MissKind::Timer && iv.id == ctx.receiver_pid {
                        Some("timer".to_string())
                    } else if iv.id == ctx.sender_pid {
                        Some("sender".to_string())
                    } else if iv.id == ctx.receiver_pid {
                        Some("receiver".to_string())
                    } else {
                        None
                    }
                })
                .flatten(),
            time_ns: 0,
            after_wake_ns: 0,
        });
        o.time_ns += time;
        o.after_wake_ns += after;
    };
    for r in t.runs.iter().filter(|r| r.cpu == cpu) {
        let (s, e) = (r.start_ns.max(a), r.end_ns.min(b));
        if e <= s {
            continue;
        }
        let stolen: u64 = irqs
            .iter()
            .map(|i| overlap(i.start_ns, i.end_ns, s, e))
            .sum();
        let stolen_after: u64 = irqs
            .iter()
            .map(|i| overlap(i.start_ns, i.end_ns, s.max(wake), e))
            .sum();
        let time = (e - s).saturating_sub(stolen);
        let after = overlap(s, e, wake, u64::MAX).saturating_sub(stolen_after);
        add(r, time, after.min(time));
    }
    for i in &irqs {
        let time = overlap(i.start_ns, i.end_ns, a, b);
        add(i, time, overlap(i.start_ns, i.end_ns, a.max(wake), b));
    }
    let mut v: Vec<Occupant> = acc.into_values().collect();
    v.sort_by(|x, y| y.time_ns.cmp(&x.time_ns).then(x.name.cmp(&y.name)));
    v
}

/// Which part of the path took the time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LatePart {
    /// Send -> the receiver's wakeup took longest.
    WokenLate,
    /// Wakeup -> the receiver on its CPU took longest.
    RanLate,
    /// On its CPU -> its handler took longest.
    HandlerLate,
    /// The receiver was running, or preempted and runnable, when the
    /// message was sent (busy with earlier work): no wakeup was needed.
    Busy,
    /// The trace has no wakeup of the receiver in the window.
    NoWakeup,
}

/// A priority change by priority inheritance in the window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PiBoost {
    pub comm: String,
    pub pid: i32,
    pub cpu: u32,
    pub ts_ns: u64,
    pub from: String,
    pub to: String,
}

/// One kernel event on the wake path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KernelStep {
    pub ts_ns: u64,
    pub cpu: u32,
    /// The task current on the CPU.
    pub comm: String,
    pub pid: i32,
    pub event: String,
    pub text: String,
}

/// A wait for a lock by the sender or the receiver in the window
/// (`lock:contention_begin` .. `contention_end`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LockWait {
    /// `sender`, `receiver` or `timer`.
    pub role: String,
    pub comm: String,
    pub pid: i32,
    /// Where the wait began.
    pub cpu: u32,
    /// The lock's address as the kernel prints it (hashed).
    pub lock: String,
    /// Its kind: `RT` (an rt_mutex: a spinlock on PREEMPT_RT, like a
    /// futex hash bucket's), `SPIN`, `MUTEX`, ...
    pub flags: String,
    pub start_ns: u64,
    /// To the `contention_end`, or to the handler when the window has
    /// none.
    pub wait_ns: u64,
    /// The task priority inheritance boosted while it waited: the lock's
    /// holder (rt_mutexes boost their owner to the top waiter's
    /// priority), as `comm (pid N, nice 0 -> FIFO 80)`.
    pub holder: Option<String>,
}

/// At most this many lock waits are listed.
const MAX_LOCK_WAITS: usize = 16;

/// At most this many io_uring events are listed.
const MAX_IO_URING_STEPS: usize = 16;

/// The analysis of one miss.
#[derive(Debug, Clone, Serialize)]
pub struct Analysis {
    pub context: MissContext,
    pub latency_ns: u64,
    /// The receiver's wakeup (`sched_wakeup`), when in the window.
    pub wake_ns: Option<u64>,
    /// The receiver switched in on its CPU after the wakeup.
    pub run_ns: Option<u64>,
    pub part: LatePart,
    /// What ran on the receiver's CPU from the send to the handler.
    pub receiver_cpu: Vec<Occupant>,
    /// What ran on the sender's CPU from the send to the wakeup, when it
    /// is another CPU.
    pub sender_cpu: Vec<Occupant>,
    pub pi_boosts: Vec<PiBoost>,
    /// Lock waits of the sender and the receiver in the window, longest
    /// first.
    pub lock_waits: Vec<LockWait>,
    /// io_uring events of the window (completions, task work queued and
    /// run), oldest first: how the wake went through io_uring.
    pub io_uring: Vec<KernelStep>,
    /// The longest stretch of the window with no event on the receiver's
    /// CPU, when it is most of the latency: (start, length). Time inside
    /// one task these events do not show (a spinning lock, a long
    /// syscall, the hypervisor running another vCPU).
    pub silent: Option<(u64, u64)>,
    /// What held the receiver back, when one thing did.
    pub culprit: Option<Occupant>,
    /// With no culprit: how long the receiver's CPU stayed idle after
    /// the wake, when that was half the latency or more.
    pub idle_after_wake_ns: Option<u64>,
    /// Limits of what the trace shows.
    pub limits: Vec<String>,
    /// The one-line verdict.
    pub verdict: String,
}

/// Below this share of the latency nothing is called the culprit.
const CULPRIT_SHARE: u64 = 5;
/// Nor below this.
const CULPRIT_MIN_NS: u64 = 5_000;
/// A stretch without events shorter than this is not worth a mention.
const SILENT_MIN_NS: u64 = 50_000;

/// Analyses the window of `ctx` in `events`.
pub fn analyse(events: &[Event], ctx: &MissContext) -> Analysis {
    let (send, handler) = (ctx.send_ns, ctx.handler_ns.max(ctx.send_ns));
    let latency = handler - send;
    let t = timeline(events, ctx.complete_since_ns, handler);
    let rcpu = ctx.receiver_cpu;
    let (start_w, who_w, end_w) = ctx.kind.words();
    let mut limits = vec![];
    for cpu in [ctx.sender_cpu, rcpu] {
        match t.span.get(&cpu) {
            None => limits.push(format!("no event of CPU {cpu} in the trace")),
            Some(&(first, _))
                if first > send && ctx.complete_since_ns.is_none_or(|c| c > send) =>
            {
                limits.push(format!(
                    "the buffer of CPU {cpu} begins {} after {start_w} (older events overwritten or not recorded): part of the window is missing",
                    fmt_ns(first - send)
                ))
            }
            _ => {}
        }
    }
    limits.dedup();
    // Trace times have microseconds: allow one of slack at the send.
    let from = send.saturating_sub(1_000);
    let wake_ns = events
        .iter()
        .filter(|e| e.ts_ns >= from && e.ts_ns <= handler)
        .filter(|e| matches!(&e.kind, EventKind::Wakeup { pid, .. } if *pid == ctx.receiver_pid))
        .map(|e| e.ts_ns)
        .min();
    let run_ns = events
        .iter()
        .filter(|e| e.cpu == rcpu && e.ts_ns >= wake_ns.unwrap_or(from) && e.ts_ns <= handler)
        .filter(|e| {
            matches!(&e.kind, EventKind::Switch { next_pid, .. } if *next_pid == ctx.receiver_pid)
        })
        .map(|e| e.ts_ns)
        .min();
    let running_at_send = t.runs.iter().any(|r| {
        r.cpu == rcpu && r.id == ctx.receiver_pid && r.start_ns <= send && r.end_ns > send
    });
    // Preempted, not asleep: its last switch out on its CPU before the
    // send left it runnable (`R`, `R+`), so no wakeup was needed.
    let preempted_at_send = !running_at_send
        && events
            .iter()
            .filter(|e| e.cpu == rcpu && e.ts_ns <= send)
            .filter_map(|e| match &e.kind {
                EventKind::Switch {
                    prev_pid,
                    prev_state,
                    ..
                } if *prev_pid == ctx.receiver_pid => Some((e.ts_ns, prev_state.starts_with('R'))),
                _ => None,
            })
            .max_by_key(|x| x.0)
            .is_some_and(|x| x.1);
    let part = match (wake_ns, run_ns) {
        (None, _) if running_at_send || preempted_at_send => LatePart::Busy,
        (None, _) => LatePart::NoWakeup,
        (Some(w), r) => {
            let r = r.unwrap_or(handler);
            let parts = [
                (w.saturating_sub(send), LatePart::WokenLate),
                (r.saturating_sub(w), LatePart::RanLate),
                (handler.saturating_sub(r), LatePart::HandlerLate),
            ];
            parts
                .iter()
                .max_by_key(|p| p.0)
                .map_or(LatePart::RanLate, |p| p.1)
        }
    };
    let wake_split = wake_ns.unwrap_or(u64::MAX);
    let ignore =
        |o: &Occupant| o.kind == OccupantKind::Thread && (o.id == ctx.receiver_pid || o.id == 0);
    let receiver_cpu = occupants(&t, ctx, rcpu, send, handler, wake_split);
    let sender_cpu = if ctx.sender_cpu != rcpu {
        occupants(
            &t,
            ctx,
            ctx.sender_cpu,
            send,
            wake_ns.unwrap_or(handler),
            wake_split,
        )
    } else {
        vec![]
    };
    let threshold = (latency / CULPRIT_SHARE).max(CULPRIT_MIN_NS);
    let culprit = receiver_cpu
        .iter()
        .chain(
            sender_cpu
                .iter()
                .filter(|o| o.id != ctx.sender_pid || o.kind != OccupantKind::Thread),
        )
        .filter(|o| !ignore(o) && o.time_ns >= threshold)
        .max_by_key(|o| o.time_ns)
        .cloned();
    let pi_boosts: Vec<PiBoost> = events
        .iter()
        .filter(|e| e.ts_ns >= from && e.ts_ns <= handler)
        .filter_map(|e| match &e.kind {
            EventKind::PiSetprio {
                comm,
                pid,
                oldprio,
                newprio,
            } => {
                let pol = ctx.policies.get(pid).map(|s| s.as_str());
                Some(PiBoost {
                    comm: comm.clone(),
                    pid: *pid,
                    cpu: e.cpu,
                    ts_ns: e.ts_ns,
                    from: prio_label(*oldprio, pol),
                    to: prio_label(*newprio, if *newprio < 100 { Some("FIFO") } else { pol }),
                })
            }
            _ => None,
        })
        .take(16)
        .collect();
    let lock_waits = lock_waits(events, ctx, from, handler);
    let head = format!(
        "late {} (budget {})",
        fmt_ns(latency),
        fmt_ns(ctx.budget_ns)
    );
    let path = match (part, wake_ns, run_ns) {
        (LatePart::Busy, _, _) => {
            let when = match ctx.kind {
                MissKind::Delivery => "when the message was sent",
                MissKind::Timer => "at its deadline",
            };
            if running_at_send {
                format!("{who_w} was still running {when}")
            } else {
                format!("{who_w} was preempted (runnable, not waiting) {when}")
            }
        }
        (LatePart::NoWakeup, _, _) => format!("no wakeup of {who_w} in the trace"),
        (_, Some(w), r) => format!(
            "woken {} after {start_w}, on CPU {} {} later",
            fmt_ns(w.saturating_sub(send)),
            rcpu,
            r.map_or("not seen".to_string(), |r| fmt_ns(r.saturating_sub(w)))
        ),
        (_, None, _) => String::new(),
    };
    let idle_after_wake = wake_ns
        .and_then(|_| {
            receiver_cpu
                .iter()
                .find(|o| o.kind == OccupantKind::Thread && o.id == 0)
        })
        .map(|o| o.after_wake_ns)
        .filter(|&t| t * 2 >= latency && t >= CULPRIT_MIN_NS);
    let mut verdict = match &culprit {
        Some(c) => {
            let when = match wake_ns {
                Some(_) if c.after_wake_ns * 2 >= c.time_ns => "after the wake",
                Some(_) => "before the wake",
                None => &format!("between {start_w} and {end_w}"),
            };
            format!(
                "{head}: {} ran {} on CPU {} {when} ({path})",
                c.label(),
                fmt_ns(c.time_ns),
                c.cpu
            )
        }
        // Woken, and the CPU stayed idle most of the latency: it was slow
        // to run what was woken, which no task on it explains.
        None if idle_after_wake.is_some() => format!(
            "{head}: CPU {rcpu} stayed idle {} after the wake ({path}): slow to leave idle (a deep C-state, which cpu_dma_latency bounds, or a virtual CPU its host did not run)",
            fmt_ns(idle_after_wake.unwrap_or(0))
        ),
        None => {
            let other = receiver_cpu.iter().find(|o| !ignore(o));
            format!(
                "{head}: unexplained ({path}; {})",
                match other {
                    Some(o) => format!(
                        "the most on CPU {rcpu} was {} for {}",
                        o.label(),
                        fmt_ns(o.time_ns)
                    ),
                    None => format!("nothing else ran on CPU {rcpu}"),
                }
            )
        }
    };
    let io_uring: Vec<KernelStep> = events
        .iter()
        .filter(|e| e.ts_ns >= from && e.ts_ns <= handler)
        .filter_map(|e| match &e.kind {
            EventKind::Other { name, text } if name.starts_with("io_uring_") => Some(KernelStep {
                ts_ns: e.ts_ns,
                cpu: e.cpu,
                comm: e.comm.clone(),
                pid: e.pid,
                event: name.clone(),
                text: text.chars().take(120).collect(),
            }),
            _ => None,
        })
        .take(MAX_IO_URING_STEPS)
        .collect();
    // The longest gap between events on the receiver's CPU in the window.
    let mut stamps: Vec<u64> = events
        .iter()
        .filter(|e| e.cpu == rcpu && e.ts_ns > send && e.ts_ns < handler)
        .map(|e| e.ts_ns)
        .collect();
    stamps.push(send);
    stamps.push(handler);
    stamps.sort_unstable();
    let silent = stamps
        .windows(2)
        .map(|w| (w[0], w[1] - w[0]))
        .max_by_key(|g| g.1)
        .filter(|g| g.1 >= SILENT_MIN_NS && g.1 * 2 >= latency);
    // Worth saying when no other task explains the time: the stretch ran
    // inside the real-time pair (or something unnamed), not in idle.
    let silent_in = silent.and_then(|(at, _)| {
        t.runs
            .iter()
            .find(|r| r.cpu == rcpu && r.start_ns <= at && r.end_ns > at)
    });
    let silent = silent.filter(|_| {
        silent_in.is_some_and(|r| r.id != 0)
            && culprit
                .as_ref()
                .is_none_or(|c| c.kind == OccupantKind::Thread && c.role.is_some())
    });
    if let (Some((at, len)), Some(r)) = (silent, silent_in) {
        verdict.push_str(&format!(
            "; no event on CPU {rcpu} for {} from +{} while {} ran",
            fmt_ns(len),
            fmt_ns(at - send),
            r.name
        ));
    }
    if let Some(w) = lock_waits
        .first()
        .filter(|w| w.wait_ns >= 1_000 && w.wait_ns * CULPRIT_SHARE >= latency)
    {
        verdict.push_str(&format!(
            "; the {} waited {} for a lock ({}){}",
            if ctx.kind == MissKind::Timer {
                "timer thread"
            } else {
                w.role.as_str()
            },
            fmt_ns(w.wait_ns),
            w.flags,
            w.holder
                .as_ref()
                .map_or(String::new(), |h| format!(" held by {h}"))
        ));
    }
    if let Some(p) = pi_boosts.first() {
        verdict.push_str(&format!(
            "; PI boost of {} (pid {}) {} -> {}",
            p.comm, p.pid, p.from, p.to
        ));
    }
    if !limits.is_empty() {
        verdict.push_str(" [partial trace]");
    }
    let culprit_none = culprit.is_none();
    Analysis {
        context: ctx.clone(),
        latency_ns: latency,
        wake_ns,
        run_ns,
        part,
        receiver_cpu,
        sender_cpu,
        pi_boosts,
        lock_waits,
        io_uring,
        silent,
        culprit,
        idle_after_wake_ns: idle_after_wake.filter(|_| culprit_none),
        limits,
        verdict,
    }
}

/// The sender's and the receiver's lock waits that overlap `[from, to]`,
/// longest first, each with the task priority inheritance boosted while
/// it lasted (its holder).
fn lock_waits(events: &[Event], ctx: &MissContext, from: u64, to: u64) -> Vec<LockWait> {
    let role = |pid: i32| {
        if ctx.kind == MissKind::Timer && pid == ctx.receiver_pid {
            Some("timer")
        } else if pid == ctx.sender_pid {
            Some("sender")
        } else if pid == ctx.receiver_pid {
            Some("receiver")
        } else {
            None
        }
    };
    let mut v: Vec<LockWait> = vec![];
    for e in events.iter().filter(|e| e.ts_ns <= to) {
        let (EventKind::LockWait { lock, flags }, Some(role)) = (&e.kind, role(e.pid)) else {
            continue;
        };
        // Its end: the waiter's contention_end of that lock (on any CPU:
        // it may be woken elsewhere).
        let end = events
            .iter()
            .filter(|d| d.pid == e.pid && d.ts_ns >= e.ts_ns)
            .filter(|d| matches!(&d.kind, EventKind::LockDone { lock: l, .. } if l == lock))
            .map(|d| d.ts_ns)
            .min()
            .unwrap_or(to.max(e.ts_ns));
        if end < from {
            continue;
        }
        let holder = events
            .iter()
            .filter(|b| b.ts_ns >= e.ts_ns && b.ts_ns <= end)
            .find_map(|b| match &b.kind {
                EventKind::PiSetprio {
                    comm,
                    pid,
                    oldprio,
                    newprio,
                } if *pid != e.pid && newprio < oldprio => {
                    let pol = ctx.policies.get(pid).map(|s| s.as_str());
                    Some(format!(
                        "{comm} (pid {pid}, {} -> {})",
                        prio_label(*oldprio, pol),
                        prio_label(*newprio, if *newprio < 100 { Some("FIFO") } else { pol })
                    ))
                }
                _ => None,
            });
        v.push(LockWait {
            role: role.to_string(),
            comm: e.comm.clone(),
            pid: e.pid,
            cpu: e.cpu,
            lock: lock.clone(),
            flags: flags.clone(),
            start_ns: e.ts_ns,
            wait_ns: end - e.ts_ns,
            holder,
        });
        if v.len() >= MAX_LOCK_WAITS * 4 {
            break;
        }
    }
    v.sort_by(|a, b| b.wait_ns.cmp(&a.wait_ns).then(a.start_ns.cmp(&b.start_ns)));
    v.truncate(MAX_LOCK_WAITS);
    v
}

impl Analysis {
    /// Whether something was named: a culprit other than the idle task.
    pub fn explained(&self) -> bool {
        self.culprit
            .as_ref()
            .is_some_and(|c| c.kind != OccupantKind::Thread || c.id != 0)
    }

    /// The analysis as text: the verdict, the path, who ran, PI boosts.
    pub fn to_text(&self) -> String {
        use std::fmt::Write as _;
        let c = &self.context;
        let mut o = String::new();
        let _ = writeln!(o, "{}", self.verdict);
        match c.kind {
            MissKind::Delivery => writeln!(
                o,
                "  message seq {} ({}): sender pid {} on CPU {}, receiver pid {} on CPU {}",
                c.seq, c.mechanism, c.sender_pid, c.sender_cpu, c.receiver_pid, c.receiver_cpu
            ),
            MissKind::Timer => writeln!(
                o,
                "  timer wake {} of pid {} on CPU {}",
                c.seq, c.receiver_pid, c.receiver_cpu
            ),
        }
        .ok();
        let (start_w, _, end_w) = c.kind.words();
        let rel = |t: Option<u64>| {
            t.map_or("-".to_string(), |t| {
                format!("+{}", fmt_ns(t.saturating_sub(c.send_ns)))
            })
        };
        let (start_n, end_n) = match c.kind {
            MissKind::Delivery => ("send", "handler"),
            MissKind::Timer => ("deadline", "read on waking"),
        };
        let _ = writeln!(
            o,
            "  {start_n} +0, wakeup {}, on CPU {}, {end_n} {}",
            rel(self.wake_ns),
            rel(self.run_ns),
            rel(Some(c.handler_ns))
        );
        let table = |o: &mut String, title: String, v: &[Occupant]| {
            if v.is_empty() {
                return;
            }
            let _ = writeln!(o, "  {title}:");
            for x in v.iter().take(12) {
                let _ = writeln!(
                    o,
                    "    {:>10}  {:>10} after the wake  {}",
                    fmt_ns(x.time_ns),
                    fmt_ns(x.after_wake_ns),
                    x.label()
                );
            }
            if v.len() > 12 {
                let _ = writeln!(o, "    ... {} more", v.len() - 12);
            }
        };
        table(
            &mut o,
            format!(
                "on {}'s CPU {} from {start_w} to {end_w}",
                c.kind.words().1,
                c.receiver_cpu
            ),
            &self.receiver_cpu,
        );
        table(
            &mut o,
            format!(
                "on the sender's CPU {} from the send to the wakeup",
                c.sender_cpu
            ),
            &self.sender_cpu,
        );
        for p in &self.pi_boosts {
            let _ = writeln!(
                o,
                "  PI: {} (pid {}) on CPU {} at +{}: {} -> {}",
                p.comm,
                p.pid,
                p.cpu,
                fmt_ns(p.ts_ns.saturating_sub(c.send_ns)),
                p.from,
                p.to
            );
        }
        for w in &self.lock_waits {
            let _ = writeln!(
                o,
                "  lock: the {} {} (pid {}) on CPU {} at +{} waited {} for lock {} ({}){}",
                w.role,
                w.comm,
                w.pid,
                w.cpu,
                fmt_ns(w.start_ns.saturating_sub(c.send_ns)),
                fmt_ns(w.wait_ns),
                w.lock,
                w.flags,
                w.holder
                    .as_ref()
                    .map_or(String::new(), |h| format!(", held by {h}"))
            );
        }
        for k in &self.io_uring {
            let _ = writeln!(
                o,
                "  io_uring at +{} on CPU {} in {} (pid {}): {} {}",
                fmt_ns(k.ts_ns.saturating_sub(c.send_ns)),
                k.cpu,
                k.comm,
                k.pid,
                k.event,
                k.text
            );
        }
        if let Some((at, len)) = self.silent {
            let _ = writeln!(
                o,
                "  no event on CPU {} for {} from +{}: time inside one task these events do not show (a spinning lock, a long system call, or the hypervisor running something else)",
                c.receiver_cpu,
                fmt_ns(len),
                fmt_ns(at.saturating_sub(c.send_ns))
            );
        }
        for l in &self.limits {
            let _ = writeln!(o, "  limit: {l}");
        }
        o
    }
}

#[cfg(test)]
mod tests {
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
}
