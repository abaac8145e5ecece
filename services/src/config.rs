//! The `robot`, `processes` and `update` sections of `robot.yaml`, and
//! their validation.
//!
//! Every validator appends `(field path, message)` pairs; the caller maps a
//! path such as `processes[2].priority` back to its line and column.

use std::collections::BTreeMap;

use cpusets::config::{validate_priority, Policy};
use serde::{Deserialize, Serialize};
use units::cpu::CpuSet;
use units::duration::Dur;
use units::size::ByteSize;

/// The largest robot.yaml read (`deploy`'s loader refuses a larger one at
/// its first byte past this; the supervisor reads a release's no further).
pub const MAX_ROBOT_YAML: u64 = 512 << 10;

/// A validation problem: the field path and what is wrong with it.
pub type Problem = (String, String);

/// `robot:`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RobotSection {
    pub name: String,
    /// The group that owns channel files and the control socket.
    #[serde(default)]
    pub group: Option<String>,
}

/// Checks a name used in paths and unit names: `[a-z0-9][a-z0-9_-]*`.
pub fn validate_name(path: &str, what: &str, name: &str, out: &mut Vec<Problem>) {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    if !ok {
        out.push((
            path.to_string(),
            format!("`{name}` is not a valid {what} name (expected a-z, 0-9, `_`, `-`, starting with a letter or digit, at most 64 characters)"),
        ));
    }
}

/// Checks a user or group name the way shadow-utils accepts them.
fn validate_account(path: &str, name: &str, out: &mut Vec<Problem>) {
    let ok = !name.is_empty()
        && name.len() <= 32
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_' || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '-' | '.'));
    if !ok {
        out.push((
            path.to_string(),
            format!("`{name}` is not a user or group name (expected a-z, 0-9, `_`, `-`, `.`, or a numeric id)"),
        ));
    }
}

impl RobotSection {
    pub fn validate(&self, out: &mut Vec<Problem>) {
        validate_name("robot.name", "robot", &self.name, out);
        if let Some(g) = &self.group {
            validate_account("robot.group", g, out);
        }
    }
}

/// When a process that exited is started again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RestartPolicy {
    #[default]
    Always,
    OnFailure,
    Never,
}

impl RestartPolicy {
    /// As robot.yaml spells it.
    pub fn name(self) -> &'static str {
        match self {
            RestartPolicy::Always => "always",
            RestartPolicy::OnFailure => "on-failure",
            RestartPolicy::Never => "never",
        }
    }
}

/// `processes[].restart`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Restart {
    pub policy: RestartPolicy,
    /// Delay before the first restart; doubles (x `factor`) each time.
    pub initial_backoff: Dur,
    pub max_backoff: Dur,
    pub factor: f64,
    /// This many restarts within `window` puts the process in `failed`.
    pub crash_loop_restarts: u32,
    pub crash_loop_window: Dur,
}

impl Default for Restart {
    fn default() -> Self {
        Restart {
            policy: RestartPolicy::Always,
            initial_backoff: Dur::from_millis(100),
            max_backoff: Dur::from_secs(10),
            factor: 2.0,
            crash_loop_restarts: 5,
            crash_loop_window: Dur::from_secs(60),
        }
    }
}

/// `processes[].memlock`: a size, or `unlimited`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Memlock {
    Bytes(ByteSize),
    #[serde(serialize_with = "unlimited")]
    Unlimited,
}

fn unlimited<S: serde::Serializer>(s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str("unlimited")
}

impl<'de> Deserialize<'de> for Memlock {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Memlock;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a size like `64MiB`, or `unlimited`")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Memlock, E> {
                Ok(Memlock::Bytes(ByteSize(v)))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Memlock, E> {
                u64::try_from(v)
                    .map(|v| Memlock::Bytes(ByteSize(v)))
                    .map_err(|_| E::custom(format!("memlock {v} is negative (expected a size like `64MiB`, or `unlimited`)")))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Memlock, E> {
                if v == "unlimited" {
                    return Ok(Memlock::Unlimited);
                }
                ByteSize::parse(v)
                    .map(Memlock::Bytes)
                    .map_err(|e| E::custom(format!("{e}, or `unlimited`")))
            }
        }
        d.deserialize_any(V)
    }
}

/// `processes[].budgets`: limits on what the process's timing reports show.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProcessBudgets {
    /// Event (send time or deadline) -> handler start, worst in a report.
    pub wakeup: Option<Dur>,
    /// Handler run time, worst in a report.
    pub handler: Option<Dur>,
}

/// One entry of `processes:`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessConfig {
    pub name: String,
    /// The program: a path inside the release (`bin/imu_reader`), or
    /// absolute.
    pub exec: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub group: Option<String>,
    #[serde(default)]
    pub working_dir: Option<String>,
    #[serde(default = "other")]
    pub policy: Policy,
    #[serde(default)]
    pub priority: Option<u32>,
    /// CPUs the process may run on. Default: the isolated CPUs for
    /// fifo/rr, the housekeeping CPUs otherwise.
    #[serde(default)]
    pub cpus: Option<CpuSet>,
    /// Lets a fifo/rr process run on housekeeping CPUs.
    #[serde(default)]
    pub allow_housekeeping: bool,
    #[serde(default)]
    pub memlock: Option<Memlock>,
    #[serde(default)]
    pub nice: Option<i32>,
    /// RLIMIT_RTTIME: CPU time a real-time process may take without
    /// blocking before the kernel sends SIGXCPU.
    #[serde(default)]
    pub rttime: Option<Dur>,
    #[serde(default)]
    pub restart: Restart,
    #[serde(default = "default_stop_timeout")]
    pub stop_timeout: Dur,
    #[serde(default)]
    pub publishes: Vec<String>,
    #[serde(default)]
    pub subscribes: Vec<String>,
    #[serde(default)]
    pub budgets: ProcessBudgets,
    /// Processes that must be running (and reporting) before this starts.
    #[serde(default)]
    pub after: Vec<String>,
}

fn other() -> Policy {
    Policy::Other
}

/// Who of `processes` uses a channel: the publisher entries and the
/// subscribing processes its file is sized for (at least one publisher:
/// a channel nobody publishes on still takes a tool's message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelUsers {
    pub publishers: u32,
    pub subscribers: u32,
}

impl ChannelUsers {
    pub fn of(processes: &[ProcessConfig], channel: &str) -> ChannelUsers {
        let count = |f: fn(&ProcessConfig) -> &Vec<String>| {
            processes
                .iter()
                .filter(|p| f(p).iter().any(|c| c == channel))
                .count()
                .min(u32::MAX as usize) as u32
        };
        ChannelUsers {
            publishers: count(|p| &p.publishes).max(1),
            subscribers: count(|p| &p.subscribes),
        }
    }
}

fn default_stop_timeout() -> Dur {
    Dur::from_secs(5)
}

impl ProcessConfig {
    pub fn validate(&self, path: &str, out: &mut Vec<Problem>) {
        validate_name(&format!("{path}.name"), "process", &self.name, out);
        if self.exec.is_empty() || self.exec.contains('\0') {
            out.push((
                format!("{path}.exec"),
                "empty program (expected a path like `bin/imu_reader`)".into(),
            ));
        } else if !self.exec.starts_with('/')
            && self.exec.split('/').any(|p| p == ".." || p.is_empty())
        {
            out.push((
                format!("{path}.exec"),
                format!("`{}` leaves the release directory (expected a path inside it, like `bin/imu_reader`, or an absolute path)", self.exec),
            ));
        }
        for (k, v) in &self.env {
            if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
                out.push((
                    format!("{path}.env.{k}"),
                    format!(
                        "`{k}` is not an environment variable name (expected no `=` and no NUL)"
                    ),
                ));
            }
        }
        if let Some(u) = &self.user {
            validate_account(&format!("{path}.user"), u, out);
        }
        if let Some(g) = &self.group {
            validate_account(&format!("{path}.group"), g, out);
        }
        validate_priority(&format!("{path}.priority"), self.policy, self.priority, out);
        if let Some(n) = self.nice {
            if !(-20..=19).contains(&n) {
                out.push((
                    format!("{path}.nice"),
                    format!("nice {n} is out of range (expected -20 to 19)"),
                ));
            } else if self.policy.is_realtime() && n != 0 {
                out.push((
                    format!("{path}.nice"),
                    format!(
                        "nice has no effect under policy `{}` (remove it or use policy `other`)",
                        self.policy
                    ),
                ));
            }
        }
        if let Some(cpus) = &self.cpus {
            if cpus.is_empty() {
                out.push((
                    format!("{path}.cpus"),
                    "empty CPU set (expected at least one CPU)".into(),
                ));
            }
        }
        let r = &self.restart;
        if r.initial_backoff.is_zero() {
            out.push((
                format!("{path}.restart.initial_backoff"),
                "0 (expected a positive duration like `100ms`)".into(),
            ));
        }
        if r.max_backoff < r.initial_backoff {
            out.push((
                format!("{path}.restart.max_backoff"),
                format!(
                    "{} is below initial_backoff {} (expected max >= initial)",
                    r.max_backoff, r.initial_backoff
                ),
            ));
        }
        if !(r.factor >= 1.0 && r.factor <= 16.0) {
            out.push((
                format!("{path}.restart.factor"),
                format!("factor {} is out of range (expected 1 to 16)", r.factor),
            ));
        }
        if r.crash_loop_restarts == 0 {
            out.push((
                format!("{path}.restart.crash_loop_restarts"),
                "0 (expected 1 or more)".into(),
            ));
        }
        if r.crash_loop_window.is_zero() {
            out.push((
                format!("{path}.restart.crash_loop_window"),
                "0 (expected a positive duration like `60s`)".into(),
            ));
        }
        if self.stop_timeout.is_zero() {
            out.push((
                format!("{path}.stop_timeout"),
                "0 (expected a positive duration like `5s`)".into(),
            ));
        }
        if let Some(d) = self.rttime {
            if d.is_zero() {
                out.push((
                    format!("{path}.rttime"),
                    "0 (expected a positive duration like `500ms`)".into(),
                ));
            }
        }
        for (field, d) in [
            ("wakeup", self.budgets.wakeup),
            ("handler", self.budgets.handler),
        ] {
            if d.is_some_and(|d| d.is_zero()) {
                out.push((
                    format!("{path}.budgets.{field}"),
                    "0 (expected a positive duration like `200us`)".into(),
                ));
            }
        }
    }
}

/// The order processes start in: every process after those its `after:`
/// names, otherwise in file order. `None` when `after:` has a cycle or
/// names an unknown process (validation reports both).
pub fn start_order(processes: &[ProcessConfig]) -> Option<Vec<usize>> {
    let index: BTreeMap<&str, usize> = processes
        .iter()
        .enumerate()
        .map(|(i, p)| (p.name.as_str(), i))
        .collect();
    let mut started = vec![false; processes.len()];
    let mut order = Vec::with_capacity(processes.len());
    while order.len() < processes.len() {
        let next = processes.iter().enumerate().find(|(i, p)| {
            !started[*i]
                && p.after
                    .iter()
                    .all(|d| index.get(d.as_str()).is_some_and(|&j| started[j]))
        });
        let (i, _) = next?;
        started[i] = true;
        order.push(i);
    }
    Some(order)
}

/// `metrics:` — the Prometheus textfile the supervisor writes.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsSection {
    /// Where the supervisor writes the exposition (node_exporter's
    /// textfile collector directory, a `*.prom` file); absolute, or
    /// relative to the install prefix. None: not written.
    pub textfile: Option<String>,
    /// How often.
    pub every: Dur,
}

impl Default for MetricsSection {
    fn default() -> Self {
        MetricsSection {
            textfile: None,
            every: Dur::from_secs(10),
        }
    }
}

impl MetricsSection {
    pub fn validate(&self, out: &mut Vec<Problem>) {
        if self.every.0 < std::time::Duration::from_secs(1) {
            out.push((
                "metrics.every".into(),
                format!("{} (expected 1s or longer)", self.every),
            ));
        }
        if let Some(t) = &self.textfile {
            if let Err(e) = units::path::check(t) {
                out.push((
                    "metrics.textfile".into(),
                    format!("{e} (expected a path under the robot's root, without `..`)"),
                ));
            } else if !t.ends_with(".prom") || t.ends_with("/.prom") {
                out.push((
                    "metrics.textfile".into(),
                    format!("`{t}` (expected a file name ending in `.prom`, which node_exporter's textfile collector reads)"),
                ));
            }
        }
    }
}

/// `watchdog:`: the board's hardware watchdog, which the supervisor opens
/// at start, sets to `timeout` and feeds from its event loop
/// ([`crate::watchdog`]). A supervisor that stops turning (frozen, hung in
/// the kernel, SIGSTOP) stops feeding it, and the board resets; a boot
/// that never reaches the supervisor resets too when the watchdog was
/// started before user space (the base's initramfs, or the firmware), and
/// a system update counted by the boot loader (`update.boot_attempts`)
/// then falls back.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WatchdogSection {
    /// The watchdog's device node (`/dev/watchdog`, the first one the
    /// kernel registered, or `/dev/watchdogN`).
    #[serde(default = "default_watchdog_device")]
    pub device: String,
    /// How long the board may go unfed before it resets, in whole seconds
    /// (the driver may round it; the supervisor feeds at a quarter of what
    /// the driver took).
    #[serde(default = "default_watchdog_timeout")]
    pub timeout: Dur,
}

impl Default for WatchdogSection {
    fn default() -> Self {
        WatchdogSection {
            device: default_watchdog_device(),
            timeout: default_watchdog_timeout(),
        }
    }
}

fn default_watchdog_device() -> String {
    "/dev/watchdog".into()
}

fn default_watchdog_timeout() -> Dur {
    Dur::from_secs(60)
}

impl WatchdogSection {
    pub fn validate(&self, out: &mut Vec<Problem>) {
        let d = std::path::Path::new(&self.device);
        let plain = d.components().all(|c| {
            matches!(
                c,
                std::path::Component::RootDir | std::path::Component::Normal(_)
            )
        });
        if !plain || !self.device.starts_with("/dev/") || self.device.len() > 256 {
            out.push((
                "watchdog.device".into(),
                format!(
                    "`{}` (expected a device node under /dev without `.` or `..`, like `/dev/watchdog0`)",
                    self.device.escape_debug()
                ),
            ));
        }
        let t = self.timeout.0;
        let secs = crate::watchdog::MIN_TIMEOUT_S..=crate::watchdog::MAX_TIMEOUT_S;
        if t.subsec_nanos() != 0 || !secs.contains(&t.as_secs()) {
            out.push((
                "watchdog.timeout".into(),
                format!(
                    "{} (expected whole seconds from {}s to {}s: the kernel sets a watchdog's timeout in seconds)",
                    self.timeout,
                    secs.start(),
                    secs.end()
                ),
            ));
        }
    }
}

/// `update:`
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpdateSection {
    /// Releases kept on the robot, current and previous included.
    pub keep: u32,
    /// How long a new release must stay healthy to be committed.
    pub health_window: Dur,
    /// How long `deploy install` waits for the update lock.
    pub lock_timeout: Dur,
    /// ed25519 public keys (base64) accepted for bundles, in addition to
    /// `/etc/rtdeploy/keys/*.pub`.
    pub public_keys: Vec<String>,
    /// Updates through Mender: `deploy image` installs our update module,
    /// `deploy bundle --mender-artifact` wraps bundles for this device type.
    /// None: no Mender.
    pub mender: Option<MenderSection>,
    /// A system update's new boot label counted by the boot loader:
    /// `None`, no count below the kernel (the supervisor's own boot
    /// counter still rolls back a trial it starts into twice).
    pub boot_attempts: Option<BootAttemptsSection>,
}

/// `update.boot_attempts`: on a board that boots through U-Boot, a system
/// update's new extlinux.conf label is booted at most `limit` times
/// without a verdict; the boot after that boots the previous label.
/// U-Boot counts, running the script that `deploy image` puts in the boot
/// partition (`releases::boot_attempts`), which Linux mounts at
/// `partition`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BootAttemptsSection {
    /// Boots of the new label without a verdict (1 to 8).
    #[serde(default = "default_boot_attempts")]
    pub limit: u8,
    /// Where the boot partition (FAT, the first partition U-Boot scans)
    /// is mounted.
    #[serde(default = "default_boot_partition")]
    pub partition: String,
}

fn default_boot_attempts() -> u8 {
    3
}

fn default_boot_partition() -> String {
    "/boot/rtboot".into()
}

/// `update.mender`: releases delivered by a Mender server, through our
/// update module (`deploy mender-module`). Our signature and trial stay in
/// force inside it: the module installs in trial and answers Mender's
/// commit with the supervisor's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MenderSection {
    /// Mender's device type for this robot (the `device_type` its client
    /// reports, and that artifacts are written for), e.g. `jetson-orin-nano`.
    pub device_type: String,
    /// How long Mender's commit waits for the trial's verdict before it
    /// gives up and Mender rolls back; longer than `update.health_window`.
    #[serde(default = "default_verdict_timeout")]
    pub verdict_timeout: Dur,
}

fn default_verdict_timeout() -> Dur {
    Dur::from_secs(600)
}

impl Default for UpdateSection {
    fn default() -> Self {
        UpdateSection {
            keep: 3,
            health_window: Dur::from_secs(30),
            lock_timeout: Dur::from_secs(60),
            public_keys: Vec::new(),
            mender: None,
            boot_attempts: None,
        }
    }
}

impl UpdateSection {
    pub fn validate(&self, out: &mut Vec<Problem>) {
        if self.keep < 2 {
            out.push((
                "update.keep".into(),
                format!(
                    "keep {} leaves nothing to roll back to (expected 2 or more)",
                    self.keep
                ),
            ));
        }
        if self.health_window.is_zero() {
            out.push((
                "update.health_window".into(),
                "0 (expected a positive duration like `30s`)".into(),
            ));
        }
        for (i, k) in self.public_keys.iter().enumerate() {
            let ok = k.len() == 44
                && k.ends_with('=')
                && k[..43]
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '+' || c == '/');
            if !ok {
                out.push((
                    format!("update.public_keys[{i}]"),
                    "not an ed25519 public key (expected 44 characters of base64, as in KEY.pub from `deploy keygen`)".into(),
                ));
            }
        }
        if let Some(b) = &self.boot_attempts {
            if !(1..=releases::boot_attempts::MAX_LIMIT).contains(&b.limit) {
                out.push((
                    "update.boot_attempts.limit".into(),
                    format!(
                        "{} (expected 1 to {}: the boot script counts in one digit)",
                        b.limit,
                        releases::boot_attempts::MAX_LIMIT
                    ),
                ));
            }
            let p = std::path::Path::new(&b.partition);
            if !p.is_absolute()
                || p.components().any(|c| {
                    !matches!(
                        c,
                        std::path::Component::RootDir | std::path::Component::Normal(_)
                    )
                })
                || p.parent().is_none()
            {
                out.push((
                    "update.boot_attempts.partition".into(),
                    format!(
                        "`{}` is not a mount point (expected an absolute path without `.` or `..`, like `/boot/rtboot`)",
                        b.partition.escape_debug()
                    ),
                ));
            }
        }
        if let Some(m) = &self.mender {
            // Mender's device type is one token of its `device_type=` file
            // and of the artifact header; keep to the characters its own
            // examples use.
            let t = &m.device_type;
            if t.is_empty()
                || t.len() > 128
                || !t
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            {
                out.push((
                    "update.mender.device_type".into(),
                    format!(
                        "`{}` is not a device type (expected 1 to 128 letters, digits, `-`, `_` or `.`, like `jetson-orin-nano`)",
                        t.escape_debug()
                    ),
                ));
            }
            if m.verdict_timeout.0 <= self.health_window.0 {
                out.push((
                    "update.mender.verdict_timeout".into(),
                    format!(
                        "{:?} is not longer than update.health_window ({:?}): Mender's commit would give up before the trial can pass (expected a longer duration, like `10m`)",
                        m.verdict_timeout.0, self.health_window.0
                    ),
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc_(name: &str, after: &[&str]) -> ProcessConfig {
        ProcessConfig {
            name: name.into(),
            exec: format!("bin/{name}"),
            args: vec![],
            env: BTreeMap::new(),
            user: None,
            group: None,
            working_dir: None,
            policy: Policy::Other,
            priority: None,
            cpus: None,
            allow_housekeeping: false,
            memlock: None,
            nice: None,
            rttime: None,
            restart: Restart::default(),
            stop_timeout: default_stop_timeout(),
            publishes: vec![],
            subscribes: vec![],
            budgets: ProcessBudgets::default(),
            after: after.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn start_order_follows_after_then_file_order() {
        let ps = [
            proc_("planner", &["estimator"]),
            proc_("imu", &[]),
            proc_("estimator", &["imu"]),
            proc_("logger", &[]),
        ];
        let order: Vec<&str> = start_order(&ps)
            .unwrap()
            .iter()
            .map(|&i| ps[i].name.as_str())
            .collect();
        assert_eq!(order, ["imu", "estimator", "planner", "logger"]);
        let cyclic = [proc_("a", &["b"]), proc_("b", &["a"])];
        assert!(start_order(&cyclic).is_none());
        assert!(start_order(&[proc_("a", &["ghost"])]).is_none());
    }

    #[test]
    fn mender_device_type_and_verdict_timeout_are_checked() {
        let mut u = UpdateSection {
            mender: Some(MenderSection {
                device_type: "jetson-orin-nano".into(),
                verdict_timeout: default_verdict_timeout(),
            }),
            ..Default::default()
        };
        let mut out = Vec::new();
        u.validate(&mut out);
        assert!(out.is_empty(), "{out:?}");
        u.mender = Some(MenderSection {
            device_type: "orin nano".into(),
            verdict_timeout: Dur::from_secs(30),
        });
        u.validate(&mut out);
        let fields: Vec<&str> = out.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            fields,
            ["update.mender.device_type", "update.mender.verdict_timeout"]
        );
        assert!(out[0].1.contains("`orin nano`"), "{out:?}");
    }
}
