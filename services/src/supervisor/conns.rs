//! The control socket's connections as the loop holds them (limits and
//! their reasons: [`crate::control`]): who may connect, reading requests
//! into bounded buffers, replies queued and flushed without blocking,
//! replies owed for later ([`Pending`]), clients following a process's
//! log, and dropping the idle, the slow and the dead.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::time::Instant;

use super::table::{Followers, PState, Table};
use crate::control::{self, NextLine, Reply, Request, RequestBuf};
use crate::procfs;

/// Bytes read from one control connection per turn of the loop, so that
/// a client that never stops sending cannot keep the loop from the others.
pub(super) const READ_BUDGET: usize = 64 * 1024;

/// Connections accepted per turn of the loop: the ones already open are
/// read before more are let in.
const ACCEPT_BATCH: usize = 16;

/// Why a peer may not use the control socket.
#[derive(Debug, thiserror::Error)]
pub(super) enum PeerAccessError {
    #[error("permission denied: cannot read peer credentials: {err}")]
    Credentials { err: std::io::Error },
    #[error(
        "permission denied: uid {uid} is not root, not the supervisor's user ({own_uid}) and not in group {}",
        describe_group(group)
    )]
    NotAllowed {
        uid: u32,
        own_uid: u32,
        /// `robot.group` and its gid, when set and known.
        group: Option<(String, u32)>,
    },
}

fn describe_group(group: &Option<(String, u32)>) -> String {
    match group {
        Some((g, gid)) => format!("`{g}` ({gid})"),
        None => "(robot.group not set)".into(),
    }
}

/// Who may connect: root, the supervisor's own user, or a member of
/// `robot.group`.
pub(super) struct Access {
    pub own_uid: u32,
    /// `robot.group` as written.
    pub group_name: Option<String>,
    /// Its gid, when it resolved.
    pub group_gid: Option<u32>,
    /// Where a peer's supplementary groups are read.
    pub proc_root: PathBuf,
}

impl Access {
    /// Root, the supervisor's own user, or a member of `robot.group`.
    fn check(&self, s: &UnixStream) -> Result<(), PeerAccessError> {
        let (pid, uid, gid) = crate::sys::peer_cred(s.as_raw_fd())
            .map_err(|err| PeerAccessError::Credentials { err })?;
        if uid == 0 || uid == self.own_uid {
            return Ok(());
        }
        if let Some(group) = self.group_gid {
            if gid == group {
                return Ok(());
            }
            // Supplementary groups, when the peer is visible in our /proc.
            if pid > 0 {
                if let Ok(st) = procfs::read_status(&self.proc_root, pid) {
                    if st.groups.contains(&group) {
                        return Ok(());
                    }
                }
            }
        }
        Err(PeerAccessError::NotAllowed {
            uid,
            own_uid: self.own_uid,
            group: match (&self.group_name, self.group_gid) {
                (Some(g), Some(gid)) => Some((g.clone(), gid)),
                _ => None,
            },
        })
    }
}

/// A control connection.
struct Conn {
    /// Names the connection in [`Pending`] across removals from `conns`.
    id: u64,
    stream: UnixStream,
    input: RequestBuf,
    outbuf: Vec<u8>,
    /// Following this process's log.
    follow: Option<usize>,
    /// A request whose reply comes later (see [`Pending`]).
    awaiting: bool,
    /// Dropped once `outbuf` is flushed; what the client sends is ignored.
    closing: bool,
    dead: bool,
    /// Accepted, or last answered, at (the longest idle makes room first).
    since: Instant,
    /// Dropped at this time: no complete request since `since`, or a reply
    /// left unread. `None` while awaiting a reply or following.
    deadline: Option<Instant>,
}

impl Conn {
    fn new(id: u64, stream: UnixStream, now: Instant) -> Conn {
        Conn {
            id,
            stream,
            input: RequestBuf::default(),
            outbuf: Vec::new(),
            follow: None,
            awaiting: false,
            closing: false,
            dead: false,
            since: now,
            deadline: Some(now + control::IDLE_TIMEOUT),
        }
    }

    /// Ready for its next request: nothing owed, nothing left to send.
    fn ready(&self) -> bool {
        !self.dead
            && !self.closing
            && !self.awaiting
            && self.follow.is_none()
            && self.outbuf.is_empty()
    }

    /// Answered: the client has `IDLE_TIMEOUT` to read this and send the
    /// next request. `unsent` is what the other connections have not sent
    /// yet ([`queue`]).
    fn answered(&mut self, r: &Reply, now: Instant, unsent: usize) {
        queue(self, r, unsent);
        self.awaiting = false;
        self.since = now;
        self.deadline = Some(now + control::IDLE_TIMEOUT);
    }

    /// Sends `r` as the last reply and drops the connection once it is out
    /// (or after `CLOSE_LINGER`).
    fn close_with(&mut self, r: &Reply, now: Instant) {
        // A refusal is a short line: it is queued whatever others hold.
        queue(self, r, 0);
        self.input.discard();
        self.closing = true;
        self.deadline = Some(now + control::CLOSE_LINGER);
        flush(self);
    }
}

/// A reply owed to a connection (`conn` is its [`Conn::id`]).
pub(super) enum Pending {
    Stopped {
        conn: u64,
        proc_idx: usize,
    },
    Restarted {
        conn: u64,
        proc_idx: usize,
        old_pid: Option<i32>,
    },
    All {
        conn: u64,
    },
}

/// The next step in serving a connection (see [`Conns::next_request`]).
pub(super) enum Turn {
    /// Nothing to answer now: no complete request, or a reply still owed
    /// or unsent.
    Wait,
    /// A line was dealt with at once: empty (skipped), too long or not a
    /// request (answered with an error).
    Handled,
    Request(Request),
}

/// The result of one read from a connection (see [`Conns::read_some`]).
pub(super) enum ReadStep {
    /// Closed, failed, drained for now, or closed for sending too much.
    Stop,
    /// Nothing for the request buffer (interrupted, or input ignored).
    Again,
    /// Bytes added to the request buffer: answer what is complete.
    Pushed,
}

/// The listening socket and every open connection.
pub(super) struct Conns {
    conns: Vec<Conn>,
    next_id: u64,
    listener: Option<UnixListener>,
    socket_path: PathBuf,
    pending: Vec<Pending>,
    access: Access,
}

impl Followers for Conns {
    fn forward(&mut self, proc_idx: usize, data: &str) {
        let reply = Reply {
            ok: true,
            data: Some(data.to_string()),
            ..Default::default()
        };
        let line = reply_line(&reply);
        for c in self
            .conns
            .iter_mut()
            .filter(|c| c.follow == Some(proc_idx) && !c.dead)
        {
            if c.outbuf.len() + line.len() > control::FOLLOW_BACKLOG {
                // A follower that does not read: drop it rather than hold
                // more for it.
                c.dead = true;
                continue;
            }
            c.outbuf.extend_from_slice(&line);
        }
    }
}

impl Conns {
    pub(super) fn new(listener: UnixListener, socket_path: PathBuf, access: Access) -> Conns {
        Conns {
            conns: Vec::new(),
            next_id: 0,
            listener: Some(listener),
            socket_path,
            pending: Vec::new(),
            access,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.conns.len()
    }

    pub(super) fn listener_fd(&self) -> Option<RawFd> {
        self.listener.as_ref().map(|l| l.as_raw_fd())
    }

    /// The descriptors to poll: per open connection, its index, its
    /// socket and whether it has output waiting.
    pub(super) fn poll_fds(&self) -> impl Iterator<Item = (usize, RawFd, bool)> + '_ {
        self.conns
            .iter()
            .enumerate()
            .filter(|(_, c)| !c.dead)
            .map(|(k, c)| (k, c.stream.as_raw_fd(), !c.outbuf.is_empty()))
    }

    /// Reply bytes queued and not sent yet on the connections other than
    /// `k` that do not follow a log (what [`control::MAX_UNSENT`] bounds).
    fn unsent_except(&self, k: Option<usize>) -> usize {
        self.conns
            .iter()
            .enumerate()
            .filter(|(i, c)| Some(*i) != k && c.follow.is_none() && !c.dead)
            .map(|(_, c)| c.outbuf.len())
            .sum()
    }

    /// Connection `k` is ready for its next request and one is complete.
    pub(super) fn has_request(&self, k: usize) -> bool {
        self.conns[k].ready() && self.conns[k].input.has_line()
    }

    /// The connection's id, for a [`Pending`] reply.
    pub(super) fn id(&self, k: usize) -> u64 {
        self.conns[k].id
    }

    /// Clients following a log.
    pub(super) fn followers(&self) -> usize {
        self.conns.iter().filter(|c| c.follow.is_some()).count()
    }

    /// Connection `k` follows process `proc_idx`'s log from now on.
    pub(super) fn follow(&mut self, k: usize, proc_idx: usize) {
        self.conns[k].follow = Some(proc_idx);
    }

    /// A reply owed later.
    pub(super) fn owe(&mut self, p: Pending) {
        self.pending.push(p);
    }

    pub(super) fn owes_replies(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The earliest connection deadline.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.conns.iter().filter_map(|c| c.deadline).min()
    }

    /// Sends what connection `k` has queued, as far as it goes without
    /// blocking.
    pub(super) fn flush(&mut self, k: usize) {
        flush(&mut self.conns[k]);
    }

    /// Reads once from connection `k`, at most `budget` bytes (which it
    /// lowers), into its bounded request buffer.
    pub(super) fn read_some(&mut self, k: usize, budget: &mut usize) -> ReadStep {
        let mut scratch = [0u8; 16 * 1024];
        let c = &mut self.conns[k];
        if c.dead {
            return ReadStep::Stop;
        }
        let ignored = c.closing || c.follow.is_some();
        let room = if ignored {
            scratch.len()
        } else {
            c.input.room()
        };
        if room == 0 {
            // Full of requests sent ahead of replies still owed.
            let r = Reply::error(format!(
                "more than {} KiB of requests sent ahead of their replies; connection closed",
                control::MAX_REQUEST_LINE / 1024
            ));
            c.close_with(&r, Instant::now());
            return ReadStep::Stop;
        }
        let want = room.min(scratch.len()).min(*budget);
        match c.stream.read(&mut scratch[..want]) {
            Ok(0) => {
                c.dead = true;
                ReadStep::Stop
            }
            Ok(n) => {
                *budget -= n;
                if ignored {
                    ReadStep::Again
                } else {
                    c.input.push(&scratch[..n]);
                    ReadStep::Pushed
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => ReadStep::Stop,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => ReadStep::Again,
            Err(_) => {
                c.dead = true;
                ReadStep::Stop
            }
        }
    }

    /// Takes the next complete request of connection `k` when it is ready
    /// for one; answers at once a line that is too long or not a request.
    pub(super) fn next_request(&mut self, k: usize, now: Instant) -> Turn {
        let c = &mut self.conns[k];
        if !c.ready() {
            return Turn::Wait;
        }
        let line = match c.input.next_line() {
            NextLine::Incomplete => return Turn::Wait,
            NextLine::TooLong => {
                let r = Reply::error(format!(
                    "request line longer than {} KiB",
                    control::MAX_REQUEST_LINE / 1024
                ));
                c.answered(&r, now, 0);
                flush(c);
                return Turn::Handled;
            }
            NextLine::Line(line) => line,
        };
        let text = String::from_utf8_lossy(&line).trim().to_string();
        if text.is_empty() {
            return Turn::Handled;
        }
        match serde_json::from_str::<Request>(&text) {
            Ok(req) => Turn::Request(req),
            Err(e) => {
                let r = Reply::error(format!("bad request `{}`: {e}", truncate(&text, 200)));
                self.reply(k, Some(r), now);
                Turn::Handled
            }
        }
    }

    /// Answers connection `k`'s request with `reply`, or marks it awaiting
    /// a reply (`None`, see [`Pending`]).
    pub(super) fn reply(&mut self, k: usize, reply: Option<Reply>, now: Instant) {
        let unsent = self.unsent_except(Some(k));
        let c = &mut self.conns[k];
        match reply {
            Some(r) => c.answered(&r, now, unsent),
            None => {
                c.awaiting = true;
                c.deadline = None;
            }
        }
        if c.follow.is_some() {
            c.input.discard();
            c.deadline = None;
        }
        flush(c);
    }

    /// Sends the replies owed whose answer is known now.
    pub(super) fn answer_pending(&mut self, table: &Table) {
        let mut done = Vec::new();
        for (k, p) in self.pending.iter().enumerate() {
            let (conn, reply) = match p {
                Pending::Stopped { conn, proc_idx } => {
                    let pr = table.proc(*proc_idx);
                    if pr.pid().is_some() {
                        continue;
                    }
                    (
                        *conn,
                        Reply::message(format!(
                            "`{}` {}",
                            pr.name(),
                            pr.reason().unwrap_or(pr.state().name())
                        )),
                    )
                }
                Pending::Restarted {
                    conn,
                    proc_idx,
                    old_pid,
                } => {
                    let pr = table.proc(*proc_idx);
                    let new_pid = pr.pid();
                    match pr.state() {
                        PState::Running if new_pid != *old_pid => (
                            *conn,
                            Reply::message(format!(
                                "restarted `{}`, pid {}",
                                pr.name(),
                                new_pid.unwrap_or(0)
                            )),
                        ),
                        PState::Failed | PState::Refused | PState::Stopped => (
                            *conn,
                            Reply::error(format!(
                                "`{}` is {}: {}",
                                pr.name(),
                                pr.state().name(),
                                pr.reason().unwrap_or_default()
                            )),
                        ),
                        _ => continue,
                    }
                }
                Pending::All { conn } => {
                    if !table.all_down() {
                        continue;
                    }
                    (
                        *conn,
                        Reply::message("all processes stopped; the supervisor exits"),
                    )
                }
            };
            if let Some(k) = self
                .conns
                .iter()
                .position(|c| c.id == conn && c.awaiting && !c.dead)
            {
                let unsent = self.unsent_except(Some(k));
                let c = &mut self.conns[k];
                c.answered(&reply, Instant::now(), unsent);
                flush(c);
            }
            done.push(k);
        }
        for k in done.into_iter().rev() {
            self.pending.remove(k);
        }
    }

    /// Takes up to `ACCEPT_BATCH` new connections. A peer that may not
    /// connect, or that finds every connection waiting for a reply, is
    /// answered at once and dropped without taking a place.
    pub(super) fn accept(&mut self) {
        let now = Instant::now();
        for _ in 0..ACCEPT_BATCH {
            let Some(l) = &self.listener else { return };
            let Ok((stream, _)) = l.accept() else { return };
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            let mut conn = Conn::new(self.next_id, stream, now);
            self.next_id += 1;
            if let Err(why) = self.access.check(&conn.stream) {
                conn.close_with(&Reply::error(why.to_string()), now);
                continue;
            }
            let open = self.conns.iter().filter(|c| !c.dead).count();
            if open >= control::MAX_CONNECTIONS && !self.make_room(now) {
                conn.close_with(
                    &Reply::busy(format!(
                        "busy: all {} control connections are waiting for replies or following logs; try again",
                        control::MAX_CONNECTIONS
                    )),
                    now,
                );
                continue;
            }
            self.conns.push(conn);
        }
    }

    /// Closes the connection idle longest (see [`control::make_room`]);
    /// false when every one waits for a reply or follows logs.
    fn make_room(&mut self, now: Instant) -> bool {
        let open: Vec<usize> = (0..self.conns.len())
            .filter(|&k| !self.conns[k].dead)
            .collect();
        let slots = open.iter().map(|&k| {
            let c = &self.conns[k];
            control::Slot {
                busy: c.awaiting || c.follow.is_some(),
                closing: c.closing,
                since: c.since,
            }
        });
        let Some(victim) = control::make_room(slots) else {
            return false;
        };
        let c = &mut self.conns[open[victim]];
        if !c.closing && c.outbuf.is_empty() {
            let idle = now.saturating_duration_since(c.since);
            c.close_with(
                &Reply::busy(format!(
                    "busy: {} control connections are open; closed to make room after {:.1}s without a request",
                    control::MAX_CONNECTIONS,
                    idle.as_secs_f64()
                )),
                now,
            );
        }
        c.dead = true;
        true
    }

    /// Drops connections past their deadline; one that is idle is told why.
    pub(super) fn expire(&mut self, now: Instant) {
        for c in &mut self.conns {
            if c.dead || c.deadline.is_none_or(|d| now < d) {
                continue;
            }
            if c.ready() {
                c.close_with(
                    &Reply::error(format!(
                        "no complete request within {}s; connection closed",
                        control::IDLE_TIMEOUT.as_secs()
                    )),
                    now,
                );
            }
            c.dead = true;
        }
    }

    /// Forgets the connections found dead this turn.
    pub(super) fn remove_dead(&mut self) {
        self.conns.retain(|c| !c.dead);
    }

    /// At the end: sends what is queued and removes the socket.
    pub(super) fn close(&mut self) {
        for c in &mut self.conns {
            flush(c);
        }
        let _ = std::fs::remove_file(&self.socket_path);
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.len() <= n {
        return s.to_string();
    }
    let mut end = n;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

/// `r` as one line of JSON.
fn reply_line(r: &Reply) -> Vec<u8> {
    let mut line = serde_json::to_vec(r)
        .unwrap_or_else(|_| b"{\"ok\":false,\"error\":\"unserializable reply\"}".to_vec());
    line.push(b'\n');
    line
}

/// Queues the reply `r` on `c`, whose peers hold `unsent` bytes they have
/// not sent: a reply longer than [`control::MAX_REPLY_LINE`] is replaced by
/// an error saying so, and one that would take what every client holds
/// past [`control::MAX_UNSENT`] by a `busy` line. So a client that asks
/// and does not read costs at most one reply, and all of them together a
/// bounded total.
fn queue(c: &mut Conn, r: &Reply, unsent: usize) {
    let mut line = reply_line(r);
    if line.len() > control::MAX_REPLY_LINE {
        line = reply_line(&Reply::too_long(line.len()));
    }
    if unsent + c.outbuf.len() + line.len() > control::MAX_UNSENT {
        line = reply_line(&Reply::busy(format!(
            "busy: {} KiB of replies wait for clients that do not read them; try again",
            unsent >> 10
        )));
    }
    c.outbuf.extend_from_slice(&line);
}

fn flush(c: &mut Conn) {
    while !c.outbuf.is_empty() {
        match c.stream.write(&c.outbuf) {
            Ok(0) => {
                c.dead = true;
                return;
            }
            Ok(n) => {
                c.outbuf.drain(..n);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => {
                c.dead = true;
                return;
            }
        }
    }
    if c.closing {
        // The last reply is out: drop the connection. The client reads the
        // reply before the hang-up, even when it was still writing (its
        // write fails, see `Client::raw`).
        c.dead = true;
    }
}
