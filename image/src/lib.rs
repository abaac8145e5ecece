//! Reproducible root filesystem images for rtdeploy robots (the crate is
//! `rootfs`; its folder is `image/`).
//!
//! Reads a base root filesystem as data (never as the host), overlays the
//! supervisor, the controller release and the boot configuration, and writes
//! tar, tar.zst, ext4 or cpio.gz images that are byte-identical for identical
//! inputs. The release goes where the robot's release store expects it
//! (`releases::Layout`), under the name the store would give it
//! (`releases::release_name`); signed bundles and the store itself are the
//! `releases` crate.
//!
//! Design rules:
//! - the base is data: symlinks are entries (never followed), owners, modes
//!   and device nodes are kept, tar member names cannot leave the root, and
//!   an entry the output format cannot hold is an error naming it;
//! - streaming: file data is read and hashed a bounded distance ahead of
//!   the writer (8 buffers of 1 MiB per reader thread), never a whole tree
//!   into memory; a compressed tar base is decompressed to a temporary
//!   file and read by offset;
//! - reproducible: entries in path order, numeric owners, every mtime
//!   clamped to SOURCE_DATE_EPOCH (given, or the newest mtime of the
//!   release, never the clock), no user names, host paths or host times in
//!   the output; ext4 goes through e2fsprogs with fixed UUID, hash seed,
//!   feature list and fake time;
//! - all or nothing: the image and its sidecars are written under temporary
//!   names next to the output and renamed into place only when complete.

pub mod base;
pub mod build;
pub mod elf;
pub mod entry;
pub mod error;
pub mod extlinux;
pub mod flash;
pub mod manifest;
pub mod programs;
mod readahead;
pub mod release;
pub mod sbom;
mod sha256x2;
pub mod write;

pub use base::Base;
pub use build::{build, ImageSpec, Phase, Progress, Summary};
pub use error::ImageBuildError;
pub use write::Format;
