//! The image's tree: placing rtdeploy's entries in the base, and what is
//! read back from it (the directory base's digest, the extended attributes).

use std::collections::HashMap;

use sha2::{Digest, Sha256};

use crate::base::HashingReader;
use crate::entry::{Entry, Kind, Tree};
use crate::error::ImageBuildError;
use crate::manifest::ManifestEntry;

/// The digest of a directory base: sha256 over its manifest lines (path
/// order, file contents by sha256) as the base was, before rtdeploy
/// replaced anything in it.
pub(super) fn dir_base_digest(
    tree: &Tree,
    base_keys: &[String],
    replaced: &HashMap<String, Entry>,
    files: &[(String, ManifestEntry)],
) -> Result<String, ImageBuildError> {
    let written: HashMap<&str, &ManifestEntry> =
        files.iter().map(|(p, f)| (p.as_str(), f)).collect();
    let mut h = Sha256::new();
    for key in base_keys {
        let line = match replaced.get(key) {
            Some(old) => {
                let sha = match &old.kind {
                    Kind::File { size, data, .. } => {
                        let src = tree.source_of(key, data);
                        let mut r = tree
                            .open(key, *size, data)
                            .map_err(ImageBuildError::io("read", &src))?;
                        let mut hr = HashingReader {
                            inner: &mut r,
                            hasher: Sha256::new(),
                            count: 0,
                        };
                        std::io::copy(&mut hr, &mut std::io::sink())
                            .map_err(ImageBuildError::io("read", &src))?;
                        Some(hex::encode(hr.hasher.finalize()))
                    }
                    _ => None,
                };
                ManifestEntry::new(format!("/{key}"), old, sha, None)
            }
            None => match written.get(key.as_str()) {
                Some(l) => (*l).clone(),
                None => continue,
            },
        };
        h.update(serde_json::to_vec(&line).expect("manifest line serializes"));
        h.update(b"\n");
    }
    Ok(hex::encode(h.finalize()))
}

/// Puts `entry` at `path`, creating missing parent directories (root,
/// 0755); a parent that exists as anything but a directory (a symlink
/// included: the image is never written through one) is an error.
pub(super) fn place(
    tree: &mut Tree,
    replaced: &mut HashMap<String, Entry>,
    path: &str,
    entry: Entry,
    epoch: u64,
) -> Result<(), ImageBuildError> {
    let mut at = 0;
    while let Some(i) = path[at..].find('/') {
        let parent = &path[..at + i];
        match tree.entries.get(parent) {
            None => {
                tree.entries
                    .insert(parent.to_string(), Entry::dir(0o755, epoch));
            }
            Some(Entry {
                kind: Kind::Dir, ..
            }) => {}
            Some(e) => {
                return Err(ImageBuildError::Conflict {
                    path: format!("/{parent}"),
                    reason: format!(
                        "is a {} in the base, but rtdeploy needs a directory there for /{path}",
                        e.kind.name()
                    ),
                })
            }
        }
        at += i + 1;
    }
    if let Some(old) = tree.entries.get(path) {
        if matches!(old.kind, Kind::Dir) != matches!(entry.kind, Kind::Dir) {
            return Err(ImageBuildError::Conflict {
                path: format!("/{path}"),
                reason: format!(
                    "is a {} in the base; rtdeploy writes a {} there",
                    old.kind.name(),
                    entry.kind.name()
                ),
            });
        }
        if matches!(old.kind, Kind::Dir) {
            return Ok(());
        }
        replaced
            .entry(path.to_string())
            .or_insert_with(|| old.clone());
    }
    tree.entries.insert(path.to_string(), entry);
    Ok(())
}

/// The entries with extended attributes, each inode once (the first path
/// of a hard link group holds them).
pub(super) fn files_with_xattrs(tree: &Tree) -> Vec<(String, crate::entry::Xattrs)> {
    let mut seen_groups = std::collections::HashSet::new();
    tree.entries
        .iter()
        .filter(|(_, e)| !e.xattrs.is_empty())
        .filter(|(_, e)| match &e.kind {
            Kind::File {
                link_group: Some(g),
                ..
            } => seen_groups.insert(*g),
            _ => true,
        })
        .map(|(p, e)| (p.clone(), e.xattrs.clone()))
        .collect()
}
