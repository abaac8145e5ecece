//! The rtdeploy supervisor.
//!
//! It owns the controller's lifecycle on the robot: applies the CPU plan,
//! creates the channels, runs the boot timing check, starts every process with
//! the real-time attributes `robot.yaml` gives it, restarts them sensibly,
//! and answers on a control socket.
//!
//! Design rules:
//! - between `fork` and `exec` only async-signal-safe calls; every string and
//!   buffer is prepared before forking;
//! - every on-robot path is rooted at a caller-supplied prefix.

pub mod accounts;
pub mod config;
pub mod control;
pub mod health;
pub mod logfile;
pub mod notify;
pub mod pid1;
pub mod procfs;
pub mod restart;
pub mod spawn;
pub mod status;
pub mod supervisor;
pub mod unit;
pub mod release;
mod sys;
