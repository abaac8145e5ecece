//! The robot and its supervisor.
//!
//! It owns `robot.yaml` whole ([`robot`]: the model composed from each
//! crate's section, its loader with line and column, the checks that cross
//! sections, and what the other crates are given from it) and the
//! controller's lifecycle on the robot: the boot ([`boot`]: applies the CPU
//! plan, runs the boot timing check, scans for new IRQs, traces misses),
//! then creates the channels, starts every process with the real-time
//! attributes `robot.yaml` gives it, restarts them sensibly, and answers on
//! a control socket.
//!
//! Design rules:
//! - robot.yaml enters here once: `deploy` loads it through [`robot`] and
//!   hands the robot on; commands never derive a crate's input from it
//!   themselves (the robot has a method for it);
//! - the work that needs the crates below (cpusets, check) reaches the
//!   supervisor through one trait, [`supervisor::Boot`]; tests give their
//!   own;
//! - between `fork` and `exec` only async-signal-safe calls; every string and
//!   buffer is prepared before forking;
//! - every on-robot path is rooted at a caller-supplied prefix;
//! - one thread, one `poll(2)` loop: a signalfd for SIGTERM/SIGINT/SIGCHLD,
//!   a pidfd and an output pipe per process, the control socket; timers are
//!   the poll timeout; no async runtime;
//! - decisions are pure and tested alone ([`restart`]: backoff and crash
//!   loops, [`health`]: readiness, liveness and budgets from timing
//!   reports); the loop ([`supervisor`]) only applies them.
//!
//! Modules: [`robot`] robot.yaml; [`boot`] the supervisor's boot on a
//! robot; [`spawn`] starts one process with its attributes; [`supervisor`]
//! is the event loop; [`control`] the socket protocol and its client;
//! [`status`] what `deploy status` shows; [`procfs`] reads back what the
//! kernel put in force; [`logfile`] the rotated logs; [`accounts`] users and
//! groups under the prefix; [`pid1`] init duties; [`notify`] sd_notify;
//! [`journal`] events to the systemd journal; [`metrics`] the Prometheus
//! exposition and its textfile; [`top`] what `deploy top` shows, with
//! [`thermal`] the board's thermal zones;
//! [`unit`](mod@unit) the systemd unit; [`boot_history`] the boot checks
//! kept over time; [`trial`] the verdict on a release in trial;
//! [`release`] the release store (the `releases` crate) as the supervisor
//! sees it.

pub mod accounts;
pub mod boot;
pub mod boot_history;
pub mod bridge;
pub mod config;
pub mod control;
pub mod health;
pub mod hotplug;
pub mod journal;
pub mod logfile;
pub mod metrics;
pub mod notify;
pub mod pid1;
pub mod procfs;
pub mod release;
pub mod restart;
pub mod robot;
pub mod rootfs_slots;
pub mod sim;
pub mod spawn;
pub mod status;
pub mod supervisor;
mod sys;
pub mod thermal;
pub mod top;
pub mod trial;
pub mod unit;
pub mod wake_class;
pub mod watchdog;
