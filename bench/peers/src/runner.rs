//! Makes one run: creates our channels when the run is ours, starts the
//! receiving sides, waits until they are attached, starts the sending
//! side, collects every side's results within deadlines.

use std::time::Duration;

use anyhow::Result;

use crate::host::Host;
use crate::message::size_label;
use crate::ours;
use crate::plan::Run;
use crate::role::{Impl, Role, RoleResult, RoleSpec};
use crate::settings::{Bench, Settings};
use crate::spawn::Group;

/// How long a side may take to attach (iceoryx2 creates and locks its
/// data segments here).
const READY_WITHIN: Duration = Duration::from_secs(30);
/// Slack on top of what a run should take.
const SLACK: Duration = Duration::from_secs(30);

/// What one run measured.
#[derive(Debug)]
pub struct Outcome {
    pub run: Run,
    /// The sending side's results.
    pub sender: RoleResult,
    /// The receiving sides' results.
    pub receivers: Vec<RoleResult>,
    /// Every side's scheduling as the kernel reported it: (side, text).
    pub sched: Vec<(&'static str, String)>,
}

/// `ping-pong ours 1 KiB round 3`.
pub fn describe(run: &Run) -> String {
    let subs = if run.bench == Bench::Throughput {
        format!(" {} subscriber(s)", run.subscribers)
    } else {
        String::new()
    };
    format!(
        "{} {} {}{subs} round {}",
        run.bench.name(),
        run.imp.name(),
        size_label(run.size),
        run.round + 1
    )
}

/// The roles of a run: (receiving role, how many, sending role).
fn roles(bench: Bench, subscribers: u32) -> (Role, u32, Role) {
    match bench {
        Bench::PingPong => (Role::Pong, 1, Role::Ping),
        Bench::OneWay => (Role::WakeReceiver, 1, Role::PeriodicSender),
        Bench::Publish => (Role::IdleSubscriber, 1, Role::PublishCost),
        Bench::Throughput => (Role::Drain, subscribers, Role::BurstSender),
    }
}

/// How long the sending side may take.
fn budget(run: &Run, s: &Settings) -> Duration {
    let n = run.count + run.warmup;
    SLACK
        + match run.bench {
            Bench::PingPong => Duration::from_millis(n),
            Bench::OneWay => s.period * 3 * n as u32,
            Bench::Publish => Duration::from_micros(20 * n * s.batch),
            Bench::Throughput => Duration::from_micros(100 * n),
        }
}

/// Makes `run`.
pub fn execute(run: &Run, s: &Settings, host: &Host) -> Result<Outcome> {
    let what = describe(run);
    let base = format!(
        "/{}-{}-s{}-r{}",
        run.bench.name(),
        run.size,
        run.subscribers,
        run.round
    );
    let (recv_role, receivers, send_role) = roles(run.bench, run.subscribers);
    let channels = ours::channels(send_role, &base);
    if run.imp == Impl::Ours {
        for name in &channels {
            ours::create_channel(&host.names.ours_dir, name, run.size, s.depth)?;
        }
    }
    let spec = |role: Role, cpu: usize| RoleSpec {
        imp: run.imp,
        role,
        size: run.size,
        count: run.count,
        warmup: run.warmup,
        cpu,
        priority: host.priority,
        lock_memory: true,
        names: host.names.clone(),
        base: base.clone(),
        depth: s.depth,
        receive: s.receive,
        period_ns: s.period.as_nanos() as u64,
        batch: s.batch,
        parent: std::process::id(),
    };
    let result = (|| {
        let mut g = Group::new(what.clone());
        let mut sched = Vec::new();
        let mut rx = Vec::new();
        for i in 0..receivers {
            let label = if receivers == 1 {
                "receiving side".to_string()
            } else {
                format!("receiving side {}", i + 1)
            };
            let idx = g.spawn(&label, &spec(recv_role, s.receiver_cpu))?;
            sched.push(("receiver", g.ready(idx, READY_WITHIN)?));
            rx.push(idx);
        }
        let tx = g.spawn("sending side", &spec(send_role, s.sender_cpu))?;
        sched.push(("sender", g.ready(tx, READY_WITHIN)?));
        let within = budget(run, s);
        let sender = g.done(tx, within)?;
        if run.bench == Bench::Publish {
            for &i in &rx {
                g.close_stdin(i);
            }
        }
        let mut got = Vec::new();
        for &i in &rx {
            got.push(g.done(i, SLACK)?);
        }
        g.finish(SLACK)?;
        Ok(Outcome {
            run: run.clone(),
            sender,
            receivers: got,
            sched,
        })
    })();
    if run.imp == Impl::Ours {
        for name in &channels {
            let _ = std::fs::remove_file(controller::channel::channel_path(
                &host.names.ours_dir,
                name,
            ));
        }
    }
    result
}
