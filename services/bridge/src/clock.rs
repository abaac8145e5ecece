//! The offset between this board's CLOCK_MONOTONIC and another's, from
//! the bridges' own exchanges (as AOS's message bridge estimates it): this
//! bridge asks the other for its clock at local time `t0`, the answer
//! carries the other's clock `r`, read while answering, and arrives at
//! `t1`. If the way there and back took as long, `r` was read at local
//! `(t0 + t1) / 2`, so `offset = r - (t0 + t1) / 2` (remote minus local),
//! wrong by at most half the round trip. Of the last samples, the one
//! with the shortest round trip is kept: queueing only lengthens a round
//! trip, so the shortest is the least disturbed.

use std::collections::VecDeque;

/// The samples kept.
pub const WINDOW: usize = 16;

/// One exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    pub t0: u64,
    pub remote: u64,
    pub t1: u64,
}

/// The estimate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Estimate {
    /// Remote minus local, ns.
    pub offset_ns: i64,
    /// The round trip of the sample it comes from (the error bound is
    /// half of it).
    pub rtt_ns: u64,
    pub samples: usize,
}

/// The last [`WINDOW`] samples of one remote board.
#[derive(Debug, Clone, Default)]
pub struct Offset {
    samples: VecDeque<Sample>,
}

impl Offset {
    /// Adds a sample; one that runs backwards (`t1 < t0`) is not one.
    pub fn add(&mut self, s: Sample) {
        if s.t1 < s.t0 {
            return;
        }
        if self.samples.len() == WINDOW {
            self.samples.pop_front();
        }
        self.samples.push_back(s);
    }

    /// Forgets every sample (the other board rebooted: another clock).
    pub fn reset(&mut self) {
        self.samples.clear();
    }

    pub fn estimate(&self) -> Option<Estimate> {
        let best = self.samples.iter().min_by_key(|s| s.t1 - s.t0)?;
        let mid = best.t0 / 2 + best.t1 / 2 + (best.t0 % 2 + best.t1 % 2) / 2;
        Some(Estimate {
            offset_ns: (best.remote as i128 - mid as i128).clamp(i64::MIN as i128, i64::MAX as i128)
                as i64,
            rtt_ns: best.t1 - best.t0,
            samples: self.samples.len(),
        })
    }

    /// A remote time as local time, when there is an estimate.
    pub fn to_local(&self, remote: u64) -> Option<u64> {
        let e = self.estimate()?;
        Some((remote as i128 - e.offset_ns as i128).clamp(0, u64::MAX as i128) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shortest_round_trip_decides_within_half_of_it() {
        // The remote clock runs 5 s ahead; the way there takes 10 us and
        // the way back 10 us, one exchange queued for 3 ms on the way back.
        let truth = 5_000_000_000i64;
        let mut o = Offset::default();
        assert!(o.estimate().is_none());
        let ex = |t0: u64, there: u64, back: u64| Sample {
            t0,
            remote: (t0 + there) as i64 as u64 + truth as u64,
            t1: t0 + there + back,
        };
        o.add(ex(1_000_000, 10_000, 3_000_000));
        o.add(ex(2_000_000, 10_000, 10_000));
        o.add(ex(3_000_000, 400_000, 10_000));
        let e = o.estimate().unwrap();
        assert_eq!(e.rtt_ns, 20_000);
        assert_eq!(e.offset_ns, truth);
        assert_eq!(e.samples, 3);
        assert_eq!(o.to_local(7_000_000 + truth as u64), Some(7_000_000));
        // A sample running backwards is none; the window keeps the last.
        o.add(Sample {
            t0: 9,
            remote: 0,
            t1: 8,
        });
        assert_eq!(o.estimate().unwrap().samples, 3);
        for k in 0..WINDOW as u64 {
            o.add(ex(10_000_000 + k * 1_000_000, 50_000, 50_000));
        }
        let e = o.estimate().unwrap();
        assert_eq!((e.samples, e.rtt_ns, e.offset_ns), (WINDOW, 100_000, truth));
        o.reset();
        assert!(o.estimate().is_none());
    }
}
