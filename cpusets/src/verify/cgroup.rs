//! The cgroup cpusets of rtdeploy: their CPUs, and the partition (v2) or
//! the exclusive flag (v1) of `rtdeploy/rt`.

use std::path::Path;

use units::cpu::CpuSet;

use super::{check, Check, Status, VerifyRunError, HINT_APPLY};
use crate::model::live::{find_cgroup_root, read_cpu_list, read_opt, sys_path};
use crate::model::{partition_invalid_reason, CgroupRoot};
use crate::plan::RuntimePlan;

pub(super) fn check_cgroups(plan: &RuntimePlan, root: &Path) -> Result<Vec<Check>, VerifyRunError> {
    let g = &plan.cgroups;
    let mut out = Vec::new();
    let cpus_check = |id: &str, abs: &str, want: &CpuSet| -> Result<Check, VerifyRunError> {
        Ok(match read_cpu_list(&sys_path(root, abs))? {
            Some(c) if &c == want => check(id, Status::Ok, format!("{abs} = {c}"), None),
            Some(c) => check(
                id,
                Status::Drift,
                format!("{abs} = {c}, planned {want}"),
                Some(HINT_APPLY),
            ),
            None => check(
                id,
                Status::Drift,
                format!("{abs} does not exist"),
                Some(HINT_APPLY),
            ),
        })
    };
    let cgroup = find_cgroup_root(root)?;
    let m = match &cgroup {
        CgroupRoot::None => {
            out.push(check(
                "cgroup",
                Status::Unsupported,
                "no cgroup hierarchy with the cpuset controller is mounted",
                Some("enable CONFIG_CPUSETS and mount cgroup2 (or the v1 cpuset hierarchy)"),
            ));
            return Ok(out);
        }
        CgroupRoot::V2(m) | CgroupRoot::V1(m) => m,
    };
    for (name, want) in [("rt", &g.rt), ("housekeeping", &g.housekeeping)] {
        out.push(cpus_check(
            &format!("cgroup.{name}.cpus"),
            &format!("{m}/rtdeploy/{name}/cpuset.cpus"),
            want,
        )?);
    }
    match (&cgroup, g.partition_value()) {
        (CgroupRoot::V2(_), Some(kind)) => out.push(check_partition_v2(root, m, kind)?),
        (CgroupRoot::V1(_), Some(_)) => out.push(check_exclusive_v1(root, m)?),
        _ => {}
    }
    Ok(out)
}

/// The cgroup v2 partition of rtdeploy/rt under the mount `m`.
fn check_partition_v2(root: &Path, m: &str, kind: &str) -> Result<Check, VerifyRunError> {
    let abs = format!("{m}/rtdeploy/rt/cpuset.cpus.partition");
    let exclusive = sys_path(root, &format!("{m}/rtdeploy/cpuset.cpus.exclusive")).exists();
    Ok(match read_opt(&sys_path(root, &abs))? {
        _ if !exclusive && sys_path(root, &format!("{m}/rtdeploy")).is_dir() => check(
            "cgroup.rt.partition",
            Status::Unsupported,
            "nested partitions need cpuset.cpus.exclusive (Linux 6.7+)",
            Some("the command line's isolcpus= isolates without a partition"),
        ),
        None => check("cgroup.rt.partition", Status::Drift, format!("{abs} does not exist"), Some(HINT_APPLY)),
        Some(v) => match partition_invalid_reason(&v) {
            Some(reason) => check(
                "cgroup.rt.partition",
                Status::Drift,
                format!("partition invalid: {reason} ({abs} = `{}`)", v.trim()),
                Some("the kernel refused the partition: a partition under rtdeploy needs the CPUs in cpuset.cpus.exclusive of rtdeploy and rtdeploy/rt (`deploy apply` writes both); a partition that mixes isolcpus= CPUs with housekeeping ones conflicts with the housekeeping setup; or set cpus.partition: none"),
            ),
            None if v.trim() == kind => check("cgroup.rt.partition", Status::Ok, format!("partition {kind}"), None),
            None => check(
                "cgroup.rt.partition",
                Status::Drift,
                format!("partition `{}`, planned {kind}", v.trim()),
                Some(HINT_APPLY),
            ),
        },
    })
}

/// The cgroup v1 `cpu_exclusive` flag of rtdeploy/rt under the mount `m`.
fn check_exclusive_v1(root: &Path, m: &str) -> Result<Check, VerifyRunError> {
    let abs = format!("{m}/rtdeploy/rt/cpuset.cpu_exclusive");
    Ok(match read_opt(&sys_path(root, &abs))? {
        Some(v) if v.trim() == "1" => check(
            "cgroup.rt.exclusive",
            Status::Ok,
            "v1 cpuset rtdeploy/rt is cpu_exclusive",
            None,
        ),
        Some(v) => check(
            "cgroup.rt.exclusive",
            Status::Drift,
            format!("{abs} = {}, planned 1", v.trim()),
            Some(HINT_APPLY),
        ),
        None => check(
            "cgroup.rt.exclusive",
            Status::Drift,
            format!("{abs} does not exist"),
            Some(HINT_APPLY),
        ),
    })
}
