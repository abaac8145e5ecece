//! Releases as the supervisor sees them. The on-robot release store (the
//! layout, the update lock, `state.json`, install, trial, commit, rollback,
//! recovery, pruning and the update server) is the `releases` crate,
//! re-exported here; the trial verdict, judged from the supervisor's own
//! health data, is [`crate::trial`], re-exported here too.
//!
//! How the supervisor uses them:
//!
//! 1. at start, before starting any process: [`recover_at_start`]`(prefix)`;
//! 2. start processes from `opt/rtdeploy/current`;
//! 3. when [`read_state`] says [`ReleaseState::Trial`]: restart every
//!    process from `current` and judge them with [`TrialHealth`] until
//!    [`commit`] or [`rollback`] (see [`crate::trial`]).

pub use crate::trial::{watch_trial, HealthVerdict, ProcessHealth, TrialHealth, TrialOutcome};
pub use releases::*;
