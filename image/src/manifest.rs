//! `manifest.json`: every file of a release (or of a whole image) with its
//! type, mode, owner, size, sha256 and link target, in path order.
//!
//! The release manifest's own sha256 names the release directory
//! (`<version>-<sha8>`), so two releases with the same files get the same
//! name and any changed byte gets a new one.

use serde::Serialize;

use crate::entry::{Entry, Kind};

/// One line of a manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ManifestEntry {
    /// Absolute path in the image, or relative to the release directory in
    /// a release manifest.
    pub path: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Permission bits in octal (`"0755"`).
    pub mode: String,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Symlink target, or the first path of a hard link group.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// `major:minor` of a device node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// Extended attributes, name to value in hex (a file capability, a
    /// POSIX ACL), so that they count in the manifest's digest.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub xattrs: std::collections::BTreeMap<String, String>,
}

impl ManifestEntry {
    /// The manifest line for `entry` at `path`; `sha256` for regular files,
    /// `hardlink_to` when it is a later member of a hard link group.
    pub fn new(
        path: String,
        entry: &Entry,
        sha256: Option<String>,
        hardlink_to: Option<String>,
    ) -> Self {
        let (kind, target, device) = match &entry.kind {
            Kind::Symlink(t) => ("symlink", Some(t.clone()), None),
            Kind::Char { major, minor } | Kind::Block { major, minor } => {
                (entry.kind.name(), None, Some(format!("{major}:{minor}")))
            }
            Kind::File { .. } if hardlink_to.is_some() => ("hardlink", hardlink_to, None),
            k => (k.name(), None, None),
        };
        ManifestEntry {
            path,
            kind,
            mode: format!("{:04o}", entry.mode),
            uid: entry.uid,
            gid: entry.gid,
            size: entry.size(),
            sha256,
            target,
            device,
            xattrs: entry
                .xattrs
                .iter()
                .map(|(n, v)| (n.clone(), hex::encode(v)))
                .collect(),
        }
    }
}

/// A whole manifest document.
#[derive(Debug, Clone, Serialize)]
pub struct Manifest {
    pub schema_version: u32,
    /// What the manifest describes: `release` or `image`.
    pub kind: &'static str,
    pub robot: String,
    pub version: String,
    pub source_date_epoch: u64,
    pub files: Vec<ManifestEntry>,
}

impl Manifest {
    /// The canonical bytes (pretty JSON, trailing newline) that are stored
    /// and hashed.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(self).expect("manifest serializes");
        v.push(b'\n');
        v
    }
}
