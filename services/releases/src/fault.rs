//! Fault injection for the installer's tests: with the `fault-injection`
//! feature, the install aborts right after a named step when the
//! environment variable `RTDEPLOY_FAULT` names it, as a power cut or a
//! SIGKILL would stop it (no destructors, no cleanup). Without the feature
//! (every release build) [`fault_point`] is an empty function, and neither
//! the variable's name nor the step names are in the binary.

/// The install steps a fault can be injected after (see [`fault_point`]).
#[cfg(feature = "fault-injection")]
pub const FAULT_STEPS: &[&str] = &[
    "locked",
    "blob-staged",
    "verified",
    "stored",
    "release-file",
    "release-built",
    "release-renamed",
    "state-trial",
    "previous-switched",
    "current-switched",
    "config-linked",
    "pruned",
];

/// The steps only a system update has (see [`crate::system`]): the boot
/// attempts armed ([`crate::boot_attempts`]: its first copy written, then
/// both), the boot loader's new file written to its temporary name, and
/// renamed into place.
#[cfg(feature = "fault-injection")]
pub const SYSTEM_FAULT_STEPS: &[&str] = &[
    "attempts-first-copy",
    "attempts-armed",
    "boot-staged",
    "boot-written",
];

/// Test hook: when the environment variable [`units::env::FAULT`] names
/// `step`, the process aborts right there.
#[cfg(feature = "fault-injection")]
pub fn fault_point(step: &str) {
    debug_assert!(
        FAULT_STEPS.contains(&step) || SYSTEM_FAULT_STEPS.contains(&step),
        "unknown fault step {step}"
    );
    if std::env::var_os(units::env::FAULT).is_some_and(|v| v == step) {
        eprintln!("rtdeploy: {}={step}: aborting", units::env::FAULT);
        std::process::abort();
    }
}

/// Without the `fault-injection` feature: nothing.
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub(crate) fn fault_point(_step: &str) {}
