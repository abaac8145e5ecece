//! The control socket protocol: `<prefix>/run/rtdeploy/control.sock`, a
//! Unix stream socket, one JSON object per line each way.
//!
//! Requests: `{"cmd":"status"}`, `{"cmd":"start","name":"imu"}`, `stop`,
//! `restart`, `{"cmd":"stop-all"}`, `{"cmd":"logs","name":"imu","lines":50,
//! "follow":true}`, `{"cmd":"release-changed"}` (sent by `deploy install`
//! after it switched `current`: the supervisor reads `state.json` now
//! instead of at its next once-a-second look). Every request gets one reply line
//! `{"ok":true,...}` or `{"ok":false,"error":"..."}`; a `logs` request with
//! `follow` then gets one `{"ok":true,"data":"..."}` line per chunk of
//! output until the client hangs up.
//!
//! Who may connect: root, the supervisor's own user, or a member of
//! `robot.group` (checked with `SO_PEERCRED` and the peer's groups); the
//! socket file is mode 0660 and owned by that group as well.
//!
//! Limits (any peer may be buggy; none may lock the others out or grow the
//! supervisor): a connection is answered one request at a time and may
//! send ahead of its replies only what its request buffer holds
//! ([`MAX_REQUEST_LINE`]); a line longer than that is answered with an error
//! and skipped up to its newline, without being stored. A connection that
//! has not sent a complete request within [`IDLE_TIMEOUT`] of connecting or
//! of its last answer is told so and closed. At most [`MAX_CONNECTIONS`] are
//! open; when a new client finds them all taken, the one idle longest is
//! closed to make room (and told why), so that `status`, `stop` and
//! `restart` get through; only when every connection is waiting for a
//! reply or following logs ([`MAX_FOLLOWERS`] at most) is the new client
//! answered `busy` ([`Reply::busy`]), which [`Client`] returns as
//! [`ControlRequestError::Busy`]. After `logs` with `follow` a connection
//! only receives; what the client sends is ignored.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::status::SupervisorStatus;

/// Control connections open at once. A robot has a handful of legitimate
/// clients at a time (a `deploy` command, a monitoring script, a few log
/// followers); 64 leaves room for scripts polling in parallel while the
/// worst case stays small: 64 request buffers of [`MAX_REQUEST_LINE`] are
/// 4 MiB, and 64 descriptors are far below the default limit of 1024.
pub const MAX_CONNECTIONS: usize = 64;

/// Connections following logs at once (they are never closed to make
/// room), so that at least `MAX_CONNECTIONS - MAX_FOLLOWERS` remain for
/// requests.
pub const MAX_FOLLOWERS: usize = 16;

/// The longest request line, its newline included. The longest legitimate
/// request is a process name in a few dozen bytes of JSON.
pub const MAX_REQUEST_LINE: usize = 64 * 1024;

/// How long a connection has to send a complete request, counted from its
/// accept or its previous answer, and to read its reply. A client writes
/// its request as soon as it connects; 5 s covers a loaded housekeeping
/// CPU many times over and bounds how long a silent peer holds a slot.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a connection refused or closed with an error has to take its
/// last reply before it is dropped.
pub const CLOSE_LINGER: Duration = Duration::from_secs(1);

/// Output a log follower may leave unread before it is dropped (a
/// terminal or a pipe reads far faster; this bounds a stalled one).
pub const FOLLOW_BACKLOG: usize = 256 << 10;

/// The longest reply line, its newline included. `status` of a robot of
/// 64 processes, each with a full timing report, is well under this; a
/// reply that would be longer is answered with an error saying so
/// ([`Reply::too_long`]), and a client refuses a longer line.
pub const MAX_REPLY_LINE: usize = 1 << 20;

/// The longest `logs` reply line: the newest lines of the log that fit,
/// each escaped as JSON (a control byte takes six).
pub const MAX_LOGS_REPLY: usize = 256 << 10;

/// Reply bytes left unsent, over every connection that is not following
/// a log, beyond which a new reply is [`Reply::busy`] (a short line): a
/// client that asks and does not read holds at most one reply, and all of
/// them together hold at most this, so with [`MAX_FOLLOWERS`] times
/// [`FOLLOW_BACKLOG`] the supervisor holds at most 12 MiB of output for
/// clients however many ask.
pub const MAX_UNSENT: usize = 8 << 20;

/// The socket path under a prefix.
pub fn socket_path(prefix: &Path) -> PathBuf {
    releases::Layout::new(prefix).control_socket()
}

/// A request on the control socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Request {
    Status,
    Start {
        name: String,
    },
    Stop {
        name: String,
    },
    Restart {
        name: String,
    },
    StopAll,
    Logs {
        name: String,
        #[serde(default = "default_lines")]
        lines: usize,
        #[serde(default)]
        follow: bool,
    },
    /// `opt/rtdeploy/current` or `state.json` changed: look now.
    ReleaseChanged,
}

fn default_lines() -> usize {
    50
}

/// A reply line.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Reply {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What was done (`stopping imu`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<SupervisorStatus>,
    /// `logs`: the last lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lines: Option<Vec<String>>,
    /// `logs` with `follow`: new output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    /// The supervisor had no room for this connection (see [`Reply::busy`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub busy: bool,
}

impl Reply {
    pub fn error(msg: impl Into<String>) -> Reply {
        Reply {
            ok: false,
            error: Some(msg.into()),
            ..Default::default()
        }
    }
    pub fn message(msg: impl Into<String>) -> Reply {
        Reply {
            ok: true,
            message: Some(msg.into()),
            ..Default::default()
        }
    }
    /// The connection is closed because the supervisor has no room for it;
    /// trying again later may succeed.
    pub fn busy(msg: impl Into<String>) -> Reply {
        Reply {
            busy: true,
            ..Reply::error(msg)
        }
    }

    /// Stands for a reply of `len` bytes, longer than [`MAX_REPLY_LINE`].
    pub fn too_long(len: usize) -> Reply {
        Reply::error(format!(
            "the reply is {len} bytes, longer than the {} KiB a reply may be",
            MAX_REPLY_LINE >> 10
        ))
    }
}

/// Keeps the newest of `lines` whose JSON fits in `budget` bytes (a line
/// is a JSON string: quotes, escapes, and a comma): what a `logs` reply
/// carries. A newest line too long for the budget alone keeps its end.
/// Returns how many older lines were left out (a cut line counts).
pub fn fit_lines(lines: &mut Vec<String>, budget: usize) -> usize {
    let mut used = 0usize;
    let mut keep = 0;
    for l in lines.iter().rev() {
        let n = json_string_len(l) + 1;
        if used + n > budget {
            break;
        }
        used += n;
        keep += 1;
    }
    let dropped = lines.len() - keep;
    if keep == 0 {
        if let Some(last) = lines.last_mut() {
            // The end of the line that fits, on a character boundary.
            let mut n = 3usize;
            let mut start = last.len();
            for (i, c) in last.char_indices().rev() {
                n += json_string_len(c.encode_utf8(&mut [0; 4])) - 2;
                if n > budget {
                    break;
                }
                start = i;
            }
            last.drain(..start);
            let n = lines.len() - 1;
            lines.drain(..n);
            return dropped;
        }
    }
    lines.drain(..dropped);
    dropped
}

/// The length of `s` written as a JSON string by serde_json.
fn json_string_len(s: &str) -> usize {
    2 + s
        .chars()
        .map(|c| match c {
            '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
            c if (c as u32) < 0x20 => 6,
            c => c.len_utf8(),
        })
        .sum::<usize>()
}

/// Why a control request failed on the client side.
#[derive(Debug, thiserror::Error)]
pub enum ControlRequestError {
    #[error("cannot connect to {}: {err} (is `deploy supervise` running?)", path.display())]
    Connect { path: PathBuf, err: std::io::Error },
    #[error("control socket {}: {err}", path.display())]
    Io { path: PathBuf, err: std::io::Error },
    #[error("control socket {}: bad reply `{line}`: {err}", path.display())]
    BadReply {
        path: PathBuf,
        line: String,
        err: serde_json::Error,
    },
    #[error("control socket {}: the supervisor hung up without a reply", path.display())]
    NoReply { path: PathBuf },
    /// The supervisor had no room for this connection.
    #[error("control socket {}: {message}", path.display())]
    Busy { path: PathBuf, message: String },
    #[error("control socket {}: a reply line longer than {max} bytes", path.display())]
    TooLong { path: PathBuf, max: usize },
}

/// A connection to the supervisor.
pub struct Client {
    path: PathBuf,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Client {
    pub fn connect(path: &Path) -> Result<Client, ControlRequestError> {
        let s = UnixStream::connect(path).map_err(|err| ControlRequestError::Connect {
            path: path.to_path_buf(),
            err,
        })?;
        let io = |err| ControlRequestError::Io {
            path: path.to_path_buf(),
            err,
        };
        s.set_read_timeout(Some(Duration::from_secs(30)))
            .map_err(io)?;
        let writer = s.try_clone().map_err(io)?;
        Ok(Client {
            path: path.to_path_buf(),
            reader: BufReader::new(s),
            writer,
        })
    }

    /// Sends a raw line (for tests of malformed input) and reads one reply.
    pub fn raw(&mut self, line: &str) -> Result<Reply, ControlRequestError> {
        let path = self.path.clone();
        let io = move |err| ControlRequestError::Io { path, err };
        let written = self.writer.write_all(format!("{line}\n").as_bytes());
        if let Err(e) = written {
            // A refused connection gets its reply before the supervisor
            // stops reading: show that reply (or that it is busy) rather
            // than the broken pipe.
            return match self.next_reply() {
                Ok(Some(r)) => Ok(r),
                Err(busy @ ControlRequestError::Busy { .. }) => Err(busy),
                _ => Err(io(e)),
            };
        }
        self.next_reply()?
            .ok_or_else(|| ControlRequestError::NoReply {
                path: self.path.clone(),
            })
    }

    pub fn request(&mut self, req: &Request) -> Result<Reply, ControlRequestError> {
        let line = serde_json::to_string(req).expect("requests serialize");
        self.raw(&line)
    }

    /// The next reply line; `None` when the supervisor hung up, an error
    /// when it answered that it is busy. A line longer than
    /// [`MAX_REPLY_LINE`] is refused without being held.
    pub fn next_reply(&mut self) -> Result<Option<Reply>, ControlRequestError> {
        let mut raw = Vec::new();
        let n = (&mut self.reader)
            .take(MAX_REPLY_LINE as u64)
            .read_until(b'\n', &mut raw)
            .map_err(|err| ControlRequestError::Io {
                path: self.path.clone(),
                err,
            })?;
        if n == 0 {
            return Ok(None);
        }
        if n >= MAX_REPLY_LINE && raw.last() != Some(&b'\n') {
            return Err(ControlRequestError::TooLong {
                path: self.path.clone(),
                max: MAX_REPLY_LINE,
            });
        }
        let line = String::from_utf8_lossy(&raw);
        let reply: Reply =
            serde_json::from_str(line.trim_end()).map_err(|err| ControlRequestError::BadReply {
                path: self.path.clone(),
                line: line.trim_end().chars().take(200).collect(),
                err,
            })?;
        if reply.busy {
            return Err(ControlRequestError::Busy {
                path: self.path.clone(),
                message: reply.error.unwrap_or_else(|| "busy".into()),
            });
        }
        Ok(Some(reply))
    }

    /// Waits without a timeout (for `logs --follow`).
    pub fn no_timeout(&mut self) -> Result<(), ControlRequestError> {
        self.reader
            .get_ref()
            .set_read_timeout(None)
            .map_err(|err| ControlRequestError::Io {
                path: self.path.clone(),
                err,
            })
    }
}

/// One request, one reply.
pub fn request(path: &Path, req: &Request) -> Result<Reply, ControlRequestError> {
    Client::connect(path)?.request(req)
}

/// The server's buffer of one connection's request bytes, never more than
/// [`MAX_REQUEST_LINE`]: the limit holds while reading, not after. A longer
/// line is reported once by [`next_line`](RequestBuf::next_line) and the
/// rest of it dropped as it arrives, up to its newline.
#[derive(Debug, Default)]
pub(crate) struct RequestBuf {
    buf: Vec<u8>,
    /// Inside an over-long line: bytes are dropped up to its newline.
    skipping: bool,
}

/// What [`RequestBuf::next_line`] found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum NextLine {
    /// A complete line, its newline included.
    Line(Vec<u8>),
    /// A line reached [`MAX_REQUEST_LINE`] without a newline: dropped, and
    /// its rest will be.
    TooLong,
    /// No complete line yet.
    Incomplete,
}

impl RequestBuf {
    /// How many bytes [`push`](RequestBuf::push) takes now; 0 when the
    /// buffer is full of requests that have not been answered yet.
    pub(crate) fn room(&self) -> usize {
        if self.skipping {
            MAX_REQUEST_LINE
        } else {
            MAX_REQUEST_LINE - self.buf.len()
        }
    }

    /// Adds bytes read from the connection, at most [`room`](RequestBuf::room).
    pub(crate) fn push(&mut self, mut data: &[u8]) {
        assert!(data.len() <= self.room(), "read more than the room left");
        if self.skipping {
            match data.iter().position(|&b| b == b'\n') {
                Some(end) => {
                    self.skipping = false;
                    data = &data[end + 1..];
                }
                None => return,
            }
        }
        let need = self.buf.len() + data.len();
        if need > self.buf.capacity() {
            // Grow by doubling, but never past the limit.
            let cap = need.next_power_of_two().min(MAX_REQUEST_LINE);
            self.buf.reserve_exact(cap - self.buf.len());
        }
        self.buf.extend_from_slice(data);
    }

    pub(crate) fn next_line(&mut self) -> NextLine {
        if let Some(end) = self.buf.iter().position(|&b| b == b'\n') {
            return NextLine::Line(self.buf.drain(..=end).collect());
        }
        if self.buf.len() >= MAX_REQUEST_LINE {
            self.buf.clear();
            self.skipping = true;
            return NextLine::TooLong;
        }
        NextLine::Incomplete
    }

    /// A complete line (or an over-long one) waits for
    /// [`next_line`](RequestBuf::next_line).
    pub(crate) fn has_line(&self) -> bool {
        self.buf.len() >= MAX_REQUEST_LINE || self.buf.contains(&b'\n')
    }

    /// Drops what was received and whatever comes later up to a newline.
    pub(crate) fn discard(&mut self) {
        self.buf = Vec::new();
        self.skipping = false;
    }
}

/// What the server knows of an open connection when a new client finds
/// all [`MAX_CONNECTIONS`] taken.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Slot {
    /// Waiting for a reply the supervisor owes, or following logs: kept.
    pub(crate) busy: bool,
    /// Already being closed with an error.
    pub(crate) closing: bool,
    /// Accepted, or last answered, at.
    pub(crate) since: Instant,
}

/// The connection to close to make room for a new client: one already
/// closing, else the one idle longest. `None` when every connection waits
/// for a reply or follows logs: the new client is then told the supervisor
/// is busy.
pub(crate) fn make_room(slots: impl IntoIterator<Item = Slot>) -> Option<usize> {
    slots
        .into_iter()
        .enumerate()
        .filter(|(_, s)| !s.busy)
        .min_by_key(|(_, s)| (!s.closing, s.since))
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_wire_form() {
        assert_eq!(
            serde_json::to_string(&Request::StopAll).unwrap(),
            r#"{"cmd":"stop-all"}"#
        );
        let r: Request = serde_json::from_str(r#"{"cmd":"logs","name":"imu"}"#).unwrap();
        assert_eq!(
            r,
            Request::Logs {
                name: "imu".into(),
                lines: 50,
                follow: false
            }
        );
        assert_eq!(
            serde_json::to_string(&Request::ReleaseChanged).unwrap(),
            r#"{"cmd":"release-changed"}"#
        );
        assert!(serde_json::from_str::<Request>(r#"{"cmd":"explode"}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"cmd":"start"}"#).is_err());
    }

    #[test]
    fn logs_lines_are_fit_into_a_reply_newest_first() {
        let mut l: Vec<String> = (0..100).map(|i| format!("line {i}")).collect();
        // `"line 99",` is 10 bytes: 3 of them fit in 30.
        assert_eq!(fit_lines(&mut l, 30), 97);
        assert_eq!(l, ["line 97", "line 98", "line 99"]);
        // A line of control bytes (six each as JSON) longer than the
        // budget keeps its end.
        let mut l = vec!["old".to_string(), "\u{1}".repeat(1000)];
        assert_eq!(fit_lines(&mut l, 603), 2);
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].len(), 100);
        assert!(serde_json::to_vec(&l[0]).unwrap().len() < 603);
        let mut none: Vec<String> = Vec::new();
        assert_eq!(fit_lines(&mut none, 10), 0);
    }

    #[test]
    fn busy_reply_wire_form() {
        let r = Reply::busy("busy: no room");
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"ok":false,"error":"busy: no room","busy":true}"#
        );
        // Other replies do not carry the field; older replies parse.
        assert_eq!(
            serde_json::to_string(&Reply::error("x")).unwrap(),
            r#"{"ok":false,"error":"x"}"#
        );
        let old: Reply = serde_json::from_str(r#"{"ok":true}"#).unwrap();
        assert!(!old.busy);
    }

    #[test]
    fn request_lines_are_split_and_bounded_while_reading() {
        let mut b = RequestBuf::default();
        assert_eq!(b.room(), MAX_REQUEST_LINE);
        b.push(b"{\"cmd\":\"status\"}\n{\"cmd\"");
        assert!(b.has_line());
        assert_eq!(
            b.next_line(),
            NextLine::Line(b"{\"cmd\":\"status\"}\n".to_vec())
        );
        assert_eq!(b.next_line(), NextLine::Incomplete);
        assert!(!b.has_line());
        b.push(b":\"stop-all\"}\n");
        assert_eq!(
            b.next_line(),
            NextLine::Line(b"{\"cmd\":\"stop-all\"}\n".to_vec())
        );

        // A line of MAX_REQUEST_LINE bytes without its newline fills the
        // buffer: no room for more until it is taken.
        let chunk = vec![b'x'; 4096];
        for _ in 0..MAX_REQUEST_LINE / chunk.len() {
            b.push(&chunk);
        }
        assert_eq!(b.room(), 0);
        assert!(b.buf.capacity() <= MAX_REQUEST_LINE);
        assert!(b.has_line());
        assert_eq!(b.next_line(), NextLine::TooLong);
        // Its rest is dropped as it comes, however long, without being kept.
        for _ in 0..1000 {
            assert_eq!(b.room(), MAX_REQUEST_LINE);
            b.push(&chunk);
            assert!(b.buf.is_empty());
        }
        assert_eq!(b.next_line(), NextLine::Incomplete);
        // Its newline ends it; what follows is the next request.
        b.push(b"xxx\n{\"cmd\":\"status\"}\n");
        assert_eq!(
            b.next_line(),
            NextLine::Line(b"{\"cmd\":\"status\"}\n".to_vec())
        );
        assert_eq!(b.next_line(), NextLine::Incomplete);
    }

    #[test]
    fn a_line_one_byte_short_of_the_limit_is_a_request() {
        let mut b = RequestBuf::default();
        b.push(&vec![b' '; MAX_REQUEST_LINE - 1]);
        assert_eq!(b.room(), 1);
        assert!(!b.has_line());
        b.push(b"\n");
        assert!(matches!(b.next_line(), NextLine::Line(l) if l.len() == MAX_REQUEST_LINE));
    }

    #[test]
    fn room_is_made_by_closing_a_closing_connection_then_the_longest_idle() {
        let t = Instant::now();
        let at = |s: u64| t + Duration::from_secs(s);
        let slot = |busy, closing, since| Slot {
            busy,
            closing,
            since,
        };
        // The one idle longest.
        assert_eq!(
            make_room([
                slot(false, false, at(3)),
                slot(false, false, at(1)),
                slot(true, false, at(0)),
                slot(false, false, at(2)),
            ]),
            Some(1)
        );
        // One being closed goes first, however recent.
        assert_eq!(
            make_room([slot(false, false, at(1)), slot(false, true, at(9))]),
            Some(1)
        );
        // Every one waits for a reply or follows logs: no room.
        assert_eq!(
            make_room([slot(true, false, at(1)), slot(true, false, at(2))]),
            None
        );
        assert_eq!(make_room([]), None);
    }

    #[test]
    fn a_connect_error_says_its_cause_once() {
        let dir = tempfile::tempdir().unwrap();
        let e = Client::connect(&dir.path().join("none.sock"))
            .err()
            .unwrap();
        assert!(e.to_string().contains("(os error 2)"), "{e}");
        assert!(std::error::Error::source(&e).is_none(), "{e}");
    }
}
