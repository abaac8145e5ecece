//! The process environment: the one spelling of the `RTDEPLOY_*`
//! variables, the contract between the supervisor (which sets them for
//! each process it starts), the CLI, the runtime a controller links
//! (which reads its own), the check's workers and the tests.
//!
//! This file is the only one that writes a variable's name; every other
//! refers to the constants below. What the supervisor passes a process
//! and the runtime reads back is one value, [`ProcessEnv`]: built by the
//! supervisor and turned into variables with [`ProcessEnv::to_env`], read
//! by the runtime with [`ProcessEnv::from_env`]. A value the runtime
//! cannot read is an error naming the variable and the value, never a
//! silent default.
//!
//! The other variables are not a process's contract with its supervisor:
//! [`CONFIG`] is the CLI's, [`DENY_SYSCALLS`] the supervisor's own (it
//! filters its children's system calls), [`CHECK_ENGINE`] the check's
//! (engine and workers), and the rest hooks of the tests and of the
//! `fault-injection` builds.

use std::fmt;
use std::path::PathBuf;

use crate::sched::Policy;
use crate::wake::WakeClass;

// What the supervisor gives a process (all in [`ProcessEnv`]).

/// Where channels live: `<prefix>/dev/shm/rtdeploy`
/// ([`crate::path::SHM_DIR`] under the prefix).
pub const SHM_DIR: &str = "RTDEPLOY_SHM_DIR";
/// The process's name in robot.yaml (its timing channel is named after
/// it); also the supervisor's journal field of a process's lines.
pub const PROCESS: &str = "RTDEPLOY_PROCESS";
/// The robot's name (robot.yaml `robot.name`); also the supervisor's
/// journal field of every line.
pub const ROBOT: &str = "RTDEPLOY_ROBOT";
/// The process's wake class (`real-time`, `best-effort`), decided from
/// robot.yaml.
pub const WAKE_CLASS: &str = "RTDEPLOY_WAKE_CLASS";
/// The policy and priority robot.yaml gives the process (`fifo:80`,
/// `other`; see [`SchedSpec`]), which the runtime checks the attaching
/// thread against.
pub const SCHED: &str = "RTDEPLOY_SCHED";
/// A wake backend forced on the process's event loops (`io_uring-futex`,
/// `futex_waitv`, `doorbell`), from its robot.yaml `env:`.
pub const BACKEND: &str = "RTDEPLOY_BACKEND";
/// How often a loop looks at its channels itself, in microseconds (0:
/// never).
pub const WAKE_CHECK: &str = "RTDEPLOY_WAKE_CHECK";
/// The supervisor's ftrace instance (`.../tracing/instances/rtdeploy-<pid>`)
/// a process writes its markers to.
pub const TRACE: &str = "RTDEPLOY_TRACE";
/// A handler that starts more than this many nanoseconds after its event
/// is a traced miss.
pub const TRACE_MISS_NS: &str = "RTDEPLOY_TRACE_MISS_NS";
/// Set by `deploy sim`: the descriptor of the process's link to its
/// simulation's coordinator (a `SOCK_SEQPACKET` socket; see
/// [`crate::sim_link`]). The process's event loop then runs on a virtual
/// clock and takes its turns from the coordinator.
pub const SIM: &str = "RTDEPLOY_SIM";
/// With [`SIM`]: the virtual time the process starts at, in nanoseconds
/// (a process the simulation restarts starts later than the first), which
/// its loop's clock reads until its first turn.
pub const SIM_START_NS: &str = "RTDEPLOY_SIM_START_NS";

// Of the CLI and the supervisor.

/// robot.yaml's path when `-c` does not name it (`deploy`'s default; the
/// systemd unit sets it).
pub const CONFIG: &str = "RTDEPLOY_CONFIG";
/// System calls that answer ENOSYS in every process the supervisor
/// starts (a comma list, see `controller::supervise`): an older kernel, or
/// one with io_uring off, on the machine at hand.
pub const DENY_SYSCALLS: &str = "RTDEPLOY_DENY_SYSCALLS";
/// The pid of the check engine that started a worker (the worker dies
/// with it).
pub const CHECK_ENGINE: &str = "RTDEPLOY_CHECK_ENGINE";

// Hooks of the tests and of `fault-injection` builds.

/// The installer's step after which it aborts (`fault-injection` builds).
pub const FAULT: &str = "RTDEPLOY_FAULT";
/// A kernel to pretend to be (`jetpack6`, `no-io_uring`) through seccomp
/// (`fault-injection` builds of the runtime).
pub const TEST_KERNEL_PROFILE: &str = "RTDEPLOY_TEST_KERNEL_PROFILE";
/// `deploy update`'s transfer is cut after this many bytes (tests).
pub const TEST_CUT_AFTER: &str = "RTDEPLOY_TEST_CUT_AFTER";
/// The prefix a test's child process works in.
pub const TEST_PREFIX: &str = "RTDEPLOY_TEST_PREFIX";
/// The bundle a test's child process installs.
pub const TEST_BUNDLE: &str = "RTDEPLOY_TEST_BUNDLE";
/// What a test's child process does (`install`, `commit`), and with which
/// options (`counted`: boot attempts counted by the boot loader).
pub const TEST_ACTION: &str = "RTDEPLOY_TEST_ACTION";
/// The control socket a test's child process connects to.
pub const TEST_CLIENT_SOCKET: &str = "RTDEPLOY_TEST_CLIENT_SOCKET";
/// How many processes a test's child process starts.
pub const TEST_PROCESSES: &str = "RTDEPLOY_TEST_PROCESSES";
/// Which hostile input a bounded-reading test's child process reads.
pub const BOUNDED_CASE: &str = "RTDEPLOY_BOUNDED_CASE";
/// Where a test's child process that is to be killed keeps its channels.
pub const KILL_CHILD: &str = "RTDEPLOY_KILL_CHILD";
/// Set: the fuzz-seed tests write the seeds instead of comparing them.
pub const WRITE_SEEDS: &str = "RTDEPLOY_WRITE_SEEDS";

// The build and end-to-end tools' own (scripts/ and deploy/e2e).
/// Where fetched kernels, bases, build chroots and vendor trees are kept,
/// keyed by content.
pub const CACHE: &str = "RTDEPLOY_CACHE";
/// Where scripts/build-aarch64.sh puts the aarch64 programs.
pub const AARCH64_OUT: &str = "RTDEPLOY_AARCH64_OUT";
/// Which PREEMPT_RT kernel series scripts/fetch-rt-kernel.sh fetches
/// (unset: trixie's; `5.10`: bullseye's).
pub const KERNEL_SERIES: &str = "RTDEPLOY_KERNEL_SERIES";

/// The policy and priority robot.yaml gives a process, as [`SCHED`]
/// writes them: `fifo:80`, `rr:10`, `other`, `batch`, `idle`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedSpec {
    pub policy: Policy,
    /// 1 to 99 for `fifo` and `rr`, 0 for the others.
    pub priority: u32,
}

impl SchedSpec {
    /// Reads [`SCHED`]'s form; `None` when `text` is not one.
    pub fn parse(text: &str) -> Option<SchedSpec> {
        let (policy, priority) = match text.split_once(':') {
            Some(("fifo", p)) => (Policy::Fifo, p.parse::<u32>().ok()?),
            Some(("rr", p)) => (Policy::Rr, p.parse::<u32>().ok()?),
            None if text == "other" => (Policy::Other, 0),
            None if text == "batch" => (Policy::Batch, 0),
            None if text == "idle" => (Policy::Idle, 0),
            _ => return None,
        };
        if policy.has_priority() && !(1..=99).contains(&priority) {
            return None;
        }
        Some(SchedSpec { policy, priority })
    }
}

impl fmt::Display for SchedSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.policy.has_priority() {
            write!(f, "{}:{}", self.policy, self.priority)
        } else {
            f.write_str(self.policy.name())
        }
    }
}

/// What the supervisor passes a process, and the process reads: every
/// field is one variable (two for the traced misses), `None` when unset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessEnv {
    /// [`SHM_DIR`].
    pub shm_dir: Option<PathBuf>,
    /// [`PROCESS`].
    pub process: Option<String>,
    /// [`ROBOT`].
    pub robot: Option<String>,
    /// [`WAKE_CLASS`]; [`ProcessEnv::from_env`] refuses it without
    /// [`SCHED`].
    pub wake_class: Option<WakeClass>,
    /// [`SCHED`].
    pub sched: Option<SchedSpec>,
    /// [`BACKEND`], as written (the runtime knows the backends' names and
    /// says when it is none of them).
    pub backend: Option<String>,
    /// [`WAKE_CHECK`], microseconds.
    pub wake_check_us: Option<u64>,
    /// [`TRACE`].
    pub trace: Option<PathBuf>,
    /// [`TRACE_MISS_NS`].
    pub trace_miss_ns: Option<u64>,
    /// [`SIM`]: a descriptor number (3 or more).
    pub sim_fd: Option<i32>,
    /// [`SIM_START_NS`].
    pub sim_start_ns: Option<u64>,
}

/// The environment holds a value the runtime does not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProcessEnvError {
    #[error("{WAKE_CLASS}={value:?} is not a wake class (expected real-time or best-effort)")]
    Class { value: String },
    #[error("{SCHED}={value:?} is not a policy (expected other, batch, idle, or fifo:N / rr:N with N from 1 to 99)")]
    Sched { value: String },
    #[error("{WAKE_CLASS} is set without {SCHED} (the supervisor sets both)")]
    SchedMissing,
    #[error("{var}={value:?} is not a whole number")]
    NotANumber { var: &'static str, value: String },
    #[error("{SIM}={value:?} is not a descriptor number (3 to {})", i32::MAX)]
    SimFd { value: String },
}

impl ProcessEnv {
    /// The variables of the fields that are set, in the order of the
    /// fields.
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        let path = |p: &PathBuf| p.to_string_lossy().into_owned();
        [
            (SHM_DIR, self.shm_dir.as_ref().map(path)),
            (PROCESS, self.process.clone()),
            (ROBOT, self.robot.clone()),
            (WAKE_CLASS, self.wake_class.map(|c| c.name().to_string())),
            (SCHED, self.sched.map(|s| s.to_string())),
            (BACKEND, self.backend.clone()),
            (WAKE_CHECK, self.wake_check_us.map(|us| us.to_string())),
            (TRACE, self.trace.as_ref().map(path)),
            (TRACE_MISS_NS, self.trace_miss_ns.map(|ns| ns.to_string())),
            (SIM, self.sim_fd.map(|fd| fd.to_string())),
            (SIM_START_NS, self.sim_start_ns.map(|ns| ns.to_string())),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k, v?)))
        .collect()
    }

    /// Reads the variables through `get` (`|k| std::env::var(k).ok()` for
    /// this process's own); an empty value is unset. [`SCHED`] counts only
    /// with [`WAKE_CLASS`], which needs it.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<ProcessEnv, ProcessEnvError> {
        let get = |k: &str| get(k).filter(|v| !v.is_empty());
        let number = |var: &'static str| -> Result<Option<u64>, ProcessEnvError> {
            get(var)
                .map(|value| {
                    value
                        .trim()
                        .parse()
                        .map_err(|_| ProcessEnvError::NotANumber { var, value })
                })
                .transpose()
        };
        let wake_class = get(WAKE_CLASS)
            .map(|value| WakeClass::from_name(&value).ok_or(ProcessEnvError::Class { value }))
            .transpose()?;
        let sched = match wake_class {
            None => None,
            Some(_) => {
                let value = get(SCHED).ok_or(ProcessEnvError::SchedMissing)?;
                Some(SchedSpec::parse(&value).ok_or(ProcessEnvError::Sched { value })?)
            }
        };
        Ok(ProcessEnv {
            shm_dir: get(SHM_DIR).map(PathBuf::from),
            process: get(PROCESS),
            robot: get(ROBOT),
            wake_class,
            sched,
            backend: get(BACKEND),
            wake_check_us: number(WAKE_CHECK)?,
            trace: get(TRACE).map(PathBuf::from),
            trace_miss_ns: number(TRACE_MISS_NS)?,
            sim_fd: get(SIM)
                .map(|value| match value.trim().parse::<i32>() {
                    Ok(fd) if fd >= 3 => Ok(fd),
                    _ => Err(ProcessEnvError::SimFd { value }),
                })
                .transpose()?,
            sim_start_ns: number(SIM_START_NS)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn read(vars: &[(&str, &str)]) -> Result<ProcessEnv, ProcessEnvError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        ProcessEnv::from_env(|k| map.get(k).cloned())
    }

    #[test]
    fn what_the_supervisor_writes_the_runtime_reads_back() {
        let env = ProcessEnv {
            shm_dir: Some("/pfx/dev/shm/rtdeploy".into()),
            process: Some("imu".into()),
            robot: Some("arm-1".into()),
            wake_class: Some(WakeClass::RealTime),
            sched: Some(SchedSpec {
                policy: Policy::Fifo,
                priority: 80,
            }),
            backend: Some("doorbell".into()),
            wake_check_us: Some(0),
            trace: Some("/sys/kernel/tracing/instances/rtdeploy-7".into()),
            trace_miss_ns: Some(200_000),
            sim_fd: Some(5),
            sim_start_ns: Some(1_400_000_000),
        };
        let vars = env.to_env();
        assert_eq!(vars.len(), 11);
        assert!(vars.iter().all(|(k, _)| k.starts_with("RTDEPLOY_")));
        assert!(vars.contains(&(SCHED, "fifo:80".into())));
        let map: HashMap<&str, String> = vars.into_iter().collect();
        assert_eq!(ProcessEnv::from_env(|k| map.get(k).cloned()).unwrap(), env);
        assert_eq!(ProcessEnv::default().to_env(), vec![]);
        assert_eq!(read(&[]).unwrap(), ProcessEnv::default());
    }

    #[test]
    fn the_class_round_trips_and_garbage_is_refused_by_name() {
        for (policy, prio) in [(Policy::Fifo, 80), (Policy::Rr, 1), (Policy::Other, 0)] {
            let v = SchedSpec {
                policy,
                priority: prio,
            }
            .to_string();
            let e = read(&[(WAKE_CLASS, "real-time"), (SCHED, &v)]).unwrap();
            let s = e.sched.unwrap();
            assert_eq!(
                (s.policy, s.priority, e.wake_class),
                (policy, prio, Some(WakeClass::RealTime))
            );
        }
        // A program run by hand: no class, whatever else is set.
        let e = read(&[(SCHED, "fifo:80")]).unwrap();
        assert_eq!((e.wake_class, e.sched), (None, None));
        let e = read(&[(WAKE_CLASS, "rt"), (SCHED, "fifo:80")])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"rt\"") && e.contains("real-time or best-effort"),
            "{e}"
        );
        for bad in ["fifo:0", "fifo:100", "fifo:x", "fifo", "deadline:3", ""] {
            let e = read(&[(WAKE_CLASS, "best-effort"), (SCHED, bad)]).unwrap_err();
            assert!(
                matches!(
                    e,
                    ProcessEnvError::Sched { .. } | ProcessEnvError::SchedMissing
                ),
                "{bad}: {e}"
            );
        }
        assert_eq!(
            read(&[(WAKE_CLASS, "best-effort")]).unwrap_err(),
            ProcessEnvError::SchedMissing
        );
        assert_eq!(
            read(&[(WAKE_CHECK, "50ms")]).unwrap_err().to_string(),
            "RTDEPLOY_WAKE_CHECK=\"50ms\" is not a whole number"
        );
        // The simulation link: a descriptor past stdin, stdout and stderr.
        for bad in ["0", "2", "-1", "x", "99999999999"] {
            assert_eq!(
                read(&[(SIM, bad)]).unwrap_err(),
                ProcessEnvError::SimFd { value: bad.into() },
                "{bad}"
            );
        }
        assert_eq!(read(&[(SIM, "7")]).unwrap().sim_fd, Some(7));
    }
}
