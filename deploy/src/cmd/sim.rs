//! `deploy sim [--for D] [--seed N] [--leave-out NAME].. [--unsimulated
//! refuse|leave-out] [--bin-dir DIR] [--keep DIR]`: the robot.yaml
//! processes, the real binaries, on one virtual clock
//! ([`services::sim`]): one process runs at a time, in turns a seed
//! orders, as fast as they run; no real-time scheduling, no CPU plan, no
//! privilege.
//!
//! Exit codes: 0 the run reached its end (or nothing was left to do);
//! 1 it stopped early (a turn that never ended, a process that died, a
//! livelock) or a process exited with a failure after it; 2 it could not
//! start (robot.yaml, a program, a process that cannot be simulated).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use serde::Serialize;
use services::sim::{SimOptions, SimOutcome, Unsimulated};
use units::duration::Dur;

use crate::ctx::{Ctx, Exit};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum UnsimulatedArg {
    /// The run does not start; the processes are named.
    Refuse,
    /// They are stopped and the run goes on without them.
    LeaveOut,
}

#[derive(Debug, Args)]
pub struct SimArgs {
    /// Virtual time to run for.
    #[arg(long = "for", value_name = "D", default_value = "10s", value_parser = Dur::parse)]
    pub run_for: Dur,
    /// Orders the turns due at the same virtual time: the same binaries,
    /// robot.yaml and seed give the same run.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Do not start this process (repeatable).
    #[arg(long = "leave-out", value_name = "NAME")]
    pub leave_out: Vec<String>,
    /// What to do with a process that does not run rtdeploy's event loop
    /// (it never connects to the simulation).
    #[arg(long, value_enum, default_value = "refuse")]
    pub unsimulated: UnsimulatedArg,
    /// Where the programs robot.yaml names relatively are [default: the
    /// current release's bin/ under --prefix, as the supervisor finds
    /// them].
    #[arg(long, value_name = "DIR")]
    pub bin_dir: Option<PathBuf>,
    /// Keep the run's directory (the channels and each process's output,
    /// `<name>.out`) at DIR [default: a temporary one, removed at the end].
    #[arg(long, value_name = "DIR")]
    pub keep: Option<PathBuf>,
    /// Wall time one turn may take before its process is killed and named.
    #[arg(long, value_name = "D", default_value = "10s", value_parser = Dur::parse)]
    pub turn_timeout: Dur,
    /// Record the run in FILE (MCAP, as the logger writes; it must not
    /// exist): the channels robot.yaml's `log:` picks (all, without one)
    /// and the timing reports, at their virtual times. The same binaries,
    /// robot.yaml and seed give the same bytes.
    #[arg(long, value_name = "FILE.mcap")]
    pub log: Option<PathBuf>,
    /// Replay a recorded log into the run: its channels that robot.yaml
    /// declares are published at their recorded times on the virtual
    /// clock (a simulation's log at the same virtual times, another from
    /// the run's start with the same spacing).
    #[arg(long, value_name = "FILE.mcap")]
    pub replay: Option<PathBuf>,
    /// With --replay: channels the processes under test publish, as
    /// globs (repeatable); the log's copies are published on
    /// /original<channel> instead, so that --log holds both.
    #[arg(long, value_name = "GLOB", requires = "replay")]
    pub remap: Vec<String>,
    /// Charge each turn's CPU time (on the loop's thread) to the clock: a
    /// process is busy that long, and what falls due meanwhile runs late,
    /// as its timing reports then say. Not deterministic: the output says
    /// so.
    #[arg(long)]
    pub charge_cpu: bool,
    /// The CPU the coordinator and every process run on (one runs at a
    /// time; handing a turn over on one CPU is a task switch, not a
    /// wakeup on another) [default: the lowest CPU this process may run
    /// on].
    #[arg(long, value_name = "N")]
    pub cpu: Option<u32>,
    /// Wall time a process has from its start to its event loop's run.
    #[arg(long, value_name = "D", default_value = "10s", value_parser = Dur::parse)]
    pub hello_timeout: Dur,
}

#[derive(Serialize)]
struct Report<'a> {
    robot: &'a str,
    wall_seconds: f64,
    #[serde(flatten)]
    outcome: &'a SimOutcome,
    /// The run's directory, when kept.
    dir: Option<PathBuf>,
}

pub fn run(ctx: &Ctx, args: SimArgs) -> anyhow::Result<Exit> {
    let loaded = super::load_robot(ctx)?;
    let robot = &loaded.robot;
    let temp;
    // The processes run in the run's directory: paths given relative to
    // this one are made absolute before they are handed to them.
    let abs = |p: &std::path::Path| {
        std::path::absolute(p).with_context(|| format!("cannot resolve {}", p.display()))
    };
    let dir = match &args.keep {
        Some(d) => abs(d)?,
        None => {
            temp = tempfile::Builder::new()
                .prefix("rtdeploy-sim-")
                .tempdir_in(shm_base())
                .context("cannot create the run's directory")?;
            temp.path().to_path_buf()
        }
    };
    let cpu = match args.cpu {
        Some(c) => c,
        None => units::sched::get_affinity(0)
            .ok()
            .and_then(|set| set.iter().next())
            .context("cannot read this process's CPUs (--cpu N names one)")?,
    };
    let opts = SimOptions {
        cpu: Some(cpu),
        charge_cpu: args.charge_cpu,
        seed: args.seed,
        run_for: args.run_for.0,
        turn_timeout: args.turn_timeout.0,
        hello_timeout: args.hello_timeout.0,
        leave_out: args.leave_out.clone(),
        unsimulated: match args.unsimulated {
            UnsimulatedArg::Refuse => Unsimulated::Refuse,
            UnsimulatedArg::LeaveOut => Unsimulated::LeaveOut,
        },
        bin_dir: args.bin_dir.as_deref().map(abs).transpose()?,
        prefix: abs(&ctx.prefix)?,
        shm_dir: dir.join("shm"),
        out_dir: dir.join("out"),
        proc_root: ctx.sys("/proc"),
        replay: args
            .replay
            .as_ref()
            .map(|path| services::sim::SimReplayOptions {
                path: path.clone(),
                remap: args.remap.clone(),
            }),
        log: args.log.as_ref().map(|path| services::sim::SimLogOptions {
            path: path.clone(),
            // Asked for on the command line: recorded even where
            // robot.yaml's logger is off.
            section: logbook::LogSection {
                enabled: true,
                ..robot.log.clone().unwrap_or_default()
            },
        }),
    };
    ctx.note(format_args!(
        "simulating robot {} for {} of virtual time (seed {}) on CPU {cpu} in {}",
        robot.robot.name,
        args.run_for,
        args.seed,
        dir.display()
    ));
    let wall = Instant::now();
    let outcome = services::sim::run(robot, &opts)?;
    let wall = wall.elapsed();
    // A process that ran (not one left out or not simulated, which were
    // stopped) and failed, or exited with a failure at any time, fails the
    // run.
    let failed = outcome.failure.is_some()
        || outcome.processes.iter().any(|p| {
            p.state == "failed"
                || p.failed_exits > 0
                || (matches!(p.state.as_str(), "running" | "exited" | "done")
                    && p.exit.as_deref().is_some_and(|e| !exited_well(e)))
        });
    let report = Report {
        robot: &robot.robot.name,
        wall_seconds: wall.as_secs_f64(),
        outcome: &outcome,
        dir: args.keep.clone(),
    };
    if ctx.json {
        ctx.print_json(&report)?;
    } else {
        crate::ctx::write_stdout(&render(&report, wall))?;
    }
    Ok(if failed { Exit::Failed } else { Exit::Ok })
}

/// Where the run's directory goes: `/dev/shm` (the channels are memory),
/// else the temporary directory.
fn shm_base() -> PathBuf {
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() {
        shm
    } else {
        std::env::temp_dir()
    }
}

/// An exit status that is no failure (a process told to stop returns
/// from `run` and exits).
fn exited_well(status: &str) -> bool {
    status == "exit status: 0"
}

fn render(r: &Report, wall: Duration) -> String {
    let o = r.outcome;
    let virt = Duration::from_nanos(o.end_ns.saturating_sub(o.start_ns));
    let speed = virt.as_secs_f64() / wall.as_secs_f64().max(1e-9);
    let mut s = format!(
        "simulated {} of robot {} (seed {}): {} turns at {} instants in {:.2} s of wall time ({speed:.1}x real time){}\n\n",
        Dur(virt),
        r.robot,
        o.seed,
        o.turns,
        o.instants,
        wall.as_secs_f64(),
        if o.idle { "; nothing was left to do" } else { "" }
    );
    if o.charge_cpu {
        s.push_str("CPU time charged to the clock (--charge-cpu): this run is not deterministic (CPU times vary from run to run)\n\n");
    }
    // The turns' CPU time is shown only when it was charged: otherwise
    // the report is the same from run to run.
    let cpu_head = if o.charge_cpu { " cpu (ms)" } else { "" };
    s.push_str(&format!(
        "{:<20} {:<14} {:>10} {:>10} {:>8}{cpu_head}  {}\n",
        "process", "state", "turns", "published", "restarts", "exit"
    ));
    for p in &o.processes {
        let cpu = if o.charge_cpu {
            format!(" {:>8.1}", p.cpu_ns as f64 / 1e6)
        } else {
            String::new()
        };
        s.push_str(&format!(
            "{:<20} {:<14} {:>10} {:>10} {:>8}{cpu}  {}\n",
            p.name,
            p.state,
            p.turns,
            p.published,
            p.restarts,
            p.exit.as_deref().unwrap_or("-")
        ));
    }
    for p in &o.processes {
        for h in &p.history {
            s.push_str(&format!("{}: {h}\n", p.name));
        }
        if let Some(d) = &p.detail {
            if p.state != "failed" || o.failure.is_none() {
                s.push_str(&format!("{}: {} ({d})\n", p.name, p.state));
            }
        }
    }
    if let Some(f) = &o.failure {
        s.push_str(&format!("\nthe run stopped early: {f}\n"));
    }
    for p in &o.processes {
        let Some(path) = &p.output else { continue };
        let text = services::sim::tail(path, 4096);
        let lines: Vec<&str> = text.lines().collect();
        if lines.is_empty() {
            continue;
        }
        s.push_str(&format!("\n== {} (the last lines of its output)\n", p.name));
        for l in &lines[lines.len().saturating_sub(5)..] {
            s.push_str(l);
            s.push('\n');
        }
    }
    if let Some(r) = &o.replay {
        s.push_str(&format!(
            "\nreplayed: {} messages ({}){}\n",
            r.published,
            r.channels
                .iter()
                .map(|(c, n)| {
                    let refused = if n.refused > 0 {
                        format!(", {} refused", n.refused)
                    } else {
                        String::new()
                    };
                    format!("{c}: {}{refused}", n.published)
                })
                .collect::<Vec<_>>()
                .join(", "),
            r.truncated_input
                .as_ref()
                .map(|t| format!("; the log was cut short: {t}"))
                .unwrap_or_default()
        ));
    }
    if let Some(log) = &o.log {
        let messages: u64 = log.channels.values().map(|c| c.0).sum();
        let lost: u64 = log.channels.values().map(|c| c.1).sum();
        s.push_str(&format!(
            "\nlog: {} ({messages} messages on {} channels, {lost} lost, {} events; log times are virtual times)\n",
            log.path.display(),
            log.channels.len(),
            log.events
        ));
    }
    if let Some(d) = &r.dir {
        s.push_str(&format!("\nkept: {}\n", d.display()));
    }
    s
}
