//! Rules by network interface: which interrupts an interface owns, read
//! from /sys the way the kernel lays it out (a virtio NIC whose MSI-X
//! vectors its PCI function lists, a PCI NIC on a legacy INTx line, a
//! platform CAN controller that names its interrupt after the interface
//! when it comes up), and the plan placing interrupts and IRQ threads by
//! `interface:`.

mod common;

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

use common::{pid_of, qemu, tree};
use cpusets::config::{IrqOverride, Policy, ThreadRule};
use cpusets::model::live::Live;
use cpusets::plan::{self, ThreadKind};
use units::cpu::CpuSet;

fn mkdir(root: &Path, abs: &str) {
    fs::create_dir_all(root.join(abs.trim_start_matches('/'))).unwrap();
}

fn put(root: &Path, abs: &str, text: &str) {
    let p = root.join(abs.trim_start_matches('/'));
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, text).unwrap();
}

fn link(root: &Path, abs: &str, target: &str) {
    let p = root.join(abs.trim_start_matches('/'));
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    symlink(target, p).unwrap();
}

/// Renames interrupt `n`'s only action from `old` to `new` in /proc/irq,
/// /proc/interrupts and its IRQ thread's comm: what a driver that
/// requests its interrupt under the interface name shows.
fn rename_action(root: &Path, n: u32, old: &str, new: &str) {
    let dir = root.join(format!("proc/irq/{n}"));
    fs::rename(dir.join(old), dir.join(new)).unwrap();
    let p = root.join("proc/interrupts");
    let text = fs::read_to_string(&p).unwrap();
    let text: String = text
        .lines()
        .map(|l| {
            if l.trim_start().starts_with(&format!("{n}:")) {
                l.replace(old, new)
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    fs::write(&p, text + "\n").unwrap();
    let pid = pid_of(root, &format!("irq/{n}-{old}"));
    for f in ["comm", "stat", "status"] {
        let p = root.join(format!("proc/{pid}/{f}"));
        let text = fs::read_to_string(&p).unwrap();
        let renamed = text.replace(&format!("irq/{n}-{old}"), &format!("irq/{n}-{new}"));
        assert_ne!(text, renamed, "{f}");
        fs::write(&p, renamed).unwrap();
    }
}

/// The QEMU guest's tree with four interfaces:
/// - `eth0`: virtio-net on PCI function 0000:00:03.0, whose MSI-X vectors
///   24 and 25 (`virtio0-config`, `virtio0-virtqueues`) the function lists;
/// - `enp0s4`: a PCI NIC on legacy INTx line 9 (`device/irq`);
/// - `can0`: a platform device without an interrupt listing, whose
///   driver requested IRQ 8 as `can0`;
/// - `can` and `lo`: no device; `can` must not own `can0`'s interrupt.
fn tree_with_interfaces() -> tempfile::TempDir {
    let t = tree("qemu-rt-6.12");
    let r = t.path();
    let pci = "/sys/devices/pci0000:00/0000:00:03.0";
    put(r, &format!("{pci}/msi_irqs/24"), "msix\n");
    put(r, &format!("{pci}/msi_irqs/25"), "msix\n");
    mkdir(r, &format!("{pci}/virtio0/net/eth0"));
    mkdir(r, "/sys/bus/virtio");
    link(
        r,
        &format!("{pci}/virtio0/subsystem"),
        "../../../../bus/virtio",
    );
    link(
        r,
        &format!("{pci}/virtio0/net/eth0/device"),
        "../../../virtio0",
    );
    link(
        r,
        "/sys/class/net/eth0",
        "../../devices/pci0000:00/0000:00:03.0/virtio0/net/eth0",
    );

    let nic = "/sys/devices/pci0000:00/0000:00:04.0";
    put(r, &format!("{nic}/irq"), "9\n");
    mkdir(r, &format!("{nic}/net/enp0s4"));
    link(
        r,
        &format!("{nic}/net/enp0s4/device"),
        "../../../0000:00:04.0",
    );
    link(
        r,
        "/sys/class/net/enp0s4",
        "../../devices/pci0000:00/0000:00:04.0/net/enp0s4",
    );

    let can = "/sys/devices/platform/c310000.mttcan";
    mkdir(r, &format!("{can}/net/can0"));
    link(
        r,
        &format!("{can}/net/can0/device"),
        "../../../c310000.mttcan",
    );
    link(
        r,
        "/sys/class/net/can0",
        "../../devices/platform/c310000.mttcan/net/can0",
    );
    rename_action(r, 8, "rtc0", "can0");

    mkdir(r, "/sys/devices/virtual/net/lo");
    link(r, "/sys/class/net/lo", "../../devices/virtual/net/lo");
    mkdir(r, "/sys/devices/virtual/net/can");
    link(r, "/sys/class/net/can", "../../devices/virtual/net/can");
    t
}

fn rule(json: serde_json::Value) -> ThreadRule {
    serde_json::from_value(json).unwrap()
}

fn cpus(s: &str) -> CpuSet {
    s.parse().unwrap()
}

#[test]
fn interrupts_are_owned_by_the_interface_whose_device_lists_them_or_names_them() {
    let t = tree_with_interfaces();
    let live = Live::read(t.path()).unwrap();
    let owners = |n: u32| {
        live.irqs
            .iter()
            .find(|i| i.irq == n)
            .unwrap_or_else(|| panic!("no IRQ {n}"))
            .interfaces
            .clone()
    };
    assert_eq!(owners(24), ["eth0"], "MSI-X vector of the virtio parent");
    assert_eq!(owners(25), ["eth0"], "MSI-X vector of the virtio parent");
    assert_eq!(owners(9), ["enp0s4"], "legacy INTx line in device/irq");
    assert_eq!(owners(8), ["can0"], "action named after the interface");
    assert!(owners(4).is_empty(), "ttyS0 belongs to no interface");
    assert!(owners(1).is_empty());
}

#[test]
fn the_plan_places_interrupts_and_their_threads_by_interface() {
    let t = tree_with_interfaces();
    let live = Live::read(t.path()).unwrap();
    let mut s = qemu();
    s.irqs.overrides = vec![
        serde_json::from_value::<IrqOverride>(serde_json::json!({
            "interface": "eth*", "cpus": "1"
        }))
        .unwrap(),
        serde_json::from_value::<IrqOverride>(serde_json::json!({
            "interface": "wlan0", "cpus": "0"
        }))
        .unwrap(),
    ];
    s.irqs.threads = vec![
        rule(serde_json::json!({
            "interface": "can0", "policy": "fifo", "priority": 92, "cpus": "3"
        })),
        // Both selectors: only eth0's config vector, not its queues.
        rule(serde_json::json!({
            "match": "irq/*-config", "interface": "eth0", "policy": "fifo", "priority": 40
        })),
        rule(serde_json::json!({
            "interface": "wlan*", "policy": "fifo", "priority": 10
        })),
    ];
    let p = plan::plan(&s.isolation(), &live.inventory()).unwrap();

    let irq = |n: u32| p.irqs.iter().find(|i| i.irq == n).unwrap();
    for n in [24, 25] {
        assert_eq!(irq(n).cpus, cpus("1"), "IRQ {n}");
        assert_eq!(irq(n).reason, "irqs.overrides[0]", "IRQ {n}");
    }
    assert_eq!(irq(9).cpus, cpus("0-1"), "enp0s4 is not eth*");
    assert_eq!(irq(8).cpus, cpus("0-1"));

    let thread = |comm: &str| {
        p.threads
            .iter()
            .find(|t| t.comm == comm)
            .unwrap_or_else(|| panic!("no placement for {comm}: {:#?}", p.threads))
    };
    let can = thread("irq/8-can0");
    assert_eq!(can.kind, ThreadKind::Irq);
    assert_eq!((can.policy, can.priority), (Some(Policy::Fifo), Some(92)));
    assert_eq!(can.cpus, Some(cpus("3")));
    assert_eq!(can.reason, "irqs.threads[0] interface `can0`");

    let config = thread("irq/24-virtio0-config");
    assert_eq!(config.priority, Some(40));
    assert_eq!(config.cpus, Some(cpus("1")), "follows its interrupt");
    assert_eq!(
        config.reason,
        "irqs.threads[1] `irq/*-config` on interface `eth0`"
    );
    let queues = thread("irq/25-virtio0-virtqueues");
    assert_eq!(queues.policy, None, "no rule: {queues:?}");
    assert_eq!(queues.reason, "follows its interrupt's CPUs");

    assert!(
        p.warnings
            .contains(&"irqs.overrides[1] matches no interrupt".to_string()),
        "{:?}",
        p.warnings
    );
    assert!(
        p.warnings
            .contains(&"irqs.threads[2] interface `wlan*` matches no kernel thread".to_string()),
        "{:?}",
        p.warnings
    );
}

#[test]
fn an_interface_that_comes_up_later_is_matched_on_the_next_read() {
    // Before can0 is up its driver holds no interrupt: nothing to match.
    let t = tree("qemu-rt-6.12");
    let before = Live::read(t.path()).unwrap();
    assert!(before.irqs.iter().all(|i| i.interfaces.is_empty()));
    let t = tree_with_interfaces();
    let after = Live::read(t.path()).unwrap();
    assert!(after
        .irqs
        .iter()
        .any(|i| i.interfaces == ["can0"] && i.actions == ["can0"]));
}

#[test]
fn a_strange_sysfs_is_read_without_failing() {
    let t = tree("qemu-rt-6.12");
    let r = t.path();
    // A loop, a dangling device, garbage in `irq`, a name too long for
    // an interface, and msi_irqs entries that are not numbers.
    link(r, "/sys/class/net/loop0", "loop0");
    mkdir(r, "/sys/devices/virtual/net/dang0");
    link(r, "/sys/devices/virtual/net/dang0/device", "/nonexistent");
    link(r, "/sys/class/net/dang0", "../../devices/virtual/net/dang0");
    let nic = "/sys/devices/pci0000:00/0000:00:05.0";
    put(r, &format!("{nic}/irq"), "not a number\n");
    put(r, &format!("{nic}/msi_irqs/xyz"), "msix\n");
    put(r, &format!("{nic}/msi_irqs/4294967296"), "msix\n");
    mkdir(r, &format!("{nic}/net/bad0"));
    link(
        r,
        &format!("{nic}/net/bad0/device"),
        "../../../0000:00:05.0",
    );
    link(
        r,
        "/sys/class/net/bad0",
        "../../devices/pci0000:00/0000:00:05.0/net/bad0",
    );
    mkdir(r, "/sys/class/net/averyveryverylongname");
    let live = Live::read(r).unwrap();
    assert!(live.irqs.iter().all(|i| i.interfaces.is_empty()));
}
