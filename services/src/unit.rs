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

use std::time::Duration;

use units::cpu::CpuSet;

use crate::config::{ProcessConfig, RobotSection};

/// Where the image installs the binary.
pub const EXEC_START: &str = "/usr/bin/deploy supervise";
/// The watchdog interval systemd enforces.
pub const WATCHDOG: Duration = Duration::from_secs(10);

/// The unit file text.
pub fn render(robot: &RobotSection, housekeeping: &CpuSet, processes: &[ProcessConfig]) -> String {
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
        let text = render(&robot, &hk, &[proc_("a", "5s"), proc_("b", "2500ms")]);
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
        ] {
            assert!(lines.contains(&want), "missing `{want}` in\n{text}");
        }
        assert!(text.starts_with("# rtdeploy supervisor for robot `arm`"));
        // Sections in order, each once.
        let sections: Vec<&&str> = lines.iter().filter(|l| l.starts_with('[')).collect();
        assert_eq!(sections, [&"[Unit]", &"[Service]", &"[Install]"]);
    }
}
