//! Plan, apply and verify on the tree captured from Debian's PREEMPT_RT
//! 6.12 kernel booted under QEMU (-smp 4) with the planned isolation
//! command line for CPUs 2-3, before anything of rtdeploy ran.

mod common;

use std::path::Path;

use common::*;
use cpusets::apply::{self, ApplyOptions, ThreadControl};
use cpusets::verify::{self, Status, VerifyOptions};

const FIXTURE: &str = "qemu-rt-6.12";

fn opts(dry_run: bool) -> ApplyOptions {
    ApplyOptions {
        dry_run,
        threads: ThreadControl::FakeTree,
        nvpmodel: None,
    }
}

fn vopts(root: &Path) -> VerifyOptions {
    VerifyOptions {
        interrupts_after: Some(root.join("_second/proc/interrupts")),
        ..VerifyOptions::default()
    }
}

#[test]
fn the_booted_kernel_already_isolates_and_the_runtime_part_drifts() {
    let t = tree(FIXTURE);
    let root = t.path();
    let plan = qemu().plan(root);
    assert_eq!(
        plan.cmdline
            .iter()
            .map(|t| t.token.as_str())
            .collect::<Vec<_>>()
            .join(" "),
        "isolcpus=managed_irq,domain,2-3 nohz_full=2-3 rcu_nocbs=2-3 rcu_nocb_poll irqaffinity=0-1"
    );
    let v = verify::verify(&plan, root, &vopts(root)).unwrap();
    for id in [
        "kernel.preempt_rt",
        "cmdline.isolcpus",
        "cmdline.nohz_full",
        "cmdline.rcu_nocbs",
        "cmdline.rcu_nocb_poll",
        "cmdline.irqaffinity",
        "cmdline.effect.isolated",
        "cmdline.effect.nohz_full",
        "irq.default_affinity",
        "irq.4",
        "irq.24",
        "irq.activity",
        "workqueue.cpumask",
    ] {
        assert_eq!(
            v.check(id).unwrap().status,
            Status::Ok,
            "{id}: {}",
            v.render(true)
        );
    }
    // Threaded handlers run at the kernel's fifo 50 on their IRQ's CPU.
    let t25 = pid_of(root, "irq/25-virtio0-virtqueues");
    assert_eq!(
        v.check(&format!("thread.{t25}")).unwrap().status,
        Status::Ok
    );
    let drifted: Vec<&str> = v.drifted().map(|c| c.id.as_str()).collect();
    let kcompactd = format!("thread.{}", pid_of(root, "kcompactd0"));
    let kswapd = format!("thread.{}", pid_of(root, "kswapd0"));
    assert_eq!(
        drifted,
        vec![
            kcompactd.as_str(),
            kswapd.as_str(),
            "tasks.isolated",
            "sysctl.kernel.sched_rt_runtime_us",
            "sysctl.kernel.timer_migration",
            "sysctl.vm.stat_interval",
            "cgroup.rt.cpus",
            "cgroup.housekeeping.cpus",
            "cgroup.rt.partition"
        ],
        "{}",
        v.render(false)
    );
    // kswapd0 and kcompactd0 may still run anywhere; apply moves them.
    let foreign = &v.check("tasks.isolated").unwrap().items;
    assert_eq!(foreign.len(), 2, "{foreign:?}");
    assert!(
        foreign.iter().any(|i| i.contains("kswapd0"))
            && foreign.iter().any(|i| i.contains("kcompactd0"))
    );
    // No cpufreq under TCG, and nothing asked for it.
    assert!(v.checks.iter().all(|c| !c.id.starts_with("cpufreq")));
}

#[test]
fn apply_makes_a_remote_isolated_partition_and_verify_is_in_sync() {
    let t = tree(FIXTURE);
    let root = t.path();
    make_cgroup_v2_dirs_like(root, &fixture(FIXTURE).join("sys/fs/cgroup/e2e-isolated"));
    let plan = qemu().plan(root);
    let report = apply::apply(&plan, root, &opts(false)).unwrap();
    assert_eq!(report.failures().count(), 0, "{}", report.render(true));
    assert_eq!(report.cgroup, "v2 /sys/fs/cgroup");
    // The layout that works on this kernel (see the fixture's README):
    // the CPUs exclusive in rtdeploy and rtdeploy/rt, rt isolated.
    assert_eq!(read(root, "/sys/fs/cgroup/rtdeploy/cpuset.cpus"), "0-3");
    assert_eq!(
        read(root, "/sys/fs/cgroup/rtdeploy/cpuset.cpus.exclusive"),
        "2-3"
    );
    assert_eq!(
        read(root, "/sys/fs/cgroup/rtdeploy/cpuset.cpus.partition"),
        "member"
    );
    assert_eq!(
        read(root, "/sys/fs/cgroup/rtdeploy/rt/cpuset.cpus.exclusive"),
        "2-3"
    );
    assert_eq!(
        read(root, "/sys/fs/cgroup/rtdeploy/rt/cpuset.cpus.partition"),
        "isolated"
    );
    assert_eq!(
        read(root, "/sys/fs/cgroup/rtdeploy/housekeeping/cpuset.cpus"),
        "0-1"
    );
    let again = apply::apply(&plan, root, &opts(false)).unwrap();
    assert_eq!(again.summary().changed, 0, "{}", again.render(true));

    let v = verify::verify(&plan, root, &vopts(root)).unwrap();
    assert!(v.in_sync(), "{}", v.render(true));
    assert_eq!(v.check("cgroup.rt.partition").unwrap().status, Status::Ok);
    let pinned = v.check("tasks.isolated.pinned").unwrap();
    assert!(
        pinned.items.iter().all(|i| i.contains("kworker/R-")),
        "{pinned:?}"
    );
}

#[test]
fn verify_reports_the_partition_the_kernel_refused_with_its_reason() {
    let t = tree(FIXTURE);
    let root = t.path();
    make_cgroup_v2_dirs_like(root, &fixture(FIXTURE).join("sys/fs/cgroup/e2e-isolated"));
    let plan = qemu().plan(root);
    apply::apply(&plan, root, &opts(false)).unwrap();
    // What this kernel read back when rtdeploy/cpuset.cpus.exclusive was
    // not set (the fixture's _capture/cgroup-steps.txt).
    write(
        root,
        "/sys/fs/cgroup/rtdeploy/rt/cpuset.cpus.partition",
        "isolated invalid (Invalid cpu list in cpuset.cpus.exclusive)\n",
    );
    let v = verify::verify(&plan, root, &vopts(root)).unwrap();
    let c = v.check("cgroup.rt.partition").unwrap();
    assert_eq!(c.status, Status::Drift);
    assert!(
        c.detail
            .starts_with("partition invalid: Invalid cpu list in cpuset.cpus.exclusive"),
        "{}",
        c.detail
    );
    assert!(c.hint.as_deref().unwrap().contains("cpuset.cpus.exclusive"));
    assert!(v.render(false).contains("cgroup.rt.partition"));
}

/// The fixture's boot log as /dev/kmsg records (`prio,seq,usec,flags;text`).
fn kmsg_from_serial_log(root: &Path, extra: &[&str]) {
    let log = std::fs::read_to_string(root.join("_capture/serial.log")).unwrap();
    let mut records = String::new();
    for (seq, line) in log
        .lines()
        .filter_map(|l| l.split_once("] ").map(|(_, m)| m))
        .chain(extra.iter().copied())
        .enumerate()
    {
        records.push_str(&format!("6,{seq},0,-;{line}\n"));
    }
    std::fs::create_dir_all(root.join("dev")).unwrap();
    std::fs::write(root.join("dev/kmsg"), records).unwrap();
}

#[test]
fn verify_reads_the_kernel_log_for_isolation_warnings() {
    let t = tree(FIXTURE);
    let root = t.path();
    let plan = qemu().plan(root);
    let v = verify::verify(&plan, root, &vopts(root)).unwrap();
    assert_eq!(
        v.check("cmdline.kernel_log").unwrap().status,
        Status::Unsupported,
        "no dev/kmsg in the tree"
    );

    kmsg_from_serial_log(root, &[]);
    let v = verify::verify(&plan, root, &vopts(root)).unwrap();
    let c = v.check("cmdline.kernel_log").unwrap();
    assert_eq!(c.status, Status::Ok, "{c:?}");
    assert!(
        c.detail.ends_with("NO_HZ: Full dynticks CPUs: 2-3."),
        "{}",
        c.detail
    );

    kmsg_from_serial_log(
        root,
        &["Housekeeping: nohz_full= or isolcpus= incorrect CPU range"],
    );
    let v = verify::verify(&plan, root, &vopts(root)).unwrap();
    let c = v.check("cmdline.kernel_log").unwrap();
    assert_eq!(c.status, Status::Drift);
    assert_eq!(
        c.items,
        vec!["Housekeeping: nohz_full= or isolcpus= incorrect CPU range".to_string()]
    );
}
