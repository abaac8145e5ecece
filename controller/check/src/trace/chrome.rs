//! A snapshot as a trace-event JSON document (the "Trace Event Format" of
//! Chrome's trace viewer, which Perfetto's UI opens too): the JSON object
//! form, `{"traceEvents": [...], "displayTimeUnit": "ns", "otherData":
//! {...}}`, every event with `name`, `cat`, `ph`, `ts` (microseconds),
//! `pid` and `tid`. One process, "kernel trace", holds a thread per CPU
//! (`tid` = CPU number) with complete events (`ph: "X"`, with `dur`) for
//! task runs and interrupts (nested in the run they hit), and instant
//! events (`ph: "i"`, thread scope) for wakeups, priority changes and the
//! runtime's markers; a second process, "rtdeploy", shows the late
//! message from its send to its handler. `docs/trace-event-schema.json`
//! describes the subset written here.

use serde_json::{json, Value};

use super::analyse::{timeline, Analysis, OccupantKind};
use super::model::{prio_label, Event, EventKind};

/// At most this many events in one document (a window of a few
/// milliseconds holds far fewer).
pub const MAX_EVENTS: usize = 200_000;

const KERNEL_PID: u32 = 1;
const RTDEPLOY_PID: u32 = 2;

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// The document for `events` (one snapshot) and its analysis.
pub fn trace_events(events: &[Event], a: &Analysis) -> Value {
    let ctx = &a.context;
    let t = timeline(events, ctx.complete_since_ns, ctx.handler_ns);
    let mut out: Vec<Value> = vec![
        json!({"name": "process_name", "cat": "__metadata", "ph": "M", "ts": 0, "pid": KERNEL_PID, "tid": 0,
               "args": {"name": "kernel trace"}}),
        json!({"name": "process_name", "cat": "__metadata", "ph": "M", "ts": 0, "pid": RTDEPLOY_PID, "tid": 0,
               "args": {"name": "rtdeploy"}}),
        json!({"name": "thread_name", "cat": "__metadata", "ph": "M", "ts": 0, "pid": RTDEPLOY_PID, "tid": 0,
               "args": {"name": "late message"}}),
    ];
    for &cpu in t.span.keys() {
        out.push(
            json!({"name": "thread_name", "cat": "__metadata", "ph": "M", "ts": 0,
                        "pid": KERNEL_PID, "tid": cpu, "args": {"name": format!("CPU {cpu}")}}),
        );
    }
    out.push(json!({
        "name": format!("seq {} late", ctx.seq),
        "cat": "rtdeploy",
        "ph": "X",
        "ts": us(ctx.send_ns),
        "dur": us(ctx.handler_ns.saturating_sub(ctx.send_ns)),
        "pid": RTDEPLOY_PID,
        "tid": 0,
        "args": {"verdict": a.verdict, "budget_ns": ctx.budget_ns, "mechanism": ctx.mechanism},
    }));
    for r in &t.runs {
        if r.end_ns <= r.start_ns || out.len() >= MAX_EVENTS {
            continue;
        }
        let prio = r
            .prio
            .map(|p| prio_label(p, ctx.policies.get(&r.id).map(|s| s.as_str())));
        out.push(json!({
            "name": format!("{} ({})", r.name, r.id),
            "cat": if r.id == 0 { "idle" } else { "task" },
            "ph": "X",
            "ts": us(r.start_ns),
            "dur": us(r.end_ns - r.start_ns),
            "pid": KERNEL_PID,
            "tid": r.cpu,
            "args": {"pid": r.id, "priority": prio},
        }));
    }
    for i in &t.irqs {
        if i.end_ns < i.start_ns || out.len() >= MAX_EVENTS {
            continue;
        }
        let (name, cat) = match i.kind {
            OccupantKind::Hardirq => (format!("irq {} {}", i.id, i.name), "hardirq"),
            OccupantKind::Softirq => (format!("softirq {}", i.name), "softirq"),
            OccupantKind::Hrtimer => (format!("hrtimer {}", i.name), "hrtimer"),
            OccupantKind::Thread => continue,
        };
        out.push(json!({
            "name": name, "cat": cat, "ph": "X",
            "ts": us(i.start_ns), "dur": us(i.end_ns - i.start_ns),
            "pid": KERNEL_PID, "tid": i.cpu,
        }));
    }
    for e in events {
        if out.len() >= MAX_EVENTS {
            break;
        }
        let (name, cat, args) = match &e.kind {
            EventKind::Wakeup {
                comm,
                pid,
                target_cpu,
                new,
                ..
            } => (
                format!("wakeup {comm} ({pid})"),
                "sched",
                json!({"pid": pid, "target_cpu": target_cpu, "new": new}),
            ),
            EventKind::PiSetprio {
                comm,
                pid,
                oldprio,
                newprio,
            } => (
                format!("pi {comm} ({pid}) {oldprio} -> {newprio}"),
                "sched",
                json!({"pid": pid, "oldprio": oldprio, "newprio": newprio}),
            ),
            EventKind::Marker { text } => (text.clone(), "marker", json!({})),
            EventKind::LockWait { lock, flags } => (
                format!("lock wait {lock} ({flags})"),
                "lock",
                json!({"lock": lock, "flags": flags}),
            ),
            EventKind::LockDone { lock, ret } => (
                format!("lock taken {lock}"),
                "lock",
                json!({"lock": lock, "ret": ret}),
            ),
            EventKind::Other { name, text } => (name.clone(), "other", json!({"text": text})),
            _ => continue,
        };
        out.push(json!({
            "name": name, "cat": cat, "ph": "i", "s": "t",
            "ts": us(e.ts_ns), "pid": KERNEL_PID, "tid": e.cpu,
            "args": args,
        }));
    }
    json!({
        "traceEvents": out,
        "displayTimeUnit": "ns",
        "otherData": {
            "producer": "rtdeploy",
            "verdict": a.verdict,
            "seq": ctx.seq,
            "mechanism": ctx.mechanism,
            "clock": "CLOCK_MONOTONIC",
        },
    })
}

#[cfg(test)]
mod tests {
    use super::super::analyse::{analyse, MissContext};
    use super::super::model::parse;
    use super::*;

    #[test]
    fn every_event_has_the_required_fields_and_runs_nest() {
        let text = "\
         rt-send-900     [001] d..2.   99.999990: sched_switch: prev_comm=swapper/1 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=rt-send next_pid=900 next_prio=19
         rt-send-900     [001] ...1.  100.000000: tracing_mark_write: rtdeploy send seq=1 t=100000000000
         rt-send-900     [001] d.h1.  100.000100: irq_handler_entry: irq=42 name=eth0
         rt-send-900     [001] d.h1.  100.000112: irq_handler_exit: irq=42 ret=handled
         rt-send-900     [001] d..2.  100.000200: sched_wakeup: comm=rt-recv pid=901 prio=19 target_cpu=001
";
        let ctx = MissContext {
            kind: Default::default(),
            mechanism: "futex".into(),
            seq: 1,
            send_ns: 100_000_000_000,
            handler_ns: 100_000_300_000,
            budget_ns: 10_000,
            sender_pid: 900,
            sender_cpu: 1,
            receiver_pid: 901,
            receiver_cpu: 1,
            policies: Default::default(),
            complete_since_ns: None,
        };
        let ev = parse(text).events;
        let doc = trace_events(&ev, &analyse(&ev, &ctx));
        let list = doc["traceEvents"].as_array().unwrap();
        for e in list {
            for k in ["name", "ph", "ts", "pid", "tid"] {
                assert!(e.get(k).is_some(), "{k} missing in {e}");
            }
            if e["ph"] == "X" {
                assert!(e["dur"].as_f64().unwrap() >= 0.0, "{e}");
            }
        }
        let irq = list.iter().find(|e| e["cat"] == "hardirq").unwrap();
        assert_eq!(irq["ts"], 100_000_100.0);
        assert_eq!(irq["dur"], 12.0);
        let run = list
            .iter()
            .find(|e| e["cat"] == "task" && e["args"]["pid"] == 900)
            .unwrap();
        let (rs, rd) = (run["ts"].as_f64().unwrap(), run["dur"].as_f64().unwrap());
        assert!(rs <= 100_000_100.0 && rs + rd >= 100_000_112.0, "{run}");
        assert!(list.iter().any(|e| e["ph"] == "i" && e["cat"] == "marker"));
        assert_eq!(doc["displayTimeUnit"], "ns");
    }
}
