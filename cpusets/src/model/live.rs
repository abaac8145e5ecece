//! Reads the live system's state from a sysroot (`/` on a robot, a
//! temporary tree in tests). Only reads: writing is `apply`'s job.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{
    parse_cpus_allowed, parse_mounts, CgroupRoot, Interrupts, Irq, ModelParseError, Task, TaskStat,
    PF_KTHREAD, PF_NO_SETAFFINITY,
};
use units::cpu::CpuSet;

/// Why the live state could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ModelReadError {
    /// `err` is in the message and deliberately not a `#[source]`, so an
    /// error chain prints it once.
    #[error("cannot read {}: {err}", path.display())]
    Io { path: PathBuf, err: io::Error },
    #[error(transparent)]
    Parse(#[from] ModelParseError),
}

/// `root` joined with an absolute kernel path, as if `root` were `/`.
pub fn sys_path(root: &Path, abs: &str) -> PathBuf {
    root.join(abs.trim_start_matches('/'))
}

/// The most read of a /proc or /sys file: a 256-CPU machine's
/// /proc/interrupts is well under this.
pub const MAX_PSEUDO_FILE: u64 = 4 << 20;

/// The most read of one task's `stat` or `status` (a few hundred bytes
/// each): thousands of tasks are read per plan.
pub const MAX_TASK_FILE: u64 = 64 << 10;

/// How every /proc and /sys file of the model is read: without blocking
/// on a FIFO, at most [`MAX_PSEUDO_FILE`] (their sizes say 0 or 4096).
const PSEUDO: units::bounded::Bound = units::bounded::Bound::pseudo(MAX_PSEUDO_FILE);

fn io_error(e: units::bounded::FileReadError) -> ModelReadError {
    ModelReadError::Io {
        path: e.path().to_path_buf(),
        err: e.into_io(),
    }
}

/// The whole text of a file (bounded: [`MAX_PSEUDO_FILE`]); errors carry
/// the path.
pub fn read_text(path: &Path) -> Result<String, ModelReadError> {
    PSEUDO.read_lossy(path).map_err(io_error)
}

/// The text of a file, or `None` when it does not exist.
pub fn read_opt(path: &Path) -> Result<Option<String>, ModelReadError> {
    match PSEUDO.read_lossy(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(io_error(e)),
    }
}

/// A CPU list file, or `None` when it does not exist.
pub fn read_cpu_list(path: &Path) -> Result<Option<CpuSet>, ModelReadError> {
    match read_opt(path)? {
        None => Ok(None),
        Some(text) => CpuSet::parse_list(text.trim()).map(Some).map_err(|e| {
            ModelParseError::Format {
                path: path.to_path_buf(),
                what: e.to_string(),
            }
            .into()
        }),
    }
}

/// A CPU mask file, or `None` when it does not exist.
pub fn read_cpu_mask(path: &Path) -> Result<Option<CpuSet>, ModelReadError> {
    match read_opt(path)? {
        None => Ok(None),
        Some(text) => CpuSet::parse_mask(text.trim()).map(Some).map_err(|e| {
            ModelParseError::Format {
                path: path.to_path_buf(),
                what: e.to_string(),
            }
            .into()
        }),
    }
}

/// What the planner and verifier need from the live system.
#[derive(Debug, Clone, Serialize)]
pub struct Live {
    /// /sys/devices/system/cpu/online.
    pub online: CpuSet,
    pub interrupts: Interrupts,
    pub irqs: Vec<Irq>,
    pub tasks: Vec<Task>,
}

impl Live {
    /// Reads /proc/interrupts, /proc/irq/*, every task's stat and status,
    /// and the online CPUs under `root`.
    pub fn read(root: &Path) -> Result<Self, ModelReadError> {
        let online_path = sys_path(root, "/sys/devices/system/cpu/online");
        let text = read_text(&online_path)?;
        let online = CpuSet::parse_list(text.trim()).map_err(|e| ModelParseError::Format {
            path: online_path.clone(),
            what: e.to_string(),
        })?;
        let interrupts = read_interrupts(&sys_path(root, "/proc/interrupts"))?;
        let mut irqs = read_irqs(root, &interrupts)?;
        attach_interfaces(&mut irqs, &read_net_irqs(root));
        let tasks = read_tasks(root)?;
        Ok(Live {
            online,
            interrupts,
            irqs,
            tasks,
        })
    }
}

pub fn read_interrupts(path: &Path) -> Result<Interrupts, ModelReadError> {
    Ok(Interrupts::parse(&read_text(path)?, path)?)
}

fn numbered_entries(dir: &Path) -> Result<Vec<u32>, ModelReadError> {
    let rd = fs::read_dir(dir).map_err(|err| ModelReadError::Io {
        path: dir.to_path_buf(),
        err,
    })?;
    let mut out: Vec<u32> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
        .collect();
    out.sort_unstable();
    Ok(out)
}

/// Files in /proc/irq/N that are not action directories.
const IRQ_FILES: &[&str] = &[
    "affinity_hint",
    "effective_affinity",
    "effective_affinity_list",
    "node",
    "smp_affinity",
    "smp_affinity_list",
    "spurious",
];

/// Every numbered interrupt in /proc/irq with its affinities and actions.
pub fn read_irqs(root: &Path, interrupts: &Interrupts) -> Result<Vec<Irq>, ModelReadError> {
    let base = sys_path(root, "/proc/irq");
    let mut irqs = Vec::new();
    for n in numbered_entries(&base)? {
        let dir = base.join(n.to_string());
        let row = interrupts.row(&n.to_string());
        let mut actions: Vec<String> = match fs::read_dir(&dir) {
            Ok(rd) => rd
                .filter_map(|e| e.ok())
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .filter_map(|e| e.file_name().to_str().map(String::from))
                .filter(|name| !IRQ_FILES.contains(&name.as_str()))
                .collect(),
            // Freed between the listing and now.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(err) => return Err(ModelReadError::Io { path: dir, err }),
        };
        actions.sort();
        if actions.is_empty() {
            if let Some(r) = row {
                actions = r.actions();
            }
        }
        irqs.push(Irq {
            irq: n,
            actions,
            chip: row.map(|r| r.chip().to_string()).unwrap_or_default(),
            hwirq: row.and_then(|r| r.hwirq()),
            affinity: read_cpu_list(&dir.join("smp_affinity_list"))?,
            effective: read_cpu_list(&dir.join("effective_affinity_list"))?,
            interfaces: Vec::new(),
        });
    }
    Ok(irqs)
}

/// At most this many network interfaces, and interrupts per device, are
/// read from /sys: a bound against a strange or hostile sysfs.
const NET_LIMIT: usize = 4096;

/// The network interfaces in /sys/class/net, each with the interrupts its
/// device lists: a PCI function's MSI/MSI-X vectors (`msi_irqs/N`) and its
/// legacy `irq`; for a virtio device (whose vectors its PCI parent holds),
/// the parent's. Interfaces without a device (`lo`, bridges) have none.
/// Unreadable entries are skipped: ownership read from sysfs is a hint
/// for rules, never a reason to fail a plan.
pub fn read_net_irqs(root: &Path) -> BTreeMap<String, Vec<u32>> {
    let mut out = BTreeMap::new();
    let Ok(rd) = fs::read_dir(sys_path(root, "/sys/class/net")) else {
        return out;
    };
    for entry in rd.filter_map(|e| e.ok()).take(NET_LIMIT) {
        let Some(name) = entry.file_name().to_str().map(String::from) else {
            continue;
        };
        // IFNAMSIZ: 15 characters and the NUL.
        if name.is_empty() || name.len() > 15 {
            continue;
        }
        let device = entry.path().join("device");
        let mut irqs = device_irqs(&device);
        let virtio = fs::read_link(device.join("subsystem"))
            .ok()
            .and_then(|t| t.file_name().map(|f| f == "virtio"))
            .unwrap_or(false);
        if virtio {
            irqs.extend(device_irqs(&device.join("..")));
        }
        irqs.sort_unstable();
        irqs.dedup();
        out.insert(name, irqs);
    }
    out
}

/// The interrupts a device directory lists: `msi_irqs/N` and a non-zero
/// `irq`.
fn device_irqs(device: &Path) -> Vec<u32> {
    let mut irqs: Vec<u32> = fs::read_dir(device.join("msi_irqs"))
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .take(NET_LIMIT)
                .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
                .collect()
        })
        .unwrap_or_default();
    if let Ok(Some(text)) = read_opt(&device.join("irq")) {
        if let Ok(n) = text.trim().parse::<u32>() {
            if n != 0 {
                irqs.push(n);
            }
        }
    }
    irqs
}

/// Sets each interrupt's [`Irq::interfaces`] from the device listing of
/// [`read_net_irqs`] and from its action names: an action that is an
/// interface's name, or starts with `<name>-`, is that interface's (mttcan
/// requests `can0` in `open`; many NIC drivers name queue vectors
/// `eth0-TxRx-0`).
pub fn attach_interfaces(irqs: &mut [Irq], net: &BTreeMap<String, Vec<u32>>) {
    for irq in irqs.iter_mut() {
        let mut owners: Vec<String> = net
            .iter()
            .filter(|(name, listed)| {
                listed.contains(&irq.irq)
                    || irq.actions.iter().any(|a| {
                        a.strip_prefix(name.as_str())
                            .is_some_and(|rest| rest.is_empty() || rest.starts_with('-'))
                    })
            })
            .map(|(name, _)| name.clone())
            .collect();
        owners.sort();
        owners.dedup();
        irq.interfaces = owners;
    }
}

/// Every task: the threads in /proc/PID/task when the directory exists,
/// else the process itself. Tasks that exit while being read are skipped.
pub fn read_tasks(root: &Path) -> Result<Vec<Task>, ModelReadError> {
    let proc_dir = sys_path(root, "/proc");
    let mut tasks = Vec::new();
    for pid in numbered_entries(&proc_dir)? {
        let pdir = proc_dir.join(pid.to_string());
        let tdir = pdir.join("task");
        let tids = match numbered_entries(&tdir) {
            Ok(t) if !t.is_empty() => t
                .into_iter()
                .map(|t| (t, tdir.join(t.to_string())))
                .collect(),
            _ => vec![(pid, pdir.clone())],
        };
        for (tid, dir) in tids {
            match read_task(pid, tid, &dir) {
                Ok(Some(t)) => tasks.push(t),
                Ok(None) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(tasks)
}

/// One task's stat and status; `None` if it has gone.
pub fn read_task(pid: u32, tid: u32, dir: &Path) -> Result<Option<Task>, ModelReadError> {
    let stat_path = dir.join("stat");
    let status_path = dir.join("status");
    let (Some(stat), Some(status)) = (gone_is_none(&stat_path)?, gone_is_none(&status_path)?)
    else {
        return Ok(None);
    };
    let st = TaskStat::parse(&stat, &stat_path)?;
    let cpus = parse_cpus_allowed(&status, &status_path)?;
    Ok(Some(Task {
        tid,
        pid,
        comm: st.comm,
        kernel_thread: st.flags & PF_KTHREAD != 0,
        no_setaffinity: st.flags & PF_NO_SETAFFINITY != 0,
        policy: st.policy,
        rt_priority: st.rt_priority,
        cpus_allowed: cpus,
        last_cpu: st.processor,
    }))
}

/// Reads a file of a task that may exit at any moment: missing or `ESRCH`
/// means gone.
fn gone_is_none(path: &Path) -> Result<Option<String>, ModelReadError> {
    use units::bounded::FileReadError;
    match units::bounded::Bound::pseudo(MAX_TASK_FILE).read_lossy(path) {
        Ok(s) => Ok(Some(s)),
        Err(FileReadError::Open { err, .. } | FileReadError::Read { err, .. })
            if err.kind() == io::ErrorKind::NotFound || err.raw_os_error() == Some(3) =>
        {
            Ok(None)
        }
        Err(e) => Err(io_error(e)),
    }
}

/// Finds the cgroup hierarchy for cpusets from /proc/mounts: cgroup v2 when
/// its root offers the cpuset controller, else the v1 cpuset hierarchy.
pub fn find_cgroup_root(root: &Path) -> Result<CgroupRoot, ModelReadError> {
    let Some(text) = read_opt(&sys_path(root, "/proc/mounts"))? else {
        return Ok(CgroupRoot::None);
    };
    let mounts = parse_mounts(&text);
    for m in mounts.iter().filter(|m| m.fstype == "cgroup2") {
        let controllers = read_opt(&sys_path(root, &format!("{}/cgroup.controllers", m.target)))?;
        if controllers.is_some_and(|c| c.split_whitespace().any(|w| w == "cpuset")) {
            return Ok(CgroupRoot::V2(m.target.clone()));
        }
    }
    for m in mounts.iter().filter(|m| m.fstype == "cgroup") {
        if m.options.iter().any(|o| o == "cpuset") {
            return Ok(CgroupRoot::V1(m.target.clone()));
        }
    }
    Ok(CgroupRoot::None)
}

/// The directory of a task in /proc: `/proc/PID/task/TID` when it exists,
/// else `/proc/PID` (fixture trees keep processes only).
pub fn task_dir(root: &Path, pid: u32, tid: u32) -> PathBuf {
    let t = sys_path(root, &format!("/proc/{pid}/task/{tid}"));
    if t.is_dir() {
        t
    } else {
        sys_path(root, &format!("/proc/{tid}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_captured_host_tree() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/host-6.18");
        let live = Live::read(&root).unwrap();
        assert_eq!(live.online.to_string(), "0-1");
        let ged = live.irqs.iter().find(|i| i.irq == 24).unwrap();
        assert_eq!(ged.actions, vec!["ACPI:Ged"]);
        assert_eq!(ged.chip, "IO-APIC");
        assert!(ged.affinity.is_some());
        let t = live
            .tasks
            .iter()
            .find(|t| t.comm == "irq/24-ACPI:Ged")
            .unwrap();
        assert!(t.kernel_thread);
        assert_eq!(t.irq_number(), Some(24));
        assert_eq!((t.policy, t.rt_priority), (1, 50));
        assert!(live.tasks.iter().any(|t| !t.kernel_thread));
    }
}
