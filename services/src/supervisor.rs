//! The supervisor's event loop: one thread, `poll(2)` on a signalfd, one
//! pidfd and one output pipe per running process, the control socket and
//! its clients; timers are the poll timeout.
//!
//! Start-up: mount what is missing (as PID 1), apply the CPU plan, hold
//! `/dev/cpu_dma_latency`, create the channels, run the boot timing check,
//! open the control socket, then start the processes in dependency order
//! (`after:`). Watching: exits go through [`crate::restart`]; a stop is
//! SIGTERM to the process group, then SIGKILL after `stop_timeout`; on
//! shutdown the processes stop in reverse dependency order and, as PID 1,
//! every remaining process is killed and reaped.
//!
//! Releases ([`crate::release`]): before anything else at start-up,
//! [`release::recover_at_start`] rolls back a trial that a reboot or crash
//! interrupted. While the supervisor runs it looks at `state.json` and the
//! `current` link once a second (and at once on a `release-changed`
//! request, which `deploy install` sends): a new trial restarts every
//! process from the new `current`, then [`release::TrialHealth`] judges
//! them once a second until [`release::commit`] or [`release::rollback`]
//! (which restarts them again, from the restored release). A `current`
//! moved by hand (`deploy rollback`) restarts the processes too; a trial
//! whose installer died before switching `current` is undone. A shutdown
//! during a trial leaves it on disk, so the next start rolls it back, as
//! after a crash. A process restarted during a trial (after a crash or by
//! request) fails it; one stopped by request is no longer judged.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use controller::config::{BootCheckSection, ChannelConfig, OnFailure};
use cpusets::cpuset::CpuSet;
use rustix::process::{Pid, Signal, WaitIdOptions, WaitOptions};

use crate::accounts::Accounts;
use crate::config::{ProcessConfig, RobotSection};
use crate::control::{self, NextLine, Reply, Request, RequestBuf};
use crate::health::Health;
use crate::logfile::{self, RotatingLog};
use crate::notify::Notifier;
use crate::pid1::AtExit;
use crate::procfs;
use crate::release::{self, HealthVerdict, ProcessHealth, ReleaseState, TrialHealth};
use crate::restart::{Decision, ExitKind, Tracker};
use crate::spawn::{self, SpawnContext};
use crate::status::{InForceStatus, ProcessStatus, ReleaseStatus, StepStatus, SupervisorStatus};

/// Why the supervisor could not start.
#[derive(Debug, thiserror::Error)]
pub enum SupervisorStartError {
    #[error("cannot create {}: {source}", path.display())]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("another supervisor answers on {}", path.display())]
    AlreadyRunning { path: PathBuf },
    #[error("cannot listen on {}: {source}", path.display())]
    Listen {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read accounts: {0}")]
    Accounts(#[from] crate::accounts::AccountResolveError),
    #[error("cannot block signals for the signalfd: {0}")]
    Signals(std::io::Error),
    #[error("poll failed: {0}")]
    Poll(std::io::Error),
}

/// The parts of `robot.yaml` the supervisor runs.
#[derive(Debug, Clone)]
pub struct SupervisorConfig {
    pub robot: RobotSection,
    pub processes: Vec<ProcessConfig>,
    /// The CPUs of each process, in `processes` order (as written, or the
    /// isolated / housekeeping default).
    pub cpus: Vec<CpuSet>,
    pub channels: Vec<ChannelConfig>,
    pub boot_check: BootCheckSection,
    /// `power.cpu_dma_latency` in microseconds.
    pub cpu_dma_latency: Option<u32>,
}

/// Where the live system is.
#[derive(Debug, Clone)]
pub struct Roots {
    /// The install prefix (`/` on a robot).
    pub prefix: PathBuf,
    /// `/proc`.
    pub proc_root: PathBuf,
    /// `/sys`.
    pub sys_root: PathBuf,
    /// `/dev` (for `cpu_dma_latency`).
    pub dev_root: PathBuf,
}

/// How the supervisor runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// Read SIGTERM, SIGINT and SIGCHLD through a signalfd, become a child
    /// subreaper and reap orphans. Off only when the supervisor runs on a
    /// thread of a larger program (tests).
    pub handle_signals: bool,
    /// Run as init: mount what is missing, kill and reap everything left at
    /// the end, then `at_exit`.
    pub pid1: bool,
    pub at_exit: AtExit,
    pub log_max_bytes: u64,
    pub log_keep: u32,
    /// Print what happens on stderr.
    pub verbose: bool,
    /// `update.health_window`: how long a release in trial must stay
    /// healthy to be committed.
    pub health_window: Duration,
    /// `update.keep`: releases kept when a trial commits.
    pub keep: u32,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            handle_signals: true,
            pid1: false,
            at_exit: AtExit::Exit,
            log_max_bytes: 4 << 20,
            log_keep: 3,
            verbose: true,
            health_window: Duration::from_secs(30),
            keep: 3,
        }
    }
}

/// The result of the boot timing check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BootCheckOutcome {
    Passed(String),
    Failed(String),
    /// Not run, and why.
    Skipped(String),
}

/// A start-up step done by another crate, given by the caller.
pub type StepHook = Box<dyn FnOnce() -> StepStatus>;
/// The boot timing check, given the configured duration.
pub type BootCheckHook = Box<dyn FnOnce(Duration) -> BootCheckOutcome>;

/// Start-up work the supervisor cannot do itself.
#[derive(Default)]
pub struct Hooks {
    /// Apply the cpusets runtime plan (IRQs, thread priorities, cgroups).
    pub apply_cpu_plan: Option<StepHook>,
    /// The boot timing check engine.
    pub boot_check: Option<BootCheckHook>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PState {
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
    fn name(self) -> &'static str {
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
enum AfterStop {
    Stay,
    Restart,
}

struct Proc {
    cfg: ProcessConfig,
    cpus: CpuSet,
    state: PState,
    reason: Option<String>,
    child: Option<spawn::Child>,
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
}

/// A control connection (limits and their reasons: [`control`]).
struct Conn {
    /// Names the connection in [`Pending`] across removals from `conns`.
    id: u64,
    stream: UnixStream,
    input: RequestBuf,
    outbuf: Vec<u8>,
    /// Following this process's log.
    follow: Option<usize>,
    /// A request whose reply comes later (see [`Pending`]).
    awaiting: bool,
    /// Dropped once `outbuf` is flushed; what the client sends is ignored.
    closing: bool,
    dead: bool,
    /// Accepted, or last answered, at (the longest idle makes room first).
    since: Instant,
    /// Dropped at this time: no complete request since `since`, or a reply
    /// left unread. `None` while awaiting a reply or following.
    deadline: Option<Instant>,
}

impl Conn {
    fn new(id: u64, stream: UnixStream, now: Instant) -> Conn {
        Conn {
            id,
            stream,
            input: RequestBuf::default(),
            outbuf: Vec::new(),
            follow: None,
            awaiting: false,
            closing: false,
            dead: false,
            since: now,
            deadline: Some(now + control::IDLE_TIMEOUT),
        }
    }

    /// Ready for its next request: nothing owed, nothing left to send.
    fn ready(&self) -> bool {
        !self.dead
            && !self.closing
            && !self.awaiting
            && self.follow.is_none()
            && self.outbuf.is_empty()
    }

    /// Answered: the client has `IDLE_TIMEOUT` to read this and send the
    /// next request.
    fn answered(&mut self, r: &Reply, now: Instant) {
        queue(self, r);
        self.awaiting = false;
        self.since = now;
        self.deadline = Some(now + control::IDLE_TIMEOUT);
    }

    /// Sends `r` as the last reply and drops the connection once it is out
    /// (or after `CLOSE_LINGER`).
    fn close_with(&mut self, r: &Reply, now: Instant) {
        queue(self, r);
        self.input.discard();
        self.closing = true;
        self.deadline = Some(now + control::CLOSE_LINGER);
        flush(self);
    }
}

/// A release in trial, as the supervisor follows it.
struct Trial {
    release: String,
    /// From `state.json`: identifies this trial (a second install of the
    /// same release is a new trial).
    since: u64,
    previous: String,
    began: Instant,
    phase: TrialPhase,
    /// Set when the new release's robot.yaml differs from the previous
    /// one's: the supervisor keeps the configuration it loaded.
    config_note: Option<String>,
}

enum TrialPhase {
    /// Every process is being restarted from the new release.
    Restarting,
    /// All started: health judged once a second from `began`.
    Watching {
        health: TrialHealth,
        began: Instant,
        next: Instant,
    },
}

/// A reply owed to a connection (`conn` is its [`Conn::id`]).
enum Pending {
    Stopped {
        conn: u64,
        proc_idx: usize,
    },
    Restarted {
        conn: u64,
        proc_idx: usize,
        old_pid: Option<i32>,
    },
    All {
        conn: u64,
    },
}

/// The running supervisor.
pub struct Supervisor {
    cfg: SupervisorConfig,
    roots: Roots,
    opts: Options,
    ctx: SpawnContext,
    procs: Vec<Proc>,
    conns: Vec<Conn>,
    next_conn_id: u64,
    listener: Option<UnixListener>,
    socket_path: PathBuf,
    sigfd: Option<OwnedFd>,
    notifier: Option<Notifier>,
    next_watchdog: Option<Instant>,
    _dma_latency: Option<File>,
    started: Instant,
    startup: Vec<StepStatus>,
    boot_check: String,
    boot_failed_refuse: bool,
    boot_failed_degrade: bool,
    shutting_down: bool,
    pending: Vec<Pending>,
    group_gid: Option<u32>,
    own_uid: u32,
    shm_dir: PathBuf,
    channel_budgets: BTreeMap<String, Duration>,
    next_timing_poll: Instant,
    /// The release `current` named when the processes were last
    /// (re)started from it.
    running_release: Option<String>,
    trial: Option<Trial>,
    /// A trial whose commit or rollback failed (release, since): not taken
    /// up again; the next start's recovery deals with it.
    abandoned: Option<(String, u64)>,
    release: ReleaseStatus,
    next_release_check: Instant,
}

/// Bytes read from one control connection per turn of the loop, so that
/// a client that never stops sending cannot keep the loop from the others.
const READ_BUDGET: usize = 64 * 1024;

/// Connections accepted per turn of the loop: the ones already open are
/// read before more are let in.
const ACCEPT_BATCH: usize = 16;

/// How often the timing reports are read (they are published once a second).
const TIMING_POLL: Duration = Duration::from_millis(500);

/// How often `state.json` and `current` are looked at, and a trial's
/// health judged.
const RELEASE_POLL: Duration = Duration::from_secs(1);

fn step(step: &str, result: &str, detail: impl Into<String>) -> StepStatus {
    StepStatus {
        step: step.into(),
        result: result.into(),
        detail: detail.into(),
    }
}

pub use controller::rt::find_cgroup;

impl Supervisor {
    /// Does the start-up sequence up to (not including) starting processes.
    pub fn new(
        cfg: SupervisorConfig,
        roots: Roots,
        opts: Options,
        hooks: Hooks,
        notifier: Option<Notifier>,
    ) -> Result<Supervisor, SupervisorStartError> {
        let mut startup = Vec::new();
        if opts.pid1 {
            startup.extend(crate::pid1::mount_missing(Path::new("/")));
        }
        let sigfd = if opts.handle_signals {
            let fd = crate::sys::signalfd(&[libc::SIGTERM, libc::SIGINT, libc::SIGCHLD])
                .map_err(SupervisorStartError::Signals)?;
            if !opts.pid1 {
                if let Err(e) =
                    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
                {
                    startup.push(step("child subreaper", "failed", e.to_string()));
                }
            }
            Some(fd)
        } else {
            None
        };

        // 0. Releases: a trial interrupted by a reboot or a crash rolls
        // back before anything starts.
        let (recovery_step, release_status) = recover_release(&roots.prefix);
        startup.push(recovery_step);
        let running_release = release_status.current.clone();

        // 1. The CPU plan.
        startup.push(match hooks.apply_cpu_plan {
            Some(h) => h(),
            None => step(
                "cpu plan",
                "skipped",
                "cpusets runtime plan API not available",
            ),
        });

        // 2. cpu_dma_latency, held for the supervisor's lifetime.
        let mut dma = None;
        match cfg.cpu_dma_latency {
            None => startup.push(step(
                "cpu_dma_latency",
                "skipped",
                "power.cpu_dma_latency not set",
            )),
            Some(us) => {
                let path = roots.dev_root.join("cpu_dma_latency");
                match std::fs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .and_then(|mut f| {
                        f.write_all(&(us as i32).to_ne_bytes())?;
                        Ok(f)
                    }) {
                    Ok(f) => {
                        dma = Some(f);
                        startup.push(step(
                            "cpu_dma_latency",
                            "ok",
                            format!("{}: {us}us held", path.display()),
                        ));
                    }
                    Err(e) => startup.push(step(
                        "cpu_dma_latency",
                        "failed",
                        format!("{}: {e}", path.display()),
                    )),
                }
            }
        }

        // 3. Channels (mode 0660, the robot's group).
        let accounts = Accounts::load(&roots.prefix)?;
        let group_gid = match &cfg.robot.group {
            None => None,
            Some(g) => match accounts.gid(g) {
                Ok(gid) => Some(gid),
                Err(e) => {
                    startup.push(step("robot.group", "failed", e.to_string()));
                    None
                }
            },
        };
        let shm_dir = roots.prefix.join("dev/shm/rtdeploy");
        startup.push(create_channels(&cfg, &shm_dir, group_gid, &roots.proc_root));

        // 4. The boot timing check.
        let outcome = if !cfg.boot_check.enabled {
            BootCheckOutcome::Skipped("disabled in robot.yaml".into())
        } else {
            match hooks.boot_check {
                Some(h) => h(cfg.boot_check.duration.0),
                None => BootCheckOutcome::Skipped("engine not available".into()),
            }
        };
        let (boot_check, refuse, degrade) = match &outcome {
            BootCheckOutcome::Passed(d) => (format!("passed: {d}"), false, false),
            BootCheckOutcome::Skipped(d) => (format!("skipped: {d}"), false, false),
            BootCheckOutcome::Failed(d) => match cfg.boot_check.on_failure {
                OnFailure::Refuse => (
                    format!("failed: {d} (real-time processes refused)"),
                    true,
                    false,
                ),
                OnFailure::Degrade => (
                    format!("failed: {d} (real-time processes started degraded)"),
                    false,
                    true,
                ),
            },
        };

        // 5. Accounts, spawn context, the control socket.
        let own_uid = rustix::process::geteuid().as_raw();
        let own_ids = (own_uid, rustix::process::getegid().as_raw());
        let mut base_env = BTreeMap::new();
        base_env.insert(
            "PATH".to_string(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
        );
        base_env.insert(
            "RTDEPLOY_SHM_DIR".to_string(),
            roots
                .prefix
                .join("dev/shm/rtdeploy")
                .to_string_lossy()
                .into_owned(),
        );
        let ctx = SpawnContext {
            prefix: roots.prefix.clone(),
            accounts,
            own_ids,
            rt_cgroup: find_cgroup(&roots.sys_root, "rt"),
            housekeeping_cgroup: find_cgroup(&roots.sys_root, "housekeeping"),
            base_env,
        };
        startup.push(match (&ctx.rt_cgroup, &ctx.housekeeping_cgroup) {
            (None, None) => step("cgroups", "skipped", "no rtdeploy/rt or rtdeploy/housekeeping cgroup found; processes stay in the supervisor's cgroup"),
            (rt, hk) => step(
                "cgroups",
                "ok",
                format!(
                    "rt: {}, housekeeping: {}",
                    rt.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "none".into()),
                    hk.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "none".into())
                ),
            ),
        });

        let socket_path = control::socket_path(&roots.prefix);
        let listener = open_socket(&socket_path, group_gid)?;

        let cfg_channel_budgets: BTreeMap<String, Duration> = cfg
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
                log_path: logfile::log_path(&roots.prefix, &p.name),
                cfg: p.clone(),
                cpus,
                state: PState::Waiting,
                reason: None,
                child: None,
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
            })
            .collect();

        let mut sup = Supervisor {
            cfg,
            roots,
            opts,
            ctx,
            procs,
            conns: Vec::new(),
            next_conn_id: 0,
            listener: Some(listener),
            socket_path,
            sigfd,
            next_watchdog: notifier
                .as_ref()
                .and_then(|n| n.watchdog)
                .map(|w| Instant::now() + w),
            notifier,
            _dma_latency: dma,
            started: Instant::now(),
            startup,
            boot_check,
            boot_failed_refuse: refuse,
            boot_failed_degrade: degrade,
            shutting_down: false,
            pending: Vec::new(),
            group_gid,
            own_uid,
            channel_budgets: cfg_channel_budgets,
            shm_dir,
            next_timing_poll: Instant::now(),
            running_release,
            trial: None,
            abandoned: None,
            release: release_status,
            next_release_check: Instant::now(),
        };
        for s in sup.startup.clone() {
            if s.result != "ok" {
                sup.say(format!("{}: {} ({})", s.step, s.result, s.detail));
            }
        }
        sup.say(format!("boot check {}", sup.boot_check));
        sup.say(format!("release: {}", sup.release.describe()));
        sup.detect_cycles();
        // An install that ran between the recovery and now is a trial
        // that legitimately began: the processes start from it.
        sup.check_release(Instant::now());
        Ok(sup)
    }

    fn say(&self, msg: impl std::fmt::Display) {
        if self.opts.verbose {
            eprintln!("rtdeploy supervise: {msg}");
        }
    }

    fn detect_cycles(&mut self) {
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

    fn index(&self, name: &str) -> Option<usize> {
        self.procs.iter().position(|p| p.cfg.name == name)
    }

    /// Runs until every process is down after a shutdown request (SIGTERM,
    /// SIGINT or `stop-all`).
    pub fn run(mut self) -> Result<(), SupervisorStartError> {
        let mut ready_sent = false;
        loop {
            let now = Instant::now();
            self.tick(now);
            if !ready_sent
                && !self
                    .procs
                    .iter()
                    .any(|p| p.state == PState::Waiting && self.deps_failed(p).is_none())
            {
                ready_sent = true;
                self.notify("READY=1");
                self.say("start-up done");
            }
            if self.shutting_down && self.procs.iter().all(|p| p.child.is_none()) {
                break;
            }
            self.wait_and_dispatch()?;
        }
        self.finish();
        Ok(())
    }

    fn notify(&self, state: &str) {
        if let Some(n) = &self.notifier {
            if let Err(e) = n.send(state) {
                self.say(e);
            }
        }
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

    /// Reads the latest timing report of every running process.
    fn poll_reports(&mut self) {
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
                    let msg = format!("timing report unreadable: {e}");
                    if self.procs[i].timing_error.as_deref() != Some(msg.as_str()) {
                        self.note(i, &msg);
                        self.say(format!("{name}: {msg}"));
                        self.procs[i].timing_error = Some(msg);
                    }
                    continue;
                }
            };
            self.procs[i].timing_error = None;
            let p = &mut self.procs[i];
            let was_ready = p.health.ready();
            if let Some(why) = p
                .health
                .on_report(&report, pid, now, &p.cfg, &self.channel_budgets)
            {
                let n = p.health.over_budget;
                if n <= 10 || n % 100 == 0 {
                    self.note(
                        i,
                        &format!("timing report {} over budget (#{n}): {why}", report.seq),
                    );
                    self.say(format!("{name}: timing report over budget (#{n}): {why}"));
                }
            }
            if !was_ready && self.procs[i].health.ready() {
                self.note(i, "first timing report: ready");
            }
        }
    }

    /// Timers: start what can start, restart after backoff, escalate stops.
    fn tick(&mut self, now: Instant) {
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
        for i in 0..self.procs.len() {
            match self.procs[i].state {
                PState::Waiting if !self.shutting_down => {
                    if let Some(why) = self.deps_failed(&self.procs[i]) {
                        self.procs[i].reason = Some(format!("waiting: {why}"));
                    } else if self.deps_running(&self.procs[i]) {
                        self.start(i);
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
                    self.start(i);
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
                            );
                            self.say(format!("{name}: stop timeout {timeout}: SIGKILL"));
                        }
                    }
                }
                _ => {}
            }
        }
        if now >= self.next_timing_poll {
            self.next_timing_poll = now + TIMING_POLL;
            self.poll_reports();
        }
        if !self.shutting_down && now >= self.next_release_check {
            self.next_release_check = now + RELEASE_POLL;
            self.check_release(now);
        }
        if !self.shutting_down {
            self.judge_trial(now);
        }
        if self.shutting_down {
            self.shutdown_step();
        }
        self.check_pending();
    }

    /// Looks at `state.json` and `current`: a new trial restarts every
    /// process from it; a trial that ended elsewhere (`deploy rollback`)
    /// and a `current` moved by hand restart them from the new `current`.
    fn check_release(&mut self, now: Instant) {
        let prefix = self.roots.prefix.clone();
        let layout = release::Layout::new(&prefix);
        let current = release::link_target(&layout.current());
        let state = match release::read_state(&prefix) {
            Ok(s) => s,
            Err(e) => {
                let msg = e.to_string();
                if self.release.detail.as_deref() != Some(msg.as_str()) {
                    self.say(format!("release: {msg}"));
                }
                self.release = ReleaseStatus {
                    state: "error".into(),
                    current,
                    detail: Some(msg),
                    ..Default::default()
                };
                return;
            }
        };
        match state {
            Some(ReleaseState::Trial {
                release,
                since,
                previous,
                ..
            }) => {
                if self
                    .abandoned
                    .as_ref()
                    .is_some_and(|(r, s)| *r == release && *s == since)
                {
                    return;
                }
                if current.as_deref() != Some(release.as_str()) {
                    // The installer wrote the state and has not switched
                    // `current` yet (look again at the next poll), or it
                    // died before the switch: then nobody holds the
                    // update lock, and the half-begun trial is undone.
                    self.undo_unswitched_trial(&release, since);
                    return;
                }
                if self
                    .trial
                    .as_ref()
                    .is_some_and(|t| t.release == release && t.since == since)
                {
                    return;
                }
                self.say(format!(
                    "release {release} in trial (rollback to {previous}): restarting every process from it"
                ));
                self.restart_all(&format!("release {release} in trial"));
                self.running_release = Some(release.clone());
                let config_note = config_changed(&layout, &previous, &release);
                if let Some(n) = &config_note {
                    self.say(format!("release {release}: {n}"));
                }
                self.trial = Some(Trial {
                    release,
                    since,
                    previous,
                    began: now,
                    phase: TrialPhase::Restarting,
                    config_note,
                });
                self.update_release_status(now);
            }
            other => {
                if let Some(t) = self.trial.take() {
                    self.say(format!(
                        "release {}: trial ended outside the supervisor",
                        t.release
                    ));
                    self.release = ReleaseStatus {
                        state: "committed".into(),
                        current: current.clone(),
                        detail: Some(format!("trial of {} ended by another command", t.release)),
                        ..Default::default()
                    };
                }
                if current != self.running_release {
                    self.say(format!(
                        "release: current is now {}: restarting every process from it",
                        current.as_deref().unwrap_or("(none)")
                    ));
                    self.restart_all("current release changed");
                    self.running_release = current.clone();
                    self.release = ReleaseStatus {
                        state: if other.is_some() { "committed" } else { "none" }.into(),
                        current,
                        ..Default::default()
                    };
                }
            }
        }
    }

    /// A trial in `state.json` whose release `current` does not name, with
    /// the update lock free: the installer died between writing the state
    /// and switching. [`release::rollback`] puts `state.json` and
    /// `previous` back; `current` never moved, so nothing restarts (unless
    /// it moved after all, which [`Self::check_release`] sees next time).
    fn undo_unswitched_trial(&mut self, release: &str, since: u64) {
        let prefix = self.roots.prefix.clone();
        let lock = match release::UpdateLock::try_acquire(&prefix, "supervisor") {
            Ok(Some(l)) => l,
            // An install or a lock holder is at work: look again later.
            Ok(None) => return,
            Err(e) => {
                self.say(format!("release: {e}"));
                return;
            }
        };
        // Under the lock: still the same half-begun trial?
        let layout = release::Layout::new(&prefix);
        let still = matches!(
            release::read_state(&prefix),
            Ok(Some(ReleaseState::Trial { release: r, .. })) if r == release
        ) && release::link_target(&layout.current()).as_deref() != Some(release);
        if !still {
            return;
        }
        let reason = format!("the install of {release} stopped before it switched current");
        match release::rollback(&prefix) {
            Ok(rb) => {
                self.say(format!("release: {reason}: trial undone, {} stays", rb.to));
                self.release = ReleaseStatus {
                    state: "rolled-back".into(),
                    current: Some(rb.to),
                    other: Some(rb.from),
                    detail: Some(reason),
                    ..Default::default()
                };
            }
            Err(e) => {
                self.say(format!("release: {reason}; undoing it failed: {e}"));
                self.abandoned = Some((release.to_string(), since));
                self.release = ReleaseStatus {
                    state: "error".into(),
                    current: release::link_target(&layout.current()),
                    detail: Some(format!("{reason}; undoing it failed: {e}")),
                    ..Default::default()
                };
            }
        }
        drop(lock);
    }

    /// Restarts every process that is not stopped by request or refused
    /// by the boot check (those stay as they are).
    fn restart_all(&mut self, why: &str) {
        for i in 0..self.procs.len() {
            if matches!(self.procs[i].state, PState::Stopped | PState::Refused) {
                continue;
            }
            self.note(i, &format!("{why}: restarting"));
            self.begin_stop(i, AfterStop::Restart);
        }
    }

    /// The processes a trial judges: all but those stopped (or being
    /// stopped) by request, refused by the boot check, or done (exited 0
    /// under a policy that does not restart them).
    fn judged(&self, p: &Proc) -> bool {
        !(matches!(p.state, PState::Stopped | PState::Refused)
            || (p.state == PState::Stopping && p.after_stop == AfterStop::Stay)
            || (p.state == PState::Exited && p.last_exit.as_deref() == Some("exit 0")))
    }

    /// Advances the trial: waits for the restarts, then asks
    /// [`TrialHealth`] once a second and commits or rolls back.
    fn judge_trial(&mut self, now: Instant) {
        let Some(mut t) = self.trial.take() else {
            return;
        };
        let window = self.opts.health_window;
        let verdict = match &mut t.phase {
            TrialPhase::Restarting => {
                let judged: Vec<&Proc> = self.procs.iter().filter(|p| self.judged(p)).collect();
                if let Some(p) = judged
                    .iter()
                    .find(|p| matches!(p.state, PState::Failed | PState::Backoff | PState::Exited))
                {
                    HealthVerdict::Rollback(format!(
                        "process {} is {} while restarting from the new release: {}",
                        p.cfg.name,
                        p.state.name(),
                        p.reason
                            .clone()
                            .or_else(|| p.last_exit.clone())
                            .unwrap_or_default()
                    ))
                } else if judged.iter().all(|p| p.state == PState::Running) {
                    t.phase = TrialPhase::Watching {
                        health: TrialHealth::new(window),
                        began: now,
                        next: now,
                    };
                    HealthVerdict::Wait
                } else if now.duration_since(t.began) >= window {
                    let p = judged
                        .iter()
                        .find(|p| p.state != PState::Running)
                        .expect("not all running");
                    HealthVerdict::Rollback(format!(
                        "process {} not started {:?} into the trial: {}",
                        p.cfg.name,
                        window,
                        p.reason.clone().unwrap_or_else(|| p.state.name().into())
                    ))
                } else {
                    HealthVerdict::Wait
                }
            }
            TrialPhase::Watching { .. } => HealthVerdict::Wait,
        };
        // Health is judged once a second, and at once when a process is
        // down (a crash rolls back without waiting for the next look).
        let down = self
            .procs
            .iter()
            .any(|p| self.judged(p) && !(p.state == PState::Running && p.child.is_some()));
        let verdict = match (&mut t.phase, verdict) {
            (
                TrialPhase::Watching {
                    health,
                    began,
                    next,
                },
                HealthVerdict::Wait,
            ) if now >= *next || down => {
                *next = now + RELEASE_POLL;
                let sup_now = self.started.elapsed();
                let procs: Vec<ProcessHealth> = self
                    .procs
                    .iter()
                    .filter(|p| self.judged(p))
                    .map(|p| ProcessHealth {
                        name: p.cfg.name.clone(),
                        running: p.state == PState::Running && p.child.is_some(),
                        ready: p.health.ready() && !p.health.unhealthy(sup_now),
                        over_budget: p.health.over_budget,
                        restarts: p.restarts,
                    })
                    .collect();
                health.observe(now.duration_since(*began), &procs)
            }
            (_, v) => v,
        };
        match verdict {
            HealthVerdict::Wait => {
                self.trial = Some(t);
                self.update_release_status(now);
            }
            HealthVerdict::Commit => match release::commit(&self.roots.prefix, self.opts.keep) {
                Ok(r) => {
                    self.say(format!("release {r}: healthy for {window:?}: committed"));
                    self.release = ReleaseStatus {
                        state: "committed".into(),
                        current: Some(r),
                        detail: Some(match &t.config_note {
                            Some(n) => format!("healthy for {window:?}; {n}"),
                            None => format!("healthy for {window:?}"),
                        }),
                        ..Default::default()
                    };
                }
                Err(e) => self.release_failed(&t, format!("commit failed: {e}")),
            },
            HealthVerdict::Rollback(reason) => {
                self.say(format!(
                    "release {}: {reason}: rolling back to {}",
                    t.release, t.previous
                ));
                match release::rollback(&self.roots.prefix) {
                    Ok(rb) => {
                        self.restart_all(&format!("rolled back to {}", rb.to));
                        self.running_release = Some(rb.to.clone());
                        self.release = ReleaseStatus {
                            state: "rolled-back".into(),
                            current: Some(rb.to),
                            other: Some(rb.from),
                            detail: Some(reason),
                            ..Default::default()
                        };
                    }
                    Err(e) => self.release_failed(&t, format!("{reason}; rollback failed: {e}")),
                }
            }
        }
    }

    /// A commit or rollback that failed: said, shown, and the trial is no
    /// longer judged (the next start's recovery rolls it back).
    fn release_failed(&mut self, t: &Trial, msg: String) {
        self.say(format!("release {}: {msg}", t.release));
        self.abandoned = Some((t.release.clone(), t.since));
        self.release = ReleaseStatus {
            state: "error".into(),
            current: Some(t.release.clone()),
            other: Some(t.previous.clone()),
            since: Some(t.since),
            detail: Some(msg),
            ..Default::default()
        };
    }

    fn update_release_status(&mut self, now: Instant) {
        let Some(t) = &self.trial else { return };
        let (phase, left) = match &t.phase {
            TrialPhase::Restarting => ("restarting", None),
            TrialPhase::Watching { health, began, .. } => (
                "watching",
                health
                    .window_left(now.duration_since(*began))
                    .map(|d| d.as_secs_f64()),
            ),
        };
        self.release = ReleaseStatus {
            state: "trial".into(),
            current: Some(t.release.clone()),
            other: Some(t.previous.clone()),
            since: Some(t.since),
            for_s: Some(now.duration_since(t.began).as_secs_f64()),
            phase: Some(phase.into()),
            window_left_s: left,
            detail: t.config_note.clone(),
        };
    }

    /// Starts process `i` now.
    fn start(&mut self, i: usize) {
        let realtime = self.procs[i].cfg.policy.is_realtime();
        if realtime && self.boot_failed_refuse {
            let p = &mut self.procs[i];
            p.state = PState::Refused;
            p.reason = Some(format!("boot check {}", self.boot_check));
            return;
        }
        if self.procs[i].log.is_none() {
            match RotatingLog::open(
                self.procs[i].log_path.clone(),
                self.opts.log_max_bytes,
                self.opts.log_keep,
            ) {
                Ok(l) => self.procs[i].log = Some(l),
                Err(e) => self.say(format!("{}: {e}", self.procs[i].cfg.name)),
            }
        }
        let result = spawn::prepare(&self.procs[i].cfg, &self.procs[i].cpus, &self.ctx)
            .and_then(|prep| spawn::spawn(&prep));
        let degraded = realtime && self.boot_failed_degrade;
        match result {
            Ok(child) => {
                let pid = child.pid;
                let since = self.started.elapsed();
                self.procs[i].health.restarted(since);
                let warnings = child.warnings.clone();
                let p = &mut self.procs[i];
                p.child = Some(child);
                p.state = PState::Running;
                p.reason = None;
                p.degraded = degraded;
                p.backoff_until = None;
                p.stop_deadline = None;
                p.killed = false;
                p.after_stop = AfterStop::Stay;
                let name = p.cfg.name.clone();
                self.note(i, &format!("started, pid {pid}"));
                self.say(format!("{name}: started, pid {pid}"));
                for w in warnings {
                    self.note(i, &format!("warning: {w}"));
                    self.say(format!("{name}: warning: {w}"));
                }
            }
            Err(e) => {
                let msg = e.to_string();
                let p = &mut self.procs[i];
                p.state = PState::Failed;
                p.reason = Some(msg.clone());
                self.note(i, &msg);
                self.say(msg);
            }
        }
    }

    /// A line from the supervisor in a process's log.
    fn note(&mut self, i: usize, line: &str) {
        if let Some(l) = &mut self.procs[i].log {
            let _ = l.note(line);
        }
        let data = format!("[rtdeploy] {line}\n");
        self.forward(i, &data);
    }

    fn forward(&mut self, i: usize, data: &str) {
        for c in self
            .conns
            .iter_mut()
            .filter(|c| c.follow == Some(i) && !c.dead)
        {
            let reply = Reply {
                ok: true,
                data: Some(data.to_string()),
                ..Default::default()
            };
            queue(c, &reply);
        }
    }

    /// Sends SIGTERM to a running process and arms its stop timeout.
    fn begin_stop(&mut self, i: usize, after: AfterStop) {
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
                self.note(i, "stopping: sent SIGTERM");
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

    fn begin_shutdown(&mut self, why: &str) {
        if !self.shutting_down {
            self.say(format!("shutting down: {why}"));
            self.notify("STOPPING=1");
            self.shutting_down = true;
        }
    }

    /// Stops processes whose dependents are all down (reverse order).
    fn shutdown_step(&mut self) {
        for i in 0..self.procs.len() {
            let name = self.procs[i].cfg.name.clone();
            let dependents_up = self
                .procs
                .iter()
                .any(|q| q.child.is_some() && q.cfg.after.contains(&name));
            match self.procs[i].state {
                PState::Running if !dependents_up => self.begin_stop(i, AfterStop::Stay),
                PState::Waiting | PState::Backoff => {
                    self.procs[i].state = PState::Stopped;
                    self.procs[i].reason = Some("supervisor shutting down".into());
                }
                _ => {}
            }
        }
    }

    /// The process `i` exited with `exit`.
    fn on_exit(&mut self, i: usize, exit: ExitKind) {
        let Some(child) = self.procs[i].child.take() else {
            return;
        };
        // Keep what it wrote last.
        self.drain_output(i, &child.output);
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
        );
        let name = self.procs[i].cfg.name.clone();
        self.say(format!("{name}: pid {} {desc}", child.pid));
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
                self.note(i, &msg);
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
                self.note(i, &why);
                self.say(format!("{name}: {why}"));
            }
        }
    }

    fn drain_output(&mut self, i: usize, fd: &OwnedFd) -> bool {
        let mut buf = [0u8; 16384];
        loop {
            match rustix::io::read(fd, &mut buf) {
                Ok(0) => return false,
                Ok(n) => {
                    if let Some(l) = &mut self.procs[i].log {
                        if let Err(e) = l.write(&buf[..n]) {
                            self.say(e);
                        }
                    }
                    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                    self.forward(i, &text);
                }
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => return true,
            }
        }
    }

    /// Reaps: each managed child through its pidfd, then (as reaper) every
    /// other exited process.
    fn reap(&mut self) {
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
                    self.on_exit(i, exit);
                }
                Ok(None) => {}
                // Already reaped by the orphan loop below (ECHILD): handled there.
                Err(_) => {}
            }
        }
        if self.opts.handle_signals {
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
                    self.on_exit(i, exit);
                }
            }
        }
    }

    fn wait_and_dispatch(&mut self) -> Result<(), SupervisorStartError> {
        use crate::sys::{poll, Poll};
        #[derive(Clone, Copy)]
        enum Tag {
            Signal,
            Listener,
            Exit,
            Output(usize),
            Conn(usize),
        }
        // Requests that waited behind a reply given since (check_pending).
        for k in 0..self.conns.len() {
            if self.conns[k].ready() && self.conns[k].input.has_line() {
                self.serve(k);
            }
        }
        let mut fds = Vec::new();
        let mut tags = Vec::new();
        if let Some(s) = &self.sigfd {
            fds.push(Poll::read(s.as_raw_fd()));
            tags.push(Tag::Signal);
        }
        if let Some(l) = &self.listener {
            fds.push(Poll::read(l.as_raw_fd()));
            tags.push(Tag::Listener);
        }
        for (i, p) in self.procs.iter().enumerate() {
            if let Some(c) = &p.child {
                fds.push(Poll::read(c.pidfd.as_raw_fd()));
                tags.push(Tag::Exit);
                fds.push(Poll::read(c.output.as_raw_fd()));
                tags.push(Tag::Output(i));
            }
        }
        for (i, c) in self.conns.iter().enumerate().filter(|(_, c)| !c.dead) {
            let mut e = Poll::read(c.stream.as_raw_fd());
            e.want_write = !c.outbuf.is_empty();
            fds.push(e);
            tags.push(Tag::Conn(i));
        }
        poll(&mut fds, self.next_deadline()).map_err(SupervisorStartError::Poll)?;
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
                Tag::Exit if e.readable => reap = true,
                Tag::Output(i) if e.readable => {
                    if let Some(c) = self.procs[i].child.take() {
                        let open = self.drain_output(i, &c.output);
                        if !open {
                            drop_output.push(i);
                        }
                        self.procs[i].child = Some(c);
                    }
                }
                Tag::Conn(i) => {
                    if e.writable {
                        flush(&mut self.conns[i]);
                    }
                    if e.readable {
                        self.read_conn(i);
                    } else if self.conns[i].ready() && self.conns[i].input.has_line() {
                        self.serve(i);
                    }
                }
                _ => {}
            }
        }
        // A pipe at EOF while the process lives (it closed stdout): stop
        // polling it by swapping in /dev/null's read end would be wrong, so
        // replace it with a fresh pipe whose write end is closed at once.
        for i in drop_output {
            if let Some(c) = &mut self.procs[i].child {
                if let Ok((r, _w)) = rustix::pipe::pipe_with(
                    rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK,
                ) {
                    c.output = r;
                }
            }
        }
        if reap || self.opts.pid1 {
            self.reap();
        }
        // After the open connections were read: a new client that makes
        // room closes an idle one, never one whose request just arrived.
        if accept {
            self.accept();
        }
        self.expire_conns(Instant::now());
        self.conns.retain(|c| !c.dead);
        Ok(())
    }

    fn next_deadline(&self) -> Option<Duration> {
        let now = Instant::now();
        let mut next: Option<Instant> = self.next_watchdog;
        let mut consider = |t: Option<Instant>| {
            if let Some(t) = t {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        };
        for p in &self.procs {
            match p.state {
                PState::Backoff => consider(p.backoff_until),
                PState::Stopping if !p.killed => consider(p.stop_deadline),
                _ => {}
            }
        }
        if self
            .procs
            .iter()
            .any(|p| p.child.is_some() && p.health.expected)
        {
            consider(Some(self.next_timing_poll));
        }
        consider(self.conns.iter().filter_map(|c| c.deadline).min());
        if !self.shutting_down {
            consider(Some(self.next_release_check));
            if let Some(Trial {
                phase: TrialPhase::Watching { next, .. },
                ..
            }) = &self.trial
            {
                consider(Some(*next));
            }
        }
        let mut timeout = next.map(|t| t.saturating_duration_since(now));
        // Processes that wait for one that fails later, and pending replies,
        // are re-checked at least once a second.
        if !self.pending.is_empty() || self.shutting_down {
            timeout = Some(timeout.map_or(Duration::from_millis(100), |t| {
                t.min(Duration::from_millis(100))
            }));
        }
        Some(timeout.map_or(Duration::from_secs(1), |t| t.min(Duration::from_secs(1))))
    }

    /// Takes up to `ACCEPT_BATCH` new connections. A peer that may not
    /// connect, or that finds every connection waiting for a reply, is
    /// answered at once and dropped without taking a place.
    fn accept(&mut self) {
        let now = Instant::now();
        for _ in 0..ACCEPT_BATCH {
            let Some(l) = &self.listener else { return };
            let Ok((stream, _)) = l.accept() else { return };
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            let mut conn = Conn::new(self.next_conn_id, stream, now);
            self.next_conn_id += 1;
            if let Err(why) = self.peer_allowed(&conn.stream) {
                conn.close_with(&Reply::error(why), now);
                continue;
            }
            let open = self.conns.iter().filter(|c| !c.dead).count();
            if open >= control::MAX_CONNECTIONS && !self.make_room(now) {
                conn.close_with(
                    &Reply::busy(format!(
                        "busy: all {} control connections are waiting for replies or following logs; try again",
                        control::MAX_CONNECTIONS
                    )),
                    now,
                );
                continue;
            }
            self.conns.push(conn);
        }
    }

    /// Closes the connection idle longest (see [`control::make_room`]);
    /// false when every one waits for a reply or follows logs.
    fn make_room(&mut self, now: Instant) -> bool {
        let open: Vec<usize> = (0..self.conns.len())
            .filter(|&k| !self.conns[k].dead)
            .collect();
        let slots = open.iter().map(|&k| {
            let c = &self.conns[k];
            control::Slot {
                busy: c.awaiting || c.follow.is_some(),
                closing: c.closing,
                since: c.since,
            }
        });
        let Some(victim) = control::make_room(slots) else {
            return false;
        };
        let c = &mut self.conns[open[victim]];
        if !c.closing && c.outbuf.is_empty() {
            let idle = now.saturating_duration_since(c.since);
            c.close_with(
                &Reply::busy(format!(
                    "busy: {} control connections are open; closed to make room after {:.1}s without a request",
                    control::MAX_CONNECTIONS,
                    idle.as_secs_f64()
                )),
                now,
            );
        }
        c.dead = true;
        true
    }

    /// Drops connections past their deadline; one that is idle is told why.
    fn expire_conns(&mut self, now: Instant) {
        for c in &mut self.conns {
            if c.dead || c.deadline.is_none_or(|d| now < d) {
                continue;
            }
            if c.ready() {
                c.close_with(
                    &Reply::error(format!(
                        "no complete request within {}s; connection closed",
                        control::IDLE_TIMEOUT.as_secs()
                    )),
                    now,
                );
            }
            c.dead = true;
        }
    }

    /// Root, the supervisor's own user, or a member of `robot.group`.
    fn peer_allowed(&self, s: &UnixStream) -> Result<(), String> {
        let (pid, uid, gid) = crate::sys::peer_cred(s.as_raw_fd())
            .map_err(|e| format!("permission denied: cannot read peer credentials: {e}"))?;
        if uid == 0 || uid == self.own_uid {
            return Ok(());
        }
        if let Some(group) = self.group_gid {
            if gid == group {
                return Ok(());
            }
            // Supplementary groups, when the peer is visible in our /proc.
            if pid > 0 {
                if let Ok(st) = procfs::read_status(&self.roots.proc_root, pid) {
                    if st.groups.contains(&group) {
                        return Ok(());
                    }
                }
            }
        }
        Err(format!(
            "permission denied: uid {uid} is not root, not the supervisor's user ({}) and not in group {}",
            self.own_uid,
            match (&self.cfg.robot.group, self.group_gid) {
                (Some(g), Some(gid)) => format!("`{g}` ({gid})"),
                _ => "(robot.group not set)".into(),
            }
        ))
    }

    /// Reads what connection `k` sent, at most `READ_BUDGET` bytes, into
    /// its bounded request buffer, and answers what is complete.
    fn read_conn(&mut self, k: usize) {
        let mut scratch = [0u8; 16 * 1024];
        let mut budget = READ_BUDGET;
        while budget > 0 {
            let c = &mut self.conns[k];
            if c.dead {
                return;
            }
            let ignored = c.closing || c.follow.is_some();
            let room = if ignored {
                scratch.len()
            } else {
                c.input.room()
            };
            if room == 0 {
                // Full of requests sent ahead of replies still owed.
                let r = Reply::error(format!(
                    "more than {} KiB of requests sent ahead of their replies; connection closed",
                    control::MAX_REQUEST_LINE / 1024
                ));
                c.close_with(&r, Instant::now());
                return;
            }
            let want = room.min(scratch.len()).min(budget);
            match c.stream.read(&mut scratch[..want]) {
                Ok(0) => {
                    c.dead = true;
                    return;
                }
                Ok(n) => {
                    budget -= n;
                    if !ignored {
                        c.input.push(&scratch[..n]);
                        self.serve(k);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    c.dead = true;
                    return;
                }
            }
        }
    }

    /// Answers the complete requests of connection `k`, one at a time: the
    /// next waits until the reply to the previous one is out.
    fn serve(&mut self, k: usize) {
        while self.conns[k].ready() {
            let now = Instant::now();
            let line = match self.conns[k].input.next_line() {
                NextLine::Incomplete => break,
                NextLine::TooLong => {
                    let r = Reply::error(format!(
                        "request line longer than {} KiB",
                        control::MAX_REQUEST_LINE / 1024
                    ));
                    self.conns[k].answered(&r, now);
                    flush(&mut self.conns[k]);
                    continue;
                }
                NextLine::Line(line) => line,
            };
            let text = String::from_utf8_lossy(&line).trim().to_string();
            if text.is_empty() {
                continue;
            }
            let reply = match serde_json::from_str::<Request>(&text) {
                Ok(req) => self.handle(k, req),
                Err(e) => Some(Reply::error(format!(
                    "bad request `{}`: {e}",
                    truncate(&text, 200)
                ))),
            };
            let c = &mut self.conns[k];
            match reply {
                Some(r) => c.answered(&r, now),
                None => {
                    c.awaiting = true;
                    c.deadline = None;
                }
            }
            if c.follow.is_some() {
                c.input.discard();
                c.deadline = None;
            }
            flush(c);
        }
    }

    /// Handles one request; `None` when the reply comes later.
    fn handle(&mut self, conn: usize, req: Request) -> Option<Reply> {
        let find = |s: &Self, name: &str| {
            s.index(name).ok_or_else(|| {
                format!(
                    "no process `{name}` (known: {})",
                    s.procs
                        .iter()
                        .map(|p| p.cfg.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })
        };
        match req {
            Request::Status => Some(Reply {
                ok: true,
                status: Some(self.status()),
                ..Default::default()
            }),
            Request::Start { name } => {
                let i = match find(self, &name) {
                    Ok(i) => i,
                    Err(e) => return Some(Reply::error(e)),
                };
                if self.shutting_down {
                    return Some(Reply::error("the supervisor is shutting down"));
                }
                match self.procs[i].state {
                    PState::Running | PState::Stopping => Some(Reply::error(format!(
                        "`{name}` is already {}",
                        self.procs[i].state.name()
                    ))),
                    _ => {
                        let p = &mut self.procs[i];
                        p.tracker.reset();
                        p.state = PState::Waiting;
                        p.reason = None;
                        self.tick(Instant::now());
                        let p = &self.procs[i];
                        match p.state {
                            PState::Running => Some(Reply::message(format!(
                                "started `{name}`, pid {}",
                                p.child.as_ref().map(|c| c.pid).unwrap_or(0)
                            ))),
                            _ => Some(Reply::error(format!(
                                "`{name}` is {}: {}",
                                p.state.name(),
                                p.reason.clone().unwrap_or_default()
                            ))),
                        }
                    }
                }
            }
            Request::Stop { name } => {
                let i = match find(self, &name) {
                    Ok(i) => i,
                    Err(e) => return Some(Reply::error(e)),
                };
                self.begin_stop(i, AfterStop::Stay);
                self.pending.push(Pending::Stopped {
                    conn: self.conns[conn].id,
                    proc_idx: i,
                });
                None
            }
            Request::Restart { name } => {
                let i = match find(self, &name) {
                    Ok(i) => i,
                    Err(e) => return Some(Reply::error(e)),
                };
                if self.shutting_down {
                    return Some(Reply::error("the supervisor is shutting down"));
                }
                let old_pid = self.procs[i].child.as_ref().map(|c| c.pid);
                self.begin_stop(i, AfterStop::Restart);
                self.pending.push(Pending::Restarted {
                    conn: self.conns[conn].id,
                    proc_idx: i,
                    old_pid,
                });
                None
            }
            Request::StopAll => {
                self.begin_shutdown("stop-all requested on the control socket");
                self.pending.push(Pending::All {
                    conn: self.conns[conn].id,
                });
                None
            }
            Request::ReleaseChanged => {
                if self.shutting_down {
                    return Some(Reply::error("the supervisor is shutting down"));
                }
                let now = Instant::now();
                self.check_release(now);
                self.judge_trial(now);
                Some(Reply::message(format!(
                    "release: {}",
                    self.release.describe()
                )))
            }
            Request::Logs {
                name,
                lines,
                follow,
            } => {
                let i = match find(self, &name) {
                    Ok(i) => i,
                    Err(e) => return Some(Reply::error(e)),
                };
                let tail = match logfile::tail(&self.procs[i].log_path, lines) {
                    Ok(t) => t,
                    Err(e) => return Some(Reply::error(e.to_string())),
                };
                if follow {
                    let following = self.conns.iter().filter(|c| c.follow.is_some()).count();
                    if following >= control::MAX_FOLLOWERS {
                        return Some(Reply::busy(format!(
                            "busy: {following} clients already follow logs"
                        )));
                    }
                    self.conns[conn].follow = Some(i);
                }
                Some(Reply {
                    ok: true,
                    lines: Some(tail),
                    ..Default::default()
                })
            }
        }
    }

    fn check_pending(&mut self) {
        let mut done = Vec::new();
        for (k, p) in self.pending.iter().enumerate() {
            let (conn, reply) = match p {
                Pending::Stopped { conn, proc_idx } => {
                    let pr = &self.procs[*proc_idx];
                    if pr.child.is_some() {
                        continue;
                    }
                    (
                        *conn,
                        Reply::message(format!(
                            "`{}` {}",
                            pr.cfg.name,
                            pr.reason.clone().unwrap_or_else(|| pr.state.name().into())
                        )),
                    )
                }
                Pending::Restarted {
                    conn,
                    proc_idx,
                    old_pid,
                } => {
                    let pr = &self.procs[*proc_idx];
                    let new_pid = pr.child.as_ref().map(|c| c.pid);
                    match pr.state {
                        PState::Running if new_pid != *old_pid => (
                            *conn,
                            Reply::message(format!(
                                "restarted `{}`, pid {}",
                                pr.cfg.name,
                                new_pid.unwrap_or(0)
                            )),
                        ),
                        PState::Failed | PState::Refused | PState::Stopped => (
                            *conn,
                            Reply::error(format!(
                                "`{}` is {}: {}",
                                pr.cfg.name,
                                pr.state.name(),
                                pr.reason.clone().unwrap_or_default()
                            )),
                        ),
                        _ => continue,
                    }
                }
                Pending::All { conn } => {
                    if self.procs.iter().any(|p| p.child.is_some()) {
                        continue;
                    }
                    (
                        *conn,
                        Reply::message("all processes stopped; the supervisor exits"),
                    )
                }
            };
            if let Some(c) = self
                .conns
                .iter_mut()
                .find(|c| c.id == conn && c.awaiting && !c.dead)
            {
                c.answered(&reply, Instant::now());
                flush(c);
            }
            done.push(k);
        }
        for k in done.into_iter().rev() {
            self.pending.remove(k);
        }
    }

    /// The status document.
    pub fn status(&self) -> SupervisorStatus {
        let processes = self
            .procs
            .iter()
            .map(|p| {
                let pid = p.child.as_ref().map(|c| c.pid);
                let in_force = pid
                    .and_then(|pid| procfs::in_force(&self.roots.proc_root, pid).ok())
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
                    budget: if p.child.is_some() {
                        p.health.describe(self.started.elapsed())
                    } else {
                        "-".into()
                    },
                    over_budget_reports: p.health.over_budget,
                    degraded: p.degraded || p.health.over_budget > 0,
                }
            })
            .collect();
        SupervisorStatus {
            robot: self.cfg.robot.name.clone(),
            pid: std::process::id() as i32,
            pid1: self.opts.pid1,
            uptime_s: self.started.elapsed().as_secs_f64(),
            state: if self.shutting_down {
                "stopping"
            } else {
                "running"
            }
            .into(),
            boot_check: self.boot_check.clone(),
            startup: self.startup.clone(),
            release: Some(self.release.clone()),
            processes,
        }
    }

    /// After the last process: kill stragglers, remove the socket, and as
    /// PID 1 kill and reap everything left.
    fn finish(&mut self) {
        for c in &mut self.conns {
            flush(c);
        }
        let _ = std::fs::remove_file(&self.socket_path);
        if self.opts.pid1 {
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
        } else if self.opts.handle_signals {
            while let Ok(Some(_)) = rustix::process::wait(WaitOptions::NOHANG) {}
        }
        self.say("stopped");
        if self.opts.pid1 {
            if let Err(e) = crate::pid1::finish(self.opts.at_exit) {
                self.say(format!("reboot({:?}) failed: {e}", self.opts.at_exit));
            }
        }
    }
}

fn signal_group(pid: i32, sig: Signal) {
    if let Some(p) = Pid::from_raw(pid) {
        let _ = rustix::process::kill_process_group(p, sig);
        let _ = rustix::process::kill_process(p, sig);
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.len() <= n {
        return s.to_string();
    }
    let mut end = n;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

fn queue(c: &mut Conn, r: &Reply) {
    if c.outbuf.len() > control::FOLLOW_BACKLOG {
        // A follower that does not read: drop it rather than grow forever.
        c.dead = true;
        return;
    }
    let mut line = serde_json::to_vec(r)
        .unwrap_or_else(|_| b"{\"ok\":false,\"error\":\"unserializable reply\"}".to_vec());
    line.push(b'\n');
    c.outbuf.extend_from_slice(&line);
}

fn flush(c: &mut Conn) {
    while !c.outbuf.is_empty() {
        match c.stream.write(&c.outbuf) {
            Ok(0) => {
                c.dead = true;
                return;
            }
            Ok(n) => {
                c.outbuf.drain(..n);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => {
                c.dead = true;
                return;
            }
        }
    }
    if c.closing {
        // The last reply is out: drop the connection. The client reads the
        // reply before the hang-up, even when it was still writing (its
        // write fails, see `Client::raw`).
        c.dead = true;
    }
}

/// Creates every channel of `robot.yaml` under `shm_dir` (an existing
/// compatible file is reused, its dead owners' entries reclaimed).
fn create_channels(
    cfg: &SupervisorConfig,
    shm_dir: &Path,
    gid: Option<u32>,
    proc_root: &Path,
) -> StepStatus {
    use controller::channel::{Channel, CreateOutcome};
    if cfg.channels.is_empty() {
        return step("channels", "ok", "no channels configured");
    }
    let (mut created, mut reused, mut replaced) = (0, 0, Vec::new());
    let mut errors = Vec::new();
    for c in &cfg.channels {
        let publishers = cfg
            .processes
            .iter()
            .filter(|p| p.publishes.contains(&c.name))
            .count()
            .max(1) as u32;
        match Channel::create_from_config(shm_dir, c, publishers, gid, proc_root) {
            Ok((_, CreateOutcome::Created)) => created += 1,
            Ok((_, CreateOutcome::Reused { .. })) => reused += 1,
            Ok((_, CreateOutcome::Replaced { reason })) => {
                replaced.push(format!("{} ({reason})", c.name))
            }
            Err(e) => errors.push(e.to_string()),
        }
    }
    let mut detail = format!("{}: {created} created, {reused} reused", shm_dir.display());
    if !replaced.is_empty() {
        detail.push_str(&format!(", replaced: {}", replaced.join(", ")));
    }
    if errors.is_empty() {
        step("channels", "ok", detail)
    } else {
        step(
            "channels",
            "failed",
            format!("{detail}; {}", errors.join("; ")),
        )
    }
}

/// A note when release `new`'s robot.yaml differs from `old`'s: the
/// processes are restarted from the new binaries, but with the process
/// configuration the supervisor loaded at its start.
fn config_changed(layout: &release::Layout, old: &str, new: &str) -> Option<String> {
    let read = |r: &str| std::fs::read(layout.release(r).join("robot.yaml")).ok();
    (read(old) != read(new)).then(|| {
        "its robot.yaml differs from the previous release's: the processes run the new binaries with the configuration loaded at the supervisor's start until the supervisor restarts".to_string()
    })
}

/// [`release::recover_at_start`] as a start-up step, and the release
/// status it leaves.
fn recover_release(prefix: &Path) -> (StepStatus, ReleaseStatus) {
    let layout = release::Layout::new(prefix);
    if !layout.opt().exists() && !layout.state().exists() {
        return (
            step(
                "release recovery",
                "skipped",
                format!("no release installed under {}", layout.opt().display()),
            ),
            ReleaseStatus {
                state: "none".into(),
                ..Default::default()
            },
        );
    }
    match release::recover_at_start(prefix) {
        Ok(r) => {
            let mut done = Vec::new();
            if let Some(rb) = &r.rolled_back {
                done.push(format!(
                    "trial of {} interrupted (reboot, crash or shutdown): rolled back to {}",
                    rb.from, rb.to
                ));
            }
            if r.repaired {
                done.push("current put back to the committed release".into());
            }
            if !r.cleaned.is_empty() {
                done.push(format!("removed {}", r.cleaned.join(", ")));
            }
            let detail = if done.is_empty() {
                format!(
                    "current {}: nothing to recover",
                    r.current.as_deref().unwrap_or("(none)")
                )
            } else {
                done.join("; ")
            };
            let status = match &r.rolled_back {
                Some(rb) => ReleaseStatus {
                    state: "rolled-back".into(),
                    current: r.current.clone(),
                    other: Some(rb.from.clone()),
                    detail: Some("trial interrupted by a reboot, a crash or a shutdown".into()),
                    ..Default::default()
                },
                None => ReleaseStatus {
                    state: if r.current.is_some() {
                        "committed"
                    } else {
                        "none"
                    }
                    .into(),
                    current: r.current.clone(),
                    ..Default::default()
                },
            };
            (step("release recovery", "ok", detail), status)
        }
        Err(e) => (
            step("release recovery", "failed", e.to_string()),
            ReleaseStatus {
                state: "error".into(),
                current: release::link_target(&layout.current()),
                detail: Some(format!("recovery at start failed: {e}")),
                ..Default::default()
            },
        ),
    }
}

/// Binds the control socket: removes a stale one, refuses when another
/// supervisor answers, then mode 0660 and the robot's group.
fn open_socket(path: &Path, gid: Option<u32>) -> Result<UnixListener, SupervisorStartError> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir).map_err(|source| SupervisorStartError::Create {
        path: dir.to_path_buf(),
        source,
    })?;
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(SupervisorStartError::AlreadyRunning {
                path: path.to_path_buf(),
            });
        }
        let _ = std::fs::remove_file(path);
    }
    let listen = |source| SupervisorStartError::Listen {
        path: path.to_path_buf(),
        source,
    };
    let l = UnixListener::bind(path).map_err(listen)?;
    l.set_nonblocking(true).map_err(listen)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660)).map_err(listen)?;
    if let Some(gid) = gid {
        std::os::unix::fs::chown(path, None, Some(gid)).map_err(listen)?;
    }
    Ok(l)
}
