//! Ratios measured on a noisy machine: arms run in interleaved rounds (the
//! order rotated each round, so a slow drift of the machine hits every arm
//! alike), one figure per arm per round, and each ratio given as the median
//! over rounds of the per-round ratio, with its spread (the lowest and the
//! highest round). An A/A arm (the reference measured a second time in
//! every round) gives the noise floor in the same run: a ratio between two
//! arms means something only where it lies outside the A/A ratio's spread.
//!
//! `deploy check --compare --rounds N`, `deploy bench wake` and
//! `deploy bench publish` report their comparisons through this.

use serde::Serialize;

/// The order arms run in, in round `round` of a run over `arms` arms: a
/// rotation, so that each arm runs first, second, ... equally often.
pub fn order(arms: usize, round: usize) -> Vec<usize> {
    (0..arms).map(|i| (i + round) % arms.max(1)).collect()
}

/// One figure per round (`None`: the arm did not run that round).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Arm {
    pub name: String,
    pub rounds: Vec<Option<f64>>,
}

/// A ratio of two arms over the rounds both ran.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Ratio {
    /// What is compared, e.g. `delivery p50`.
    pub figure: String,
    pub numerator: String,
    pub denominator: String,
    /// The per-round ratios, in round order.
    pub per_round: Vec<f64>,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// The A/A ratio (the denominator against its own second measurement
    /// in the same rounds), when the run had one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aa: Option<Spread>,
}

/// The median and spread of per-round values.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    /// `None` when there is no value.
    pub fn of(values: &[f64]) -> Option<Spread> {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Spread {
            median,
            min: v[0],
            max: v[n - 1],
        })
    }
}

/// Per-round `f(a, b)` over the rounds where both arms have a figure and
/// the result is finite.
fn per_round(a: &Arm, b: &Arm, f: impl Fn(f64, f64) -> f64) -> Vec<f64> {
    a.rounds
        .iter()
        .zip(&b.rounds)
        .filter_map(|(x, y)| Some(f((*x)?, (*y)?)))
        .filter(|r| r.is_finite())
        .collect()
}

impl Ratio {
    /// `num / den` per round; `aa` is the denominator's second
    /// measurement (the A/A control). `None` when no round has both.
    pub fn of(figure: &str, num: &Arm, den: &Arm, aa: Option<&Arm>) -> Option<Ratio> {
        let div = |x: f64, y: f64| if y > 0.0 { x / y } else { f64::NAN };
        let per = per_round(num, den, div);
        let s = Spread::of(&per)?;
        Some(Ratio {
            figure: figure.into(),
            numerator: num.name.clone(),
            denominator: den.name.clone(),
            per_round: per,
            median: s.median,
            min: s.min,
            max: s.max,
            aa: aa.and_then(|a| Spread::of(&per_round(a, den, div))),
        })
    }

    /// One line: `delivery p50: doorbell / io_uring_shared 0.97x (0.91x to
    /// 1.04x over 5 rounds; A/A 1.00x, 0.96x to 1.03x)`.
    pub fn line(&self) -> String {
        let aa = self.aa.map_or(String::new(), |a| {
            format!("; A/A {:.2}x, {:.2}x to {:.2}x", a.median, a.min, a.max)
        });
        format!(
            "{}: {} / {} {:.2}x ({:.2}x to {:.2}x over {} rounds{aa})",
            self.figure,
            self.numerator,
            self.denominator,
            self.median,
            self.min,
            self.max,
            self.per_round.len()
        )
    }
}

/// A difference `num - den` per round, for figures where the gap is what
/// matters (nanoseconds of a publish).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Difference {
    pub figure: String,
    pub numerator: String,
    pub denominator: String,
    pub per_round: Vec<f64>,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aa: Option<Spread>,
}

impl Difference {
    pub fn of(figure: &str, num: &Arm, den: &Arm, aa: Option<&Arm>) -> Option<Difference> {
        let per = per_round(num, den, |x, y| x - y);
        let s = Spread::of(&per)?;
        Some(Difference {
            figure: figure.into(),
            numerator: num.name.clone(),
            denominator: den.name.clone(),
            per_round: per,
            median: s.median,
            min: s.min,
            max: s.max,
            aa: aa.and_then(|a| Spread::of(&per_round(a, den, |x, y| x - y))),
        })
    }

    pub fn line(&self, unit: &str) -> String {
        let aa = self.aa.map_or(String::new(), |a| {
            format!(
                "; A/A {:+.1}{unit}, {:+.1} to {:+.1}",
                a.median, a.min, a.max
            )
        });
        format!(
            "{}: {} - {} {:+.1}{unit} ({:+.1} to {:+.1} over {} rounds{aa})",
            self.figure,
            self.numerator,
            self.denominator,
            self.median,
            self.min,
            self.max,
            self.per_round.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arm(name: &str, v: &[Option<f64>]) -> Arm {
        Arm {
            name: name.into(),
            rounds: v.to_vec(),
        }
    }

    #[test]
    fn every_arm_leads_a_round_in_turn() {
        assert_eq!(order(3, 0), vec![0, 1, 2]);
        assert_eq!(order(3, 1), vec![1, 2, 0]);
        assert_eq!(order(3, 5), vec![2, 0, 1]);
        assert_eq!(order(0, 3), Vec::<usize>::new());
    }

    #[test]
    fn ratios_are_medians_of_per_round_ratios_over_rounds_both_ran() {
        let new = arm(
            "new",
            &[Some(10.0), Some(12.0), None, Some(30.0), Some(9.0)],
        );
        let reference = arm(
            "ref",
            &[Some(10.0), Some(10.0), Some(10.0), Some(10.0), Some(0.0)],
        );
        let again = arm(
            "ref again",
            &[Some(11.0), Some(9.0), Some(10.0), Some(10.0), Some(10.0)],
        );
        let r = Ratio::of("p50", &new, &reference, Some(&again)).unwrap();
        // Rounds 0, 1 and 3 (round 2: new missing; round 4: a zero
        // reference is no ratio).
        assert_eq!(r.per_round, vec![1.0, 1.2, 3.0]);
        assert_eq!((r.median, r.min, r.max), (1.2, 1.0, 3.0));
        let aa = r.aa.unwrap();
        assert_eq!((aa.median, aa.min, aa.max), (1.0, 0.9, 1.1));
        let line = r.line();
        assert!(
            line.starts_with(
                "p50: new / ref 1.20x (1.00x to 3.00x over 3 rounds; A/A 1.00x, 0.90x to 1.10x)"
            ),
            "{line}"
        );
        assert!(Ratio::of("p50", &arm("a", &[None]), &reference, None).is_none());
        let d = Difference::of("publish", &new, &reference, None).unwrap();
        assert_eq!(d.median, 5.5);
        assert!(
            d.line("ns")
                .contains("+5.5ns (+0.0 to +20.0 over 4 rounds)"),
            "{}",
            d.line("ns")
        );
    }
}
