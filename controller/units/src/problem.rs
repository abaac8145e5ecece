//! What a validator of robot.yaml reports.
//!
//! Every section's validator appends `(field path, message)` pairs; the
//! caller (`deploy config check`) maps a path such as `channels[2].rate`
//! back to its line and column. Each crate validates its own sections
//! with this one type, so the composition needs no conversion.

/// A validation problem: the field path and what is wrong with it.
pub type Problem = (String, String);
