//! Reads and hashes file data on reader threads ahead of the writer, so
//! reading and hashing the base overlap with framing and compressing the
//! output. Files are dealt to the readers in turn (file i to reader
//! i mod n) and the writer takes them back in the same turn, so the order
//! is the tree's whatever the threads do.
//!
//! A reader packs the files that fit into one buffer of `CHUNK` bytes
//! together (each with its length and sha256) and sends a larger file in
//! pieces of `CHUNK`. Each reader's queue holds at most `DEPTH` buffers,
//! so memory stays flat whatever the size of the base, and the bytes
//! queued ahead are as many for a directory of small files as for one
//! large file: the readers and the writer do not wait on each other file
//! by file.

use std::collections::VecDeque;
use std::io::{self, BufRead, Read};
use std::path::PathBuf;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

use crate::entry::{Data, Tree};
use crate::sha256x2::{self, Lane};

pub const CHUNK: usize = 1 << 20;
pub const DEPTH: usize = 8;
/// Reader threads: reading and hashing is the heaviest stage of a build
/// after compression, so it gets two.
pub const READERS: usize = 2;

/// One file to read: path, size, where its bytes are.
pub struct Job<'t> {
    pub path: &'t str,
    pub size: u64,
    pub data: &'t Data,
}

enum Msg {
    /// Whole files back to back in the buffer, each one's length and
    /// sha256, in order.
    Files(Vec<u8>, Vec<(usize, String)>),
    /// A piece of a file larger than `CHUNK`.
    Piece(Vec<u8>),
    /// The end of a file sent in pieces; its sha256.
    End(String),
    Err(io::Error, PathBuf),
}

/// Why a reader stops before the end of its files.
enum Stop {
    /// The writer is gone.
    Gone,
    /// Reading a file failed.
    Read(io::Error),
}

impl From<io::Error> for Stop {
    fn from(e: io::Error) -> Self {
        Stop::Read(e)
    }
}

/// A reader's side: whole files being gathered into one buffer, and the
/// buffers the writer gave back.
struct Producer<'t> {
    tx: SyncSender<Msg>,
    recycled: Receiver<Vec<u8>>,
    batch: Vec<u8>,
    /// The lengths of the whole files in `batch`, hashed when it is sent.
    lens: Vec<usize>,
    /// The large file after the one being read, read ahead of its turn.
    ahead: Option<Ahead<'t>>,
}

/// A large file read ahead while the large file before it is read, so
/// that the two are hashed side by side (see [`crate::sha256x2`]): its
/// pieces wait here, hashed, until its turn.
struct Ahead<'t> {
    /// Its place in the reader's files.
    index: usize,
    reader: Box<dyn Read + 't>,
    left: u64,
    lane: Lane,
    pieces: Vec<Vec<u8>>,
}

/// Pieces a reader holds ahead: a file of up to twice this many pieces is
/// hashed alongside its neighbours from end to end.
const AHEAD: usize = 4;

impl<'t> Producer<'t> {
    fn buffer(&self) -> Vec<u8> {
        let mut buf = self
            .recycled
            .try_recv()
            .unwrap_or_else(|_| Vec::with_capacity(CHUNK));
        buf.clear();
        buf
    }

    fn send(&self, msg: Msg) -> Result<(), Stop> {
        self.tx.send(msg).map_err(|_| Stop::Gone)
    }

    /// Sends the whole files gathered so far, if any, hashed two at a
    /// time.
    fn send_batch(&mut self) -> Result<(), Stop> {
        if self.lens.is_empty() {
            return Ok(());
        }
        let mut files = Vec::with_capacity(self.lens.len());
        let mut at = 0;
        for pair in self.lens.chunks(2) {
            let a = &self.batch[at..at + pair[0]];
            at += pair[0];
            match pair.get(1) {
                Some(&len) => {
                    let (da, db) = sha256x2::digest_pair(a, &self.batch[at..at + len]);
                    at += len;
                    files.push((pair[0], hex::encode(da)));
                    files.push((len, hex::encode(db)));
                }
                None => files.push((pair[0], hex::encode(sha256x2::digest(a)))),
            }
        }
        self.lens.clear();
        let next = self.buffer();
        let batch = std::mem::replace(&mut self.batch, next);
        self.send(Msg::Files(batch, files))
    }

    /// Reads one file: into the batch when it fits in a buffer, else in
    /// pieces of its own. `jobs[i]` is the file, `jobs[i + 1]` the one
    /// after it.
    fn read(&mut self, tree: &'t Tree, jobs: &[Job<'t>], i: usize) -> Result<(), Stop> {
        let job = &jobs[i];
        if job.size > CHUNK as u64 {
            self.send_batch()?;
            return self.pieces(tree, jobs, i);
        }
        let reader = tree.open(job.path, job.size, job.data)?;
        if self.batch.len() + job.size as usize > CHUNK {
            self.send_batch()?;
        }
        let start = self.batch.len();
        // A file shorter than listed reads short: the writer says so.
        reader.take(job.size).read_to_end(&mut self.batch)?;
        self.lens.push(self.batch.len() - start);
        Ok(())
    }

    /// One piece of at most `CHUNK` bytes of `left`; empty at the end (or
    /// where the file is shorter than listed: the writer says so).
    fn piece(&self, reader: &mut dyn Read, left: &mut u64) -> io::Result<Vec<u8>> {
        let mut buf = self.buffer();
        let n = reader
            .take((*left).min(CHUNK as u64))
            .read_to_end(&mut buf)?;
        *left -= n as u64;
        Ok(buf)
    }

    /// Reads and sends a large file in pieces, taking over what was read
    /// of it ahead, and reads the next file ahead while there is room when
    /// it is large too. A failure to read ahead only ends the read-ahead:
    /// the file is read again in its turn, which reports the error.
    fn pieces(&mut self, tree: &'t Tree, jobs: &[Job<'t>], i: usize) -> Result<(), Stop> {
        let job = &jobs[i];
        let (mut reader, mut left, mut lane) = match self.ahead.take() {
            Some(a) if a.index == i => {
                for piece in a.pieces {
                    self.send(Msg::Piece(piece))?;
                }
                (a.reader, a.left, a.lane)
            }
            _ => (
                tree.open(job.path, job.size, job.data)?,
                job.size,
                Lane::new(),
            ),
        };
        let mut ahead = jobs
            .get(i + 1)
            .filter(|n| n.size > CHUNK as u64)
            .and_then(|n| {
                let reader = tree.open(n.path, n.size, n.data).ok()?;
                Some(Ahead {
                    index: i + 1,
                    reader,
                    left: n.size,
                    lane: Lane::new(),
                    pieces: Vec::new(),
                })
            });
        while left > 0 {
            let buf = self.piece(&mut reader, &mut left)?;
            if buf.is_empty() {
                break;
            }
            let mut paired = false;
            if let Some(a) = ahead
                .as_mut()
                .filter(|a| a.pieces.len() < AHEAD && a.left > 0)
            {
                match self.piece(&mut a.reader, &mut a.left) {
                    Ok(other) if !other.is_empty() => {
                        sha256x2::update_pair(&mut lane, &buf, &mut a.lane, &other);
                        a.pieces.push(other);
                        paired = true;
                    }
                    Ok(_) => a.left = 0,
                    Err(_) => ahead = None,
                }
            }
            if !paired {
                lane.update(&buf);
            }
            self.send(Msg::Piece(buf))?;
        }
        self.ahead = ahead;
        self.send(Msg::End(hex::encode(lane.finish())))
    }
}

/// Reads `jobs` in order into `tx`, hashing as it goes. Stops at the first
/// error (sent on, after the files before it) or when the receiver is gone.
fn produce<'t>(
    tree: &'t Tree,
    jobs: Vec<Job<'t>>,
    tx: SyncSender<Msg>,
    recycled: Receiver<Vec<u8>>,
) {
    let mut p = Producer {
        tx,
        recycled,
        batch: Vec::with_capacity(CHUNK),
        lens: Vec::new(),
        ahead: None,
    };
    for (i, job) in jobs.iter().enumerate() {
        match p.read(tree, &jobs, i) {
            Ok(()) => {}
            Err(Stop::Gone) => return,
            Err(Stop::Read(e)) => {
                let src = tree.source_of(job.path, job.data);
                let _ = p.send_batch().and_then(|()| p.send(Msg::Err(e, src)));
                return;
            }
        }
    }
    let _ = p.send_batch();
}

/// What the writer holds of one reader's stream.
#[derive(Default)]
struct Held {
    buf: Vec<u8>,
    pos: usize,
    /// Whole files of `buf` after the current one: length and sha256.
    files: VecDeque<(usize, String)>,
}

/// Where the current file's bytes are.
enum Current {
    /// Not started: the next file of the reader in turn.
    Next,
    /// A whole file: `held.buf[held.pos..end]`.
    Whole { end: usize, sha: String },
    /// A file in pieces: the rest of `held.buf`, then the next piece.
    Pieces,
    /// Every byte read.
    Done(String),
}

/// The writer's end: a `BufRead` for the current file.
pub struct Incoming {
    rx: Vec<Receiver<Msg>>,
    recycle: Vec<SyncSender<Vec<u8>>>,
    held: Vec<Held>,
    /// The reader holding the current file.
    turn: usize,
    cur: Current,
    /// Set when a read error came from the source, not the writer.
    pub source_error: Option<PathBuf>,
}

impl Incoming {
    /// The next message of the reader in turn; the buffer it replaces goes
    /// back to that reader.
    fn receive(&mut self) -> io::Result<()> {
        let t = self.turn;
        let msg = self.rx[t]
            .recv()
            .map_err(|_| io::Error::other("the reading thread stopped"))?;
        let held = &mut self.held[t];
        let buf = match msg {
            Msg::Files(buf, files) => {
                held.files = files.into();
                buf
            }
            Msg::Piece(buf) => {
                self.cur = Current::Pieces;
                buf
            }
            Msg::End(sha) => {
                self.cur = Current::Done(sha);
                return Ok(());
            }
            Msg::Err(e, path) => {
                self.source_error = Some(path);
                return Err(e);
            }
        };
        let old = std::mem::replace(&mut held.buf, buf);
        held.pos = 0;
        let _ = self.recycle[t].try_send(old);
        Ok(())
    }

    /// Finishes the current file: consumes up to its end and returns its
    /// sha256; the next read starts the next file.
    pub fn finish_file(&mut self) -> io::Result<String> {
        loop {
            let n = self.fill_buf()?.len();
            if n == 0 {
                break;
            }
            self.consume(n);
        }
        let Current::Done(sha) = std::mem::replace(&mut self.cur, Current::Next) else {
            unreachable!("fill_buf returns nothing only at the end of a file")
        };
        self.turn = (self.turn + 1) % self.rx.len();
        Ok(sha)
    }
}

impl BufRead for Incoming {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        loop {
            let held = &mut self.held[self.turn];
            match &mut self.cur {
                Current::Next => match held.files.pop_front() {
                    Some((len, sha)) => {
                        self.cur = Current::Whole {
                            end: held.pos + len,
                            sha,
                        }
                    }
                    None => self.receive()?,
                },
                Current::Whole { end, sha } => {
                    if held.pos < *end {
                        let end = *end;
                        let held = &self.held[self.turn];
                        return Ok(&held.buf[held.pos..end]);
                    }
                    self.cur = Current::Done(std::mem::take(sha));
                }
                Current::Pieces => {
                    if held.pos < held.buf.len() {
                        let held = &self.held[self.turn];
                        return Ok(&held.buf[held.pos..]);
                    }
                    self.receive()?;
                }
                Current::Done(_) => return Ok(&[]),
            }
        }
    }

    fn consume(&mut self, n: usize) {
        self.held[self.turn].pos += n;
    }
}

impl Read for Incoming {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let buf = self.fill_buf()?;
        let n = out.len().min(buf.len());
        out[..n].copy_from_slice(&buf[..n]);
        self.consume(n);
        Ok(n)
    }
}

/// Runs `write` with an `Incoming` fed by reading threads for `jobs`.
pub fn with_readahead<R>(
    tree: &Tree,
    jobs: Vec<Job<'_>>,
    write: impl FnOnce(&mut Incoming) -> R,
) -> R {
    std::thread::scope(|s| {
        let mut dealt: Vec<Vec<Job>> = (0..READERS).map(|_| Vec::new()).collect();
        for (i, job) in jobs.into_iter().enumerate() {
            dealt[i % READERS].push(job);
        }
        let mut rxs = Vec::new();
        let mut recycles = Vec::new();
        for jobs in dealt {
            let (tx, rx) = sync_channel(DEPTH);
            let (recycle, recycled) = sync_channel(DEPTH + 2);
            s.spawn(move || produce(tree, jobs, tx, recycled));
            rxs.push(rx);
            recycles.push(recycle);
        }
        let mut incoming = Incoming {
            rx: rxs,
            recycle: recycles,
            held: (0..READERS).map(|_| Held::default()).collect(),
            turn: 0,
            cur: Current::Next,
            source_error: None,
        };
        // On return `incoming` is dropped, so a reader still sending sees
        // its channel closed and ends; the scope then joins them.
        write(&mut incoming)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};
    use std::sync::Arc;

    fn bytes(len: usize, seed: u8) -> Data {
        let content = (0..len).map(|i| (i as u8).wrapping_mul(31) ^ seed);
        Data::Bytes(Arc::new(content.collect()))
    }

    fn job(size: u64, data: &Data) -> Job<'_> {
        Job {
            path: "f",
            size,
            data,
        }
    }

    /// Reads the current file in pieces of at most 1000 bytes.
    fn read_file(incoming: &mut Incoming) -> io::Result<(Vec<u8>, String)> {
        let mut got = Vec::new();
        loop {
            let buf = incoming.fill_buf()?;
            if buf.is_empty() {
                break;
            }
            let n = buf.len().min(1000);
            got.extend_from_slice(&buf[..n]);
            incoming.consume(n);
        }
        Ok((got, incoming.finish_file()?))
    }

    #[test]
    fn files_come_back_in_order_with_their_digests() {
        let tree = Tree::default();
        // Files that share a buffer, fill one exactly, or come in pieces.
        let sizes = [0, 1, 4096, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 17, 5];
        // Large files one after another, each reader's read ahead of its
        // turn: shorter, longer and as long as the one before, and longer
        // than the read-ahead holds.
        let large = [
            2 * CHUNK + 5,
            9 * CHUNK,
            CHUNK + 1,
            11 * CHUNK + 3,
            4 * CHUNK,
        ];
        let large: Vec<usize> = large.iter().flat_map(|&n| [n, n + 64]).collect();
        let sizes: Vec<usize> = sizes
            .iter()
            .chain(&[700_000; 5])
            .chain(&large)
            .chain(&[3, 2 * CHUNK])
            .copied()
            .collect();
        let data: Vec<Data> = (0..sizes.len()).map(|i| bytes(sizes[i], i as u8)).collect();
        let jobs = data
            .iter()
            .zip(&sizes)
            .map(|(data, &size)| Job {
                path: "f",
                size: size as u64,
                data,
            })
            .collect();
        with_readahead(&tree, jobs, |incoming| {
            for (i, d) in data.iter().enumerate() {
                let Data::Bytes(want) = d else { unreachable!() };
                let (got, sha) = read_file(incoming).unwrap();
                assert!(got == **want, "file {i}: {} bytes", got.len());
                assert_eq!(
                    sha,
                    hex::encode(Sha256::digest(want.as_slice())),
                    "file {i}"
                );
            }
        });
    }

    #[test]
    fn a_file_shorter_than_listed_reads_short_and_an_error_comes_after_the_files_before_it() {
        let tree = Tree::default();
        let small = bytes(50, 1);
        let large = bytes(CHUNK + 10, 2);
        let missing = Data::Disk(PathBuf::from("/nonexistent/rtdeploy-readahead-test"));
        let jobs = vec![
            job(100, &small),
            job(3 * CHUNK as u64, &large),
            job(50, &small),
            job(7, &missing),
        ];
        with_readahead(&tree, jobs, |incoming| {
            assert_eq!(read_file(incoming).unwrap().0.len(), 50);
            assert_eq!(read_file(incoming).unwrap().0.len(), CHUNK + 10);
            assert_eq!(read_file(incoming).unwrap().0.len(), 50);
            let e = read_file(incoming).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::NotFound);
            assert_eq!(
                incoming.source_error.as_deref(),
                Some(std::path::Path::new("/nonexistent/rtdeploy-readahead-test"))
            );
        });
    }

    #[test]
    fn a_file_read_ahead_that_is_short_or_missing_is_told_in_its_turn() {
        let tree = Tree::default();
        let small = bytes(50, 1);
        let full = bytes(3 * CHUNK, 2);
        let short = bytes(CHUNK + 10, 3);
        let missing = Data::Disk(PathBuf::from("/nonexistent/rtdeploy-readahead-ahead"));
        // The second reader gets the large files, one after another.
        let jobs = vec![
            job(50, &small),
            job(3 * CHUNK as u64, &full),
            job(50, &small),
            job(3 * CHUNK as u64, &short),
            job(50, &small),
            job(2 * CHUNK as u64, &missing),
        ];
        with_readahead(&tree, jobs, |incoming| {
            let Data::Bytes(want) = &full else {
                unreachable!()
            };
            assert_eq!(read_file(incoming).unwrap().0.len(), 50);
            let (got, sha) = read_file(incoming).unwrap();
            assert!(got == **want);
            assert_eq!(sha, hex::encode(Sha256::digest(want.as_slice())));
            assert_eq!(read_file(incoming).unwrap().0.len(), 50);
            let Data::Bytes(want) = &short else {
                unreachable!()
            };
            let (got, sha) = read_file(incoming).unwrap();
            assert!(got == **want, "{} bytes", got.len());
            assert_eq!(sha, hex::encode(Sha256::digest(want.as_slice())));
            assert_eq!(read_file(incoming).unwrap().0.len(), 50);
            let e = read_file(incoming).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::NotFound);
        });
    }
}
