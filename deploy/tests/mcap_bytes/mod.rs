//! MCAP files built byte by byte (the format's records as its
//! specification lays them out), for the hostile cases no writer makes: a
//! chunk whose CRC does not match, chunks that expand a thousandfold.

#![allow(dead_code)]

/// An MCAP file under construction: the magic, then records.
pub struct Mcap {
    pub bytes: Vec<u8>,
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// One record: opcode, length, body.
pub fn record(op: u8, body: &[u8]) -> Vec<u8> {
    let mut r = vec![op];
    r.extend_from_slice(&(body.len() as u64).to_le_bytes());
    r.extend_from_slice(body);
    r
}

/// A message record of channel 1.
pub fn message(seq: u32, log_time: u64, data: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&1u16.to_le_bytes());
    b.extend_from_slice(&seq.to_le_bytes());
    b.extend_from_slice(&log_time.to_le_bytes());
    b.extend_from_slice(&log_time.to_le_bytes());
    b.extend_from_slice(data);
    record(0x05, &b)
}

impl Mcap {
    /// The magic, a header, and channel 1 `topic` (`json` messages, no
    /// schema).
    pub fn new(topic: &str) -> Mcap {
        let mut bytes = b"\x89MCAP0\r\n".to_vec();
        let mut h = Vec::new();
        string(&mut h, "");
        string(&mut h, "hand-built");
        bytes.extend(record(0x01, &h));
        let mut c = Vec::new();
        c.extend_from_slice(&1u16.to_le_bytes());
        c.extend_from_slice(&0u16.to_le_bytes());
        string(&mut c, topic);
        string(&mut c, "json");
        c.extend_from_slice(&0u32.to_le_bytes()); // no metadata
        bytes.extend(record(0x04, &c));
        Mcap { bytes }
    }

    /// A chunk of `records`, zstd-compressed at `level` (or not, at 0),
    /// with `crc` as its header's CRC of the records (`None`: the right
    /// one).
    pub fn chunk(&mut self, records: &[u8], level: i32, crc: Option<u32>, t: (u64, u64)) {
        let (compression, data) = if level == 0 {
            ("", records.to_vec())
        } else {
            ("zstd", zstd::bulk::compress(records, level).unwrap())
        };
        let mut b = Vec::new();
        b.extend_from_slice(&t.0.to_le_bytes());
        b.extend_from_slice(&t.1.to_le_bytes());
        b.extend_from_slice(&(records.len() as u64).to_le_bytes());
        b.extend_from_slice(
            &crc.unwrap_or_else(|| crc32fast::hash(records))
                .to_le_bytes(),
        );
        string(&mut b, compression);
        b.extend_from_slice(&(data.len() as u64).to_le_bytes());
        b.extend_from_slice(&data);
        self.bytes.extend(record(0x06, &b));
    }

    /// The data-end record (a data section CRC of 0: not given).
    pub fn finish(mut self) -> Vec<u8> {
        self.bytes.extend(record(0x0F, &0u32.to_le_bytes()));
        self.bytes.extend_from_slice(b"\x89MCAP0\r\n");
        self.bytes
    }
}

/// `n` messages of `{"v":<i>}` at 1 ms apart from `t0`.
pub fn json_messages(first: u32, n: u32, t0: u64) -> Vec<u8> {
    let mut r = Vec::new();
    for i in first..first + n {
        r.extend(message(
            i,
            t0 + u64::from(i) * 1_000_000,
            format!("{{\"v\":{i}}}").as_bytes(),
        ));
    }
    r
}
