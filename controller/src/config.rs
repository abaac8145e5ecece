//! The `channels` section of `robot.yaml` and its validation (durations
//! and sizes are [`units::duration`] and [`units::size`]; the `check` and
//! `boot_check` sections are the check engine's).
//!
//! Every validator appends `(field path, message)` pairs; the caller maps a
//! path such as `channels[2].rate` back to its line and column.

use serde::{Deserialize, Serialize};
use units::duration::Dur;
use units::problem::Problem;
use units::size::ByteSize;

/// The largest message a channel may carry: a 4K RGBA frame is 32 MiB, a
/// dense point cloud or a map tile tens of MiB.
pub const MAX_MESSAGE_SIZE: u64 = 64 << 20;
/// The most slots a channel queue may have.
pub const MAX_QUEUE_LEN: u64 = 1 << 20;
/// The most shared memory one channel may take (what the file layout's
/// geometry allows; `config check` holds the channels against the board's
/// memory and the processes' `memlock`).
pub const MAX_CHANNEL_BYTES: u64 = 4 << 30;

/// One entry of `channels:`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelConfig {
    /// `/name/parts`, lower case letters, digits, `_`, `-`, `.`.
    pub name: String,
    /// The largest message payload.
    pub max_size: ByteSize,
    /// The most messages per second all publishers together send.
    pub rate: u32,
    /// How long a message must stay readable after it is sent (default
    /// 100ms): the ring holds rate x retention messages, and a publisher
    /// that would overwrite a younger one is refused. Or `depth`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<Dur>,
    /// How many of the newest messages stay readable, instead of a
    /// `retention`: the ring holds that many (rounded up to a power of
    /// two) and publishers never wait for readers. `depth: 1` keeps the
    /// newest only: publishers and subscribers cycle through two slots
    /// (with holds: a slot per hold more), which stay in the caches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<u32>,
    /// Send -> handler-start latency budget for subscribers.
    #[serde(default)]
    pub budget: Option<Dur>,
    /// How late a message may reach a subscriber of the other wake class
    /// (a real-time loop reading a best-effort publisher's message, or the
    /// reverse; see [`crate::wake`]). Default 2ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cross_class_latency: Option<Dur>,
    /// Messages each subscribing process may hold in place at once (read
    /// in their slots, never copied; see [`crate::channel`]'s `hold`). Each
    /// costs a slot of `max_size`. Default: 1 for messages of
    /// [`HOLD_BY_DEFAULT_FROM`] and more, 0 below.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holds: Option<u32>,
    /// What stays readable once every subscriber has read it: `newest`
    /// (the default: the newest `depth` messages, or those of the last
    /// `retention`, for fetchers, late joiners and the recorder too) or
    /// `unread` (a message only until every subscriber has read it: the
    /// publisher then writes the next one into its slot, still in the
    /// caches; one publishing process, and a `depth` for how far a slow
    /// subscriber may fall behind). See [`crate::channel::Keep`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep: Option<KeepChoice>,
}

/// robot.yaml's words for [`crate::channel::Keep`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KeepChoice {
    Newest,
    Unread,
}

/// From this `max_size` on a channel gives each subscriber a hold unless
/// robot.yaml says otherwise: below it a copy into the subscriber's
/// buffer costs less than a publish's look at the hold records, and a
/// small message is copied whole by the seqlock read anyway.
pub const HOLD_BY_DEFAULT_FROM: u64 = 64 << 10;
/// The most holds one subscriber may have on a channel.
pub const MAX_HOLDS: u32 = 64;

/// `retention` unless robot.yaml gives it or a `depth`.
pub const DEFAULT_RETENTION: Dur = Dur(std::time::Duration::from_millis(100));

/// Per-slot bookkeeping a queue slot carries in front of the payload.
pub const SLOT_HEADER_BYTES: u64 = 64;

impl ChannelConfig {
    /// The time a message stays readable: `retention`, nothing with a
    /// `depth`, else the default.
    pub fn retention(&self) -> Dur {
        match (self.retention, self.depth) {
            (Some(r), _) => r,
            (None, Some(_)) => Dur(std::time::Duration::ZERO),
            (None, None) => DEFAULT_RETENTION,
        }
    }

    /// What the channel keeps readable, in words: `100ms` or `depth 2`.
    pub fn keeps(&self) -> String {
        match self.depth {
            Some(d) if self.retention.is_none() => format!("depth {d}"),
            _ => self.retention().to_string(),
        }
    }

    /// Queue length: with a `depth`, that rounded up to a power of two;
    /// else rate x retention, plus headroom for one period of jitter and a
    /// reader mid-copy, rounded up to a power of two; `None` when that
    /// length does not fit in 64 bits.
    ///
    /// The product is taken in 128 bits (a u32 rate times a retention of
    /// at most 2^64 ns cannot overflow them) and every later step is
    /// checked: a length that wraps would come out as a small queue that
    /// validates.
    pub fn checked_queue_len(&self) -> Option<u64> {
        if let (Some(d), None) = (self.depth, self.retention) {
            return Some(u64::from(d.max(1)).next_power_of_two());
        }
        let needed =
            (u128::from(self.rate) * self.retention().0.as_nanos()).div_ceil(1_000_000_000);
        let len = needed.checked_add(2)?.checked_next_power_of_two()?.max(4);
        u64::try_from(len).ok()
    }

    /// [`Self::checked_queue_len`], or `u64::MAX` (beyond
    /// [`MAX_QUEUE_LEN`], so refused by [`Self::validate`]) when it does not
    /// fit.
    pub fn queue_len(&self) -> u64 {
        self.checked_queue_len().unwrap_or(u64::MAX)
    }

    /// The cross-class bound: `cross_class_latency`, or the default.
    pub fn cross_class_latency(&self) -> std::time::Duration {
        self.cross_class_latency
            .map_or(crate::channel::DEFAULT_CROSS_CLASS_LATENCY, |d| d.0)
    }

    /// What the channel keeps once read (`keep`, default newest).
    pub fn keep(&self) -> crate::channel::Keep {
        match self.keep {
            Some(KeepChoice::Unread) => crate::channel::Keep::Unread,
            _ => crate::channel::Keep::Newest,
        }
    }

    /// Holds per subscribing process: `holds`, or the default.
    pub fn holds_per_subscriber(&self) -> u32 {
        self.holds
            .unwrap_or(u32::from(self.max_size.0 >= HOLD_BY_DEFAULT_FROM))
    }

    /// Hold records of the channel file when `subscribers` processes
    /// subscribe (at least one is counted: a tool may read in place).
    pub fn hold_records(&self, subscribers: u32) -> u32 {
        let n = u64::from(self.holds_per_subscriber()) * u64::from(subscribers.max(1));
        n.min(u64::from(crate::channel::MAX_ENTRIES)) as u32
    }

    /// Bytes of one slot: header plus payload, rounded to a cache line.
    pub fn slot_bytes(&self) -> u64 {
        (SLOT_HEADER_BYTES + self.max_size.0).div_ceil(64) * 64
    }

    /// Bytes of the channel file with `publishers` publisher entries and
    /// `subscribers` subscribing processes: the header, the entry tables,
    /// the ring, the hold records, the slots, a scratch slot per publisher
    /// and a reserve slot per hold record, exactly as [`crate::channel`]
    /// lays it out.
    pub fn shm_bytes(&self, publishers: u64, subscribers: u64) -> u64 {
        let publishers = publishers.clamp(1, u32::MAX as u64) as u32;
        let subscribers = subscribers.min(u32::MAX as u64) as u32;
        crate::channel::ChannelGeometry::from_config(self, publishers, subscribers).total_bytes()
    }

    pub fn validate(&self, path: &str, out: &mut Vec<Problem>) {
        if let Err(e) = validate_channel_name(&self.name) {
            out.push((format!("{path}.name"), e.to_string()));
        }
        if self.max_size.0 == 0 || self.max_size.0 > MAX_MESSAGE_SIZE {
            out.push((
                format!("{path}.max_size"),
                format!(
                    "message size {} is out of range (expected 1B to {})",
                    self.max_size,
                    ByteSize(MAX_MESSAGE_SIZE)
                ),
            ));
        }
        if self.rate == 0 {
            out.push((
                format!("{path}.rate"),
                "rate 0 (expected messages per second, 1 or more)".into(),
            ));
        }
        if self.retention.is_some_and(|r| r.is_zero()) {
            out.push((
                format!("{path}.retention"),
                "retention 0 (expected a positive duration like `100ms`)".into(),
            ));
        }
        if let Some(d) = self.depth {
            if self.retention.is_some() {
                out.push((
                    format!("{path}.depth"),
                    "both `depth` and `retention` (a channel keeps the newest `depth` messages, or every message for `retention`: give one)".into(),
                ));
            } else if d == 0 || u64::from(d) > MAX_QUEUE_LEN {
                out.push((
                    format!("{path}.depth"),
                    format!("depth {d} is out of range (expected 1 to {MAX_QUEUE_LEN})"),
                ));
            }
        }
        if let Some(b) = self.budget {
            if b.is_zero() {
                out.push((
                    format!("{path}.budget"),
                    "budget 0 (expected a positive duration like `200us`)".into(),
                ));
            }
        }
        if let Some(b) = self.cross_class_latency {
            use crate::channel::{MAX_CROSS_CLASS_LATENCY as MAX, MIN_CROSS_CLASS_LATENCY as MIN};
            if !(MIN..=MAX).contains(&b.0) {
                out.push((
                    format!("{path}.cross_class_latency"),
                    format!(
                        "cross-class latency {b} is out of range (expected {} to {})",
                        Dur(MIN),
                        Dur(MAX)
                    ),
                ));
            }
        }
        if self.keep == Some(KeepChoice::Unread)
            && (self.depth.is_none() || self.retention.is_some())
        {
            out.push((
                format!("{path}.keep"),
                "keep: unread needs a `depth` (how many unread messages a slow subscriber may fall behind) and no `retention` (a message read by every subscriber is not kept for a time)".into(),
            ));
        }
        if let Some(h) = self.holds {
            if h > MAX_HOLDS {
                out.push((
                    format!("{path}.holds"),
                    format!("{h} holds per subscriber (expected 0 to {MAX_HOLDS})"),
                ));
            }
        }
        if self.rate > 0 && (self.depth.is_some() || !self.retention().is_zero()) {
            let len = self.checked_queue_len();
            if len.is_none_or(|len| len > MAX_QUEUE_LEN) {
                let needs = match len {
                    Some(len) => format!("{len} slots"),
                    None => "more than 2^64 slots".into(),
                };
                out.push((
                    format!("{path}.retention"),
                    format!(
                        "rate {} x retention {} needs {needs} (at most {MAX_QUEUE_LEN}; lower the rate or the retention)",
                        self.rate, self.retention()
                    ),
                ));
            } else if self.max_size.0 <= MAX_MESSAGE_SIZE
                && self.shm_bytes(1, 1) > MAX_CHANNEL_BYTES
            {
                let field = if self.depth.is_some() && self.retention.is_none() {
                    "depth"
                } else {
                    "retention"
                };
                out.push((
                    format!("{path}.{field}"),
                    format!(
                        "{} slots of {} need {} of shared memory (at most {})",
                        self.queue_len(),
                        self.max_size,
                        ByteSize(self.shm_bytes(1, 1)),
                        ByteSize(MAX_CHANNEL_BYTES)
                    ),
                ));
            }
        }
    }
}

/// A text that is not a channel name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{name}` is not a channel name (expected `/` and parts of a-z, 0-9, `_`, `-`, `.`, like `/imu/raw`, at most 128 characters)")]
pub struct ChannelNameError {
    /// The name, cut to 200 characters.
    pub name: String,
}

/// Checks a channel name: `/` then `/`-separated parts of `[a-z0-9_.-]`.
pub fn validate_channel_name(name: &str) -> Result<(), ChannelNameError> {
    let ok = name.len() <= 128
        && name.starts_with('/')
        && name[1..].split('/').all(|part| {
            !part.is_empty()
                && part != "."
                && part != ".."
                && part.chars().all(|c| {
                    c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '-' | '.')
                })
        });
    if ok {
        Ok(())
    } else {
        Err(ChannelNameError {
            name: name.chars().take(200).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn queue_sizing() {
        let c = ChannelConfig {
            name: "/imu".into(),
            max_size: ByteSize(64),
            rate: 1000,
            retention: Some(Dur::from_millis(100)),
            depth: None,
            budget: None,
            cross_class_latency: None,
            holds: None,
            keep: None,
        };
        assert_eq!(c.queue_len(), 128);
        assert_eq!(c.slot_bytes(), 128);
        let mut out = vec![];
        c.validate("channels[0]", &mut out);
        assert!(out.is_empty(), "{out:?}");
    }

    #[test]
    fn a_queue_length_beyond_64_bits_is_refused_not_wrapped() {
        // 2e9/s x 2^63 ns is 2^64 slots: wrapped to 64 bits it was 0,
        // a 4-slot queue that validated.
        let c = ChannelConfig {
            name: "/imu".into(),
            max_size: ByteSize(64),
            rate: 2_000_000_000,
            retention: Some(Dur(Duration::from_nanos(1 << 63))),
            depth: None,
            budget: None,
            cross_class_latency: None,
            holds: None,
            keep: None,
        };
        assert_eq!(c.checked_queue_len(), None);
        assert!(c.queue_len() > MAX_QUEUE_LEN);
        let mut out = vec![];
        c.validate("channels[0]", &mut out);
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].0, "channels[0].retention");
        assert!(
            out[0].1.contains("needs more than 2^64 slots"),
            "{}",
            out[0].1
        );
        // The largest rate and retention there are: still no overflow.
        let c = ChannelConfig {
            rate: u32::MAX,
            retention: Some(Dur(Duration::from_nanos(u64::MAX))),
            depth: None,
            ..c
        };
        assert_eq!(c.checked_queue_len(), None);
        // Just within 64 bits: a length, refused as too long.
        let c = ChannelConfig {
            rate: 1,
            retention: Some(Dur::from_secs(1 << 33)),
            depth: None,
            ..c
        };
        assert_eq!(c.checked_queue_len(), Some(1 << 34));
        let mut out = vec![];
        c.validate("channels[0]", &mut out);
        assert!(out[0].1.contains("needs 17179869184 slots"), "{out:?}");
    }

    #[test]
    fn a_depth_sizes_the_ring_instead_of_the_retention() {
        // A channel entry as robot.yaml's loader hands it over.
        let parse = |extra: &str| -> ChannelConfig {
            serde_json::from_str(&format!(
                r#"{{"name": "/c", "max_size": "4MiB", "rate": 30{extra}}}"#
            ))
            .unwrap()
        };
        let c = parse(r#", "depth": 1"#);
        assert_eq!(c.queue_len(), 1);
        assert_eq!(c.retention().0, Duration::ZERO, "no time promise");
        assert_eq!(c.keeps(), "depth 1");
        assert_eq!(
            c.holds_per_subscriber(),
            1,
            "4 MiB messages hold by default"
        );
        let mut out = vec![];
        c.validate("channels[0]", &mut out);
        assert!(out.is_empty(), "{out:?}");
        assert_eq!(parse(r#", "depth": 3"#).queue_len(), 4);
        let c = ChannelConfig {
            max_size: ByteSize(8),
            ..parse("")
        };
        assert_eq!(c.retention(), DEFAULT_RETENTION);
        assert_eq!(c.keeps(), "100ms");
        assert_eq!(c.holds_per_subscriber(), 0);
        for (extra, field, says) in [
            (
                r#", "depth": 2, "retention": "10ms""#,
                "channels[0].depth",
                "give one",
            ),
            (r#", "depth": 0"#, "channels[0].depth", "out of range"),
            (r#", "depth": 2000000"#, "channels[0].depth", "out of range"),
            (r#", "holds": 65"#, "channels[0].holds", "expected 0 to 64"),
        ] {
            let mut out = vec![];
            parse(extra).validate("channels[0]", &mut out);
            assert!(
                out.iter().any(|(f, m)| f == field && m.contains(says)),
                "{extra}: {out:?}"
            );
        }
    }

    #[test]
    fn shm_bytes_is_the_size_of_the_channel_file() {
        let dir = tempfile::tempdir().unwrap();
        let c = ChannelConfig {
            name: "/sizes/check".into(),
            max_size: ByteSize(200),
            rate: 500,
            retention: Some(Dur::from_millis(40)),
            depth: None,
            budget: None,
            cross_class_latency: None,
            holds: Some(2),
            keep: None,
        };
        let (ch, _) = crate::channel::Channel::create_from_config(
            dir.path(),
            &c,
            3,
            5,
            None,
            std::path::Path::new("/proc"),
        )
        .unwrap();
        let len = std::fs::metadata(crate::channel::channel_path(dir.path(), &c.name))
            .unwrap()
            .len();
        assert_eq!(ch.geometry().holds, 10, "two holds for each of five");
        assert_eq!(ch.geometry().slots(), 32 + 3 + 10);
        drop(ch);
        assert_eq!(c.shm_bytes(3, 5), len);
    }

    #[test]
    fn channel_names() {
        assert!(validate_channel_name("/imu/raw").is_ok());
        for bad in ["imu", "/", "/Imu", "/a//b", "/a/../b", "/a b"] {
            assert!(validate_channel_name(bad).is_err(), "{bad}");
        }
    }
}
