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
use crate::read::{load, scan, Filter, ReadError};

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
    /// time: median, 99th percentile, largest.
    pub drift_p50_ns: u64,
    pub drift_p99_ns: u64,
    pub drift_max_ns: u64,
    pub truncated_input: Option<String>,
}

/// Replays `path` (the whole file is read and checked before the first
/// message is published).
pub fn replay(path: &Path, opts: &ReplayOptions) -> Result<ReplayReport, ReplayError> {
    if !(opts.speed.is_finite() && opts.speed > 0.0) {
        return Err(ReplayError::Speed(opts.speed));
    }
    let bytes = load(path)?;
    // First pass: which messages, in what order (file order is log-time
    // order for the logger's files; others are sorted, stably).
    let mut picked: Vec<(u64, String, Vec<u8>)> = Vec::new();
    let sum = scan(path, &bytes, |m| {
        let t = m.channel.topic.as_str();
        if t == EVENTS_TOPIC || t == GAPS_TOPIC || t == SENDERS_TOPIC || t.starts_with("/rtdeploy/")
        {
            return;
        }
        if opts.filter.takes(m) {
            picked.push((
                m.log_time,
                m.channel.topic.clone(),
                m.channel.payload(m.data).to_vec(),
            ));
        }
    })?;
    picked.sort_by_key(|p| p.0);
    if picked.is_empty() {
        return Err(ReplayError::Nothing(path.into()));
    }
    // Open and check every channel before publishing anything.
    let mut pubs: BTreeMap<String, Publisher> = BTreeMap::new();
    for (_, topic, _) in &picked {
        if pubs.contains_key(topic) {
            continue;
        }
        let err = |why: String| ReplayError::Channel {
            topic: topic.clone(),
            why,
        };
        let info = sum
            .channel(topic)
            .expect("a message's channel is in the summary");
        let ch = Channel::open(&opts.shm_dir, topic).map_err(|e| err(e.to_string()))?;
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
        let max = ch.geometry().max_payload();
        if let Some(big) = picked
            .iter()
            .filter(|p| &p.1 == topic)
            .map(|p| p.2.len() as u64)
            .find(|n| *n > max)
        {
            return Err(err(format!(
                "a recorded message of {big} bytes is larger than the channel's {max}"
            )));
        }
        let p = ch
            .publisher(&opts.proc_root)
            .map_err(|e| err(e.to_string()))?;
        pubs.insert(topic.clone(), p);
    }
    let mut report: BTreeMap<String, ChannelReplay> = pubs
        .keys()
        .map(|t| {
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
    let t0 = picked[0].0;
    let start = Monotonic::now();
    let mut drifts = Vec::with_capacity(picked.len());
    let mut last = start;
    for (t, topic, data) in &picked {
        let offset = ((t - t0) as f64 / opts.speed) as u64;
        let due = start.saturating_add(Duration::from_nanos(offset));
        controller::time::sleep_until(due);
        let p = pubs.get_mut(topic).expect("opened above");
        let r = p.publish(data);
        let now = Monotonic::now();
        drifts.push(now.as_nanos().saturating_sub(due.as_nanos()));
        last = now;
        let c = report.get_mut(topic).expect("listed above");
        match r {
            Ok(_) => c.published += 1,
            Err(_) => c.refused += 1,
        }
    }
    drifts.sort_unstable();
    let q = |f: f64| drifts[((drifts.len() - 1) as f64 * f).round() as usize];
    let recorded_span = picked.last().map_or(0, |p| p.0 - t0);
    Ok(ReplayReport {
        file: path.into(),
        speed: opts.speed,
        published: report.values().map(|c| c.published).sum(),
        channels: report,
        recorded_span_ns: recorded_span,
        replayed_span_ns: (last.saturating_duration_since(start).as_nanos() as f64 * opts.speed)
            as u64,
        drift_p50_ns: q(0.5),
        drift_p99_ns: q(0.99),
        drift_max_ns: *drifts.last().unwrap_or(&0),
        truncated_input: sum.truncated,
    })
}
