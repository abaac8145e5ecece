//! The floor under a ping-pong round trip of large messages through a
//! ring of slots: two threads, pinned and under SCHED_FIFO as the peers
//! benchmark's sides are, that take turns writing a whole message into
//! the next slot of their ring and waking the other through a raw futex
//! word, which reads the message's first and last words. Nothing else: no
//! channel, no event loop, no index, no seqlock.
//!
//! Rings of several depths run in one invocation, their rounds
//! interleaved. A ring of two slots keeps what it writes in the writing
//! CPU's cache, as a pool that hands back the sample just released does;
//! a ring as deep as a channel's queue writes, each time, a slot last
//! written `depth` messages ago. The difference is what the ring's depth
//! costs, whatever carries the message.
//!
//!   floor [--size BYTES] [--depths N ...] [--round-trips N] [--rounds N]

#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use clap::Parser;
use controller::rt::DmaLatencyHold;
use check::futex;
use units::cpu::CpuSet;
use units::sched::{self, Policy, SchedAttr};

#[path = "../stats.rs"]
#[allow(dead_code)]
mod stats;
use stats::Percentiles;

#[derive(Debug, Parser)]
#[command(
    about = "Futex ping-pong of whole messages through rings of slots: the floor under \
                   the peers benchmark's round trip, for each ring depth"
)]
struct Args {
    /// Message size in bytes (a multiple of 8).
    #[arg(long, default_value_t = 65536)]
    size: usize,
    /// Ring depths (slots per direction), their rounds interleaved.
    #[arg(long, num_args = 1.., default_values_t = [2u64, 64])]
    depths: Vec<u64>,
    /// Measured round trips per depth, split over the rounds.
    #[arg(long, default_value_t = 20000)]
    round_trips: u64,
    /// Rounds per depth.
    #[arg(long, default_value_t = 4)]
    rounds: u64,
    #[arg(long, default_value_t = 0)]
    sender_cpu: usize,
    #[arg(long, default_value_t = 1)]
    receiver_cpu: usize,
    /// SCHED_FIFO priority of both threads.
    #[arg(long, default_value_t = 80)]
    priority: u32,
}

/// Round trips before the measured ones in each round: every slot of
/// both rings written at least once.
fn warmup(depth: u64) -> u64 {
    2 * depth + 100
}

/// One direction: `depth` slots of `words` words and the futex word that
/// counts the messages written.
struct Ring {
    slots: Box<[UnsafeCell<u64>]>,
    words: usize,
    depth: u64,
    count: AtomicU64,
}

// SAFETY: the two threads take turns (see `Ring::write`): a slot is
// written only by the ring's writer and read only after the release store
// of `count` that follows the write, and the writer comes back to a slot
// only after the reader answered a later message, so no access to a word
// overlaps a write of it.
unsafe impl Sync for Ring {}

impl Ring {
    fn new(words: usize, depth: u64) -> Ring {
        let slots = (0..words * depth as usize)
            .map(|_| UnsafeCell::new(1))
            .collect();
        Ring {
            slots,
            words,
            depth,
            count: AtomicU64::new(0),
        }
    }

    fn slot(&self, n: u64) -> *mut u64 {
        self.slots[(n % self.depth) as usize * self.words].get()
    }

    /// Writes message `n` whole (word 0 the stamp, the rest `n`), then
    /// publishes it and wakes the reader.
    fn write(&self, n: u64, stamp: u64) -> Result<()> {
        let p = self.slot(n);
        // SAFETY: the slot's `words` words are in bounds (slot() starts at
        // a multiple of `words` below words * depth); no other access to
        // them is under way (see the Sync impl).
        let slot = unsafe { std::slice::from_raw_parts_mut(p, self.words) };
        slot[0] = stamp;
        slot[1..].fill(n);
        self.count.store(n + 1, Ordering::Release);
        futex::wake_all(&self.count).context("FUTEX_WAKE")?;
        Ok(())
    }

    /// Waits (at most 10 s: the other thread may have failed) for message
    /// `n` and reads its first and last words.
    fn read(&self, n: u64) -> Result<(u64, u64)> {
        let give_up = now_ns() + 10_000_000_000;
        loop {
            let c = self.count.load(Ordering::Acquire);
            if c > n {
                break;
            }
            if now_ns() > give_up {
                bail!("message {n} did not come within 10 s");
            }
            futex::wait(&self.count, c as u32, Some(100_000_000)).context("FUTEX_WAIT")?;
        }
        let p = self.slot(n);
        // SAFETY: in bounds (as in write); the acquire load above saw the
        // release store that followed the slot's write, and the writer
        // waits for our answer before it writes the slot again.
        Ok(unsafe { (p.read(), p.add(self.words - 1).read()) })
    }
}

fn now_ns() -> u64 {
    controller::Monotonic::now().as_nanos()
}

/// One round: `total` round trips, the samples of those after the
/// warm-up.
fn round(a: &Args, depth: u64, count: u64) -> Result<Vec<f64>> {
    let words = a.size / 8;
    let ping = Arc::new(Ring::new(words, depth));
    let pong = Arc::new(Ring::new(words, depth));
    let total = warmup(depth) + count;
    let (cpu, priority) = (a.receiver_cpu, a.priority);
    let (p2, q2) = (ping.clone(), pong.clone());
    let answer = std::thread::spawn(move || -> Result<()> {
        sched::set_affinity(0, &CpuSet::from_indices([cpu])?)?;
        sched::set_attr(0, &SchedAttr::new(Policy::Fifo, priority))?;
        for n in 0..total {
            let (stamp, seq) = p2.read(n)?;
            if seq != n {
                bail!("ping {n} read as {seq}");
            }
            q2.write(n, stamp)?;
        }
        Ok(())
    });
    let mut samples = Vec::with_capacity(count as usize);
    let mine = (|| -> Result<()> {
        for n in 0..total {
            let t0 = now_ns();
            ping.write(n, t0)?;
            let (stamp, seq) = pong.read(n)?;
            let t1 = now_ns();
            if stamp != t0 || seq != n {
                bail!("pong {n} carried ({stamp}, {seq})");
            }
            if n >= warmup(depth) {
                samples.push((t1 - t0) as f64 / 1000.0);
            }
        }
        Ok(())
    })();
    let theirs = answer
        .join()
        .map_err(|_| anyhow::anyhow!("the answering thread panicked"))?;
    mine.and(theirs)?;
    Ok(samples)
}

fn main() -> Result<()> {
    let a = Args::parse();
    if a.size < 16 || a.size % 8 != 0 {
        bail!("--size {} is not a multiple of 8 of at least 16", a.size);
    }
    if a.depths.contains(&0) || a.rounds == 0 {
        bail!("--depths and --rounds must be at least 1");
    }
    sched::set_affinity(0, &CpuSet::from_indices([a.sender_cpu])?)?;
    sched::set_attr(0, &SchedAttr::new(Policy::Fifo, a.priority))
        .context("SCHED_FIFO (run as root or with CAP_SYS_NICE)")?;
    let _dma = DmaLatencyHold::hold(std::path::Path::new("/dev/cpu_dma_latency"), 0)
        .map_err(|e| eprintln!("floor: note: /dev/cpu_dma_latency not held at 0: {e}"))
        .ok();
    let per_round = a.round_trips.div_ceil(a.rounds);
    let mut by_depth: Vec<Vec<f64>> = vec![Vec::new(); a.depths.len()];
    for _ in 0..a.rounds {
        for (i, &depth) in a.depths.iter().enumerate() {
            by_depth[i].extend(round(&a, depth, per_round)?);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    println!(
        "| futex ping-pong, {} B messages, us ({} per depth) | p50 | p99 | p99.9 | max | over 60 us |",
        a.size,
        per_round * a.rounds
    );
    println!("|---|---|---|---|---|---|");
    for (samples, depth) in by_depth.iter().zip(&a.depths) {
        let p = Percentiles::of(samples.iter().copied()).context("no samples")?;
        let over = samples.iter().filter(|&&s| s > 60.0).count();
        println!(
            "| ring of {depth} | {:.2} | {:.1} | {:.1} | {:.0} | {over} |",
            p.p50, p.p99, p.p999, p.max
        );
    }
    Ok(())
}
