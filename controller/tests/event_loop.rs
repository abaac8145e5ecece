//! The event loop against the real kernel, on every backend the kernel
//! has (each test probes and prints why it skips a backend).

use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;
use std::time::{Duration, Instant};

use controller::event_loop::{probe, Backend, EventLoop, LoopOptions, TimingOptions};
use controller::{Channel, ChannelGeometry, Monotonic};

mod common;

const PROC: &str = "/proc";

fn backends() -> Vec<Backend> {
    let p = probe();
    let mut v = Vec::new();
    if p.io_uring_futex {
        v.push(Backend::IoUringFutex);
    } else {
        println!(
            "skipping io_uring-futex on kernel {}: {:?}",
            p.kernel, p.io_uring_problem
        );
    }
    if p.futex_waitv {
        v.push(Backend::FutexWaitv);
    } else {
        println!(
            "skipping futex_waitv: kernel {} lacks it (needs 5.16+)",
            p.kernel
        );
    }
    assert!(p.doorbell, "{p:?}");
    v.push(Backend::Doorbell);
    v
}

fn new_loop(b: Backend) -> EventLoop {
    EventLoop::new(LoopOptions {
        backend: Some(b),
        ..LoopOptions::default()
    })
    .unwrap()
}

/// Fails the test (from inside the loop) if it runs longer than `secs`.
fn watchdog(lp: &mut EventLoop, secs: u64) {
    let deadline = Monotonic::now() + Duration::from_secs(secs);
    lp.add_timer("watchdog", deadline, None, move |_| {
        panic!("event loop watchdog: no progress in {secs}s")
    });
}

#[test]
fn probe_reports_a_backend() {
    let p = probe();
    println!("{p:?}");
    assert!(!p.kernel.is_empty());
    // The best available, in the order io_uring-futex, futex_waitv,
    // doorbell (which every kernel has).
    let best = Backend::ALL.into_iter().find(|&b| p.has(b));
    assert_eq!(p.backend, best);
    assert!(p.doorbell);
}

#[test]
fn suites_on_old_kernel_profiles() {
    common::rerun_under_kernel_profiles(7);
}

#[test]
fn watcher_gets_every_message_in_order_from_another_thread() {
    for b in backends() {
        let dir = tempfile::tempdir().unwrap();
        let geom = ChannelGeometry::new(16, 4096, 1);
        let (ch, _) = Channel::create(dir.path(), "/w", &geom, None, Path::new(PROC)).unwrap();
        const N: u64 = 3000;
        let mut lp = new_loop(b);
        assert_eq!(lp.backend(), b);
        watchdog(&mut lp, 20);
        let got = Rc::new(RefCell::new(Vec::new()));
        let g = got.clone();
        lp.watch_raw(&ch, move |ctx, m| {
            g.borrow_mut().push(m.value::<u64>().unwrap());
            assert!(ctx.now().as_nanos() >= m.send_time_ns);
            if m.value::<u64>() == Some(N - 1) {
                ctx.exit();
            }
        })
        .unwrap();
        let ch2 = ch.clone();
        let t = std::thread::spawn(move || {
            let mut p = ch2.publisher(Path::new(PROC)).unwrap();
            let mut woke = 0;
            for i in 0..N {
                if p.publish(&i.to_ne_bytes()).unwrap().woke {
                    woke += 1;
                }
                if i % 3 == 0 {
                    std::thread::sleep(Duration::from_micros(30));
                }
            }
            woke
        });
        lp.run().unwrap();
        let woke = t.join().unwrap();
        assert_eq!(*got.borrow(), (0..N).collect::<Vec<_>>(), "backend {b}");
        let rep = lp.report_now();
        let w = &rep.entries[0];
        assert_eq!(w.count, N);
        assert_eq!(w.lost, 0);
        println!(
            "{b}: {N} messages, {woke} wake syscalls, {} -EAGAIN",
            w.eagain
        );
        assert!(woke > 0, "the publisher never saw a waiter");
    }
}

#[test]
fn eagain_path_is_forced_and_counted() {
    for b in backends() {
        let dir = tempfile::tempdir().unwrap();
        let geom = ChannelGeometry::new(8, 64, 1);
        let (ch, _) = Channel::create(dir.path(), "/e", &geom, None, Path::new(PROC)).unwrap();
        const K: u64 = 25;
        let mut lp = new_loop(b);
        watchdog(&mut lp, 20);
        let mut p = ch.publisher(Path::new(PROC)).unwrap();
        let mut sent = 0u64;
        // Publish between the loop's index check and the kernel's: every
        // one of these arms must come back -EAGAIN and still deliver.
        lp.set_before_arm_hook(move || {
            if sent < K {
                p.publish(&sent.to_ne_bytes()).unwrap();
                sent += 1;
            }
        });
        let got = Rc::new(RefCell::new(Vec::new()));
        let g = got.clone();
        lp.watch_raw(&ch, move |ctx, m| {
            g.borrow_mut().push(m.value::<u64>().unwrap());
            if g.borrow().len() as u64 == K {
                ctx.exit();
            }
        })
        .unwrap();
        lp.run().unwrap();
        assert_eq!(*got.borrow(), (0..K).collect::<Vec<_>>());
        let rep = lp.report_now();
        assert_eq!(rep.entries[0].eagain, K, "backend {b}");
    }
}

#[test]
fn handlers_run_in_event_time_order_across_channels() {
    for b in backends() {
        let dir = tempfile::tempdir().unwrap();
        let geom = ChannelGeometry::new(8, 64, 1);
        let (a, _) = Channel::create(dir.path(), "/a", &geom, None, Path::new(PROC)).unwrap();
        let (c, _) = Channel::create(dir.path(), "/c", &geom, None, Path::new(PROC)).unwrap();
        let mut lp = new_loop(b);
        watchdog(&mut lp, 20);
        let seen = Rc::new(RefCell::new(Vec::new()));
        for (ch, tag) in [(&a, 0u8), (&c, 1u8)] {
            let s = seen.clone();
            lp.watch_raw(ch, move |ctx, m| {
                s.borrow_mut()
                    .push((m.send_time_ns, tag, m.value::<u64>().unwrap()));
                if s.borrow().len() == 20 {
                    ctx.exit();
                }
            })
            .unwrap();
        }
        let (mut pa, mut pc) = (
            a.publisher(Path::new(PROC)).unwrap(),
            c.publisher(Path::new(PROC)).unwrap(),
        );
        // Published before the loop runs: one wake sees both channels full.
        lp.on_run(move |_| {
            for i in 0..10u64 {
                pa.publish(&(2 * i).to_ne_bytes()).unwrap();
                pc.publish(&(2 * i + 1).to_ne_bytes()).unwrap();
            }
        });
        lp.run().unwrap();
        let seen = seen.borrow();
        let order: Vec<u64> = seen.iter().map(|e| e.2).collect();
        assert_eq!(order, (0..20).collect::<Vec<_>>(), "backend {b}");
        assert!(seen.windows(2).all(|w| w[0].0 <= w[1].0));
    }
}

#[test]
fn phased_loop_keeps_phase_and_counts_missed_periods() {
    for b in backends() {
        let mut lp = new_loop(b);
        watchdog(&mut lp, 20);
        let period = Duration::from_millis(2);
        let offset = Duration::from_micros(300);
        let fired = Rc::new(RefCell::new(Vec::new()));
        let f = fired.clone();
        lp.add_phased_loop("phase", period, offset, move |ctx| {
            f.borrow_mut().push(ctx.event_time().as_nanos());
            assert!(ctx.now() >= ctx.event_time());
            if f.borrow().len() == 5 {
                // Overrun: late by more than two periods.
                std::thread::sleep(Duration::from_millis(5));
            }
            if f.borrow().len() == 12 {
                ctx.exit();
            }
        });
        lp.run().unwrap();
        let returned = Monotonic::now().as_nanos();
        let fired = fired.borrow();
        let p = period.as_nanos() as u64;
        for d in fired.iter() {
            assert_eq!(d % p, offset.as_nanos() as u64, "deadline {d} off phase");
        }
        assert!(fired.windows(2).all(|w| w[1] > w[0]));
        let rep = lp.report_now();
        let t = rep.entries.iter().find(|e| e.name == "phase").unwrap();
        assert_eq!(t.count, 12);
        assert!(t.missed >= 2, "missed {} (backend {b})", t.missed);
        // Every deadline skipped between firings is counted missed; beyond
        // that, only deadlines after the last firing that passed before the
        // loop returned may be (the last handler can itself end late).
        let last = fired[fired.len() - 1];
        let span = (last - fired[0]) / p;
        let after_last = (returned - last) / p;
        let gaps: Vec<u64> = fired.windows(2).map(|w| (w[1] - w[0]) / p).collect();
        assert!(
            span <= 11 + t.missed && 11 + t.missed <= span + after_last,
            "backend {b}: missed {}, gaps in periods {gaps:?}, {after_last} periods after the last firing",
            t.missed
        );
    }
}

#[test]
fn timing_reports_are_published_and_read_back() {
    let Some(b) = backends().first().copied() else {
        println!("skipping: no backend");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let geom = ChannelGeometry::new(8, 64, 1);
    let (ch, _) = Channel::create(dir.path(), "/t", &geom, None, Path::new(PROC)).unwrap();
    let mut lp = EventLoop::new(LoopOptions {
        backend: Some(b),
        timing: Some(TimingOptions {
            shm_dir: dir.path().into(),
            process: "reporter".into(),
            period: Duration::from_millis(30),
        }),
        ..LoopOptions::default()
    })
    .unwrap();
    watchdog(&mut lp, 20);
    lp.watch_raw(&ch, |_, _| {}).unwrap();
    let mut s = lp.make_raw_sender(&ch).unwrap();
    let start = Instant::now();
    let shm = dir.path().to_path_buf();
    let mut looked = Instant::now();
    lp.add_timer(
        "tick",
        Monotonic::now(),
        Some(Duration::from_millis(1)),
        move |ctx| {
            s.publish(&1u64.to_ne_bytes()).unwrap();
            // Until the second report is out (seven periods on a quiet
            // machine; a slow one, such as an emulated guest, takes longer),
            // with a bound that fails the test below.
            if start.elapsed() > Duration::from_millis(200)
                && looked.elapsed() > Duration::from_millis(20)
            {
                looked = Instant::now();
                let seq = controller::timing_report::read_latest(&shm, "reporter")
                    .ok()
                    .flatten()
                    .map_or(0, |r| r.seq);
                if seq >= 2 || start.elapsed() > Duration::from_secs(15) {
                    ctx.exit();
                }
            }
        },
    );
    assert!(
        controller::timing_report::read_latest(dir.path(), "reporter")
            .unwrap()
            .is_none()
    );
    lp.run().unwrap();
    let rep = controller::timing_report::read_latest(dir.path(), "reporter")
        .unwrap()
        .unwrap();
    assert_eq!(rep.process, "reporter");
    assert_eq!(rep.pid, std::process::id());
    assert_eq!(rep.backend, b.name());
    assert!(rep.seq >= 2, "seq {}", rep.seq);
    let kinds: Vec<_> = rep
        .entries
        .iter()
        .map(|e| (e.kind, e.name.as_str()))
        .collect();
    use controller::timing_report::EntryKind::*;
    assert_eq!(
        kinds,
        vec![
            (Watcher, "/t"),
            (Timer, "watchdog"),
            (Timer, "tick"),
            (Sender, "/t")
        ]
    );
    let sender = &rep.entries[3];
    assert!(sender.total >= sender.count && sender.total > 0);
    // The median of the window, and the latency since the loop started,
    // which bounds the window's.
    assert_eq!(rep.layout, controller::timing_report::LAYOUT);
    for e in &rep.entries[..3] {
        let p50 = e.latency_p50_ns.unwrap();
        assert!(
            e.count == 0 || (e.latency_min_ns..=e.latency_p99_ns).contains(&p50),
            "{e:?}"
        );
        let (s50, s99, smax) = (
            e.since_start_latency_p50_ns.unwrap(),
            e.since_start_latency_p99_ns.unwrap(),
            e.since_start_latency_max_ns.unwrap(),
        );
        assert!(s50 <= s99 && s99 <= smax, "{e:?}");
        assert!(smax >= e.latency_max_ns, "{e:?}");
        assert!(e.total == 0 || smax > 0, "{e:?}");
    }
    println!("{}", serde_json::to_string_pretty(&rep).unwrap());
    assert!(controller::timing_report::read_latest(dir.path(), "nobody").is_err());
}

controller::shm_struct! {
    #[derive(Debug)]
    pub struct Frame {
        pub seq: u64,
        pub len: u64,
    }
}

#[test]
fn held_frames_reach_a_loop_whole_and_never_torn() {
    for b in backends() {
        let dir = tempfile::tempdir().unwrap();
        const N: u64 = 400;
        const MAX: usize = 256 << 10;
        // The newest two kept, one hold for the loop: four slots cycle.
        let geom = ChannelGeometry::new(64 + MAX as u64, 2, 1).with_holds(1);
        let (_ch, _) = Channel::create(dir.path(), "/cam", &geom, None, Path::new(PROC)).unwrap();
        let mut lp = EventLoop::new(LoopOptions {
            backend: Some(b),
            shm_dir: dir.path().to_path_buf(),
            ..LoopOptions::default()
        })
        .unwrap();
        watchdog(&mut lp, 30);
        // The sender runs up to three frames ahead of the handler: with
        // the two the channel keeps and its scratch, the third is written
        // into the slot of the frame being handled, unless that slot is
        // traded away (a frame that falls out meanwhile is counted lost).
        let handled = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let h = handled.clone();
        lp.watch_frames::<Frame>("/cam", move |ctx, head, pixels| {
            assert_eq!(pixels.len() as u64, head.len, "frame {}", head.seq);
            let want = head.seq as u8;
            assert!(
                pixels.iter().all(|&p| p == want),
                "frame {} changed under its handler",
                head.seq
            );
            h.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if head.seq == N - 1 {
                ctx.exit();
            }
        })
        .unwrap();
        // A second held watcher of the same loop finds the one record taken.
        let err = lp.watch_frames::<Frame>("/cam", |_, _, _| {}).unwrap_err();
        assert!(err.to_string().contains("hold records is free"), "{err}");
        let shm = dir.path().to_path_buf();
        let h = handled.clone();
        let t = std::thread::spawn(move || {
            let mut sender = EventLoop::new(LoopOptions {
                shm_dir: shm,
                ..LoopOptions::default()
            })
            .unwrap();
            let mut s = sender.make_frame_sender::<Frame>("/cam").unwrap();
            for seq in 0..N {
                let len = MAX - (seq as usize % 7) * 4096;
                let mut loan = s.loan(len).unwrap();
                let (head, pixels) = loan.parts();
                *head = Frame {
                    seq,
                    len: len as u64,
                };
                pixels.fill(seq as u8);
                loan.send().unwrap();
                let until = Instant::now() + Duration::from_secs(2);
                while h.load(std::sync::atomic::Ordering::SeqCst) + 3 <= seq
                    && Instant::now() < until
                {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
        });
        lp.run().unwrap();
        t.join().unwrap();
        let rep = lp.report_now();
        let w = &rep.entries[0];
        let handled = handled.load(std::sync::atomic::Ordering::SeqCst);
        println!("{b}: {handled} handled, {} lost", w.lost);
        assert_eq!(handled + w.lost, N, "backend {b}");
        assert!(handled >= N / 4, "backend {b}: {handled} frames handled");
    }
}
