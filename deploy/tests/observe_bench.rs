//! Figures for `deploy top` and the metrics textfile (ignored: run by
//! hand, they take about a minute and a half):
//!
//! ```text
//! cargo build -p controller --examples --release
//! cargo test -p deploy --release --test observe_bench -- --ignored --nocapture
//! ```
//!
//! With 20 example talkers (100 Hz each, one channel each, a timing
//! report a second each):
//! - the supervisor's CPU time over `BENCH_SECS` (20) without `metrics:`, then with
//!   `metrics.every: 1s`;
//! - one exposition of that status rendered and written (temp + rename),
//!   averaged over 1000;
//! - `deploy top`'s CPU time over `BENCH_SECS` at 1 Hz in an 80x24 tmux pane.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{examples, supervise, wait_status, DEPLOY};

/// Seconds each figure measures over: `BENCH_SECS`, 20 by default (CI
/// runs it for 2, to check that it runs, not for its figures).
fn secs() -> u64 {
    std::env::var("BENCH_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&s| s > 0)
        .unwrap_or(20)
}

fn ticks(pid: u32) -> u64 {
    let s = services::procfs::read_stat(Path::new("/proc"), pid as i32).unwrap();
    s.utime + s.stime
}

fn clk_tck() -> f64 {
    // SAFETY: sysconf has no preconditions.
    #[allow(unsafe_code)]
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    t as f64
}

fn prefix_with_talkers(metrics: &str) -> tempfile::TempDir {
    let (talker, _) = examples().expect("the example controllers are built");
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("etc/rtdeploy")).unwrap();
    let mut y = String::from(
        "robot:\n  name: bench\nboard:\n  model: generic\n  cpus: 2\ncpus:\n  housekeeping: 0\n  isolated: 1\nboot_check:\n  enabled: false\nchannels:\n",
    );
    for i in 0..20 {
        y.push_str(&format!(
            "  - name: /b/{i:02}\n    max_size: 64\n    rate: 100\n    retention: 100ms\n"
        ));
    }
    y.push_str("processes:\n");
    for i in 0..20 {
        y.push_str(&format!(
            "  - name: t{i:02}\n    exec: {}\n    args: [--channel, /b/{i:02}, --period-us, \"10000\", --every, \"1000000\"]\n    publishes: [/b/{i:02}]\n    budgets: {{wakeup: 5ms}}\n",
            talker.display()
        ));
    }
    y.push_str(metrics);
    std::fs::write(dir.path().join("etc/rtdeploy/robot.yaml"), y).unwrap();
    dir
}

fn all_reporting(prefix: &Path) -> services::status::SupervisorStatus {
    wait_status(prefix, "20 processes reporting", |s| {
        s.processes.len() == 20
            && s.processes
                .iter()
                .all(|p| p.timing.as_ref().is_some_and(|t| t.reports >= 2))
    })
}

/// The supervisor's CPU seconds over `secs()`.
fn supervisor_cpu(metrics: &str) -> (f64, services::status::SupervisorStatus) {
    let prefix = prefix_with_talkers(metrics);
    let sup = supervise(prefix.path());
    let status = all_reporting(prefix.path());
    let t0 = ticks(sup.0.id());
    std::thread::sleep(Duration::from_secs(secs()));
    let t1 = ticks(sup.0.id());
    ((t1 - t0) as f64 / clk_tck(), status)
}

#[test]
#[ignore = "slow: a benchmark that prints figures (run with --ignored --nocapture)"]
fn top_and_metrics_figures() {
    if let Err(why) = examples() {
        panic!("{why}");
    }
    let (plain, status) = supervisor_cpu("");
    let (with, _) =
        supervisor_cpu("metrics:\n  textfile: /var/lib/node_exporter/rtdeploy.prom\n  every: 1s\n");
    println!(
        "supervisor, 20 reporting processes, {}s: {:.2}s CPU without metrics ({:.2}%), {:.2}s with metrics every 1s ({:.2}%)",
        secs(),
        plain,
        plain * 100.0 / secs() as f64,
        with,
        with * 100.0 / secs() as f64
    );

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rtdeploy.prom");
    let n = 1000;
    let r0 = rusage_self();
    let t = Instant::now();
    let mut bytes = 0;
    for _ in 0..n {
        let text = services::metrics::exposition(&status);
        bytes = text.len();
        services::boot_history::write_atomic(&path, text.as_bytes()).unwrap();
    }
    let wall = t.elapsed();
    let cpu = rusage_self() - r0;
    println!(
        "one exposition of 20 processes ({bytes} bytes) rendered and written: {:.0}us CPU, {:.0}us wall (mean of {n})",
        cpu * 1e6 / n as f64,
        wall.as_secs_f64() * 1e6 / n as f64
    );

    assert!(
        Command::new("tmux").arg("-V").output().is_ok(),
        "tmux is not installed (Debian package tmux)"
    );
    let prefix = prefix_with_talkers("");
    let _sup = supervise(prefix.path());
    all_reporting(prefix.path());
    let sock = format!("rtdeploy-bench-{}", std::process::id());
    let tmux = |args: &[&str]| {
        Command::new("tmux")
            .arg("-L")
            .arg(&sock)
            .args(args)
            .output()
            .unwrap()
    };
    let cmd = format!("{DEPLOY} --prefix {} top", prefix.path().display());
    tmux(&["new-session", "-d", "-s", "b", "-x", "80", "-y", "24", &cmd]);
    std::thread::sleep(Duration::from_secs(3));
    let pid: u32 =
        String::from_utf8_lossy(&tmux(&["display", "-p", "-t", "b", "#{pane_pid}"]).stdout)
            .trim()
            .parse()
            .unwrap();
    let t0 = ticks(pid);
    std::thread::sleep(Duration::from_secs(secs()));
    let t1 = ticks(pid);
    tmux(&["kill-server"]);
    let top = (t1 - t0) as f64 / clk_tck();
    println!(
        "deploy top at 1 Hz, 20 processes, 80x24, {}s: {top:.2}s CPU ({:.2}%)",
        secs(),
        top * 100.0 / secs() as f64
    );
}

/// This process's user + system CPU seconds.
fn rusage_self() -> f64 {
    let mut r = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a rusage into the pointer it is given, which
    // points at one; RUSAGE_SELF is a valid `who`.
    #[allow(unsafe_code)]
    let r = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, r.as_mut_ptr());
        r.assume_init()
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(r.ru_utime) + tv(r.ru_stime)
}
