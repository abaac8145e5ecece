//! tar (GNU format, GNU long names for paths over 100 bytes), optionally
//! zstd-compressed.
//!
//! Headers carry numeric ids only (user and group names empty), the clamped
//! mtime, and no atime/ctime, so the bytes depend on the entries alone.

use std::io::{self, BufRead, Write};

use crate::entry::Kind;
use crate::write::{exact_copy, Item, Sink};

pub struct TarSink<W: Write> {
    builder: tar::Builder<W>,
}

impl<W: Write> TarSink<W> {
    pub fn new(out: W) -> Self {
        let mut builder = tar::Builder::new(out);
        builder.mode(tar::HeaderMode::Complete);
        TarSink { builder }
    }

    /// Writes the end-of-archive blocks and returns the writer.
    pub fn finish(self) -> io::Result<W> {
        self.builder.into_inner()
    }
}

/// The member name: `.` for the root, else the relative path.
fn name(path: &str) -> &str {
    if path.is_empty() {
        "."
    } else {
        path
    }
}

impl<W: Write> Sink for TarSink<W> {
    fn put(&mut self, item: &Item, data: Option<&mut dyn BufRead>) -> io::Result<()> {
        let e = item.entry;
        let mut h = tar::Header::new_gnu();
        h.set_mode(e.mode);
        h.set_uid(u64::from(e.uid));
        h.set_gid(u64::from(e.gid));
        h.set_mtime(e.mtime);
        h.set_size(0);
        let path = name(item.path);
        match (&e.kind, item.link_to) {
            (Kind::Dir, _) => {
                h.set_entry_type(tar::EntryType::Directory);
                self.builder.append_data(&mut h, path, io::empty())
            }
            (Kind::File { .. }, Some(first)) => {
                h.set_entry_type(tar::EntryType::Link);
                self.builder.append_link(&mut h, path, first)
            }
            (Kind::File { size, .. }, None) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(*size);
                let data = data.ok_or_else(|| io::Error::other("regular file without data"))?;
                // The crate writes the (long name and) header; the data goes
                // straight from the reader's buffer, then the padding.
                self.builder.append_data(&mut h, path, io::empty())?;
                let out = self.builder.get_mut();
                exact_copy(data, *size, out)?;
                let pad = (512 - (*size % 512) as usize) % 512;
                out.write_all(&[0u8; 512][..pad])
            }
            (Kind::Symlink(target), _) => {
                h.set_entry_type(tar::EntryType::Symlink);
                if target.len() <= 100 && !target.as_bytes().contains(&0) {
                    // Stored byte for byte (the crate's path setter would
                    // normalise `a/./b` or a trailing `/`).
                    let field = &mut h.as_old_mut().linkname;
                    field[..target.len()].copy_from_slice(target.as_bytes());
                    self.builder.append_data(&mut h, path, io::empty())
                } else {
                    self.builder.append_link(&mut h, path, target)
                }
            }
            (Kind::Char { major, minor }, _) | (Kind::Block { major, minor }, _) => {
                h.set_entry_type(if matches!(e.kind, Kind::Char { .. }) {
                    tar::EntryType::Char
                } else {
                    tar::EntryType::Block
                });
                h.set_device_major(*major)?;
                h.set_device_minor(*minor)?;
                self.builder.append_data(&mut h, path, io::empty())
            }
            (Kind::Fifo, _) => {
                h.set_entry_type(tar::EntryType::Fifo);
                self.builder.append_data(&mut h, path, io::empty())
            }
            (Kind::Socket, _) => Err(io::Error::other("tar cannot hold a socket")),
        }
    }
}
