//! CPU isolation for rtdeploy: plan, apply and verify.
//!
//! From the `board`, `cpus`, `kernel`, `irqs`, `sysctl` and `power` sections
//! of `robot.yaml` this crate decides the kernel command line, IRQ affinities,
//! IRQ-thread priorities, sysctls, cgroup cpusets and cpufreq settings, writes
//! them to a live system, and reads the live system back to prove it matches.
//!
//! Design rules:
//! - three layers: `model` parses the text of /proc and /sys (pure), `plan`
//!   decides (pure), `apply` is the only code that does I/O;
//! - every path is rooted at a caller-supplied sysroot, so tests run against
//!   fake trees built from fixtures captured on real machines.

pub mod board;
pub mod cmdline;
pub mod config;
pub mod cpuset;
pub mod model;
pub mod plan;
pub mod apply;
pub mod verify;
