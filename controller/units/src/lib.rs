//! The units and contracts every crate of rtdeploy shares, and that depend
//! on no crate of ours: [`bounded`], the one way a file from outside the
//! process is read, and [`path`], the one way a path from robot.yaml is
//! put under a root.
//!
//! Design rules:
//! - std, libc and thiserror only, so `controller` (which a controller
//!   binary links alone) and `cpusets` can depend on it;
//! - every read is bounded in memory and in time: a file's size as stat(2)
//!   reports it is never trusted (procfs says 0, sysfs 4096, a FIFO or a
//!   device anything), and nothing here waits on a FIFO or a device;
//! - every error carries the path it is about, lower case, without its
//!   cause repeated as a `source()`.

pub mod bounded;
pub mod path;
