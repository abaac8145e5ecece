//! Start-up, up to (not including) the first process starts: what the
//! supervisor is given ([`SupervisorConfig`], [`Roots`], [`Options`],
//! a [`Boot`]) and the steps it takes with it, in order. Each step that
//! fails without stopping the start is a [`StepStatus`] `deploy status`
//! shows; only the accounts and the control socket stop it.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use check::config::{BootCheckSection, OnFailure};
use controller::config::ChannelConfig;
use controller::rt::DmaLatencyHold;
use units::cpu::CpuSet;
use units::env::ProcessEnv;
use units::error::Chain;

use super::find_cgroup;
use crate::accounts::{AccountResolveError, Accounts};
use crate::config::{ProcessConfig, RobotSection};
use crate::control;
use crate::pid1::AtExit;
use crate::spawn::SpawnContext;
use crate::status::{ReleaseStatus, StepStatus};

/// Why the supervisor could not start (or, for [`Poll`](Self::Poll), go on).
#[derive(Debug, thiserror::Error)]
pub enum SupervisorStartError {
    #[error("cannot create {}: {err}", path.display())]
    Create { path: PathBuf, err: std::io::Error },
    #[error("another supervisor answers on {}", path.display())]
    AlreadyRunning { path: PathBuf },
    #[error("cannot listen on {}: {err}", path.display())]
    Listen { path: PathBuf, err: std::io::Error },
    #[error("cannot read accounts: {0}")]
    Accounts(AccountResolveError),
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
    /// `log:`: what the logger records (none: no logger).
    pub log: Option<logbook::LogSection>,
    /// The housekeeping CPUs: the logger's thread runs there (empty:
    /// where the supervisor runs).
    pub housekeeping: CpuSet,
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
    /// `irqs.rescan`: how often [`Boot::scan_irqs`] runs (none: never).
    pub irq_scan_every: Option<Duration>,
    /// Also run the IRQ scan soon after the kernel says a device was
    /// added or bound, or a network link came up ([`crate::hotplug`]).
    pub irq_scan_on_events: bool,
    /// Send events to the systemd journal when it is there
    /// ([`crate::journal`]).
    pub journal: bool,
    /// `metrics.textfile` (resolved) and `metrics.every`.
    pub metrics_textfile: Option<(PathBuf, Duration)>,
    /// The release recovery, when the caller ran it before loading
    /// robot.yaml ([`recover`](super::recover)); `None`: start-up runs it.
    pub recovered: Option<(StepStatus, ReleaseStatus)>,
    /// When a release's robot.yaml adds, removes or renames a process or
    /// changes a channel (set up only at start), stop every process and
    /// end [`Supervisor::run_to_end`](super::Supervisor::run_to_end) with
    /// [`Ended::Restart`](super::Ended::Restart), so that the caller starts
    /// the supervisor again (`deploy supervise` executes itself anew); a
    /// trial goes on across that start. Off: the processes keep the
    /// configuration of the start, and the status says so.
    pub restart_to_reload: bool,
    /// robot.yaml `watchdog:`: the hardware watchdog the supervisor opens
    /// after start-up and feeds ([`crate::watchdog`]); its device is found
    /// under [`Roots::dev_root`].
    pub watchdog: Option<crate::config::WatchdogSection>,
    /// Why the watchdog is not opened although robot.yaml has one (a
    /// robot under a prefix on this machine's own /dev), said in the
    /// status instead.
    pub watchdog_skip: Option<String>,
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
            irq_scan_every: None,
            irq_scan_on_events: false,
            journal: false,
            metrics_textfile: None,
            recovered: None,
            restart_to_reload: false,
            watchdog: None,
            watchdog_skip: None,
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

/// Loads a release's robot.yaml (the path) into the supervisor's
/// configuration; `Err` says why it cannot be used.
pub type ConfigHook =
    Box<dyn Fn(&Path) -> Result<SupervisorConfig, crate::robot::RobotLoadError> + Send>;

/// One traced miss of a running process (robot.yaml
/// `check.trace_on_miss` with a process's `budgets.wakeup`).
#[derive(Debug, Clone)]
pub struct TracedMiss {
    /// The process whose handler started late.
    pub pid: i32,
    /// `late 1.2ms (budget 500us): <who> ran ... on CPU n ...`.
    pub verdict: String,
    /// The saved trace (`deploy trace show` reads it).
    pub file: Option<String>,
}

/// What one turn of the trace watch found.
#[derive(Debug, Clone, Default)]
pub struct TraceTurn {
    pub misses: Vec<TracedMiss>,
    /// Lines to say (the tracer started, or why not).
    pub say: Vec<String>,
}

/// The supervisor's work that needs the whole robot and the crates
/// below it (cpusets, the check engine, tracefs), given by the caller:
/// [`crate::boot::RobotBoot`] on a robot. Each part has a default that
/// does without it, so a test gives only the part it needs.
pub trait Boot: Send {
    /// Start-up step 1: apply the cpusets runtime plan (IRQs, thread
    /// priorities, cgroups).
    fn apply_cpu_plan(&mut self) -> StepStatus {
        step(
            "cpu plan",
            "skipped",
            "cpusets runtime plan API not available",
        )
    }

    /// Start-up step 4: the boot timing check, for the configured
    /// duration (run only when `boot_check.enabled`); `release` is what
    /// the release recovery at this start found (a rollback and why, the
    /// boot loader's count), for the boot history.
    fn boot_check(&mut self, duration: Duration, release: &ReleaseStatus) -> BootCheckOutcome {
        let _ = (duration, release);
        BootCheckOutcome::Skipped("engine not available".into())
    }

    /// One scan for interrupts and IRQ threads that appeared since the
    /// last, every [`Options::irq_scan_every`]: places them and says what
    /// it did, or `None` when nothing appeared.
    fn scan_irqs(&mut self) -> Option<StepStatus> {
        None
    }

    /// The tracing of the running processes' misses: called once when
    /// start-up is done (before any process starts: it sets up what they
    /// write to), then a few times a second; `None`: no tracing, and it is
    /// not asked again.
    fn watch_traces(&mut self) -> Option<TraceTurn> {
        None
    }

    /// The loader of a release's robot.yaml, for when the processes
    /// restart from a release whose robot.yaml differs (a trial, a
    /// rollback); `None`: the configuration loaded at start stays. Asked
    /// once, at start.
    fn release_config(&mut self) -> Option<ConfigHook> {
        None
    }

    /// A Jetson's rootfs A/B slots as this boot found them (`None`: no
    /// A/B, or nothing to read them with). Read once: every later call
    /// answers the same.
    fn rootfs_slots(&mut self) -> Option<crate::rootfs_slots::RootfsSlots> {
        None
    }

    /// Confirms the rootfs slot this boot runs from, once the boot's
    /// verdict is good (a Jetson's `nvbootctrl verify`: the slot's retry
    /// count goes back to its maximum). `None`: the board has no slots to
    /// confirm; otherwise what was done, or why it failed.
    fn confirm_rootfs_slot(&mut self) -> Option<Result<String, String>> {
        None
    }
}

/// What the boot timing check means for the real-time processes.
#[derive(Debug, Clone)]
pub(super) struct BootGate {
    /// `passed: ...`, `skipped: ...` or `failed: ... (what it means)`.
    pub summary: String,
    /// `on_failure: refuse`: real-time processes are not started.
    pub refuse: bool,
    /// `on_failure: degrade`: they start, marked degraded.
    pub degrade: bool,
}

/// What start-up leaves for the loop.
pub(super) struct Started {
    pub steps: Vec<StepStatus>,
    pub sigfd: Option<OwnedFd>,
    /// `/dev/cpu_dma_latency`, held open for the supervisor's lifetime.
    pub dma_latency: Option<DmaLatencyHold>,
    /// What the recovery of an interrupted trial left.
    pub release: ReleaseStatus,
    pub boot: BootGate,
    pub ctx: SpawnContext,
    pub listener: UnixListener,
    pub socket_path: PathBuf,
    /// `robot.group`, resolved.
    pub group_gid: Option<u32>,
    pub own_uid: u32,
    pub shm_dir: PathBuf,
}

pub(super) fn step(step: &str, result: &str, detail: impl Into<String>) -> StepStatus {
    StepStatus {
        step: step.into(),
        result: result.into(),
        detail: detail.into(),
    }
}

/// The start-up sequence: mounts (as PID 1), the signalfd, release
/// recovery, the CPU plan, `cpu_dma_latency`, the channels, the boot
/// timing check, the spawn context and the control socket.
pub(super) fn start_up(
    cfg: &SupervisorConfig,
    roots: &Roots,
    opts: &Options,
    mut boot: Option<&mut (dyn Boot + 'static)>,
) -> Result<Started, SupervisorStartError> {
    let mut steps = Vec::new();
    if opts.pid1 {
        steps.extend(crate::pid1::mount_missing(Path::new("/")));
    }
    let sigfd = if opts.handle_signals {
        let fd = crate::sys::signalfd(&[libc::SIGTERM, libc::SIGINT, libc::SIGCHLD])
            .map_err(SupervisorStartError::Signals)?;
        if !opts.pid1 {
            if let Err(e) = rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
                steps.push(step("child subreaper", "failed", e.to_string()));
            }
        }
        Some(fd)
    } else {
        None
    };

    // 0. Releases: a trial interrupted by a reboot or a crash rolls
    // back before anything starts.
    let (recovery_step, release) = match opts.recovered.clone() {
        Some(r) => r,
        None => super::trial::recover(&roots.prefix, &roots.proc_root),
    };
    steps.push(recovery_step);

    // 1. The CPU plan.
    steps.push(match boot.as_mut() {
        Some(b) => b.apply_cpu_plan(),
        None => step(
            "cpu plan",
            "skipped",
            "cpusets runtime plan API not available",
        ),
    });

    // 2. cpu_dma_latency, held for the supervisor's lifetime.
    let (dma_step, dma_latency) = hold_dma_latency(cfg.cpu_dma_latency, &roots.dev_root);
    steps.push(dma_step);

    // 3. Channels (mode 0660, the robot's group).
    let accounts = Accounts::load(&roots.prefix).map_err(SupervisorStartError::Accounts)?;
    let group_gid = match &cfg.robot.group {
        None => None,
        Some(g) => match accounts.gid(g) {
            Ok(gid) => Some(gid),
            Err(e) => {
                steps.push(step("robot.group", "failed", e.to_string()));
                None
            }
        },
    };
    let shm_dir = releases::Layout::new(&roots.prefix).shm_dir();
    steps.push(create_channels(cfg, &shm_dir, group_gid, &roots.proc_root));

    // 4. The boot timing check, then the verdict on this boot: a good
    // one confirms its rootfs slot where the firmware counts boots per
    // slot.
    let gate = boot_check(&cfg.boot_check, boot.as_deref_mut(), &release);
    if let Some(b) = boot {
        if let Some(st) = confirm_slot(&steps, &gate, b) {
            steps.push(st);
        }
    }
    let boot = gate;

    // 5. Accounts, spawn context, the control socket.
    let own_uid = rustix::process::geteuid().as_raw();
    let own_ids = (own_uid, rustix::process::getegid().as_raw());
    let mut base_env = BTreeMap::new();
    base_env.insert(
        "PATH".to_string(),
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
    );
    // Where the channels are and whose robot it is, for every process
    // (each gets its own name at spawn).
    let shared = ProcessEnv {
        shm_dir: Some(shm_dir.clone()),
        robot: Some(cfg.robot.name.clone()),
        ..ProcessEnv::default()
    };
    base_env.extend(shared.to_env().into_iter().map(|(k, v)| (k.to_string(), v)));
    // The supervisor's own DENY_SYSCALLS: run every process as on an
    // older kernel (or a system with io_uring off), for testing what the
    // robot's kernel will pick; see controller::supervise.
    let deny = match std::env::var(units::env::DENY_SYSCALLS) {
        Ok(list) if !list.trim().is_empty() => {
            match controller::supervise::parse_deny_list(&list) {
                Ok(d) => {
                    let names: Vec<&str> = d.iter().map(|d| d.name()).collect();
                    steps.push(step(
                        "syscall filter",
                        "ok",
                        format!(
                            "{} answer ENOSYS in every process ({})",
                            names.join(", "),
                            units::env::DENY_SYSCALLS
                        ),
                    ));
                    Some(controller::supervise::DenyFilter::new(&d))
                }
                Err(e) => {
                    steps.push(step(
                        "syscall filter",
                        "failed",
                        format!("{}: {e}; no filter", units::env::DENY_SYSCALLS),
                    ));
                    None
                }
            }
        }
        _ => None,
    };
    let ctx = SpawnContext {
        prefix: roots.prefix.clone(),
        accounts,
        own_ids,
        rt_cgroup: find_cgroup(&roots.sys_root, "rt"),
        housekeeping_cgroup: find_cgroup(&roots.sys_root, "housekeeping"),
        base_env,
        deny,
    };
    steps.push(match (&ctx.rt_cgroup, &ctx.housekeeping_cgroup) {
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

    Ok(Started {
        steps,
        sigfd,
        dma_latency,
        release,
        boot,
        ctx,
        listener,
        socket_path,
        group_gid,
        own_uid,
        shm_dir,
    })
}

/// The verdict on this boot, for the firmware's count of boot attempts
/// (a boot that never becomes good falls back by itself): a boot is good once the
/// CPU plan applied and verified and the boot check did not refuse the
/// real-time processes (passed; failed under `on_failure: degrade`; or
/// not run, as robot.yaml says). A good boot confirms its rootfs slot;
/// any other leaves the slot's retry count as the firmware left it, so
/// that boots that never become good end in the other slot. `None`: no
/// slot to confirm.
fn confirm_slot(steps: &[StepStatus], gate: &BootGate, boot: &mut dyn Boot) -> Option<StepStatus> {
    let slots = boot.rootfs_slots()?;
    let slot = slots
        .current
        .map_or("the slot booted".to_string(), |c| format!("slot {c}"));
    let not_good = match super::trial::CpuPlanNotApplied::of_steps(steps) {
        Err(e) => Some(format!("the CPU plan is not applied ({e})")),
        Ok(()) if gate.refuse => Some(format!("the boot check {}", gate.summary)),
        Ok(()) => None,
    };
    if let Some(why) = not_good {
        return Some(step(
            "rootfs slot",
            "skipped",
            format!(
                "{slot} not confirmed: {why}; the firmware takes one of its retries at the next boot, and boots the other slot once they are used up"
            ),
        ));
    }
    Some(match boot.confirm_rootfs_slot()? {
        Ok(done) => step(
            "rootfs slot",
            "ok",
            format!(
                "{slot} confirmed ({done}): CPU plan applied, boot check {}",
                gate.summary
            ),
        ),
        Err(e) => step(
            "rootfs slot",
            "failed",
            format!("{slot} not confirmed: {e}"),
        ),
    })
}

/// Makes the `power.cpu_dma_latency` request at `<dev>/cpu_dma_latency`;
/// it holds while the returned hold lives (the supervisor's lifetime).
fn hold_dma_latency(us: Option<u32>, dev_root: &Path) -> (StepStatus, Option<DmaLatencyHold>) {
    let Some(us) = us else {
        return (
            step(
                "cpu_dma_latency",
                "skipped",
                "power.cpu_dma_latency not set",
            ),
            None,
        );
    };
    match DmaLatencyHold::hold(&dev_root.join("cpu_dma_latency"), us) {
        Ok(hold) => (
            step(
                "cpu_dma_latency",
                "ok",
                format!("{}: {}us held", hold.path().display(), hold.value_us()),
            ),
            Some(hold),
        ),
        Err(e) => (
            step("cpu_dma_latency", "failed", Chain(&e).to_string()),
            None,
        ),
    }
}

/// Runs the boot timing check (when enabled and given) and says what its
/// outcome means under `on_failure`.
fn boot_check(
    section: &BootCheckSection,
    boot: Option<&mut (dyn Boot + 'static)>,
    release: &ReleaseStatus,
) -> BootGate {
    let outcome = if !section.enabled {
        BootCheckOutcome::Skipped("disabled in robot.yaml".into())
    } else {
        match boot {
            Some(b) => b.boot_check(section.duration.0, release),
            None => BootCheckOutcome::Skipped("engine not available".into()),
        }
    };
    let (summary, refuse, degrade) = match &outcome {
        BootCheckOutcome::Passed(d) => (format!("passed: {d}"), false, false),
        BootCheckOutcome::Skipped(d) => (format!("skipped: {d}"), false, false),
        BootCheckOutcome::Failed(d) => match section.on_failure {
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
    BootGate {
        summary,
        refuse,
        degrade,
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
        let users = crate::config::ChannelUsers::of(&cfg.processes, &c.name);
        match Channel::create_from_config(
            shm_dir,
            c,
            users.publishers,
            users.subscribers,
            gid,
            proc_root,
        ) {
            Ok((_, CreateOutcome::Created)) => created += 1,
            Ok((_, CreateOutcome::Reused { .. })) => reused += 1,
            Ok((_, CreateOutcome::Replaced { reason })) => {
                replaced.push(format!("{} ({reason})", c.name))
            }
            Err(e) => errors.push(Chain(&e).to_string()),
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

/// Binds the control socket: removes a stale one, refuses when another
/// supervisor answers, then mode 0660 and the robot's group.
fn open_socket(path: &Path, gid: Option<u32>) -> Result<UnixListener, SupervisorStartError> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir).map_err(|err| SupervisorStartError::Create {
        path: dir.to_path_buf(),
        err,
    })?;
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(SupervisorStartError::AlreadyRunning {
                path: path.to_path_buf(),
            });
        }
        let _ = std::fs::remove_file(path);
    }
    let listen = |err| SupervisorStartError::Listen {
        path: path.to_path_buf(),
        err,
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
