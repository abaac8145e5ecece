//! The wire between a simulation's coordinator (`deploy sim`) and the
//! event loop of each process it runs: one `SOCK_SEQPACKET` socket per
//! process (its descriptor in [`crate::env::SIM`]), fixed frames of
//! [`FRAME`] bytes, little-endian, one per packet.
//!
//! The conversation is strictly in turns, so that one process runs at a
//! time:
//!
//! 1. the loop, when its process calls `run`, says [`FromLoop::Hello`];
//! 2. the coordinator says [`ToLoop::Turn`] with a virtual time, the loop
//!    sets its clock there, handles what is due and answers
//!    [`FromLoop::Turned`] with how the turn ended, when it next has
//!    something to do and how many messages it has published in all;
//! 3. until the coordinator says [`ToLoop::Stop`] (the run is over: `run`
//!    returns), or the loop has ended (`Turned` with an end other than
//!    [`TurnEnd::Waiting`]: `run` returns after saying so).
//!
//! Either side treats a frame it cannot read (wrong length, kind, magic or
//! version, a time that goes backwards) as the end of the link, naming
//! what was wrong: a frame is bytes from another process.

/// The length of every frame.
pub const FRAME: usize = 32;
/// The first eight bytes of a hello.
pub const MAGIC: [u8; 8] = *b"RTSIMLNK";
/// This wire's version.
pub const VERSION: u32 = 1;

const HELLO: u32 = 1;
const TURN: u32 = 2;
const STOP: u32 = 3;
const TURNED: u32 = 4;
/// `next_ns` of a loop that has nothing armed.
const NOTHING: u64 = u64::MAX;

/// From the coordinator to a loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToLoop {
    /// Take a turn at this virtual time (nanoseconds on the loop's clock).
    Turn { now_ns: u64 },
    /// The run is over: return from `run`.
    Stop,
}

/// How a loop's turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnEnd {
    /// It waits for its next event.
    Waiting,
    /// A handler asked it to exit.
    Exited,
    /// Nothing is left to wait for.
    Done,
}

/// From a loop to the coordinator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FromLoop {
    /// The loop is ready for its first turn.
    Hello { version: u32 },
    /// A turn is over.
    Turned {
        end: TurnEnd,
        /// When it next has something to do (`None`: nothing armed).
        next_ns: Option<u64>,
        /// Messages it has published since it started (its senders and its
        /// timing reports): a change means other loops may have something
        /// to read at the same instant.
        published: u64,
        /// CPU time the turn took on the loop's thread, nanoseconds (what
        /// `deploy sim --charge-cpu` charges to the clock).
        cpu_ns: u64,
    },
}

/// A frame that is not one of this wire's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("a frame of {0} bytes (every frame is {FRAME})")]
    Length(usize),
    #[error("frame kind {0} is not one the other side sends")]
    Kind(u32),
    #[error("a hello without the wire's magic")]
    Magic,
    #[error("wire version {0} (this side speaks {VERSION})")]
    Version(u32),
    #[error("turn end {0} is not one of waiting (0), exited (1), done (2)")]
    End(u32),
}

fn frame(kind: u32, word: u32, a: u64, b: u64, c: u64) -> [u8; FRAME] {
    let mut f = [0u8; FRAME];
    f[0..4].copy_from_slice(&kind.to_le_bytes());
    f[4..8].copy_from_slice(&word.to_le_bytes());
    f[8..16].copy_from_slice(&a.to_le_bytes());
    f[16..24].copy_from_slice(&b.to_le_bytes());
    f[24..32].copy_from_slice(&c.to_le_bytes());
    f
}

/// The frame's kind, word and three numbers.
fn fields(bytes: &[u8]) -> Result<(u32, u32, u64, u64, u64), FrameError> {
    let f: &[u8; FRAME] = bytes
        .try_into()
        .map_err(|_| FrameError::Length(bytes.len()))?;
    let u32_at = |i: usize| u32::from_le_bytes([f[i], f[i + 1], f[i + 2], f[i + 3]]);
    let u64_at = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&f[i..i + 8]);
        u64::from_le_bytes(b)
    };
    Ok((u32_at(0), u32_at(4), u64_at(8), u64_at(16), u64_at(24)))
}

impl ToLoop {
    pub fn encode(self) -> [u8; FRAME] {
        match self {
            ToLoop::Turn { now_ns } => frame(TURN, 0, now_ns, 0, 0),
            ToLoop::Stop => frame(STOP, 0, 0, 0, 0),
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<ToLoop, FrameError> {
        match fields(bytes)? {
            (TURN, _, now_ns, _, _) => Ok(ToLoop::Turn { now_ns }),
            (STOP, ..) => Ok(ToLoop::Stop),
            (kind, ..) => Err(FrameError::Kind(kind)),
        }
    }
}

impl FromLoop {
    pub fn encode(self) -> [u8; FRAME] {
        match self {
            FromLoop::Hello { version } => frame(HELLO, version, u64::from_le_bytes(MAGIC), 0, 0),
            FromLoop::Turned {
                end,
                next_ns,
                published,
                cpu_ns,
            } => {
                let end = match end {
                    TurnEnd::Waiting => 0,
                    TurnEnd::Exited => 1,
                    TurnEnd::Done => 2,
                };
                frame(TURNED, end, next_ns.unwrap_or(NOTHING), published, cpu_ns)
            }
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<FromLoop, FrameError> {
        match fields(bytes)? {
            (HELLO, version, magic, _, _) => {
                if magic != u64::from_le_bytes(MAGIC) {
                    return Err(FrameError::Magic);
                }
                if version != VERSION {
                    return Err(FrameError::Version(version));
                }
                Ok(FromLoop::Hello { version })
            }
            (TURNED, end, next, published, cpu_ns) => Ok(FromLoop::Turned {
                end: match end {
                    0 => TurnEnd::Waiting,
                    1 => TurnEnd::Exited,
                    2 => TurnEnd::Done,
                    e => return Err(FrameError::End(e)),
                },
                next_ns: (next != NOTHING).then_some(next),
                published,
                cpu_ns,
            }),
            (kind, ..) => Err(FrameError::Kind(kind)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_frame_reads_back_and_garbage_is_named() {
        for m in [ToLoop::Turn { now_ns: 7 }, ToLoop::Stop] {
            assert_eq!(ToLoop::decode(&m.encode()), Ok(m));
        }
        for m in [
            FromLoop::Hello { version: VERSION },
            FromLoop::Turned {
                end: TurnEnd::Exited,
                next_ns: None,
                published: 3,
                cpu_ns: 0,
            },
            FromLoop::Turned {
                end: TurnEnd::Waiting,
                next_ns: Some(1_000_000_001),
                published: u64::MAX,
                cpu_ns: 12_345,
            },
        ] {
            assert_eq!(FromLoop::decode(&m.encode()), Ok(m));
        }
        assert_eq!(ToLoop::decode(&[0; 31]), Err(FrameError::Length(31)));
        assert_eq!(FromLoop::decode(&[0; 33]), Err(FrameError::Length(33)));
        // Each side refuses the other's kinds and unknown ones.
        let hello = FromLoop::Hello { version: VERSION }.encode();
        assert_eq!(ToLoop::decode(&hello), Err(FrameError::Kind(HELLO)));
        assert_eq!(
            FromLoop::decode(&ToLoop::Stop.encode()),
            Err(FrameError::Kind(STOP))
        );
        let mut f = hello;
        f[8] ^= 1;
        assert_eq!(FromLoop::decode(&f), Err(FrameError::Magic));
        let mut f = hello;
        f[4] = 9;
        assert_eq!(FromLoop::decode(&f), Err(FrameError::Version(9)));
        let mut f = FromLoop::Turned {
            end: TurnEnd::Done,
            next_ns: None,
            published: 0,
            cpu_ns: 0,
        }
        .encode();
        f[4] = 3;
        assert_eq!(FromLoop::decode(&f), Err(FrameError::End(3)));
    }
}
