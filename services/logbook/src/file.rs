//! One MCAP file being written: its channels, its clock mapping, its size.
//!
//! Chunks are built in memory and written whole (the writer does not seek
//! back into a chunk), so a power cut or SIGKILL leaves a file whose
//! complete chunks all read, losing at most the chunk being built; every
//! `flush` writes the current chunk out. `finish` adds the index and
//! summary so readers seek.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use mcap::records::MessageHeader;

use crate::schema::{Layout, CDR_HEADER};

/// The metadata record holding the clock mapping of a file.
pub const CLOCK_METADATA: &str = "rtdeploy.clock";
/// Topics the logger writes besides the channels.
pub const EVENTS_TOPIC: &str = "/rtdeploy/events";
pub const GAPS_TOPIC: &str = "/rtdeploy/log/gaps";
pub const SENDERS_TOPIC: &str = "/rtdeploy/log/senders";

/// Channel metadata keys.
pub const META_TYPE: &str = "rtdeploy.type";
pub const META_TYPE_SIZE: &str = "rtdeploy.type_size";
pub const META_TYPE_ALIGN: &str = "rtdeploy.type_align";
pub const META_TYPE_HASH: &str = "rtdeploy.type_hash";
/// Why a channel's `log.types` declaration was not used: it is not the
/// type the channel records.
pub const META_TYPE_MISMATCH: &str = "rtdeploy.type_mismatch";
pub const META_MAX_SIZE: &str = "rtdeploy.max_size";
/// `cdr`: each message is the 4-byte CDR header and then the payload as
/// published; `none`: the payload as published.
pub const META_PREFIX: &str = "rtdeploy.prefix";

/// Message encodings of what has no declared type.
pub const RAW_ENCODING: &str = "rtdeploy.raw";
pub const TIMING_ENCODING: &str = "rtdeploy.timing";

/// The mapping from CLOCK_MONOTONIC (message send times) to wall-clock
/// nanoseconds since the epoch (MCAP log times), fixed for a file: log
/// times within a file keep the order and spacing of the monotonic
/// clock, whatever the wall clock does meanwhile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockMap {
    pub monotonic_ns: u64,
    pub realtime_ns: u64,
}

impl ClockMap {
    /// Reads both clocks now (the monotonic one on either side of the
    /// wall clock, and their midpoint taken).
    pub fn now() -> ClockMap {
        let a = controller::Monotonic::now().as_nanos();
        let real = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos().min(u64::MAX as u128) as u64)
            .unwrap_or(0);
        let b = controller::Monotonic::now().as_nanos();
        ClockMap {
            monotonic_ns: a + (b - a) / 2,
            realtime_ns: real,
        }
    }

    pub fn to_wall(&self, monotonic_ns: u64) -> u64 {
        (self.realtime_ns as i128 + monotonic_ns as i128 - self.monotonic_ns as i128)
            .clamp(0, u64::MAX as i128) as u64
    }

    pub fn to_monotonic(&self, wall_ns: u64) -> u64 {
        (self.monotonic_ns as i128 + wall_ns as i128 - self.realtime_ns as i128)
            .clamp(0, u64::MAX as i128) as u64
    }

    pub fn metadata(&self, boot_id: &str) -> BTreeMap<String, String> {
        [
            ("monotonic_ns".to_string(), self.monotonic_ns.to_string()),
            ("realtime_ns".to_string(), self.realtime_ns.to_string()),
            ("boot_id".to_string(), boot_id.to_string()),
        ]
        .into()
    }

    pub fn from_metadata(m: &BTreeMap<String, String>) -> Option<ClockMap> {
        Some(ClockMap {
            monotonic_ns: m.get("monotonic_ns")?.parse().ok()?,
            realtime_ns: m.get("realtime_ns")?.parse().ok()?,
        })
    }
}

/// A file that counts what was written to it; "seeks" only to where it is
/// (the MCAP writer asks for its position and never moves it when
/// seeking is disabled).
#[derive(Debug)]
pub struct Counted {
    file: File,
    pos: u64,
    written: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Write for Counted {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        self.pos += n as u64;
        self.written
            .store(self.pos, std::sync::atomic::Ordering::Relaxed);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

impl Seek for Counted {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        match pos {
            SeekFrom::Current(0) => Ok(self.pos),
            _ => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the log writer does not seek",
            )),
        }
    }
}

/// What a channel of the file is: its topic and how its messages are
/// written.
#[derive(Debug, Clone)]
pub struct TopicSpec {
    pub topic: String,
    /// The declared type: `ros2msg` schema, `cdr` messages.
    pub layout: Option<Layout>,
    /// The message encoding when there is no declared type.
    pub raw_encoding: &'static str,
    pub metadata: BTreeMap<String, String>,
}

/// An MCAP file being written.
pub struct LogFile {
    w: mcap::Writer<Counted>,
    path: PathBuf,
    pub clock: ClockMap,
    /// topic -> (channel id, writes a CDR header in front)
    ids: BTreeMap<String, (u16, bool)>,
    /// Messages written per topic.
    pub counts: BTreeMap<String, u64>,
    pub opened_mono: u64,
    written: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// The same file, for fdatasync.
    sync: File,
}

impl LogFile {
    /// Creates `path` (which must not exist) and writes the header and the
    /// clock mapping.
    pub fn create(
        path: &Path,
        chunk_size: u64,
        boot_id: &str,
        clock: ClockMap,
    ) -> io::Result<LogFile> {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)?;
        let opts = mcap::WriteOptions::new()
            .profile("")
            .library(concat!("rtdeploy ", env!("CARGO_PKG_VERSION")))
            .chunk_size(Some(chunk_size))
            .compression(Some(mcap::Compression::Zstd))
            // zstd level 1: at 100k small messages a second it takes 11%
            // of a CPU against level 3's 16%, for the same size on disk
            // (`cargo bench -p logbook`); no worker threads: the logger's
            // own thread, on a housekeeping CPU, does the compressing.
            .compression_level(1)
            .compression_threads(0)
            // Readers seek by chunk (the chunk index in the summary keeps
            // each chunk's time range); per-message indexes, uncompressed,
            // would cost 16 bytes a message, more than a small message
            // takes compressed.
            .emit_message_indexes(false)
            .disable_seeking(true);
        let sync = file.try_clone()?;
        let written = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut w = opts
            .create(Counted {
                file,
                pos: 0,
                written: written.clone(),
            })
            .map_err(mcap_io)?;
        w.write_metadata(&mcap::records::Metadata {
            name: CLOCK_METADATA.into(),
            metadata: clock.metadata(boot_id),
        })
        .map_err(mcap_io)?;
        Ok(LogFile {
            w,
            path: path.to_path_buf(),
            clock,
            ids: BTreeMap::new(),
            counts: BTreeMap::new(),
            opened_mono: clock.monotonic_ns,
            written,
            sync,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Adds a topic (once).
    pub fn add(&mut self, spec: &TopicSpec) -> io::Result<()> {
        if self.ids.contains_key(&spec.topic) {
            return Ok(());
        }
        let (schema, encoding, prefix) = match &spec.layout {
            Some(l) => {
                let id = self
                    .w
                    .add_schema(&l.schema_name(), "ros2msg", l.ros2msg().as_bytes())
                    .map_err(mcap_io)?;
                (id, "cdr", true)
            }
            None if spec.raw_encoding == "json" => {
                let id = self
                    .w
                    .add_schema(
                        &spec.topic,
                        "jsonschema",
                        json_schema(&spec.topic).as_bytes(),
                    )
                    .map_err(mcap_io)?;
                (id, "json", false)
            }
            None => (0, spec.raw_encoding, false),
        };
        let mut meta = spec.metadata.clone();
        if spec.raw_encoding != "json" {
            meta.insert(
                META_PREFIX.into(),
                if prefix { "cdr" } else { "none" }.into(),
            );
        }
        let id = self
            .w
            .add_channel(schema, &spec.topic, encoding, &meta)
            .map_err(mcap_io)?;
        self.ids.insert(spec.topic.clone(), (id, prefix));
        Ok(())
    }

    /// Writes one message of an added topic, sent at `send_mono` (our
    /// clock), with `sequence` (the queue index's low 32 bits).
    pub fn write(
        &mut self,
        topic: &str,
        sequence: u32,
        send_mono: u64,
        data: &[u8],
        scratch: &mut Vec<u8>,
    ) -> io::Result<()> {
        let Some(&(id, prefix)) = self.ids.get(topic) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("topic {topic} was not added"),
            ));
        };
        let t = self.clock.to_wall(send_mono);
        let header = MessageHeader {
            channel_id: id,
            sequence,
            log_time: t,
            publish_time: t,
        };
        let bytes = if prefix {
            scratch.clear();
            scratch.extend_from_slice(&CDR_HEADER);
            scratch.extend_from_slice(data);
            &scratch[..]
        } else {
            data
        };
        self.w
            .write_to_known_channel(&header, bytes)
            .map_err(mcap_io)?;
        match self.counts.get_mut(topic) {
            Some(n) => *n += 1,
            None => {
                self.counts.insert(topic.to_string(), 1);
            }
        }
        Ok(())
    }

    /// Writes the chunk being built and flushes the file.
    pub fn flush(&mut self) -> io::Result<()> {
        self.w.flush().map_err(mcap_io)
    }

    /// Makes what was written durable (the chunk being built is not).
    pub fn sync(&self) -> io::Result<()> {
        self.sync.sync_data()
    }

    /// Bytes written to the file so far (the chunk being built is not).
    pub fn written(&self) -> u64 {
        self.written.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Writes the index and summary, and syncs the file.
    pub fn finish(mut self) -> io::Result<PathBuf> {
        self.w.finish().map_err(mcap_io)?;
        let c = self.w.into_inner();
        c.file.sync_all()?;
        Ok(self.path)
    }
}

/// MCAP errors as I/O errors (a full disk stays `StorageFull`).
pub fn mcap_io(e: mcap::McapError) -> io::Error {
    match e {
        mcap::McapError::Io(e) => e,
        e => io::Error::other(e.to_string()),
    }
}

/// The JSON Schema of the logger's own topics.
pub fn json_schema(topic: &str) -> String {
    let props = match topic {
        EVENTS_TOPIC => serde_json::json!({
            "kind": {"type": "string", "description": "start, exit, restart, crash_loop, budget, boot_check, trial, commit, rollback, supervisor, logger"},
            "process": {"type": ["string", "null"]},
            "message": {"type": "string"},
            "monotonic_ns": {"type": "integer"}
        }),
        GAPS_TOPIC => serde_json::json!({
            "channel": {"type": "string"},
            "from_index": {"type": "integer"},
            "count": {"type": "integer"},
            "reason": {"type": "string"}
        }),
        _ => serde_json::json!({
            "channel": {"type": "string"},
            "index": {"type": "integer"},
            "pid": {"type": "integer"}
        }),
    };
    serde_json::json!({"type": "object", "properties": props}).to_string()
}
