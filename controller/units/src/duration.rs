//! Durations as robot.yaml writes them (`500us`, `2ms`, `1.5s`, `1m`,
//! `250ns`): every section of the file and every crate that reads one
//! uses this one type, its parser, its printing and its serde form.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A duration written like `500us`, `2ms`, `1.5s`, `1m` or `250ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Dur(pub Duration);

impl Dur {
    pub const fn from_micros(us: u64) -> Self {
        Dur(Duration::from_micros(us))
    }
    pub const fn from_millis(ms: u64) -> Self {
        Dur(Duration::from_millis(ms))
    }
    pub const fn from_secs(s: u64) -> Self {
        Dur(Duration::from_secs(s))
    }
    pub fn as_nanos(self) -> u64 {
        self.0.as_nanos().min(u64::MAX as u128) as u64
    }
    pub fn is_zero(self) -> bool {
        self.0.is_zero()
    }

    /// Parses `500us`, `2ms`, `1.5s`, `1m`, `1h`, `250ns`.
    pub fn parse(text: &str) -> Result<Self, DurParseError> {
        let t = text.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let unit_ns: f64 = match unit.trim() {
            "ns" => 1.0,
            "us" | "µs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" | "min" => 60e9,
            "h" => 3600e9,
            "" => return Err(DurParseError::NoUnit { text: t.into() }),
            u => {
                return Err(DurParseError::UnknownUnit {
                    text: t.into(),
                    unit: u.into(),
                })
            }
        };
        let value: f64 = num
            .parse()
            .map_err(|_| DurParseError::NotANumber { text: t.into() })?;
        let ns = value * unit_ns;
        if !ns.is_finite() || ns > u64::MAX as f64 {
            return Err(DurParseError::TooLong { text: t.into() });
        }
        Ok(Dur(Duration::from_nanos(ns.round() as u64)))
    }
}

/// Why a text is not a [`Dur`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurParseError {
    #[error("`{text}` has no unit (expected a duration like `500us`, `2ms` or `1s`)")]
    NoUnit { text: String },
    #[error("unknown unit `{unit}` in `{text}` (expected ns, us, ms, s, m or h)")]
    UnknownUnit { text: String, unit: String },
    #[error("`{text}` is not a duration (expected like `500us`, `2ms` or `1s`)")]
    NotANumber { text: String },
    #[error("`{text}` is too long")]
    TooLong { text: String },
}

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ns = self.as_nanos();
        for (unit, size) in [
            ("h", 3_600_000_000_000u64),
            ("m", 60_000_000_000),
            ("s", 1_000_000_000),
            ("ms", 1_000_000),
            ("us", 1_000),
        ] {
            if ns >= size && ns % size == 0 {
                return write!(f, "{}{unit}", ns / size);
            }
        }
        if ns >= 1_000_000_000 {
            write!(f, "{}s", ns as f64 / 1e9)
        } else if ns >= 1_000_000 {
            write!(f, "{}ms", ns as f64 / 1e6)
        } else if ns >= 1_000 {
            write!(f, "{}us", ns as f64 / 1e3)
        } else {
            write!(f, "{ns}ns")
        }
    }
}

impl Serialize for Dur {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Dur;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a duration like `500us`, `2ms` or `1s`")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Dur, E> {
                Dur::parse(v).map_err(E::custom)
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Dur, E> {
                Err(E::custom(format!(
                    "`{v}` has no unit (expected a duration like `{v}us`, `{v}ms` or `{v}s`)"
                )))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Dur, E> {
                Err(E::custom(format!(
                    "`{v}` is not a duration (expected like `500us`)"
                )))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Dur, E> {
                Err(E::custom(format!(
                    "`{v}` has no unit (expected a duration like `{v}s`)"
                )))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(Dur::parse("500us").unwrap(), Dur::from_micros(500));
        assert_eq!(Dur::parse("1.5s").unwrap(), Dur::from_millis(1500));
        assert_eq!(Dur::parse("2ms").unwrap().to_string(), "2ms");
        assert_eq!(Dur::from_micros(1500).to_string(), "1500us");
        assert_eq!(Dur::parse("250ns").unwrap().to_string(), "250ns");
        assert!(Dur::parse("5").unwrap_err().to_string().contains("no unit"));
        assert!(Dur::parse("5 parsecs")
            .unwrap_err()
            .to_string()
            .contains("unknown unit"));
        assert!(Dur::parse("x").is_err());
    }
}
