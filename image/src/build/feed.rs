//! Feeding the tree to a format's sink: hard links, inode numbers, the
//! manifest lines and progress, file data read ahead on a second thread.

use std::collections::HashMap;

use super::{Phase, Progress};
use crate::entry::{Kind, Tree};
use crate::error::ImageBuildError;
use crate::manifest::ManifestEntry;
use crate::readahead;
use crate::write::{Item, Sink};

/// Feeds every entry to `sink` in path order, file data read and hashed
/// ahead on a second thread, and reports progress.
pub(super) fn write_all(
    tree: &Tree,
    sink: &mut dyn Sink,
    files: &mut Vec<(String, ManifestEntry)>,
    total: u64,
    progress: &mut dyn FnMut(Progress),
) -> Result<(), ImageBuildError> {
    let mut group_size: HashMap<u64, u32> = HashMap::new();
    let mut jobs = Vec::new();
    for (path, e) in &tree.entries {
        if let Kind::File {
            size,
            data,
            link_group,
        } = &e.kind
        {
            let first = match link_group {
                Some(g) => {
                    let n = group_size.entry(*g).or_default();
                    *n += 1;
                    *n == 1
                }
                None => true,
            };
            if first {
                jobs.push(readahead::Job {
                    path,
                    size: *size,
                    data,
                });
            }
        }
    }
    readahead::with_readahead(tree, jobs, |incoming| {
        write_entries(tree, sink, files, total, progress, &group_size, incoming)
    })
}

fn write_entries(
    tree: &Tree,
    sink: &mut dyn Sink,
    files: &mut Vec<(String, ManifestEntry)>,
    total: u64,
    progress: &mut dyn FnMut(Progress),
    group_size: &HashMap<u64, u32>,
    incoming: &mut readahead::Incoming,
) -> Result<(), ImageBuildError> {
    let mut first_of_group: HashMap<u64, (String, u64, String)> = HashMap::new();
    let mut done = 0u64;
    let mut last_report = 0u64;
    let mut next_ino = 1u64;
    progress(Progress {
        phase: Phase::Write,
        done,
        total,
    });
    for (path, e) in &tree.entries {
        let group = match e.kind {
            Kind::File {
                link_group: Some(g),
                ..
            } => Some(g),
            _ => None,
        };
        if let Some((first, ino, sha)) = group.and_then(|g| first_of_group.get(&g)) {
            let item = Item {
                path,
                entry: e,
                link_to: Some(first),
                ino: *ino,
                nlink: group.map_or(1, |g| group_size[&g]),
            };
            sink.put(&item, None)
                .map_err(ImageBuildError::io("write", format!("/{path}")))?;
            let line = ManifestEntry::new(
                format!("/{path}"),
                e,
                Some(sha.clone()),
                Some(format!("/{first}")),
            );
            files.push((path.clone(), line));
            continue;
        }
        let ino = next_ino;
        next_ino += 1;
        let nlink = match (&e.kind, group) {
            (Kind::Dir, _) => 2,
            (_, Some(g)) => group_size[&g],
            _ => 1,
        };
        let item = Item {
            path,
            entry: e,
            link_to: None,
            ino,
            nlink,
        };
        let sha = match &e.kind {
            Kind::File { size, data, .. } => {
                let src = tree.source_of(path, data);
                let read_err = |incoming: &mut readahead::Incoming, err: std::io::Error| {
                    let src = incoming.source_error.take().unwrap_or_else(|| src.clone());
                    ImageBuildError::io("read", src)(err)
                };
                if let Err(err) = sink.put(&item, Some(&mut *incoming)) {
                    // Say which side failed: reading the source (it failed,
                    // shrank or changed) or writing.
                    return Err(
                        if incoming.source_error.is_some()
                            || matches!(
                                err.kind(),
                                std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::InvalidData
                            )
                        {
                            read_err(incoming, err)
                        } else {
                            ImageBuildError::io("write", format!("/{path}"))(err)
                        },
                    );
                }
                let sha = incoming
                    .finish_file()
                    .map_err(|err| read_err(incoming, err))?;
                done += *size;
                if done - last_report >= 4 << 20 {
                    last_report = done;
                    progress(Progress {
                        phase: Phase::Write,
                        done,
                        total,
                    });
                }
                Some(sha)
            }
            _ => {
                sink.put(&item, None)
                    .map_err(ImageBuildError::io("write", format!("/{path}")))?;
                None
            }
        };
        if let (Some(g), Some(s)) = (group, &sha) {
            first_of_group.insert(g, (path.clone(), ino, s.clone()));
        }
        let line = ManifestEntry::new(format!("/{path}"), e, sha, None);
        files.push((path.clone(), line));
    }
    progress(Progress {
        phase: Phase::Write,
        done: total,
        total,
    });
    Ok(())
}
