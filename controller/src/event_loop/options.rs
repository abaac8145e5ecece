//! What a loop is told: its backend, wake class, timing reports, wake
//! check and where the channels are, from code or from the environment
//! the supervisor sets.

use std::path::PathBuf;
use std::time::Duration;

use units::env::{ProcessEnv, ProcessEnvError};

use crate::time::Clock;
use crate::wake::{Attach, WakeClass};

use super::Backend;

/// How often a loop looks at its watched channels' indexes itself unless
/// told otherwise (see [`LoopOptions::wake_check`]).
pub const DEFAULT_WAKE_CHECK: Duration = Duration::from_millis(50);

/// Where and how often the loop publishes its timing report.
#[derive(Debug, Clone)]
pub struct TimingOptions {
    /// `<prefix>/dev/shm/rtdeploy`.
    pub shm_dir: PathBuf,
    /// The process name ([`units::env::PROCESS`]).
    pub process: String,
    pub period: Duration,
}

/// Options of a loop.
#[derive(Debug, Clone)]
pub struct LoopOptions {
    /// Force a backend (the default takes the best the kernel has).
    pub backend: Option<Backend>,
    /// Publish timing reports; `None` keeps them in the loop only.
    pub timing: Option<TimingOptions>,
    /// `/proc`, for publisher/subscriber ownership.
    pub proc_root: PathBuf,
    /// Where channels opened by name live (`<prefix>/dev/shm/rtdeploy`).
    pub shm_dir: PathBuf,
    /// How often the loop looks at the index of each watched channel
    /// itself, so that a message whose wake was lost (a corrupted waiter
    /// count, a publisher killed before its wake) is handled at most this
    /// late; `None` trusts the wakes alone. Each look is one timer
    /// expiry of the loop (a few microseconds of its CPU).
    pub wake_check: Option<Duration>,
    /// Whose words the loop's waits and senders use ([`crate::wake`]);
    /// under the supervisor, robot.yaml's ([`units::env::WAKE_CLASS`]). A
    /// real-time loop sleeps on its doorbell unless `backend` says
    /// otherwise.
    pub class: WakeClass,
    /// What robot.yaml gives the process, checked against the attaching
    /// thread (see [`Attach::check`]); `None` checks nothing.
    pub attach: Option<Attach>,
    /// The supervisor's environment could not be read ([`LoopOptions::from_env`]):
    /// [`EventLoop::new`] refuses to start with it.
    pub env_error: Option<ProcessEnvError>,
    /// Where the loop and its senders take the time. A virtual clock
    /// makes a simulated loop ([`super::Backend::Simulated`]), which runs
    /// when a simulation gives it a turn ([`crate::sim`]).
    pub clock: Clock,
    /// The descriptor of the link to a simulation's coordinator
    /// ([`units::env::SIM`], set by `deploy sim`): the loop, on a virtual
    /// clock, takes its turns and its time from it in
    /// [`super::EventLoop::run`]. One loop per process takes it.
    pub sim_fd: Option<i32>,
}

impl Default for LoopOptions {
    fn default() -> Self {
        LoopOptions {
            backend: None,
            timing: None,
            proc_root: PathBuf::from("/proc"),
            shm_dir: PathBuf::from(units::path::SHM_DIR),
            wake_check: Some(DEFAULT_WAKE_CHECK),
            class: WakeClass::BestEffort,
            attach: None,
            env_error: None,
            clock: Clock::Monotonic,
            sim_fd: None,
        }
    }
}

impl LoopOptions {
    /// Options from the environment the supervisor sets
    /// ([`ProcessEnv`], read from this process's environment; see
    /// [`LoopOptions::from_process_env`]).
    pub fn from_env() -> LoopOptions {
        LoopOptions::from_process_env(ProcessEnv::from_env(|k| std::env::var(k).ok()))
    }

    /// Options from a process environment: its shm directory (where
    /// channels are) and process name (timing reports are published when
    /// both are set), its forced backend (`io_uring-futex`, `futex_waitv`
    /// or `doorbell`; another name is said on stderr and the probe
    /// picks), its wake class and the policy robot.yaml gives the process
    /// (see [`crate::wake`]), its wake check (microseconds, 0 for none)
    /// for [`LoopOptions::wake_check`], and the supervisor's miss tracing
    /// ([`crate::miss_trace`]). An environment that could not be read is
    /// kept in [`LoopOptions::env_error`], which [`EventLoop::new`]
    /// refuses.
    pub fn from_process_env(env: Result<ProcessEnv, ProcessEnvError>) -> LoopOptions {
        let mut o = LoopOptions::default();
        let env = match env {
            Ok(env) => env,
            Err(e) => {
                o.env_error = Some(e);
                return o;
            }
        };
        if let Some(dir) = &env.shm_dir {
            o.shm_dir = dir.clone();
        }
        if let (Some(dir), Some(process)) = (&env.shm_dir, &env.process) {
            o.timing = Some(TimingOptions {
                shm_dir: dir.clone(),
                process: process.clone(),
                period: Duration::from_secs(1),
            });
        }
        o.backend = env.backend.as_deref().and_then(|name| {
            let b = Backend::from_name(name);
            if b.is_none() {
                eprintln!(
                    "rtdeploy: {}={name:?} is not a backend (io_uring-futex, futex_waitv, doorbell); taking the best the kernel has",
                    units::env::BACKEND
                );
            }
            b
        });
        // The supervisor's miss tracing (robot.yaml check.trace_on_miss).
        if let Some(problem) = crate::miss_trace::init(&env) {
            eprintln!("rtdeploy: {problem}");
        }
        // Under `deploy sim`: a virtual clock from the simulation's start,
        // and the coordinator's link.
        if let Some(fd) = env.sim_fd {
            o.sim_fd = Some(fd);
            let start = env
                .sim_start_ns
                .map_or(crate::sim::START, crate::time::Monotonic::from_nanos);
            o.clock = Clock::Virtual(crate::time::VirtualClock::new(start));
        }
        if let Some(us) = env.wake_check_us {
            o.wake_check = (us > 0).then(|| Duration::from_micros(us));
        }
        if let Some(a) = Attach::of_env(&env) {
            o.class = a.class;
            o.attach = Some(a);
        }
        o
    }
}
