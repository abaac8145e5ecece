//! CPU frequency, the CPUs online, and the nvpmodel power mode.

use std::path::Path;

use super::{check, Check, Status, VerifyRunError, HINT_APPLY};
use crate::model::live::{read_cpu_list, read_opt, sys_path};
use crate::plan::{FreqLock, RuntimePlan};
use crate::power::{self, NvpmodelTool};

pub(super) fn check_cpufreq(plan: &RuntimePlan, root: &Path) -> Result<Vec<Check>, VerifyRunError> {
    let f = &plan.cpufreq;
    if f.governor.is_none() && f.lock_cpus.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for cpu in plan.cpus.all.iter() {
        let dir = format!("/sys/devices/system/cpu/cpu{cpu}/cpufreq");
        if !sys_path(root, &dir).is_dir() {
            out.push(check(
                format!("cpufreq.cpu{cpu}"),
                Status::Unsupported,
                format!("{dir} does not exist (no cpufreq driver)"),
                None,
            ));
            continue;
        }
        let read = |name: &str| read_opt(&sys_path(root, &format!("{dir}/{name}")));
        if let Some(want) = &f.governor {
            let id = format!("cpufreq.cpu{cpu}.governor");
            out.push(match read("scaling_governor")? {
                Some(g) if g.trim() == want => {
                    check(id, Status::Ok, format!("governor {want}"), None)
                }
                Some(g) => check(
                    id,
                    Status::Drift,
                    format!("governor {}, planned {want}", g.trim()),
                    Some(HINT_APPLY),
                ),
                None => check(id, Status::Unsupported, "no scaling_governor", None),
            });
        }
        if f.lock_cpus.contains(cpu) {
            let id = format!("cpufreq.cpu{cpu}.locked");
            // The nvpmodel mode's cap, when the clock is pinned to it.
            let cap = match f.lock_to {
                FreqLock::CurrentMax => None,
                FreqLock::Khz { khz } => Some(khz.to_string()),
                FreqLock::HardwareMax => read("cpuinfo_max_freq")?.map(|t| t.trim().to_string()),
            };
            out.push(
                match (read("scaling_min_freq")?, read("scaling_max_freq")?) {
                    (Some(lo), Some(hi))
                        if lo.trim() == hi.trim()
                            && cap.as_ref().is_some_and(|c| c != hi.trim()) =>
                    {
                        check(
                            id,
                            Status::Drift,
                            format!(
                                "min = max = {} kHz, the nvpmodel mode's cap is {} kHz",
                                hi.trim(),
                                cap.as_deref().unwrap_or_default()
                            ),
                            Some(HINT_APPLY),
                        )
                    }
                    (Some(lo), Some(hi)) if lo.trim() == hi.trim() => check(
                        id,
                        Status::Ok,
                        format!("min = max = {} kHz", hi.trim()),
                        None,
                    ),
                    (Some(lo), Some(hi)) => check(
                        id,
                        Status::Drift,
                        format!("min {} kHz, max {} kHz: not locked", lo.trim(), hi.trim()),
                        Some(HINT_APPLY),
                    ),
                    _ => check(
                        id,
                        Status::Unsupported,
                        "no scaling_min_freq/scaling_max_freq",
                        None,
                    ),
                },
            );
        }
    }
    Ok(out)
}

/// The CPUs the plan uses are online, and the nvpmodel mode is the one
/// robot.yaml names (also the supervisor's gate before its boot check).
pub fn power_checks(plan: &RuntimePlan, root: &Path) -> Result<Vec<Check>, VerifyRunError> {
    let mut out = Vec::new();
    let want = &plan.power.cpus_in_use;
    let online = read_cpu_list(&sys_path(root, "/sys/devices/system/cpu/online"))?;
    let nvp = plan.power.nvpmodel.as_ref();
    out.push(match &online {
        None => check(
            "cpus.online",
            Status::Unsupported,
            "/sys/devices/system/cpu/online does not exist",
            None,
        ),
        Some(on) if want.is_subset(on) => check(
            "cpus.online",
            Status::Ok,
            format!("CPUs {on} online, the plan uses {want}"),
            None,
        ),
        Some(on) => check(
            "cpus.online",
            Status::Drift,
            format!(
                "CPUs {} the plan uses are offline (online: {on}; the plan uses {want})",
                want.difference(on)
            ),
            Some(match nvp {
                Some(_) => "set the nvpmodel mode robot.yaml names (`deploy apply`) and reboot, or bring the CPUs online (echo 1 > /sys/devices/system/cpu/cpuN/online)",
                None => "bring the CPUs online (echo 1 > /sys/devices/system/cpu/cpuN/online) or choose an nvpmodel mode that keeps them online (`power.nvpmodel`) and reboot",
            }),
        ),
    });
    let Some(m) = nvp else {
        return Ok(out);
    };
    const HINT_MODE: &str =
        "run `deploy apply` (it runs nvpmodel -m; reboot when it says a reboot is required)";
    // nvpmodel's own record of the mode, else its answer.
    let status_path = sys_path(root, power::STATUS_FILE);
    let (live, source) = match read_opt(&status_path)? {
        Some(text) => (
            power::parse_status(&text).map(|id| power::LiveMode {
                id,
                name: power::find_conf(&m.conf)
                    .and_then(|c| c.mode(id))
                    .map(|md| md.name.to_string())
                    .unwrap_or_default(),
            }),
            power::STATUS_FILE.to_string(),
        ),
        None => match NvpmodelTool::find(root) {
            Some(tool) => match tool.query() {
                Ok(live) => (Some(live), "nvpmodel -q".to_string()),
                Err(e) => {
                    out.push(check(
                        "power.nvpmodel",
                        Status::Unsupported,
                        format!(
                            "no {} and nvpmodel does not answer: {}",
                            power::STATUS_FILE,
                            units::error::Chain(&e)
                        ),
                        None,
                    ));
                    return Ok(out);
                }
            },
            None => {
                out.push(check(
                    "power.nvpmodel",
                    Status::Unsupported,
                    format!(
                        "neither {} nor an nvpmodel binary: the power mode cannot be read",
                        power::STATUS_FILE
                    ),
                    None,
                ));
                return Ok(out);
            }
        },
    };
    let planned = format!("{} ({}, L4T {})", m.label(), m.conf, m.release);
    out.push(match live {
        None => check(
            "power.nvpmodel",
            Status::Drift,
            format!("{source} holds no mode (`pmode:NNNN`), planned {planned}"),
            Some(HINT_MODE),
        ),
        Some(live) if live.id != m.id => check(
            "power.nvpmodel",
            Status::Drift,
            format!("nvpmodel mode {live} is set ({source}), planned {planned}"),
            Some(HINT_MODE),
        ),
        Some(live) if online.as_ref().is_some_and(|on| on != &m.online) => check(
            "power.nvpmodel",
            Status::Drift,
            format!(
                "nvpmodel mode {live} is set ({source}) but CPUs {} are online, the mode keeps {}",
                online.as_ref().map(|c| c.to_string()).unwrap_or_default(),
                m.online
            ),
            Some("reboot: nvpmodel changes the online CPUs at boot"),
        ),
        Some(live) => check(
            "power.nvpmodel",
            Status::Ok,
            format!("nvpmodel mode {live} ({source}), CPUs {} online", m.online),
            None,
        ),
    });
    Ok(out)
}
