//! The command line: raw flags, then validated settings.

use std::time::Duration;

use anyhow::{bail, Result};
use clap::Parser;
use serde::Serialize;

use crate::message::{DEFAULT_SIZES, LARGE, SIZES};

/// Our runtime against iceoryx2 on this machine: ping-pong round trip,
/// one-way wake at a fixed period, publish cost with no subscriber
/// waiting, and throughput with 1, 2 and 4 subscribers, for each message
/// size, in one run of interleaved rounds. Every round measures ours,
/// iceoryx2 and ours a second time (the A/A control: how far two
/// measurements of the same thing differ on this machine), in an order
/// rotated round by round; each figure is given as the median over rounds
/// of the per-round ratio ours / iceoryx2, beside the A/A ratio.
///
/// The defaults are the full run (about 20 to 30 minutes on a 2-core VM):
/// sizes 8 B, 1 KiB, 64 KiB, 1 MiB, 4 MiB; 10 rounds; 200000 round trips,
/// 20000 one-way wakes and 2000 publish batches per size and side; 5
/// throughput rounds of 200000 (up to 64 B), 100000 (up to 4 KiB), 10000
/// (up to 64 KiB) or 2000 (above) messages. Messages above 64 KiB are
/// large: a queue of --large-depth, a one-way period of --large-period-us
/// and publish batches of --large-batch.
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
    /// Message sizes in bytes (of 8, 64, 1024, 4096, 65536, 1048576,
    /// 4194304).
    #[arg(long, value_delimiter = ',', default_values_t = DEFAULT_SIZES)]
    pub sizes: Vec<usize>,
    /// Rounds per benchmark and size; each round runs ours, iceoryx2 and
    /// ours again (and the floor, with --floor), in a rotated order.
    #[arg(long, default_value_t = 10)]
    pub rounds: u32,
    /// Measured round trips per size and side, split over the rounds.
    #[arg(long, default_value_t = 200_000)]
    pub pingpong: u64,
    /// Measured one-way wakes per size and side, split over the rounds.
    #[arg(long, default_value_t = 20_000)]
    pub oneway: u64,
    /// The one-way sender's period, microseconds (messages up to 64 KiB).
    #[arg(long, default_value_t = 200)]
    pub period_us: u64,
    /// The one-way sender's period for messages above 64 KiB,
    /// microseconds: longer than writing one (a 4 MiB write takes a few
    /// hundred microseconds).
    #[arg(long, default_value_t = 1000)]
    pub large_period_us: u64,
    /// Timed publish batches per size and side, split over the rounds.
    #[arg(long, default_value_t = 2_000)]
    pub publish_batches: u64,
    /// Publishes per timed batch (messages up to 64 KiB).
    #[arg(long, default_value_t = 256)]
    pub batch: u64,
    /// Publishes per timed batch for messages above 64 KiB.
    #[arg(long, default_value_t = 8)]
    pub large_batch: u64,
    /// Throughput: messages per round, every size (default by size:
    /// 200000 up to 64 B, 100000 up to 4 KiB, 10000 up to 64 KiB, 2000
    /// above).
    #[arg(long)]
    pub throughput_messages: Option<u64>,
    /// Throughput rounds per size, subscriber count and side.
    #[arg(long, default_value_t = 5)]
    pub throughput_rounds: u32,
    /// Subscriber counts for the throughput benchmark.
    #[arg(long, value_delimiter = ',', default_values_t = [1u32, 2, 4])]
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
    /// Ring length of our channels and subscriber buffer of iceoryx2's,
    /// for messages up to 64 KiB (a power of two).
    #[arg(long, default_value_t = 64)]
    pub depth: u64,
    /// Ring length of our channels and subscriber buffer of iceoryx2's,
    /// for messages above 64 KiB (a power of two).
    #[arg(long, default_value_t = 2)]
    pub large_depth: u64,
    /// What our channels keep once read, for messages up to 64 KiB:
    /// `newest` (the newest `--depth` messages, each publish writing the
    /// slot the oldest leaves) or `unread` (the publisher writes the
    /// newest message's slot again once it is read).
    #[arg(long, value_enum, default_value_t = KeepArg::Newest)]
    pub keep: KeepArg,
    /// What our channels keep once read, for messages above 64 KiB (the
    /// floor then writes one buffer each way, as such a channel does).
    #[arg(long, value_enum, default_value_t = KeepArg::Unread)]
    pub large_keep: KeepArg,
    /// How our receivers read a message: `held` holds it in its slot
    /// while the handler reads the two words it uses (as iceoryx2's
    /// receivers hold a sample; our channels get a hold record per
    /// subscribing process), `in-place` reads the two words in the slot
    /// and checks it was not recycled meanwhile, `copy` takes the event
    /// loop's copy of the whole message.
    #[arg(long, value_enum, default_value_t = Receive::Held)]
    pub receive: Receive,
    /// Ping-pong: measure the floor too, as one more arm of every round:
    /// two threads of one process taking turns writing the whole message
    /// into a ring of the same depth and waking each other by a bare
    /// futex (the `floor` binary, which must lie beside this one). The
    /// table then gives our p50 and iceoryx2's over the floor's.
    #[arg(long)]
    pub floor: bool,
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

/// What our channels keep once read (see `--keep`; robot.yaml's
/// `channels[].keep`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum KeepArg {
    Newest,
    Unread,
}

impl KeepArg {
    pub fn keep(self) -> controller::channel::Keep {
        match self {
            KeepArg::Newest => controller::channel::Keep::Newest,
            KeepArg::Unread => controller::channel::Keep::Unread,
        }
    }
}

/// How our receivers read messages (see `--receive`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Receive {
    Held,
    InPlace,
    Copy,
}

impl Receive {
    /// How the table says it.
    pub fn describe(self) -> &'static str {
        match self {
            Receive::Held => "held in the slot",
            Receive::InPlace => "in place",
            Receive::Copy => "the loop's copy",
        }
    }
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
    #[serde(serialize_with = "as_micros")]
    pub large_period: Duration,
    pub publish_batches: u64,
    pub batch: u64,
    pub large_batch: u64,
    pub throughput_messages: Option<u64>,
    pub throughput_rounds: u32,
    pub subscribers: Vec<u32>,
    pub sender_cpu: usize,
    pub receiver_cpu: usize,
    /// Requested SCHED_FIFO priority (`None`: SCHED_OTHER asked for).
    pub priority: Option<u32>,
    pub depth: u64,
    pub large_depth: u64,
    pub keep: KeepArg,
    pub large_keep: KeepArg,
    pub receive: Receive,
    pub floor: bool,
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
        if f.batch == 0 || f.large_batch == 0 {
            bail!("--batch and --large-batch must be at least 1");
        }
        for (flag, us) in [
            ("--period-us", f.period_us),
            ("--large-period-us", f.large_period_us),
        ] {
            if us < 10 {
                bail!("{flag} {us} is below 10");
            }
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
        for (flag, depth) in [("--depth", f.depth), ("--large-depth", f.large_depth)] {
            if !depth.is_power_of_two() || !(1..=4096).contains(&depth) {
                bail!("{flag} {depth} is not a power of two from 1 to 4096");
            }
        }
        Ok(Settings {
            benches,
            sizes: f.sizes.clone(),
            rounds: f.rounds,
            pingpong: f.pingpong,
            oneway: f.oneway,
            period: Duration::from_micros(f.period_us),
            large_period: Duration::from_micros(f.large_period_us),
            publish_batches: f.publish_batches,
            batch: f.batch,
            large_batch: f.large_batch,
            throughput_messages: f.throughput_messages,
            throughput_rounds: f.throughput_rounds,
            subscribers: f.subscribers.clone(),
            sender_cpu: f.sender_cpu,
            receiver_cpu: f.receiver_cpu,
            priority: (!f.no_fifo).then_some(f.priority),
            depth: f.depth,
            large_depth: f.large_depth,
            keep: f.keep,
            large_keep: f.large_keep,
            receive: f.receive,
            floor: f.floor,
            json: f.json,
            quiet: f.quiet,
        })
    }

    /// Throughput messages per round for `size`.
    pub fn throughput_messages_for(&self, size: usize) -> u64 {
        self.throughput_messages.unwrap_or(match size {
            0..=64 => 200_000,
            65..=4096 => 100_000,
            4097..=LARGE => 10_000,
            _ => 2_000,
        })
    }

    /// Ring length of our channels and subscriber buffer of iceoryx2's
    /// for `size`.
    pub fn depth_for(&self, size: usize) -> u64 {
        if size > LARGE {
            self.large_depth
        } else {
            self.depth
        }
    }

    /// What our channels keep once read, for `size`.
    pub fn keep_for(&self, size: usize) -> KeepArg {
        if size > LARGE {
            self.large_keep
        } else {
            self.keep
        }
    }

    /// The floor's ring for `size`: our channels' depth, or one buffer
    /// each way where they write the newest slot again.
    pub fn floor_depth_for(&self, size: usize) -> u64 {
        match self.keep_for(size) {
            KeepArg::Newest => self.depth_for(size),
            KeepArg::Unread => 1,
        }
    }

    /// The one-way sender's period for `size`.
    pub fn period_for(&self, size: usize) -> Duration {
        if size > LARGE {
            self.large_period
        } else {
            self.period
        }
    }

    /// Publishes per timed batch for `size`.
    pub fn batch_for(&self, size: usize) -> u64 {
        if size > LARGE {
            self.large_batch
        } else {
            self.batch
        }
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
        assert_eq!(s.sizes, vec![8, 1024, 65536, 1 << 20, 4 << 20]);
        assert_eq!(s.benches, Bench::ALL.to_vec());
        assert_eq!((s.sender_cpu, s.receiver_cpu, s.priority), (0, 1, Some(80)));
        assert_eq!((s.rounds, s.pingpong), (10, 200_000));
        assert_eq!(s.subscribers, vec![1, 2, 4]);
        assert_eq!(s.receive, Receive::Held);
        assert!(!s.floor);
        assert_eq!(s.throughput_messages_for(8), 200_000);
        assert_eq!(s.throughput_messages_for(65536), 10_000);
        assert_eq!(s.throughput_messages_for(1 << 20), 2_000);
        assert_eq!(s.throughput_messages_for(4 << 20), 2_000);
    }

    #[test]
    fn large_messages_get_the_large_depth_period_and_batch() {
        let s = Settings::from_flags(
            &flags(&["--depth", "32", "--large-depth", "4", "--large-batch", "3"]),
            &[0, 1],
        )
        .unwrap();
        assert_eq!((s.depth_for(8), s.depth_for(65536)), (32, 32));
        assert_eq!((s.depth_for(65537), s.depth_for(4 << 20)), (4, 4));
        assert_eq!(s.period_for(65536), Duration::from_micros(200));
        assert_eq!(s.period_for(1 << 20), Duration::from_micros(1000));
        assert_eq!((s.batch_for(65536), s.batch_for(1 << 20)), (256, 3));
        let d = Settings::from_flags(&flags(&[]), &[0, 1]).unwrap();
        assert_eq!((d.depth_for(65536), d.depth_for(1 << 20)), (64, 2));
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
        assert!(e(&["--large-depth", "0"]).contains("--large-depth 0"));
        assert!(e(&["--large-period-us", "5"]).contains("--large-period-us 5"));
        assert!(e(&["--pingpong", "3"]).contains("--pingpong 3"));
    }

    #[test]
    fn no_fifo_asks_for_sched_other() {
        let s = Settings::from_flags(&flags(&["--no-fifo"]), &[0, 1]).unwrap();
        assert_eq!(s.priority, None);
    }
}
