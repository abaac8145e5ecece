//! Python (`pip install ./controller/python`, the `rtdeploy` module): a
//! script publishes 10,000 messages of the type `deploy gen --lang python`
//! writes from `examples/cpp/msg/Chatter.msg` (the Rust examples' Chatter)
//! that the Rust listener, run by the supervisor, receives every one of;
//! it reads them back itself in order (and 100 more as a numpy structured
//! array), and reads the listener's timing report while it runs.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{examples, supervise, wait_status, DEPLOY};

fn python() -> String {
    std::env::var("RTDEPLOY_PYTHON").unwrap_or_else(|_| "python3".into())
}

const SCRIPT: &str = r#"
import sys
import rtdeploy
import chatter

assert rtdeploy.REAL_TIME is False
shm = sys.argv[1]
ch = rtdeploy.Channel("/demo/chatter", shm_dir=shm)
sub = ch.subscriber(chatter.Chatter)
pub = ch.publisher(chatter.Chatter)
for i in range(10000):
    pub.publish(chatter.Chatter(seq=i, deadline_ns=0))
print("published", pub.published)
seqs = [m.seq for m in sub.since()]
assert seqs == list(range(10000)), (len(seqs), seqs[:3], seqs[-3:])
print("read back", len(seqs), "in order, lost", sub.lost)
# A wrong type is refused, both named.
class Swapped(chatter.Chatter):
    LAYOUT_HASH = chatter.Chatter.LAYOUT_HASH ^ 1
try:
    ch.publisher(Swapped)
    print("wrong type accepted")
except RuntimeError as e:
    print("wrong type refused:", e)
# The same messages as one numpy structured array of the type's dtype.
import numpy
for i in range(10000, 10100):
    pub.publish(chatter.Chatter(seq=i, deadline_ns=2 * i))
arr = sub.since_array()
assert isinstance(arr, numpy.ndarray) and arr.dtype == chatter.Chatter.dtype(), arr.dtype
assert arr["seq"].tolist() == list(range(10000, 10100)), arr["seq"][:3]
assert arr["deadline_ns"].tolist() == [2 * i for i in range(10000, 10100)]
print("numpy view", ",".join(arr.dtype.names), len(arr))
r = rtdeploy.timing_report("listener", shm_dir=shm)
watched = [e for e in r["entries"] if e["kind"] == "watcher" and e["name"] == "/demo/chatter"]
print("report of", r["process"], "seq", r["seq"], "watcher entries", len(watched))
"#;

#[test]
#[ignore = "needs python rtdeploy: the module pip install ./controller/python builds, and numpy"]
fn a_python_script_publishes_what_the_rust_listener_receives_and_reads_its_report() {
    let (_, listener) = examples().unwrap_or_else(|why| panic!("{why}"));
    let prefix = tempfile::Builder::new()
        .prefix("rtdeploy-py-")
        .tempdir()
        .unwrap();
    std::fs::create_dir_all(prefix.path().join("etc/rtdeploy")).unwrap();
    let yaml = format!(
        "robot:\n  name: pybot\nboard:\n  model: generic\n  cpus: 2\ncpus:\n  housekeeping: 0\n  isolated: 1\nboot_check:\n  enabled: false\nchannels:\n  - name: /demo/chatter\n    max_size: 64\n    rate: 1000\n    depth: 16384\nprocesses:\n  - name: listener\n    exec: {}\n    args: [--channel, /demo/chatter, --count, \"10000\", --every, \"2500\"]\n    restart: {{policy: never}}\n    subscribes: [/demo/chatter]\n",
        listener.display()
    );
    std::fs::write(prefix.path().join("etc/rtdeploy/robot.yaml"), yaml).unwrap();
    // The message class, from the description.
    let work = tempfile::tempdir().unwrap();
    let msg = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/cpp/msg/Chatter.msg");
    let o = Command::new(DEPLOY)
        .args(["gen", "--lang", "python", "--out"])
        .arg(work.path())
        .arg(&msg)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    std::fs::write(work.path().join("publish.py"), SCRIPT).unwrap();

    let _sup = supervise(prefix.path());
    // The listener's loop runs (its first report) before the script.
    wait_status(prefix.path(), "the listener reporting", |s| {
        s.processes
            .iter()
            .all(|p| p.timing.as_ref().is_some_and(|t| t.reports >= 1))
    });
    let shm = prefix.path().join("dev/shm/rtdeploy");
    let o = Command::new(python())
        .arg(work.path().join("publish.py"))
        .arg(&shm)
        .current_dir(work.path())
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", python()));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    eprintln!("{out}");
    assert!(out.contains("published 10000"), "{out}");
    assert!(out.contains("read back 10000 in order, lost 0"), "{out}");
    assert!(out.contains("wrong type refused: channel"), "{out}");
    assert!(out.contains("carries `Chatter`"), "{out}");
    assert!(out.contains("numpy view seq,deadline_ns 100"), "{out}");
    assert!(out.contains("report of listener seq "), "{out}");
    assert!(out.contains("watcher entries 1"), "{out}");
    // The Rust listener got every one.
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let o = Command::new(DEPLOY)
            .arg("--prefix")
            .arg(prefix.path())
            .args(["logs", "listener"])
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&o.stdout).into_owned();
        if log.contains("the loop ended") {
            assert!(
                log.contains(
                    "the loop ended after 10000 messages on /demo/chatter (last seq 9999, lost 0)"
                ),
                "{log}"
            );
            break;
        }
        assert!(Instant::now() < until, "the listener did not end:\n{log}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
