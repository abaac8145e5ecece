//! Fixed-size latency histograms that live in shared memory.
//!
//! A [`Histogram`] is a plain `repr(C)` block of `AtomicU64`s, so the
//! measuring side (a real-time thread, or a worker process mapping the same
//! file) records with a handful of relaxed atomic adds and never allocates.
//! Two bucket sets are kept side by side:
//!
//! - a log-scale set (32 sub-buckets per power of two of nanoseconds, so any
//!   value is placed within 1/32 = 3.1 % of itself) from which percentiles
//!   and the picture are drawn, over the whole `u64` range;
//! - a linear set of one bucket per microsecond up to [`LINEAR_US`], the
//!   shape cyclictest's `--histogram` file has, with an overflow count.
//!
//! [`Summary`] is the owned, heap-side copy taken after the run.

#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use controller::shm::ShmAtomic;

/// Sub-buckets per power of two (a power of two itself).
const SUB_BITS: u32 = 5;
const SUB: u64 = 1 << SUB_BITS;
/// Log-scale buckets: values below `SUB` each get their own, then `SUB`
/// per power of two up to 2^63.
pub const LOG_BUCKETS: usize = (SUB + (64 - SUB_BITS as u64) * SUB) as usize;
/// Linear one-microsecond buckets (cyclictest's histogram file).
pub const LINEAR_US: usize = 10_000;

/// The log-scale bucket of a value in nanoseconds.
#[inline]
pub fn log_bucket(ns: u64) -> usize {
    if ns < SUB {
        return ns as usize;
    }
    let e = 63 - ns.leading_zeros(); // >= SUB_BITS
    let sub = (ns >> (e - SUB_BITS)) & (SUB - 1);
    (SUB + (e - SUB_BITS) as u64 * SUB + sub) as usize
}

/// The smallest value in a log-scale bucket.
pub fn log_bucket_low(b: usize) -> u64 {
    let b = b as u64;
    if b < SUB {
        return b;
    }
    let e = (b - SUB) / SUB + SUB_BITS as u64;
    let sub = (b - SUB) % SUB;
    (1u64 << e) | (sub << (e - SUB_BITS as u64))
}

/// The largest value in a log-scale bucket.
pub fn log_bucket_high(b: usize) -> u64 {
    if b + 1 >= LOG_BUCKETS {
        u64::MAX
    } else {
        log_bucket_low(b + 1) - 1
    }
}

/// One measurement's histogram, in shared memory or on the heap.
///
/// Every field is updated with `Relaxed` atomics: each is an independent
/// counter (or running min/max) that is read only after the writers have
/// stopped (a process exit or a thread join, both of which synchronise), or
/// read live only for the progress display, where a slightly stale value is
/// fine.
#[repr(C)]
pub struct Histogram {
    pub count: AtomicU64,
    pub sum_ns: AtomicU64,
    /// `u64::MAX - min` so that an all-zero histogram means "no sample".
    pub min_inv: AtomicU64,
    pub max_ns: AtomicU64,
    pub over_100us: AtomicU64,
    pub over_1ms: AtomicU64,
    pub linear_overflow: AtomicU64,
    /// Errors the measuring side counted (failed sends, lost messages).
    pub errors: AtomicU64,
    pub log: [AtomicU64; LOG_BUCKETS],
    pub linear: [AtomicU64; LINEAR_US],
}
// SAFETY: repr(C), only AtomicU64 fields and arrays of them: no padding, no
// pointers, no Drop, valid for every bit pattern (all zero = empty).
unsafe impl ShmAtomic for Histogram {}

impl Histogram {
    /// An empty histogram on the heap (allocated once, before measuring).
    pub fn boxed() -> Box<Histogram> {
        let v = vec![Histogram {
            count: AtomicU64::new(0),
            sum_ns: AtomicU64::new(0),
            min_inv: AtomicU64::new(0),
            max_ns: AtomicU64::new(0),
            over_100us: AtomicU64::new(0),
            over_1ms: AtomicU64::new(0),
            linear_overflow: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            log: std::array::from_fn(|_| AtomicU64::new(0)),
            linear: std::array::from_fn(|_| AtomicU64::new(0)),
        }];
        v.into_iter().next().map(Box::new).expect("one element")
    }

    /// Records one sample: no allocation, no lock, a few relaxed atomics.
    #[inline]
    pub fn record(&self, ns: u64) {
        // Relaxed everywhere: see the type's comment.
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
        self.min_inv.fetch_max(u64::MAX - ns, Ordering::Relaxed);
        self.max_ns.fetch_max(ns, Ordering::Relaxed);
        if ns > 100_000 {
            self.over_100us.fetch_add(1, Ordering::Relaxed);
        }
        if ns > 1_000_000 {
            self.over_1ms.fetch_add(1, Ordering::Relaxed);
        }
        self.log[log_bucket(ns)].fetch_add(1, Ordering::Relaxed);
        let us = (ns / 1000) as usize;
        if us < LINEAR_US {
            self.linear[us].fetch_add(1, Ordering::Relaxed);
        } else {
            self.linear_overflow.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Empties the histogram; only while no writer runs (between two
    /// runs, with the workers reaped).
    pub fn reset(&self) {
        // Relaxed: no writer runs; the next writers are started after
        // this (process creation orders it).
        let z = |a: &AtomicU64| a.store(0, Ordering::Relaxed);
        for a in [
            &self.count,
            &self.sum_ns,
            &self.min_inv,
            &self.max_ns,
            &self.over_100us,
            &self.over_1ms,
            &self.linear_overflow,
            &self.errors,
        ] {
            z(a);
        }
        self.log.iter().for_each(z);
        self.linear.iter().for_each(z);
    }

    /// Counts an error on the measuring side.
    #[inline]
    pub fn error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed); // an independent counter
    }

    /// The live worst case and count (for progress display).
    pub fn live(&self) -> (u64, u64) {
        // Relaxed: a display value, see the type's comment.
        (
            self.count.load(Ordering::Relaxed),
            self.max_ns.load(Ordering::Relaxed),
        )
    }

    /// An owned copy, taken after the writers stopped.
    pub fn summary(&self) -> Summary {
        // Relaxed loads: the writers stopped and were joined/reaped first.
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let count = ld(&self.count);
        let min_inv = ld(&self.min_inv);
        Summary {
            count,
            sum_ns: ld(&self.sum_ns),
            min_ns: if count == 0 { 0 } else { u64::MAX - min_inv },
            max_ns: ld(&self.max_ns),
            over_100us: ld(&self.over_100us),
            over_1ms: ld(&self.over_1ms),
            errors: ld(&self.errors),
            log: self.log.iter().map(ld).collect(),
            linear: self.linear.iter().map(ld).collect(),
            linear_overflow: ld(&self.linear_overflow),
        }
    }
}

/// A histogram copied out after the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub count: u64,
    pub sum_ns: u64,
    pub min_ns: u64,
    pub max_ns: u64,
    pub over_100us: u64,
    pub over_1ms: u64,
    pub errors: u64,
    /// [`LOG_BUCKETS`] counts.
    pub log: Vec<u64>,
    /// [`LINEAR_US`] counts, one per microsecond.
    pub linear: Vec<u64>,
    pub linear_overflow: u64,
}

impl Summary {
    /// An empty summary.
    pub fn empty() -> Summary {
        Summary {
            count: 0,
            sum_ns: 0,
            min_ns: 0,
            max_ns: 0,
            over_100us: 0,
            over_1ms: 0,
            errors: 0,
            log: vec![0; LOG_BUCKETS],
            linear: vec![0; LINEAR_US],
            linear_overflow: 0,
        }
    }

    /// The value at quantile `q` (0..=1): the upper edge of the log bucket
    /// holding that rank, never above the recorded maximum nor below the
    /// minimum (so the error is at most one bucket, 3.1 %).
    pub fn quantile(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        if rank == 1 {
            return self.min_ns;
        }
        let mut seen = 0;
        for (b, &n) in self.log.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return log_bucket_high(b).clamp(self.min_ns, self.max_ns);
            }
        }
        self.max_ns
    }

    /// Mean in nanoseconds.
    pub fn mean_ns(&self) -> u64 {
        self.sum_ns.checked_div(self.count).unwrap_or(0)
    }

    /// Adds another summary's samples to this one.
    pub fn merge(&mut self, o: &Summary) {
        if o.count > 0 {
            self.min_ns = if self.count == 0 {
                o.min_ns
            } else {
                self.min_ns.min(o.min_ns)
            };
        }
        self.count += o.count;
        self.sum_ns += o.sum_ns;
        self.max_ns = self.max_ns.max(o.max_ns);
        self.over_100us += o.over_100us;
        self.over_1ms += o.over_1ms;
        self.errors += o.errors;
        self.linear_overflow += o.linear_overflow;
        for (a, b) in self.log.iter_mut().zip(&o.log) {
            *a += b;
        }
        for (a, b) in self.linear.iter_mut().zip(&o.linear) {
            *a += b;
        }
    }

    /// Non-empty log buckets as `(low_ns, high_ns, count)`.
    pub fn log_buckets(&self) -> Vec<LogBucket> {
        self.log
            .iter()
            .enumerate()
            .filter(|(_, &n)| n > 0)
            .map(|(b, &n)| LogBucket {
                low_ns: log_bucket_low(b),
                high_ns: log_bucket_high(b),
                count: n,
            })
            .collect()
    }
}

/// One non-empty bucket of the log-scale histogram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LogBucket {
    pub low_ns: u64,
    pub high_ns: u64,
    pub count: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_the_range_without_gaps() {
        assert_eq!(log_bucket(0), 0);
        assert_eq!(log_bucket(31), 31);
        assert_eq!(log_bucket(32), 32);
        assert_eq!(log_bucket(u64::MAX), LOG_BUCKETS - 1);
        for b in 0..LOG_BUCKETS - 1 {
            assert_eq!(log_bucket_high(b) + 1, log_bucket_low(b + 1), "bucket {b}");
            assert_eq!(log_bucket(log_bucket_low(b)), b);
            assert_eq!(log_bucket(log_bucket_high(b)), b);
        }
    }

    #[test]
    fn bucket_width_is_within_one_thirty_second() {
        for v in [100u64, 1_000, 12_345, 1_000_000, 123_456_789] {
            let b = log_bucket(v);
            let w = log_bucket_high(b) - log_bucket_low(b) + 1;
            assert!(w * 32 <= v, "value {v} width {w}");
        }
    }

    #[test]
    fn summary_counts_and_quantiles() {
        let h = Histogram::boxed();
        for us in 1..=1000u64 {
            h.record(us * 1000);
        }
        h.record(5_000_000);
        h.record(20_000_000);
        let s = h.summary();
        assert_eq!(s.count, 1002);
        assert_eq!(s.min_ns, 1000);
        assert_eq!(s.max_ns, 20_000_000);
        assert_eq!(s.over_100us, 902);
        assert_eq!(s.over_1ms, 2);
        assert_eq!(s.linear[1], 1);
        assert_eq!(s.linear[999], 1);
        assert_eq!(s.linear[5000], 1);
        assert_eq!(s.linear_overflow, 1);
        let p50 = s.quantile(0.5);
        assert!((490_000..=520_000).contains(&p50), "p50 {p50}");
        assert_eq!(s.quantile(1.0), 20_000_000);
        assert_eq!(s.quantile(0.0), 1000);
    }
}
