//! Fake /proc and /sys trees for the integration tests: a captured fixture
//! copied into a temporary directory, the robot.yaml sections of the
//! examples built in code, and the few things only a kernel does (files
//! appearing in a new cgroup directory, an interrupt's effective affinity
//! following its affinity) done by hand where a test needs them.
#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};

use cpusets::config::{
    BoardSection, CpusSection, IrqOverride, IrqsSection, KernelSection, PartitionKind, Policy,
    PowerSection, SysctlSection, SysctlValue, ThreadRule,
};
use cpusets::model::live::Live;
use cpusets::plan::{self, Isolation, RuntimePlan};
use units::cpu::CpuSet;

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dst);
        } else if e.file_name() != ".keep" {
            fs::copy(e.path(), &dst).unwrap();
        }
    }
}

/// A temporary copy of a fixture tree.
pub fn tree(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixture(name), dir.path());
    dir
}

/// The pid of the task whose comm is `comm` in a tree.
pub fn pid_of(root: &Path, comm: &str) -> u32 {
    for e in fs::read_dir(root.join("proc")).unwrap() {
        let e = e.unwrap();
        if let Ok(c) = fs::read_to_string(e.path().join("comm")) {
            if c.trim() == comm {
                return e.file_name().to_str().unwrap().parse().unwrap();
            }
        }
    }
    panic!("no task `{comm}` in {}", root.display())
}

pub fn read(root: &Path, abs: &str) -> String {
    fs::read_to_string(root.join(abs.trim_start_matches('/')))
        .unwrap_or_else(|e| panic!("{abs}: {e}"))
        .trim()
        .to_string()
}

pub fn write(root: &Path, abs: &str, text: &str) {
    fs::write(root.join(abs.trim_start_matches('/')), text)
        .unwrap_or_else(|e| panic!("{abs}: {e}"));
}

/// The files the kernel creates in a new cgroup directory, for the cgroup
/// directories apply uses (a plain `mkdir` in a temporary directory
/// creates none). `exclusive`: a 6.7+ kernel with cpuset.cpus.exclusive.
pub fn make_cgroup_v2_dirs(root: &Path, mount: &str, exclusive: bool) {
    for dir in ["rtdeploy", "rtdeploy/rt", "rtdeploy/housekeeping"] {
        let d = root.join(mount.trim_start_matches('/')).join(dir);
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("cgroup.subtree_control"), "").unwrap();
        fs::write(d.join("cpuset.cpus"), "\n").unwrap();
        fs::write(d.join("cpuset.cpus.partition"), "member\n").unwrap();
        if exclusive {
            fs::write(d.join("cpuset.cpus.exclusive"), "\n").unwrap();
        }
    }
}

pub fn make_cgroup_v1_dirs(root: &Path, mount: &str) {
    for dir in ["rtdeploy", "rtdeploy/rt", "rtdeploy/housekeeping"] {
        let d = root.join(mount.trim_start_matches('/')).join(dir);
        fs::create_dir_all(&d).unwrap();
        for (f, v) in [
            ("cpuset.cpus", "\n"),
            ("cpuset.mems", "\n"),
            ("cpuset.cpu_exclusive", "0\n"),
            ("cpuset.sched_load_balance", "1\n"),
        ] {
            fs::write(d.join(f), v).unwrap();
        }
    }
}

/// What the kernel does after an affinity write: the effective affinity
/// (and the mask file) follow. Here the first CPU of the list, as the GIC
/// routes a shared interrupt to one CPU.
pub fn settle_irqs(root: &Path) {
    let base = root.join("proc/irq");
    for e in fs::read_dir(&base).unwrap() {
        let d = e.unwrap().path();
        let Ok(list) = fs::read_to_string(d.join("smp_affinity_list")) else {
            continue;
        };
        let set = CpuSet::parse_list(list.trim()).unwrap();
        fs::write(d.join("smp_affinity"), format!("{}\n", set.to_mask())).unwrap();
        if d.join("effective_affinity_list").exists() {
            let first: CpuSet = set.iter().take(1).collect();
            fs::write(d.join("effective_affinity_list"), format!("{first}\n")).unwrap();
        }
    }
}

/// The sections of examples/orin-nano.yaml (this crate cannot read YAML).
pub struct Sections {
    pub board: BoardSection,
    pub cpus: CpusSection,
    pub kernel: KernelSection,
    pub irqs: IrqsSection,
    pub sysctl: SysctlSection,
    pub power: PowerSection,
}

impl Sections {
    pub fn isolation(&self) -> Isolation<'_> {
        Isolation {
            board: &self.board,
            cpus: &self.cpus,
            kernel: &self.kernel,
            irqs: &self.irqs,
            sysctl: &self.sysctl,
            power: &self.power,
        }
    }

    /// Plans against the live state under `root`.
    pub fn plan(&self, root: &Path) -> RuntimePlan {
        let live = Live::read(root).unwrap();
        plan::plan(&self.isolation(), &live.inventory()).unwrap()
    }
}

fn cpus(s: &str) -> CpuSet {
    s.parse().unwrap()
}

fn rule(pattern: &str, policy: Policy, priority: u32, on: Option<&str>) -> ThreadRule {
    serde_json::from_value(serde_json::json!({
        "match": pattern,
        "policy": policy,
        "priority": priority,
        "cpus": on,
    }))
    .unwrap()
}

fn interface_rule(interface: &str, policy: Policy, priority: u32, on: Option<&str>) -> ThreadRule {
    serde_json::from_value(serde_json::json!({
        "interface": interface,
        "policy": policy,
        "priority": priority,
        "cpus": on,
    }))
    .unwrap()
}

pub fn orin() -> Sections {
    let mut sysctl = SysctlSection::new();
    sysctl.insert("kernel.sched_rt_runtime_us".into(), SysctlValue::Int(-1));
    sysctl.insert("vm.stat_interval".into(), SysctlValue::Int(10));
    Sections {
        board: BoardSection {
            model: "jetson-orin-nano".into(),
            cpus: None,
            memory: None,
        },
        cpus: CpusSection {
            housekeeping: Some(cpus("0-3")),
            isolated: cpus("4-5"),
            nohz_full: true,
            partition: PartitionKind::Isolated,
        },
        kernel: KernelSection {
            cmdline: vec!["nosoftlockup".into()],
            ..KernelSection::default()
        },
        irqs: IrqsSection {
            default_affinity: Some(cpus("0-3")),
            overrides: vec![IrqOverride {
                irq: None,
                name: None,
                interface: Some("enP8p1s0".into()),
                cpus: cpus("2-3"),
            }],
            threads: vec![
                // Tegra names these handlers after the device node
                // (`irq/68-3210000.spi`), so the globs are `*spi*`.
                rule("irq/*spi*", Policy::Fifo, 88, Some("4")),
                rule("irq/*-can0", Policy::Fifo, 92, Some("5")),
                interface_rule("enP8p1s0", Policy::Fifo, 50, Some("2-3")),
            ],
            kthreads: vec![rule("rcuc/*", Policy::Fifo, 1, None)],
            rescan: None,
        },
        sysctl,
        power: serde_json::from_value(serde_json::json!({
            "governor": "performance", "lock_frequency": true, "cpu_dma_latency": "0us"
        }))
        .unwrap(),
    }
}

/// The QEMU guest of the qemu-rt-6.12 fixture: 4 CPUs, 2-3 isolated.
pub fn qemu() -> Sections {
    Sections {
        board: BoardSection {
            model: "qemu-x86_64".into(),
            cpus: Some(4),
            memory: None,
        },
        cpus: CpusSection {
            housekeeping: Some(cpus("0-1")),
            isolated: cpus("2-3"),
            nohz_full: true,
            partition: PartitionKind::Isolated,
        },
        kernel: KernelSection::default(),
        irqs: IrqsSection::default(),
        sysctl: SysctlSection::new(),
        power: PowerSection::default(),
    }
}

/// The cgroup v2 directories apply uses, with the files a 6.12 kernel
/// makes in a new cgroup: copied from a captured one, values reset.
pub fn make_cgroup_v2_dirs_like(root: &Path, template: &Path) {
    for dir in ["rtdeploy", "rtdeploy/rt", "rtdeploy/housekeeping"] {
        let d = root.join("sys/fs/cgroup").join(dir);
        fs::create_dir_all(&d).unwrap();
        for e in fs::read_dir(template).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().into_string().unwrap();
            let value = match name.as_str() {
                "cpuset.cpus.partition" => "member\n".to_string(),
                "cpuset.cpus"
                | "cpuset.cpus.exclusive"
                | "cgroup.subtree_control"
                | "cgroup.procs" => "\n".into(),
                _ => fs::read_to_string(e.path()).unwrap(),
            };
            fs::write(d.join(&name), value).unwrap();
        }
    }
}

/// The sections of examples/dev.yaml: 2 CPUs, CPU 1 isolated.
pub fn dev() -> Sections {
    let mut sysctl = SysctlSection::new();
    sysctl.insert("kernel.sched_rt_runtime_us".into(), SysctlValue::Int(-1));
    Sections {
        board: BoardSection {
            model: "generic".into(),
            cpus: Some(2),
            memory: None,
        },
        cpus: CpusSection {
            housekeeping: Some(cpus("0")),
            isolated: cpus("1"),
            nohz_full: true,
            partition: PartitionKind::Isolated,
        },
        kernel: KernelSection::default(),
        irqs: IrqsSection {
            default_affinity: None,
            overrides: vec![],
            threads: vec![rule("irq/*", Policy::Fifo, 50, Some("0"))],
            kthreads: vec![],
            rescan: None,
        },
        sysctl,
        power: PowerSection::default(),
    }
}
