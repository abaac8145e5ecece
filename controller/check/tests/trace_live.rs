//! The tracer on this machine's tracefs: an instance of its own with the
//! mono clock, markers in its buffer, removed on drop. Needs root and
//! tracefs: ignored unless asked for (`--include-ignored`).

use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use check::trace::model::{parse, EventKind};
use check::trace::watch::RuntimeTrace;
use check::trace::Tracer;

/// One instance per process (its name is the pid): one test at a time.
static ONE: Mutex<()> = Mutex::new(());

fn is_root() -> bool {
    // SAFETY-free probe: geteuid through /proc (no libc call in the test).
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .is_some_and(|l| l.split_whitespace().nth(2) == Some("0"))
}

fn tracer(cpus: &[usize]) -> Tracer {
    assert!(is_root(), "tracefs needs root");
    Tracer::start(Path::new("/sys"), Path::new("/proc"), cpus)
        .unwrap_or_else(|e| panic!("no tracer here: {e}"))
}

#[test]
#[ignore = "needs tracefs: root and the kernel's tracefs (mounted, or mountable at /sys/kernel/tracing)"]
fn an_instance_of_its_own_records_markers_and_is_removed() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let t = tracer(&[0]);
    let dir = t.dir().to_path_buf();
    assert!(dir.ends_with(format!("rtdeploy-{}", std::process::id())));
    assert!(t.events.iter().any(|e| e == "sched/sched_switch"));
    assert_eq!(
        std::fs::read_to_string(dir.join("tracing_cpumask"))
            .unwrap()
            .trim(),
        "1"
    );
    assert!(std::fs::read_to_string(dir.join("trace_clock"))
        .unwrap()
        .contains("[mono]"));
    // A marker from a thread pinned to CPU 0.
    let marker_dir = dir.clone();
    std::thread::spawn(move || {
        units::sched::set_affinity(0, &units::cpu::CpuSet::first(1)).unwrap();
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(marker_dir.join("trace_marker"))
            .unwrap();
        use std::io::Write;
        f.write_all(b"rtdeploy send seq=5 t=1").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
    })
    .join()
    .unwrap();
    t.off();
    let cpus = t.read_cpus();
    assert_eq!(cpus.len(), 1);
    let p = parse(&cpus[0].1);
    assert!(
        p.events.iter().any(
            |e| matches!(&e.kind, EventKind::Marker { text } if text == "rtdeploy send seq=5 t=1")
        ),
        "no marker in {} events",
        p.events.len()
    );
    assert!(p.events.iter().all(|e| e.cpu == 0));
    drop(t);
    assert!(!dir.exists(), "{} left behind", dir.display());
}

/// Writes `text` to the instance's trace_marker from a thread on CPU 0,
/// then turns it off when `off` (as a late process does).
fn late_process(instance: &Path, text: String, off: bool) {
    let dir = instance.to_path_buf();
    std::thread::spawn(move || {
        use std::io::Write;
        units::sched::set_affinity(0, &units::cpu::CpuSet::first(1)).unwrap();
        let open = |f: &str| {
            std::fs::OpenOptions::new()
                .write(true)
                .open(dir.join(f))
                .unwrap()
        };
        open("trace_marker").write_all(text.as_bytes()).unwrap();
        if off {
            open("tracing_on").write_all(b"0").unwrap();
        }
    })
    .join()
    .unwrap();
}

#[test]
#[ignore = "needs tracefs: root and the kernel's tracefs (mounted, or mountable at /sys/kernel/tracing)"]
fn the_supervisors_watch_takes_a_processs_miss_then_pauses() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    assert!(is_root(), "tracefs needs root");
    let saved = tempfile::tempdir().unwrap();
    let mut w = RuntimeTrace::start(
        Path::new("/sys"),
        Path::new("/proc"),
        &[0],
        saved.path().to_path_buf(),
        2,
    )
    .unwrap_or_else(|e| panic!("no tracer here: {e}"));
    let instance = w.tracer().dir().to_path_buf();
    // A miss whose message was sent 3 ms ago: after the last resume.
    let miss = |seq: u64| {
        std::thread::sleep(Duration::from_millis(5));
        let now = controller::Monotonic::now().as_nanos();
        format!(
            "rtdeploy miss kind=timer seq={seq} sender=1 send={} handler={now} budget=1000000",
            now - 3_000_000
        )
    };
    let t0 = Instant::now();
    // Recording, no miss: nothing to take.
    assert!(w.poll_at(t0).is_none());
    // A marker that is not a whole miss, and the instance turned off:
    // nothing taken, recording again.
    late_process(&instance, "rtdeploy miss kind=timer".into(), true);
    assert!(w.poll_at(t0).is_none());
    let on = std::fs::read_to_string(instance.join("tracing_on")).unwrap();
    assert_eq!(on.trim(), "1", "recording again");
    // A miss: taken, saved, recording again.
    late_process(&instance, miss(1), true);
    let m = w.poll_at(t0).expect("the miss is taken");
    assert!(m.timer);
    assert!(
        m.verdict.starts_with("late 3.00ms (budget 1.00ms)"),
        "{}",
        m.verdict
    );
    let text = m.text.expect("saved");
    assert!(text.starts_with(saved.path()), "{}", text.display());
    let on = std::fs::read_to_string(instance.join("tracing_on")).unwrap();
    assert_eq!(on.trim(), "1", "recording again");
    // The next miss waits out the pause (1 s), held in the stopped
    // buffer; then it is taken, and the pause after it is 2 s.
    late_process(&instance, miss(2), true);
    assert!(w.poll_at(t0 + Duration::from_millis(500)).is_none());
    let on = std::fs::read_to_string(instance.join("tracing_on")).unwrap();
    assert_eq!(on.trim(), "0", "held");
    let m = w
        .poll_at(t0 + Duration::from_millis(1_100))
        .expect("taken after the pause");
    assert!(m.verdict.contains("late 3.00ms"), "{}", m.verdict);
    late_process(&instance, miss(3), true);
    assert!(w.poll_at(t0 + Duration::from_millis(2_500)).is_none());
    assert!(w.poll_at(t0 + Duration::from_millis(3_200)).is_some());
    assert_eq!(w.snapshots, 3);
    // At most `keep` of them stay.
    let files = std::fs::read_dir(saved.path()).unwrap().count();
    assert_eq!(files, 4, "two misses of one kind, text and JSON each");
    // A message sent before recording started again has part of its
    // window only: passed over once (recording again), the next such is
    // taken as it is.
    let sent_before = |seq: u64| {
        let now = controller::Monotonic::now().as_nanos();
        format!(
            "rtdeploy miss kind=message seq={seq} sender=1 send={} handler={now} budget=1000000",
            now - 60_000_000_000
        )
    };
    let later = t0 + Duration::from_secs(60);
    late_process(&instance, sent_before(4), true);
    assert!(w.poll_at(later).is_none());
    let on = std::fs::read_to_string(instance.join("tracing_on")).unwrap();
    assert_eq!(on.trim(), "1", "recording again");
    late_process(&instance, sent_before(5), true);
    let m = w.poll_at(later).expect("taken the second time");
    assert!(m.verdict.ends_with("[partial trace]"), "{}", m.verdict);
    assert_eq!(w.snapshots, 4);
    drop(w);
    assert!(!instance.exists(), "{} left behind", instance.display());
}
