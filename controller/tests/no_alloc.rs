//! Zero heap allocations per message on the publish and handle paths after
//! start-up, asserted with the runtime's own counting allocator.

mod common;

use std::path::Path;
use std::time::Duration;

use controller::event_loop::{probe, Backend, EventLoop, LoopOptions, TimingOptions};
use controller::rt::{allocations, set_alloc_trap, AllocTrap, AllocTrapGuard, TrapAlloc};
use controller::{Channel, ChannelGeometry};

#[global_allocator]
static ALLOC: TrapAlloc<std::alloc::System> = TrapAlloc(std::alloc::System);

const PROC: &str = "/proc";

#[test]
fn the_counter_sees_allocations() {
    let _g = AllocTrapGuard::new(AllocTrap::Count);
    let before = allocations();
    let v: Vec<u64> = std::hint::black_box(Vec::with_capacity(100));
    drop(v);
    assert_eq!(allocations() - before, 1);
}

#[test]
fn publish_allocates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let geom = ChannelGeometry::new(64, 256, 1).with_retention(Duration::from_nanos(1));
    let (ch, _) = Channel::create(dir.path(), "/na/pub", &geom, None, Path::new(PROC)).unwrap();
    let mut p = ch.publisher(Path::new(PROC)).unwrap();
    let mut s = ch.subscriber(Path::new(PROC)).unwrap();
    let payload = [7u8; 64];
    p.publish(&payload).unwrap();
    s.next_message().unwrap().unwrap();
    let _g = AllocTrapGuard::new(AllocTrap::Count);
    let before = allocations();
    for i in 0..10_000u64 {
        p.publish(&payload).unwrap();
        if i % 2 == 0 {
            s.next_message().unwrap().unwrap();
        }
        let _ = s.latest().unwrap();
        // Errors on the real-time path are Copy values, no allocation.
        assert!(p.publish(&[0u8; 65]).is_err());
    }
    assert_eq!(
        allocations() - before,
        0,
        "allocations on the publish/read path"
    );
}

#[test]
fn holding_and_releasing_allocates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let geom = ChannelGeometry::new(1 << 16, 4, 1).with_holds(2);
    let (ch, _) = Channel::create(dir.path(), "/na/hold", &geom, None, Path::new(PROC)).unwrap();
    let mut p = ch.publisher(Path::new(PROC)).unwrap();
    let mut s = ch.subscriber(Path::new(PROC)).unwrap();
    assert_eq!(s.claim_holds(2, Path::new(PROC)).unwrap(), 2);
    let payload = vec![7u8; 1 << 16];
    let _g = AllocTrapGuard::new(AllocTrap::Count);
    let before = allocations();
    let mut kept = None;
    for i in 0..2_000u64 {
        p.publish(&payload).unwrap();
        let h = s.hold_next().unwrap().unwrap();
        assert_eq!(h.bytes()[100], 7);
        // Every tenth is kept across the next publishes (its slot traded).
        if i % 10 == 0 {
            kept = Some(h);
        }
    }
    drop(kept);
    assert_eq!(allocations() - before, 0, "allocations holding messages");
}

#[test]
fn event_loop_handle_path_allocates_nothing() {
    let p = probe();
    let mut backends = Vec::new();
    if p.io_uring_futex {
        backends.push(Backend::IoUringFutex);
    } else {
        println!("skipping io_uring-futex: {:?}", p.io_uring_problem);
    }
    if p.futex_waitv {
        backends.push(Backend::FutexWaitv);
    }
    backends.push(Backend::Doorbell);
    for b in backends {
        let dir = tempfile::tempdir().unwrap();
        let geom = ChannelGeometry::new(64, 1024, 2);
        let (ch, _) =
            Channel::create(dir.path(), "/na/loop", &geom, None, Path::new(PROC)).unwrap();
        let mut lp = EventLoop::new(LoopOptions {
            backend: Some(b),
            timing: Some(TimingOptions {
                shm_dir: dir.path().into(),
                process: "na".into(),
                period: Duration::from_millis(5),
            }),
            ..LoopOptions::default()
        })
        .unwrap();
        const WARMUP: u64 = 200;
        const N: u64 = 5_000;
        let mut echo = lp.make_raw_sender(&ch).unwrap();
        let mut count = 0u64;
        let mut before = 0;
        lp.watch_raw(&ch, move |ctx, m| {
            count += 1;
            // The loop's own echo messages are tagged; don't echo them.
            if m.data[0] == 1 {
                return;
            }
            if count == WARMUP {
                set_alloc_trap(AllocTrap::Count);
                before = allocations();
            }
            // A handler that publishes: the send path is measured too.
            echo.publish(&[1u8; 64]).unwrap();
            if m.value::<[u64; 8]>().map(|v| v[1]) == Some(N - 1) {
                let n = allocations() - before;
                set_alloc_trap(AllocTrap::Off);
                assert_eq!(n, 0, "allocations while handling (backend {b})");
                ctx.exit();
            }
        })
        .unwrap();
        let ch2 = ch.clone();
        let t = std::thread::spawn(move || {
            let mut p = ch2.publisher(Path::new(PROC)).unwrap();
            for i in 0..N {
                p.publish_value(&[0u64, i, 0, 0, 0, 0, 0, 0]).unwrap();
                if i % 4 == 0 {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
        });
        lp.run().unwrap();
        t.join().unwrap();
        // Reports were published while counting (period 5 ms).
        let rep = controller::timing_report::read_latest(dir.path(), "na")
            .unwrap()
            .unwrap();
        assert!(rep.seq >= 2, "seq {}", rep.seq);
    }
}

/// The suite again under the JetPack 6 and no-io_uring kernel profiles,
/// where the probe must pick the doorbell backend.
#[test]
fn suites_on_old_kernel_profiles() {
    common::rerun_under_kernel_profiles(4);
}
