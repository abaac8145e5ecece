//! The units and contracts every crate of rtdeploy shares, and that depend
//! on no crate of ours. Each exists once, here, so that the runtime a
//! controller links, the CPU plan, the supervisor, the check and the CLI
//! agree without one of them lending its types to the others:
//!
//! - [`bounded`]: the one way a file from outside the process is read;
//! - [`path`]: the one way a path from robot.yaml is put under a root, and
//!   the on-robot channel directory ([`path::SHM_DIR`]);
//! - [`duration`], [`size`]: the units robot.yaml writes in every section
//!   (`500us`, `64MiB`), and [`problem`], what a section's validator
//!   reports;
//! - [`cpu::CpuSet`]: the one type of a set of CPUs, in the kernel's list
//!   and mask forms;
//! - [`kernel`]: a kernel's version, and the first release of each feature
//!   the CPU plan and the runtime reason about ([`kernel::needs`]);
//! - [`sched`]: the one wrapper of a thread's scheduling policy and CPU
//!   affinity (`sched_setattr`, `sched_getattr`, `sched_setaffinity`,
//!   `sched_getaffinity`);
//! - [`wake::WakeClass`] and [`env`](mod@env): the contract between the supervisor
//!   and a process: the one spelling of every `RTDEPLOY_*` variable, and
//!   [`env::ProcessEnv`], what the supervisor passes and the runtime reads;
//! - [`sim_link`]: the frames between a simulation's coordinator and the
//!   event loops it gives turns to;
//! - [`error::Chain`]: the one printer of an error with its causes.
//!
//! What a unit *means* to a crate stays with that crate: what a kernel
//! offers the runtime (its wake backend) is `controller::kernel`, the wake
//! rule is `controller::wake`, the sections of robot.yaml are each their
//! crate's.
//!
//! Design rules:
//! - std, libc, thiserror and serde only, so `controller` (which a
//!   controller binary links alone) and `cpusets` can depend on it. serde
//!   is here because the units are robot.yaml's: a duration is written the
//!   same way in `channels:`, `cpus:` and `log:`, and each crate owns the
//!   serde types of its own section, so the unit's serde form must live
//!   below all of them. Derive and the data model only: no format crate
//!   (no serde_json, no YAML);
//! - nothing here holds state or starts anything: values, parsers, and
//!   system calls on what the caller passes;
//! - every read is bounded in memory and in time: a file's size as stat(2)
//!   reports it is never trusted (procfs says 0, sysfs 4096, a FIFO or a
//!   device anything), and nothing here waits on a FIFO or a device;
//! - [`sched`] allocates nothing, its errors included, so the supervisor
//!   calls it between `fork` and `exec`; `unsafe` lives only there, each
//!   block with its `SAFETY:` argument;
//! - no other file of the workspace writes an `RTDEPLOY_` variable's name:
//!   it names the constant in [`env`](mod@env);
//! - every error carries the value (or the path) it is about, lower case,
//!   without its cause repeated as a `source()`.

pub mod bounded;
pub mod cpu;
pub mod duration;
pub mod env;
pub mod error;
pub mod futex;
pub mod kernel;
pub mod path;
pub mod problem;
pub mod sched;
pub mod sim_link;
pub mod size;
pub mod wake;
