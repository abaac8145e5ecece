//! Starting one process with the attributes `robot.yaml` gives it.
//!
//! [`prepare`] turns a [`ProcessConfig`] into everything the child needs,
//! allocated up front: C strings for the program, arguments and
//! environment, the `sched_attr`, the CPU mask, the rlimits, the ids, and an
//! open `cgroup.procs`. [`spawn`] then forks; between `fork` and `execve`
//! the child makes only raw, async-signal-safe system calls on that
//! prepared data, and reports a failure as `(step, errno)` through a
//! close-on-exec pipe, so the parent learns *which* step failed and why
//! (an empty read means `execve` succeeded).
//!
//! Order in the child, and why:
//! 1. `setpgid(0, 0)`: its own process group, so a stop reaches the
//!    process's own children too;
//! 2. signal mask and dispositions back to default (the supervisor blocks
//!    the signals it reads through a signalfd, and ignores SIGPIPE);
//! 3. stdin from /dev/null, stdout and stderr into the log pipe;
//! 4. into the cgroup (before the affinity, which the cgroup's cpuset may
//!    narrow);
//! 5. rlimits, then `sched_setattr` (policy, priority, nice), then the CPU
//!    affinity, all while still privileged; only what robot.yaml asks for
//!    is set: a `policy: other` process without `nice:` keeps the nice
//!    value it inherits (a supervisor started under `nice -n 19` cannot
//!    lower it without CAP_SYS_NICE), and is only moved to SCHED_OTHER
//!    when it inherited another policy;
//! 6. supplementary groups, gid, uid;
//! 7. `PR_SET_PDEATHSIG` last, because changing credentials clears it, then
//!    a check that the supervisor did not die before it was set;
//! 8. working directory, `execve`.
//!
//! A step the kernel refuses for want of a privilege (EPERM, EACCES) says
//! which one is missing and how to grant it ([`privilege_hint`]).

#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use cpusets::config::Policy;
use units::cpu::CpuSet;
use units::env::ProcessEnv;
use units::sched::{self, Policy as SchedPolicy, SchedAttr, SchedGetError};

use crate::accounts::{AccountResolveError, Accounts, Identity};
use crate::config::{Memlock, ProcessConfig};

/// The steps of the child between `fork` and `execve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Step {
    Setpgid = 1,
    Signals = 2,
    Stdio = 3,
    Cgroup = 4,
    RlimitRtprio = 5,
    RlimitMemlock = 6,
    RlimitRttime = 7,
    Sched = 8,
    Affinity = 9,
    Setgroups = 10,
    Setgid = 11,
    Setuid = 12,
    Pdeathsig = 13,
    Chdir = 14,
    Exec = 15,
    Seccomp = 16,
}

impl Step {
    fn from_u32(v: u32) -> Option<Step> {
        use Step::*;
        [
            Setpgid,
            Signals,
            Stdio,
            Cgroup,
            RlimitRtprio,
            RlimitMemlock,
            RlimitRttime,
            Sched,
            Affinity,
            Setgroups,
            Setgid,
            Setuid,
            Pdeathsig,
            Chdir,
            Exec,
            Seccomp,
        ]
        .into_iter()
        .find(|s| *s as u32 == v)
    }
}

/// Why a process could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ProcessSpawnError {
    #[error("process `{name}`: {err}")]
    Account {
        name: String,
        err: AccountResolveError,
    },
    #[error("process `{name}`: {what} contains a NUL byte")]
    Nul { name: String, what: String },
    #[error("process `{name}`: cannot open {}: {err}", path.display())]
    Open {
        name: String,
        path: PathBuf,
        err: std::io::Error,
    },
    #[error("process `{name}`: {what} failed: {err}")]
    Setup {
        name: String,
        what: String,
        err: std::io::Error,
    },
    #[error("process `{name}`: {what} failed: {err}{}", hint.as_deref().map(|h| format!("; {h}")).unwrap_or_default())]
    Child {
        name: String,
        step: Step,
        what: String,
        err: std::io::Error,
        /// Which privilege the step lacked and how to grant it, when the
        /// kernel refused it for want of one.
        hint: Option<String>,
    },
}

/// Where a process's paths and ids are looked up.
#[derive(Debug, Clone)]
pub struct SpawnContext {
    /// The install prefix (`/` on a robot).
    pub prefix: PathBuf,
    /// `<prefix>/etc/passwd` and `<prefix>/etc/group`.
    pub accounts: Accounts,
    /// The supervisor's own (uid, gid).
    pub own_ids: (u32, u32),
    /// `cgroup.procs` of the cgroup for real-time processes, when it exists.
    pub rt_cgroup: Option<PathBuf>,
    /// `cgroup.procs` of the housekeeping cgroup, when it exists.
    pub housekeeping_cgroup: Option<PathBuf>,
    /// Variables every process gets (before its own `env:`).
    pub base_env: BTreeMap<String, String>,
    /// System calls every process gets ENOSYS for (`RTDEPLOY_DENY_SYSCALLS`:
    /// to run the controllers as on an older kernel, see
    /// [`controller::supervise`]).
    pub deny: Option<controller::supervise::DenyFilter>,
}

/// The program a process runs: absolute as written, else inside the
/// current release's `bin/` (`imu` and `bin/imu` both name
/// `<prefix>/opt/rtdeploy/current/bin/imu`).
pub fn resolve_exec(prefix: &Path, exec: &str) -> PathBuf {
    if exec.starts_with('/') {
        return PathBuf::from(exec);
    }
    let bin = releases::Layout::new(prefix).current_bin();
    bin.join(exec.strip_prefix("bin/").unwrap_or(exec))
}

/// What the child does about its scheduling policy.
#[derive(Debug, Clone, Copy)]
enum Sched {
    /// `sched_setattr` with these attributes: a real-time policy, or
    /// `policy: other` with a `nice:`.
    Set(SchedAttr),
    /// `policy: other` without `nice:`: the inherited nice value stays;
    /// only a process that inherited another policy (a supervisor running
    /// under SCHED_FIFO) is moved to SCHED_OTHER, at that nice value.
    Other,
}

/// Everything the child needs, allocated before `fork`.
pub struct Prepared {
    pub name: String,
    pub path: PathBuf,
    path_c: CString,
    _argv: Vec<CString>,
    argv_ptrs: Vec<*const libc::c_char>,
    _envp: Vec<CString>,
    envp_ptrs: Vec<*const libc::c_char>,
    cwd: CString,
    cwd_text: String,
    identity: Option<Identity>,
    groups: Vec<libc::gid_t>,
    sched: Sched,
    sched_text: String,
    /// The policy, priority and nice robot.yaml asks for, for hints.
    policy: Policy,
    priority: u32,
    nice: Option<i32>,
    affinity: CpuSet,
    rlimits: Vec<(Step, libc::__rlimit_resource_t, libc::rlimit)>,
    cgroup: Option<(PathBuf, File)>,
    devnull: File,
    deny: Option<controller::supervise::DenyFilter>,
}

fn cstr(name: &str, what: &str, bytes: &[u8]) -> Result<CString, ProcessSpawnError> {
    CString::new(bytes).map_err(|_| ProcessSpawnError::Nul {
        name: name.to_string(),
        what: what.to_string(),
    })
}

/// Prepares a process for [`spawn`]: resolves its program, user and group,
/// builds its environment and attributes, opens its cgroup.
pub fn prepare(
    p: &ProcessConfig,
    cpus: &CpuSet,
    ctx: &SpawnContext,
) -> Result<Prepared, ProcessSpawnError> {
    let name = p.name.clone();
    let path = resolve_exec(&ctx.prefix, &p.exec);
    let path_c = cstr(&name, "exec", path.as_os_str().as_bytes())?;
    let mut argv = vec![path_c.clone()];
    for a in &p.args {
        argv.push(cstr(&name, "args", a.as_bytes())?);
    }
    let mut env = ctx.base_env.clone();
    let own = ProcessEnv {
        process: Some(p.name.clone()),
        ..ProcessEnv::default()
    };
    env.extend(own.to_env().into_iter().map(|(k, v)| (k.to_string(), v)));
    for (k, v) in &p.env {
        env.insert(k.clone(), v.clone());
    }
    let envp = env
        .iter()
        .map(|(k, v)| cstr(&name, &format!("env {k}"), format!("{k}={v}").as_bytes()))
        .collect::<Result<Vec<_>, _>>()?;
    let argv_ptrs = argv
        .iter()
        .map(|c| c.as_ptr())
        .chain([std::ptr::null()])
        .collect();
    let envp_ptrs = envp
        .iter()
        .map(|c| c.as_ptr())
        .chain([std::ptr::null()])
        .collect();

    let identity = ctx
        .accounts
        .identity(p.user.as_deref(), p.group.as_deref(), ctx.own_ids)
        .map_err(|err| ProcessSpawnError::Account {
            name: name.clone(),
            err,
        })?
        // Already that user and group (a supervisor run as the user
        // robot.yaml names): nothing to change, and no privilege to
        // change the supplementary groups with.
        .filter(|i| (i.uid, i.gid) != ctx.own_ids);
    let groups = identity
        .as_ref()
        .map(|i| i.groups.clone())
        .unwrap_or_default();

    let cwd_text = p.working_dir.clone().unwrap_or_else(|| "/".to_string());
    let cwd = cstr(&name, "working_dir", cwd_text.as_bytes())?;

    let priority = if p.policy.is_realtime() {
        p.priority.unwrap_or(1)
    } else {
        0
    };
    let attr = |nice| SchedAttr {
        policy: p.policy.sched(),
        priority,
        nice,
    };
    let (sched, sched_text) = match (p.policy, p.nice) {
        (Policy::Other, Some(n)) => (
            Sched::Set(attr(Some(n))),
            format!("sched_setattr other nice {n}"),
        ),
        (Policy::Other, None) => (
            Sched::Other,
            "sched_setattr other (the inherited nice kept)".to_string(),
        ),
        (pol, _) => (
            Sched::Set(attr(None)),
            format!("sched_setattr {pol} {priority}"),
        ),
    };

    let mut rlimits = Vec::new();
    if p.policy.is_realtime() {
        let v = priority as libc::rlim_t;
        rlimits.push((
            Step::RlimitRtprio,
            libc::RLIMIT_RTPRIO,
            libc::rlimit {
                rlim_cur: v,
                rlim_max: v,
            },
        ));
    }
    if let Some(m) = p.memlock {
        let v = match m {
            Memlock::Unlimited => libc::RLIM_INFINITY,
            Memlock::Bytes(b) => b.0 as libc::rlim_t,
        };
        rlimits.push((
            Step::RlimitMemlock,
            libc::RLIMIT_MEMLOCK,
            libc::rlimit {
                rlim_cur: v,
                rlim_max: v,
            },
        ));
    }
    if let Some(d) = p.rttime {
        let us = d.0.as_micros().min(u64::MAX as u128) as libc::rlim_t;
        rlimits.push((
            Step::RlimitRttime,
            libc::RLIMIT_RTTIME,
            libc::rlimit {
                rlim_cur: us,
                rlim_max: us,
            },
        ));
    }

    let cgroup_path = if p.policy.is_realtime() {
        &ctx.rt_cgroup
    } else {
        &ctx.housekeeping_cgroup
    };
    let cgroup = match cgroup_path {
        Some(path) => {
            let f = OpenOptions::new().write(true).open(path).map_err(|err| {
                ProcessSpawnError::Open {
                    name: name.clone(),
                    path: path.clone(),
                    err,
                }
            })?;
            Some((path.clone(), f))
        }
        None => None,
    };
    let devnull = File::open("/dev/null").map_err(|err| ProcessSpawnError::Open {
        name: name.clone(),
        path: "/dev/null".into(),
        err,
    })?;

    Ok(Prepared {
        name,
        path,
        path_c,
        _argv: argv,
        argv_ptrs,
        _envp: envp,
        envp_ptrs,
        cwd,
        cwd_text,
        identity,
        groups,
        sched,
        sched_text,
        policy: p.policy,
        priority,
        nice: p.nice,
        affinity: cpus.clone(),
        rlimits,
        cgroup,
        devnull,
        deny: ctx.deny.clone(),
    })
}

impl Prepared {
    /// What a step did, with its values, for error messages.
    fn describe(&self, step: Step) -> String {
        let lim = |r: libc::__rlimit_resource_t| {
            self.rlimits
                .iter()
                .find(|(_, res, _)| *res == r)
                .map(|(_, _, l)| {
                    if l.rlim_cur == libc::RLIM_INFINITY {
                        "unlimited".to_string()
                    } else {
                        l.rlim_cur.to_string()
                    }
                })
                .unwrap_or_default()
        };
        let id = self.identity.as_ref();
        match step {
            Step::Setpgid => "setpgid".into(),
            Step::Signals => "resetting signals".into(),
            Step::Stdio => "redirecting stdout/stderr".into(),
            Step::Cgroup => format!(
                "joining cgroup {}",
                self.cgroup
                    .as_ref()
                    .map(|c| c.0.display().to_string())
                    .unwrap_or_default()
            ),
            Step::RlimitRtprio => format!("setrlimit RTPRIO {}", lim(libc::RLIMIT_RTPRIO)),
            Step::RlimitMemlock => format!("setrlimit MEMLOCK {}", lim(libc::RLIMIT_MEMLOCK)),
            Step::RlimitRttime => format!("setrlimit RTTIME {}us", lim(libc::RLIMIT_RTTIME)),
            Step::Sched => self.sched_text.clone(),
            Step::Affinity => format!("sched_setaffinity to CPUs {}", self.affinity),
            Step::Setgroups => format!("setgroups {:?}", self.groups),
            Step::Setgid => format!("setgid to {}", id.map(|i| i.gid).unwrap_or(0)),
            Step::Setuid => format!("setuid to {}", id.map(|i| i.uid).unwrap_or(0)),
            Step::Pdeathsig => "prctl PR_SET_PDEATHSIG".into(),
            Step::Chdir => format!("chdir to {}", self.cwd_text),
            Step::Exec => format!("exec {}", self.path.display()),
            Step::Seccomp => {
                let names: Vec<&str> = self
                    .deny
                    .iter()
                    .flat_map(|f| f.denied())
                    .map(|d| d.name())
                    .collect();
                format!("seccomp filter denying {}", names.join(", "))
            }
        }
    }
}

/// The calling process's limit `res` as `soft/hard`, for hints.
fn own_limit(res: libc::__rlimit_resource_t) -> String {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into `l`, which it points to.
    if unsafe { libc::getrlimit(res, &mut l) } == -1 {
        return "unknown".into();
    }
    let show = |v: libc::rlim_t| {
        if v == libc::RLIM_INFINITY {
            "unlimited".to_string()
        } else {
            v.to_string()
        }
    };
    format!("{}/{}", show(l.rlim_cur), show(l.rlim_max))
}

impl Prepared {
    /// Which privilege `step` lacked when the kernel refused it with
    /// `err`, and how to grant it; `None` when the refusal is not about a
    /// privilege. Read in the supervisor, whose limits, nice value and ids
    /// the child inherited.
    pub fn privilege_hint(&self, step: Step, err: &std::io::Error) -> Option<String> {
        let errno = err.raw_os_error()?;
        if errno != libc::EPERM && errno != libc::EACCES {
            return None;
        }
        let euid = rustix::process::geteuid().as_raw();
        let how_root = if euid == 0 {
            "the supervisor runs as root but without this capability (a container or a unit with CapabilityBoundingSet=?)".to_string()
        } else {
            format!("the supervisor runs as uid {euid}")
        };
        Some(match step {
            Step::Sched if self.policy.is_realtime() => {
                let (pol, prio) = (self.policy.to_string().to_uppercase(), self.priority);
                format!(
                    "SCHED_{pol} {prio} needs root, CAP_SYS_NICE or an RLIMIT_RTPRIO of at least {prio} \
                     ({how_root}, RLIMIT_RTPRIO {}): run the supervisor as root, grant it CAP_SYS_NICE \
                     (AmbientCapabilities=CAP_SYS_NICE in its systemd unit, or `setcap cap_sys_nice+ep` on \
                     the deploy binary), or raise its limit (LimitRTPRIO={prio} in the unit, \
                     `rtprio {prio}` in /etc/security/limits.d/ for a login, `prlimit --rtprio={prio}`)",
                    own_limit(libc::RLIMIT_RTPRIO)
                )
            }
            Step::Sched => {
                let own = rustix::process::getpriority_process(None).unwrap_or(0);
                match self.nice {
                    Some(n) => format!(
                        "nice {n} is below the supervisor's nice {own}, and lowering it needs root, \
                         CAP_SYS_NICE or an RLIMIT_NICE of at least {} ({how_root}, RLIMIT_NICE {}): \
                         start the supervisor at nice {n} or lower (not under `nice -n {own}`), grant it \
                         CAP_SYS_NICE, or raise its limit (LimitNICE={n} in its systemd unit, `nice {n}` in \
                         /etc/security/limits.d/ for a login, `prlimit --nice={}`)",
                        20 - n,
                        own_limit(libc::RLIMIT_NICE),
                        20 - n
                    ),
                    None => format!(
                        "leaving the inherited policy for SCHED_OTHER at nice {own} needs root, \
                         CAP_SYS_NICE or an RLIMIT_NICE of at least {} ({how_root})",
                        20 - own
                    ),
                }
            }
            Step::RlimitRtprio | Step::RlimitMemlock | Step::RlimitRttime => {
                let (res, name, unit, item, flag) = match step {
                    Step::RlimitRtprio => (libc::RLIMIT_RTPRIO, "RLIMIT_RTPRIO", "LimitRTPRIO", "rtprio", "rtprio"),
                    Step::RlimitMemlock => (libc::RLIMIT_MEMLOCK, "RLIMIT_MEMLOCK", "LimitMEMLOCK", "memlock (KiB)", "memlock"),
                    _ => (libc::RLIMIT_RTTIME, "RLIMIT_RTTIME", "LimitRTTIME", "(no limits.conf item)", "rttime"),
                };
                let want = self
                    .rlimits
                    .iter()
                    .find(|(s, _, _)| *s == step)
                    .map(|(_, _, l)| l.rlim_cur);
                let want = match want {
                    Some(libc::RLIM_INFINITY) => "unlimited".to_string(),
                    Some(v) => v.to_string(),
                    None => "it".into(),
                };
                format!(
                    "raising a hard limit above the supervisor's needs root or CAP_SYS_RESOURCE \
                     ({how_root}, {name} {}): raise the supervisor's own limit to {want} ({unit}= in its \
                     systemd unit, {item} in /etc/security/limits.d/ for a login, `prlimit --{flag}=...`), \
                     or run it as root",
                    own_limit(res)
                )
            }
            Step::Setgroups | Step::Setgid | Step::Setuid => {
                let id = self.identity.as_ref();
                format!(
                    "running a process as another user or group (uid {}, gid {}) needs root \
                     (CAP_SETUID and CAP_SETGID; {how_root}): run the supervisor as root, or remove \
                     `user:` and `group:` from the process",
                    id.map(|i| i.uid).unwrap_or(0),
                    id.map(|i| i.gid).unwrap_or(0)
                )
            }
            Step::Cgroup => format!(
                "joining a cgroup needs write access to its cgroup.procs and to the common \
                 ancestor's ({how_root}): run the supervisor as root, or delegate the cgroup to its \
                 user (Delegate=yes in its systemd unit)"
            ),
            _ => return None,
        })
    }
}

/// A started process.
#[derive(Debug)]
pub struct Child {
    pub pid: i32,
    /// Readable when the process exits.
    pub pidfd: OwnedFd,
    /// The read end of its stdout/stderr pipe (non-blocking).
    pub output: OwnedFd,
    pub started: Instant,
    /// Steps that failed without stopping the start (an rlimit the
    /// supervisor may not raise without CAP_SYS_RESOURCE).
    pub warnings: Vec<String>,
}

fn pipe_cloexec() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } == -1 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both are fresh descriptors we own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Starts a prepared process. Returns once `execve` succeeded, or with the
/// step that failed and its errno.
pub fn spawn(prep: &Prepared) -> Result<Child, ProcessSpawnError> {
    let setup = |what: &str, err| ProcessSpawnError::Setup {
        name: prep.name.clone(),
        what: what.to_string(),
        err,
    };
    let (out_r, out_w) = pipe_cloexec().map_err(|e| setup("creating the output pipe", e))?;
    let (err_r, err_w) = pipe_cloexec().map_err(|e| setup("creating the status pipe", e))?;
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: fork has no memory-safety preconditions; the child below
    // calls only async-signal-safe functions on data prepared before the
    // fork, and leaves only through execve or _exit.
    let pid = unsafe { libc::fork() };
    if pid == -1 {
        return Err(setup("fork", std::io::Error::last_os_error()));
    }
    if pid == 0 {
        // SAFETY: we are the child of fork; `child` upholds its contract.
        unsafe { child(prep, parent, out_w.as_raw_fd(), err_w.as_raw_fd()) }
    }
    drop(out_w);
    drop(err_w);
    // Records of 12 bytes: (fatal, step, errno). Warnings come first; a
    // fatal record is the last thing the child writes; EOF alone means
    // execve succeeded.
    let mut bytes = Vec::new();
    let mut buf = [0u8; 256];
    loop {
        // SAFETY: `buf` has `buf.len()` bytes of room.
        let n = unsafe { libc::read(err_r.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n == -1 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            break;
        }
        if n == 0 {
            break;
        }
        bytes.extend_from_slice(&buf[..n as usize]);
    }
    let mut warnings = Vec::new();
    for rec in bytes.chunks_exact(12) {
        let word =
            |i: usize| u32::from_ne_bytes(rec[i * 4..i * 4 + 4].try_into().unwrap_or_default());
        let step = Step::from_u32(word(1)).unwrap_or(Step::Exec);
        let err = std::io::Error::from_raw_os_error(word(2) as i32);
        if word(0) == 0 {
            let hint = prep
                .privilege_hint(step, &err)
                .map(|h| format!("; {h}"))
                .unwrap_or_default();
            warnings.push(format!(
                "{} failed: {err} (the process runs with the inherited limit){hint}",
                prep.describe(step)
            ));
            continue;
        }
        let mut status = 0;
        // SAFETY: reaps our own child, which has exited (or is exiting).
        unsafe { libc::waitpid(pid, &mut status, 0) };
        return Err(ProcessSpawnError::Child {
            name: prep.name.clone(),
            step,
            what: prep.describe(step),
            hint: prep.privilege_hint(step, &err),
            err,
        });
    }
    let pidfd = rustix::process::pidfd_open(
        rustix::process::Pid::from_raw(pid).expect("fork returned a positive pid"),
        rustix::process::PidfdFlags::empty(),
    )
    .map_err(|e| setup("pidfd_open", e.into()))?;
    rustix::fs::fcntl_setfl(&out_r, rustix::fs::OFlags::NONBLOCK)
        .map_err(|e| setup("fcntl O_NONBLOCK", e.into()))?;
    Ok(Child {
        pid,
        pidfd,
        output: out_r,
        started: Instant::now(),
        warnings,
    })
}

/// Writes one `(fatal, step, errno)` record for the parent, with the
/// errno the last system call left.
///
/// # Safety
/// Only for the child of `fork`; async-signal-safe.
unsafe fn report(err_fd: RawFd, fatal: bool, step: Step) {
    // SAFETY: __errno_location returns this thread's errno slot.
    let errno = unsafe { *libc::__errno_location() };
    // SAFETY: same contract as ours.
    unsafe { report_errno(err_fd, fatal, step, errno) }
}

/// Writes one `(fatal, step, errno)` record for the parent.
///
/// # Safety
/// Only for the child of `fork`; async-signal-safe.
unsafe fn report_errno(err_fd: RawFd, fatal: bool, step: Step, errno: i32) {
    let mut msg = [0u8; 12];
    msg[..4].copy_from_slice(&u32::from(fatal).to_ne_bytes());
    msg[4..8].copy_from_slice(&(step as u32).to_ne_bytes());
    msg[8..].copy_from_slice(&errno.to_ne_bytes());
    // SAFETY: write is async-signal-safe; `msg` is on our stack. A pipe
    // write of 12 bytes is atomic.
    unsafe { libc::write(err_fd, msg.as_ptr().cast(), msg.len()) };
}

/// Reports `(step, errno)` to the parent and exits.
///
/// # Safety
/// Only for the child of `fork`; async-signal-safe.
unsafe fn fail(err_fd: RawFd, step: Step) -> ! {
    // SAFETY: __errno_location returns this thread's errno slot.
    let errno = unsafe { *libc::__errno_location() };
    // SAFETY: same contract as ours.
    unsafe { fail_errno(err_fd, step, errno) }
}

/// Reports `(step, errno)` to the parent and exits.
///
/// # Safety
/// Only for the child of `fork`; async-signal-safe.
unsafe fn fail_errno(err_fd: RawFd, step: Step, errno: i32) -> ! {
    // SAFETY: same contract as ours; _exit is async-signal-safe.
    unsafe {
        report_errno(err_fd, true, step, errno);
        libc::_exit(127)
    }
}

/// The child between `fork` and `execve`.
///
/// # Safety
/// Only in the child of `fork`. Makes only async-signal-safe system calls
/// on `prep`, which was fully built before the fork, and never returns.
unsafe fn child(prep: &Prepared, parent: libc::pid_t, out_fd: RawFd, err_fd: RawFd) -> ! {
    macro_rules! check {
        ($step:expr, $call:expr) => {
            if $call == -1 {
                fail(err_fd, $step)
            }
        };
    }
    // SAFETY: every call in this block is a plain system call wrapper,
    // async-signal-safe, on pointers to data owned by `prep` (alive until
    // exec or exit) or on this stack.
    unsafe {
        check!(Step::Setpgid, libc::setpgid(0, 0));

        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        check!(
            Step::Signals,
            libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut())
        );
        for sig in 1..32 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::signal(sig, libc::SIG_DFL);
            }
        }

        check!(Step::Stdio, libc::dup2(prep.devnull.as_raw_fd(), 0));
        check!(Step::Stdio, libc::dup2(out_fd, 1));
        check!(Step::Stdio, libc::dup2(out_fd, 2));

        if let Some((_, f)) = &prep.cgroup {
            // "0" moves the writing process (see cgroups(7)).
            if libc::write(f.as_raw_fd(), b"0".as_ptr().cast(), 1) != 1 {
                fail(err_fd, Step::Cgroup);
            }
        }

        for (step, res, lim) in &prep.rlimits {
            // Raising a hard limit needs CAP_SYS_RESOURCE; without it the
            // start goes on and the parent reports a warning.
            if libc::setrlimit(*res, lim) == -1 {
                report(err_fd, false, *step);
            }
        }
        // units::sched: system calls on its own stack, no allocation,
        // errors included (an errno); the CPU set was built before the
        // fork.
        let attr = match prep.sched {
            Sched::Set(attr) => Some(attr),
            Sched::Other => match sched::get_attr(0) {
                // Another policy inherited (a supervisor under SCHED_FIFO):
                // SCHED_OTHER at the nice value the process has.
                Ok(a) if a.policy != SchedPolicy::Other => {
                    Some(SchedAttr::new(SchedPolicy::Other, 0))
                }
                Err(SchedGetError::UnknownPolicy { .. }) => {
                    Some(SchedAttr::new(SchedPolicy::Other, 0))
                }
                // SCHED_OTHER already, or nothing to tell: the inherited
                // nice value stays.
                _ => None,
            },
        };
        if let Some(attr) = attr {
            if let Err(e) = sched::set_attr(0, &attr) {
                fail_errno(
                    err_fd,
                    Step::Sched,
                    e.raw_os_error().unwrap_or(libc::EINVAL),
                );
            }
        }
        if let Err(e) = sched::set_affinity(0, &prep.affinity) {
            fail_errno(
                err_fd,
                Step::Affinity,
                e.raw_os_error().unwrap_or(libc::EINVAL),
            );
        }

        if let Some(id) = &prep.identity {
            check!(
                Step::Setgroups,
                libc::setgroups(prep.groups.len(), prep.groups.as_ptr())
            );
            check!(Step::Setgid, libc::setgid(id.gid));
            check!(Step::Setuid, libc::setuid(id.uid));
        }

        check!(
            Step::Pdeathsig,
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong)
        );
        if libc::getppid() != parent {
            // The supervisor died before the death signal was armed.
            libc::_exit(126);
        }

        check!(Step::Chdir, libc::chdir(prep.cwd.as_ptr()));
        // Last before exec: the filter holds for the program, not for the
        // steps above. `install` makes two raw system calls on the filter
        // built before the fork.
        if let Some(f) = &prep.deny {
            if f.install(false).is_err() {
                fail(err_fd, Step::Seccomp);
            }
        }
        // Any descriptor the supervisor leaked without O_CLOEXEC closes at
        // exec (the status pipe is close-on-exec already).
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        );
        libc::execve(
            prep.path_c.as_ptr(),
            prep.argv_ptrs.as_ptr(),
            prep.envp_ptrs.as_ptr(),
        );
        fail(err_fd, Step::Exec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_paths() {
        let p = Path::new("/pfx");
        assert_eq!(resolve_exec(p, "/bin/sh"), PathBuf::from("/bin/sh"));
        assert_eq!(
            resolve_exec(p, "imu"),
            PathBuf::from("/pfx/opt/rtdeploy/current/bin/imu")
        );
        assert_eq!(
            resolve_exec(p, "bin/imu"),
            PathBuf::from("/pfx/opt/rtdeploy/current/bin/imu")
        );
    }

    #[test]
    fn step_numbers_round_trip() {
        for v in 1..=15 {
            assert_eq!(Step::from_u32(v).map(|s| s as u32), Some(v));
        }
        assert_eq!(Step::from_u32(0), None);
    }

    #[test]
    fn errors_say_their_cause_once() {
        let io = || std::io::Error::from_raw_os_error(2);
        let name = || "imu".to_string();
        let errors = [
            ProcessSpawnError::Account {
                name: name(),
                err: AccountResolveError::UnknownUser {
                    name: "ghost".into(),
                    path: "/etc/passwd".into(),
                },
            },
            ProcessSpawnError::Open {
                name: name(),
                path: "/dev/null".into(),
                err: io(),
            },
            ProcessSpawnError::Setup {
                name: name(),
                what: "pipe".into(),
                err: io(),
            },
            ProcessSpawnError::Child {
                name: name(),
                step: Step::Exec,
                what: "exec /bin/imu".into(),
                err: io(),
                hint: None,
            },
        ];
        for e in errors {
            let text = e.to_string();
            assert!(
                text.ends_with("(os error 2)") || text.ends_with("(not in /etc/passwd)"),
                "{text}"
            );
            assert!(std::error::Error::source(&e).is_none(), "{text}");
        }
    }
}
