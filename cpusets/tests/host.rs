//! Plan, apply and verify on the tree captured from the development machine
//! (kernel 6.18 PREEMPT_DYNAMIC, 2 CPUs, cgroup v1 cpusets, no isolation on
//! the command line) with the dev plan: CPU 0 housekeeping, CPU 1 isolated.

mod common;

use common::*;
use cpusets::apply::{self, ApplyOptions, Outcome, ThreadControl};
use cpusets::verify::{self, Status, VerifyOptions};

fn opts(dry_run: bool) -> ApplyOptions {
    ApplyOptions {
        dry_run,
        threads: ThreadControl::FakeTree,
        nvpmodel: None,
    }
}

#[test]
fn dev_plan_on_the_captured_host() {
    let t = tree("host-6.18");
    let root = t.path();
    let plan = dev().plan(root);
    assert_eq!(plan.cpus.housekeeping.to_string(), "0");
    assert!(plan.irqs.iter().all(|p| p.cpus.to_string() == "0"));
    let ged = plan
        .threads
        .iter()
        .find(|t| t.comm == "irq/25-ACPI:Ged")
        .unwrap();
    assert_eq!(
        (ged.priority, ged.cpus.as_ref().unwrap().to_string()),
        (Some(50), "0".into())
    );

    // v1 cpusets: mkdir makes the kernel's files appear; here a stand-in.
    let dry = apply::apply(&plan, root, &opts(true)).unwrap();
    assert!(dry
        .render(false)
        .contains("would write /sys/fs/cgroup/cpuset/rtdeploy  (absent) -> directory"));
    make_cgroup_v1_dirs(root, "/sys/fs/cgroup/cpuset");
    let report = apply::apply(&plan, root, &opts(false)).unwrap();
    assert_eq!(report.cgroup, "v1 /sys/fs/cgroup/cpuset");
    assert_eq!(report.failures().count(), 0, "{}", report.render(true));
    assert_eq!(
        read(root, "/sys/fs/cgroup/cpuset/rtdeploy/rt/cpuset.cpus"),
        "1"
    );
    assert_eq!(
        read(root, "/sys/fs/cgroup/cpuset/rtdeploy/rt/cpuset.mems"),
        "0"
    );
    assert_eq!(
        read(
            root,
            "/sys/fs/cgroup/cpuset/rtdeploy/rt/cpuset.cpu_exclusive"
        ),
        "1"
    );
    assert_eq!(
        read(
            root,
            "/sys/fs/cgroup/cpuset/rtdeploy/rt/cpuset.sched_load_balance"
        ),
        "0"
    );
    assert_eq!(
        read(root, "/sys/fs/cgroup/cpuset/rtdeploy/cpuset.cpu_exclusive"),
        "1"
    );
    assert_eq!(
        read(
            root,
            "/sys/fs/cgroup/cpuset/rtdeploy/housekeeping/cpuset.cpus"
        ),
        "0"
    );
    assert_eq!(read(root, "/proc/irq/26/smp_affinity_list"), "0");
    // No cpufreq on this virtual machine, and nothing asked for it.
    assert!(report.actions.iter().all(|a| !a.item.contains("cpufreq")));
    let again = apply::apply(&plan, root, &opts(false)).unwrap();
    assert_eq!(again.summary().changed, 0, "{}", again.render(true));
    assert!(
        again
            .actions
            .iter()
            .all(|a| matches!(a.outcome, Outcome::Unchanged)),
        "{}",
        again.render(true)
    );

    settle_irqs(root);
    let v = verify::verify(
        &plan,
        root,
        &VerifyOptions {
            interrupts_after: Some(root.join("proc/interrupts.after")),
            ..VerifyOptions::default()
        },
    )
    .unwrap();
    // This kernel is not PREEMPT_RT and its command line isolates nothing:
    // verify says so, by name, and everything apply wrote is in place.
    assert!(!v.in_sync());
    for id in [
        "kernel.preempt_rt",
        "cmdline.isolcpus",
        "cmdline.nohz_full",
        "cmdline.effect.isolated",
        "tasks.isolated",
    ] {
        assert_eq!(v.check(id).unwrap().status, Status::Drift, "{id}");
    }
    assert_eq!(
        v.check("cmdline.effect.nohz_full").unwrap().status,
        Status::Unsupported
    );
    for id in [
        "cgroup.rt.cpus",
        "cgroup.housekeeping.cpus",
        "cgroup.rt.exclusive",
        "workqueue.cpumask",
        "irq.default_affinity",
        "irq.26",
        "sysctl.kernel.sched_rt_runtime_us",
    ] {
        assert_eq!(
            v.check(id).unwrap().status,
            Status::Ok,
            "{id}: {}",
            v.render(true)
        );
    }
    let foreign = v.check("tasks.isolated").unwrap();
    assert_eq!(
        foreign.items.len(),
        1,
        "only the capture script itself: {:?}",
        foreign.items
    );
    assert!(foreign.items[0].contains("capture.sh"));
}

#[test]
fn apply_opens_without_create_so_a_missing_file_fails() {
    let t = tree("host-6.18");
    let root = t.path();
    let plan = dev().plan(root);
    // A cgroup directory made by mkdir in a plain directory has no files:
    // the writes fail instead of creating them.
    let report = apply::apply(&plan, root, &opts(false)).unwrap();
    let f = report.failures().next().expect("a failure");
    assert!(
        matches!(&f.outcome, Outcome::Failed { error } if error.ends_with("rtdeploy/cpuset.cpus does not exist")),
        "{f:?}"
    );
    assert!(!root
        .join("sys/fs/cgroup/cpuset/rtdeploy/cpuset.cpus")
        .exists());
}
