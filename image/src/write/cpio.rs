//! cpio in the "newc" format (`070701`), the one the kernel unpacks as an
//! initramfs (see the kernel's Documentation/driver-api/early-userspace/
//! buffer-format.rst), gzip-compressed with a zero header mtime.
//!
//! Hard links share an inode number; the first member carries the data and
//! later members have size 0, which is what the kernel's unpacker expects.
//! Inode numbers are counted in path order, so they do not depend on the
//! build host.

use std::io::{self, BufRead, Write};

use crate::entry::Kind;
use crate::write::{exact_copy, Item, Sink};

pub struct CpioSink<W: Write> {
    out: W,
    offset: u64,
}

impl<W: Write> CpioSink<W> {
    pub fn new(out: W) -> Self {
        CpioSink { out, offset: 0 }
    }

    fn pad(&mut self) -> io::Result<()> {
        let pad = (4 - (self.offset % 4) as usize) % 4;
        self.out.write_all(&[0u8; 3][..pad])?;
        self.offset += pad as u64;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn header(
        &mut self,
        name: &str,
        ino: u64,
        mode: u32,
        uid: u32,
        gid: u32,
        nlink: u32,
        mtime: u64,
        size: u64,
        rdev: (u32, u32),
    ) -> io::Result<()> {
        if size > u64::from(u32::MAX) {
            return Err(io::Error::other(format!(
                "{name}: {size} bytes is over the 4 GiB newc limit"
            )));
        }
        let namesize = name.len() + 1;
        let fields = [
            ino as u32,
            mode,
            uid,
            gid,
            nlink,
            mtime.min(u64::from(u32::MAX)) as u32,
            size as u32,
            0,
            0,
            rdev.0,
            rdev.1,
            namesize as u32,
            0,
        ];
        let mut h = String::with_capacity(110 + namesize);
        h.push_str("070701");
        for f in fields {
            h.push_str(&format!("{f:08x}"));
        }
        self.out.write_all(h.as_bytes())?;
        self.out.write_all(name.as_bytes())?;
        self.out.write_all(&[0])?;
        self.offset += (h.len() + namesize) as u64;
        self.pad()
    }

    /// Writes the trailer and returns the writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.header("TRAILER!!!", 0, 0, 0, 0, 1, 0, 0, (0, 0))?;
        // Pad the archive to a 512-byte multiple, as cpio(1) does.
        let pad = (512 - (self.offset % 512) as usize) % 512;
        self.out.write_all(&vec![0u8; pad])?;
        Ok(self.out)
    }
}

impl<W: Write> Sink for CpioSink<W> {
    fn put(&mut self, item: &Item, data: Option<&mut dyn BufRead>) -> io::Result<()> {
        let e = item.entry;
        let name = if item.path.is_empty() { "." } else { item.path };
        let mode = e.kind.type_bits() | e.mode;
        let rdev = match e.kind {
            Kind::Char { major, minor } | Kind::Block { major, minor } => (major, minor),
            _ => (0, 0),
        };
        match (&e.kind, item.link_to) {
            (Kind::File { size, .. }, None) => {
                self.header(
                    name, item.ino, mode, e.uid, e.gid, item.nlink, e.mtime, *size, rdev,
                )?;
                let data = data.ok_or_else(|| io::Error::other("regular file without data"))?;
                exact_copy(data, *size, &mut self.out)?;
                self.offset += size;
                self.pad()
            }
            (Kind::Symlink(target), _) => {
                let t = target.as_bytes();
                self.header(
                    name,
                    item.ino,
                    mode,
                    e.uid,
                    e.gid,
                    1,
                    e.mtime,
                    t.len() as u64,
                    rdev,
                )?;
                self.out.write_all(t)?;
                self.offset += t.len() as u64;
                self.pad()
            }
            _ => self.header(
                name, item.ino, mode, e.uid, e.gid, item.nlink, e.mtime, 0, rdev,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::Entry;

    #[test]
    fn newc_layout() {
        let mut s = CpioSink::new(Vec::new());
        let f = Entry::bytes(b"hello".to_vec(), 0o644, 7);
        let mut d: &[u8] = b"hello";
        s.put(
            &Item {
                path: "a",
                entry: &f,
                link_to: None,
                ino: 1,
                nlink: 1,
            },
            Some(&mut d),
        )
        .unwrap();
        let out = s.finish().unwrap();
        let h = std::str::from_utf8(&out[..110]).unwrap();
        assert!(h.starts_with("070701"));
        assert_eq!(&h[6..14], "00000001"); // ino
        assert_eq!(&h[14..22], "000081a4"); // S_IFREG | 0644
        assert_eq!(&h[46..54], "00000007"); // mtime
        assert_eq!(&h[54..62], "00000005"); // size
        assert_eq!(&h[94..102], "00000002"); // name size "a\0"
                                             // header (110) + "a\0" = 112, aligned; data at 112.
        assert_eq!(&out[112..117], b"hello");
        assert_eq!(&out[120..126], b"070701");
        assert_eq!(out.len() % 512, 0);
    }
}
