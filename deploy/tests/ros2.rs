//! The bridge as ROS 2 nodes on rmw_zenoh see it, checked by an
//! independent peer: Python's `eclipse-zenoh` (PyPI) connects to the
//! robot's bridge and
//! - finds the bridge's node and publisher liveliness tokens, each with
//!   the shape of the fixtures of rmw_zenoh's docs/design.md (quoted
//!   verbatim below, at the commit `messages::ros` pins);
//! - subscribes to the talker's channel on its rmw_zenoh key expression,
//!   whose type hash PyPI `rosbags` computes itself from the type's fields,
//!   reads the attachment as the design document lays it out, and decodes
//!   the CDR payload with the ROS 2 tools' decoder (`mcap-ros2-support`);
//! - publishes CDR messages (serialised by `rosbags`) with rmw_zenoh's
//!   attachment on the key of an inbound channel, which the robot's
//!   listener receives every one of, and garbage (another type hash, a
//!   bad attachment, a payload too large), which the bridge drops and
//!   counts by reason.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{examples, supervise, wait_status, DEPLOY};

fn python() -> String {
    std::env::var("RTDEPLOY_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn bridge_exe() -> PathBuf {
    let b = Path::new(DEPLOY).parent().unwrap().join("rtdeploy-bridge");
    assert!(
        b.is_file(),
        "{} is not built (`cargo test --workspace` builds it; alone: cargo build -p bridge)",
        b.display()
    );
    b
}

const SCRIPT: &str = r#"
import re, struct, sys, time
import zenoh
from rosbags.typesys import get_types_from_msg, get_typestore, Stores
from mcap_ros2._dynamic import generate_dynamic

endpoint, node, count = sys.argv[1], sys.argv[2], int(sys.argv[3])

# rmw_zenoh's docs/design.md (ros2/rmw_zenoh at
# 99a6a2bd10b949052f4f12c5854825dc005e95a5), verbatim.
DOC_KEY = "0/chatter/std_msgs::msg::dds_::String_/RIHS01_df668c740482bbd48fb39d76a70dfd4bd59db1288021743503259e948f6b1a18"
DOC_NODE = "@ros2_lv/2/aac3178e146ba6f1fc6e6a4085e77f21/0/0/NN/%/%/listener"
DOC_PUB = "@ros2_lv/2/8b20917502ee955ac4476e0266340d5c/0/10/MP/%/%/talker/%chatter/std_msgs::msg::dds_::String_/RIHS01_df668c740482bbd48fb39d76a70dfd4bd59db1288021743503259e948f6b1a18/::,7:,:,:,,"
DOC_ATTACHMENT = [("sequence number", 8), ("timestamp", 8), ("gid length", 1), ("gid", 16)]

# The type, and its hash, from an independent implementation.
MSG = "uint64 seq\nuint64 deadline_ns\n"
store = get_typestore(Stores.EMPTY)
store.register(get_types_from_msg(MSG, "demo/msg/Chatter"))
HASH = store.hash_rihs01("demo/msg/Chatter")
DDS = "demo::msg::dds_::Chatter_"
decode = generate_dynamic("demo/msg/Chatter", MSG)["demo/msg/Chatter"]

conf = zenoh.Config()
conf.insert_json5("mode", '"peer"')
conf.insert_json5("connect/endpoints", '["%s"]' % endpoint)
conf.insert_json5("scouting/multicast/enabled", "false")
s = zenoh.open(conf)

# The key expression: the document's shape, our topic, rosbags' hash.
doc = DOC_KEY.split("/")
key = "0/demo/chatter/%s/%s" % (DDS, HASH)
ours = key.split("/")
assert len(ours) == len(doc) + 1, (ours, doc)  # the topic has two chunks
assert ours[0] == doc[0] and ours[-2].endswith("_") and "::msg::dds_::" in ours[-2]
assert ours[-1].startswith("RIHS01_") and len(ours[-1]) == len(doc[-1])

# Liveliness: the node and the publisher, shaped as the document's.
tokens = []
deadline = time.time() + 10
while time.time() < deadline and not any("/MP/" in t for t in tokens):
    tokens = [str(r.ok.key_expr) for r in s.liveliness().get("@ros2_lv/0/**", timeout=2.0) if r.ok]
    time.sleep(0.2)
nodes = [t for t in tokens if "/NN/" in t]
pubs = [t for t in tokens if "/MP/" in t and "%demo%chatter" in t]
assert len(nodes) == 1 and len(pubs) == 1, tokens
n, dn = nodes[0].split("/"), DOC_NODE.split("/")
assert len(n) == len(dn), (n, dn)
assert (n[0], n[1], n[5], n[6], n[7], n[8]) == (dn[0], "0", dn[5], dn[6], dn[7], node), (n, dn)
# The session id is Zenoh's text for it (what rmw_zenoh writes through
# zenoh-cpp's Id::to_string): lowercase hex without leading zeros, so 1 to
# 32 characters, never a fixed width. It must be the bridge's session.
assert n[3] == n[4] == "0" and re.fullmatch(r"[1-9a-f][0-9a-f]{0,31}", n[2]), n
sessions = [str(z) for z in s.info.peers_zid()] + [str(z) for z in s.info.routers_zid()]
assert n[2] in sessions, (n, sessions)
p, dp = pubs[0].split("/"), DOC_PUB.split("/")
assert len(p) == len(dp), (p, dp)
assert (p[0], p[5], p[6], p[7], p[8]) == (dp[0], dp[5], dp[6], dp[7], node), (p, dp)
assert (p[9], p[10], p[11]) == ("%demo%chatter", DDS, HASH), p
assert p[2] == n[2], "the publisher's session is the node's"
qos, dqos = p[12].split(":"), dp[12].split(":")
assert len(qos) == len(dqos) and [q.count(",") for q in qos] == [q.count(",") for q in dqos], (qos, dqos)
print("liveliness ok", pubs[0])

# The talker's messages: key, attachment, CDR.
got = []
def on_sample(sample):
    got.append((str(sample.key_expr), sample.payload.to_bytes(),
                sample.attachment.to_bytes() if sample.attachment is not None else None))
sub = s.declare_subscriber("0/demo/chatter/%s/*" % DDS, on_sample)
deadline = time.time() + 20
while len(got) < 200 and time.time() < deadline:
    time.sleep(0.05)
assert len(got) >= 200, len(got)
seqs, atts = [], []
for k, payload, att in got[:200]:
    assert k == key, (k, key)
    assert att is not None and len(att) == sum(n for _, n in DOC_ATTACHMENT), att
    sn, ts, glen = struct.unpack_from("<qqB", att)
    assert glen == 16, glen
    atts.append((sn, ts, att[17:]))
    m = decode(payload)
    seqs.append(m.seq)
assert seqs == list(range(seqs[0], seqs[0] + 200)), seqs[:5]
assert [a[0] for a in atts] == list(range(atts[0][0], atts[0][0] + 200)), [a[0] for a in atts[:5]]
assert len({a[2] for a in atts}) == 1
assert abs(atts[-1][1] - time.time_ns()) < 60 * 10**9, atts[-1][1]
print("received", len(got), "first seq", seqs[0], "decoded by mcap_ros2")
sub.undeclare()

# Into the robot: messages serialised by rosbags, rmw_zenoh's attachment.
cmd = "0/demo/cmd/%s/%s" % (DDS, HASH)
Chatter = store.types["demo/msg/Chatter"]
gid = bytes(range(16))
pub = s.declare_publisher(cmd)
time.sleep(1.0)
for i in range(count):
    payload = bytes(store.serialize_cdr(Chatter(seq=i, deadline_ns=2 * i), "demo/msg/Chatter"))
    att = struct.pack("<qqB", i + 1, time.time_ns(), 16) + gid
    pub.put(payload, attachment=att)
    time.sleep(0.001)
# Garbage, each dropped and counted by the bridge.
good = bytes(store.serialize_cdr(Chatter(seq=0, deadline_ns=0), "demo/msg/Chatter"))
s.put("0/demo/cmd/%s/RIHS01_%s" % (DDS, "0" * 64), good, attachment=struct.pack("<qqB", 1, 0, 16) + gid)
s.put(cmd, good, attachment=b"short")
s.put(cmd, good + bytes(4096), attachment=struct.pack("<qqB", count + 5, time.time_ns(), 16) + gid)
time.sleep(1.0)
print("published", count)
s.close()
"#;

#[test]
#[ignore = "needs python zenoh: PyPI eclipse-zenoh, rosbags and mcap-ros2-support, an independent peer"]
fn a_ros_2_peer_sees_the_channels_as_rmw_zenoh_topics_and_sends_into_them() {
    const COUNT: u32 = 300;
    let (talker, listener) = examples().unwrap_or_else(|why| panic!("{why}"));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("tcp/127.0.0.1:{port}");
    let dir = tempfile::Builder::new()
        .prefix("rtdeploy-ros2-")
        .tempdir()
        .unwrap();
    std::fs::create_dir_all(dir.path().join("etc/rtdeploy")).unwrap();
    let chatter = "{name: demo/Chatter, fields: [uint64 seq, uint64 deadline_ns]}";
    let yaml = [
        "robot:\n  name: rosbot\nboard:\n  model: generic\n  cpus: 2\n".to_string(),
        "cpus:\n  housekeeping: 0\n  isolated: 1\nboot_check:\n  enabled: false\n".into(),
        // Four seconds of the talker held: the bridge (SCHED_OTHER) may
        // wait behind the other tests of this run, and the peer checks
        // that every sequence number comes.
        "channels:\n  - name: /demo/chatter\n    max_size: 64\n    rate: 1000\n    depth: 4096\n"
            .into(),
        "  - name: /demo/cmd\n    max_size: 64\n    rate: 1000\n    depth: 1024\n".into(),
        format!("log:\n  types:\n    /demo/chatter: {chatter}\n    /demo/cmd: {chatter}\n"),
        format!(
            "processes:\n  - name: talker\n    exec: {}\n",
            talker.display()
        ),
        "    args: [--channel, /demo/chatter, --period-us, \"1000\", --every, \"100000\"]\n".into(),
        "    publishes: [/demo/chatter]\n".into(),
        format!("  - name: listener\n    exec: {}\n", listener.display()),
        format!("    args: [--channel, /demo/cmd, --count, \"{COUNT}\", --every, \"100\"]\n"),
        "    restart: {policy: never}\n    subscribes: [/demo/cmd]\n".into(),
        format!(
            "bridge:\n  exec: {}\n  mode: peer\n",
            bridge_exe().display()
        ),
        format!("  listen: [{endpoint}]\n  node: rosbot_bridge\n  forward:\n"),
        "    - {channels: /demo/chatter, direction: out, ros2: true}\n".into(),
        "    - {channels: /demo/cmd, direction: in, ros2: true}\n".into(),
    ]
    .concat();
    std::fs::write(dir.path().join("etc/rtdeploy/robot.yaml"), yaml).unwrap();
    let _sup = supervise(dir.path());
    wait_status(dir.path(), "the bridge up", |s| {
        s.bridge.as_ref().is_some_and(|b| b.links.len() == 2)
    });
    let script = dir.path().join("peer.py");
    std::fs::write(&script, SCRIPT).unwrap();
    let o = Command::new(python())
        .arg(&script)
        .args([&endpoint, "rosbot_bridge", &COUNT.to_string()])
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", python()));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("liveliness ok @ros2_lv/0/"), "{out}");
    assert!(out.contains("received "), "{out}");
    assert!(out.contains(&format!("published {COUNT}")), "{out}");
    // The listener got every one the peer sent, in order.
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let o = Command::new(DEPLOY)
            .arg("--prefix")
            .arg(dir.path())
            .args(["logs", "listener"])
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&o.stdout).into_owned();
        if log.contains("the loop ended") {
            assert!(
                log.contains(&format!(
                    "the loop ended after {COUNT} messages on /demo/cmd (last seq {}, lost 0)",
                    COUNT - 1
                )),
                "{log}"
            );
            break;
        }
        assert!(Instant::now() < until, "the listener did not end:\n{log}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // The garbage: dropped, each counted by its reason.
    let s = wait_status(dir.path(), "the garbage counted", |s| {
        s.bridge.as_ref().is_some_and(|b| {
            b.links
                .iter()
                .any(|l| l.direction == "in" && l.dropped.total() >= 3)
        })
    });
    let b = s.bridge.unwrap();
    let l = b.links.iter().find(|l| l.direction == "in").unwrap();
    assert_eq!(l.received, COUNT as u64, "{b:#?}");
    assert_eq!(
        (l.dropped.wrong_type, l.dropped.garbage, l.dropped.size),
        (1, 1, 1),
        "{b:#?}"
    );
    let log = String::from_utf8_lossy(
        &Command::new(DEPLOY)
            .arg("--prefix")
            .arg(dir.path())
            .args(["logs", "rtdeploy-bridge"])
            .output()
            .unwrap()
            .stdout,
    )
    .into_owned();
    for said in [
        "a ROS 2 message of type hash RIHS01_0000",
        "a ROS 2 message with a bad attachment",
        "larger than the channel's max_size 64",
    ] {
        assert_eq!(
            log.matches(said).count(),
            1,
            "{said:?} not said once in:\n{log}"
        );
    }
}

const FLOOD: &str = r#"
import struct, sys, time
import zenoh
endpoint, seconds = sys.argv[1], float(sys.argv[2])
conf = zenoh.Config()
conf.insert_json5("mode", '"peer"')
conf.insert_json5("connect/endpoints", '["%s"]' % endpoint)
conf.insert_json5("scouting/multicast/enabled", "false")
s = zenoh.open(conf)
pub = s.declare_publisher("rtdeploy/robot-x/demo/cmd")
time.sleep(1.0)
boot = bytes(16)
n, end = 0, time.time() + seconds
while time.time() < end:
    for _ in range(100):
        head = b"RTB1" + struct.pack("<HHQQQQ", 64, 0, n, time.monotonic_ns(), time.time_ns(), 0) + boot + bytes(8)
        pub.put(head + struct.pack("<QQ", n, 0))
        n += 1
print("flooded", n)
s.close()
"#;

/// A peer floods an inbound channel far beyond its `rate`: the bridge
/// takes the rate and drops the rest, counted, its peak resident set
/// within its `memory`; the robot's own talker and listener run on
/// (their counts are printed as figures, not asserted: this machine is
/// shared).
#[test]
#[ignore = "needs python zenoh: PyPI eclipse-zenoh, a peer that floods"]
fn a_flooding_peer_is_held_to_the_rate_and_the_memory_bound() {
    const RATE: u64 = 500;
    const SECONDS: u64 = 4;
    const MEMORY: u64 = 64 << 20;
    let (talker, listener) = examples().unwrap_or_else(|why| panic!("{why}"));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("tcp/127.0.0.1:{port}");
    let dir = tempfile::Builder::new()
        .prefix("rtdeploy-flood-")
        .tempdir()
        .unwrap();
    std::fs::create_dir_all(dir.path().join("etc/rtdeploy")).unwrap();
    let yaml = [
        "robot:\n  name: floodbot\nboard:\n  model: generic\n  cpus: 2\n".to_string(),
        "cpus:\n  housekeeping: 0\n  isolated: 1\nboot_check:\n  enabled: false\n".into(),
        "channels:\n  - name: /demo/ping\n    max_size: 64\n    rate: 1000\n".into(),
        "  - name: /demo/cmd\n    max_size: 64\n    rate: 1000\n    depth: 1024\n".into(),
        format!(
            "processes:\n  - name: talker\n    exec: {}\n",
            talker.display()
        ),
        "    args: [--channel, /demo/ping, --period-us, \"1000\", --every, \"1000\"]\n".into(),
        "    publishes: [/demo/ping]\n".into(),
        format!("  - name: listener\n    exec: {}\n", listener.display()),
        "    args: [--channel, /demo/ping, --every, \"1000\"]\n".into(),
        "    subscribes: [/demo/ping]\n".into(),
        format!(
            "bridge:\n  exec: {}\n  mode: peer\n",
            bridge_exe().display()
        ),
        format!("  listen: [{endpoint}]\n  memory: {MEMORY}\n  forward:\n"),
        format!("    - {{channels: /demo/cmd, direction: in, rate: {RATE}}}\n"),
    ]
    .concat();
    std::fs::write(dir.path().join("etc/rtdeploy/robot.yaml"), yaml).unwrap();
    let _sup = supervise(dir.path());
    let s = wait_status(dir.path(), "the bridge up", |s| {
        s.bridge.as_ref().is_some_and(|b| b.links.len() == 1)
    });
    let pid = s
        .processes
        .iter()
        .find(|p| p.name == "rtdeploy-bridge")
        .and_then(|p| p.pid)
        .expect("the bridge's pid");
    let ping = |prefix: &Path| {
        controller::Channel::open(&prefix.join("dev/shm/rtdeploy"), "/demo/ping")
            .map(|c| c.next_index())
            .unwrap_or(0)
    };
    let script = dir.path().join("flood.py");
    std::fs::write(&script, FLOOD).unwrap();
    let before = (ping(dir.path()), Instant::now());
    let o = Command::new(python())
        .arg(&script)
        .args([&endpoint, &SECONDS.to_string()])
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", python()));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let flooded: u64 = out
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    let talked = ping(dir.path()) - before.0;
    let elapsed = before.1.elapsed().as_secs_f64();
    let s = wait_status(dir.path(), "the flood counted", |s| {
        s.bridge.as_ref().is_some_and(|b| {
            let l = &b.links[0];
            l.received + l.dropped.total() + l.lost >= flooded.min(1000)
        })
    });
    let b = s.bridge.unwrap();
    let l = &b.links[0];
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let hwm_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    eprintln!(
        "flood: {flooded} sent by the peer in {SECONDS} s; the bridge took {} and dropped {} over rate; peak RSS {} KiB of {} KiB; the talker published {talked} on /demo/ping in {elapsed:.1} s meanwhile",
        l.received,
        l.dropped.rate,
        hwm_kib,
        MEMORY >> 10
    );
    assert!(flooded > 10 * RATE * SECONDS, "not a flood: {flooded}");
    // The rate, and the bucket's one second of burst.
    assert!(
        l.received <= RATE * (SECONDS + 2) + RATE,
        "{} taken at {RATE}/s: {b:#?}",
        l.received
    );
    assert!(l.dropped.rate > 0, "{b:#?}");
    assert!(
        hwm_kib << 10 <= MEMORY,
        "peak RSS {hwm_kib} KiB over {MEMORY}"
    );
    assert_eq!(l.dropped.memory, 0, "{b:#?}");
    // The robot's own pair ran on (how fast is a figure above).
    assert!(talked > 0, "the talker published nothing during the flood");
}
