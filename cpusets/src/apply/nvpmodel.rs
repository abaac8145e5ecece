//! The Jetson power mode: `nvpmodel -m`, and the CPU clocks pinned at the
//! mode's cap.
//!
//! nvpmodel changes the online CPUs only through a reboot: for such a mode
//! it asks on standard input whether to reboot now. It runs here with
//! /dev/null as input (it reads end-of-file, the answer "no") and a
//! timeout, and the report says "reboot required" when its output asks for
//! one or when the CPUs online afterwards are not the mode's.

use super::{Applier, ApplyRunError, Missing, Outcome};
use crate::model::live::{read_cpu_list, read_opt, sys_path};
use crate::plan::{FreqLock, NvpmodelPlan, RuntimePlan};
use crate::power::{self, LiveMode};
use units::cpu::CpuSet;

const ONLINE: &str = "/sys/devices/system/cpu/online";

/// True when the name nvpmodel reports for the mode is the table's.
fn same_name(live: &LiveMode, m: &NvpmodelPlan) -> bool {
    live.name.eq_ignore_ascii_case(&m.name)
}

fn other_conf(live: &LiveMode, m: &NvpmodelPlan) -> String {
    format!(
        "the board's nvpmodel calls mode {} `{}`, robot.yaml's table ({}, L4T {}) calls it `{}`: the board runs another nvpmodel configuration (set `power.nvpmodel_conf` to the one in /etc/nvpmodel.conf)",
        live.id, live.name, m.conf, m.release, m.name
    )
}

/// Why the CPUs online (`now`) show the mode not yet in effect, or `None`
/// when they are the mode's.
fn pending_cpus(now: Option<&CpuSet>, m: &NvpmodelPlan) -> Option<String> {
    let now = now?;
    (now != &m.online).then(|| {
        format!(
            "mode {} keeps CPUs {} online, CPUs {now} are online: the change of online CPUs takes effect at the next boot",
            m.label(),
            m.online
        )
    })
}

/// Sets the mode `m` with `nvpmodel -m` unless nvpmodel reports it set.
pub(super) fn apply_mode(a: &mut Applier, m: &NvpmodelPlan) -> Result<(), ApplyRunError> {
    let item = format!("nvpmodel power mode ({}, L4T {})", m.conf, m.release);
    let new = m.label();
    let Some(tool) = a.opts.nvpmodel.clone() else {
        a.push(
            item,
            "nvpmodel".into(),
            None,
            new,
            Outcome::Unsupported {
                reason: format!(
                    "no nvpmodel binary (looked in PATH, {}): the power mode is left as it is",
                    power::TOOL_DIRS.join(", ")
                ),
            },
        );
        return Ok(());
    };
    let path = format!("{} -m {}", tool.path.display(), m.id);
    let online_now = || read_cpu_list(&sys_path(a.root, ONLINE));
    let current = match tool.query() {
        Ok(live) => live,
        Err(e) => {
            let error = units::error::Chain(&e).to_string();
            a.push(item, path, None, new, Outcome::Failed { error });
            return Ok(());
        }
    };
    let old = Some(current.to_string());
    let outcome = if current.id == m.id {
        if !same_name(&current, m) {
            Outcome::Failed {
                error: other_conf(&current, m),
            }
        } else {
            match pending_cpus(online_now()?.as_ref(), m) {
                Some(reason) => Outcome::RebootRequired { reason },
                None => Outcome::Unchanged,
            }
        }
    } else if a.opts.dry_run {
        Outcome::WouldChange
    } else {
        let id = m.id.to_string();
        match tool.run(&["-m", &id]) {
            Err(e) => Outcome::Failed {
                error: units::error::Chain(&e).to_string(),
            },
            Ok(run) => {
                let said = run.output_line();
                let pending = pending_cpus(online_now()?.as_ref(), m);
                if power::asks_for_reboot(&run.output) || pending.is_some() {
                    let mut reason = pending.unwrap_or_else(|| {
                        format!("`{}` asks for a reboot for mode {}", run.command, m.label())
                    });
                    if run.timed_out {
                        reason.push_str(&format!(
                            "; nvpmodel did not finish within {} s and was stopped",
                            tool.timeout.as_secs()
                        ));
                    }
                    if !said.is_empty() {
                        reason.push_str(&format!(" (nvpmodel said: {said})"));
                    }
                    Outcome::RebootRequired { reason }
                } else if run.timed_out {
                    Outcome::Failed {
                        error: format!(
                            "`{}` did not finish within {} s and was stopped: {said}",
                            run.command,
                            tool.timeout.as_secs()
                        ),
                    }
                } else if !run.succeeded() {
                    Outcome::Failed {
                        error: format!(
                            "`{}` exited with code {}: {said}",
                            run.command,
                            run.code
                                .map_or("none (killed by a signal)".into(), |c| c.to_string())
                        ),
                    }
                } else {
                    // What nvpmodel calls the mode it set must be the
                    // table's, or the board runs another configuration.
                    match tool.query() {
                        Ok(live) if live.id == m.id && same_name(&live, m) => Outcome::Changed,
                        Ok(live) if live.id == m.id => Outcome::Failed {
                            error: other_conf(&live, m),
                        },
                        Ok(live) => Outcome::Failed {
                            error: format!(
                                "`{}` succeeded but nvpmodel reports mode {live}",
                                run.command
                            ),
                        },
                        Err(e) => Outcome::Failed {
                            error: units::error::Chain(&e).to_string(),
                        },
                    }
                }
            }
        }
    };
    a.push(item, path, old, new, outcome);
    Ok(())
}

/// Pins CPU `cpu` at the mode's cap: `scaling_max_freq`, then
/// `scaling_min_freq`, to the cap (or to `cpuinfo_max_freq` for a mode
/// that sets none). A CPU the kernel reports offline has no clock to pin.
pub(super) fn pin_clock(
    a: &mut Applier,
    plan: &RuntimePlan,
    cpu: u32,
    online: Option<&CpuSet>,
) -> Result<(), ApplyRunError> {
    let dir = format!("/sys/devices/system/cpu/cpu{cpu}/cpufreq");
    let item = |what: &str| format!("cpu{cpu} {what} frequency (nvpmodel mode cap)");
    if online.is_some_and(|on| !on.contains(cpu)) {
        a.push(
            item("minimum = maximum"),
            format!("{dir}/scaling_min_freq"),
            None,
            "-".into(),
            Outcome::Unsupported {
                reason: format!("cpu{cpu} is offline"),
            },
        );
        return Ok(());
    }
    let target = match plan.cpufreq.lock_to {
        FreqLock::Khz { khz } => Some(khz.to_string()),
        FreqLock::HardwareMax => read_opt(&sys_path(a.root, &format!("{dir}/cpuinfo_max_freq")))?
            .map(|t| t.trim().to_string()),
        FreqLock::CurrentMax => None,
    };
    let Some(target) = target else {
        a.push(
            item("minimum = maximum"),
            format!("{dir}/scaling_min_freq"),
            None,
            "cpuinfo_max_freq".into(),
            Outcome::Unsupported {
                reason: format!("{dir}/cpuinfo_max_freq does not exist (no cpufreq driver)"),
            },
        );
        return Ok(());
    };
    let same = |old: &str| old.trim() == target;
    for (what, file) in [
        ("maximum", "scaling_max_freq"),
        ("minimum", "scaling_min_freq"),
    ] {
        a.set(
            item(what),
            &format!("{dir}/{file}"),
            target.clone(),
            same,
            Missing::Unsupported,
            false,
        );
    }
    Ok(())
}
