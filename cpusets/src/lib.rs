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
//!
//! The modules in the order the work flows: [`model`] (and [`model::live`],
//! which only reads) turns /proc/interrupts, /proc/irq, /proc/PID/stat and
//! status, /proc/mounts and cgroup files into values; [`plan::plan`] makes a
//! [`plan::RuntimePlan`] from the sections and the interrupts and threads
//! found; [`apply::apply`] writes it (read before write, so a second run
//! changes nothing; no `O_CREAT`, so a wrong path fails as on the kernel) and
//! reports each write's outcome; [`verify::verify`] reads everything back
//! and reports each check as ok, drift, unmovable or unsupported. Apply and
//! verify share what they know of the system through [`model`] (the cgroup
//! hierarchy, partition states, scheduling policies), never through each
//! other; what apply could not change reaches a later verify in the
//! [`apply_state`] file. [`cmdline`] and [`conf_files`] render the kernel
//! command line and the /etc files an image carries. [`power`] holds the
//! Jetson power modes (nvpmodel) and runs the tool; [`rescan`] finds the
//! interrupts and IRQ threads that appear after apply, for the supervisor
//! to place them.
//!
//! Dependencies: `units` for the CPU list type, the durations robot.yaml
//! writes, kernel versions and the features each brought, and the one
//! wrapper of `sched_setattr(2)` and `sched_setaffinity(2)` (the policy
//! and CPUs of kernel threads); no other crate of ours (what a kernel
//! offers the runtime is the runtime's to say: verify reports it through
//! the function its caller passes); `libc` for a process group's signal
//! and errno values; `serde_json` for the apply-state file. Globs on
//! thread and interrupt names use a small matcher in [`model`].

pub mod apply;
pub mod apply_state;
pub mod board;
pub mod cmdline;
pub mod conf_files;
pub mod config;
pub mod model;
pub mod plan;
pub mod power;
pub mod rescan;
pub mod verify;
