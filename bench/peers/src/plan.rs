//! The order of the runs: for each benchmark and size (and subscriber
//! count), rounds in which every arm runs once (ours, iceoryx2, ours
//! again, and the floor with `--floor`), the order rotated round by round
//! ([`check::harness::order`]), so that drifts of the machine (another
//! build starting, the clock ramping) hit every arm alike and each runs
//! first equally often. Pure: the plan is a value the tests look at.

use check::harness;
use serde::Serialize;

use crate::role::Impl;
use crate::settings::{Bench, Settings};

/// What one run of a round measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Arm {
    /// Our channels and event loop.
    Ours,
    /// iceoryx2.
    Iceoryx2,
    /// Ours measured a second time in the same round: the A/A control.
    /// Its ratio to [`Arm::Ours`] is what two measurements of the same
    /// thing differ by on this machine.
    OursAgain,
    /// Ping-pong with `--floor`: the bare futex ping-pong of the `floor`
    /// binary, no channel and no event loop.
    Floor,
}

impl Arm {
    pub fn name(self) -> &'static str {
        match self {
            Arm::Ours => "ours",
            Arm::Iceoryx2 => "iceoryx2",
            Arm::OursAgain => "ours again",
            Arm::Floor => "floor",
        }
    }

    /// The implementation whose role processes the arm runs (`None`: the
    /// floor, a program of its own).
    pub fn imp(self) -> Option<Impl> {
        match self {
            Arm::Ours | Arm::OursAgain => Some(Impl::Ours),
            Arm::Iceoryx2 => Some(Impl::Iceoryx2),
            Arm::Floor => None,
        }
    }
}

/// One run: one process group measuring one arm once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Run {
    pub bench: Bench,
    pub size: usize,
    /// Throughput: subscribers; 1 otherwise.
    pub subscribers: u32,
    pub round: u32,
    pub arm: Arm,
    /// Measured iterations of this run.
    pub count: u64,
    /// Unmeasured iterations before them.
    pub warmup: u64,
    /// Ring length of our channels, subscriber buffer of iceoryx2's, ring
    /// of the floor (see `Settings::floor_depth_for`).
    pub depth: u64,
    /// What our channels keep once read.
    pub keep: crate::settings::KeepArg,
}

/// The arms of every round of `bench`, in their canonical order (the
/// order of round 0).
pub fn arms(bench: Bench, s: &Settings) -> Vec<Arm> {
    let mut v = vec![Arm::Ours, Arm::Iceoryx2, Arm::OursAgain];
    if s.floor && bench == Bench::PingPong {
        v.push(Arm::Floor);
    }
    v
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
            let arms = arms(bench, s);
            for subscribers in groups {
                let rounds = match bench {
                    Bench::Throughput => s.throughput_rounds,
                    _ => s.rounds,
                };
                for round in 0..rounds {
                    for i in harness::order(arms.len(), round as usize) {
                        let arm = arms[i];
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
                            arm,
                            count,
                            warmup,
                            depth: if arm == Arm::Floor {
                                s.floor_depth_for(size)
                            } else {
                                s.depth_for(size)
                            },
                            keep: s.keep_for(size),
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
    use crate::settings::{Flags, KeepArg};
    use clap::Parser as _;

    fn settings(args: &[&str]) -> Settings {
        let f =
            Flags::try_parse_from(std::iter::once("peers").chain(args.iter().copied())).unwrap();
        Settings::from_flags(&f, &[0, 1]).unwrap()
    }

    #[test]
    fn every_round_runs_each_arm_once_in_a_rotated_order() {
        let runs = plan(&settings(&[
            "--only",
            "ping-pong",
            "--sizes",
            "8",
            "--rounds",
            "3",
        ]));
        let order: Vec<(u32, Arm)> = runs.iter().map(|r| (r.round, r.arm)).collect();
        use Arm::*;
        assert_eq!(
            order,
            vec![
                (0, Ours),
                (0, Iceoryx2),
                (0, OursAgain),
                (1, Iceoryx2),
                (1, OursAgain),
                (1, Ours),
                (2, OursAgain),
                (2, Ours),
                (2, Iceoryx2),
            ]
        );
        assert_eq!(OursAgain.imp(), Some(Impl::Ours));
        assert_eq!(Floor.imp(), None);
    }

    #[test]
    fn the_floor_is_an_arm_of_ping_pong_rounds_only() {
        let runs = plan(&settings(&[
            "--only",
            "ping-pong,one-way",
            "--sizes",
            "8,4194304",
            "--rounds",
            "4",
            "--floor",
        ]));
        for bench in [Bench::PingPong, Bench::OneWay] {
            for round in 0..4 {
                let arms: Vec<Arm> = runs
                    .iter()
                    .filter(|r| r.bench == bench && r.size == 8 && r.round == round)
                    .map(|r| r.arm)
                    .collect();
                let want = if bench == Bench::PingPong { 4 } else { 3 };
                assert_eq!(arms.len(), want, "{bench:?} round {round}");
                // Each arm leads one round of four.
                if bench == Bench::PingPong {
                    assert_eq!(
                        arms[0],
                        [Arm::Ours, Arm::Iceoryx2, Arm::OursAgain, Arm::Floor][round as usize]
                    );
                }
            }
        }
        // Large messages run in the large depth on our and iceoryx2's
        // arms; our channels keep unread messages only there, so the floor
        // writes one buffer each way.
        assert!(runs.iter().all(|r| r.depth
            == match (r.size, r.arm) {
                (8, _) => 64,
                (_, Arm::Floor) => 1,
                _ => 2,
            }));
        let keeps = |size| runs.iter().filter(move |r| r.size == size).map(|r| r.keep);
        assert!(keeps(8).all(|k| k == KeepArg::Newest));
        assert!(keeps(4194304).all(|k| k == KeepArg::Unread));
        // --large-keep newest: the floor runs the channels' depth again.
        let newest = plan(&settings(&[
            "--only",
            "ping-pong",
            "--sizes",
            "4194304",
            "--floor",
            "--large-keep",
            "newest",
        ]));
        assert!(newest.iter().all(|r| r.depth == 2 && r.keep == KeepArg::Newest));
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
            for size in [8, 1024, 65536, 1 << 20, 4 << 20] {
                for arm in [Arm::Ours, Arm::Iceoryx2, Arm::OursAgain] {
                    let n: u64 = runs
                        .iter()
                        .filter(|r| r.bench == bench && r.size == size && r.arm == arm)
                        .map(|r| r.count)
                        .sum();
                    let want = if bench == Bench::PingPong {
                        20001
                    } else {
                        20000
                    };
                    assert_eq!(n, want, "{bench:?} {size} {arm:?}");
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
        let groups: Vec<(u32, u32, Arm)> = runs
            .iter()
            .map(|r| (r.subscribers, r.round, r.arm))
            .collect();
        assert_eq!(groups.len(), 3 * 2 * 3);
        assert_eq!(groups[0], (1, 0, Arm::Ours));
        assert_eq!(groups[3], (1, 1, Arm::Iceoryx2));
        assert_eq!(groups[6], (2, 0, Arm::Ours));
        assert_eq!(groups[12], (4, 0, Arm::Ours));
        assert!(runs.iter().all(|r| r.count == 100_000));
    }
}
