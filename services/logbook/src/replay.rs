//! Replay: publishes recorded messages onto channels at their recorded
//! spacing (scaled by a speed), so a controller under test sees the same
//! inputs with the same gaps, and says how far the replay's timing drifted
//! from the recording's.
//!
//! A channel is replayed onto only when its recorded message type is the
//! channel's (the type is bound as the recording's when the channel has
//! none yet); messages are published exactly as they were (the CDR header
//! of typed channels taken off). Whether a running robot may be replayed
//! onto is the caller's decision (`deploy replay` refuses without
//! `--force`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use controller::shm::TypeName;
use controller::{Channel, Monotonic, Publisher};
use serde::Serialize;

use crate::file::{EVENTS_TOPIC, GAPS_TOPIC, SENDERS_TOPIC};
use crate::read::{scan_file, Filter, Flow, ReadError};

/// What to replay, and how fast.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    pub filter: Filter,
    /// 1.0: as recorded; 2.0: twice as fast.
    pub speed: f64,
    pub shm_dir: PathBuf,
    pub proc_root: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("{0}: nothing to replay (no recorded channel matches)")]
    Nothing(PathBuf),
    #[error("speed {0}: expected a positive number")]
    Speed(f64),
    #[error("channel {topic}: {why}")]
    Channel { topic: String, why: String },
}

/// How one channel's replay went.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChannelReplay {
    pub published: u64,
    /// Messages the channel refused (the publisher ran out of retention:
    /// `PublishError`), counted and skipped.
    pub refused: u64,
    /// Messages recorded as lost in the log (the replay has the same
    /// holes).
    pub gaps_in_log: u64,
}

/// What a replay did.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    pub file: PathBuf,
    pub speed: f64,
    pub channels: BTreeMap<String, ChannelReplay>,
    pub published: u64,
    /// The recording's span, and the replay's (scaled back by the speed).
    pub recorded_span_ns: u64,
    pub replayed_span_ns: u64,
    /// How late each message was published against its scaled recorded
    /// time: median, 99th percentile (each within 1% above), largest.
    pub drift_p50_ns: u64,
    pub drift_p99_ns: u64,
    pub drift_max_ns: u64,
    /// Messages published after a later one (earlier than the reorder
    /// window reached back).
    pub out_of_order: u64,
    pub truncated_input: Option<String>,
}

/// Messages held to put a file's messages in log-time order (other
/// writers' files may interleave): the earliest is published once this
/// many wait. A message earlier than one already published goes out at
/// once, counted ([`ReplayReport::out_of_order`]).
pub const REORDER_MESSAGES: usize = 4096;

/// Bytes of messages held for the same.
pub const REORDER_BYTES: usize = 16 << 20;

/// Is a topic one of the logger's own (never replayed)?
fn own_topic(t: &str) -> bool {
    t == EVENTS_TOPIC || t == GAPS_TOPIC || t == SENDERS_TOPIC || t.starts_with("/rtdeploy/")
}

/// Drifts, in a log-linear histogram (128 steps per power of two, so a
/// quantile is within 1% of the drift measured): the messages of a replay
/// are not held to sort their drifts.
#[derive(Default)]
struct Drifts {
    counts: BTreeMap<u32, u64>,
    n: u64,
    max: u64,
}

impl Drifts {
    fn bucket(v: u64) -> u32 {
        if v < 128 {
            return v as u32;
        }
        let e = 63 - v.leading_zeros(); // 7..=63
        let m = (v >> (e - 7)) & 0x7f;
        ((e - 6) << 7) | m as u32
    }

    /// The largest value of a bucket.
    fn top(b: u32) -> u64 {
        if b < 128 {
            return b as u64;
        }
        let e = (b >> 7) + 6;
        let m = (b & 0x7f) as u128 | 0x80;
        let top = ((m + 1) << (e - 7)) - 1;
        u64::try_from(top).unwrap_or(u64::MAX)
    }

    fn add(&mut self, v: u64) {
        *self.counts.entry(Self::bucket(v)).or_default() += 1;
        self.n += 1;
        self.max = self.max.max(v);
    }

    /// The `f` quantile, as its bucket's top (never above the maximum).
    fn q(&self, f: f64) -> u64 {
        if self.n == 0 {
            return 0;
        }
        let rank = ((self.n - 1) as f64 * f).round() as u64;
        let mut seen = 0;
        for (&b, &c) in &self.counts {
            seen += c;
            if seen > rank {
                return Self::top(b).min(self.max);
            }
        }
        self.max
    }
}

/// A message waiting in the reorder window.
struct Pending {
    log_time: u64,
    order: u64,
    topic: usize,
    data: Vec<u8>,
}

impl PartialEq for Pending {
    fn eq(&self, o: &Self) -> bool {
        (self.log_time, self.order) == (o.log_time, o.order)
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Pending {
    /// Reversed: the heap's top is the earliest.
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (o.log_time, o.order).cmp(&(self.log_time, self.order))
    }
}

/// Opens the channel `onto` a recorded channel is replayed onto and
/// checks (or binds) its type.
fn open_checked(
    shm_dir: &Path,
    info: &crate::read::ChannelInfo,
    onto: &str,
) -> Result<Channel, ReplayError> {
    let err = |why: String| ReplayError::Channel {
        topic: if onto == info.topic {
            info.topic.clone()
        } else {
            format!("{} (replayed onto {onto})", info.topic)
        },
        why,
    };
    let ch = Channel::open(shm_dir, onto).map_err(|e| err(e.to_string()))?;
    match (info.recorded_type(), ch.recorded_type()) {
        (Some((name, size, align, hash)), _) => ch
            .bind_recorded_type(&TypeName::new(&name), size, align, hash)
            .map_err(|e| err(format!("recorded messages are not this channel's type: {e}")))?,
        (None, Some((name, ..))) => {
            return Err(err(format!(
                "the log records no message type, the channel holds `{name}`: refused (replaying untyped bytes onto a typed channel)"
            )))
        }
        (None, None) => {}
    }
    Ok(ch)
}

/// A message of the replay, in log-time order.
struct Due {
    log_time: u64,
    /// Index into [`ReplaySource`]'s publishers.
    topic: usize,
    data: Vec<u8>,
}

/// A log's messages, checked against the channels they go to and
/// streamed in log-time order (within [`REORDER_MESSAGES`] and
/// [`REORDER_BYTES`]) by a thread reading the file, for a caller that
/// publishes each when its time comes: [`replay`] on `CLOCK_MONOTONIC`, a
/// simulation on its virtual clock.
pub struct ReplaySource {
    path: PathBuf,
    /// The channel replayed onto, by recorded topic, and its publisher.
    pubs: Vec<(String, Publisher)>,
    report: BTreeMap<String, ChannelReplay>,
    /// The earliest log time replayed.
    pub t0: u64,
    /// The log is a simulation's (`deploy sim --log`): its log times are
    /// virtual times.
    pub simulated: bool,
    /// The log's channels the filter left out (not the logger's own).
    pub left_out: Vec<String>,
    rx: std::sync::mpsc::Receiver<Due>,
    next: Option<Due>,
    reader: Option<std::thread::JoinHandle<Result<crate::read::Summary, ReadError>>>,

    out_of_order: std::sync::Arc<std::sync::atomic::AtomicU64>,
    last_t: u64,
    truncated: Option<String>,
}

impl ReplaySource {
    /// Reads `path` once to find the channels taken, their types and their
    /// longest messages, opens and checks every channel (the recorded
    /// topic `t` goes to channel `onto(t)`) before anything is published,
    /// then streams the messages from a thread of its own.
    pub fn open(
        path: &Path,
        opts: &ReplayOptions,
        onto: &dyn Fn(&str) -> String,
    ) -> Result<ReplaySource, ReplayError> {
        let mut t0: Option<u64> = None;
        let mut taken: BTreeMap<String, (u64, Channel)> = BTreeMap::new();
        let mut refused: Option<ReplayError> = None;
        let sum = scan_file(path, |m| {
            if own_topic(&m.channel.topic) || !opts.filter.takes(m) {
                return Flow::Go;
            }
            t0 = Some(t0.map_or(m.log_time, |t| t.min(m.log_time)));
            let len = m.channel.payload(m.data).len() as u64;
            if let Some((big, _)) = taken.get_mut(&m.channel.topic) {
                *big = (*big).max(len);
                return Flow::Go;
            }
            match open_checked(&opts.shm_dir, m.channel, &onto(&m.channel.topic)) {
                Ok(ch) => {
                    taken.insert(m.channel.topic.clone(), (len, ch));
                    Flow::Go
                }
                Err(e) => {
                    refused = Some(e);
                    Flow::Stop
                }
            }
        })?;
        if let Some(e) = refused {
            return Err(e);
        }
        let Some(t0) = t0 else {
            return Err(ReplayError::Nothing(path.into()));
        };
        let mut pubs: Vec<(String, Publisher)> = Vec::new();
        for (topic, (big, ch)) in &taken {
            let err = |why: String| ReplayError::Channel {
                topic: topic.clone(),
                why,
            };
            let max = ch.geometry().max_payload();
            if *big > max {
                return Err(err(format!(
                    "a recorded message of {big} bytes is larger than the channel's {max}"
                )));
            }
            let p = ch
                .publisher(&opts.proc_root)
                .map_err(|e| err(e.to_string()))?;
            pubs.push((topic.clone(), p));
        }
        let report = pubs
            .iter()
            .map(|(t, _)| {
                let gaps = sum.channel(t).map_or(0, |c| c.gaps);
                (
                    t.clone(),
                    ChannelReplay {
                        gaps_in_log: gaps,
                        ..ChannelReplay::default()
                    },
                )
            })
            .collect();
        let index: BTreeMap<String, usize> = taken
            .keys()
            .enumerate()
            .map(|(i, t)| (t.clone(), i))
            .collect();
        let (tx, rx) = std::sync::mpsc::sync_channel::<Due>(256);
        let out_of_order = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let ooo = out_of_order.clone();
        let (file, filter) = (path.to_path_buf(), opts.filter.clone());
        let reader = std::thread::Builder::new()
            .name("rtd-replay-read".into())
            .spawn(move || {
                let mut heap: std::collections::BinaryHeap<Pending> = Default::default();
                let (mut held, mut order, mut last_t) = (0usize, 0u64, 0u64);
                let mut send = |p: Pending| {
                    if p.log_time < last_t {
                        ooo.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    last_t = last_t.max(p.log_time);
                    tx.send(Due {
                        log_time: p.log_time,
                        topic: p.topic,
                        data: p.data,
                    })
                    .is_ok()
                };
                let second = scan_file(&file, |m| {
                    if own_topic(&m.channel.topic) || !filter.takes(m) {
                        return Flow::Go;
                    }
                    let Some(&topic) = index.get(&m.channel.topic) else {
                        // Not seen by the first pass: the file changed.
                        return Flow::Go;
                    };
                    let data = m.channel.payload(m.data).to_vec();
                    held += data.len();
                    order += 1;
                    heap.push(Pending {
                        log_time: m.log_time,
                        order,
                        topic,
                        data,
                    });
                    while heap.len() > REORDER_MESSAGES || held > REORDER_BYTES {
                        let p = heap.pop().expect("not empty");
                        held -= p.data.len();
                        if !send(p) {
                            return Flow::Stop;
                        }
                    }
                    Flow::Go
                });
                while let Some(p) = heap.pop() {
                    if !send(p) {
                        break;
                    }
                }
                second
            })
            .map_err(|e| {
                ReplayError::Read(ReadError::Io {
                    path: path.into(),
                    source: e,
                })
            })?;
        let simulated = sum
            .metadata
            .get(crate::file::CLOCK_METADATA)
            .is_some_and(|m| {
                m.get("boot_id").map(String::as_str) == Some(crate::sim::SIM_BOOT_ID)
                    && crate::file::ClockMap::from_metadata(m) == Some(crate::sim::SIM_CLOCK)
            });
        let left_out = sum
            .channels
            .iter()
            .map(|c| c.topic.clone())
            .filter(|t| !own_topic(t) && !opts.filter.topic(t))
            .collect();
        Ok(ReplaySource {
            path: path.into(),
            pubs,
            report,
            t0,
            simulated,
            left_out,
            rx,
            next: None,
            reader: Some(reader),
            out_of_order,
            last_t: t0,
            truncated: sum.truncated,
        })
    }

    /// The log time of the next message, `None` when all are published.
    pub fn next_time(&mut self) -> Option<u64> {
        if self.next.is_none() {
            self.next = self.rx.recv().ok();
        }
        self.next.as_ref().map(|d| d.log_time)
    }

    /// Publishes the next message (as [`ReplaySource::next_time`] said);
    /// whether the channel took it (a refusal is counted in the report).
    pub fn publish_next(&mut self) -> bool {
        if self.next_time().is_none() {
            return false;
        }
        let d = self.next.take().expect("just read");
        self.last_t = self.last_t.max(d.log_time);
        let (topic, publisher) = &mut self.pubs[d.topic];
        let ok = publisher.publish(&d.data).is_ok();
        let c = self.report.get_mut(topic.as_str()).expect("listed at open");
        if ok {
            c.published += 1;
        } else {
            c.refused += 1;
        }
        ok
    }

    /// Every publisher takes its send times from `clock` (a simulation's).
    pub fn set_clock(&mut self, clock: &controller::Clock) {
        for (_, p) in &mut self.pubs {
            p.set_clock(clock.clone());
        }
    }

    /// The recorded topics replayed.
    pub fn topics(&self) -> impl Iterator<Item = &str> {
        self.pubs.iter().map(|(t, _)| t.as_str())
    }

    /// What was published per channel, the recording's span so far, the
    /// messages out of order; the reading thread is stopped.
    pub fn finish(self) -> Result<ReplayDone, ReplayError> {
        let ReplaySource {
            path,
            report,
            t0,
            rx,
            reader,
            out_of_order,
            last_t,
            truncated,
            ..
        } = self;
        // No receiver: the thread's next send fails and it stops.
        drop(rx);
        let second = match reader.map(|t| t.join()) {
            Some(Ok(r)) => r?,
            _ => {
                return Err(ReplayError::Read(ReadError::Io {
                    path,
                    source: std::io::Error::other("the thread reading it panicked"),
                }))
            }
        };
        Ok(ReplayDone {
            published: report.values().map(|c| c.published).sum(),
            channels: report,
            recorded_span_ns: last_t.saturating_sub(t0),
            out_of_order: out_of_order.load(std::sync::atomic::Ordering::Relaxed),
            truncated_input: second.truncated.or(truncated),
        })
    }
}

/// What a [`ReplaySource`] published.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayDone {
    pub channels: BTreeMap<String, ChannelReplay>,
    pub published: u64,
    pub recorded_span_ns: u64,
    pub out_of_order: u64,
    pub truncated_input: Option<String>,
}

/// Replays `path` onto the channels of the same names at the recorded
/// spacing (scaled by the speed): the file is read twice, streamed, never
/// held (see [`ReplaySource`]).
pub fn replay(path: &Path, opts: &ReplayOptions) -> Result<ReplayReport, ReplayError> {
    if !(opts.speed.is_finite() && opts.speed > 0.0) {
        return Err(ReplayError::Speed(opts.speed));
    }
    let mut src = ReplaySource::open(path, opts, &|t| t.to_string())?;
    let t0 = src.t0;
    let start = Monotonic::now();
    let mut last = start;
    let mut drifts = Drifts::default();
    while let Some(t) = src.next_time() {
        let offset = (t.saturating_sub(t0) as f64 / opts.speed) as u64;
        let due = start.saturating_add(Duration::from_nanos(offset));
        controller::time::sleep_until(due);
        src.publish_next();
        let now = Monotonic::now();
        drifts.add(now.as_nanos().saturating_sub(due.as_nanos()));
        last = now;
    }
    let done = src.finish()?;
    Ok(ReplayReport {
        file: path.into(),
        speed: opts.speed,
        published: done.published,
        channels: done.channels,
        recorded_span_ns: done.recorded_span_ns,
        replayed_span_ns: (last.saturating_duration_since(start).as_nanos() as f64 * opts.speed)
            as u64,
        drift_p50_ns: drifts.q(0.5),
        drift_p99_ns: drifts.q(0.99),
        drift_max_ns: drifts.max,
        out_of_order: done.out_of_order,
        truncated_input: done.truncated_input,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drift_quantiles_are_within_one_percent_without_holding_the_drifts() {
        let mut d = Drifts::default();
        for v in 1..=100_000u64 {
            d.add(v * 1000);
        }
        let within = |got: u64, want: u64| {
            assert!(got >= want && got <= want + want / 100, "{got} for {want}")
        };
        within(d.q(0.5), 50_000_000);
        within(d.q(0.99), 99_000_000);
        assert_eq!(d.q(1.0), 100_000_000);
        assert_eq!(d.max, 100_000_000);
        assert!(d.counts.len() < 2000, "{} buckets", d.counts.len());
        let mut huge = Drifts::default();
        huge.add(u64::MAX);
        assert_eq!(huge.q(0.5), u64::MAX);
        let mut small = Drifts::default();
        small.add(5);
        assert_eq!((small.q(0.5), small.q(0.99)), (5, 5));
        assert_eq!(Drifts::default().q(0.5), 0);
    }
}
