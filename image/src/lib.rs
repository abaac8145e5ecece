//! Reproducible root filesystems and release bundles for rtdeploy.
//!
//! Reads a base root filesystem as data (never as the host), overlays the
//! supervisor, the controller release and the boot configuration, and writes
//! tar, tar.zst, ext4 or cpio.gz images that are byte-identical for identical
//! inputs.

pub mod bundle;
