//! Makes one run: creates our channels when the run is ours, starts the
//! receiving sides, waits until they are attached, starts the sending
//! side, collects every side's results within deadlines. A floor run
//! starts the `floor` binary instead (see [`crate::floor`]).

use std::time::Duration;

use anyhow::Result;

use crate::host::Host;
use crate::message::size_label;
use crate::ours;
use crate::plan::{Arm, Run};
use crate::role::{Impl, Role, RoleResult, RoleSpec};
use crate::settings::{Bench, Receive, Settings};
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

/// `ping-pong ours again 1 KiB round 3`.
pub fn describe(run: &Run) -> String {
    let subs = if run.bench == Bench::Throughput {
        format!(" {} subscriber(s)", run.subscribers)
    } else {
        String::new()
    };
    format!(
        "{} {} {}{subs} round {}",
        run.bench.name(),
        run.arm.name(),
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

/// What writing one message of `size` bytes may take, ns: at 1 GB/s,
/// far slower than any machine this runs on writes memory (4 MiB: 4.2
/// ms, where this VM takes a few hundred microseconds).
fn write_ns(size: usize) -> u64 {
    size as u64
}

/// How long the sending side (or the floor) may take: per iteration what
/// a small message may take, and the writes of a large one on top.
pub fn budget(run: &Run, s: &Settings) -> Duration {
    let n = run.count + run.warmup;
    let w = write_ns(run.size);
    let per = match run.bench {
        // Two messages written per round trip.
        Bench::PingPong => 1_000_000 + 2 * w,
        Bench::OneWay => 3 * s.period_for(run.size).as_nanos() as u64 + w,
        Bench::Publish => s.batch_for(run.size) * (20_000 + w),
        Bench::Throughput => 100_000 + w,
    };
    SLACK + Duration::from_nanos(n.saturating_mul(per))
}

/// Makes `run`.
pub fn execute(run: &Run, s: &Settings, host: &Host) -> Result<Outcome> {
    let Some(imp) = run.arm.imp() else {
        return crate::floor::execute(run, s, host);
    };
    let what = describe(run);
    let base = format!(
        "/{}-{}-s{}-r{}-{}",
        run.bench.name(),
        run.size,
        run.subscribers,
        run.round,
        match run.arm {
            Arm::OursAgain => "aa",
            _ => imp.name(),
        }
    );
    let (recv_role, receivers, send_role) = roles(run.bench, run.subscribers);
    let channels = ours::channels(send_role, &base);
    if imp == Impl::Ours {
        // Held receivers take a hold record each: one per subscribing
        // process of every channel (one in ping-pong, each direction).
        let holds = if s.receive == Receive::Held {
            receivers
        } else {
            0
        };
        for name in &channels {
            ours::create_channel(
                &host.names.ours_dir,
                name,
                run.size,
                run.depth,
                holds,
                run.keep.keep(),
            )?;
        }
    }
    let spec = |role: Role, cpu: usize| RoleSpec {
        imp,
        role,
        size: run.size,
        count: run.count,
        warmup: run.warmup,
        cpu,
        priority: host.priority,
        lock_memory: true,
        names: host.names.clone(),
        base: base.clone(),
        depth: run.depth,
        receive: s.receive,
        period_ns: s.period_for(run.size).as_nanos() as u64,
        batch: s.batch_for(run.size),
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
    if imp == Impl::Ours {
        for name in &channels {
            let _ = std::fs::remove_file(controller::channel::channel_path(
                &host.names.ours_dir,
                name,
            ));
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Flags;
    use clap::Parser as _;

    #[test]
    fn budgets_grow_with_the_message_written() {
        let s = Settings::from_flags(&Flags::try_parse_from(["peers"]).unwrap(), &[0, 1]).unwrap();
        let run = |bench, size, count| Run {
            bench,
            size,
            subscribers: 1,
            round: 0,
            arm: Arm::Ours,
            count,
            warmup: 0,
            depth: s.depth_for(size),
            keep: s.keep_for(size),
        };
        // A round of 4 MiB round trips at 3 ms each fits its budget.
        let pp = budget(&run(Bench::PingPong, 4 << 20, 20_000), &s);
        assert!(pp > SLACK + Duration::from_millis(3) * 20_000, "{pp:?}");
        assert_eq!(
            budget(&run(Bench::PingPong, 8, 20_000), &s),
            SLACK + Duration::from_nanos(20_000 * 1_000_016)
        );
        // 4 MiB publishes at a millisecond each, one-way at the large period.
        let publish = budget(&run(Bench::Publish, 4 << 20, 200), &s);
        assert!(
            publish > SLACK + Duration::from_millis(200 * 8),
            "{publish:?}"
        );
        let one_way = budget(&run(Bench::OneWay, 4 << 20, 2_000), &s);
        assert!(
            one_way > SLACK + Duration::from_millis(3 * 2_000),
            "{one_way:?}"
        );
    }
}
