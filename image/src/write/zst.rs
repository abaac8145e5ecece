//! The zstd stage of tar.zst images: multi-threaded zstd, its compressed
//! output written to the file by a thread of its own.
//!
//! The thread that frames the tar stream is the one every other stage
//! waits for: the readers fill its queue, zstd's workers compress what it
//! hands them. So it only frames and hands over; the write(2) calls
//! happen on the writer thread (direct to the device where the filesystem
//! allows it: see [`super::direct`]), and zstd compresses straight into
//! the buffers that thread takes (no copy through a `BufWriter`).
//!
//! The bytes are those of `zstd::stream::write::Encoder` with the same
//! parameters: the same compression calls (`ZSTD_compressStream`, then
//! `ZSTD_endStream`), never a flush in between, and multi-threaded zstd's
//! output does not depend on how its input and output are cut.

use std::fs::File;
use std::io::{self, Write};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::thread::JoinHandle;

use super::direct::DirectFile;
use zstd::stream::raw::{CParameter, Encoder, InBuffer, Operation, OutBuffer};

/// Compressed bytes per write(2).
const OUT_CHUNK: usize = 1 << 20;
/// Buffers queued for the writer thread: enough to ride out a slow write
/// without holding much.
const OUT_DEPTH: usize = 4;

/// A `Write` that compresses into `file`; `finish` ends the frame and
/// returns the bytes written.
pub struct ZstdFile {
    enc: Encoder<'static>,
    /// Compressed bytes not yet handed to the writer thread.
    out: Vec<u8>,
    to_writer: Option<SyncSender<Vec<u8>>>,
    /// Buffers the writer thread is done with, to fill again.
    written: Receiver<Vec<u8>>,
    writer: Option<JoinHandle<io::Result<u64>>>,
}

impl ZstdFile {
    /// Compression at `level` with `workers` threads (`>= 1`: the output of
    /// multi-threaded zstd is the same for any count, not for 0) and a
    /// checksum of the content at the end of the frame.
    pub fn new(file: File, level: i32, workers: u32) -> io::Result<Self> {
        let mut enc = Encoder::new(level)?;
        enc.set_parameter(CParameter::NbWorkers(workers.max(1)))?;
        enc.set_parameter(CParameter::ChecksumFlag(true))?;
        let (to_writer, incoming) = sync_channel::<Vec<u8>>(OUT_DEPTH);
        let (give_back, written) = sync_channel(OUT_DEPTH + 1);
        let writer = std::thread::Builder::new()
            .name("image-write".into())
            .spawn(move || {
                let mut out = DirectFile::new(file);
                for buf in incoming {
                    out.write_all(&buf)?;
                    let _ = give_back.try_send(buf);
                }
                out.finish()
            })?;
        Ok(ZstdFile {
            enc,
            out: Vec::with_capacity(OUT_CHUNK),
            to_writer: Some(to_writer),
            written,
            writer: Some(writer),
        })
    }

    /// Ends the frame, waits for the writer thread and returns the bytes
    /// it wrote.
    pub fn finish(mut self) -> io::Result<u64> {
        loop {
            let left = self.enc.finish(&mut out_buffer(&mut self.out), true)?;
            if left == 0 {
                break;
            }
            self.hand_over()?;
        }
        self.hand_over()?;
        self.to_writer = None;
        self.join_writer()
    }

    /// Hands the filled output buffer to the writer thread and takes an
    /// empty one.
    fn hand_over(&mut self) -> io::Result<()> {
        if self.out.is_empty() {
            return Ok(());
        }
        let mut next = self
            .written
            .try_recv()
            .unwrap_or_else(|_| Vec::with_capacity(OUT_CHUNK));
        next.clear();
        let full = std::mem::replace(&mut self.out, next);
        let sent = self.to_writer.as_ref().map(|tx| tx.send(full));
        match sent {
            Some(Ok(())) => Ok(()),
            // The writer thread stopped: its error says why.
            _ => {
                self.to_writer = None;
                Err(self
                    .join_writer()
                    .err()
                    .unwrap_or_else(|| io::Error::other("the image writer thread stopped")))
            }
        }
    }

    fn join_writer(&mut self) -> io::Result<u64> {
        match self.writer.take().map(JoinHandle::join) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(io::Error::other("the image writer thread panicked")),
            None => Err(io::Error::other("the image writer thread already ended")),
        }
    }
}

/// zstd's view of the spare capacity of `out`, after what it holds.
fn out_buffer(out: &mut Vec<u8>) -> OutBuffer<'_, Vec<u8>> {
    let len = out.len();
    OutBuffer::around_pos(out, len)
}

impl Write for ZstdFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut input = InBuffer::around(buf);
        // zstd takes all of it unless the output buffer fills first.
        while input.pos() < buf.len() {
            self.enc.run(&mut input, &mut out_buffer(&mut self.out))?;
            if self.out.len() == self.out.capacity() {
                self.hand_over()?;
            }
        }
        Ok(buf.len())
    }

    /// Ends a zstd block here (`ZSTD_flushStream`) and hands what it gives
    /// to the writer thread. The image never flushes: a flush changes the
    /// compressed bytes.
    fn flush(&mut self) -> io::Result<()> {
        loop {
            let left = self.enc.flush(&mut out_buffer(&mut self.out))?;
            self.hand_over()?;
            if left == 0 {
                return Ok(());
            }
        }
    }
}

impl Drop for ZstdFile {
    /// Unfinished (an error elsewhere): the writer thread ends when its
    /// queue closes; wait for it so nothing writes to the file after.
    fn drop(&mut self) {
        self.to_writer = None;
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// Text that compresses, with incompressible runs, over several of
    /// zstd's multi-threaded jobs (8 MiB each at level 3).
    fn content() -> Vec<u8> {
        let mut data = Vec::new();
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        for i in 0..600u32 {
            data.extend_from_slice(
                format!("line {i} of the test content\n")
                    .repeat(500)
                    .as_bytes(),
            );
            for _ in 0..2048 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                data.extend_from_slice(&x.to_le_bytes());
            }
        }
        data
    }

    fn read_back(file: &mut File) -> Vec<u8> {
        let mut bytes = Vec::new();
        std::io::Seek::rewind(file).unwrap();
        file.read_to_end(&mut bytes).unwrap();
        bytes
    }

    #[test]
    fn the_same_bytes_as_the_zstd_crates_encoder_whatever_the_pieces() {
        let data = content();
        // At least three of zstd's jobs (8 MiB at level 3).
        assert!(data.len() > 16 << 20, "{} bytes", data.len());
        let mut expected = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
        expected.multithread(2).unwrap();
        expected.include_checksum(true).unwrap();
        expected.write_all(&data).unwrap();
        let expected = expected.finish().unwrap();

        for (workers, piece) in [(1, 1 << 20), (2, 512), (3, 100_000)] {
            let mut file = tempfile::tempfile().unwrap();
            let mut z = ZstdFile::new(file.try_clone().unwrap(), 3, workers).unwrap();
            for p in data.chunks(piece) {
                z.write_all(p).unwrap();
            }
            let count = z.finish().unwrap();
            let written = read_back(&mut file);
            assert_eq!(count, written.len() as u64);
            assert!(
                written == expected,
                "{workers} workers, {piece}-byte pieces: {} bytes, expected {}",
                written.len(),
                expected.len()
            );
        }
        assert_eq!(zstd::stream::decode_all(&expected[..]).unwrap(), data);
    }

    #[test]
    fn a_write_error_is_the_writers() {
        // /dev/full: every write fails with ENOSPC.
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("/dev/full (every Linux system has it)");
        let mut z = ZstdFile::new(full, 3, 1).unwrap();
        let data = content();
        let err = data
            .chunks(1 << 20)
            .try_for_each(|p| z.write_all(p))
            .and_then(|()| z.finish().map(drop))
            .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    }
}
