//! The roles on our runtime, written as a controller would write them:
//! receivers are an [`EventLoop`] watching the channel (one io_uring
//! futex wait kept armed on it, or the backend the kernel offers) with a
//! handler (by default one that gets the message held in its slot:
//! [`EventLoop::watch_held`]); senders loan the channel's next slot, write
//! the message in place and send it ([`Publisher::loan`]).
//!
//! The parent creates the channels (as the supervisor does on a robot);
//! the roles only open them.

use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;

use anyhow::{bail, Context as _, Result};

use controller::channel::{Channel, ChannelGeometry, Keep, Publisher};
use controller::event_loop::{Ctx, EventLoop, LoopOptions, TypedSender};
use controller::timing_report::EntryKind;
use units::error::Chain;

use crate::message::{fill, read, STOP};
use crate::role::{now_ns, wait_for_stdin_to_close, Role, RoleResult, RoleSpec};
use crate::settings::Receive;
use crate::with_words;

const PROC: &str = "/proc";

/// The channels a run of `role_pair` under `base` uses.
pub fn channels(role_pair: Role, base: &str) -> Vec<String> {
    match role_pair {
        Role::Ping | Role::Pong => vec![format!("{base}/ping"), format!("{base}/pong")],
        _ => vec![format!("{base}/data")],
    }
}

/// Creates channel `name` for messages of `size` bytes in a ring of
/// `depth`, with `holds` hold records (one per subscribing process whose
/// receivers hold messages; each costs a slot) and what it keeps once
/// read, the parent's job, as the supervisor's on a robot.
pub fn create_channel(
    dir: &Path,
    name: &str,
    size: usize,
    depth: u64,
    holds: u32,
    keep: Keep,
) -> Result<()> {
    let geom = ChannelGeometry::new(size as u64, depth, 1)
        .with_holds(holds)
        .with_keep(keep);
    Channel::create(dir, name, &geom, None, Path::new(PROC))
        .map_err(|e| anyhow::anyhow!("{}", Chain(&e)))
        .with_context(|| format!("creating channel {name} in {}", dir.display()))?;
    Ok(())
}

/// Runs `spec`'s role; `ready` is called once attached.
pub fn run(spec: &RoleSpec, ready: &dyn Fn() -> Result<()>) -> Result<RoleResult> {
    with_words!(spec.size, W => match spec.role {
        Role::Ping => ping::<W>(spec, ready),
        Role::Pong => pong::<W>(spec, ready),
        Role::PeriodicSender => periodic_sender::<W>(spec, ready),
        Role::WakeReceiver => wake_receiver::<W>(spec, ready),
        Role::PublishCost => publish_cost::<W>(spec, ready),
        Role::IdleSubscriber => idle_subscriber(spec, ready),
        Role::BurstSender => burst_sender::<W>(spec, ready),
        Role::Drain => drain::<W>(spec, ready),
    })
}

/// The benchmark's processes are a real-time pair (SCHED_FIFO on CPUs of
/// their own): their loops and publishers are of the real-time wake class,
/// as robot.yaml would make them (see `controller::wake`).
fn event_loop(spec: &RoleSpec) -> Result<EventLoop> {
    EventLoop::new(LoopOptions {
        shm_dir: spec.names.ours_dir.clone(),
        class: controller::WakeClass::RealTime,
        ..LoopOptions::default()
    })
    .map_err(|e| anyhow::anyhow!("{}", Chain(&e)))
    .context("creating the event loop")
}

fn publisher<const W: usize>(spec: &RoleSpec, name: &str) -> Result<Publisher> {
    let ch = Channel::open(&spec.names.ours_dir, name)
        .map_err(|e| anyhow::anyhow!("{}", Chain(&e)))
        .with_context(|| format!("opening channel {name}"))?;
    let mut p = ch
        .publisher_as(controller::WakeClass::RealTime, Path::new(PROC))
        .map_err(|e| anyhow::anyhow!("{}", Chain(&e)))
        .with_context(|| format!("attaching a publisher to {name}"))?;
    p.reserve_loans::<[u64; W]>();
    Ok(p)
}

/// The loop's backend and the messages its wake check found (no wake
/// came for them), once it ran.
fn after_run(lp: EventLoop) -> (String, u64) {
    let healed = lp
        .report_now()
        .entries
        .iter()
        .filter(|e| e.kind == EntryKind::Watcher)
        .map(|e| e.healed)
        .sum();
    (lp.backend().name().to_string(), healed)
}

/// Loans the next slot, writes the whole message in place, sends it.
#[inline]
fn send<const W: usize>(p: &mut Publisher, stamp: u64, seq: u64) -> Result<()> {
    let mut loan = p.loan::<[u64; W]>().context("loaning a slot")?;
    fill::<W>(&mut loan, stamp, seq);
    loan.send().context("sending")?;
    Ok(())
}

/// [`send`] through an event loop's sender.
#[inline]
fn send_typed<const W: usize>(tx: &mut TypedSender<[u64; W]>, stamp: u64, seq: u64) -> Result<()> {
    let mut loan = tx.loan().context("loaning a slot")?;
    fill::<W>(&mut loan, stamp, seq);
    loan.send().context("sending")?;
    Ok(())
}

/// Watches `base/channel` for `[u64; W]` messages and calls `handler`
/// with each one's stamp and sequence number (words 0 and `W - 1`), read
/// as `--receive` says: from the message held in its slot while the
/// handler runs (as iceoryx2's receivers read a sample they hold), in the
/// slot with a check that it was not recycled meanwhile (nothing else of
/// the message is touched either way), or from the loop's copy of the
/// whole message. The message is never a value on the stack: the loop
/// hands out a reference.
fn watch_words<const W: usize>(
    lp: &mut EventLoop,
    spec: &RoleSpec,
    channel: &str,
    mut handler: impl FnMut(&mut Ctx, (u64, u64)) + 'static,
) -> Result<()> {
    let name = format!("{}/{channel}", spec.base);
    match spec.receive {
        Receive::Held => lp.watch_held::<[u64; W]>(&name, move |ctx, m| handler(ctx, read(m))),
        Receive::InPlace => lp.watch_in_place::<[u64; W], _>(
            &name,
            |v| (v.word(0).unwrap_or(STOP), v.word(W - 1).unwrap_or(0)),
            handler,
        ),
        Receive::Copy => lp.watch::<[u64; W]>(&name, move |ctx, m| handler(ctx, read(m))),
    }
    .map_err(|e| anyhow::anyhow!("{}", Chain(&e)))
}

/// Handler state shared with the loop's closures (one thread).
struct Shared<T>(Rc<RefCell<T>>);

impl<T> Shared<T> {
    fn new(v: T) -> Self {
        Shared(Rc::new(RefCell::new(v)))
    }
    fn handle(&self) -> Self {
        Shared(self.0.clone())
    }
}

/// Side A: the loop watches `pong`; its first ping goes out when the loop
/// runs, each pong's handler records the round trip and sends the next.
fn ping<const W: usize>(spec: &RoleSpec, ready: &dyn Fn() -> Result<()>) -> Result<RoleResult> {
    struct State<const W: usize> {
        tx: TypedSender<[u64; W]>,
        sent_stamp: u64,
        done: u64,
        total: u64,
        warmup: u64,
        result: RoleResult,
        error: Option<anyhow::Error>,
    }
    impl<const W: usize> State<W> {
        fn next(&mut self) {
            if self.done == self.total {
                if let Err(e) = send_typed::<W>(&mut self.tx, STOP, 0) {
                    self.error = Some(e);
                }
                return;
            }
            let t0 = now_ns();
            self.sent_stamp = t0;
            if let Err(e) = send_typed::<W>(&mut self.tx, t0, self.done) {
                self.error = Some(e);
            }
        }
    }
    let mut lp = event_loop(spec)?;
    let total = spec.warmup + spec.count;
    let tx = lp
        .make_sender::<[u64; W]>(&format!("{}/ping", spec.base))
        .map_err(|e| anyhow::anyhow!("{}", Chain(&e)))?;
    let st = Shared::new(State::<W> {
        tx,
        sent_stamp: 0,
        done: 0,
        total,
        warmup: spec.warmup,
        result: RoleResult {
            samples_ns: Vec::with_capacity(spec.count as usize),
            ..RoleResult::default()
        },
        error: None,
    });
    let h = st.handle();
    watch_words::<W>(&mut lp, spec, "pong", move |ctx, (stamp, _)| {
        let now = now_ns();
        let mut s = h.0.borrow_mut();
        if stamp != s.sent_stamp {
            s.result.mismatched += 1;
        }
        if s.done >= s.warmup {
            let rtt = now.saturating_sub(s.sent_stamp);
            s.result.samples_ns.push(rtt);
        }
        s.result.received += 1;
        s.result.lost += ctx.lost_before();
        s.done += 1;
        s.next();
        if s.done == s.total || s.error.is_some() {
            ctx.exit();
        }
    })?;
    let h = st.handle();
    lp.on_run(move |ctx| {
        let mut s = h.0.borrow_mut();
        s.next();
        if s.error.is_some() {
            ctx.exit();
        }
    });
    ready()?;
    lp.run().map_err(|e| anyhow::anyhow!("{}", Chain(&e)))?;
    let (backend, healed) = after_run(lp);
    let mut s = st.0.borrow_mut();
    if let Some(e) = s.error.take() {
        return Err(e);
    }
    let mut r = std::mem::take(&mut s.result);
    r.backend = Some(backend);
    r.healed = healed;
    Ok(r)
}

/// Side B: the loop watches `ping`; the handler sends the pong (echoing
/// word 0) and the loop exits on the stop message.
fn pong<const W: usize>(spec: &RoleSpec, ready: &dyn Fn() -> Result<()>) -> Result<RoleResult> {
    let mut lp = event_loop(spec)?;
    let mut tx = lp
        .make_sender::<[u64; W]>(&format!("{}/pong", spec.base))
        .map_err(|e| anyhow::anyhow!("{}", Chain(&e)))?;
    let st = Shared::new((RoleResult::default(), None::<anyhow::Error>));
    let h = st.handle();
    watch_words::<W>(&mut lp, spec, "ping", move |ctx, (stamp, seq)| {
        let mut s = h.0.borrow_mut();
        if stamp == STOP {
            ctx.exit();
            return;
        }
        s.0.received += 1;
        s.0.lost += ctx.lost_before();
        if let Err(e) = send_typed::<W>(&mut tx, stamp, seq) {
            s.1 = Some(e);
            ctx.exit();
        }
    })?;
    ready()?;
    lp.run().map_err(|e| anyhow::anyhow!("{}", Chain(&e)))?;
    let (backend, healed) = after_run(lp);
    let mut s = st.0.borrow_mut();
    if let Some(e) = s.1.take() {
        return Err(e);
    }
    let mut r = std::mem::take(&mut s.0);
    r.backend = Some(backend);
    r.healed = healed;
    Ok(r)
}

/// Sleeps to absolute deadlines `period` apart and sends its send time.
fn periodic_sender<const W: usize>(
    spec: &RoleSpec,
    ready: &dyn Fn() -> Result<()>,
) -> Result<RoleResult> {
    let mut p = publisher::<W>(spec, &format!("{}/data", spec.base))?;
    ready()?;
    let total = spec.warmup + spec.count;
    let mut deadline = now_ns() + spec.period_ns;
    for seq in 0..total {
        crate::role::sleep_until(deadline);
        send::<W>(&mut p, now_ns(), seq)?;
        // About to sleep: the next slot into cache meanwhile (what an
        // event loop does for its senders before it sleeps).
        p.warm_next();
        deadline += spec.period_ns;
    }
    crate::role::sleep_until(deadline);
    send::<W>(&mut p, STOP, total)?;
    Ok(RoleResult {
        received: total,
        ..RoleResult::default()
    })
}

/// The loop watches `data`; the handler records now - the send time.
fn wake_receiver<const W: usize>(
    spec: &RoleSpec,
    ready: &dyn Fn() -> Result<()>,
) -> Result<RoleResult> {
    let mut lp = event_loop(spec)?;
    let st = Shared::new(RoleResult {
        samples_ns: Vec::with_capacity(spec.count as usize),
        ..RoleResult::default()
    });
    let h = st.handle();
    let warmup = spec.warmup;
    watch_words::<W>(&mut lp, spec, "data", move |ctx, (stamp, _)| {
        let now = now_ns();
        let mut r = h.0.borrow_mut();
        if stamp == STOP {
            ctx.exit();
            return;
        }
        r.lost += ctx.lost_before();
        if r.received + r.lost >= warmup {
            r.samples_ns.push(now.saturating_sub(stamp));
        }
        r.received += 1;
    })?;
    ready()?;
    lp.run().map_err(|e| anyhow::anyhow!("{}", Chain(&e)))?;
    let (backend, healed) = after_run(lp);
    let mut r = std::mem::take(&mut *st.0.borrow_mut());
    r.backend = Some(backend);
    r.healed = healed;
    Ok(r)
}

/// Timed batches of back-to-back publishes (loan, write, send), with a
/// subscriber attached in another process that never waits: no wake is
/// due, so none is made.
fn publish_cost<const W: usize>(
    spec: &RoleSpec,
    ready: &dyn Fn() -> Result<()>,
) -> Result<RoleResult> {
    let mut p = publisher::<W>(spec, &format!("{}/data", spec.base))?;
    let ch = p.channel().clone();
    if ch.waiters(controller::WakeClass::RealTime) != 0 {
        bail!(
            "a subscriber of {} is waiting; this measures publishing with none waiting",
            ch.name()
        );
    }
    ready()?;
    let mut r = RoleResult {
        batch_ns: Vec::with_capacity(spec.count as usize),
        ..RoleResult::default()
    };
    let mut seq = 0u64;
    for b in 0..spec.warmup + spec.count {
        let t0 = now_ns();
        for _ in 0..spec.batch {
            send::<W>(&mut p, seq, seq)?;
            seq += 1;
        }
        let t1 = now_ns();
        if b >= spec.warmup {
            r.batch_ns.push(t1 - t0);
        }
    }
    if p.wake_syscalls() != 0 {
        bail!(
            "{} of {} publishes made a wake syscall: a subscriber was waiting after all",
            p.wake_syscalls(),
            seq
        );
    }
    r.received = seq;
    Ok(r)
}

/// A subscriber attached to `data` that never waits and never reads.
fn idle_subscriber(spec: &RoleSpec, ready: &dyn Fn() -> Result<()>) -> Result<RoleResult> {
    let name = format!("{}/data", spec.base);
    let ch = Channel::open(&spec.names.ours_dir, &name)
        .map_err(|e| anyhow::anyhow!("{}", Chain(&e)))
        .with_context(|| format!("opening channel {name}"))?;
    let sub = ch
        .subscriber(Path::new(PROC))
        .map_err(|e| anyhow::anyhow!("{}", Chain(&e)))?;
    ready()?;
    wait_for_stdin_to_close();
    drop(sub);
    Ok(RoleResult::default())
}

/// How long a burst sender waits, quiet, before it sends its stop
/// message a second time: several copies of the largest message.
const STOP_AGAIN_AFTER: std::time::Duration = std::time::Duration::from_millis(2);

/// Publishes `count` messages back to back (word 0: the sequence number),
/// then the stop message (twice, see below).
fn burst_sender<const W: usize>(
    spec: &RoleSpec,
    ready: &dyn Fn() -> Result<()>,
) -> Result<RoleResult> {
    let mut p = publisher::<W>(spec, &format!("{}/data", spec.base))?;
    ready()?;
    let start = now_ns();
    for seq in 0..spec.count {
        send::<W>(&mut p, seq, seq)?;
    }
    let end = now_ns();
    send::<W>(&mut p, STOP, spec.count)?;
    // The stop again once the channel has been quiet a while. A receiver
    // copying whole messages (`--receive copy`) that the burst lapped
    // `2 * depth + 16` times in a row gives up on the message it was
    // copying and goes on at the newest index, counting what it skipped
    // as lost: a stop sent the moment before is skipped with it. With
    // nothing written meanwhile its next copy succeeds, so it reads this
    // one. A receiver that read the first stop has exited already.
    std::thread::sleep(STOP_AGAIN_AFTER);
    send::<W>(&mut p, STOP, spec.count + 1)?;
    Ok(RoleResult {
        received: spec.count,
        start_ns: start,
        end_ns: end,
        ..RoleResult::default()
    })
}

/// The loop watches `data` and counts what it handles and what it lost.
fn drain<const W: usize>(spec: &RoleSpec, ready: &dyn Fn() -> Result<()>) -> Result<RoleResult> {
    let mut lp = event_loop(spec)?;
    let st = Shared::new(RoleResult::default());
    let h = st.handle();
    watch_words::<W>(&mut lp, spec, "data", move |ctx, (stamp, _)| {
        let mut r = h.0.borrow_mut();
        r.lost += ctx.lost_before();
        if stamp == STOP {
            r.last_ns = now_ns();
            ctx.exit();
            return;
        }
        r.received += 1;
    })?;
    ready()?;
    lp.run().map_err(|e| anyhow::anyhow!("{}", Chain(&e)))?;
    let (backend, healed) = after_run(lp);
    let mut r = std::mem::take(&mut *st.0.borrow_mut());
    r.backend = Some(backend);
    r.healed = healed;
    Ok(r)
}
