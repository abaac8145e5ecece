//! The event loop: one io_uring per loop, one futex wait kept armed per
//! watched channel, timers on absolute `CLOCK_MONOTONIC` deadlines.
//!
//! - The ring is set up with `SINGLE_ISSUER | DEFER_TASKRUN`: completions
//!   run in this thread when it waits, so no other task posts to its
//!   completion ring.
//! - Each watcher keeps one `IORING_OP_FUTEX_WAIT` armed on its channel's
//!   futex word (the low 32 bits of the queue index) with the index it
//!   expects next. On completion it drains every new message in order and
//!   re-arms with the new index. A completion of `-EAGAIN` means the word
//!   moved between our load and the kernel's check: more data, never an
//!   error; it is drained like a wake and counted.
//! - Timers and phased loops are io_uring timeouts with absolute
//!   `CLOCK_MONOTONIC` deadlines; periods missed while the loop was late
//!   are skipped and counted.
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
//! - Kernels without io_uring futex ops (before 6.7) get the `futex_waitv`
//!   backend (5.16+): one `futex_waitv` call over all watched words with
//!   the next timer deadline as its timeout. Kernels with neither (the 5.10
//!   and 5.15 of JetPack 5 and 6), and systems where io_uring is switched
//!   off, get the doorbell backend (any kernel): the loop sleeps in one
//!   `FUTEX_WAIT_BITSET` on its own bell, which the publishers of every
//!   channel it watches ring (see [`crate::doorbell`]).
#![allow(unsafe_code)]

use std::cell::Cell;
use std::io;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use io_uring::{opcode, types, IoUring};
use serde::Serialize;

use crate::channel::{
    BellListing, Channel, ChannelAttachError, ChannelFault, ChannelOpenError, InPlace, Loan,
    Message, MessageMeta, PublishError, Published, Publisher, SlotView, Subscriber,
};
use crate::doorbell::{Bell, BellTable};
use crate::shm::ShmSafe;
use crate::sys::{self, FutexWaitv, WaitvResult};
use crate::time::Monotonic;
use crate::timing_report::{self, EntryKind, EntryStats, RawReport};
use crate::wake::{Attach, AttachMismatchError, WakeClass};
use units::env::{ProcessEnv, ProcessEnvError};

/// How the loop sleeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Backend {
    /// `IORING_OP_FUTEX_WAIT` kept armed per channel (Linux 6.7+).
    #[serde(rename = "io_uring-futex")]
    IoUringFutex,
    /// One `futex_waitv` call per sleep (Linux 5.16+).
    #[serde(rename = "futex_waitv")]
    FutexWaitv,
    /// One `FUTEX_WAIT_BITSET` on the loop's own bell per sleep (any
    /// kernel; see [`crate::doorbell`]).
    #[serde(rename = "doorbell")]
    Doorbell,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::IoUringFutex => "io_uring-futex",
            Backend::FutexWaitv => "futex_waitv",
            Backend::Doorbell => "doorbell",
        }
    }

    /// Every backend, best first (the order the probe picks in).
    pub const ALL: [Backend; 3] = [
        Backend::IoUringFutex,
        Backend::FutexWaitv,
        Backend::Doorbell,
    ];

    /// The backend a name (as [`Backend::name`] spells it) stands for.
    pub fn from_name(name: &str) -> Option<Backend> {
        Backend::ALL.into_iter().find(|b| b.name() == name)
    }

    /// The code a timing report carries for it (0: unknown).
    pub fn code(self) -> u64 {
        match self {
            Backend::IoUringFutex => 1,
            Backend::FutexWaitv => 2,
            Backend::Doorbell => 3,
        }
    }

    /// The backend a timing report's code stands for.
    pub fn from_code(code: u64) -> Option<Backend> {
        Backend::ALL.into_iter().find(|b| b.code() == code)
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What the kernel offers.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeReport {
    pub kernel: String,
    /// A ring with SINGLE_ISSUER | DEFER_TASKRUN that supports
    /// IORING_OP_FUTEX_WAIT.
    pub io_uring_futex: bool,
    /// Why not, when not.
    pub io_uring_problem: Option<String>,
    pub futex_waitv: bool,
    /// The doorbell backend (plain futex waits: every kernel has them).
    pub doorbell: bool,
    /// The backend a loop would use.
    pub backend: Option<Backend>,
}

impl ProbeReport {
    /// Whether `b` is available.
    pub fn has(&self, b: Backend) -> bool {
        match b {
            Backend::IoUringFutex => self.io_uring_futex,
            Backend::FutexWaitv => self.futex_waitv,
            Backend::Doorbell => self.doorbell,
        }
    }
}

/// Test instrumentation: makes [`probe`] report io_uring futex waits
/// and/or `futex_waitv` missing, as a 5.10 or 5.15 kernel would (with
/// io_uring itself still there, which a seccomp profile cannot show).
#[cfg(feature = "fault-injection")]
pub fn hide_backends_from_probe(io_uring_futex: bool, futex_waitv: bool) {
    HIDE_IO_URING_FUTEX.store(io_uring_futex, std::sync::atomic::Ordering::SeqCst);
    HIDE_FUTEX_WAITV.store(futex_waitv, std::sync::atomic::Ordering::SeqCst);
}

#[cfg(feature = "fault-injection")]
static HIDE_IO_URING_FUTEX: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);
#[cfg(feature = "fault-injection")]
static HIDE_FUTEX_WAITV: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Test instrumentation: the kernel profile ([`units::env::TEST_KERNEL_PROFILE`])
/// asks for, applied to the whole process once, at the first probe:
/// `jetpack6` (a 5.15 kernel: io_uring without futex waits, reported
/// missing by the probe, and `futex_waitv` answering ENOSYS through
/// seccomp) or `no-io_uring` (io_uring and `futex_waitv` answering ENOSYS,
/// as with `kernel.io_uring_disabled` or a container's profile). Test
/// binaries re-run themselves under each to run their suites on the
/// doorbell backend.
#[cfg(feature = "fault-injection")]
fn apply_test_kernel_profile() {
    use crate::seccomp::{Deniable, DenyFilter};
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let Ok(profile) = std::env::var(units::env::TEST_KERNEL_PROFILE) else {
            return;
        };
        let deny: &[Deniable] = match profile.as_str() {
            "jetpack6" => {
                hide_backends_from_probe(true, false);
                &[Deniable::FutexWaitv]
            }
            "no-io_uring" => &[Deniable::IoUring, Deniable::FutexWaitv],
            other => panic!("unknown {} {other:?}", units::env::TEST_KERNEL_PROFILE),
        };
        DenyFilter::new(deny)
            .install(true)
            .expect("installing the test kernel profile's seccomp filter");
    });
}

fn hidden(b: Backend) -> bool {
    #[cfg(feature = "fault-injection")]
    {
        use std::sync::atomic::Ordering::SeqCst;
        match b {
            Backend::IoUringFutex => HIDE_IO_URING_FUTEX.load(SeqCst),
            Backend::FutexWaitv => HIDE_FUTEX_WAITV.load(SeqCst),
            Backend::Doorbell => false,
        }
    }
    #[cfg(not(feature = "fault-injection"))]
    {
        let _ = b;
        false
    }
}

fn build_ring(entries: u32) -> io::Result<IoUring> {
    IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(entries)
}

/// Probes the kernel for the loop's backends.
pub fn probe() -> ProbeReport {
    #[cfg(feature = "fault-injection")]
    apply_test_kernel_profile();
    let kernel = sys::kernel_release();
    let (io_uring_futex, io_uring_problem) = match build_ring(8) {
        Err(e) => (
            false,
            Some(format!(
                "io_uring setup with SINGLE_ISSUER | DEFER_TASKRUN failed: {e}"
            )),
        ),
        Ok(ring) => {
            let mut p = io_uring::Probe::new();
            match ring.submitter().register_probe(&mut p) {
                Err(e) => (false, Some(format!("io_uring opcode probe failed: {e}"))),
                Ok(()) if p.is_supported(opcode::FutexWait::CODE) => (true, None),
                Ok(()) => (
                    false,
                    Some("io_uring has no IORING_OP_FUTEX_WAIT (needs Linux 6.7+)".into()),
                ),
            }
        }
    };
    let (io_uring_futex, io_uring_problem) = if io_uring_futex && hidden(Backend::IoUringFutex) {
        (
            false,
            Some("io_uring has no IORING_OP_FUTEX_WAIT (hidden from the probe for a test)".into()),
        )
    } else {
        (io_uring_futex, io_uring_problem)
    };
    let futex_waitv = sys::has_futex_waitv() && !hidden(Backend::FutexWaitv);
    let mut p = ProbeReport {
        kernel,
        io_uring_futex,
        io_uring_problem,
        futex_waitv,
        doorbell: true,
        backend: None,
    };
    p.backend = Backend::ALL.into_iter().find(|&b| p.has(b));
    p
}

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
}

/// How often a loop looks at its watched channels' indexes itself unless
/// told otherwise (see [`LoopOptions::wake_check`]).
pub const DEFAULT_WAKE_CHECK: Duration = Duration::from_millis(50);

/// Where and how often the loop publishes its timing report.
#[derive(Debug, Clone)]
pub struct TimingOptions {
    /// `<prefix>/dev/shm/rtdeploy`.
    pub shm_dir: PathBuf,
    /// The process name ([`units::env::PROCESS`]).
    pub process: String,
    pub period: Duration,
}

/// Options of a loop.
#[derive(Debug, Clone)]
pub struct LoopOptions {
    /// Force a backend (the default takes the best the kernel has).
    pub backend: Option<Backend>,
    /// Publish timing reports; `None` keeps them in the loop only.
    pub timing: Option<TimingOptions>,
    /// `/proc`, for publisher/subscriber ownership.
    pub proc_root: PathBuf,
    /// Where channels opened by name live (`<prefix>/dev/shm/rtdeploy`).
    pub shm_dir: PathBuf,
    /// How often the loop looks at the index of each watched channel
    /// itself, so that a message whose wake was lost (a corrupted waiter
    /// count, a publisher killed before its wake) is handled at most this
    /// late; `None` trusts the wakes alone. Each look is one timer
    /// expiry of the loop (a few microseconds of its CPU).
    pub wake_check: Option<Duration>,
    /// Whose words the loop's waits and senders use ([`crate::wake`]);
    /// under the supervisor, robot.yaml's ([`units::env::WAKE_CLASS`]). A
    /// real-time loop sleeps on its doorbell unless `backend` says
    /// otherwise.
    pub class: WakeClass,
    /// What robot.yaml gives the process, checked against the attaching
    /// thread (see [`Attach::check`]); `None` checks nothing.
    pub attach: Option<Attach>,
    /// The supervisor's environment could not be read ([`LoopOptions::from_env`]):
    /// [`EventLoop::new`] refuses to start with it.
    pub env_error: Option<ProcessEnvError>,
}

impl Default for LoopOptions {
    fn default() -> Self {
        LoopOptions {
            backend: None,
            timing: None,
            proc_root: PathBuf::from("/proc"),
            shm_dir: PathBuf::from(units::path::SHM_DIR),
            wake_check: Some(DEFAULT_WAKE_CHECK),
            class: WakeClass::BestEffort,
            attach: None,
            env_error: None,
        }
    }
}

impl LoopOptions {
    /// Options from the environment the supervisor sets
    /// ([`ProcessEnv`], read from this process's environment; see
    /// [`LoopOptions::from_process_env`]).
    pub fn from_env() -> LoopOptions {
        LoopOptions::from_process_env(ProcessEnv::from_env(|k| std::env::var(k).ok()))
    }

    /// Options from a process environment: its shm directory (where
    /// channels are) and process name (timing reports are published when
    /// both are set), its forced backend (`io_uring-futex`, `futex_waitv`
    /// or `doorbell`; another name is said on stderr and the probe
    /// picks), its wake class and the policy robot.yaml gives the process
    /// (see [`crate::wake`]), its wake check (microseconds, 0 for none)
    /// for [`LoopOptions::wake_check`], and the supervisor's miss tracing
    /// ([`crate::miss_trace`]). An environment that could not be read is
    /// kept in [`LoopOptions::env_error`], which [`EventLoop::new`]
    /// refuses.
    pub fn from_process_env(env: Result<ProcessEnv, ProcessEnvError>) -> LoopOptions {
        let mut o = LoopOptions::default();
        let env = match env {
            Ok(env) => env,
            Err(e) => {
                o.env_error = Some(e);
                return o;
            }
        };
        if let Some(dir) = &env.shm_dir {
            o.shm_dir = dir.clone();
        }
        if let (Some(dir), Some(process)) = (&env.shm_dir, &env.process) {
            o.timing = Some(TimingOptions {
                shm_dir: dir.clone(),
                process: process.clone(),
                period: Duration::from_secs(1),
            });
        }
        o.backend = env.backend.as_deref().and_then(|name| {
            let b = Backend::from_name(name);
            if b.is_none() {
                eprintln!(
                    "rtdeploy: {}={name:?} is not a backend (io_uring-futex, futex_waitv, doorbell); taking the best the kernel has",
                    units::env::BACKEND
                );
            }
            b
        });
        // The supervisor's miss tracing (robot.yaml check.trace_on_miss).
        if let Some(problem) = crate::miss_trace::init(&env) {
            eprintln!("rtdeploy: {problem}");
        }
        if let Some(us) = env.wake_check_us {
            o.wake_check = (us > 0).then(|| Duration::from_micros(us));
        }
        if let Some(a) = Attach::of_env(&env) {
            o.class = a.class;
            o.attach = Some(a);
        }
        o
    }
}

/// What a handler knows about the event it handles.
pub struct Ctx<'a> {
    now_ns: u64,
    event_ns: u64,
    missed: u64,
    lost: u64,
    exit: &'a mut bool,
}

impl Ctx<'_> {
    /// When the handler started.
    pub fn now(&self) -> Monotonic {
        Monotonic::from_nanos(self.now_ns)
    }
    /// The event's time: the message's send time or the timer's deadline.
    pub fn event_time(&self) -> Monotonic {
        Monotonic::from_nanos(self.event_ns)
    }
    /// Wakeup latency: event time to handler start.
    pub fn latency(&self) -> Duration {
        Duration::from_nanos(self.latency_ns())
    }
    /// For a timer or phased loop: the periods skipped since its previous
    /// run because the loop was late (their deadlines passed unhandled);
    /// 0 for messages.
    pub fn missed_cycles(&self) -> u64 {
        self.missed
    }
    /// For a message: how many messages of its channel were overwritten
    /// before this loop read them, just before this one; 0 for timers.
    pub fn lost_before(&self) -> u64 {
        self.lost
    }
    /// `CLOCK_MONOTONIC` when the handler started.
    pub fn now_ns(&self) -> u64 {
        self.now_ns
    }
    /// The event's time: the message's send time or the timer's deadline.
    pub fn event_time_ns(&self) -> u64 {
        self.event_ns
    }
    /// Wakeup latency: event time to handler start.
    pub fn latency_ns(&self) -> u64 {
        self.now_ns.saturating_sub(self.event_ns)
    }
    /// Makes [`EventLoop::run`] return after this handler.
    pub fn exit(&mut self) {
        *self.exit = true;
    }
}

type WatchFn = Box<dyn FnMut(&mut Ctx, &Message)>;
/// Reads the staged message in place and, when it was still there, hands
/// what was read to the handler.
type InPlaceFn = Box<dyn FnMut(&mut Ctx, &mut Subscriber, &MessageMeta) -> InPlace<()>>;

type TimerFn = Box<dyn FnMut(&mut Ctx)>;
type HookFn = Box<dyn FnMut(&mut Ctx)>;

/// How a watcher's messages reach its handler.
enum Handler {
    /// Copied into the subscriber's buffer when staged.
    Copy(WatchFn),
    /// Staged without the payload, read in its slot when handled.
    InPlace(InPlaceFn),
}

struct Watcher {
    name: String,
    sub: Subscriber,
    handler: Handler,
    /// A wait is armed (in the ring, or counted for futex_waitv).
    armed: bool,
    /// A completion arrived or data is known to be there.
    ready: bool,
    /// The loop's last sleep ended with a wake for this watcher, or the
    /// loop found its data without sleeping: what it reads now is not
    /// counted as found without a wake (`healed`).
    woken: bool,
    staged: Option<MessageMeta>,
    /// Messages lost that no handler was told of yet: one read in place
    /// and found overwritten, and those lost before it.
    untold_lost: u64,
    /// The channel was truncated: no longer watched.
    failed: Option<ChannelFault>,
    /// A typed watcher's message size: other sizes are counted as errors
    /// and not handled.
    expect_size: Option<usize>,
    stats: EntryStats,
    total: u64,
    /// Doorbell backend: this loop's bell listed in the channel.
    listing: Option<BellListing>,
    /// Half the channel's cross-class bound: how often the loop looks at
    /// it while the other class publishes there (see [`crate::wake`]).
    cross_look_ns: u64,
}

impl Watcher {
    /// Its channel was truncated: counted, and no longer watched.
    fn truncated(&mut self) {
        self.stats.faults += 1;
        self.failed = Some(ChannelFault::Truncated);
        self.ready = false;
    }
}

struct Timer {
    name: String,
    deadline: u64,
    period: u64,
    handler: Option<TimerFn>,
    /// Counted in the next sleep's deadline.
    armed: bool,
    due: bool,
    active: bool,
    /// Periods skipped before the next run (told to the handler).
    missed: u64,
    control: Rc<Cell<TimerCommand>>,
    stats: EntryStats,
    total: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TimerCommand {
    None,
    Disable,
    Schedule { deadline: u64, period: u64 },
}

/// A timer of a loop: disable it or reschedule it, from its own handler,
/// another handler or the code that set up the loop (not `Send`: the loop
/// lives on one thread). The change applies before the loop next waits.
#[derive(Clone)]
pub struct TimerHandle {
    control: Rc<Cell<TimerCommand>>,
}

impl TimerHandle {
    /// Stops the timer: no more firings until it is scheduled again.
    pub fn disable(&self) {
        self.control.set(TimerCommand::Disable);
    }

    /// Next due at `deadline`, then every `period` if given.
    pub fn schedule(&self, deadline: Monotonic, period: Option<Duration>) {
        self.control.set(TimerCommand::Schedule {
            deadline: deadline.as_nanos(),
            period: period.map_or(0, |p| p.as_nanos().clamp(1, u64::MAX as u128) as u64),
        });
    }
}

struct SenderCounters {
    count: Cell<u64>,
    errors: Cell<u64>,
    window_count: Cell<u64>,
    window_errors: Cell<u64>,
    /// The sender's channel, and the slot and bytes its last message left
    /// to warm before the loop sleeps (see [`Publisher::warm_next`]).
    channel: Channel,
    warm: Cell<Option<(u64, usize)>>,
}

/// A publisher made by a loop; its counts appear in the loop's reports.
pub struct Sender {
    publisher: Publisher,
    counters: Rc<SenderCounters>,
}

impl SenderCounters {
    fn sent(&self, warm: Option<(u64, usize)>) {
        self.count.set(self.count.get() + 1);
        self.window_count.set(self.window_count.get() + 1);
        self.warm.set(warm);
    }
    fn error(&self) {
        self.errors.set(self.errors.get() + 1);
        self.window_errors.set(self.window_errors.get() + 1);
    }
}

impl Sender {
    pub fn send(&mut self, payload: &[u8]) -> Result<Published, PublishError> {
        let r = self.publisher.publish(payload);
        match r {
            Ok(_) => self.counters.sent(self.publisher.take_warm()),
            Err(_) => self.counters.error(),
        }
        r
    }
    pub fn send_value<T: ShmSafe>(&mut self, v: &T) -> Result<Published, PublishError> {
        self.send(crate::shm::as_bytes(v))
    }
    pub fn publisher(&self) -> &Publisher {
        &self.publisher
    }
}

/// A sender of `T` messages made by a loop ([`EventLoop::make_sender`]).
pub struct TypedSender<T: ShmSafe> {
    sender: Sender,
    _type: PhantomData<fn(&T)>,
}

impl<T: ShmSafe> TypedSender<T> {
    /// Publishes a copy of `v`.
    pub fn send(&mut self, v: &T) -> Result<Published, PublishError> {
        self.sender.send(crate::shm::as_bytes(v))
    }

    /// Lends the channel's next slot to write a `T` in place, with no copy
    /// on send (see [`Publisher::loan`]).
    pub fn loan(&mut self) -> Result<SenderLoan<'_, T>, PublishError> {
        let counters = self.sender.counters.clone();
        match self.sender.publisher.loan::<T>() {
            Ok(loan) => Ok(SenderLoan { loan, counters }),
            Err(e) => {
                counters.error();
                Err(e)
            }
        }
    }

    pub fn publisher(&self) -> &Publisher {
        &self.sender.publisher
    }
}

/// A loaned message of a [`TypedSender`]: write it through `*loan`, then
/// [`SenderLoan::send`].
pub struct SenderLoan<'a, T: ShmSafe> {
    loan: Loan<'a, T>,
    counters: Rc<SenderCounters>,
}

impl<T: ShmSafe> std::ops::Deref for SenderLoan<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.loan
    }
}

impl<T: ShmSafe> std::ops::DerefMut for SenderLoan<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.loan
    }
}

impl<T: ShmSafe> SenderLoan<'_, T> {
    /// Whether the message is written in place (see [`Loan::in_place`]).
    pub fn in_place(&self) -> bool {
        self.loan.in_place()
    }

    pub fn send(self) -> Result<Published, PublishError> {
        let (r, warm) = self.loan.send_then();
        match r {
            Ok(_) => self.counters.sent(warm),
            Err(_) => self.counters.error(),
        }
        r
    }
}

/// A reader of `T` messages that never wakes the loop
/// ([`EventLoop::make_fetcher`]).
pub struct TypedFetcher<T: ShmSafe> {
    reader: Subscriber,
    _type: PhantomData<fn() -> T>,
}

impl<T: ShmSafe> TypedFetcher<T> {
    /// The newest message not fetched yet; `Ok(None)` when there is none
    /// or it is not a `T` (another size: a byte-API publisher's).
    pub fn fetch_latest(&mut self) -> Result<Option<&T>, ChannelFault> {
        Ok(self.reader.latest()?.and_then(|m| m.get::<T>()))
    }

    /// The next message in order (see [`Subscriber::next_message`]).
    pub fn fetch_next(&mut self) -> Result<Option<&T>, ChannelFault> {
        Ok(self.reader.next_message()?.and_then(|m| m.get::<T>()))
    }

    pub fn lost(&self) -> u64 {
        self.reader.lost()
    }
}

/// A reader that never wakes the loop: fetch the latest or the next
/// message when the loop decides to.
pub struct Fetcher {
    reader: Subscriber,
}

impl Fetcher {
    /// The newest message not fetched yet (see [`Subscriber::latest`]).
    pub fn fetch_latest(&mut self) -> Result<Option<Message<'_>>, ChannelFault> {
        self.reader.latest()
    }
    /// The next message in order (see [`Subscriber::next_message`]).
    pub fn fetch_next(&mut self) -> Result<Option<Message<'_>>, ChannelFault> {
        self.reader.next_message()
    }
    pub fn lost(&self) -> u64 {
        self.reader.lost()
    }
}

// user_data: kind in the top byte, the watcher's index in the low 24
// bits. The ring holds futex waits only: timers are the wait's own
// timeout (see `EventLoop::wait_uring`).
const KIND_SHIFT: u32 = 56;
const KIND_WATCH: u64 = 1 << KIND_SHIFT;
const INDEX_MASK: u64 = (1 << 24) - 1;
/// `FUTEX_BITSET_MATCH_ANY`.
const MATCH_ANY: u64 = 0xffff_ffff;

struct Reporting {
    publisher: Publisher,
    raw: Box<RawReport>,
    seq: u64,
    period: u64,
}

/// One event loop. Not `Send`: it lives on the thread that runs it (the
/// ring is SINGLE_ISSUER).
pub struct EventLoop {
    backend: Backend,
    ring: Option<IoUring>,
    watchers: Vec<Watcher>,
    timers: Vec<Timer>,
    senders: Vec<(String, Rc<SenderCounters>)>,
    on_run: Vec<HookFn>,
    waitv: Vec<FutexWaitv>,
    waitv_owner: Vec<usize>,
    exit: bool,
    proc_root: PathBuf,
    shm_dir: PathBuf,
    reporting: Option<Reporting>,
    report_timer: Option<usize>,
    wake_check: Option<Duration>,
    wake_check_timer: Option<usize>,
    before_arm: Option<Box<dyn FnMut()>>,
    pid: u32,
    /// Doorbell backend: the loop's bell (claimed when it first runs).
    bell: Option<Bell>,
    /// Whose words the loop arms and its senders wake.
    class: WakeClass,
    /// What robot.yaml gives the process (checked at each attach).
    attach: Option<Attach>,
    /// io_uring backend: the kernel takes absolute wait timeouts (6.12+);
    /// cleared at the first refusal.
    abs_timer: bool,
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
            Some(b) => b,
            None if opts.class == WakeClass::RealTime => Backend::Doorbell,
            // The doorbell backend needs nothing beyond plain futexes.
            None => p.backend.unwrap_or(Backend::Doorbell),
        };
        let mut lp = EventLoop {
            backend,
            ring: None,
            watchers: Vec::new(),
            timers: Vec::new(),
            senders: Vec::new(),
            on_run: Vec::new(),
            waitv: Vec::new(),
            waitv_owner: Vec::new(),
            exit: false,
            proc_root: opts.proc_root.clone(),
            shm_dir: opts.shm_dir.clone(),
            reporting: None,
            report_timer: None,
            wake_check: opts.wake_check,
            wake_check_timer: None,
            before_arm: None,
            pid: sys::getpid(),
            bell: None,
            class: opts.class,
            attach: opts.attach,
            abs_timer: true,
            cross_look: None,
            last_cross_look: 0,
            memory_checked: false,
            slept_until_ns: 0,
        };
        if let Some(t) = opts.timing {
            lp.enable_reports(&t)?;
        }
        Ok(lp)
    }

    fn enable_reports(&mut self, t: &TimingOptions) -> Result<(), EventLoopCreateError> {
        let err = |reason: String| EventLoopCreateError::Timing {
            process: t.process.clone(),
            reason,
        };
        let name = timing_report::timing_channel_name(&t.process);
        let (ch, _) = Channel::create(
            &t.shm_dir,
            &name,
            &timing_report::timing_geometry(),
            None,
            &self.proc_root,
        )
        .map_err(|e| err(units::error::Chain(&e).to_string()))?;
        let publisher = ch
            .publisher(&self.proc_root)
            .map_err(|e| err(units::error::Chain(&e).to_string()))?;
        let mut raw = Box::<RawReport>::default();
        timing_report::fill_name(&mut raw.process, &t.process);
        raw.pid = self.pid as u64;
        raw.backend = self.backend.code();
        raw.class = timing_report::class_code(self.class);
        let period = t.period.as_nanos().max(1) as u64;
        raw.period_ns = period;
        let timer = self.push_timer(
            "timing-report".into(),
            sys::monotonic_ns() + period,
            period,
            None,
        );
        self.report_timer = Some(timer);
        self.reporting = Some(Reporting {
            publisher,
            raw,
            seq: 0,
            period,
        });
        Ok(())
    }

    /// The backend in use.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The loop's wake class.
    pub fn class(&self) -> WakeClass {
        self.class
    }

    /// Checks the calling thread against robot.yaml's policy, as every
    /// attach does (see [`Attach::check`]).
    fn check_attach(&self) -> Result<(), AttachMismatchError> {
        self.attach.as_ref().map_or(Ok(()), |a| a.check_current())
    }

    /// Opens channel `name` in the loop's shm directory (the supervisor
    /// created it from robot.yaml).
    pub fn open_channel(&self, name: &str) -> Result<Channel, ChannelOpenError> {
        Channel::open(&self.shm_dir, name)
    }

    /// Calls `handler` with every `T` published on channel `name` from now
    /// on, in order, woken by a futex wait kept armed on the channel. The
    /// channel records `T` ([`Channel::bind_type`]): a channel carrying
    /// another type is refused here, naming both. The `&T` is the loop's
    /// own copy of the message.
    pub fn watch<T: ShmSafe>(
        &mut self,
        name: &str,
        mut handler: impl FnMut(&mut Ctx, &T) + 'static,
    ) -> Result<(), LoopChannelError> {
        const {
            assert!(
                std::mem::align_of::<T>() <= 8,
                "channel types are at most 8-aligned"
            )
        };
        let ch = self.open_channel(name)?;
        ch.bind_type::<T>()?;
        self.watch_raw(&ch, move |ctx, m| {
            if let Some(v) = m.get::<T>() {
                handler(ctx, v)
            }
        })?;
        if let Some(w) = self.watchers.last_mut() {
            w.expect_size = Some(std::mem::size_of::<T>());
        }
        Ok(())
    }

    /// A sender of `T` on channel `name` (typed like [`EventLoop::watch`]);
    /// its counts appear in this loop's reports.
    pub fn make_sender<T: ShmSafe>(
        &mut self,
        name: &str,
    ) -> Result<TypedSender<T>, LoopChannelError> {
        let ch = self.open_channel(name)?;
        ch.bind_type::<T>()?;
        let mut sender = self.make_raw_sender(&ch)?;
        sender.publisher.reserve_loans::<T>();
        Ok(TypedSender {
            sender,
            _type: PhantomData,
        })
    }

    /// A reader of `T` on channel `name` that never wakes the loop.
    pub fn make_fetcher<T: ShmSafe>(
        &mut self,
        name: &str,
    ) -> Result<TypedFetcher<T>, LoopChannelError> {
        let ch = self.open_channel(name)?;
        ch.bind_type::<T>()?;
        Ok(TypedFetcher {
            reader: ch.reader(),
            _type: PhantomData,
        })
    }

    /// Calls `handler` for every message published on `channel` from now
    /// on, in order, as bytes: the API for tools that handle any channel
    /// (loggers, bridges). Controllers use [`EventLoop::watch`].
    pub fn watch_raw(
        &mut self,
        channel: &Channel,
        handler: impl FnMut(&mut Ctx, &Message) + 'static,
    ) -> Result<(), LoopChannelError> {
        self.push_watcher(channel, Handler::Copy(Box::new(handler)))
    }

    /// Like [`EventLoop::watch`], without the copy: for each message `read`
    /// gets a view of it in its slot of the shared memory and reads what it
    /// needs (a header, a few fields of a large message); when the slot
    /// still held the message after `read` ran, `handler` gets what `read`
    /// returned. A message a publisher recycled meanwhile is not handled
    /// and counts as lost (in [`Ctx::lost_before`] of the next one and the
    /// watcher's report). So `read` computes and returns; acting on the
    /// message is `handler`'s. Worth it where a handler needs a small part
    /// of a large message: reading all of it costs what the copy does.
    pub fn watch_in_place<T: ShmSafe, R: 'static>(
        &mut self,
        name: &str,
        mut read: impl FnMut(&SlotView) -> R + 'static,
        mut handler: impl FnMut(&mut Ctx, R) + 'static,
    ) -> Result<(), LoopChannelError> {
        let ch = self.open_channel(name)?;
        ch.bind_type::<T>()?;
        let handle = move |ctx: &mut Ctx, sub: &mut Subscriber, meta: &MessageMeta| match sub
            .read_in_place_at(meta, &mut read)
        {
            InPlace::Read(r) => {
                handler(ctx, r);
                InPlace::Read(())
            }
            InPlace::Overwritten => InPlace::Overwritten,
            InPlace::Truncated => InPlace::Truncated,
        };
        self.push_watcher(&ch, Handler::InPlace(Box::new(handle)))?;
        if let Some(w) = self.watchers.last_mut() {
            w.expect_size = Some(std::mem::size_of::<T>());
        }
        Ok(())
    }

    fn push_watcher(
        &mut self,
        channel: &Channel,
        handler: Handler,
    ) -> Result<(), LoopChannelError> {
        self.check_attach()?;
        let sub = channel.subscriber_as(self.class, &self.proc_root)?;
        let half =
            (channel.geometry().cross_class.as_nanos() / 2).clamp(1, u64::MAX as u128) as u64;
        self.watchers.push(Watcher {
            name: channel.name().to_string(),
            sub,
            handler,
            armed: false,
            ready: false,
            woken: false,
            staged: None,
            untold_lost: 0,
            failed: None,
            expect_size: None,
            stats: EntryStats::default(),
            total: 0,
            listing: None,
            cross_look_ns: half,
        });
        Ok(())
    }

    /// A byte publisher whose counts appear in this loop's reports (see
    /// [`EventLoop::watch_raw`]).
    pub fn make_raw_sender(&mut self, channel: &Channel) -> Result<Sender, LoopChannelError> {
        self.check_attach()?;
        let publisher = channel.publisher_as(self.class, &self.proc_root)?;
        let counters = Rc::new(SenderCounters {
            count: Cell::new(0),
            errors: Cell::new(0),
            window_count: Cell::new(0),
            window_errors: Cell::new(0),
            channel: channel.clone(),
            warm: Cell::new(None),
        });
        self.senders
            .push((channel.name().to_string(), counters.clone()));
        Ok(Sender {
            publisher,
            counters,
        })
    }

    /// A byte reader that never wakes the loop.
    pub fn make_raw_fetcher(&mut self, channel: &Channel) -> Fetcher {
        Fetcher {
            reader: channel.reader(),
        }
    }

    fn push_timer(
        &mut self,
        name: String,
        deadline: u64,
        period: u64,
        handler: Option<TimerFn>,
    ) -> usize {
        self.timers.push(Timer {
            name,
            deadline,
            period,
            handler,
            armed: false,
            due: false,
            active: true,
            missed: 0,
            control: Rc::new(Cell::new(TimerCommand::None)),
            stats: EntryStats::default(),
            total: 0,
        });
        self.timers.len() - 1
    }

    fn handle(&self, i: usize) -> TimerHandle {
        TimerHandle {
            control: self.timers[i].control.clone(),
        }
    }

    /// Applies what timer handles asked for since the last look (the next
    /// sleep's deadline follows).
    fn apply_timer_commands(&mut self) {
        for i in 0..self.timers.len() {
            let cmd = self.timers[i].control.replace(TimerCommand::None);
            if cmd == TimerCommand::None {
                continue;
            }
            let t = &mut self.timers[i];
            t.armed = false;
            t.due = false;
            t.missed = 0;
            match cmd {
                TimerCommand::Disable => t.active = false,
                TimerCommand::Schedule { deadline, period } => {
                    t.active = true;
                    t.deadline = deadline;
                    t.period = period;
                }
                TimerCommand::None => {}
            }
            self.arm_timer(i);
        }
    }

    /// A timer first due at `first_deadline_ns` (CLOCK_MONOTONIC), then
    /// every `period` if given. The handle disables or reschedules it.
    pub fn add_timer(
        &mut self,
        name: &str,
        first_deadline_ns: u64,
        period: Option<Duration>,
        handler: impl FnMut(&mut Ctx) + 'static,
    ) -> TimerHandle {
        let period = period.map_or(0, |p| p.as_nanos().max(1) as u64);
        let i = self.push_timer(
            name.into(),
            first_deadline_ns,
            period,
            Some(Box::new(handler)),
        );
        self.handle(i)
    }

    /// A phased loop: due at every `k * period + offset` on CLOCK_MONOTONIC,
    /// starting with the next such instant. A late loop skips the cycles
    /// whose deadlines passed and tells the handler how many
    /// ([`Ctx::missed_cycles`]).
    pub fn add_phased_loop(
        &mut self,
        name: &str,
        period: Duration,
        offset: Duration,
        handler: impl FnMut(&mut Ctx) + 'static,
    ) -> TimerHandle {
        let p = period.as_nanos().max(1) as u64;
        let off = offset.as_nanos() as u64 % p;
        let now = sys::monotonic_ns();
        let k = now.saturating_sub(off) / p + 1;
        let i = self.push_timer(name.into(), k * p + off, p, Some(Box::new(handler)));
        self.handle(i)
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

    /// The loop's counters now, as a report (allocates; for tests and
    /// diagnostics, not for the real-time path).
    pub fn report_now(&self) -> timing_report::TimingReport {
        let mut raw = Box::<RawReport>::default();
        self.fill_report(&mut raw, 0);
        timing_report::TimingReport::from_raw(&raw).expect("freshly built report decodes")
    }

    fn fill_report(&self, raw: &mut RawReport, seq: u64) {
        raw.seq = seq;
        raw.time_ns = sys::monotonic_ns();
        raw.pid = self.pid as u64;
        raw.backend = self.backend.code();
        raw.class = timing_report::class_code(self.class);
        let mut n = 0;
        for w in &self.watchers {
            if n < timing_report::MAX_ENTRIES {
                raw.entry[n].fill(EntryKind::Watcher, &w.name, &w.stats, w.total);
                n += 1;
            }
        }
        for (i, t) in self.timers.iter().enumerate() {
            if self.internal_timer(i) {
                continue;
            }
            if n < timing_report::MAX_ENTRIES {
                raw.entry[n].fill(EntryKind::Timer, &t.name, &t.stats, t.total);
                n += 1;
            }
        }
        for (name, c) in &self.senders {
            if n < timing_report::MAX_ENTRIES {
                let s = EntryStats {
                    count: c.window_count.get(),
                    errors: c.window_errors.get(),
                    ..EntryStats::default()
                };
                raw.entry[n].fill(EntryKind::Sender, name, &s, c.count.get());
                n += 1;
            }
        }
        raw.entries = n as u64;
    }

    fn publish_report(&mut self) {
        let Some(mut rep) = self.reporting.take() else {
            return;
        };
        rep.seq += 1;
        self.fill_report(&mut rep.raw, rep.seq);
        rep.raw.period_ns = rep.period;
        let _ = rep.publisher.publish_value(&*rep.raw);
        for w in &mut self.watchers {
            w.stats.new_period();
        }
        for t in &mut self.timers {
            t.stats.new_period();
        }
        for (_, c) in &self.senders {
            c.window_count.set(0);
            c.window_errors.set(0);
        }
        self.reporting = Some(rep);
    }

    /// Whether timer `i` is the loop's own (reports, wake check), not a
    /// user's.
    fn internal_timer(&self, i: usize) -> bool {
        self.report_timer == Some(i) || self.wake_check_timer == Some(i)
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
                Self::fail_if_truncated(w);
            }
        }
    }

    /// Marks the watcher failed when its channel was truncated (the kernel
    /// answers EFAULT for a futex word past the end of the file); `false`
    /// when the mapping is intact (the error is something else).
    fn fail_if_truncated(w: &mut Watcher) -> bool {
        if w.sub.channel().probe_mapping() {
            return false;
        }
        w.failed = Some(ChannelFault::Truncated);
        w.stats.faults += 1;
        w.ready = false;
        w.staged = None;
        if w.armed {
            w.armed = false;
            w.sub.end_wait();
        }
        true
    }

    fn ring(&mut self) -> Result<&mut IoUring, EventLoopRunError> {
        if self.ring.is_none() {
            let entries =
                (2 * (self.watchers.len() + self.timers.len()) + 8).next_power_of_two() as u32;
            let ring = build_ring(entries).map_err(EventLoopRunError::Enter)?;
            self.ring = Some(ring);
        }
        Ok(self.ring.as_mut().expect("ring was just built"))
    }

    fn push(&mut self, sqe: &io_uring::squeue::Entry) -> Result<(), EventLoopRunError> {
        let ring = self.ring()?;
        loop {
            // SAFETY: the pointers in our SQEs are a futex word inside a
            // channel mapping that the watcher's Subscriber keeps mapped
            // for the loop's lifetime, and a boxed Timespec owned by its
            // Timer; the kernel reads both when the SQE is submitted
            // (a futex wait keeps only the futex key, a timeout copies the
            // timespec). Watchers and timers are never removed, and the
            // ring is dropped before them (field order), so both outlive
            // every submission.
            if unsafe { ring.submission().push(sqe) }.is_ok() {
                return Ok(());
            }
            ring.submit().map_err(EventLoopRunError::Enter)?;
        }
    }

    /// Arms watcher `i`'s wait, or marks it ready when data is already
    /// there.
    fn arm_watcher(&mut self, i: usize) -> Result<(), EventLoopRunError> {
        let w = &mut self.watchers[i];
        if w.armed || w.ready || w.failed.is_some() {
            return Ok(());
        }
        if self.backend == Backend::Doorbell {
            // Waits on the loop's bell; the index is looked at in
            // wait_doorbell, after the bell says the loop sleeps.
            w.armed = true;
            w.woken = false;
            return Ok(());
        }
        if !w.sub.begin_wait() {
            // Found before sleeping: no wake was due.
            w.ready = true;
            w.woken = true;
            return Ok(());
        }
        w.armed = true;
        w.woken = false;
        if self.backend == Backend::FutexWaitv {
            return Ok(()); // the wait itself is issued in wait_waitv
        }
        let word = w.sub.channel().futex_word(self.class);
        let val = w.sub.wait_value() as u64;
        if let Some(h) = self.before_arm.as_mut() {
            h();
        }
        let sqe = opcode::FutexWait::new(word, val, MATCH_ANY, sys::FUTEX2_SIZE_U32)
            .build()
            .user_data(KIND_WATCH | i as u64);
        self.push(&sqe)
    }

    /// Counts timer `i` in the next sleep's deadline, on every backend:
    /// the deadline is the sleep's own timeout, never an io_uring timeout
    /// request, whose expiry would add task_work to the ring from
    /// `ktimers/N` (see [`crate::wake`]).
    fn arm_timer(&mut self, i: usize) {
        let t = &mut self.timers[i];
        if !(t.armed || t.due || !t.active) {
            t.armed = true;
        }
    }

    /// Runs until a handler calls [`Ctx::exit`] or nothing is left to wait
    /// for.
    pub fn run(&mut self) -> Result<(), EventLoopRunError> {
        self.exit = false;
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
        self.waitv.reserve(self.watchers.len());
        self.waitv_owner.reserve(self.watchers.len());
        if let (Some(every), None, false) = (
            self.wake_check,
            self.wake_check_timer,
            self.watchers.is_empty(),
        ) {
            let period = every.as_nanos().clamp(1, u64::MAX as u128) as u64;
            let t = self.push_timer(
                "wake-check".into(),
                sys::monotonic_ns().saturating_add(period),
                period,
                None,
            );
            self.wake_check_timer = Some(t);
        }
        if self.backend == Backend::IoUringFutex {
            self.ring()?;
        }
        if self.backend == Backend::Doorbell {
            self.list_bell()?;
        }
        for i in 0..self.watchers.len() {
            self.arm_watcher(i)?;
        }
        for i in 0..self.timers.len() {
            self.arm_timer(i);
        }
        self.look_across();
        let mut hooks = std::mem::take(&mut self.on_run);
        for h in &mut hooks {
            let now = sys::monotonic_ns();
            let mut ctx = Ctx {
                now_ns: now,
                event_ns: now,
                missed: 0,
                lost: 0,
                exit: &mut self.exit,
            };
            h(&mut ctx);
        }
        self.on_run = hooks;
        while !self.exit {
            self.dispatch()?;
            if self.exit {
                break;
            }
            // Watchers always wait again (io_uring: re-armed when drained;
            // futex_waitv: armed per call); timers until their last firing.
            // The wake check alone keeps nothing alive.
            let waiting = self.watchers.iter().any(|w| w.failed.is_none())
                || self
                    .timers
                    .iter()
                    .enumerate()
                    .any(|(i, t)| t.armed && self.wake_check_timer != Some(i));
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
            for (_, c) in &self.senders {
                if let Some((slot, bytes)) = c.warm.take() {
                    c.channel.warm_for_write(slot, bytes, &arrived);
                }
            }
            match self.backend {
                Backend::IoUringFutex => self.wait_uring()?,
                Backend::FutexWaitv => self.wait_waitv()?,
                Backend::Doorbell => self.wait_doorbell()?,
            }
            self.look_across();
        }
        Ok(())
    }

    /// One sleep of the io_uring backend: submit what is queued and wait
    /// for a completion, until the next deadline at the latest. The
    /// deadline is the wait's own timeout (`IORING_ENTER_EXT_ARG`, absolute
    /// with `IORING_ENTER_ABS_TIMER` from Linux 6.12, relative before): no
    /// timeout request sits in the ring, so no timer expiry adds task_work
    /// to it (see [`crate::wake`]). A relative timeout measured from just
    /// before the call ends a little after the deadline, never before it.
    fn wait_uring(&mut self) -> Result<(), EventLoopRunError> {
        let deadline = self.sleep_deadline();
        let ring = self.ring.as_mut().expect("ring built in run");
        let r = match deadline {
            None => ring.submit_and_wait(1),
            Some(d) => {
                let mut r = None;
                if self.abs_timer {
                    let ts = types::Timespec::new()
                        .sec(d / 1_000_000_000)
                        .nsec((d % 1_000_000_000) as u32);
                    let args = types::SubmitArgs::new().timespec(&ts);
                    match ring.submitter().submit_with_args_and_flags(
                        1,
                        &args,
                        io_uring::EnterFlags::ABS_TIMER,
                    ) {
                        // A kernel before 6.12: relative timeouts from now on.
                        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => self.abs_timer = false,
                        other => r = Some(other),
                    }
                }
                match r {
                    Some(r) => r,
                    None => {
                        let rel = d.saturating_sub(sys::monotonic_ns());
                        let ts = types::Timespec::new()
                            .sec(rel / 1_000_000_000)
                            .nsec((rel % 1_000_000_000) as u32);
                        let args = types::SubmitArgs::new().timespec(&ts);
                        ring.submitter().submit_with_args(1, &args)
                    }
                }
            }
        };
        match r {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR) | Some(libc::EBUSY) | Some(libc::ETIME)
                ) => {}
            Err(e) => return Err(EventLoopRunError::Enter(e)),
        }
        self.slept_until_ns = sys::monotonic_ns();
        let ring = self.ring.as_mut().expect("ring built in run");
        for cqe in ring.completion() {
            let ud = cqe.user_data();
            let res = cqe.result();
            let idx = (ud & INDEX_MASK) as usize;
            // Only futex waits are ever submitted; anything else is not ours.
            if ud & (0xff << KIND_SHIFT) != KIND_WATCH || idx >= self.watchers.len() {
                continue;
            }
            let w = &mut self.watchers[idx];
            w.armed = false;
            w.sub.end_wait();
            w.ready = true;
            w.woken = true;
            if res == -libc::EAGAIN {
                w.stats.eagain += 1;
            } else if res == -libc::EFAULT && Self::fail_if_truncated(w) {
                // Counted; the rest of the loop runs on.
            } else if res < 0 && res != -libc::EINTR && res != -libc::ECANCELED {
                let w = &self.watchers[idx];
                return Err(EventLoopRunError::Wait {
                    channel: w.name.clone(),
                    errno: io::Error::from_raw_os_error(-res),
                });
            }
        }
        self.expire_timers();
        Ok(())
    }

    /// When the next sleep must end: the earliest armed timer, and the
    /// next look for messages of the other wake class (see
    /// [`EventLoop::look_across`]).
    fn sleep_deadline(&self) -> Option<u64> {
        let timers = self.next_timer_deadline();
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
        let now = sys::monotonic_ns();
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

    fn wait_waitv(&mut self) -> Result<(), EventLoopRunError> {
        // futex_waitv waits are one-shot per call: count every idle
        // watcher as waiting again (or find its data already there).
        for i in 0..self.watchers.len() {
            self.arm_watcher(i)?;
        }
        if self.watchers.iter().any(|w| w.ready) {
            for w in &mut self.watchers {
                if w.armed {
                    w.armed = false;
                    w.sub.end_wait();
                }
            }
            return Ok(());
        }
        self.waitv.clear();
        self.waitv_owner.clear();
        for (i, w) in self.watchers.iter().enumerate() {
            if w.armed {
                self.waitv.push(FutexWaitv {
                    val: w.sub.wait_value() as u64,
                    uaddr: w.sub.channel().futex_word(self.class) as u64,
                    flags: sys::FUTEX2_SIZE_U32,
                    reserved: 0,
                });
                self.waitv_owner.push(i);
            }
        }
        let deadline = self.sleep_deadline();
        let r = if self.waitv.is_empty() {
            if let Some(d) = deadline {
                sleep_until_ns(d);
            }
            WaitvResult::TimedOut
        } else {
            if let Some(h) = self.before_arm.as_mut() {
                h();
            }
            match sys::futex_waitv(&self.waitv, deadline) {
                Ok(r) => r,
                Err(e) if e.raw_os_error() == Some(libc::EFAULT) => {
                    // Some watched word is past the end of its file: find
                    // it (the probe replaces that mapping) and go on.
                    let owners = std::mem::take(&mut self.waitv_owner);
                    let mut found = false;
                    for &i in &owners {
                        found |= Self::fail_if_truncated(&mut self.watchers[i]);
                    }
                    self.waitv_owner = owners;
                    if !found {
                        return Err(EventLoopRunError::Waitv(e));
                    }
                    WaitvResult::Again
                }
                Err(e) => return Err(EventLoopRunError::Waitv(e)),
            }
        };
        let now = sys::monotonic_ns();
        self.slept_until_ns = now;
        for &i in &self.waitv_owner {
            let w = &mut self.watchers[i];
            if !w.armed {
                continue; // failed above
            }
            w.armed = false;
            w.sub.end_wait();
            // A timeout is no wake: what it finds is counted per message
            // as it is handled (see dispatch).
            w.woken = r != WaitvResult::TimedOut;
            if w.sub.has_new() {
                w.ready = true;
                if r == WaitvResult::Again {
                    w.stats.eagain += 1;
                }
            }
        }
        for t in &mut self.timers {
            if t.armed && t.deadline <= now {
                t.armed = false;
                t.due = true;
            }
        }
        Ok(())
    }

    /// Doorbell backend: claims the loop's bell (in the doorbell table of
    /// the first watched channel's directory) and lists it in every
    /// watched channel not yet listing it. Each wait then looks at the
    /// indexes after announcing the sleep, which covers messages published
    /// before a listing was seen (see [`crate::doorbell`]).
    fn list_bell(&mut self) -> Result<(), EventLoopRunError> {
        let Some(first) = self.watchers.iter().find(|w| w.failed.is_none()) else {
            return Ok(());
        };
        if self.bell.is_none() {
            let table = BellTable::open(first.sub.channel().shm_dir(), None, false)
                .map_err(EventLoopRunError::Doorbell)?;
            let bell = Bell::claim(table, &self.proc_root).map_err(EventLoopRunError::Doorbell)?;
            self.bell = Some(bell);
        }
        let bell = self.bell.as_ref().expect("claimed above");
        for w in &mut self.watchers {
            if w.listing.is_some() || w.failed.is_some() {
                continue;
            }
            let listing = w
                .sub
                .channel()
                .list_bell(bell, self.class, &self.proc_root)
                .map_err(|source| EventLoopRunError::Listing {
                    channel: w.name.clone(),
                    source,
                })?;
            w.listing = Some(listing);
        }
        Ok(())
    }

    /// The earliest deadline of the armed timers.
    fn next_timer_deadline(&self) -> Option<u64> {
        self.timers
            .iter()
            .filter(|t| t.armed)
            .map(|t| t.deadline)
            .min()
    }

    /// One sleep of the doorbell backend: announce it on the bell, look at
    /// every watched index, sleep on the bell until rung or the next timer
    /// deadline.
    fn wait_doorbell(&mut self) -> Result<(), EventLoopRunError> {
        for i in 0..self.watchers.len() {
            self.arm_watcher(i)?;
        }
        let deadline = self.sleep_deadline();
        let Some(bell) = self.bell.as_ref() else {
            // Nothing watched: timers only.
            if let Some(d) = deadline {
                sleep_until_ns(d);
            }
            self.expire_timers();
            return Ok(());
        };
        // SeqCst RMW on the bell, then SeqCst loads of the indexes.
        let key = bell.prepare_sleep();
        let mut ready = false;
        for w in &mut self.watchers {
            if w.armed && w.sub.has_new_seqcst() {
                // Found before sleeping: no ring was due.
                w.armed = false;
                w.ready = true;
                w.woken = true;
                ready = true;
            }
        }
        let result = if ready {
            None
        } else {
            if let Some(h) = self.before_arm.as_mut() {
                h();
            }
            Some(bell.sleep(key, deadline).map_err(EventLoopRunError::Bell)?)
        };
        // A ring moves the word (publishers add to it), so a sleep that
        // timed out as a ring came still counts as rung.
        let rung = bell.wake_up() != key;
        if result.is_some() {
            self.slept_until_ns = sys::monotonic_ns();
        }
        let woken = match result {
            Some(sys::WaitResult::TimedOut) => rung,
            _ => true,
        };
        for w in &mut self.watchers {
            if !w.armed {
                continue;
            }
            w.woken = woken;
            if w.sub.has_new() {
                w.armed = false;
                w.ready = true;
                if result == Some(sys::WaitResult::Again) {
                    w.stats.eagain += 1;
                }
            } else if w.sub.channel().is_truncated() {
                Self::fail_if_truncated(w);
            }
        }
        self.expire_timers();
        Ok(())
    }

    /// Marks every armed timer whose deadline passed as due (the backends
    /// that sleep with a timeout instead of arming io_uring timeouts).
    fn expire_timers(&mut self) {
        let now = sys::monotonic_ns();
        for t in &mut self.timers {
            if t.armed && t.deadline <= now {
                t.armed = false;
                t.due = true;
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
            self.apply_timer_commands();
            let mut best: Option<(u64, bool, usize)> = None;
            for i in 0..self.watchers.len() {
                self.refill(i)?;
                if let Some(m) = &self.watchers[i].staged {
                    if best.is_none_or(|b| m.send_time_ns < b.0) {
                        best = Some((m.send_time_ns, true, i));
                    }
                }
            }
            for (i, t) in self.timers.iter().enumerate() {
                if t.due && best.is_none_or(|b| t.deadline < b.0) {
                    best = Some((t.deadline, false, i));
                }
            }
            let Some((event_ns, is_watch, i)) = best else {
                return Ok(());
            };
            let now = sys::monotonic_ns();
            let (missed, lost) = if is_watch {
                let w = &self.watchers[i];
                let before = w.staged.map_or(0, |m| m.lost_before);
                (0, before.saturating_add(w.untold_lost))
            } else {
                (std::mem::take(&mut self.timers[i].missed), 0)
            };
            let mut ctx = Ctx {
                now_ns: now,
                event_ns,
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
                let end = sys::monotonic_ns();
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
                let end = if self.report_timer == Some(i) {
                    self.publish_report();
                    sys::monotonic_ns()
                } else if self.wake_check_timer == Some(i) {
                    self.check_wakes();
                    sys::monotonic_ns()
                } else {
                    let t = &mut self.timers[i];
                    if let Some(h) = t.handler.as_mut() {
                        crate::miss_trace::handled(
                            crate::miss_trace::Handled::Timer { seq: t.total },
                            event_ns,
                            now,
                        );
                        h(&mut ctx);
                    }
                    let end = sys::monotonic_ns();
                    t.stats.record(now.saturating_sub(event_ns), end - now);
                    t.total += 1;
                    end
                };
                let t = &mut self.timers[i];
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
                    self.arm_timer(i);
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
fn sleep_until_ns(deadline_ns: u64) {
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
