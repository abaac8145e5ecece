//! Plan, apply and verify on the Jetson Orin Nano tree (R36's PREEMPT_RT
//! 5.15 booted with the planned command line, before apply; assembled by
//! cpusets/fixtures/make-orin-nano.py, which cites where each name comes
//! from).

mod common;

use std::fs;
use std::path::Path;
use std::process::Command;

use common::*;
use cpusets::apply::{self, ApplyOptions, Outcome, ThreadControl};
use cpusets::config::Policy;
use cpusets::plan::ThreadKind;
use cpusets::verify::{self, Status, VerifyOptions};

fn apply_opts(dry_run: bool) -> ApplyOptions {
    ApplyOptions {
        dry_run,
        threads: ThreadControl::FakeTree,
        nvpmodel: None,
    }
}

fn verify_opts(root: &Path) -> VerifyOptions {
    VerifyOptions {
        interrupts_after: Some(root.join("proc/interrupts.after")),
        allow_tasks: vec!["imu_reader".into(), "motor_controlle".into()],
        ..VerifyOptions::default()
    }
}

#[test]
fn plan_places_interrupts_and_threads() {
    let t = tree("orin-nano-5.15");
    let plan = orin().plan(t.path());
    let irq = |n: u32| plan.irqs.iter().find(|p| p.irq == n).unwrap();
    assert_eq!(irq(67).cpus.to_string(), "0-3");
    assert_eq!(
        irq(301).cpus.to_string(),
        "2-3",
        "the enP8p1s0 interface override"
    );
    assert_eq!(irq(301).reason, "irqs.overrides[0]");
    assert_eq!(irq(154).cpus.to_string(), "0-3");
    let thread = |comm: &str| {
        plan.threads
            .iter()
            .find(|t| t.comm == comm)
            .unwrap_or_else(|| panic!("{comm} not planned"))
    };
    // The comm is cut at 15 characters; the rule matches the full name.
    let spi = thread("irq/68-3210000.");
    assert_eq!(
        (
            spi.policy,
            spi.priority,
            spi.cpus.as_ref().unwrap().to_string()
        ),
        (Some(Policy::Fifo), Some(88), "4".into())
    );
    // PREEMPT_RT gives a handler with a thread function a second thread,
    // irq/N-s-<name>; the rule matches it by the interrupt's full name too.
    let spi2 = thread("irq/68-s-321000");
    assert_eq!(
        (spi2.priority, spi2.cpus.as_ref().unwrap().to_string()),
        (Some(88), "4".into())
    );
    assert_eq!(thread("irq/239-can0").priority, Some(92));
    let eth = thread("irq/301-enP8p1s");
    assert_eq!(
        (eth.priority, eth.cpus.as_ref().unwrap().to_string()),
        (Some(50), "2-3".into()),
        "{}",
        eth.reason
    );
    let mmc = thread("irq/67-mmc0");
    assert_eq!(
        (mmc.policy, mmc.cpus.as_ref().unwrap().to_string()),
        (None, "0-3".into())
    );
    assert_eq!(thread("rcuc/4").kind, ThreadKind::Kthread);
    assert_eq!(thread("rcuc/4").priority, Some(1));
    assert_eq!(thread("kswapd0").cpus.as_ref().unwrap().to_string(), "0-3");
    assert!(plan
        .threads
        .iter()
        .all(|t| t.comm != "ksoftirqd/4" && t.comm != "kworker/u12:0"));
    let sysctl = |k: &str| {
        plan.sysctls
            .iter()
            .find(|s| s.key == k)
            .unwrap()
            .value
            .clone()
    };
    assert_eq!(sysctl("kernel.sched_rt_runtime_us"), "-1");
    assert_eq!(sysctl("kernel.timer_migration"), "0");
    assert_eq!(sysctl("vm.stat_interval"), "10");
    assert_eq!(plan.workqueue_cpumask.to_string(), "0-3");
    assert_eq!(plan.cpufreq.lock_cpus.to_string(), "4-5");
    assert_eq!(plan.cpu_dma_latency_us, Some(0));
    assert!(plan.warnings.is_empty(), "{:?}", plan.warnings);
    let text = plan.to_string();
    assert!(text.contains("isolcpus=managed_irq,domain,4-5"), "{text}");
}

#[test]
fn dry_run_writes_nothing_and_shows_each_write() {
    let t = tree("orin-nano-5.15");
    let plan = orin().plan(t.path());
    let before = snapshot(t.path());
    let report = apply::apply(&plan, t.path(), &apply_opts(true)).unwrap();
    assert_eq!(snapshot(t.path()), before, "dry run changed the tree");
    let text = report.render(false);
    assert!(
        text.contains("would write /proc/irq/67/smp_affinity_list  0-5 -> 0-3"),
        "{text}"
    );
    assert!(
        text.contains("would write /proc/sys/kernel/sched_rt_runtime_us  950000 -> -1"),
        "{text}"
    );
    assert!(
        text.contains("would write /sys/fs/cgroup/rtdeploy  (absent) -> directory"),
        "{text}"
    );
    assert_eq!(report.summary().changed, 0);
    assert!(report.summary().would_change > 20);
}

fn snapshot(root: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    fn walk(d: &Path, out: &mut Vec<(String, String)>) {
        for e in fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else {
                out.push((p.display().to_string(), fs::read_to_string(&p).unwrap()));
            }
        }
    }
    walk(root, &mut out);
    out.sort();
    out
}

#[test]
fn apply_writes_the_plan_and_twice_changes_nothing() {
    let t = tree("orin-nano-5.15");
    let root = t.path();
    make_cgroup_v2_dirs(root, "/sys/fs/cgroup", false);
    let plan = orin().plan(root);
    let report = apply::apply(&plan, root, &apply_opts(false)).unwrap();
    assert_eq!(report.failures().count(), 0, "{}", report.render(true));
    assert_eq!(read(root, "/proc/irq/67/smp_affinity_list"), "0-3");
    assert_eq!(read(root, "/proc/irq/301/smp_affinity_list"), "2-3");
    assert_eq!(read(root, "/proc/irq/default_smp_affinity"), "f");
    assert_eq!(read(root, "/proc/sys/kernel/sched_rt_runtime_us"), "-1");
    assert_eq!(read(root, "/proc/sys/kernel/timer_migration"), "0");
    assert_eq!(read(root, "/proc/sys/vm/stat_interval"), "10");
    assert_eq!(read(root, "/sys/devices/virtual/workqueue/cpumask"), "f");
    assert_eq!(
        read(root, "/sys/fs/cgroup/cgroup.subtree_control"),
        "+cpuset"
    );
    assert_eq!(read(root, "/sys/fs/cgroup/rtdeploy/cpuset.cpus"), "0-5");
    assert_eq!(read(root, "/sys/fs/cgroup/rtdeploy/rt/cpuset.cpus"), "4-5");
    assert_eq!(
        read(root, "/sys/fs/cgroup/rtdeploy/housekeeping/cpuset.cpus"),
        "0-3"
    );
    // 5.15 has no cpuset.cpus.exclusive: no nested partition, said so.
    assert_eq!(
        read(root, "/sys/fs/cgroup/rtdeploy/rt/cpuset.cpus.partition"),
        "member"
    );
    let part = report
        .actions
        .iter()
        .find(|a| a.item == "cgroup rtdeploy/rt partition")
        .unwrap();
    assert!(
        matches!(&part.outcome, Outcome::Unsupported { reason } if reason.contains("6.7")),
        "{part:?}"
    );
    assert_eq!(
        read(
            root,
            "/sys/devices/system/cpu/cpu4/cpufreq/scaling_governor"
        ),
        "performance"
    );
    assert_eq!(
        read(
            root,
            "/sys/devices/system/cpu/cpu4/cpufreq/scaling_min_freq"
        ),
        "1510400"
    );
    assert_eq!(
        read(
            root,
            "/sys/devices/system/cpu/cpu1/cpufreq/scaling_min_freq"
        ),
        "115200"
    );
    // Threads: the fake tree shows what the kernel would.
    let spi = pid_of(root, "irq/68-3210000.");
    let stat = read(root, &format!("/proc/{spi}/stat"));
    assert!(stat.ends_with(" 0 88 1 0 0 0 0 0 0 0 0 0 0 0"), "{stat}");
    assert!(read(root, &format!("/proc/{spi}/status")).contains("Cpus_allowed_list:\t4"));
    let kswapd = pid_of(root, "kswapd0");
    assert!(
        read(root, &format!("/proc/{kswapd}/status")).contains("Cpus_allowed_list:\t0-3"),
        "kswapd0 moved"
    );
    // A workqueue rescuer (rcu_gp on 5.15) is pinned by the kernel:
    // unmovable, not an error.
    assert!(
        report.actions.iter().all(|a| !a.item.contains("rcu_gp")),
        "not planned: PF_NO_SETAFFINITY"
    );

    let again = apply::apply(&plan, root, &apply_opts(false)).unwrap();
    let s = again.summary();
    assert_eq!(
        (s.changed, s.would_change, s.failed),
        (0, 0, 0),
        "{}",
        again.render(true)
    );
    assert!(s.unchanged > 30);
}

/// The kernel refuses to move some interrupts (EIO, EPERM, EINVAL). An
/// immutable file makes a root write fail with EPERM the same way.
#[test]
#[ignore = "needs root: chattr +i on the fixture's files stands for interrupts the kernel will not move"]
fn unmovable_interrupt_is_recorded_not_an_error() {
    let t = tree("orin-nano-5.15");
    let root = t.path();
    make_cgroup_v2_dirs(root, "/sys/fs/cgroup", false);
    // 13 is the arch_timer PPI, 303 an MSI (nvme0q0) the PCIe controller
    // pins.
    let files: Vec<_> = [13, 303]
        .iter()
        .map(|n| root.join(format!("proc/irq/{n}/smp_affinity_list")))
        .collect();
    let chattr = |flag: &str| {
        files.iter().all(|f| {
            Command::new("chattr")
                .arg(flag)
                .arg(f)
                .status()
                .map(|s| s.success())
                .unwrap_or(false)
        })
    };
    if !chattr("+i") || fs::OpenOptions::new().write(true).open(&files[0]).is_ok() {
        chattr("-i");
        panic!(
            "cannot make {} immutable here (chattr +i: root on a filesystem with the immutable flag)",
            files[0].display()
        );
    }
    let plan = orin().plan(root);
    let report = apply::apply(&plan, root, &apply_opts(false));
    chattr("-i");
    let report = report.unwrap();
    assert_eq!(report.unmovable_irqs(), vec![13, 303]);
    assert_eq!(report.failures().count(), 0, "{}", report.render(true));
    assert!(report
        .render(false)
        .contains("unmovable   /proc/irq/303/smp_affinity_list  0-5 -> 0-3"));

    // verify lists it as unmovable when told so, as drift otherwise.
    settle_irqs(root);
    let mut opts = verify_opts(root);
    let v = verify::verify(&plan, root, &opts).unwrap();
    assert_eq!(v.check("irq.303").unwrap().status, Status::Drift);
    assert_eq!(
        v.check("irq.13").unwrap().status,
        Status::Unmovable,
        "arch_timer is a PPI"
    );
    opts.unmovable_irqs = report.unmovable_irqs();
    let v = verify::verify(&plan, root, &opts).unwrap();
    assert_eq!(v.check("irq.303").unwrap().status, Status::Unmovable);
    // The timer ticks on the isolated CPUs: listed, not drift.
    assert_eq!(v.check("irq.activity").unwrap().status, Status::Ok);
    let ticks = v.check("irq.activity.unmovable").unwrap();
    assert_eq!(
        ticks.items,
        vec![
            "irq 13 arch_timer fired 1 times on CPU 4".to_string(),
            "irq 13 arch_timer fired 1 times on CPU 5".into()
        ]
    );
    assert!(v.in_sync(), "{}", v.render(false));
}

fn applied() -> (tempfile::TempDir, cpusets::plan::RuntimePlan) {
    let t = tree("orin-nano-5.15");
    let root = t.path();
    make_cgroup_v2_dirs(root, "/sys/fs/cgroup", true);
    let plan = orin().plan(root);
    let report = apply::apply(&plan, root, &apply_opts(false)).unwrap();
    assert_eq!(report.failures().count(), 0, "{}", report.render(true));
    settle_irqs(root);
    (t, plan)
}

#[test]
fn verify_before_apply_names_the_drift() {
    let t = tree("orin-nano-5.15");
    let root = t.path();
    let plan = orin().plan(root);
    let v = verify::verify(&plan, root, &verify_opts(root)).unwrap();
    assert!(!v.in_sync());
    let drifted: Vec<&str> = v.drifted().map(|c| c.id.as_str()).collect();
    for id in [
        "irq.67",
        "irq.301",
        "sysctl.kernel.sched_rt_runtime_us",
        "workqueue.cpumask",
        "cgroup.rt.cpus",
        "cpufreq.cpu4.governor",
        "cpufreq.cpu4.locked",
    ] {
        assert!(drifted.contains(&id), "{id} not drifted: {drifted:?}");
    }
    for id in [
        "kernel.preempt_rt",
        "cmdline.isolcpus",
        "cmdline.nohz_full",
        "cmdline.effect.isolated",
        "cmdline.effect.nohz_full",
        "irq.activity",
        "irq.154",
    ] {
        assert_eq!(
            v.check(id).unwrap().status,
            Status::Ok,
            "{id}: {}",
            v.render(true)
        );
    }
}

#[test]
fn verify_after_apply_is_in_sync() {
    let (t, plan) = applied();
    let v = verify::verify(&plan, t.path(), &verify_opts(t.path())).unwrap();
    assert!(v.in_sync(), "{}", v.render(true));
    assert_eq!(v.check("cgroup.rt.partition").unwrap().status, Status::Ok);
    // The kernel-pinned rescuer rcu_gp may still run anywhere: listed, not
    // drift.
    let pinned = v.check("tasks.isolated.pinned").unwrap();
    assert!(
        pinned.items.iter().any(|i| i.contains("`rcu_gp`")),
        "{pinned:?}"
    );
}

#[test]
fn verify_names_an_irq_on_an_isolated_cpu() {
    let (t, plan) = applied();
    let root = t.path();
    write(root, "/proc/irq/301/smp_affinity_list", "4\n");
    write(root, "/proc/irq/301/effective_affinity_list", "4\n");
    // ... and it fired there during the sampling window.
    let after = fs::read_to_string(root.join("proc/interrupts.after")).unwrap();
    let after: String = after
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("301:") {
                let mut f: Vec<String> = l.split_whitespace().map(String::from).collect();
                f[5] = "25".into(); // CPU4
                format!("{}\n", f.join(" "))
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    write(root, "/proc/interrupts.after", &after);
    let v = verify::verify(&plan, root, &verify_opts(root)).unwrap();
    assert!(!v.in_sync());
    assert_eq!(v.check("irq.301").unwrap().status, Status::Drift);
    let act = v.check("irq.activity").unwrap();
    assert_eq!(act.status, Status::Drift);
    assert_eq!(
        act.items,
        vec!["irq 301 enP8p1s0-0 fired 25 times on CPU 4".to_string()]
    );
    let text = v.render(false);
    assert!(
        text.contains("irq.301")
            && text.contains("enP8p1s0-0: affinity 4 effective 4, planned 2-3"),
        "{text}"
    );
}

/// `/proc/interrupts.after` with irq 301's row as in `/proc/interrupts`
/// plus `more` on the column of CPU `cpu`.
fn irq_301_fired(root: &Path, cpu: &str, more: u64) {
    let before = read(root, "/proc/interrupts");
    let row = before
        .lines()
        .find(|l| l.trim_start().starts_with("301:"))
        .unwrap();
    let col = before
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .position(|c| c == format!("CPU{cpu}"))
        .unwrap();
    let mut f: Vec<String> = row.split_whitespace().map(String::from).collect();
    f[col + 1] = (f[col + 1].parse::<u64>().unwrap() + more).to_string();
    let after: String = read(root, "/proc/interrupts.after")
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("301:") {
                format!("{}\n", f.join(" "))
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    write(root, "/proc/interrupts.after", &after);
}

/// An interrupt whose affinity was set but that has not fired since still
/// shows its old CPU as effective: x86 moves it at its next interrupt.
/// That is a pending move, not drift; once it fired and still did not
/// move, it is drift.
#[test]
fn verify_calls_a_move_that_waits_for_its_next_interrupt_pending() {
    let (t, plan) = applied();
    let root = t.path();
    let planned = read(root, "/proc/irq/301/smp_affinity_list");
    write(root, "/proc/irq/301/effective_affinity_list", "4\n");
    irq_301_fired(root, "4", 0);
    let v = verify::verify(&plan, root, &verify_opts(root)).unwrap();
    let c = v.check("irq.301").unwrap();
    assert_eq!(c.status, Status::Pending, "{c:?}");
    assert!(c.detail.contains("move pending"), "{c:?}");
    assert!(v.in_sync(), "{}", v.render(false));
    assert_eq!(v.summary().pending, 1);
    assert!(
        v.render(false)
            .contains(", 1 pending (moved at their next interrupt)"),
        "{}",
        v.render(false)
    );

    // It fired (on the isolated CPU its effective affinity names) and it
    // is still there: the kernel did not move it.
    irq_301_fired(root, "4", 3);
    let v = verify::verify(&plan, root, &verify_opts(root)).unwrap();
    assert_eq!(v.check("irq.301").unwrap().status, Status::Drift);
    assert_eq!(
        v.check("irq.activity").unwrap().items,
        vec!["irq 301 enP8p1s0-0 fired 3 times on CPU 4".to_string()]
    );
    assert!(!v.in_sync());
    assert!(planned.trim() != "4");
}

#[test]
fn verify_names_an_irq_thread_at_the_wrong_priority() {
    let (t, plan) = applied();
    let root = t.path();
    let can = pid_of(root, "irq/239-can0");
    let stat = read(root, &format!("/proc/{can}/stat"));
    let wrong = cpusets::model::TaskStat::with_sched(&stat, 1, 10).unwrap();
    write(root, &format!("/proc/{can}/stat"), &wrong);
    let v = verify::verify(&plan, root, &verify_opts(root)).unwrap();
    let c = v.check(&format!("thread.{can}")).unwrap();
    assert_eq!(c.status, Status::Drift);
    assert_eq!(c.detail, "irq/239-can0 is fifo 10, planned fifo 92");
    assert_eq!(v.drifted().count(), 1, "{}", v.render(false));
}

#[test]
fn verify_names_a_missing_cmdline_token() {
    let (t, plan) = applied();
    let root = t.path();
    let line = read(root, "/proc/cmdline")
        .replace(" nohz_full=4-5", "")
        .replace("isolcpus=managed_irq,domain,4-5", "isolcpus=5");
    write(root, "/proc/cmdline", &line);
    let v = verify::verify(&plan, root, &verify_opts(root)).unwrap();
    let c = v.check("cmdline.nohz_full").unwrap();
    assert_eq!(
        (c.status, c.detail.as_str()),
        (Status::Drift, "`nohz_full=4-5` missing from /proc/cmdline")
    );
    let c = v.check("cmdline.isolcpus").unwrap();
    assert_eq!(
        c.detail,
        "/proc/cmdline has `isolcpus=5`, planned `isolcpus=managed_irq,domain,4-5`"
    );
    assert!(c.hint.as_deref().unwrap().contains("reboot"));
}

#[test]
fn verify_names_an_invalid_partition() {
    let (t, plan) = applied();
    let root = t.path();
    assert_eq!(
        read(root, "/sys/fs/cgroup/rtdeploy/rt/cpuset.cpus.partition"),
        "isolated"
    );
    assert_eq!(
        read(root, "/sys/fs/cgroup/rtdeploy/rt/cpuset.cpus.exclusive"),
        "4-5"
    );
    // What Linux 6.12 reads back when the partition would mix isolcpus=
    // CPUs with housekeeping ones (the QEMU fixture's cgroup-steps.txt).
    write(
        root,
        "/sys/fs/cgroup/rtdeploy/rt/cpuset.cpus.partition",
        "isolated invalid (partition config conflicts with housekeeping setup)\n",
    );
    let v = verify::verify(&plan, root, &verify_opts(root)).unwrap();
    let c = v.check("cgroup.rt.partition").unwrap();
    assert_eq!(c.status, Status::Drift);
    assert!(
        c.detail
            .starts_with("partition invalid: partition config conflicts with housekeeping setup"),
        "{}",
        c.detail
    );
}

#[test]
fn verify_names_a_foreign_task() {
    let (t, plan) = applied();
    let root = t.path();
    let logger = pid_of(root, "logger");
    let status = read(root, &format!("/proc/{logger}/status"))
        .replace("Cpus_allowed_list:\t0-3", "Cpus_allowed_list:\t0-5");
    write(root, &format!("/proc/{logger}/status"), &status);
    let v = verify::verify(&plan, root, &verify_opts(root)).unwrap();
    let c = v.check("tasks.isolated").unwrap();
    assert_eq!(c.status, Status::Drift);
    assert_eq!(c.items, vec![format!("{logger} `logger` may run on 0-5")]);
    // A task the supervisor put in rtdeploy/rt (or a child of one) is not
    // foreign.
    write(
        root,
        "/sys/fs/cgroup/rtdeploy/rt/cgroup.procs",
        &format!("{logger}\n"),
    );
    let v = verify::verify(&plan, root, &verify_opts(root)).unwrap();
    assert_eq!(v.check("tasks.isolated").unwrap().status, Status::Ok);
    write(root, "/sys/fs/cgroup/rtdeploy/rt/cgroup.procs", "");
    // The robot's own processes are allowed there.
    let mut opts = verify_opts(root);
    opts.allow_tasks.clear();
    let v = verify::verify(&plan, root, &opts).unwrap();
    assert_eq!(v.check("tasks.isolated").unwrap().items.len(), 3);
}

#[test]
fn json_report_has_every_check() {
    let (t, plan) = applied();
    let v = verify::verify(&plan, t.path(), &verify_opts(t.path())).unwrap();
    let doc = serde_json::to_value(&v).unwrap();
    assert_eq!(doc["in_sync"], true);
    assert_eq!(doc["checks"].as_array().unwrap().len(), v.checks.len());
    assert_eq!(doc["summary"]["drift"], 0);
    let report = apply::apply(&plan, t.path(), &apply_opts(true)).unwrap();
    let doc = serde_json::to_value(&report).unwrap();
    assert!(
        doc["actions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["outcome"] == "unchanged" || a["outcome"] == "unsupported"),
        "{doc:#}"
    );
}

#[test]
fn verify_reports_what_the_jetpack_kernel_offers_and_whether_robot_yaml_names_it() {
    use cpusets::config::KernelSection;
    let t = tree("orin-nano-5.15");
    let root = t.path();
    let plan = orin().plan(root);
    let with = |decl: KernelSection| VerifyOptions {
        declared_kernel: decl.declared(),
        kernel_offers: Some(|release, live| {
            controller::kernel::KernelFacts::of(release, live).summary()
        }),
        ..verify_opts(root)
    };
    let v = verify::verify(&plan, root, &with(KernelSection::default())).unwrap();
    let caps = v.check("kernel.capabilities").unwrap();
    assert_eq!(caps.status, Status::Ok);
    assert!(
        caps.detail.starts_with(
            "5.15.148-rt-tegra: wake backend doorbell (io_uring futex wait: no; futex_waitv: no); cgroup partitions: isolated no, nested no; by version"
        ),
        "{}",
        caps.detail
    );
    assert!(v.check("kernel.declared").is_none());

    // JetPack 6 is 5.15: as declared.
    let jp6 = KernelSection {
        l4t: Some("R36.4.3".into()),
        ..KernelSection::default()
    };
    let v = verify::verify(&plan, root, &with(jp6)).unwrap();
    let d = v.check("kernel.declared").unwrap();
    assert_eq!(d.status, Status::Ok, "{}", d.detail);
    assert!(
        d.detail.contains("(kernel.l4t R36.4.3, JetPack 6)"),
        "{}",
        d.detail
    );

    // JetPack 5 is 5.10: the board runs something else.
    let jp5 = KernelSection {
        l4t: Some("35.6.0".into()),
        ..KernelSection::default()
    };
    let v = verify::verify(&plan, root, &with(jp5)).unwrap();
    let d = v.check("kernel.declared").unwrap();
    assert_eq!(d.status, Status::Drift);
    assert_eq!(
        d.detail,
        "runs `5.15.148-rt-tegra`, robot.yaml says 5.10 (kernel.l4t R35.6.0, JetPack 5)"
    );
    assert!(d.hint.as_deref().unwrap().contains("kernel.l4t"));
}
