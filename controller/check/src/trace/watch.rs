//! The supervisor's side of tracing the running processes (robot.yaml
//! `check.trace_on_miss` and a real-time process's `budgets.wakeup`).
//!
//! The supervisor keeps an instance of its own ([`Tracer`]) recording on
//! the isolated CPUs for as long as it runs; its real-time processes write
//! markers to it and turn it off on a handler that starts over their
//! budget (`controller::miss_trace`). [`RuntimeTrace::poll`], called from
//! the supervisor's loop a few times a second, notices the instance off,
//! finds the miss marker, analyses the window from the event to the
//! handler as the check does, saves it beside the check's misses and
//! turns tracing on again. Snapshots are spaced: one a second at most,
//! the pause doubling (up to 5 minutes) while misses keep coming.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::analyse::{MissContext, MissKind};
use super::model::{parse, Event, EventKind};
use super::run::{analyse_and_save, complete_since, window};
use super::snapshot::Snapshot;
use super::tracefs::{read_small, TraceSetupError, Tracer};
use controller::miss_trace::MissMarker;
use units::error::Chain;

/// One traced miss of a running process.
#[derive(Debug, Clone)]
pub struct RuntimeMiss {
    /// The process whose handler was late (the marker's writer).
    pub receiver_pid: i32,
    /// A timer's wake, not a message.
    pub timer: bool,
    pub verdict: String,
    /// The saved text (`deploy trace show` reads it); `None` when saving
    /// failed, `problem` says why.
    pub text: Option<PathBuf>,
    pub problem: Option<String>,
}

/// After a snapshot the next is taken no sooner than this ...
const FIRST_PAUSE: Duration = Duration::from_secs(1);
/// ... the pause doubling while misses keep coming, up to this: a robot
/// that misses all the time must not spend its housekeeping CPU reading
/// buffers, nor wear its flash with saved traces.
const MAX_PAUSE: Duration = Duration::from_secs(300);

/// The supervisor's instance and where its misses go.
#[derive(Debug)]
pub struct RuntimeTrace {
    tracer: Tracer,
    proc_root: PathBuf,
    dir: PathBuf,
    keep: usize,
    /// Misses snapshotted so far.
    pub snapshots: u64,
    /// No snapshot before this (a stopped trace waits, holding its miss).
    next_at: Option<Instant>,
    pause: Duration,
    /// When recording last started (CLOCK_MONOTONIC, the trace's clock):
    /// a miss whose event came before it has only part of its window.
    resumed_ns: u64,
    /// The last stop was such a miss, passed over: the next is taken
    /// whole or not.
    passed_over: bool,
}

impl RuntimeTrace {
    /// Starts recording on `cpus` in this process's instance (the one
    /// [`super::tracefs::instance_dir`] names); misses are saved in
    /// `dir`, at most `keep` of each kind.
    pub fn start(
        sys: &Path,
        proc_root: &Path,
        cpus: &[usize],
        dir: PathBuf,
        keep: usize,
    ) -> Result<RuntimeTrace, TraceSetupError> {
        let tracer = Tracer::start(sys, proc_root, cpus)?;
        Ok(RuntimeTrace {
            tracer,
            proc_root: proc_root.to_path_buf(),
            dir,
            keep: keep.max(1),
            snapshots: 0,
            next_at: None,
            pause: FIRST_PAUSE,
            resumed_ns: controller::Monotonic::now().as_nanos(),
            passed_over: false,
        })
    }

    pub fn tracer(&self) -> &Tracer {
        &self.tracer
    }

    fn resume(&mut self) {
        self.tracer.resume();
        // Read after the buffers were cleared: events before it may be
        // gone, none after.
        self.resumed_ns = controller::Monotonic::now().as_nanos();
    }

    /// When a process turned the instance off: the analysis of its miss,
    /// then recording again. `None` while it records (or when it was
    /// turned off without a miss marker: recording starts again).
    pub fn poll(&mut self) -> Option<RuntimeMiss> {
        self.poll_at(Instant::now())
    }

    /// [`RuntimeTrace::poll`] at `now` (the pause between snapshots is
    /// counted on it).
    pub fn poll_at(&mut self, now: Instant) -> Option<RuntimeMiss> {
        if let Some(at) = self.next_at {
            if now < at {
                return None;
            }
        }
        let on = read_small(&self.tracer.dir().join("tracing_on")).ok()?;
        if on.trim() != "0" {
            // Quiet for a whole pause since the last snapshot: the next
            // pause is shorter again.
            if let Some(at) = self.next_at {
                if now >= at + self.pause {
                    self.pause = (self.pause / 2).max(FIRST_PAUSE);
                    self.next_at = Some(now);
                }
            }
            return None;
        }
        let texts = self.tracer.read_cpus();
        // The earliest miss over every CPU's buffer: only the marker lines
        // are parsed here (a full buffer is tens of thousands of events,
        // and the supervisor runs on the housekeeping CPUs).
        let markers: Vec<Event> = texts
            .iter()
            .flat_map(|(_, t)| t.lines().filter(|l| l.contains(": rtdeploy miss ")))
            .take(4096)
            .flat_map(|l| parse(l).events)
            .collect();
        let Some((event, marker)) = first_miss(&markers) else {
            self.resume();
            return None;
        };
        // Sent before recording started (a message late across the
        // resume): its window is cut. Passed over once; the next miss has
        // its whole window (or is taken as it is, said partial).
        if marker.send_ns < self.resumed_ns && !self.passed_over {
            self.passed_over = true;
            self.resume();
            return None;
        }
        self.passed_over = false;
        // The window, then the context from its events.
        let cpus = window(&texts, marker.send_ns, marker.handler_ns);
        drop(texts);
        let events: Vec<Event> = cpus.iter().flat_map(|(_, t)| parse(t).events).collect();
        let mut context = context_of(&event, &marker, &events);
        context.complete_since_ns = Some(complete_since(self.resumed_ns, marker.send_ns));
        // Recording again before the analysis: a miss meanwhile is not
        // lost.
        self.resume();
        self.next_at = Some(now + self.pause);
        self.pause = (self.pause * 2).min(MAX_PAUSE);
        let (_, a, saved) = analyse_and_save(
            Snapshot { context, cpus },
            &self.proc_root,
            &self.dir,
            self.keep,
        );
        self.snapshots += 1;
        Some(RuntimeMiss {
            receiver_pid: event.pid,
            timer: marker.timer,
            verdict: a.verdict,
            text: saved.as_ref().ok().map(|s| s.text.clone()),
            problem: saved.as_ref().err().map(|e| Chain(e).to_string()),
        })
    }
}

/// The earliest miss marker of `events`, with its event (whose pid and
/// CPU are the late process's).
fn first_miss(events: &[Event]) -> Option<(Event, MissMarker)> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Marker { text } => MissMarker::parse(text).map(|m| (e.clone(), m)),
            _ => None,
        })
        .min_by_key(|(e, _)| e.ts_ns)
}

/// The context of a miss from its marker: the receiver is the marker's
/// writer on its CPU; the sender's CPU is where the sender last ran
/// before the send (the receiver's when the trace does not show it).
pub(crate) fn context_of(event: &Event, m: &MissMarker, events: &[Event]) -> MissContext {
    let sender = m.sender_pid as i32;
    let sender_cpu = if m.timer {
        event.cpu
    } else {
        events
            .iter()
            .filter(|e| e.ts_ns <= m.send_ns.saturating_add(1_000))
            .filter(|e| match &e.kind {
                EventKind::Switch { next_pid, .. } => *next_pid == sender,
                _ => e.pid == sender,
            })
            .max_by_key(|e| e.ts_ns)
            .map_or(event.cpu, |e| e.cpu)
    };
    MissContext {
        kind: if m.timer {
            MissKind::Timer
        } else {
            MissKind::Delivery
        },
        mechanism: if m.timer { "timer" } else { "runtime" }.into(),
        seq: m.seq,
        send_ns: m.send_ns,
        handler_ns: m.handler_ns,
        budget_ns: m.budget_ns,
        sender_pid: if m.timer { event.pid } else { sender },
        sender_cpu,
        receiver_pid: event.pid,
        receiver_cpu: event.cpu,
        policies: Default::default(),
        complete_since_ns: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A talker (pid 900) on CPU 2 publishes; the listener (pid 901) on
    /// CPU 3 is woken at once but a FIFO 90 spinner holds CPU 3; the
    /// listener's handler starts 1.2ms later, over its 500us budget.
    const RUNTIME_MISS: &str = "\
          <idle>-0       [003] d..2.   99.999900: sched_switch: prev_comm=listener prev_pid=901 prev_prio=19 prev_state=S ==> next_comm=planted-spin next_pid=777 next_prio=9
          talker-900     [002] d..2.   99.999990: sched_switch: prev_comm=swapper/2 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=talker next_pid=900 next_prio=19
          talker-900     [002] d..2.  100.000004: sched_wakeup: comm=listener pid=901 prio=19 target_cpu=003
          talker-900     [002] ...1.  100.000006: tracing_mark_write: rtdeploy send seq=41 t=100000000000
    planted-spin-777     [003] d..2.  100.001200: sched_switch: prev_comm=planted-spin prev_pid=777 prev_prio=9 prev_state=S ==> next_comm=listener next_pid=901 next_prio=19
        listener-901     [003] ...1.  100.001205: tracing_mark_write: rtdeploy handler seq=41 t=100001205000
        listener-901     [003] ...1.  100.001207: tracing_mark_write: rtdeploy miss kind=message seq=41 sender=900 send=100000000000 handler=100001205000 budget=500000
";

    #[test]
    fn the_miss_marker_gives_the_context_and_the_verdict() {
        let events = parse(RUNTIME_MISS).events;
        let (e, m) = first_miss(&events).expect("a miss marker");
        let c = context_of(&e, &m, &events);
        assert_eq!(
            (c.receiver_pid, c.receiver_cpu, c.sender_pid, c.sender_cpu),
            (901, 3, 900, 2)
        );
        assert_eq!(
            (c.kind, c.seq, c.budget_ns),
            (MissKind::Delivery, 41, 500_000)
        );
        let mut c = c;
        c.policies.insert(777, "FIFO".into());
        let a = super::super::analyse(&events, &c);
        assert!(
            a.verdict.starts_with(
                "late 1.21ms (budget 500us): planted-spin (FIFO 90, pid 777) ran 1.20ms on CPU 3 after the wake"
            ),
            "{}",
            a.verdict
        );
        // A marker some other process wrote that only looks like ours.
        assert!(first_miss(&parse(
            "           x-5     [003] ...1.  100.000001: tracing_mark_write: rtdeploy miss kind=message seq=1\n"
        ).events)
        .is_none());
    }
}
