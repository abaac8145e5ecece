//! The `log:` section of robot.yaml: what the supervisor's logger records,
//! where, and how much disk it may take.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use units::duration::Dur;
use units::problem::Problem;
use units::size::ByteSize;

use crate::schema::TypeDecl;

/// The smallest chunk: below this, zstd and the per-chunk index cost more
/// than they save.
pub const MIN_CHUNK: u64 = 4 << 10;
/// The largest chunk: what a power cut may lose, and what the logger holds
/// in memory.
pub const MAX_CHUNK: u64 = 64 << 20;

/// `log:`
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogSection {
    /// Record at all (a `log:` section with `enabled: false` keeps its
    /// settings without recording).
    pub enabled: bool,
    /// Channels to record, as globs (`*` matches across `/`); the
    /// processes' timing report channels (`/rtdeploy/timing/<process>`)
    /// are recorded when a pattern matches them.
    pub channels: Vec<String>,
    /// Where the files go (default `/var/log/rtdeploy/mcap`, under the
    /// prefix).
    pub dir: Option<String>,
    /// Uncompressed bytes of messages per chunk: the most a power cut
    /// loses, and what the logger holds in memory.
    pub chunk_size: ByteSize,
    /// A chunk is also written (and the file flushed) at least this often,
    /// so a quiet channel loses no more than this much time at a power cut.
    pub flush: Dur,
    /// A new file is started when the current one is this large ...
    pub rotate_size: ByteSize,
    /// ... or this old.
    pub rotate_age: Dur,
    /// The oldest files are deleted to keep the directory within this.
    pub quota: ByteSize,
    /// How often the logger reads the channels. It never waits on a
    /// channel's futex, so publishers never wake it; what a channel keeps
    /// (`retention`) must be longer than this or messages are lost (and
    /// recorded as gaps).
    pub poll: Dur,
    /// The logger thread's nice value (SCHED_OTHER: never real-time). A
    /// housekeeping CPU is shared with everything else of the robot; below
    /// 0 the logger keeps its share there under load and loses fewer
    /// messages. Needs CAP_SYS_NICE below 0 (the status says when it was
    /// refused).
    pub nice: i32,
    /// What the reader may hold for a writer that is behind (a disk that
    /// stalls): read messages beyond this are dropped, and recorded as
    /// gaps.
    pub buffer: ByteSize,
    /// The message type of each channel that has one, for readers that
    /// decode (Foxglove, `deploy log cat`): channel name -> type.
    pub types: BTreeMap<String, TypeDecl>,
}

impl Default for LogSection {
    fn default() -> Self {
        LogSection {
            enabled: true,
            channels: vec!["*".into()],
            dir: None,
            chunk_size: ByteSize(256 << 10),
            flush: Dur::from_secs(1),
            rotate_size: ByteSize(64 << 20),
            rotate_age: Dur::from_secs(3600),
            quota: ByteSize(1 << 30),
            poll: Dur::from_millis(10),
            nice: -5,
            buffer: ByteSize(64 << 20),
            types: BTreeMap::new(),
        }
    }
}

/// Glob match where `*` matches any run of characters (`/` included) and
/// `?` one character.
pub fn glob(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == b'?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == b'*' {
            star = Some(pi);
            pi += 1;
            mark = ti;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == b'*' {
        pi += 1;
    }
    pi == p.len()
}

impl LogSection {
    /// Whether channel `name` is recorded.
    pub fn records(&self, name: &str) -> bool {
        self.enabled && self.channels.iter().any(|p| glob(p, name))
    }

    /// Problems of the section; `channels` are the channels robot.yaml
    /// declares, with their `max_size` (a type for another channel, or
    /// larger than its channel's messages, is refused).
    pub fn validate(&self, channels: &[(&str, u64)], out: &mut Vec<Problem>) {
        for (i, p) in self.channels.iter().enumerate() {
            if p.is_empty() || p.len() > 255 {
                out.push((
                    format!("log.channels[{i}]"),
                    "expected a channel name or glob like `/imu/*`".into(),
                ));
            }
        }
        if let Some(d) = &self.dir {
            if !d.starts_with('/') {
                out.push((
                    "log.dir".into(),
                    format!("{d:?}: expected an absolute path"),
                ));
            } else if let Err(e) = units::path::check(d) {
                out.push((
                    "log.dir".into(),
                    format!("{e} (expected an absolute path under the robot's root, without `..`)"),
                ));
            }
        }
        if !(MIN_CHUNK..=MAX_CHUNK).contains(&self.chunk_size.0) {
            out.push((
                "log.chunk_size".into(),
                format!(
                    "{} bytes: expected {}KiB to {}MiB",
                    self.chunk_size.0,
                    MIN_CHUNK >> 10,
                    MAX_CHUNK >> 20
                ),
            ));
        }
        for (field, d, min) in [
            ("log.flush", self.flush, Dur::from_millis(10)),
            ("log.rotate_age", self.rotate_age, Dur::from_secs(1)),
            ("log.poll", self.poll, Dur::from_micros(100)),
        ] {
            if d < min {
                out.push((
                    field.into(),
                    format!("{:?}: expected at least {:?}", d.0, min.0),
                ));
            }
        }
        if self.poll > Dur::from_secs(1) {
            out.push((
                "log.poll".into(),
                format!("{:?}: expected at most 1s", self.poll.0),
            ));
        }
        if !((1 << 20)..=(4 << 30)).contains(&self.buffer.0) {
            out.push((
                "log.buffer".into(),
                format!("{} bytes: expected 1MiB to 4GiB", self.buffer.0),
            ));
        }
        if !(-20..=19).contains(&self.nice) {
            out.push((
                "log.nice".into(),
                format!("{}: expected -20 to 19", self.nice),
            ));
        }
        if self.rotate_size.0 < 2 * self.chunk_size.0 {
            out.push((
                "log.rotate_size".into(),
                format!(
                    "{} bytes: expected at least two chunks ({} bytes)",
                    self.rotate_size.0,
                    2 * self.chunk_size.0
                ),
            ));
        }
        if self.quota.0 < 2 * self.rotate_size.0 {
            out.push((
                "log.quota".into(),
                format!(
                    "{} bytes: expected room for at least two files of rotate_size ({} bytes)",
                    self.quota.0,
                    2 * self.rotate_size.0
                ),
            ));
        }
        // A batch with one message of the channel must fit the buffer
        // (each message costs its bytes and a 64-byte record), or every
        // message of the channel is a gap.
        if let Some((name, max)) = channels
            .iter()
            .filter(|(name, _)| self.records(name))
            .max_by_key(|c| c.1)
        {
            if max.saturating_add(64) > self.buffer.0 {
                out.push((
                    "log.buffer".into(),
                    format!(
                        "{} bytes cannot hold one message of {name} (max_size {max} bytes, and 64 bytes of record): raise log.buffer to at least {} bytes, or stop recording the channel",
                        self.buffer.0,
                        max.saturating_add(64)
                    ),
                ));
            }
        }
        for (name, decl) in &self.types {
            let at = format!("log.types.{name}");
            let max = channels.iter().find(|c| c.0 == name).map(|c| c.1);
            match (decl.layout(), max) {
                (Err(e), _) => out.push((at, e.to_string())),
                (Ok(_), None) => out.push((at, format!("no channel {name:?} in `channels:`"))),
                (Ok(l), Some(max)) if l.size > max => out.push((
                    at,
                    format!(
                        "{} is {} bytes, larger than the channel's max_size ({max} bytes)",
                        l.schema_name(),
                        l.size
                    ),
                )),
                (Ok(_), Some(_)) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob("*", "/rtdeploy/timing/talker"));
        assert!(glob("/demo/*", "/demo/ping"));
        assert!(!glob("/demo/*", "/imu/raw"));
        assert!(glob("/imu/?aw", "/imu/raw"));
        assert!(glob("/a*b*c", "/axxbyyc"));
        assert!(!glob("/a*b*c", "/axxbyy"));
        assert!(glob("/rtdeploy/timing/*", "/rtdeploy/timing/x"));
    }

    #[test]
    fn defaults_validate_and_mistakes_are_named() {
        let mut out = Vec::new();
        LogSection::default().validate(&[], &mut out);
        assert!(out.is_empty(), "{out:?}");
        let s = LogSection {
            dir: Some("rel".into()),
            chunk_size: ByteSize(10),
            poll: Dur::from_secs(5),
            quota: ByteSize(1),
            types: [(
                "/nope".to_string(),
                TypeDecl {
                    name: "x".into(),
                    fields: vec![],
                },
            )]
            .into(),
            ..LogSection::default()
        };
        s.validate(&[("/demo", 64)], &mut out);
        let fields: Vec<&str> = out.iter().map(|p| p.0.as_str()).collect();
        for f in [
            "log.dir",
            "log.chunk_size",
            "log.poll",
            "log.quota",
            "log.types./nope",
        ] {
            assert!(fields.contains(&f), "{f} missing from {out:?}");
        }
    }
}
