//! Figures for the supervisor (ignored: run by hand, they take a minute):
//!
//! ```text
//! cargo test -p deploy --release --test supervise_bench -- --ignored --nocapture
//! ```
//!
//! - start-up: from starting `deploy supervise` to its `READY=1`
//!   notification (sent once every process has been started), 20 processes;
//! - restart latency: from SIGKILL of a process to its replacement running,
//!   with `initial_backoff: 1ms`, median and worst of 20;
//! - idle CPU: the supervisor's utime+stime over `BENCH_IDLE_SECS` (30)
//!   with the 20 processes running.

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use services::control::{self, Request};

const DEPLOY: &str = env!("CARGO_BIN_EXE_deploy");

fn status(prefix: &Path) -> Option<services::status::SupervisorStatus> {
    control::request(&control::socket_path(prefix), &Request::Status)
        .ok()?
        .status
}

fn ticks(pid: u32) -> u64 {
    let s = services::procfs::read_stat(Path::new("/proc"), pid as i32).unwrap();
    s.utime + s.stime
}

#[test]
#[ignore = "slow: a benchmark that prints figures (run with --ignored --nocapture)"]
fn supervisor_figures() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path();
    std::fs::create_dir_all(prefix.join("etc/rtdeploy")).unwrap();
    let mut yaml = String::from(
        "robot:\n  name: bench\nboard:\n  model: generic\n  cpus: 2\ncpus:\n  housekeeping: 0\n  isolated: 1\nboot_check:\n  enabled: false\nprocesses:\n",
    );
    for i in 0..20 {
        yaml.push_str(&format!(
            "  - name: p{i:02}\n    exec: /bin/sleep\n    args: [\"3600\"]\n    restart: {{initial_backoff: 1ms, crash_loop_restarts: 100}}\n"
        ));
    }
    std::fs::write(prefix.join("etc/rtdeploy/robot.yaml"), yaml).unwrap();
    let notify_path = prefix.join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();

    let t0 = Instant::now();
    let mut sup = Command::new(DEPLOY)
        .args([
            "-q",
            "--prefix",
            prefix.to_str().unwrap(),
            "supervise",
            "--skip-cpu-plan",
        ])
        .env("NOTIFY_SOCKET", &notify_path)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut buf = [0u8; 64];
    let n = notify.recv(&mut buf).unwrap();
    let startup = t0.elapsed();
    assert_eq!(&buf[..n], b"READY=1");
    let s = status(prefix).unwrap();
    assert!(s.processes.iter().all(|p| p.state == "running"));
    println!(
        "start-up, 20 processes: {:.1} ms (deploy supervise exec to READY=1)",
        startup.as_secs_f64() * 1e3
    );

    let mut lat = Vec::new();
    for round in 0..20 {
        let name = format!("p{:02}", round);
        let old = s
            .processes
            .iter()
            .find(|p| p.name == name)
            .unwrap()
            .pid
            .unwrap();
        let children = format!("/proc/{0}/task/{0}/children", sup.id());
        let before: Vec<String> = std::fs::read_to_string(&children)
            .unwrap()
            .split_whitespace()
            .map(String::from)
            .collect();
        Command::new("kill")
            .args(["-KILL", &old.to_string()])
            .status()
            .unwrap();
        // From the moment `kill` returned (the signal is sent by then);
        // watch the supervisor's children list, cheaper than a status
        // request, for the replacement.
        let t = Instant::now();
        loop {
            let now = std::fs::read_to_string(&children).unwrap();
            if now
                .split_whitespace()
                .any(|p| !before.iter().any(|b| b == p))
            {
                lat.push(t.elapsed());
                break;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        let st = loop {
            let st = status(prefix).unwrap();
            if st.processes.iter().all(|p| p.state == "running") {
                break st;
            }
        };
        assert_ne!(
            st.processes.iter().find(|p| p.name == name).unwrap().pid,
            Some(old)
        );
    }
    lat.sort();
    println!(
        "restart after SIGKILL (initial_backoff 1ms included, children list polled every 0.1 ms): median {:.2} ms, worst {:.2} ms",
        lat[lat.len() / 2].as_secs_f64() * 1e3,
        lat[lat.len() - 1].as_secs_f64() * 1e3
    );

    let secs: u64 = std::env::var("BENCH_IDLE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let hz = 100.0; // USER_HZ on Linux
    let before = ticks(sup.id());
    std::thread::sleep(Duration::from_secs(secs));
    let after = ticks(sup.id());
    println!(
        "idle CPU, 20 processes, {secs} s: {} ticks = {:.3}% of one CPU",
        after - before,
        (after - before) as f64 / hz / secs as f64 * 100.0
    );
    Command::new(DEPLOY)
        .args(["--prefix", prefix.to_str().unwrap(), "stop", "--all"])
        .status()
        .unwrap();
    sup.wait().unwrap();
}
