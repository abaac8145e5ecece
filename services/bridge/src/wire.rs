//! What one rtdeploy board sends another for each forwarded message, on
//! `rtdeploy/<robot>/<channel>`: a 64-byte header, then the message as
//! published.
//!
//! ```text
//!  0  magic "RTB1"
//!  4  header length (64), u16        6  flags (0), u16
//!  8  the message's queue index on the sending board, u64
//! 16  its send time, the sender's CLOCK_MONOTONIC, ns, u64
//! 24  its send time, the sender's CLOCK_REALTIME, ns, u64
//! 32  the layout hash of the channel's type there (0: none), u64
//! 40  the sender's boot id, 16 bytes
//! 56  reserved (0), u64
//! 64  the message
//! ```
//!
//! All little endian. The bytes come from the network: [`Header::decode`]
//! checks every field it uses and refuses the rest, never panics.

/// The magic.
pub const MAGIC: [u8; 4] = *b"RTB1";
/// The header's size.
pub const HEADER: usize = 64;

/// A forwarded message's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub index: u64,
    pub send_mono_ns: u64,
    pub send_real_ns: u64,
    pub layout_hash: u64,
    pub boot_id: [u8; 16],
}

/// Why bytes are not a forwarded message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("{0} bytes: shorter than the {HEADER}-byte header")]
    Short(usize),
    #[error("not a forwarded message (magic {0:02x?})")]
    Magic([u8; 4]),
    #[error("a header of {0} bytes (this bridge reads {HEADER})")]
    HeaderLength(u16),
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

impl Header {
    /// The header followed by `payload`, into `out`.
    pub fn encode(&self, payload: &[u8], out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&(HEADER as u16).to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        for v in [
            self.index,
            self.send_mono_ns,
            self.send_real_ns,
            self.layout_hash,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.boot_id);
        out.extend_from_slice(&0u64.to_le_bytes());
        out.extend_from_slice(payload);
    }

    /// The header and the message of `b`.
    pub fn decode(b: &[u8]) -> Result<(Header, &[u8]), WireError> {
        if b.len() < HEADER {
            return Err(WireError::Short(b.len()));
        }
        let magic: [u8; 4] = b[0..4].try_into().expect("4 bytes");
        if magic != MAGIC {
            return Err(WireError::Magic(magic));
        }
        let len = u16::from_le_bytes([b[4], b[5]]);
        if len as usize != HEADER {
            return Err(WireError::HeaderLength(len));
        }
        let mut boot_id = [0u8; 16];
        boot_id.copy_from_slice(&b[40..56]);
        Ok((
            Header {
                index: u64_at(b, 8),
                send_mono_ns: u64_at(b, 16),
                send_real_ns: u64_at(b, 24),
                layout_hash: u64_at(b, 32),
                boot_id,
            },
            &b[HEADER..],
        ))
    }
}

/// The boot id (`/proc/sys/kernel/random/boot_id`, a UUID) as 16 bytes;
/// zeros when it cannot be read.
pub fn boot_id(proc_root: &std::path::Path) -> [u8; 16] {
    // A UUID is 36 characters and a newline; a larger file is not one.
    let text = units::bounded::Bound::pseudo(64)
        .read_text(&proc_root.join("sys/kernel/random/boot_id"))
        .unwrap_or_default();
    let hex: Vec<u8> = text
        .trim()
        .bytes()
        .filter(|c| c.is_ascii_hexdigit())
        .collect();
    let mut out = [0u8; 16];
    if hex.len() == 32 {
        for (i, pair) in hex.chunks(2).enumerate() {
            let s = std::str::from_utf8(pair).unwrap_or("00");
            out[i] = u8::from_str_radix(s, 16).unwrap_or(0);
        }
    }
    out
}

/// A boot id as its UUID text.
pub fn boot_id_text(b: &[u8; 16]) -> String {
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_what_is_not_one() {
        let h = Header {
            index: 41,
            send_mono_ns: 7,
            send_real_ns: 8,
            layout_hash: 0xfeed,
            boot_id: [3; 16],
        };
        let mut b = Vec::new();
        h.encode(b"payload", &mut b);
        assert_eq!(b.len(), HEADER + 7);
        assert_eq!(Header::decode(&b), Ok((h, &b"payload"[..])));
        assert_eq!(Header::decode(&b[..63]), Err(WireError::Short(63)));
        let mut m = b.clone();
        m[0] = b'X';
        assert!(matches!(Header::decode(&m), Err(WireError::Magic(_))));
        let mut l = b.clone();
        l[4] = 65;
        assert_eq!(Header::decode(&l), Err(WireError::HeaderLength(65)));
        // Any bytes: an answer, never a panic.
        for n in 0..200 {
            let junk: Vec<u8> = (0..n).map(|i| (i * 37 + n) as u8).collect();
            let _ = Header::decode(&junk);
        }
    }

    #[test]
    fn boot_ids_read_and_print_as_uuids() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("sys/kernel/random")).unwrap();
        std::fs::write(
            d.path().join("sys/kernel/random/boot_id"),
            "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0\n",
        )
        .unwrap();
        let b = boot_id(d.path());
        assert_eq!(b[0], 0x0f);
        assert_eq!(boot_id_text(&b), "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0");
        assert_eq!(boot_id(&d.path().join("nowhere")), [0; 16]);
        // A file that is no boot id (a strange /proc): zeros, read no
        // further than its bound.
        let mut long = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0".to_string();
        long.push_str(&"ab".repeat(1 << 20));
        std::fs::write(d.path().join("sys/kernel/random/boot_id"), long).unwrap();
        assert_eq!(boot_id(d.path()), [0; 16]);
    }
}
