//! Timing reports: what each event loop measured, published once a second
//! on its own channel `/rtdeploy/timing/<process>`, and read back by the
//! supervisor with [`read_latest`].
//!
//! The loop keeps fixed-size log histograms (no allocation on the handle
//! path): per entry one for the report period's wakeup latency, one for
//! its handler runs and one for the wakeup latency since the loop started.
//! Once per report period it folds them into a fixed-size binary entry
//! ([`RawReport`], a [`ShmSafe`] type published as bytes). Readers turn it
//! into the serde-serialisable [`TimingReport`].
//!
//! # Layouts
//!
//! The report's first word names its layout (`RTDTIME4` now: the loop's
//! wake class and each watcher's cross-class deliveries). Logs keep
//! reports of earlier layouts, and [`TimingReport::decode`] and
//! [`read_latest`] also read `RTDTIME3` (no wake class, no cross-class
//! figures) and `RTDTIME2` (no median, nothing since start either), each
//! on its own channel geometry, with what they lack `None`, and name any
//! other layout as one they do not know.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::channel::{Channel, ChannelFault, ChannelGeometry, ChannelOpenError};

/// Sub-buckets per power of two (4: about 19% resolution).
const SUB_BITS: u32 = 2;
const SUB: usize = 1 << SUB_BITS;
/// Buckets: values below 4 exactly, then 4 per power of two up to 2^63.
pub const BUCKETS: usize = SUB + (64 - SUB_BITS as usize) * SUB;

/// A log histogram of nanosecond values, fixed size, allocation-free.
/// Counts are 64-bit: the since-start histogram of a 10 kHz loop would
/// fill a 32-bit bucket in five days.
#[derive(Clone, Copy, Debug)]
pub struct Histogram {
    counts: [u64; BUCKETS],
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
            seen = seen.saturating_add(c);
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

/// Live counters of one watcher, timer or sender inside a loop: the
/// current report period's, and the wakeup latency since the loop started.
#[derive(Clone, Copy, Debug, Default)]
pub struct EntryStats {
    pub latency: Histogram,
    pub handler: Histogram,
    /// Every wakeup latency since the loop started (kept by
    /// [`EntryStats::new_period`]).
    pub latency_since_start: Histogram,
    pub count: u64,
    pub eagain: u64,
    pub lost: u64,
    pub missed: u64,
    pub errors: u64,
    /// Messages of the loop's own wake class found by its own look at the
    /// index (a timeout, the wake check), not by a wake, although they
    /// were there before its sleep ended: a wake was lost or late.
    pub healed: u64,
    /// Faults of the channel (corrupt or truncated shared memory).
    pub faults: u64,
    /// Messages handled whose publisher was of the other wake class (see
    /// [`crate::wake`]), and their wakeup latency.
    pub cross_class: u64,
    pub cross_latency: Histogram,
}

impl EntryStats {
    /// Counts one handled message of a publisher of the other wake class
    /// (after [`EntryStats::record`]).
    #[inline]
    pub fn record_cross_class(&mut self, latency_ns: u64) {
        self.cross_class += 1;
        self.cross_latency.record(latency_ns);
    }

    /// Records one handled event: its wakeup latency (in the period's and
    /// the since-start histograms) and its handler run.
    #[inline]
    pub fn record(&mut self, latency_ns: u64, handler_ns: u64) {
        self.latency.record(latency_ns);
        self.latency_since_start.record(latency_ns);
        self.handler.record(handler_ns);
        self.count += 1;
    }

    /// Starts a new report period: every figure back to zero but the
    /// since-start histogram.
    pub fn new_period(&mut self) {
        *self = EntryStats {
            latency_since_start: self.latency_since_start,
            ..EntryStats::default()
        };
    }
}

/// Most entries one report carries.
pub const MAX_ENTRIES: usize = 32;
const NAME_BYTES: usize = 48;
/// The layout published now.
pub const REPORT_MAGIC: u64 = u64::from_le_bytes(*b"RTDTIME4");
/// The layout before wake classes.
pub const REPORT_MAGIC_V3: u64 = u64::from_le_bytes(*b"RTDTIME3");
/// The layout before the median and since-start figures.
pub const REPORT_MAGIC_V2: u64 = u64::from_le_bytes(*b"RTDTIME2");
/// What every layout's magic starts with.
const MAGIC_PREFIX: &[u8; 7] = b"RTDTIME";

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
    /// The period's median wakeup latency.
    pub latency_p50: u64,
    /// Wakeup latency since the loop started.
    pub since_start_latency_p50: u64,
    pub since_start_latency_p99: u64,
    pub since_start_latency_max: u64,
    /// Messages of the window from publishers of the other wake class,
    /// and their wakeup latency's p99 and longest.
    pub cross_class: u64,
    pub cross_class_p99: u64,
    pub cross_class_max: u64,
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
    /// [`crate::event_loop::Backend::code`].
    pub backend: u64,
    /// The loop's wake class: 1 real-time, 2 best-effort (0 unknown).
    pub class: u64,
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
            class: 0,
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
                latency_p50: 0,
                since_start_latency_p50: 0,
                since_start_latency_p99: 0,
                since_start_latency_max: 0,
                cross_class: 0,
                cross_class_p99: 0,
                cross_class_max: 0,
            }; MAX_ENTRIES],
        }
    }
}

/// The layout before wake classes (`RTDTIME3`): read, never written.
mod v3 {
    use super::{MAX_ENTRIES, NAME_BYTES};

    crate::shm_struct! {
    #[derive(Debug)]
    pub struct RawEntryV3 {
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
        pub latency_p50: u64,
        pub since_start_latency_p50: u64,
        pub since_start_latency_p99: u64,
        pub since_start_latency_max: u64,
    }
    }

    crate::shm_struct! {
    #[derive(Debug)]
    pub struct RawReportV3 {
        pub magic: u64,
        pub pid: u64,
        pub seq: u64,
        pub time_ns: u64,
        pub period_ns: u64,
        pub backend: u64,
        pub process: [u8; 64],
        pub entries: u64,
        pub entry: [RawEntryV3; MAX_ENTRIES],
    }
    }
}
use v3::RawReportV3;

/// The previous layout (`RTDTIME2`), as controllers built before the
/// median and the since-start figures publish it: read, never written.
mod v2 {
    use super::{MAX_ENTRIES, NAME_BYTES};

    crate::shm_struct! {
    #[derive(Debug)]
    pub struct RawEntryV2 {
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
    #[derive(Debug)]
    pub struct RawReportV2 {
        pub magic: u64,
        pub pid: u64,
        pub seq: u64,
        pub time_ns: u64,
        pub period_ns: u64,
        pub backend: u64,
        pub process: [u8; 64],
        pub entries: u64,
        pub entry: [RawEntryV2; MAX_ENTRIES],
    }
    }
}
use v2::RawReportV2;

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
        self.latency_p50 = s.latency.quantile(0.5);
        self.latency_p99 = s.latency.quantile(0.99);
        self.latency_max = s.latency.max();
        self.since_start_latency_p50 = s.latency_since_start.quantile(0.5);
        self.since_start_latency_p99 = s.latency_since_start.quantile(0.99);
        self.since_start_latency_max = s.latency_since_start.max();
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
        self.cross_class = s.cross_class;
        self.cross_class_p99 = s.cross_latency.quantile(0.99);
        self.cross_class_max = s.cross_latency.max();
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
    /// The median (`None` from a report of the previous layout).
    #[serde(default)]
    pub latency_p50_ns: Option<u64>,
    pub latency_p99_ns: u64,
    pub latency_max_ns: u64,
    /// Wakeup latency since the loop started: median, 99th percentile,
    /// longest (`None` from a report of the previous layout).
    #[serde(default)]
    pub since_start_latency_p50_ns: Option<u64>,
    #[serde(default)]
    pub since_start_latency_p99_ns: Option<u64>,
    #[serde(default)]
    pub since_start_latency_max_ns: Option<u64>,
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
    /// Messages from publishers of the other wake class (see
    /// [`crate::wake`]), with the p99 and longest of their wakeup latency
    /// (`None` from a report of an earlier layout).
    #[serde(default)]
    pub cross_class: Option<u64>,
    #[serde(default)]
    pub cross_class_p99_ns: Option<u64>,
    #[serde(default)]
    pub cross_class_max_ns: Option<u64>,
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
    /// `io_uring-futex`, `futex_waitv` or `doorbell`.
    pub backend: String,
    /// The loop's wake class (`real-time`, `best-effort`; `None` from a
    /// report of an earlier layout).
    #[serde(default)]
    pub class: Option<crate::wake::WakeClass>,
    /// The binary layout it was published in: 4, or 3 or 2 from a
    /// controller built against an earlier runtime.
    #[serde(default = "current_layout")]
    pub layout: u32,
    pub entries: Vec<EntryReport>,
}

fn current_layout() -> u32 {
    LAYOUT
}

/// The layout version [`REPORT_MAGIC`] names.
pub const LAYOUT: u32 = 4;
/// The first layout with the median and the since-start figures (reports
/// of earlier ones show those as `-`).
pub const LAYOUT_WITH_MEDIANS: u32 = 3;

fn kind_of(code: u64) -> Option<EntryKind> {
    match code {
        1 => Some(EntryKind::Watcher),
        2 => Some(EntryKind::Timer),
        3 => Some(EntryKind::Sender),
        _ => None,
    }
}

/// The wake class a report's code stands for.
fn class_of(code: u64) -> Option<crate::wake::WakeClass> {
    match code {
        1 => Some(crate::wake::WakeClass::RealTime),
        2 => Some(crate::wake::WakeClass::BestEffort),
        _ => None,
    }
}

/// The code a report carries for a wake class.
pub fn class_code(class: crate::wake::WakeClass) -> u64 {
    match class {
        crate::wake::WakeClass::RealTime => 1,
        crate::wake::WakeClass::BestEffort => 2,
    }
}

fn backend_name(code: u64) -> String {
    crate::event_loop::Backend::from_code(code)
        .map_or("unknown", |b| b.name())
        .into()
}

/// Why published bytes are not a report this reader can decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportDecodeError {
    #[error("a timing report in layout {magic}, which this reader does not know (it reads RTDTIME4, RTDTIME3 and RTDTIME2)")]
    UnknownLayout { magic: String },
    #[error("{len} bytes that are not a timing report")]
    Garbled { len: usize },
}

impl TimingReport {
    /// Decodes a published report of the current layout.
    pub fn from_raw(r: &RawReport) -> Option<TimingReport> {
        if r.magic != REPORT_MAGIC {
            return None;
        }
        let n = (r.entries as usize).min(MAX_ENTRIES);
        let entries = r.entry[..n]
            .iter()
            .filter_map(|e| {
                Some(EntryReport {
                    kind: kind_of(e.kind)?,
                    name: name_of(&e.name),
                    count: e.count,
                    total: e.total,
                    latency_min_ns: e.latency_min,
                    latency_avg_ns: e.latency_avg,
                    latency_p50_ns: Some(e.latency_p50),
                    latency_p99_ns: e.latency_p99,
                    latency_max_ns: e.latency_max,
                    since_start_latency_p50_ns: Some(e.since_start_latency_p50),
                    since_start_latency_p99_ns: Some(e.since_start_latency_p99),
                    since_start_latency_max_ns: Some(e.since_start_latency_max),
                    handler_avg_ns: e.handler_avg,
                    handler_p99_ns: e.handler_p99,
                    handler_max_ns: e.handler_max,
                    eagain: e.eagain,
                    lost: e.lost,
                    missed: e.missed,
                    errors: e.errors,
                    healed: e.healed,
                    faults: e.faults,
                    cross_class: Some(e.cross_class),
                    cross_class_p99_ns: Some(e.cross_class_p99),
                    cross_class_max_ns: Some(e.cross_class_max),
                })
            })
            .collect();
        Some(TimingReport {
            process: name_of(&r.process),
            pid: r.pid as u32,
            seq: r.seq,
            time_ns: r.time_ns,
            period_ns: r.period_ns,
            backend: backend_name(r.backend),
            class: class_of(r.class),
            layout: LAYOUT,
            entries,
        })
    }

    /// Decodes a report of the layout before wake classes: what it has,
    /// the class and the cross-class figures `None`.
    fn from_raw_v3(r: &RawReportV3) -> TimingReport {
        let n = (r.entries as usize).min(MAX_ENTRIES);
        let entries = r.entry[..n]
            .iter()
            .filter_map(|e| {
                Some(EntryReport {
                    kind: kind_of(e.kind)?,
                    name: name_of(&e.name),
                    count: e.count,
                    total: e.total,
                    latency_min_ns: e.latency_min,
                    latency_avg_ns: e.latency_avg,
                    latency_p50_ns: Some(e.latency_p50),
                    latency_p99_ns: e.latency_p99,
                    latency_max_ns: e.latency_max,
                    since_start_latency_p50_ns: Some(e.since_start_latency_p50),
                    since_start_latency_p99_ns: Some(e.since_start_latency_p99),
                    since_start_latency_max_ns: Some(e.since_start_latency_max),
                    handler_avg_ns: e.handler_avg,
                    handler_p99_ns: e.handler_p99,
                    handler_max_ns: e.handler_max,
                    eagain: e.eagain,
                    lost: e.lost,
                    missed: e.missed,
                    errors: e.errors,
                    healed: e.healed,
                    faults: e.faults,
                    cross_class: None,
                    cross_class_p99_ns: None,
                    cross_class_max_ns: None,
                })
            })
            .collect();
        TimingReport {
            process: name_of(&r.process),
            pid: r.pid as u32,
            seq: r.seq,
            time_ns: r.time_ns,
            period_ns: r.period_ns,
            backend: backend_name(r.backend),
            class: None,
            layout: 3,
            entries,
        }
    }

    /// Decodes a report of the previous layout: what it has, the median
    /// and since-start figures `None`.
    fn from_raw_v2(r: &RawReportV2) -> TimingReport {
        let n = (r.entries as usize).min(MAX_ENTRIES);
        let entries = r.entry[..n]
            .iter()
            .filter_map(|e| {
                Some(EntryReport {
                    kind: kind_of(e.kind)?,
                    name: name_of(&e.name),
                    count: e.count,
                    total: e.total,
                    latency_min_ns: e.latency_min,
                    latency_avg_ns: e.latency_avg,
                    latency_p50_ns: None,
                    latency_p99_ns: e.latency_p99,
                    latency_max_ns: e.latency_max,
                    since_start_latency_p50_ns: None,
                    since_start_latency_p99_ns: None,
                    since_start_latency_max_ns: None,
                    handler_avg_ns: e.handler_avg,
                    handler_p99_ns: e.handler_p99,
                    handler_max_ns: e.handler_max,
                    eagain: e.eagain,
                    lost: e.lost,
                    missed: e.missed,
                    errors: e.errors,
                    healed: e.healed,
                    faults: e.faults,
                    cross_class: None,
                    cross_class_p99_ns: None,
                    cross_class_max_ns: None,
                })
            })
            .collect();
        TimingReport {
            process: name_of(&r.process),
            pid: r.pid as u32,
            seq: r.seq,
            time_ns: r.time_ns,
            period_ns: r.period_ns,
            backend: backend_name(r.backend),
            class: None,
            layout: 2,
            entries,
        }
    }

    /// Decodes published bytes of any layout this reader knows, by their
    /// magic and length.
    pub fn decode(data: &[u8]) -> Result<TimingReport, ReportDecodeError> {
        let garbled = ReportDecodeError::Garbled { len: data.len() };
        let Some(head) = data.get(..8) else {
            return Err(garbled);
        };
        let mut m = [0u8; 8];
        m.copy_from_slice(head);
        match u64::from_le_bytes(m) {
            REPORT_MAGIC => crate::shm::from_bytes::<RawReport>(data)
                .as_ref()
                .and_then(TimingReport::from_raw)
                .ok_or(garbled),
            REPORT_MAGIC_V3 => crate::shm::from_bytes::<RawReportV3>(data)
                .map(|r| TimingReport::from_raw_v3(&r))
                .ok_or(garbled),
            REPORT_MAGIC_V2 => crate::shm::from_bytes::<RawReportV2>(data)
                .map(|r| TimingReport::from_raw_v2(&r))
                .ok_or(garbled),
            _ if m.starts_with(MAGIC_PREFIX) => Err(ReportDecodeError::UnknownLayout {
                magic: m.escape_ascii().to_string(),
            }),
            _ => Err(garbled),
        }
    }
}

/// The channel a process's loop publishes its reports on.
pub fn timing_channel_name(process: &str) -> String {
    format!("/rtdeploy/timing/{process}")
}

/// Geometry of a timing channel.
pub fn timing_geometry() -> ChannelGeometry {
    geometry_for(std::mem::size_of::<RawReport>())
}

/// Geometries of timing channels of the earlier layouts (`RTDTIME3`,
/// `RTDTIME2`), told apart by their slot size.
fn earlier_geometries() -> [ChannelGeometry; 2] {
    [
        geometry_for(std::mem::size_of::<RawReportV3>()),
        geometry_for(std::mem::size_of::<RawReportV2>()),
    ]
}

fn geometry_for(report_bytes: usize) -> ChannelGeometry {
    ChannelGeometry::new(report_bytes as u64, 4, 2).with_subscribers(4)
}

/// Reading a timing report failed.
#[derive(Debug, thiserror::Error)]
pub enum TimingReadError {
    #[error("cannot open the timing channel of process `{process}`")]
    Open {
        process: String,
        source: ChannelOpenError,
    },
    #[error("timing channel {path} has slots of {slot_bytes} bytes: a timing report layout this reader does not know (it reads RTDTIME4, RTDTIME3 and RTDTIME2)")]
    UnknownGeometry { path: String, slot_bytes: u64 },
    #[error("timing channel {path} holds {source}")]
    Decode {
        path: String,
        source: ReportDecodeError,
    },
    #[error("timing channel {path}: {fault}")]
    Fault { path: String, fault: ChannelFault },
}

/// The latest report process `process` published under `shm_dir`, or
/// `None` when it has published none yet.
///
/// The file belongs to another process and may hold anything: its geometry
/// is checked against [`timing_geometry`] (or, when only its slot size
/// differs, an earlier layout's) before it is mapped (nothing is
/// prefaulted), the read is bounded, and a truncated file is an error, so
/// the caller (the supervisor's loop) never blocks or grows on it.
pub fn read_latest(shm_dir: &Path, process: &str) -> Result<Option<TimingReport>, TimingReadError> {
    let name = timing_channel_name(process);
    let open_err = |source| TimingReadError::Open {
        process: process.into(),
        source,
    };
    let ch = match Channel::open_to_inspect(shm_dir, &name, &timing_geometry()) {
        Ok(ch) => ch,
        // The queue length matched (it is compared first): a channel of
        // another report layout, which the slot size tells.
        Err(ChannelOpenError::Mismatch {
            path,
            field: "slot size",
            found,
            ..
        }) => {
            let Some(old) = earlier_geometries()
                .into_iter()
                .find(|g| g.slot_bytes == found)
            else {
                return Err(TimingReadError::UnknownGeometry {
                    path: path.display().to_string(),
                    slot_bytes: found,
                });
            };
            Channel::open_to_inspect(shm_dir, &name, &old).map_err(open_err)?
        }
        Err(source) => return Err(open_err(source)),
    };
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
    TimingReport::decode(m.data)
        .map(Some)
        .map_err(|source| TimingReadError::Decode {
            path: ch.path().display().to_string(),
            source,
        })
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
        s.record(5_000, 100);
        s.record(7_000, 300);
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
        // A quantile is the top of its bucket (4096..=5119 for 5 us),
        // clamped to the largest value seen.
        assert_eq!(e.latency_p50_ns, Some(5_119));
        assert_eq!(
            (
                e.since_start_latency_p50_ns,
                e.since_start_latency_p99_ns,
                e.since_start_latency_max_ns
            ),
            (Some(5_119), Some(7_000), Some(7_000))
        );
        assert_eq!(back.layout, 4);
        let json = serde_json::to_string(&back).unwrap();
        let again: TimingReport = serde_json::from_str(&json).unwrap();
        assert_eq!(again, back);
        // The bytes as published decode to the same report.
        assert_eq!(TimingReport::decode(crate::shm::as_bytes(&raw)), Ok(back));
    }

    #[test]
    fn a_new_period_keeps_the_since_start_histogram() {
        let mut s = EntryStats::default();
        for v in [1_000, 2_000, 3_000, 400_000] {
            s.record(v, 10);
        }
        s.missed = 3;
        s.new_period();
        assert_eq!((s.count, s.missed, s.latency.count()), (0, 0, 0));
        assert_eq!(s.handler.count(), 0);
        s.record(5_000, 10);
        assert_eq!(s.latency.max(), 5_000);
        let h = &s.latency_since_start;
        assert_eq!((h.count(), h.min(), h.max()), (5, 1_000, 400_000));
        // The median of 1, 2, 3, 5 and 400 us is 3 us, within its bucket.
        assert!(
            (3_000..3_584).contains(&h.quantile(0.5)),
            "{}",
            h.quantile(0.5)
        );
        let mut raw = RawReport::default().entry[0];
        raw.fill(EntryKind::Timer, "t", &s, 5);
        assert_eq!(raw.latency_p50, 5_000, "clamped to the period's only value");
        assert_eq!(raw.since_start_latency_max, 400_000);
        assert_eq!(raw.since_start_latency_p99, 400_000);
        assert_eq!(raw.since_start_latency_p50, h.quantile(0.5));
    }

    #[test]
    fn counts_do_not_wrap_past_32_bits() {
        let mut h = Histogram::default();
        h.counts[bucket_of(10)] = u32::MAX as u64;
        h.n = u32::MAX as u64;
        h.record(10);
        h.record(1_000);
        assert_eq!(h.counts[bucket_of(10)], u32::MAX as u64 + 1);
        // Rank 2^31 of 2^32 + 1 values lies in the full bucket.
        assert_eq!(h.quantile(0.5), bucket_high(bucket_of(10)));
        assert_eq!(h.quantile(1.0), 1_000);
    }

    #[test]
    fn bytes_of_an_unknown_layout_or_no_report_are_said_so() {
        let mut raw = RawReport {
            magic: u64::from_le_bytes(*b"RTDTIME9"),
            ..RawReport::default()
        };
        assert_eq!(
            TimingReport::decode(crate::shm::as_bytes(&raw)),
            Err(ReportDecodeError::UnknownLayout {
                magic: "RTDTIME9".into()
            })
        );
        let e = TimingReport::decode(crate::shm::as_bytes(&raw)).unwrap_err();
        assert!(e.to_string().contains("does not know"), "{e}");
        raw.magic = u64::from_le_bytes(*b"RTDTIME\xff");
        assert!(matches!(
            TimingReport::decode(crate::shm::as_bytes(&raw)),
            Err(ReportDecodeError::UnknownLayout { magic }) if magic == "RTDTIME\\xff"
        ));
        // The current magic at the previous layout's length, and the
        // reverse: not a report.
        raw.magic = REPORT_MAGIC;
        let bytes = crate::shm::as_bytes(&raw);
        let short = &bytes[..std::mem::size_of::<RawReportV2>()];
        assert_eq!(
            TimingReport::decode(short),
            Err(ReportDecodeError::Garbled { len: short.len() })
        );
        let mut v2 = bytes.to_vec();
        v2[..8].copy_from_slice(b"RTDTIME2");
        assert!(matches!(
            TimingReport::decode(&v2),
            Err(ReportDecodeError::Garbled { .. })
        ));
        assert!(matches!(
            TimingReport::decode(&[1, 2, 3]),
            Err(ReportDecodeError::Garbled { len: 3 })
        ));
        assert!(matches!(
            TimingReport::decode(&[0; 4096]),
            Err(ReportDecodeError::Garbled { len: 4096 })
        ));
    }

    #[test]
    fn the_layouts_have_different_slot_sizes() {
        // How a reader tells an old channel from a current one before
        // mapping it.
        let [v3, v2] = earlier_geometries();
        let now = timing_geometry().slot_bytes;
        assert!(now != v3.slot_bytes && now != v2.slot_bytes && v3.slot_bytes != v2.slot_bytes);
        assert_eq!(std::mem::size_of::<RawReportV2>(), 5752);
        assert_eq!(std::mem::size_of::<RawReportV3>(), 5752 + 32 * 4 * 8);
    }
}
