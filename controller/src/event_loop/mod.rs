//! The event loop: handlers for the messages of watched channels and for
//! timers on absolute `CLOCK_MONOTONIC` deadlines, run on one thread in
//! event-time order, with the loop asleep in between. A loop made on a
//! virtual clock ([`crate::time::Clock`]) is the same loop in simulation:
//! it never sleeps, and its simulation gives it turns (`sim`, and
//! [`crate::sim`]).
//!
//! - The loop sleeps through one internal interface (`wait::Wait`), one
//!   module per backend: `uring` (one `IORING_OP_FUTEX_WAIT` kept armed
//!   per watched channel, Linux 6.7+), `waitv` (one `futex_waitv` call
//!   over every watched word, 5.16+) and `bell` (one `FUTEX_WAIT_BITSET`
//!   on the loop's own bell, any kernel: the 5.10 and 5.15 of JetPack 5
//!   and 6, systems where io_uring is switched off, and every real-time
//!   loop, see [`crate::wake`]). `backend` probes the kernel and picks.
//! - Timers and phased loops (`timer`) are the sleep's own timeout;
//!   periods missed while the loop was late are skipped and counted.
//! - Everything ready after a wake is handled in event-time order (message
//!   send time, timer deadline).
//! - Wakes can be lost: another process of the group may scribble on the
//!   waiter count (publishers then skip the wake), or a publisher may die
//!   between announcing a message and waking. So the loop looks at the
//!   index of every watched channel itself every
//!   [`LoopOptions::wake_check`] and handles what no wake announced,
//!   counting it (`healed` in the timing report: each message of the
//!   loop's own wake class that was there before its sleep ended, with no
//!   wake for it; messages of the other class are never announced and are
//!   counted as `cross_class` instead): a lost wakeup costs at most that
//!   much latency, never the message.
//! - A channel's faults (corrupt or truncated shared memory, see
//!   [`crate::channel::ChannelFault`]) are counted per watcher; a
//!   truncated channel stops being watched, the rest of the loop runs on.
//! - The API: [`EventLoop`] and its [`LoopOptions`] (`options`), the
//!   [`Ctx`] a handler gets (`ctx`), watchers (`watch`), senders and
//!   fetchers (`send`), and the timing report (`report`), whose counts
//!   are those of the channel layer: a sender's are its publisher's.

mod backend;
mod bell;
mod ctx;
mod options;
mod report;
mod send;
mod sim;
mod timer;
mod uring;
mod wait;
mod waitv;
mod watch;

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use crate::channel::{Channel, ChannelAttachError, ChannelFault, ChannelOpenError, InPlace};
use crate::sys;
use crate::time::{Clock, Monotonic};
use crate::wake::{Attach, AttachMismatchError, WakeClass};
use units::env::ProcessEnvError;

#[cfg(feature = "fault-injection")]
pub use backend::hide_backends_from_probe;
pub use backend::{probe, Backend, ProbeReport};
pub use ctx::Ctx;
pub use options::{LoopOptions, TimingOptions, DEFAULT_WAKE_CHECK};
pub use send::{FetchError, FrameSender, TypedFetcher, TypedSender};
pub use sim::TurnEnd;
pub use timer::TimerHandle;

use report::Reporting;
use send::SenderStats;
use timer::Timers;
use wait::{Sleep, Wait};
use watch::{Handler, Watcher};

/// Creating an event loop failed.
#[derive(Debug, thiserror::Error)]
pub enum EventLoopCreateError {
    #[error("backend {backend} is not available on kernel {kernel}: {reason}")]
    BackendUnavailable {
        backend: Backend,
        kernel: String,
        reason: String,
    },
    #[error("cannot set up the io_uring: {0}")]
    Ring(io::Error),
    #[error("cannot create the timing channel of process `{process}`: {reason}")]
    Timing { process: String, reason: String },
    #[error("the supervisor's environment is not one this runtime reads")]
    Environment(#[source] ProcessEnvError),
    #[error("refused to attach")]
    Attach(#[source] AttachMismatchError),
    #[error("a loop on a virtual clock is simulated: it cannot run on backend {0}")]
    SimulatedBackend(Backend),
    #[error("cannot take the simulation's link ({var}={fd}): {reason}", var = units::env::SIM)]
    SimLink { fd: i32, reason: String },
}

/// Running an event loop failed.
#[derive(Debug, thiserror::Error)]
pub enum EventLoopRunError {
    #[error("io_uring_enter failed: {0}")]
    Enter(io::Error),
    #[error("futex_waitv failed")]
    Waitv(#[source] io::Error),
    #[error("the doorbell wait failed")]
    Bell(#[source] io::Error),
    #[error("cannot set up this loop's doorbell")]
    Doorbell(#[source] crate::doorbell::BellError),
    #[error("cannot list this loop's doorbell in channel {channel}")]
    Listing {
        channel: String,
        #[source]
        source: ChannelAttachError,
    },
    #[error("a futex wait on channel {channel} failed: {errno}")]
    Wait { channel: String, errno: io::Error },
    #[error("nothing left to wait for: channel {channel} failed: {fault}")]
    ChannelFailed {
        channel: String,
        fault: ChannelFault,
    },
    #[error(
        "this loop is simulated: its simulation runs it (controller::sim), not EventLoop::run"
    )]
    Simulated,
    #[error("this loop is not simulated: it runs on CLOCK_MONOTONIC with EventLoop::run")]
    NotSimulated,
    #[error("the link to the simulation's coordinator: {0}")]
    SimLink(String),
}

/// Opening a channel by name for a loop failed.
#[derive(Debug, thiserror::Error)]
pub enum LoopChannelError {
    #[error(transparent)]
    Open(#[from] ChannelOpenError),
    #[error(transparent)]
    Attach(#[from] ChannelAttachError),
    #[error(transparent)]
    Sched(#[from] AttachMismatchError),
    #[error("channel {channel}: none of its {records} hold records is free (robot.yaml `channels[].holds` gives each subscribing process its own)")]
    NoHold { channel: String, records: u32 },
}

type HookFn = Box<dyn FnMut(&mut Ctx)>;

/// One event loop. Not `Send`: it lives on the thread that runs it (an
/// io_uring backend's ring is SINGLE_ISSUER).
pub struct EventLoop {
    /// How the loop sleeps. First: the io_uring a backend may hold is
    /// dropped before the watchers whose futex words its waits name.
    wait: Box<dyn Wait>,
    watchers: Vec<Watcher>,
    timers: Timers,
    senders: Vec<SenderStats>,
    on_run: Vec<HookFn>,
    exit: bool,
    proc_root: PathBuf,
    shm_dir: PathBuf,
    reporting: Option<Reporting>,
    wake_check: Option<Duration>,
    before_arm: Option<Box<dyn FnMut()>>,
    pid: u32,
    /// Whose words the loop arms and its senders wake.
    class: WakeClass,
    /// What robot.yaml gives the process (checked at each attach).
    attach: Option<Attach>,
    /// How often to look at channels where the other class publishes
    /// (`None`: none does), and when the loop last did.
    cross_look: Option<u64>,
    last_cross_look: u64,
    /// A real-time loop looked at its locked memory at its first run.
    memory_checked: bool,
    /// When the loop's last sleep ended (`CLOCK_MONOTONIC` ns): a message
    /// of its own class sent before then that no wake announced was found
    /// by the loop's own look (`healed`).
    slept_until_ns: u64,
    /// Where every time of the loop comes from (event times, handler
    /// starts, deadlines, reports): `CLOCK_MONOTONIC`, or a simulation's
    /// virtual clock.
    clock: Clock,
    /// [`EventLoop::start`] ran (a simulated loop starts at its first
    /// turn).
    started: bool,
    /// The link to a simulation's coordinator (`deploy sim`), which
    /// [`EventLoop::run`] takes its turns from.
    sim_link: Option<std::os::fd::OwnedFd>,
}

impl EventLoop {
    /// A loop on the best backend the kernel offers for its wake class (or
    /// the forced one): a real-time loop sleeps on its doorbell, whatever
    /// the kernel offers (see [`crate::wake`] for why), a best-effort one
    /// on the probe's best.
    pub fn new(opts: LoopOptions) -> Result<EventLoop, EventLoopCreateError> {
        if let Some(e) = opts.env_error {
            return Err(EventLoopCreateError::Environment(e));
        }
        if let Some(a) = &opts.attach {
            a.check_current().map_err(EventLoopCreateError::Attach)?;
        }
        if let Some(fd) = opts.sim_fd {
            if opts.clock.virtual_clock().is_none() {
                return Err(EventLoopCreateError::SimLink {
                    fd,
                    reason:
                        "the loop's clock is CLOCK_MONOTONIC: a simulated loop needs a virtual one"
                            .into(),
                });
            }
        }
        if opts.clock.virtual_clock().is_some() {
            return match opts.backend {
                Some(b) if b != Backend::Simulated => {
                    Err(EventLoopCreateError::SimulatedBackend(b))
                }
                _ => EventLoop::with_wait(opts, Backend::Simulated),
            };
        }
        let p = probe();
        let backend = match opts.backend {
            Some(Backend::IoUringFutex) if !p.io_uring_futex => {
                return Err(EventLoopCreateError::BackendUnavailable {
                    backend: Backend::IoUringFutex,
                    kernel: p.kernel,
                    reason: p.io_uring_problem.unwrap_or_default(),
                })
            }
            Some(Backend::FutexWaitv) if !p.futex_waitv => {
                return Err(EventLoopCreateError::BackendUnavailable {
                    backend: Backend::FutexWaitv,
                    kernel: p.kernel,
                    reason: "futex_waitv needs Linux 5.16 or later".into(),
                })
            }
            Some(Backend::Simulated) => {
                return Err(EventLoopCreateError::BackendUnavailable {
                    backend: Backend::Simulated,
                    kernel: p.kernel,
                    reason: "a simulated loop needs a virtual clock (controller::sim)".into(),
                })
            }
            Some(b) => b,
            None if opts.class == WakeClass::RealTime => Backend::Doorbell,
            // The doorbell backend needs nothing beyond plain futexes.
            None => p.backend.unwrap_or(Backend::Doorbell),
        };
        EventLoop::with_wait(opts, backend)
    }

    fn with_wait(opts: LoopOptions, backend: Backend) -> Result<EventLoop, EventLoopCreateError> {
        let mut lp = EventLoop {
            wait: wait::for_backend(backend),
            watchers: Vec::new(),
            timers: Timers::default(),
            senders: Vec::new(),
            on_run: Vec::new(),
            exit: false,
            proc_root: opts.proc_root.clone(),
            shm_dir: opts.shm_dir.clone(),
            reporting: None,
            wake_check: opts.wake_check,
            before_arm: None,
            pid: sys::getpid(),
            class: opts.class,
            attach: opts.attach,
            cross_look: None,
            last_cross_look: 0,
            memory_checked: false,
            slept_until_ns: 0,
            clock: opts.clock,
            started: false,
            sim_link: None,
        };
        if let Some(fd) = opts.sim_fd {
            lp.sim_link = Some(sim::take_link(fd)?);
        }
        if let Some(t) = opts.timing {
            lp.enable_reports(&t)?;
        }
        Ok(lp)
    }

    /// The backend in use.
    pub fn backend(&self) -> Backend {
        self.wait.backend()
    }

    /// The loop's wake class.
    pub fn class(&self) -> WakeClass {
        self.class
    }

    /// The time now on the loop's clock (`CLOCK_MONOTONIC`, or its
    /// simulation's virtual time): what a controller takes to set a
    /// timer's first deadline, so that the same code runs in simulation.
    pub fn now(&self) -> Monotonic {
        self.clock.now()
    }

    /// The loop's clock.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Checks the calling thread against robot.yaml's policy, as every
    /// attach does (see [`Attach::check`]).
    pub(super) fn check_attach(&self) -> Result<(), AttachMismatchError> {
        self.attach.as_ref().map_or(Ok(()), |a| a.check_current())
    }

    /// Opens channel `name` in the loop's shm directory (the supervisor
    /// created it from robot.yaml).
    pub fn open_channel(&self, name: &str) -> Result<Channel, ChannelOpenError> {
        Channel::open(&self.shm_dir, name)
    }

    /// Runs `hook` each time [`EventLoop::run`] starts, after every wait is
    /// armed.
    pub fn on_run(&mut self, hook: impl FnMut(&mut Ctx) + 'static) {
        self.on_run.push(Box::new(hook));
    }

    /// Test instrumentation: called just before each futex wait is armed
    /// (after the index was checked), e.g. to publish into that window and
    /// force the `-EAGAIN` path.
    #[cfg(feature = "fault-injection")]
    pub fn set_before_arm_hook(&mut self, hook: impl FnMut() + 'static) {
        self.before_arm = Some(Box::new(hook));
    }

    /// The loop's wait loop, and the parts of the loop it works on.
    fn sleep_parts(&mut self) -> (&mut dyn Wait, Sleep<'_>) {
        (
            &mut *self.wait,
            Sleep {
                watchers: &mut self.watchers,
                timers: &mut self.timers,
                class: self.class,
                proc_root: &self.proc_root,
                before_arm: &mut self.before_arm,
                slept_until_ns: &mut self.slept_until_ns,
            },
        )
    }

    /// Arms watcher `i`'s wait, or marks it ready when data is already
    /// there.
    fn arm_watcher(&mut self, i: usize) -> Result<(), EventLoopRunError> {
        let (wait, mut s) = self.sleep_parts();
        wait::arm_watcher(wait, &mut s, i)
    }

    /// What a run does before its first sleep: arms every wait and timer
    /// and calls the [`EventLoop::on_run`] hooks.
    fn start(&mut self) -> Result<(), EventLoopRunError> {
        self.started = true;
        if self.class == WakeClass::RealTime && !self.memory_checked {
            self.memory_checked = true;
            // A page fault on the real-time path takes the process's
            // mmap_lock, which any thread mapping memory holds (see
            // crate::wake): said once, off the real-time path.
            if let Some(0) = locked_kb(&self.proc_root) {
                eprintln!(
                    "rtdeploy: a real-time event loop runs with no memory locked: a page fault on its wake path waits for this process's mmap_lock (call controller::rt::lock_and_prefault at start, and give the process `memlock` in robot.yaml)"
                );
            }
        }
        // A simulated loop looks at every watched channel at each turn: it
        // has no wake to lose.
        if let (Some(every), None, false, false) = (
            self.wake_check,
            self.timers.wake_check,
            self.watchers.is_empty(),
            self.backend() == Backend::Simulated,
        ) {
            let period = every.as_nanos().clamp(1, u64::MAX as u128) as u64;
            let t = self.timers.push(
                "wake-check".into(),
                self.clock.now_ns().saturating_add(period),
                period,
                None,
            );
            self.timers.wake_check = Some(t);
        }
        {
            let (wait, mut s) = self.sleep_parts();
            wait.prepare(&mut s)?;
        }
        for i in 0..self.watchers.len() {
            self.arm_watcher(i)?;
        }
        for i in 0..self.timers.len() {
            self.timers.arm(i);
        }
        self.look_across();
        let mut hooks = std::mem::take(&mut self.on_run);
        for h in &mut hooks {
            let now = self.clock.now();
            let mut ctx = Ctx {
                now,
                event: now,
                missed: 0,
                lost: 0,
                exit: &mut self.exit,
            };
            h(&mut ctx);
        }
        self.on_run = hooks;
        Ok(())
    }

    /// Runs until a handler calls [`Ctx::exit`] or nothing is left to wait
    /// for.
    ///
    /// A simulated loop runs only under `deploy sim`: it then takes its
    /// turns and its time from the simulation's coordinator, and returns
    /// when the coordinator ends the run or the loop ends. Elsewhere its
    /// simulation ([`crate::sim::Sim`]) runs it, and `run` refuses.
    pub fn run(&mut self) -> Result<(), EventLoopRunError> {
        if self.backend() == Backend::Simulated {
            return match self.sim_link.take() {
                Some(link) => self.follow(link),
                None => Err(EventLoopRunError::Simulated),
            };
        }
        self.exit = false;
        self.start()?;
        while !self.exit {
            self.dispatch()?;
            if self.exit {
                break;
            }
            // Watchers always wait again (io_uring: re-armed when drained;
            // futex_waitv: armed per call); timers until their last firing.
            // The wake check alone keeps nothing alive.
            let waiting = self.watchers.iter().any(|w| w.failed.is_none())
                || self.timers.any_armed_but_wake_check();
            if !waiting {
                if let Some(w) = self.watchers.iter().find(|w| w.failed.is_some()) {
                    return Err(EventLoopRunError::ChannelFailed {
                        channel: w.name.clone(),
                        fault: w.failed.expect("found by failed"),
                    });
                }
                break;
            }
            // Idle until the next event: the time for each sender to bring
            // the slot of its next message into cache. A message arriving
            // meanwhile ends it (checked every 4 KiB): it is handled first.
            let watchers = &self.watchers;
            let arrived = || watchers.iter().any(|w| w.sub.has_new());
            for s in &self.senders {
                s.warm(&arrived);
            }
            let deadline = self.sleep_deadline();
            let (wait, mut s) = self.sleep_parts();
            wait.sleep(&mut s, deadline)?;
            self.look_across();
        }
        Ok(())
    }

    /// When the next sleep must end: the earliest armed timer, and the
    /// next look for messages of the other wake class (see
    /// [`EventLoop::look_across`]).
    fn sleep_deadline(&self) -> Option<u64> {
        let timers = self.timers.next_deadline();
        let cross = self
            .cross_look
            .map(|every| self.last_cross_look.saturating_add(every));
        match (timers, cross) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// After every wake: looks at each watched channel that has publishers
    /// of the other wake class, whose messages no wake of ours announces
    /// (see [`crate::wake`]), and decides whether the next sleep must end
    /// in time for the next look: half the shortest cross-class bound of
    /// those channels after this one. One load per watched channel (two
    /// where the other class publishes); no syscall.
    fn look_across(&mut self) {
        let other = self.class.other();
        let now = self.clock.now_ns();
        let mut every: Option<u64> = None;
        for w in &mut self.watchers {
            if w.failed.is_some() || w.sub.channel().publishers_of_class(other) == 0 {
                continue;
            }
            every = Some(every.map_or(w.cross_look_ns, |e| e.min(w.cross_look_ns)));
            if !w.ready && w.staged.is_none() && w.sub.has_new() {
                w.ready = true;
            }
        }
        self.cross_look = every;
        self.last_cross_look = now;
    }

    /// The wake check: handles messages no wake announced.
    fn check_wakes(&mut self) {
        for w in &mut self.watchers {
            if w.failed.is_some() || w.ready || w.staged.is_some() {
                continue;
            }
            if w.sub.has_new() {
                // Counted per message as it is handled (see dispatch).
                w.ready = true;
            } else if w.sub.channel().is_truncated() {
                // Its wait is armed on a word no one will move again.
                w.fail_if_truncated();
            }
        }
    }

    /// Makes sure a ready watcher has a staged message, or re-arms it when
    /// drained.
    ///
    /// Bounded: a channel whose shared memory keeps faulting leaves the
    /// watcher ready after a few tries, to be looked at again on the next
    /// pass (the wake check guarantees one), never a spin.
    fn refill(&mut self, i: usize) -> Result<(), EventLoopRunError> {
        for _ in 0..4 {
            let w = &mut self.watchers[i];
            if !w.ready || w.staged.is_some() || w.failed.is_some() {
                return Ok(());
            }
            let next = match w.handler {
                Handler::Copy(_) => w.sub.next_meta(),
                Handler::InPlace(_) => w.sub.next_peek(),
            };
            match next {
                Ok(Some(m)) => {
                    w.stats.lost = w.stats.lost.saturating_add(m.lost_before);
                    w.staged = Some(m);
                    return Ok(());
                }
                Ok(None) => {}
                Err(ChannelFault::Truncated) => {
                    w.truncated();
                    return Ok(());
                }
                // Resynchronised to the index as it is now; go on.
                Err(_) => w.stats.faults += 1,
            }
            w.ready = false;
            self.arm_watcher(i)?;
        }
        Ok(())
    }

    /// Handles everything ready, in event-time order.
    fn dispatch(&mut self) -> Result<(), EventLoopRunError> {
        loop {
            if self.exit {
                return Ok(());
            }
            self.timers.apply_commands();
            let mut best: Option<(u64, bool, usize)> = None;
            for i in 0..self.watchers.len() {
                self.refill(i)?;
                if let Some(m) = &self.watchers[i].staged {
                    if best.is_none_or(|b| m.send_time_ns < b.0) {
                        best = Some((m.send_time_ns, true, i));
                    }
                }
            }
            for (i, t) in self.timers.list.iter().enumerate() {
                if t.due && best.is_none_or(|b| t.deadline < b.0) {
                    best = Some((t.deadline, false, i));
                }
            }
            let Some((event_ns, is_watch, i)) = best else {
                return Ok(());
            };
            let now = self.clock.now_ns();
            let (missed, lost) = if is_watch {
                let w = &self.watchers[i];
                let before = w.staged.map_or(0, |m| m.lost_before);
                (0, before.saturating_add(w.untold_lost))
            } else {
                (std::mem::take(&mut self.timers.list[i].missed), 0)
            };
            let mut ctx = Ctx {
                now: Monotonic::from_nanos(now),
                event: Monotonic::from_nanos(event_ns),
                missed,
                lost,
                exit: &mut self.exit,
            };
            if is_watch {
                let w = &mut self.watchers[i];
                let meta = w.staged.take().expect("staged message picked");
                if w.expect_size.is_some_and(|n| n != meta.size) {
                    // Not a message of the watcher's type (a byte-API
                    // publisher's): counted, not handled.
                    w.stats.errors += 1;
                    continue;
                }
                crate::miss_trace::handled(
                    crate::miss_trace::Handled::Message {
                        seq: meta.index,
                        sender_pid: meta.sender_pid,
                    },
                    event_ns,
                    now,
                );
                match &mut w.handler {
                    Handler::Copy(h) => h(&mut ctx, &w.sub.staged(&meta)),
                    Handler::InPlace(h) => match h(&mut ctx, &mut w.sub, &meta) {
                        InPlace::Read(()) => {}
                        InPlace::Overwritten => {
                            // Lost after all; the next message says so.
                            w.stats.lost = w.stats.lost.saturating_add(1);
                            w.untold_lost = ctx.lost.saturating_add(1);
                            continue;
                        }
                        InPlace::Truncated => {
                            w.truncated();
                            continue;
                        }
                    },
                }
                w.untold_lost = 0;
                let end = self.clock.now_ns();
                w.stats.record(now.saturating_sub(event_ns), end - now);
                if meta.sender_class != self.class {
                    w.stats.record_cross_class(now.saturating_sub(event_ns));
                } else if !w.woken && meta.send_time_ns < self.slept_until_ns {
                    // Of its own class and there before the loop's sleep
                    // ended, yet no wake announced it: the loop's own look
                    // (a timeout, the wake check, a look across) found it,
                    // so its wake was lost or late. Messages of the other
                    // class are never announced (see crate::wake).
                    w.stats.healed += 1;
                }
                w.total += 1;
            } else {
                let end = if self.timers.report == Some(i) {
                    self.publish_report();
                    self.clock.now_ns()
                } else if self.timers.wake_check == Some(i) {
                    self.check_wakes();
                    self.clock.now_ns()
                } else {
                    let t = &mut self.timers.list[i];
                    if let Some(h) = t.handler.as_mut() {
                        crate::miss_trace::handled(
                            crate::miss_trace::Handled::Timer { seq: t.total },
                            event_ns,
                            now,
                        );
                        h(&mut ctx);
                    }
                    let end = self.clock.now_ns();
                    t.stats.record(now.saturating_sub(event_ns), end - now);
                    t.total += 1;
                    end
                };
                let t = &mut self.timers.list[i];
                t.due = false;
                if t.period == 0 {
                    t.active = false;
                } else {
                    let mut next = t.deadline + t.period;
                    if next <= end {
                        let skipped = (end - next) / t.period + 1;
                        t.stats.missed += skipped;
                        t.missed += skipped;
                        next += skipped * t.period;
                    }
                    t.deadline = next;
                    self.timers.arm(i);
                }
            }
        }
    }
}

/// `VmLck` of this process, in KiB, from `<proc_root>/self/status` (at
/// most 16 KiB read); `None` when it cannot be read.
fn locked_kb(proc_root: &std::path::Path) -> Option<u64> {
    let text = units::bounded::Bound::pseudo(16 << 10)
        .read_lossy(&proc_root.join("self/status"))
        .ok()?;
    parse_locked_kb(&text)
}

fn parse_locked_kb(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmLck:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()
}

/// Sleeps until the absolute `CLOCK_MONOTONIC` time `deadline_ns` (the
/// runtime's one absolute sleep, [`crate::time::sleep_until`]).
pub(super) fn sleep_until_ns(deadline_ns: u64) {
    crate::time::sleep_until(Monotonic::from_nanos(deadline_ns));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forced_backend_the_kernel_lacks_names_kernel_and_needs() {
        let e = EventLoopCreateError::BackendUnavailable {
            backend: Backend::FutexWaitv,
            kernel: "5.10.120-tegra".into(),
            reason: "futex_waitv needs Linux 5.16 or later".into(),
        }
        .to_string();
        assert!(e.contains("kernel 5.10.120-tegra"), "{e}");
        assert!(e.contains("futex_waitv") && e.contains("Linux 5.16"), "{e}");
    }

    #[test]
    fn locked_memory_is_read_from_the_status_file() {
        assert_eq!(
            parse_locked_kb("Name:\tx\nVmLck:\t   65536 kB\nVmPin: 0 kB\n"),
            Some(65536)
        );
        assert_eq!(parse_locked_kb("VmLck:\t0 kB\n"), Some(0));
        assert_eq!(parse_locked_kb("VmLck: lots\n"), None);
        assert_eq!(parse_locked_kb(""), None);
    }

    #[test]
    fn backend_names_and_codes_round_trip() {
        for b in Backend::ALL {
            assert_eq!(Backend::from_name(b.name()), Some(b));
            assert_eq!(Backend::from_code(b.code()), Some(b));
        }
        assert_eq!(Backend::from_name("epoll"), None);
        assert_eq!(Backend::from_code(0), None);
    }
}
