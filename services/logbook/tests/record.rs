//! The logger against real channels in a temporary shm directory, read
//! back by our reader and by Python's `mcap` package (an independent
//! implementation: those tests are ignored unless asked for, `needs python
//! mcap`, since a new machine lacks the package).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use controller::{Channel, ChannelGeometry};
use logbook::read::{first_log_time, load, scan, Filter};
use logbook::replay::{replay, ReplayOptions};
use logbook::schema::TypeDecl;
use logbook::{LogSection, Recorder, RecorderConfig};
use units::duration::Dur;
use units::size::ByteSize;

const PROC: &str = "/proc";

controller::shm_struct! {
    #[derive(Debug)]
    pub struct Sample {
        pub seq: u64,
        pub value: f64,
        pub flags: u32,
        pub reserved: u32,
    }
}

fn section(poll_ms: u64) -> LogSection {
    LogSection {
        poll: Dur::from_millis(poll_ms),
        flush: Dur::from_millis(100),
        chunk_size: ByteSize(16 << 10),
        types: [(
            "/demo/sample".to_string(),
            TypeDecl {
                name: "demo/Sample".into(),
                fields: vec![
                    "uint64 seq".into(),
                    "float64 value".into(),
                    "uint32 flags".into(),
                    "uint32 reserved".into(),
                ],
            },
        )]
        .into(),
        ..LogSection::default()
    }
}

fn start(shm: &Path, dir: &Path, section: LogSection, channels: &[&str]) -> Recorder {
    Recorder::start(RecorderConfig {
        section,
        dir: dir.to_path_buf(),
        shm_dir: shm.to_path_buf(),
        channels: channels.iter().map(|s| s.to_string()).collect(),
        boot_id: "test-boot".into(),
        cpus: units::cpu::CpuSet::new(),
        from_oldest: true,
    })
    .unwrap()
}

fn files(dir: &Path) -> Vec<PathBuf> {
    logbook::recorder::list_files(dir)
        .into_iter()
        .map(|(p, _)| p)
        .collect()
}

fn wait_logged(rec: &Recorder, channel: &str, n: u64) {
    let t = Instant::now();
    loop {
        let s = rec.status();
        let c = s.channels.get(channel).cloned().unwrap_or_default();
        if c.logged + c.gaps >= n {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "logger stuck at {c:?} of {n}: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The next value of a xorshift64 sequence.
fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// `len` incompressible bytes from the sequence at `x`.
fn noise(x: &mut u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    for b in buf.chunks_mut(8) {
        b.copy_from_slice(&xorshift(x).to_le_bytes()[..b.len()]);
    }
    buf
}

/// Fails the test, in one line, when Python's `mcap` package (and, with
/// `ros2`, `mcap-ros2-support`) cannot be imported.
fn require_python_mcap(ros2: bool) {
    let import = if ros2 {
        "import mcap.reader, mcap.stream_reader, mcap.writer, mcap_ros2.decoder"
    } else {
        "import mcap.reader, mcap.stream_reader, mcap.writer"
    };
    let o = Command::new("python3")
        .args(["-c", import])
        .output()
        .unwrap_or_else(|e| panic!("python3: {e}"));
    assert!(
        o.status.success(),
        "Python's mcap packages: {} (pip install mcap mcap-ros2-support)",
        String::from_utf8_lossy(&o.stderr)
            .lines()
            .last()
            .unwrap_or("")
    );
}

/// Reads `file` with Python's mcap package: non-seeking (`StreamReader`)
/// or seeking through the summary (`make_reader`), and prints per-topic
/// counts and the gaps the logger recorded, as JSON.
fn python_counts(file: &Path, seeking: bool) -> serde_json::Value {
    let script = r#"
import json, sys
from mcap.reader import make_reader
from mcap.stream_reader import StreamReader
from mcap.records import Channel, Message
path, seeking = sys.argv[1], sys.argv[2] == "1"
counts, gaps, seqs, error = {}, {}, {}, None
def note(topic, data, seq):
    counts[topic] = counts.get(topic, 0) + 1
    if topic == "/rtdeploy/log/gaps":
        g = json.loads(data)
        gaps[g["channel"]] = gaps.get(g["channel"], 0) + g["count"]
    seqs.setdefault(topic, []).append(seq)
with open(path, "rb") as f:
    if seeking:
        r = make_reader(f)
        for schema, channel, message in r.iter_messages():
            note(channel.topic, message.data, message.sequence)
    else:
        channels = {}
        try:
            for rec in StreamReader(f, skip_magic=False).records:
                if isinstance(rec, Channel):
                    channels[rec.id] = rec.topic
                elif isinstance(rec, Message):
                    note(channels[rec.channel_id], rec.data, rec.sequence)
        except Exception as e:
            error = type(e).__name__ + ": " + str(e)
print(json.dumps({"counts": counts, "gaps": gaps, "error": error,
                  "first_seq": {k: v[0] for k, v in seqs.items()}}))
"#;
    let o = Command::new("python3")
        .args([
            "-c",
            script,
            file.to_str().unwrap(),
            if seeking { "1" } else { "0" },
        ])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "python mcap reader failed on {}: {}",
        file.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Decodes `topic` of `file` with the ROS 2 CDR decoder of Python's
/// `mcap-ros2-support` (what decodes `ros2msg`/`cdr` for the mcap tools,
/// independently of ours): every message's fields, as JSON.
fn python_ros2_decode(file: &Path, topic: &str) -> Result<serde_json::Value, String> {
    let script = r#"
import json, sys
from mcap.reader import make_reader
from mcap_ros2.decoder import DecoderFactory
out = []
with open(sys.argv[1], "rb") as f:
    r = make_reader(f, decoder_factories=[DecoderFactory()])
    for schema, channel, message, msg in r.iter_decoded_messages(topics=[sys.argv[2]]):
        out.append({k: getattr(msg, k) for k in msg.__slots__})
print(json.dumps(out))
"#;
    let o = Command::new("python3")
        .args(["-c", script, file.to_str().unwrap(), topic])
        .output()
        .map_err(|e| e.to_string())?;
    if !o.status.success() {
        return Err(String::from_utf8_lossy(&o.stderr).trim().to_string());
    }
    serde_json::from_slice(&o.stdout).map_err(|e| e.to_string())
}

/// A file that logged a paced run and a burst, and what was sent.
struct Burst {
    _out: tempfile::TempDir,
    file: PathBuf,
    sent: u64,
    logged: u64,
    seqs: Vec<u64>,
}

#[test]
fn every_message_is_logged_or_a_gap() {
    logged_burst();
}

/// 200 paced messages and a burst of 2000, logged, checked with our reader.
fn logged_burst() -> Burst {
    let shm = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    // A small queue (16 slots) and a slow logger (poll 50 ms) against a
    // burst of 2000: most of the burst is overwritten before the logger
    // reads it, which must show as gaps, counted exactly.
    let geom = ChannelGeometry::new(64, 16, 2);
    let (ch, _) =
        Channel::create(shm.path(), "/demo/sample", &geom, None, Path::new(PROC)).unwrap();
    ch.bind_type::<Sample>().unwrap();
    let (raw, _) = Channel::create(shm.path(), "/demo/raw", &geom, None, Path::new(PROC)).unwrap();
    let rec = start(
        shm.path(),
        out.path(),
        section(50),
        &["/demo/sample", "/demo/raw", "/not/recorded/missing"],
    );
    let mut p = ch.publisher(Path::new(PROC)).unwrap();
    let mut praw = raw.publisher(Path::new(PROC)).unwrap();
    let sink = rec.sink();
    sink.send("start", Some("talker"), "talker: started, pid 1");
    let mut sent = 0u64;
    // Paced part: the logger keeps up (no gaps).
    for i in 0..200u64 {
        p.publish_value(&Sample {
            seq: i,
            value: i as f64 * 0.5,
            flags: 7,
            reserved: 0,
        })
        .unwrap();
        praw.publish(&i.to_le_bytes()).unwrap();
        sent += 1;
        if i % 8 == 7 {
            std::thread::sleep(Duration::from_millis(60));
        }
    }
    // Burst: the ring laps the logger.
    for i in 200..2200u64 {
        p.publish_value(&Sample {
            seq: i,
            value: 0.0,
            flags: 0,
            reserved: 0,
        })
        .unwrap();
        sent += 1;
    }
    wait_logged(&rec, "/demo/sample", sent);
    sink.send("exit", Some("talker"), "talker: pid 1 exited with status 0");
    let st = rec.stop();
    assert_eq!(st.state, "stopped", "{st:?}");
    let c = &st.channels["/demo/sample"];
    assert_eq!(c.logged + c.gaps, sent, "{st:?}");
    assert!(
        c.gaps > 0,
        "the burst should have lapped the logger: {st:?}"
    );
    assert!(c.logged >= 200, "{st:?}");
    assert_eq!(st.channels["/demo/raw"].logged, 200);
    assert_eq!(st.events_logged, 2);

    let fs = files(out.path());
    assert_eq!(fs.len(), 1, "{fs:?}");
    let bytes = load(&fs[0]).unwrap();
    let mut seqs = Vec::new();
    let mut event_seqs = Vec::new();
    let sum = scan(&fs[0], &bytes, |m| {
        if m.channel.topic == "/rtdeploy/events" {
            event_seqs.push(m.sequence);
        }
        if m.channel.topic == "/demo/sample" {
            let v = m.channel.decode(m.data).unwrap();
            seqs.push(v["seq"].as_u64().unwrap());
            assert_eq!(m.sequence as u64, v["seq"].as_u64().unwrap());
        }
    })
    .unwrap();
    assert!(sum.finished && sum.truncated.is_none(), "{sum:?}");
    let s = sum.channel("/demo/sample").unwrap();
    assert_eq!(s.messages, c.logged);
    assert_eq!(s.gaps, c.gaps);
    assert_eq!(s.message_encoding, "cdr");
    assert_eq!(s.schema_name.as_deref(), Some("demo/msg/Sample"));
    assert!(seqs.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(seqs[..200], (0..200).collect::<Vec<_>>()[..]);
    assert_eq!(*seqs.last().unwrap(), 2199);
    assert!(sum.clock.is_some());
    assert_eq!(sum.channel("/rtdeploy/events").unwrap().messages, 2);
    // The supervisor's events are numbered in the order they came.
    assert_eq!(event_seqs, [0, 1]);
    assert!(sum.channel("/rtdeploy/log/senders").unwrap().messages >= 2);
    Burst {
        file: fs[0].clone(),
        _out: out,
        sent,
        logged: c.logged,
        seqs,
    }
}

#[test]
#[ignore = "needs python mcap: Python's mcap and mcap-ros2-support (pip install mcap mcap-ros2-support)"]
fn an_independent_reader_and_the_ros2_decoder_agree_on_a_logged_burst() {
    require_python_mcap(true);
    let b = logged_burst();
    for seeking in [true, false] {
        let v = python_counts(&b.file, seeking);
        assert!(v["error"].is_null(), "{v}");
        let logged = v["counts"]["/demo/sample"].as_u64().unwrap();
        let gaps = v["gaps"]["/demo/sample"].as_u64().unwrap();
        assert_eq!(logged + gaps, b.sent, "python (seeking {seeking}): {v}");
        assert_eq!(v["counts"]["/demo/raw"], 200);
        assert_eq!(v["counts"]["/rtdeploy/events"], 2);
    }
    // The bytes as published, behind a CDR header, decode as the declared
    // ros2msg type with the ROS 2 tools' own decoder.
    let decoded = python_ros2_decode(&b.file, "/demo/sample").unwrap();
    let decoded = decoded.as_array().unwrap();
    assert_eq!(decoded.len() as u64, b.logged);
    for (d, seq) in decoded.iter().zip(&b.seqs) {
        assert_eq!(d["seq"].as_u64(), Some(*seq), "{d}");
    }
    assert_eq!(
        decoded[3],
        serde_json::json!({"seq": 3, "value": 1.5, "flags": 7, "reserved": 0})
    );
}

#[test]
fn a_logger_killed_mid_chunk_leaves_a_file_that_reads_up_to_its_last_chunk() {
    killed_mid_chunk();
}

#[test]
#[ignore = "needs python mcap: Python's mcap (pip install mcap)"]
fn an_independent_reader_reads_a_file_cut_by_a_kill_up_to_its_last_chunk() {
    require_python_mcap(false);
    let (_out, file, read) = killed_mid_chunk();
    let v = python_counts(&file, false);
    assert_eq!(
        v["counts"]["/demo/sample"].as_u64(),
        Some(read),
        "python's non-seeking reader: {v}"
    );
}

/// A logger killed while it writes; its file, and how many messages our
/// reader read back from it.
fn killed_mid_chunk() -> (tempfile::TempDir, PathBuf, u64) {
    // The logger runs in a child process (this test binary, re-entered)
    // that is SIGKILLed while it writes; the file must still read.
    let shm = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let geom = ChannelGeometry::new(64, 1024, 2);
    let (ch, _) =
        Channel::create(shm.path(), "/demo/sample", &geom, None, Path::new(PROC)).unwrap();
    ch.bind_type::<Sample>().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "logger_child",
            "--nocapture",
            "--include-ignored",
        ])
        .env("LOGBOOK_CHILD_SHM", shm.path())
        .env("LOGBOOK_CHILD_OUT", out.path())
        .spawn()
        .unwrap();
    let mut p = ch.publisher(Path::new(PROC)).unwrap();
    // Publish until at least two complete chunks are on disk, then kill
    // the logger in the middle of building the next.
    let t = Instant::now();
    let mut i = 0u64;
    loop {
        p.publish_value(&Sample {
            seq: i,
            value: i as f64,
            flags: 1,
            reserved: 0,
        })
        .unwrap();
        i += 1;
        if i % 64 == 0 {
            std::thread::sleep(Duration::from_millis(2));
            let f = files(out.path());
            let len = f.first().map_or(0, |f| std::fs::metadata(f).unwrap().len());
            if len > 8 << 10 && i % 1024 == 0 {
                break;
            }
        }
        assert!(t.elapsed() < Duration::from_secs(30), "no chunk written");
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let fs = files(out.path());
    assert_eq!(fs.len(), 1);
    let bytes = load(&fs[0]).unwrap();
    // The child's logger starts at the newest message when it opens the
    // channel; from there on, every message is in the file, in order, up
    // to the last complete chunk.
    let (mut first, mut last) = (None, None);
    let sum = scan(&fs[0], &bytes, |m| {
        if m.channel.topic == "/demo/sample" {
            let v = m.channel.decode(m.data).unwrap();
            let s = v["seq"].as_u64().unwrap();
            first.get_or_insert(s);
            assert_eq!(
                last.map_or(s, |l: u64| l + 1),
                s,
                "messages in order, none missing"
            );
            last = Some(s);
        }
    })
    .unwrap();
    assert!(!sum.finished, "{sum:?}");
    assert!(sum.chunks >= 1, "{sum:?}");
    let read = last.unwrap() + 1 - first.unwrap();
    assert!(read > 0 && read <= i, "{read} of {i}");
    eprintln!(
        "killed after {i} published: {read} read back from {} complete chunks; {:?}",
        sum.chunks, sum.truncated
    );
    (out, fs[0].clone(), read)
}

/// The logger of the test above, in its own process (on its own it does
/// nothing).
#[test]
#[ignore = "helper process: run by a_logger_killed_mid_chunk_leaves_a_file_that_reads_up_to_its_last_chunk"]
fn logger_child() {
    let (Some(shm), Some(out)) = (
        std::env::var_os("LOGBOOK_CHILD_SHM"),
        std::env::var_os("LOGBOOK_CHILD_OUT"),
    ) else {
        return;
    };
    let mut s = section(1);
    s.flush = Dur::from_secs(3600); // chunks are written when full, only
    let _rec = start(Path::new(&shm), Path::new(&out), s, &["/demo/sample"]);
    std::thread::sleep(Duration::from_secs(60));
}

#[test]
fn files_rotate_and_the_quota_deletes_the_oldest() {
    let shm = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let geom = ChannelGeometry::new(4096, 256, 2);
    let (ch, _) = Channel::create(shm.path(), "/demo/big", &geom, None, Path::new(PROC)).unwrap();
    let mut s = section(2);
    s.types.clear();
    s.chunk_size = ByteSize(8 << 10);
    s.rotate_size = ByteSize(32 << 10);
    s.quota = ByteSize(128 << 10);
    let rec = start(shm.path(), out.path(), s, &["/demo/big"]);
    let mut p = ch.publisher(Path::new(PROC)).unwrap();
    // Incompressible payloads, so the file sizes are the data's.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut sent = 0u64;
    for _ in 0..400 {
        let buf = noise(&mut x, 4000);
        p.publish(&buf).unwrap();
        sent += 1;
        std::thread::sleep(Duration::from_millis(3));
    }
    wait_logged(&rec, "/demo/big", sent);
    let st = rec.stop();
    let fs = logbook::recorder::list_files(out.path());
    let total: u64 = fs.iter().map(|f| f.1).sum();
    assert!(st.files_written >= 10, "{st:?}");
    assert!(st.files_deleted > 0, "{st:?}");
    assert!(total <= 128 << 10, "{total} bytes in {fs:?}");
    for (f, _) in &fs {
        let b = load(f).unwrap();
        let sum = scan(f, &b, |_| {}).unwrap();
        assert!(sum.finished, "{f:?}: {sum:?}");
    }
}

#[test]
fn export_takes_a_window_and_replay_republishes_at_the_recorded_spacing() {
    let shm = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let geom = ChannelGeometry::new(64, 64, 2);
    let (ch, _) =
        Channel::create(shm.path(), "/demo/sample", &geom, None, Path::new(PROC)).unwrap();
    ch.bind_type::<Sample>().unwrap();
    let rec = start(shm.path(), out.path(), section(2), &["/demo/sample"]);
    let mut p = ch.publisher(Path::new(PROC)).unwrap();
    for i in 0..50u64 {
        p.publish_value(&Sample {
            seq: i,
            value: 1.0,
            flags: 0,
            reserved: 0,
        })
        .unwrap();
        std::thread::sleep(Duration::from_millis(4));
    }
    wait_logged(&rec, "/demo/sample", 50);
    rec.stop();
    drop(p);
    let file = files(out.path()).remove(0);

    // Export the middle: seq 10..=29 by log time.
    let bytes = load(&file).unwrap();
    let mut times = Vec::new();
    scan(&file, &bytes, |m| {
        if m.channel.topic == "/demo/sample" {
            times.push(m.log_time)
        }
    })
    .unwrap();
    let cut = out.path().join("cut.mcap");
    let rep = logbook::read::export(
        &file,
        &cut,
        &Filter {
            channels: vec!["/demo/*".into()],
            from: Some(times[10]),
            to: Some(times[29]),
        },
    )
    .unwrap();
    assert_eq!(rep.messages, 20);
    let cb = load(&cut).unwrap();
    let mut seqs = Vec::new();
    let sum = scan(&cut, &cb, |m| {
        if let Some(v) = m.channel.decode(m.data) {
            seqs.push(v["seq"].as_u64().unwrap());
        }
    })
    .unwrap();
    assert_eq!(seqs, (10..30).collect::<Vec<_>>());
    assert!(sum.clock.is_some(), "the clock mapping is kept");

    // Replay the export onto a fresh channel and read what arrives.
    let shm2 = tempfile::tempdir().unwrap();
    let (ch2, _) =
        Channel::create(shm2.path(), "/demo/sample", &geom, None, Path::new(PROC)).unwrap();
    let mut sub = ch2.subscriber(Path::new(PROC)).unwrap();
    let r = replay(
        &cut,
        &ReplayOptions {
            filter: Filter::default(),
            speed: 2.0,
            shm_dir: shm2.path().to_path_buf(),
            proc_root: PROC.into(),
        },
    )
    .unwrap();
    assert_eq!(r.published, 20);
    let mut got = Vec::new();
    let mut sends = Vec::new();
    while let Some(m) = sub.next_message().unwrap() {
        got.push(m.value::<Sample>().unwrap().seq);
        sends.push(m.send_time_ns);
    }
    assert_eq!(got, (10..30).collect::<Vec<_>>());
    // At speed 2, the last message is sent no sooner than half the
    // recorded span after the replay began, and the first at most the
    // worst drift after it (the 19 recorded gaps are >= 4 ms each).
    let span = sends.last().unwrap() - sends[0];
    assert!(r.recorded_span_ns >= 19 * 4_000_000, "{r:?}");
    assert!(
        span + r.drift_max_ns >= r.recorded_span_ns / 2,
        "replayed span {span} ns: {r:?}"
    );
    assert_eq!(ch2.recorded_type().unwrap().0.as_str(), "Sample");

    // A channel of another type is refused, and nothing is published.
    let shm3 = tempfile::tempdir().unwrap();
    let (ch3, _) =
        Channel::create(shm3.path(), "/demo/sample", &geom, None, Path::new(PROC)).unwrap();
    controller::shm_struct! {
        pub struct Other { pub a: u64 }
    }
    ch3.bind_type::<Other>().unwrap();
    let e = replay(
        &cut,
        &ReplayOptions {
            filter: Filter::default(),
            speed: 1.0,
            shm_dir: shm3.path().to_path_buf(),
            proc_root: PROC.into(),
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("not this channel's type"), "{e}");
    assert_eq!(ch3.next_index(), 0);
}

#[test]
fn a_file_cut_anywhere_or_garbled_reads_what_is_whole_and_says_where_it_stopped() {
    let (_out, file, whole) = six_hundred_logged();
    let count = |b: &[u8]| {
        let mut n = 0u64;
        let sum = scan(&file, b, |m| {
            if m.channel.topic == "/demo/sample" {
                n += 1;
            }
        });
        (n, sum)
    };
    let (all, sum) = count(&whole);
    assert_eq!(all, 600);
    assert!(sum.unwrap().chunks >= 3);
    // Cut at every 61st byte: never an error past the magic, never more
    // than a prefix, and the count only grows with the length.
    let mut prev = 0;
    let mut cut_mid_record = 0;
    for cut in (8..whole.len()).step_by(61) {
        let (n, sum) = count(&whole[..cut]);
        let sum = sum.unwrap();
        assert!(n >= prev && n <= all, "cut {cut}: {n} after {prev}");
        prev = n;
        // The data section ends before the summary does.
        assert!(!sum.finished || n == all, "cut {cut}");
        // The chunk headers give the first log time the messages do.
        assert_eq!(
            first_log_time(&file, &whole[..cut]).unwrap(),
            sum.first_log_time,
            "cut {cut}"
        );
        cut_mid_record += sum.truncated.is_some() as u32;
    }
    assert!(cut_mid_record > 0);
    // Flipped bytes: whatever comes out, no panic and no hang.
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..300 {
        let mut b = whole.clone();
        for _ in 0..4 {
            xorshift(&mut x);
            let at = 8 + (x as usize) % (b.len() - 8);
            b[at] ^= (x >> 32) as u8 | 1;
        }
        let _ = count(&b);
        let _ = first_log_time(&file, &b);
    }
}

#[test]
#[ignore = "needs python mcap: Python's mcap (pip install mcap)"]
fn an_independent_reader_agrees_on_a_file_cut_inside_its_last_chunk() {
    require_python_mcap(false);
    let (out, file, whole) = six_hundred_logged();
    let cut = out.path().join("cut.mcap");
    let at = whole.len() * 3 / 4;
    std::fs::write(&cut, &whole[..at]).unwrap();
    let mut n = 0u64;
    scan(&file, &whole[..at], |m| {
        if m.channel.topic == "/demo/sample" {
            n += 1;
        }
    })
    .unwrap();
    assert!(n > 0 && n < 600, "{n}");
    let v = python_counts(&cut, false);
    assert_eq!(v["counts"]["/demo/sample"].as_u64().unwrap_or(0), n, "{v}");
}

/// 600 messages logged in chunks of 4 KiB: the directory, the file and
/// its bytes.
fn six_hundred_logged() -> (tempfile::TempDir, PathBuf, Vec<u8>) {
    let shm = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let geom = ChannelGeometry::new(64, 256, 2);
    let (ch, _) =
        Channel::create(shm.path(), "/demo/sample", &geom, None, Path::new(PROC)).unwrap();
    ch.bind_type::<Sample>().unwrap();
    let mut s = section(2);
    s.chunk_size = ByteSize(4 << 10);
    let rec = start(shm.path(), out.path(), s, &["/demo/sample"]);
    let mut p = ch.publisher(Path::new(PROC)).unwrap();
    for i in 0..600u64 {
        p.publish_value(&Sample {
            seq: i,
            value: i as f64,
            flags: 3,
            reserved: 0,
        })
        .unwrap();
        if i % 50 == 0 {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    wait_logged(&rec, "/demo/sample", 600);
    rec.stop();
    let file = files(out.path()).remove(0);
    let whole = load(&file).unwrap();
    (out, file, whole)
}

/// A full disk stops the logger cleanly (its status says so) and never
/// holds up a publisher.
#[test]
#[ignore = "needs root: mounting a small tmpfs"]
fn a_full_disk_stops_the_logger_and_never_the_publisher() {
    let shm = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let mount = Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            "size=96k",
            "rtdeploy-full",
            out.path().to_str().unwrap(),
        ])
        .status()
        .expect("mount (util-linux)");
    assert!(mount.success(), "mount -t tmpfs: {mount}");
    struct Umount<'a>(&'a Path);
    impl Drop for Umount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(self.0).status();
        }
    }
    let _u = Umount(out.path());
    let geom = ChannelGeometry::new(4096, 64, 2);
    let (ch, _) = Channel::create(shm.path(), "/demo/big", &geom, None, Path::new(PROC)).unwrap();
    let mut s = section(1);
    s.types.clear();
    s.chunk_size = ByteSize(8 << 10);
    s.flush = Dur::from_millis(20);
    let rec = start(shm.path(), out.path(), s, &["/demo/big"]);
    let mut p = ch.publisher(Path::new(PROC)).unwrap();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let t = Instant::now();
    let mut published = 0u64;
    let state = loop {
        let buf = noise(&mut x, 4000);
        p.publish(&buf)
            .expect("a full log disk never refuses a publish");
        published += 1;
        std::thread::sleep(Duration::from_millis(1));
        let st = rec.status();
        if st.state != "recording" {
            break st.state;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "still recording: {st:?}"
        );
    };
    assert!(state.starts_with("stopped: disk full"), "{state}");
    // Publishing goes on after the logger stopped.
    for _ in 0..1000 {
        p.publish(&[1u8; 64]).unwrap();
    }
    let st = rec.stop();
    assert!(st.state.starts_with("stopped: disk full"), "{st:?}");
    eprintln!("{published} published before: {}", st.state);
}

/// A writer that is behind by more than `log.buffer` (here: any batch is
/// more than the buffer) makes the reader drop what it read; every dropped
/// message is a gap, in the status and in the file.
#[test]
fn messages_the_writer_cannot_take_are_gaps_not_silence() {
    let shm = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let geom = ChannelGeometry::new(64, 256, 2);
    let (ch, _) =
        Channel::create(shm.path(), "/demo/sample", &geom, None, Path::new(PROC)).unwrap();
    ch.bind_type::<Sample>().unwrap();
    let mut s = section(5);
    s.buffer = ByteSize(100);
    let rec = start(shm.path(), out.path(), s, &["/demo/sample"]);
    let sink = rec.sink();
    let mut p = ch.publisher(Path::new(PROC)).unwrap();
    for i in 0..300u64 {
        p.publish_value(&Sample {
            seq: i,
            value: 0.0,
            flags: 0,
            reserved: 0,
        })
        .unwrap();
        if i % 30 == 0 {
            sink.send("supervisor", None, "an event");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    wait_logged(&rec, "/demo/sample", 300);
    std::thread::sleep(Duration::from_millis(50));
    let st = rec.stop();
    let c = &st.channels["/demo/sample"];
    assert!(st.batches_dropped > 0, "{st:?}");
    assert_eq!(c.logged + c.gaps, 300, "{st:?}");
    assert!(c.gaps > 0, "{st:?}");
    assert_eq!(st.events_logged + st.events_dropped, 10, "{st:?}");
    // The last batch (at stop) goes through whatever its size: the file
    // holds what it logged and every gap.
    let f = files(out.path()).remove(0);
    let b = load(&f).unwrap();
    let sum = scan(&f, &b, |_| {}).unwrap();
    let logged = sum.channel("/demo/sample").map_or(0, |c| c.messages);
    assert_eq!(logged, c.logged, "{sum:?}");
    assert_eq!(sum.lost.get("/demo/sample"), Some(&c.gaps), "{sum:?}");
    let ev = sum.channel("/rtdeploy/events").map_or(0, |c| c.messages);
    assert_eq!(ev, st.events_logged);
}

/// The largest message a channel carries (64 MiB) is logged whole and
/// read back byte for byte, in a chunk of its own (chunks are 16 KiB
/// here: a message never splits).
#[test]
fn a_sixty_four_mib_message_is_logged_whole() {
    const SIZE: usize = controller::config::MAX_MESSAGE_SIZE as usize;
    let shm = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let geom = ChannelGeometry::new(SIZE as u64, 1, 1);
    let (ch, _) = Channel::create(shm.path(), "/camera/map", &geom, None, Path::new(PROC)).unwrap();
    // The default log.buffer (64 MiB) cannot take one such message with
    // its record: config check says so (below); this one can.
    let mut s = section(2);
    let mut problems = Vec::new();
    s.validate(&[("/camera/map", SIZE as u64)], &mut problems);
    assert!(
        problems
            .iter()
            .any(|(f, m)| f == "log.buffer" && m.contains("raise log.buffer")),
        "{problems:?}"
    );
    s.buffer = ByteSize(2 * SIZE as u64);
    let rec = start(shm.path(), out.path(), s, &["/camera/map"]);
    let mut p = ch.publisher(Path::new(PROC)).unwrap();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut sent = Vec::new();
    for _ in 0..2 {
        let m = noise(&mut x, SIZE);
        p.publish(&m).unwrap();
        sent.push(m);
        // Depth 1: the logger takes each before the next replaces it.
        wait_logged(&rec, "/camera/map", sent.len() as u64);
    }
    let c = rec.status().channels["/camera/map"].clone();
    assert_eq!((c.logged, c.gaps), (2, 0), "{c:?}");
    rec.stop();
    // Each message fills a file of the default rotate_size (64 MiB).
    let mut got = Vec::new();
    for file in files(out.path()) {
        let bytes = load(&file).unwrap();
        let sum = scan(&file, &bytes, |m| {
            if m.channel.topic == "/camera/map" {
                got.push(m.data.to_vec());
            }
        })
        .unwrap();
        assert!(sum.finished && sum.truncated.is_none(), "{sum:?}");
    }
    assert_eq!(got.len(), 2);
    for (i, (g, s)) in got.iter().zip(&sent).enumerate() {
        assert!(
            g == s,
            "message {i}: {} bytes read back, not the {} sent",
            g.len(),
            s.len()
        );
    }
}

/// A `log.types` declaration that is not the channel's type (a field
/// renamed: another layout hash) is not trusted: the channel is logged
/// raw, the file and the logger's status say why, naming both types.
#[test]
fn a_declaration_that_is_not_the_channels_type_is_logged_raw_and_said() {
    let shm = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let geom = ChannelGeometry::new(64, 16, 2);
    let (ch, _) =
        Channel::create(shm.path(), "/demo/sample", &geom, None, Path::new(PROC)).unwrap();
    ch.bind_type::<Sample>().unwrap();
    let mut s = section(5);
    let decl = s.types.get_mut("/demo/sample").unwrap();
    decl.fields[3] = "uint32 spare".into();
    let declared = decl.layout().unwrap().hash;
    let rec = start(shm.path(), out.path(), s, &["/demo/sample"]);
    let mut p = ch.publisher(Path::new(PROC)).unwrap();
    for i in 0..10u64 {
        p.publish_value(&Sample {
            seq: i,
            value: 1.0,
            flags: 0,
            reserved: 0,
        })
        .unwrap();
    }
    wait_logged(&rec, "/demo/sample", 10);
    let st = rec.stop();
    let problem = st.last_problem.clone().unwrap_or_default();
    let carried = <Sample as controller::ShmSafe>::LAYOUT_HASH;
    for part in [
        "log.types./demo/sample declares demo/msg/Sample".to_string(),
        format!("{declared:016x}"),
        format!("the channel carries Sample (layout hash {carried:016x})"),
    ] {
        assert!(problem.contains(&part), "{part:?} not in {problem:?}");
    }
    let fs = files(out.path());
    let bytes = load(&fs[0]).unwrap();
    let sum = scan(&fs[0], &bytes, |_| {}).unwrap();
    let c = sum.channel("/demo/sample").unwrap();
    assert_eq!(c.messages, 10);
    assert_eq!(c.message_encoding, "rtdeploy.raw");
    assert_eq!(c.schema_name, None);
    assert_eq!(
        c.metadata.get(logbook::file::META_TYPE_MISMATCH),
        Some(&problem)
    );
}
