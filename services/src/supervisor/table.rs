//! The process table: each process's state, its pidfd and output pipe, its
//! log, its health from timing reports, and the decisions of
//! [`crate::restart`] applied to it. Start order follows `after:`; a stop is
//! SIGTERM to the process group, then SIGKILL after `stop_timeout`; on
//! shutdown the processes stop in reverse dependency order.
//!
//! What a process writes, and the supervisor's own lines about it, go to
//! its log and to the control connections following it ([`Followers`]).

use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, WaitIdOptions, WaitOptions};
use units::cpu::CpuSet;

use super::startup::{BootGate, SupervisorConfig};
use super::Stderr;
use crate::config::ProcessConfig;
use crate::health::Health;
use crate::logfile::{self, RotatingLog};
use crate::procfs;
use crate::release::ProcessHealth;
use crate::restart::{Decision, ExitKind, Tracker};
use crate::spawn::{self, SpawnContext};
use crate::status::{InForceStatus, ProcessStatus};

/// At most this much of one process's output is read per turn of the
/// event loop.
const OUTPUT_PER_TURN: usize = 1 << 20;

/// How an implausible timing report is said in the process's log.
const IMPLAUSIBLE: &str = "timing report implausible";

/// How often the timing reports are read (they are published once a second).
const TIMING_POLL: Duration = Duration::from_millis(500);

/// Why a release's configuration cannot be taken by the running table
/// ([`Table::reconfigure`]): processes and channels are set up at start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum TableReconfigureError {
    #[error("its processes ({}) are not the running ones ({}): processes are set up at the supervisor's start", new.join(", "), running.join(", "))]
    Processes {
        new: Vec<String>,
        running: Vec<String>,
    },
    #[error(
        "its channels differ from the running ones: channels are created at the supervisor's start"
    )]
    Channels,
}

/// Where a process's output and the supervisor's lines about it go besides
/// its log: the clients following it.
pub(super) trait Followers {
    fn forward(&mut self, proc_idx: usize, data: &str);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PState {
    Waiting,
    Running,
    Backoff,
    Stopping,
    Stopped,
    Exited,
    Failed,
    Refused,
}

impl PState {
    pub(super) fn name(self) -> &'static str {
        match self {
            PState::Waiting => "waiting",
            PState::Running => "running",
            PState::Backoff => "backoff",
            PState::Stopping => "stopping",
            PState::Stopped => "stopped",
            PState::Exited => "exited",
            PState::Failed => "failed",
            PState::Refused => "refused",
        }
    }
}

/// What to do when a stopping process is down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AfterStop {
    Stay,
    Restart,
}

/// One process of `robot.yaml`.
pub(super) struct Proc {
    cfg: ProcessConfig,
    cpus: CpuSet,
    state: PState,
    reason: Option<String>,
    child: Option<spawn::Child>,
    /// The child's output pipe reached end of file while it lives (it
    /// closed stdout and stderr): no longer polled, or the hang-up would
    /// wake the loop on every turn.
    output_closed: bool,
    log: Option<RotatingLog>,
    log_path: PathBuf,
    restarts: u32,
    tracker: Tracker,
    last_exit: Option<String>,
    backoff_until: Option<Instant>,
    stop_deadline: Option<Instant>,
    killed: bool,
    after_stop: AfterStop,
    /// Started although the boot check failed (`on_failure: degrade`).
    degraded: bool,
    health: Health,
    /// The last error reading this process's timing channel (said once,
    /// not every poll).
    timing_error: Option<String>,
    /// The verdict of its last traced miss and the file that holds it
    /// (robot.yaml `check.trace_on_miss`), kept across restarts.
    last_trace: Option<String>,
}

impl Proc {
    pub(super) fn name(&self) -> &str {
        &self.cfg.name
    }

    pub(super) fn state(&self) -> PState {
        self.state
    }

    pub(super) fn reason(&self) -> Option<&str> {
        self.reason.as_deref()
    }

    pub(super) fn last_exit(&self) -> Option<&str> {
        self.last_exit.as_deref()
    }

    /// The pid of the running child, if any.
    pub(super) fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.pid)
    }

    pub(super) fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Running, and its child not yet reaped.
    pub(super) fn is_up(&self) -> bool {
        self.state == PState::Running && self.child.is_some()
    }

    /// Whether a trial judges this process: all but those stopped (or
    /// being stopped) by request, refused by the boot check, or done
    /// (exited 0 under a policy that does not restart them).
    pub(super) fn judged(&self) -> bool {
        !(matches!(self.state, PState::Stopped | PState::Refused)
            || (self.state == PState::Stopping && self.after_stop == AfterStop::Stay)
            || (self.state == PState::Exited && self.last_exit.as_deref() == Some("exit 0")))
    }

    /// What a trial's health verdict looks at, `now` into the
    /// supervisor's run.
    pub(super) fn trial_health(&self, now: Duration) -> ProcessHealth {
        ProcessHealth {
            name: self.cfg.name.clone(),
            running: self.is_up(),
            ready: self.health.ready() && !self.health.unhealthy(now),
            over_budget: self.health.over_budget,
            restarts: self.restarts,
        }
    }
}

/// Every process, and what starting, watching and stopping them needs.
pub(super) struct Table {
    procs: Vec<Proc>,
    ctx: SpawnContext,
    boot: BootGate,
    log_max_bytes: u64,
    log_keep: u32,
    shm_dir: PathBuf,
    /// The channels as configured (for [`Self::reconfigure`]).
    channels: Vec<controller::config::ChannelConfig>,
    channel_budgets: BTreeMap<String, Duration>,
    next_timing_poll: Instant,
    /// Every process is being brought down (SIGTERM, SIGINT, `stop-all`).
    shutting_down: bool,
    /// When the supervisor started: process health counts from here.
    started: Instant,
    stderr: Stderr,
}

/// What [`Table::new`] needs besides the configuration.
pub(super) struct TableSetup {
    pub ctx: SpawnContext,
    pub boot: BootGate,
    pub shm_dir: PathBuf,
    pub log_max_bytes: u64,
    pub log_keep: u32,
    pub started: Instant,
    pub stderr: Stderr,
}

impl Table {
    /// Every process waiting; those in an `after:` cycle failed.
    pub(super) fn new(cfg: &SupervisorConfig, prefix: &Path, setup: TableSetup) -> Table {
        let channel_budgets: BTreeMap<String, Duration> = cfg
            .channels
            .iter()
            .filter_map(|c| c.budget.map(|b| (c.name.clone(), b.0)))
            .collect();
        let procs = cfg
            .processes
            .iter()
            .zip(
                cfg.cpus
                    .iter()
                    .cloned()
                    .chain(std::iter::repeat(CpuSet::new())),
            )
            .map(|(p, cpus)| Proc {
                log_path: logfile::log_path(prefix, &p.name),
                cfg: p.clone(),
                cpus,
                state: PState::Waiting,
                reason: None,
                child: None,
                output_closed: false,
                log: None,
                restarts: 0,
                tracker: Tracker::default(),
                last_exit: None,
                backoff_until: None,
                stop_deadline: None,
                killed: false,
                after_stop: AfterStop::Stay,
                degraded: false,
                health: Health::new(p),
                timing_error: None,
                last_trace: None,
            })
            .collect();
        Table {
            procs,
            ctx: setup.ctx,
            boot: setup.boot,
            log_max_bytes: setup.log_max_bytes,
            log_keep: setup.log_keep,
            shm_dir: setup.shm_dir,
            channels: cfg.channels.clone(),
            channel_budgets,
            next_timing_poll: Instant::now(),
            shutting_down: false,
            started: setup.started,
            stderr: setup.stderr,
        }
    }

    /// Takes a release's configuration for the processes: each one's
    /// command, CPUs, limits, restart policy and budgets, and the channels'
    /// budgets. Refused (nothing changes) when the process names or the
    /// channels differ: processes and channels are created at start.
    /// Call before [`Self::restart_all`]: a process starts again with it.
    pub(super) fn reconfigure(
        &mut self,
        cfg: &SupervisorConfig,
    ) -> Result<(), TableReconfigureError> {
        let names = |v: &mut dyn Iterator<Item = &str>| v.map(String::from).collect::<Vec<_>>();
        let now = names(&mut self.procs.iter().map(|p| p.cfg.name.as_str()));
        let new = names(&mut cfg.processes.iter().map(|p| p.name.as_str()));
        if now != new {
            return Err(TableReconfigureError::Processes { new, running: now });
        }
        let shape = |c: &controller::config::ChannelConfig| {
            format!(
                "{:?}",
                controller::config::ChannelConfig {
                    budget: None,
                    ..c.clone()
                }
            )
        };
        let old_channels: Vec<String> = self.channels.iter().map(shape).collect();
        let new_channels: Vec<String> = cfg.channels.iter().map(shape).collect();
        if old_channels != new_channels {
            return Err(TableReconfigureError::Channels);
        }
        for (i, p) in cfg.processes.iter().enumerate() {
            let proc = &mut self.procs[i];
            proc.cfg = p.clone();
            proc.cpus = cfg.cpus.get(i).cloned().unwrap_or_default();
            proc.health = Health::new(p);
        }
        self.channel_budgets = cfg
            .channels
            .iter()
            .filter_map(|c| c.budget.map(|b| (c.name.clone(), b.0)))
            .collect();
        self.channels = cfg.channels.clone();
        Ok(())
    }

    /// Fails every process whose `after:` leads back to itself.
    pub(super) fn detect_cycles(&mut self) {
        let names: Vec<String> = self.procs.iter().map(|p| p.cfg.name.clone()).collect();
        let idx = |n: &str| names.iter().position(|m| m == n);
        for i in 0..self.procs.len() {
            // Depth-first from i; a path back to i is a cycle.
            let mut stack = vec![i];
            let mut seen = vec![false; names.len()];
            let mut cyclic = false;
            while let Some(j) = stack.pop() {
                for a in &self.procs[j].cfg.after {
                    match idx(a) {
                        Some(k) if k == i => cyclic = true,
                        Some(k) if !seen[k] => {
                            seen[k] = true;
                            stack.push(k);
                        }
                        _ => {}
                    }
                }
            }
            if cyclic {
                self.procs[i].state = PState::Failed;
                self.procs[i].reason = Some("dependency cycle in `after:`".into());
            }
        }
    }

    pub(super) fn procs(&self) -> &[Proc] {
        &self.procs
    }

    pub(super) fn proc(&self, i: usize) -> &Proc {
        &self.procs[i]
    }

    pub(super) fn index(&self, name: &str) -> Option<usize> {
        self.procs.iter().position(|p| p.cfg.name == name)
    }

    /// The boot check's result, as the status shows it.
    pub(super) fn boot_check(&self) -> &str {
        &self.boot.summary
    }

    /// How long the supervisor has run (the health clock).
    pub(super) fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    pub(super) fn shutting_down(&self) -> bool {
        self.shutting_down
    }

    /// Begins the shutdown; false when it had begun already.
    pub(super) fn shut_down(&mut self) -> bool {
        !std::mem::replace(&mut self.shutting_down, true)
    }

    /// Every process that can start has: none waits but for a dependency
    /// that failed.
    pub(super) fn started_all(&self) -> bool {
        !self
            .procs
            .iter()
            .any(|p| p.state == PState::Waiting && self.deps_failed(p).is_none())
    }

    /// No child is left to reap.
    pub(super) fn all_down(&self) -> bool {
        self.procs.iter().all(|p| p.child.is_none())
    }

    /// A dependency that failed or was refused (so this one cannot start).
    fn deps_failed(&self, p: &Proc) -> Option<String> {
        for a in &p.cfg.after {
            match self.index(a) {
                None => return Some(format!("`after: {a}` names no process")),
                Some(j) if matches!(self.procs[j].state, PState::Failed | PState::Refused) => {
                    return Some(format!(
                        "dependency `{a}` is {}",
                        self.procs[j].state.name()
                    ))
                }
                _ => {}
            }
        }
        None
    }

    /// Every `after:` process runs and, when it reports timing, has
    /// published its first report.
    fn deps_running(&self, p: &Proc) -> bool {
        p.cfg.after.iter().all(|a| {
            self.index(a).is_some_and(|j| {
                self.procs[j].state == PState::Running && self.procs[j].health.ready()
            })
        })
    }

    /// Reads the latest timing report of every running process, when due.
    pub(super) fn poll_reports_if_due(&mut self, now: Instant, out: &mut impl Followers) {
        if now >= self.next_timing_poll {
            self.next_timing_poll = now + TIMING_POLL;
            self.poll_reports(out);
        }
    }

    /// Reads the latest timing report of every running process.
    fn poll_reports(&mut self, out: &mut impl Followers) {
        let now = self.started.elapsed();
        for i in 0..self.procs.len() {
            let Some(pid) = self.procs[i].child.as_ref().map(|c| c.pid) else {
                continue;
            };
            let name = self.procs[i].cfg.name.clone();
            // Bounded in time and memory whatever the file holds (the
            // process, or any other of the group, may have scribbled on
            // it): geometry checked before mapping, reads bounded.
            let report = match controller::timing_report::read_latest(&self.shm_dir, &name) {
                Ok(Some(r)) => r,
                // Nothing published yet.
                Ok(None) => continue,
                // No channel yet.
                Err(controller::timing_report::TimingReadError::Open {
                    source: controller::channel::ChannelOpenError::NotFound { .. },
                    ..
                }) => continue,
                Err(e) => {
                    let msg = format!("timing report unreadable: {}", units::error::Chain(&e));
                    if self.procs[i].timing_error.as_deref() != Some(msg.as_str()) {
                        self.note(i, &msg, out);
                        self.stderr.warn_about(&name, &msg);
                        self.procs[i].timing_error = Some(msg);
                    }
                    continue;
                }
            };
            let p = &mut self.procs[i];
            let was_ready = p.health.ready();
            let verdict = p
                .health
                .on_report(&report, pid, now, &p.cfg, &self.channel_budgets);
            if let crate::health::ReportVerdict::Implausible(why) = &verdict {
                // Said once per run of such reports (their figures vary).
                if !self.procs[i]
                    .timing_error
                    .as_deref()
                    .is_some_and(|e| e.starts_with(IMPLAUSIBLE))
                {
                    let msg = format!(
                        "{IMPLAUSIBLE} (report {}: {why}); not counted against its budgets",
                        report.seq
                    );
                    self.note(i, &msg, out);
                    self.stderr.warn_about(&name, &msg);
                    self.procs[i].timing_error = Some(msg);
                }
            } else if verdict != crate::health::ReportVerdict::Old {
                self.procs[i].timing_error = None;
            }
            if let crate::health::ReportVerdict::Over(why) = verdict {
                let n = self.procs[i].health.over_budget;
                if n <= 10 || n % 100 == 0 {
                    self.note(
                        i,
                        &format!("timing report {} over budget (#{n}): {why}", report.seq),
                        out,
                    );
                    self.stderr.event(
                        "budget",
                        Some(&name),
                        format!("{name}: timing report over budget (#{n}): {why}"),
                    );
                }
            }
            if !was_ready && self.procs[i].health.ready() {
                self.note(i, "first timing report: ready", out);
            }
        }
    }

    /// Timers: start what can start, restart after backoff, escalate stops.
    pub(super) fn tick(&mut self, now: Instant, out: &mut impl Followers) {
        for i in 0..self.procs.len() {
            match self.procs[i].state {
                PState::Waiting if !self.shutting_down => {
                    if let Some(why) = self.deps_failed(&self.procs[i]) {
                        self.procs[i].reason = Some(format!("waiting: {why}"));
                    } else if self.deps_running(&self.procs[i]) {
                        self.start(i, out);
                    } else {
                        let missing: Vec<String> = self.procs[i]
                            .cfg
                            .after
                            .iter()
                            .filter_map(|a| {
                                let j = self.index(a)?;
                                let d = &self.procs[j];
                                match (d.state == PState::Running, d.health.ready()) {
                                    (true, true) => None,
                                    (true, false) => Some(format!("{a} (no timing report yet)")),
                                    _ => Some(a.clone()),
                                }
                            })
                            .collect();
                        self.procs[i].reason = Some(format!("waiting for {}", missing.join(", ")));
                    }
                }
                PState::Backoff
                    if !self.shutting_down
                        && self.procs[i].backoff_until.is_some_and(|t| now >= t) =>
                {
                    self.procs[i].restarts += 1;
                    self.start(i, out);
                }
                PState::Stopping => {
                    let p = &mut self.procs[i];
                    if !p.killed && p.stop_deadline.is_some_and(|t| now >= t) {
                        p.killed = true;
                        if let Some(c) = &p.child {
                            signal_group(c.pid, Signal::KILL);
                            let (name, timeout) = (p.cfg.name.clone(), p.cfg.stop_timeout);
                            self.note(
                                i,
                                &format!("still running {timeout} after SIGTERM: sent SIGKILL"),
                                out,
                            );
                            self.stderr
                                .say(format!("{name}: stop timeout {timeout}: SIGKILL"));
                        }
                    }
                }
                _ => {}
            }
        }
    }

    /// Starts process `i` now.
    fn start(&mut self, i: usize, out: &mut impl Followers) {
        let realtime = self.procs[i].cfg.policy.is_realtime();
        if realtime && self.boot.refuse {
            let p = &mut self.procs[i];
            p.state = PState::Refused;
            p.reason = Some(format!("boot check {}", self.boot.summary));
            return;
        }
        if self.procs[i].log.is_none() {
            match RotatingLog::open(
                self.procs[i].log_path.clone(),
                self.log_max_bytes,
                self.log_keep,
            ) {
                Ok(l) => self.procs[i].log = Some(l),
                Err(e) => self.stderr.say(format!("{}: {e}", self.procs[i].cfg.name)),
            }
        }
        let result = spawn::prepare(&self.procs[i].cfg, &self.procs[i].cpus, &self.ctx)
            .and_then(|prep| spawn::spawn(&prep));
        let degraded = realtime && self.boot.degrade;
        match result {
            Ok(child) => {
                let pid = child.pid;
                let since = self.started.elapsed();
                self.procs[i].health.restarted(since);
                let warnings = child.warnings.clone();
                let p = &mut self.procs[i];
                p.child = Some(child);
                p.output_closed = false;
                p.state = PState::Running;
                p.reason = None;
                p.degraded = degraded;
                p.backoff_until = None;
                p.stop_deadline = None;
                p.killed = false;
                p.after_stop = AfterStop::Stay;
                let name = p.cfg.name.clone();
                self.note(i, &format!("started, pid {pid}"), out);
                self.stderr
                    .event("start", Some(&name), format!("{name}: started, pid {pid}"));
                for w in warnings {
                    self.note(i, &format!("warning: {w}"), out);
                    self.stderr.say(format!("{name}: warning: {w}"));
                }
            }
            Err(e) => {
                let msg = e.to_string();
                let p = &mut self.procs[i];
                p.state = PState::Failed;
                p.reason = Some(msg.clone());
                self.note(i, &msg, out);
                self.stderr.say(msg);
            }
        }
    }

    /// A line from the supervisor in a process's log.
    pub(super) fn note(&mut self, i: usize, line: &str, out: &mut impl Followers) {
        if let Some(l) = &mut self.procs[i].log {
            let _ = l.note(line);
        }
        let data = format!("[rtdeploy] {line}\n");
        out.forward(i, &data);
    }

    /// A traced miss of the process running as `pid`: kept for its status
    /// and said in its log; `false` when no process runs as `pid` (it
    /// exited since).
    pub(super) fn traced_miss(
        &mut self,
        miss: &super::startup::TracedMiss,
        out: &mut impl Followers,
    ) -> bool {
        let Some(i) = self
            .procs
            .iter()
            .position(|p| p.child.as_ref().is_some_and(|c| c.pid == miss.pid))
        else {
            return false;
        };
        let line = match &miss.file {
            Some(f) => format!("{} (trace {f})", miss.verdict),
            None => miss.verdict.clone(),
        };
        self.note(i, &format!("traced miss: {line}"), out);
        self.procs[i].last_trace = Some(line);
        true
    }

    /// Lets process `i` start again (by request): its crash history is
    /// forgotten and it waits for its dependencies.
    pub(super) fn wait_to_start(&mut self, i: usize) {
        let p = &mut self.procs[i];
        p.tracker.reset();
        p.state = PState::Waiting;
        p.reason = None;
    }

    /// Sends SIGTERM to a running process and arms its stop timeout.
    pub(super) fn begin_stop(&mut self, i: usize, after: AfterStop, out: &mut impl Followers) {
        let p = &mut self.procs[i];
        match p.state {
            PState::Running => {
                if let Some(c) = &p.child {
                    signal_group(c.pid, Signal::TERM);
                }
                p.state = PState::Stopping;
                p.stop_deadline = Some(Instant::now() + p.cfg.stop_timeout.0);
                p.killed = false;
                p.after_stop = after;
                self.note(i, "stopping: sent SIGTERM", out);
            }
            PState::Stopping => p.after_stop = after,
            PState::Backoff
            | PState::Waiting
            | PState::Exited
            | PState::Failed
            | PState::Refused
            | PState::Stopped => {
                if after == AfterStop::Restart && !self.shutting_down {
                    p.state = PState::Waiting;
                    p.tracker.reset();
                    p.reason = None;
                } else if p.child.is_none() && matches!(p.state, PState::Backoff | PState::Waiting)
                {
                    p.state = PState::Stopped;
                    p.reason = Some("stopped by request".into());
                }
            }
        }
    }

    /// Restarts every process that is not stopped by request or refused
    /// by the boot check (those stay as they are).
    pub(super) fn restart_all(&mut self, why: &str, out: &mut impl Followers) {
        for i in 0..self.procs.len() {
            if matches!(self.procs[i].state, PState::Stopped | PState::Refused) {
                continue;
            }
            self.note(i, &format!("{why}: restarting"), out);
            self.begin_stop(i, AfterStop::Restart, out);
        }
    }

    /// Stops processes whose dependents are all down (reverse order).
    pub(super) fn shutdown_step(&mut self, out: &mut impl Followers) {
        for i in 0..self.procs.len() {
            let name = self.procs[i].cfg.name.clone();
            let dependents_up = self
                .procs
                .iter()
                .any(|q| q.child.is_some() && q.cfg.after.contains(&name));
            match self.procs[i].state {
                PState::Running if !dependents_up => self.begin_stop(i, AfterStop::Stay, out),
                PState::Waiting | PState::Backoff => {
                    self.procs[i].state = PState::Stopped;
                    self.procs[i].reason = Some("supervisor shutting down".into());
                }
                _ => {}
            }
        }
    }

    /// The process `i` exited with `exit`.
    fn on_exit(&mut self, i: usize, exit: ExitKind, out: &mut impl Followers) {
        let Some(child) = self.procs[i].child.take() else {
            return;
        };
        // Keep what it wrote last.
        self.drain_output(i, &child.output, out);
        // Its process group goes with it (grandchildren never linger).
        let _ = rustix::process::kill_process_group(
            Pid::from_raw(child.pid).expect("positive pid"),
            Signal::KILL,
        );
        let ran = child.started.elapsed();
        let desc = exit.describe();
        self.procs[i].last_exit = Some(desc.clone());
        self.note(
            i,
            &format!("pid {} {desc} after {:.3}s", child.pid, ran.as_secs_f64()),
            out,
        );
        let name = self.procs[i].cfg.name.clone();
        self.stderr.event(
            "exit",
            Some(&name),
            format!("{name}: pid {} {desc}", child.pid),
        );
        let state = self.procs[i].state;
        if state == PState::Stopping || self.shutting_down {
            let p = &mut self.procs[i];
            if p.after_stop == AfterStop::Restart && !self.shutting_down {
                p.tracker.reset();
                p.restarts += 1;
                p.state = PState::Waiting;
                p.reason = None;
            } else {
                p.state = PState::Stopped;
                p.reason = Some(if p.killed {
                    "stopped (SIGKILL after stop timeout)".into()
                } else {
                    "stopped".into()
                });
            }
            return;
        }
        let now = self.started.elapsed();
        let p = &mut self.procs[i];
        match p.tracker.on_exit(&p.cfg.restart, exit, ran, now) {
            Decision::Restart(d) => {
                p.state = PState::Backoff;
                p.backoff_until = Some(Instant::now() + d);
                p.reason = Some(format!(
                    "restarting in {:.3}s after {desc}",
                    d.as_secs_f64()
                ));
                let msg = format!("restart in {:.3}s", d.as_secs_f64());
                self.note(i, &msg, out);
                self.stderr
                    .event("restart", Some(&name), format!("{name}: {msg}"));
            }
            Decision::Stay => {
                p.state = PState::Exited;
                p.reason = Some(
                    format!("{desc}; restart policy {:?}", p.cfg.restart.policy).to_lowercase(),
                );
            }
            Decision::Fail(why) => {
                p.state = PState::Failed;
                p.reason = Some(why.clone());
                self.note(i, &why, out);
                self.stderr
                    .event("crash_loop", Some(&name), format!("{name}: {why}"));
            }
        }
    }

    /// Copies what is in a process's output pipe to its log and its
    /// followers; false at end of file.
    fn drain_output(&mut self, i: usize, fd: &OwnedFd, out: &mut impl Followers) -> bool {
        let mut buf = [0u8; 16384];
        let mut taken = 0;
        // A process that writes as fast as this reads would otherwise keep
        // the loop here for good: the rest waits for the next turn.
        while taken < OUTPUT_PER_TURN {
            match rustix::io::read(fd, &mut buf) {
                Ok(0) => return false,
                Ok(n) => {
                    taken += n;
                    if let Some(l) = &mut self.procs[i].log {
                        if let Err(e) = l.write(&buf[..n]) {
                            self.stderr.say(e);
                        }
                    }
                    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                    out.forward(i, &text);
                }
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => return true,
            }
        }
        true
    }

    /// Drains the output pipe of running process `i`; false when the pipe
    /// is at end of file while the process lives (it closed stdout).
    pub(super) fn read_output(&mut self, i: usize, out: &mut impl Followers) -> bool {
        let Some(c) = self.procs[i].child.take() else {
            return true;
        };
        let open = self.drain_output(i, &c.output, out);
        self.procs[i].child = Some(c);
        open
    }

    /// A pipe at end of file while the process lives (it closed stdout
    /// and stderr): stop polling it until the next start.
    pub(super) fn close_output(&mut self, i: usize) {
        self.procs[i].output_closed = true;
    }

    /// Reaps: each managed child through its pidfd, then (as reaper,
    /// `orphans`) every other exited process.
    pub(super) fn reap(&mut self, orphans: bool, out: &mut impl Followers) {
        for i in 0..self.procs.len() {
            let status = match &self.procs[i].child {
                Some(c) => rustix::process::waitid(
                    rustix::process::WaitId::PidFd(c.pidfd.as_fd()),
                    WaitIdOptions::EXITED | WaitIdOptions::NOHANG,
                ),
                None => continue,
            };
            match status {
                Ok(Some(st)) => {
                    let exit = match (st.exit_status(), st.terminating_signal()) {
                        (Some(c), _) => ExitKind::Code(c),
                        (None, Some(s)) => ExitKind::Signal(s),
                        (None, None) => continue,
                    };
                    self.on_exit(i, exit, out);
                }
                Ok(None) => {}
                // Already reaped by the orphan loop below (ECHILD): handled there.
                Err(_) => {}
            }
        }
        if orphans {
            while let Ok(Some((pid, st))) = rustix::process::wait(WaitOptions::NOHANG) {
                let pid = pid.as_raw_nonzero().get();
                if let Some(i) = self
                    .procs
                    .iter()
                    .position(|p| p.child.as_ref().is_some_and(|c| c.pid == pid))
                {
                    let exit = match (st.exit_status(), st.terminating_signal()) {
                        (Some(c), _) => ExitKind::Code(c),
                        (_, Some(s)) => ExitKind::Signal(s),
                        _ => continue,
                    };
                    self.on_exit(i, exit, out);
                }
            }
        }
    }

    /// The descriptors to poll: per running process, its index, its
    /// pidfd and its output pipe.
    pub(super) fn poll_fds(&self) -> impl Iterator<Item = (usize, RawFd, Option<RawFd>)> + '_ {
        self.procs.iter().enumerate().filter_map(|(i, p)| {
            let c = p.child.as_ref()?;
            Some((
                i,
                c.pidfd.as_raw_fd(),
                (!p.output_closed).then(|| c.output.as_raw_fd()),
            ))
        })
    }

    /// The earliest timer: a backoff ending, a stop timeout, the next
    /// timing poll while a running process reports timing.
    pub(super) fn next_timer(&self) -> Option<Instant> {
        let backoffs = self.procs.iter().filter_map(|p| match p.state {
            PState::Backoff => p.backoff_until,
            PState::Stopping if !p.killed => p.stop_deadline,
            _ => None,
        });
        let timing = self
            .procs
            .iter()
            .any(|p| p.child.is_some() && p.health.expected)
            .then_some(self.next_timing_poll);
        backoffs.chain(timing).min()
    }

    /// Each process as `deploy status` shows it.
    pub(super) fn status(&self, proc_root: &Path) -> Vec<ProcessStatus> {
        self.procs
            .iter()
            .map(|p| {
                let pid = p.child.as_ref().map(|c| c.pid);
                let in_force = pid
                    .and_then(|pid| procfs::in_force(proc_root, pid).ok())
                    .map(|f| InForceStatus {
                        policy: f.policy,
                        priority: f.priority,
                        nice: f.nice,
                        cpus: f.cpus,
                        uid: f.uid,
                        gid: f.gid,
                    });
                ProcessStatus {
                    name: p.cfg.name.clone(),
                    state: p.state.name().into(),
                    reason: p.reason.clone(),
                    pid,
                    restarts: p.restarts,
                    uptime_s: p.child.as_ref().map(|c| c.started.elapsed().as_secs_f64()),
                    in_force,
                    last_exit: p.last_exit.clone(),
                    wakeup_p99_us: p.health.wakeup_p99_ns.map(|n| n as f64 / 1000.0),
                    wakeup_max_us: p.health.wakeup_max_ns.map(|n| n as f64 / 1000.0),
                    backend: if p.child.is_some() {
                        p.health.backend.clone()
                    } else {
                        None
                    },
                    budget: if p.child.is_some() {
                        p.health.describe(self.started.elapsed())
                    } else {
                        "-".into()
                    },
                    over_budget_reports: p.health.over_budget,
                    degraded: p.degraded || p.health.over_budget > 0,
                    timing: p.health.timing_status(),
                    last_trace: p.last_trace.clone(),
                }
            })
            .collect()
    }
}

fn signal_group(pid: i32, sig: Signal) {
    if let Some(p) = Pid::from_raw(pid) {
        let _ = rustix::process::kill_process_group(p, sig);
        let _ = rustix::process::kill_process(p, sig);
    }
}
