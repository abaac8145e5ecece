//! Sets of CPU numbers, written the way the kernel writes them (`0,2-3`).
//!
//! The same text form is used in `robot.yaml`, on the kernel command line
//! (`isolcpus=`), in `/sys/devices/system/cpu/isolated`, in a cgroup's
//! `cpuset.cpus.effective` and in `Cpus_allowed_list`; the hexadecimal
//! mask form is used by `/proc/irq/N/smp_affinity`. The CPU plan, the
//! supervisor, the runtime and the check all read and write CPU lists
//! through this one type.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The largest CPU number accepted (Linux's `NR_CPUS` on arm64 is 512).
pub const MAX_CPU: u32 = 1023;

/// An ordered set of CPU numbers.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct CpuSet {
    /// One bit per CPU, CPU n in word n / 64.
    words: Vec<u64>,
}

/// Why a CPU list did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpuSetParseError {
    #[error("`{0}` is not a CPU number (expected a list like `0,2-3`)")]
    NotANumber(String),
    #[error("range `{0}` runs backwards (expected low-high, like `4-5`)")]
    Backwards(String),
    #[error("CPU {0} is beyond the largest supported CPU number {MAX_CPU}")]
    TooLarge(u32),
    #[error("`{0}` is not a hexadecimal CPU mask")]
    BadMask(String),
}

impl CpuSet {
    pub fn new() -> Self {
        Self::default()
    }

    /// CPUs `0..n`.
    pub fn first(n: u32) -> Self {
        (0..n).collect()
    }

    /// The set of CPU numbers held as indexes (`usize`, as std and a
    /// `Vec` count them); a number beyond [`MAX_CPU`] is refused, as in a
    /// CPU list.
    pub fn from_indices(cpus: impl IntoIterator<Item = usize>) -> Result<Self, CpuSetParseError> {
        let mut set = CpuSet::new();
        for c in cpus {
            match u32::try_from(c) {
                Ok(c) if c <= MAX_CPU => set.insert(c),
                _ => {
                    return Err(CpuSetParseError::TooLarge(
                        u32::try_from(c).unwrap_or(u32::MAX),
                    ))
                }
            }
        }
        Ok(set)
    }

    pub fn insert(&mut self, cpu: u32) {
        let w = (cpu / 64) as usize;
        if self.words.len() <= w {
            self.words.resize(w + 1, 0);
        }
        self.words[w] |= 1 << (cpu % 64);
    }

    pub fn remove(&mut self, cpu: u32) {
        if let Some(word) = self.words.get_mut((cpu / 64) as usize) {
            *word &= !(1 << (cpu % 64));
        }
        self.trim();
    }

    fn trim(&mut self) {
        while self.words.last() == Some(&0) {
            self.words.pop();
        }
    }

    pub fn contains(&self, cpu: u32) -> bool {
        self.words
            .get((cpu / 64) as usize)
            .is_some_and(|w| w & (1 << (cpu % 64)) != 0)
    }

    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|&w| w == 0)
    }

    pub fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.words.iter().enumerate().flat_map(|(i, &w)| {
            (0..64u32)
                .filter(move |b| w & (1 << b) != 0)
                .map(move |b| i as u32 * 64 + b)
        })
    }

    pub fn max(&self) -> Option<u32> {
        self.iter().last()
    }

    /// A set from its words, without trailing zero words (so that equal
    /// sets compare equal).
    fn from_words(words: Vec<u64>) -> CpuSet {
        let mut set = CpuSet { words };
        set.trim();
        set
    }

    pub fn union(&self, other: &CpuSet) -> CpuSet {
        let n = self.words.len().max(other.words.len());
        CpuSet::from_words(
            (0..n)
                .map(|i| self.words.get(i).unwrap_or(&0) | other.words.get(i).unwrap_or(&0))
                .collect(),
        )
    }

    pub fn intersection(&self, other: &CpuSet) -> CpuSet {
        CpuSet::from_words(
            self.words
                .iter()
                .zip(&other.words)
                .map(|(a, b)| a & b)
                .collect(),
        )
    }

    pub fn difference(&self, other: &CpuSet) -> CpuSet {
        CpuSet::from_words(
            self.words
                .iter()
                .enumerate()
                .map(|(i, a)| a & !other.words.get(i).unwrap_or(&0))
                .collect(),
        )
    }

    pub fn is_subset(&self, other: &CpuSet) -> bool {
        self.difference(other).is_empty()
    }

    pub fn is_disjoint(&self, other: &CpuSet) -> bool {
        self.intersection(other).is_empty()
    }

    /// Parses the kernel's list form (`0-3,5`); the empty string is the
    /// empty set, as in `/sys/devices/system/cpu/isolated`.
    pub fn parse_list(text: &str) -> Result<Self, CpuSetParseError> {
        let mut set = CpuSet::new();
        let text = text.trim();
        if text.is_empty() {
            return Ok(set);
        }
        for part in text.split(',') {
            let part = part.trim();
            let num = |s: &str| -> Result<u32, CpuSetParseError> {
                let n: u32 = s
                    .trim()
                    .parse()
                    .map_err(|_| CpuSetParseError::NotANumber(part.to_string()))?;
                if n > MAX_CPU {
                    return Err(CpuSetParseError::TooLarge(n));
                }
                Ok(n)
            };
            match part.split_once('-') {
                Some((lo, hi)) => {
                    let (lo, hi) = (num(lo)?, num(hi)?);
                    if hi < lo {
                        return Err(CpuSetParseError::Backwards(part.to_string()));
                    }
                    (lo..=hi).for_each(|c| set.insert(c));
                }
                None => set.insert(num(part)?),
            }
        }
        Ok(set)
    }

    /// Parses the kernel's hexadecimal mask form (`f`, `00000000,00000030`).
    pub fn parse_mask(text: &str) -> Result<Self, CpuSetParseError> {
        let digits: String = text.trim().chars().filter(|&c| c != ',').collect();
        if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(CpuSetParseError::BadMask(text.trim().to_string()));
        }
        let mut set = CpuSet::new();
        for (i, c) in digits.chars().rev().enumerate() {
            let nibble = c.to_digit(16).unwrap_or(0);
            for b in 0..4 {
                if nibble & (1 << b) != 0 {
                    let cpu = (i * 4 + b) as u32;
                    if cpu > MAX_CPU {
                        return Err(CpuSetParseError::TooLarge(cpu));
                    }
                    set.insert(cpu);
                }
            }
        }
        Ok(set)
    }

    /// The hexadecimal mask form, comma-grouped in 32-bit words like the
    /// kernel prints it (`30`, `1,00000000`); `0` for the empty set.
    pub fn to_mask(&self) -> String {
        let max = match self.max() {
            Some(m) => m,
            None => return "0".to_string(),
        };
        let groups = max / 32 + 1;
        let mut out = String::new();
        for g in (0..groups).rev() {
            let word = self.words.get((g / 2) as usize).copied().unwrap_or(0);
            let half = if g % 2 == 0 {
                word as u32
            } else {
                (word >> 32) as u32
            };
            if out.is_empty() {
                out.push_str(&format!("{half:x}"));
            } else {
                out.push_str(&format!(",{half:08x}"));
            }
        }
        out
    }
}

impl FromIterator<u32> for CpuSet {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        let mut set = CpuSet::new();
        iter.into_iter().for_each(|c| set.insert(c));
        set
    }
}

impl FromStr for CpuSet {
    type Err = CpuSetParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse_list(s)
    }
}

/// The kernel's list form, ranges collapsed: `0-3,5`.
impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cpus: Vec<u32> = self.iter().collect();
        let mut first = true;
        let mut i = 0;
        while i < cpus.len() {
            let start = cpus[i];
            let mut end = start;
            while i + 1 < cpus.len() && cpus[i + 1] == end + 1 {
                i += 1;
                end = cpus[i];
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
            i += 1;
        }
        Ok(())
    }
}

impl fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuSet({self})")
    }
}

impl Serialize for CpuSet {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Accepts `4-5`, `"0,2-3"` and a bare number (`4`).
impl<'de> Deserialize<'de> for CpuSet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = CpuSet;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a CPU list like `4-5` or `0,2-3`")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<CpuSet, E> {
                if v > MAX_CPU as u64 {
                    return Err(E::custom(CpuSetParseError::TooLarge(
                        v.min(u32::MAX as u64) as u32,
                    )));
                }
                Ok(std::iter::once(v as u32).collect())
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<CpuSet, E> {
                if v < 0 {
                    return Err(E::custom(CpuSetParseError::NotANumber(v.to_string())));
                }
                self.visit_u64(v as u64)
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<CpuSet, E> {
                CpuSet::parse_list(v).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_round_trip() {
        for s in ["", "0", "0-3", "0,2-3", "1,3,5-7,64-65,1023"] {
            assert_eq!(CpuSet::parse_list(s).unwrap().to_string(), s);
        }
        assert_eq!(CpuSet::parse_list(" 3 , 1-2\n").unwrap().to_string(), "1-3");
    }

    #[test]
    fn list_errors() {
        assert!(matches!(
            CpuSet::parse_list("a"),
            Err(CpuSetParseError::NotANumber(_))
        ));
        assert!(matches!(
            CpuSet::parse_list("5-4"),
            Err(CpuSetParseError::Backwards(_))
        ));
        assert!(matches!(
            CpuSet::parse_list("1,"),
            Err(CpuSetParseError::NotANumber(_))
        ));
        assert!(matches!(
            CpuSet::parse_list("4096"),
            Err(CpuSetParseError::TooLarge(4096))
        ));
    }

    #[test]
    fn mask_round_trip() {
        let set = CpuSet::parse_list("4-5").unwrap();
        assert_eq!(set.to_mask(), "30");
        assert_eq!(CpuSet::parse_mask("30").unwrap(), set);
        assert_eq!(CpuSet::parse_mask("00000000,00000030").unwrap(), set);
        let wide = CpuSet::parse_list("0,32").unwrap();
        assert_eq!(wide.to_mask(), "1,00000001");
        assert_eq!(CpuSet::parse_mask(&wide.to_mask()).unwrap(), wide);
        assert_eq!(CpuSet::new().to_mask(), "0");
        assert!(CpuSet::parse_mask("xyz").is_err());
    }

    #[test]
    fn indexes_are_cpu_numbers_up_to_the_largest() {
        assert_eq!(
            CpuSet::from_indices([5, 0, 1]).unwrap().to_string(),
            "0-1,5"
        );
        assert_eq!(
            CpuSet::from_indices([2, 4096]),
            Err(CpuSetParseError::TooLarge(4096))
        );
    }

    #[test]
    fn set_algebra() {
        let a = CpuSet::parse_list("0-3").unwrap();
        let b = CpuSet::parse_list("2-5").unwrap();
        assert_eq!(a.union(&b).to_string(), "0-5");
        assert_eq!(a.intersection(&b).to_string(), "2-3");
        assert_eq!(a.difference(&b).to_string(), "0-1");
        assert!(CpuSet::parse_list("1-2").unwrap().is_subset(&a));
        assert!(!a.is_disjoint(&b));
        assert_eq!(a.len(), 4);
        let mut c = a.clone();
        c.remove(3);
        assert_eq!(c.to_string(), "0-2");
    }
}
