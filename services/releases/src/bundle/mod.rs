//! Signed release bundles: the format, its writer and reader, the
//! content-addressed store on the robot, and the update wire protocol.
//!
//! A bundle is a zstd-compressed tar holding, in this order:
//!
//! 1. `manifest.json`: the [`Manifest`] (format version, the robot and board
//!    it is for, the release version, the release's `robot.yaml`, and each
//!    file's path, mode, size and sha256);
//! 2. `manifest.sig`: the 64-byte ed25519 signature over the exact bytes of
//!    `manifest.json`;
//! 3. `blobs/<sha256>`: each distinct file content once, in hash order.
//!
//! Design rules:
//! - fail closed: the signature is checked against the trusted keys before
//!   any other entry is read, an unsigned or wrongly signed bundle is never
//!   accepted, and every blob's sha256 is checked while it streams;
//! - the reader accepts only the entries above, as regular files: links,
//!   device nodes, `..`, absolute paths and blobs the manifest does not list
//!   are refused with the entry's name;
//! - bounded before the signature: every length the input gives (the
//!   manifest's, the signature's, a GNU long name's, a pax header's, a
//!   zstd window, a wire frame's) is held to a limit before anything is
//!   allocated, and a blob's to the size its signed manifest gives;
//! - names from the input are shown cut and escaped in errors ([`quoted`]);
//! - the writer is deterministic: the same release, version and key give
//!   the same bytes.

mod archive;
mod hash;
mod keys;
mod manifest;
mod quote;
mod read;
mod store;
pub mod wire;
mod write;

pub use archive::{MAX_NAME, MAX_PAX};
pub use hash::{sha256_file, sha256_hex, Sha256Hex, Sha256Writer};
pub use keys::{
    keygen, load_secret_key, load_trusted_keys, parse_public_key, pub_path, public_key_base64,
    KeyError, SecretKey, TrustedKeys,
};
pub use manifest::{
    Compat, FileEntry, Manifest, ManifestError, MANIFEST_FORMAT, MANIFEST_NAME, SIGNATURE_NAME,
};
pub use quote::{quoted, quoted_bytes, SHOWN_CHARS};
pub use read::{
    BundleReadError, BundleReader, VerifiedManifest, MAX_MANIFEST, MAX_SIGNATURE, WINDOW_LOG_MAX,
};
pub use store::{sync_dir, Receiver, Staging, Store, StoreError, MAX_PARTIALS};
pub use write::{write_bundle, BundleSpec, BundleWriteError, BundleWritten};
