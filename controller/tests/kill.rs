//! Publishers SIGKILLed mid-publish, hundreds of times, while others keep
//! publishing: no subscriber hangs and no torn message is delivered.
//!
//! The victims are this test binary re-executed in publisher mode
//! (`RTDEPLOY_KILL_CHILD=<shm dir>`), so nothing is forked from a
//! multi-threaded process.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use controller::{Channel, ChannelGeometry};

const PROC: &str = "/proc";
const NAME: &str = "/kill/test";
const KILLS: usize = 300;

fn checksum(words: &[u64]) -> u64 {
    words.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, w| {
        (h ^ w).wrapping_mul(0x1000_0000_01b3)
    })
}

fn publish_forever(dir: &Path, id: u64, stop: Option<&AtomicBool>) -> u64 {
    let ch = Channel::open(dir, NAME).unwrap();
    let mut p = ch.publisher(Path::new(PROC)).unwrap();
    let mut buf = [0u64; 16];
    let mut bytes = [0u8; 128];
    let mut seq = 0u64;
    loop {
        if let Some(s) = stop {
            if s.load(Ordering::Relaxed) {
                return seq;
            }
        }
        let n = 3 + (seq % 13) as usize;
        buf[0] = id;
        buf[1] = seq;
        for (k, w) in buf[2..n - 1].iter_mut().enumerate() {
            *w = seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ k as u64 ^ id;
        }
        buf[n - 1] = checksum(&buf[..n - 1]);
        for (k, w) in buf[..n].iter().enumerate() {
            bytes[k * 8..k * 8 + 8].copy_from_slice(&w.to_ne_bytes());
        }
        p.publish(&bytes[..n * 8]).unwrap();
        seq += 1;
        if stop.is_some() && seq % 64 == 0 {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// The victim's body: only runs when re-executed by the test below.
#[test]
fn kill_child_entry() {
    if let Ok(dir) = std::env::var(units::env::KILL_CHILD) {
        publish_forever(&PathBuf::from(dir), 1000 + std::process::id() as u64, None);
    }
}

#[test]
fn publishers_killed_mid_publish() {
    let dir = tempfile::tempdir().unwrap();
    let geom = ChannelGeometry::new(128, 256, 6);
    let (ch, _) = Channel::create(dir.path(), NAME, &geom, None, Path::new(PROC)).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // Set once every publisher is stopped and the channel swept: then the
    // subscribers drain to the end and report.
    let done = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + Duration::from_secs(40);

    let mut steady = Vec::new();
    for id in 0..2u64 {
        let d = dir.path().to_path_buf();
        let stop = stop.clone();
        steady.push(std::thread::spawn(move || {
            publish_forever(&d, id, Some(&stop))
        }));
    }
    let mut subs = Vec::new();
    for _ in 0..2 {
        let mut s = ch.subscriber(Path::new(PROC)).unwrap();
        let stop = done.clone();
        let first = s.next_index();
        subs.push(std::thread::spawn(move || {
            let (mut seen, mut victims_seen) = (0u64, 0u64);
            loop {
                assert!(
                    Instant::now() < deadline,
                    "subscriber hung at index {}",
                    s.next_index()
                );
                let got = match s.next_message().unwrap() {
                    Some(m) => {
                        let w: Vec<u64> = m
                            .data
                            .chunks_exact(8)
                            .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
                            .collect();
                        assert!(w.len() >= 3, "short message {}", m.index);
                        assert_eq!(
                            w[w.len() - 1],
                            checksum(&w[..w.len() - 1]),
                            "torn message {}",
                            m.index
                        );
                        seen += 1;
                        if w[0] >= 1000 {
                            victims_seen += 1;
                        }
                        true
                    }
                    None => false,
                };
                if !got {
                    if stop.load(Ordering::Acquire) && !s.has_new() {
                        return (seen, s.lost(), victims_seen, first);
                    }
                    s.wait(Some(Duration::from_millis(20)));
                }
            }
        }));
    }

    let exe = std::env::current_exe().unwrap();
    let mut rng = 0x1234_5678u64;
    let mut kills = 0;
    for _ in 0..KILLS {
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "kill_child_entry",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(units::env::KILL_CHILD, dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        // Let it start (exec + attach, ~1-3 ms) and publish for a while.
        std::thread::sleep(Duration::from_micros(2_000 + rng % 3_000));
        child.kill().unwrap();
        child.wait().unwrap();
        kills += 1;
        assert!(Instant::now() < deadline, "kill loop too slow");
    }
    // The steady publishers keep going a little after the last kill.
    std::thread::sleep(Duration::from_millis(20));
    stop.store(true, Ordering::Release);
    let published: u64 = steady.into_iter().map(|t| t.join().unwrap()).sum();
    let rep = ch.recover(Path::new(PROC));
    let total = ch.next_index();
    done.store(true, Ordering::Release);
    for s in subs {
        let (seen, lost, victims, first) = s.join().unwrap();
        assert_eq!(
            seen + lost,
            total - first,
            "seen {seen} + lost {lost} != {total} - {first}"
        );
        println!("subscriber: {seen} seen, {lost} lost, {victims} from victims");
    }
    println!(
        "{kills} kills, {published} steady messages, {total} in all, {} entries reclaimed ({} mid-swap), final sweep {rep:?}",
        ch.recovered_count(),
        ch.recovered_mid_swap_count()
    );
    assert!(total >= published);
    assert!(ch.recovered_count() > 0);
}
