//! Checks both machines make the same way.

use std::path::Path;

use deploy::cmd::plan::Plan;
use services::status::SupervisorStatus;
use units::cpu::CpuSet;

use crate::guest::missing_tokens;
use crate::report::Report;

/// Each process of `plan` runs with its policy, priority and CPUs as
/// `status` read them back from the kernel; `whose` names the plan in the
/// assertion ("the planned", "release 4's").
pub fn processes_in_force(
    r: &mut Report,
    plan: &Plan,
    status: &SupervisorStatus,
    whose: &str,
    log: Option<&Path>,
) {
    for p in &plan.processes {
        let want = format!("{} {} cpus {}", p.policy, p.priority.unwrap_or(0), p.cpus);
        let got = status
            .processes
            .iter()
            .find(|s| s.name == p.name)
            .and_then(|s| s.in_force.as_ref())
            .map(|f| {
                let cpus = CpuSet::parse_list(&f.cpus).map_or(f.cpus.clone(), |c| c.to_string());
                format!("{} {} cpus {cpus}", f.policy, f.priority)
            })
            .unwrap_or_else(|| "not running".into());
        r.check(
            &format!(
                "{} runs with {whose} policy, priority and CPUs (read back from the kernel)",
                p.name
            ),
            &want,
            &got,
            log,
        );
    }
}

/// The guest's kernel command line carries every token of `planned`.
pub fn cmdline_carries(
    r: &mut Report,
    what: &str,
    cmdline: &str,
    planned: &str,
    log: Option<&Path>,
) {
    let missing = missing_tokens(cmdline, planned);
    let why = if cmdline.is_empty() {
        "missing: (no command line read)".to_string()
    } else {
        format!("missing: {} (cmdline: {cmdline})", missing.join(" "))
    };
    r.assert(missing.is_empty() && !cmdline.is_empty(), what, why, log);
}

/// The supervisor's start-up step `cpu plan` is `ok`.
pub fn cpu_plan_applied(r: &mut Report, status: &SupervisorStatus, log: Option<&Path>) {
    match status.startup.iter().find(|s| s.step == "cpu plan") {
        Some(s) if s.result == "ok" => r.pass(format!(
            "the supervisor applied the CPU plan ({})",
            s.detail
        )),
        other => r.fail(
            "the supervisor applied the CPU plan",
            format!("startup step: {other:?}"),
            log,
        ),
    }
}

/// robot.yaml's `watchdog.timeout` in whole seconds (0 without one, or
/// when the file does not load: the assertion below then says so).
pub fn watchdog_timeout_s(config: &Path) -> u64 {
    services::robot::load(config)
        .ok()
        .and_then(|l| l.robot.watchdog)
        .map_or(0, |w| w.timeout.0.as_secs())
}

/// The supervisor holds QEMU's i6300ESB watchdog at `config`'s timeout
/// and feeds it (`status` read in boot `boot`).
pub fn watchdog_armed(
    r: &mut Report,
    config: &Path,
    status: Option<&SupervisorStatus>,
    boot: &str,
    log: Option<&Path>,
) {
    let want = watchdog_timeout_s(config);
    let w = status.and_then(|s| s.watchdog.as_ref());
    r.assert(
        want > 0
            && w.is_some_and(|w| {
                w.state == "armed"
                    && w.timeout_s == Some(want)
                    && w.identity.as_deref().is_some_and(|i| i.contains("6300ESB"))
                    && w.fed >= 1
                    && w.last_fed_s_ago.is_some_and(|a| a < want as f64)
            }),
        format!(
            "{boot}: the supervisor holds the i6300ESB watchdog at robot.yaml's {want}s and feeds it ({})",
            w.map(|w| w.describe()).unwrap_or_default()
        ),
        format!("{w:?}"),
        log,
    );
}
