//! The control socket under load: idle connections and endless request
//! lines cannot lock out `status`, `stop` and `restart`, nor grow the
//! supervisor; a client the supervisor has no room for is told it is busy.
//!
//! The supervisor runs in a child process (this test binary run again as
//! `supervisor_helper`), so that its peak memory is its own and a watchdog
//! can kill it should it stop answering.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{config, process, roots};
use serde_json::json;
use services::control::{self, ControlRequestError, Reply, Request, MAX_CONNECTIONS};
use services::supervisor::{Options, Supervisor};

/// Run by the tests below in a child process: a supervisor for the
/// processes in `RTDEPLOY_TEST_PROCESSES` under `RTDEPLOY_TEST_PREFIX`.
/// On its own (`--include-ignored`) it does nothing.
#[test]
#[ignore = "helper process: run by the tests of control_limits"]
fn supervisor_helper() {
    let (Ok(prefix), Ok(procs)) = (
        std::env::var(units::env::TEST_PREFIX),
        std::env::var(units::env::TEST_PROCESSES),
    ) else {
        return;
    };
    let procs: Vec<serde_json::Value> = serde_json::from_str(&procs).unwrap();
    let cfg = config(procs.into_iter().map(process).collect(), None);
    let opts = Options {
        handle_signals: false,
        verbose: false,
        log_max_bytes: 1 << 20,
        ..Default::default()
    };
    let sup = Supervisor::new(cfg, roots(Path::new(&prefix)), opts, None, None)
        .expect("supervisor starts");
    sup.run().expect("supervisor runs");
}

/// A supervisor in a child process, killed when dropped.
struct Child {
    child: std::process::Child,
    socket: PathBuf,
    _prefix: tempfile::TempDir,
}

impl Child {
    fn start(processes: serde_json::Value) -> Child {
        let prefix = common::prefix();
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "supervisor_helper",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(units::env::TEST_PREFIX, prefix.path())
            .env(units::env::TEST_PROCESSES, processes.to_string())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let socket = control::socket_path(prefix.path());
        let mut c = Child {
            child,
            socket,
            _prefix: prefix,
        };
        // Answering once start-up is done.
        let until = Instant::now() + Duration::from_secs(30);
        while !matches!(control::request(&c.socket, &Request::Status), Ok(r) if r.ok) {
            if let Some(st) = c.child.try_wait().unwrap() {
                panic!("the supervisor exited during start-up: {st}");
            }
            assert!(
                Instant::now() < until,
                "the supervisor did not answer within 30 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        c
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Waits (at most 10 s) until process `name` runs the program `comm`.
    fn wait_for_exec(&self, name: &str, comm: &str) {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let r = control::request(&self.socket, &Request::Status).expect("status answered");
            let pid = r
                .status
                .and_then(|s| s.processes.into_iter().find(|p| p.name == name))
                .and_then(|p| p.pid);
            let running = pid
                .and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).ok())
                .is_some_and(|c| c.trim_end() == comm);
            if running {
                return;
            }
            assert!(
                Instant::now() < until,
                "{name} did not run {comm} within 10 s"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Peak resident memory so far (VmHWM), in bytes.
    fn peak_rss(&self) -> u64 {
        let st = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let kb: u64 = st
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmHWM in /proc/PID/status");
        kb * 1024
    }

    /// stop-all, then waits for the supervisor to exit.
    fn stop_all(mut self) {
        let r = control::request(&self.socket, &Request::StopAll).expect("stop-all answered");
        assert!(r.ok, "{r:?}");
        let st = self.child.wait().unwrap();
        assert!(st.success(), "supervisor exited with {st}");
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Kills the supervisor and fails the test if it is not done within
/// `limit`: a supervisor that stops answering shows as a failure, not a
/// hang (the killed supervisor's sockets close, which ends every wait).
struct Watchdog {
    done: Arc<AtomicBool>,
    fired: Arc<AtomicBool>,
}

impl Watchdog {
    fn arm(pid: i32, limit: Duration) -> Watchdog {
        let done = Arc::new(AtomicBool::new(false));
        let fired = Arc::new(AtomicBool::new(false));
        let (d, f) = (done.clone(), fired.clone());
        std::thread::spawn(move || {
            let until = Instant::now() + limit;
            while !d.load(Ordering::SeqCst) {
                if Instant::now() > until {
                    f.store(true, Ordering::SeqCst);
                    eprintln!("watchdog: the test ran over {limit:?}; killing the supervisor");
                    if let Some(p) = rustix::process::Pid::from_raw(pid) {
                        let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
                    }
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Watchdog { done, fired }
    }

    fn check(&self) {
        assert!(
            !self.fired.load(Ordering::SeqCst),
            "watchdog fired: the supervisor stopped answering"
        );
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::SeqCst);
    }
}

fn sleeper() -> serde_json::Value {
    json!({"name": "p", "exec": "/bin/sleep", "args": ["600"]})
}

/// A client socket whose reads and writes give up after 30 s.
fn connect(socket: &Path) -> UnixStream {
    let s = UnixStream::connect(socket).expect("connect to the control socket");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
    s
}

/// The reply line the supervisor sent on `s`, then its hang-up (seen as a
/// reset when the supervisor left bytes of the client unread).
fn last_words(s: UnixStream) -> Reply {
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).expect("a reply line");
    let reply: Reply = serde_json::from_str(&line).unwrap_or_else(|e| panic!("`{line}`: {e}"));
    let mut rest = Vec::new();
    match r.read_to_end(&mut rest) {
        Ok(_) => assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest)),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
    reply
}

fn status_ok(socket: &Path) {
    let r = control::request(socket, &Request::Status).expect("status answered");
    assert!(r.ok && r.status.is_some(), "{r:?}");
}

#[test]
fn idle_connections_cannot_lock_out_status() {
    let sup = Child::start(json!([sleeper()]));
    let dog = Watchdog::arm(sup.pid(), Duration::from_secs(60));

    // More idle connections than the supervisor keeps (256 locked
    // everyone out before the limits).
    let idle: Vec<UnixStream> = (0..300).map(|_| connect(&sup.socket)).collect();

    // status is answered at once: the oldest idle connection made room.
    status_ok(&sup.socket);
    dog.check();

    // The first ones were closed to make room, and told so.
    let mut idle = idle.into_iter();
    let first = last_words(idle.next().unwrap());
    assert!(!first.ok && first.busy, "{first:?}");
    let why = first.error.unwrap();
    assert!(
        why.starts_with(&format!(
            "busy: {MAX_CONNECTIONS} control connections are open; closed to make room after "
        )) && why.ends_with("s without a request"),
        "{why}"
    );

    // A client that trickles a request it never finishes is closed once
    // its time is up, however many bytes it sent.
    let mut slow = connect(&sup.socket);
    let trickle = std::thread::spawn(move || {
        for b in br#"{"cmd":"#.iter().cycle() {
            if slow.write_all(&[*b]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        slow
    });
    let slow = trickle.join().unwrap();
    let r = last_words(slow);
    assert_eq!(
        r.error.as_deref(),
        Some("no complete request within 5s; connection closed"),
        "{r:?}"
    );
    // So is the last idle one.
    let r = last_words(idle.next_back().unwrap());
    assert_eq!(
        r.error.as_deref(),
        Some("no complete request within 5s; connection closed"),
        "{r:?}"
    );
    dog.check();
    status_ok(&sup.socket);
    drop(dog);
    sup.stop_all();
}

#[test]
fn a_client_beyond_the_limit_is_told_the_supervisor_is_busy() {
    // Ignores SIGTERM: a stop stays pending until the (long) stop timeout.
    let stubborn = json!({
        "name": "stubborn", "exec": "/bin/sh", "args": ["-c", "trap '' TERM; exec sleep 600"],
        "stop_timeout": "10m",
    });
    let sup = Child::start(json!([stubborn]));
    let dog = Watchdog::arm(sup.pid(), Duration::from_secs(60));
    // The shell ignores SIGTERM only once it has run `trap`: wait for the
    // exec that follows it, or an early stop would simply kill it.
    sup.wait_for_exec("stubborn", "sleep");
    let stop = br#"{"cmd":"stop","name":"stubborn"}
"#;
    // Every connection but one waits for its stop to finish.
    let mut waiting: Vec<UnixStream> = (0..MAX_CONNECTIONS - 1)
        .map(|_| {
            let mut s = connect(&sup.socket);
            s.write_all(stop).unwrap();
            s
        })
        .collect();
    // The last one: its status answer shows the others were read (they
    // were accepted first), then it waits for a stop as well.
    let mut last = connect(&sup.socket);
    last.write_all(b"{\"cmd\":\"status\"}\n").unwrap();
    let mut line = String::new();
    BufReader::new(&last).read_line(&mut line).unwrap();
    let r: Reply = serde_json::from_str(&line).unwrap();
    let p = &r.status.expect("status").processes[0];
    assert_eq!(p.state, "stopping", "{p:?}");
    last.write_all(stop).unwrap();

    // No connection is idle: the next client is told the supervisor is
    // busy, in so many words, whether its request went out before the
    // supervisor closed the connection or failed because it had.
    let busy = format!(
        "control socket {}: busy: all {MAX_CONNECTIONS} control connections are waiting for replies or following logs; try again",
        sup.socket.display()
    );
    for attempt in 0..20 {
        let mut c = control::Client::connect(&sup.socket).unwrap();
        if attempt % 2 == 1 {
            // Most likely refused before the request is written.
            std::thread::sleep(Duration::from_millis(100));
        }
        match c.request(&Request::Restart {
            name: "stubborn".into(),
        }) {
            Err(e @ ControlRequestError::Busy { .. }) => assert_eq!(e.to_string(), busy),
            other => panic!("attempt {attempt}: expected busy, got {other:?}"),
        }
    }
    dog.check();

    // Once a waiting client gives up, its place is free again.
    drop(waiting.pop());
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        match control::request(&sup.socket, &Request::Status) {
            Ok(r) => {
                assert!(r.ok, "{r:?}");
                break;
            }
            Err(ControlRequestError::Busy { .. }) if Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("{e}"),
        }
    }
    dog.check();
    // The stubborn process would hold stop-all for its 10 minutes: the
    // supervisor is killed instead (dropping `sup`), its process with it.
}

/// The supervisor's peak resident memory under a flood, at most: about
/// 8 MiB in use plus what 64 connections may hold (their 64 KiB request
/// buffers and one reply each).
const RSS_BOUND: u64 = 64 << 20;

/// 50 clients send `payload` over and over without reading, reconnecting
/// when cut off, until 512 MiB is sent; `status` is answered throughout and
/// the supervisor's peak memory stays under `RSS_BOUND`.
fn flood(payload: &'static [u8]) {
    const CLIENTS: usize = 50;
    const TOTAL: u64 = 512 << 20;

    let sup = Child::start(json!([sleeper()]));
    let dog = Watchdog::arm(sup.pid(), Duration::from_secs(90));
    // Relaxed: plain counters; nothing else is published through them, and
    // the totals are read after the threads are joined.
    let sent = Arc::new(AtomicU64::new(0));
    let cut_off = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (socket, sent, cut_off) = (sup.socket.clone(), sent.clone(), cut_off.clone());
            std::thread::spawn(move || {
                let chunk = payload.repeat(64 * 1024 / payload.len());
                while sent.load(Ordering::Relaxed) < TOTAL {
                    let Ok(mut s) = UnixStream::connect(&socket) else {
                        return;
                    };
                    s.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
                    loop {
                        if s.write_all(&chunk).is_err() {
                            cut_off.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                        if sent.fetch_add(chunk.len() as u64, Ordering::Relaxed) >= TOTAL {
                            return;
                        }
                    }
                }
            })
        })
        .collect();
    // Answered during the flood.
    while sent.load(Ordering::Relaxed) < TOTAL {
        status_ok(&sup.socket);
        dog.check();
        std::thread::sleep(Duration::from_millis(100));
    }
    for t in clients {
        t.join().unwrap();
    }
    dog.check();
    status_ok(&sup.socket);
    let peak = sup.peak_rss();
    eprintln!(
        "supervisor peak RSS {} KiB after {} MiB sent by {CLIENTS} clients ({} connections cut off)",
        peak >> 10,
        sent.load(Ordering::Relaxed) >> 20,
        cut_off.load(Ordering::Relaxed)
    );
    assert!(
        peak < RSS_BOUND,
        "supervisor peak RSS {} MiB, over {} MiB",
        peak >> 20,
        RSS_BOUND >> 20
    );
    drop(dog);
    sup.stop_all();
}

#[test]
fn endless_request_lines_from_fifty_clients_stay_within_bounded_memory() {
    // No newline, ever: the line limit must hold while reading.
    flood(b"x");
}

#[test]
fn requests_sent_ahead_of_their_replies_stay_within_bounded_memory() {
    // Valid requests whose replies are never read: they must not pile up.
    flood(b"{\"cmd\":\"status\"}\n");
}

/// A log of `bytes` control bytes and no newline, then a sleep: the worst
/// log to answer `logs` from (every byte six as JSON, no line to stop at).
fn chatty(bytes: u64) -> serde_json::Value {
    json!({
        "name": "chatty", "exec": "/bin/sh",
        "args": ["-c", format!("head -c {bytes} /dev/zero | tr '\\000' '\\001'; exec sleep 600")],
    })
}

#[test]
fn logs_floods_from_sixty_clients_that_do_not_read_leave_status_and_restarts_working() {
    const CLIENTS: usize = 60;
    const ROUNDS: u64 = 2;
    let victim = json!({
        "name": "victim", "exec": "/bin/sleep", "args": ["600"],
        "restart": {"initial_backoff": "50ms", "max_backoff": "100ms"},
    });
    // Under the helper's 1 MiB log rotation.
    let sup = Child::start(json!([chatty(900 << 10), victim]));
    let dog = Watchdog::arm(sup.pid(), Duration::from_secs(120));
    let log = sup._prefix.path().join("var/log/rtdeploy/chatty.log");
    let until = Instant::now() + Duration::from_secs(20);
    while std::fs::metadata(&log).map_or(0, |m| m.len()) < 900 << 10 {
        assert!(Instant::now() < until, "chatty's log did not fill");
        std::thread::sleep(Duration::from_millis(20));
    }
    let before = sup.peak_rss();

    // One reply, read: bounded, the newest bytes kept, and it says so.
    let mut c = control::Client::connect(&sup.socket).unwrap();
    let r = c
        .raw(r#"{"cmd":"logs","name":"chatty","lines":1000000000}"#)
        .unwrap();
    assert!(r.ok, "{r:?}");
    let json_len = serde_json::to_vec(&r).unwrap().len();
    assert!(
        json_len <= control::MAX_LOGS_REPLY,
        "a logs reply of {json_len} bytes"
    );
    let lines = r.lines.unwrap();
    assert_eq!(lines.len(), 1, "one (cut) line of control bytes");
    assert!(lines[0].len() > 30 << 10, "{} bytes kept", lines[0].len());
    assert!(lines[0].bytes().all(|b| b == 1));

    // Sixty clients ask for every line of it and never read, each
    // reconnecting once the supervisor drops it for not reading.
    // Relaxed: counters read after the threads are joined, or as progress.
    let asked = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (socket, asked, stop) = (sup.socket.clone(), asked.clone(), stop.clone());
            std::thread::spawn(move || {
                for _ in 0..ROUNDS {
                    let Ok(mut s) = UnixStream::connect(&socket) else {
                        return;
                    };
                    let req = b"{\"cmd\":\"logs\",\"name\":\"chatty\",\"lines\":1000000000}\n";
                    if s.write_all(req).is_ok() {
                        asked.fetch_add(1, Ordering::Relaxed);
                    }
                    // Longer than IDLE_TIMEOUT: the supervisor gives up on
                    // this client before it goes on.
                    let until = Instant::now() + control::IDLE_TIMEOUT + Duration::from_secs(1);
                    while Instant::now() < until && !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            })
        })
        .collect();

    // Meanwhile: status answers, and a killed child comes back.
    let mut answered = 0u64;
    while asked.load(Ordering::Relaxed) < CLIENTS as u64 {
        status_ok(&sup.socket);
        answered += 1;
        dog.check();
        std::thread::sleep(Duration::from_millis(20));
    }
    let victim_pid = |r: Reply| {
        let p = r
            .status
            .unwrap()
            .processes
            .into_iter()
            .find(|p| p.name == "victim");
        p.map(|p| (p.pid, p.restarts, p.state))
    };
    let (pid, restarts, _) =
        victim_pid(control::request(&sup.socket, &Request::Status).unwrap()).unwrap();
    let pid = pid.expect("victim runs");
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let r = control::request(&sup.socket, &Request::Status).expect("status answered");
        answered += 1;
        let (p, n, state) = victim_pid(r).unwrap();
        if n == restarts + 1 && state == "running" && p != Some(pid) {
            break;
        }
        assert!(Instant::now() < until, "victim not restarted: {n} {state}");
        dog.check();
        std::thread::sleep(Duration::from_millis(20));
    }
    while asked.load(Ordering::Relaxed) < CLIENTS as u64 * ROUNDS {
        status_ok(&sup.socket);
        answered += 1;
        dog.check();
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    for t in clients {
        t.join().unwrap();
    }
    dog.check();
    status_ok(&sup.socket);
    let peak = sup.peak_rss();
    eprintln!(
        "supervisor peak RSS {} KiB (before the flood {} KiB) after {} unread logs requests; status answered {answered} times",
        peak >> 10,
        before >> 10,
        asked.load(Ordering::Relaxed)
    );
    // The unbounded replies were 6 MiB each here: sixty of them 360 MiB.
    assert!(
        peak < RSS_BOUND,
        "supervisor peak RSS {} MiB, over {} MiB",
        peak >> 20,
        RSS_BOUND >> 20
    );
    drop(dog);
    sup.stop_all();
}
