//! What one benchmark process does (its role), how it is set up, and the
//! lines it tells the parent on stdout.
//!
//! The parent spawns this same binary as `peers role '<spec as JSON>'`.
//! A role sets itself up like a real-time controller (pinned CPU,
//! SCHED_FIFO when permitted, memory locked), attaches to its channels or
//! services, prints [`Line::Ready`], runs, and prints [`Line::Done`] with
//! its figures. Protocol lines start with [`TAG`], so whatever else a
//! library prints on stdout is ignored.
#![allow(unsafe_code)]

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::{bail, Context as _, Result};
use serde::{Deserialize, Serialize};

use controller::rt;
use units::cpu::CpuSet;
use units::sched::{self, Policy, SchedAttr};

/// The start of every protocol line.
pub const TAG: &str = "@peers ";

/// The implementation a role exercises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Impl {
    /// Our channels and event loop (`controller`).
    #[serde(rename = "ours")]
    Ours,
    /// iceoryx2's `ipc` service: publish-subscribe plus an event service.
    #[serde(rename = "iceoryx2")]
    Iceoryx2,
}

impl Impl {
    pub fn name(self) -> &'static str {
        match self {
            Impl::Ours => "ours",
            Impl::Iceoryx2 => "iceoryx2",
        }
    }
}

/// What a process does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Ping-pong side A: publishes a ping, sleeps until the pong wakes it,
    /// records the round trip.
    Ping,
    /// Ping-pong side B: sleeps until a ping wakes it, publishes the pong.
    Pong,
    /// One-way: publishes at a fixed period, its send time in word 0.
    PeriodicSender,
    /// One-way: sleeps until a message wakes it, records now - send time.
    WakeReceiver,
    /// Publishes back to back in timed batches while a subscriber exists
    /// that does not wait.
    PublishCost,
    /// Attached, never waits nor reads; exits when its stdin closes.
    IdleSubscriber,
    /// Throughput: publishes `count` messages back to back.
    BurstSender,
    /// Throughput: sleeps until woken, drains everything there, counts.
    Drain,
}

/// Where the run's channels and services live (unique per run).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Names {
    /// Our channels' directory (`/dev/shm/rtdeploy-peers-<pid>`).
    pub ours_dir: PathBuf,
    /// iceoryx2's file prefix (`rtdpeers<pid>_`): its shared memory in
    /// /dev/shm starts with it.
    pub iox_prefix: String,
    /// iceoryx2's root path for its other files (`/tmp/rtdeploy-peers-<pid>/`).
    pub iox_root: String,
}

/// Everything a role process needs, passed as one JSON argument.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RoleSpec {
    pub imp: Impl,
    pub role: Role,
    /// Message bytes (one of [`crate::message::SIZES`]).
    pub size: usize,
    /// Measured iterations (round trips, wakes, batches, messages).
    pub count: u64,
    /// Unmeasured iterations before them.
    pub warmup: u64,
    pub cpu: usize,
    /// SCHED_FIFO priority; `None` leaves SCHED_OTHER.
    pub priority: Option<u32>,
    pub lock_memory: bool,
    pub names: Names,
    /// This run's channel / service base name (`/pp/8/r3`).
    pub base: String,
    /// Ring length (ours) and subscriber buffer (iceoryx2): `--depth`,
    /// or `--large-depth` for messages above 64 KiB.
    pub depth: u64,
    /// How our receivers read (iceoryx2's always read in place).
    pub receive: crate::settings::Receive,
    /// One-way: the sender's period.
    pub period_ns: u64,
    /// Publish cost: publishes per timed batch.
    pub batch: u64,
    /// The parent's pid: a role whose parent is gone exits.
    pub parent: u32,
}

/// What a role reports.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RoleResult {
    /// Round trips or wake latencies, ns, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub samples_ns: Vec<u64>,
    /// Publish cost: ns per timed batch of `batch` publishes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub batch_ns: Vec<u64>,
    /// Publish cost, iceoryx2 only: batches without the notify.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub batch_send_only_ns: Vec<u64>,
    /// Messages handled (excluding the stop message).
    pub received: u64,
    /// Messages the receiver knows it missed (overwritten before read).
    pub lost: u64,
    /// Echoes that did not match what was sent (ping-pong).
    pub mismatched: u64,
    /// Messages found by the receiver's timed look (our loop's wake check,
    /// iceoryx2's timed wait running out) because no wake came for them.
    #[serde(default)]
    pub healed: u64,
    /// Throughput sender: first and last send, ns CLOCK_MONOTONIC.
    pub start_ns: u64,
    pub end_ns: u64,
    /// Throughput receiver: when the stop message was read.
    pub last_ns: u64,
    /// Our event loop's backend, when the role ran one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
}

/// A protocol line.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Line {
    /// Attached and about to run; what the kernel says it runs with.
    Ready {
        sched: String,
    },
    Done(RoleResult),
}

/// Prints a protocol line and flushes it.
pub fn say(line: &Line) -> Result<()> {
    let text = serde_json::to_string(line).context("encoding a protocol line")?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{TAG}{text}").context("writing to the parent")?;
    out.flush().context("writing to the parent")?;
    Ok(())
}

/// Parses a protocol line, `None` for any other output.
pub fn parse(text: &str) -> Option<Result<Line>> {
    let rest = text.strip_prefix(TAG)?;
    Some(serde_json::from_str(rest).with_context(|| format!("bad protocol line {rest:?}")))
}

/// Sets the process up as the spec says and returns what it runs with,
/// as the kernel reports it: `SCHED_FIFO 80 on CPU 1, memory locked`.
pub fn setup(spec: &RoleSpec) -> Result<String> {
    // A role outlives no parent: SIGKILL when it goes, and leave now if
    // it already went.
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number and touches no
    // memory of ours.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) } != 0 {
        bail!(
            "prctl(PR_SET_PDEATHSIG) failed: {}",
            std::io::Error::last_os_error()
        );
    }
    if std::os::unix::process::parent_id() != spec.parent {
        bail!("the parent (pid {}) is gone", spec.parent);
    }
    let cpus = CpuSet::from_indices([spec.cpu])?;
    sched::set_affinity(0, &cpus).with_context(|| format!("pinning to CPU {}", spec.cpu))?;
    if let Some(p) = spec.priority {
        sched::set_attr(0, &SchedAttr::new(Policy::Fifo, p))
            .with_context(|| format!("SCHED_FIFO {p}"))?;
    }
    let memory = if spec.lock_memory {
        match rt::lock_and_prefault(256 << 10, 0) {
            Ok(()) => "memory locked".to_string(),
            Err(e) => format!("memory not locked ({e})"),
        }
    } else {
        "memory not locked".to_string()
    };
    let s = rt::sched_state().context("reading the scheduling state back")?;
    let policy = match s.policy {
        Some(Policy::Fifo) => format!("SCHED_FIFO {}", s.priority),
        Some(p) => format!("SCHED_{p:?}").to_uppercase(),
        None => "unknown policy".into(),
    };
    let cpus: Vec<String> = s.cpus.iter().map(|c| c.to_string()).collect();
    Ok(format!("{policy} on CPU {}, {memory}", cpus.join(",")))
}

/// `CLOCK_MONOTONIC` in ns.
#[inline]
pub fn now_ns() -> u64 {
    controller::Monotonic::now().as_nanos()
}

/// Sleeps until `deadline_ns` on `CLOCK_MONOTONIC` (an absolute sleep).
pub fn sleep_until(deadline_ns: u64) {
    controller::time::sleep_until(controller::time::Monotonic::from_nanos(deadline_ns));
}

/// Runs the role `spec` describes in this process.
pub fn run(spec: &RoleSpec) -> Result<()> {
    let sched = setup(spec)?;
    let ready = || {
        say(&Line::Ready {
            sched: sched.clone(),
        })
    };
    let (result, keep) = match spec.imp {
        Impl::Ours => (crate::ours::run(spec, &ready)?, None),
        Impl::Iceoryx2 => crate::iox::run(spec, &ready)?,
    };
    say(&Line::Done(result))?;
    // A sending side's ports stay open until the parent has every
    // side's results (it closes our stdin then).
    if keep.is_some() {
        wait_for_stdin_to_close();
    }
    drop(keep);
    Ok(())
}

/// Blocks until stdin closes (the idle subscriber's whole job, and the
/// end of an iceoryx2 sender's).
pub fn wait_for_stdin_to_close() {
    let mut sink = Vec::new();
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_lines_round_trip_and_other_output_is_ignored() {
        let line = Line::Done(RoleResult {
            samples_ns: vec![1, 2, 3],
            received: 3,
            ..RoleResult::default()
        });
        let text = format!("{TAG}{}", serde_json::to_string(&line).unwrap());
        match parse(&text) {
            Some(Ok(Line::Done(r))) => assert_eq!(r.samples_ns, vec![1, 2, 3]),
            other => panic!("{other:?}"),
        }
        assert!(parse("some library's log line").is_none());
        assert!(parse(&format!("{TAG}{{broken")).unwrap().is_err());
    }
}
