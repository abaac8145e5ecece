//! The check engine's parts that need no worker processes: host facts from
//! a captured-style tree, timer-latency threads on the real kernel, budgets
//! and verdict, cyclictest's histogram file, the SVG picture. (The whole
//! run, with its worker processes, is tested through the `deploy` binary in
//! deploy/tests/check.rs.)

use std::path::Path;
use std::time::Duration;

use check::config::CheckSection;
use check::hist::{Histogram, LINEAR_US};
use check::host::read_host_facts;
use check::output::{cyclictest_histogram, svg_plot};
use check::report::{seq_ranges, CheckReport, DeliveryAccount, Realtime, ScenarioFacts};
use check::timer::measure;
use check::{evaluate_budgets, CheckInputs, Measurement, MeasurementKind, Mechanism, NamedBudget};
use units::duration::Dur;

fn write(root: &Path, rel: &str, content: &[u8]) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, content).unwrap();
}

#[test]
fn host_facts_come_from_the_sysroot() {
    let t = tempfile::tempdir().unwrap();
    let r = t.path();
    write(r, "proc/sys/kernel/osrelease", b"6.1.0-31-rt-arm64\n");
    write(
        r,
        "proc/sys/kernel/version",
        b"#1 SMP PREEMPT_RT Debian 6.1.128-1 (2025-02-07)\n",
    );
    write(r, "sys/kernel/realtime", b"1\n");
    write(
        r,
        "proc/cpuinfo",
        b"processor\t: 0\nBogoMIPS\t: 62.50\nCPU part\t: 0xd42\n\nprocessor\t: 1\n",
    );
    write(
        r,
        "proc/device-tree/model",
        b"NVIDIA Jetson Orin Nano Developer Kit\0",
    );
    write(r, "sys/devices/system/cpu/online", b"0-5\n");
    write(r, "sys/devices/system/cpu/isolated", b"4-5\n");
    for (cpu, gov) in [(0, "schedutil"), (4, "performance"), (10, "performance")] {
        write(
            r,
            &format!("sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor"),
            format!("{gov}\n").as_bytes(),
        );
    }
    write(r, "dev/cpu_dma_latency", &0i32.to_ne_bytes());
    let h = read_host_facts(r);
    assert_eq!(h.kernel_release, "6.1.0-31-rt-arm64");
    assert!(h.preempt_rt);
    assert_eq!(h.preempt_model, "PREEMPT_RT");
    assert_eq!(
        h.cpu_model.as_deref(),
        Some("NVIDIA Jetson Orin Nano Developer Kit")
    );
    assert_eq!(h.isolated_cpus, "4-5");
    assert_eq!(h.cpus_online, "0-5");
    let g: Vec<(u32, &str)> = h
        .governors
        .iter()
        .map(|g| (g.cpu, g.governor.as_str()))
        .collect();
    assert_eq!(
        g,
        [(0, "schedutil"), (4, "performance"), (10, "performance")]
    );
    assert_eq!(h.cpu_dma_latency_us, Some(0));

    // A non-RT kernel with nothing optional present.
    let t2 = tempfile::tempdir().unwrap();
    write(
        t2.path(),
        "proc/sys/kernel/version",
        b"#1 SMP PREEMPT_DYNAMIC Debian\n",
    );
    let h = read_host_facts(t2.path());
    assert!(!h.preempt_rt);
    assert_eq!(h.preempt_model, "PREEMPT_DYNAMIC");
    assert_eq!(h.kernel_release, "unknown");
    assert!(h.governors.is_empty());
    assert_eq!(h.cpu_dma_latency_us, None);
}

#[test]
fn the_timer_loop_records_every_wake() {
    let h = Histogram::boxed();
    let end = std::time::Instant::now() + Duration::from_millis(100);
    let wakes = std::cell::Cell::new(0u64);
    let mut seen: Vec<(u64, u64, u64)> = vec![];
    measure(
        &h,
        Duration::from_micros(500).as_nanos() as u64,
        || {
            wakes.set(wakes.get() + 1);
            std::time::Instant::now() >= end
        },
        |n, deadline, now| seen.push((n, deadline, now)),
    );
    let s = h.summary();
    // One record per wake: the stop test runs once before the first sleep
    // and once after each wake.
    assert_eq!(s.count, wakes.get() - 1);
    assert!(s.count > 0);
    // Each wake is seen once, numbered in order, after its deadline, on
    // deadlines a whole number of periods apart; the largest lateness
    // seen is the histogram's maximum.
    assert_eq!(seen.len() as u64, s.count);
    for (i, w) in seen.iter().enumerate() {
        assert_eq!(w.0, i as u64);
        assert!(w.2 >= w.1, "{w:?}");
    }
    for p in seen.windows(2) {
        assert_eq!((p[1].1 - p[0].1) % 500_000, 0, "{p:?}");
        assert!(p[1].1 > p[0].1);
    }
    assert_eq!(seen.iter().map(|w| w.2 - w.1).max(), Some(s.max_ns));
    assert!(s.min_ns <= s.quantile(0.5) && s.quantile(0.5) <= s.max_ns);
    assert_eq!(s.log.iter().sum::<u64>(), s.count);
    assert_eq!(s.linear.iter().sum::<u64>() + s.linear_overflow, s.count);
}

fn measurement(
    name: &str,
    kind: MeasurementKind,
    mech: Option<Mechanism>,
    samples_ns: &[u64],
) -> Measurement {
    let h = Histogram::boxed();
    for &v in samples_ns {
        h.record(v);
    }
    Measurement::new(name, kind, mech, Some(1), h.summary())
}

fn inputs() -> CheckInputs {
    let mut c = CheckSection::default();
    c.budgets.delivery_max = Some(Dur::from_micros(100));
    c.budgets.timer_p99 = Some(Dur::from_micros(50));
    c.budgets.send_max = Some(Dur::from_micros(20));
    let mut i = CheckInputs::new("unit", c, vec![1], vec![0]);
    i.channel_budgets.push(NamedBudget {
        name: "channels./demo/ping.budget".into(),
        limit: Dur::from_millis(1),
    });
    i
}

fn report_of(
    inputs: &CheckInputs,
    mechanisms: Vec<Mechanism>,
    measurements: Vec<Measurement>,
) -> CheckReport {
    let budgets = evaluate_budgets(inputs, &mechanisms, &measurements);
    let mut r = CheckReport {
        schema_version: check::CHECK_SCHEMA_VERSION,
        started_unix: 0,
        host: read_host_facts(Path::new("/nonexistent")),
        realtime: Realtime {
            sched_fifo: true,
            memory_locked: true,
            cpu_dma_latency_held_us: Some(0),
            warning: None,
        },
        scenario: ScenarioFacts {
            robot: "unit".into(),
            mode: "check".into(),
            duration_ns: 0,
            timer_duration_ns: 0,
            scenario_duration_ns: 0,
            period_ns: 500_000,
            priority: 80,
            isolated: vec![1],
            housekeeping: vec![0],
            sender_cpu: Some(1),
            receiver_cpu: Some(1),
            low_priority_processes: 0,
            low_priority_period_ns: 200_000,
            churn_ns: 0,
            low_priority_started: 0,
            burst_threads: 0,
            burst_priority: 40,
            burst_min_ns: 0,
            burst_max_ns: 0,
            cpu_load: 0,
            io_load: 0,
            mechanisms,
        },
        measurements,
        budgets,
        accounting: vec![],
        verdict: String::new(),
        failed: vec![],
        notes: vec![],
        trace: None,
        ratios: vec![],
        differences: vec![],
        census: None,
    };
    r.decide();
    r
}

fn account(mech: Mechanism, unaccounted: u64, informational: bool) -> DeliveryAccount {
    DeliveryAccount {
        mechanism: mech,
        sent: 1000,
        delivered: 1000 - unaccounted,
        lost: 0,
        receiver_reached_end: unaccounted == 0,
        unaccounted,
        missing: seq_ranges(&(1000 - unaccounted..1000).collect::<Vec<_>>(), 12),
        beyond_range: 0,
        informational,
        run: None,
        found_without_wake: 0,
    }
}

#[test]
fn messages_neither_delivered_nor_lost_fail_the_run_and_are_named() {
    let i = inputs();
    let io = Some(Mechanism::IoUringFutex);
    // Every budget met...
    let ms = vec![
        measurement("timer cpu1", MeasurementKind::Timer, None, &[10_000; 100]),
        measurement("send", MeasurementKind::Send, io, &[5_000, 6_000]),
        measurement("delivery", MeasurementKind::Delivery, io, &[20_000, 30_000]),
    ];
    let mut r = report_of(&i, vec![Mechanism::IoUringFutex], ms);
    assert!(r.passed(), "{:?}", r.failed);
    // ...but 770 of 1000 messages never arrived.
    r.accounting = vec![account(Mechanism::IoUringFutex, 770, false)];
    r.decide();
    assert!(!r.passed());
    assert_eq!(r.verdict, "fail");
    assert_eq!(r.failed, vec!["delivery accounting (io_uring)".to_string()]);
    let text = r.to_text();
    assert!(
        text.contains("1000 sent, 230 delivered, 0 lost: 770 never delivered nor counted lost")
            && text.contains("seq 230-999"),
        "{text}"
    );
    // A compared mechanism's shortfall is reported, not deciding.
    r.accounting = vec![
        account(Mechanism::IoUringFutex, 0, false),
        account(Mechanism::Futex, 3, true),
    ];
    r.decide();
    assert!(r.passed(), "{:?}", r.failed);
    assert!(r.to_text().contains("FAIL (comparison only)"));
}

#[test]
fn seq_ranges_name_runs_and_cut_the_list() {
    assert_eq!(seq_ranges(&[1, 2, 3, 7, 9, 10], 12), "1-3, 7, 9-10");
    assert_eq!(seq_ranges(&[1, 3, 5, 7], 2), "1, 3, ... 2 more runs");
    assert_eq!(seq_ranges(&[], 2), "");
}

#[test]
fn budgets_decide_the_verdict_and_name_the_failure() {
    let i = inputs();
    let io = Some(Mechanism::IoUringFutex);
    let ms = vec![
        measurement("timer cpu1", MeasurementKind::Timer, None, &[10_000; 100]),
        measurement("send", MeasurementKind::Send, io, &[5_000, 6_000]),
        measurement(
            "delivery",
            MeasurementKind::Delivery,
            io,
            &[20_000, 30_000, 250_000],
        ),
    ];
    let r = report_of(&i, vec![Mechanism::IoUringFutex], ms);
    let by_name = |n: &str| {
        r.budgets
            .iter()
            .find(|b| b.name.starts_with(n))
            .unwrap_or_else(|| panic!("no {n}"))
    };
    assert!(by_name("check.budgets.timer_p99").pass);
    assert!(by_name("check.budgets.send_max").pass);
    let d = by_name("check.budgets.delivery_max");
    assert!(!d.pass);
    assert_eq!(d.figure_ns, Some(250_000));
    assert!(by_name("channels./demo/ping.budget").pass);
    assert!(!r.passed());
    assert_eq!(r.failed, ["check.budgets.delivery_max"]);
    let text = r.to_text();
    assert!(text.contains("FAIL: check.budgets.delivery_max"), "{text}");
}

#[test]
fn compared_mechanisms_do_not_decide_and_unmeasured_budgets_fail() {
    let i = inputs();
    let ms = vec![
        measurement(
            "delivery",
            MeasurementKind::Delivery,
            Some(Mechanism::IoUringFutex),
            &[20_000],
        ),
        measurement(
            "delivery",
            MeasurementKind::Delivery,
            Some(Mechanism::Futex),
            &[3_000_000],
        ),
        measurement(
            "delivery",
            MeasurementKind::Delivery,
            Some(Mechanism::FutexWaitv),
            &[],
        ),
    ];
    let r = report_of(
        &i,
        vec![
            Mechanism::IoUringFutex,
            Mechanism::Futex,
            Mechanism::FutexWaitv,
        ],
        ms,
    );
    let futex: Vec<_> = r
        .budgets
        .iter()
        .filter(|b| b.mechanism == Some(Mechanism::Futex))
        .collect();
    assert!(futex.iter().all(|b| b.informational && !b.pass));
    let waitv = r
        .budgets
        .iter()
        .find(|b| {
            b.mechanism == Some(Mechanism::FutexWaitv) && b.name == "check.budgets.delivery_max"
        })
        .unwrap();
    assert_eq!(waitv.figure_ns, None);
    assert!(!waitv.pass);
    assert!(
        r.passed(),
        "only the first mechanism decides: {:?}",
        r.failed
    );
    let text = r.to_text();
    for label in ["io_uring futex (armed)", "futex_waitv", "futex"] {
        assert!(
            text.lines().any(|l| l.starts_with(label)),
            "no row for {label}:\n{text}"
        );
    }
}

#[test]
fn cyclictest_histogram_file_has_its_layout() {
    let a = measurement(
        "timer cpu1",
        MeasurementKind::Timer,
        None,
        &[1_500, 1_900, 3_200, 20_000_000],
    );
    let b = measurement(
        "delivery",
        MeasurementKind::Delivery,
        Some(Mechanism::Futex),
        &[2_000],
    );
    let text = cyclictest_histogram(&[&a, &b]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "# Histogram");
    assert_eq!(lines[1], "000000 000000\t000000");
    assert_eq!(lines[2], "000001 000002\t000000");
    assert_eq!(lines[3], "000002 000000\t000001");
    assert_eq!(lines[4], "000003 000001\t000000");
    assert_eq!(lines.iter().filter(|l| !l.starts_with('#')).count(), 100);
    let tail: Vec<&str> = lines[101..].to_vec();
    assert_eq!(
        tail,
        [
            "# Total: 000000003 000000001",
            "# Min Latencies: 00001 00002",
            "# Avg Latencies: 05001 00002",
            "# Max Latencies: 20000 00002",
            "# Histogram Overflows: 00001 00000",
            "# Columns: timer cpu1, delivery (futex)",
        ]
    );
    // Past 100 lines the file grows to the last non-empty microsecond.
    let c = measurement(
        "x",
        MeasurementKind::Timer,
        None,
        &[(LINEAR_US as u64 - 1) * 1000],
    );
    let text = cyclictest_histogram(&[&c]);
    assert_eq!(
        text.lines().filter(|l| !l.starts_with('#')).count(),
        LINEAR_US
    );
}

#[test]
fn svg_has_one_series_per_measurement_and_a_line_per_budget() {
    let i = inputs();
    let io = Some(Mechanism::IoUringFutex);
    let ms = vec![
        measurement(
            "timer cpu1",
            MeasurementKind::Timer,
            None,
            &[10_000, 12_000, 400_000],
        ),
        measurement("delivery", MeasurementKind::Delivery, io, &[20_000, 30_000]),
        measurement("send", MeasurementKind::Send, io, &[]),
    ];
    let r = report_of(&i, vec![Mechanism::IoUringFutex], ms);
    let svg = svg_plot(&r);
    assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert!(svg.trim_end().ends_with("</svg>"));
    // The empty send measurement draws no series.
    assert_eq!(svg.matches(r#"<path class="series""#).count(), 2);
    let dashed = svg.matches(r#"<line class="budget""#).count();
    let mut limits: Vec<u64> = r
        .budgets
        .iter()
        .filter(|b| !b.informational)
        .map(|b| b.limit_ns)
        .collect();
    limits.sort();
    limits.dedup();
    assert_eq!(dashed, limits.len());
    assert!(svg.contains("check.budgets.delivery_max 100us PASS"));
    assert!(svg.contains("channels./demo/ping.budget"));
    // Every opened element is closed or self-closed (well-formed enough
    // for a browser): count tags.
    assert_eq!(svg.matches("<text").count(), svg.matches("</text>").count());
}
