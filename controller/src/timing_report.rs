//! Timing reports: what each event loop measured, published once a second
//! on its own channel `/rtdeploy/timing/<process>`, and read back by the
//! supervisor with [`read_latest`].
//!
//! The loop keeps fixed-size log histograms (no allocation on the handle
//! path) and, once per report period, folds each into a fixed-size binary
//! entry ([`RawReport`], a [`ShmSafe`] type published as bytes). Readers
//! turn it into the serde-serialisable [`TimingReport`].

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::channel::{Channel, ChannelFault, ChannelGeometry, ChannelOpenError};

/// Sub-buckets per power of two (4: about 19% resolution).
const SUB_BITS: u32 = 2;
const SUB: usize = 1 << SUB_BITS;
/// Buckets: values below 4 exactly, then 4 per power of two up to 2^63.
pub const BUCKETS: usize = SUB + (64 - SUB_BITS as usize) * SUB;

/// A log histogram of nanosecond values, fixed size, allocation-free.
#[derive(Clone, Copy, Debug)]
pub struct Histogram {
    counts: [u32; BUCKETS],
    n: u64,
    sum: u64,
    min: u64,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: [0; BUCKETS],
            n: 0,
            sum: 0,
            min: u64::MAX,
            max: 0,
        }
    }
}

fn bucket_of(v: u64) -> usize {
    if v < SUB as u64 {
        return v as usize;
    }
    let msb = 63 - v.leading_zeros(); // >= SUB_BITS
    let sub = ((v >> (msb - SUB_BITS)) & (SUB as u64 - 1)) as usize;
    SUB + (msb - SUB_BITS) as usize * SUB + sub
}

/// The largest value that falls in bucket `b`.
fn bucket_high(b: usize) -> u64 {
    if b < SUB {
        return b as u64;
    }
    let msb = ((b - SUB) / SUB) as u32 + SUB_BITS;
    let sub = ((b - SUB) % SUB) as u64;
    let low = (1u64 << msb) | (sub << (msb - SUB_BITS));
    low.saturating_add((1u64 << (msb - SUB_BITS)) - 1)
}

impl Histogram {
    #[inline]
    pub fn record(&mut self, v: u64) {
        let b = bucket_of(v);
        self.counts[b] = self.counts[b].saturating_add(1);
        self.n += 1;
        self.sum = self.sum.saturating_add(v);
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }
    pub fn count(&self) -> u64 {
        self.n
    }
    pub fn min(&self) -> u64 {
        if self.n == 0 {
            0
        } else {
            self.min
        }
    }
    pub fn max(&self) -> u64 {
        self.max
    }
    pub fn mean(&self) -> u64 {
        self.sum.checked_div(self.n).unwrap_or(0)
    }
    /// The value at quantile `q` (0..=1): the upper edge of its bucket,
    /// clamped to the largest value seen, so it never understates.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.n == 0 {
            return 0;
        }
        let rank = ((q * self.n as f64).ceil() as u64).clamp(1, self.n);
        let mut seen = 0u64;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c as u64;
            if seen >= rank {
                return bucket_high(b).min(self.max).max(self.min);
            }
        }
        self.max
    }
    pub fn clear(&mut self) {
        *self = Histogram::default();
    }
}

/// What kind of thing an entry measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    Watcher,
    Timer,
    Sender,
}

/// Live counters of one watcher, timer or sender inside a loop.
#[derive(Clone, Copy, Debug, Default)]
pub struct EntryStats {
    pub latency: Histogram,
    pub handler: Histogram,
    pub count: u64,
    pub eagain: u64,
    pub lost: u64,
    pub missed: u64,
    pub errors: u64,
    /// Messages found by the loop's own look at the index, not by a wake
    /// (a wake was lost or late).
    pub healed: u64,
    /// Faults of the channel (corrupt or truncated shared memory).
    pub faults: u64,
}

impl EntryStats {
    pub fn clear(&mut self) {
        *self = EntryStats::default();
    }
}

/// Most entries one report carries.
pub const MAX_ENTRIES: usize = 32;
const NAME_BYTES: usize = 48;
const REPORT_MAGIC: u64 = u64::from_le_bytes(*b"RTDTIME2");

crate::shm_struct! {
/// One entry in binary form.
#[derive(Debug)]
pub struct RawEntry {
    pub kind: u64,
    pub name: [u8; NAME_BYTES],
    pub count: u64,
    pub latency_min: u64,
    pub latency_avg: u64,
    pub latency_p99: u64,
    pub latency_max: u64,
    pub handler_avg: u64,
    pub handler_p99: u64,
    pub handler_max: u64,
    pub eagain: u64,
    pub lost: u64,
    pub missed: u64,
    pub errors: u64,
    pub total: u64,
    pub healed: u64,
    pub faults: u64,
}
}

crate::shm_struct! {
/// A report in binary form, as published.
#[derive(Debug)]
pub struct RawReport {
    pub magic: u64,
    pub pid: u64,
    pub seq: u64,
    pub time_ns: u64,
    pub period_ns: u64,
    /// 1 = io_uring futex, 2 = futex_waitv.
    pub backend: u64,
    pub process: [u8; 64],
    pub entries: u64,
    pub entry: [RawEntry; MAX_ENTRIES],
}
}

impl Default for RawReport {
    fn default() -> Self {
        RawReport {
            magic: REPORT_MAGIC,
            pid: 0,
            seq: 0,
            time_ns: 0,
            period_ns: 0,
            backend: 0,
            process: [0; 64],
            entries: 0,
            entry: [RawEntry {
                kind: 0,
                name: [0; NAME_BYTES],
                count: 0,
                latency_min: 0,
                latency_avg: 0,
                latency_p99: 0,
                latency_max: 0,
                handler_avg: 0,
                handler_p99: 0,
                handler_max: 0,
                eagain: 0,
                lost: 0,
                missed: 0,
                errors: 0,
                total: 0,
                healed: 0,
                faults: 0,
            }; MAX_ENTRIES],
        }
    }
}

/// Copies `s` into a NUL-padded byte array (truncating).
pub fn fill_name<const N: usize>(out: &mut [u8; N], s: &str) {
    *out = [0; N];
    let n = s.len().min(N);
    out[..n].copy_from_slice(&s.as_bytes()[..n]);
}

fn name_of(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

impl RawEntry {
    /// Folds live stats (the window since the last report) into `self`.
    pub fn fill(&mut self, kind: EntryKind, name: &str, s: &EntryStats, total: u64) {
        self.kind = match kind {
            EntryKind::Watcher => 1,
            EntryKind::Timer => 2,
            EntryKind::Sender => 3,
        };
        fill_name(&mut self.name, name);
        self.count = s.count;
        self.latency_min = s.latency.min();
        self.latency_avg = s.latency.mean();
        self.latency_p99 = s.latency.quantile(0.99);
        self.latency_max = s.latency.max();
        self.handler_avg = s.handler.mean();
        self.handler_p99 = s.handler.quantile(0.99);
        self.handler_max = s.handler.max();
        self.eagain = s.eagain;
        self.lost = s.lost;
        self.missed = s.missed;
        self.errors = s.errors;
        self.total = total;
        self.healed = s.healed;
        self.faults = s.faults;
    }
}

/// One watcher, timer or sender of a report (window = one report period).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EntryReport {
    pub kind: EntryKind,
    /// Channel name for watchers and senders, timer name for timers.
    pub name: String,
    /// Events handled (messages, timer firings, messages sent) in the window.
    pub count: u64,
    /// Since the loop started.
    pub total: u64,
    /// Send time (or deadline) to handler start, nanoseconds.
    pub latency_min_ns: u64,
    pub latency_avg_ns: u64,
    pub latency_p99_ns: u64,
    pub latency_max_ns: u64,
    pub handler_avg_ns: u64,
    pub handler_p99_ns: u64,
    pub handler_max_ns: u64,
    /// Futex waits that returned -EAGAIN (the word moved: more data).
    pub eagain: u64,
    /// Messages overwritten before the watcher read them.
    pub lost: u64,
    /// Timer periods skipped because the loop was late.
    pub missed: u64,
    /// Sends refused (retention, size or a fault of the channel).
    pub errors: u64,
    /// Messages the loop found by looking at the index itself because no
    /// wake came for them (a lost or late wake).
    #[serde(default)]
    pub healed: u64,
    /// Faults of the channel: corrupt or truncated shared memory.
    #[serde(default)]
    pub faults: u64,
}

/// A timing report as the supervisor reads it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimingReport {
    pub process: String,
    pub pid: u32,
    /// Reports published so far by this loop (1 for the first).
    pub seq: u64,
    /// CLOCK_MONOTONIC when published, nanoseconds.
    pub time_ns: u64,
    pub period_ns: u64,
    /// `io_uring-futex` or `futex_waitv`.
    pub backend: String,
    pub entries: Vec<EntryReport>,
}

impl TimingReport {
    /// Decodes a published report.
    pub fn from_raw(r: &RawReport) -> Option<TimingReport> {
        if r.magic != REPORT_MAGIC {
            return None;
        }
        let n = (r.entries as usize).min(MAX_ENTRIES);
        let entries = r.entry[..n]
            .iter()
            .filter_map(|e| {
                let kind = match e.kind {
                    1 => EntryKind::Watcher,
                    2 => EntryKind::Timer,
                    3 => EntryKind::Sender,
                    _ => return None,
                };
                Some(EntryReport {
                    kind,
                    name: name_of(&e.name),
                    count: e.count,
                    total: e.total,
                    latency_min_ns: e.latency_min,
                    latency_avg_ns: e.latency_avg,
                    latency_p99_ns: e.latency_p99,
                    latency_max_ns: e.latency_max,
                    handler_avg_ns: e.handler_avg,
                    handler_p99_ns: e.handler_p99,
                    handler_max_ns: e.handler_max,
                    eagain: e.eagain,
                    lost: e.lost,
                    missed: e.missed,
                    errors: e.errors,
                    healed: e.healed,
                    faults: e.faults,
                })
            })
            .collect();
        Some(TimingReport {
            process: name_of(&r.process),
            pid: r.pid as u32,
            seq: r.seq,
            time_ns: r.time_ns,
            period_ns: r.period_ns,
            backend: crate::event_loop::Backend::from_code(r.backend)
                .map_or("unknown", |b| b.name())
                .into(),
            entries,
        })
    }
}

/// The channel a process's loop publishes its reports on.
pub fn timing_channel_name(process: &str) -> String {
    format!("/rtdeploy/timing/{process}")
}

/// Geometry of a timing channel.
pub fn timing_geometry() -> ChannelGeometry {
    ChannelGeometry::new(std::mem::size_of::<RawReport>() as u64, 4, 2).with_subscribers(4)
}

/// Reading a timing report failed.
#[derive(Debug, thiserror::Error)]
pub enum TimingReadError {
    #[error("cannot open the timing channel of process `{process}`")]
    Open {
        process: String,
        source: ChannelOpenError,
    },
    #[error("timing channel {path} holds a message of {len} bytes that is not a timing report")]
    Garbled { path: String, len: usize },
    #[error("timing channel {path}: {fault}")]
    Fault { path: String, fault: ChannelFault },
}

/// The latest report process `process` published under `shm_dir`, or
/// `None` when it has published none yet.
///
/// The file belongs to another process and may hold anything: its geometry
/// is checked against [`timing_geometry`] before it is mapped (nothing is
/// prefaulted), the read is bounded, and a truncated file is an error, so
/// the caller (the supervisor's loop) never blocks or grows on it.
pub fn read_latest(shm_dir: &Path, process: &str) -> Result<Option<TimingReport>, TimingReadError> {
    let ch = Channel::open_to_inspect(shm_dir, &timing_channel_name(process), &timing_geometry())
        .map_err(|source| TimingReadError::Open {
        process: process.into(),
        source,
    })?;
    let mut r = ch.reader();
    let m = match r.latest() {
        Ok(Some(m)) => m,
        Ok(None) => return Ok(None),
        Err(fault) => {
            return Err(TimingReadError::Fault {
                path: ch.path().display().to_string(),
                fault,
            })
        }
    };
    let garbled = || TimingReadError::Garbled {
        path: ch.path().display().to_string(),
        len: m.data.len(),
    };
    let raw: RawReport = m.value().ok_or_else(garbled)?;
    TimingReport::from_raw(&raw).map(Some).ok_or_else(garbled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_values_in_order() {
        let mut last = 0;
        for v in [0u64, 1, 3, 4, 5, 7, 8, 100, 1000, 12345, 1 << 40, u64::MAX] {
            let b = bucket_of(v);
            assert!(b < BUCKETS);
            assert!(b >= last);
            last = b;
            assert!(
                bucket_high(b) >= v,
                "value {v} above its bucket's top {}",
                bucket_high(b)
            );
            if b > 0 {
                assert!(bucket_high(b - 1) < v, "value {v} belongs below bucket {b}");
            }
        }
    }

    #[test]
    fn quantiles_bound_the_data() {
        let mut h = Histogram::default();
        for v in 1..=1000u64 {
            h.record(v * 1000);
        }
        assert_eq!(h.count(), 1000);
        assert_eq!(h.min(), 1000);
        assert_eq!(h.max(), 1_000_000);
        assert_eq!(h.mean(), 500_500);
        let p99 = h.quantile(0.99);
        // True p99 is 990000; the bucket edge is at most ~19% above it.
        assert!((990_000..=1_000_000).contains(&p99), "{p99}");
        let p50 = h.quantile(0.5);
        assert!((500_000..=600_000).contains(&p50), "{p50}");
    }

    #[test]
    fn raw_round_trip() {
        let mut s = EntryStats::default();
        s.latency.record(5_000);
        s.latency.record(7_000);
        s.count = 2;
        s.eagain = 1;
        let mut raw = RawReport {
            entries: 1,
            backend: 1,
            ..RawReport::default()
        };
        fill_name(&mut raw.process, "talker");
        raw.entry[0].fill(EntryKind::Watcher, "/imu/raw", &s, 10);
        let back = TimingReport::from_raw(&raw).unwrap();
        assert_eq!(back.process, "talker");
        assert_eq!(back.backend, "io_uring-futex");
        let e = &back.entries[0];
        assert_eq!(
            (e.kind, e.name.as_str(), e.count, e.total, e.eagain),
            (EntryKind::Watcher, "/imu/raw", 2, 10, 1)
        );
        assert_eq!(
            (e.latency_min_ns, e.latency_max_ns, e.latency_avg_ns),
            (5_000, 7_000, 6_000)
        );
        let json = serde_json::to_string(&back).unwrap();
        let again: TimingReport = serde_json::from_str(&json).unwrap();
        assert_eq!(again, back);
    }
}
