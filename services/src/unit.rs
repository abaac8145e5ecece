//! The systemd unit that runs the supervisor on an image that boots
//! systemd (`rtdeploy.service`), rendered from `robot.yaml`.
//!
//! Why each setting:
//! - `Type=notify` + `WatchdogSec`: systemd knows when start-up (CPU plan,
//!   channels, boot check, processes) is done, and restarts a supervisor
//!   whose event loop hangs; start-up may take longer than systemd's
//!   default TimeoutStartSec (90 s) when `boot_check.duration` is long, so
//!   the supervisor extends it (`EXTEND_TIMEOUT_USEC`) by the check's
//!   duration and a margin before running the check;
//! - `LimitRTPRIO=99`, `LimitMEMLOCK=infinity`, `LimitRTTIME=infinity`:
//!   the supervisor hands each process its own, lower limits, and may only
//!   do so from limits at least as high;
//! - `CPUAffinity` = the housekeeping CPUs: the supervisor itself never runs
//!   on an isolated CPU (its children get their own affinity);
//! - `KillMode=mixed`: on stop, SIGTERM goes to the supervisor alone, which
//!   stops the processes in reverse dependency order; whatever is left when
//!   `TimeoutStopSec` runs out is SIGKILLed by systemd;
//! - `TimeoutStopSec`: the sum of every process's `stop_timeout`, plus a
//!   margin, so an orderly shutdown is never cut short;
//! - `Restart=always`: a supervisor that dies comes back (its children died
//!   with it through PR_SET_PDEATHSIG).
//! - `Wants=` and `After=` the mounts the start reads (the boot partition
//!   of `update.boot_attempts`, where the boot loader left its count):
//!   wanted, not required, so that a partition that does not mount leaves
//!   the supervisor running and saying so rather than not started.

use std::time::Duration;

use units::cpu::CpuSet;

use crate::config::{ProcessConfig, RobotSection};

/// Where the image installs the binary.
pub const EXEC_START: &str = "/usr/bin/deploy supervise";
/// The watchdog interval systemd enforces.
pub const WATCHDOG: Duration = Duration::from_secs(10);

/// The unit file text; `mounts` are the mount points its start reads.
pub fn render(
    robot: &RobotSection,
    housekeeping: &CpuSet,
    processes: &[ProcessConfig],
    mounts: &[&str],
) -> String {
    let stop: Duration =
        processes.iter().map(|p| p.stop_timeout.0).sum::<Duration>() + Duration::from_secs(5);
    let mut u = String::new();
    u.push_str(&format!(
        "# rtdeploy supervisor for robot `{}`, generated from robot.yaml; do not edit.\n",
        robot.name
    ));
    u.push_str("[Unit]\n");
    u.push_str(&format!(
        "Description=rtdeploy supervisor ({})\n",
        robot.name
    ));
    // After Jetson Linux's nvpmodel.service (absent elsewhere: systemd
    // ignores ordering on a unit that does not exist), which sets the power
    // mode and its clocks at boot and would undo the CPU clocks the plan
    // pins if it ran after the supervisor's apply.
    u.push_str("After=local-fs.target network-pre.target nvpmodel.service\n");
    for m in mounts {
        let unit = mount_unit(m);
        u.push_str(&format!("Wants={unit}\nAfter={unit}\n"));
    }
    u.push_str("StartLimitIntervalSec=0\n");
    u.push_str("\n[Service]\n");
    u.push_str("Type=notify\n");
    u.push_str("NotifyAccess=main\n");
    u.push_str(&format!("ExecStart={EXEC_START}\n"));
    u.push_str("Restart=always\n");
    u.push_str("RestartSec=1s\n");
    u.push_str(&format!("WatchdogSec={}s\n", WATCHDOG.as_secs()));
    u.push_str("KillMode=mixed\n");
    u.push_str("KillSignal=SIGTERM\n");
    u.push_str(&format!("TimeoutStopSec={}ms\n", stop.as_millis()));
    u.push_str("LimitRTPRIO=99\n");
    u.push_str("LimitMEMLOCK=infinity\n");
    u.push_str("LimitRTTIME=infinity\n");
    if !housekeeping.is_empty() {
        u.push_str(&format!("CPUAffinity={housekeeping}\n"));
    }
    u.push_str("OOMScoreAdjust=-900\n");
    u.push_str(&format!(
        "Environment=RTDEPLOY_CONFIG={}\n",
        releases::Layout::new(std::path::Path::new("/"))
            .config_link()
            .display()
    ));
    u.push_str("\n[Install]\n");
    u.push_str("WantedBy=multi-user.target\n");
    u
}

/// The name of the mount unit systemd makes for the absolute path `path`
/// (`systemd-escape --path --suffix=mount`): `/` between components
/// becomes `-`, and every byte but ASCII letters, digits, `_` and a `.`
/// that does not start the name becomes `\xNN` (checked against
/// `systemd-escape`).
pub fn mount_unit(path: &str) -> String {
    let trimmed = path.trim_matches('/');
    if trimmed.is_empty() {
        return "-.mount".into();
    }
    let mut out = String::new();
    for (i, part) in trimmed.split('/').filter(|p| !p.is_empty()).enumerate() {
        if i > 0 {
            out.push('-');
        }
        for (j, b) in part.bytes().enumerate() {
            let keep = b.is_ascii_alphanumeric() || b == b'_' || (b == b'.' && !(i == 0 && j == 0));
            if keep {
                out.push(b as char);
            } else {
                out.push_str(&format!("\\x{b:02x}"));
            }
        }
    }
    out.push_str(".mount");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc_(name: &str, stop: &str) -> ProcessConfig {
        serde_json::from_value(
            serde_json::json!({"name": name, "exec": "bin/x", "stop_timeout": stop}),
        )
        .unwrap()
    }

    #[test]
    fn unit_carries_limits_affinity_and_stop_budget() {
        let robot = RobotSection {
            name: "arm".into(),
            group: Some("robot".into()),
        };
        let hk = CpuSet::parse_list("0-1").unwrap();
        let text = render(
            &robot,
            &hk,
            &[proc_("a", "5s"), proc_("b", "2500ms")],
            &["/boot/rtboot"],
        );
        let lines: Vec<&str> = text.lines().collect();
        for want in [
            "Type=notify",
            "ExecStart=/usr/bin/deploy supervise",
            "WatchdogSec=10s",
            "LimitRTPRIO=99",
            "LimitMEMLOCK=infinity",
            "CPUAffinity=0-1",
            "Restart=always",
            "KillMode=mixed",
            "TimeoutStopSec=12500ms",
            "WantedBy=multi-user.target",
            "Wants=boot-rtboot.mount",
            "After=boot-rtboot.mount",
        ] {
            assert!(lines.contains(&want), "missing `{want}` in\n{text}");
        }
        assert!(text.starts_with("# rtdeploy supervisor for robot `arm`"));
        // Sections in order, each once.
        let sections: Vec<&&str> = lines.iter().filter(|l| l.starts_with('[')).collect();
        assert_eq!(sections, [&"[Unit]", &"[Service]", &"[Install]"]);
    }

    #[test]
    fn mount_units_are_named_as_systemd_escape_names_them() {
        // systemd-escape --path --suffix=mount
        for (path, unit) in [
            ("/boot/rtboot", "boot-rtboot.mount"),
            ("/boot/rtboot/", "boot-rtboot.mount"),
            ("/", "-.mount"),
            ("/mnt/boot-a", "mnt-boot\\x2da.mount"),
            ("/mnt/.hidden/x.y", "mnt-.hidden-x.y.mount"),
            ("/.b", "\\x2eb.mount"),
            ("/media/a b", "media-a\\x20b.mount"),
        ] {
            assert_eq!(mount_unit(path), unit, "{path}");
        }
    }
}
