//! The figures of a whole run, per benchmark, size (and subscriber
//! count): each figure measured per round and arm, quoted as the median
//! over rounds of the per-round ratio ours / iceoryx2 with its spread
//! (the lowest and the highest round), beside the A/A ratio (ours again /
//! ours: what two measurements of the same thing differ by on this
//! machine) and the figures pooled over the rounds; the target
//! checked; as a Markdown table for people and one JSON document for
//! tools. The ratios are [`check::harness`]'s, as `deploy check --compare`
//! and `deploy bench` report theirs.

use std::fmt::Write as _;

use check::harness::{self, Ratio};
use serde::Serialize;

use crate::host::Host;
use crate::message::size_label;
use crate::plan::Arm;
use crate::runner::Outcome;
use crate::settings::{Bench, Settings};
use crate::stats::{median, ratio, Percentiles};

/// Bumped when a field changes meaning or goes away.
pub const SCHEMA_VERSION: u32 = 2;

/// The target for ping-pong: our p50 at most this times iceoryx2's
/// (the median of the per-round ratios) up to 64 KiB.
pub const TARGET_P50_RATIO: f64 = 0.6;
/// ... and above 64 KiB, where both sides write the payload on every hop
/// and the round trip is bound by memory bandwidth.
pub const TARGET_P50_RATIO_LARGE: f64 = 1.0;
/// The largest size held to [`TARGET_P50_RATIO`].
pub const TARGET_SMALL_UP_TO: usize = 64 << 10;
/// ... and our p99.9 no worse than iceoryx2's.
pub const TARGET_P999_RATIO: f64 = 1.0;

/// Exactly what each side does per message, per benchmark.
pub const MEASURED: &[(&str, &str, &str)] = &[
    (
        "ping-pong",
        "A stamps CLOCK_MONOTONIC, loans a slot, writes the whole message, sends; B's event loop (watching the channel: an io_uring futex wait kept armed; wake check every 50 ms, the default) runs its handler with the message as --receive says (held in its slot by default: the handler reads words 0 and W-1 there), which sends the pong the same way (stamp echoed); A's event loop runs its handler the same way, which reads the clock: RTT",
        "A stamps CLOCK_MONOTONIC, loan_uninit, writes the whole message, send, notify; B sleeps in its event listener's wait (timed_wait of 50 ms: the same safety net as our loop's 50 ms wake check, for a wake that never comes), receive()s the sample and reads words 0 and W-1 in it, sends the pong the same way (stamp echoed) and notifies; A wakes in its listener's wait the same way, receive()s, reads the clock: RTT",
    ),
    (
        "one-way",
        "a sender on absolute CLOCK_MONOTONIC sleeps one period apart stamps word 0 and sends as above; the receiver's event loop handler reads the clock first thing: latency = now - stamp (the stamp is taken before the message is written: a large message's write is in it)",
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

/// One figure of both sides: what the table headlines.
#[derive(Debug, Clone, Serialize)]
pub struct Compared {
    /// `p50`, `p99`, `p99.9`, `sent/s`, `delivered/s`.
    pub figure: &'static str,
    /// Ours (the `ours` arm): pooled over the rounds for latencies and
    /// publish costs, the median over rounds for rates.
    pub ours: Option<f64>,
    /// iceoryx2, likewise.
    pub iceoryx2: Option<f64>,
    /// ours / iceoryx2 per round, with the median and spread over rounds.
    pub ratio: Option<Ratio>,
    /// The A/A control: ours again / ours per round, likewise.
    pub aa: Option<Ratio>,
    /// The ratio's median lies outside the A/A ratio's spread: a
    /// difference this run tells from its own noise.
    pub beyond_aa: Option<bool>,
}

impl Compared {
    /// `figure` of `cell`: `ours_f` of each run of the ours arms, `iox_f`
    /// of each iceoryx2 run; `pooled` the (ours, iceoryx2) figures.
    fn of(
        figure: &'static str,
        cell: &Cell,
        pooled: (Option<f64>, Option<f64>),
        ours_f: &dyn Fn(&Outcome) -> Option<f64>,
        iox_f: &dyn Fn(&Outcome) -> Option<f64>,
    ) -> Compared {
        let ours = cell.series(Arm::Ours, ours_f);
        let again = cell.series(Arm::OursAgain, ours_f);
        let iox = cell.series(Arm::Iceoryx2, iox_f);
        let ratio = Ratio::of(figure, &ours, &iox, None);
        let aa = Ratio::of(figure, &again, &ours, None);
        let beyond_aa = ratio
            .as_ref()
            .zip(aa.as_ref())
            .map(|(r, a)| r.median < a.min || r.median > a.max);
        Compared {
            figure,
            ours: pooled.0,
            iceoryx2: pooled.1,
            ratio,
            aa,
            beyond_aa,
        }
    }

    /// The median of the per-round ratios.
    fn median(&self) -> Option<f64> {
        self.ratio.as_ref().map(|r| r.median)
    }
}

/// The runs of one benchmark, size and subscriber count, every arm.
struct Cell<'a> {
    runs: Vec<&'a Outcome>,
    rounds: usize,
}

impl<'a> Cell<'a> {
    fn of(all: &'a [Outcome], bench: Bench, size: usize, subscribers: u32) -> Cell<'a> {
        let runs: Vec<&Outcome> = all
            .iter()
            .filter(|o| {
                o.run.bench == bench && o.run.size == size && o.run.subscribers == subscribers
            })
            .collect();
        let rounds = runs
            .iter()
            .map(|o| o.run.round as usize + 1)
            .max()
            .unwrap_or(0);
        Cell { runs, rounds }
    }

    fn arm(&self, arm: Arm) -> impl Iterator<Item = &'a Outcome> + '_ {
        self.runs.iter().copied().filter(move |o| o.run.arm == arm)
    }

    /// `f` of `arm`'s run in each round (`None` where it has none).
    fn series(&self, arm: Arm, f: &dyn Fn(&Outcome) -> Option<f64>) -> harness::Arm {
        let mut rounds = vec![None; self.rounds];
        for o in self.arm(arm) {
            rounds[o.run.round as usize] = f(o);
        }
        harness::Arm {
            name: arm.name().into(),
            rounds,
        }
    }

    /// The depth our and iceoryx2's runs used (the same for both; the
    /// floor's is `Settings::floor_depth_for`).
    fn depth(&self) -> u64 {
        self.runs
            .iter()
            .find(|o| o.run.arm != Arm::Floor)
            .map_or(0, |o| o.run.depth)
    }

    /// The sum of `f` over `arm`'s runs.
    fn count(&self, arm: Arm, f: &dyn Fn(&Outcome) -> u64) -> u64 {
        self.arm(arm).map(f).sum()
    }

    fn counts(&self, f: &dyn Fn(&Outcome) -> u64) -> Counts {
        Counts {
            ours: self.count(Arm::Ours, f),
            ours_again: self.count(Arm::OursAgain, f),
            iceoryx2: self.count(Arm::Iceoryx2, f),
        }
    }
}

/// Ratios of pooled percentiles (every round's samples together).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Ratios {
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    pub p999: Option<f64>,
    pub max: Option<f64>,
}

impl Ratios {
    fn of(a: &Option<Percentiles>, b: &Option<Percentiles>) -> Option<Ratios> {
        let (a, b) = (a.as_ref()?, b.as_ref()?);
        Some(Ratios {
            p50: ratio(a.p50, b.p50),
            p99: ratio(a.p99, b.p99),
            p999: ratio(a.p999, b.p999),
            max: ratio(a.max, b.max),
        })
    }
}

/// A count per arm, all rounds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Counts {
    pub ours: u64,
    pub ours_again: u64,
    pub iceoryx2: u64,
}

impl Counts {
    fn any(&self) -> bool {
        self.ours + self.ours_again + self.iceoryx2 > 0
    }
}

/// Ping-pong with `--floor`: p50 over the floor's p50, per round.
#[derive(Debug, Clone, Serialize)]
pub struct OverFloor {
    pub ours: Option<Ratio>,
    pub iceoryx2: Option<Ratio>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LatencyFigures {
    pub benchmark: &'static str,
    pub size: usize,
    /// Ring length of ours, subscriber buffer of iceoryx2.
    pub depth: u64,
    /// One-way: the sender's period.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub period_us: Option<u64>,
    pub unit: &'static str,
    pub rounds: usize,
    /// p50, p99 and p99.9: each side pooled, the per-round ratios.
    pub compared: Vec<Compared>,
    /// Pooled over the rounds, per arm.
    pub ours: Option<Percentiles>,
    pub ours_again: Option<Percentiles>,
    pub iceoryx2: Option<Percentiles>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub floor: Option<Percentiles>,
    /// Ratios of the pooled percentiles (ours / iceoryx2).
    pub pooled_ratio_ours_over_iceoryx2: Option<Ratios>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub over_floor: Option<OverFloor>,
    /// Messages overwritten before the receiver read them.
    pub lost: Counts,
    /// Ping-pong echoes that did not carry the stamp sent.
    pub mismatched: Counts,
    /// Messages a receiver found by its 50 ms timed look, not by a wake
    /// (ours: our loop's wake check, counting lost and late wakes;
    /// iceoryx2: its timed wait ran out with a sample there). Each cost up
    /// to 50 ms of latency.
    pub healed: Counts,
}

#[derive(Debug, Clone, Serialize)]
pub struct PublishFigures {
    pub benchmark: &'static str,
    pub size: usize,
    pub depth: u64,
    pub unit: &'static str,
    pub batch: u64,
    pub rounds: usize,
    /// p50 and p99 of the per-batch means, against iceoryx2 with notify.
    pub compared: Vec<Compared>,
    /// ... and against iceoryx2's batches without the notify.
    pub compared_send_only: Vec<Compared>,
    /// Percentiles of the per-batch means, pooled over the rounds.
    pub ours: Option<Percentiles>,
    pub ours_again: Option<Percentiles>,
    pub iceoryx2: Option<Percentiles>,
    pub iceoryx2_send_only: Option<Percentiles>,
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
    pub depth: u64,
    pub subscribers: u32,
    pub unit: &'static str,
    /// sent/s and delivered/s (the slowest subscriber): each side's
    /// median over rounds, the per-round ratios (higher is faster).
    pub compared: Vec<Compared>,
    pub ours: ThroughputSide,
    pub ours_again: ThroughputSide,
    pub iceoryx2: ThroughputSide,
}

// A few dozen of these per run, built once: their sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Figures {
    Latency(LatencyFigures),
    Publish(PublishFigures),
    Throughput(ThroughputFigures),
}

/// The target for one size, on the medians of the per-round
/// ratios.
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

/// How the runs were ordered.
pub const ORDER: &str = "for each benchmark and size: rounds of ours, iceoryx2 and ours again (the A/A control; and the floor with --floor), the order rotated each round";

/// The latency samples of a run: the ping side's round trips (or the
/// floor's), the receiver's wake latencies.
fn latency_samples(o: &Outcome) -> &[u64] {
    match o.run.bench {
        Bench::PingPong => &o.sender.samples_ns,
        _ => o.receivers.first().map_or(&[], |r| &r.samples_ns),
    }
}

fn pooled_latency<'a>(runs: impl Iterator<Item = &'a Outcome>) -> Option<Percentiles> {
    Percentiles::of(runs.flat_map(|o| latency_samples(o).iter().map(|&v| v as f64)))
}

/// The percentiles of one run's samples.
fn run_latency(o: &Outcome) -> Option<Percentiles> {
    Percentiles::of(latency_samples(o).iter().map(|&v| v as f64))
}

/// A figure the table headlines and how to take it from percentiles.
type Figure = (&'static str, fn(&Percentiles) -> f64);

/// The latency figures the table headlines.
const LATENCY_FIGURES: [Figure; 3] = [
    ("p50", |p| p.p50),
    ("p99", |p| p.p99),
    ("p99.9", |p| p.p999),
];

fn latency(all: &[Outcome], bench: Bench, size: usize, s: &Settings) -> LatencyFigures {
    let cell = Cell::of(all, bench, size, 1);
    let ours = pooled_latency(cell.arm(Arm::Ours));
    let ours_again = pooled_latency(cell.arm(Arm::OursAgain));
    let iox = pooled_latency(cell.arm(Arm::Iceoryx2));
    let floor = pooled_latency(cell.arm(Arm::Floor));
    let compared = LATENCY_FIGURES
        .iter()
        .map(|&(figure, get)| {
            let per_run = move |o: &Outcome| run_latency(o).map(|p| get(&p));
            Compared::of(
                figure,
                &cell,
                (ours.as_ref().map(get), iox.as_ref().map(get)),
                &per_run,
                &per_run,
            )
        })
        .collect();
    let over_floor = floor.is_some().then(|| {
        let p50 = |o: &Outcome| run_latency(o).map(|p| p.p50);
        let f = cell.series(Arm::Floor, &p50);
        OverFloor {
            ours: Ratio::of("p50", &cell.series(Arm::Ours, &p50), &f, None),
            iceoryx2: Ratio::of("p50", &cell.series(Arm::Iceoryx2, &p50), &f, None),
        }
    });
    let lost = |o: &Outcome| o.sender.lost + o.receivers.iter().map(|r| r.lost).sum::<u64>();
    let healed = |o: &Outcome| o.sender.healed + o.receivers.iter().map(|r| r.healed).sum::<u64>();
    let mism = |o: &Outcome| o.sender.mismatched;
    LatencyFigures {
        benchmark: bench.name(),
        size,
        depth: cell.depth(),
        period_us: (bench == Bench::OneWay).then(|| s.period_for(size).as_micros() as u64),
        unit: "ns",
        rounds: cell.rounds,
        compared,
        pooled_ratio_ours_over_iceoryx2: Ratios::of(&ours, &iox),
        ours,
        ours_again,
        iceoryx2: iox,
        floor,
        over_floor,
        lost: cell.counts(&lost),
        mismatched: cell.counts(&mism),
        healed: cell.counts(&healed),
    }
}

fn publish(all: &[Outcome], size: usize, batch: u64) -> PublishFigures {
    let cell = Cell::of(all, Bench::Publish, size, 1);
    let per = move |v: &[u64]| {
        v.iter()
            .map(|&ns| ns as f64 / batch as f64)
            .collect::<Vec<_>>()
    };
    let pooled = |arm: Arm, send_only: bool| {
        Percentiles::of(cell.arm(arm).flat_map(|o| {
            per(if send_only {
                &o.sender.batch_send_only_ns
            } else {
                &o.sender.batch_ns
            })
        }))
    };
    let ours = pooled(Arm::Ours, false);
    let iox = pooled(Arm::Iceoryx2, false);
    let iox_send = pooled(Arm::Iceoryx2, true);
    let figures: [Figure; 2] = [("p50", |p| p.p50), ("p99", |p| p.p99)];
    let compare = |send_only: bool| -> Vec<Compared> {
        let theirs = if send_only { &iox_send } else { &iox };
        figures
            .iter()
            .map(|&(figure, get)| {
                let ours_f =
                    move |o: &Outcome| Percentiles::of(per(&o.sender.batch_ns)).map(|p| get(&p));
                let iox_f = move |o: &Outcome| {
                    let v = if send_only {
                        &o.sender.batch_send_only_ns
                    } else {
                        &o.sender.batch_ns
                    };
                    Percentiles::of(per(v)).map(|p| get(&p))
                };
                Compared::of(
                    figure,
                    &cell,
                    (ours.as_ref().map(get), theirs.as_ref().map(get)),
                    &ours_f,
                    &iox_f,
                )
            })
            .collect()
    };
    PublishFigures {
        benchmark: "publish",
        size,
        depth: cell.depth(),
        unit: "ns per publish",
        batch,
        rounds: cell.rounds,
        compared: compare(false),
        compared_send_only: compare(true),
        ours,
        ours_again: pooled(Arm::OursAgain, false),
        iceoryx2: iox,
        iceoryx2_send_only: iox_send,
    }
}

/// N / (last send - first send) of a throughput run.
fn sent_rate(o: &Outcome) -> Option<f64> {
    let s = &o.sender;
    (s.end_ns > s.start_ns).then(|| o.run.count as f64 / ((s.end_ns - s.start_ns) as f64 / 1e9))
}

/// The slowest subscriber's handled messages / (its stop message - first
/// send) of a throughput run.
fn delivered_rate(o: &Outcome) -> Option<f64> {
    let start = o.sender.start_ns;
    o.receivers
        .iter()
        .filter(|r| r.last_ns > start)
        .map(|r| r.received as f64 / ((r.last_ns - start) as f64 / 1e9))
        .min_by(f64::total_cmp)
}

fn throughput_side(cell: &Cell, arm: Arm) -> ThroughputSide {
    let runs: Vec<&Outcome> = cell.arm(arm).collect();
    let sent: Vec<f64> = runs.iter().filter_map(|o| sent_rate(o)).collect();
    let delivered: Vec<f64> = runs.iter().filter_map(|o| delivered_rate(o)).collect();
    ThroughputSide {
        rounds: runs.len(),
        messages: runs.last().map_or(0, |o| o.run.count),
        sent_per_s: median(&sent),
        delivered_per_s: median(&delivered),
        lost: runs
            .iter()
            .map(|o| o.receivers.iter().map(|r| r.lost).sum::<u64>())
            .sum(),
        expected: runs
            .iter()
            .map(|o| o.run.count * o.receivers.len() as u64)
            .sum(),
        healed: runs
            .iter()
            .map(|o| o.receivers.iter().map(|r| r.healed).sum::<u64>())
            .sum(),
    }
}

fn throughput(all: &[Outcome], size: usize, subs: u32) -> ThroughputFigures {
    let cell = Cell::of(all, Bench::Throughput, size, subs);
    let ours = throughput_side(&cell, Arm::Ours);
    let iox = throughput_side(&cell, Arm::Iceoryx2);
    let compared = vec![
        Compared::of(
            "sent/s",
            &cell,
            (ours.sent_per_s, iox.sent_per_s),
            &sent_rate,
            &sent_rate,
        ),
        Compared::of(
            "delivered/s",
            &cell,
            (ours.delivered_per_s, iox.delivered_per_s),
            &delivered_rate,
            &delivered_rate,
        ),
    ];
    ThroughputFigures {
        benchmark: "throughput",
        size,
        depth: cell.depth(),
        subscribers: subs,
        unit: "messages/s",
        compared,
        ours_again: throughput_side(&cell, Arm::OursAgain),
        ours,
        iceoryx2: iox,
    }
}

/// The target for one size, from its ping-pong figures.
fn target(l: &LatencyFigures) -> TargetCheck {
    let of = |figure: &str| {
        l.compared
            .iter()
            .find(|c| c.figure == figure)
            .and_then(Compared::median)
    };
    let (p50, p999) = (of("p50"), of("p99.9"));
    let p50_target = if l.size <= TARGET_SMALL_UP_TO {
        TARGET_P50_RATIO
    } else {
        TARGET_P50_RATIO_LARGE
    };
    TargetCheck {
        size: l.size,
        p50_ratio: p50,
        p50_target,
        p999_ratio: p999,
        p999_target: TARGET_P999_RATIO,
        met: p50.is_some_and(|r| r <= p50_target)
            && p999.is_some_and(|r| r <= TARGET_P999_RATIO),
    }
}

/// Every benchmark's figures and the ping-pong targets.
fn results(s: &Settings, all: &[Outcome]) -> (Vec<Figures>, Vec<TargetCheck>) {
    let mut results = Vec::new();
    let mut targets = Vec::new();
    for &bench in &s.benches {
        for &size in &s.sizes {
            match bench {
                Bench::PingPong | Bench::OneWay => {
                    let f = latency(all, bench, size, s);
                    if bench == Bench::PingPong {
                        targets.push(target(&f));
                    }
                    results.push(Figures::Latency(f));
                }
                Bench::Publish => {
                    results.push(Figures::Publish(publish(all, size, s.batch_for(size))))
                }
                Bench::Throughput => {
                    for &subs in &s.subscribers {
                        results.push(Figures::Throughput(throughput(all, size, subs)));
                    }
                }
            }
        }
    }
    (results, targets)
}

/// Gathers the outcomes into the report.
pub fn build<'a>(command: String, s: &'a Settings, host: &'a Host, all: &[Outcome]) -> Report<'a> {
    let (results, targets) = results(s, all);
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
        order: ORDER,
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
        Some(v) if v >= 1e4 => format!("{:.0} k/s", v / 1e3),
        Some(v) => format!("{v:.0}/s"),
    }
}

/// A per-round ratio as the table writes it: `0.61x (0.58..0.66)`.
fn spread(r: &Option<Ratio>) -> String {
    match r {
        None => "-".into(),
        Some(r) => format!("{:.2}x ({:.2}..{:.2})", r.median, r.min, r.max),
    }
}

/// The ratio cell of `c`, marked `~` when it lies within the A/A spread.
fn ratio_cell(c: &Compared) -> String {
    let mark = if c.beyond_aa == Some(false) { " ~" } else { "" };
    format!("{}{mark}", spread(&c.ratio))
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
        s.receive.describe(),
        r.order
    );
    let _ = writeln!(
        t,
        "ours and iceoryx2: pooled over the rounds (throughput: the median of rounds); ours/iceoryx2: the median of the per-round ratios (lowest..highest round); A/A: ours again / ours likewise, the noise of this machine; ~ marks a ratio within the A/A spread"
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
                if l.lost.any() || l.mismatched.any() {
                    let _ = writeln!(
                        t,
                        "note: {} {}: lost ours {} (again {}) iceoryx2 {}, mismatched echoes ours {} (again {}) iceoryx2 {}",
                        l.benchmark,
                        size_label(l.size),
                        l.lost.ours,
                        l.lost.ours_again,
                        l.lost.iceoryx2,
                        l.mismatched.ours,
                        l.mismatched.ours_again,
                        l.mismatched.iceoryx2
                    );
                }
                if l.healed.any() {
                    let _ = writeln!(
                        t,
                        "note: {} {}: messages found by the receiver's 50 ms timed look, not by a wake (lost, or still on its way): ours {} (again {}), iceoryx2 {}",
                        l.benchmark,
                        size_label(l.size),
                        l.healed.ours,
                        l.healed.ours_again,
                        l.healed.iceoryx2
                    );
                }
            }
            Figures::Throughput(p)
                if p.ours.healed + p.ours_again.healed + p.iceoryx2.healed > 0 =>
            {
                let _ = writeln!(
                    t,
                    "note: throughput {} x{}: messages found by a subscriber's 50 ms timed look, not by a wake (lost, or still on its way): ours {} (again {}), iceoryx2 {}",
                    size_label(p.size),
                    p.subscribers,
                    p.ours.healed,
                    p.ours_again.healed,
                    p.iceoryx2.healed
                );
            }
            _ => {}
        }
    }
    for &bench in &s.benches {
        let _ = writeln!(t);
        match bench {
            Bench::PingPong | Bench::OneWay => latency_table(&mut t, r, bench),
            Bench::Publish => publish_table(&mut t, r),
            Bench::Throughput => throughput_table(&mut t, r),
        }
    }
    floor_table(&mut t, r);
    if !r.ping_pong_target.is_empty() {
        let _ = writeln!(t);
        for c in &r.ping_pong_target {
            let _ = writeln!(
                t,
                "target {}: ping-pong p50 {} (at most {:.1}x) and p99.9 {} (at most {:.1}x), medians of the per-round ratios: {}",
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

fn latency_table(t: &mut String, r: &Report, bench: Bench) {
    let s = r.settings;
    let title = if bench == Bench::PingPong {
        format!(
            "ping-pong round trip, us ({} per size and side, {} rounds)",
            s.pingpong, s.rounds
        )
    } else {
        format!(
            "one-way wake, us ({} per size and side, {} rounds)",
            s.oneway, s.rounds
        )
    };
    let period = if bench == Bench::OneWay {
        " period us |"
    } else {
        ""
    };
    let _ = writeln!(
        t,
        "| {title} | depth |{period} ours | iceoryx2 | ours/iceoryx2 | A/A |"
    );
    let _ = writeln!(
        t,
        "| --- | ---: |{} ---: | ---: | ---: | ---: |",
        if period.is_empty() { "" } else { " ---: |" }
    );
    for f in &r.results {
        let Figures::Latency(l) = f else { continue };
        if l.benchmark != bench.name() {
            continue;
        }
        let period = l.period_us.map_or(String::new(), |p| format!(" {p} |"));
        for c in &l.compared {
            let _ = writeln!(
                t,
                "| {} {} | {} |{period} {} | {} | {} | {} |",
                size_label(l.size),
                c.figure,
                depth_cell(s, l.size, l.depth),
                c.ours.map_or("-".into(), us),
                c.iceoryx2.map_or("-".into(), us),
                ratio_cell(c),
                spread(&c.aa)
            );
        }
    }
}

/// The depth column: the ring, and `unread` where our channels write the
/// newest slot again once read.
fn depth_cell(s: &Settings, size: usize, depth: u64) -> String {
    match s.keep_for(size) {
        crate::settings::KeepArg::Newest => depth.to_string(),
        crate::settings::KeepArg::Unread => format!("{depth} unread"),
    }
}

fn floor_table(t: &mut String, r: &Report) {
    let rows: Vec<&LatencyFigures> = r
        .results
        .iter()
        .filter_map(|f| match f {
            Figures::Latency(l) if l.over_floor.is_some() => Some(l),
            _ => None,
        })
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(t);
    let _ = writeln!(
        t,
        "| ping-pong p50 over the floor (bare futex ping-pong through a ring of the same depth, or one buffer each way where our channels keep unread messages only), us | depth | floor | ours | iceoryx2 | ours/floor | iceoryx2/floor |"
    );
    let _ = writeln!(t, "| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for l in rows {
        let Some(o) = &l.over_floor else { continue };
        let p50 = |p: &Option<Percentiles>| p.as_ref().map_or("-".into(), |p| us(p.p50));
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} | {} | {} |",
            size_label(l.size),
            depth_cell(r.settings, l.size, l.depth),
            p50(&l.floor),
            p50(&l.ours),
            p50(&l.iceoryx2),
            spread(&o.ours),
            spread(&o.iceoryx2)
        );
    }
}

fn publish_table(t: &mut String, r: &Report) {
    let _ = writeln!(
        t,
        "| publish, no subscriber waiting, ns per publish ({} batches per size and side) | batch | depth | ours: loan, write, send | iceoryx2: loan, write, send, notify | iceoryx2 send only (no notify) | ours/iceoryx2 | ours/iceoryx2 send only | A/A |",
        r.settings.publish_batches
    );
    let _ = writeln!(
        t,
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    for f in &r.results {
        let Figures::Publish(p) = f else { continue };
        for (c, send_only) in p.compared.iter().zip(&p.compared_send_only) {
            let _ = writeln!(
                t,
                "| {} {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                size_label(p.size),
                c.figure,
                p.batch,
                depth_cell(r.settings, p.size, p.depth),
                c.ours.map_or("-".into(), ns),
                c.iceoryx2.map_or("-".into(), ns),
                send_only.iceoryx2.map_or("-".into(), ns),
                ratio_cell(c),
                ratio_cell(send_only),
                spread(&c.aa)
            );
        }
    }
}

fn throughput_table(t: &mut String, r: &Report) {
    let _ = writeln!(
        t,
        "| throughput, N back to back, median of {} rounds (ratios: higher is faster) | N | depth | ours | iceoryx2 | ours/iceoryx2 | A/A | lost / expected ours, iceoryx2 |",
        r.settings.throughput_rounds
    );
    let _ = writeln!(
        t,
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    for f in &r.results {
        let Figures::Throughput(p) = f else { continue };
        let head = format!(
            "{} x{} sub{}",
            size_label(p.size),
            p.subscribers,
            if p.subscribers == 1 { "" } else { "s" }
        );
        for c in &p.compared {
            let what = if c.figure == "delivered/s" {
                "delivered (slowest subscriber)"
            } else {
                "sent"
            };
            let _ = writeln!(
                t,
                "| {head} {what} | {} | {} | {} | {} | {} | {} | {} / {}, {} / {} |",
                p.ours.messages,
                depth_cell(r.settings, p.size, p.depth),
                rate(c.ours),
                rate(c.iceoryx2),
                ratio_cell(c),
                spread(&c.aa),
                p.ours.lost,
                p.ours.expected,
                p.iceoryx2.lost,
                p.iceoryx2.expected
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Run;
    use crate::role::RoleResult;
    use crate::settings::Flags;
    use clap::Parser as _;

    fn settings(args: &[&str]) -> Settings {
        let f =
            Flags::try_parse_from(std::iter::once("peers").chain(args.iter().copied())).unwrap();
        Settings::from_flags(&f, &[0, 1]).unwrap()
    }

    fn outcome(bench: Bench, arm: Arm, round: u32, samples: Vec<u64>) -> Outcome {
        Outcome {
            run: Run {
                bench,
                size: 8,
                subscribers: 1,
                round,
                arm,
                count: samples.len() as u64,
                warmup: 0,
                depth: 64,
                keep: crate::settings::KeepArg::Newest,
            },
            sender: RoleResult {
                samples_ns: samples,
                ..RoleResult::default()
            },
            receivers: vec![RoleResult::default()],
            sched: vec![("sender", "SCHED_FIFO 80 on CPU 0, memory locked".into())],
        }
    }

    /// Ping-pong rounds of round trips all of one value per run: each
    /// round (ours, iceoryx2, ours again), in us.
    fn ping_pong(rounds: &[(u64, u64, u64)]) -> Vec<Outcome> {
        let mut all = Vec::new();
        for (i, &(ours, iox, again)) in rounds.iter().enumerate() {
            for (arm, us) in [
                (Arm::Ours, ours),
                (Arm::Iceoryx2, iox),
                (Arm::OursAgain, again),
            ] {
                all.push(outcome(
                    Bench::PingPong,
                    arm,
                    i as u32,
                    vec![us * 1000; 100],
                ));
            }
        }
        all
    }

    #[test]
    fn ratios_are_medians_of_per_round_ratios_not_of_pooled_figures() {
        // Per round ours/iceoryx2: 0.5, 1.5, 1.0; A/A: 1.1, 1.0, 0.9.
        // Pooled, ours' p50 is 10 us and iceoryx2's 20 us: 0.5.
        let all = ping_pong(&[(10, 20, 11), (30, 20, 30), (10, 10, 9)]);
        let s = settings(&["--only", "ping-pong", "--sizes", "8", "--rounds", "3"]);
        let f = latency(&all, Bench::PingPong, 8, &s);
        let p50 = &f.compared[0];
        assert_eq!(p50.figure, "p50");
        let r = p50.ratio.as_ref().unwrap();
        assert_eq!(r.per_round, vec![0.5, 1.5, 1.0]);
        assert_eq!((r.median, r.min, r.max), (1.0, 0.5, 1.5));
        let aa = p50.aa.as_ref().unwrap();
        assert!((aa.median - 1.0).abs() < 1e-12, "{aa:?}");
        assert!((aa.min - 0.9).abs() < 1e-12 && (aa.max - 1.1).abs() < 1e-12);
        assert_eq!(p50.beyond_aa, Some(false));
        assert_eq!((p50.ours, p50.iceoryx2), (Some(10_000.0), Some(20_000.0)));
        assert_eq!(f.pooled_ratio_ours_over_iceoryx2.unwrap().p50, Some(0.5));
        assert_eq!(f.rounds, 3);
        assert_eq!(f.depth, 64);
        // 1.0 against a target of 0.6: missed, whatever the pooled 0.5 says.
        let c = target(&f);
        assert_eq!(c.p50_ratio, Some(1.0));
        assert!(!c.met);
    }

    #[test]
    fn a_ratio_beyond_the_aa_spread_is_told_from_noise_and_meets_the_target() {
        let all = ping_pong(&[(5, 10, 5), (6, 10, 6), (4, 10, 4), (5, 10, 5)]);
        let s = settings(&["--only", "ping-pong", "--sizes", "8", "--rounds", "4"]);
        let f = latency(&all, Bench::PingPong, 8, &s);
        for c in &f.compared {
            assert_eq!(c.ratio.as_ref().unwrap().median, 0.5, "{}", c.figure);
            assert_eq!(c.aa.as_ref().unwrap().median, 1.0);
            assert_eq!(c.beyond_aa, Some(true));
        }
        let c = target(&f);
        assert_eq!((c.p50_ratio, c.p999_ratio), (Some(0.5), Some(0.5)));
        assert!(c.met);
        // The table carries it: per-round ratio, spread, A/A.
        let (results, targets) = results(&s, &all);
        let host_notes = Vec::new();
        let rep = Report {
            schema_version: SCHEMA_VERSION,
            command: "peers".into(),
            settings: &s,
            environment: Environment {
                kernel: "6.1",
                allowed_cpus: &[0, 1],
                sched_fifo_priority: Some(80),
                cpu_dma_latency_held_at_0: true,
                steal_percent: &[],
                load_average: (0.0, 0.0),
                sides: Vec::new(),
                ours_backend: Vec::new(),
                iceoryx2: ICEORYX2,
                notes: &host_notes,
            },
            order: ORDER,
            measured: Vec::new(),
            results,
            ping_pong_target: targets,
        };
        let text = table(&rep);
        assert!(
            text.contains(
                "| 8 B p50 | 64 | 5.00 | 10.0 | 0.50x (0.40..0.60) | 1.00x (1.00..1.00) |"
            ),
            "{text}"
        );
        assert!(text.contains("met"), "{text}");
        let json = serde_json::to_value(&rep).unwrap();
        assert_eq!(json["results"][0]["compared"][0]["ratio"]["median"], 0.5);
        assert_eq!(
            json["results"][0]["compared"][0]["aa"]["numerator"],
            "ours again"
        );
    }

    #[test]
    fn a_round_without_both_arms_gives_no_ratio_for_that_round() {
        let mut all = ping_pong(&[(10, 20, 10), (10, 40, 10)]);
        // Round 1's iceoryx2 run measured nothing.
        all[4].sender.samples_ns.clear();
        let s = settings(&["--only", "ping-pong", "--sizes", "8", "--rounds", "2"]);
        let f = latency(&all, Bench::PingPong, 8, &s);
        assert_eq!(f.compared[0].ratio.as_ref().unwrap().per_round, vec![0.5]);
    }

    #[test]
    fn the_floor_divides_each_round_s_p50() {
        let mut all = ping_pong(&[(10, 20, 10), (12, 18, 12)]);
        all.push(outcome(Bench::PingPong, Arm::Floor, 0, vec![5_000; 10]));
        all.push(outcome(Bench::PingPong, Arm::Floor, 1, vec![6_000; 10]));
        let s = settings(&["--only", "ping-pong", "--sizes", "8", "--rounds", "2"]);
        let f = latency(&all, Bench::PingPong, 8, &s);
        let o = f.over_floor.unwrap();
        assert_eq!(o.ours.unwrap().per_round, vec![2.0, 2.0]);
        assert_eq!(o.iceoryx2.unwrap().per_round, vec![4.0, 3.0]);
        // The floor is no arm of the comparison.
        assert_eq!(f.compared[0].ratio.as_ref().unwrap().per_round.len(), 2);
    }

    fn throughput_run(arm: Arm, round: u32, delivered_ms: &[u64]) -> Outcome {
        let mut o = outcome(Bench::Throughput, arm, round, vec![]);
        o.run.count = 1000;
        o.sender.start_ns = 1_000_000_000;
        o.sender.end_ns = 1_001_000_000; // 1 ms: 1 M/s sent
        o.receivers = delivered_ms
            .iter()
            .map(|&ms| RoleResult {
                received: 1000,
                last_ns: 1_000_000_000 + ms * 1_000_000,
                ..RoleResult::default()
            })
            .collect();
        o
    }

    #[test]
    fn throughput_takes_the_slowest_subscriber() {
        let mut o = throughput_run(Arm::Ours, 0, &[1, 2]);
        o.receivers[1].received = 900;
        o.receivers[1].lost = 100;
        let all = [o];
        let cell = Cell::of(&all, Bench::Throughput, 8, 1);
        let s = throughput_side(&cell, Arm::Ours);
        assert_eq!(s.sent_per_s, Some(1e6));
        assert_eq!(s.delivered_per_s, Some(450_000.0));
        assert_eq!((s.lost, s.expected), (100, 2000));
    }

    #[test]
    fn throughput_ratios_are_per_round_on_the_slowest_subscriber() {
        // Ours delivers to its slowest in 2 ms, then 4; iceoryx2 in 4,
        // then 2: per round 2.0 and 0.5, median 1.25.
        let all = vec![
            throughput_run(Arm::Ours, 0, &[1, 2]),
            throughput_run(Arm::Iceoryx2, 0, &[4, 1]),
            throughput_run(Arm::OursAgain, 0, &[2, 2]),
            throughput_run(Arm::Ours, 1, &[4, 1]),
            throughput_run(Arm::Iceoryx2, 1, &[2, 2]),
            throughput_run(Arm::OursAgain, 1, &[4, 4]),
        ];
        let f = throughput(&all, 8, 1);
        let d = f
            .compared
            .iter()
            .find(|c| c.figure == "delivered/s")
            .unwrap();
        let r = d.ratio.as_ref().unwrap();
        assert_eq!(r.per_round, vec![2.0, 0.5]);
        assert_eq!(r.median, 1.25);
        assert_eq!(d.aa.as_ref().unwrap().per_round, vec![1.0, 1.0]);
        assert_eq!(f.ours.rounds, 2);
    }
}
