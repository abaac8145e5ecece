//! The engine: sets up the shared file and the channel, starts the loads,
//! runs the timer phase and the scenario (per mechanism), stops
//! everything, and builds the report.
//!
//! `workers` starts and reaps the processes, `figures` turns the
//! histograms into the report's measurements and budget results; this
//! module is the run itself, phase by phase.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::hist::Summary;
use crate::notify::Notifier;
use crate::report::{
    fmt_ns, seq_ranges, BudgetResult, CheckReport, DeliveryAccount, Measurement, MeasurementKind,
    Realtime, ScenarioFacts, Statistic,
};
use crate::tempdir::TempDir;
use crate::timer::TimerThreadSetup;
use crate::trace::run::TraceRun;
use crate::worker::{
    Shared, ACCOUNTED_SEQS, CELLS, H_DELIVERY, H_LOW_DELIVERY, H_SEND, MAX_LOW, MAX_TIMERS,
    RT_CELL, TAG_STOP,
};
use crate::{
    host, rt, CheckEnv, CheckInputs, CheckRunError, LoggerFigures, LoggerRun, Mechanism, Progress,
};
use controller::channel::{Channel, ChannelGeometry, Publisher};
use controller::rt::DmaLatencyHold;
use units::cpu::CpuSet;
use units::error::Chain;

mod figures;
mod workers;

pub use figures::*;
use workers::*;

/// `<prefix>/dev/shm/rtdeploy`: where channels live.
pub(crate) fn shm_dir(prefix: &Path) -> PathBuf {
    prefix.join(units::path::SHM_DIR.trim_start_matches('/'))
}

/// The CPUs the kernel has online (`<sysroot>/sys/devices/system/cpu/online`,
/// a list like `0-3`). Not `available_parallelism`: that counts only the
/// CPUs this process may run on, and the supervisor itself is pinned to the
/// housekeeping CPUs while the check places workers on the isolated ones.
fn online_cpus(sysroot: &Path) -> Vec<usize> {
    // A CPU list sysfs prints in one page (64 KiB pages on some arm64
    // kernels).
    let parsed = units::bounded::Bound::pseudo(64 << 10)
        .read_text(&sysroot.join("sys/devices/system/cpu/online"))
        .ok()
        .and_then(|t| units::cpu::CpuSet::parse_list(&t).ok())
        .filter(|cpus| !cpus.is_empty())
        .map(|cpus| cpus.iter().map(|c| c as usize).collect());
    parsed.unwrap_or_else(|| {
        (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect()
    })
}

pub(crate) fn run(
    inputs: &CheckInputs,
    env: &CheckEnv,
    progress: &dyn Progress,
    mode: &str,
) -> Result<CheckReport, CheckRunError> {
    let c = &inputs.check;
    if inputs.isolated.is_empty() {
        return Err(CheckRunError::NoIsolatedCpus);
    }
    if inputs.housekeeping.is_empty() {
        return Err(CheckRunError::NoHousekeepingCpus);
    }
    let online = online_cpus(&env.sysroot);
    if let Some(&cpu) = inputs
        .isolated
        .iter()
        .chain(&inputs.housekeeping)
        .find(|c| !online.contains(c))
    {
        return Err(CheckRunError::NoSuchCpu {
            cpu,
            online: online.len(),
        });
    }
    let wanted: Vec<Mechanism> = if inputs.mechanisms.is_empty() {
        vec![Mechanism::runtime()]
    } else {
        inputs.mechanisms.clone()
    };
    // The first mechanism decides the verdict: it must run. Others that
    // cannot run here are left out, and the report says why.
    let mut mechanisms = vec![];
    let mut skipped = vec![];
    for (i, &m) in wanted.iter().enumerate() {
        match m.availability() {
            Ok(()) => mechanisms.push(m),
            Err(reason) if i == 0 => {
                return Err(CheckRunError::Mechanism {
                    mechanism: m,
                    reason,
                })
            }
            Err(reason) => skipped.push(format!("{} not run: {}", m.label(), Chain(&reason))),
        }
    }
    let started_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let host = host::read_host_facts(&env.sysroot);
    let total = inputs.total_duration().max(Duration::from_millis(200));
    let timer_dur = total / 4;
    let scen_dur = total - timer_dur;
    let mut notes = inputs.notes.clone();
    notes.extend(skipped);

    // Hold the PM QoS latency request and lock memory for the whole run.
    let dma_value = inputs.cpu_dma_latency_us.unwrap_or(0);
    let dma = match DmaLatencyHold::hold(&env.sysroot.join("dev/cpu_dma_latency"), dma_value) {
        Ok(h) => Some(h),
        Err(e) => {
            notes.push(format!(
                "cpu_dma_latency not held at {dma_value}us: {}",
                Chain(&e)
            ));
            None
        }
    };
    let parent_locked = rt::lock_memory();

    let sender_cpu = inputs.isolated[0];
    let receiver_cpu = *inputs.isolated.get(1).unwrap_or(&inputs.isolated[0]);
    // Before the workers: dropped after them (an instance a worker still
    // holds a file of cannot be removed).
    let mut tracing = inputs.trace.as_ref().map(|req| {
        TraceRun::start(
            req,
            inputs,
            &env.sysroot,
            sender_cpu,
            receiver_cpu,
            &inputs.isolated,
        )
    });
    if let Some(t) = &tracing {
        notes.extend(t.notes());
    }

    // The shared file and the channel.
    let pid = std::process::id();
    let dir = shm_dir(&env.prefix);
    let shared_path = dir.join(format!("rtdeploy/check/p{pid}.ctl"));
    let channel_name = format!("/rtdeploy/check/p{pid}");
    let setup_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CheckRunError::Setup { path, source }
    };
    let shared = Shared::create(&shared_path).map_err(setup_err(&shared_path))?;
    let low_n = (c.low_priority.processes as usize).min(MAX_LOW);
    let rate = 1e9 / c.period.as_nanos().max(1) as f64
        + low_n as f64 * 1e9 / c.low_priority.period.as_nanos().max(1) as f64;
    let queue_len = ((rate * 0.1) as u64 + 2).next_power_of_two().max(64);
    let entries = 4 + 2 * low_n as u32;
    let geom = ChannelGeometry::new(64, queue_len, entries).with_subscribers(entries);
    let proc_root = env.sysroot.join("proc");
    let (channel, _) = match Channel::create(&dir, &channel_name, &geom, None, &proc_root) {
        Ok(x) => x,
        Err(e) => {
            let _ = std::fs::remove_file(&shared_path);
            return Err(CheckRunError::Channel(e));
        }
    };
    let channel_path = channel.path().to_path_buf();
    let stopper = match channel.publisher(&proc_root) {
        Ok(p) => p,
        Err(e) => {
            let _ = std::fs::remove_file(&shared_path);
            let _ = std::fs::remove_file(&channel_path);
            return Err(CheckRunError::Attach(e));
        }
    };
    drop(channel);
    let mut run = Run {
        env,
        shared,
        shared_path,
        channel_name,
        channel_path,
        io_dir: None,
        loads: vec![],
        low: (0..low_n).map(|_| None).collect(),
        retired: vec![],
        low_flip: vec![0; low_n],
        stopper,
    };
    let hk = cpu_list(&inputs.housekeeping);

    // Loads on the housekeeping CPUs.
    for i in 0..c.bursts.threads as usize {
        let cpu = inputs.housekeeping[i % inputs.housekeeping.len()];
        let w = run.spawn(
            "burst",
            &[
                format!("cpu={cpu}"),
                format!("priority={}", c.bursts.priority),
                format!("min_ns={}", c.bursts.min.as_nanos()),
                format!("max_ns={}", c.bursts.max.as_nanos()),
            ],
        )?;
        run.loads.push(w);
    }
    for i in 0..c.cpu_load as usize {
        let cpu = inputs.housekeeping[i % inputs.housekeeping.len()];
        let w = run.spawn("hog", &[format!("cpu={cpu}")])?;
        run.loads.push(w);
    }
    if c.io_load > 0 {
        let base = env.prefix.join("var/tmp");
        let d = TempDir::new(&base, &format!("rtdeploy-check-{pid}")).map_err(setup_err(&base))?;
        for _ in 0..c.io_load {
            let w = run.spawn(
                "io",
                &[format!("cpu={hk}"), format!("dir={}", d.path().display())],
            )?;
            run.loads.push(w);
        }
        run.io_dir = Some(d);
    }

    let rounds = if inputs.trace_compare || inputs.log_compare.is_some() {
        1
    } else {
        inputs.rounds.max(1) as usize
    };
    let aa_runs = inputs.aa_reference.is_some_and(|r| mechanisms.contains(&r)) as u32;
    let n_phases = 1 + mechanisms.len() as u32 + aa_runs;
    let whole = timer_dur + scen_dur * (n_phases - 1);
    let t_start = Instant::now();
    let frac = |t0: Instant| t0.elapsed().as_secs_f64() / whole.as_secs_f64();

    // Timer phase (with the loads, without the real-time pair): one worker
    // process per isolated CPU, each in the cgroup of its CPU.
    if inputs.isolated.len() > MAX_TIMERS {
        return Err(CheckRunError::TooManyIsolated {
            count: inputs.isolated.len(),
            max: MAX_TIMERS,
        });
    }
    let mut timers = vec![];
    let mut trace_problems: Vec<String> = vec![];
    for (slot, &cpu) in inputs.isolated.iter().enumerate() {
        let mut args = vec![
            format!("slot={slot}"),
            format!("cpu={cpu}"),
            format!("priority={}", c.priority),
            format!("period_ns={}", c.period.0.as_nanos().max(1)),
        ];
        args.extend(tracing.as_ref().map_or(vec![], |t| t.timer_args()));
        timers.push(run.spawn("timer", &args)?);
    }
    if let Some(t) = &tracing {
        t.arm(run.shared.control());
    }
    let timer_worst = |run: &Run| {
        (0..inputs.isolated.len())
            .map(|slot| run.shared.timer_hist(slot).live().1)
            .max()
            .unwrap_or(0)
    };
    let phase_end = Instant::now() + timer_dur;
    while Instant::now() < phase_end {
        std::thread::sleep(
            Duration::from_millis(100).min(phase_end.saturating_duration_since(Instant::now())),
        );
        progress.update("timer latency", frac(t_start), timer_worst(&run));
        for w in run.loads.iter_mut().chain(timers.iter_mut()) {
            Run::check_alive(w)?;
        }
        if let Some(t) = tracing.as_mut() {
            trace_problems.extend(t.poll(run.shared.control(), None, true));
        }
    }
    if let Some(t) = tracing.as_mut() {
        // A miss in the last moments of the phase.
        trace_problems.extend(t.poll(run.shared.control(), None, false));
        t.disarm(run.shared.control());
    }
    run.shared.control().timer_stop.store(1, Ordering::SeqCst);
    for w in timers {
        finish(w, Duration::from_secs(2))?;
    }
    let ctl = run.shared.control();
    let (pinned, fifo) = (
        ctl.timer_pinned.load(Ordering::SeqCst),
        ctl.timer_fifo.load(Ordering::SeqCst),
    );
    let setups: Vec<TimerThreadSetup> = inputs
        .isolated
        .iter()
        .enumerate()
        .map(|(slot, &cpu)| TimerThreadSetup {
            cpu,
            pinned: pinned & (1 << slot) != 0,
            fifo: fifo & (1 << slot) != 0,
        })
        .collect();
    let timer_fifo = setups.iter().all(|s| s.fifo);
    for s in setups.iter().filter(|s| !s.pinned) {
        notes.push(format!(
            "timer cpu{0}: the measuring process could not be pinned to CPU {0}; its figures come from the CPUs it was allowed",
            s.cpu
        ));
    }
    let mut measurements = vec![];
    for (slot, s) in setups.iter().enumerate() {
        measurements.push(Measurement::new(
            format!("timer cpu{}", s.cpu),
            MeasurementKind::Timer,
            None,
            Some(s.cpu),
            run.shared.timer_hist(slot).summary(),
        ));
    }

    // The census (see [`crate::census`]): from here to the end, with its
    // positive control first.
    let census = if inputs.census {
        match crate::census::Census::start(&env.sysroot.join("sys"), &proc_root) {
            Ok(c) => Some(c),
            Err(e) => {
                notes.push(format!("no census: {}", Chain(&e)));
                None
            }
        }
    } else {
        None
    };
    let census_off = (inputs.census && census.is_none()).then(|| {
        notes
            .iter()
            .rev()
            .find(|n| n.starts_with("no census:"))
            .cloned()
            .unwrap_or_default()
    });
    if let Some(cs) = &census {
        pi_control(&mut run, cs, inputs, &hk, receiver_cpu)?;
    }

    // The scenario, once per mechanism.
    let churn = c.low_priority.churn.0.max(Duration::from_millis(10));
    let mut gen = 0u64;
    let mut accounting = vec![];
    // The phases: each mechanism, traced when tracing runs; with
    // `trace_compare`, the deciding mechanism untraced, then traced (the
    // tracer's cost on the same run's figures).
    let tracing_on = tracing.as_ref().is_some_and(|t| t.enabled());
    let compare_trace = inputs.trace_compare && tracing_on;
    if inputs.trace_compare && !tracing_on {
        notes.push("no tracing overhead figure: tracing did not run".into());
    }
    // `log_compare`: the deciding mechanism without, then with the logger.
    let phases: Vec<(usize, Mechanism, bool, bool)> = if compare_trace {
        vec![
            (0, mechanisms[0], false, false),
            (0, mechanisms[0], true, false),
        ]
    } else if inputs.log_compare.is_some() {
        vec![
            (0, mechanisms[0], tracing_on, false),
            (0, mechanisms[0], tracing_on, true),
        ]
    } else {
        // In rounds (the harness, see [`crate::harness`]): each round runs
        // every mechanism, in an order rotated round by round, plus the
        // reference a second time for the A/A floor.
        let mut arms: Vec<(usize, Mechanism, bool)> = mechanisms
            .iter()
            .enumerate()
            .map(|(mi, &m)| (mi, m, false))
            .collect();
        if let Some(ri) = inputs
            .aa_reference
            .and_then(|r| mechanisms.iter().position(|&m| m == r))
        {
            arms.push((ri, mechanisms[ri], true));
        }
        (0..rounds)
            .flat_map(|r| {
                crate::harness::order(arms.len(), r)
                    .into_iter()
                    .map(|i| arms[i])
                    .collect::<Vec<_>>()
            })
            .map(|(mi, m, aa)| (mi, m, tracing_on, aa))
            .collect()
    };
    let phase_dur = if compare_trace || inputs.log_compare.is_some() {
        scen_dur
    } else {
        scen_dur / rounds as u32
    };
    // What the phases measured, merged per measurement (a mechanism run
    // in several rounds is one measurement), in the order first run.
    let mut merged: Vec<Merged> = vec![];
    let mut per_round: Vec<crate::harness::Arm> = vec![];
    let mut publish_arms: Vec<crate::harness::Arm> = vec![];
    let mut logger_note: Option<String> = None;
    for (phase_i, &(mi, mech, traced, flag)) in phases.iter().enumerate() {
        // `flag`: the logged run with `log_compare`, the A/A run of the
        // reference otherwise.
        let logged = inputs.log_compare.is_some() && flag;
        let aa = inputs.log_compare.is_none() && flag;
        let round = if compare_trace || inputs.log_compare.is_some() {
            0
        } else {
            phase_i / phases.len().div_ceil(rounds).max(1)
        };
        // The traced (or logged) phase of a comparison is shown beside the
        // plain one, under its own measurement names; it does not decide.
        let (suffix, shown_only) = if compare_trace && traced {
            (" (traced)", true)
        } else if logged {
            (" (logged)", true)
        } else if aa {
            (" (A/A)", true)
        } else {
            ("", mi > 0)
        };
        // No worker runs between phases: each phase's histograms start
        // empty, and the phases of one measurement are merged below.
        for which in [H_SEND, H_DELIVERY, H_LOW_DELIVERY] {
            run.shared.hist(mech, which).reset();
        }
        let failed_before = run.shared.control().notify_failed.load(Ordering::SeqCst);
        if let Some(cs) = &census {
            cs.phase(&format!("{}{suffix}", mech.short()));
        }
        let phase = (|| -> Result<(), CheckRunError> {
            let ctl = run.shared.control();
            ctl.rt_stop.store(0, Ordering::SeqCst);
            ctl.rt_recv_stop.store(0, Ordering::SeqCst);
            ctl.rt_recv_done.store(0, Ordering::SeqCst);
            ctl.rt_recv_ended_ns.store(0, Ordering::SeqCst);
            ctl.rt_healed.store(0, Ordering::SeqCst);
            ctl.receiver_ready.store(0, Ordering::SeqCst);
            run.shared.clear_marks();
            // Fresh low-priority processes on this mechanism.
            let low_args = |slot: usize, gen: u64, cell: usize| {
                vec![
                    format!("cpu={hk}"),
                    format!("mech={}", mech.short()),
                    format!("slot={slot}"),
                    format!("gen={gen}"),
                    format!("cell={cell}"),
                    format!("period_ns={}", c.low_priority.period.as_nanos()),
                ]
            };
            for slot in 0..low_n {
                gen += 1;
                run.shared.control().low_gen[slot].store(gen, Ordering::SeqCst);
                let cell = run.low_cell(slot);
                let w = run.spawn("low", &low_args(slot, gen, cell))?;
                if let Some(old) = run.low[slot].replace(w) {
                    run.retired.push(old);
                }
            }
            // The census's hammer on the best-effort word, for this phase.
            let mut hammer = if inputs.hammer > 0 {
                let g = run.shared.control().hammer_gen.load(Ordering::SeqCst);
                Some(run.spawn(
                    "hammer",
                    &[
                        format!("cpu={hk}"),
                        format!("gen={g}"),
                        format!("threads={}", inputs.hammer),
                    ],
                )?)
            } else {
                None
            };
            let rt_args = |cpu: usize| {
                vec![
                    format!("cpu={cpu}"),
                    format!("cell={RT_CELL}"),
                    format!("mech={}", mech.short()),
                    format!("priority={}", c.priority),
                    format!("period_ns={}", c.period.as_nanos()),
                ]
            };
            let trace_args = |receiver: bool| match &tracing {
                Some(t) if traced => t.worker_args(receiver),
                _ => vec![],
            };
            let mut recv_args = rt_args(receiver_cpu);
            recv_args.extend(trace_args(true));
            let mut recv = run.spawn("rt-recv", &recv_args)?;
            // A watchdog for a hung worker, not a timing figure: wide
            // enough for a first start under emulation on a loaded host
            // (in the x86 end-to-end boot, the PID 1 boot check's receiver
            // was once not ready within 10 s).
            let ready_by = Instant::now() + RECEIVER_READY_WITHIN;
            // Acquire: pairs with the receiver's Release store.
            while run.shared.control().receiver_ready.load(Ordering::Acquire) == 0 {
                Run::check_alive(&mut recv)?;
                if Instant::now() > ready_by {
                    recv.kill_and_reap();
                    return Err(worker_failed(
                        &mut recv,
                        format!("not ready after {}s", RECEIVER_READY_WITHIN.as_secs()),
                    ));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            if let Some(t) = tracing.as_ref().filter(|_| traced) {
                t.arm(run.shared.control());
            }
            // The logger, as the supervisor runs it, on the housekeeping
            // CPUs, from the next message on.
            let logger = match inputs.log_compare.as_ref().filter(|_| logged) {
                Some(logger) => {
                    // On the robot's log disk (not the shm tmpfs): the
                    // writes and syncs cost what they cost there.
                    let parent = run.env.prefix.join("var/log/rtdeploy");
                    let dir =
                        crate::tempdir::TempDir::unique(&parent, "check-log").map_err(|e| {
                            CheckRunError::Setup {
                                path: parent.clone(),
                                source: e,
                            }
                        })?;
                    let setup = |source| CheckRunError::Setup {
                        path: dir.path().to_path_buf(),
                        source,
                    };
                    let cpus = CpuSet::from_indices(inputs.housekeeping.iter().copied())
                        .map_err(|e| setup(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
                    let rec = logger
                        .start(&LoggerRun {
                            dir: dir.path(),
                            shm_dir: &shm_dir(&run.env.prefix),
                            channel: &run.channel_name,
                            cpus: &cpus,
                        })
                        .map_err(setup)?;
                    Some((rec, dir))
                }
                None => None,
            };
            let mut send_args = rt_args(sender_cpu);
            send_args.extend(trace_args(false));
            let mut send = run.spawn("rt-send", &send_args)?;
            let (send_pid, recv_pid) = (send.child.id(), recv.child.id());
            let phase_start = Instant::now();
            let phase_end = phase_start + phase_dur;
            // Staggered churn: slot i is replaced at churn * (k + (i+1)/n).
            let mut next_churn: Vec<Instant> = (0..low_n)
                .map(|i| phase_start + churn.mul_f64((i + 1) as f64 / low_n.max(1) as f64))
                .collect();
            while Instant::now() < phase_end {
                // Tracing: look for a miss to snapshot more often, so the
                // instance is stopped for less time.
                let tick = if tracing.is_some() { 10 } else { 50 };
                std::thread::sleep(
                    Duration::from_millis(tick)
                        .min(phase_end.saturating_duration_since(Instant::now())),
                );
                let worst = run.shared.hist(mech, H_DELIVERY).live().1;
                progress.update(
                    &format!("scenario ({}{suffix})", mech.short()),
                    frac(t_start),
                    worst,
                );
                Run::check_alive(&mut recv)?;
                Run::check_alive(&mut send)?;
                if let Some(t) = tracing.as_mut().filter(|_| traced) {
                    let pair = Some((mech, send_pid, recv_pid));
                    if let Some(p) = t.poll(run.shared.control(), pair, true) {
                        trace_problems.push(p);
                    }
                }
                for w in run.loads.iter_mut() {
                    Run::check_alive(w)?;
                }
                let now = Instant::now();
                for (slot, due) in next_churn.iter_mut().enumerate() {
                    if now >= *due {
                        *due += churn;
                        gen += 1;
                        // Start the new one first, then let the old one go.
                        let new_gen = gen;
                        let cell = run.low_cell(slot);
                        let w = run.spawn("low", &low_args(slot, new_gen, cell))?;
                        run.shared.control().low_gen[slot].store(new_gen, Ordering::SeqCst);
                        run.poke();
                        if let Some(old) = run.low[slot].replace(w) {
                            run.retired.push(old);
                        }
                    }
                }
                run.reap_retired(false);
            }
            // The sender first; then the receiver, told to stop only once
            // every real-time message is in the channel, so that the stop
            // message it handles comes after all of them.
            run.shared.control().rt_stop.store(1, Ordering::SeqCst);
            finish(send, Duration::from_secs(2))?;
            run.shared.control().rt_recv_stop.store(1, Ordering::SeqCst);
            run.poke();
            run.release_cell(&recv);
            finish(recv, Duration::from_secs(2))?;
            if let Some((rec, dir)) = logger {
                let st = rec.stop();
                logger_note = Some(logger_cost(&st, dir.path()));
            }
            if let Some(t) = tracing.as_mut().filter(|_| traced) {
                // A miss in the last moments of the phase.
                let pair = Some((mech, send_pid, recv_pid));
                if let Some(p) = t.poll(run.shared.control(), pair, false) {
                    trace_problems.push(p);
                }
                t.disarm(run.shared.control());
            }
            let sh = &run.shared;
            let delivery = sh.hist(mech, H_DELIVERY).summary();
            let (unseen, sent_marked) = sh.unseen();
            let reached = sh.control().rt_recv_done.load(Ordering::SeqCst) != 0;
            let sent = sh.hist(mech, H_SEND).summary().count;
            let unaccounted = if reached {
                // Every real-time message not seen was passed: it must
                // have been counted lost.
                (unseen.len() as u64).saturating_sub(delivery.errors)
            } else {
                unseen.len() as u64
            };
            let account = DeliveryAccount {
                mechanism: mech,
                sent,
                delivered: delivery.count,
                lost: delivery.errors,
                receiver_reached_end: reached,
                unaccounted,
                missing: if unaccounted > 0 {
                    seq_ranges(&unseen, 12)
                } else {
                    String::new()
                },
                beyond_range: sent.saturating_sub(sent_marked),
                informational: shown_only,
                run: (!suffix.is_empty()).then(|| {
                    suffix
                        .trim_matches(|c| c == ' ' || c == '(' || c == ')')
                        .to_string()
                }),
                found_without_wake: sh.control().rt_healed.load(Ordering::SeqCst),
            };
            let label = format!("{}{suffix}", mech.short());
            let send = sh.hist(mech, H_SEND).summary();
            let arm = match per_round.iter().position(|a| a.name == label) {
                Some(i) => i,
                None => {
                    per_round.push(crate::harness::Arm {
                        name: label.clone(),
                        rounds: vec![None; rounds],
                    });
                    per_round.len() - 1
                }
            };
            if let Some(slot) = per_round[arm].rounds.get_mut(round) {
                *slot = (delivery.count > 0).then(|| delivery.quantile(0.5) as f64);
            }
            let m = match merged
                .iter()
                .position(|m| m.mech == mech && m.suffix == suffix)
            {
                Some(i) => &mut merged[i],
                None => {
                    merged.push(Merged {
                        mech,
                        suffix,
                        account: None,
                        send: Summary::empty(),
                        delivery: Summary::empty(),
                        low: Summary::empty(),
                    });
                    merged.last_mut().expect("just pushed")
                }
            };
            m.send.merge(&send);
            m.delivery.merge(&delivery);
            m.add_account(account);
            // Low-priority processes still running write into this
            // mechanism's histogram; they are replaced at the next phase.
            // The census's phase is the real-time pair's: it ends when the
            // receiver's loop stopped, before the receiver released its
            // words. A low-priority process started by the last churn may
            // claim a released bell (or get a ring's memory) afterwards:
            // a word used by one class after the other, never by both at
            // once, is no shared word.
            if let Some(cs) = &census {
                match sh.control().rt_recv_ended_ns.load(Ordering::SeqCst) {
                    0 => cs.end_phase(),
                    ns => cs.end_phase_at(ns),
                }
            }
            if let Some(h) = hammer.take() {
                run.shared
                    .control()
                    .hammer_gen
                    .fetch_add(1, Ordering::SeqCst);
                finish(h, Duration::from_secs(5))?;
            }
            let lows: Vec<Worker> = run.low.iter_mut().filter_map(|w| w.take()).collect();
            for slot in 0..low_n {
                gen += 1;
                run.shared.control().low_gen[slot].store(gen, Ordering::SeqCst);
            }
            run.poke();
            for w in lows {
                run.release_cell(&w);
                finish(w, Duration::from_secs(2))?;
            }
            run.reap_retired(true);
            let low = run.shared.hist(mech, H_LOW_DELIVERY).summary();
            if let Some(m) = merged
                .iter_mut()
                .find(|m| m.mech == mech && m.suffix == suffix)
            {
                m.low.merge(&low);
            }
            Ok(())
        })();
        // The last phase of a round: the cost of a publish with no waiter,
        // real-time (the wake classes' path) against best-effort (the
        // path as before them) and best-effort again (A/A), in turn.
        let round_ends = !compare_trace
            && inputs.log_compare.is_none()
            && rounds > 1
            && (phase_i + 1) % phases.len().div_ceil(rounds).max(1) == 0;
        if round_ends {
            let costs = crate::bench::publish_costs(&run.env.prefix, &proc_root, round);
            for (i, (name, ns)) in costs.into_iter().enumerate() {
                if publish_arms.len() <= i {
                    publish_arms.push(crate::harness::Arm {
                        name: name.into(),
                        rounds: vec![None; rounds],
                    });
                }
                publish_arms[i].rounds[round] = ns;
            }
        }
        match phase {
            Ok(()) => {}
            // The deciding mechanism must run; a compared one that
            // failed is reported and the comparison goes on.
            Err(e) if mi == 0 && !shown_only => return Err(e),
            Err(e) => notes.push(format!("{} failed: {e}", mech.label())),
        }
        let ctl = run.shared.control();
        let failed = ctl.notify_failed.load(Ordering::SeqCst) - failed_before;
        if failed > 0 {
            let errno = ctl.notify_errno.load(Ordering::SeqCst) as i32;
            notes.push(format!(
                "{}: {failed} wake notifications failed (last error: {}); a message whose wake failed waits for the receiver's next wake",
                mech.label(),
                std::io::Error::from_raw_os_error(errno)
            ));
        }
    }
    progress.update("done", 1.0, 0);
    let ctl = run.shared.control();
    let fifo_refused = ctl.fifo_refused.load(Ordering::SeqCst);
    let mlock_failed = ctl.mlock_failed.load(Ordering::SeqCst);
    let low_started = ctl.low_started.load(Ordering::SeqCst);
    let trace = tracing.as_ref().map(|t| t.summary(ctl));
    trace_problems.dedup();
    notes.extend(
        trace_problems
            .into_iter()
            .take(4)
            .map(|p| format!("a traced miss was not saved: {p}")),
    );
    drop(run);
    drop(tracing.take());
    let _ = t_start;
    for m in merged {
        let cpu_s = Some(sender_cpu);
        measurements.push(Measurement::new(
            format!("send{}", m.suffix),
            MeasurementKind::Send,
            Some(m.mech),
            cpu_s,
            m.send,
        ));
        measurements.push(Measurement::new(
            format!("delivery{}", m.suffix),
            MeasurementKind::Delivery,
            Some(m.mech),
            Some(receiver_cpu),
            m.delivery,
        ));
        measurements.push(Measurement::new(
            format!("low-priority delivery{}", m.suffix),
            MeasurementKind::LowPriorityDelivery,
            Some(m.mech),
            None,
            m.low,
        ));
        accounting.extend(m.account);
    }
    // The harness's ratios: each mechanism's delivery p50 over the
    // reference's, with the reference's A/A floor.
    let mut ratios = vec![];
    if let Some(reference) = inputs.aa_reference.filter(|_| rounds > 1) {
        let den = per_round.iter().find(|a| a.name == reference.short());
        let aa = per_round
            .iter()
            .find(|a| a.name == format!("{} (A/A)", reference.short()));
        if let Some(den) = den {
            for num in per_round
                .iter()
                .filter(|a| !std::ptr::eq(*a, den) && !a.name.ends_with("(A/A)"))
            {
                ratios.extend(crate::harness::Ratio::of("delivery p50", num, den, aa));
            }
        }
    }
    let mut differences = vec![];
    if let [rt, be, be_again] = &publish_arms[..] {
        differences.extend(crate::harness::Difference::of(
            "publish 8 B, no waiter (mean ns)",
            rt,
            be,
            Some(be_again),
        ));
    }
    for r in &ratios {
        notes.push(r.line());
    }
    for d in &differences {
        notes.push(d.line("ns"));
    }

    let sched_fifo = timer_fifo && fifo_refused == 0;
    let realtime = Realtime {
        sched_fifo,
        memory_locked: parent_locked && mlock_failed == 0,
        cpu_dma_latency_held_us: dma.as_ref().map(|d| d.value_us()),
        warning: (!sched_fifo).then(|| {
            "SCHED_FIFO was refused (run as root or with CAP_SYS_NICE and an RLIMIT_RTPRIO): the measuring threads ran at normal priority, so these figures are NOT real-time figures".to_string()
        }),
    };
    drop(dma);
    let scenario = ScenarioFacts {
        robot: inputs.robot.clone(),
        mode: mode.into(),
        duration_ns: (timer_dur + scen_dur).as_nanos() as u64,
        timer_duration_ns: timer_dur.as_nanos() as u64,
        scenario_duration_ns: scen_dur.as_nanos() as u64,
        period_ns: c.period.as_nanos(),
        priority: c.priority,
        isolated: inputs.isolated.clone(),
        housekeeping: inputs.housekeeping.clone(),
        sender_cpu: Some(sender_cpu),
        receiver_cpu: Some(receiver_cpu),
        low_priority_processes: low_n as u32,
        low_priority_period_ns: c.low_priority.period.as_nanos(),
        churn_ns: churn.as_nanos() as u64,
        low_priority_started: low_started,
        burst_threads: c.bursts.threads,
        burst_priority: c.bursts.priority,
        burst_min_ns: c.bursts.min.as_nanos(),
        burst_max_ns: c.bursts.max.as_nanos(),
        cpu_load: c.cpu_load,
        io_load: c.io_load,
        mechanisms: mechanisms.clone(),
    };
    if compare_trace {
        notes.extend(overhead_note(
            &measurements,
            mechanisms[0],
            ("untraced", "traced"),
            "tracing overhead",
        ));
    }
    if inputs.log_compare.is_some() {
        notes.extend(overhead_note(
            &measurements,
            mechanisms[0],
            ("not logged", "logged"),
            "logger overhead",
        ));
        notes.extend(logger_note);
    }
    let budgets = evaluate_budgets(inputs, &mechanisms, &measurements);
    for a in accounting.iter().filter(|a| a.beyond_range > 0) {
        notes.push(format!(
            "{}: {} real-time messages were sent beyond the first {ACCOUNTED_SEQS} and are not accounted one by one",
            a.mechanism.label(),
            a.beyond_range
        ));
    }
    let mut report = CheckReport {
        schema_version: crate::CHECK_SCHEMA_VERSION,
        started_unix,
        host,
        realtime,
        scenario,
        measurements,
        budgets,
        accounting,
        verdict: String::new(),
        failed: vec![],
        notes,
        trace,
        ratios,
        differences,
        census: census.map(|c| c.finish()).or_else(|| {
            census_off.map(|why| crate::census::CensusReport {
                enabled: false,
                reason: Some(why),
                ..Default::default()
            })
        }),
    };
    report.decide();
    Ok(report)
}
