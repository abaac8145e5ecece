//! What ran where: the window's scheduler events turned into a timeline
//! of intervals per CPU, and the occupants of a CPU in a span of it.

use super::*;

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
pub(super) fn close(
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

pub(super) fn overlap(a0: u64, a1: u64, b0: u64, b1: u64) -> u64 {
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
pub(super) fn occupants(
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
