//! tar (GNU format, GNU long names for paths over 100 bytes, a pax
//! `SCHILY.xattr.*` record before a member with extended attributes, as
//! GNU tar `--xattrs` writes and reads them), optionally zstd-compressed.
//!
//! Headers carry numeric ids only (user and group names empty), the clamped
//! mtime, and no atime/ctime, so the bytes depend on the entries alone.
//!
//! A file with holes is a GNU sparse member (type `S`): the header lists
//! where its data runs are (four in the header, 21 in each extension block
//! after it) and only those runs are stored. This is the sparse format of
//! the GNU format the rest of the archive is in; GNU tar, bsdtar and the
//! `tar` crate read it back as the whole file, and GNU tar and bsdtar
//! extract it with its holes. (The pax sparse formats would put a
//! `GNUSparseFile.N/` name and the map in the data of a member that tools
//! without pax sparse support extract as garbage.)

use std::io::{self, BufRead, Write};

use crate::entry::{Kind, SparseMap};
use crate::write::{copy_segments, exact_copy, Item, Sink};

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
        // Extended attributes go in a pax record before the member (the
        // inode's: once, on the first path of a hard link group).
        if !e.xattrs.is_empty() && item.link_to.is_none() {
            let keys: Vec<String> = e
                .xattrs
                .iter()
                .map(|(n, _)| format!("SCHILY.xattr.{n}"))
                .collect();
            self.builder.append_pax_extensions(
                keys.iter()
                    .map(String::as_str)
                    .zip(e.xattrs.iter().map(|(_, v)| v.as_slice())),
            )?;
        }
        match (&e.kind, item.link_to) {
            (Kind::Dir, _) => {
                h.set_entry_type(tar::EntryType::Directory);
                self.builder.append_data(&mut h, path, io::empty())
            }
            (Kind::File { .. }, Some(first)) => {
                h.set_entry_type(tar::EntryType::Link);
                self.builder.append_link(&mut h, path, first)
            }
            (
                Kind::File {
                    size, data: source, ..
                },
                None,
            ) if source.sparse_map().is_some() => {
                let map = source.sparse_map().expect("checked");
                let data = data.ok_or_else(|| io::Error::other("regular file without data"))?;
                let entries = sparse_entries(map, *size);
                let stored = map.data_bytes();
                h.set_entry_type(tar::EntryType::GNUSparse);
                h.set_size(stored);
                let gnu = h.as_gnu_mut().expect("a GNU header");
                put_number(&mut gnu.realsize, *size);
                let (first, rest) = entries.split_at(entries.len().min(4));
                for (slot, &(offset, len)) in gnu.sparse.iter_mut().zip(first) {
                    put_number(&mut slot.offset, offset);
                    put_number(&mut slot.numbytes, len);
                }
                gnu.isextended[0] = u8::from(!rest.is_empty());
                self.builder.append_data(&mut h, path, io::empty())?;
                let out = self.builder.get_mut();
                let mut blocks = rest.chunks(21).peekable();
                while let Some(chunk) = blocks.next() {
                    let mut ext = tar::GnuExtSparseHeader::new();
                    for (slot, &(offset, len)) in ext.sparse.iter_mut().zip(chunk) {
                        put_number(&mut slot.offset, offset);
                        put_number(&mut slot.numbytes, len);
                    }
                    ext.isextended[0] = u8::from(blocks.peek().is_some());
                    out.write_all(ext.as_bytes())?;
                }
                copy_segments(data, *size, map, &mut |_, bytes| out.write_all(bytes))?;
                let pad = (512 - (stored % 512) as usize) % 512;
                out.write_all(&[0u8; 512][..pad])
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

/// The sparse map as a GNU sparse member lists it: the data runs, then,
/// when the file ends in a hole (or is all hole), an empty run at its end,
/// which is how GNU tar records that the file goes on past its last data.
fn sparse_entries(map: &SparseMap, size: u64) -> Vec<(u64, u64)> {
    let mut entries = map.segments.clone();
    if entries.last().is_none_or(|&(o, l)| o + l < size) {
        entries.push((size, 0));
    }
    entries
}

/// A 12-byte numeric field: octal with a NUL terminator up to 8 GiB, the
/// GNU base-256 form (high bit set, big-endian) beyond.
fn put_number(field: &mut [u8; 12], value: u64) {
    if value < 1 << 33 {
        field[..11].copy_from_slice(format!("{value:011o}").as_bytes());
        field[11] = 0;
    } else {
        field.fill(0);
        field[0] = 0x80;
        field[4..].copy_from_slice(&value.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numeric_fields() {
        let mut f = [0u8; 12];
        put_number(&mut f, 4096);
        assert_eq!(&f, b"00000010000\0");
        put_number(&mut f, (1 << 33) - 1);
        assert_eq!(&f, b"77777777777\0");
        put_number(&mut f, 1 << 40);
        assert_eq!(f, [0x80, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn a_file_ending_in_a_hole_lists_an_empty_run_at_its_end() {
        let map = |segments: Vec<(u64, u64)>| SparseMap { segments };
        assert_eq!(
            sparse_entries(&map(vec![(4096, 4096)]), 1 << 20),
            [(4096, 4096), (1 << 20, 0)]
        );
        assert_eq!(
            sparse_entries(&map(vec![(0, 4096), (8192, 100)]), 8292),
            [(0, 4096), (8192, 100)]
        );
        assert_eq!(sparse_entries(&map(vec![]), 5000), [(5000, 0)]);
    }
}
