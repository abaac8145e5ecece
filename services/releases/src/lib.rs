//! Releases on the robot: the signed bundle format, the content-addressed
//! store, installing a bundle and switching to it in trial, commit and
//! rollback, the update lock, pruning, both ends of the update wire
//! protocol (the robot's server and the build host's fleet client), the
//! planner of system updates and our Mender update module.
//!
//! The supervisor uses this crate without the image builder; the image
//! builder uses it for the on-robot [`Layout`] and the release name.
//!
//! Design rules:
//! - one place for every on-robot path ([`Layout`], all under a
//!   caller-supplied prefix) and one release name ([`release_name`]);
//! - every byte from a bundle or the wire is hostile: fail closed on the
//!   signature before any other entry is read, hold every length to a
//!   limit before allocating, show names from the input cut and escaped
//!   (see [`bundle`]);
//! - crash safe: a release directory is complete and fsync'd before it is
//!   renamed into place, `state.json` says trial before `current` moves,
//!   links move only by rename(2); at any instant `current` names the old
//!   or the new release, whole, and [`recover_at_start`] undoes an
//!   interrupted trial;
//! - the store changes under the update lock ([`UpdateLock`]) only;
//! - the health verdict that ends a trial is not here: the supervisor
//!   judges its processes and calls [`commit`] or [`rollback`];
//! - what an update needs of the robot beyond the store (its robot.yaml,
//!   its supervisor) comes in from the caller ([`mender::ModuleEnv`],
//!   [`PlanSystem`]): this crate depends on no crate above it (`cpusets`
//!   and `units` only);
//! - errors are typed (`thiserror`), no `anyhow`;
//! - test instrumentation (the installer's fault points) exists only with
//!   the `fault-injection` feature, which release builds do not enable.
//!
//! Modules: [`bundle`] the format, its reader and writer, the store and
//! the wire frames; [`layout`] the paths; [`lock`] the update lock;
//! [`state`] `state.json` and the links; [`install`] bundle to release
//! directory; [`switch`] trial, commit, rollback, recovery; [`prune`]
//! listing and pruning; [`serve`] the robot's end of `deploy update`;
//! [`fleet`] the sender's end: ssh to each robot, with retries;
//! [`boot_attempts`] a system update's boots counted by U-Boot;
//! [`l4t_slots`] a Jetson's rootfs A/B slots as its firmware left them;
//! [`system`] releases that change the kernel command line or the CPU
//! plan, whose trial spans a reboot, and [`system_plan`] what makes one
//! (the system part compared, the extlinux.conf entry); [`mender`] our
//! Mender update module; [`programs`] the one check that a release holds
//! the programs its robot.yaml runs.

pub mod boot_attempts;
pub mod bundle;
mod error;
mod fault;
pub mod fleet;
pub mod install;
pub mod l4t_slots;
pub mod layout;
pub mod lock;
pub mod mender;
mod name;
pub mod programs;
pub mod prune;
pub mod serve;
pub mod state;
pub mod switch;
pub mod system;
pub mod system_plan;
pub mod utc;

pub use error::ReleaseError;
#[cfg(feature = "fault-injection")]
pub use fault::{fault_point, FAULT_STEPS, SYSTEM_FAULT_STEPS};
pub use install::{
    install_bundle, install_from_store, verify_release, InstallOptions, InstallReport,
    RobotYamlError, ValidateYaml,
};
pub use layout::Layout;
pub use lock::{UpdateLock, UpdateLockError};
pub use name::release_name;
pub use programs::{check_programs, ReleaseProgramsError};
pub use prune::{list, prune, ReleaseInfo, ReleasesInfo};
pub use serve::serve_update;
pub use state::{link_target, read_state, ReleaseState};
pub use switch::{
    begin_system_trial, begin_trial, commit, recover_at_boot, recover_at_start, rollback, Recovery,
    Rollback,
};
pub use system::{PlanSystem, SystemUpdate};
