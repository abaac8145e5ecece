//! Wake classes on every backend the kernel has: a publisher wakes only
//! subscribers of its own class, and messages still cross classes, every
//! one of them, through the subscribers' own looks at the index within the
//! channel's cross-class bound (see `controller::wake`).
//!
//! These tests count wake syscalls and deliveries; they need no privilege.
//! Which task touches which futex word in the kernel is shown by the
//! tracefs census (`deploy/tests/census.rs`) and in the QEMU guests.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use controller::event_loop::{probe, Backend, EventLoop, LoopOptions};
use controller::{Channel, ChannelGeometry, WakeClass};

const PROC: &str = "/proc";

/// Every backend this kernel has (the doorbell always): the machines CI
/// runs on have all three, so a missing one here fails loudly below.
fn backends() -> Vec<Backend> {
    let p = probe();
    Backend::ALL.into_iter().filter(|&b| p.has(b)).collect()
}

#[test]
fn ci_machines_have_every_backend() {
    let p = probe();
    assert_eq!(
        backends(),
        Backend::ALL.to_vec(),
        "kernel {} lacks a wake backend: {p:?}",
        p.kernel
    );
}

/// A message as a listener got it: its publisher's class, its sequence
/// number and its wakeup latency.
type Got = (WakeClass, u64, u64);

fn channel(dir: &Path, bound: Duration) -> Channel {
    let geom = ChannelGeometry::new(16, 1024, 4).with_cross_class(bound);
    Channel::create(dir, "/classes", &geom, None, Path::new(PROC))
        .unwrap()
        .0
}

/// A loop of `class` on `backend` watching `ch` in its own thread until
/// `want` messages arrived (or 30 s passed, which fails the test), that
/// keeps `(sender class, seq, latency)` of each, and gives them with its
/// report's cross-class count and its count of messages found without a
/// wake (`healed`).
fn listener(
    ch: &Channel,
    backend: Backend,
    class: WakeClass,
    want: usize,
    armed: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(Vec<Got>, u64, u64)> {
    let ch = ch.clone();
    std::thread::spawn(move || {
        let mut lp = EventLoop::new(LoopOptions {
            backend: Some(backend),
            class,
            ..LoopOptions::default()
        })
        .unwrap();
        assert_eq!((lp.backend(), lp.class()), (backend, class));
        let got = Arc::new(Mutex::new(Vec::new()));
        let g = got.clone();
        lp.watch_raw(&ch, move |ctx, m| {
            let seq = u64::from_ne_bytes(m.data[..8].try_into().unwrap());
            let mut g = g.lock().unwrap();
            g.push((m.sender_class, seq, ctx.latency().as_nanos() as u64));
            if g.len() >= want {
                ctx.exit();
            }
        })
        .unwrap();
        let deadline = controller::Monotonic::now() + Duration::from_secs(30);
        lp.add_timer("watchdog", deadline, None, move |_| {
            panic!("no {want} messages within 30 s")
        });
        lp.on_run(move |_| armed.store(true, Ordering::SeqCst));
        lp.run().unwrap();
        let report = lp.report_now();
        let entry = report
            .entries
            .iter()
            .find(|e| e.name == "/classes")
            .unwrap();
        let v = got.lock().unwrap().clone();
        (v, entry.cross_class.unwrap(), entry.healed)
    })
}

fn wait_armed(flags: &[&Arc<AtomicBool>]) {
    for _ in 0..10_000 {
        if flags.iter().all(|f| f.load(Ordering::SeqCst)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("listeners never ran");
}

#[test]
fn a_publisher_never_wakes_a_subscriber_of_the_other_class() {
    for b in backends() {
        for (pub_class, sub_class) in [
            (WakeClass::BestEffort, WakeClass::RealTime),
            (WakeClass::RealTime, WakeClass::BestEffort),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let ch = channel(dir.path(), Duration::from_millis(100));
            const N: usize = 50;
            let armed = Arc::new(AtomicBool::new(false));
            let l = listener(&ch, b, sub_class, N, armed.clone());
            wait_armed(&[&armed]);
            let mut p = ch.publisher_as(pub_class, Path::new(PROC)).unwrap();
            for i in 0..N as u64 {
                let r = p.publish(&i.to_ne_bytes()).unwrap();
                assert!(
                    !r.woke,
                    "{b}: a {pub_class} publisher woke a {sub_class} subscriber"
                );
                std::thread::sleep(Duration::from_millis(2));
            }
            assert_eq!(p.wake_syscalls(), 0, "{b}");
            let (got, cross, healed) = l.join().unwrap();
            // Every message, in order, each found by the subscriber's own
            // look: none by a wake.
            let seqs: Vec<u64> = got.iter().map(|g| g.1).collect();
            assert_eq!(seqs, (0..N as u64).collect::<Vec<_>>(), "{b}");
            assert!(got.iter().all(|g| g.0 == pub_class), "{b}");
            assert_eq!(cross, N as u64, "{b}: cross-class deliveries counted");
            // Messages of the other class are never announced by a wake:
            // finding them by a look is no lost wake.
            assert_eq!(healed, 0, "{b}: cross-class messages counted as lost wakes");
        }
    }
}

#[test]
fn every_message_crosses_classes_within_the_bound_and_wakes_stay_in_their_class() {
    let bound = Duration::from_millis(500);
    for b in backends() {
        let dir = tempfile::tempdir().unwrap();
        let ch = channel(dir.path(), bound);
        const N: usize = 100;
        let (ra, ba) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let rt = listener(&ch, b, WakeClass::RealTime, 2 * N, ra.clone());
        let be = listener(&ch, b, WakeClass::BestEffort, 2 * N, ba.clone());
        wait_armed(&[&ra, &ba]);
        let wakes = Arc::new(AtomicU64::new(0));
        let talkers: Vec<_> = [WakeClass::RealTime, WakeClass::BestEffort]
            .into_iter()
            .map(|class| {
                let (ch, wakes) = (ch.clone(), wakes.clone());
                std::thread::spawn(move || {
                    let mut p = ch.publisher_as(class, Path::new(PROC)).unwrap();
                    for i in 0..N as u64 {
                        p.publish(&i.to_ne_bytes()).unwrap();
                        std::thread::sleep(Duration::from_millis(3));
                    }
                    wakes.fetch_add(p.wake_syscalls(), Ordering::SeqCst);
                    (class, p.wake_syscalls())
                })
            })
            .collect();
        let made: Vec<(WakeClass, u64)> = talkers.into_iter().map(|t| t.join().unwrap()).collect();
        for (listener_class, l) in [(WakeClass::RealTime, rt), (WakeClass::BestEffort, be)] {
            let (got, cross, _) = l.join().unwrap();
            for class in WakeClass::ALL {
                let mut seqs: Vec<u64> = got.iter().filter(|g| g.0 == class).map(|g| g.1).collect();
                seqs.sort_unstable();
                assert_eq!(
                    seqs,
                    (0..N as u64).collect::<Vec<_>>(),
                    "{b}: the {listener_class} listener missed {class} messages"
                );
            }
            assert_eq!(cross, N as u64, "{b}: {listener_class}");
            // Half the bound between looks, so the bound holds with half
            // of it to spare for the listener's own wakeup.
            let worst = got
                .iter()
                .filter(|g| g.0 != listener_class)
                .map(|g| g.2)
                .max()
                .unwrap();
            assert!(
                worst <= bound.as_nanos() as u64,
                "{b}: a message reached the {listener_class} listener {worst} ns after it was sent (bound {bound:?})"
            );
        }
        // Each talker woke its own class's listener, which slept most of
        // the time: wake syscalls happened on both sides.
        for (class, n) in made {
            assert!(n > 0, "{b}: the {class} talker never woke its listener");
        }
    }
}
