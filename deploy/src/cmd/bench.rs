//! `deploy bench wake|publish|throughput`: the runtime's microbenchmarks.
//!
//! - `wake`: one-way wake latency between two processes, every mechanism
//!   side by side in one run (io_uring armed futex, futex_waitv, raw futex,
//!   eventfd, pipe, RT signal into signalfd), with the settings in force
//!   (SCHED_FIFO, CPUs, /dev/cpu_dma_latency) printed alongside.
//! - `publish`: the cost of one publish, without and with a waiting
//!   subscriber, and the futex wake syscalls it made; then a 64 B and a
//!   1 MiB message published by copy and by loan, send and receive timed
//!   apart, against a memcpy and a plain write timed in the same run; then
//!   a 4 MiB message by loan to four subscribers that hold it and read
//!   every cache line, its CPU time against private buffers.
//! - `throughput`: messages per second a publisher reaches.
//!
//! Channel files go to a temporary directory under
//! `<prefix>/dev/shm/rtdeploy`. Exit codes: 0 ran, 2 could not run.

use std::time::Duration;

use anyhow::Context as _;
use check::bench::{self, Mechanism, WakeOptions};
use clap::{Args, Subcommand};

use crate::ctx::{Ctx, Exit};

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// One-way wake latency per mechanism, side by side.
    Wake(WakeArgs),
    /// Cost of one publish (no waiter; one waiting subscriber); publishing
    /// 64 B and 1 MiB by copy and by loan against memcpy.
    Publish(PublishArgs),
    /// Publish throughput without waiters.
    Throughput(ThroughputArgs),
}

#[derive(Debug, Args)]
pub struct WakeArgs {
    /// Samples per mechanism.
    #[arg(long, default_value_t = 10_000)]
    pub samples: u32,
    /// Sender period in microseconds.
    #[arg(long, default_value_t = 200)]
    pub period_us: u64,
    /// Interleaved rounds over the mechanisms.
    #[arg(long, default_value_t = 5)]
    pub rounds: u32,
    /// Only these mechanisms (io_uring, futex_waitv, doorbell, futex, eventfd,
    /// signalfd, msg_ring, pipe); repeatable.
    #[arg(long = "mechanism")]
    pub mechanisms: Vec<String>,
    /// SCHED_FIFO priority of sender and receiver.
    #[arg(long, default_value_t = 80)]
    pub priority: u32,
    /// Keep the current scheduling policy instead of SCHED_FIFO.
    #[arg(long)]
    pub no_fifo: bool,
    /// The CPU the sender is pinned to [default: the second-last CPU this
    /// process may run on; none with only one].
    #[arg(long, value_name = "CPU")]
    pub sender_cpu: Option<usize>,
    /// The CPU the receiver is pinned to [default: the last CPU this
    /// process may run on].
    #[arg(long, value_name = "CPU")]
    pub receiver_cpu: Option<usize>,
    /// A C++ receiver (`cpp-wake-receiver`, built from
    /// examples/cpp/wake_receiver.cpp): its loop is measured beside the
    /// Rust loop on the same backend (doorbell), and their p50 ratio is
    /// reported with its A/A floor.
    #[arg(long, value_name = "PATH")]
    pub cpp_receiver: Option<std::path::PathBuf>,
    /// The bridge program (`rtdeploy-bridge`): the Rust loop on the
    /// doorbell backend is measured while two bridges forward its channel
    /// over Zenoh, beside the same loop without them; the p50 and p99.9
    /// ratios and the forwarding bridge's CPU time are reported.
    #[arg(long, value_name = "PATH")]
    pub bridge: Option<std::path::PathBuf>,
}

#[derive(Debug, Args)]
pub struct PublishArgs {
    /// Back-to-back publishes without a waiter.
    #[arg(long, default_value_t = 5_000_000)]
    pub count: u64,
    /// Publishes (one per 200us) to a waiting subscriber process.
    #[arg(long, default_value_t = 5_000)]
    pub waited: u64,
    /// Payload bytes of the publish cost (the copy and loan comparison
    /// always takes 64 B and 1 MiB).
    #[arg(long, default_value_t = 64)]
    pub size: usize,
    /// Interleaved rounds of the copy and loan comparison.
    #[arg(long, default_value_t = 20)]
    pub rounds: u32,
    /// Timed samples of each copy and loan case per round.
    #[arg(long, default_value_t = 100)]
    pub samples: u32,
    /// Payload bytes of the message held by several subscribers (0: skip
    /// that part).
    #[arg(long, default_value_t = 4 << 20)]
    pub fanout_bytes: usize,
    /// Subscribers holding it.
    #[arg(long, default_value_t = 4)]
    pub fanout_subscribers: u32,
    /// Messages per round of each of its arms (one per 10 ms).
    #[arg(long, default_value_t = 100)]
    pub fanout_messages: u32,
    /// Interleaved rounds of its arms.
    #[arg(long, default_value_t = 5)]
    pub fanout_rounds: u32,
    /// A directory on a tmpfs that gives huge pages (e.g. `mount -t tmpfs
    /// -o huge=within_size tmpfs DIR`): the held message runs through a
    /// channel there too, as a fourth arm.
    #[arg(long, value_name = "DIR")]
    pub fanout_huge_shm: Option<std::path::PathBuf>,
}

#[derive(Debug, Args)]
pub struct ThroughputArgs {
    #[arg(long, default_value_t = 2)]
    pub seconds: u64,
    #[arg(long, default_value_t = 1)]
    pub publishers: u32,
    /// Run the publishers SCHED_FIFO at this priority.
    #[arg(long)]
    pub priority: Option<u32>,
    /// Payload bytes.
    #[arg(long, default_value_t = 64)]
    pub size: usize,
}

pub fn run(ctx: &Ctx, cmd: BenchCommand) -> anyhow::Result<Exit> {
    let shm = releases::Layout::new(&ctx.prefix).shm_dir();
    std::fs::create_dir_all(&shm).with_context(|| format!("creating {}", shm.display()))?;
    let proc_root = ctx.sys("/proc");
    match cmd {
        BenchCommand::Wake(a) => {
            let mut o = WakeOptions::new(&shm);
            o.samples = a.samples;
            o.period = Duration::from_micros(a.period_us.max(1));
            o.rounds = a.rounds.max(1);
            o.priority = (!a.no_fifo).then_some(a.priority);
            o.sender_cpu = a.sender_cpu;
            o.receiver_cpu = a.receiver_cpu;
            o.cpp_receiver = a.cpp_receiver;
            o.bridge = a.bridge;
            // The real device even under --prefix: it is a kernel control,
            // not an installed path; the report says whether it was held.
            o.dma_latency = "/dev/cpu_dma_latency".into();
            o.proc_root = proc_root;
            if !a.mechanisms.is_empty() {
                o.mechanisms = a
                    .mechanisms
                    .iter()
                    .map(|m| {
                        Mechanism::parse(m).with_context(|| {
                            format!(
                                "unknown mechanism `{m}` (expected one of {})",
                                Mechanism::names(&Mechanism::ALL)
                            )
                        })
                    })
                    .collect::<anyhow::Result<_>>()?;
            }
            // The C++ receiver and the bridge add their arms and the Rust
            // loop's A/A.
            let arms = o.mechanisms.len()
                + usize::from(o.cpp_receiver.is_some())
                + usize::from(o.bridge.is_some())
                + usize::from(o.cpp_receiver.is_some() || o.bridge.is_some());
            ctx.note(format!(
                "measuring {arms} arm(s), {} samples each at {}us: about {}s",
                o.samples,
                a.period_us,
                (arms as u64 * o.samples as u64 * a.period_us) / 1_000_000 + 1
            ));
            let r = bench::wake(&o)?;
            if ctx.json {
                ctx.print_json(&r)?;
            } else {
                print!("{}", r.table());
            }
        }
        BenchCommand::Publish(a) => {
            let cost = bench::publish(&shm, &proc_root, a.size, a.count, a.waited)?;
            let opts = bench::CopyLoanOptions {
                rounds: a.rounds.max(1),
                samples: a.samples.max(1),
            };
            let copy_and_loan = bench::copy_and_loan(&shm, &proc_root, &opts)?;
            let fanout = if a.fanout_bytes > 0 {
                let o = bench::FanoutOptions {
                    bytes: a.fanout_bytes,
                    subscribers: a.fanout_subscribers.max(1),
                    messages: a.fanout_messages.max(1),
                    rounds: a.fanout_rounds.max(1),
                    huge_shm: a.fanout_huge_shm.clone(),
                    ..bench::FanoutOptions::default()
                };
                Some(bench::fanout(&shm, &proc_root, &o)?)
            } else {
                None
            };
            let r = bench::PublishBenchReport {
                cost,
                copy_and_loan,
                fanout,
            };
            if ctx.json {
                ctx.print_json(&r)?;
            } else {
                print!("{}", r.table());
            }
        }
        BenchCommand::Throughput(a) => {
            let r = bench::throughput(
                &shm,
                &proc_root,
                a.size,
                a.publishers,
                Duration::from_secs(a.seconds.max(1)),
                a.priority,
            )?;
            if ctx.json {
                ctx.print_json(&r)?;
            } else {
                print!("{}", r.table());
            }
        }
    }
    Ok(Exit::Ok)
}
