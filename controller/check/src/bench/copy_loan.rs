//! Publishing by copy against publishing by loan, 64 B and 1 MiB, send
//! and receive timed apart, against a memcpy and a plain write timed in
//! the same run (part of `deploy bench publish`).

use super::*;

/// Settings of [`copy_and_loan`].
#[derive(Debug, Clone)]
pub struct CopyLoanOptions {
    /// Rounds over every case of every size, interleaved so that slow
    /// drifts of the machine hit all of them alike.
    pub rounds: u32,
    /// Timed samples of each case per round.
    pub samples: u32,
}

impl Default for CopyLoanOptions {
    fn default() -> Self {
        CopyLoanOptions {
            rounds: 20,
            samples: 100,
        }
    }
}

/// The message sizes [`copy_and_loan`] measures: a small message and a
/// large one (the size a camera frame or a point cloud slice takes).
pub const COPY_LOAN_SIZES: [usize; 2] = [SMALL, LARGE];
pub(super) const SMALL: usize = 64;
pub(super) const LARGE: usize = 1 << 20;

/// One case's time per message, nanoseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct CaseTime {
    pub median_ns: f64,
    pub p90_ns: f64,
}

/// The figures of one message size (nanoseconds per message).
#[derive(Debug, Clone, Serialize)]
pub struct SizeFigures {
    pub bytes: usize,
    /// Messages per timed sample: small messages are timed in batches so
    /// the clock reads do not weigh on them.
    pub per_sample: u32,
    /// Samples behind each figure.
    pub samples: u64,
    /// `copy_from_slice` of `bytes` into a prefaulted buffer: the
    /// reference a receive is held against.
    pub memcpy: CaseTime,
    /// The writer's own write: filling `bytes` of a plain prefaulted
    /// buffer. Whatever a send costs beyond it is the channel's.
    pub write: CaseTime,
    /// By copy: the writer fills its own buffer, then
    /// `Publisher::publish_value` copies it into the channel.
    pub copy_send: CaseTime,
    /// A subscriber taking the copied message: `Subscriber::next_message`
    /// (which copies it out of the shared slot) and a look at it in place
    /// (`Message::get`).
    pub copy_receive: CaseTime,
    /// By loan: `Publisher::loan`, the writer fills the slot in place,
    /// `Loan::send`.
    pub loan_send: CaseTime,
    /// The same receive, of the loaned message.
    pub loan_receive: CaseTime,
    /// Median send minus median write: what the channel adds.
    pub copy_send_beyond_write_ns: f64,
    pub loan_send_beyond_write_ns: f64,
    pub copy_send_per_write: f64,
    pub loan_send_per_write: f64,
    pub copy_receive_per_memcpy: f64,
    pub loan_receive_per_memcpy: f64,
    /// Loans that were staged instead of written in place (a reader of
    /// this process was copying the slot): 0 here, nothing else reads.
    pub loans_staged: u64,
    /// Messages received lost, short, or with other contents than sent: 0
    /// unless the channel misbehaved.
    pub bad_reads: u64,
}

/// The copy and loan comparison of `bench publish`.
#[derive(Debug, Clone, Serialize)]
pub struct CopyLoanReport {
    pub rounds: u32,
    pub samples_per_round: u32,
    /// The CPU the measuring thread was pinned to, if it could be.
    pub cpu: Option<usize>,
    pub sizes: Vec<SizeFigures>,
    /// For the 1 MiB message: a loaned send costs no copy beyond the
    /// writer's own write (it exceeds the plain write by less than half a
    /// 1 MiB memcpy).
    pub loan_send_without_copy: bool,
    /// For the 1 MiB message: both receives take at most 1.2 times the
    /// 1 MiB memcpy.
    pub receive_within_1_2x_memcpy: bool,
}

pub(super) fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

impl CopyLoanReport {
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "publishing by copy and by loan, send and receive apart, against memcpy measured in the same run: medians (p90) in ns per message, {} samples of each case over {} interleaved rounds{}",
            self.samples_per_round as u64 * self.rounds as u64,
            self.rounds,
            self.cpu.map_or(String::new(), |c| format!(", on CPU {c}"))
        );
        for s in &self.sizes {
            let _ = writeln!(
                out,
                "\n{} message ({} per timed sample):",
                size_text(s.bytes),
                match s.per_sample {
                    1 => "one message".to_string(),
                    n => format!("{n} messages"),
                }
            );
            let row = |out: &mut String, name: &str, t: &CaseTime, note: String| {
                let _ = writeln!(
                    out,
                    "  {:<56} {:>12} {:>12}  {}",
                    name,
                    format!("{:.1}", t.median_ns),
                    format!("({:.1})", t.p90_ns),
                    note
                );
            };
            let b = size_text(s.bytes);
            row(
                &mut out,
                &format!("memcpy {b} (copy_from_slice, prefaulted)"),
                &s.memcpy,
                "reference".into(),
            );
            row(
                &mut out,
                &format!("write {b} into a plain buffer (the writer's own)"),
                &s.write,
                "reference".into(),
            );
            row(
                &mut out,
                "copy: send (write own buffer + publish_value)",
                &s.copy_send,
                format!(
                    "{:.2}x the write, {:+.1} ns beyond it",
                    s.copy_send_per_write, s.copy_send_beyond_write_ns
                ),
            );
            row(
                &mut out,
                "copy: receive (next_message copies out, get)",
                &s.copy_receive,
                format!("{:.2}x memcpy", s.copy_receive_per_memcpy),
            );
            row(
                &mut out,
                "loan: send (loan, write in place, send)",
                &s.loan_send,
                format!(
                    "{:.2}x the write, {:+.1} ns beyond it",
                    s.loan_send_per_write, s.loan_send_beyond_write_ns
                ),
            );
            row(
                &mut out,
                "loan: receive (next_message copies out, get)",
                &s.loan_receive,
                format!("{:.2}x memcpy", s.loan_receive_per_memcpy),
            );
            if s.loans_staged > 0 || s.bad_reads > 0 {
                let _ = writeln!(
                    out,
                    "  {} loans staged instead of written in place, {} bad reads",
                    s.loans_staged, s.bad_reads
                );
            }
        }
        if let Some(l) = self.sizes.iter().find(|s| s.bytes == LARGE) {
            let _ = writeln!(
                out,
                "\n1 MiB loaned send: {:.1} ns, {:+.1} ns beyond writing 1 MiB into a plain buffer (a copy would add about {:.1} ns): {}",
                l.loan_send.median_ns,
                l.loan_send_beyond_write_ns,
                l.memcpy.median_ns,
                if self.loan_send_without_copy {
                    "no copy beyond the writer's own write"
                } else {
                    "MORE than the writer's own write (target missed)"
                }
            );
            let _ = writeln!(
                out,
                "1 MiB receive: {:.2}x (copied) and {:.2}x (loaned) a 1 MiB memcpy: {}",
                l.copy_receive_per_memcpy,
                l.loan_receive_per_memcpy,
                if self.receive_within_1_2x_memcpy {
                    "within the 1.2x target"
                } else {
                    "OVER the 1.2x target"
                }
            );
        }
        out
    }
}

pub(super) fn size_text(bytes: usize) -> String {
    if bytes >= 1 << 20 && bytes % (1 << 20) == 0 {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 10 && bytes % (1 << 10) == 0 {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} B")
    }
}

/// Median and 90th percentile of `v` (totals per sample) per message.
pub(super) fn case_time(v: &mut [u64], per_sample: u32) -> CaseTime {
    v.sort_unstable();
    let at = |q: f64| -> f64 {
        if v.is_empty() {
            return 0.0;
        }
        let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
        v[i] as f64 / per_sample.max(1) as f64
    };
    CaseTime {
        median_ns: at(0.5),
        p90_ns: at(0.9),
    }
}

/// A zeroed `[u8; N]` on the heap (not built on the stack), every page
/// touched.
pub(super) fn prefaulted<const N: usize>() -> Box<[u8; N]> {
    let mut b: Box<[u8; N]> = vec![0u8; N]
        .into_boxed_slice()
        .try_into()
        .unwrap_or_else(|_| unreachable!("a Vec of N bytes"));
    b.fill(1);
    b
}

/// The cases of one size, in the order each sample runs them.
pub(super) const MEMCPY: usize = 0;
pub(super) const WRITE: usize = 1;
pub(super) const COPY_SEND: usize = 2;
pub(super) const COPY_RECEIVE: usize = 3;
pub(super) const LOAN_SEND: usize = 4;
pub(super) const LOAN_RECEIVE: usize = 5;

/// The state of one message size across rounds.
pub(super) struct SizeBench<const N: usize> {
    pub(super) publisher: controller::channel::Publisher,
    pub(super) subscriber: controller::channel::Subscriber,
    pub(super) src: Box<[u8; N]>,
    pub(super) dst: Box<[u8; N]>,
    pub(super) plain: Box<[u8; N]>,
    pub(super) own: Box<[u8; N]>,
    pub(super) per_sample: u32,
    pub(super) fill: u8,
    pub(super) times: [Vec<u64>; 6],
    pub(super) loans_staged: u64,
    pub(super) bad_reads: u64,
}

impl<const N: usize> SizeBench<N> {
    pub(super) fn new(dir: &Path, proc_root: &Path) -> Result<Self, BenchRunError> {
        // Small messages are timed 64 KiB at a time; the ring holds one
        // sample's messages, so the subscriber loses none.
        let per_sample = (65536 / N).max(1) as u32;
        let geom = ChannelGeometry::new(N as u64, per_sample as u64, 1).with_subscribers(1);
        let ch = channel_for(dir, &format!("/bench/copy-loan-{N}"), &geom, proc_root)?;
        let mut publisher = publisher_for(&ch, dir, proc_root, controller::WakeClass::BestEffort)?;
        publisher.reserve_loans::<[u8; N]>();
        let subscriber =
            ch.subscriber(proc_root)
                .map_err(|source| BenchRunError::ChannelAttach {
                    dir: dir.into(),
                    source,
                })?;
        Ok(SizeBench {
            publisher,
            subscriber,
            src: prefaulted(),
            dst: prefaulted(),
            plain: prefaulted(),
            own: prefaulted(),
            per_sample,
            fill: 0,
            times: Default::default(),
            loans_staged: 0,
            bad_reads: 0,
        })
    }

    /// One sample of every case; `record` false for the warm-up.
    pub(super) fn sample(&mut self, record: bool) -> Result<(), BenchRunError> {
        let per = self.per_sample;
        let mut t = [0u64; 6];
        let mut mark = monotonic_ns();
        let mut lap = |case: usize| {
            let now = monotonic_ns();
            t[case] = now - mark;
            mark = now;
        };
        for _ in 0..per {
            self.dst.copy_from_slice(&self.src[..]);
            std::hint::black_box(&mut self.dst);
        }
        lap(MEMCPY);
        for _ in 0..per {
            self.fill = self.fill.wrapping_add(1);
            self.plain.fill(self.fill);
            std::hint::black_box(&mut self.plain);
        }
        lap(WRITE);
        let first = self.fill.wrapping_add(1);
        for _ in 0..per {
            self.fill = self.fill.wrapping_add(1);
            self.own.fill(self.fill);
            self.publisher
                .publish_value(&*self.own)
                .map_err(|source| BenchRunError::Publish {
                    what: "a copied publish",
                    bytes: N,
                    source,
                })?;
        }
        lap(COPY_SEND);
        // Each receive checks its message against what was sent.
        for k in 0..per {
            self.receive_one(first.wrapping_add(k as u8));
        }
        lap(COPY_RECEIVE);
        let first = self.fill.wrapping_add(1);
        for _ in 0..per {
            self.fill = self.fill.wrapping_add(1);
            let mut loan =
                self.publisher
                    .loan::<[u8; N]>()
                    .map_err(|source| BenchRunError::Publish {
                        what: "a loan",
                        bytes: N,
                        source,
                    })?;
            if !loan.in_place() {
                self.loans_staged += 1;
            }
            loan.fill(self.fill);
            loan.send().map_err(|source| BenchRunError::Publish {
                what: "a loaned send",
                bytes: N,
                source,
            })?;
        }
        lap(LOAN_SEND);
        for k in 0..per {
            self.receive_one(first.wrapping_add(k as u8));
        }
        lap(LOAN_RECEIVE);
        if record {
            for (v, x) in self.times.iter_mut().zip(t) {
                v.push(x);
            }
        }
        Ok(())
    }

    /// Reads the next message, expected to be `N` bytes of `fill`.
    #[inline(always)]
    pub(super) fn receive_one(&mut self, fill: u8) {
        match self.subscriber.next_message() {
            Ok(Some(m)) => {
                let ok = m.lost_before == 0
                    && m.get::<[u8; N]>()
                        .is_some_and(|v| v[0] == fill && v[N - 1] == fill);
                if !ok {
                    self.bad_reads += 1;
                }
                std::hint::black_box(m.data);
            }
            _ => self.bad_reads += 1,
        }
    }

    pub(super) fn figures(mut self) -> SizeFigures {
        let per = self.per_sample;
        let samples = self.times[0].len() as u64;
        let [memcpy, write, copy_send, copy_receive, loan_send, loan_receive] =
            self.times.each_mut().map(|v| case_time(v, per));
        SizeFigures {
            bytes: N,
            per_sample: per,
            samples,
            memcpy,
            write,
            copy_send,
            copy_receive,
            loan_send,
            loan_receive,
            copy_send_beyond_write_ns: copy_send.median_ns - write.median_ns,
            loan_send_beyond_write_ns: loan_send.median_ns - write.median_ns,
            copy_send_per_write: ratio(copy_send.median_ns, write.median_ns),
            loan_send_per_write: ratio(loan_send.median_ns, write.median_ns),
            copy_receive_per_memcpy: ratio(copy_receive.median_ns, memcpy.median_ns),
            loan_receive_per_memcpy: ratio(loan_receive.median_ns, memcpy.median_ns),
            loans_staged: self.loans_staged,
            bad_reads: self.bad_reads,
        }
    }
}

/// Publishes a 64 B and a 1 MiB message by copy (`publish_value`) and by
/// loan (written in place, then sent) on channels with slots of that
/// size, times send and receive apart, and times, in the same run and
/// interleaved with them, a `memcpy` and a plain write of the same size:
/// what a send costs beyond the writer's own write, and what a receive
/// costs against a memcpy. One thread, pinned to one CPU where allowed,
/// sends and then receives each sample's messages (the subscriber is in
/// the same process: the figures are the copies, not a cross-CPU
/// transfer).
pub fn copy_and_loan(
    shm_dir: &Path,
    proc_root: &Path,
    opts: &CopyLoanOptions,
) -> Result<CopyLoanReport, BenchRunError> {
    let dir = bench_dir(shm_dir)?;
    let _restore = SchedRestore(rt::sched_state().ok());
    let cpu = rt::sched_state()
        .ok()
        .and_then(|s| s.cpus.max())
        .map(|c| c as usize)
        .filter(|&c| pin_to(c));
    let mut small = SizeBench::<SMALL>::new(dir.path(), proc_root)?;
    let mut large = SizeBench::<LARGE>::new(dir.path(), proc_root)?;
    // Warm-up: page tables, caches and branch predictors, not recorded.
    for _ in 0..opts.samples.clamp(1, 10) {
        small.sample(false)?;
        large.sample(false)?;
    }
    let rounds = opts.rounds.max(1);
    let samples = opts.samples.max(1);
    for _ in 0..rounds {
        for _ in 0..samples {
            small.sample(true)?;
        }
        for _ in 0..samples {
            large.sample(true)?;
        }
    }
    let sizes = vec![small.figures(), large.figures()];
    let l = &sizes[1];
    let loan_send_without_copy = l.loan_send_beyond_write_ns < 0.5 * l.memcpy.median_ns;
    let receive_within_1_2x_memcpy =
        l.copy_receive_per_memcpy <= 1.2 && l.loan_receive_per_memcpy <= 1.2;
    Ok(CopyLoanReport {
        rounds,
        samples_per_round: samples,
        cpu,
        sizes,
        loan_send_without_copy,
        receive_within_1_2x_memcpy,
    })
}
