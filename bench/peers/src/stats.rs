//! Percentiles of pooled samples.

use serde::Serialize;

/// Percentiles of one set of samples (nearest rank), in the samples' unit.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Percentiles {
    pub samples: usize,
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

/// The value at quantile `q` of sorted `v` (nearest rank: the smallest
/// value with at least `q` of the samples at or below it).
fn rank(v: &[f64], q: f64) -> f64 {
    let n = v.len();
    let i = ((q * n as f64).ceil() as usize).clamp(1, n) - 1;
    v[i]
}

impl Percentiles {
    /// `None` for no samples.
    pub fn of(samples: impl IntoIterator<Item = f64>) -> Option<Percentiles> {
        let mut v: Vec<f64> = samples.into_iter().collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        Some(Percentiles {
            samples: v.len(),
            p50: rank(&v, 0.50),
            p99: rank(&v, 0.99),
            p999: rank(&v, 0.999),
            max: v[v.len() - 1],
        })
    }
}

/// The median of `v` (the mean of the two middle values for an even count).
pub fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    Some(if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    })
}

/// `a / b`, `None` when `b` is not positive.
pub fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0).then(|| a / b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let p = Percentiles::of((1..=1000).map(f64::from)).unwrap();
        assert_eq!(p.samples, 1000);
        assert_eq!(p.p50, 500.0);
        assert_eq!(p.p99, 990.0);
        assert_eq!(p.p999, 999.0);
        assert_eq!(p.max, 1000.0);
        let one = Percentiles::of([7.0]).unwrap();
        assert_eq!((one.p50, one.p999, one.max), (7.0, 7.0, 7.0));
        assert!(Percentiles::of(std::iter::empty()).is_none());
    }

    #[test]
    fn medians_and_ratios() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        assert_eq!(ratio(3.0, 6.0), Some(0.5));
        assert_eq!(ratio(3.0, 0.0), None);
    }
}
