//! The floor under a ping-pong round trip of messages through a ring of
//! slots: two threads, pinned and under SCHED_FIFO as the peers
//! benchmark's sides are, that take turns writing a whole message into
//! the next slot of their ring and waking the other through a raw futex
//! word, which reads the message's first and last words. Nothing else: no
//! channel, no event loop, no index, no seqlock.
//!
//! Every size and ring depth runs in one invocation, their rounds
//! interleaved. A ring of two slots keeps what it writes in the writing
//! CPU's cache, as a pool that hands back the sample just released does;
//! a ring as deep as a channel's queue writes, each time, a slot last
//! written `depth` messages ago. The difference is what the ring's depth
//! costs, whatever carries the message. By default every size runs in a
//! ring of 2, and sizes up to 64 KiB in a ring of 64 too (the peers
//! benchmark's depths: a ring of 64 slots of 4 MiB would be 256 MiB).
//!
//!   floor [--sizes BYTES,...] [--depths N ...] [--round-trips N] [--rounds N] [--json]
//!
//! `peers --floor` runs this once per ping-pong round, for one size and
//! the depth of that size's run, and reads its `--json` output.

#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use check::futex;
use clap::Parser;
use controller::rt::DmaLatencyHold;
use serde::Serialize;
use units::cpu::CpuSet;
use units::sched::{self, Policy, SchedAttr};

#[path = "../stats.rs"]
#[allow(dead_code)]
mod stats;
use stats::Percentiles;

#[path = "../message.rs"]
#[allow(dead_code)]
mod message;
use message::{size_label, DEFAULT_SIZES, LARGE};

#[derive(Debug, Parser)]
#[command(
    about = "Futex ping-pong of whole messages through rings of slots: the floor under \
                   the peers benchmark's round trip, for each message size and ring depth"
)]
struct Args {
    /// Message sizes in bytes (multiples of 8).
    #[arg(long, value_delimiter = ',', default_values_t = DEFAULT_SIZES)]
    sizes: Vec<usize>,
    /// Ring depths (slots per direction) for every size (default: 2 and
    /// 64 for sizes up to 64 KiB, 2 above).
    #[arg(long, num_args = 1..)]
    depths: Option<Vec<u64>>,
    /// Measured round trips per size and depth, split over the rounds.
    #[arg(long, default_value_t = 20000)]
    round_trips: u64,
    /// Rounds per size and depth.
    #[arg(long, default_value_t = 4)]
    rounds: u64,
    #[arg(long, default_value_t = 0)]
    sender_cpu: usize,
    #[arg(long, default_value_t = 1)]
    receiver_cpu: usize,
    /// SCHED_FIFO priority of both threads.
    #[arg(long, default_value_t = 80)]
    priority: u32,
    /// Both threads under SCHED_OTHER.
    #[arg(long)]
    no_fifo: bool,
    /// One JSON document on stdout, every sample in it (what `peers
    /// --floor` reads), instead of the table.
    #[arg(long)]
    json: bool,
    /// Exit when the process `PID` is gone (`peers --floor` passes its own).
    #[arg(long, value_name = "PID")]
    parent: Option<u32>,
}

impl Args {
    /// The ring depths `size` runs in.
    fn depths_for(&self, size: usize) -> Vec<u64> {
        match &self.depths {
            Some(d) => d.clone(),
            None if size > LARGE => vec![2],
            None => vec![2, 64],
        }
    }

    fn priority(&self) -> Option<u32> {
        (!self.no_fifo).then_some(self.priority)
    }
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
        // Vector stores from a 16-byte boundary, as the sides' messages
        // are written (see peers' message::fill_raw).
        let first = if slot.len() > 2 && !(slot.as_ptr().wrapping_add(1) as usize).is_multiple_of(16) {
            slot[1] = n;
            2
        } else {
            1
        };
        let first = first.min(slot.len());
        slot[first..].fill(n);
        self.count.store(n + 1, Ordering::Release);
        futex::wake_all(&self.count).context("FUTEX_WAKE")?;
        Ok(())
    }

    /// Waits (at most 10 s: the other thread may have failed) for message
    /// `n` and reads its first and last words (one word, twice, for an
    /// 8-byte message).
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

/// Pins the calling thread and gives it the run's policy.
fn setup_thread(cpu: usize, priority: Option<u32>) -> Result<()> {
    sched::set_affinity(0, &CpuSet::from_indices([cpu])?)
        .with_context(|| format!("pinning to CPU {cpu}"))?;
    if let Some(p) = priority {
        sched::set_attr(0, &SchedAttr::new(Policy::Fifo, p))
            .with_context(|| format!("SCHED_FIFO {p} (run as root or with CAP_SYS_NICE)"))?;
    }
    Ok(())
}

/// One round: the warm-up's round trips, then `count` measured ones;
/// their round trips in ns.
fn round(a: &Args, size: usize, depth: u64, count: u64) -> Result<Vec<u64>> {
    let words = size / 8;
    let ping = Arc::new(Ring::new(words, depth));
    let pong = Arc::new(Ring::new(words, depth));
    let total = warmup(depth) + count;
    let (cpu, priority) = (a.receiver_cpu, a.priority());
    let (p2, q2) = (ping.clone(), pong.clone());
    let answer = std::thread::spawn(move || -> Result<()> {
        setup_thread(cpu, priority)?;
        for n in 0..total {
            let (stamp, seq) = p2.read(n)?;
            if words > 1 && seq != n {
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
            if stamp != t0 || (words > 1 && seq != n) {
                bail!("pong {n} carried ({stamp}, {seq})");
            }
            if n >= warmup(depth) {
                samples.push(t1 - t0);
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

/// One size and depth, every round's samples.
#[derive(Debug, Serialize)]
struct Measured {
    size: usize,
    depth: u64,
    samples_ns: Vec<u64>,
}

/// What `--json` prints.
#[derive(Debug, Serialize)]
struct Output {
    /// How both threads ran.
    sched: String,
    runs: Vec<Measured>,
}

/// With `--parent`: killed when the parent goes, and gone already if it
/// went.
fn follow_parent(parent: Option<u32>) -> Result<()> {
    let Some(parent) = parent else {
        return Ok(());
    };
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number and touches no
    // memory of ours.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) } != 0 {
        bail!(
            "prctl(PR_SET_PDEATHSIG) failed: {}",
            std::io::Error::last_os_error()
        );
    }
    if std::os::unix::process::parent_id() != parent {
        bail!("the parent (pid {parent}) is gone");
    }
    Ok(())
}

fn main() -> Result<()> {
    let a = Args::parse();
    follow_parent(a.parent)?;
    if a.sizes.is_empty() || a.sizes.iter().any(|&s| s < 8 || s % 8 != 0) {
        bail!("--sizes: each must be a multiple of 8 of at least 8");
    }
    if a.depths
        .as_ref()
        .is_some_and(|d| d.is_empty() || d.contains(&0))
        || a.rounds == 0
    {
        bail!("--depths and --rounds must be at least 1");
    }
    setup_thread(a.sender_cpu, a.priority())?;
    let _dma = DmaLatencyHold::hold(std::path::Path::new("/dev/cpu_dma_latency"), 0)
        .map_err(|e| eprintln!("floor: note: /dev/cpu_dma_latency not held at 0: {e}"))
        .ok();
    let per_round = a.round_trips.div_ceil(a.rounds);
    let mut measured: Vec<Measured> = Vec::new();
    for &size in &a.sizes {
        for depth in a.depths_for(size) {
            measured.push(Measured {
                size,
                depth,
                samples_ns: Vec::with_capacity((per_round * a.rounds) as usize),
            });
        }
    }
    for _ in 0..a.rounds {
        for m in &mut measured {
            let got = round(&a, m.size, m.depth, per_round)
                .with_context(|| format!("{} in a ring of {}", size_label(m.size), m.depth))?;
            m.samples_ns.extend(got);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let policy = a
        .priority()
        .map_or("SCHED_OTHER".to_string(), |p| format!("SCHED_FIFO {p}"));
    let sched = format!(
        "floor: two threads of one process, {policy}, on CPUs {} and {}",
        a.sender_cpu, a.receiver_cpu
    );
    if a.json {
        let out = Output {
            sched,
            runs: measured,
        };
        println!("{}", serde_json::to_string(&out).context("encoding")?);
        return Ok(());
    }
    println!(
        "| futex ping-pong, us ({} per size and depth; {sched}) | p50 | p99 | p99.9 | max |",
        per_round * a.rounds
    );
    println!("|---|---|---|---|---|");
    for m in &measured {
        let p = Percentiles::of(m.samples_ns.iter().map(|&v| v as f64 / 1000.0))
            .context("no samples")?;
        println!(
            "| {} in a ring of {} | {:.2} | {:.1} | {:.1} | {:.0} |",
            size_label(m.size),
            m.depth,
            p.p50,
            p.p99,
            p.p999,
            p.max
        );
    }
    Ok(())
}
