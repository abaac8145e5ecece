//! Timing reports of the earlier binary layouts (`RTDTIME2`, published by
//! controllers built against the runtime before the median and the
//! since-start figures, and `RTDTIME3`, before wake classes) are read back
//! with what they carry; a layout the reader does not know is named as
//! such. The old layouts' bytes are built here from their field lists, not
//! from the runtime's own definitions of them.

use std::path::Path;

use controller::channel::{Channel, ChannelGeometry};
use controller::timing_report::{
    read_latest, timing_channel_name, timing_geometry, EntryKind, RawReport, TimingReadError,
};

const PROC: &str = "/proc";

/// The previous layout: a 120-byte head (magic, pid, seq, time_ns,
/// period_ns, backend, process[64], entries), then 32 entries of 176 bytes
/// (kind, name[48], count, latency min/avg/p99/max, handler avg/p99/max,
/// eagain, lost, missed, errors, total, healed, faults), all little-endian
/// u64 on the machines we run on.
const V2_HEAD: usize = 120;
const V2_ENTRY: usize = 176;
const V2_BYTES: usize = V2_HEAD + 32 * V2_ENTRY;
/// `RTDTIME3`: the same head, entries of 208 bytes (the 176 of `RTDTIME2`,
/// then latency p50, since-start p50, p99 and max).
const V3_ENTRY: usize = V2_ENTRY + 32;
const V3_BYTES: usize = V2_HEAD + 32 * V3_ENTRY;

struct V2Entry<'a> {
    kind: u64,
    name: &'a str,
    /// count, latency min, avg, p99, max, handler avg, p99, max, eagain,
    /// lost, missed, errors, total, healed, faults
    figures: [u64; 15],
}

fn put(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_ne_bytes());
}

fn v2_bytes(pid: u64, seq: u64, process: &str, entries: &[V2Entry]) -> Vec<u8> {
    let mut b = vec![0u8; V2_BYTES];
    b[..8].copy_from_slice(b"RTDTIME2");
    put(&mut b, 8, pid);
    put(&mut b, 16, seq);
    put(&mut b, 24, 123_456_789);
    put(&mut b, 32, 1_000_000_000);
    put(&mut b, 40, 2); // futex_waitv
    b[48..48 + process.len()].copy_from_slice(process.as_bytes());
    put(&mut b, 112, entries.len() as u64);
    for (i, e) in entries.iter().enumerate() {
        let at = V2_HEAD + i * V2_ENTRY;
        put(&mut b, at, e.kind);
        b[at + 8..at + 8 + e.name.len()].copy_from_slice(e.name.as_bytes());
        for (j, v) in e.figures.iter().enumerate() {
            put(&mut b, at + 56 + 8 * j, *v);
        }
    }
    b
}

/// A timing channel of `process` with slots for `payload` bytes, as a
/// loop of that layout creates it.
fn channel_for(dir: &Path, process: &str, payload: usize) -> Channel {
    let g = ChannelGeometry::new(payload as u64, 4, 2).with_subscribers(4);
    Channel::create(
        dir,
        &timing_channel_name(process),
        &g,
        None,
        Path::new(PROC),
    )
    .unwrap()
    .0
}

fn publish(ch: &Channel, bytes: &[u8]) {
    let mut p = ch.publisher(Path::new(PROC)).unwrap();
    p.publish(bytes).unwrap();
}

#[test]
fn a_report_of_the_previous_layout_is_read_with_what_it_carries() {
    let dir = tempfile::tempdir().unwrap();
    let ch = channel_for(dir.path(), "old", V2_BYTES);
    // Nothing published yet on an old channel: nothing to read, no error.
    assert!(read_latest(dir.path(), "old").unwrap().is_none());
    let figures = [
        1000, 2_000, 5_000, 9_000, 40_000, 300, 700, 900, 4, 5, 6, 7, 12_000, 8, 9,
    ];
    publish(
        &ch,
        &v2_bytes(
            4242,
            17,
            "old",
            &[
                V2Entry {
                    kind: 1,
                    name: "/imu",
                    figures,
                },
                V2Entry {
                    kind: 3,
                    name: "/cmd",
                    figures: [500, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 6_000, 0, 0],
                },
            ],
        ),
    );
    let r = read_latest(dir.path(), "old").unwrap().unwrap();
    assert_eq!(r.layout, 2);
    assert_eq!((r.pid, r.seq, r.process.as_str()), (4242, 17, "old"));
    assert_eq!(
        (r.period_ns, r.backend.as_str()),
        (1_000_000_000, "futex_waitv")
    );
    assert_eq!(r.entries.len(), 2);
    let e = &r.entries[0];
    assert_eq!((e.kind, e.name.as_str()), (EntryKind::Watcher, "/imu"));
    assert_eq!(
        (
            e.count,
            e.latency_min_ns,
            e.latency_avg_ns,
            e.latency_p99_ns,
            e.latency_max_ns
        ),
        (1000, 2_000, 5_000, 9_000, 40_000)
    );
    assert_eq!(
        (e.handler_avg_ns, e.handler_p99_ns, e.handler_max_ns),
        (300, 700, 900)
    );
    assert_eq!(
        (e.eagain, e.lost, e.missed, e.errors, e.total, e.healed, e.faults),
        (4, 5, 6, 7, 12_000, 8, 9)
    );
    // What the old layout does not carry is absent, not zero.
    assert_eq!(e.latency_p50_ns, None);
    assert_eq!(
        (
            e.since_start_latency_p50_ns,
            e.since_start_latency_p99_ns,
            e.since_start_latency_max_ns
        ),
        (None, None, None)
    );
    assert_eq!(
        (r.entries[1].kind, r.entries[1].total),
        (EntryKind::Sender, 6_000)
    );
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["layout"], 2);
    assert_eq!(
        json["entries"][0]["latency_p50_ns"],
        serde_json::Value::Null
    );

    // The controller is rebuilt: its loop replaces the old channel with
    // one of the current layout, which reads as such.
    drop(ch);
    let (ch, _) = Channel::create(
        dir.path(),
        &timing_channel_name("old"),
        &timing_geometry(),
        None,
        Path::new(PROC),
    )
    .unwrap();
    let mut raw = RawReport {
        pid: 4243,
        seq: 1,
        class: 1,
        ..RawReport::default()
    };
    raw.entries = 1;
    raw.entry[0].kind = 2;
    raw.entry[0].latency_p50 = 3_000;
    raw.entry[0].since_start_latency_max = 77_000;
    raw.entry[0].cross_class = 12;
    raw.entry[0].cross_class_max = 900_000;
    ch.publisher(Path::new(PROC))
        .unwrap()
        .publish_value(&raw)
        .unwrap();
    let r = read_latest(dir.path(), "old").unwrap().unwrap();
    assert_eq!((r.layout, r.pid), (4, 4243));
    assert_eq!(r.class, Some(controller::WakeClass::RealTime));
    assert_eq!(r.entries[0].latency_p50_ns, Some(3_000));
    assert_eq!(r.entries[0].since_start_latency_max_ns, Some(77_000));
    assert_eq!(
        (r.entries[0].cross_class, r.entries[0].cross_class_max_ns),
        (Some(12), Some(900_000))
    );
}

#[test]
fn a_report_of_the_layout_before_wake_classes_is_read_with_what_it_carries() {
    let dir = tempfile::tempdir().unwrap();
    let ch = channel_for(dir.path(), "v3", V3_BYTES);
    let mut b = vec![0u8; V3_BYTES];
    b[..8].copy_from_slice(b"RTDTIME3");
    put(&mut b, 8, 77);
    put(&mut b, 16, 3);
    put(&mut b, 32, 1_000_000_000);
    put(&mut b, 40, 1); // io_uring-futex
    b[48..50].copy_from_slice(b"v3");
    put(&mut b, 112, 1);
    let at = V2_HEAD;
    put(&mut b, at, 1);
    b[at + 8..at + 12].copy_from_slice(b"/imu");
    for j in 0..15 {
        put(&mut b, at + 56 + 8 * j, 100 + j as u64);
    }
    for (j, v) in [4_000u64, 5_000, 6_000, 7_000].iter().enumerate() {
        put(&mut b, at + V2_ENTRY + 8 * j, *v);
    }
    publish(&ch, &b);
    let r = read_latest(dir.path(), "v3").unwrap().unwrap();
    assert_eq!((r.layout, r.pid, r.seq), (3, 77, 3));
    assert_eq!(r.backend, "io_uring-futex");
    assert_eq!(r.class, None);
    let e = &r.entries[0];
    assert_eq!(
        (e.kind, e.name.as_str(), e.count),
        (EntryKind::Watcher, "/imu", 100)
    );
    assert_eq!(e.latency_p50_ns, Some(4_000));
    assert_eq!(
        (
            e.since_start_latency_p50_ns,
            e.since_start_latency_p99_ns,
            e.since_start_latency_max_ns
        ),
        (Some(5_000), Some(6_000), Some(7_000))
    );
    assert_eq!((e.healed, e.faults), (113, 114));
    // What the layout does not carry is absent, not zero.
    assert_eq!(
        (e.cross_class, e.cross_class_p99_ns, e.cross_class_max_ns),
        (None, None, None)
    );
}

#[test]
fn a_layout_the_reader_does_not_know_is_named_so() {
    let dir = tempfile::tempdir().unwrap();
    // A channel sized for a report this reader has never seen.
    let ch = channel_for(dir.path(), "future", 9_000);
    publish(&ch, &[7u8; 9_000]);
    let e = read_latest(dir.path(), "future").unwrap_err();
    assert!(
        matches!(e, TimingReadError::UnknownGeometry { .. }),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(msg.contains("does not know"), "{msg}");
    assert!(msg.contains("RTDTIME4, RTDTIME3 and RTDTIME2"), "{msg}");

    // The current geometry, another layout's magic.
    let ch = channel_for(dir.path(), "magic", std::mem::size_of::<RawReport>());
    let raw = RawReport {
        magic: u64::from_le_bytes(*b"RTDTIME5"),
        ..RawReport::default()
    };
    ch.publisher(Path::new(PROC))
        .unwrap()
        .publish_value(&raw)
        .unwrap();
    let msg = read_latest(dir.path(), "magic").unwrap_err().to_string();
    assert!(
        msg.contains("a timing report in layout RTDTIME5, which this reader does not know"),
        "{msg}"
    );

    // The previous layout's geometry holding bytes that are no report.
    let ch = channel_for(dir.path(), "junk", V2_BYTES);
    publish(&ch, &vec![0xa5u8; V2_BYTES]);
    let msg = read_latest(dir.path(), "junk").unwrap_err().to_string();
    assert!(
        msg.contains("5752 bytes that are not a timing report"),
        "{msg}"
    );
}
