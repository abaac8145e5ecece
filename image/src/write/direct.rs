//! The image file written past the page cache (`O_DIRECT`) where its
//! filesystem allows it.
//!
//! A build host writes an image once and hardly reads it back: it goes to
//! a board or a release store. Through the page cache, each build asks the
//! kernel for as many fresh pages as the image is large while the previous
//! image, kept until the new one replaces it, still holds as many; where
//! the host is a virtual machine that hands free memory back to its
//! hypervisor (virtio-balloon free page reporting), taking those pages
//! back costs more system time than the compression's own writes, and it
//! varies from one build to the next. Written direct, the compressed bytes
//! go from one reused buffer to the device, the build leaves no dirty
//! pages for writeback to flush after it, and it does not push the user's
//! cached files out for an image nobody reads on this host.
//!
//! Direct writes need the buffer's address, the file offset and the
//! length aligned to what the filesystem asks (`statx` `STATX_DIOALIGN`,
//! 4096 bytes where the kernel does not say). The bytes are gathered into
//! an aligned buffer and written whole; the unaligned tail at the end goes
//! through the page cache with `O_DIRECT` cleared. A filesystem that
//! refuses direct writes (`EINVAL`: tmpfs before Linux 6.6, some FUSE
//! filesystems) gets every byte through the page cache instead: the file
//! is the same either way.

use std::fs::File;
use std::io::{self, Seek, Write};

use rustix::fs::{fcntl_getfl, fcntl_setfl, statx, AtFlags, OFlags, StatxFlags};

/// Bytes gathered before each direct write.
const STAGE: usize = 4 << 20;
/// The alignment assumed where `statx` does not give one.
const DEFAULT_ALIGN: usize = 4096;

/// Writes a stream to `file` from its current offset, direct while the
/// filesystem allows it; `finish` writes the rest and clears `O_DIRECT`.
pub struct DirectFile {
    file: File,
    /// `STAGE + align` bytes, of which `stage_at..stage_at + STAGE` is the
    /// aligned stage (allocated once, so no allocation is assumed to be
    /// aligned by itself).
    buf: Vec<u8>,
    stage_at: usize,
    /// Bytes in the stage.
    fill: usize,
    /// Alignment of address, offset and length; 0 once writing buffered.
    align: usize,
    written: u64,
}

impl DirectFile {
    /// Starts writing at `file`'s current offset. Falls back to the page
    /// cache from the start when the filesystem has no direct I/O for it
    /// or the offset is not aligned.
    pub fn new(mut file: File) -> Self {
        let align = dio_align(&file)
            .filter(|&a| a.is_power_of_two() && a <= STAGE)
            .filter(|&a| file.stream_position().is_ok_and(|pos| pos % a as u64 == 0))
            .filter(|_| set_direct(&file, true).is_ok())
            .unwrap_or(0);
        let (buf, stage_at) = if align == 0 {
            (Vec::new(), 0)
        } else {
            let buf = vec![0u8; STAGE + align];
            let at = buf.as_ptr().align_offset(align);
            (buf, at)
        };
        DirectFile {
            file,
            buf,
            stage_at,
            fill: 0,
            align,
            written: 0,
        }
    }

    /// Whether the bytes still go past the page cache.
    #[cfg(test)]
    pub fn is_direct(&self) -> bool {
        self.align != 0
    }

    pub fn write_all(&mut self, mut data: &[u8]) -> io::Result<()> {
        self.written += data.len() as u64;
        while !data.is_empty() {
            if self.align == 0 {
                return self.file.write_all(data);
            }
            let n = data.len().min(STAGE - self.fill);
            let at = self.stage_at + self.fill;
            self.buf[at..at + n].copy_from_slice(&data[..n]);
            self.fill += n;
            data = &data[n..];
            if self.fill == STAGE {
                self.write_stage(STAGE)?;
            }
        }
        Ok(())
    }

    /// Writes what is left, clears `O_DIRECT` (the descriptor may be
    /// shared) and returns the bytes written in all.
    pub fn finish(mut self) -> io::Result<u64> {
        if self.align != 0 {
            let whole = self.fill - self.fill % self.align;
            self.write_stage(whole)?;
            if self.align != 0 {
                self.buffered()?;
            }
            let at = self.stage_at;
            self.file.write_all(&self.buf[at..at + self.fill])?;
        }
        Ok(self.written)
    }

    /// Writes the first `len` bytes of the stage (a multiple of the
    /// alignment) and moves the rest to its front.
    fn write_stage(&mut self, len: usize) -> io::Result<()> {
        let mut done = 0;
        while done < len {
            let at = self.stage_at + done;
            let chunk = &self.buf[at..self.stage_at + len];
            match self.file.write(chunk) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    done += n;
                    // A short write leaves the offset unaligned (a full
                    // device, a signal): the rest goes buffered.
                    if self.align != 0 && n % self.align != 0 {
                        self.buffered()?;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // Refused before anything is written: this filesystem or
                // this file has no direct writes after all.
                Err(e)
                    if self.align != 0
                        && rustix::io::Errno::from_io_error(&e)
                            == Some(rustix::io::Errno::INVAL) =>
                {
                    self.buffered()?;
                }
                Err(e) => return Err(e),
            }
        }
        self.buf.copy_within(
            self.stage_at + len..self.stage_at + self.fill,
            self.stage_at,
        );
        self.fill -= len;
        Ok(())
    }

    /// From here on, through the page cache.
    fn buffered(&mut self) -> io::Result<()> {
        self.align = 0;
        set_direct(&self.file, false)
    }
}

fn set_direct(file: &File, on: bool) -> io::Result<()> {
    let flags = fcntl_getfl(file)?;
    let flags = if on {
        flags | OFlags::DIRECT
    } else {
        flags - OFlags::DIRECT
    };
    Ok(fcntl_setfl(file, flags)?)
}

/// The alignment direct I/O on `file` needs: the larger of the memory and
/// offset alignments `statx` gives, 4096 where the kernel predates
/// `STATX_DIOALIGN` (6.1), `None` where it says direct I/O is not
/// supported for this file.
fn dio_align(file: &File) -> Option<usize> {
    match statx(file, "", AtFlags::EMPTY_PATH, StatxFlags::DIOALIGN) {
        Ok(st) if st.stx_mask & StatxFlags::DIOALIGN.bits() != 0 => {
            if st.stx_dio_offset_align == 0 {
                return None;
            }
            Some(st.stx_dio_mem_align.max(st.stx_dio_offset_align) as usize)
        }
        _ => Some(DEFAULT_ALIGN),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 4099) as u8).collect()
    }

    fn read_back(file: &mut File) -> Vec<u8> {
        let mut bytes = Vec::new();
        file.rewind().unwrap();
        file.read_to_end(&mut bytes).unwrap();
        bytes
    }

    /// A temporary file in $TMPDIR: the tests that need direct I/O skip
    /// where its filesystem has none (tmpfs before Linux 6.6).
    fn temp() -> File {
        tempfile::tempfile().unwrap()
    }

    /// Whether the kernel says `file`'s filesystem does direct I/O.
    fn supports_direct(file: &File) -> bool {
        let st = statx(file, "", AtFlags::EMPTY_PATH, StatxFlags::DIOALIGN).unwrap();
        st.stx_mask & StatxFlags::DIOALIGN.bits() != 0
            && st.stx_dio_offset_align != 0
            && st.stx_dio_mem_align <= 4096
    }

    #[test]
    fn every_byte_arrives_in_order_whatever_the_pieces_and_the_flag_is_cleared() {
        // Lengths below, at and across the alignment and the stage.
        for total in [
            0,
            1,
            4095,
            4096,
            4097,
            STAGE - 1,
            STAGE,
            STAGE + 5000,
            3 * STAGE + 123,
        ] {
            for piece in [1 << 20, 4096, 1000] {
                let data = pattern(total);
                let mut file = temp();
                let mut d = DirectFile::new(file.try_clone().unwrap());
                for p in data.chunks(piece) {
                    d.write_all(p).unwrap();
                }
                assert_eq!(d.finish().unwrap(), total as u64);
                let flags = fcntl_getfl(&file).unwrap();
                assert!(
                    !flags.contains(OFlags::DIRECT),
                    "{total}/{piece}: O_DIRECT left set"
                );
                let back = read_back(&mut file);
                assert_eq!(back.len(), total, "{total}/{piece}");
                assert!(back == data, "{total}/{piece}: bytes differ");
            }
        }
    }

    #[test]
    fn on_a_disk_filesystem_the_writes_go_direct() {
        let file = temp();
        if !supports_direct(&file) {
            eprintln!("skipping: no direct I/O reported for the target directory's filesystem");
            return;
        }
        let align = dio_align(&file).unwrap();
        let mut d = DirectFile::new(file);
        assert!(d.is_direct(), "alignment {align}, yet not direct");
        // A whole stage goes out direct: a refusal would have turned it off.
        d.write_all(&pattern(STAGE + 1)).unwrap();
        assert!(d.is_direct());
        assert_eq!(d.finish().unwrap(), STAGE as u64 + 1);
    }

    #[test]
    fn a_refused_direct_write_falls_back_and_loses_no_byte() {
        let mut file = temp();
        if !supports_direct(&file) {
            eprintln!("skipping: no direct I/O reported for the target directory's filesystem");
            return;
        }
        let mut d = DirectFile::new(file.try_clone().unwrap());
        assert!(d.is_direct());
        // A stage one byte off its alignment: the kernel refuses the
        // write with EINVAL, as a filesystem without direct I/O would.
        d.stage_at += 1;
        let data = pattern(2 * STAGE + 77);
        d.write_all(&data).unwrap();
        assert!(!d.is_direct(), "the misaligned write was taken");
        assert_eq!(d.finish().unwrap(), data.len() as u64);
        assert!(!fcntl_getfl(&file).unwrap().contains(OFlags::DIRECT));
        assert!(read_back(&mut file) == data);
    }

    #[test]
    fn an_unaligned_start_writes_through_the_page_cache() {
        let mut file = temp();
        file.write_all(b"head").unwrap();
        let mut d = DirectFile::new(file.try_clone().unwrap());
        assert!(!d.is_direct());
        d.write_all(&pattern(STAGE + 10)).unwrap();
        assert_eq!(d.finish().unwrap(), STAGE as u64 + 10);
        let back = read_back(&mut file);
        assert_eq!(&back[..4], b"head");
        assert!(back[4..] == pattern(STAGE + 10)[..]);
    }

    #[test]
    fn a_write_error_is_returned() {
        // /dev/full: every write fails with ENOSPC, direct or not.
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("/dev/full (every Linux system has it)");
        let mut d = DirectFile::new(full);
        let err = d
            .write_all(&pattern(2 * STAGE))
            .and_then(|()| d.finish().map(drop))
            .unwrap_err();
        assert_eq!(
            err.raw_os_error(),
            Some(rustix::io::Errno::NOSPC.raw_os_error())
        );
    }
}
