//! Shared helpers: a prefix in a temporary directory, process configs from
//! JSON, and a supervisor running on its own thread.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use services::config::{ProcessConfig, RobotSection};
use services::control::{self, Reply, Request};
use services::status::{ProcessStatus, SupervisorStatus};
use services::status::{ReleaseStatus, StepStatus};
use services::supervisor::{
    Boot, BootCheckOutcome, ConfigHook, Options, Roots, Supervisor, SupervisorConfig,
};

/// A test's boot check: given the duration and what the release recovery
/// found.
pub type BootCheckFn = Box<dyn FnMut(Duration, &ReleaseStatus) -> BootCheckOutcome + Send>;

/// The supervisor's [`Boot`] for a test: the parts given, the trait's
/// defaults for the rest.
#[derive(Default)]
pub struct TestBoot {
    pub cpu_plan: Option<Box<dyn FnMut() -> StepStatus + Send>>,
    pub boot_check: Option<BootCheckFn>,
    pub release_config: Option<ConfigHook>,
    /// A Jetson's rootfs slots: efivarfs and `nvbootctrl` at these paths,
    /// read and confirmed as a robot's boot does.
    pub rootfs: Option<(PathBuf, PathBuf)>,
}

impl TestBoot {
    pub fn boxed(self) -> Option<Box<dyn Boot>> {
        Some(Box::new(self))
    }
}

impl Boot for TestBoot {
    fn apply_cpu_plan(&mut self) -> StepStatus {
        match self.cpu_plan.as_mut() {
            Some(f) => f(),
            None => StepStatus {
                step: "cpu plan".into(),
                result: "skipped".into(),
                detail: "cpusets runtime plan API not available".into(),
            },
        }
    }

    fn boot_check(&mut self, duration: Duration, release: &ReleaseStatus) -> BootCheckOutcome {
        match self.boot_check.as_mut() {
            Some(f) => f(duration, release),
            None => BootCheckOutcome::Skipped("engine not available".into()),
        }
    }

    fn release_config(&mut self) -> Option<ConfigHook> {
        self.release_config.take()
    }

    fn rootfs_slots(&mut self) -> Option<services::rootfs_slots::RootfsSlots> {
        let (efivars, tool) = self.rootfs.as_ref()?;
        services::rootfs_slots::RootfsSlots::read(efivars, tool)
    }

    fn confirm_rootfs_slot(&mut self) -> Option<Result<String, String>> {
        let (_, tool) = self.rootfs.as_ref()?;
        Some(services::rootfs_slots::confirm(tool))
    }
}

pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Whether capability `bit` (capabilities(7)) is in the effective set.
pub fn has_cap(bit: u32) -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .unwrap()
        .trim();
    u64::from_str_radix(hex, 16).unwrap() & (1 << bit) != 0
}

/// A process config from JSON (the same shape as robot.yaml).
pub fn process(v: serde_json::Value) -> ProcessConfig {
    serde_json::from_value(v).expect("valid process config")
}

/// A prefix whose `etc/passwd` and `etc/group` know `nobody` and a group
/// `rtctl` (gid 4242); world-traversable so `nobody` can reach its socket.
pub fn prefix() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("rtdeploy-sup-")
        .tempdir()
        .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::create_dir_all(dir.path().join("etc")).unwrap();
    std::fs::write(
        dir.path().join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("etc/group"),
        "root:x:0:\nnogroup:x:65534:\nrtctl:x:4242:\n",
    )
    .unwrap();
    dir
}

/// [`prefix`] that trusts the release key whose public half is
/// `public_base64` (as `etc/rtdeploy/keys/test.pub`).
pub fn prefix_trusting(public_base64: &str) -> tempfile::TempDir {
    let prefix = prefix();
    let keys = prefix.path().join("etc/rtdeploy/keys");
    std::fs::create_dir_all(&keys).unwrap();
    std::fs::write(keys.join("test.pub"), format!("{public_base64}\n")).unwrap();
    prefix
}

pub struct Running {
    pub prefix: tempfile::TempDir,
    pub socket: PathBuf,
    pub thread: Option<JoinHandle<Result<(), String>>>,
}

pub fn config(processes: Vec<ProcessConfig>, group: Option<&str>) -> SupervisorConfig {
    let all = units::cpu::CpuSet::first(
        rustix::thread::sched_getaffinity(None)
            .map(|s| s.count())
            .unwrap_or(1) as u32,
    );
    SupervisorConfig {
        robot: RobotSection {
            name: "testbot".into(),
            group: group.map(String::from),
        },
        cpus: processes
            .iter()
            .map(|p| p.cpus.clone().unwrap_or_else(|| all.clone()))
            .collect(),
        processes,
        channels: Vec::new(),
        boot_check: Default::default(),
        cpu_dma_latency: None,
        log: None,
        housekeeping: units::cpu::CpuSet::new(),
    }
}

pub fn roots(prefix: &Path) -> Roots {
    Roots {
        prefix: prefix.to_path_buf(),
        proc_root: "/proc".into(),
        sys_root: prefix.join("sys"),
        dev_root: prefix.join("dev"),
    }
}

/// Starts a supervisor (no signal handling: it shares the test process).
pub fn start(cfg: SupervisorConfig, boot: Option<Box<dyn Boot>>) -> Running {
    let prefix = prefix();
    start_in(prefix, cfg, boot)
}

pub fn start_in(
    prefix: tempfile::TempDir,
    cfg: SupervisorConfig,
    boot: Option<Box<dyn Boot>>,
) -> Running {
    let opts = Options {
        handle_signals: false,
        verbose: false,
        log_max_bytes: 1 << 20,
        ..Default::default()
    };
    let sup =
        Supervisor::new(cfg, roots(prefix.path()), opts, boot, None).expect("supervisor starts");
    let thread = std::thread::spawn(move || sup.run().map_err(|e| e.to_string()));
    Running {
        socket: control::socket_path(prefix.path()),
        prefix,
        thread: Some(thread),
    }
}

impl Running {
    pub fn request(&self, r: &Request) -> Reply {
        control::request(&self.socket, r).expect("control request")
    }

    pub fn status(&self) -> SupervisorStatus {
        self.request(&Request::Status)
            .status
            .expect("status in reply")
    }

    pub fn process(&self, name: &str) -> ProcessStatus {
        self.status()
            .processes
            .into_iter()
            .find(|p| p.name == name)
            .expect("process in status")
    }

    /// Polls status until `f` holds; panics after 20 s (watchdog).
    pub fn wait_for(&self, what: &str, f: impl Fn(&SupervisorStatus) -> bool) -> SupervisorStatus {
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            let s = self.status();
            if f(&s) {
                return s;
            }
            if Instant::now() > until {
                panic!("timed out waiting for {what}; status: {s:#?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(
            self.prefix
                .path()
                .join(format!("var/log/rtdeploy/{name}.log")),
        )
        .unwrap_or_default()
    }

    /// Waits until the log of `name` contains `needle`.
    pub fn wait_log(&self, name: &str, needle: &str) {
        let until = Instant::now() + Duration::from_secs(20);
        while !self.log(name).contains(needle) {
            if Instant::now() > until {
                panic!(
                    "timed out waiting for `{needle}` in the log of {name}: {}",
                    self.log(name)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// stop-all, then joins the supervisor thread.
    pub fn stop_all(mut self) -> tempfile::TempDir {
        let reply = self.request(&Request::StopAll);
        assert!(reply.ok, "{reply:?}");
        self.thread.take().unwrap().join().unwrap().unwrap();
        self.prefix
    }
}

pub fn pid_alive(pid: i32) -> bool {
    // A zombie still has a /proc entry; count it as alive (not reaped).
    Path::new(&format!("/proc/{pid}")).exists()
}
