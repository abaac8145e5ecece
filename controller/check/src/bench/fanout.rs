//! One large message to several subscribers with no copy (part of
//! `deploy bench publish`): a frame loaned, written and sent, then held
//! and read whole (every cache line) by each subscriber, an event loop
//! in a thread of its own; its CPU time against the same work without a
//! channel (the writer filling a private buffer, each reader reading a
//! private buffer of its own), at the same period, in interleaved rounds
//! with an A/A arm (the reference measured twice).
//!
//! What the difference is: the loan, the send and its wakes, each
//! subscriber's wait, hold and release, and what reading memory another
//! core has just written costs beyond reading one's own.

use std::sync::{Arc, Barrier};

use super::*;
use crate::harness::{self, Arm, Ratio};

/// Settings of [`fanout`].
#[derive(Debug, Clone)]
pub struct FanoutOptions {
    /// Payload bytes of each message.
    pub bytes: usize,
    pub subscribers: u32,
    /// Messages per round of each arm.
    pub messages: u32,
    pub rounds: u32,
    /// One message per period.
    pub period: Duration,
    /// A directory on a tmpfs that gives huge pages (mounted `huge=always`,
    /// `within_size` or `advise`): a fourth arm runs the channel there.
    pub huge_shm: Option<PathBuf>,
}

impl Default for FanoutOptions {
    fn default() -> Self {
        FanoutOptions {
            bytes: 4 << 20,
            subscribers: 4,
            messages: 100,
            rounds: 5,
            period: Duration::from_millis(10),
            huge_shm: None,
        }
    }
}

/// What [`fanout`] measured: CPU time per message of all threads
/// together (the writer's and every reader's).
#[derive(Debug, Clone, Serialize)]
pub struct FanoutReport {
    pub bytes: usize,
    pub subscribers: u32,
    pub messages_per_round: u32,
    pub rounds: u32,
    pub period_us: u64,
    /// Through the channel, nanoseconds of CPU per message, per round.
    pub channel: Arm,
    /// Without it.
    pub reference: Arm,
    /// The reference again (the A/A arm).
    pub reference_again: Arm,
    /// Channel over reference, median over rounds with its spread.
    pub ratio: Option<Ratio>,
    /// The channel on huge pages (with `huge_shm`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub huge: Option<Arm>,
    /// Huge pages over small ones.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub huge_ratio: Option<Ratio>,
    /// The most shared memory in huge pages the system had while the
    /// huge-page arm's channel existed (`ShmemHugePages`, KiB): 0 means
    /// the tmpfs gave none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub huge_kib_seen: Option<u64>,
    /// Messages some subscriber did not handle (lost to the channel's
    /// depth): 0 unless the readers fall a period behind.
    pub lost: u64,
    /// Lines a reader found with other contents than the writer wrote: 0
    /// unless a held message changed under its reader.
    pub bad_lines: u64,
    /// The channel's CPU time is at most 1.1 times the reference's.
    pub within_10_percent: bool,
}

impl FanoutReport {
    pub fn table(&self) -> String {
        let mut out = String::new();
        let ms = |a: &Arm| {
            let v: Vec<f64> = a.rounds.iter().flatten().copied().collect();
            harness::Spread::of(&v).map_or("-".into(), |s| format!("{:.0} us", s.median / 1e3))
        };
        let _ = writeln!(
            out,
            "a {} message by loan to {} subscribers holding it and reading every cache line, one per {} us, {} per round, {} interleaved rounds; CPU time per message of all threads (median over rounds):",
            size_text(self.bytes),
            self.subscribers,
            self.period_us,
            self.messages_per_round,
            self.rounds
        );
        let _ = writeln!(out, "  through the channel        {}", ms(&self.channel));
        let _ = writeln!(
            out,
            "  private buffers (writer fills its own, each reader reads its own)  {} (again: {})",
            ms(&self.reference),
            ms(&self.reference_again)
        );
        if let Some(r) = &self.ratio {
            let _ = writeln!(out, "  {}", r.line());
        }
        if let Some(h) = &self.huge {
            let _ = writeln!(
                out,
                "  through the channel on huge pages  {} ({} KiB of shared memory in huge pages seen)",
                ms(h),
                self.huge_kib_seen.unwrap_or(0)
            );
            if let Some(r) = &self.huge_ratio {
                let _ = writeln!(out, "  {}", r.line());
            }
        }
        let _ = writeln!(
            out,
            "  {} lost, {} lines read changed; CPU beyond the reference {}",
            self.lost,
            self.bad_lines,
            if self.within_10_percent {
                "within 10%"
            } else {
                "MORE than 10% (target missed)"
            }
        );
        out
    }
}

/// What one arm's round measured.
struct RoundResult {
    cpu_ns: u64,
    handled: u64,
    bad_lines: u64,
}

/// Reads one byte of every cache line of `b`; the lines whose byte is not
/// `want`.
#[inline(never)]
fn read_lines(b: &[u8], want: u8) -> u64 {
    b.iter()
        .step_by(64)
        .map(|&x| u64::from(std::hint::black_box(x) != want))
        .sum()
}

/// Waits for the start of message `seq`'s period.
fn wait_period(t0: Monotonic, period: Duration, seq: u32) {
    sleep_until(t0 + period * seq);
}

/// `ShmemHugePages` of /proc/meminfo, KiB.
fn shmem_huge_kib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("ShmemHugePages:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// The channel arm: a writer thread (this one) and `subscribers` event
/// loops; `huge_kib` gets the most shared memory seen in huge pages.
fn channel_round(
    o: &FanoutOptions,
    shm: &Path,
    proc_root: &Path,
    huge_kib: &mut u64,
) -> Result<RoundResult, BenchRunError> {
    let dir = bench_dir(shm)?;
    let g = ChannelGeometry::new((64 + o.bytes) as u64, 2, 1).with_holds(o.subscribers);
    let (ch, _) =
        Channel::create(dir.path(), "/fanout", &g, None, proc_root).map_err(|source| {
            BenchRunError::ChannelCreate {
                dir: dir.path().into(),
                source,
            }
        })?;
    let ready = Arc::new(Barrier::new(o.subscribers as usize + 1));
    let last = u64::from(o.messages.saturating_sub(1));
    let deadline = o.period * (o.messages + 100) + Duration::from_secs(10);
    let readers: Vec<_> = (0..o.subscribers)
        .map(|_| {
            let ready = ready.clone();
            let shm_dir = dir.path().to_path_buf();
            let proc_root = proc_root.to_path_buf();
            std::thread::spawn(move || -> Result<RoundResult, BenchRunError> {
                let built = (|| {
                    let mut lp = EventLoop::new(LoopOptions {
                        shm_dir,
                        proc_root,
                        ..LoopOptions::default()
                    })
                    .map_err(BenchRunError::LoopCreate)?;
                    let got = Rc::new(RefCell::new((0u64, 0u64)));
                    let g2 = got.clone();
                    lp.watch_frames::<u64>("/fanout", move |ctx, &seq, payload| {
                        let mut g = g2.borrow_mut();
                        g.0 += 1;
                        g.1 += read_lines(payload, seq as u8);
                        if seq >= last {
                            ctx.exit();
                        }
                    })
                    .map_err(BenchRunError::LoopWatch)?;
                    lp.add_timer("deadline", Monotonic::now() + deadline, None, |ctx| {
                        ctx.exit()
                    });
                    Ok((lp, got))
                })();
                ready.wait();
                let (mut lp, got) = built?;
                let c0 = thread_cpu_ns();
                lp.run().map_err(BenchRunError::LoopRun)?;
                let cpu_ns = thread_cpu_ns() - c0;
                let (handled, bad_lines) = *got.borrow();
                Ok(RoundResult {
                    cpu_ns,
                    handled,
                    bad_lines,
                })
            })
        })
        .collect();
    let mut p = ch
        .publisher(proc_root)
        .map_err(|source| BenchRunError::ChannelAttach {
            dir: dir.path().into(),
            source,
        })?;
    p.reserve_byte_loans(64 + o.bytes);
    ready.wait();
    let t0 = Monotonic::now();
    let c0 = thread_cpu_ns();
    let mut sent = Ok(());
    for seq in 0..o.messages {
        wait_period(t0, o.period, seq);
        let r = p.loan_frame::<u64>(o.bytes).and_then(|mut loan| {
            let (head, payload) = loan.parts();
            *head = u64::from(seq);
            payload.fill(seq as u8);
            loan.send()
        });
        if let Err(source) = r {
            sent = Err(BenchRunError::Publish {
                what: "a loaned frame",
                bytes: o.bytes,
                source,
            });
            break;
        }
    }
    let mut total = RoundResult {
        cpu_ns: thread_cpu_ns() - c0,
        handled: 0,
        bad_lines: 0,
    };
    *huge_kib = (*huge_kib).max(shmem_huge_kib());
    for r in readers {
        let r = r
            .join()
            .map_err(|_| sys_err_from("a subscriber thread", io::Error::other("panicked")))??;
        total.cpu_ns += r.cpu_ns;
        total.handled += r.handled;
        total.bad_lines += r.bad_lines;
    }
    sent?;
    Ok(total)
}

/// The reference arm: the same threads, the same period, private buffers.
fn reference_round(o: &FanoutOptions) -> Result<RoundResult, BenchRunError> {
    let ready = Arc::new(Barrier::new(o.subscribers as usize + 1));
    // The schedule's start, set before the barrier releases the readers.
    let t0 = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..o.subscribers)
        .map(|_| {
            let ready = ready.clone();
            let t0 = t0.clone();
            let (bytes, period, messages) = (o.bytes, o.period, o.messages);
            std::thread::spawn(move || {
                let mine = vec![7u8; bytes];
                ready.wait();
                let start = Monotonic::from_nanos(t0.load(Ordering::Acquire));
                let c0 = thread_cpu_ns();
                let mut bad_lines = 0;
                for seq in 0..messages {
                    wait_period(start, period, seq);
                    bad_lines += read_lines(&mine, 7);
                }
                RoundResult {
                    cpu_ns: thread_cpu_ns() - c0,
                    handled: u64::from(messages),
                    bad_lines,
                }
            })
        })
        .collect();
    let mut mine = vec![0u8; o.bytes];
    let start = Monotonic::now() + Duration::from_millis(1);
    t0.store(start.as_nanos(), Ordering::Release);
    ready.wait();
    let c0 = thread_cpu_ns();
    for seq in 0..o.messages {
        wait_period(start, o.period, seq);
        mine.fill(seq as u8);
        std::hint::black_box(&mine);
    }
    let mut total = RoundResult {
        cpu_ns: thread_cpu_ns() - c0,
        handled: 0,
        bad_lines: 0,
    };
    for r in readers {
        let r = r
            .join()
            .map_err(|_| sys_err_from("a reader thread", io::Error::other("panicked")))?;
        total.cpu_ns += r.cpu_ns;
        total.handled += r.handled;
        total.bad_lines += r.bad_lines;
    }
    Ok(total)
}

/// Runs the three arms in interleaved rounds (see the module's text).
pub fn fanout(
    shm: &Path,
    proc_root: &Path,
    o: &FanoutOptions,
) -> Result<FanoutReport, BenchRunError> {
    let rounds = o.rounds.max(1) as usize;
    let arm = |name: &str| Arm {
        name: name.into(),
        rounds: vec![None; rounds],
    };
    let mut arms = vec![
        arm("channel"),
        arm("private buffers"),
        arm("private buffers again"),
    ];
    if o.huge_shm.is_some() {
        arms.push(arm("channel on huge pages"));
    }
    let (mut lost, mut bad_lines, mut huge_kib) = (0u64, 0u64, 0u64);
    let per_message = |r: &RoundResult| r.cpu_ns as f64 / f64::from(o.messages.max(1));
    for round in 0..rounds {
        for a in harness::order(arms.len(), round) {
            let r = match (a, &o.huge_shm) {
                (1 | 2, _) => reference_round(o)?,
                (3, Some(dir)) => channel_round(o, dir, proc_root, &mut huge_kib)?,
                _ => channel_round(o, shm, proc_root, &mut 0)?,
            };
            if a == 0 || a == 3 {
                lost +=
                    (u64::from(o.messages) * u64::from(o.subscribers)).saturating_sub(r.handled);
            }
            bad_lines += r.bad_lines;
            arms[a].rounds[round] = Some(per_message(&r));
        }
    }
    let ratio = Ratio::of("CPU per message", &arms[0], &arms[1], Some(&arms[2]));
    let huge = (arms.len() > 3).then(|| arms.pop()).flatten();
    let huge_ratio = huge
        .as_ref()
        .and_then(|h| Ratio::of("CPU per message, huge pages", h, &arms[0], None));
    let mut arms = arms.into_iter();
    let (channel, reference, reference_again) = (
        arms.next().unwrap_or_default(),
        arms.next().unwrap_or_default(),
        arms.next().unwrap_or_default(),
    );
    Ok(FanoutReport {
        bytes: o.bytes,
        subscribers: o.subscribers,
        messages_per_round: o.messages,
        rounds: o.rounds.max(1),
        period_us: o.period.as_micros() as u64,
        within_10_percent: ratio.as_ref().is_some_and(|r| r.median <= 1.1),
        channel,
        reference,
        reference_again,
        ratio,
        huge_kib_seen: huge.as_ref().map(|_| huge_kib),
        huge,
        huge_ratio,
        lost,
        bad_lines,
    })
}
