//! The seed corpus of the `mcap_read` fuzz target, run as a test (CI runs
//! this; the fuzzer itself runs by hand: `cargo fuzz run mcap_read
//! fuzz/seeds/mcap_read`, see the README). Each seed goes through the
//! target's body, which asserts that the reader returns, within its bounds,
//! and says why it stopped in one short line.
//!
//! The seeds: files the logger's own writer makes (`logbook::file::LogFile`:
//! typed, raw, json, timing and the logger's gap and sender records, in
//! several chunks; finished and cut short), files Python's `mcap` writer
//! makes (`scripts/mcap-fuzz-seeds.py`: chunked and not, compressed and
//! not), and hand-built ones no writer makes (a CRC that does not match,
//! chunks that expand a thousandfold, an lz4 chunk, a chunk in a chunk).
//! `RTDEPLOY_WRITE_SEEDS=1 cargo test -p logbook --test fuzz_seeds` writes
//! the logger's and the hand-built ones; the Python ones are written by
//! the script. The test runs what it makes and every committed seed.

#[path = "../../../fuzz/fuzz_targets/mcap_body.rs"]
mod mcap_body;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use logbook::file::{ClockMap, LogFile, TopicSpec, GAPS_TOPIC, SENDERS_TOPIC, TIMING_ENCODING};
use logbook::schema::TypeDecl;

fn seed_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/mcap_read")
}

/// A file of the logger's writer: `chunk` bytes a chunk.
fn logger_file(chunk: u64) -> Vec<u8> {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("f.mcap");
    let clock = ClockMap {
        monotonic_ns: 1_000_000_000,
        realtime_ns: 1_796_000_000_000_000_000,
    };
    let mut f = LogFile::create(&path, chunk, "boot-seed", clock).unwrap();
    let imu = TypeDecl {
        name: "imu/Sample".into(),
        fields: vec![
            "uint64 seq".into(),
            "float64[3] accel".into(),
            "int32 temp".into(),
            "uint32 reserved".into(),
        ],
    };
    let spec = |topic: &str, layout, raw: &'static str| TopicSpec {
        topic: topic.into(),
        layout,
        raw_encoding: raw,
        metadata: BTreeMap::new(),
    };
    f.add(&spec("/imu/raw", Some(imu.layout().unwrap()), ""))
        .unwrap();
    f.add(&spec("/blob", None, "rtdeploy.raw")).unwrap();
    f.add(&spec(GAPS_TOPIC, None, "json")).unwrap();
    f.add(&spec(SENDERS_TOPIC, None, "json")).unwrap();
    f.add(&spec("/rtdeploy/timing/imu", None, TIMING_ENCODING))
        .unwrap();
    let mut scratch = Vec::new();
    for i in 0..120u64 {
        let t = 1_000_000_000 + i * 1_000_000;
        let mut imu = i.to_le_bytes().to_vec();
        for a in [0.5f64 * i as f64, -1.0, 9.81] {
            imu.extend_from_slice(&a.to_le_bytes());
        }
        imu.extend_from_slice(&(40i32 + i as i32 % 3).to_le_bytes());
        imu.extend_from_slice(&[0; 4]);
        f.write("/imu/raw", i as u32, t, &imu, &mut scratch)
            .unwrap();
        if i % 7 == 0 {
            f.write("/blob", i as u32, t, &[i as u8; 40], &mut scratch)
                .unwrap();
        }
        if i % 40 == 0 {
            let g = format!(r#"{{"channel":"/imu/raw","count":{}}}"#, i / 40 + 1);
            f.write(GAPS_TOPIC, i as u32, t, g.as_bytes(), &mut scratch)
                .unwrap();
            let s = format!(r#"{{"channel":"/imu/raw","index":{i},"pid":{}}}"#, 4242 + i);
            f.write(SENDERS_TOPIC, i as u32, t, s.as_bytes(), &mut scratch)
                .unwrap();
        }
        if i % 50 == 0 {
            // A timing report's bytes (its head: magic, pid, seq ...); the
            // rest of the layout as zeros.
            let mut r = vec![0u8; 512];
            r[..8].copy_from_slice(b"RTDTIME3");
            r[8..16].copy_from_slice(&4242u64.to_ne_bytes());
            r[16..24].copy_from_slice(&(i / 50 + 1).to_ne_bytes());
            f.write("/rtdeploy/timing/imu", i as u32, t, &r, &mut scratch)
                .unwrap();
        }
    }
    f.finish().unwrap();
    std::fs::read(path).unwrap()
}

fn record(op: u8, body: &[u8]) -> Vec<u8> {
    let mut r = vec![op];
    r.extend_from_slice(&(body.len() as u64).to_le_bytes());
    r.extend_from_slice(body);
    r
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn message(seq: u32, t: u64, data: &[u8]) -> Vec<u8> {
    let mut b = 1u16.to_le_bytes().to_vec();
    b.extend_from_slice(&seq.to_le_bytes());
    b.extend_from_slice(&t.to_le_bytes());
    b.extend_from_slice(&t.to_le_bytes());
    b.extend_from_slice(data);
    record(0x05, &b)
}

/// The magic, a header and channel 1 (`/v`, json).
fn head() -> Vec<u8> {
    let mut out = b"\x89MCAP0\r\n".to_vec();
    let mut h = Vec::new();
    string(&mut h, "");
    string(&mut h, "seed");
    out.extend(record(0x01, &h));
    let mut c = 1u16.to_le_bytes().to_vec();
    c.extend_from_slice(&0u16.to_le_bytes());
    string(&mut c, "/v");
    string(&mut c, "json");
    c.extend_from_slice(&0u32.to_le_bytes());
    out.extend(record(0x04, &c));
    out
}

fn chunk(records: &[u8], compression: &str, crc: u32) -> Vec<u8> {
    let data = match compression {
        "zstd" => zstd::bulk::compress(records, 19).unwrap(),
        _ => records.to_vec(),
    };
    let mut b = Vec::new();
    b.extend_from_slice(&1u64.to_le_bytes());
    b.extend_from_slice(&2u64.to_le_bytes());
    b.extend_from_slice(&(records.len() as u64).to_le_bytes());
    b.extend_from_slice(&crc.to_le_bytes());
    string(&mut b, compression);
    b.extend_from_slice(&(data.len() as u64).to_le_bytes());
    b.extend_from_slice(&data);
    record(0x06, &b)
}

fn messages(n: u32) -> Vec<u8> {
    (0..n)
        .flat_map(|i| message(i, 1 + u64::from(i), format!("{{\"v\":{i}}}").as_bytes()))
        .collect()
}

/// Every seed made here: (file name, bytes).
fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let logger = logger_file(4 << 10);
    let one_chunk = logger_file(1 << 20);
    let ten = messages(10);
    let crc = crc32fast::hash(&ten);
    let mut bad_crc = head();
    bad_crc.extend(chunk(&ten, "zstd", crc));
    bad_crc.extend(chunk(&ten, "zstd", crc ^ 1));
    bad_crc.extend(chunk(&ten, "", crc ^ 1));
    let mut expanding = head();
    let big = message(0, 1, &[b' '; 1000]).repeat(1000);
    for _ in 0..20 {
        expanding.extend(chunk(&big, "zstd", 0));
    }
    let mut lz4 = head();
    lz4.extend(chunk(&ten, "lz4", 0));
    let mut nested = head();
    nested.extend(chunk(&chunk(&ten, "", 0), "", 0));
    let mut no_chunks = head();
    no_chunks.extend(ten.clone());
    no_chunks.extend(record(0x0F, &0u32.to_le_bytes()));
    vec![
        ("logger-chunks", logger.clone()),
        ("logger-cut", logger[..logger.len() * 2 / 3].to_vec()),
        ("logger-one-chunk", one_chunk),
        ("hand-bad-crc", bad_crc),
        ("hand-expanding", expanding),
        ("hand-lz4", lz4),
        ("hand-chunk-in-chunk", nested),
        ("hand-no-chunks", no_chunks),
    ]
}

#[test]
fn the_mcap_seed_corpus_runs_clean() {
    let made = seeds();
    if std::env::var_os(units::env::WRITE_SEEDS).is_some() {
        std::fs::create_dir_all(seed_dir()).unwrap();
        for (name, bytes) in &made {
            std::fs::write(seed_dir().join(name), bytes).unwrap();
        }
    }
    for (name, bytes) in &made {
        println!("made seed {name} ({} bytes)", bytes.len());
        mcap_body::run(bytes);
    }
    let mut names = Vec::new();
    for e in std::fs::read_dir(seed_dir()).unwrap() {
        let e = e.unwrap();
        let data = std::fs::read(e.path()).unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        println!("seed {name}");
        mcap_body::run(&data);
        names.push(name);
    }
    for (name, _) in &made {
        assert!(
            names.iter().any(|n| n == name),
            "seed {name} is not committed (RTDEPLOY_WRITE_SEEDS=1 writes it)"
        );
    }
    assert!(
        names.iter().filter(|n| n.starts_with("python-")).count() >= 3,
        "the Python seeds are missing (scripts/mcap-fuzz-seeds.py writes them): {names:?}"
    );
}

#[test]
fn the_seeds_read_as_their_makers_meant() {
    use logbook::read::scan;
    let p = Path::new("seed");
    let all = seeds();
    let get = |n: &str| &all.iter().find(|(name, _)| *name == n).unwrap().1;
    let s = scan(p, get("logger-chunks"), |_| {}).unwrap();
    assert!(s.finished && s.truncated.is_none(), "{s:?}");
    assert!(s.chunks >= 3, "{}", s.chunks);
    assert_eq!(s.channel("/imu/raw").unwrap().messages, 120);
    assert_eq!(s.lost["/imu/raw"], 1 + 2 + 3);
    let s = scan(p, get("hand-bad-crc"), |_| {}).unwrap();
    assert_eq!(s.messages, 10);
    assert!(
        s.truncated
            .as_deref()
            .unwrap()
            .starts_with("chunk 2 (at byte "),
        "{:?}",
        s.truncated
    );
    let s = scan(p, get("hand-expanding"), |_| {}).unwrap();
    assert!(
        s.truncated.as_deref().unwrap().contains("would take"),
        "{s:?}"
    );
    let s = scan(p, get("hand-lz4"), |_| {}).unwrap();
    assert!(s.truncated.as_deref().unwrap().contains("`lz4`"), "{s:?}");
    let s = scan(p, get("hand-chunk-in-chunk"), |_| {}).unwrap();
    assert!(
        s.truncated
            .as_deref()
            .unwrap()
            .contains("a chunk inside a chunk"),
        "{s:?}"
    );
    let s = scan(p, get("hand-no-chunks"), |_| {}).unwrap();
    assert!(s.finished && s.messages == 10, "{s:?}");
}
