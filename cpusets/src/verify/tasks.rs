//! Tasks on the isolated CPUs: those of `rtdeploy/rt`, and the foreign ones.

use std::path::Path;

use super::{check, Check, Status, VerifyOptions, VerifyRunError};
use crate::model::live::{find_cgroup_root, read_opt, sys_path};
use crate::model::{glob_match, CgroupRoot, Task};
use crate::plan::{is_per_cpu_kthread, RuntimePlan, ThreadKind};

/// Tasks the supervisor put in `rtdeploy/rt` (and their children, which
/// inherit the cgroup): process ids under cgroup v2 (`cgroup.procs`),
/// thread ids under v1 (`tasks`).
#[derive(Debug, Default)]
pub(super) struct RtMembers {
    pids: Vec<u32>,
    tids: Vec<u32>,
}

pub(super) fn rt_cgroup_members(root: &Path) -> Result<RtMembers, VerifyRunError> {
    let ids = |abs: String| -> Result<Vec<u32>, VerifyRunError> {
        Ok(read_opt(&sys_path(root, &abs))?
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect())
    };
    Ok(match find_cgroup_root(root)? {
        CgroupRoot::V2(m) => RtMembers {
            pids: ids(format!("{m}/rtdeploy/rt/cgroup.procs"))?,
            tids: Vec::new(),
        },
        CgroupRoot::V1(m) => RtMembers {
            pids: Vec::new(),
            tids: ids(format!("{m}/rtdeploy/rt/tasks"))?,
        },
        CgroupRoot::None => RtMembers::default(),
    })
}

/// Tasks that may run on the isolated CPUs and should not: not bound to one
/// CPU by the kernel, not placed there by the plan, not in `rtdeploy/rt`,
/// not one of the robot's processes.
pub(super) fn check_foreign_tasks(
    tasks: &[Task],
    plan: &RuntimePlan,
    opts: &VerifyOptions,
    in_rt: &RtMembers,
) -> Vec<Check> {
    let isolated = &plan.cpus.isolated;
    let planned_on_isolated: Vec<u32> = plan
        .threads
        .iter()
        .filter(|t| {
            t.cpus.as_ref().is_some_and(|c| !c.is_disjoint(isolated))
                || t.kind == ThreadKind::Irq && t.cpus.is_none()
        })
        .map(|t| t.pid)
        .collect();
    let mut foreign = Vec::new();
    let mut pinned = Vec::new();
    for t in tasks {
        if t.cpus_allowed.is_disjoint(isolated)
            || is_per_cpu_kthread(t)
            || planned_on_isolated.contains(&t.pid)
            || in_rt.pids.contains(&t.pid)
            || in_rt.tids.contains(&t.tid)
            || opts.allow_tasks.iter().any(|g| glob_match(g, &t.comm))
        {
            continue;
        }
        let line = format!("{} `{}` may run on {}", t.tid, t.comm, t.cpus_allowed);
        if t.kernel_thread && t.no_setaffinity {
            pinned.push(line);
        } else {
            foreign.push(line);
        }
    }
    let mut out = Vec::new();
    let mut c = if foreign.is_empty() {
        check(
            "tasks.isolated",
            Status::Ok,
            format!("no foreign task may run on {isolated}"),
            None,
        )
    } else {
        check(
            "tasks.isolated",
            Status::Drift,
            format!("{} tasks may run on isolated CPUs {isolated}", foreign.len()),
            Some("boot with the planned isolcpus= (new tasks then start on housekeeping CPUs) and let the supervisor place its processes; kernel threads move with `deploy apply`"),
        )
    };
    c.items = foreign;
    out.push(c);
    if !pinned.is_empty() {
        let mut c = check(
            "tasks.isolated.pinned",
            Status::Unmovable,
            format!("{} kernel-pinned threads may run on isolated CPUs", pinned.len()),
            Some("workqueue workers follow the workqueue cpumask once idle; isolcpus= keeps them off at boot"),
        );
        c.items = pinned;
        out.push(c);
    }
    out
}
