//! Two robots joined by their bridges (robot.yaml `bridge:`), each a
//! supervisor under its own `--prefix`: robot A's channel `/demo/chatter`
//! goes out, robot B brings it in from A, and B's listener (run by B's
//! supervisor) receives every message a talker publishes on A, in order;
//! B's status shows the link, its counts and A's clock offset. On the
//! loopback as a user, and (as root) in two network namespaces joined by a
//! veth pair. B starts first, so its bridge connects to A's only once A is
//! up: connecting late needs no restart.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{examples, wait_status, DEPLOY};
use services::bridge::BridgeStatus;

fn bridge_exe() -> PathBuf {
    let b = Path::new(DEPLOY).parent().unwrap().join("rtdeploy-bridge");
    assert!(
        b.is_file(),
        "{} is not built (`cargo test --workspace` builds it; alone: cargo build -p bridge)",
        b.display()
    );
    b
}

/// A port nobody listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn prefix(name: &str, yaml: &str) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix(&format!("rtdeploy-{name}-"))
        .tempdir()
        .unwrap();
    std::fs::create_dir_all(dir.path().join("etc/rtdeploy")).unwrap();
    std::fs::write(dir.path().join("etc/rtdeploy/robot.yaml"), yaml).unwrap();
    dir
}

const HEAD: &str = "board:\n  model: generic\n  cpus: 2\ncpus:\n  housekeeping: 0\n  isolated: 1\nboot_check:\n  enabled: false\nchannels:\n  - name: /demo/chatter\n    max_size: 64\n    rate: 2000\n    depth: 4096\nlog:\n  types:\n    /demo/chatter: {name: demo/Chatter, fields: [uint64 seq, uint64 deadline_ns]}\n";

/// Robot A: no process of its own but the bridge (the test runs the
/// talker), `/demo/chatter` out, listening on `listen`.
fn robot_a(listen: &str) -> String {
    format!(
        "robot:\n  name: robot-a\n{HEAD}processes: []\nbridge:\n  exec: {}\n  mode: peer\n  listen: [{listen}]\n  forward:\n    - {{channels: /demo/chatter, direction: out}}\n",
        bridge_exe().display()
    )
}

/// Robot B: the listener, `/demo/chatter` in from robot A, connecting to
/// `connect`.
fn robot_b(connect: &str, listener: &Path, count: u32) -> String {
    format!(
        "robot:\n  name: robot-b\n{HEAD}processes:\n  - name: listener\n    exec: {}\n    args: [--channel, /demo/chatter, --count, \"{count}\", --every, \"1000\"]\n    restart: {{policy: never}}\n    subscribes: [/demo/chatter]\nbridge:\n  exec: {}\n  mode: peer\n  connect: [{connect}]\n  forward:\n    - {{channels: /demo/chatter, direction: in, from: robot-a, ttl: 5s}}\n",
        listener.display(),
        bridge_exe().display()
    )
}

/// Kills the child (and waits) when the test ends.
struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `deploy supervise` of `prefix`, in network namespace `ns` when given.
fn supervise(prefix: &Path, ns: Option<&str>) -> Kill {
    let mut c = match ns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, DEPLOY]);
            c
        }
        None => Command::new(DEPLOY),
    };
    c.args(["-q", "--prefix"])
        .arg(prefix)
        .args(["supervise", "--skip-cpu-plan"])
        .stdout(Stdio::null());
    Kill(c.spawn().unwrap())
}

fn bridge_status(prefix: &Path, what: &str, f: impl Fn(&BridgeStatus) -> bool) -> BridgeStatus {
    wait_status(prefix, what, |s| s.bridge.as_ref().is_some_and(&f))
        .bridge
        .unwrap()
}

fn logs(prefix: &Path, process: &str) -> String {
    let o = Command::new(DEPLOY)
        .arg("--prefix")
        .arg(prefix)
        .args(["logs", process])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

const COUNT: u32 = 2000;

/// The two robots, running (their supervisors stop when this drops).
struct Robots {
    a: tempfile::TempDir,
    b: tempfile::TempDir,
    _sb: Kill,
    _sa: Kill,
    talker: PathBuf,
    ns: Option<(String, String)>,
}

impl Robots {
    /// The talker on A, as A's processes are run (its channel directory,
    /// its network namespace), `count` messages.
    fn talk(&self, count: u32) {
        let shm = self.a.path().join("dev/shm/rtdeploy");
        let mut t = match &self.ns {
            Some((ns_a, _)) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns_a]).arg(&self.talker);
                c
            }
            None => Command::new(&self.talker),
        };
        t.args([
            "--channel",
            "/demo/chatter",
            "--period-us",
            "500",
            "--count",
            &count.to_string(),
            "--every",
            "1000",
        ])
        .env("RTDEPLOY_SHM_DIR", &shm)
        .env("RTDEPLOY_PROCESS", "talker")
        .stdout(Stdio::null());
        let st = t.status().unwrap();
        assert!(st.success(), "talker: {st}");
    }
}

/// The scenario, with A listening on `a_addr` (B connecting there) and
/// each supervisor in its namespace when given.
fn two_robots(a_addr: &str, ns: Option<(&str, &str)>) -> Robots {
    let (talker, listener) = examples().unwrap_or_else(|why| panic!("{why}"));
    let a = prefix("robot-a", &robot_a(a_addr));
    let b = prefix("robot-b", &robot_b(a_addr, &listener, COUNT));
    // B first: its bridge retries until A listens.
    let _sb = supervise(b.path(), ns.map(|n| n.1));
    bridge_status(b.path(), "B's bridge up", |s| s.links.len() == 1);
    std::thread::sleep(Duration::from_millis(500));
    let _sa = supervise(a.path(), ns.map(|n| n.0));
    let sa = bridge_status(a.path(), "A's bridge meeting B's", |s| !s.peers.is_empty());
    let sb = bridge_status(b.path(), "B's bridge meeting A's, and A's clock", |s| {
        !s.peers.is_empty() && !s.clocks.is_empty()
    });
    assert!(sb.peers.contains(&sa.session), "{sb:#?} {sa:#?}");
    // Declarations travel with the connection; a margin before the first
    // message.
    std::thread::sleep(Duration::from_secs(1));
    let robots = Robots {
        a,
        b,
        _sb,
        _sa,
        talker,
        ns: ns.map(|(x, y)| (x.to_string(), y.to_string())),
    };
    robots.talk(COUNT);
    let (a, b) = (&robots.a, &robots.b);
    // Every sequence number, in order, none lost: the listener's own
    // count and its last.
    let until = Instant::now() + Duration::from_secs(60);
    let log = loop {
        let log = logs(b.path(), "listener");
        if log.contains("the loop ended") {
            break log;
        }
        assert!(
            Instant::now() < until,
            "B's listener did not end:\n{log}\nB: {}",
            logs(b.path(), "rtdeploy-bridge")
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        log.contains(&format!(
            "the loop ended after {COUNT} messages on /demo/chatter (last seq {}, lost 0)",
            COUNT - 1
        )),
        "{log}"
    );
    let sa = bridge_status(a.path(), "A's count", |s| s.links[0].sent >= COUNT as u64);
    let sb = bridge_status(b.path(), "B's count", |s| {
        s.links[0].received >= COUNT as u64
    });
    let (la, lb) = (&sa.links[0], &sb.links[0]);
    assert_eq!(
        (la.direction.as_str(), la.key.as_str()),
        ("out", "rtdeploy/robot-a/demo/chatter")
    );
    assert_eq!(
        (lb.direction.as_str(), lb.key.as_str()),
        ("in", "rtdeploy/robot-a/demo/chatter")
    );
    assert_eq!(
        (la.sent, la.lost, la.dropped.total()),
        (COUNT as u64, 0, 0),
        "{sa:#?}"
    );
    assert_eq!(
        (lb.received, lb.lost, lb.dropped.total()),
        (COUNT as u64, 0, 0),
        "{sb:#?}"
    );
    // A's clock: the same clock here, so the estimate is 0 within half
    // the round trip it came from (by construction, whatever the load).
    let c = &sb.clocks[0];
    assert_eq!(c.robot, "robot-a");
    assert!(c.samples >= 1 && c.rtt_ns > 0, "{c:?}");
    assert!(
        c.offset_ns.unsigned_abs() <= c.rtt_ns / 2 + 1,
        "offset {} beyond half the round trip {}",
        c.offset_ns,
        c.rtt_ns
    );
    // What `deploy status` says of it.
    let text = deploy_status(b.path());
    for part in [
        "bridge: session ",
        "(peer), 1 peer(s)",
        &format!("in  /demo/chatter <- rtdeploy/robot-a/demo/chatter: {COUNT} received"),
        "clock of robot-a: ",
    ] {
        assert!(text.contains(part), "{part:?} not in:\n{text}");
    }
    // Each message that came in kept its remote queue index, send time
    // and boot id, published beside the channel with its local index.
    let ch = controller::Channel::open(
        &b.path().join("dev/shm/rtdeploy"),
        "/rtdeploy/bridge/remote/demo/chatter",
    )
    .unwrap_or_else(|e| panic!("the remote-time channel: {e}"));
    let mut r = ch.reader_at(0);
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let boot: Vec<u8> = (0..16)
        .map(|i| {
            let hex: String = boot.trim().chars().filter(|c| *c != '-').collect();
            u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap()
        })
        .collect();
    // (Its ring keeps the last 1024: the first ones are overwritten.)
    let (mut first, mut n) = (None, 0u64);
    while let Ok(Some(m)) = r.next_message() {
        let u = |at: usize| u64::from_le_bytes(m.data[at..at + 8].try_into().unwrap());
        assert_eq!(m.data.len(), 48);
        let f = *first.get_or_insert(u(0));
        assert_eq!((u(0), u(8)), (f + n, f + n), "local and remote index");
        assert!(u(16) > 0 && u(24) > 0, "send times of {}", f + n);
        assert_eq!(&m.data[32..48], &boot[..]);
        n += 1;
    }
    assert_eq!((first.unwrap() + n, n), (COUNT as u64, 1024));
    robots
}

#[test]
fn a_talker_on_one_robot_drives_a_listener_on_another_over_the_loopback() {
    let port = free_port();
    let _ = two_robots(&format!("tcp/127.0.0.1:{port}"), None);
}

/// Runs `ip` with `args`, failing the test with its output.
fn ip(args: &[&str]) {
    let o = Command::new("ip")
        .args(args)
        .output()
        .expect("ip (iproute2)");
    assert!(
        o.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Two network namespaces and their veth pair, removed on drop.
struct Netns(String, String);

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
        let _ = Command::new("ip").args(["netns", "del", &self.1]).status();
    }
}

#[test]
#[ignore = "needs root: two network namespaces joined by a veth pair"]
fn a_talker_on_one_robot_drives_a_listener_on_another_across_a_veth_pair() {
    let tag = std::process::id() % 100_000;
    let (na, nb) = (format!("rtd-a-{tag}"), format!("rtd-b-{tag}"));
    ip(&["netns", "add", &na]);
    ip(&["netns", "add", &nb]);
    let _ns = Netns(na.clone(), nb.clone());
    let (va, vb) = (format!("rtda{tag}"), format!("rtdb{tag}"));
    ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb]);
    ip(&["link", "set", &va, "netns", &na]);
    ip(&["link", "set", &vb, "netns", &nb]);
    for (ns, dev, addr) in [(&na, &va, "10.201.0.1/24"), (&nb, &vb, "10.201.0.2/24")] {
        ip(&["-n", ns, "addr", "add", addr, "dev", dev]);
        ip(&["-n", ns, "link", "set", dev, "up"]);
        ip(&["-n", ns, "link", "set", "lo", "up"]);
    }
    let r = two_robots("tcp/10.201.0.1:7447", Some((&na, &nb)));
    // The network lost: B's end of the cable down. B's status says that
    // it reaches nobody, and since when; its log says so once.
    ip(&["-n", &nb, "link", "set", &vb, "down"]);
    let lost = bridge_status(r.b.path(), "B noticing that the network is lost", |s| {
        s.peers.is_empty() && s.alone_s.is_some() && s.disconnections == 1
    });
    assert_eq!(lost.links[0].received, COUNT as u64, "{lost:#?}");
    let text = deploy_status(r.b.path());
    assert!(
        text.contains("(peer), 0 peer(s), 0 router(s) (nobody reached for "),
        "{text}"
    );
    assert!(text.contains("network lost 1 time(s)"), "{text}");
    // Back: the bridges find each other again, with no restart (the same
    // sessions), and what A sends then arrives, none lost.
    ip(&["-n", &nb, "link", "set", &vb, "up"]);
    let back = bridge_status(r.b.path(), "B reaching A again", |s| {
        !s.peers.is_empty() && s.alone_s.is_none()
    });
    assert_eq!(back.session, lost.session, "the bridge was not restarted");
    assert_eq!(back.disconnections, 1);
    std::thread::sleep(Duration::from_secs(1));
    const AGAIN: u32 = 500;
    r.talk(AGAIN);
    let sb = bridge_status(r.b.path(), "B's count after the outage", |s| {
        s.links[0].received >= (COUNT + AGAIN) as u64
    });
    let l = &sb.links[0];
    assert_eq!(
        (l.received, l.lost, l.dropped.total()),
        ((COUNT + AGAIN) as u64, 0, 0),
        "{sb:#?}"
    );
    let log = logs(r.b.path(), "rtdeploy-bridge");
    for part in [
        "no peer or router is reached any more",
        "reached again after ",
    ] {
        assert_eq!(log.matches(part).count(), 1, "{part:?} once in:\n{log}");
    }
}

/// `deploy status` of the supervisor under `prefix`, as text.
fn deploy_status(prefix: &Path) -> String {
    let o = Command::new(DEPLOY)
        .arg("--prefix")
        .arg(prefix)
        .arg("status")
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `deploy plan` says what the bridge forwards where, and within what
/// bound a real-time subscriber sees what it brings in.
#[test]
fn the_plan_shows_what_is_forwarded_where() {
    let (_, listener) = examples().unwrap_or_else(|why| panic!("{why}"));
    let b = prefix("robot-b", &robot_b("tcp/10.0.0.1:7447", &listener, 10));
    let o = Command::new(DEPLOY)
        .arg("--prefix")
        .arg(b.path())
        .arg("plan")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    for part in [
        "bridge (rtdeploy-bridge, SCHED_OTHER on CPUs 0, never real-time; Zenoh peer, connect tcp/10.0.0.1:7447, listen -)",
        "in  /demo/chatter <- rtdeploy/robot-a/demo/chatter  (rtdeploy, best effort, priority 5, ttl 5000ms, real-time subscribers see it within 2000us (cross_class_latency))",
    ] {
        assert!(text.contains(part), "{part:?} not in:\n{text}");
    }
    let a = prefix("robot-a", &robot_a("tcp/127.0.0.1:7447"));
    let o = Command::new(DEPLOY)
        .arg("--prefix")
        .arg(a.path())
        .args(["--json", "plan"])
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        doc["bridge"]["links"][0]["key"], "rtdeploy/robot-a/demo/chatter",
        "{doc}"
    );
    assert_eq!(doc["bridge"]["links"][0]["direction"], "out");
}
