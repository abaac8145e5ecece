//! The role processes of one run: spawned from this binary, watched
//! through their stdout, bounded in time, killed when anything goes wrong.
//!
//! Nothing here waits without a deadline: a side that dies is reported
//! at once with its exit status and the end of its stderr (the other
//! sides are killed), and a side that misses a deadline is killed and
//! reported. Every role also dies with the parent (`PR_SET_PDEATHSIG`).

use std::collections::VecDeque;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};

use crate::role::{self, Line, RoleResult, RoleSpec};

/// Bytes of a role's stderr kept for a report.
const STDERR_TAIL: usize = 4096;

enum Event {
    Line(Line),
    /// stdout closed: the process is exiting or gone.
    Closed,
    Bad(String),
}

struct Proc {
    label: String,
    child: Child,
    stdin: Option<ChildStdin>,
    stderr: Arc<Mutex<Vec<u8>>>,
    readers: Vec<JoinHandle<()>>,
    /// Events received but not yet asked for.
    pending: VecDeque<Event>,
    /// Its results arrived (asked for or not).
    done: bool,
    exited: bool,
}

/// The processes of one run.
pub struct Group {
    /// What the run is, for messages: `ping-pong ours 1 KiB round 3`.
    run: String,
    procs: Vec<Proc>,
    tx: Sender<(usize, Event)>,
    rx: Receiver<(usize, Event)>,
}

impl Group {
    pub fn new(run: String) -> Group {
        let (tx, rx) = mpsc::channel();
        Group {
            run,
            procs: Vec::new(),
            tx,
            rx,
        }
    }

    /// Starts `spec` as a role process named `label` (`pong side`).
    pub fn spawn(&mut self, label: &str, spec: &RoleSpec) -> Result<usize> {
        let exe = std::env::current_exe().context("finding this program")?;
        let arg = serde_json::to_string(spec).context("encoding the role")?;
        let mut child = Command::new(&exe)
            .arg("role")
            .arg(arg)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("{}: starting the {label} ({})", self.run, exe.display()))?;
        let idx = self.procs.len();
        let stdout = child.stdout.take().expect("piped");
        let mut stderr = child.stderr.take().expect("piped");
        let tail = Arc::new(Mutex::new(Vec::new()));
        let tx = self.tx.clone();
        let out = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                match role::parse(&line) {
                    Some(Ok(l)) => {
                        let _ = tx.send((idx, Event::Line(l)));
                    }
                    Some(Err(e)) => {
                        let _ = tx.send((idx, Event::Bad(format!("{e:#}"))));
                    }
                    None => {}
                }
            }
            let _ = tx.send((idx, Event::Closed));
        });
        let keep = tail.clone();
        let err = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let mut t = keep.lock().expect("stderr tail lock");
                t.extend_from_slice(&buf[..n]);
                let over = t.len().saturating_sub(STDERR_TAIL);
                t.drain(..over);
            }
        });
        self.procs.push(Proc {
            label: label.into(),
            stdin: child.stdin.take(),
            child,
            stderr: tail,
            readers: vec![out, err],
            pending: VecDeque::new(),
            done: false,
            exited: false,
        });
        Ok(idx)
    }

    /// The next event of process `idx` within `deadline`. Any other
    /// process that closes its stdout before it reported its results
    /// fails the wait at once.
    fn next_event(&mut self, idx: usize, what: &str, deadline: Instant) -> Result<Event> {
        loop {
            if let Some(e) = self.procs[idx].pending.pop_front() {
                return Ok(e);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok((i, Event::Closed)) if i != idx && !self.procs[i].done => {
                    return Err(self.died(i, "before reporting its results"));
                }
                Ok((i, e)) => {
                    if matches!(e, Event::Line(Line::Done(_))) {
                        self.procs[i].done = true;
                    }
                    if i == idx {
                        return Ok(e);
                    }
                    self.procs[i].pending.push_back(e);
                }
                Err(RecvTimeoutError::Timeout) => {
                    let p = &self.procs[idx];
                    let pid = p.child.id();
                    let label = p.label.clone();
                    let waited = what.to_string();
                    self.kill_all();
                    bail!(
                        "{}: the {label} (pid {pid}) did not {waited} in time; all sides killed{}",
                        self.run,
                        self.stderr_of(idx)
                    );
                }
                Err(RecvTimeoutError::Disconnected) => unreachable!("the group holds a sender"),
            }
        }
    }

    /// Waits for `idx`'s ready line; returns what it runs with.
    pub fn ready(&mut self, idx: usize, within: Duration) -> Result<String> {
        let deadline = Instant::now() + within;
        match self.next_event(idx, "get ready", deadline)? {
            Event::Line(Line::Ready { sched }) => Ok(sched),
            Event::Line(Line::Done(_)) => Err(self.fail(idx, "reported results before ready")),
            Event::Bad(e) => Err(self.fail(idx, &e)),
            Event::Closed => Err(self.died(idx, "before it was ready")),
        }
    }

    /// Waits for `idx`'s results.
    pub fn done(&mut self, idx: usize, within: Duration) -> Result<RoleResult> {
        let deadline = Instant::now() + within;
        match self.next_event(idx, "finish", deadline)? {
            Event::Line(Line::Done(r)) => Ok(r),
            Event::Line(Line::Ready { .. }) => Err(self.fail(idx, "said ready twice")),
            Event::Bad(e) => Err(self.fail(idx, &e)),
            Event::Closed => Err(self.died(idx, "before reporting its results")),
        }
    }

    /// Closes `idx`'s stdin (what ends an idle subscriber).
    pub fn close_stdin(&mut self, idx: usize) {
        if let Some(mut s) = self.procs[idx].stdin.take() {
            let _ = s.flush();
        }
    }

    /// Waits for every process to exit with status 0.
    pub fn finish(mut self, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        for i in 0..self.procs.len() {
            self.close_stdin(i);
        }
        for i in 0..self.procs.len() {
            loop {
                match self.procs[i].child.try_wait() {
                    Ok(Some(status)) => {
                        self.procs[i].exited = true;
                        if !status.success() {
                            let e = self.fail(i, &format!("exited with {status}"));
                            return Err(e);
                        }
                        break;
                    }
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(2))
                    }
                    Ok(None) => {
                        let e = self.fail(i, "did not exit after reporting its results");
                        return Err(e);
                    }
                    Err(e) => {
                        let e = self.fail(i, &format!("cannot be waited for: {e}"));
                        return Err(e);
                    }
                }
            }
        }
        for p in &mut self.procs {
            for r in p.readers.drain(..) {
                let _ = r.join();
            }
        }
        Ok(())
    }

    fn stderr_of(&self, idx: usize) -> String {
        let t = self.procs[idx].stderr.lock().expect("stderr tail lock");
        let text = String::from_utf8_lossy(&t);
        let text = text.trim();
        if text.is_empty() {
            String::new()
        } else {
            format!("; its stderr ends:\n{text}")
        }
    }

    /// Kills everything and describes `idx`'s failure.
    fn fail(&mut self, idx: usize, what: &str) -> anyhow::Error {
        self.kill_all();
        let p = &self.procs[idx];
        anyhow::anyhow!(
            "{}: the {} (pid {}) {what}; all sides killed{}",
            self.run,
            p.label,
            p.child.id(),
            self.stderr_of(idx)
        )
    }

    /// Kills everything and describes how `idx` ended.
    fn died(&mut self, idx: usize, when: &str) -> anyhow::Error {
        // Its stdout closed: it is exiting; give it a moment to be reaped.
        let mut status = None;
        for _ in 0..100 {
            if let Ok(Some(s)) = self.procs[idx].child.try_wait() {
                self.procs[idx].exited = true;
                status = Some(s);
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        // The stderr reader may still be copying the last words.
        std::thread::sleep(Duration::from_millis(20));
        let how = match status {
            Some(s) => format!("exited with {s} {when}"),
            None => format!("closed its output {when}"),
        };
        self.fail(idx, &how)
    }

    fn kill_all(&mut self) {
        for p in &mut self.procs {
            if !p.exited {
                // Our own child, by its handle: SIGKILL, then reap it.
                let _ = p.child.kill();
                let _ = p.child.wait();
                p.exited = true;
            }
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.kill_all();
    }
}
