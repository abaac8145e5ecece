//! The supervisor's event loop: one thread, `poll(2)` on a signalfd, one
//! pidfd and one output pipe per running process, the control socket and
//! its clients; timers are the poll timeout.
//!
//! Start-up ([`startup`]): mount what is missing (as PID 1), apply the CPU
//! plan, hold `/dev/cpu_dma_latency`, create the channels, run the boot
//! timing check, open the control socket; the loop then starts the
//! processes in dependency order (`after:`). Watching ([`table`]): exits
//! go through [`crate::restart`]; a stop is SIGTERM to the process group,
//! then SIGKILL after `stop_timeout`; on shutdown the processes stop in
//! reverse dependency order and, as PID 1, every remaining process is
//! killed and reaped. Control connections ([`conns`]) are read and
//! answered without blocking ([`requests`]: what each request does).
//!
//! Releases ([`trial`]): before anything else at start-up, a trial that a
//! reboot or crash interrupted rolls back; while the supervisor runs, a
//! new trial restarts every process from the new `current` and is judged
//! until it is committed or rolled back.
//!
//! This module holds the loop and the wiring: each part owns its state
//! ([`table::Table`], [`conns::Conns`], [`trial::ReleaseWatch`]) and the
//! loop hands one to another.

mod conns;
mod requests;
mod startup;
mod table;
mod trial;

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rustix::process::WaitOptions;

use crate::notify::Notifier;
use crate::pid1::AtExit;
use crate::status::{StepStatus, SupervisorStatus};
use conns::{Access, Conns};
use table::{Table, TableSetup};
use trial::ReleaseWatch;

/// A turn of the event loop that works this long is said on stderr.
const STALL: Duration = Duration::from_secs(1);

/// Start-up beyond the boot check's own duration (the CPU plan, the
/// channels, the check's set-up) that systemd is asked to wait for.
const START_MARGIN: Duration = Duration::from_secs(120);

/// An IRQ scan a kernel event asked for runs this long after the event
/// (the driver may still be setting up) ...
const EARLY_SCAN_DELAY: Duration = Duration::from_millis(100);
/// ... and never sooner than this after the last scan, however many
/// events arrive.
const EARLY_SCAN_GAP: Duration = Duration::from_millis(250);
/// How often the trace watch looks for a miss a process stopped the
/// trace on (it records nothing until then).
const TRACE_WATCH_EVERY: Duration = Duration::from_millis(200);

pub use controller::rt::find_cgroup;
pub use startup::{
    Boot, BootCheckOutcome, ConfigHook, Options, Roots, SupervisorConfig, SupervisorStartError,
    TraceTurn, TracedMiss,
};
pub use trial::recover;

/// How [`Supervisor::run_to_end`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// Asked to stop (a signal, `stop-all`).
    Stopped,
    /// Every process stopped so that the supervisor starts again, for the
    /// reason given ([`Options::restart_to_reload`]).
    Restart(String),
}

/// The supervisor's own lines: on stderr (`Options::verbose`), to the
/// journal, and to the log (`log:`) as events of a kind.
#[derive(Debug, Clone)]
struct Stderr {
    verbose: bool,
    /// The logger's event queue, when a logger runs.
    sink: Option<logbook::EventSink>,
}

impl Stderr {
    /// An event of the supervisor: to the journal when it is there
    /// ([`crate::journal`]), on stderr when verbose, to the log.
    fn say(&self, msg: impl std::fmt::Display) {
        self.event("supervisor", None, msg);
    }

    /// A warning about one process (the journal gets its name as
    /// `RTDEPLOY_PROCESS`).
    fn warn_about(&self, process: &str, msg: impl std::fmt::Display) {
        self.send(
            "warning",
            crate::journal::Priority::Warning,
            Some(process),
            msg,
        );
    }

    /// An event of a kind the log names (`start`, `exit`, `restart`,
    /// `crash_loop`, `budget`, `boot_check`, `trial`, `commit`,
    /// `rollback`, `supervisor`).
    fn event(&self, kind: &'static str, process: Option<&str>, msg: impl std::fmt::Display) {
        self.send(kind, crate::journal::Priority::Info, process, msg);
    }

    fn send(
        &self,
        kind: &'static str,
        pri: crate::journal::Priority,
        process: Option<&str>,
        msg: impl std::fmt::Display,
    ) {
        let msg = msg.to_string();
        crate::journal::event(self.verbose, pri, process, &msg);
        if let Some(s) = &self.sink {
            s.send(kind, process, &msg);
        }
    }
}

/// Starts the logger when robot.yaml has a `log:` section that records;
/// its start-up step says where it writes, or why it could not start.
fn start_logger(
    cfg: &SupervisorConfig,
    roots: &Roots,
    shm_dir: &std::path::Path,
    steps: &mut Vec<StepStatus>,
) -> Option<logbook::Recorder> {
    let section = cfg.log.as_ref().filter(|l| l.enabled)?;
    // Under the prefix, through the one join that cannot leave it, and
    // not through a link that leads out of it either.
    let dir = match &section.dir {
        Some(d) => units::path::join_under(&roots.prefix, d),
        None => Ok(releases::Layout::new(&roots.prefix).log_dir().join("mcap")),
    }
    .and_then(|dir| units::path::resolved_within(&roots.prefix, &dir).map(|()| dir));
    let dir = match dir {
        Ok(d) => d,
        Err(e) => {
            steps.push(StepStatus {
                step: "logger".into(),
                result: "failed".into(),
                detail: format!("log.dir: {e}"),
            });
            return None;
        }
    };
    let mut channels: Vec<String> = cfg.channels.iter().map(|c| c.name.clone()).collect();
    channels.extend(
        cfg.processes
            .iter()
            .map(|p| controller::timing_report::timing_channel_name(&p.name)),
    );
    let boot_id = units::bounded::Bound::pseudo(64)
        .read_lossy(&roots.proc_root.join("sys/kernel/random/boot_id"))
        .map(|s| s.trim().chars().take(64).collect())
        .unwrap_or_default();
    let recorded = channels.iter().filter(|c| section.records(c)).count();
    let r = logbook::Recorder::start(logbook::RecorderConfig {
        section: section.clone(),
        dir: dir.clone(),
        shm_dir: shm_dir.to_path_buf(),
        channels,
        boot_id,
        cpus: cfg.housekeeping.clone(),
        from_oldest: true,
    });
    let (result, detail) = match &r {
        Ok(_) => (
            "ok".to_string(),
            format!(
                "{}: {recorded} channel(s) recorded, on CPUs {}",
                dir.display(),
                if cfg.housekeeping.is_empty() {
                    "of the supervisor".to_string()
                } else {
                    cfg.housekeeping.to_string()
                }
            ),
        ),
        Err(e) => ("failed".to_string(), format!("{}: {e}", dir.display())),
    };
    steps.push(StepStatus {
        step: "logger".into(),
        result,
        detail,
    });
    r.ok()
}

/// The running supervisor.
pub struct Supervisor {
    table: Table,
    conns: Conns,
    releases: ReleaseWatch,
    robot: String,
    proc_root: PathBuf,
    /// The start-up steps, as the status shows them.
    startup: Vec<StepStatus>,
    _dma_latency: Option<controller::rt::DmaLatencyHold>,
    sigfd: Option<OwnedFd>,
    notifier: Option<Notifier>,
    next_watchdog: Option<Instant>,
    /// The hardware watchdog (robot.yaml `watchdog:`).
    hw_watchdog: Option<crate::watchdog::Held>,
    handle_signals: bool,
    pid1: bool,
    at_exit: AtExit,
    started: Instant,
    stderr: Stderr,
    /// The robot's part (the CPU plan, IRQ scans, miss tracing), when given.
    boot: Option<Box<dyn Boot>>,
    /// Interrupts and IRQ threads that appear later: the scan's period,
    /// when it runs next, and what its last placing did.
    irq_scan_every: Option<Duration>,
    next_irq_scan: Option<Instant>,
    last_irq_scan: Option<StepStatus>,
    /// How long this turn's IRQ scan took (zero without one).
    irq_scan_took: Duration,
    /// Set when the processes are being stopped to start again.
    restart: Option<String>,
    /// When the last IRQ scan ran.
    last_irq_scan_at: Option<Instant>,
    /// Kernel event sockets that bring the next IRQ scan forward, and the
    /// event that did so for the scan now due.
    hotplug: Vec<crate::hotplug::EventSocket>,
    early_scan: Option<String>,
    /// The Prometheus textfile (robot.yaml `metrics:`).
    metrics: Option<crate::metrics::Textfile>,
    /// The logger (robot.yaml `log:`).
    logger: Option<logbook::Recorder>,
    /// Where the bridge's status channel is, when robot.yaml has a bridge.
    bridge_shm: Option<std::path::PathBuf>,
    /// The Jetson's rootfs A/B slots as this boot found them.
    rootfs_slots: Option<crate::rootfs_slots::RootfsSlots>,
    /// When the tracing of the running processes' misses looks next.
    next_trace_watch: Option<Instant>,
    /// What woke the event loop, for the status.
    counts: crate::status::LoopCounts,
}

impl Supervisor {
    /// Does the start-up sequence up to (not including) starting processes.
    pub fn new(
        cfg: SupervisorConfig,
        roots: Roots,
        opts: Options,
        boot: Option<Box<dyn Boot>>,
        notifier: Option<Notifier>,
    ) -> Result<Supervisor, SupervisorStartError> {
        let mut boot = boot;
        let irq_scan_every = opts.irq_scan_every.filter(|_| boot.is_some());
        let load_config = boot.as_mut().and_then(|b| b.release_config());
        if opts.journal {
            crate::journal::init(crate::journal::Journal::from_env(&cfg.robot.name));
        }
        // systemd gives a Type=notify service 90 s (TimeoutStartSec) to
        // say READY=1 and kills it then; start-up runs the boot check, as
        // long as robot.yaml says, so the limit is extended to cover it.
        if let (Some(n), true) = (&notifier, cfg.boot_check.enabled && boot.is_some()) {
            let extend = cfg.boot_check.duration.0 + START_MARGIN;
            if let Err(e) = n.send(&format!(
                "EXTEND_TIMEOUT_USEC={}\nSTATUS=start-up: CPU plan, channels, boot check ({:.0}s)",
                extend.as_micros(),
                cfg.boot_check.duration.0.as_secs_f64()
            )) {
                Stderr {
                    verbose: opts.verbose,
                    sink: None,
                }
                .say(e);
            }
        }
        let mut s = startup::start_up(&cfg, &roots, &opts, boot.as_deref_mut())?;
        // The hardware watchdog after the start-up's long steps (the CPU
        // plan, the boot check), which run before the loop that feeds it:
        // until here a watchdog started before user space counts with the
        // timeout it was started with.
        let hw_watchdog = opts.watchdog.as_ref().map(|w| {
            let held = match &opts.watchdog_skip {
                Some(why) => crate::watchdog::Held::skipped(&w.device, w.timeout.0, why),
                None => crate::watchdog::Held::open(
                    &crate::watchdog::device_path(&roots.dev_root, &w.device),
                    &w.device,
                    w.timeout.0,
                    Instant::now(),
                ),
            };
            s.steps.push(held.step(Instant::now()));
            held
        });
        let rootfs_slots = boot.as_mut().and_then(|b| b.rootfs_slots()).map(|mut r| {
            r.confirmed = s
                .steps
                .iter()
                .find(|st| st.step == "rootfs slot")
                .map(|st| st.result == "ok");
            r
        });
        let plan_outcome = trial::CpuPlanNotApplied::of_steps(&s.steps);
        let logger = start_logger(&cfg, &roots, &s.shm_dir, &mut s.steps);
        let bridge_shm = cfg
            .processes
            .iter()
            .any(|p| p.name == crate::bridge::PROCESS)
            .then(|| s.shm_dir.clone());
        let stderr = Stderr {
            verbose: opts.verbose,
            sink: logger.as_ref().map(|l| l.sink()),
        };
        let started = Instant::now();
        let table = Table::new(
            &cfg,
            &roots.prefix,
            TableSetup {
                ctx: s.ctx,
                boot: s.boot,
                shm_dir: s.shm_dir,
                log_max_bytes: opts.log_max_bytes,
                log_keep: opts.log_keep,
                started,
                stderr: stderr.clone(),
            },
        );
        let access = Access {
            own_uid: s.own_uid,
            group_name: cfg.robot.group.clone(),
            group_gid: s.group_gid,
            proc_root: roots.proc_root.clone(),
        };
        let prefix = roots.prefix.clone();
        let mut sup = Supervisor {
            table,
            conns: Conns::new(s.listener, s.socket_path, access),
            releases: ReleaseWatch::new(
                &roots.prefix,
                opts.health_window,
                opts.keep,
                s.release,
                plan_outcome,
                load_config,
                stderr.clone(),
            )
            .restarting_to_reload(opts.restart_to_reload && !opts.pid1),
            robot: cfg.robot.name.clone(),
            proc_root: roots.proc_root,
            startup: s.steps,
            _dma_latency: s.dma_latency,
            sigfd: s.sigfd,
            next_watchdog: notifier
                .as_ref()
                .and_then(|n| n.watchdog)
                .map(|w| Instant::now() + w),
            notifier,
            hw_watchdog,
            handle_signals: opts.handle_signals,
            pid1: opts.pid1,
            at_exit: opts.at_exit,
            started,
            stderr: stderr.clone(),
            logger,
            bridge_shm,
            rootfs_slots,
            next_irq_scan: irq_scan_every.map(|every| started + every),
            irq_scan_every,
            irq_scan_took: Duration::ZERO,
            restart: None,
            last_irq_scan: None,
            counts: Default::default(),
            last_irq_scan_at: None,
            hotplug: Vec::new(),
            early_scan: None,
            metrics: opts.metrics_textfile.clone().map(|(path, every)| {
                crate::metrics::Textfile::new(path, every).within(prefix.clone())
            }),
            next_trace_watch: boot.as_ref().map(|_| started),
            boot,
        };
        // Before any process starts: the tracer they write to is set up.
        sup.watch_traces(started);
        if sup.irq_scan_every.is_some() && opts.irq_scan_on_events {
            use crate::hotplug::{EventSocket, Kind};
            for kind in [Kind::Uevent, Kind::Link] {
                match EventSocket::open(kind) {
                    Ok(s) => sup.hotplug.push(s),
                    Err(e) => stderr.say(format!(
                        "irq scan: no {kind:?} events from the kernel ({e}); scanning on its period only"
                    )),
                }
            }
        }
        for s in &sup.startup {
            if s.result != "ok" {
                stderr.say(format!("{}: {} ({})", s.step, s.result, s.detail));
            }
        }
        stderr.event(
            "boot_check",
            None,
            format!("boot check {}", sup.table.boot_check()),
        );
        stderr.say(format!("release: {}", sup.releases.status().describe()));
        sup.table.detect_cycles();
        // An install that ran between the recovery and now is a trial
        // that legitimately began: the processes start from it.
        sup.releases
            .check(Instant::now(), &mut sup.table, &mut sup.conns);
        Ok(sup)
    }

    /// Runs until every process is down after a shutdown request (SIGTERM,
    /// SIGINT or `stop-all`).
    pub fn run(self) -> Result<(), SupervisorStartError> {
        self.run_to_end().map(|_| ())
    }

    /// [`Supervisor::run`], saying how it ended: stopped, or stopped to be
    /// started again ([`Options::restart_to_reload`]).
    pub fn run_to_end(mut self) -> Result<Ended, SupervisorStartError> {
        let mut ready_sent = false;
        loop {
            let now = Instant::now();
            self.tick(now);
            let timers = now.elapsed();
            if !ready_sent && self.table.started_all() {
                ready_sent = true;
                self.notify("READY=1");
                self.stderr.say("start-up done");
            }
            if self.table.shutting_down() && self.table.all_down() {
                break;
            }
            let events = self.wait_and_dispatch()?;
            self.say_if_stalled(timers, events);
        }
        self.finish();
        Ok(match self.restart.take() {
            Some(why) => Ended::Restart(why),
            None => Ended::Stopped,
        })
    }

    /// One turn of the loop that worked (not slept) longer than
    /// [`STALL`] is said, with where the time went: a loop that stalls
    /// misses systemd's watchdog and restarts every process.
    fn say_if_stalled(&self, timers: Duration, events: Duration) {
        if timers + events >= STALL {
            self.stderr.say(format!(
                "event loop: one turn worked {:.1}s (timers {:.1}s, of which the IRQ scan {:.1}s; events {:.1}s){}",
                (timers + events).as_secs_f64(),
                timers.as_secs_f64(),
                self.irq_scan_took.min(timers).as_secs_f64(),
                events.as_secs_f64(),
                match self.notifier.as_ref().and_then(|n| n.watchdog) {
                    Some(w) => format!("; the watchdog is fed every {:.1}s", w.as_secs_f64()),
                    None => String::new(),
                }
            ));
        }
    }

    fn notify(&self, state: &str) {
        if let Some(n) = &self.notifier {
            if let Err(e) = n.send(state) {
                self.stderr.say(e);
            }
        }
    }

    /// Timers: the watchdog, the process table's, the release trial's,
    /// shutdown progress, and replies that were waiting on them.
    fn tick(&mut self, now: Instant) {
        self.irq_scan_took = Duration::ZERO;
        if let Some(t) = self.next_watchdog {
            if now >= t {
                self.notify("WATCHDOG=1");
                self.next_watchdog = self
                    .notifier
                    .as_ref()
                    .and_then(|n| n.watchdog)
                    .map(|w| now + w);
            }
        }
        if let Some(e) = self.hw_watchdog.as_mut().and_then(|w| w.feed_if_due(now)) {
            self.stderr.say(e);
        }
        self.table.tick(now, &mut self.conns);
        self.table.poll_reports_if_due(now, &mut self.conns);
        self.write_metrics_if_due(now);
        self.scan_irqs_if_due(now);
        self.watch_traces(now);
        if !self.table.shutting_down() {
            self.releases
                .check_if_due(now, &mut self.table, &mut self.conns);
            self.releases.judge(now, &mut self.table, &mut self.conns);
            if let Some(why) = self.releases.take_restart(&self.proc_root) {
                self.begin_shutdown(&format!("to start again: {why}"));
                self.restart = Some(why);
            }
        } else {
            self.table.shutdown_step(&mut self.conns);
        }
        self.conns.answer_pending(&self.table);
    }

    /// Writes the Prometheus textfile when `metrics.every` has passed.
    fn write_metrics_if_due(&mut self, now: Instant) {
        let Some(mut m) = self.metrics.take() else {
            return;
        };
        if let Some(e) = m.write_if_due(now, || self.status()) {
            self.stderr.say(e);
        }
        self.metrics = Some(m);
    }

    /// Takes the traced misses of the running processes, when due.
    fn watch_traces(&mut self, now: Instant) {
        let (Some(boot), Some(due)) = (self.boot.as_mut(), self.next_trace_watch) else {
            return;
        };
        if now < due {
            return;
        }
        let Some(turn) = boot.watch_traces() else {
            self.next_trace_watch = None;
            return;
        };
        self.next_trace_watch = Some(now + TRACE_WATCH_EVERY);
        for line in turn.say {
            self.stderr.say(line);
        }
        for m in &turn.misses {
            if !self.table.traced_miss(m, &mut self.conns) {
                self.stderr.say(format!(
                    "traced miss of pid {} (exited since): {}",
                    m.pid, m.verdict
                ));
            }
        }
    }

    /// Places interrupts and IRQ threads that appeared since the last scan.
    fn scan_irqs_if_due(&mut self, now: Instant) {
        let (Some(boot), Some(every), Some(due)) =
            (self.boot.as_mut(), self.irq_scan_every, self.next_irq_scan)
        else {
            return;
        };
        if now < due || self.table.shutting_down() {
            return;
        }
        self.next_irq_scan = Some(now + every);
        let began = Instant::now();
        let st = boot.scan_irqs();
        self.irq_scan_took = began.elapsed();
        self.last_irq_scan_at = Some(now);
        let early = self.early_scan.take();
        if let Some(mut st) = st {
            if let Some(why) = early {
                st.detail = format!("{} (scanned early after {why})", st.detail);
            }
            self.stderr
                .say(format!("{}: {} ({})", st.step, st.result, st.detail));
            self.last_irq_scan = Some(st);
        }
    }

    /// Reads a kernel event socket; an event that can bring an interrupt
    /// brings the next IRQ scan forward.
    fn read_hotplug(&mut self, j: usize, now: Instant) {
        let Some(trigger) = self.hotplug.get(j).and_then(|s| s.drain().trigger) else {
            return;
        };
        let Some(due) = self.next_irq_scan else {
            return;
        };
        let mut at = now + EARLY_SCAN_DELAY;
        if let Some(last) = self.last_irq_scan_at {
            at = at.max(last + EARLY_SCAN_GAP);
        }
        if at < due {
            self.next_irq_scan = Some(at);
            self.early_scan.get_or_insert(trigger);
        }
    }

    fn begin_shutdown(&mut self, why: &str) {
        if self.table.shut_down() {
            self.stderr.say(format!("shutting down: {why}"));
            self.notify("STOPPING=1");
        }
    }

    /// Waits for the next event or timer and handles what came; returns
    /// how long the handling took (the wait not counted).
    fn wait_and_dispatch(&mut self) -> Result<Duration, SupervisorStartError> {
        use crate::sys::{poll, Poll};
        #[derive(Clone, Copy)]
        enum Tag {
            Signal,
            Listener,
            Exit,
            Output(usize),
            Conn(usize),
            Hotplug(usize),
        }
        // Requests that waited behind a reply given since (answer_pending).
        for k in 0..self.conns.len() {
            if self.conns.has_request(k) {
                self.serve(k);
            }
        }
        let mut fds = Vec::new();
        let mut tags = Vec::new();
        if let Some(s) = &self.sigfd {
            fds.push(Poll::read(s.as_raw_fd()));
            tags.push(Tag::Signal);
        }
        if let Some(l) = self.conns.listener_fd() {
            fds.push(Poll::read(l));
            tags.push(Tag::Listener);
        }
        for (i, pidfd, output) in self.table.poll_fds() {
            fds.push(Poll::read(pidfd));
            tags.push(Tag::Exit);
            if let Some(output) = output {
                fds.push(Poll::read(output));
                tags.push(Tag::Output(i));
            }
        }
        for (k, fd, want_write) in self.conns.poll_fds() {
            let mut e = Poll::read(fd);
            e.want_write = want_write;
            fds.push(e);
            tags.push(Tag::Conn(k));
        }
        for (j, s) in self.hotplug.iter().enumerate() {
            fds.push(Poll::read(s.raw_fd()));
            tags.push(Tag::Hotplug(j));
        }
        poll(&mut fds, self.next_deadline()).map_err(SupervisorStartError::Poll)?;
        let woke = Instant::now();
        self.counts.turns += 1;
        if fds
            .iter()
            .zip(&tags)
            .any(|(e, t)| e.readable && matches!(t, Tag::Output(_)))
        {
            self.counts.output_wakes += 1;
        }
        let mut reap = false;
        let mut accept = false;
        let mut drop_output = Vec::new();
        for (e, tag) in fds.iter().zip(tags) {
            match tag {
                Tag::Signal if e.readable => {
                    let fd = self.sigfd.as_ref().expect("signal tag implies a signalfd");
                    for sig in crate::sys::read_signals(fd) {
                        match sig {
                            libc::SIGCHLD => reap = true,
                            s => self.begin_shutdown(&format!(
                                "received {}",
                                crate::restart::signal_name(s)
                            )),
                        }
                    }
                }
                Tag::Listener if e.readable => accept = true,
                Tag::Hotplug(j) if e.readable => self.read_hotplug(j, woke),
                Tag::Exit if e.readable => reap = true,
                Tag::Output(i) if e.readable => {
                    let open = self.table.read_output(i, &mut self.conns);
                    if !open {
                        drop_output.push(i);
                    }
                }
                Tag::Conn(k) => {
                    if e.writable {
                        self.conns.flush(k);
                    }
                    if e.readable {
                        self.read_conn(k);
                    } else if self.conns.has_request(k) {
                        self.serve(k);
                    }
                }
                _ => {}
            }
        }
        for i in drop_output {
            self.table.close_output(i);
        }
        if reap || self.pid1 {
            self.table.reap(self.handle_signals, &mut self.conns);
        }
        // After the open connections were read: a new client that makes
        // room closes an idle one, never one whose request just arrived.
        if accept {
            self.conns.accept();
        }
        self.conns.expire(Instant::now());
        self.conns.remove_dead();
        Ok(woke.elapsed())
    }

    fn next_deadline(&self) -> Option<Duration> {
        let now = Instant::now();
        let mut next = [
            self.next_watchdog,
            self.hw_watchdog.as_ref().and_then(|w| w.next_feed()),
            self.table.next_timer(),
            self.conns.next_deadline(),
            (!self.table.shutting_down()).then(|| self.releases.next_deadline()),
            self.next_irq_scan,
            self.next_trace_watch,
        ]
        .into_iter()
        .flatten()
        .min()
        .map(|t| t.saturating_duration_since(now));
        // Processes that wait for one that fails later, and pending replies,
        // are re-checked at least once a second.
        if self.conns.owes_replies() || self.table.shutting_down() {
            next = Some(next.map_or(Duration::from_millis(100), |t| {
                t.min(Duration::from_millis(100))
            }));
        }
        Some(next.map_or(Duration::from_secs(1), |t| t.min(Duration::from_secs(1))))
    }

    /// The status document.
    pub fn status(&self) -> SupervisorStatus {
        SupervisorStatus {
            robot: self.robot.clone(),
            pid: std::process::id() as i32,
            pid1: self.pid1,
            uptime_s: self.started.elapsed().as_secs_f64(),
            state: if self.table.shutting_down() {
                "stopping"
            } else {
                "running"
            }
            .into(),
            boot_check: self.table.boot_check().to_string(),
            startup: self.startup.clone(),
            release: Some(self.releases.status()),
            irq_scan: self.last_irq_scan.clone(),
            watchdog: self.hw_watchdog.as_ref().map(|w| w.status(Instant::now())),
            logger: self.logger.as_ref().map(|l| l.status()),
            bridge: self
                .bridge_shm
                .as_deref()
                .and_then(crate::bridge::read_status),
            rootfs_slots: self.rootfs_slots.clone(),
            event_loop: Some(self.counts),
            processes: self.table.status(&self.proc_root),
        }
    }

    /// After the last process: kill stragglers, remove the socket, and as
    /// PID 1 kill and reap everything left.
    fn finish(&mut self) {
        self.conns.close();
        if self.pid1 {
            // kill(-1, sig): every process except init itself.
            crate::sys::kill_all(libc::SIGTERM);
            let until = Instant::now() + Duration::from_secs(2);
            while Instant::now() < until {
                match rustix::process::wait(WaitOptions::NOHANG) {
                    Ok(Some(_)) => continue,
                    Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                    Err(_) => break,
                }
            }
            crate::sys::kill_all(libc::SIGKILL);
            while let Ok(Some(_)) = rustix::process::wait(WaitOptions::empty()) {}
        } else if self.handle_signals {
            while let Ok(Some(_)) = rustix::process::wait(WaitOptions::NOHANG) {}
        }
        self.stderr.say("stopped");
        // An orderly stop releases the hardware watchdog; a stop to start
        // again leaves it counting (the descriptor closes without the
        // magic character at the exec), and the new start opens it.
        if self.restart.is_none() {
            if let Some(crate::watchdog::Held::Open(w)) = self.hw_watchdog.take() {
                self.stderr.say(w.release());
            }
        }
        if let Some(l) = self.logger.take() {
            let st = l.stop();
            if st.state != "stopped" {
                self.stderr.say(format!("logger: {}", st.state));
            }
        }
        if self.pid1 {
            if let Err(e) = crate::pid1::finish(self.at_exit) {
                self.stderr
                    .say(format!("reboot({:?}) failed: {e}", self.at_exit));
            }
        }
    }
}
