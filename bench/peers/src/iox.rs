//! The roles on iceoryx2, on its recommended fast path: the `ipc` service
//! type, a publish-subscribe service of `[u64; W]` beside an event
//! service. A sender loans an uninitialised sample, writes the message in
//! place, sends it and notifies the event service; a receiver sleeps in
//! its event listener's wait, then takes every sample there. The wait is
//! a timed one that runs out after 50 ms, the safety net our event loop
//! has too (its wake check): iceoryx2 0.10's listener can miss a wake,
//! and a receiver must not sleep forever on a sample that is there.
//!
//! Each run has its own file prefix and root path (see
//! [`crate::role::Names`]), so its files are told apart from any other
//! iceoryx2 user's and removed by the parent afterwards.
#![allow(unsafe_code)]

use std::cell::Cell;
use std::fmt::Debug;

use anyhow::{anyhow, bail, Result};
use iceoryx2::port::listener::Listener;
use iceoryx2::port::notifier::Notifier;
use iceoryx2::port::publisher::Publisher;
use iceoryx2::port::subscriber::Subscriber;
use iceoryx2::prelude::*;

use controller::event_loop::DEFAULT_WAKE_CHECK as WAKE_CHECK;

use crate::message::{fill_uninit, read, STOP};
use crate::role::{now_ns, wait_for_stdin_to_close, Role, RoleResult, RoleSpec};
use crate::with_words;

type Ipc = ipc::Service;

/// iceoryx2's errors say what they are in their Debug form.
fn ok<T, E: Debug>(r: Result<T, E>, what: &str) -> Result<T> {
    r.map_err(|e| anyhow!("iceoryx2: {what}: {e:?}"))
}

/// The configuration every process of the run uses: the run's prefix and
/// root path, the defaults otherwise.
fn config(spec: &RoleSpec) -> Result<Config> {
    let mut cfg = Config::default();
    cfg.global.prefix = ok(
        FileName::new(spec.names.iox_prefix.as_bytes()),
        "file prefix",
    )?;
    cfg.global
        .set_root_path(&ok(Path::new(spec.names.iox_root.as_bytes()), "root path")?);
    Ok(cfg)
}

fn node(spec: &RoleSpec) -> Result<Node<Ipc>> {
    ok(
        NodeBuilder::new()
            .config(&config(spec)?)
            // The parent ends a role with SIGKILL; no handler of its own.
            .signal_handling_mode(SignalHandlingMode::Disabled)
            .create::<Ipc>(),
        "creating the node",
    )
}

/// One direction of traffic: the samples and the event that announces them.
struct Topic<const W: usize> {
    data: iceoryx2::service::port_factory::publish_subscribe::PortFactory<Ipc, [u64; W], ()>,
    event: iceoryx2::service::port_factory::event::PortFactory<Ipc>,
}

impl<const W: usize> Topic<W> {
    fn open(node: &Node<Ipc>, spec: &RoleSpec, name: &str) -> Result<Self> {
        let full = format!("{}/{name}", spec.base);
        let data_name = ok(ServiceName::new(&full), "service name")?;
        let data = ok(
            node.service_builder(&data_name)
                .publish_subscribe::<[u64; W]>()
                .subscriber_max_buffer_size(spec.depth as usize)
                .max_subscribers(8)
                .max_publishers(2)
                .history_size(0)
                .enable_safe_overflow(true)
                .open_or_create(),
            "publish-subscribe service",
        )?;
        let event_name = ok(ServiceName::new(&format!("{full}/event")), "service name")?;
        let event = ok(
            node.service_builder(&event_name).event().open_or_create(),
            "event service",
        )?;
        Ok(Topic { data, event })
    }

    fn sender(&self) -> Result<Sender<W>> {
        Ok(Sender {
            publisher: ok(self.data.publisher_builder().create(), "publisher")?,
            notifier: ok(self.event.notifier_builder().create(), "notifier")?,
        })
    }

    fn receiver(&self, depth: u64) -> Result<Receiver<W>> {
        Ok(Receiver {
            subscriber: ok(
                self.data
                    .subscriber_builder()
                    .buffer_size(depth as usize)
                    .create(),
                "subscriber",
            )?,
            listener: ok(self.event.listener_builder().create(), "listener")?,
            timed_out: Cell::new(false),
            healed: Cell::new(0),
        })
    }
}

struct Sender<const W: usize> {
    publisher: Publisher<Ipc, [u64; W], ()>,
    notifier: Notifier<Ipc>,
}

impl<const W: usize> Sender<W> {
    /// Loans a sample, writes the whole message in place, sends it.
    #[inline]
    fn publish(&self, stamp: u64, seq: u64) -> Result<()> {
        let mut sample = ok(self.publisher.loan_uninit(), "loan")?;
        fill_uninit::<W>(sample.payload_mut(), stamp, seq);
        // SAFETY: `fill_uninit` wrote every word of the payload.
        let sample = unsafe { sample.assume_init() };
        ok(sample.send(), "send")?;
        Ok(())
    }

    /// Wakes the listeners.
    #[inline]
    fn notify(&self) -> Result<()> {
        ok(self.notifier.notify(), "notify")?;
        Ok(())
    }

    #[inline]
    fn send(&self, stamp: u64, seq: u64) -> Result<()> {
        self.publish(stamp, seq)?;
        self.notify()
    }
}

struct Receiver<const W: usize> {
    subscriber: Subscriber<Ipc, [u64; W], ()>,
    listener: Listener<Ipc>,
    /// The last wait ran out its time instead of being woken.
    timed_out: Cell<bool>,
    /// Samples found after a wait that ran out: no wake came for them.
    healed: Cell<u64>,
}

impl<const W: usize> Receiver<W> {
    /// Sleeps in the listener until notified, or at most [`WAKE_CHECK`]:
    /// the same safety net as our loop's wake check, for a wake that never
    /// comes (iceoryx2 0.10's listener can miss one; see the README). A
    /// timed wait costs what a blocking one does (each sets the socket's
    /// receive timeout).
    #[inline]
    fn wait(&self) -> Result<()> {
        let t0 = now_ns();
        ok(self.listener.timed_wait(|_| {}, WAKE_CHECK), "timed wait")?;
        self.timed_out
            .set(now_ns() - t0 >= WAKE_CHECK.as_nanos() as u64);
        Ok(())
    }

    /// Takes the next sample and hands its stamp and sequence to `f`
    /// (the handler: it runs while the sample is held), then releases it.
    #[inline]
    fn take(&self, f: impl FnOnce(u64, u64)) -> Result<bool> {
        match ok(self.subscriber.receive(), "receive")? {
            Some(sample) => {
                let (stamp, seq) = read::<W>(sample.payload());
                f(stamp, seq);
                drop(sample);
                if self.timed_out.replace(false) {
                    self.healed.set(self.healed.get() + 1);
                }
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

/// A role's results and, for a sending role, its ports: they stay open
/// until the parent has every side's results. An iceoryx2 subscriber that
/// has not connected to a publisher yet (a starved one of several on one
/// CPU) finds nothing once that publisher is gone, where a real publisher
/// would have lived on.
pub type Finished = (RoleResult, Option<Box<dyn std::any::Any>>);

/// Runs `spec`'s role; `ready` is called once attached.
pub fn run(spec: &RoleSpec, ready: &dyn Fn() -> Result<()>) -> Result<Finished> {
    let node = node(spec)?;
    with_words!(spec.size, W => match spec.role {
        Role::Ping => ping::<W>(&node, spec, ready),
        Role::Pong => pong::<W>(&node, spec, ready),
        Role::PeriodicSender => periodic_sender::<W>(&node, spec, ready),
        Role::WakeReceiver => wake_receiver::<W>(&node, spec, ready),
        Role::PublishCost => publish_cost::<W>(&node, spec, ready),
        Role::IdleSubscriber => idle_subscriber::<W>(&node, spec, ready),
        Role::BurstSender => burst_sender::<W>(&node, spec, ready),
        Role::Drain => drain::<W>(&node, spec, ready),
    })
}

/// Side A: send a ping, sleep until the pong's event, take the pong.
fn ping<const W: usize>(
    node: &Node<Ipc>,
    spec: &RoleSpec,
    ready: &dyn Fn() -> Result<()>,
) -> Result<Finished> {
    let tx = Topic::<W>::open(node, spec, "ping")?.sender()?;
    let rx = Topic::<W>::open(node, spec, "pong")?.receiver(spec.depth)?;
    ready()?;
    let total = spec.warmup + spec.count;
    let mut r = RoleResult {
        samples_ns: Vec::with_capacity(spec.count as usize),
        ..RoleResult::default()
    };
    for i in 0..total {
        let t0 = now_ns();
        tx.send(t0, i)?;
        loop {
            rx.wait()?;
            let mut got = None;
            rx.take(|stamp, _| got = Some((now_ns(), stamp)))?;
            if let Some((now, stamp)) = got {
                if stamp != t0 {
                    r.mismatched += 1;
                }
                if i >= spec.warmup {
                    r.samples_ns.push(now.saturating_sub(t0));
                }
                r.received += 1;
                break;
            }
        }
    }
    tx.send(STOP, 0)?;
    r.healed = rx.healed.get();
    Ok((r, Some(Box::new(tx))))
}

/// Side B: sleep until the ping's event, take it, send the pong.
fn pong<const W: usize>(
    node: &Node<Ipc>,
    spec: &RoleSpec,
    ready: &dyn Fn() -> Result<()>,
) -> Result<Finished> {
    let rx = Topic::<W>::open(node, spec, "ping")?.receiver(spec.depth)?;
    let tx = Topic::<W>::open(node, spec, "pong")?.sender()?;
    ready()?;
    let mut r = RoleResult::default();
    loop {
        rx.wait()?;
        loop {
            let mut got = None;
            if !rx.take(|stamp, seq| got = Some((stamp, seq)))? {
                break;
            }
            let (stamp, seq) = got.expect("set by take");
            if stamp == STOP {
                r.healed = rx.healed.get();
                return Ok((r, None));
            }
            r.received += 1;
            tx.send(stamp, seq)?;
        }
    }
}

fn periodic_sender<const W: usize>(
    node: &Node<Ipc>,
    spec: &RoleSpec,
    ready: &dyn Fn() -> Result<()>,
) -> Result<Finished> {
    let tx = Topic::<W>::open(node, spec, "data")?.sender()?;
    ready()?;
    let total = spec.warmup + spec.count;
    let mut deadline = now_ns() + spec.period_ns;
    for seq in 0..total {
        crate::role::sleep_until(deadline);
        tx.send(now_ns(), seq)?;
        deadline += spec.period_ns;
    }
    crate::role::sleep_until(deadline);
    tx.send(STOP, total)?;
    let r = RoleResult {
        received: total,
        ..RoleResult::default()
    };
    Ok((r, Some(Box::new(tx))))
}

/// Sleeps in the listener; for each sample taken, now - its send time.
fn wake_receiver<const W: usize>(
    node: &Node<Ipc>,
    spec: &RoleSpec,
    ready: &dyn Fn() -> Result<()>,
) -> Result<Finished> {
    let rx = Topic::<W>::open(node, spec, "data")?.receiver(spec.depth)?;
    ready()?;
    let mut r = RoleResult {
        samples_ns: Vec::with_capacity(spec.count as usize),
        ..RoleResult::default()
    };
    let mut expected_seq = 0u64;
    loop {
        rx.wait()?;
        loop {
            let mut got = None;
            if !rx.take(|stamp, seq| got = Some((now_ns(), stamp, seq)))? {
                break;
            }
            let (now, stamp, seq) = got.expect("set by take");
            if stamp == STOP {
                // Every message before the stop was sent: what did not
                // arrive was overwritten unread.
                r.lost = (spec.warmup + spec.count).saturating_sub(r.received);
                r.healed = rx.healed.get();
                return Ok((r, None));
            }
            if W > 1 {
                // The sequence number says what was overwritten unread.
                r.lost += seq.saturating_sub(expected_seq);
                expected_seq = seq + 1;
            }
            if r.received + r.lost >= spec.warmup {
                r.samples_ns.push(now.saturating_sub(stamp));
            }
            r.received += 1;
        }
    }
}

/// Timed batches of back-to-back publishes, while a subscriber (and its
/// listener) exists in another process that never waits: alternately with
/// the notify each publish needs to wake a waiting listener, and without.
fn publish_cost<const W: usize>(
    node: &Node<Ipc>,
    spec: &RoleSpec,
    ready: &dyn Fn() -> Result<()>,
) -> Result<Finished> {
    let tx = Topic::<W>::open(node, spec, "data")?.sender()?;
    ready()?;
    let mut r = RoleResult {
        batch_ns: Vec::with_capacity(spec.count as usize),
        batch_send_only_ns: Vec::with_capacity(spec.count as usize),
        ..RoleResult::default()
    };
    let mut seq = 0u64;
    for b in 0..spec.warmup + spec.count {
        let t0 = now_ns();
        for _ in 0..spec.batch {
            tx.send(seq, seq)?;
            seq += 1;
        }
        let t1 = now_ns();
        for _ in 0..spec.batch {
            tx.publish(seq, seq)?;
            seq += 1;
        }
        let t2 = now_ns();
        if b >= spec.warmup {
            r.batch_ns.push(t1 - t0);
            r.batch_send_only_ns.push(t2 - t1);
        }
    }
    r.received = seq;
    Ok((r, Some(Box::new(tx))))
}

/// A subscriber and a listener that never wait and never read.
fn idle_subscriber<const W: usize>(
    node: &Node<Ipc>,
    spec: &RoleSpec,
    ready: &dyn Fn() -> Result<()>,
) -> Result<Finished> {
    let rx = Topic::<W>::open(node, spec, "data")?.receiver(spec.depth)?;
    ready()?;
    wait_for_stdin_to_close();
    drop(rx);
    Ok((RoleResult::default(), None))
}

fn burst_sender<const W: usize>(
    node: &Node<Ipc>,
    spec: &RoleSpec,
    ready: &dyn Fn() -> Result<()>,
) -> Result<Finished> {
    let tx = Topic::<W>::open(node, spec, "data")?.sender()?;
    ready()?;
    let start = now_ns();
    for seq in 0..spec.count {
        tx.send(seq, seq)?;
    }
    let end = now_ns();
    tx.send(STOP, spec.count)?;
    let r = RoleResult {
        received: spec.count,
        start_ns: start,
        end_ns: end,
        ..RoleResult::default()
    };
    Ok((r, Some(Box::new(tx))))
}

/// Sleeps in the listener, takes every sample there, counts what it took
/// (in order: word 0 is the sequence number).
fn drain<const W: usize>(
    node: &Node<Ipc>,
    spec: &RoleSpec,
    ready: &dyn Fn() -> Result<()>,
) -> Result<Finished> {
    let rx = Topic::<W>::open(node, spec, "data")?.receiver(spec.depth)?;
    ready()?;
    let mut r = RoleResult::default();
    let mut expected = 0u64;
    loop {
        rx.wait()?;
        loop {
            let mut got = None;
            if !rx.take(|stamp, seq| got = Some((stamp, seq)))? {
                break;
            }
            let (stamp, _) = got.expect("set by take");
            if stamp == STOP {
                r.last_ns = now_ns();
                // Every message before the stop was sent: what did not
                // arrive was overwritten unread.
                r.lost = spec.count.saturating_sub(r.received);
                r.healed = rx.healed.get();
                return Ok((r, None));
            }
            if stamp < expected {
                bail!("sample {stamp} arrived after {expected}: out of order");
            }
            expected = stamp + 1;
            r.received += 1;
        }
    }
}
