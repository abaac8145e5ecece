//! The `deploy` command's library half: robot.yaml loading and the
//! subcommands, so that tests and the fuzzer reach them without a process.
//!
//! Design rules: this crate only parses, composes the library crates and
//! prints; every decision lives in `controller`, `cpusets`, `services` or
//! `image`. Exit codes everywhere: 0 ok, 1 a check/verify/budget failed,
//! 2 error.

pub mod cmd;
pub mod config;
pub mod ctx;
