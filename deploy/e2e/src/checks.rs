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
