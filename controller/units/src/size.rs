//! Sizes in bytes as robot.yaml writes them (`256`, `4KiB`, `64MiB`,
//! `1MB`): one type, its parser, its printing and its serde form.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A size in bytes, written `256`, `4KiB`, `64MiB`, `1GiB`, `1TiB` (or
/// kB/MB/GB/TB in powers of ten).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub fn parse(text: &str) -> Result<Self, SizeParseError> {
        let t = text.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let mult: u64 = match unit.trim() {
            "" | "B" => 1,
            "KiB" | "K" => 1 << 10,
            "MiB" | "M" => 1 << 20,
            "GiB" | "G" => 1 << 30,
            "TiB" | "T" => 1 << 40,
            "kB" | "KB" => 1_000,
            "MB" => 1_000_000,
            "GB" => 1_000_000_000,
            "TB" => 1_000_000_000_000,
            u => {
                return Err(SizeParseError::UnknownUnit {
                    text: t.into(),
                    unit: u.into(),
                })
            }
        };
        let n: u64 = num
            .parse()
            .map_err(|_| SizeParseError::NotANumber { text: t.into() })?;
        n.checked_mul(mult)
            .map(ByteSize)
            .ok_or_else(|| SizeParseError::TooLarge { text: t.into() })
    }
}

/// Why a text is not a [`ByteSize`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeParseError {
    #[error(
        "unknown size unit `{unit}` in `{text}` (expected B, KiB, MiB, GiB, TiB, kB, MB, GB or TB)"
    )]
    UnknownUnit { text: String, unit: String },
    #[error("`{text}` is not a size (expected bytes like `256`, `4KiB` or `64MiB`)")]
    NotANumber { text: String },
    #[error("`{text}` is too large (at most 2^64 - 1 bytes)")]
    TooLarge { text: String },
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        for (unit, size) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
            if b >= size && b % size == 0 {
                return write!(f, "{}{unit}", b / size);
            }
        }
        write!(f, "{b}B")
    }
}

impl Serialize for ByteSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a size like `256`, `4KiB` or `64MiB`")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<ByteSize, E> {
                if v < 0 {
                    return Err(E::custom(format!(
                        "size {v} is negative (expected bytes like `256`)"
                    )));
                }
                Ok(ByteSize(v as u64))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ByteSize, E> {
                ByteSize::parse(v).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// `b` bytes for people: `512B`, `74.2KiB`, `4.0MiB`, `1.1GiB`.
pub fn human(b: u64) -> String {
    if b < 1024 {
        return format!("{b}B");
    }
    let mut v = b as f64 / 1024.0;
    for unit in ["KiB", "MiB"] {
        if v < 1024.0 {
            return format!("{v:.1}{unit}");
        }
        v /= 1024.0;
    }
    format!("{v:.1}GiB")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(ByteSize::parse("4KiB").unwrap().0, 4096);
        assert_eq!(ByteSize::parse("256").unwrap().0, 256);
        assert_eq!(ByteSize::parse("1MB").unwrap().0, 1_000_000);
        assert!(ByteSize::parse("1XB").is_err());
        assert_eq!(ByteSize::parse("2TiB").unwrap().0, 2 << 40);
        assert_eq!(
            ByteSize::parse("GiB").unwrap_err(),
            SizeParseError::NotANumber { text: "GiB".into() }
        );
        assert!(ByteSize::parse("20000000TiB")
            .unwrap_err()
            .to_string()
            .contains("too large"));
        assert_eq!(ByteSize(65536).to_string(), "64KiB");
    }

    #[test]
    fn human_sizes() {
        assert_eq!(super::human(512), "512B");
        assert_eq!(super::human(76_000), "74.2KiB");
        assert_eq!(super::human(4 << 20), "4.0MiB");
        assert_eq!(super::human(1_207_967_104), "1.1GiB");
        assert_eq!(super::human(u64::MAX), "17179869184.0GiB");
    }
}
