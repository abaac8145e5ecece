//! The `deploy` command's library half: the subcommands, so that tests
//! and the fuzzer reach them without a process.
//!
//! Design rules: this crate only parses, composes the library crates and
//! prints; every decision lives in `controller`, `check`, `cpusets`,
//! `services` (robot.yaml's model and the supervisor's boot), `releases`
//! or `image`. Exit codes everywhere: 0 ok, 1 a check/verify/budget failed,
//! 2 error.

pub mod cmd;
pub mod ctx;
