//! The typed API: channels opened by name with a message type that the
//! channel records and checks, loans written in place, timer handles and
//! phased loops told what they missed.

mod common;

use std::cell::{Cell, RefCell};
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use controller::channel::ChannelAttachError;
use controller::event_loop::{EventLoop, FetchError, LoopChannelError, LoopOptions};
use controller::{Channel, ChannelGeometry, Monotonic};

const PROC: &str = "/proc";

controller::shm_struct! {
    #[derive(Debug, PartialEq)]
    pub struct Imu {
        pub time_ns: u64,
        pub accel: [f32; 3],
        pub gyro: [f32; 3],
    }
}

controller::shm_struct! {
    /// Same size and alignment as `Imu`, other fields.
    #[derive(Debug)]
    pub struct Odometry {
        pub time_ns: u64,
        pub pose: [f32; 6],
    }
}

fn new_loop(dir: &Path) -> Option<EventLoop> {
    let probe = controller::event_loop::probe();
    // The doorbell needs no kernel feature: there is always a backend.
    assert!(
        probe.backend.is_some(),
        "no backend on kernel {}",
        probe.kernel
    );
    Some(
        EventLoop::new(LoopOptions {
            shm_dir: dir.to_path_buf(),
            ..LoopOptions::default()
        })
        .unwrap(),
    )
}

/// Exits the loop after 20 s whatever happens (a hang fails, not blocks).
fn watchdog(lp: &mut EventLoop) {
    let at = Monotonic::now() + Duration::from_secs(20);
    lp.add_timer("watchdog", at, None, |_| {
        panic!("test loop still running after 20 s")
    });
}

fn channel(dir: &Path, name: &str, payload: u64) -> Channel {
    let g = ChannelGeometry::new(payload, 16, 4);
    Channel::create(dir, name, &g, None, Path::new(PROC))
        .unwrap()
        .0
}

#[test]
fn typed_messages_round_trip_and_loans_write_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let ch = channel(dir.path(), "/imu", 64);
    let Some(mut lp) = new_loop(dir.path()) else {
        return;
    };
    watchdog(&mut lp);
    let mut tx = lp.make_sender::<Imu>("/imu").unwrap();
    let got = Rc::new(RefCell::new(vec![]));
    let g = got.clone();
    lp.watch::<Imu>("/imu", move |ctx, m| {
        g.borrow_mut().push(*m);
        if g.borrow().len() == 2 {
            ctx.exit();
        }
    })
    .unwrap();
    let first = Imu {
        time_ns: 1,
        accel: [1.0, 2.0, 3.0],
        gyro: [0.5; 3],
    };
    lp.on_run(move |_| {
        tx.send(&first).unwrap();
        let mut loan = tx.loan().unwrap();
        // No reader of this process is copying the slot: written in place.
        assert!(loan.in_place());
        loan.time_ns = 2;
        loan.accel = [4.0; 3];
        loan.gyro = [-1.0; 3];
        loan.send().unwrap();
    });
    lp.run().unwrap();
    let got = got.borrow();
    assert_eq!(got[0], first);
    assert_eq!(
        got[1],
        Imu {
            time_ns: 2,
            accel: [4.0; 3],
            gyro: [-1.0; 3]
        }
    );
    let (name, size, align, _) = ch.recorded_type().unwrap();
    assert_eq!(
        (name.as_str(), size, align),
        ("Imu", std::mem::size_of::<Imu>() as u64, 8)
    );
    // The loop's report counts the sender's two sends.
    let rep = lp.report_now();
    let sender = rep
        .entries
        .iter()
        .find(|e| e.name == "/imu" && e.total == 2);
    assert!(sender.is_some(), "{rep:?}");
}

#[test]
fn a_watcher_of_another_type_is_refused_when_it_opens_the_channel() {
    let dir = tempfile::tempdir().unwrap();
    let _ch = channel(dir.path(), "/imu", 64);
    let Some(mut lp) = new_loop(dir.path()) else {
        return;
    };
    let _tx = lp.make_sender::<Imu>("/imu").unwrap();
    // Another process of the robot, built with another type for the
    // channel: same size, other layout.
    let Some(mut other) = new_loop(dir.path()) else {
        return;
    };
    assert_eq!(std::mem::size_of::<Imu>(), std::mem::size_of::<Odometry>());
    let e = other
        .watch::<Odometry>("/imu", |_, _| {})
        .expect_err("a watcher of another type must be refused");
    let text = e.to_string();
    assert!(
        matches!(
            e,
            LoopChannelError::Attach(ChannelAttachError::WrongType { .. })
        ),
        "{text}"
    );
    assert!(
        text.contains("carries `Imu` (32 bytes, align 8")
            && text.contains("opened it as `Odometry` (32 bytes, align 8"),
        "{text}"
    );
    // The right type still opens, and so does the byte API (tools).
    other.watch::<Imu>("/imu", |_, _| {}).unwrap();
    let ch = other.open_channel("/imu").unwrap();
    other.watch_raw(&ch, |_, _| {}).unwrap();
    // An array type is named as such.
    let e = other.make_sender::<[u64; 4]>("/imu").err().unwrap();
    assert!(e.to_string().contains("`[u64; 4]` (32 bytes"), "{e}");
}

#[test]
fn a_type_larger_than_the_channel_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // Slots round up to 64-byte lines: this one carries 64 bytes.
    let _ch = channel(dir.path(), "/small", 64);
    let Some(mut lp) = new_loop(dir.path()) else {
        return;
    };
    let e = lp.make_sender::<[u64; 16]>("/small").err().unwrap();
    assert!(
        e.to_string()
            .contains("carries messages of at most 64 bytes; `[u64; 16]` needs 128"),
        "{e}"
    );
    // A missing channel names its file.
    let e = lp.watch::<Imu>("/absent", |_, _| {}).err().unwrap();
    assert!(
        e.to_string()
            .contains(&format!("absent.v{}", controller::channel::LAYOUT_VERSION)),
        "{e}"
    );
}

#[test]
fn timer_handles_disable_and_reschedule() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut lp) = new_loop(dir.path()) else {
        return;
    };
    watchdog(&mut lp);
    let fired = Rc::new(Cell::new(0u32));
    let f = fired.clone();
    let period = Duration::from_millis(1);
    let now = Monotonic::now();
    let ticker = lp.add_timer("ticker", now + period, Some(period), move |_| {
        f.set(f.get() + 1);
    });
    // After 5 firings the ticker is disabled from another timer's handler,
    // then rescheduled once more, one-shot.
    let t = ticker.clone();
    let f = fired.clone();
    let stage = Rc::new(Cell::new(0u32));
    let s = stage.clone();
    let watcher_period = Duration::from_millis(2);
    lp.add_timer(
        "control",
        now + watcher_period,
        Some(watcher_period),
        move |ctx| match s.get() {
            0 if f.get() >= 5 => {
                t.disable();
                s.set(1);
            }
            // Disabled: no firing for ten periods of the controller.
            1..=10 => {
                if s.get() == 1 {
                    f.set(100);
                }
                s.set(s.get() + 1);
            }
            11 => {
                assert_eq!(f.get(), 100, "the disabled timer fired");
                t.schedule(ctx.now() + Duration::from_millis(1), None);
                s.set(12);
            }
            12..=20 => s.set(s.get() + 1),
            21 => {
                assert_eq!(
                    f.get(),
                    101,
                    "the rescheduled one-shot fired {} times",
                    f.get() - 100
                );
                ctx.exit();
            }
            _ => {}
        },
    );
    lp.run().unwrap();
    assert_eq!(stage.get(), 21);
}

#[test]
fn a_phased_loop_is_told_how_many_cycles_it_missed() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut lp) = new_loop(dir.path()) else {
        return;
    };
    watchdog(&mut lp);
    let seen = Rc::new(RefCell::new(vec![]));
    let s = seen.clone();
    lp.add_phased_loop(
        "control",
        Duration::from_millis(2),
        Duration::ZERO,
        move |ctx| {
            s.borrow_mut().push(ctx.missed_cycles());
            match s.borrow().len() {
                // Overrun: 7 ms in a 2 ms cycle.
                2 => std::thread::sleep(Duration::from_millis(7)),
                4 => ctx.exit(),
                _ => {}
            }
        },
    );
    lp.run().unwrap();
    let seen = seen.borrow();
    // The run after the overrun knows that at least three deadlines
    // passed unhandled (7 ms from a deadline: the next three are gone).
    assert!(seen[2] >= 3, "{seen:?}");
    assert_eq!(seen[0], 0, "{seen:?}");
}

/// The suite again under the JetPack 6 and no-io_uring kernel profiles,
/// where the probe must pick the doorbell backend.
#[test]
fn suites_on_old_kernel_profiles() {
    common::rerun_under_kernel_profiles(6);
}

#[test]
fn an_in_place_watcher_gets_what_it_read_and_loses_what_was_recycled_first() {
    const W: usize = 8192; // 64 KiB messages
    let dir = tempfile::tempdir().unwrap();
    let g = ChannelGeometry::new((W * 8) as u64, 4, 2);
    Channel::create(dir.path(), "/cloud", &g, None, Path::new(PROC)).unwrap();
    channel(dir.path(), "/trigger", 64);
    let Some(mut lp) = new_loop(dir.path()) else {
        return;
    };
    watchdog(&mut lp);
    let cloud = Rc::new(RefCell::new(lp.make_sender::<[u64; W]>("/cloud").unwrap()));
    let mut trigger = lp.make_sender::<u64>("/trigger").unwrap();
    let send = |tx: &Rc<RefCell<controller::event_loop::TypedSender<[u64; W]>>>, k: u64| {
        let mut tx = tx.borrow_mut();
        let mut loan = tx.loan().unwrap();
        loan[0] = k;
        loan[W - 1] = k;
        loan.send().unwrap();
    };
    let got = Rc::new(RefCell::new(vec![]));
    let g = got.clone();
    lp.watch_in_place::<[u64; W], _>(
        "/cloud",
        |v| (v.len(), v.word(0).unwrap(), v.word(W - 1).unwrap()),
        move |ctx, (len, first, last)| {
            g.borrow_mut().push((len, first, last, ctx.lost_before()));
            if first == 8 {
                ctx.exit();
            }
        },
    )
    .unwrap();
    // The trigger is older than cloud message 0, so its handler runs
    // first, while message 0 is staged (not read): it publishes eight more,
    // and the queue of four recycles message 0's slot before the in-place
    // watcher reads it.
    let c = cloud.clone();
    lp.watch::<u64>("/trigger", move |_, _| {
        for k in 1..=8 {
            send(&c, k);
        }
    })
    .unwrap();
    let c = cloud.clone();
    lp.on_run(move |_| {
        trigger.send(&0).unwrap();
        send(&c, 0);
    });
    lp.run().unwrap();
    // Message 0 overwritten, 1 to 4 gone from the queue: the first handled
    // (5) is told of all five.
    let bytes = W * 8;
    assert_eq!(
        *got.borrow(),
        vec![
            (bytes, 5, 5, 5),
            (bytes, 6, 6, 0),
            (bytes, 7, 7, 0),
            (bytes, 8, 8, 0)
        ]
    );
    let rep = lp.report_now();
    let w = rep
        .entries
        .iter()
        .find(|e| e.name == "/cloud" && e.count == 4)
        .unwrap_or_else(|| panic!("{rep:?}"));
    assert_eq!(w.lost, 5, "{w:?}");
}

#[test]
fn a_fetched_message_of_another_size_is_an_error_counted_not_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let ch = channel(dir.path(), "/imu", 64);
    let Some(mut lp) = new_loop(dir.path()) else {
        return;
    };
    let mut fetch = lp.make_fetcher::<Imu>("/imu").unwrap();
    // A tool on the byte API publishes a message that is not an `Imu`,
    // then an `Imu`.
    let mut bytes = ch.publisher(Path::new(PROC)).unwrap();
    bytes.publish(&[7u8; 8]).unwrap();
    let imu = Imu {
        time_ns: 3,
        accel: [1.0; 3],
        gyro: [2.0; 3],
    };
    bytes.publish_value(&imu).unwrap();
    let e = fetch.fetch_next().unwrap_err();
    assert_eq!(
        e,
        FetchError::WrongSize {
            index: 0,
            expected: std::mem::size_of::<Imu>(),
            got: 8
        }
    );
    assert!(e.to_string().contains("8 bytes"), "{e}");
    assert_eq!(fetch.wrong_size(), 1);
    // The fetcher moved on past it.
    assert_eq!(fetch.fetch_next().unwrap(), Some(&imu));
    assert_eq!(fetch.fetch_next().unwrap(), None);
    // The newest message: the same check.
    bytes.publish(&[9u8; 16]).unwrap();
    assert!(matches!(
        fetch.fetch_latest(),
        Err(FetchError::WrongSize { got: 16, .. })
    ));
    assert_eq!(fetch.wrong_size(), 2);
}
