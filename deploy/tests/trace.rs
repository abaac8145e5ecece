//! `deploy check --trace` for real on this machine: a planted SCHED_FIFO
//! thread above the check's real-time priority spins on the receiver's
//! CPU, the check misses its budget, and a verdict names the thread; the
//! saved trace-event JSON matches docs/trace-event-schema.json (written
//! from the format's published description); `deploy trace show` prints
//! the analysis again and refuses what is not a saved trace; the ftrace
//! instance is gone after the run. The traced runs need root and tracefs
//! (`#[ignore = "needs tracefs: ..."]`); run, they fail where either is
//! missing. No timing figure is asserted.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::Spinner;

/// One check at a time: they pin to the same CPUs.
static SERIAL: Mutex<()> = Mutex::new(());

fn repo(p: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(p)
}

fn deploy(prefix: &Path, config: Option<&Path>, args: &[&str]) -> Output {
    let mut cmd = Command::new("timeout");
    cmd.args(["-s", "KILL", "120"])
        .arg(env!("CARGO_BIN_EXE_deploy"))
        .arg("--prefix")
        .arg(prefix);
    if let Some(c) = config {
        cmd.arg("-c").arg(c);
    }
    let out = cmd.args(args).output().expect("run deploy");
    assert_ne!(out.status.code(), Some(137), "deploy hung (watchdog)");
    out
}

/// `deploy supervise` of the robot in `prefix`, without the CPU plan.
fn supervise(prefix: &Path) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_deploy"))
        .arg("-q")
        .arg("--prefix")
        .arg(prefix)
        .args(["supervise", "--skip-cpu-plan"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Fails the test where this machine cannot run the traced check.
#[allow(unsafe_code)]
fn require_tracing() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(euid, 0, "tracefs and SCHED_FIFO need root");
    assert!(
        Path::new("/sys/kernel/tracing").is_dir()
            || Path::new("/sys/kernel/debug/tracing").is_dir(),
        "the kernel has no tracefs (no /sys/kernel/tracing)"
    );
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(
        n >= 2,
        "examples/dev.yaml needs CPUs 0 and 1, this machine has {n}"
    );
}

/// A directory removed when dropped (a test's own ftrace instance).
struct RmDir(PathBuf);

impl Drop for RmDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn schema() -> jsonschema::Validator {
    let text = std::fs::read_to_string(repo("docs/trace-event-schema.json")).unwrap();
    let schema: serde_json::Value = serde_json::from_str(&text).unwrap();
    jsonschema::validator_for(&schema).expect("docs/trace-event-schema.json is a valid schema")
}

fn schema_errors(v: &jsonschema::Validator, doc: &serde_json::Value) -> Vec<String> {
    v.iter_errors(doc)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect()
}

#[test]
fn the_schema_refuses_what_the_format_does_not_allow() {
    let v = schema();
    let ok = serde_json::json!({"traceEvents": [
        {"name": "a", "ph": "X", "ts": 1.5, "dur": 2, "pid": 1, "tid": 1},
        {"name": "thread_name", "ph": "M", "ts": 0, "pid": 1, "tid": 1, "args": {"name": "CPU 1"}},
        {"name": "m", "ph": "i", "s": "t", "ts": 3, "pid": 1, "tid": 1}
    ], "displayTimeUnit": "ns"});
    assert!(
        schema_errors(&v, &ok).is_empty(),
        "{:?}",
        schema_errors(&v, &ok)
    );
    for bad in [
        serde_json::json!({"events": []}),
        serde_json::json!({"traceEvents": [{"name": "a", "ph": "X", "ts": 1, "pid": 1, "tid": 1}]}),
        serde_json::json!({"traceEvents": [{"name": "a", "ph": "Q", "ts": 1, "pid": 1, "tid": 1}]}),
        serde_json::json!({"traceEvents": [{"name": "a", "ph": "i", "ts": "1", "pid": 1, "tid": 1}]}),
        serde_json::json!({"traceEvents": [{"name": "a", "ph": "i", "ts": 1, "pid": 1}]}),
        serde_json::json!({"traceEvents": [{"name": "a", "ph": "i", "s": "x", "ts": 1, "pid": 1, "tid": 1}]}),
        serde_json::json!({"traceEvents": [], "displayTimeUnit": "s"}),
    ] {
        assert!(!schema_errors(&v, &bad).is_empty(), "accepted {bad}");
    }
}

#[test]
#[ignore = "needs tracefs: root, tracefs and SCHED_FIFO for the traced check"]
fn a_planted_fifo_spinner_on_the_receivers_cpu_is_named() {
    require_tracing();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let yaml = std::fs::read_to_string(repo("examples/dev.yaml"))
        .unwrap()
        .replace("delivery_max: 2ms", "delivery_max: 1ms")
        .replace("timer_max: 2ms", "timer_max: 500us")
        .replace(
            "budgets:\n    delivery_max",
            "trace_on_miss: 40\n  budgets:\n    delivery_max",
        );
    assert!(yaml.contains("trace_on_miss: 40"), "dev.yaml changed shape");
    assert!(yaml.contains("timer_max: 500us"), "dev.yaml changed shape");
    let cfg = dir.path().join("robot.yaml");
    std::fs::write(&cfg, yaml).unwrap();
    let traces = dir.path().join("traces");
    // Someone else's tracer, recording in an instance of its own: the run
    // must leave it as it is.
    let other = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .iter()
        .map(|r| Path::new(r).join("instances"))
        .find(|p| p.is_dir())
        .map(|p| RmDir(p.join(format!("other-tracer-{}", std::process::id()))));
    if let Some(RmDir(o)) = &other {
        std::fs::create_dir(o).unwrap();
        std::fs::write(o.join("events/sched/sched_switch/enable"), "1").unwrap();
        std::fs::write(o.join("tracing_on"), "1").unwrap();
    }
    // dev.yaml: one isolated CPU (1) for the sender and the receiver at
    // FIFO 80; the planted thread is above them there.
    let spinner = Spinner::start(1, 85, Duration::from_millis(2), Duration::from_millis(20));
    let out = deploy(
        dir.path(),
        Some(&cfg),
        &[
            "check",
            "--duration",
            "4s",
            "--json",
            "-q",
            "--no-verify",
            &format!("--trace={}", traces.display()),
        ],
    );
    spinner
        .finish()
        .expect("the planted thread ran at SCHED_FIFO on its CPU");
    if let Some(RmDir(o)) = &other {
        let on = std::fs::read_to_string(o.join("tracing_on")).unwrap();
        let ev = std::fs::read_to_string(o.join("events/sched/sched_switch/enable")).unwrap();
        let clock = std::fs::read_to_string(o.join("trace_clock")).unwrap();
        std::fs::remove_dir(o).unwrap();
        assert_eq!(
            (on.trim(), ev.trim()),
            ("1", "1"),
            "the other tracer was disturbed"
        );
        assert!(
            !clock.contains("[mono]"),
            "the other tracer's clock changed: {clock}"
        );
    }
    let code = out.status.code();
    assert!(
        code == Some(0) || code == Some(1),
        "exit {code:?}: {}",
        text(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    // The report with its trace part still matches docs/check-schema.json.
    let report_schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo("docs/check-schema.json")).unwrap())
            .unwrap();
    let rv = jsonschema::validator_for(&report_schema).unwrap();
    let errors = schema_errors(&rv, &doc);
    assert!(
        errors.is_empty(),
        "check-schema.json:\n{}",
        errors.join("\n")
    );
    let t = &doc["trace"];
    assert_eq!(t["enabled"], true, "tracing did not run: {}", t["reason"]);
    // The run's instance is gone.
    let instance = t["instance"].as_str().unwrap();
    assert!(!Path::new(instance).exists(), "{instance} left behind");
    assert!(t["events"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e == "sched/sched_switch"));
    let verdicts = t["verdicts"].as_array().unwrap();
    assert!(
        !verdicts.is_empty(),
        "no miss traced ({} over the threshold): {t}",
        t["over_threshold"]
    );
    assert_eq!(doc["verdict"], "fail", "the spinner makes the check miss");
    let named: Vec<&serde_json::Value> = verdicts
        .iter()
        .filter(|v| v["verdict"].as_str().unwrap().contains("planted-spin ("))
        .collect();
    assert!(
        !named.is_empty(),
        "no verdict names the planted thread:\n{}",
        verdicts
            .iter()
            .map(|v| v["verdict"].as_str().unwrap())
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        named[0]["verdict"]
            .as_str()
            .unwrap()
            .contains("planted-spin (FIFO 85, pid "),
        "{}",
        named[0]["verdict"]
    );
    // The timer phase on the same CPU was traced too, and names it.
    let timer_named: Vec<&serde_json::Value> = verdicts
        .iter()
        .filter(|v| v["timer_cpu"] == 1 && v["mechanism"].is_null())
        .filter(|v| {
            v["verdict"]
                .as_str()
                .unwrap()
                .contains("planted-spin (FIFO 85, pid ")
        })
        .collect();
    assert!(
        !timer_named.is_empty(),
        "no timer verdict names the planted thread ({} timer wakes over {}):\n{}",
        t["timer_over_threshold"],
        t["timer_miss_threshold_ns"],
        verdicts
            .iter()
            .map(|v| format!("[timer cpu {}] {}", v["timer_cpu"], v["verdict"]))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(t["timer_miss_threshold_ns"], 500_000);
    assert!(t["timer_over_threshold"].as_u64().unwrap() >= timer_named.len() as u64);
    let timer_text = timer_named[0]["text"].as_str().unwrap();
    assert!(timer_text.contains("-timer-seq"), "{timer_text}");
    let show = deploy(dir.path(), None, &["trace", "show", timer_text]);
    assert_eq!(show.status.code(), Some(0), "{}", text(&show.stderr));
    let shown = text(&show.stdout);
    assert_eq!(
        shown.lines().next().unwrap_or(""),
        timer_named[0]["verdict"].as_str().unwrap()
    );
    assert!(shown.contains("from the deadline to its wake"), "{shown}");
    // Saved files: at most trace_on_miss pairs of each kind (deliveries,
    // timer wakes); JSON to the schema.
    let files: Vec<PathBuf> = std::fs::read_dir(&traces)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(files.len() <= 160, "{} files kept", files.len());
    let timer_files = files
        .iter()
        .filter(|f| f.to_string_lossy().contains("-timer-seq"))
        .count();
    assert!(timer_files <= 80, "{timer_files} timer files kept");
    let v = schema();
    let json_path = PathBuf::from(named[0]["json"].as_str().unwrap());
    let trace_doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json_path).unwrap()).unwrap();
    let errors = schema_errors(&v, &trace_doc);
    assert!(
        errors.is_empty(),
        "{}:\n{}",
        json_path.display(),
        errors.join("\n")
    );
    assert!(trace_doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["ph"] == "X" && e["name"].as_str().unwrap_or("").starts_with("planted-spin")));
    // `trace show` gives the same verdict again, from the text or the JSON.
    let text_path = named[0]["text"].as_str().unwrap();
    for f in [text_path, json_path.to_str().unwrap()] {
        let show = deploy(dir.path(), None, &["trace", "show", f]);
        assert_eq!(show.status.code(), Some(0), "{}", text(&show.stderr));
        let first = text(&show.stdout).lines().next().unwrap_or("").to_string();
        assert_eq!(first, named[0]["verdict"].as_str().unwrap());
    }
}

#[test]
fn trace_show_refuses_what_is_not_a_saved_trace() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("miss.txt");
    std::fs::write(&bad, "{\"traceEvents\": []}\n").unwrap();
    let out = deploy(dir.path(), None, &["trace", "show", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let e = text(&out.stderr);
    assert!(e.contains("is not a saved rtdeploy trace"), "{e}");
    std::fs::write(
        &bad,
        "# rtdeploy trace v1\n# rtdeploy context {\"seq\": 1}\n",
    )
    .unwrap();
    let out = deploy(dir.path(), None, &["trace", "show", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let e = text(&out.stderr);
    assert!(e.contains("miss.txt:2: bad context"), "{e}");
    let out = deploy(
        dir.path(),
        None,
        &[
            "trace",
            "show",
            dir.path().join("none.txt").to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn trace_on_miss_zero_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = std::fs::read_to_string(repo("examples/dev.yaml"))
        .unwrap()
        .replace(
            "budgets:\n    delivery_max",
            "trace_on_miss: 0\n  budgets:\n    delivery_max",
        );
    let cfg = dir.path().join("robot.yaml");
    std::fs::write(&cfg, yaml).unwrap();
    let out = deploy(dir.path(), Some(&cfg), &["config", "check"]);
    assert_eq!(out.status.code(), Some(2));
    let e = text(&out.stderr) + &text(&out.stdout);
    assert!(e.contains("check.trace_on_miss"), "{e}");
}

#[test]
#[ignore = "needs tracefs: root, tracefs and SCHED_FIFO for the traced check"]
fn trace_compare_runs_untraced_then_traced_and_states_the_cost() {
    require_tracing();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let out = deploy(
        dir.path(),
        Some(&repo("examples/dev.yaml")),
        &[
            "check",
            "--duration",
            "2s",
            "--json",
            "-q",
            "--no-verify",
            &format!("--trace={}", dir.path().join("t").display()),
            "--trace-compare",
        ],
    );
    let code = out.status.code();
    assert!(
        code == Some(0) || code == Some(1),
        "exit {code:?}: {}",
        text(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        doc["trace"]["enabled"], true,
        "tracing did not run: {}",
        doc["trace"]["reason"]
    );
    let names: Vec<&str> = doc["measurements"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "timer cpu1",
            "send",
            "delivery",
            "low-priority delivery",
            "send (traced)",
            "delivery (traced)",
            "low-priority delivery (traced)"
        ]
    );
    // The untraced run decides; the traced one is shown beside it.
    let accounting = doc["accounting"].as_array().unwrap();
    assert_eq!(accounting.len(), 2);
    assert_eq!(accounting[0]["informational"], false);
    assert_eq!(accounting[1]["informational"], true);
    let notes = doc["notes"].as_array().unwrap();
    assert!(
        notes.iter().any(|n| n.as_str().unwrap().starts_with(
            "tracing overhead (doorbell, untraced -> traced in this run): delivery p50 "
        )),
        "{notes:?}"
    );
}

/// The instance directory of a `deploy` process, if it has one.
fn instance_of(pid: u32) -> Option<PathBuf> {
    ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .iter()
        .map(|r| Path::new(r).join(format!("instances/rtdeploy-{pid}")))
        .find(|p| p.is_dir())
}

/// Starts a traced check, waits for its instance to record, signals it.
fn traced_check_signalled(dir: &Path, sig: i32) -> (u32, Option<PathBuf>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_deploy"))
        .arg("--prefix")
        .arg(dir)
        .arg("-c")
        .arg(repo("examples/dev.yaml"))
        .args(["check", "--duration", "30s", "-q", "--no-verify"])
        .arg(format!("--trace={}", dir.join("t").display()))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(20);
    // Recording: the scenario phase has started (the timer phase runs
    // with the instance stopped).
    let on = loop {
        let inst = instance_of(pid);
        let recording = inst.as_ref().is_some_and(|i| {
            std::fs::read_to_string(i.join("tracing_on")).is_ok_and(|s| s.trim() == "1")
        });
        if recording || Instant::now() > deadline {
            break inst;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let rc = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(rc.success());
    let _ = child.wait();
    (pid, on)
}

#[test]
#[ignore = "needs tracefs: root, tracefs and SCHED_FIFO for the traced check"]
fn a_signal_leaves_no_tracing_on_and_the_next_run_removes_what_sigkill_left() {
    require_tracing();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    // SIGTERM: the handler stops recording before the process dies.
    let (pid, inst) = traced_check_signalled(dir.path(), 15);
    let inst = inst.expect("the traced check recorded (an instance of its own)");
    assert!(inst.ends_with(format!("rtdeploy-{pid}")));
    if inst.is_dir() {
        let on = std::fs::read_to_string(inst.join("tracing_on")).unwrap();
        assert_eq!(on.trim(), "0", "tracing left on after SIGTERM");
    }
    // SIGKILL: nothing runs; the instance stays, recording.
    let (pid2, inst2) = traced_check_signalled(dir.path(), 9);
    let inst2 = inst2.expect("an instance");
    assert!(inst2.is_dir(), "{} gone", inst2.display());
    // The next traced run removes both and says so.
    let out = deploy(
        dir.path(),
        Some(&repo("examples/dev.yaml")),
        &[
            "check",
            "--duration",
            "1s",
            "--json",
            "-q",
            "--no-verify",
            &format!("--trace={}", dir.path().join("t").display()),
        ],
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        !inst2.exists(),
        "{} left by SIGKILL not removed",
        inst2.display()
    );
    assert!(!inst.exists(), "{} not removed", inst.display());
    // No worker of the signalled runs outlives them (one started just
    // before its engine died included).
    let mine = dir.path().to_string_lossy().into_owned();
    let until = Instant::now() + Duration::from_secs(5);
    let left = loop {
        let left: Vec<String> = std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok())
            .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
            .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
            .filter(|c| c.contains("__check-worker") && c.contains(&mine))
            .collect();
        if left.is_empty() || Instant::now() > until {
            break left;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(left.is_empty(), "workers left running: {left:?}");
    let notes = doc["notes"].as_array().unwrap();
    assert!(
        notes
            .iter()
            .any(|n| n.as_str().unwrap().contains(&format!("rtdeploy-{pid2}"))),
        "{notes:?}"
    );
}

#[test]
#[ignore = "needs tracefs: root, tracefs and SCHED_FIFO for the traced check"]
fn the_supervisors_boot_check_traces_with_trace_on_miss_and_status_names_why() {
    use services::control::{self, Request};
    require_tracing();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("etc/rtdeploy")).unwrap();
    // A budget no delivery meets: every message is a miss.
    std::fs::write(
        dir.path().join("etc/rtdeploy/robot.yaml"),
        "robot:\n  name: tracebot\nboard:\n  model: generic\n  cpus: 2\ncpus:\n  housekeeping: 0\n  isolated: 1\ncheck:\n  trace_on_miss: 2\n  budgets:\n    delivery_max: 1ns\nboot_check:\n  duration: 1s\n  on_failure: degrade\nprocesses:\n  - name: bg\n    exec: /bin/sleep\n    args: [\"600\"]\n",
    )
    .unwrap();
    let mut sup = supervise(dir.path());
    let sock = control::socket_path(dir.path());
    let until = Instant::now() + Duration::from_secs(30);
    let status = loop {
        let s = control::request(&sock, &Request::Status)
            .ok()
            .and_then(|r| r.status)
            .filter(|s| s.boot_check != "running" && !s.boot_check.is_empty());
        if let Some(s) = s.filter(|s| s.processes.first().is_some_and(|p| p.state == "running")) {
            break Some(s);
        }
        if Instant::now() > until {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = sup.kill();
    let _ = sup.wait();
    let s = status.expect("the supervisor started bg after its boot check");
    eprintln!("boot check: {}", s.boot_check);
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("var/lib/rtdeploy/boot-check.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        report["trace"]["enabled"], true,
        "tracing did not run: {}",
        report["trace"]["reason"]
    );
    let saved = std::fs::read_dir(dir.path().join("var/lib/rtdeploy/traces"))
        .unwrap()
        .count();
    assert!(
        (1..=4).contains(&saved),
        "{saved} files kept for trace_on_miss: 2"
    );
    assert!(
        s.boot_check.starts_with("failed: over budget")
            && s.boot_check.contains("; why: late ")
            && s.boot_check.contains("(trace "),
        "{}",
        s.boot_check
    );
}

#[test]
fn without_permission_the_check_runs_untraced_and_says_why() {
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: geteuid has no preconditions.
    #[allow(unsafe_code)]
    let root = unsafe { libc::geteuid() } == 0;
    // As root, deploy runs as nobody (setpriv, util-linux); as a user, as
    // that user.
    let wrap: &[&str] = if root {
        &[
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ]
    } else {
        &[]
    };
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let cfg = dir.path().join("robot.yaml");
    std::fs::copy(repo("examples/dev.yaml"), &cfg).unwrap();
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (_bin, exe) = common::deploy_anyone_may_run();
    let out = Command::new("timeout")
        .args(["-s", "KILL", "60"])
        .args(wrap)
        .arg(&exe)
        .arg("--prefix")
        .arg(dir.path())
        .arg("-c")
        .arg(&cfg)
        .args([
            "check",
            "--duration",
            "1s",
            "--json",
            "-q",
            "--no-verify",
            "--trace",
        ])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let code = out.status.code();
    assert!(
        code == Some(0) || code == Some(1),
        "exit {code:?}: {}",
        text(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let t = &doc["trace"];
    assert_eq!(t["enabled"], false, "{t}");
    let reason = t["reason"].as_str().unwrap();
    assert!(
        reason.contains("tracing needs root") || reason.contains("cannot mount tracefs"),
        "{reason}"
    );
    assert!(t["verdicts"].as_array().unwrap().is_empty());
}

#[test]
#[ignore = "needs tracefs: root, tracefs and SCHED_FIFO for the traced check"]
fn a_running_process_late_on_its_budget_is_traced_and_status_names_why() {
    use services::control::{self, Request};
    require_tracing();
    let (talker, listener) = common::examples().unwrap_or_else(|why| panic!("{why}"));
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("etc/rtdeploy")).unwrap();
    // The talker on the housekeeping CPU 0 publishes every 500us; the
    // listener waits on CPU 1 at FIFO 80 with a 1ms wakeup budget. The
    // planted thread above it there spins 2ms of every 20ms: messages sent
    // meanwhile are handled up to 2ms late.
    let yaml = [
        "robot:\n  name: tracebot\nboard:\n  model: generic\n  cpus: 2\n".to_string(),
        "cpus:\n  housekeeping: 0\n  isolated: 1\nboot_check:\n  enabled: false\n".into(),
        "check:\n  trace_on_miss: 3\n".into(),
        "channels:\n  - name: /demo/ping\n    max_size: 64\n    rate: 2000\n    retention: 50ms\n"
            .into(),
        "processes:\n".into(),
        format!("  - name: talker\n    exec: {}\n", talker.display()),
        "    args: [--channel, /demo/ping, --period-us, \"500\", --every, \"100000\"]\n".into(),
        "    cpus: 0\n    publishes: [/demo/ping]\n".into(),
        format!("  - name: listener\n    exec: {}\n", listener.display()),
        "    args: [--channel, /demo/ping, --every, \"100000\"]\n".into(),
        "    policy: fifo\n    priority: 80\n    cpus: 1\n    memlock: 64MiB\n".into(),
        "    subscribes: [/demo/ping]\n    budgets: {wakeup: 1ms}\n    after: [talker]\n".into(),
    ]
    .concat();
    std::fs::write(dir.path().join("etc/rtdeploy/robot.yaml"), yaml).unwrap();
    let spinner = Spinner::start(1, 85, Duration::from_millis(2), Duration::from_millis(20));
    let mut sup = supervise(dir.path());
    let sock = control::socket_path(dir.path());
    let until = Instant::now() + Duration::from_secs(30);
    let listener_status = loop {
        let p = control::request(&sock, &Request::Status)
            .ok()
            .and_then(|r| r.status)
            .and_then(|s| s.processes.into_iter().find(|p| p.name == "listener"));
        if p.as_ref().is_some_and(|p| {
            p.last_trace
                .as_deref()
                .is_some_and(|t| t.contains("planted-spin ("))
        }) || Instant::now() > until
        {
            break p;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // An orderly stop: the supervisor's instance goes with it.
    let instance = check::trace::tracefs::instance_dir(Path::new("/sys"))
        .unwrap()
        .with_file_name(format!("rtdeploy-{}", sup.id()));
    let _ = Command::new("kill")
        .args(["-TERM", &sup.id().to_string()])
        .status();
    let stop_until = Instant::now() + Duration::from_secs(20);
    while sup.try_wait().unwrap().is_none() && Instant::now() < stop_until {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = sup.kill();
    let _ = sup.wait();
    spinner
        .finish()
        .expect("the planted thread ran at SCHED_FIFO on its CPU");
    assert!(
        !instance.exists(),
        "{} left after the supervisor stopped",
        instance.display()
    );
    let p = listener_status.expect("the listener ran");
    let why = p.last_trace.unwrap_or_else(|| {
        panic!(
            "no traced miss in the listener's status (budget {}, wakeup max {:?}us)",
            p.budget, p.wakeup_max_us
        )
    });
    eprintln!("listener: why: {why}");
    assert!(why.contains("planted-spin (FIFO 85, pid "), "{why}");
    assert!(
        why.starts_with("late ") && why.contains("(budget 1.00ms)"),
        "{why}"
    );
    // The file it names holds the same verdict for `deploy trace show`.
    let file = why
        .rsplit_once(" (trace ")
        .map(|(_, f)| f.trim_end_matches(')'))
        .expect("a trace file");
    assert!(
        file.starts_with(&*dir.path().join("var/lib/rtdeploy/traces").to_string_lossy()),
        "{file}"
    );
    let show = deploy(dir.path(), None, &["trace", "show", file]);
    assert_eq!(show.status.code(), Some(0), "{}", text(&show.stderr));
    let shown = text(&show.stdout);
    assert_eq!(
        format!("{} (trace {file})", shown.lines().next().unwrap_or("")),
        why
    );
    assert!(shown.contains("from the send to the handler"), "{shown}");
    // At most trace_on_miss of them are kept.
    let saved = std::fs::read_dir(dir.path().join("var/lib/rtdeploy/traces"))
        .unwrap()
        .count();
    assert!(
        (2..=6).contains(&saved),
        "{saved} files kept for trace_on_miss: 3"
    );
}
