//! The update protocol between `deploy update` (the sender, on the build
//! host) and `deploy serve-update` (the robot, on the other end of ssh's
//! stdin/stdout).
//!
//! Every message is a frame: one kind byte, a big-endian u32 payload
//! length, the payload. The exchange:
//!
//! ```text
//! sender                              robot
//! HELLO "rtdeploy-update/1"   ->
//!                             <-      HELLO "rtdeploy-update/1"
//! MANIFEST u32 len, manifest, sig ->  verifies signature and robot/board
//!                             <-      NEED {release, need: [{sha256, offset, size, prefix_sha256}]}
//!                                     (or ERROR message)
//! for each needed blob, from `offset` (or from 0, see below):
//!   BLOB_START {sha256, offset} ->
//!   BLOB_DATA zstd stream bytes ...-> decompressed into store/.partial/<sha>,
//!                                     never past the blob's manifest size
//!   BLOB_END                    ->    sha256 checked, moved into the store
//! INSTALL                     ->      installs from the store
//!                             <-      DONE {report}  (or ERROR message)
//! ```
//!
//! A cut connection leaves `store/.partial/<sha>` behind; the next NEED
//! names its length as the offset and the sha256 of those bytes as
//! `prefix_sha256`. The sender resumes there only when its own first
//! `offset` bytes hash the same, and otherwise sends the blob from 0 (the
//! robot then starts the partial file over), so a partial left by a broken
//! or hostile sender costs one resend, not a failed update. (A robot that
//! sends no `prefix_sha256` is trusted to hold the right bytes.)
//!
//! Each frame kind has its own payload limit ([`max_payload`]), checked
//! before the payload is read, and a payload is read as it arrives, so a
//! peer that announces a large frame and sends nothing costs nothing.

use std::io::{self, BufReader, Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::hash::{Sha256Hex, Sha256Writer};
use super::quote::{peer_message, quoted, quoted_bytes};
use super::read::{BundleReadError, BundleReader, MAX_MANIFEST, MAX_SIGNATURE};

/// The protocol name and version exchanged in HELLO.
pub const PROTOCOL: &str = "rtdeploy-update/1";
/// The largest frame payload accepted (NEED and DONE, which grow with the
/// number of files of a release); the other kinds have smaller limits,
/// see [`max_payload`].
pub const MAX_FRAME: u32 = 64 << 20;
/// The largest BLOB_DATA payload accepted: the sender cuts its zstd output
/// into frames of 64 KiB plus at most one zstd output buffer (128 KiB).
pub const MAX_DATA_FRAME: u32 = 1 << 20;
/// The most characters of the peer's ERROR text shown in an error.
pub const MAX_ERROR_SHOWN: usize = 2000;
/// zstd level on the wire: a good ratio at a speed above Wi-Fi rates.
pub const WIRE_ZSTD_LEVEL: i32 = 9;
/// BLOB_DATA frames carry at most this many compressed bytes.
const DATA_FRAME: usize = 64 << 10;

/// Frame kinds.
pub mod kind {
    pub const HELLO: u8 = 1;
    pub const MANIFEST: u8 = 2;
    pub const NEED: u8 = 3;
    pub const BLOB_START: u8 = 4;
    pub const BLOB_DATA: u8 = 5;
    pub const BLOB_END: u8 = 6;
    pub const INSTALL: u8 = 7;
    pub const DONE: u8 = 8;
    pub const ERROR: u8 = 9;
}

/// One blob the robot lacks, and how much of it it already has.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Needed {
    pub sha256: String,
    pub offset: u64,
    pub size: u64,
    /// sha256 of the first `offset` bytes the robot holds (absent when
    /// `offset` is 0, and from robots that predate it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_sha256: Option<String>,
}

/// The robot's answer to MANIFEST.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Need {
    /// `<version>-<sha8>` of the release.
    pub release: String,
    pub need: Vec<Needed>,
}

/// BLOB_START's payload.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BlobStart {
    pub sha256: String,
    pub offset: u64,
}

/// Why the exchange failed, seen from the sender.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("connection: {0}")]
    Io(io::Error),
    #[error("update protocol: {0}")]
    Protocol(String),
    #[error("robot refused: {0}")]
    Remote(String),
    #[error(transparent)]
    Bundle(#[from] BundleReadError),
}

impl From<io::Error> for WireError {
    /// A payload over its limit or a frame of no known kind is the peer
    /// breaking the protocol; anything else is the connection.
    fn from(e: io::Error) -> Self {
        if e.kind() == io::ErrorKind::InvalidData {
            WireError::Protocol(e.to_string())
        } else {
            WireError::Io(e)
        }
    }
}

/// The largest payload a frame of `kind` may carry; `None` for a kind
/// this protocol does not have.
pub fn max_payload(k: u8) -> Option<u32> {
    Some(match k {
        kind::HELLO => 64,
        kind::MANIFEST => 4 + MAX_MANIFEST as u32 + MAX_SIGNATURE as u32,
        kind::NEED | kind::DONE => MAX_FRAME,
        kind::BLOB_START => 4096,
        kind::BLOB_DATA => MAX_DATA_FRAME,
        kind::BLOB_END | kind::INSTALL => 0,
        kind::ERROR => 64 << 10,
        _ => return None,
    })
}

/// Writes one frame.
pub fn write_frame(w: &mut impl Write, kind: u8, payload: &[u8]) -> io::Result<()> {
    let len = u32::try_from(payload.len()).map_err(|_| io::Error::other("frame too large"))?;
    let mut head = [0u8; 5];
    head[0] = kind;
    head[1..].copy_from_slice(&len.to_be_bytes());
    w.write_all(&head)?;
    w.write_all(payload)
}

/// Reads one frame; `None` on a clean end of stream between frames.
pub fn read_frame(r: &mut impl Read) -> io::Result<Option<(u8, Vec<u8>)>> {
    let mut head = [0u8; 5];
    let mut got = 0;
    while got < head.len() {
        match r.read(&mut head[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let k = head[0];
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]);
    let Some(max) = max_payload(k) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of kind {k}, which this protocol does not have"),
        ));
    };
    if len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of kind {k} with {len} bytes (at most {max})"),
        ));
    }
    // Grown as bytes arrive, not allocated up front for what the peer
    // announced.
    let mut payload = Vec::with_capacity((len as usize).min(64 << 10));
    let got = r.take(u64::from(len)).read_to_end(&mut payload)?;
    if got < len as usize {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("the connection ended inside a frame of kind {k}, {got} of {len} bytes"),
        ));
    }
    Ok(Some((k, payload)))
}

/// MANIFEST's payload.
pub fn encode_manifest(manifest: &[u8], sig: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(4 + manifest.len() + sig.len());
    v.extend_from_slice(&(manifest.len() as u32).to_be_bytes());
    v.extend_from_slice(manifest);
    v.extend_from_slice(sig);
    v
}

/// Splits MANIFEST's payload into (manifest, signature); `None` when the
/// lengths do not add up or are over [`MAX_MANIFEST`] and
/// [`MAX_SIGNATURE`].
pub fn decode_manifest(p: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    let len = u32::from_be_bytes(p.get(..4)?.try_into().ok()?) as usize;
    if len as u64 > MAX_MANIFEST {
        return None;
    }
    let m = p.get(4..4usize.checked_add(len)?)?;
    let sig = &p[4 + len..];
    if sig.len() as u64 > MAX_SIGNATURE {
        return None;
    }
    Some((m.to_vec(), sig.to_vec()))
}

/// What the sender reports as it goes.
#[derive(Debug, Clone, Copy)]
pub enum Progress {
    /// The robot needs this many blob bytes (after what it already has).
    Need { blobs: usize, bytes: u64 },
    /// Uncompressed blob bytes sent so far.
    Sent { bytes: u64 },
    /// Every blob is there; the robot is installing.
    Installing,
}

/// Options of the sender.
#[derive(Debug, Clone, Default)]
pub struct SendOptions {
    /// Test hook: fail as if the connection broke after this many bytes
    /// were written.
    pub cut_after: Option<u64>,
}

/// What the sender did.
#[derive(Debug, Clone, Serialize)]
pub struct SendReport {
    pub release: String,
    /// Blobs sent (in whole or from a resume offset).
    pub blobs_sent: usize,
    /// Blobs the robot already had.
    pub blobs_skipped: usize,
    /// Bytes the robot already had of the blobs it needed (resumed).
    pub resumed_bytes: u64,
    /// Bytes written to / read from the connection, frames included.
    pub bytes_out: u64,
    pub bytes_in: u64,
    /// The robot's install report (DONE's payload).
    pub result: serde_json::Value,
}

struct Counting<W> {
    inner: W,
    n: u64,
    cut_after: Option<u64>,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut buf = buf;
        if let Some(cut) = self.cut_after {
            if self.n >= cut {
                return Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "connection cut by the test hook",
                ));
            }
            buf = &buf[..buf.len().min((cut - self.n) as usize)];
        }
        let n = self.inner.write(buf)?;
        self.n += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

struct CountingRead<R> {
    inner: R,
    n: u64,
}

impl<R: Read> Read for CountingRead<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.n += n as u64;
        Ok(n)
    }
}

/// Collects compressed bytes into BLOB_DATA frames.
struct DataFrames<'a, W: Write> {
    out: &'a mut W,
    buf: Vec<u8>,
}

impl<W: Write> DataFrames<'_, W> {
    fn emit(&mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            write_frame(self.out, kind::BLOB_DATA, &self.buf)?;
            self.buf.clear();
        }
        Ok(())
    }
}

impl<W: Write> Write for DataFrames<'_, W> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(b);
        if self.buf.len() >= DATA_FRAME {
            self.emit()?;
        }
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        self.emit()?;
        self.out.flush()
    }
}

fn expect(r: &mut impl Read, want: u8) -> Result<Vec<u8>, WireError> {
    match read_frame(r)? {
        Some((k, p)) if k == want => Ok(p),
        Some((kind::ERROR, p)) => Err(WireError::Remote(peer_message(&p, MAX_ERROR_SHOWN))),
        Some((k, _)) => Err(WireError::Protocol(format!(
            "unexpected frame kind {k} (expected {want})"
        ))),
        None => Err(WireError::Protocol(
            "the robot closed the connection".into(),
        )),
    }
}

/// Sends `bundle` to a robot at the other end of `r`/`w`: the manifest
/// first, then only the blobs (and parts of blobs) the robot lacks,
/// zstd-compressed, then asks it to install.
pub fn send_bundle(
    bundle: &Path,
    r: impl Read,
    w: impl Write,
    opts: &SendOptions,
    progress: &mut dyn FnMut(Progress),
) -> Result<SendReport, WireError> {
    let open = |p: &Path| {
        units::bounded::Bound::regular(u64::MAX)
            .following_links()
            .open(p)
            .map_err(|e| e.into_io())
            .map(BufReader::new)
            .map_err(|err| BundleReadError::Open {
                path: PathBuf::from(p),
                err,
            })
    };
    let (manifest, sig) = BundleReader::read_manifest(open(bundle)?)?;
    let mut w = Counting {
        inner: w,
        n: 0,
        cut_after: opts.cut_after,
    };
    let mut r = CountingRead { inner: r, n: 0 };
    write_frame(&mut w, kind::HELLO, PROTOCOL.as_bytes())?;
    w.flush()?;
    let hello = expect(&mut r, kind::HELLO)?;
    if hello != PROTOCOL.as_bytes() {
        return Err(WireError::Protocol(format!(
            "robot speaks {} (expected `{PROTOCOL}`)",
            quoted_bytes(&hello)
        )));
    }
    write_frame(&mut w, kind::MANIFEST, &encode_manifest(&manifest, &sig))?;
    w.flush()?;
    let mut need: Need = serde_json::from_slice(&expect(&mut r, kind::NEED)?)
        .map_err(|e| WireError::Protocol(format!("bad NEED: {}", quoted(&e.to_string()))))?;
    if need.need.iter().any(|n| n.offset > 0) {
        check_prefixes(open(bundle)?, &mut need.need)?;
    }
    let total_blobs = crate::bundle::Manifest::parse(&manifest)
        .map(|m| m.blobs().len())
        .unwrap_or(0);
    let mut wanted: std::collections::BTreeMap<String, Needed> = need
        .need
        .iter()
        .map(|n| (n.sha256.clone(), n.clone()))
        .collect();
    let bytes: u64 = need
        .need
        .iter()
        .map(|n| n.size - n.offset.min(n.size))
        .sum();
    let resumed_bytes: u64 = need.need.iter().map(|n| n.offset).sum();
    progress(Progress::Need {
        blobs: need.need.len(),
        bytes,
    });
    let mut sent = 0u64;
    let mut blobs_sent = 0;
    if !wanted.is_empty() {
        BundleReader::for_each_blob(open(bundle)?, |sha: &Sha256Hex, data: &mut dyn Read| {
            let Some(n) = wanted.remove(sha.as_str()) else {
                return Ok(());
            };
            io::copy(&mut data.take(n.offset), &mut io::sink())?;
            let start = serde_json::to_vec(&BlobStart {
                sha256: n.sha256.clone(),
                offset: n.offset,
            })?;
            write_frame(&mut w, kind::BLOB_START, &start)?;
            let mut frames = DataFrames {
                out: &mut w,
                buf: Vec::with_capacity(DATA_FRAME),
            };
            let mut enc = zstd::stream::write::Encoder::new(&mut frames, WIRE_ZSTD_LEVEL)?;
            let mut buf = vec![0u8; 256 << 10];
            loop {
                let k = data.read(&mut buf)?;
                if k == 0 {
                    break;
                }
                enc.write_all(&buf[..k])?;
                sent += k as u64;
                progress(Progress::Sent { bytes: sent });
            }
            enc.finish()?;
            frames.flush()?;
            write_frame(&mut w, kind::BLOB_END, &[])?;
            blobs_sent += 1;
            Ok(())
        })
        .map_err(|e| match e {
            BundleReadError::Stage { err, .. } => WireError::from(err),
            e => WireError::Bundle(e),
        })?;
    }
    if let Some(sha) = wanted.keys().next() {
        return Err(WireError::Protocol(format!(
            "the robot asked for blob {}, which the bundle does not hold",
            quoted(sha)
        )));
    }
    write_frame(&mut w, kind::INSTALL, &[])?;
    w.flush()?;
    progress(Progress::Installing);
    let done = expect(&mut r, kind::DONE)?;
    let result = serde_json::from_slice(&done).unwrap_or(serde_json::Value::Null);
    Ok(SendReport {
        release: need.release,
        blobs_sent,
        blobs_skipped: total_blobs.saturating_sub(need.need.len()),
        resumed_bytes,
        bytes_out: w.n,
        bytes_in: r.n,
        result,
    })
}

/// For each blob the robot holds a part of: resumes from its offset only
/// when the robot's `prefix_sha256` is the sha256 of the bundle's own
/// first `offset` bytes of that blob; otherwise sends it from 0.
fn check_prefixes(bundle: impl Read, need: &mut [Needed]) -> Result<(), WireError> {
    let mut partial: std::collections::BTreeMap<String, &mut Needed> = need
        .iter_mut()
        .filter(|n| n.offset > 0 && n.prefix_sha256.is_some())
        .map(|n| (n.sha256.clone(), n))
        .collect();
    BundleReader::for_each_blob(bundle, |sha, data| {
        let Some(n) = partial.remove(sha.as_str()) else {
            return Ok(());
        };
        let mut h = Sha256Writer::new(io::sink());
        let len = io::copy(&mut data.take(n.offset), &mut h)?;
        let (got, _) = h.finish();
        if len < n.offset || n.prefix_sha256.as_deref() != Some(got.as_str()) {
            n.offset = 0;
            n.prefix_sha256 = None;
        }
        Ok(())
    })
    .map_err(|e| match e {
        BundleReadError::Stage { err, .. } => WireError::from(err),
        e => WireError::Bundle(e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_reject_oversize() {
        let mut v = Vec::new();
        write_frame(&mut v, kind::NEED, b"abc").unwrap();
        write_frame(&mut v, kind::INSTALL, b"").unwrap();
        let mut r = &v[..];
        assert_eq!(
            read_frame(&mut r).unwrap(),
            Some((kind::NEED, b"abc".to_vec()))
        );
        assert_eq!(read_frame(&mut r).unwrap(), Some((kind::INSTALL, vec![])));
        assert_eq!(read_frame(&mut r).unwrap(), None);
        let big = [kind::BLOB_DATA, 0xff, 0xff, 0xff, 0xff];
        assert!(read_frame(&mut &big[..]).is_err());
        // each kind has its own limit, checked before the payload is read
        let e = read_frame(&mut &[kind::HELLO, 0, 0, 1, 0][..]).unwrap_err();
        assert_eq!(e.to_string(), "frame of kind 1 with 256 bytes (at most 64)");
        let e = read_frame(&mut &[kind::INSTALL, 0, 0, 0, 1, 0][..]).unwrap_err();
        assert!(e.to_string().contains("at most 0"), "{e}");
        let e = read_frame(&mut &[42, 0, 0, 0, 0][..]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("kind 42"), "{e}");
        // a frame announced larger than what follows is an error, after
        // reading only what arrived
        let e = read_frame(&mut &[kind::NEED, 0, 0, 0, 9, b'x'][..]).unwrap_err();
        assert!(e.to_string().contains("1 of 9 bytes"), "{e}");
        // cut inside a header is an error, not a clean end
        assert!(read_frame(&mut &v[..3]).is_err());
    }

    #[test]
    fn manifest_payload_round_trips() {
        let p = encode_manifest(b"{}", &[7u8; 64]);
        assert_eq!(decode_manifest(&p), Some((b"{}".to_vec(), vec![7u8; 64])));
        assert_eq!(decode_manifest(&[0, 0, 0, 9, 1]), None);
        assert_eq!(decode_manifest(&[0xff, 0xff, 0xff, 0xff]), None);
        assert_eq!(decode_manifest(&encode_manifest(b"{}", &[7u8; 65])), None);
    }
}
