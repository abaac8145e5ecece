//! The robot's side of `deploy update`: the update protocol
//! ([`crate::bundle::wire`]) spoken on a byte stream (ssh's stdin and
//! stdout), ending in an install from the store.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::path::Path;

use crate::bundle::wire::{self, kind, BlobStart, Need, Needed};
use crate::bundle::{
    load_trusted_keys, quoted, quoted_bytes, Receiver, Sha256Hex, Store, VerifiedManifest,
};
use crate::error::ReleaseError;
use crate::fault::fault_point;
use crate::install::{check_robot_yaml, install_from_store, InstallOptions, InstallReport};
use crate::layout::Layout;
use crate::lock::UpdateLock;

/// The robot's side of `deploy update` (see [`crate::bundle::wire`]):
/// verifies the manifest, asks only for the blobs (and blob tails) it
/// lacks, receives them into the store, then installs. An error is also
/// sent to the peer as an ERROR frame.
pub fn serve_update(
    prefix: &Path,
    opts: &InstallOptions,
    r: impl Read,
    w: impl Write,
) -> Result<Option<InstallReport>, ReleaseError> {
    let mut r = io::BufReader::new(r);
    let mut w = io::BufWriter::new(w);
    let result = serve_inner(prefix, opts, &mut r, &mut w);
    if let Err(e) = &result {
        let _ = wire::write_frame(&mut w, kind::ERROR, e.to_string().as_bytes());
        let _ = w.flush();
    }
    result
}

fn proto(why: impl Into<String>) -> ReleaseError {
    ReleaseError::Protocol(why.into())
}

/// A frame over its kind's limit, or of no known kind, is the sender
/// breaking the protocol; any other read or write error is the connection.
fn net(e: io::Error) -> ReleaseError {
    if e.kind() == io::ErrorKind::InvalidData {
        ReleaseError::Protocol(e.to_string())
    } else {
        ReleaseError::Connection(e)
    }
}

fn serve_inner(
    prefix: &Path,
    opts: &InstallOptions,
    r: &mut impl Read,
    w: &mut impl Write,
) -> Result<Option<InstallReport>, ReleaseError> {
    let layout = Layout::new(prefix);
    let store = layout.store();
    let frame = |r: &mut dyn Read| -> Result<Option<(u8, Vec<u8>)>, ReleaseError> {
        let mut r = r;
        wire::read_frame(&mut r).map_err(net)
    };
    match frame(r)? {
        Some((kind::HELLO, p)) if p == wire::PROTOCOL.as_bytes() => {}
        Some((kind::HELLO, p)) => {
            return Err(proto(format!(
                "the sender speaks {} (expected `{}`)",
                quoted_bytes(&p),
                wire::PROTOCOL
            )))
        }
        None => return Ok(None),
        Some((k, _)) => return Err(proto(format!("expected HELLO, got frame kind {k}"))),
    }
    wire::write_frame(w, kind::HELLO, wire::PROTOCOL.as_bytes()).map_err(net)?;
    w.flush().map_err(net)?;
    let p = match frame(r)? {
        Some((kind::MANIFEST, p)) => p,
        Some((k, _)) => return Err(proto(format!("expected MANIFEST, got frame kind {k}"))),
        None => return Err(proto("the sender closed the connection before MANIFEST")),
    };
    let (bytes, sig) =
        wire::decode_manifest(&p).ok_or_else(|| proto("malformed MANIFEST frame"))?;
    let trusted = load_trusted_keys(&layout.keys(), &opts.public_keys)?;
    let verified = VerifiedManifest::verify(bytes, &sig, &trusted, &opts.compat)?;
    check_robot_yaml(&verified, opts)?;
    let sizes: BTreeMap<Sha256Hex, u64> = verified.manifest.blobs().into_iter().collect();
    let modes: BTreeMap<String, u32> = verified
        .manifest
        .files
        .iter()
        .rev()
        .map(|f| (f.sha256.clone(), f.mode))
        .collect();
    // Partials of other releases, or longer than their blob, go before
    // anything is asked for.
    store.trim_partials(&sizes)?;
    let mut need = Vec::new();
    for (s, &size) in &sizes {
        if store.has(s) {
            continue;
        }
        let prefix = store.partial_prefix(s, size)?;
        need.push(Needed {
            sha256: s.to_string(),
            offset: prefix.as_ref().map_or(0, |(len, _)| *len),
            size,
            prefix_sha256: prefix.map(|(_, h)| h.to_string()),
        });
    }
    let need = Need {
        release: verified.release.clone(),
        need,
    };
    wire::write_frame(
        w,
        kind::NEED,
        &serde_json::to_vec(&need).expect("serializes"),
    )
    .map_err(net)?;
    w.flush().map_err(net)?;
    let mut receiving: Option<Receiver> = None;
    let received = receive_blobs(r, &store, &sizes, &modes, &mut receiving);
    if let Some(rx) = receiving.take() {
        // Cut or refused in the middle of a blob: what arrived is kept
        // for a resume (never more than the blob's size).
        let _ = rx.suspend();
    }
    let new_blobs = received?;
    let lock = UpdateLock::acquire(prefix, &opts.holder, opts.lock_timeout)?;
    fault_point("locked");
    let mut report = install_from_store(&layout, &verified, opts, &lock)?;
    report.new_blobs = new_blobs;
    wire::write_frame(
        w,
        kind::DONE,
        &serde_json::to_vec(&report).expect("serializes"),
    )
    .map_err(net)?;
    w.flush().map_err(net)?;
    Ok(Some(report))
}

/// Receives blobs until INSTALL; returns how many arrived whole. The blob
/// being received when it returns is left in `receiving`.
fn receive_blobs(
    r: &mut impl Read,
    store: &Store,
    sizes: &BTreeMap<Sha256Hex, u64>,
    modes: &BTreeMap<String, u32>,
    receiving: &mut Option<Receiver>,
) -> Result<usize, ReleaseError> {
    let mut new_blobs = 0;
    let mut current: Option<Sha256Hex> = None;
    loop {
        match wire::read_frame(r).map_err(net)? {
            Some((kind::BLOB_START, p)) => {
                let s: BlobStart = serde_json::from_slice(&p)
                    .map_err(|e| proto(format!("bad BLOB_START: {}", quoted(&e.to_string()))))?;
                let sha = Sha256Hex::parse(&s.sha256)
                    .filter(|sha| sizes.contains_key(sha))
                    .ok_or_else(|| {
                        proto(format!("blob {} is not in the manifest", quoted(&s.sha256)))
                    })?;
                if let Some(rx) = receiving.take() {
                    let _ = rx.suspend();
                }
                *receiving = Some(store.receive(&sha, s.offset, sizes[&sha])?);
                current = Some(sha);
            }
            Some((kind::BLOB_DATA, p)) => {
                let rx = receiving
                    .as_mut()
                    .ok_or_else(|| proto("BLOB_DATA outside a blob"))?;
                rx.write_compressed(&p)?;
            }
            Some((kind::BLOB_END, _)) => {
                let rx = receiving
                    .take()
                    .ok_or_else(|| proto("BLOB_END outside a blob"))?;
                let sha = current.take().expect("set with the receiver");
                rx.finish(modes[sha.as_str()])?;
                new_blobs += 1;
            }
            Some((kind::INSTALL, _)) => return Ok(new_blobs),
            Some((k, _)) => return Err(proto(format!("unexpected frame kind {k}"))),
            None => {
                return Err(ReleaseError::Connection(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the sender closed the connection before INSTALL",
                )))
            }
        }
    }
}
