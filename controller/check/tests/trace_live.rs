//! The tracer on this machine's tracefs: an instance of its own with the
//! mono clock, markers in its buffer, removed on drop. Skips (saying why)
//! when not root or without tracefs.

use std::path::Path;

use check::trace::model::{parse, EventKind};
use check::trace::Tracer;

fn tracer_or_skip(cpus: &[usize]) -> Option<Tracer> {
    // SAFETY-free probe: geteuid through /proc (no libc call in the test).
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let root = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .is_some_and(|l| l.split_whitespace().nth(2) == Some("0"));
    if !root {
        eprintln!("skipped: tracefs needs root");
        return None;
    }
    match Tracer::start(Path::new("/sys"), Path::new("/proc"), cpus) {
        Ok(t) => Some(t),
        Err(e) => {
            eprintln!("skipped: no tracer here: {e}");
            None
        }
    }
}

#[test]
fn an_instance_of_its_own_records_markers_and_is_removed() {
    let Some(t) = tracer_or_skip(&[0]) else {
        return;
    };
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
        check::rt::pin_to_set(&[0]).unwrap();
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
