//! Why reading a file stopped before the end of its data section, and why
//! a record's bytes are not one this reader can use: said, with their
//! causes, in [`Summary::truncated`](super::Summary::truncated).

use std::io;

use super::{EXPANSION_FLOOR, MAX_EXPANSION, MAX_HELD, MAX_RECORD};

/// Why a record's bytes are not a record this reader can use ([`parse`](super::parse)).
#[derive(Debug, thiserror::Error)]
pub(super) enum RecordParseError {
    #[error("a length inside it goes past its end")]
    LengthPastEnd,
    #[error(transparent)]
    Mcap(#[from] mcap::McapError),
}

/// A chunk, by its number and where its record starts.
#[derive(Debug, Clone, Copy)]
pub(super) struct ChunkAt {
    pub(super) n: u64,
    pub(super) at: u64,
}

impl std::fmt::Display for ChunkAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "chunk {} (at byte {})", self.n, self.at)
    }
}

/// Why a walk over the records stopped before the data section's end
/// (said, with its causes, in [`Summary::truncated`](super::Summary::truncated)).
#[derive(Debug, thiserror::Error)]
pub(super) enum RecordWalkError {
    #[error("the record at byte {at} (opcode {op:#04x}) is not valid")]
    Record {
        at: u64,
        op: u8,
        source: RecordParseError,
    },
    #[error("{chunk} says its records are {declared} bytes, more than the {max} a chunk may be: not read", max = MAX_RECORD)]
    ChunkTooLarge { chunk: ChunkAt, declared: u64 },
    #[error("{chunk} would take what the chunks expand to past {budget} bytes ({times} times the {read} bytes read, and {floor}): not read (a file that compresses this well is refused by this reader)", times = MAX_EXPANSION, floor = EXPANSION_FLOOR)]
    Expansion {
        chunk: ChunkAt,
        budget: u64,
        read: u64,
    },
    #[error("{chunk} is uncompressed with {len} bytes of records, its header says {declared}")]
    UncompressedSize {
        chunk: ChunkAt,
        len: usize,
        declared: u64,
    },
    #[error("{chunk}: zstd")]
    ZstdStart { chunk: ChunkAt, source: io::Error },
    #[error("{chunk} does not decompress: zstd")]
    Zstd { chunk: ChunkAt, source: io::Error },
    #[error("{chunk} decompresses to {len} bytes, its header says {declared}")]
    DecompressedSize {
        chunk: ChunkAt,
        len: usize,
        declared: u64,
    },
    /// At most 32 characters of what the chunk names.
    #[error("{chunk} is compressed with `{compression}`, which this reader does not read (zstd or none)")]
    Compression { chunk: ChunkAt, compression: String },
    #[error("{chunk}: its records' CRC is {crc:#010x}, its header says {declared:#010x}: the chunk is damaged, none of its messages is read")]
    Crc {
        chunk: ChunkAt,
        crc: u32,
        declared: u32,
    },
    #[error("{chunk}: record {k} is cut short")]
    CutShort { chunk: ChunkAt, k: u64 },
    #[error("{chunk}: record {k} says it is {len} bytes, past the chunk's end")]
    PastChunkEnd { chunk: ChunkAt, k: u64, len: u64 },
    #[error("{chunk}: record {k} is a chunk inside a chunk")]
    ChunkInChunk { chunk: ChunkAt, k: u64 },
    #[error("{chunk}: record {k} (opcode {op:#04x}) is not valid")]
    ChunkRecord {
        chunk: ChunkAt,
        k: u64,
        op: u8,
        source: RecordParseError,
    },
    #[error("more than {max} bytes of schemas, channels, metadata and gap records: reading stopped", max = MAX_HELD)]
    TooMuchHeld,
    #[error("a message of channel id {channel_id} that no channel record declared")]
    UnknownChannel { channel_id: u16 },
}
