//! The units and contracts every crate of rtdeploy shares, and that depend
//! on no crate of ours: [`bounded`], the one way a file from outside the
//! process is read; [`path`], the one way a path from robot.yaml is put
//! under a root; the units robot.yaml writes in every section
//! ([`duration`], [`size`]) and what a validator reports ([`problem`]);
//! [`error::Chain`], the one printer of an error with its causes;
//! [`kernel`], a kernel's version and the first release of each feature
//! the CPU plan and the runtime reason about; [`cpu::CpuSet`], the one
//! type of a set of CPUs, in the kernel's list and mask forms; [`sched`],
//! the one wrapper of a thread's scheduling policy and CPU affinity;
//! [`wake::WakeClass`], the class the supervisor gives each process; and
//! [`env`], the one spelling of the `RTDEPLOY_*` environment, with
//! [`env::ProcessEnv`], what the supervisor passes a process and the
//! runtime reads back.
//!
//! Design rules:
//! - std, libc, thiserror and serde only, so `controller` (which a
//!   controller binary links alone) and `cpusets` can depend on it. serde
//!   is here because the units are robot.yaml's: a duration is written the
//!   same way in `channels:`, `cpus:` and `log:`, and each crate owns the
//!   serde types of its own section, so the unit's serde form must live
//!   below all of them. Derive and the data model only: no format crate;
//! - every read is bounded in memory and in time: a file's size as stat(2)
//!   reports it is never trusted (procfs says 0, sysfs 4096, a FIFO or a
//!   device anything), and nothing here waits on a FIFO or a device;
//! - every error carries the value (or the path) it is about, lower case,
//!   without its cause repeated as a `source()`.

pub mod bounded;
pub mod cpu;
pub mod duration;
pub mod env;
pub mod error;
pub mod kernel;
pub mod path;
pub mod problem;
pub mod sched;
pub mod size;
pub mod wake;
