//! Wake classes: every publisher and every waiting subscriber of a
//! channel is real-time or best-effort, decided from robot.yaml by the
//! supervisor and passed to each process in its environment
//! ([`crate::env::WAKE_CLASS`]).
//!
//! The class is shared by the supervisor that decides it, the runtime
//! that keeps to it, the CLI that prints it and the timing reports that
//! record it. The rule it stands for (no best-effort task touches a
//! kernel object a real-time wake or wait needs) and how a channel keeps
//! it are the runtime's: `controller::wake`.

use std::fmt;

/// The wake class of a publisher or subscriber: real-time or best-effort.
/// Ordered real-time first (for tables).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    serde::Serialize,
    serde::Deserialize,
)]
pub enum WakeClass {
    /// On an isolated CPU above every other thread that may run there.
    #[serde(rename = "real-time")]
    RealTime,
    /// Everything else: the safe default (a best-effort task touches no
    /// real-time object).
    #[default]
    #[serde(rename = "best-effort")]
    BestEffort,
}

impl WakeClass {
    pub const ALL: [WakeClass; 2] = [WakeClass::RealTime, WakeClass::BestEffort];

    pub fn name(self) -> &'static str {
        match self {
            WakeClass::RealTime => "real-time",
            WakeClass::BestEffort => "best-effort",
        }
    }

    pub fn from_name(s: &str) -> Option<WakeClass> {
        WakeClass::ALL.into_iter().find(|c| c.name() == s)
    }

    /// The other class.
    pub fn other(self) -> WakeClass {
        match self {
            WakeClass::RealTime => WakeClass::BestEffort,
            WakeClass::BestEffort => WakeClass::RealTime,
        }
    }
}

impl fmt::Display for WakeClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_the_default_is_best_effort() {
        for c in WakeClass::ALL {
            assert_eq!(WakeClass::from_name(c.name()), Some(c));
            assert_eq!(c.other().other(), c);
        }
        assert_eq!(WakeClass::from_name("rt"), None);
        assert_eq!(WakeClass::default(), WakeClass::BestEffort);
    }
}
