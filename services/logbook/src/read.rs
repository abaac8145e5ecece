//! Reading MCAP files: ours, other writers', and files a power cut or a
//! SIGKILL cut short.
//!
//! A file is read from its start, record after record (no seeking through
//! the index), so a file without its summary reads the same way as a
//! finished one: up to the last complete chunk, and the reader says where
//! it stopped and why. Every length in the file is checked against the
//! bytes actually there before it is used (the `mcap` crate does this), and
//! a file larger than [`MAX_FILE`] is refused rather than read into memory.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use mcap::records::Record;
use serde::Serialize;

use crate::file::{ClockMap, CLOCK_METADATA, GAPS_TOPIC, META_PREFIX, SENDERS_TOPIC};
use crate::schema::{parse_ros2msg, Layout, CDR_HEADER};

/// The largest file read (the logger rotates at `log.rotate_size`, 64 MiB
/// by default).
pub const MAX_FILE: u64 = 4 << 30;

/// Reading failed before any record could be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot read {path}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path} is {size} bytes, more than the {max} this reader loads")]
    TooLarge { path: PathBuf, size: u64, max: u64 },
    #[error("{path} is not an MCAP file: {why}")]
    NotMcap { path: PathBuf, why: String },
}

/// One channel of a file.
#[derive(Debug, Clone, Serialize)]
pub struct ChannelInfo {
    pub id: u16,
    pub topic: String,
    pub message_encoding: String,
    pub schema_name: Option<String>,
    pub schema_encoding: Option<String>,
    pub metadata: BTreeMap<String, String>,
    /// Messages of this channel read.
    pub messages: u64,
    /// Messages the logger recorded as lost on this channel.
    pub gaps: u64,
    pub first_log_time: Option<u64>,
    pub last_log_time: Option<u64>,
    pub bytes: u64,
    #[serde(skip)]
    pub layout: Option<Layout>,
    /// Bytes in front of the payload as published (4 for our `cdr`).
    #[serde(skip)]
    pub prefix: usize,
    #[serde(skip)]
    pub schema_data: Vec<u8>,
}

impl ChannelInfo {
    /// The payload as published: the message without its CDR header.
    pub fn payload<'a>(&self, data: &'a [u8]) -> &'a [u8] {
        data.get(self.prefix..).unwrap_or(&[])
    }

    /// The message decoded to JSON, when this reader knows how.
    pub fn decode(&self, data: &[u8]) -> Option<serde_json::Value> {
        match self.message_encoding.as_str() {
            "json" => serde_json::from_slice(data).ok(),
            "cdr" => {
                let l = self.layout.as_ref()?;
                if data.len() < 4 || data[1] != CDR_HEADER[1] {
                    return None; // not little-endian plain CDR
                }
                l.decode(&data[4..])
            }
            crate::file::TIMING_ENCODING => controller::timing_report::TimingReport::decode(data)
                .ok()
                .and_then(|r| serde_json::to_value(r).ok()),
            _ => None,
        }
    }

    /// The recorded `rtdeploy.type*` of the channel, as the channel file
    /// records its type.
    pub fn recorded_type(&self) -> Option<(String, u64, u64, u64)> {
        let m = &self.metadata;
        Some((
            m.get(crate::file::META_TYPE)?.clone(),
            m.get(crate::file::META_TYPE_SIZE)?.parse().ok()?,
            m.get(crate::file::META_TYPE_ALIGN)?.parse().ok()?,
            u64::from_str_radix(m.get(crate::file::META_TYPE_HASH)?, 16).ok()?,
        ))
    }
}

/// A message as read.
#[derive(Debug, Clone, Copy)]
pub struct Msg<'a> {
    pub channel: &'a ChannelInfo,
    pub sequence: u32,
    pub log_time: u64,
    pub publish_time: u64,
    /// As in the file (our typed channels: CDR header, then the payload).
    pub data: &'a [u8],
}

/// What reading a whole file found.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub path: PathBuf,
    pub size: u64,
    pub profile: String,
    pub library: String,
    pub channels: Vec<ChannelInfo>,
    pub messages: u64,
    pub first_log_time: Option<u64>,
    pub last_log_time: Option<u64>,
    /// The clock mapping the logger recorded (none in other writers'
    /// files).
    pub clock: Option<ClockMapJson>,
    pub metadata: BTreeMap<String, BTreeMap<String, String>>,
    /// Complete chunks read.
    pub chunks: u64,
    /// The file has its data-end record (it was finished).
    pub finished: bool,
    /// Why reading stopped before the end, when it did.
    pub truncated: Option<String>,
    /// Messages the logger recorded as lost, per channel (also channels
    /// none of whose messages are in the file).
    pub lost: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct ClockMapJson {
    pub monotonic_ns: u64,
    pub realtime_ns: u64,
}

impl Summary {
    pub fn clock(&self) -> Option<ClockMap> {
        self.clock.map(|c| ClockMap {
            monotonic_ns: c.monotonic_ns,
            realtime_ns: c.realtime_ns,
        })
    }
    pub fn channel(&self, topic: &str) -> Option<&ChannelInfo> {
        self.channels.iter().find(|c| c.topic == topic)
    }
    pub fn gaps(&self) -> u64 {
        self.lost.values().sum()
    }
}

/// The longest record read (a message, or a chunk's records once
/// decompressed, are limited to it): a garbled length asks for no more
/// memory than this.
pub const MAX_RECORD: usize = 256 << 20;

/// The records of a file in order, chunks opened (or, for counting, not),
/// with every length bounded by [`MAX_RECORD`].
struct Records<'a> {
    buf: &'a [u8],
    reader: mcap::sans_io::LinearReader,
}

impl<'a> Records<'a> {
    fn new(buf: &'a [u8], emit_chunks: bool) -> Self {
        Records {
            buf,
            reader: mcap::sans_io::LinearReader::new_with_options(
                mcap::sans_io::LinearReaderOptions::default()
                    .with_skip_end_magic(true)
                    .with_emit_chunks(emit_chunks)
                    .with_record_length_limit(MAX_RECORD),
            ),
        }
    }

    /// The next record, its opcode and bytes handed to `take`; `None` at
    /// the end. The one place the reader is fed from the file.
    fn next_with<T>(&mut self, take: impl FnOnce(u8, &[u8]) -> T) -> Option<mcap::McapResult<T>> {
        while let Some(event) = self.reader.next_event() {
            match event {
                Ok(mcap::sans_io::LinearReadEvent::ReadRequest(need)) => {
                    let len = need.min(self.buf.len());
                    self.reader.insert(len).copy_from_slice(&self.buf[..len]);
                    self.reader.notify_read(len);
                    self.buf = &self.buf[len..];
                }
                Ok(mcap::sans_io::LinearReadEvent::Record { data, opcode }) => {
                    return Some(Ok(take(opcode, data)));
                }
                Err(e) => return Some(Err(e)),
            }
        }
        None
    }
}

impl Iterator for Records<'_> {
    type Item = mcap::McapResult<Record<'static>>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_with(|opcode, data| {
            mcap::read::parse_record(opcode, data).map(|r| r.into_owned())
        })
        .map(|r| r.and_then(|r| r))
    }
}

/// Loads a file (bounded by [`MAX_FILE`]).
pub fn load(path: &Path) -> Result<Vec<u8>, ReadError> {
    let io = |source| ReadError::Io {
        path: path.into(),
        source,
    };
    let size = std::fs::metadata(path).map_err(io)?.len();
    if size > MAX_FILE {
        return Err(ReadError::TooLarge {
            path: path.into(),
            size,
            max: MAX_FILE,
        });
    }
    std::fs::read(path).map_err(io)
}

/// The earliest log time in `bytes` (the file at `path`), read from the
/// chunk headers (no chunk is decompressed) and from any message outside a
/// chunk: what [`scan`] reports as `first_log_time` for a file whose chunk
/// headers are right (a chunk's header states its earliest message), at a
/// fraction of its cost. A chunk whose start and end times are both zero
/// holds no message, by the format's rule. For the windows of `deploy
/// log cat|export` and `deploy replay`, which are relative to it.
pub fn first_log_time(path: &Path, bytes: &[u8]) -> Result<Option<u64>, ReadError> {
    check_magic(path, bytes)?;
    let mut first: Option<u64> = None;
    let mut records = Records::new(bytes, true);
    while let Some(Ok(t)) = records.next_with(|op, data| match op {
        mcap::records::op::CHUNK | mcap::records::op::MESSAGE => {
            match mcap::read::parse_record(op, data) {
                Ok(Record::Chunk { header, .. })
                    if header.message_start_time != 0 || header.message_end_time != 0 =>
                {
                    Some(header.message_start_time)
                }
                Ok(Record::Message { header, .. }) => Some(header.log_time),
                _ => None,
            }
        }
        _ => None,
    }) {
        if let Some(t) = t {
            first = Some(first.map_or(t, |f| f.min(t)));
        }
    }
    Ok(first)
}

fn check_magic(path: &Path, bytes: &[u8]) -> Result<(), ReadError> {
    if bytes.len() < 8 || &bytes[..8] != mcap::MAGIC {
        return Err(ReadError::NotMcap {
            path: path.into(),
            why: "it does not start with the MCAP magic bytes".into(),
        });
    }
    Ok(())
}

/// Reads `bytes` (the file at `path`) from start to end, calling `each`
/// with every message in file order; returns what was found.
pub fn scan(
    path: &Path,
    bytes: &[u8],
    mut each: impl FnMut(&Msg<'_>),
) -> Result<Summary, ReadError> {
    check_magic(path, bytes)?;
    let mut sum = Summary {
        path: path.into(),
        size: bytes.len() as u64,
        profile: String::new(),
        library: String::new(),
        channels: Vec::new(),
        messages: 0,
        first_log_time: None,
        last_log_time: None,
        clock: None,
        metadata: BTreeMap::new(),
        chunks: 0,
        finished: false,
        truncated: None,
        lost: BTreeMap::new(),
    };
    // Complete chunks, counted without decompressing them.
    let mut chunks = Records::new(bytes, true);
    while let Some(Ok(op)) = chunks.next_with(|op, _| op) {
        if op == mcap::records::op::CHUNK {
            sum.chunks += 1;
        }
        if op == mcap::records::op::DATA_END {
            break;
        }
    }
    let mut schemas: BTreeMap<u16, (String, String, Vec<u8>)> = BTreeMap::new();
    let mut index: BTreeMap<u16, usize> = BTreeMap::new();
    let mut gaps: BTreeMap<String, u64> = BTreeMap::new();
    let flat = Records::new(bytes, false);
    for r in flat {
        let rec = match r {
            Ok(r) => r,
            Err(e) => {
                sum.truncated = Some(format!(
                    "reading stopped after {} complete chunk{} of {} bytes: {e} (a file cut short while it was written loses at most the chunk being written)",
                    sum.chunks,
                    if sum.chunks == 1 { "" } else { "s" },
                    bytes.len()
                ));
                break;
            }
        };
        match rec {
            Record::Header(h) => {
                sum.profile = h.profile;
                sum.library = h.library;
            }
            Record::Schema { header, data } => {
                schemas.insert(header.id, (header.name, header.encoding, data.into_owned()));
            }
            Record::Channel(c) => {
                if index.contains_key(&c.id) {
                    continue;
                }
                let schema = schemas.get(&c.schema_id);
                let layout = match schema {
                    Some((name, enc, data)) if enc == "ros2msg" => std::str::from_utf8(data)
                        .ok()
                        .and_then(|t| parse_ros2msg(name, t)),
                    _ => None,
                };
                let prefix = match (c.message_encoding.as_str(), c.metadata.get(META_PREFIX)) {
                    (_, Some(p)) if p == "cdr" => 4,
                    ("cdr", None) => 4,
                    _ => 0,
                };
                index.insert(c.id, sum.channels.len());
                sum.channels.push(ChannelInfo {
                    id: c.id,
                    topic: c.topic,
                    message_encoding: c.message_encoding,
                    schema_name: schema.map(|s| s.0.clone()),
                    schema_encoding: schema.map(|s| s.1.clone()),
                    metadata: c.metadata,
                    messages: 0,
                    gaps: 0,
                    first_log_time: None,
                    last_log_time: None,
                    bytes: 0,
                    layout,
                    prefix,
                    schema_data: schema.map(|s| s.2.clone()).unwrap_or_default(),
                });
            }
            Record::Message { header, data } => {
                let Some(&i) = index.get(&header.channel_id) else {
                    sum.truncated = Some(format!(
                        "a message of channel id {} that no channel record declared",
                        header.channel_id
                    ));
                    break;
                };
                if sum.channels[i].topic == GAPS_TOPIC {
                    if let Ok(g) = serde_json::from_slice::<serde_json::Value>(&data) {
                        if let (Some(ch), Some(n)) = (g["channel"].as_str(), g["count"].as_u64()) {
                            let v = gaps.entry(ch.to_string()).or_default();
                            *v = v.saturating_add(n);
                        }
                    }
                }
                let c = &mut sum.channels[i];
                c.messages += 1;
                c.bytes += data.len() as u64;
                c.first_log_time.get_or_insert(header.log_time);
                c.last_log_time = Some(header.log_time);
                sum.messages += 1;
                sum.first_log_time = Some(
                    sum.first_log_time
                        .map_or(header.log_time, |t| t.min(header.log_time)),
                );
                sum.last_log_time = Some(
                    sum.last_log_time
                        .map_or(header.log_time, |t| t.max(header.log_time)),
                );
                each(&Msg {
                    channel: &sum.channels[i],
                    sequence: header.sequence,
                    log_time: header.log_time,
                    publish_time: header.publish_time,
                    data: &data,
                });
            }
            Record::Metadata(m) => {
                if m.name == CLOCK_METADATA {
                    sum.clock = ClockMap::from_metadata(&m.metadata).map(|c| ClockMapJson {
                        monotonic_ns: c.monotonic_ns,
                        realtime_ns: c.realtime_ns,
                    });
                }
                sum.metadata.insert(m.name, m.metadata);
            }
            Record::DataEnd(_) => {
                sum.finished = true;
                break;
            }
            _ => {}
        }
    }
    for c in &mut sum.channels {
        c.gaps = gaps.get(&c.topic).copied().unwrap_or(0);
    }
    sum.lost = gaps;
    Ok(sum)
}

/// The sender pid of each message index, from the senders topic: for
/// channel `topic`, the pid recorded at the greatest index <= `index`.
#[derive(Debug, Default)]
pub struct Senders {
    by_channel: BTreeMap<String, BTreeMap<u64, u32>>,
}

impl Senders {
    pub fn note(&mut self, m: &Msg<'_>) {
        if m.channel.topic != SENDERS_TOPIC {
            return;
        }
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(m.data) {
            if let (Some(ch), Some(i), Some(pid)) = (
                v["channel"].as_str(),
                v["index"].as_u64(),
                v["pid"].as_u64(),
            ) {
                self.by_channel
                    .entry(ch.to_string())
                    .or_default()
                    .insert(i, pid as u32);
            }
        }
    }

    pub fn sender(&self, topic: &str, index: u64) -> Option<u32> {
        self.by_channel
            .get(topic)?
            .range(..=index)
            .next_back()
            .map(|(_, p)| *p)
    }
}

/// Rebuilds full queue indices from the 32-bit sequences of one channel
/// (they only grow).
#[derive(Debug, Default)]
pub struct Unwrap {
    last: BTreeMap<String, u64>,
}

impl Unwrap {
    pub fn index(&mut self, topic: &str, sequence: u32) -> u64 {
        let last = self
            .last
            .entry(topic.to_string())
            .or_insert(sequence as u64);
        let mut i = (*last & !0xffff_ffff) | sequence as u64;
        if i < *last {
            i += 1 << 32;
        }
        *last = i;
        i
    }
}

/// Which messages an export or a replay takes.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Globs of topics (empty: all).
    pub channels: Vec<String>,
    /// Log times (ns since the epoch), inclusive.
    pub from: Option<u64>,
    pub to: Option<u64>,
}

impl Filter {
    pub fn topic(&self, topic: &str) -> bool {
        self.channels.is_empty() || self.channels.iter().any(|p| crate::section::glob(p, topic))
    }
    pub fn takes(&self, m: &Msg<'_>) -> bool {
        self.topic(&m.channel.topic)
            && self.from.is_none_or(|f| m.log_time >= f)
            && self.to.is_none_or(|t| m.log_time <= t)
    }
}

/// What an export wrote.
#[derive(Debug, Clone, Serialize)]
pub struct ExportReport {
    pub out: PathBuf,
    pub messages: u64,
    pub channels: BTreeMap<String, u64>,
    pub truncated_input: Option<String>,
}

/// Writes the messages of `input` that `filter` takes to a new MCAP file
/// `out` (with the input's schemas, channels and metadata, the logger's
/// gap and sender records of the channels taken, and a full index).
pub fn export(input: &Path, out: &Path, filter: &Filter) -> Result<ExportReport, ExportError> {
    let bytes = load(input)?;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(out)
        .map_err(|source| ExportError::Create {
            path: out.into(),
            source,
        })?;
    let mut w = mcap::WriteOptions::new()
        .compression(Some(mcap::Compression::Zstd))
        .compression_threads(0)
        .create(io::BufWriter::new(file))
        .map_err(ExportError::Write)?;
    let mut ids: BTreeMap<u16, u16> = BTreeMap::new();
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    let mut failed: Option<mcap::McapError> = None;
    let sum = scan(input, &bytes, |m| {
        if failed.is_some() {
            return;
        }
        let own = m.channel.topic == GAPS_TOPIC || m.channel.topic == SENDERS_TOPIC;
        let keep = if own {
            // the logger's records of the channels taken
            serde_json::from_slice::<serde_json::Value>(m.data)
                .ok()
                .and_then(|v| v["channel"].as_str().map(|c| filter.topic(c)))
                .unwrap_or(false)
                && filter.from.is_none_or(|f| m.log_time >= f)
                && filter.to.is_none_or(|t| m.log_time <= t)
        } else {
            filter.takes(m)
        };
        if !keep {
            return;
        }
        let r = (|| -> Result<(), mcap::McapError> {
            let id = match ids.get(&m.channel.id) {
                Some(id) => *id,
                None => {
                    let c = m.channel;
                    let schema = match (&c.schema_name, &c.schema_encoding) {
                        (Some(n), Some(e)) => w.add_schema(n, e, &c.schema_data)?,
                        _ => 0,
                    };
                    let id = w.add_channel(schema, &c.topic, &c.message_encoding, &c.metadata)?;
                    ids.insert(c.id, id);
                    id
                }
            };
            w.write_to_known_channel(
                &mcap::records::MessageHeader {
                    channel_id: id,
                    sequence: m.sequence,
                    log_time: m.log_time,
                    publish_time: m.publish_time,
                },
                m.data,
            )
        })();
        match r {
            Ok(()) => {
                if !own {
                    *counts.entry(m.channel.topic.clone()).or_default() += 1;
                }
            }
            Err(e) => failed = Some(e),
        }
    })?;
    if let Some(e) = failed {
        return Err(ExportError::Write(e));
    }
    for (name, md) in &sum.metadata {
        w.write_metadata(&mcap::records::Metadata {
            name: name.clone(),
            metadata: md.clone(),
        })
        .map_err(ExportError::Write)?;
    }
    w.finish().map_err(ExportError::Write)?;
    Ok(ExportReport {
        out: out.into(),
        messages: counts.values().sum(),
        channels: counts,
        truncated_input: sum.truncated,
    })
}

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("cannot create {path}")]
    Create { path: PathBuf, source: io::Error },
    #[error("writing the export: {0}")]
    Write(mcap::McapError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_unwrap_across_32_bits() {
        let mut u = Unwrap::default();
        assert_eq!(u.index("a", 5), 5);
        assert_eq!(u.index("a", u32::MAX), u32::MAX as u64);
        assert_eq!(u.index("a", 2), (1 << 32) + 2);
        assert_eq!(u.index("b", 7), 7);
    }
}
