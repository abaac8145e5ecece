//! The configuration files an image carries so that the system boots with
//! the plan's settings before anything applies it:
//! `/etc/sysctl.d/90-rtdeploy.conf` and
//! `/etc/security/limits.d/90-rtdeploy.conf`. Pure: each returns the text.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::config::SysctlSection;
use crate::plan::plan_sysctls;

/// `/etc/sysctl.d/90-rtdeploy.conf`: the sysctls `apply` sets
/// ([`plan_sysctls`]: rtdeploy's real-time defaults, robot.yaml's
/// `sysctl:` overriding), each with its reason.
pub fn sysctl_conf(section: &SysctlSection) -> String {
    let mut out = String::from(
        "# Written by `deploy image` from robot.yaml; `deploy apply` sets the same values.\n",
    );
    for s in plan_sysctls(section) {
        let _ = write!(out, "# {}\n{} = {}\n", s.reason, s.key, s.value);
    }
    out
}

/// A `memlock` limit as limits.conf writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum MemlockLimit {
    /// Bytes, written in KiB rounded up.
    Bytes(u64),
    Unlimited,
}

/// What one process started under a user needs from limits.conf.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessLimits<'a> {
    pub user: &'a str,
    /// The real-time priority it runs at; 0 for a process that is not
    /// real-time.
    pub rtprio: u32,
    pub memlock: Option<MemlockLimit>,
}

/// `/etc/security/limits.d/90-rtdeploy.conf`: real-time priority and
/// memory locking for the robot's group, and for each user the highest
/// priority and largest memlock among its processes, for programs started
/// by hand (the supervisor sets its children's limits itself).
pub fn limits_conf<'a>(
    group: Option<&str>,
    processes: impl IntoIterator<Item = ProcessLimits<'a>>,
) -> String {
    let mut out = String::from(
        "# Written by `deploy image` from robot.yaml.\n# <domain> <type> <item> <value>\n",
    );
    if let Some(g) = group {
        let _ = write!(out, "@{g} - rtprio 99\n@{g} - memlock unlimited\n");
    }
    let mut users: BTreeMap<&str, (u32, Option<MemlockLimit>)> = BTreeMap::new();
    for p in processes {
        let e = users.entry(p.user).or_default();
        e.0 = e.0.max(p.rtprio);
        e.1 = e.1.max(p.memlock);
    }
    for (user, (prio, memlock)) in users {
        if prio > 0 {
            let _ = writeln!(out, "{user} - rtprio {prio}");
        }
        match memlock {
            Some(MemlockLimit::Bytes(b)) => {
                let _ = writeln!(out, "{user} - memlock {}", b.div_ceil(1024));
            }
            Some(MemlockLimit::Unlimited) => {
                let _ = writeln!(out, "{user} - memlock unlimited");
            }
            None => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SysctlValue;

    #[test]
    fn sysctl_conf_has_the_defaults_and_robot_yaml_overriding() {
        let mut section = SysctlSection::new();
        section.insert("kernel.timer_migration".into(), SysctlValue::Int(1));
        section.insert("vm.swappiness".into(), SysctlValue::Int(10));
        let text = sysctl_conf(&section);
        assert!(text.contains("kernel.sched_rt_runtime_us = -1\n"), "{text}");
        assert!(
            text.contains("# from sysctl in robot.yaml\nkernel.timer_migration = 1\n"),
            "{text}"
        );
        assert!(!text.contains("kernel.timer_migration = 0"), "{text}");
        assert!(
            text.ends_with("# from sysctl in robot.yaml\nvm.swappiness = 10\n"),
            "{text}"
        );
    }

    #[test]
    fn limits_take_each_users_highest_priority_and_largest_memlock() {
        let p = |user, rtprio, memlock| ProcessLimits {
            user,
            rtprio,
            memlock,
        };
        let text = limits_conf(
            Some("robot"),
            [
                p("ctl", 80, Some(MemlockLimit::Bytes(64 << 20))),
                p("ctl", 90, Some(MemlockLimit::Bytes(1025))),
                p("log", 0, Some(MemlockLimit::Bytes(1025))),
                p("cam", 50, Some(MemlockLimit::Bytes(1))),
                p("cam", 0, Some(MemlockLimit::Unlimited)),
                p("web", 0, None),
            ],
        );
        assert_eq!(
            text,
            "# Written by `deploy image` from robot.yaml.\n# <domain> <type> <item> <value>\n\
             @robot - rtprio 99\n@robot - memlock unlimited\n\
             cam - rtprio 50\ncam - memlock unlimited\n\
             ctl - rtprio 90\nctl - memlock 65536\n\
             log - memlock 2\n"
        );
    }
}
