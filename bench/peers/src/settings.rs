//! The command line: raw flags, then validated settings.

use std::time::Duration;

use anyhow::{bail, Result};
use clap::Parser;
use serde::Serialize;

use crate::message::{DEFAULT_SIZES, SIZES};

/// Our runtime against iceoryx2 on this machine: ping-pong round trip,
/// one-way wake at a fixed period, publish cost with no subscriber
/// waiting, and throughput with one and four subscribers, for each
/// message size, in one run whose rounds alternate between the two
/// (ours, iceoryx2, ours, iceoryx2, ...).
///
/// Exit status: 0 measured (whether or not a target was met), 2 the
/// benchmark could not run or a side failed.
#[derive(Debug, Parser)]
#[command(name = "peers", version)]
pub struct Flags {
    /// One JSON document on stdout (progress and notes on stderr).
    #[arg(long)]
    pub json: bool,
    /// No progress on stderr.
    #[arg(short, long)]
    pub quiet: bool,
    /// Benchmarks to run (ping-pong, one-way, publish, throughput).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "ping-pong,one-way,publish,throughput"
    )]
    pub only: Vec<String>,
    /// Message sizes in bytes (of 8, 64, 1024, 4096, 65536).
    #[arg(long, value_delimiter = ',', default_values_t = DEFAULT_SIZES)]
    pub sizes: Vec<usize>,
    /// Rounds per benchmark and size; each round runs ours, then iceoryx2.
    #[arg(long, default_value_t = 10)]
    pub rounds: u32,
    /// Measured round trips per size and side, split over the rounds.
    #[arg(long, default_value_t = 20_000)]
    pub pingpong: u64,
    /// Measured one-way wakes per size and side, split over the rounds.
    #[arg(long, default_value_t = 20_000)]
    pub oneway: u64,
    /// The one-way sender's period, microseconds.
    #[arg(long, default_value_t = 200)]
    pub period_us: u64,
    /// Timed publish batches per size and side, split over the rounds.
    #[arg(long, default_value_t = 2_000)]
    pub publish_batches: u64,
    /// Publishes per timed batch.
    #[arg(long, default_value_t = 256)]
    pub batch: u64,
    /// Throughput: messages per round (default by size: 200000 for up to
    /// 64 B, 100000 up to 4 KiB, 10000 above).
    #[arg(long)]
    pub throughput_messages: Option<u64>,
    /// Throughput rounds per size, subscriber count and side.
    #[arg(long, default_value_t = 5)]
    pub throughput_rounds: u32,
    /// Subscriber counts for the throughput benchmark.
    #[arg(long, value_delimiter = ',', default_values_t = [1u32, 4])]
    pub subscribers: Vec<u32>,
    /// The sending side's CPU (ping side, sender, publisher).
    #[arg(long, default_value_t = 0)]
    pub sender_cpu: usize,
    /// The receiving side's CPU (pong side, receivers, subscribers).
    #[arg(long, default_value_t = 1)]
    pub receiver_cpu: usize,
    /// SCHED_FIFO priority of every side (falls back to SCHED_OTHER, with
    /// a note, where not permitted).
    #[arg(long, default_value_t = 80)]
    pub priority: u32,
    /// Run every side under SCHED_OTHER.
    #[arg(long)]
    pub no_fifo: bool,
    /// Ring length of our channels and subscriber buffer of iceoryx2's.
    #[arg(long, default_value_t = 64)]
    pub depth: u64,
    /// How our receivers read a message: `in-place` reads the two words
    /// they use in the channel's slot (as iceoryx2's receivers read them
    /// in its shared memory), `copy` takes the event loop's copy of the
    /// whole message.
    #[arg(long, value_enum, default_value_t = Receive::InPlace)]
    pub receive: Receive,
    /// Run as one side of a benchmark (the parent spawns these).
    #[command(subcommand)]
    pub role: Option<RoleCmd>,
}

#[derive(Debug, clap::Subcommand)]
pub enum RoleCmd {
    /// One side of one run (internal: spawned by the benchmark itself).
    #[command(hide = true)]
    Role { spec: String },
}

/// How our receivers read messages (see `--receive`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Receive {
    InPlace,
    Copy,
}

/// A benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Bench {
    PingPong,
    OneWay,
    Publish,
    Throughput,
}

impl Bench {
    pub const ALL: [Bench; 4] = [
        Bench::PingPong,
        Bench::OneWay,
        Bench::Publish,
        Bench::Throughput,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Bench::PingPong => "ping-pong",
            Bench::OneWay => "one-way",
            Bench::Publish => "publish",
            Bench::Throughput => "throughput",
        }
    }
}

/// Validated settings.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    pub benches: Vec<Bench>,
    pub sizes: Vec<usize>,
    pub rounds: u32,
    pub pingpong: u64,
    pub oneway: u64,
    #[serde(serialize_with = "as_micros")]
    pub period: Duration,
    pub publish_batches: u64,
    pub batch: u64,
    pub throughput_messages: Option<u64>,
    pub throughput_rounds: u32,
    pub subscribers: Vec<u32>,
    pub sender_cpu: usize,
    pub receiver_cpu: usize,
    /// Requested SCHED_FIFO priority (`None`: SCHED_OTHER asked for).
    pub priority: Option<u32>,
    pub depth: u64,
    pub receive: Receive,
    #[serde(skip)]
    pub json: bool,
    #[serde(skip)]
    pub quiet: bool,
}

fn as_micros<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_micros() as u64)
}

impl Settings {
    /// Checks `f` against what the benchmark can do and the CPUs this
    /// process may use (`allowed`).
    pub fn from_flags(f: &Flags, allowed: &[usize]) -> Result<Settings> {
        let mut benches = Vec::new();
        for name in &f.only {
            match Bench::ALL.iter().find(|b| b.name() == name) {
                Some(b) if !benches.contains(b) => benches.push(*b),
                Some(_) => {}
                None => bail!(
                    "--only: unknown benchmark {name:?} (expected ping-pong, one-way, publish, throughput)"
                ),
            }
        }
        if benches.is_empty() {
            bail!("--only: no benchmark named");
        }
        for s in &f.sizes {
            if !SIZES.contains(s) {
                bail!("--sizes: {s} is not one of {SIZES:?}");
            }
        }
        if f.sizes.is_empty() {
            bail!("--sizes: no size named");
        }
        if f.rounds == 0 || f.throughput_rounds == 0 {
            bail!("--rounds and --throughput-rounds must be at least 1");
        }
        for (flag, n) in [
            ("--pingpong", f.pingpong),
            ("--oneway", f.oneway),
            ("--publish-batches", f.publish_batches),
        ] {
            if n < f.rounds as u64 {
                bail!(
                    "{flag} {n} is fewer than one per round ({} rounds)",
                    f.rounds
                );
            }
        }
        if f.batch == 0 {
            bail!("--batch must be at least 1");
        }
        if f.period_us < 10 {
            bail!("--period-us {} is below 10", f.period_us);
        }
        if f.throughput_messages == Some(0) {
            bail!("--throughput-messages must be at least 1");
        }
        if f.subscribers.is_empty() || f.subscribers.iter().any(|&n| n == 0 || n > 8) {
            bail!("--subscribers: each count must be 1 to 8");
        }
        if f.sender_cpu == f.receiver_cpu {
            bail!(
                "--sender-cpu and --receiver-cpu are both {}: the sides need two CPUs",
                f.sender_cpu
            );
        }
        for (flag, cpu) in [
            ("--sender-cpu", f.sender_cpu),
            ("--receiver-cpu", f.receiver_cpu),
        ] {
            if !allowed.contains(&cpu) {
                bail!("{flag} {cpu}: this process may run on CPUs {allowed:?} only");
            }
        }
        if !(1..=99).contains(&f.priority) {
            bail!(
                "--priority {} is not a SCHED_FIFO priority (1 to 99)",
                f.priority
            );
        }
        if !f.depth.is_power_of_two() || !(2..=4096).contains(&f.depth) {
            bail!("--depth {} is not a power of two from 2 to 4096", f.depth);
        }
        Ok(Settings {
            benches,
            sizes: f.sizes.clone(),
            rounds: f.rounds,
            pingpong: f.pingpong,
            oneway: f.oneway,
            period: Duration::from_micros(f.period_us),
            publish_batches: f.publish_batches,
            batch: f.batch,
            throughput_messages: f.throughput_messages,
            throughput_rounds: f.throughput_rounds,
            subscribers: f.subscribers.clone(),
            sender_cpu: f.sender_cpu,
            receiver_cpu: f.receiver_cpu,
            priority: (!f.no_fifo).then_some(f.priority),
            depth: f.depth,
            receive: f.receive,
            json: f.json,
            quiet: f.quiet,
        })
    }

    /// Throughput messages per round for `size`.
    pub fn throughput_messages_for(&self, size: usize) -> u64 {
        self.throughput_messages.unwrap_or(match size {
            0..=64 => 200_000,
            65..=4096 => 100_000,
            _ => 10_000,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(args: &[&str]) -> Flags {
        Flags::try_parse_from(std::iter::once("peers").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn defaults_are_the_issue_s_run() {
        let s = Settings::from_flags(&flags(&[]), &[0, 1]).unwrap();
        assert_eq!(s.sizes, vec![8, 1024, 65536]);
        assert_eq!(s.benches, Bench::ALL.to_vec());
        assert_eq!((s.sender_cpu, s.receiver_cpu, s.priority), (0, 1, Some(80)));
        assert_eq!(s.subscribers, vec![1, 4]);
        assert_eq!(s.throughput_messages_for(8), 200_000);
        assert_eq!(s.throughput_messages_for(65536), 10_000);
    }

    #[test]
    fn refusals_name_the_flag_and_the_value() {
        let e = |args: &[&str]| {
            Settings::from_flags(&flags(args), &[0, 1])
                .unwrap_err()
                .to_string()
        };
        assert!(e(&["--sizes", "8,100"]).contains("100"));
        assert!(e(&["--sender-cpu", "1"]).contains("both 1"));
        assert!(e(&["--receiver-cpu", "5"]).contains("--receiver-cpu 5"));
        assert!(e(&["--only", "latency"]).contains("\"latency\""));
        assert!(e(&["--depth", "48"]).contains("--depth 48"));
        assert!(e(&["--pingpong", "3"]).contains("--pingpong 3"));
    }

    #[test]
    fn no_fifo_asks_for_sched_other() {
        let s = Settings::from_flags(&flags(&["--no-fifo"]), &[0, 1]).unwrap();
        assert_eq!(s.priority, None);
    }
}
