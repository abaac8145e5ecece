//! The order of the runs: for each benchmark and size (and subscriber
//! count), rounds of ours then iceoryx2, so that drifts of the machine
//! (another build starting, the clock ramping) hit both alike. Pure: the
//! plan is a value the tests look at.

use serde::Serialize;

use crate::role::Impl;
use crate::settings::{Bench, Settings};

/// One run: one process group measuring one side once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Run {
    pub bench: Bench,
    pub size: usize,
    /// Throughput: subscribers; 1 otherwise.
    pub subscribers: u32,
    pub round: u32,
    pub imp: Impl,
    /// Measured iterations of this run.
    pub count: u64,
    /// Unmeasured iterations before them.
    pub warmup: u64,
}

/// Unmeasured round trips at the start of each ping-pong run.
pub const PINGPONG_WARMUP: u64 = 200;
/// Unmeasured wakes at the start of each one-way run.
pub const ONEWAY_WARMUP: u64 = 50;
/// Unmeasured batches at the start of each publish run.
pub const PUBLISH_WARMUP: u64 = 5;

/// `total` split over `rounds` as evenly as whole numbers allow.
fn share(total: u64, rounds: u32, round: u32) -> u64 {
    let r = rounds as u64;
    total / r + u64::from((round as u64) < total % r)
}

/// Every run, in the order they are made.
pub fn plan(s: &Settings) -> Vec<Run> {
    let mut runs = Vec::new();
    for &bench in &s.benches {
        for &size in &s.sizes {
            let groups: Vec<u32> = match bench {
                Bench::Throughput => s.subscribers.clone(),
                _ => vec![1],
            };
            for subscribers in groups {
                let rounds = match bench {
                    Bench::Throughput => s.throughput_rounds,
                    _ => s.rounds,
                };
                for round in 0..rounds {
                    for imp in [Impl::Ours, Impl::Iceoryx2] {
                        let (count, warmup) = match bench {
                            Bench::PingPong => (share(s.pingpong, rounds, round), PINGPONG_WARMUP),
                            Bench::OneWay => (share(s.oneway, rounds, round), ONEWAY_WARMUP),
                            Bench::Publish => {
                                (share(s.publish_batches, rounds, round), PUBLISH_WARMUP)
                            }
                            Bench::Throughput => (s.throughput_messages_for(size), 0),
                        };
                        runs.push(Run {
                            bench,
                            size,
                            subscribers,
                            round,
                            imp,
                            count,
                            warmup,
                        });
                    }
                }
            }
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Flags;
    use clap::Parser as _;

    fn settings(args: &[&str]) -> Settings {
        let f =
            Flags::try_parse_from(std::iter::once("peers").chain(args.iter().copied())).unwrap();
        Settings::from_flags(&f, &[0, 1]).unwrap()
    }

    #[test]
    fn rounds_alternate_ours_and_iceoryx2() {
        let runs = plan(&settings(&[
            "--only",
            "ping-pong",
            "--sizes",
            "8",
            "--rounds",
            "3",
        ]));
        let order: Vec<(u32, Impl)> = runs.iter().map(|r| (r.round, r.imp)).collect();
        assert_eq!(
            order,
            vec![
                (0, Impl::Ours),
                (0, Impl::Iceoryx2),
                (1, Impl::Ours),
                (1, Impl::Iceoryx2),
                (2, Impl::Ours),
                (2, Impl::Iceoryx2)
            ]
        );
    }

    #[test]
    fn counts_add_up_to_what_was_asked_per_side() {
        let runs = plan(&settings(&[
            "--only",
            "ping-pong,one-way",
            "--pingpong",
            "20001",
            "--rounds",
            "10",
        ]));
        for bench in [Bench::PingPong, Bench::OneWay] {
            for size in [8, 1024, 65536] {
                for imp in [Impl::Ours, Impl::Iceoryx2] {
                    let n: u64 = runs
                        .iter()
                        .filter(|r| r.bench == bench && r.size == size && r.imp == imp)
                        .map(|r| r.count)
                        .sum();
                    let want = if bench == Bench::PingPong {
                        20001
                    } else {
                        20000
                    };
                    assert_eq!(n, want, "{bench:?} {size} {imp:?}");
                }
            }
        }
    }

    #[test]
    fn throughput_runs_each_subscriber_count() {
        let runs = plan(&settings(&[
            "--only",
            "throughput",
            "--sizes",
            "1024",
            "--throughput-rounds",
            "2",
        ]));
        let groups: Vec<(u32, u32, Impl)> = runs
            .iter()
            .map(|r| (r.subscribers, r.round, r.imp))
            .collect();
        assert_eq!(groups.len(), 8);
        assert_eq!(groups[0], (1, 0, Impl::Ours));
        assert_eq!(groups[4], (4, 0, Impl::Ours));
        assert!(runs.iter().all(|r| r.count == 100_000));
    }
}
