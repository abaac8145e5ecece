//! The coordinator of `deploy sim`: the robot's processes, the real
//! binaries robot.yaml names, on one virtual clock.
//!
//! Each process is started with one end of a `SOCK_SEQPACKET` socket pair
//! in [`units::env::SIM`]; its event loop then runs on a virtual clock and,
//! when the process calls `run`, says hello and waits for turns
//! ([`units::sim_link`]). The coordinator gives one turn at a time, so one
//! process runs at a time:
//!
//! - at each virtual instant, the processes due then (a timer, a message)
//!   take turns in an order drawn from the seed
//!   ([`controller::sim::TurnOrder`]);
//! - a process that published in its turn may have given the others
//!   something to read at the same instant: every other process takes a
//!   turn there too (a turn with nothing ready costs a round trip and
//!   runs no handler), and so on until nobody has anything left, or
//!   [`MAX_ROUNDS_PER_INSTANT`] turns, which is named as a livelock;
//! - then the clock jumps to the earliest next event any process
//!   reported.
//!
//! What cannot be simulated is said, never guessed: a process that does
//! not connect (it does not run our event loop, or has not called `run`
//! within the hello timeout) is refused, or left out when the user says
//! so. A process whose turn does not end within the turn timeout of wall
//! time (a handler that never returns) is killed, and the process and the
//! virtual time are named. A frame that is not one of the wire's ends
//! that process's run, named.
//!
//! What is not simulated: publishes outside a loop's senders and timing
//! reports (a bare [`controller::Publisher`] a process drives itself)
//! are read by the others at their next turn, not at the same instant;
//! a process's work before `run` (its setup) is not on the clock.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use controller::sim::{TurnOrder, START};
use controller::{Monotonic, VirtualClock};
use rustix::event::{PollFd, PollFlags};
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};
use serde::Serialize;
use units::env::ProcessEnv;
use units::sim_link::{FromLoop, ToLoop, TurnEnd, FRAME};

use crate::robot::Robot;

/// Turns at one virtual instant before the run is stopped as a livelock
/// (processes publishing to each other without time passing).
pub const MAX_ROUNDS_PER_INSTANT: u64 = 1 << 16;
/// How long a process has to exit after the run is over.
const EXIT_GRACE: Duration = Duration::from_secs(5);
/// The most of a process's output shown when it fails.
const OUTPUT_TAIL: u64 = 2048;

/// What to do with a process that does not connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unsimulated {
    /// The run does not start; the process is named.
    Refuse,
    /// It is stopped and left out; the run goes on without it.
    LeaveOut,
}

/// How to run a simulation.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// Orders the turns due at one instant.
    pub seed: u64,
    /// Virtual time to run for, from [`START`].
    pub run_for: Duration,
    /// Wall time a turn may take before its process is killed.
    pub turn_timeout: Duration,
    /// Wall time a process has from its start to its loop's hello.
    pub hello_timeout: Duration,
    /// Processes not started.
    pub leave_out: Vec<String>,
    pub unsimulated: Unsimulated,
    /// Where programs named relatively are (default: the current
    /// release's `bin/` under `prefix`, as the supervisor resolves them).
    pub bin_dir: Option<PathBuf>,
    pub prefix: PathBuf,
    /// The channels' directory (created; the robot.yaml channels are
    /// created in it).
    pub shm_dir: PathBuf,
    /// Where each process's output goes (`<name>.out`).
    pub out_dir: PathBuf,
    /// `/proc`, for the channels' owner words.
    pub proc_root: PathBuf,
    /// Record the run (`deploy sim --log`).
    pub log: Option<SimLogOptions>,
    /// Replay a recorded log into the run (`deploy sim --replay`).
    pub replay: Option<SimReplayOptions>,
    /// Charge each turn's CPU time to the clock: a process is busy for as
    /// long as its turn took on its thread, and its next turn is not
    /// before then. Not deterministic (CPU times vary from run to run).
    pub charge_cpu: bool,
    /// Run the coordinator and every process on this CPU: one runs at a
    /// time, and a turn handed over on one CPU is a switch between two
    /// tasks rather than a wakeup on another CPU (about three times
    /// faster per turn here). `None`: where they may run.
    pub cpu: Option<u32>,
}

/// A log replayed into a simulation: its channels that robot.yaml
/// declares are published at their recorded times on the virtual clock
/// (a simulation's own log at the same virtual times; another log from
/// the simulation's start, keeping its spacing).
#[derive(Debug, Clone)]
pub struct SimReplayOptions {
    pub path: PathBuf,
    /// Globs of channels the processes under test publish: the log's
    /// copies go to [`ORIGINAL`] + the name instead, to be compared.
    pub remap: Vec<String>,
}

/// Where the log's copy of a remapped channel goes: `/original/demo/ping`
/// for `/demo/ping`.
pub const ORIGINAL: &str = "/original";

/// What a simulation records, and where.
#[derive(Debug, Clone)]
pub struct SimLogOptions {
    /// The file (it must not exist).
    pub path: PathBuf,
    /// robot.yaml's `log:` section (the default one without it): which
    /// channels, their types, the chunk size.
    pub section: logbook::LogSection,
}

/// A process of the simulation, at its end.
#[derive(Debug, Clone, Serialize)]
pub struct SimProcess {
    pub name: String,
    /// `running` (to the end of the run), `exited` (a handler asked),
    /// `done` (nothing left to wait for), `left out`, `not simulated`,
    /// `failed`.
    pub state: String,
    /// Why, for the states other than `running`.
    pub detail: Option<String>,
    /// Turns it took.
    pub turns: u64,
    /// Messages its loop published (senders and timing reports).
    pub published: u64,
    /// Its exit status once the run was over.
    pub exit: Option<String>,
    /// Its standard output and error.
    pub output: Option<PathBuf>,
    /// Times it was started again (robot.yaml's `restart:`).
    pub restarts: u32,
    /// Times it ended with a failure (an exit status other than 0, a
    /// signal) during the run.
    pub failed_exits: u32,
    /// CPU time its turns took on its loop's thread (measured; not
    /// deterministic), nanoseconds.
    pub cpu_ns: u64,
    /// Its deaths and restarts, at their virtual times.
    pub history: Vec<String>,
}

/// A simulation that ran.
#[derive(Debug, Clone, Serialize)]
pub struct SimOutcome {
    pub seed: u64,
    /// Virtual time at the start and at the end, nanoseconds.
    pub start_ns: u64,
    pub end_ns: u64,
    /// Instants at which a process took a turn, and turns in all.
    pub instants: u64,
    pub turns: u64,
    /// No process had anything left to do before the end.
    pub idle: bool,
    pub processes: Vec<SimProcess>,
    /// What stopped the run early (a watchdog, a livelock, a process that
    /// died in its turn, a link that broke, the log); `None`: it ran to
    /// its end.
    pub failure: Option<String>,
    /// What the log holds (`--log`).
    pub log: Option<logbook::sim::SimLogSummary>,
    /// What was replayed (`--replay`).
    pub replay: Option<logbook::replay::ReplayDone>,
    /// Turns' CPU time was charged to the clock (`--charge-cpu`): the run
    /// is not deterministic.
    pub charge_cpu: bool,
}

/// A simulation that could not start.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("cannot create {}", dir.display())]
    Dir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot create channel {name}")]
    Channel {
        name: String,
        #[source]
        source: controller::channel::ChannelCreateError,
    },
    #[error("cannot start process {name} ({})", path.display())]
    Spawn {
        name: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the simulation's link to {name}")]
    Link {
        name: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{} cannot be simulated: {}; leave them out with --leave-out NAME or --unsimulated leave-out", names.join(", "), reasons.join("; "))]
    NotSimulated {
        names: Vec<String>,
        reasons: Vec<String>,
    },
    #[error("cannot run the simulation on CPU {cpu}")]
    Pin {
        cpu: u32,
        #[source]
        source: units::sched::AffinitySetError,
    },
    #[error("--leave-out {0}: robot.yaml has no such process")]
    UnknownProcess(String),
    #[error("cannot replay {}", path.display())]
    Replay {
        path: PathBuf,
        #[source]
        source: logbook::replay::ReplayError,
    },
    #[error("channel {channel} is both replayed from the log and published by process {process}: --remap {channel} (the log's copy goes to {ORIGINAL}{channel}) or --leave-out {process}")]
    ReplayConflict { channel: String, process: String },
    #[error("{} holds channels robot.yaml does not declare: {} (a log of another robot?)", path.display(), channels.join(", "))]
    ReplayOtherRobot {
        path: PathBuf,
        channels: Vec<String>,
    },
    #[error("--remap {0}: no channel of robot.yaml matches")]
    RemapMatchesNothing(String),
    #[error("cannot create the log {}", path.display())]
    Log {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

enum State {
    Running,
    /// Its loop ended (a handler asked, or nothing was left) at this
    /// virtual time, and the restart policy leaves it so.
    Ended(TurnEnd, u64),
    /// It died, and the restart policy starts it again at this virtual
    /// time.
    Restarting(u64),
    /// It died and the restart policy leaves it dead (why).
    Dead(String),
    LeftOut,
    NotSimulated(String),
    Failed(String),
}

struct Proc {
    name: String,
    /// robot.yaml's `restart:`, and the restarts so far.
    restart: crate::config::Restart,
    tracker: crate::restart::Tracker,
    restarts: u32,
    failed_exits: u32,
    /// CPU time its turns took, in all.
    cpu_ns: u64,
    /// When its current run started (virtual ns).
    started_ns: u64,
    /// What happened to it, in order (deaths, restarts).
    history: Vec<String>,
    child: Option<Child>,
    link: Option<OwnedFd>,
    next: Option<u64>,
    published: u64,
    turns: u64,
    state: State,
    output: Option<PathBuf>,
    exit: Option<String>,
}

/// Why a turn did not come back: the run stops with it.
struct TurnFailure(String);

/// How a turn ended.
enum Turned {
    /// The process waits for its next event; it published in the turn.
    Waiting { published: bool },
    /// Its loop ended or it died: the restart policy decides.
    Ended {
        why: String,
        status: Option<std::process::ExitStatus>,
    },
}

/// Runs `robot`'s processes on one virtual clock (see the module's
/// documentation). The processes are stopped (and killed if they do not
/// exit) before it returns, whatever happened.
pub fn run(robot: &Robot, opts: &SimOptions) -> Result<SimOutcome, SimError> {
    for name in &opts.leave_out {
        if !robot.processes.iter().any(|p| &p.name == name) {
            return Err(SimError::UnknownProcess(name.clone()));
        }
    }
    if let Some(cpu) = opts.cpu {
        // This thread's CPU set, which the processes inherit.
        let mut one = units::cpu::CpuSet::new();
        one.insert(cpu);
        units::sched::set_affinity(0, &one).map_err(|source| SimError::Pin { cpu, source })?;
    }
    for dir in [&opts.shm_dir, &opts.out_dir] {
        std::fs::create_dir_all(dir).map_err(|source| SimError::Dir {
            dir: dir.clone(),
            source,
        })?;
    }
    for c in &robot.channels {
        let users = crate::config::ChannelUsers::of(&robot.processes, &c.name);
        controller::Channel::create_from_config(
            &opts.shm_dir,
            c,
            users.publishers,
            users.subscribers,
            None,
            &opts.proc_root,
        )
        .map_err(|source| SimError::Channel {
            name: c.name.clone(),
            source,
        })?;
    }
    let remapped = |name: &str| {
        opts.replay
            .as_ref()
            .is_some_and(|r| r.remap.iter().any(|g| logbook::section::glob(g, name)))
    };
    let mut originals = Vec::new();
    if let Some(r) = &opts.replay {
        for g in &r.remap {
            if !robot
                .channels
                .iter()
                .any(|c| logbook::section::glob(g, &c.name))
            {
                return Err(SimError::RemapMatchesNothing(g.clone()));
            }
        }
        for c in robot.channels.iter().filter(|c| remapped(&c.name)) {
            let copy = controller::config::ChannelConfig {
                name: format!("{ORIGINAL}{}", c.name),
                ..c.clone()
            };
            controller::Channel::create_from_config(
                &opts.shm_dir,
                &copy,
                1,
                1,
                None,
                &opts.proc_root,
            )
            .map_err(|source| SimError::Channel {
                name: copy.name.clone(),
                source,
            })?;
            originals.push(copy.name);
        }
    }
    let replay = match &opts.replay {
        None => None,
        Some(r) => {
            let ropts = logbook::replay::ReplayOptions {
                filter: logbook::read::Filter {
                    channels: robot.channels.iter().map(|c| c.name.clone()).collect(),
                    ..Default::default()
                },
                speed: 1.0,
                shm_dir: opts.shm_dir.clone(),
                proc_root: opts.proc_root.clone(),
            };
            let onto = |t: &str| {
                if remapped(t) {
                    format!("{ORIGINAL}{t}")
                } else {
                    t.to_string()
                }
            };
            let mut src =
                logbook::replay::ReplaySource::open(&r.path, &ropts, &onto).map_err(|source| {
                    SimError::Replay {
                        path: r.path.clone(),
                        source,
                    }
                })?;
            // A log's channel robot.yaml does not declare: another robot's
            // log (a replayed copy of a remap is the log's own).
            let others: Vec<String> = src
                .left_out
                .iter()
                .filter(|t| !t.starts_with(&format!("{ORIGINAL}/")))
                .cloned()
                .collect();
            if !others.is_empty() {
                return Err(SimError::ReplayOtherRobot {
                    path: r.path.clone(),
                    channels: others,
                });
            }
            for t in src.topics() {
                if remapped(t) {
                    continue;
                }
                if let Some(p) = robot.processes.iter().find(|p| {
                    p.publishes.iter().any(|c| c == t) && !opts.leave_out.contains(&p.name)
                }) {
                    return Err(SimError::ReplayConflict {
                        channel: t.to_string(),
                        process: p.name.clone(),
                    });
                }
            }
            let clock = VirtualClock::new(START);
            src.set_clock(&controller::Clock::Virtual(clock.clone()));
            Some(Replay { src, clock })
        }
    };
    let log = match &opts.log {
        None => None,
        Some(l) => {
            // robot.yaml's channels and every process's timing channel.
            let channels = robot
                .channels
                .iter()
                .map(|c| c.name.clone())
                .chain(originals.iter().cloned())
                .chain(
                    robot
                        .processes
                        .iter()
                        .map(|p| controller::timing_report::timing_channel_name(&p.name)),
                )
                .collect();
            let log = logbook::sim::SimLog::create(&l.path, &l.section, &opts.shm_dir, channels)
                .map_err(|source| SimError::Log {
                    path: l.path.clone(),
                    source,
                })?;
            Some(log)
        }
    };
    let mut coord = Coordinator {
        procs: Vec::new(),
        configs: robot.processes.clone(),
        robot_name: robot.robot.name.clone(),
        opts: opts.clone(),
        order: TurnOrder::new(opts.seed),
        turn_timeout: opts.turn_timeout,
        log,
        replay,
    };
    let started = coord.start(robot, opts);
    let outcome = started.map(|()| coord.run(opts));
    coord.stop();
    let mut outcome = outcome?;
    outcome.processes = coord.report();
    if let Some(r) = coord.replay.take() {
        match r.src.finish() {
            Ok(done) => outcome.replay = Some(done),
            Err(e) => {
                outcome
                    .failure
                    .get_or_insert(format!("the replay: {}", units::error::Chain(&e)));
            }
        }
    }
    if let Some(log) = coord.log.take() {
        match Coordinator::log_end(log) {
            Ok(summary) => outcome.log = Some(summary),
            Err(e) => {
                outcome.failure.get_or_insert(format!("the log: {e}"));
            }
        }
    }
    Ok(outcome)
}

struct Coordinator {
    procs: Vec<Proc>,
    /// robot.yaml's processes, in the order of `procs`.
    configs: Vec<crate::config::ProcessConfig>,
    robot_name: String,
    opts: SimOptions,
    order: TurnOrder,
    turn_timeout: Duration,
    log: Option<logbook::sim::SimLog>,
    replay: Option<Replay>,
}

/// A log being replayed, and the clock its publishers stamp with.
struct Replay {
    src: logbook::replay::ReplaySource,
    clock: VirtualClock,
}

impl Replay {
    /// The virtual time of the next message: its log time in a
    /// simulation's own log, else the same distance from [`START`] as
    /// from the log's first message.
    fn next_virtual(&mut self) -> Option<u64> {
        let t = self.src.next_time()?;
        Some(if self.src.simulated {
            t
        } else {
            START
                .as_nanos()
                .saturating_add(t.saturating_sub(self.src.t0))
        })
    }

    /// Publishes every message due at or before `now`: how many.
    fn publish_due(&mut self, now: u64) -> u64 {
        self.clock.advance_to(Monotonic::from_nanos(now));
        let mut n = 0;
        while self.next_virtual().is_some_and(|t| t <= now) {
            self.src.publish_next();
            n += 1;
        }
        n
    }
}

impl Coordinator {
    /// Starts every process (in robot.yaml's order) and waits for each
    /// one's hello before the next starts.
    fn start(&mut self, robot: &Robot, opts: &SimOptions) -> Result<(), SimError> {
        let mut refused = (Vec::new(), Vec::new());
        for p in &robot.processes {
            if opts.leave_out.contains(&p.name) {
                self.procs.push(Proc::new(&p.name, State::LeftOut, None));
                continue;
            }
            let output = opts.out_dir.join(format!("{}.out", p.name));
            // A new run's output (a kept directory may hold an old one);
            // a restart's is appended.
            File::create(&output).map_err(|source| SimError::Dir {
                dir: output.clone(),
                source,
            })?;
            let mut proc = Proc::new(&p.name, State::Running, Some(output.clone()));
            proc.restart = p.restart.clone();
            let (child, mine) =
                spawn_process(p, &robot.robot.name, opts, START.as_nanos(), &output)?;
            proc.child = Some(child);
            match hello(&mine, opts.hello_timeout) {
                Ok(()) => {
                    proc.link = Some(mine);
                    // Its first turn starts it, at the start.
                    proc.next = Some(START.as_nanos());
                }
                Err(why) => {
                    proc.kill();
                    let why = format!("{}: {why}", p.name);
                    if opts.unsimulated == Unsimulated::Refuse {
                        refused.0.push(p.name.clone());
                        refused.1.push(why.clone());
                    }
                    proc.state = State::NotSimulated(why);
                }
            }
            self.procs.push(proc);
        }
        if !refused.0.is_empty() {
            return Err(SimError::NotSimulated {
                names: refused.0,
                reasons: refused.1,
            });
        }
        Ok(())
    }

    /// Runs to `opts.run_for` past [`START`], until no process has
    /// anything left to do, or until a turn fails.
    fn run(&mut self, opts: &SimOptions) -> SimOutcome {
        let until = START
            .as_nanos()
            .saturating_add(opts.run_for.as_nanos() as u64);
        let mut out = SimOutcome {
            seed: opts.seed,
            start_ns: START.as_nanos(),
            end_ns: START.as_nanos(),
            instants: 0,
            turns: 0,
            idle: false,
            processes: Vec::new(),
            failure: None,
            log: None,
            replay: None,
            charge_cpu: opts.charge_cpu,
        };
        if let Err(e) = self.log_start() {
            out.failure = Some(format!("the log: {e}"));
            return out;
        }
        let mut next_open = START.as_nanos() + 1_000_000_000;
        let n = self.procs.len();
        let mut queue = std::collections::VecDeque::with_capacity(n);
        let mut queued = vec![false; n];
        let mut others = Vec::with_capacity(n);
        loop {
            let running = self
                .procs
                .iter()
                .any(|p| matches!(p.state, State::Running | State::Restarting(_)));
            let next = self
                .procs
                .iter()
                .filter_map(|p| match p.state {
                    State::Running => p.next,
                    State::Restarting(at) => Some(at),
                    _ => None,
                })
                .chain(
                    self.replay
                        .as_mut()
                        .filter(|_| running)
                        .and_then(|r| r.next_virtual()),
                )
                .min();
            let now = match next {
                None => {
                    out.idle = true;
                    break;
                }
                Some(t) if t > until => {
                    out.end_ns = until;
                    break;
                }
                Some(t) => t,
            };
            out.end_ns = now;
            out.instants += 1;
            // Restarts due now, in robot.yaml's order.
            for i in 0..n {
                if matches!(self.procs[i].state, State::Restarting(at) if at == now) {
                    self.restart(i, now);
                }
            }
            // The log's messages of this instant first: every process may
            // have something to read.
            let replayed = self.replay.as_mut().map_or(0, |r| r.publish_due(now));
            let mut due: Vec<usize> = (0..n)
                .filter(|&i| matches!(self.procs[i].state, State::Running))
                .filter(|&i| replayed > 0 || self.procs[i].next == Some(now))
                .collect();
            self.order.shuffle(&mut due);
            for &i in &due {
                queued[i] = true;
                queue.push_back(i);
            }
            let mut rounds = 0u64;
            while let Some(i) = queue.pop_front() {
                queued[i] = false;
                // Queued before it ended in an earlier turn of this instant.
                if !matches!(self.procs[i].state, State::Running) {
                    continue;
                }
                rounds += 1;
                if rounds > MAX_ROUNDS_PER_INSTANT {
                    out.failure = Some(format!(
                        "livelock at virtual time {}: {MAX_ROUNDS_PER_INSTANT} turns without time passing (processes publishing to each other at one instant)",
                        Monotonic::from_nanos(now)
                    ));
                    return out;
                }
                out.turns += 1;
                let published = match self.turn(i, now) {
                    Ok(Turned::Waiting { published }) => published,
                    Ok(Turned::Ended { why, status }) => {
                        self.ended(i, now, why, status);
                        // What it published before it ended is read by
                        // the others at this instant.
                        true
                    }
                    Err(TurnFailure(why)) => {
                        if let Some(log) = &mut self.log {
                            // The failure's first line: the rest is the
                            // process's own output, which may hold anything.
                            let first = why.lines().next().unwrap_or_default();
                            let name = self.procs[i].name.clone();
                            let _ =
                                log.event(now, "exit", Some(&name), &format!("failed: {first}"));
                        }
                        self.procs[i].state = State::Failed(why.clone());
                        out.failure = Some(why);
                        return out;
                    }
                };
                if published {
                    others.clear();
                    others.extend((0..n).filter(|&j| {
                        j != i && !queued[j] && matches!(self.procs[j].state, State::Running)
                    }));
                    self.order.shuffle(&mut others);
                    for &j in &others {
                        queued[j] = true;
                        queue.push_back(j);
                    }
                }
                if self.procs[i].next == Some(now) && !queued[i] {
                    queued[i] = true;
                    queue.push_back(i);
                }
            }
            // Nobody runs: the log reads what this instant published (and
            // once a virtual second looks for channels created since).
            if let Some(log) = &mut self.log {
                if now >= next_open {
                    log.open_channels();
                    next_open = now.saturating_add(1_000_000_000);
                }
                if let Err(e) = log.record() {
                    out.failure = Some(format!("the log: {e}"));
                    return out;
                }
            }
        }
        out
    }

    /// The log's start: each process's pid named by its place in
    /// robot.yaml, the channels opened, an event per process.
    fn log_start(&mut self) -> std::io::Result<()> {
        let Some(log) = &mut self.log else {
            return Ok(());
        };
        for (i, p) in self.procs.iter().enumerate() {
            if let Some(c) = &p.child {
                log.name_pid(c.id(), i as u32 + 1);
            }
        }
        log.open_channels();
        let at = START.as_nanos();
        for p in &self.procs {
            let (kind, message) = match &p.state {
                State::Running => ("start", "started on the virtual clock".to_string()),
                State::LeftOut => ("exit", "left out (--leave-out)".to_string()),
                State::NotSimulated(why) => ("exit", format!("not simulated: {why}")),
                _ => continue,
            };
            log.event(at, kind, Some(&p.name), &message)?;
        }
        Ok(())
    }

    /// The log's end: what the last instant published, the file
    /// finished.
    /// (Ends and restarts were recorded as they happened.)
    fn log_end(mut log: logbook::sim::SimLog) -> std::io::Result<logbook::sim::SimLogSummary> {
        log.record()?;
        log.finish()
    }

    /// Gives process `i` a turn at `now`: whether it published, or that
    /// it ended (its process exited, or is exiting: its status).
    fn turn(&mut self, i: usize, now: u64) -> Result<Turned, TurnFailure> {
        let timeout = self.turn_timeout;
        let charge_cpu = self.opts.charge_cpu;
        let p = &mut self.procs[i];
        let at = Monotonic::from_nanos(now);
        let link = p.link.as_ref().expect("a running process has its link");
        let fail = |p: &mut Proc, why: String| {
            p.kill();
            let tail = p.output_tail();
            TurnFailure(if tail.is_empty() {
                format!("{}: {why}", p.name)
            } else {
                format!("{}: {why}; the end of its output:\n{tail}", p.name)
            })
        };
        if let Err(e) = send(link, ToLoop::Turn { now_ns: now }) {
            let why = format!("cannot give it its turn at virtual time {at}: {e}");
            return Err(fail(p, why));
        }
        let mut buf = [0u8; 2 * FRAME];
        let n = match recv_within(link, &mut buf, timeout) {
            Ok(Some(n)) => n,
            Ok(None) => {
                let why = format!(
                    "its turn at virtual time {at} did not end within {} of wall time (a handler that never returns?): killed",
                    units::duration::Dur(timeout)
                );
                return Err(fail(p, why));
            }
            Err(e) => {
                let why = format!("its link broke in its turn at virtual time {at}: {e}");
                return Err(fail(p, why));
            }
        };
        if n == 0 {
            // It died in its turn: the restart policy decides.
            p.turns += 1;
            p.link = None;
            let status = p.wait_status(EXIT_GRACE);
            return Ok(Turned::Ended {
                why: format!("it died in its turn at virtual time {at}"),
                status,
            });
        }
        let (end, next, published, cpu_ns) = match FromLoop::decode(&buf[..n]) {
            Ok(FromLoop::Turned {
                end,
                next_ns,
                published,
                cpu_ns,
            }) => (end, next_ns, published, cpu_ns),
            Ok(FromLoop::Hello { .. }) => {
                let why = format!("a second hello in its turn at virtual time {at}");
                return Err(fail(p, why));
            }
            Err(e) => {
                let why = format!("a frame that is not one in its turn at virtual time {at}: {e}");
                return Err(fail(p, why));
            }
        };
        if let Some(t) = next.filter(|&t| t < now) {
            let why = format!(
                "its next event at virtual time {} is before its turn at {at}",
                Monotonic::from_nanos(t)
            );
            return Err(fail(p, why));
        }
        p.turns += 1;
        let changed = published != p.published;
        p.published = published;
        p.next = next;
        p.cpu_ns = p.cpu_ns.saturating_add(cpu_ns);
        if charge_cpu {
            // Busy until its turn's CPU time has passed: what was due
            // meanwhile runs late, and its reports say so.
            let busy = now.saturating_add(cpu_ns);
            p.next = next.map(|t| t.max(busy));
        }
        if end != TurnEnd::Waiting {
            // Its loop ended: the process exits (run returned), and the
            // restart policy decides, as for any exit.
            p.state = State::Ended(end, now);
            p.next = None;
            p.link = None;
            let status = p.wait_status(EXIT_GRACE);
            let why = match end {
                TurnEnd::Exited => {
                    format!("its loop exited at virtual time {at} (a handler asked)")
                }
                _ => format!("its loop had nothing left to wait for at virtual time {at}"),
            };
            return Ok(Turned::Ended { why, status });
        }
        Ok(Turned::Waiting { published: changed })
    }

    /// Process `i` ended at `now` (`why`, its exit status): robot.yaml's
    /// restart policy for it decides, as the supervisor's would, on the
    /// virtual clock: started again after its backoff, left as it is, or
    /// failed (a crash loop). The run goes on.
    fn ended(&mut self, i: usize, now: u64, why: String, status: Option<std::process::ExitStatus>) {
        use std::os::unix::process::ExitStatusExt;
        let p = &mut self.procs[i];
        let exit = match status {
            Some(s) => match (s.code(), s.signal()) {
                (Some(c), _) => crate::restart::ExitKind::Code(c),
                (None, Some(sig)) => crate::restart::ExitKind::Signal(sig),
                _ => crate::restart::ExitKind::Signal(0),
            },
            // Not reaped (killed after the grace): as a kill.
            None => crate::restart::ExitKind::Signal(9),
        };
        let ran = Duration::from_nanos(now.saturating_sub(p.started_ns));
        let decision = p
            .tracker
            .on_exit(&p.restart, exit, ran, Duration::from_nanos(now));
        let what = format!("{why}: {}", exit.describe());
        p.history.push(what.clone());
        if !exit.success() {
            p.failed_exits += 1;
        }
        let event = match decision {
            crate::restart::Decision::Restart(delay) => {
                let at = now.saturating_add(delay.as_nanos() as u64);
                p.state = State::Restarting(at);
                format!(
                    "{what}; restarts at virtual time {} (restart: {})",
                    Monotonic::from_nanos(at),
                    p.restart.policy.name()
                )
            }
            crate::restart::Decision::Stay => {
                if !matches!(p.state, State::Ended(..)) || !exit.success() {
                    p.state = State::Dead(what.clone());
                }
                format!(
                    "{what}; not restarted (restart: {})",
                    p.restart.policy.name()
                )
            }
            crate::restart::Decision::Fail(reason) => {
                p.state = State::Failed(format!("{what}; {reason}"));
                format!("{what}; failed: {reason}")
            }
        };
        if let Some(log) = &mut self.log {
            let name = self.procs[i].name.clone();
            let _ = log.event(now, "exit", Some(&name), &event);
        }
    }

    /// Starts process `i` again at `now` (its restart came): its first
    /// turn is at `now`. A start that fails leaves it failed.
    fn restart(&mut self, i: usize, now: u64) {
        let output = self.procs[i].output.clone().unwrap_or_else(|| {
            self.opts
                .out_dir
                .join(format!("{}.out", self.procs[i].name))
        });
        let started = spawn_process(&self.configs[i], &self.robot_name, &self.opts, now, &output)
            .map_err(|e| units::error::Chain(&e).to_string())
            .and_then(|(child, link)| {
                let pid = child.id();
                self.procs[i].child = Some(child);
                hello(&link, self.opts.hello_timeout).map(|()| (link, pid))
            });
        let at = Monotonic::from_nanos(now);
        let p = &mut self.procs[i];
        match started {
            Ok((link, pid)) => {
                p.link = Some(link);
                p.state = State::Running;
                p.next = Some(now);
                p.started_ns = now;
                p.restarts += 1;
                p.exit = None;
                p.history
                    .push(format!("started again at virtual time {at}"));
                if let Some(log) = &mut self.log {
                    log.name_pid(pid, i as u32 + 1);
                    let _ = log.event(
                        now,
                        "restart",
                        Some(&self.procs[i].name),
                        "started again on the virtual clock",
                    );
                }
            }
            Err(why) => {
                p.kill();
                p.state = State::Failed(format!("starting it again at virtual time {at}: {why}"));
            }
        }
    }

    /// Ends the run: every running process is told to stop and has
    /// [`EXIT_GRACE`] to exit, then is killed; every child is reaped.
    fn stop(&mut self) {
        for p in &mut self.procs {
            if let (State::Running, Some(link)) = (&p.state, &p.link) {
                let _ = send(link, ToLoop::Stop);
            }
        }
        for p in &mut self.procs {
            p.link = None;
            if p.child.is_some() {
                let status = p.wait_exit(EXIT_GRACE);
                p.exit = Some(status);
            }
        }
    }

    fn report(&self) -> Vec<SimProcess> {
        self.procs
            .iter()
            .map(|p| {
                let (state, detail) = match &p.state {
                    State::Running => ("running", None),
                    State::Ended(TurnEnd::Exited, t) => (
                        "exited",
                        Some(format!(
                            "a handler asked at virtual time {}",
                            Monotonic::from_nanos(*t)
                        )),
                    ),
                    State::Ended(_, t) => (
                        "done",
                        Some(format!(
                            "nothing left to wait for at virtual time {}",
                            Monotonic::from_nanos(*t)
                        )),
                    ),
                    State::Restarting(t) => (
                        "restarting",
                        Some(format!(
                            "to start again at virtual time {}",
                            Monotonic::from_nanos(*t)
                        )),
                    ),
                    State::Dead(why) => ("dead", Some(why.clone())),
                    State::LeftOut => ("left out", Some("--leave-out".to_string())),
                    State::NotSimulated(why) => ("not simulated", Some(why.clone())),
                    State::Failed(why) => ("failed", Some(why.clone())),
                };
                SimProcess {
                    name: p.name.clone(),
                    state: state.into(),
                    detail,
                    turns: p.turns,
                    published: p.published,
                    exit: p.exit.clone(),
                    output: p.output.clone(),
                    restarts: p.restarts,
                    failed_exits: p.failed_exits,
                    cpu_ns: p.cpu_ns,
                    history: p.history.clone(),
                }
            })
            .collect()
    }
}

impl Proc {
    fn new(name: &str, state: State, output: Option<PathBuf>) -> Proc {
        Proc {
            name: name.into(),
            restart: crate::config::Restart::default(),
            tracker: crate::restart::Tracker::default(),
            restarts: 0,
            failed_exits: 0,
            cpu_ns: 0,
            started_ns: START.as_nanos(),
            history: Vec::new(),
            child: None,
            link: None,
            next: None,
            published: 0,
            turns: 0,
            state,
            output,
            exit: None,
        }
    }

    fn kill(&mut self) {
        self.link = None;
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            if let Ok(status) = c.wait() {
                self.exit = Some(status.to_string());
            }
            self.child = None;
        }
    }

    /// Waits up to `grace` for the child to exit, then kills it: how it
    /// ended.
    fn wait_exit(&mut self, grace: Duration) -> String {
        let Some(c) = &mut self.child else {
            return self.exit.clone().unwrap_or_else(|| "not started".into());
        };
        let deadline = Instant::now() + grace;
        let status = loop {
            match c.try_wait() {
                Ok(Some(s)) => break s.to_string(),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Ok(None) => {
                    let _ = c.kill();
                    break match c.wait() {
                        Ok(s) => format!("killed after {} ({s})", units::duration::Dur(grace)),
                        Err(e) => format!("killed, not reaped: {e}"),
                    };
                }
                Err(e) => break format!("cannot wait for it: {e}"),
            }
        };
        self.child = None;
        self.exit = Some(status.clone());
        status
    }

    /// Waits up to `grace` for the child to exit (then kills it): its
    /// status, `None` when it had to be killed or cannot be waited for.
    fn wait_status(&mut self, grace: Duration) -> Option<std::process::ExitStatus> {
        let c = self.child.as_mut()?;
        let deadline = Instant::now() + grace;
        let status = loop {
            match c.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Ok(None) => {
                    let _ = c.kill();
                    let _ = c.wait();
                    break None;
                }
                Err(_) => break None,
            }
        };
        self.exit = Some(status.map_or_else(
            || format!("killed after {}", units::duration::Dur(grace)),
            |s| s.to_string(),
        ));
        self.child = None;
        status
    }

    /// The last [`OUTPUT_TAIL`] bytes of the process's output.
    fn output_tail(&self) -> String {
        self.output
            .as_deref()
            .map(|p| tail(p, OUTPUT_TAIL))
            .unwrap_or_default()
    }
}

/// The last `max` bytes of the file at `path` (a process's output), lossy
/// UTF-8 without trailing blanks; empty when it cannot be read.
pub fn tail(path: &std::path::Path, max: u64) -> String {
    let read = || -> std::io::Result<String> {
        let mut f = File::open(path)?;
        let len = f.metadata()?.len();
        f.seek(SeekFrom::Start(len.saturating_sub(max)))?;
        let mut bytes = Vec::new();
        f.take(max).read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).trim_end().to_string())
    };
    read().unwrap_or_default()
}

/// Starts process `p` of robot `robot` at virtual time `at_ns`, its
/// output appended to `output`: the child, and the coordinator's end of
/// its link.
fn spawn_process(
    p: &crate::config::ProcessConfig,
    robot: &str,
    opts: &SimOptions,
    at_ns: u64,
    output: &std::path::Path,
) -> Result<(Child, OwnedFd), SimError> {
    let path = match &opts.bin_dir {
        Some(dir) if !p.exec.starts_with('/') => {
            dir.join(p.exec.strip_prefix("bin/").unwrap_or(&p.exec))
        }
        _ => crate::spawn::resolve_exec(&opts.prefix, &p.exec),
    };
    let link_err = |source| SimError::Link {
        name: p.name.clone(),
        source,
    };
    let (mine, theirs) = rustix::net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| link_err(e.into()))?;
    // The child's end is inherited by this child alone: it is made
    // inheritable just before the spawn and closed here right after
    // (processes are started one at a time, from this thread).
    rustix::io::fcntl_setfd(&theirs, rustix::io::FdFlags::empty())
        .map_err(|e| link_err(e.into()))?;
    let file_err = |source| SimError::Dir {
        dir: output.to_path_buf(),
        source,
    };
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(output)
        .map_err(file_err)?;
    let err = out.try_clone().map_err(file_err)?;
    let env = ProcessEnv {
        shm_dir: Some(opts.shm_dir.clone()),
        process: Some(p.name.clone()),
        robot: Some(robot.to_string()),
        sim_fd: Some(theirs.as_raw_fd()),
        sim_start_ns: Some(at_ns),
        ..ProcessEnv::default()
    };
    let cwd = p
        .working_dir
        .as_deref()
        .map(PathBuf::from)
        .unwrap_or_else(|| opts.out_dir.clone());
    let child = Command::new(&path)
        .args(&p.args)
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .envs(env.to_env())
        .envs(&p.env)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|source| SimError::Spawn {
            name: p.name.clone(),
            path: path.clone(),
            source,
        })?;
    drop(theirs);
    Ok((child, mine))
}

fn send(link: &OwnedFd, m: ToLoop) -> std::io::Result<()> {
    let n = rustix::net::send(link, &m.encode(), SendFlags::NOSIGNAL)?;
    if n != FRAME {
        return Err(std::io::Error::other(format!(
            "a frame went out as {n} bytes"
        )));
    }
    Ok(())
}

/// One packet within `timeout`: its length (0: the peer closed), `None`
/// when none came in time.
fn recv_within(
    link: &OwnedFd,
    buf: &mut [u8],
    timeout: Duration,
) -> std::io::Result<Option<usize>> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ts = rustix::time::Timespec {
            tv_sec: left.as_secs() as i64,
            tv_nsec: left.subsec_nanos() as i64,
        };
        let mut fds = [PollFd::new(link, PollFlags::IN)];
        match rustix::event::poll(&mut fds, Some(&ts)) {
            Ok(0) if left.is_zero() => return Ok(None),
            Ok(0) => continue,
            Ok(_) => break,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    loop {
        match rustix::net::recv(link, &mut *buf, RecvFlags::DONTWAIT) {
            Ok((n, _)) => return Ok(Some(n)),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Waits for a process's hello: what went wrong otherwise.
fn hello(link: &OwnedFd, timeout: Duration) -> Result<(), String> {
    let mut buf = [0u8; 2 * FRAME];
    match recv_within(link, &mut buf, timeout) {
        Ok(Some(0)) => Err(
            "it closed the simulation's link (or exited) without connecting: it does not run rtdeploy's event loop".into(),
        ),
        Ok(Some(n)) => match FromLoop::decode(&buf[..n]) {
            Ok(FromLoop::Hello { .. }) => Ok(()),
            Ok(other) => Err(format!("it sent {other:?} before its hello")),
            Err(e) => Err(format!("its hello is not one: {e}")),
        },
        Ok(None) => Err(format!(
            "no hello within {} of wall time: it does not run rtdeploy's event loop, or has not called run (--hello-timeout)",
            units::duration::Dur(timeout)
        )),
        Err(e) => Err(format!("its link: {e}")),
    }
}
