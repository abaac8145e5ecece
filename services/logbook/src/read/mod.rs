//! Reading MCAP files: ours, other writers', and files a power cut or a
//! SIGKILL cut short.
//!
//! A file is read from its start, record after record (no seeking through
//! the index), so a file without its summary reads the same way as a
//! finished one: up to the last complete chunk, and the reader says where
//! it stopped and why. Every byte of the file is hostile, and what reading
//! it costs is bounded whatever it says:
//!
//! - the file is opened through [`units::bounded`] (a FIFO or a device is
//!   refused, not waited on or read forever) and streamed, never loaded:
//!   at most [`MAX_FILE`] bytes are read, and what is held at a time is one
//!   record or one chunk, at most [`MAX_RECORD`], grown as bytes arrive,
//!   never sized from a length the file states;
//! - a chunk is opened here, not by the `mcap` crate: its records are
//!   decompressed whole (at most [`MAX_RECORD`]), their CRC checked against
//!   the chunk's own where it has one, and only then is any of its messages
//!   handed on; a chunk that fails is named (its number and byte offset)
//!   and reading stops there;
//! - what chunks expand to is bounded in total: at most [`MAX_EXPANSION`]
//!   times the bytes read so far, plus [`EXPANSION_FLOOR`]. So the work per
//!   byte of the file is bounded (a few KB of zstd frames that expand to
//!   millions of messages are refused at the chunk that would pass the
//!   bound), and [`Summary::decompressed`] says what it was;
//! - what a summary keeps of schemas, channels, metadata and the logger's
//!   gap records is at most [`MAX_HELD`] bytes; a file that asks for more
//!   stops there, said so;
//! - messages are handed to the caller one at a time, as they are read, so
//!   a caller that prints them holds nothing.

mod walk_error;

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mcap::records::Record;
use serde::Serialize;

use crate::file::{ClockMap, CLOCK_METADATA, GAPS_TOPIC, META_PREFIX, SENDERS_TOPIC};
use crate::schema::{parse_ros2msg, Layout, CDR_HEADER};
use walk_error::{ChunkAt, RecordParseError, RecordWalkError};

/// The largest file read (the logger rotates at `log.rotate_size`, 64 MiB
/// by default): past it, reading stops and says so.
pub const MAX_FILE: u64 = 4 << 30;

/// The longest record read, and the most a chunk's records may be once
/// decompressed: the logger closes a chunk once it passes its
/// `log.chunk_size` (at most [`crate::section::MAX_CHUNK`]), so a chunk
/// holds at most that, one more message of the largest size a channel
/// carries, and that message's record fields. A garbled length asks for
/// no more memory than this, and only as its bytes arrive.
pub const MAX_RECORD: usize =
    (crate::section::MAX_CHUNK + controller::config::MAX_MESSAGE_SIZE + 4096) as usize;

/// What the chunks of a file may expand to, as a multiple of the bytes of
/// the file read so far (plus [`EXPANSION_FLOOR`]). The logger's chunks
/// expand 2 to 10 times (16-byte messages: about 5), other writers' as
/// much as their data compresses; a chunk past this bound is not read, and
/// the reader says why.
pub const MAX_EXPANSION: u64 = 1024;

/// Bytes any file's chunks may expand to whatever its size (a small file
/// of one well-compressed chunk).
pub const EXPANSION_FLOOR: u64 = 16 << 20;

/// The most a summary keeps of schemas, channels, metadata and gap
/// records, in bytes.
pub const MAX_HELD: usize = 64 << 20;

/// Bytes handed to the sans-io reader at a time: a record's buffer grows
/// by this as its bytes arrive, not to the length the record states.
const FEED: usize = 64 << 10;

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

impl ReadError {
    fn io(path: &Path) -> impl FnOnce(io::Error) -> ReadError + '_ {
        move |source| ReadError::Io {
            path: path.into(),
            source,
        }
    }
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
    /// The longest message of this channel, in bytes.
    pub max_bytes: u64,
    #[serde(skip)]
    pub layout: Option<Layout>,
    /// Bytes in front of the payload as published (4 for our `cdr`).
    #[serde(skip)]
    pub prefix: usize,
    /// The schema's bytes, shared by every channel that names it.
    #[serde(skip)]
    pub schema_data: Arc<[u8]>,
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

/// Whether a caller of [`scan_file`] wants the next message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Go,
    Stop,
}

/// What reading a whole file found.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub path: PathBuf,
    /// Bytes of the file read: up to the end of its data section (its
    /// summary and footer are not read).
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
    /// Complete chunks read (their CRC checked where they have one).
    pub chunks: u64,
    /// Bytes the chunks' records took once decompressed.
    pub decompressed: u64,
    /// The file has its data-end record (it was finished).
    pub finished: bool,
    /// Why reading stopped before the end, when it did.
    pub truncated: Option<String>,
    /// Messages the logger recorded as lost, per channel (also channels
    /// none of whose messages are in the file).
    pub lost: BTreeMap<String, u64>,
    /// The caller stopped the scan before the end ([`Flow::Stop`]).
    #[serde(skip)]
    pub stopped: bool,
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
        self.lost.values().fold(0u64, |a, &b| a.saturating_add(b))
    }
}

/// The records of a file in order, from its data section: a sans-io
/// reader fed [`FEED`] bytes at a time from `input`, chunks handed over
/// whole (opened by [`Walker`]), every length bounded by [`MAX_RECORD`].
struct Records<R> {
    input: R,
    reader: mcap::sans_io::LinearReader,
    /// File offset of the next record.
    offset: u64,
}

impl<R: Read> Records<R> {
    /// After the magic bytes, which the caller checked.
    fn new(input: R) -> Self {
        Records {
            input,
            reader: mcap::sans_io::LinearReader::new_with_options(
                mcap::sans_io::LinearReaderOptions::default()
                    .with_skip_start_magic(true)
                    .with_skip_end_magic(true)
                    .with_emit_chunks(true)
                    .with_record_length_limit(MAX_RECORD),
            ),
            offset: mcap::MAGIC.len() as u64,
        }
    }

    /// The next record, its file offset, opcode and bytes handed to
    /// `take`; `None` at the end. The one place the reader is fed.
    fn next_with<T>(
        &mut self,
        take: impl FnOnce(u64, u8, &[u8]) -> T,
    ) -> Option<mcap::McapResult<T>> {
        while let Some(event) = self.reader.next_event() {
            match event {
                Ok(mcap::sans_io::LinearReadEvent::ReadRequest(need)) => {
                    let want = need.clamp(1, FEED);
                    let buf = self.reader.insert(want);
                    let got = loop {
                        match self.input.read(buf) {
                            Ok(n) => break n,
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                            Err(e) => return Some(Err(e.into())),
                        }
                    };
                    self.reader.notify_read(got);
                }
                Ok(mcap::sans_io::LinearReadEvent::Record { data, opcode }) => {
                    let at = self.offset;
                    self.offset += 9 + data.len() as u64;
                    return Some(Ok(take(at, opcode, data)));
                }
                Err(e) => return Some(Err(e)),
            }
        }
        None
    }
}

/// Reads the magic bytes: `Err` when `input` is not an MCAP file.
fn check_magic(path: &Path, input: &mut impl Read) -> Result<(), ReadError> {
    let mut magic = [0u8; 8];
    let mut got = 0;
    while got < magic.len() {
        match input.read(&mut magic[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ReadError::io(path)(e)),
        }
    }
    if magic[..got] != mcap::MAGIC[..] {
        return Err(ReadError::NotMcap {
            path: path.into(),
            why: "it does not start with the MCAP magic bytes".into(),
        });
    }
    Ok(())
}

/// Opens a file named on the command line for streaming: a regular file
/// (through a link), read at most [`MAX_FILE`] bytes of.
pub fn open(path: &Path) -> Result<impl Read, ReadError> {
    let f = units::bounded::Bound::regular(MAX_FILE)
        .following_links()
        .open(path)
        .map_err(|e| ReadError::io(path)(e.into_io()))?;
    Ok(io::BufReader::with_capacity(
        FEED,
        units::bounded::Limited::new(f, MAX_FILE),
    ))
}

/// Loads a whole file into memory (bounded by [`MAX_FILE`]; a FIFO or a
/// device is refused): for tests and tools that cut and flip bytes. The
/// commands stream instead ([`scan_file`]).
pub fn load(path: &Path) -> Result<Vec<u8>, ReadError> {
    units::bounded::Bound::regular(MAX_FILE)
        .following_links()
        .read(path)
        .map_err(|e| match e {
            units::bounded::FileReadError::TooLarge { limit, .. } => ReadError::TooLarge {
                path: path.into(),
                size: limit + 1,
                max: limit,
            },
            e => ReadError::io(path)(e.into_io()),
        })
}

/// The earliest log time of the file at `path`, read from the chunk
/// headers (no chunk is decompressed) and from any message outside a
/// chunk: what [`scan`] reports as `first_log_time` for a file whose chunk
/// headers are right (a chunk's header states its earliest message), at a
/// fraction of its cost. A chunk whose start and end times are both zero
/// holds no message, by the format's rule. For the windows of `deploy
/// log cat|export` and `deploy replay`, which are relative to it.
pub fn first_log_time_file(path: &Path) -> Result<Option<u64>, ReadError> {
    first_log_time_from(path, open(path)?)
}

/// [`first_log_time_file`] of bytes already in memory.
pub fn first_log_time(path: &Path, bytes: &[u8]) -> Result<Option<u64>, ReadError> {
    first_log_time_from(path, bytes)
}

fn first_log_time_from(path: &Path, mut input: impl Read) -> Result<Option<u64>, ReadError> {
    check_magic(path, &mut input)?;
    let mut first: Option<u64> = None;
    let mut records = Records::new(input);
    while let Some(Ok(t)) = records.next_with(|_, op, data| match op {
        mcap::records::op::CHUNK | mcap::records::op::MESSAGE => match parse(op, data) {
            Ok(Some(Record::Chunk { header, .. }))
                if header.message_start_time != 0 || header.message_end_time != 0 =>
            {
                Some(header.message_start_time)
            }
            Ok(Some(Record::Message { header, .. })) => Some(header.log_time),
            _ => None,
        },
        _ => None,
    }) {
        if let Some(t) = t {
            first = Some(first.map_or(t, |f| f.min(t)));
        }
    }
    Ok(first)
}

/// The bytes of a record body, walked to check its length prefixes.
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    fn skip(&mut self, n: u64) -> Option<()> {
        let n = usize::try_from(n).ok().filter(|&n| n <= self.0.len())?;
        self.0 = &self.0[n..];
        Some(())
    }
    fn int<const N: usize>(&mut self) -> Option<u64> {
        let (b, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        let mut v = [0u8; 8];
        v[..N].copy_from_slice(b);
        Some(u64::from_le_bytes(v))
    }
    /// A string or byte array with a `N`-byte length in front.
    fn counted<const N: usize>(&mut self) -> Option<()> {
        let n = self.int::<N>()?;
        self.skip(n)
    }
    /// A map of strings: a 4-byte length of its entries, then each key and
    /// value.
    fn map(&mut self) -> Option<()> {
        let n = usize::try_from(self.int::<4>()?).ok()?;
        let (entries, rest) = (self.0.get(..n)?, &self.0[n..]);
        self.0 = rest;
        let mut m = Fields(entries);
        while !m.0.is_empty() {
            m.counted::<4>()?;
            m.counted::<4>()?;
        }
        Some(())
    }
}

/// Parses a record this reader uses (header, schema, channel, message,
/// metadata, chunk; `None` for the others, which it skips unread), once
/// every length inside it is checked to fit in its bytes: the parser
/// reserves what a length says before it reads (a string of 4 GiB in a
/// record of 40 bytes asked for 4 GiB).
fn parse(op: u8, body: &[u8]) -> Result<Option<Record<'_>>, RecordParseError> {
    use mcap::records::op;
    let mut f = Fields(body);
    let fits = match op {
        op::HEADER => f.counted::<4>().and_then(|()| f.counted::<4>()),
        op::SCHEMA => f
            .skip(2)
            .and_then(|()| f.counted::<4>())
            .and_then(|()| f.counted::<4>())
            .and_then(|()| f.counted::<4>()),
        op::CHANNEL => f
            .skip(4)
            .and_then(|()| f.counted::<4>())
            .and_then(|()| f.counted::<4>())
            .and_then(|()| f.map()),
        op::MESSAGE => f.skip(22),
        op::METADATA => f.counted::<4>().and_then(|()| f.map()),
        op::CHUNK => f
            .skip(28)
            .and_then(|()| f.counted::<4>())
            .and_then(|()| f.counted::<8>()),
        _ => return Ok(None),
    };
    if fits.is_none() {
        return Err(RecordParseError::LengthPastEnd);
    }
    Ok(Some(mcap::read::parse_record(op, body)?))
}

/// The most a reason for stopping says, in characters.
const MAX_REASON: usize = 600;

/// `s` as one short line: control characters (a parser's error may span
/// lines, a name from the file may hold anything) shown as spaces, cut at
/// [`MAX_REASON`] characters.
fn one_line(s: &str) -> String {
    let mut out: String = s
        .chars()
        .take(MAX_REASON)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if s.chars().nth(MAX_REASON).is_some() {
        out.push_str("...");
    }
    out
}

/// How a walk over the records ended.
#[derive(Debug, Default)]
struct WalkEnd {
    chunks: u64,
    decompressed: u64,
    bytes: u64,
    finished: bool,
    stopped: bool,
    why: Option<String>,
}

/// Every record of the data section in order, chunks opened, checked and
/// bounded (see the module's rules), handed to `visit` one at a time.
/// Returns why it ended.
fn walk<R: Read>(
    input: R,
    visit: &mut dyn FnMut(Record<'_>) -> Result<Flow, RecordWalkError>,
) -> WalkEnd {
    let mut end = WalkEnd::default();
    let mut records = Records::new(input);
    let mut zstd: Option<zstd::bulk::Decompressor<'static>> = None;
    let cut = |end: &WalkEnd, e: &dyn std::fmt::Display| {
        format!(
            "reading stopped after {} complete chunk{} of {} bytes: {e} (a file cut short while it was written loses at most the chunk being written)",
            end.chunks,
            if end.chunks == 1 { "" } else { "s" },
            end.bytes
        )
    };
    loop {
        // The record's bytes are the reader's: parse and act on them in
        // place, then go on.
        let step = records.next_with(|at, op, data| -> Result<Flow, RecordWalkError> {
            let record_end = at + 9 + data.len() as u64;
            if op == mcap::records::op::DATA_END {
                return Ok(Flow::Stop);
            }
            let rec = match parse(op, data) {
                Ok(Some(rec)) => rec,
                Ok(None) => return Ok(Flow::Go),
                Err(source) => return Err(RecordWalkError::Record { at, op, source }),
            };
            let Record::Chunk { header, data } = rec else {
                return visit(rec);
            };
            let chunk = ChunkAt {
                n: end.chunks + 1,
                at,
            };
            let declared = header.uncompressed_size;
            if declared > MAX_RECORD as u64 {
                return Err(RecordWalkError::ChunkTooLarge { chunk, declared });
            }
            let budget = MAX_EXPANSION
                .saturating_mul(record_end)
                .saturating_add(EXPANSION_FLOOR);
            if end.decompressed.saturating_add(declared) > budget {
                return Err(RecordWalkError::Expansion {
                    chunk,
                    budget,
                    read: record_end,
                });
            }
            let records_bytes: std::borrow::Cow<'_, [u8]> = match header.compression.as_str() {
                "" => {
                    if data.len() as u64 != declared {
                        return Err(RecordWalkError::UncompressedSize {
                            chunk,
                            len: data.len(),
                            declared,
                        });
                    }
                    data
                }
                "zstd" => {
                    let d = match &mut zstd {
                        Some(d) => d,
                        None => zstd.insert(
                            zstd::bulk::Decompressor::new()
                                .map_err(|source| RecordWalkError::ZstdStart { chunk, source })?,
                        ),
                    };
                    // Decompressed in one pass into a buffer of the size
                    // the header states (bounded above): no window is
                    // allocated for what the frame asks, and a frame that
                    // holds more or less than stated is an error.
                    let mut out = Vec::with_capacity(declared as usize);
                    d.decompress_to_buffer(&data, &mut out)
                        .map_err(|source| RecordWalkError::Zstd { chunk, source })?;
                    if out.len() as u64 != declared {
                        return Err(RecordWalkError::DecompressedSize {
                            chunk,
                            len: out.len(),
                            declared,
                        });
                    }
                    std::borrow::Cow::Owned(out)
                }
                other => {
                    return Err(RecordWalkError::Compression {
                        chunk,
                        compression: other.chars().take(32).collect(),
                    })
                }
            };
            end.decompressed += declared;
            if header.uncompressed_crc != 0 {
                let crc = crc32fast::hash(&records_bytes);
                if crc != header.uncompressed_crc {
                    return Err(RecordWalkError::Crc {
                        chunk,
                        crc,
                        declared: header.uncompressed_crc,
                    });
                }
            }
            let mut rest: &[u8] = &records_bytes;
            let mut k = 0u64;
            while !rest.is_empty() {
                k += 1;
                if rest.len() < 9 {
                    return Err(RecordWalkError::CutShort { chunk, k });
                }
                let op = rest[0];
                let len = u64::from_le_bytes(rest[1..9].try_into().expect("8 bytes"));
                let body_len = usize::try_from(len)
                    .ok()
                    .filter(|&l| l <= rest.len() - 9)
                    .ok_or(RecordWalkError::PastChunkEnd { chunk, k, len })?;
                let body = &rest[9..9 + body_len];
                rest = &rest[9 + body_len..];
                if op == mcap::records::op::CHUNK {
                    return Err(RecordWalkError::ChunkInChunk { chunk, k });
                }
                let Some(rec) = parse(op, body).map_err(|source| RecordWalkError::ChunkRecord {
                    chunk,
                    k,
                    op,
                    source,
                })?
                else {
                    continue;
                };
                if visit(rec)? == Flow::Stop {
                    end.stopped = true;
                    return Ok(Flow::Stop);
                }
            }
            end.chunks += 1;
            Ok(Flow::Go)
        });
        end.bytes = records.offset;
        match step {
            None => break,
            Some(Err(e)) => {
                end.why = Some(one_line(&cut(&end, &e)));
                break;
            }
            Some(Ok(Err(why))) => {
                end.why = Some(one_line(&units::error::Chain(&why).to_string()));
                break;
            }
            Some(Ok(Ok(Flow::Go))) => {}
            Some(Ok(Ok(Flow::Stop))) => {
                end.finished = !end.stopped;
                break;
            }
        }
    }
    end
}

/// Reads `bytes` (the file at `path`) from start to end, calling `each`
/// with every message in file order; returns what was found.
pub fn scan(
    path: &Path,
    bytes: &[u8],
    mut each: impl FnMut(&Msg<'_>),
) -> Result<Summary, ReadError> {
    scan_from(path, bytes, &mut |m| {
        each(m);
        Flow::Go
    })
}

/// Streams the file at `path` (see [`open`]), calling `each` with every
/// message in file order until it answers [`Flow::Stop`]; returns what was
/// found.
pub fn scan_file(
    path: &Path,
    mut each: impl FnMut(&Msg<'_>) -> Flow,
) -> Result<Summary, ReadError> {
    scan_from(path, open(path)?, &mut each)
}

/// What a summary holds, counted against [`MAX_HELD`].
struct Held(usize);

impl Held {
    fn take(&mut self, n: usize) -> Result<(), RecordWalkError> {
        self.0 = self.0.saturating_add(n);
        if self.0 > MAX_HELD {
            return Err(RecordWalkError::TooMuchHeld);
        }
        Ok(())
    }
}

fn map_bytes(m: &BTreeMap<String, String>) -> usize {
    m.iter().map(|(k, v)| k.len() + v.len() + 48).sum()
}

fn scan_from(
    path: &Path,
    mut input: impl Read,
    each: &mut dyn FnMut(&Msg<'_>) -> Flow,
) -> Result<Summary, ReadError> {
    check_magic(path, &mut input)?;
    let mut sum = Summary {
        path: path.into(),
        size: 0,
        profile: String::new(),
        library: String::new(),
        channels: Vec::new(),
        messages: 0,
        first_log_time: None,
        last_log_time: None,
        clock: None,
        metadata: BTreeMap::new(),
        chunks: 0,
        decompressed: 0,
        finished: false,
        truncated: None,
        lost: BTreeMap::new(),
        stopped: false,
    };
    // Schemas by id: name, encoding, bytes and (ros2msg) layout, parsed
    // once per schema record whatever the number of channels naming it.
    type SchemaEntry = (String, String, Arc<[u8]>, Option<Layout>);
    let mut schemas: BTreeMap<u16, SchemaEntry> = BTreeMap::new();
    let mut index: BTreeMap<u16, usize> = BTreeMap::new();
    let mut gaps: BTreeMap<String, u64> = BTreeMap::new();
    let mut held = Held(0);
    let mut visit = |rec: Record<'_>| -> Result<Flow, RecordWalkError> {
        match rec {
            Record::Header(h) => {
                held.take(h.profile.len() + h.library.len())?;
                sum.profile = h.profile;
                sum.library = h.library;
            }
            Record::Schema { header, data } => {
                held.take(header.name.len() + header.encoding.len() + data.len() + 64)?;
                let layout = (header.encoding == "ros2msg")
                    .then(|| std::str::from_utf8(&data).ok())
                    .flatten()
                    .and_then(|t| parse_ros2msg(&header.name, t));
                schemas.insert(
                    header.id,
                    (header.name, header.encoding, Arc::from(&data[..]), layout),
                );
            }
            Record::Channel(c) => {
                if index.contains_key(&c.id) {
                    return Ok(Flow::Go);
                }
                held.take(c.topic.len() + c.message_encoding.len() + map_bytes(&c.metadata) + 256)?;
                let schema = schemas.get(&c.schema_id);
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
                    max_bytes: 0,
                    layout: schema.and_then(|s| s.3.clone()),
                    prefix,
                    schema_data: schema.map_or_else(|| Arc::from(&[][..]), |s| s.2.clone()),
                });
            }
            Record::Message { header, data } => {
                let Some(&i) = index.get(&header.channel_id) else {
                    return Err(RecordWalkError::UnknownChannel {
                        channel_id: header.channel_id,
                    });
                };
                if sum.channels[i].topic == GAPS_TOPIC {
                    if let Ok(g) = serde_json::from_slice::<serde_json::Value>(&data) {
                        if let (Some(ch), Some(n)) = (g["channel"].as_str(), g["count"].as_u64()) {
                            if !gaps.contains_key(ch) {
                                held.take(ch.len() + 48)?;
                            }
                            let v = gaps.entry(ch.to_string()).or_default();
                            *v = v.saturating_add(n);
                        }
                    }
                }
                let c = &mut sum.channels[i];
                c.messages += 1;
                c.bytes = c.bytes.saturating_add(data.len() as u64);
                c.max_bytes = c.max_bytes.max(data.len() as u64);
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
                return Ok(each(&Msg {
                    channel: &sum.channels[i],
                    sequence: header.sequence,
                    log_time: header.log_time,
                    publish_time: header.publish_time,
                    data: &data,
                }));
            }
            Record::Metadata(m) => {
                held.take(m.name.len() + map_bytes(&m.metadata) + 64)?;
                if m.name == CLOCK_METADATA {
                    sum.clock = ClockMap::from_metadata(&m.metadata).map(|c| ClockMapJson {
                        monotonic_ns: c.monotonic_ns,
                        realtime_ns: c.realtime_ns,
                    });
                }
                sum.metadata.insert(m.name, m.metadata);
            }
            _ => {}
        }
        Ok(Flow::Go)
    };
    let end = walk(input, &mut visit);
    sum.size = end.bytes;
    sum.chunks = end.chunks;
    sum.decompressed = end.decompressed;
    sum.finished = end.finished;
    sum.stopped = end.stopped;
    sum.truncated = end.why;
    for c in &mut sum.channels {
        c.gaps = gaps.get(&c.topic).copied().unwrap_or(0);
    }
    sum.lost = gaps;
    Ok(sum)
}

/// The most sender records [`Senders`] keeps (a record is written when
/// the sender of a channel changes: a few per run).
pub const MAX_SENDERS: usize = 1 << 18;

/// The sender pid of each message index, from the senders topic: for
/// channel `topic`, the pid recorded at the greatest index <= `index`. At
/// most [`MAX_SENDERS`] records are kept; later ones are counted
/// ([`Senders::dropped`]), and their messages show no sender.
#[derive(Debug, Default)]
pub struct Senders {
    by_channel: BTreeMap<String, BTreeMap<u64, u32>>,
    kept: usize,
    dropped: u64,
}

impl Senders {
    /// Sender records not kept.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    pub fn note(&mut self, m: &Msg<'_>) {
        if m.channel.topic != SENDERS_TOPIC {
            return;
        }
        if self.kept >= MAX_SENDERS {
            self.dropped += 1;
            return;
        }
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(m.data) {
            if let (Some(ch), Some(i), Some(pid)) = (
                v["channel"].as_str(),
                v["index"].as_u64(),
                v["pid"].as_u64(),
            ) {
                self.kept += 1;
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
/// gap and sender records of the channels taken, and a full index). The
/// input is streamed ([`scan_file`]): what is held is the chunk being read
/// and the one being written.
pub fn export(input: &Path, out: &Path, filter: &Filter) -> Result<ExportReport, ExportError> {
    let source = open(input)?;
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
    let sum = scan_from(input, source, &mut |m| {
        if failed.is_some() {
            return Flow::Stop;
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
            return Flow::Go;
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
                Flow::Go
            }
            Err(e) => {
                failed = Some(e);
                Flow::Stop
            }
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
    fn a_length_inside_a_record_past_its_end_is_refused_before_parsing() {
        // A header whose profile says 805 MB in a record of 12 bytes: the
        // parser reserved the 805 MB (found by the mcap_read fuzz target).
        let mut f = b"\x89MCAP0\r\n".to_vec();
        f.push(0x01);
        f.extend_from_slice(&12u64.to_le_bytes());
        f.extend_from_slice(&805_306_368u32.to_le_bytes());
        f.extend_from_slice(&[0; 8]);
        let sum = scan(Path::new("h.mcap"), &f, |_| {}).unwrap();
        assert_eq!(
            sum.truncated.as_deref(),
            Some("the record at byte 8 (opcode 0x01) is not valid: a length inside it goes past its end")
        );
        // Every kind this reader parses is checked field by field.
        for (op, body) in [
            (
                mcap::records::op::SCHEMA,
                [&[1u8, 0][..], &[1, 0, 0, 0, b'a'], &[0; 4], &[9, 0, 0, 0]].concat(),
            ),
            (
                mcap::records::op::CHANNEL,
                [
                    &[1u8, 0, 0, 0][..],
                    &[0; 4],
                    &[0; 4],
                    &[8, 0, 0, 0, 200, 0, 0, 0],
                ]
                .concat(),
            ),
            (
                mcap::records::op::METADATA,
                [&[0u8; 4][..], &[255, 255, 255, 255]].concat(),
            ),
            (
                mcap::records::op::CHUNK,
                [&[0u8; 28][..], &[0; 4], &[1, 0, 0, 0, 0, 0, 0, 0x10]].concat(),
            ),
            (mcap::records::op::MESSAGE, vec![0u8; 21]),
        ] {
            assert!(parse(op, &body).is_err(), "opcode {op:#x}");
        }
        // Records it does not use are not parsed at all.
        assert!(matches!(
            parse(mcap::records::op::MESSAGE_INDEX, &[0xff; 3]),
            Ok(None)
        ));
    }

    #[test]
    fn what_a_summary_holds_is_bounded() {
        // 80 metadata records of 1 MiB each: more than MAX_HELD.
        let mut w = mcap::Writer::new(std::io::Cursor::new(Vec::new())).unwrap();
        let value = "m".repeat(1 << 20);
        for i in 0..80 {
            w.write_metadata(&mcap::records::Metadata {
                name: format!("m{i}"),
                metadata: BTreeMap::from([("k".to_string(), value.clone())]),
            })
            .unwrap();
        }
        w.finish().unwrap();
        let bytes = w.into_inner().into_inner();
        let sum = scan(Path::new("m.mcap"), &bytes, |_| {}).unwrap();
        assert_eq!(
            sum.truncated.as_deref(),
            Some("more than 67108864 bytes of schemas, channels, metadata and gap records: reading stopped")
        );
        assert!(sum.metadata.len() < 64, "{}", sum.metadata.len());
    }

    #[test]
    fn sequences_unwrap_across_32_bits() {
        let mut u = Unwrap::default();
        assert_eq!(u.index("a", 5), 5);
        assert_eq!(u.index("a", u32::MAX), u32::MAX as u64);
        assert_eq!(u.index("a", 2), (1 << 32) + 2);
        assert_eq!(u.index("b", 7), 7);
    }
}
