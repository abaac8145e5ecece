//! Channels whose shared memory another process scribbled on, truncated or
//! replaced: every reader and publisher returns an error bounded in time
//! and memory, and the process lives on.
//!
//! Each case runs in a child process (this test binary run again with
//! `HOSTILE_CASE` set): a watchdog kills it if it hangs, `wait4` gives its
//! peak RSS, and a `SIGBUS` that escaped would show as its death instead
//! of taking the whole test binary down. No wall-clock duration is
//! asserted: the watchdog only turns a hang into a failure.
#![allow(unsafe_code)] // wait4, kill and mkfifo of the harness

mod common;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use controller::channel::{
    channel_path, Channel, ChannelFault, ChannelGeometry, ChannelOpenError, PublishError,
};
use controller::event_loop::{EventLoop, LoopOptions};
use controller::timing_report::{self, TimingReadError};

const PROC: &str = "/proc";
/// Byte offsets in the header page (see `controller/src/channel/layout.rs`).
const NEXT_INDEX: u64 = 256;
const WAITERS: u64 = 320;
/// The doorbell listings' count (see the channel header).
const BELL_COUNT: u64 = 512;
const HEADER_BYTES: u64 = 4096;
/// The hang watchdog of a child case.
const WATCHDOG: Duration = Duration::from_secs(60);
/// Peak RSS a child case may reach (the test binary itself is a few MB).
const RSS_LIMIT_KIB: i64 = 100 * 1024;

struct Outcome {
    status: i32,
    max_rss_kib: i64,
    hung: bool,
    output: String,
}

/// Runs test `name` of this binary in a child with `HOSTILE_CASE=name`,
/// under a watchdog, and returns how it ended and its peak RSS.
fn in_child(name: &str) -> Outcome {
    let out = tempfile::NamedTempFile::new().unwrap();
    let child = Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env("HOSTILE_CASE", name)
        .stdout(out.reopen().unwrap())
        .stderr(out.reopen().unwrap())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let done = Arc::new(AtomicBool::new(false));
    let hung = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let (done, hung) = (done.clone(), hung.clone());
        std::thread::spawn(move || {
            let until = Instant::now() + WATCHDOG;
            while !done.load(Ordering::SeqCst) {
                if Instant::now() > until {
                    hung.store(true, Ordering::SeqCst);
                    // SAFETY: kill(2) of our own child, not yet reaped
                    // (wait4 below has not returned).
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid out-parameter.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child; both pointers are valid.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    assert_eq!(r, pid, "wait4: {}", std::io::Error::last_os_error());
    done.store(true, Ordering::SeqCst);
    watchdog.join().unwrap();
    std::mem::forget(child); // reaped by wait4
    Outcome {
        status,
        max_rss_kib: ru.ru_maxrss,
        hung: hung.load(Ordering::SeqCst),
        output: std::fs::read_to_string(out.path()).unwrap_or_default(),
    }
}

/// Whether this process is the child running case `name`.
fn is_child(name: &str) -> bool {
    std::env::var("HOSTILE_CASE").as_deref() == Ok(name)
}

/// In the parent: runs the case in a child and checks it ended well,
/// bounded in time and memory.
fn run_case(name: &str) {
    let o = in_child(name);
    assert!(
        !o.hung,
        "case {name} hung (killed by the watchdog after {WATCHDOG:?}):\n{}",
        o.output
    );
    assert!(
        libc::WIFEXITED(o.status) && libc::WEXITSTATUS(o.status) == 0,
        "case {name} ended with wait status {:#x} (signal {}):\n{}",
        o.status,
        if libc::WIFSIGNALED(o.status) {
            libc::WTERMSIG(o.status)
        } else {
            0
        },
        o.output
    );
    assert!(
        o.output.contains("1 passed"),
        "case {name} did not run:\n{}",
        o.output
    );
    assert!(
        o.max_rss_kib < RSS_LIMIT_KIB,
        "case {name} peaked at {} KiB",
        o.max_rss_kib
    );
}

fn write_u64(path: &Path, offset: u64, v: u64) {
    let f = OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&v.to_le_bytes(), offset).unwrap();
}

fn ring_offset(g: &ChannelGeometry) -> u64 {
    HEADER_BYTES + 64 * (g.publishers as u64 + g.subscribers as u64)
}

#[test]
fn a_garbage_index_makes_readers_and_publishers_fail_not_spin() {
    const NAME: &str = "a_garbage_index_makes_readers_and_publishers_fail_not_spin";
    if !is_child(NAME) {
        return run_case(NAME);
    }
    let dir = tempfile::tempdir().unwrap();
    let g = ChannelGeometry::new(16, 8, 2);
    let (ch, _) = Channel::create(dir.path(), "/g", &g, None, Path::new(PROC)).unwrap();
    let mut p = ch.publisher(Path::new(PROC)).unwrap();
    let mut fetcher = ch.reader();
    let mut sub = ch.subscriber(Path::new(PROC)).unwrap();
    let mut in_place = ch.subscriber(Path::new(PROC)).unwrap();
    for i in 0..5u64 {
        p.publish_value(&i).unwrap();
    }
    // An index far ahead of every ring entry.
    write_u64(ch.path(), NEXT_INDEX, 0x0123_4567_89ab);
    match p.publish_value(&9u64) {
        Err(PublishError::Fault(ChannelFault::RingInconsistent { index, .. })) => {
            assert_eq!(index, 0x0123_4567_89ab)
        }
        other => panic!("publish on a garbage index: {other:?}"),
    }
    assert_eq!(p.errors(), 1);
    assert!(matches!(
        fetcher.latest_meta(),
        Err(ChannelFault::GaveUp { .. })
    ));
    // The subscriber skips to the garbage index, counting what it could not
    // read as lost, and does not read anything that is not there.
    assert_eq!(sub.next_meta(), Ok(None));
    assert!(sub.lost() > 0);
    // Reading in place likewise, its body never run on a slot that does
    // not hold the message it looked for.
    let mut ran = false;
    assert_eq!(
        in_place.next_in_place(|v| {
            ran = true;
            v.word(0)
        }),
        Ok(None)
    );
    assert!(!ran && in_place.lost() > 0);
    // Ring entries of no lap and slot ids out of range.
    write_u64(ch.path(), NEXT_INDEX, 5);
    for pos in 0..g.queue_len {
        write_u64(ch.path(), ring_offset(&g) + 8 * pos, u64::MAX);
    }
    assert!(matches!(
        p.publish_value(&9u64),
        Err(PublishError::Fault(ChannelFault::RingInconsistent { .. }))
    ));
    // The entry of the lap before index 5 (tag of 5 - 8), naming a slot
    // the channel does not have.
    let lap_before = 5u64.wrapping_sub(g.queue_len) & ((1 << 40) - 1);
    write_u64(
        ch.path(),
        ring_offset(&g) + 8 * 5,
        lap_before << 24 | 0xff_ffff,
    );
    assert!(matches!(
        p.publish_value(&9u64),
        Err(PublishError::Fault(ChannelFault::BadSlot {
            slot: 0xff_ffff,
            ..
        }))
    ));
    println!("publish and read returned errors");
}

#[test]
fn an_index_that_goes_back_is_reported_and_the_reader_follows_it() {
    const NAME: &str = "an_index_that_goes_back_is_reported_and_the_reader_follows_it";
    if !is_child(NAME) {
        return run_case(NAME);
    }
    let dir = tempfile::tempdir().unwrap();
    let g = ChannelGeometry::new(16, 8, 2);
    let (ch, _) = Channel::create(dir.path(), "/b", &g, None, Path::new(PROC)).unwrap();
    let mut p = ch.publisher(Path::new(PROC)).unwrap();
    let mut sub = ch.subscriber(Path::new(PROC)).unwrap();
    let mut in_place = ch.subscriber(Path::new(PROC)).unwrap();
    for i in 0..5u64 {
        p.publish_value(&i).unwrap();
    }
    while sub.next_meta().unwrap().is_some() {}
    let mut read = vec![];
    while let Some((_, w)) = in_place.next_in_place(|v| v.word(0)).unwrap() {
        read.push(w.unwrap());
    }
    assert_eq!(read, (0..5).collect::<Vec<u64>>());
    write_u64(ch.path(), NEXT_INDEX, 1);
    assert_eq!(
        sub.next_meta(),
        Err(ChannelFault::IndexWentBack { from: 5, to: 1 })
    );
    assert_eq!(sub.faults(), 1);
    assert_eq!(
        in_place.next_in_place(|v| v.word(0)),
        Err(ChannelFault::IndexWentBack { from: 5, to: 1 })
    );
    assert_eq!(in_place.next_index(), 1);
    // It follows the word as it is now (so its waits arm on that value,
    // not on a stale one that would return -EAGAIN at once, forever).
    assert_eq!(sub.next_index(), 1);
    assert!(!sub.has_new());
}

#[test]
fn a_truncated_channel_is_an_error_not_a_sigbus() {
    const NAME: &str = "a_truncated_channel_is_an_error_not_a_sigbus";
    if !is_child(NAME) {
        return run_case(NAME);
    }
    let dir = tempfile::tempdir().unwrap();
    let g = ChannelGeometry::new(64, 8, 2);
    let (ch, _) = Channel::create(dir.path(), "/t", &g, None, Path::new(PROC)).unwrap();
    let mut p = ch.publisher(Path::new(PROC)).unwrap();
    let mut sub = ch.subscriber(Path::new(PROC)).unwrap();
    let mut in_place = ch.subscriber(Path::new(PROC)).unwrap();
    let mut fetcher = ch.reader();
    p.publish_value(&1u64).unwrap();
    OpenOptions::new()
        .write(true)
        .open(ch.path())
        .unwrap()
        .set_len(0)
        .unwrap();
    // Each of these touches the mapping past the end of the file.
    assert_eq!(sub.next_meta(), Err(ChannelFault::Truncated));
    assert_eq!(
        in_place.next_in_place(|v| v.word(0)),
        Err(ChannelFault::Truncated)
    );
    assert_eq!(fetcher.latest_meta(), Err(ChannelFault::Truncated));
    assert_eq!(
        p.publish_value(&2u64),
        Err(PublishError::Fault(ChannelFault::Truncated))
    );
    assert!(ch.is_truncated());
    // A second channel of the same process is untouched.
    let (other, _) = Channel::create(dir.path(), "/o", &g, None, Path::new(PROC)).unwrap();
    let mut p2 = other.publisher(Path::new(PROC)).unwrap();
    let mut s2 = other.subscriber(Path::new(PROC)).unwrap();
    p2.publish_value(&3u64).unwrap();
    assert_eq!(s2.next_message().unwrap().unwrap().value::<u64>(), Some(3));
    // Opening the truncated file again is refused, not mapped.
    assert!(matches!(
        Channel::open(dir.path(), "/t"),
        Err(ChannelOpenError::WrongFileSize { found: 0, .. })
    ));
    println!("survived the truncation");
}

#[test]
fn an_event_loop_survives_its_channel_being_truncated() {
    const NAME: &str = "an_event_loop_survives_its_channel_being_truncated";
    if !is_child(NAME) {
        return run_case(NAME);
    }
    let probe = controller::event_loop::probe();
    // The doorbell needs no kernel feature: there is always a backend.
    let backend = probe.backend.expect("a backend (the doorbell needs none)");
    let dir = tempfile::tempdir().unwrap();
    let g = ChannelGeometry::new(64, 8, 2);
    let (ch, _) = Channel::create(dir.path(), "/t", &g, None, Path::new(PROC)).unwrap();
    let mut lp = EventLoop::new(LoopOptions {
        backend: Some(backend),
        wake_check: Some(Duration::from_millis(5)),
        shm_dir: dir.path().to_path_buf(),
        ..LoopOptions::default()
    })
    .unwrap();
    lp.watch_raw(&ch, |_, _| {}).unwrap();
    // And a watcher reading in place, on the same channel.
    lp.watch_in_place::<u64, _>("/t", |v| v.word(0), |_, _| {})
        .unwrap();
    let path = ch.path().to_path_buf();
    let ticks = std::rc::Rc::new(std::cell::Cell::new(0u32));
    let t = ticks.clone();
    let now = controller::Monotonic::now();
    lp.add_timer(
        "tick",
        now + Duration::from_millis(2),
        Some(Duration::from_millis(2)),
        move |ctx| {
            t.set(t.get() + 1);
            if t.get() == 3 {
                OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .unwrap()
                    .set_len(0)
                    .unwrap();
            }
            // The loop goes on running its timer long after the truncation.
            if t.get() == 30 {
                ctx.exit();
            }
        },
    );
    lp.run().unwrap();
    assert_eq!(ticks.get(), 30);
    let rep = lp.report_now();
    let watchers: Vec<_> = rep.entries.iter().filter(|e| e.name == "/t").collect();
    assert_eq!(watchers.len(), 2, "{rep:?}");
    assert!(watchers.iter().all(|w| w.faults == 1), "{rep:?}");
    println!("the loop ran on with {backend}");
}

#[test]
fn lost_wakeups_heal() {
    const NAME: &str = "lost_wakeups_heal";
    if !is_child(NAME) {
        return run_case(NAME);
    }
    let probe = controller::event_loop::probe();
    // The doorbell needs no kernel feature: there is always a backend.
    let backend = probe.backend.expect("a backend (the doorbell needs none)");
    let dir = tempfile::tempdir().unwrap();
    let g = ChannelGeometry::new(16, 64, 2);
    let (ch, _) = Channel::create(dir.path(), "/w", &g, None, Path::new(PROC)).unwrap();
    const N: u64 = 20;
    let mut lp = EventLoop::new(LoopOptions {
        backend: Some(backend),
        wake_check: Some(Duration::from_millis(5)),
        ..LoopOptions::default()
    })
    .unwrap();
    let got = std::rc::Rc::new(std::cell::RefCell::new(vec![]));
    let got2 = got.clone();
    lp.watch_raw(&ch, move |ctx, m| {
        got2.borrow_mut().push(m.value::<u64>().unwrap());
        if got2.borrow().len() as u64 == N {
            ctx.exit();
        }
    })
    .unwrap();
    let path = ch.path().to_path_buf();
    let ch2 = ch.clone();
    let publisher = std::thread::spawn(move || {
        let mut p = ch2.publisher(Path::new(PROC)).unwrap();
        let mut skipped = 0;
        for i in 0..N {
            std::thread::sleep(Duration::from_millis(2));
            // Another process scribbles the waiter count and the doorbell
            // listings' count to zero before every publish: publishers
            // then skip the wake.
            write_u64(&path, WAITERS, 0);
            write_u64(&path, BELL_COUNT, 0);
            if !p.publish_value(&i).unwrap().woke {
                skipped += 1;
            }
        }
        skipped
    });
    lp.run().unwrap();
    let skipped = publisher.join().unwrap();
    assert_eq!(*got.borrow(), (0..N).collect::<Vec<_>>());
    assert!(skipped > 0, "no wake was skipped: the test did not test");
    let rep = lp.report_now();
    let w = rep.entries.iter().find(|e| e.name == "/w").unwrap();
    assert!(w.healed > 0, "{rep:?}");
    assert_eq!(w.lost, 0);
    println!(
        "{N} delivered with {backend}, {skipped} wakes skipped, {} healed",
        w.healed
    );
}

#[test]
fn a_sparse_gigabyte_timing_file_costs_its_reader_nothing() {
    const NAME: &str = "a_sparse_gigabyte_timing_file_costs_its_reader_nothing";
    if !is_child(NAME) {
        return run_case(NAME);
    }
    let dir = tempfile::tempdir().unwrap();
    // A real channel geometry of about 1 GiB, with a valid header, as a
    // sparse file where the timing channel of process `big` belongs.
    let g = ChannelGeometry::new(16 << 20, 64, 1).with_subscribers(1);
    let (ch, _) = Channel::create(
        dir.path(),
        &timing_report::timing_channel_name("big"),
        &ChannelGeometry::new(64, 2, 1),
        None,
        Path::new(PROC),
    )
    .unwrap();
    let path = ch.path().to_path_buf();
    drop(ch);
    let f = OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(g.total_bytes()).unwrap();
    for (off, v) in [
        (16, g.slot_bytes),
        (24, g.queue_len),
        (32, g.publishers as u64),
        (40, g.subscribers as u64),
        (56, g.total_bytes()),
    ] {
        f.write_all_at(&v.to_le_bytes(), off).unwrap();
    }
    assert!(g.total_bytes() > 1 << 30);
    // The supervisor polls twice a second; do it many times.
    for _ in 0..50 {
        match timing_report::read_latest(dir.path(), "big") {
            Err(TimingReadError::Open {
                source: ChannelOpenError::Mismatch { .. },
                ..
            }) => {}
            other => panic!("a 1 GiB timing file: {other:?}"),
        }
    }
    println!("refused before mapping");
}

#[test]
fn garbage_in_the_median_and_since_start_fields_is_read_as_given() {
    const NAME: &str = "garbage_in_the_median_and_since_start_fields_is_read_as_given";
    if !is_child(NAME) {
        return run_case(NAME);
    }
    let dir = tempfile::tempdir().unwrap();
    let (ch, _) = Channel::create(
        dir.path(),
        &timing_report::timing_channel_name("liar"),
        &timing_report::timing_geometry(),
        None,
        Path::new(PROC),
    )
    .unwrap();
    let mut p = ch.publisher(Path::new(PROC)).unwrap();
    // Another process of the group publishes a report whose new fields
    // contradict each other and the old ones, with an entry count far past
    // the table and entries of no kind.
    let mut raw = timing_report::RawReport {
        entries: u64::MAX,
        ..Default::default()
    };
    for (i, e) in raw.entry.iter_mut().enumerate() {
        e.kind = if i % 3 == 2 { 0xdead } else { 1 + i as u64 % 3 };
        e.name = [0xff; 48];
        e.latency_max = 10;
        e.latency_p50 = u64::MAX;
        e.since_start_latency_p50 = u64::MAX;
        e.since_start_latency_p99 = 7;
        e.since_start_latency_max = 0;
    }
    for round in 0..1000u64 {
        raw.seq = round;
        p.publish_value(&raw).unwrap();
        let r = timing_report::read_latest(dir.path(), "liar")
            .unwrap()
            .unwrap();
        assert_eq!(r.seq, round);
        // Bounded by the table, entries of no kind left out.
        assert_eq!(r.entries.len(), 22);
        for e in &r.entries {
            // As given: the reader neither invents nor mends figures.
            assert_eq!(e.latency_p50_ns, Some(u64::MAX));
            assert_eq!(
                (
                    e.since_start_latency_p50_ns,
                    e.since_start_latency_p99_ns,
                    e.since_start_latency_max_ns
                ),
                (Some(u64::MAX), Some(7), Some(0))
            );
            assert_eq!(e.name.chars().count(), 48, "lossy, bounded: {:?}", e.name);
        }
    }
    // A magic one bit away from the current one: another layout, said so.
    raw.magic ^= 1 << 58;
    p.publish_value(&raw).unwrap();
    match timing_report::read_latest(dir.path(), "liar") {
        Err(TimingReadError::Decode { source, .. }) => {
            assert!(source.to_string().contains("does not know"), "{source}")
        }
        other => panic!("a report of another magic: {other:?}"),
    }
    println!("read as given");
}

#[test]
fn a_fifo_or_symlink_in_place_of_a_channel_is_refused_without_blocking() {
    const NAME: &str = "a_fifo_or_symlink_in_place_of_a_channel_is_refused_without_blocking";
    if !is_child(NAME) {
        return run_case(NAME);
    }
    let dir = tempfile::tempdir().unwrap();
    let fifo = channel_path(dir.path(), "/f");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o660) }, 0);
    let e = Channel::open(dir.path(), "/f").unwrap_err();
    assert!(e.to_string().contains("a FIFO"), "{e}");
    // A symlink to a real channel file is not followed.
    let g = ChannelGeometry::new(16, 8, 1);
    let (real, _) = Channel::create(dir.path(), "/real", &g, None, Path::new(PROC)).unwrap();
    std::os::unix::fs::symlink(real.path(), channel_path(dir.path(), "/link")).unwrap();
    assert!(matches!(
        Channel::open(dir.path(), "/link"),
        Err(ChannelOpenError::Io { .. })
    ));
    // Creating over either replaces it with a real channel file.
    let (ch, _) = Channel::create(dir.path(), "/f", &g, None, Path::new(PROC)).unwrap();
    assert!(std::fs::symlink_metadata(ch.path()).unwrap().is_file());
    let (ch, _) = Channel::create(dir.path(), "/link", &g, None, Path::new(PROC)).unwrap();
    assert!(std::fs::symlink_metadata(ch.path()).unwrap().is_file());
    println!("refused");
}

/// The suite again under the JetPack 6 and no-io_uring kernel profiles,
/// where the probe must pick the doorbell backend.
#[test]
fn suites_on_old_kernel_profiles() {
    common::rerun_under_kernel_profiles(8);
}
