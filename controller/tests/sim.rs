//! The example controllers in a simulation: the same code as the binaries
//! (`examples/controllers/`), on a virtual clock.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use controller::event_loop::{EventLoop, EventLoopCreateError, EventLoopRunError, LoopOptions};
use controller::sim::{LoopId, Sim, SimError, START};
use controller::{Backend, ChannelGeometry, Clock, Monotonic, VirtualClock};

#[allow(dead_code)] // the binaries' set-up; the tests need its message type
#[path = "../examples/common/mod.rs"]
mod common;
#[path = "../examples/controllers/listen.rs"]
mod listen;
#[path = "../examples/controllers/talk.rs"]
mod talk;

use common::Chatter;
use listen::{Listen, Summary};
use talk::Talk;

const CHATTER: &str = "/demo/chatter";
const SUMMARY: &str = "/demo/summary";

/// A simulation with the talker and the listener of the examples, the
/// listener publishing its summary every `summary_every` messages; and the
/// listener's loop.
fn robot(
    seed: u64,
    period: Duration,
    summary_every: u64,
) -> (Sim, LoopId, Rc<Cell<listen::Received>>) {
    let mut sim = Sim::with_seed(seed).unwrap();
    sim.create_channel(CHATTER, &ChannelGeometry::new(64, 64, 4))
        .unwrap();
    sim.create_channel(SUMMARY, &ChannelGeometry::new(64, 16, 4))
        .unwrap();
    let talker = sim.make_loop("talker").unwrap();
    let t = Talk {
        channel: CHATTER.into(),
        period,
        every: 0,
        count: 0,
    };
    talk::talk(sim.event_loop(talker), t).unwrap();
    let listener = sim.make_loop("listener").unwrap();
    let l = Listen {
        channel: CHATTER.into(),
        every: 0,
        count: 0,
        summary: Some((SUMMARY.into(), summary_every)),
        planted_bug: None,
    };
    let received = listen::listen(sim.event_loop(listener), l).unwrap();
    (sim, listener, received)
}

#[test]
fn a_talker_and_a_listener_run_a_simulated_hour_and_every_message_arrives_in_order_on_time() {
    let period = Duration::from_millis(1);
    let (mut sim, listener, received) = robot(1, period, 1000);
    // A third loop checks every message the talker sent: its sequence
    // number, and that it was sent at its phased loop's deadline, on the
    // virtual clock (a handler takes no virtual time).
    let checker = sim.make_loop("checker").unwrap();
    let seen = Rc::new(RefCell::new((0u64, Vec::<String>::new())));
    let s = seen.clone();
    sim.event_loop(checker)
        .watch::<Chatter>(CHATTER, move |ctx, m| {
            let (n, problems) = &mut *s.borrow_mut();
            if problems.len() < 5 {
                if m.seq != *n {
                    problems.push(format!("message {n} carries seq {}", m.seq));
                }
                if m.deadline_ns != ctx.event_time().as_nanos() {
                    problems.push(format!(
                        "seq {}: sent at {} for deadline {}",
                        m.seq,
                        ctx.event_time(),
                        m.deadline_ns
                    ));
                }
                if ctx.latency() != Duration::ZERO || ctx.lost_before() != 0 {
                    problems.push(format!(
                        "seq {}: latency {:?}, lost before {}",
                        m.seq,
                        ctx.latency(),
                        ctx.lost_before()
                    ));
                }
            }
            *n += 1;
        })
        .unwrap();
    let summaries = Rc::new(RefCell::new(Vec::<Summary>::new()));
    let got = summaries.clone();
    sim.event_loop(checker)
        .watch::<Summary>(SUMMARY, move |_, s| got.borrow_mut().push(*s))
        .unwrap();

    let wall = Instant::now();
    let run = sim.run_for(Duration::from_secs(3600)).unwrap();
    let wall = wall.elapsed();
    println!(
        "a simulated hour: {} turns at {} instants in {:.1} s of wall time",
        run.turns,
        run.instants,
        wall.as_secs_f64()
    );

    let (n, problems) = &*seen.borrow();
    assert!(problems.is_empty(), "{problems:#?}");
    // The phased loop's first deadline is the first millisecond after the
    // start; the last one is the hour's end.
    assert_eq!(*n, 3_600_000, "one message per millisecond of the hour");
    assert_eq!(run.now, START + Duration::from_secs(3600));
    assert!(!run.idle);
    let summaries = summaries.borrow();
    assert_eq!(summaries.len(), 3600, "a summary per 1000 messages");
    let last = summaries.last().unwrap();
    assert_eq!(last.count, 3_600_000);
    assert_eq!(last.last_seq, 3_599_999);
    assert_eq!(last.seq_sum, (0..3_600_000u64).sum::<u64>());
    // Every talker message was handled by the listener, with no latency:
    // its timing report is the real loop's, on the virtual clock.
    let report = sim.event_loop(listener).report_now();
    let w = report
        .entries
        .iter()
        .find(|e| e.name == CHATTER)
        .expect("the listener's watcher");
    assert_eq!(w.total, 3_600_000, "{w:?}");
    assert_eq!(w.lost, 0, "{w:?}");
    assert_eq!(report.backend, "simulated");
    let r = received.get();
    assert_eq!((r.got, r.lost, r.last_seq), (3_600_000, 0, Some(3_599_999)));
}

/// The order in which three loops' timers, all due at the same virtual
/// instants, ran.
fn order_of_events(seed: u64) -> Vec<(u64, &'static str)> {
    let mut sim = Sim::with_seed(seed).unwrap();
    let trace = Rc::new(RefCell::new(Vec::new()));
    for name in ["a", "b", "c"] {
        let id = sim.make_loop(name).unwrap();
        let t = trace.clone();
        let lp = sim.event_loop(id);
        lp.add_phased_loop(
            "tick",
            Duration::from_millis(10),
            Duration::ZERO,
            move |ctx| {
                t.borrow_mut().push((ctx.event_time().as_nanos(), name));
            },
        );
    }
    sim.run_for(Duration::from_secs(1)).unwrap();
    let v = trace.borrow().clone();
    v
}

#[test]
fn the_same_seed_gives_the_same_order_and_another_seed_reorders_events_due_together() {
    let a = order_of_events(1);
    assert_eq!(a.len(), 300, "three loops, a hundred instants each");
    assert_eq!(a, order_of_events(1), "same seed, same order");
    let b = order_of_events(2);
    assert_ne!(a, b, "another seed orders the loops differently");
    // The same events, only their order at an instant differs.
    let (mut sa, mut sb) = (a.clone(), b.clone());
    sa.sort_unstable();
    sb.sort_unstable();
    assert_eq!(sa, sb);
    assert!(a.windows(2).all(|w| w[0].0 <= w[1].0), "in time order");
}

#[test]
fn a_simulated_run_replays_the_same_messages_with_the_same_seed() {
    let run = |seed| {
        let (mut sim, _, _) = robot(seed, Duration::from_micros(500), 100);
        sim.run_for(Duration::from_secs(2)).unwrap();
        let ch = sim.open_channel(SUMMARY).unwrap();
        let mut r = ch.reader_at(0);
        let mut out = Vec::new();
        while let Some(m) = r.next_message().unwrap() {
            out.push((m.send_time_ns, m.data.to_vec()));
        }
        out
    };
    let a = run(5);
    assert_eq!(a.len(), 16, "the channel keeps its last 16 summaries");
    assert_eq!(a, run(5));
    assert_eq!(
        a.last().unwrap().0,
        (START + Duration::from_secs(2)).as_nanos(),
        "the last summary was sent at the run's end, on the virtual clock"
    );
}

#[test]
fn a_simulated_loop_is_refused_by_run_and_a_real_backend_on_a_virtual_clock_is_refused() {
    let clock = VirtualClock::new(Monotonic::from_nanos(5));
    let mut lp = EventLoop::new(LoopOptions {
        clock: Clock::Virtual(clock.clone()),
        ..LoopOptions::default()
    })
    .unwrap();
    assert_eq!(lp.backend(), Backend::Simulated);
    assert_eq!(lp.now(), Monotonic::from_nanos(5));
    assert!(matches!(lp.run(), Err(EventLoopRunError::Simulated)));
    let e = EventLoop::new(LoopOptions {
        clock: Clock::Virtual(clock),
        backend: Some(Backend::Doorbell),
        ..LoopOptions::default()
    })
    .err()
    .unwrap();
    assert!(
        matches!(e, EventLoopCreateError::SimulatedBackend(Backend::Doorbell)),
        "{e}"
    );
    let e = EventLoop::new(LoopOptions {
        backend: Some(Backend::Simulated),
        ..LoopOptions::default()
    })
    .err()
    .unwrap();
    assert!(e.to_string().contains("virtual clock"), "{e}");
}

#[test]
fn loops_that_publish_to_each_other_without_time_passing_are_stopped_and_the_instant_named() {
    let mut sim = Sim::with_seed(0).unwrap();
    for name in ["/ping", "/pong"] {
        sim.create_channel(name, &ChannelGeometry::new(8, 64, 4))
            .unwrap();
    }
    for (watch, answer) in [("/ping", "/pong"), ("/pong", "/ping")] {
        let id = sim.make_loop(&watch[1..]).unwrap();
        let lp = sim.event_loop(id);
        let mut out = lp.make_sender::<u64>(answer).unwrap();
        lp.watch::<u64>(watch, move |_, v| {
            let _ = out.send(&(v + 1));
        })
        .unwrap();
    }
    let first = sim.make_loop("starter").unwrap();
    let lp = sim.event_loop(first);
    let mut out = lp.make_sender::<u64>("/ping").unwrap();
    let at = lp.now() + Duration::from_millis(3);
    lp.add_timer("serve", at, None, move |_| {
        let _ = out.send(&0);
    });
    let e = sim.run_for(Duration::from_secs(1)).err().unwrap();
    match &e {
        SimError::Livelock { at: t, .. } => assert_eq!(*t, at),
        other => panic!("{other}"),
    }
    assert!(e.to_string().contains("1.003000000"), "{e}");
}

#[test]
fn a_simulation_link_that_is_no_socket_of_ours_is_refused_by_name() {
    use std::os::fd::AsRawFd;
    let opts = |fd: i32, clock: Clock| LoopOptions {
        sim_fd: Some(fd),
        clock,
        ..LoopOptions::default()
    };
    let virt = || Clock::Virtual(VirtualClock::new(START));
    let refusal = |o: LoopOptions| match EventLoop::new(o) {
        Err(e @ EventLoopCreateError::SimLink { .. }) => e.to_string(),
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("a link that is none was taken"),
    };
    // A number no descriptor has, a file that is no socket, a socket of
    // another type: each named, and the descriptor left to its owner.
    let e = refusal(opts(1 << 20, virt()));
    assert!(
        e.starts_with(
            "cannot take the simulation's link (RTDEPLOY_SIM=1048576): Bad file descriptor"
        ),
        "{e}"
    );
    let file = std::fs::File::open("/dev/null").unwrap();
    let e = refusal(opts(file.as_raw_fd(), virt()));
    assert!(e.contains("Socket operation on non-socket"), "{e}");
    let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
    let e = refusal(opts(a.as_raw_fd(), virt()));
    assert!(e.contains("a socket of type 1, not SOCK_SEQPACKET"), "{e}");
    // A link on CLOCK_MONOTONIC would be a real loop taking turns.
    let e = refusal(opts(a.as_raw_fd(), Clock::Monotonic));
    assert!(e.contains("a simulated loop needs a virtual one"), "{e}");
    // Still open: nothing adopted them.
    assert!(file.metadata().is_ok());
    assert!(a.peer_addr().is_ok());
}
