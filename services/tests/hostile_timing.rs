//! A process of the robot group scribbles on its own timing channel: the
//! supervisor (PID 1 on a robot) must go on answering, reaping and
//! restarting, and say once what is wrong with that channel.

mod common;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;

use common::{config, process, start};
use controller::channel::{Channel, ChannelGeometry};
use controller::timing_report::{timing_channel_name, timing_geometry, RawReport};
use serde_json::json;

/// Byte offset of the queue index in a channel's header page.
const NEXT_INDEX: u64 = 256;

fn scribble(path: &Path, offset: u64, v: u64) {
    let f = OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&v.to_le_bytes(), offset).unwrap();
}

#[test]
fn a_garbage_timing_channel_does_not_freeze_the_supervisor() {
    let scribbler = process(json!({"name": "scribbler", "exec": "/bin/sleep", "args": ["600"]}));
    let victim = process(json!({
        "name": "victim", "exec": "/bin/sleep", "args": ["600"],
        "restart": {"initial_backoff": "50ms", "max_backoff": "100ms"},
    }));
    let big = process(json!({"name": "big", "exec": "/bin/sleep", "args": ["600"]}));
    let sup = start(config(vec![scribbler, victim, big], None), None);
    sup.wait_for("all running", |s| {
        s.processes.iter().all(|p| p.state == "running")
    });
    let shm = sup.prefix.path().join("dev/shm/rtdeploy");
    // A real timing channel whose index points far past every ring entry:
    // the reader that retried forever froze the supervisor here.
    let (ch, _) = Channel::create(
        &shm,
        &timing_channel_name("scribbler"),
        &timing_geometry(),
        None,
        Path::new("/proc"),
    )
    .unwrap();
    scribble(ch.path(), NEXT_INDEX, 0x00ab_cdef_0123);
    // And a timing channel of another geometry, sized 1 GiB (sparse).
    let g = ChannelGeometry::new(16 << 20, 64, 1).with_subscribers(1);
    let (other, _) = Channel::create(
        &shm,
        &timing_channel_name("big"),
        &ChannelGeometry::new(64, 2, 1),
        None,
        Path::new("/proc"),
    )
    .unwrap();
    let f = OpenOptions::new().write(true).open(other.path()).unwrap();
    f.set_len(g.total_bytes()).unwrap();
    drop(other);

    // The supervisor reads both every 500 ms; it says once what is wrong.
    sup.wait_log("scribbler", "timing report unreadable");
    sup.wait_log("big", "timing report unreadable");
    let log = sup.log("scribbler");
    assert!(log.contains("corrupt shared memory"), "{log}");
    assert_eq!(log.matches("timing report unreadable").count(), 1, "{log}");
    assert!(
        sup.log("big").contains("queue length"),
        "{}",
        sup.log("big")
    );

    // It still reaps and restarts.
    let pid = sup.process("victim").pid.unwrap();
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    let s = sup.wait_for("victim restarted", |s| {
        s.processes[1].restarts == 1 && s.processes[1].state == "running"
    });
    assert_ne!(s.processes[1].pid, Some(pid));
    assert_eq!(s.processes[0].state, "running");
    sup.stop_all();
}

/// A report of the previous layout (`RTDTIME2`: a 120-byte head, then 32
/// entries of 176 bytes) with one watcher, built from its field list.
fn v2_report(pid: u64, seq: u64, p99_ns: u64, max_ns: u64) -> Vec<u8> {
    let mut b = vec![0u8; 120 + 32 * 176];
    let mut put = |at: usize, v: u64| b[at..at + 8].copy_from_slice(&v.to_ne_bytes());
    put(8, pid);
    put(16, seq);
    put(32, 1_000_000_000);
    put(40, 1);
    put(112, 1);
    put(120, 1); // a watcher
    put(120 + 56, 100); // count
    put(120 + 56 + 24, p99_ns);
    put(120 + 56 + 32, max_ns);
    put(120 + 56 + 96, 1000); // total
    b[..8].copy_from_slice(b"RTDTIME2");
    b[128..132].copy_from_slice(b"/imu");
    b
}

#[test]
fn old_layouts_unknown_layouts_and_garbage_figures_leave_the_supervisor_answering() {
    let names = ["old", "alien", "liar", "victim"];
    let procs = names
        .iter()
        .map(|n| {
            process(json!({
                "name": n, "exec": "/bin/sleep", "args": ["600"],
                "restart": {"initial_backoff": "50ms", "max_backoff": "100ms"},
            }))
        })
        .collect();
    let sup = start(config(procs, None), None);
    let s = sup.wait_for("all running", |s| {
        s.processes.iter().all(|p| p.state == "running")
    });
    let pid = |n: &str| {
        s.processes
            .iter()
            .find(|p| p.name == n)
            .unwrap()
            .pid
            .unwrap() as u64
    };
    let shm = sup.prefix.path().join("dev/shm/rtdeploy");
    let proc_root = Path::new("/proc");
    let channel = |name: &str, payload: u64| {
        let g = ChannelGeometry::new(payload, 4, 2).with_subscribers(4);
        Channel::create(&shm, &timing_channel_name(name), &g, None, proc_root)
            .unwrap()
            .0
    };
    // A controller built against the previous runtime.
    let old = channel("old", 120 + 32 * 176);
    let mut p = old.publisher(proc_root).unwrap();
    p.publish(&v2_report(pid("old"), 1, 9_000, 40_000)).unwrap();
    // One of a layout this supervisor does not know.
    let alien = channel("alien", 20_000);
    alien
        .publisher(proc_root)
        .unwrap()
        .publish(&[1u8; 20_000])
        .unwrap();
    // The current layout with figures that make no sense.
    let liar = channel("liar", std::mem::size_of::<RawReport>() as u64);
    let mut raw = RawReport {
        pid: pid("liar"),
        seq: 1,
        period_ns: 1_000_000_000,
        entries: 2,
        ..Default::default()
    };
    for e in &mut raw.entry[..2] {
        e.kind = 2;
        e.count = 10;
        e.total = 10;
        e.latency_p50 = u64::MAX;
        e.since_start_latency_p50 = u64::MAX;
        e.since_start_latency_p99 = 3;
        e.since_start_latency_max = 0;
    }
    liar.publisher(proc_root)
        .unwrap()
        .publish_value(&raw)
        .unwrap();

    // The liar's report cannot be true (a median above its 99th
    // percentile): said once, and not taken at its word.
    sup.wait_log("liar", "timing report implausible");
    let s = sup.wait_for("the old report read", |s| {
        s.processes
            .iter()
            .any(|p| p.name == "old" && p.timing.is_some())
    });
    let t = |n: &str| {
        s.processes
            .iter()
            .find(|p| p.name == n)
            .unwrap()
            .timing
            .clone()
            .unwrap()
    };
    let o = t("old");
    assert_eq!(o.layout, Some(2));
    assert_eq!((o.wakeup_p99_us, o.wakeup_max_us), (Some(9.0), Some(40.0)));
    assert_eq!(o.wakeup_p50_us, None);
    assert_eq!(o.since_start_wakeup_p99_us, None);
    assert_eq!(o.entries[0].name, "/imu");
    let liar_status = s.processes.iter().find(|p| p.name == "liar").unwrap();
    assert!(liar_status.timing.is_none(), "{liar_status:?}");
    assert!(
        !liar_status.budget.starts_with("over"),
        "{}",
        liar_status.budget
    );
    let log = sup.log("liar");
    assert!(
        log.contains(&format!(
            "wakeup p50 {}us is above its p99 0us); not counted against its budgets",
            u64::MAX / 1000
        )),
        "{log}"
    );
    assert_eq!(log.matches("timing report implausible").count(), 1, "{log}");
    sup.wait_log("alien", "timing report unreadable");
    let log = sup.log("alien");
    assert!(
        log.contains("a timing report layout this reader does not know"),
        "{log}"
    );
    assert!(!sup.log("old").contains("unreadable"), "{}", sup.log("old"));
    // What the status feeds: the exposition and top's frame take it.
    let text = services::metrics::exposition(&s);
    assert!(!text.contains("process=\"liar\"} 0.003"), "{text}");
    assert!(!text.contains("rtdeploy_wakeup_p50_microseconds{robot=\"testbot\",process=\"old\""));
    let f = services::top::frame(Ok(&s), vec![], &[], Default::default(), None);
    assert!(
        f.notes
            .iter()
            .any(|n| n.starts_with("old publishes timing reports of an older layout")),
        "{:?}",
        f.notes
    );

    // It still reaps and restarts.
    let v = sup.process("victim").pid.unwrap();
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(v).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    sup.wait_for("victim restarted", |s| {
        s.processes[3].restarts == 1 && s.processes[3].state == "running"
    });
    sup.stop_all();
}

#[test]
fn an_impossible_wakeup_in_a_report_does_not_degrade_its_process() {
    let talker = process(json!({
        "name": "talker", "exec": "/bin/sleep", "args": ["600"],
        "budgets": {"wakeup": "1ms"},
    }));
    let sup = start(config(vec![talker], None), None);
    let s = sup.wait_for("running", |s| s.processes[0].state == "running");
    let pid = s.processes[0].pid.unwrap() as u64;
    let shm = sup.prefix.path().join("dev/shm/rtdeploy");
    let (ch, _) = Channel::create(
        &shm,
        &timing_channel_name("talker"),
        &timing_geometry(),
        None,
        Path::new("/proc"),
    )
    .unwrap();
    let mut p = ch.publisher(Path::new("/proc")).unwrap();
    // A scribbled report: a wakeup of 584 years, seconds after the start.
    let mut raw = RawReport {
        pid,
        seq: 1,
        period_ns: 1_000_000_000,
        entries: 1,
        ..Default::default()
    };
    let e = &mut raw.entry[0];
    e.kind = 2;
    e.name[..5].copy_from_slice(b"timer");
    e.count = 10;
    e.total = 10;
    e.latency_min = 1_000;
    e.latency_avg = 2_000;
    e.latency_p50 = 1_500;
    e.latency_p99 = 3_000;
    e.latency_max = 18_446_603_336_221_196_000;
    e.since_start_latency_max = 3_000;
    p.publish_value(&raw).unwrap();
    sup.wait_log("talker", "timing report implausible");
    let log = sup.log("talker");
    assert!(
        log.contains("timer wakeup max 18446603336221196us is longer than the process has run"),
        "{log}"
    );
    let s = sup.status();
    let t = &s.processes[0];
    assert_eq!(t.state, "running", "{t:?}");
    assert!(!t.budget.starts_with("over"), "{}", t.budget);
    assert!(t.timing.is_none(), "{t:?}");
    // A true report after it is taken, and judged.
    e_true(&mut raw);
    p.publish_value(&raw).unwrap();
    let s = sup.wait_for("the true report", |s| s.processes[0].timing.is_some());
    assert!(
        s.processes[0]
            .budget
            .starts_with("over: 1 report(s) over budget"),
        "{}",
        s.processes[0].budget
    );
    sup.stop_all();
}

/// The report's second version: its wakeup 2 ms, over the 1 ms budget.
fn e_true(raw: &mut RawReport) {
    raw.seq = 2;
    raw.entry[0].latency_max = 2_000_000;
}
