//! The roles that move messages: the real-time sender and receiver of the
//! scenario, and the lower-priority processes publishing and subscribing
//! on the same channel; the receiver's trace markers and its stop on a
//! budget miss.

use super::*;

/// Stop polling interval for waits (bounded so a stop request is seen).
pub(super) const WAIT_SLICE_NS: u64 = 20_000_000;

pub(super) fn rt_send(a: &Args) -> Result<(), WorkerRunError> {
    let shared = a.shared()?;
    let ctl = shared.control();
    let mech = a.mech()?;
    rt_setup(ctl, a, Some(a.u64("priority")? as u32))?;
    let ch = open_channel(a)?;
    let mut publisher = ch
        .publisher_as(mech.classes().0, &a.path("proc")?)
        .map_err(WorkerRunError::Attach)?;
    let period = a.u64("period_ns")?.max(1);
    let send_h = shared.hist(mech, H_SEND);
    let mut peers = notified(mech).then(|| Peers::new(CELLS));
    let marker = a.opt_path("trace").and_then(|d| TraceMarker::open(&d));
    // Acquire: pairs with the receiver's Release store; its subscription
    // is in place before the first message.
    while ctl.receiver_ready.load(Ordering::Acquire) == 0 {
        if ctl.rt_stop.load(Ordering::Relaxed) != 0 {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut seq = 0u64;
    let mut next = monotonic_ns() + period;
    // Relaxed: a stop request; the engine reaps this process before it
    // reads the histograms.
    while ctl.rt_stop.load(Ordering::Relaxed) == 0 {
        sleep_until(Monotonic::from_nanos(next));
        // New or gone receivers are (dis)connected outside the timed call.
        if let Some(p) = peers.as_mut() {
            p.refresh(&ctl.cells);
        }
        let failed_before = peers.as_ref().map_or(0, |p| p.failed());
        let payload = [TAG_RT, seq];
        // Outside the timed call; Relaxed: a hint (a marker more or less).
        if let Some(m) = &marker {
            if ctl.trace_armed.load(Ordering::Relaxed) != 0 {
                m.mark("send", seq, monotonic_ns());
            }
        }
        let t0 = monotonic_ns();
        let r = publisher.publish_value(&payload);
        // The message is in the channel; now wake every receiver.
        if let Some(p) = peers.as_mut() {
            p.notify_all();
        }
        let t1 = monotonic_ns();
        if let Some(p) = peers.as_ref() {
            count_notify_failures(ctl, p, failed_before);
        }
        match r {
            Ok(_) => {
                send_h.record(t1 - t0);
                shared.mark(MARK_SENT, seq);
            }
            Err(_) => send_h.error(),
        }
        seq += 1;
        next += period;
        let now = monotonic_ns();
        if now > next {
            next += ((now - next) / period + 1) * period;
        }
    }
    Ok(())
}

/// Records one received message: lost messages before it count as
/// errors; its delivery latency is recorded when its tag is `only` (or
/// always when `None`).
/// A real-time receiver also marks each real-time message in `seen`.
#[inline]
pub(super) fn record_message(
    h: &Histogram,
    latency_ns: u64,
    m: &Message,
    only: Option<u64>,
    seen: Seen,
) {
    for _ in 0..m.lost_before {
        h.error();
    }
    let (tag, seq) = tag_seq(m);
    if only.is_none_or(|t| t == tag) {
        h.record(latency_ns);
    }
    if let (Some(shared), TAG_RT) = (seen, tag) {
        shared.mark(MARK_SEEN, seq);
        if let Some(t) = RECV_TRACE.get() {
            t.handled(seq, m.send_time_ns, latency_ns);
        }
    }
}

/// Where a real-time receiver marks what it saw.
pub(super) type Seen = Option<&'static Shared>;

/// The instance's `tracing_on`, open for writing: a worker that sees a
/// miss turns the instance off through it.
pub(super) fn open_tracing_on(instance: &Path) -> Result<std::fs::File, WorkerRunError> {
    let path = instance.join("tracing_on");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .map_err(|source| WorkerRunError::File {
            what: "open",
            path,
            source,
        })
}

/// The instance's `trace_marker`, open for writing (see [`crate::trace`]).
pub(super) struct TraceMarker(std::fs::File);

impl TraceMarker {
    /// Opens `<instance>/trace_marker`; `None` when there is none (the
    /// run goes on without markers).
    pub(super) fn open(instance: &Path) -> Option<TraceMarker> {
        std::fs::OpenOptions::new()
            .write(true)
            .open(instance.join("trace_marker"))
            .ok()
            .map(TraceMarker)
    }

    /// Writes `rtdeploy <what> seq=<seq> t=<t_ns>` with no allocation.
    pub(super) fn mark(&self, what: &str, seq: u64, t_ns: u64) {
        controller::miss_trace::write_marker(
            &self.0,
            format_args!("rtdeploy {what} seq={seq} t={t_ns}"),
        );
    }
}

/// The real-time receiver's side of tracing: the handler marker, and on a
/// message over `miss_ns` the instance stopped at once.
pub(super) struct RecvTrace {
    pub(super) marker: Option<TraceMarker>,
    pub(super) on: std::fs::File,
    pub(super) miss_ns: u64,
    pub(super) ctl: &'static Control,
}

/// Set once in the real-time receiver when the run traces; never in
/// other roles (so the handler path pays one load when not tracing).
pub(super) static RECV_TRACE: std::sync::OnceLock<RecvTrace> = std::sync::OnceLock::new();

impl RecvTrace {
    pub(super) fn handled(&self, seq: u64, send_ns: u64, latency_ns: u64) {
        let ctl = self.ctl;
        let over = latency_ns > self.miss_ns;
        if over {
            ctl.trace_over.fetch_add(1, Ordering::Relaxed); // a statistic
        }
        // Relaxed: a hint; the compare-exchange below decides.
        if ctl.trace_armed.load(Ordering::Relaxed) == 0 {
            return;
        }
        let handler_ns = send_ns.saturating_add(latency_ns);
        if let Some(m) = &self.marker {
            m.mark("handler", seq, handler_ns);
        }
        if over {
            stop_on_miss(ctl, &self.on, seq, send_ns, handler_ns, None);
        }
    }
}

/// Turns the instance off (through `on`, its `tracing_on`) for a miss,
/// when it is armed, and tells the engine which: `seq`, the event at
/// `send_ns` (a send, a deadline) handled at `handler_ns`, by the
/// real-time receiver or, with `timer`, the timer worker of that slot and
/// pid. One miss at a time: the first to disarm it wins.
pub(super) fn stop_on_miss(
    ctl: &Control,
    on: &std::fs::File,
    seq: u64,
    send_ns: u64,
    handler_ns: u64,
    timer: Option<(usize, u32)>,
) {
    if ctl
        .trace_armed
        .compare_exchange(1, 0, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        return;
    }
    let _ = (&*on).write_all(b"0");
    ctl.trace_miss_seq.store(seq, Ordering::Relaxed);
    ctl.trace_miss_send_ns.store(send_ns, Ordering::Relaxed);
    ctl.trace_miss_handler_ns
        .store(handler_ns, Ordering::Relaxed);
    if let Some((slot, pid)) = timer {
        ctl.trace_miss_timer
            .store(slot as u64 + 1, Ordering::Relaxed);
        ctl.trace_miss_pid.store(u64::from(pid), Ordering::Relaxed);
    }
    // Release: the engine that sees the flag (Acquire) sees the words
    // above.
    ctl.trace_miss.store(1, Ordering::Release);
}

pub(super) fn tag_seq(m: &Message) -> (u64, u64) {
    m.value::<[u64; 2]>().map_or((0, 0), |v| (v[0], v[1]))
}

pub(super) fn tag_of(m: &Message) -> u64 {
    tag_seq(m).0
}

/// Whether publishers wake receivers through [`crate::notify`] (not the
/// channel's futex word) with `mech`.
pub(super) fn notified(mech: Mechanism) -> bool {
    matches!(
        mech,
        Mechanism::Eventfd | Mechanism::Signalfd | Mechanism::MsgRing
    )
}

/// Drains `sub`, recording each message's delivery latency.
pub(super) fn drain(
    sub: &mut controller::channel::Subscriber,
    h: &Histogram,
    only: Option<u64>,
    seen: Seen,
) {
    loop {
        let m = match sub.next_message() {
            Ok(Some(m)) => m,
            Ok(None) => break,
            Err(controller::channel::ChannelFault::Truncated) => break,
            // Counted by the subscriber; it has resynchronised to the
            // index, so reading on is bounded.
            Err(_) => continue,
        };
        let now = monotonic_ns();
        if tag_of(&m) != TAG_STOP {
            record_message(h, now.saturating_sub(m.send_time_ns), &m, only, seen);
        }
    }
}

/// Receives on `ch` woken by `mech` until `stop()` is true, recording each
/// message's delivery latency (send time -> handler start) into `h`.
/// `ready` runs once the first wait is armed.
///
/// The runtime's backends and the one-word reference run the runtime's
/// own event loop (with that backend forced, in wake class `class`); the
/// plain futex uses the channel's blocking wait; eventfd and signalfd
/// block in their [`Waiter`], whose address is published in `cell` for
/// the publishers, then drain the channel.
#[allow(clippy::too_many_arguments)]
pub(super) fn receive(
    mech: Mechanism,
    class: controller::WakeClass,
    ch: &Channel,
    proc_root: &Path,
    h: &'static Histogram,
    only: Option<u64>,
    cell: &AddressCell,
    seen: Seen,
    stop: impl Fn() -> bool + 'static,
    ready: impl FnOnce() + 'static,
) -> Result<(), WorkerRunError> {
    match mech {
        Mechanism::IoUringFutex
        | Mechanism::FutexWaitv
        | Mechanism::Doorbell
        | Mechanism::IoUringShared => {
            let backend = mech.backend().unwrap_or(Backend::Doorbell);
            let mut lp = EventLoop::new(LoopOptions {
                backend: Some(backend),
                timing: None,
                proc_root: proc_root.into(),
                // As a controller under the supervisor would run it.
                wake_check: LoopOptions::from_env().wake_check,
                class,
                ..LoopOptions::default()
            })
            .map_err(|source| WorkerRunError::Loop {
                mechanism: mech,
                source,
            })?;
            // No timer on the real-time loop: the engine publishes a
            // TAG_STOP message after raising a stop word.
            lp.watch_raw(ch, move |ctx, m| {
                let tag = tag_of(m);
                if tag == TAG_STOP {
                    if stop() {
                        ctx.exit();
                    }
                    return;
                }
                record_message(h, ctx.latency().as_nanos() as u64, m, only, seen)
            })
            .map_err(WorkerRunError::Watch)?;
            let mut ready = Some(ready);
            lp.on_run(move |_| {
                if let Some(r) = ready.take() {
                    r();
                }
            });
            let r = lp.run().map_err(|source| WorkerRunError::LoopRun {
                mechanism: mech,
                source,
            });
            if let Some(shared) = seen {
                // SeqCst: read by the engine after it reaped this process;
                // stored while the loop still holds its words.
                shared
                    .control()
                    .rt_recv_ended_ns
                    .store(Monotonic::now().as_nanos(), Ordering::SeqCst);
                let healed: u64 = lp.report_now().entries.iter().map(|e| e.healed).sum();
                // SeqCst: read by the engine after it reaped this process.
                shared.control().rt_healed.store(healed, Ordering::SeqCst);
            }
            r
        }
        Mechanism::Futex => {
            let mut sub = ch.subscriber(proc_root).map_err(WorkerRunError::Attach)?;
            sub.skip_to_end();
            ready();
            while !stop() {
                sub.wait(Some(Duration::from_nanos(WAIT_SLICE_NS)));
                drain(&mut sub, h, only, seen);
            }
            // Everything published before the stop request.
            drain(&mut sub, h, only, seen);
            Ok(())
        }
        Mechanism::Eventfd | Mechanism::Signalfd | Mechanism::MsgRing => {
            let mut sub = ch.subscriber(proc_root).map_err(WorkerRunError::Attach)?;
            let waiter = match mech {
                Mechanism::Eventfd => Waiter::eventfd(),
                Mechanism::MsgRing => Waiter::msg_ring(),
                _ => Waiter::signal(check_signal()),
            }
            .map_err(|source| WorkerRunError::Waiter {
                mechanism: mech,
                source,
            })?;
            // No futex wait is ever armed (`begin_wait` is not called), so
            // publishers make no futex wake: the mechanism is the only wake.
            sub.skip_to_end();
            let gen = cell.publish(&waiter.address());
            ready();
            // Blocking waits without a timeout: the engine notifies every
            // filled cell after raising a stop word (and the counter or
            // the signal queue keeps a notification that arrives before
            // the wait).
            let r = loop {
                if stop() {
                    drain(&mut sub, h, only, seen);
                    break Ok(());
                }
                if let Err(source) = waiter.wait() {
                    break Err(WorkerRunError::Wait {
                        mechanism: mech,
                        source,
                    });
                }
                drain(&mut sub, h, only, seen);
            };
            cell.clear(gen);
            r
        }
        Mechanism::Pipe => Err(WorkerRunError::Unavailable {
            mechanism: mech,
            reason: MechanismUnavailableError::NotDriven { mechanism: mech },
        }),
    }
}

/// Opens the shared file for the life of the process (handlers of the
/// event loop need `'static` references into it; the process exits when
/// the role ends).
pub(super) fn shared_static(a: &Args) -> Result<&'static Shared, WorkerRunError> {
    Ok(Box::leak(Box::new(a.shared()?)))
}

pub(super) fn rt_recv(a: &Args) -> Result<(), WorkerRunError> {
    let shared = shared_static(a)?;
    let ctl = shared.control();
    let mech = a.mech()?;
    mechanism_availability(mech).map_err(|reason| WorkerRunError::Unavailable {
        mechanism: mech,
        reason,
    })?;
    rt_setup(ctl, a, Some(a.u64("priority")? as u32))?;
    if let Some(dir) = a.opt_path("trace") {
        let on = open_tracing_on(&dir)?;
        let _ = RECV_TRACE.set(RecvTrace {
            marker: TraceMarker::open(&dir),
            on,
            miss_ns: a.u64("miss_ns")?,
            ctl,
        });
    }
    let ch = open_channel(a)?;
    let h = shared.hist(mech, H_DELIVERY);
    receive(
        mech,
        mech.classes().0,
        &ch,
        &a.path("proc")?,
        h,
        Some(TAG_RT),
        &ctl.cells[RT_CELL],
        Some(shared),
        // SeqCst: raised by the engine after the sender exited; whoever
        // sees it has every real-time message before it in the channel.
        move || ctl.rt_recv_stop.load(Ordering::SeqCst) != 0,
        // Release: the subscription is in place before the sender's first
        // message (its Acquire load of this word).
        move || ctl.receiver_ready.store(1, Ordering::Release),
    )?;
    if ctl.rt_recv_stop.load(Ordering::SeqCst) == 0 {
        return Err(WorkerRunError::StoppedEarly { mechanism: mech });
    }
    // SeqCst: read by the engine after it reaped this process.
    ctl.rt_recv_done.store(1, Ordering::SeqCst);
    Ok(())
}

pub(super) fn low(a: &Args) -> Result<(), WorkerRunError> {
    let shared = shared_static(a)?;
    let ctl = shared.control();
    let mech = a.mech()?;
    let slot = a.index("slot", MAX_LOW)?;
    let gen = a.u64("gen")?;
    rt_setup(ctl, a, None)?;
    ctl.low_started.fetch_add(1, Ordering::Relaxed); // a statistic
    let ch = open_channel(a)?;
    let proc_root = a.path("proc")?;
    let period = a.u64("period_ns")?.max(1);
    let running = move || {
        // Relaxed: stop requests; see rt_send.
        ctl.stop_all.load(Ordering::Relaxed) == 0
            && ctl.low_gen[slot].load(Ordering::Relaxed) == gen
    };
    let cell = a.index("cell", CELLS)?;
    let mut publisher = ch
        .publisher_as(mech.classes().1, &proc_root)
        .map_err(WorkerRunError::Attach)?;
    let mut peers = notified(mech).then(|| Peers::new(CELLS));
    let publisher_thread = std::thread::Builder::new()
        .name("rtd-low-pub".into())
        .spawn(move || {
            let mut seq = 0u64;
            let mut next = monotonic_ns() + period;
            while running() {
                sleep_until(Monotonic::from_nanos(next));
                if let Some(p) = peers.as_mut() {
                    p.refresh(&ctl.cells);
                    let before = p.failed();
                    let _ = publisher.publish_value(&[TAG_LOW, seq]);
                    p.notify_all();
                    count_notify_failures(ctl, p, before);
                } else {
                    let _ = publisher.publish_value(&[TAG_LOW, seq]);
                }
                seq += 1;
                next += period;
                let now = monotonic_ns();
                if now > next {
                    next += ((now - next) / period + 1) * period;
                }
            }
        })
        .map_err(WorkerRunError::Thread)?;
    let h = shared.hist(mech, H_LOW_DELIVERY);
    let r = receive(
        mech,
        mech.classes().1,
        &ch,
        &proc_root,
        h,
        None,
        &ctl.cells[cell],
        None,
        move || !running(),
        || {},
    );
    let _ = publisher_thread.join();
    r
}
