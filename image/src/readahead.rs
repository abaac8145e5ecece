//! Reads and hashes file data on reader threads ahead of the writer, so
//! reading and hashing the base overlap with framing and compressing the
//! output. Files are dealt to the readers in turn (file i to reader
//! i mod n) and the writer takes them back in the same turn, so the order
//! is the tree's whatever the threads do. Each reader's queue is bounded
//! (`DEPTH` chunks of at most `CHUNK` bytes), so memory stays flat
//! whatever the size of the base.

use std::io::{self, BufRead, Read};
use std::path::PathBuf;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError};

use sha2::{Digest, Sha256};

use crate::entry::{Data, Tree};

pub const CHUNK: usize = 1 << 20;
pub const DEPTH: usize = 8;
/// Reader threads: reading and hashing is the heaviest stage of a build,
/// so it gets two.
pub const READERS: usize = 2;

/// One file to read: path, size, where its bytes are.
pub struct Job<'t> {
    pub path: &'t str,
    pub size: u64,
    pub data: &'t Data,
}

enum Msg {
    Data(Vec<u8>),
    /// A whole file in one piece, and its sha256 (small files: one
    /// message instead of two).
    Whole(Vec<u8>, String),
    /// The file ended; its sha256.
    End(String),
    Err(io::Error, PathBuf),
}

/// Reads `jobs` in order into `tx`, hashing as it goes. Stops at the first
/// error (sent on) or when the receiver is gone.
fn produce(tree: &Tree, jobs: Vec<Job<'_>>, tx: SyncSender<Msg>, recycled: Receiver<Vec<u8>>) {
    for job in jobs {
        let src = || tree.source_of(job.path, job.data);
        let mut reader = match tree.open(job.path, job.size, job.data) {
            Ok(r) => r,
            Err(e) => {
                let _ = tx.send(Msg::Err(e, src()));
                return;
            }
        };
        let mut hasher = Sha256::new();
        let mut left = job.size;
        let mut sent_whole = false;
        while left > 0 {
            let mut buf = match recycled.try_recv() {
                Ok(b) => b,
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => Vec::with_capacity(CHUNK),
            };
            buf.clear();
            let want = left.min(CHUNK as u64);
            match (&mut reader).take(want).read_to_end(&mut buf) {
                Ok(0) => break, // shorter than listed: the writer says so
                Ok(n) => {
                    left -= n as u64;
                    hasher.update(&buf);
                    let msg = if left == 0 && n as u64 == job.size {
                        Msg::Whole(buf, hex::encode(std::mem::take(&mut hasher).finalize()))
                    } else {
                        Msg::Data(buf)
                    };
                    let whole = matches!(msg, Msg::Whole(..));
                    if tx.send(msg).is_err() {
                        return;
                    }
                    if whole {
                        sent_whole = true;
                        break;
                    }
                }
                Err(e) => {
                    let _ = tx.send(Msg::Err(e, src()));
                    return;
                }
            }
        }
        if sent_whole {
            continue;
        }
        if tx.send(Msg::End(hex::encode(hasher.finalize()))).is_err() {
            return;
        }
    }
}

/// The writer's end: a `Read` for the current file.
pub struct Incoming {
    rx: Vec<Receiver<Msg>>,
    recycle: Vec<SyncSender<Vec<u8>>>,
    /// The reader holding the current file.
    turn: usize,
    cur: Vec<u8>,
    pos: usize,
    sha: Option<String>,
    /// Set when a read error came from the source, not the writer.
    pub source_error: Option<PathBuf>,
}

impl BufRead for Incoming {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        while self.pos >= self.cur.len() && self.sha.is_none() {
            match self.rx[self.turn].recv() {
                Ok(Msg::Data(v)) => {
                    let old = std::mem::replace(&mut self.cur, v);
                    let _ = self.recycle[self.turn].try_send(old);
                    self.pos = 0;
                }
                Ok(Msg::Whole(v, sha)) => {
                    let old = std::mem::replace(&mut self.cur, v);
                    let _ = self.recycle[self.turn].try_send(old);
                    self.pos = 0;
                    self.sha = Some(sha);
                }
                Ok(Msg::End(sha)) => self.sha = Some(sha),
                Ok(Msg::Err(e, path)) => {
                    self.source_error = Some(path);
                    return Err(e);
                }
                Err(_) => return Err(io::Error::other("the reading thread stopped")),
            }
        }
        Ok(&self.cur[self.pos.min(self.cur.len())..])
    }

    fn consume(&mut self, n: usize) {
        self.pos += n;
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

impl Incoming {
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
        self.turn = (self.turn + 1) % self.rx.len();
        Ok(self
            .sha
            .take()
            .expect("read returned 0 only at the end of a file"))
    }
}

/// Runs `write` with an `Incoming` fed by a reading thread for `jobs`.
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
            turn: 0,
            cur: Vec::new(),
            pos: 0,
            sha: None,
            source_error: None,
        };
        // On return `incoming` is dropped, so a reader still sending sees
        // its channel closed and ends; the scope then joins them.
        write(&mut incoming)
    })
}
