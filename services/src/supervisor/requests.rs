//! What each control request does: the protocol is
//! [`crate::control`]; the connections are [`super::conns`]; a request
//! acts on the process table and the release trial, so it is served here,
//! where the loop holds all three.

use std::time::Instant;

use super::conns::{Pending, ReadStep, Turn, READ_BUDGET};
use super::table::{AfterStop, PState};
use super::Supervisor;
use crate::control::{self, Reply, Request};
use crate::logfile;

impl Supervisor {
    /// Reads what connection `k` sent, at most `READ_BUDGET` bytes, into
    /// its bounded request buffer, and answers what is complete.
    pub(super) fn read_conn(&mut self, k: usize) {
        let mut budget = READ_BUDGET;
        while budget > 0 {
            match self.conns.read_some(k, &mut budget) {
                ReadStep::Stop => return,
                ReadStep::Again => continue,
                ReadStep::Pushed => self.serve(k),
            }
        }
    }

    /// Answers the complete requests of connection `k`, one at a time: the
    /// next waits until the reply to the previous one is out.
    pub(super) fn serve(&mut self, k: usize) {
        loop {
            let now = Instant::now();
            match self.conns.next_request(k, now) {
                Turn::Wait => break,
                Turn::Handled => continue,
                Turn::Request(req) => {
                    let reply = self.handle(k, req);
                    self.conns.reply(k, reply, now);
                }
            }
        }
    }

    /// Handles one request of connection `conn`; `None` when the reply
    /// comes later.
    fn handle(&mut self, conn: usize, req: Request) -> Option<Reply> {
        let find = |s: &Self, name: &str| {
            s.table.index(name).ok_or_else(|| {
                format!(
                    "no process `{name}` (known: {})",
                    s.table
                        .procs()
                        .iter()
                        .map(|p| p.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })
        };
        match req {
            Request::Status => Some(Reply {
                ok: true,
                status: Some(self.status()),
                ..Default::default()
            }),
            Request::Start { name } => {
                let i = match find(self, &name) {
                    Ok(i) => i,
                    Err(e) => return Some(Reply::error(e)),
                };
                if self.table.shutting_down() {
                    return Some(Reply::error("the supervisor is shutting down"));
                }
                match self.table.proc(i).state() {
                    s @ (PState::Running | PState::Stopping) => {
                        Some(Reply::error(format!("`{name}` is already {}", s.name())))
                    }
                    _ => {
                        self.table.wait_to_start(i);
                        self.tick(Instant::now());
                        let p = self.table.proc(i);
                        match p.state() {
                            PState::Running => Some(Reply::message(format!(
                                "started `{name}`, pid {}",
                                p.pid().unwrap_or(0)
                            ))),
                            s => Some(Reply::error(format!(
                                "`{name}` is {}: {}",
                                s.name(),
                                p.reason().unwrap_or_default()
                            ))),
                        }
                    }
                }
            }
            Request::Stop { name } => {
                let i = match find(self, &name) {
                    Ok(i) => i,
                    Err(e) => return Some(Reply::error(e)),
                };
                self.table.begin_stop(i, AfterStop::Stay, &mut self.conns);
                self.conns.owe(Pending::Stopped {
                    conn: self.conns.id(conn),
                    proc_idx: i,
                });
                None
            }
            Request::Restart { name } => {
                let i = match find(self, &name) {
                    Ok(i) => i,
                    Err(e) => return Some(Reply::error(e)),
                };
                if self.table.shutting_down() {
                    return Some(Reply::error("the supervisor is shutting down"));
                }
                let old_pid = self.table.proc(i).pid();
                self.table
                    .begin_stop(i, AfterStop::Restart, &mut self.conns);
                self.conns.owe(Pending::Restarted {
                    conn: self.conns.id(conn),
                    proc_idx: i,
                    old_pid,
                });
                None
            }
            Request::StopAll => {
                self.begin_shutdown("stop-all requested on the control socket");
                self.conns.owe(Pending::All {
                    conn: self.conns.id(conn),
                });
                None
            }
            Request::ReleaseChanged => {
                if self.table.shutting_down() {
                    return Some(Reply::error("the supervisor is shutting down"));
                }
                let now = Instant::now();
                self.releases.check(now, &mut self.table, &mut self.conns);
                self.releases.judge(now, &mut self.table, &mut self.conns);
                Some(Reply::message(format!(
                    "release: {}",
                    self.releases.status().describe()
                )))
            }
            Request::Logs {
                name,
                lines,
                follow,
            } => {
                let i = match find(self, &name) {
                    Ok(i) => i,
                    Err(e) => return Some(Reply::error(e)),
                };
                let mut tail = match logfile::tail(self.table.proc(i).log_path(), lines) {
                    Ok(t) => t,
                    Err(e) => return Some(Reply::error(e.to_string())),
                };
                // The newest lines that fit in a bounded reply (a log of
                // control bytes is six times longer as JSON).
                let cut = control::fit_lines(&mut tail, control::MAX_LOGS_REPLY - 256);
                if follow {
                    let following = self.conns.followers();
                    if following >= control::MAX_FOLLOWERS {
                        return Some(Reply::busy(format!(
                            "busy: {following} clients already follow logs"
                        )));
                    }
                    self.conns.follow(conn, i);
                }
                Some(Reply {
                    ok: true,
                    message: (cut > 0).then(|| {
                        format!(
                            "{cut} older line(s) left out: a reply carries at most {} KiB",
                            control::MAX_LOGS_REPLY >> 10
                        )
                    }),
                    lines: Some(tail),
                    ..Default::default()
                })
            }
        }
    }
}
