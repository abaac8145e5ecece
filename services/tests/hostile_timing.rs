//! A process of the robot group scribbles on its own timing channel: the
//! supervisor (PID 1 on a robot) must go on answering, reaping and
//! restarting, and say once what is wrong with that channel.

mod common;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;

use common::{config, process, start};
use controller::channel::{Channel, ChannelGeometry};
use controller::timing_report::{timing_channel_name, timing_geometry};
use serde_json::json;
use services::supervisor::Hooks;

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
    let sup = start(config(vec![scribbler, victim, big], None), Hooks::default());
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
