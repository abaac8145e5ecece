//! `deploy top`: driven in tmux (send-keys, capture-pane) against a
//! running supervisor with the example controllers, the listener's budget
//! planted so that every report misses it, and a sysroot whose thermal
//! zones (one at its passive trip point) are fake; `--once --json` for
//! scripts; a supervisor that is gone or answers in another layout.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{robot_with_examples, supervise, wait_reports, DEPLOY};

/// A tmux server of this test's own (`-L`), killed at the end.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn start() -> Result<Tmux, String> {
        match Command::new("tmux").arg("-V").output() {
            Ok(o) if o.status.success() => {}
            _ => return Err("tmux is not installed (apt-get install tmux)".into()),
        }
        Ok(Tmux {
            socket: format!("rtdeploy-top-{}", std::process::id()),
        })
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            // tmux runs the pane's command with the user's shell, and an
            // account like nobody has nologin as its shell.
            .env("SHELL", "/bin/sh")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap()
    }

    fn capture(&self, escapes: bool) -> String {
        let mut args = vec!["capture-pane", "-p", "-t", "top"];
        if escapes {
            args.push("-e");
        }
        String::from_utf8_lossy(&self.run(&args).stdout).into_owned()
    }

    /// Waits (watchdog 30 s) until the screen satisfies `f`.
    fn wait_screen(&self, what: &str, f: impl Fn(&str) -> bool) -> String {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let s = self.capture(false);
            if f(&s) {
                return s;
            }
            assert!(Instant::now() < until, "timed out waiting for {what}:\n{s}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "top"];
        args.extend_from_slice(keys);
        assert!(self.run(&args).status.success());
    }

    fn alive(&self) -> bool {
        self.run(&["has-session", "-t", "top"]).status.success()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

/// A sysroot for top: this machine's /proc and CPUs (symlinks), and two
/// thermal zones, `cpu-thermal` below its passive trip point and
/// `gpu-thermal` at it.
fn fake_sysroot() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("sys/class/thermal")).unwrap();
    std::os::unix::fs::symlink("/proc", root.join("proc")).unwrap();
    std::os::unix::fs::symlink("/sys/devices", root.join("sys/devices")).unwrap();
    for (n, kind, temp) in [(0, "cpu-thermal", "48250"), (1, "gpu-thermal", "95500")] {
        let z = root.join(format!("sys/class/thermal/thermal_zone{n}"));
        std::fs::create_dir_all(&z).unwrap();
        for (file, text) in [
            ("type", kind),
            ("temp", temp),
            ("trip_point_0_type", "passive"),
            ("trip_point_0_temp", "95500"),
            ("trip_point_1_type", "critical"),
            ("trip_point_1_temp", "104500"),
        ] {
            std::fs::write(z.join(file), format!("{text}\n")).unwrap();
        }
    }
    dir
}

/// Whether a column of top shows a figure (`12.3`, `1234`, `12ms`,
/// `1.2s`), not `-`.
fn figure(s: &str) -> bool {
    let n = s.trim_end_matches("ms").trim_end_matches('s');
    !n.is_empty() && n.parse::<f64>().is_ok()
}

/// The screen line that starts with `name`.
fn row<'a>(screen: &'a str, name: &str) -> Option<&'a str> {
    screen.lines().find(|l| l.starts_with(name))
}

/// Whether a line captured with escapes is drawn in red (SGR 31, 91, or
/// 38;5;1 / 38;5;9 as tmux writes palette colours).
fn red(line: &str) -> bool {
    ["[31m", ";31m", "[91m", ";91m", "38;5;1m", "38;5;9m"]
        .iter()
        .any(|s| line.contains(s))
}

#[test]
#[ignore = "needs tmux: top runs in a tmux pane the test reads (Debian package tmux)"]
fn top_in_tmux_shows_the_rows_and_a_planted_miss_and_survives_the_supervisor() {
    let tmux = Tmux::start().unwrap_or_else(|why| panic!("{why}"));
    let prefix = robot_with_examples("");
    let p = prefix.path().to_str().unwrap();
    let mut sup = supervise(prefix.path());
    wait_reports(prefix.path(), 2);
    let sysroot = fake_sysroot();

    let cmd = format!(
        "{DEPLOY} --prefix {p} --sysroot {} top",
        sysroot.path().display()
    );
    let started = tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "top",
        "-x",
        "80",
        "-y",
        "24",
        &cmd,
    ]);
    assert!(started.status.success(), "{started:?}");
    let screen = tmux.wait_screen("the process and channel rows", |s| {
        row(s, "talker").is_some() && row(s, "listener").is_some() && s.contains("/demo/ping")
    });
    eprintln!("{screen}");
    assert!(screen.lines().count() <= 24);
    assert!(screen.lines().all(|l| l.chars().count() <= 80));
    let talker: Vec<&str> = row(&screen, "talker").unwrap().split_whitespace().collect();
    assert_eq!(&talker[..2], ["talker", "running"], "{screen}");
    assert!(
        ["uring", "waitv", "bell"].contains(&talker[4]),
        "the backend: {screen}"
    );
    // Median, p99 and longest of the latest report; p99 and longest since
    // the loop started: figures, not `-`.
    for (col, v) in talker.iter().enumerate().take(10).skip(5) {
        assert!(figure(v), "column {col}: {screen}");
    }
    assert!(
        screen.contains(" P50 ") && screen.contains(" SMAX "),
        "{screen}"
    );
    let listener: Vec<&str> = row(&screen, "listener")
        .unwrap()
        .split_whitespace()
        .collect();
    // The planted miss: a 1us budget, over in every report, highlighted.
    assert_eq!(listener[1], "degraded", "{screen}");
    assert_eq!(listener[11], "1.0", "the budget column: {screen}");
    assert!(listener[12].parse::<u64>().unwrap() >= 1, "{screen}");
    let coloured = tmux.capture(true);
    let line = coloured
        .lines()
        .find(|l| l.contains("listener "))
        .expect("the listener row");
    assert!(red(line), "the listener row is not highlighted: {line:?}");
    // The thermal zones: the one at its passive trip point first, marked
    // and in red; the other plain.
    let thermal = row(&screen, "thermal:").expect("the thermal line");
    assert!(
        thermal.starts_with("thermal: gpu 95.5C>=95.5 THROTTLED cpu 48.2C"),
        "{screen}"
    );
    let line = coloured
        .lines()
        .find(|l| l.contains("THROTTLED"))
        .expect("the thermal line");
    assert!(red(line), "the throttled zone is not highlighted: {line:?}");
    assert!(
        !red(coloured.lines().find(|l| l.contains("talker ")).unwrap()),
        "the talker row meets its budget"
    );
    let ch: Vec<&str> = row(&screen, "/demo/ping")
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(
        &ch[1..3],
        ["1", "1"],
        "one publisher, one subscriber: {screen}"
    );
    assert!(screen.contains("cpu0"), "{screen}");

    // Sort, filter, pause.
    tmux.keys(&["s"]);
    tmux.wait_screen("sorted by name", |s| s.contains("sort: name"));
    tmux.keys(&["/", "l", "i", "s", "t", "Enter"]);
    let s = tmux.wait_screen("filtered", |s| {
        s.contains("filter: list") && row(s, "talker").is_none()
    });
    assert!(row(&s, "listener").is_some(), "{s}");
    tmux.keys(&["/", "Escape"]);
    tmux.wait_screen("filter cleared", |s| row(s, "talker").is_some());
    tmux.keys(&["p"]);
    tmux.wait_screen("paused", |s| s.contains("PAUSED"));
    tmux.keys(&["p"]);
    tmux.wait_screen("running again", |s| !s.contains("PAUSED"));

    // Too small, then large enough again.
    tmux.run(&["resize-window", "-t", "top", "-x", "40", "-y", "10"]);
    tmux.wait_screen("too small", |s| s.contains("too small"));
    tmux.run(&["resize-window", "-t", "top", "-x", "80", "-y", "24"]);
    tmux.wait_screen("the rows again", |s| row(s, "listener").is_some());

    // The supervisor goes away: said, and top keeps running.
    let kill = Command::new("kill")
        .args(["-TERM", &sup.0.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let _ = sup.0.wait();
    let s = tmux.wait_screen("no supervisor", |s| s.contains("no supervisor status"));
    let joined = s.lines().map(str::trim_end).collect::<Vec<_>>().join(" ");
    assert!(joined.contains("is `deploy supervise` running?"), "{s}");
    assert!(tmux.alive());

    tmux.keys(&["q"]);
    let until = Instant::now() + Duration::from_secs(10);
    while tmux.alive() {
        assert!(Instant::now() < until, "top did not quit on q");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn once_json(prefix: &Path) -> (Option<i32>, serde_json::Value) {
    once_json_in(prefix, Path::new("/"))
}

fn once_json_in(prefix: &Path, sysroot: &Path) -> (Option<i32>, serde_json::Value) {
    let out = Command::new(DEPLOY)
        .args([
            "--prefix",
            prefix.to_str().unwrap(),
            "--sysroot",
            sysroot.to_str().unwrap(),
            "--json",
            "top",
            "--once",
            "--interval",
            "200ms",
        ])
        .output()
        .unwrap();
    let doc = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
    });
    (out.status.code(), doc)
}

#[test]
fn once_json_is_one_frame_for_scripts() {
    let prefix = robot_with_examples("");
    let _sup = supervise(prefix.path());
    wait_reports(prefix.path(), 2);
    let sysroot = fake_sysroot();
    let (code, f) = once_json_in(prefix.path(), sysroot.path());
    assert_eq!(code, Some(0), "{f:#}");
    assert_eq!(f["schema_version"], 1);
    assert_eq!(f["robot"], "exbot");
    assert_eq!(f["error"], serde_json::Value::Null);
    let procs = f["processes"].as_array().unwrap();
    assert_eq!(procs[0]["name"], "talker");
    assert_eq!(procs[1]["name"], "listener");
    assert_eq!(procs[1]["miss"], true, "{f:#}");
    assert_eq!(procs[1]["wakeup_budget_us"], 1.0);
    assert!(
        procs[1]["wakeup_p99_us"].as_f64().unwrap() <= procs[1]["wakeup_max_us"].as_f64().unwrap()
    );
    // The median of the latest report, and since the loop started.
    for p in procs {
        let v = |k: &str| {
            p[k].as_f64()
                .unwrap_or_else(|| panic!("{k} of {}: {f:#}", p["name"]))
        };
        assert!(v("wakeup_p50_us") <= v("wakeup_p99_us"), "{p:#}");
        assert!(v("since_start_wakeup_p50_us") <= v("since_start_wakeup_p99_us"));
        assert!(v("since_start_wakeup_p99_us") <= v("since_start_wakeup_max_us"));
        assert!(
            v("since_start_wakeup_max_us") >= v("wakeup_max_us"),
            "{p:#}"
        );
        assert_eq!(p["report_layout"], controller::timing_report::LAYOUT);
    }
    let zones = f["thermal"].as_array().unwrap();
    let z: Vec<(&str, f64, bool)> = zones
        .iter()
        .map(|z| {
            (
                z["name"].as_str().unwrap(),
                z["temp_c"].as_f64().unwrap(),
                z["throttling"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        z,
        [("cpu-thermal", 48.25, false), ("gpu-thermal", 95.5, true)]
    );
    assert_eq!(zones[1]["passive_c"], 95.5);

    // deploy status --json carries the same figures in its timing block.
    let out = Command::new(DEPLOY)
        .args([
            "--prefix",
            prefix.path().to_str().unwrap(),
            "--json",
            "status",
        ])
        .output()
        .unwrap();
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let t = &s["processes"][0]["timing"];
    assert_eq!(t["layout"], controller::timing_report::LAYOUT, "{s:#}");
    // The class the supervisor gave it from robot.yaml (policy other:
    // best-effort), as its loop reports it.
    assert_eq!(t["wake_class"], "best-effort", "{s:#}");
    for k in [
        "wakeup_p50_us",
        "since_start_wakeup_p50_us",
        "since_start_wakeup_p99_us",
        "since_start_wakeup_max_us",
    ] {
        assert!(t[k].as_f64().is_some(), "{k}: {t:#}");
    }
    let e = &t["entries"][0];
    assert!(e["latency_p50_us"].as_f64().is_some(), "{e:#}");
    assert!(e["since_start_latency_p99_us"].as_f64().is_some(), "{e:#}");
    assert_eq!(f["channels"][0]["name"], "/demo/ping");
    assert_eq!(f["channels"][0]["publishers"], 1);
    let cpus = f["cpus"].as_array().unwrap();
    assert!(!cpus.is_empty(), "{f:#}");
    // robot.yaml isolates CPU 1.
    if let Some(c1) = cpus.iter().find(|c| c["cpu"] == 1) {
        assert_eq!(c1["isolated"], true);
        assert!(c1["util_pct"].as_f64().is_some());
    }
}

#[test]
fn once_without_a_supervisor_says_why_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let (code, f) = once_json(dir.path());
    assert_eq!(code, Some(2));
    let e = f["error"].as_str().unwrap();
    assert!(e.contains("is `deploy supervise` running?"), "{e}");
    assert!(f["processes"].as_array().unwrap().is_empty());
    // The CPUs are shown all the same; robot.yaml is missing: said.
    assert!(!f["cpus"].as_array().unwrap().is_empty());
    assert!(
        f["notes"][0]
            .as_str()
            .unwrap()
            .starts_with("isolated CPUs unknown"),
        "{f:#}"
    );
}

/// Answers every connection on `prefix`'s control socket with `reply`.
fn fake_supervisor(prefix: &Path, reply: String) -> std::thread::JoinHandle<()> {
    let sock = services::control::socket_path(prefix);
    std::fs::create_dir_all(sock.parent().unwrap()).unwrap();
    let l = UnixListener::bind(&sock).unwrap();
    std::thread::spawn(move || {
        if let Ok((s, _)) = l.accept() {
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut line = String::new();
            let _ = r.read_line(&mut line);
            let mut w = s;
            let _ = w.write_all(reply.as_bytes());
        }
    })
}

#[test]
fn an_older_status_layout_is_shown_with_a_note_and_a_garbled_one_is_an_error() {
    // A supervisor from before the timing detail: p99 and max only.
    let dir = tempfile::tempdir().unwrap();
    let old = r#"{"ok":true,"status":{"robot":"old","pid":9,"pid1":false,"uptime_s":3.0,"state":"running","boot_check":"passed","startup":[],"processes":[{"name":"imu","state":"running","restarts":1,"budget":"ok","over_budget_reports":0,"degraded":false,"wakeup_p99_us":12.5,"wakeup_max_us":40.0,"backend":"futex_waitv"}]}}"#;
    let t = fake_supervisor(dir.path(), format!("{old}\n"));
    let (code, f) = once_json(dir.path());
    t.join().unwrap();
    assert_eq!(code, Some(0), "{f:#}");
    assert_eq!(f["processes"][0]["wakeup_p99_us"], 12.5);
    assert_eq!(f["processes"][0]["handler_max_us"], serde_json::Value::Null);
    assert!(
        f["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().contains("older supervisor")),
        "{f:#}"
    );

    // A reply that is not a status at all, and a long one: an error, cut.
    let dir = tempfile::tempdir().unwrap();
    let t = fake_supervisor(
        dir.path(),
        format!("{{\"ok\":true,\"status\":{}}}\n", "7".repeat(100_000)),
    );
    let (code, f) = once_json(dir.path());
    t.join().unwrap();
    assert_eq!(code, Some(2));
    let e = f["error"].as_str().unwrap();
    assert!(e.starts_with("a status this deploy cannot read"), "{e}");
    assert!(e.len() < 400, "{}", e.len());
}
