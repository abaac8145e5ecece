//! The figures of a whole run: pooled per benchmark, size and side, the
//! ratio ours / iceoryx2 beside each, the target checked, as a
//! Markdown table for people and one JSON document for tools.

use std::fmt::Write as _;

use serde::Serialize;

use crate::host::Host;
use crate::message::size_label;
use crate::role::Impl;
use crate::runner::Outcome;
use crate::settings::{Bench, Settings};
use crate::stats::{median, ratio, Percentiles};

/// Bumped when a field changes meaning or goes away.
pub const SCHEMA_VERSION: u32 = 1;

/// The target for ping-pong: our p50 at most this times iceoryx2's.
pub const TARGET_P50_RATIO: f64 = 0.6;
/// ... and our p99.9 no worse than iceoryx2's.
pub const TARGET_P999_RATIO: f64 = 1.0;

/// Exactly what each side does per message, per benchmark.
pub const MEASURED: &[(&str, &str, &str)] = &[
    (
        "ping-pong",
        "A stamps CLOCK_MONOTONIC, loans a slot, writes the whole message, sends; B's event loop (watching the channel: an io_uring futex wait kept armed; wake check every 50 ms, the default) runs its handler, which sends the pong the same way (stamp echoed); A's event loop runs its handler, which reads the clock: RTT",
        "A stamps CLOCK_MONOTONIC, loan_uninit, writes the whole message, send, notify; B sleeps in its event listener's wait (timed_wait of 50 ms: the same safety net as our loop's 50 ms wake check, for a wake that never comes), receive()s the sample, sends the pong the same way (stamp echoed) and notifies; A wakes in its listener's wait the same way, receive()s, reads the clock: RTT",
    ),
    (
        "one-way",
        "a sender on absolute CLOCK_MONOTONIC sleeps one period apart stamps word 0 and sends as above; the receiver's event loop handler reads the clock first thing: latency = now - stamp",
        "the same sender with loan_uninit/send/notify; the receiver wakes in its listener's wait (timed, 50 ms), receive()s, reads the clock: latency = now - stamp",
    ),
    (
        "publish",
        "loan, write the whole message, send, back to back in timed batches; a subscriber is attached in another process and never waits (no wake is due; the run fails if one was made)",
        "loan_uninit, write the whole message, send, notify, back to back in timed batches; a subscriber and a listener exist in another process and never wait nor read (after the first notify the event is pending, so later notifies make no syscall); `send only` batches (alternating with these) leave out the notify",
    ),
    (
        "throughput",
        "a sender publishes N messages back to back (loan, write, send); each subscriber is an event loop watching the channel (wake check every 50 ms, the default) on the receiver CPU, counting what it handles and what its ring overwrote unread",
        "a sender publishes N messages back to back (loan_uninit, write, send, notify); each subscriber sleeps in its listener's wait (timed, 50 ms) and receive()s everything there, counting, and the sequence numbers tell what its buffer overwrote unread",
    ),
];

/// Percentiles of one side, or none when it measured nothing.
#[derive(Debug, Clone, Serialize)]
pub struct LatencyFigures {
    pub benchmark: &'static str,
    pub size: usize,
    pub unit: &'static str,
    pub ours: Option<Percentiles>,
    pub iceoryx2: Option<Percentiles>,
    pub ratio_ours_over_iceoryx2: Option<Ratios>,
    /// Messages overwritten before the receiver read them.
    pub lost: SidePair<u64>,
    /// Ping-pong echoes that did not carry the stamp sent.
    pub mismatched: SidePair<u64>,
    /// Messages a receiver found by its 50 ms timed look, not by a wake
    /// (ours: our loop's wake check, counting lost and late wakes;
    /// iceoryx2: its timed wait ran out with a sample there). Each cost up
    /// to 50 ms of latency.
    pub healed: SidePair<u64>,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Ratios {
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    pub p999: Option<f64>,
    pub max: Option<f64>,
}

impl Ratios {
    fn of(a: &Percentiles, b: &Percentiles) -> Ratios {
        Ratios {
            p50: ratio(a.p50, b.p50),
            p99: ratio(a.p99, b.p99),
            p999: ratio(a.p999, b.p999),
            max: ratio(a.max, b.max),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct SidePair<T> {
    pub ours: T,
    pub iceoryx2: T,
}

#[derive(Debug, Clone, Serialize)]
pub struct PublishFigures {
    pub benchmark: &'static str,
    pub size: usize,
    pub unit: &'static str,
    pub batch: u64,
    /// Percentiles of the per-batch means.
    pub ours: Option<Percentiles>,
    pub iceoryx2: Option<Percentiles>,
    pub iceoryx2_send_only: Option<Percentiles>,
    pub ratio_ours_over_iceoryx2: Option<Ratios>,
    pub ratio_ours_over_iceoryx2_send_only: Option<Ratios>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ThroughputSide {
    pub rounds: usize,
    /// Messages per round.
    pub messages: u64,
    /// Median over rounds of N / (last send - first send).
    pub sent_per_s: Option<f64>,
    /// Median over rounds of the slowest subscriber's handled messages /
    /// (its stop message - first send).
    pub delivered_per_s: Option<f64>,
    /// Messages overwritten unread, all rounds and subscribers.
    pub lost: u64,
    /// Messages that should have been delivered, all rounds and subscribers.
    pub expected: u64,
    /// Messages the subscribers found by their 50 ms timed look, not by a
    /// wake (see [`LatencyFigures::healed`]).
    pub healed: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ThroughputFigures {
    pub benchmark: &'static str,
    pub size: usize,
    pub subscribers: u32,
    pub unit: &'static str,
    pub ours: ThroughputSide,
    pub iceoryx2: ThroughputSide,
    pub ratio_ours_over_iceoryx2: ThroughputRatios,
}

#[derive(Debug, Clone, Serialize)]
pub struct ThroughputRatios {
    pub sent_per_s: Option<f64>,
    pub delivered_per_s: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Figures {
    Latency(LatencyFigures),
    Publish(PublishFigures),
    Throughput(ThroughputFigures),
}

/// The target for one size.
#[derive(Debug, Clone, Serialize)]
pub struct TargetCheck {
    pub size: usize,
    pub p50_ratio: Option<f64>,
    pub p50_target: f64,
    pub p999_ratio: Option<f64>,
    pub p999_target: f64,
    pub met: bool,
}

#[derive(Debug, Serialize)]
pub struct Environment<'a> {
    pub kernel: &'a str,
    pub allowed_cpus: &'a [usize],
    pub sched_fifo_priority: Option<u32>,
    pub cpu_dma_latency_held_at_0: bool,
    /// Per measured CPU: percent of its time stolen by the hypervisor.
    pub steal_percent: &'a [(usize, f64)],
    /// 1-minute load average at the start and the end of the run.
    pub load_average: (f64, f64),
    /// Each side's scheduling as the kernel reported it (distinct values).
    pub sides: Vec<(String, String)>,
    /// Our event loops' backends (distinct values).
    pub ours_backend: Vec<String>,
    pub iceoryx2: &'static str,
    pub notes: &'a [String],
}

#[derive(Debug, Serialize)]
pub struct Report<'a> {
    pub schema_version: u32,
    pub command: String,
    pub settings: &'a Settings,
    pub environment: Environment<'a>,
    pub order: &'static str,
    pub measured: Vec<Measured>,
    pub results: Vec<Figures>,
    pub ping_pong_target: Vec<TargetCheck>,
}

#[derive(Debug, Serialize)]
pub struct Measured {
    pub benchmark: &'static str,
    pub ours: &'static str,
    pub iceoryx2: &'static str,
}

/// The iceoryx2 this crate is built against (Cargo.lock pins it).
pub const ICEORYX2: &str = "iceoryx2 0.10.0, ipc service (publish-subscribe + event; its listener waits on a Unix datagram socket)";

fn outcomes(
    all: &[Outcome],
    bench: Bench,
    size: usize,
    imp: Impl,
) -> impl Iterator<Item = &Outcome> {
    all.iter()
        .filter(move |o| o.run.bench == bench && o.run.size == size && o.run.imp == imp)
}

fn latency(all: &[Outcome], bench: Bench, size: usize) -> LatencyFigures {
    let side = |imp: Impl| {
        let samples = outcomes(all, bench, size, imp).flat_map(|o| {
            let from = match bench {
                Bench::PingPong => &o.sender,
                _ => &o.receivers[0],
            };
            from.samples_ns.iter().map(|&v| v as f64)
        });
        Percentiles::of(samples)
    };
    let count = |imp: Impl, f: &dyn Fn(&Outcome) -> u64| -> u64 {
        outcomes(all, bench, size, imp).map(f).sum()
    };
    let lost = |o: &Outcome| o.sender.lost + o.receivers.iter().map(|r| r.lost).sum::<u64>();
    let healed = |o: &Outcome| o.sender.healed + o.receivers.iter().map(|r| r.healed).sum::<u64>();
    let mism = |o: &Outcome| o.sender.mismatched;
    let ours = side(Impl::Ours);
    let iox = side(Impl::Iceoryx2);
    LatencyFigures {
        benchmark: bench.name(),
        size,
        unit: "ns",
        ratio_ours_over_iceoryx2: match (&ours, &iox) {
            (Some(a), Some(b)) => Some(Ratios::of(a, b)),
            _ => None,
        },
        ours,
        iceoryx2: iox,
        lost: SidePair {
            ours: count(Impl::Ours, &lost),
            iceoryx2: count(Impl::Iceoryx2, &lost),
        },
        mismatched: SidePair {
            ours: count(Impl::Ours, &mism),
            iceoryx2: count(Impl::Iceoryx2, &mism),
        },
        healed: SidePair {
            ours: count(Impl::Ours, &healed),
            iceoryx2: count(Impl::Iceoryx2, &healed),
        },
    }
}

fn publish(all: &[Outcome], size: usize, batch: u64) -> PublishFigures {
    let per = |v: &[u64]| {
        v.iter()
            .map(|&ns| ns as f64 / batch as f64)
            .collect::<Vec<_>>()
    };
    let ours = Percentiles::of(
        outcomes(all, Bench::Publish, size, Impl::Ours).flat_map(|o| per(&o.sender.batch_ns)),
    );
    let iox = Percentiles::of(
        outcomes(all, Bench::Publish, size, Impl::Iceoryx2).flat_map(|o| per(&o.sender.batch_ns)),
    );
    let iox_send = Percentiles::of(
        outcomes(all, Bench::Publish, size, Impl::Iceoryx2)
            .flat_map(|o| per(&o.sender.batch_send_only_ns)),
    );
    let r = |a: &Option<Percentiles>, b: &Option<Percentiles>| match (a, b) {
        (Some(a), Some(b)) => Some(Ratios::of(a, b)),
        _ => None,
    };
    PublishFigures {
        benchmark: "publish",
        size,
        unit: "ns per publish",
        batch,
        ratio_ours_over_iceoryx2: r(&ours, &iox),
        ratio_ours_over_iceoryx2_send_only: r(&ours, &iox_send),
        ours,
        iceoryx2: iox,
        iceoryx2_send_only: iox_send,
    }
}

fn throughput_side(all: &[Outcome], size: usize, subs: u32, imp: Impl) -> ThroughputSide {
    let runs: Vec<&Outcome> = outcomes(all, Bench::Throughput, size, imp)
        .filter(|o| o.run.subscribers == subs)
        .collect();
    let mut sent = Vec::new();
    let mut delivered = Vec::new();
    let mut lost = 0;
    let mut expected = 0;
    let mut healed = 0;
    let mut messages = 0;
    for o in &runs {
        let s = &o.sender;
        messages = o.run.count;
        if s.end_ns > s.start_ns {
            sent.push(o.run.count as f64 / ((s.end_ns - s.start_ns) as f64 / 1e9));
        }
        let slowest = o
            .receivers
            .iter()
            .filter(|r| r.last_ns > s.start_ns)
            .map(|r| r.received as f64 / ((r.last_ns - s.start_ns) as f64 / 1e9))
            .min_by(f64::total_cmp);
        if let Some(v) = slowest {
            delivered.push(v);
        }
        lost += o.receivers.iter().map(|r| r.lost).sum::<u64>();
        expected += o.run.count * o.receivers.len() as u64;
        healed += o.receivers.iter().map(|r| r.healed).sum::<u64>();
    }
    ThroughputSide {
        rounds: runs.len(),
        messages,
        sent_per_s: median(&sent),
        delivered_per_s: median(&delivered),
        lost,
        expected,
        healed,
    }
}

fn throughput(all: &[Outcome], size: usize, subs: u32) -> ThroughputFigures {
    let ours = throughput_side(all, size, subs, Impl::Ours);
    let iox = throughput_side(all, size, subs, Impl::Iceoryx2);
    let r = |a: Option<f64>, b: Option<f64>| a.zip(b).and_then(|(a, b)| ratio(a, b));
    ThroughputFigures {
        benchmark: "throughput",
        size,
        subscribers: subs,
        unit: "messages/s",
        ratio_ours_over_iceoryx2: ThroughputRatios {
            sent_per_s: r(ours.sent_per_s, iox.sent_per_s),
            delivered_per_s: r(ours.delivered_per_s, iox.delivered_per_s),
        },
        ours,
        iceoryx2: iox,
    }
}

/// Pools the outcomes into the report.
pub fn build<'a>(command: String, s: &'a Settings, host: &'a Host, all: &[Outcome]) -> Report<'a> {
    let mut results = Vec::new();
    let mut targets = Vec::new();
    for &bench in &s.benches {
        for &size in &s.sizes {
            match bench {
                Bench::PingPong | Bench::OneWay => {
                    let f = latency(all, bench, size);
                    if bench == Bench::PingPong {
                        let p50 = f.ratio_ours_over_iceoryx2.and_then(|r| r.p50);
                        let p999 = f.ratio_ours_over_iceoryx2.and_then(|r| r.p999);
                        targets.push(TargetCheck {
                            size,
                            p50_ratio: p50,
                            p50_target: TARGET_P50_RATIO,
                            p999_ratio: p999,
                            p999_target: TARGET_P999_RATIO,
                            met: p50.is_some_and(|r| r <= TARGET_P50_RATIO)
                                && p999.is_some_and(|r| r <= TARGET_P999_RATIO),
                        });
                    }
                    results.push(Figures::Latency(f));
                }
                Bench::Publish => results.push(Figures::Publish(publish(all, size, s.batch))),
                Bench::Throughput => {
                    for &subs in &s.subscribers {
                        results.push(Figures::Throughput(throughput(all, size, subs)));
                    }
                }
            }
        }
    }
    let mut sides: Vec<(String, String)> = Vec::new();
    let mut backends: Vec<String> = Vec::new();
    for o in all {
        for (side, text) in &o.sched {
            let e = (side.to_string(), text.clone());
            if !sides.contains(&e) {
                sides.push(e);
            }
        }
        for r in std::iter::once(&o.sender).chain(&o.receivers) {
            if let Some(b) = &r.backend {
                if !backends.contains(b) {
                    backends.push(b.clone());
                }
            }
        }
    }
    Report {
        schema_version: SCHEMA_VERSION,
        command,
        settings: s,
        environment: Environment {
            kernel: &host.kernel,
            allowed_cpus: &host.allowed_cpus,
            sched_fifo_priority: host.priority,
            cpu_dma_latency_held_at_0: host.cpu_dma_latency_held,
            steal_percent: &host.steal_percent,
            load_average: host.load_average,
            sides,
            ours_backend: backends,
            iceoryx2: ICEORYX2,
            notes: &host.notes,
        },
        order: "for each benchmark and size: rounds of ours then iceoryx2, alternating",
        measured: MEASURED
            .iter()
            .filter(|(b, _, _)| s.benches.iter().any(|x| x.name() == *b))
            .map(|&(benchmark, ours, iceoryx2)| Measured {
                benchmark,
                ours,
                iceoryx2,
            })
            .collect(),
        results,
        ping_pong_target: targets,
    }
}

fn us(ns: f64) -> String {
    let v = ns / 1000.0;
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn ns(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn x(r: Option<f64>) -> String {
    r.map_or("-".into(), |r| format!("{r:.2}x"))
}

fn rate(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(v) if v >= 1e6 => format!("{:.2} M/s", v / 1e6),
        Some(v) => format!("{:.0} k/s", v / 1e3),
    }
}

/// The report as Markdown: a header of settings, one table per benchmark,
/// the target verdicts.
pub fn table(r: &Report) -> String {
    let mut t = String::new();
    let s = r.settings;
    let e = &r.environment;
    let _ = writeln!(t, "Ours against {} on Linux {}", e.iceoryx2, e.kernel);
    let fifo = e
        .sched_fifo_priority
        .map_or("SCHED_OTHER".to_string(), |p| format!("SCHED_FIFO {p}"));
    let _ = writeln!(
        t,
        "sender CPU {}, receiver CPU {}, {fifo} on every side, cpu_dma_latency {}, our event loop backend {}, our receivers reading {}; {}",
        s.sender_cpu,
        s.receiver_cpu,
        if e.cpu_dma_latency_held_at_0 { "held at 0" } else { "not held" },
        if e.ours_backend.is_empty() { "-".into() } else { e.ours_backend.join(", ") },
        match s.receive {
            crate::settings::Receive::InPlace => "in place",
            crate::settings::Receive::Copy => "the loop's copy",
        },
        r.order
    );
    let _ = writeln!(
        t,
        "load average {:.1} at the start, {:.1} at the end (other work on the machine runs below the sides' priority)",
        e.load_average.0, e.load_average.1
    );
    for n in e.notes {
        let _ = writeln!(t, "note: {n}");
    }
    for f in &r.results {
        match f {
            Figures::Latency(l) => {
                if l.lost.ours + l.lost.iceoryx2 + l.mismatched.ours + l.mismatched.iceoryx2 > 0 {
                    let _ = writeln!(
                        t,
                        "note: {} {}: lost ours {} iceoryx2 {}, mismatched echoes ours {} iceoryx2 {}",
                        l.benchmark,
                        size_label(l.size),
                        l.lost.ours,
                        l.lost.iceoryx2,
                        l.mismatched.ours,
                        l.mismatched.iceoryx2
                    );
                }
                if l.healed.ours + l.healed.iceoryx2 > 0 {
                    let _ = writeln!(
                        t,
                        "note: {} {}: messages found by the receiver's 50 ms timed look, not by a wake (lost, or still on its way): ours {}, iceoryx2 {}",
                        l.benchmark,
                        size_label(l.size),
                        l.healed.ours,
                        l.healed.iceoryx2
                    );
                }
            }
            Figures::Throughput(p) if p.ours.healed + p.iceoryx2.healed > 0 => {
                let _ = writeln!(
                    t,
                    "note: throughput {} x{}: messages found by a subscriber's 50 ms timed look, not by a wake (lost, or still on its way): ours {}, iceoryx2 {}",
                    size_label(p.size),
                    p.subscribers,
                    p.ours.healed,
                    p.iceoryx2.healed
                );
            }
            _ => {}
        }
    }
    for &bench in &s.benches {
        let _ = writeln!(t);
        match bench {
            Bench::PingPong | Bench::OneWay => {
                let title = if bench == Bench::PingPong {
                    format!(
                        "ping-pong round trip, us ({} per size and side)",
                        s.pingpong
                    )
                } else {
                    format!(
                        "one-way wake at a {} us period, us ({} per size and side)",
                        s.period.as_micros(),
                        s.oneway
                    )
                };
                let _ = writeln!(t, "| {title} | p50 | p99 | p99.9 | max |");
                let _ = writeln!(t, "| --- | ---: | ---: | ---: | ---: |");
                for f in &r.results {
                    let Figures::Latency(l) = f else { continue };
                    if l.benchmark != bench.name() {
                        continue;
                    }
                    for (name, p) in [("ours", &l.ours), ("iceoryx2", &l.iceoryx2)] {
                        match p {
                            Some(p) => {
                                let _ = writeln!(
                                    t,
                                    "| {} {name} | {} | {} | {} | {} |",
                                    size_label(l.size),
                                    us(p.p50),
                                    us(p.p99),
                                    us(p.p999),
                                    us(p.max)
                                );
                            }
                            None => {
                                let _ = writeln!(
                                    t,
                                    "| {} {name} | - | - | - | - |",
                                    size_label(l.size)
                                );
                            }
                        }
                    }
                    let q = l.ratio_ours_over_iceoryx2;
                    let _ = writeln!(
                        t,
                        "| {} ours/iceoryx2 | {} | {} | {} | {} |",
                        size_label(l.size),
                        x(q.and_then(|q| q.p50)),
                        x(q.and_then(|q| q.p99)),
                        x(q.and_then(|q| q.p999)),
                        x(q.and_then(|q| q.max))
                    );
                }
            }
            Bench::Publish => {
                let _ = writeln!(
                    t,
                    "| publish, no subscriber waiting, ns per publish (batches of {}) | p50 | p99 |",
                    s.batch
                );
                let _ = writeln!(t, "| --- | ---: | ---: |");
                for f in &r.results {
                    let Figures::Publish(p) = f else { continue };
                    let sz = size_label(p.size);
                    for (name, v) in [
                        ("ours: loan, write, send", &p.ours),
                        ("iceoryx2: loan, write, send, notify", &p.iceoryx2),
                        ("iceoryx2 send only (no notify)", &p.iceoryx2_send_only),
                    ] {
                        let (a, b) = v
                            .as_ref()
                            .map_or(("-".into(), "-".into()), |v| (ns(v.p50), ns(v.p99)));
                        let _ = writeln!(t, "| {sz} {name} | {a} | {b} |");
                    }
                    let q = p.ratio_ours_over_iceoryx2;
                    let _ = writeln!(
                        t,
                        "| {sz} ours/iceoryx2 (with notify) | {} | {} |",
                        x(q.and_then(|q| q.p50)),
                        x(q.and_then(|q| q.p99))
                    );
                }
            }
            Bench::Throughput => {
                let _ = writeln!(
                    t,
                    "| throughput, N back to back (median of {} rounds) | sent | delivered (slowest subscriber) | lost / expected |",
                    s.throughput_rounds
                );
                let _ = writeln!(t, "| --- | ---: | ---: | ---: |");
                for f in &r.results {
                    let Figures::Throughput(p) = f else { continue };
                    let head = format!(
                        "{} x{} sub{}",
                        size_label(p.size),
                        p.subscribers,
                        if p.subscribers == 1 { "" } else { "s" }
                    );
                    for (name, v) in [("ours", &p.ours), ("iceoryx2", &p.iceoryx2)] {
                        let _ = writeln!(
                            t,
                            "| {head} {name} (N={}) | {} | {} | {} / {} |",
                            v.messages,
                            rate(v.sent_per_s),
                            rate(v.delivered_per_s),
                            v.lost,
                            v.expected
                        );
                    }
                    let q = &p.ratio_ours_over_iceoryx2;
                    let _ = writeln!(
                        t,
                        "| {head} ours/iceoryx2 | {} | {} | |",
                        x(q.sent_per_s),
                        x(q.delivered_per_s)
                    );
                }
            }
        }
    }
    if !r.ping_pong_target.is_empty() {
        let _ = writeln!(t);
        for c in &r.ping_pong_target {
            let _ = writeln!(
                t,
                "target {}: ping-pong p50 {} (at most {:.1}x) and p99.9 {} (at most {:.1}x): {}",
                size_label(c.size),
                x(c.p50_ratio),
                c.p50_target,
                x(c.p999_ratio),
                c.p999_target,
                if c.met { "met" } else { "missed" }
            );
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Run;
    use crate::role::RoleResult;

    fn outcome(bench: Bench, imp: Impl, samples: Vec<u64>) -> Outcome {
        Outcome {
            run: Run {
                bench,
                size: 8,
                subscribers: 1,
                round: 0,
                imp,
                count: samples.len() as u64,
                warmup: 0,
            },
            sender: RoleResult {
                samples_ns: samples,
                ..RoleResult::default()
            },
            receivers: vec![RoleResult::default()],
            sched: vec![("sender", "SCHED_FIFO 80 on CPU 0, memory locked".into())],
        }
    }

    #[test]
    fn ratios_are_ours_over_iceoryx2_and_the_target_is_checked() {
        let all = vec![
            outcome(Bench::PingPong, Impl::Ours, vec![5_000; 100]),
            outcome(Bench::PingPong, Impl::Iceoryx2, vec![10_000; 100]),
        ];
        let f = latency(&all, Bench::PingPong, 8);
        let q = f.ratio_ours_over_iceoryx2.unwrap();
        assert_eq!(q.p50, Some(0.5));
        assert_eq!(q.p999, Some(0.5));
    }

    #[test]
    fn throughput_takes_the_slowest_subscriber() {
        let mut o = outcome(Bench::Throughput, Impl::Ours, vec![]);
        o.run.count = 1000;
        o.sender.start_ns = 1_000_000_000;
        o.sender.end_ns = 1_001_000_000; // 1 ms: 1 M/s sent
        o.receivers = vec![
            RoleResult {
                received: 1000,
                last_ns: 1_001_000_000,
                ..RoleResult::default()
            },
            RoleResult {
                received: 900,
                lost: 100,
                last_ns: 1_002_000_000,
                ..RoleResult::default()
            },
        ];
        let s = throughput_side(&[o], 8, 1, Impl::Ours);
        assert_eq!(s.sent_per_s, Some(1e6));
        assert_eq!(s.delivered_per_s, Some(450_000.0));
        assert_eq!((s.lost, s.expected), (100, 2000));
    }
}
