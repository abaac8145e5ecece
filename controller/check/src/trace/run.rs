//! The engine's side of tracing in a run: starts the tracer (or says why
//! not), arms it for each scenario phase, takes, analyses and saves the
//! snapshot when the receiver reports a miss, and sums it up for the
//! report.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use super::analyse::{Analysis, MissContext, MissKind};
use super::snapshot::{save, trim, Saved, Snapshot, TraceSaveError};
use super::tracefs::Tracer;
use crate::report::{TraceSummary, TraceVerdict};
use crate::worker::Control;
use crate::{CheckInputs, Mechanism, TraceRequest};
use units::error::Chain;

/// At most this many tasks get their policy read from `/proc` per
/// snapshot.
const MAX_POLICIES: usize = 256;
/// A snapshot keeps this much before the send ...
pub(crate) const CONTEXT_BEFORE_NS: u64 = 20_000_000;
/// ... and this much after the handler.
const CONTEXT_AFTER_NS: u64 = 2_000_000;

pub(crate) struct TraceRun {
    tracer: Option<Tracer>,
    req: TraceRequest,
    miss_ns: u64,
    /// A timer wake over this is a miss; `None`: the timer phase is not
    /// traced.
    timer_miss_ns: Option<u64>,
    /// The timer workers' CPUs, by slot.
    timer_cpus: Vec<usize>,
    sender_cpu: usize,
    receiver_cpu: usize,
    /// When recording last started (CLOCK_MONOTONIC, read after the
    /// buffers were cleared).
    armed_ns: std::cell::Cell<u64>,
    proc_root: PathBuf,
    /// The last verdicts of deliveries and of timer wakes, each at most
    /// `req.keep` (as the saved files).
    verdicts: VecDeque<TraceVerdict>,
    timer_verdicts: VecDeque<TraceVerdict>,
    summary: TraceSummary,
}

/// The tightest budget on the real-time delivery's maximum: a delivery
/// over it is a miss.
pub(crate) fn miss_threshold(inputs: &CheckInputs) -> Option<u64> {
    inputs
        .check
        .budgets
        .delivery_max
        .iter()
        .chain(
            inputs
                .channel_budgets
                .iter()
                .chain(&inputs.process_budgets)
                .map(|b| &b.limit),
        )
        .map(|d| d.as_nanos())
        .min()
}

/// The budget on the timer latency's maximum: a timer wake over it is a
/// miss.
pub(crate) fn timer_miss_threshold(inputs: &CheckInputs) -> Option<u64> {
    inputs.check.budgets.timer_max.map(|d| d.as_nanos())
}

impl TraceRun {
    /// Starts the tracer for the sender's and receiver's CPUs (and the
    /// timer workers' `timer_cpus` when the timer latency has a budget),
    /// stopped until [`TraceRun::arm`]. When it cannot run, the run goes
    /// on without it and the summary says why.
    pub fn start(
        req: &TraceRequest,
        inputs: &CheckInputs,
        sysroot: &Path,
        sender_cpu: usize,
        receiver_cpu: usize,
        timer_cpus: &[usize],
    ) -> TraceRun {
        let miss = miss_threshold(inputs);
        let timer_miss = timer_miss_threshold(inputs);
        let mut cpus = vec![];
        if miss.is_some() {
            cpus.extend([sender_cpu, receiver_cpu]);
        }
        if timer_miss.is_some() {
            cpus.extend(timer_cpus);
        }
        cpus.sort_unstable();
        cpus.dedup();
        let mut summary = TraceSummary {
            dir: req.dir.display().to_string(),
            cpus: cpus.clone(),
            miss_threshold_ns: miss,
            timer_miss_threshold_ns: timer_miss,
            ..TraceSummary::default()
        };
        let proc_root = sysroot.join("proc");
        let tracer = match (miss, timer_miss) {
            (None, None) => {
                summary.reason = Some(
                    "no budget on the delivery's maximum to miss (check.budgets.delivery_max, a channel's budget or a real-time process's budgets.wakeup) nor on the timer's (check.budgets.timer_max)".into(),
                );
                None
            }
            _ => match Tracer::start(&sysroot.join("sys"), &proc_root, &cpus) {
                Ok(t) => {
                    t.off();
                    t.off_on_signal();
                    summary.enabled = true;
                    summary.instance = Some(t.dir().display().to_string());
                    summary.events = t.events.clone();
                    summary.missing_events = t.missing.clone();
                    Some(t)
                }
                Err(e) => {
                    summary.reason = Some(Chain(&e).to_string());
                    None
                }
            },
        };
        TraceRun {
            tracer,
            req: req.clone(),
            miss_ns: miss.unwrap_or(u64::MAX),
            timer_miss_ns: timer_miss,
            timer_cpus: timer_cpus.to_vec(),
            sender_cpu,
            receiver_cpu,
            armed_ns: std::cell::Cell::new(u64::MAX),
            proc_root,
            verdicts: VecDeque::new(),
            timer_verdicts: VecDeque::new(),
            summary,
        }
    }

    /// Whether the tracer runs.
    pub fn enabled(&self) -> bool {
        self.tracer.is_some()
    }

    /// Notes for the report from the start (another tracer, stale
    /// instances).
    pub fn notes(&self) -> Vec<String> {
        self.tracer.as_ref().map_or(vec![], |t| t.notes.clone())
    }

    /// Extra arguments of the real-time sender and receiver (none when
    /// the delivery has no budget to miss).
    pub fn worker_args(&self, receiver: bool) -> Vec<String> {
        let Some(t) = self.tracer.as_ref().filter(|_| self.miss_ns != u64::MAX) else {
            return vec![];
        };
        let mut v = vec![format!("trace={}", t.dir().display())];
        if receiver {
            v.push(format!("miss_ns={}", self.miss_ns));
        }
        v
    }

    /// Extra arguments of a timer worker (none when the timer latency has
    /// no budget to miss).
    pub fn timer_args(&self) -> Vec<String> {
        match (&self.tracer, self.timer_miss_ns) {
            (Some(t), Some(miss)) => vec![
                format!("trace={}", t.dir().display()),
                format!("miss_ns={miss}"),
            ],
            _ => vec![],
        }
    }

    /// Clears the buffers and records; the receiver may stop it on a miss.
    pub fn arm(&self, ctl: &Control) {
        if let Some(t) = &self.tracer {
            ctl.trace_miss.store(0, Ordering::SeqCst);
            t.resume();
            self.armed_ns.set(controller::Monotonic::now().as_nanos());
            ctl.trace_armed.store(1, Ordering::SeqCst);
        }
    }

    /// Stops recording (end of a phase).
    pub fn disarm(&self, ctl: &Control) {
        if let Some(t) = &self.tracer {
            ctl.trace_armed.store(0, Ordering::SeqCst);
            t.off();
        }
    }

    /// Takes the snapshot of a miss the receiver (of mechanism `mech`,
    /// the real-time pair's pids given) or a timer worker reported, if
    /// any; then records again when `rearm`.
    pub fn poll(
        &mut self,
        ctl: &Control,
        pair: Option<(Mechanism, u32, u32)>,
        rearm: bool,
    ) -> Option<String> {
        let t = self.tracer.as_ref()?;
        // Acquire: pairs with the receiver's Release store of the flag.
        if ctl.trace_miss.load(Ordering::Acquire) == 0 {
            return None;
        }
        let (seq, send_ns, handler_ns) = (
            ctl.trace_miss_seq.load(Ordering::Relaxed),
            ctl.trace_miss_send_ns.load(Ordering::Relaxed),
            ctl.trace_miss_handler_ns.load(Ordering::Relaxed),
        );
        let timer = ctl.trace_miss_timer.swap(0, Ordering::Relaxed);
        let timer_cpu = timer
            .checked_sub(1)
            .and_then(|slot| self.timer_cpus.get(slot as usize).copied());
        // Who missed: a timer worker (then it is both ends, on its CPU)
        // or the real-time pair of this phase.
        let who = match (timer_cpu, pair) {
            (Some(cpu), _) => {
                let pid = ctl.trace_miss_pid.load(Ordering::Relaxed) as i32;
                let budget = self.timer_miss_ns.unwrap_or(0);
                Some((
                    MissKind::Timer,
                    "timer".to_string(),
                    budget,
                    (pid, cpu),
                    (pid, cpu),
                ))
            }
            (None, Some((mech, sender, receiver))) if timer == 0 => Some((
                MissKind::Delivery,
                mech.short().to_string(),
                self.miss_ns,
                (sender as i32, self.sender_cpu),
                (receiver as i32, self.receiver_cpu),
            )),
            _ => None,
        };
        let Some((kind, mechanism, budget_ns, sender, receiver)) = who else {
            // A report that matches no worker of this phase: dropped,
            // and recording goes on.
            if rearm {
                self.arm(ctl);
            } else {
                ctl.trace_miss.store(0, Ordering::SeqCst);
            }
            return None;
        };
        let context = MissContext {
            kind,
            mechanism,
            seq,
            send_ns,
            handler_ns,
            budget_ns,
            sender_pid: sender.0,
            sender_cpu: sender.1 as u32,
            receiver_pid: receiver.0,
            receiver_cpu: receiver.1 as u32,
            policies: BTreeMap::new(),
            complete_since_ns: Some(complete_since(self.armed_ns.get(), send_ns)),
        };
        let mech = pair.map(|p| p.0).filter(|_| timer_cpu.is_none());
        let cpus = window(&t.read_cpus(), context.send_ns, context.handler_ns);
        // Recording again before the analysis: the engine may get little
        // CPU time (it runs on the loaded housekeeping CPUs), and a miss
        // meanwhile is not lost.
        if rearm {
            self.arm(ctl);
        } else {
            ctl.trace_miss.store(0, Ordering::SeqCst);
        }
        let (snap, a, saved) = analyse_and_save(
            Snapshot { context, cpus },
            &self.proc_root,
            &self.req.dir,
            self.req.keep,
        );
        self.summary.snapshots += 1;
        let problem = saved.as_ref().err().map(|e| Chain(e).to_string());
        let kept = if timer_cpu.is_some() {
            &mut self.timer_verdicts
        } else {
            &mut self.verdicts
        };
        kept.push_back(TraceVerdict {
            mechanism: mech,
            timer_cpu,
            seq: snap.context.seq,
            latency_ns: a.latency_ns,
            verdict: a.verdict.clone(),
            explained: a.explained(),
            text: saved.as_ref().ok().map(|s| s.text.display().to_string()),
            json: saved.as_ref().ok().map(|s| s.json.display().to_string()),
        });
        while kept.len() > self.req.keep.max(1) {
            kept.pop_front();
        }
        problem
    }

    /// The summary for the report; the tracer stays up until dropped.
    pub fn summary(&self, ctl: &Control) -> TraceSummary {
        let mut s = self.summary.clone();
        s.over_threshold = ctl.trace_over.load(Ordering::SeqCst);
        s.timer_over_threshold = ctl.trace_timer_over.load(Ordering::SeqCst);
        // The timer phase runs first: oldest first overall.
        s.verdicts = self
            .timer_verdicts
            .iter()
            .chain(&self.verdicts)
            .cloned()
            .collect();
        s
    }
}

/// The window of a miss sent at `send_ns` and handled at `handler_ns` in
/// the CPUs' buffer texts, with context: who ran before the send, what
/// came right after the handler.
pub(crate) fn window(texts: &[(u32, String)], send_ns: u64, handler_ns: u64) -> Vec<(u32, String)> {
    let (from, to) = (
        send_ns.saturating_sub(CONTEXT_BEFORE_NS),
        handler_ns.saturating_add(CONTEXT_AFTER_NS),
    );
    texts
        .iter()
        .map(|(c, text)| (*c, trim(text, from, to)))
        .collect()
}

/// Since when a snapshot holds every event of its CPUs: recording
/// started at `armed_ns`, the window begins [`CONTEXT_BEFORE_NS`] before
/// the send at `send_ns`.
pub(crate) fn complete_since(armed_ns: u64, send_ns: u64) -> u64 {
    armed_ns.max(send_ns.saturating_sub(CONTEXT_BEFORE_NS))
}

/// Reads the policies of the tasks in `snap` (from `proc_root`), analyses
/// it and saves it in `dir` (keeping `keep` of its kind).
pub(crate) fn analyse_and_save(
    mut snap: Snapshot,
    proc_root: &Path,
    dir: &Path,
    keep: usize,
) -> (Snapshot, Analysis, Result<Saved, TraceSaveError>) {
    let parsed = snap.parsed();
    let pids: BTreeSet<i32> = parsed
        .events
        .iter()
        .map(|e| e.pid)
        .filter(|&p| p > 0)
        .take(MAX_POLICIES * 4)
        .collect();
    for pid in pids.into_iter().take(MAX_POLICIES) {
        if let Some(p) = policy(proc_root, pid) {
            snap.context.policies.insert(pid, p.to_string());
        }
    }
    let (a, parsed) = snap.analyse();
    let saved = save(dir, &snap, &a, &parsed, keep);
    (snap, a, saved)
}

/// The scheduling policy of task `pid` (`/proc/<pid>/stat`, field 41),
/// as chrt names it.
fn policy(proc_root: &Path, pid: i32) -> Option<&'static str> {
    // One line of 52 numeric fields and a comm of at most 16 bytes: well
    // under 4 KiB.
    let s = units::bounded::Bound::pseudo(4096)
        .read_lossy(&proc_root.join(pid.to_string()).join("stat"))
        .ok()?;
    policy_of_stat(&s)
}

/// Field 41 of a `/proc/<pid>/stat` line (after the comm in parentheses,
/// the state is field 3).
pub(crate) fn policy_of_stat(stat: &str) -> Option<&'static str> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let p: u32 = rest.split_whitespace().nth(41 - 3)?.parse().ok()?;
    Some(match p {
        0 => "OTHER",
        1 => "FIFO",
        2 => "RR",
        3 => "BATCH",
        5 => "IDLE",
        6 => "DEADLINE",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_field_of_proc_stat() {
        // /proc/<pid>/stat of a SCHED_FIFO thread (kernel 6.18), comm
        // with a space and a parenthesis.
        let stat = "4242 (spin (x) y) R 1 4242 4242 0 -1 4194368 95 0 0 0 1200 3 0 0 -51 0 1 0 1000 2000000 100 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 50 1 0 0 0 0 0 0 0 0 0 0 0";
        assert_eq!(policy_of_stat(stat), Some("FIFO"));
        assert_eq!(policy_of_stat("1 (x) S 0"), None);
        assert_eq!(policy_of_stat("garbage"), None);
    }
}
