//! Why one message was late: the events of the window from its send to
//! its handler, turned into what ran where, when the receiver was woken
//! and when it ran, and a one-line verdict (pure: no I/O).
//!
//! `timeline` builds what ran where; this module decides why the message
//! was late from it (`tests` holds the fixture traces).

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::model::{prio_label, Event, EventKind};
use crate::report::fmt_ns;

mod timeline;

pub use timeline::*;

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
mod tests;
