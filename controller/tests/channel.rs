//! Channel behaviour against the real kernel: shared mappings, futexes,
//! many threads. Each test uses its own temporary shm directory.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use controller::channel::{
    channel_path, ChannelOpenError, CreateOutcome, PublishError, LAYOUT_VERSION,
};
use controller::{Channel, ChannelGeometry};

const PROC: &str = "/proc";

fn checksum(words: &[u64]) -> u64 {
    words.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, w| {
        (h ^ w).wrapping_mul(0x1000_0000_01b3)
    })
}

/// A message: publisher id, sequence, length-varying filler, checksum.
fn encode(pubid: u64, seq: u64, out: &mut [u64; 16]) -> usize {
    let n = 3 + (seq % 13) as usize;
    out[0] = pubid;
    out[1] = seq;
    for (k, w) in out[2..n - 1].iter_mut().enumerate() {
        *w = seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (k as u64) ^ (pubid << 56);
    }
    out[n - 1] = checksum(&out[..n - 1]);
    n
}

fn words_of(data: &[u8]) -> Vec<u64> {
    data.chunks_exact(8)
        .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn create_open_publish_read() {
    let dir = tempfile::tempdir().unwrap();
    let geom = ChannelGeometry::new(64, 8, 2);
    let (ch, outcome) =
        Channel::create(dir.path(), "/imu/raw", &geom, None, Path::new(PROC)).unwrap();
    assert_eq!(outcome, CreateOutcome::Created);
    let path = dir.path().join(format!("imu/raw.v{LAYOUT_VERSION}"));
    assert_eq!(ch.path(), path);
    let (mode, _) = controller::channel::file_mode(&path).unwrap();
    assert_eq!(mode, 0o660);

    let mut p = ch.publisher(Path::new(PROC)).unwrap();
    let other = Channel::open(dir.path(), "/imu/raw").unwrap();
    let mut s = other.subscriber(Path::new(PROC)).unwrap();
    assert!(s.next_message().unwrap().is_none());
    for i in 0..5u64 {
        let r = p.publish(&i.to_ne_bytes()).unwrap();
        assert_eq!(r.index, i);
        assert!(!r.woke);
    }
    for i in 0..5u64 {
        let m = s.next_message().unwrap().unwrap();
        assert_eq!(m.index, i);
        assert_eq!(m.value::<u64>(), Some(i));
        assert_eq!(m.sender_pid, std::process::id());
        assert_eq!(m.lost_before, 0);
        assert!(m.send_time_ns > 0);
    }
    assert!(s.next_message().unwrap().is_none());
    // Overrun: 20 more into a ring of 8: the subscriber learns it lost 12.
    for i in 0..20u64 {
        p.publish(&i.to_ne_bytes()).unwrap();
    }
    let m = s.next_message().unwrap().unwrap();
    assert_eq!(m.lost_before, 12);
    assert_eq!(m.index, 17);
    assert_eq!(s.lost(), 12);
    // Too large.
    assert_eq!(
        p.publish(&[0u8; 65]),
        Err(PublishError::TooLarge { len: 65, max: 64 })
    );
    // latest() jumps to the newest.
    p.publish(&99u64.to_ne_bytes()).unwrap();
    let mut f = other.reader();
    assert_eq!(f.latest().unwrap().unwrap().value::<u64>(), Some(99));
    assert!(f.latest().unwrap().is_none());
}

#[test]
fn retention_refuses_overwriting_young_messages() {
    let dir = tempfile::tempdir().unwrap();
    let geom = ChannelGeometry::new(8, 4, 1).with_retention(Duration::from_secs(30));
    let (ch, _) = Channel::create(dir.path(), "/r", &geom, None, Path::new(PROC)).unwrap();
    let mut p = ch.publisher(Path::new(PROC)).unwrap();
    for i in 0..4u64 {
        p.publish(&i.to_ne_bytes()).unwrap();
    }
    match p.publish(&4u64.to_ne_bytes()) {
        Err(PublishError::WouldOverwrite {
            index,
            retention_ns,
            ..
        }) => {
            assert_eq!(index, 4);
            assert_eq!(retention_ns, 30_000_000_000);
        }
        other => panic!("expected WouldOverwrite, got {other:?}"),
    }
    assert_eq!(p.errors(), 1);
    assert_eq!(ch.next_index(), 4);
}

#[test]
fn wrong_version_and_size_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let geom = ChannelGeometry::new(64, 8, 1);
    let (_ch, _) = Channel::create(dir.path(), "/v", &geom, None, Path::new(PROC)).unwrap();
    let path = channel_path(dir.path(), "/v");

    // Another geometry than expected.
    let other = ChannelGeometry::new(128, 8, 1);
    match Channel::open_expect(dir.path(), "/v", &other) {
        Err(ChannelOpenError::Mismatch {
            field: "slot size",
            found: 128,
            expected: 192,
            ..
        }) => {}
        r => panic!("expected a slot size mismatch, got {r:?}"),
    }

    // The next layout version in the header.
    let next = LAYOUT_VERSION + 1;
    let mut bytes = std::fs::read(&path).unwrap();
    let orig = bytes.clone();
    bytes[8] = next as u8;
    std::fs::write(&path, &bytes).unwrap();
    let e = Channel::open(dir.path(), "/v").unwrap_err();
    assert!(
        matches!(e, ChannelOpenError::WrongVersion { found, .. } if found == u64::from(next)),
        "{e}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("layout version {next}"))
            && msg.contains(&format!("v.v{LAYOUT_VERSION}")),
        "{msg}"
    );

    // Truncated file.
    std::fs::write(&path, &orig[..orig.len() - 64]).unwrap();
    let e = Channel::open(dir.path(), "/v").unwrap_err();
    assert!(matches!(e, ChannelOpenError::WrongFileSize { .. }), "{e}");

    // Not a channel at all.
    std::fs::write(&path, vec![0u8; 8192]).unwrap();
    assert!(matches!(
        Channel::open(dir.path(), "/v"),
        Err(ChannelOpenError::BadMagic { .. })
    ));

    // A temporary left by a creator that died mid-create is swept.
    let stale = dir
        .path()
        .join(format!("v.v{LAYOUT_VERSION}.tmp.{}", (1u32 << 22) + 3));
    std::fs::write(&stale, b"half").unwrap();

    // create() replaces the damaged file and says why.
    let (_ch, outcome) = Channel::create(dir.path(), "/v", &geom, None, Path::new(PROC)).unwrap();
    assert!(
        matches!(outcome, CreateOutcome::Replaced { .. }),
        "{outcome:?}"
    );
    // ... and reuses a good one.
    let (_ch, outcome) = Channel::create(dir.path(), "/v", &geom, None, Path::new(PROC)).unwrap();
    assert!(
        matches!(outcome, CreateOutcome::Reused { .. }),
        "{outcome:?}"
    );
}

#[test]
fn many_publishers_many_subscribers() {
    const PUBS: u64 = 4;
    const SUBS: usize = 3;
    const PER_PUB: u64 = 20_000;
    let dir = tempfile::tempdir().unwrap();
    let geom = ChannelGeometry::new(128, 64, PUBS as u32);
    let (ch, _) = Channel::create(dir.path(), "/mpmc", &geom, None, Path::new(PROC)).unwrap();
    let total = PUBS * PER_PUB;
    let deadline = Instant::now() + Duration::from_secs(30);
    let start = Arc::new(AtomicBool::new(false));

    let mut subs = Vec::new();
    for _ in 0..SUBS {
        let mut s = ch.subscriber(Path::new(PROC)).unwrap();
        subs.push(std::thread::spawn(move || {
            let mut last_seq = [None::<u64>; PUBS as usize];
            let mut seen = 0u64;
            let mut expect_index = 0u64;
            while expect_index < total {
                assert!(
                    Instant::now() < deadline,
                    "subscriber hung at index {expect_index}"
                );
                match s.next_message().unwrap() {
                    Some(m) => {
                        assert_eq!(m.index, expect_index + m.lost_before, "out of order");
                        expect_index = m.index + 1;
                        let w = words_of(m.data);
                        assert_eq!(
                            w[w.len() - 1],
                            checksum(&w[..w.len() - 1]),
                            "torn message {}",
                            m.index
                        );
                        let p = w[0] as usize;
                        if let Some(l) = last_seq[p] {
                            assert!(w[1] > l, "publisher {p} seq {} after {l}", w[1]);
                        }
                        last_seq[p] = Some(w[1]);
                        seen += 1;
                    }
                    None => s.wait(Some(Duration::from_millis(50))),
                }
            }
            (seen, s.lost())
        }));
    }
    let mut pubs = Vec::new();
    for id in 0..PUBS {
        let mut p = ch.publisher(Path::new(PROC)).unwrap();
        let start = start.clone();
        pubs.push(std::thread::spawn(move || {
            while !start.load(Ordering::Acquire) {
                std::hint::spin_loop();
            }
            let mut buf = [0u64; 16];
            for seq in 0..PER_PUB {
                let n = encode(id, seq, &mut buf);
                let bytes: Vec<u8> = buf[..n].iter().flat_map(|w| w.to_ne_bytes()).collect();
                p.publish(&bytes).unwrap();
            }
        }));
    }
    start.store(true, Ordering::Release);
    for p in pubs {
        p.join().unwrap();
    }
    assert_eq!(ch.next_index(), total);
    for s in subs {
        let (seen, lost) = s.join().unwrap();
        assert_eq!(seen + lost, total, "seen {seen} + lost {lost}");
        assert!(seen > 0);
    }
}

/// A publisher stopped dead after each step of a publish (as SIGKILL would
/// leave it) is reclaimed with every slot in exactly one place; the message
/// it was placing is delivered whole exactly when its ring swap happened,
/// and the queue index is helped along past it.
#[test]
fn recovery_after_death_at_every_publish_step() {
    use controller::channel::PublishStep::*;
    // A pid above the kernel's maximum (2^22): never a live process.
    const DEAD_PID: u32 = (1 << 22) + 7;
    for step in [
        Stamped,
        SwappingRecorded,
        Swapped,
        EvictedInvalidated,
        ScratchRecorded,
        RecordCleared,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let geom = ChannelGeometry::new(32, 4, 2);
        let (ch, _) = Channel::create(dir.path(), "/steps", &geom, None, Path::new(PROC)).unwrap();
        let mut good = ch.publisher(Path::new(PROC)).unwrap();
        let mut victim = ch.publisher(Path::new(PROC)).unwrap();
        let mut r = ch.reader();
        // Fill more than a lap so the victim evicts a real message.
        for i in 0..6u64 {
            good.publish(&[i; 4].map(|v| v.to_ne_bytes()).concat())
                .unwrap();
        }
        while r.next_message().unwrap().is_some() {}
        let placed = victim
            .publish_stopping_after(&[77u64; 4].map(|v| v.to_ne_bytes()).concat(), step)
            .unwrap();
        assert!(placed.is_none(), "{step:?}: publish should have stopped");
        victim.abandon_as_dead(DEAD_PID);
        assert!(
            ch.check_slot_ownership().is_err() || matches!(step, Stamped | RecordCleared),
            "{step:?}"
        );

        let rep = ch.recover(Path::new(PROC));
        assert_eq!(rep.publishers, 1, "{step:?}");
        ch.check_slot_ownership()
            .unwrap_or_else(|e| panic!("{step:?}: {e}"));
        let swapped = !matches!(step, Stamped | SwappingRecorded);
        assert_eq!(ch.next_index(), if swapped { 7 } else { 6 }, "{step:?}");
        if swapped {
            let m = r.next_message().unwrap().unwrap();
            assert_eq!(m.index, 6);
            assert_eq!(m.value::<[u64; 4]>(), Some([77; 4]), "{step:?}");
        }
        assert!(r.next_message().unwrap().is_none());

        // The reclaimed entry and the survivor keep publishing, laps around
        // the ring, and every message reads back whole and in order.
        let mut again = ch.publisher(Path::new(PROC)).unwrap();
        for i in 0..20u64 {
            let p = if i % 2 == 0 { &mut good } else { &mut again };
            p.publish(&[100 + i; 4].map(|v| v.to_ne_bytes()).concat())
                .unwrap();
            let m = r.next_message().unwrap().unwrap();
            assert_eq!(m.value::<[u64; 4]>(), Some([100 + i; 4]), "{step:?}");
        }
        ch.check_slot_ownership()
            .unwrap_or_else(|e| panic!("{step:?} after more publishes: {e}"));
    }
}

/// As above, but other publishers go around the ring several times between
/// the death and the recovery, so the recovery cannot read the outcome off
/// the ring position and must use the slot stamps and the others' records.
#[test]
fn recovery_after_death_and_laps_of_other_publishes() {
    use controller::channel::PublishStep::*;
    const DEAD_PID: u32 = (1 << 22) + 9;
    for step in [
        Stamped,
        SwappingRecorded,
        Swapped,
        EvictedInvalidated,
        ScratchRecorded,
        RecordCleared,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let geom = ChannelGeometry::new(32, 4, 3);
        let (ch, _) = Channel::create(dir.path(), "/laps", &geom, None, Path::new(PROC)).unwrap();
        let mut good = ch.publisher(Path::new(PROC)).unwrap();
        let mut victim = ch.publisher(Path::new(PROC)).unwrap();
        for i in 0..5u64 {
            good.publish(&[i; 4].map(|v| v.to_ne_bytes()).concat())
                .unwrap();
        }
        assert!(victim
            .publish_stopping_after(&[77u64; 4].map(|v| v.to_ne_bytes()).concat(), step)
            .unwrap()
            .is_none());
        victim.abandon_as_dead(DEAD_PID);
        let mut r = ch.reader();
        r.skip_to_end();
        for i in 0..13u64 {
            good.publish(&[200 + i; 4].map(|v| v.to_ne_bytes()).concat())
                .unwrap();
        }
        let rep = ch.recover(Path::new(PROC));
        assert_eq!(rep.publishers, 1, "{step:?}");
        ch.check_slot_ownership()
            .unwrap_or_else(|e| panic!("{step:?}: {e}"));
        let mut again = ch.publisher(Path::new(PROC)).unwrap();
        let mut third = ch.publisher(Path::new(PROC)).unwrap();
        for i in 0..30u64 {
            let p = [&mut good, &mut again, &mut third];
            let [a, b, c] = p;
            let p = match i % 3 {
                0 => a,
                1 => b,
                _ => c,
            };
            p.publish(&[300 + i; 4].map(|v| v.to_ne_bytes()).concat())
                .unwrap();
            let m = r.latest().unwrap().unwrap();
            assert_eq!(m.value::<[u64; 4]>(), Some([300 + i; 4]), "{step:?}");
        }
        ch.check_slot_ownership()
            .unwrap_or_else(|e| panic!("{step:?} after more publishes: {e}"));
    }
}

#[test]
fn a_message_read_in_place_is_returned_only_if_its_slot_still_held_it() {
    let dir = tempfile::tempdir().unwrap();
    let geom = ChannelGeometry::new(64, 4, 2);
    let (ch, _) = Channel::create(dir.path(), "/in_place", &geom, None, Path::new(PROC)).unwrap();
    let mut p = ch.publisher(Path::new(PROC)).unwrap();
    let mut sub = ch.subscriber(Path::new(PROC)).unwrap();
    let mut msg = [0u64; 3];
    msg[2] = 0xfeed;
    p.publish(&bytes_of(&msg)).unwrap();

    // The view: words up to the size, nothing past it.
    let (meta, (len, words, past)) = sub
        .next_in_place(|v| {
            let mut w = [0u64; 8];
            let n = v.copy_words(1, &mut w);
            (v.len(), (n, w[0], w[1]), v.word(3))
        })
        .unwrap()
        .unwrap();
    assert_eq!((meta.index, meta.lost_before, meta.size), (0, 0, 24));
    assert_eq!((len, words, past), (24, (2, 0, 0xfeed), None));
    assert!(sub.next_in_place(|v| v.word(0)).unwrap().is_none());

    // Eight more published while the body reads message 1: its slot is
    // recycled (four in the queue), so what the body made of it is thrown
    // away, the body runs again on the oldest message still there (6, the
    // ring moved on meanwhile) and everything before is counted lost.
    msg[0] = 1;
    p.publish(&bytes_of(&msg)).unwrap();
    let mut calls = 0;
    let (meta, first) = sub
        .next_in_place(|v| {
            calls += 1;
            let first = v.word(0).unwrap();
            if calls == 1 {
                for k in 2..=9u64 {
                    p.publish(&bytes_of(&[k, 0, 0])).unwrap();
                }
            }
            first
        })
        .unwrap()
        .unwrap();
    assert_eq!(calls, 2);
    assert_eq!((meta.index, first), (6, 6));
    assert_eq!(meta.lost_before, 5, "{meta:?}");
    assert_eq!(sub.lost(), 5);
}

fn bytes_of(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_ne_bytes()).collect()
}
