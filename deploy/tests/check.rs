//! `deploy check` run for real on this machine (short durations), with
//! examples/dev.yaml: the JSON against docs/check-schema.json, the
//! histogram and SVG files, exit 1 naming an impossible budget, the boot
//! check's report file, and the plain warning when SCHED_FIFO is refused.
//! No timing figure is asserted (the machine is shared and noisy).

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One check at a time: they pin to the same CPUs.
static SERIAL: Mutex<()> = Mutex::new(());

fn repo(p: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(p)
}

/// Fails the test unless this machine has the CPUs dev.yaml names (0
/// and 1).
fn require_two_cpus() {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(
        n >= 2,
        "examples/dev.yaml needs CPUs 0 and 1, this machine has {n}"
    );
}

/// dev.yaml with `edit` applied, written into `dir`.
fn robot_yaml(dir: &Path, edit: impl Fn(String) -> String) -> PathBuf {
    let text = std::fs::read_to_string(repo("examples/dev.yaml")).unwrap();
    let edited = edit(text);
    let p = dir.join("robot.yaml");
    std::fs::write(&p, edited).unwrap();
    p
}

/// How long one `deploy check` of these tests may take (they ask for
/// seconds).
const WATCHDOG: Duration = Duration::from_secs(90);

/// Runs `deploy` under a watchdog. A run still going after [`WATCHDOG`]
/// fails the test with what each of its processes and threads was waiting
/// in (`ps`: state and kernel wait channel) and its stderr so far, then it
/// and everything it started are killed. `timeout -s KILL` (its own
/// process group, which holds deploy's workers) is the outer bound should
/// this process itself be stopped.
fn deploy(prefix: &Path, config: &Path, args: &[&str], wrap: &[&str]) -> Output {
    deploy_from(Path::new(common::DEPLOY), prefix, config, args, wrap)
}

/// [`deploy`] with the binary at `exe`.
fn deploy_from(exe: &Path, prefix: &Path, config: &Path, args: &[&str], wrap: &[&str]) -> Output {
    let mut cmd = Command::new("timeout");
    cmd.args(["-s", "KILL", &(WATCHDOG.as_secs() + 30).to_string()])
        .args(wrap)
        .arg(exe);
    cmd.arg("--prefix")
        .arg(prefix)
        .arg("-c")
        .arg(config)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("run deploy");
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let out_reader = drain(child.stdout.take().map(|r| Box::new(r) as _));
    let err_reader = drain(child.stderr.take().map(|r| Box::new(r) as _));
    let deadline = Instant::now() + WATCHDOG;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for deploy") {
            break status;
        }
        if Instant::now() > deadline {
            // `timeout` leads a process group of its own: deploy and the
            // workers deploy check started.
            let group = child.id().to_string();
            let waits = processes_in_group(&group);
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{group}")])
                .status();
            let _ = child.wait();
            let stderr = err_reader.join().unwrap_or_default();
            panic!(
                "deploy {args:?} still ran after {WATCHDOG:?} and was killed; its processes were waiting in:\n{waits}\nits stderr:\n{}",
                String::from_utf8_lossy(&stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out_reader.join().unwrap_or_default(),
        stderr: err_reader.join().unwrap_or_default(),
    }
}

/// `ps` lines (process, thread, state, kernel wait channel, command) of
/// every thread in process group `group`.
fn processes_in_group(group: &str) -> String {
    let out = Command::new("ps")
        .args([
            "-e",
            "-L",
            "-o",
            "pgid=,pid=,tid=,stat=,wchan:32=,etimes=,args=",
        ])
        .output();
    match out {
        Ok(o) => String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| l.split_whitespace().next() == Some(group))
            .collect::<Vec<_>>()
            .join("\n"),
        Err(e) => format!("(ps: {e})"),
    }
}

fn schema() -> jsonschema::Validator {
    let text = std::fs::read_to_string(repo("docs/check-schema.json")).unwrap();
    let schema: serde_json::Value = serde_json::from_str(&text).unwrap();
    jsonschema::validator_for(&schema).expect("docs/check-schema.json is a valid schema")
}

fn assert_valid(doc: &serde_json::Value) {
    let v = schema();
    let errors: Vec<String> = v
        .iter_errors(doc)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "report does not match docs/check-schema.json:\n{}",
        errors.join("\n")
    );
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}
fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn json_report_matches_the_schema_and_files_follow_their_formats() {
    require_two_cpus();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let cfg = robot_yaml(dir.path(), |t| t);
    let hist = dir.path().join("hist.txt");
    let svg = dir.path().join("plot.svg");
    let out = deploy(
        dir.path(),
        &cfg,
        &[
            "check",
            "--duration",
            "2s",
            "--json",
            "-q",
            "--no-verify",
            "--histogram",
            hist.to_str().unwrap(),
            "--plot",
            svg.to_str().unwrap(),
        ],
        &[],
    );
    let code = out.status.code();
    assert!(
        code == Some(0) || code == Some(1),
        "exit {code:?}: {}",
        stderr(&out)
    );
    let doc: serde_json::Value =
        serde_json::from_str(&stdout(&out)).expect("stdout is one JSON document");
    assert_valid(&doc);
    assert_eq!(
        doc["verdict"],
        if code == Some(0) { "pass" } else { "fail" }
    );
    assert_eq!(doc["scenario"]["mechanisms"][0], "doorbell");
    // The timer worker pinned itself to its isolated CPU.
    let notes = doc["notes"].as_array().unwrap();
    assert!(
        notes
            .iter()
            .all(|n| !n.as_str().unwrap_or("").contains("could not be pinned")),
        "{notes:?}"
    );
    let ms = doc["measurements"].as_array().unwrap();
    let names: Vec<&str> = ms.iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["timer cpu1", "send", "delivery", "low-priority delivery"]
    );
    for m in ms {
        assert!(
            m["count"].as_u64().unwrap() > 0,
            "nothing measured for {}",
            m["name"]
        );
        let total: u64 = m["histogram"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["count"].as_u64().unwrap())
            .sum();
        assert_eq!(
            total,
            m["count"].as_u64().unwrap(),
            "{}: histogram does not add up",
            m["name"]
        );
    }
    // Every message the sender sent was delivered or counted lost.
    let send = &ms[1];
    let del = &ms[2];
    let sent = send["count"].as_u64().unwrap();
    let got = del["count"].as_u64().unwrap() + del["errors"].as_u64().unwrap();
    assert!(
        got <= sent && got + 1 >= sent,
        "sent {sent}, delivered or lost {got}"
    );
    // The channel and control files are gone.
    let shm = dir.path().join("dev/shm/rtdeploy/rtdeploy/check");
    let left: Vec<_> = std::fs::read_dir(&shm)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left behind: {left:?}");

    // cyclictest's histogram file: one count column per measurement.
    let h = std::fs::read_to_string(&hist).unwrap();
    let lines: Vec<&str> = h.lines().collect();
    assert_eq!(lines[0], "# Histogram");
    let data: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| !l.starts_with('#'))
        .collect();
    assert!(data.len() >= 100);
    for (i, l) in data.iter().enumerate() {
        let cols: Vec<&str> = l.split([' ', '\t']).collect();
        assert_eq!(cols.len(), 1 + ms.len(), "line {l:?}");
        assert_eq!(cols[0].parse::<usize>().unwrap(), i);
    }
    for title in [
        "# Total:",
        "# Min Latencies:",
        "# Avg Latencies:",
        "# Max Latencies:",
        "# Histogram Overflows:",
    ] {
        let l = lines
            .iter()
            .find(|l| l.starts_with(title))
            .unwrap_or_else(|| panic!("no {title} line"));
        assert_eq!(l[title.len()..].split_whitespace().count(), ms.len(), "{l}");
    }
    let totals: Vec<u64> = lines.iter().find(|l| l.starts_with("# Total:")).unwrap()[8..]
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    let overflows: Vec<u64> = lines
        .iter()
        .find(|l| l.starts_with("# Histogram Overflows:"))
        .unwrap()[22..]
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    for (i, m) in ms.iter().enumerate() {
        assert_eq!(
            totals[i] + overflows[i],
            m["count"].as_u64().unwrap(),
            "{}",
            m["name"]
        );
    }

    // The picture: one series per measurement, a line per budget, labels.
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
    assert_eq!(s.matches(r#"<path class="series""#).count(), ms.len());
    assert!(s.contains("check.budgets.delivery_max"));
    assert!(s.contains("latency (log scale)") && s.contains("samples per bucket (log scale)"));
}

#[test]
fn an_impossible_budget_fails_the_run_and_is_named() {
    require_two_cpus();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let cfg = robot_yaml(dir.path(), |t| {
        t.replace("delivery_max: 2ms", "delivery_max: 1ns")
    });
    let out = deploy(
        dir.path(),
        &cfg,
        &["check", "--duration", "2s", "-q", "--no-verify"],
        &[],
    );
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}\n{}", stderr(&out));
    let row = text
        .lines()
        .find(|l| l.starts_with("check.budgets.delivery_max"))
        .unwrap_or_else(|| panic!("no budget row:\n{text}"));
    assert!(
        row.contains("1ns") && row.trim_end().ends_with("FAIL"),
        "{row}"
    );
    let verdict = text
        .lines()
        .find(|l| l.starts_with("FAIL: "))
        .unwrap_or_else(|| panic!("no verdict:\n{text}"));
    assert!(verdict.contains("check.budgets.delivery_max"), "{verdict}");
}

#[test]
fn boot_check_writes_its_report_under_the_prefix() {
    require_two_cpus();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let cfg = robot_yaml(dir.path(), |t| {
        t.replace("boot_check:\n  duration: 3s", "boot_check:\n  duration: 1s")
    });
    let out = deploy(
        dir.path(),
        &cfg,
        &["check", "--boot", "-q", "--no-verify"],
        &[],
    );
    let code = out.status.code();
    assert!(
        code == Some(0) || code == Some(1),
        "exit {code:?}: {}",
        stderr(&out)
    );
    let path = dir.path().join("var/lib/rtdeploy/boot-check.json");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("boot-check.json written"))
            .unwrap();
    assert_valid(&doc);
    assert_eq!(doc["scenario"]["mode"], "boot");
    assert_eq!(doc["scenario"]["duration_ns"], 1_000_000_000u64);
    assert_eq!(
        doc["verdict"],
        if code == Some(0) { "pass" } else { "fail" }
    );
}

/// The eight mechanisms in the order `--compare` runs them, with their
/// table labels.
const MECHANISMS: [(&str, &str); 8] = [
    ("doorbell", "doorbell"),
    ("io_uring", "io_uring futex (armed)"),
    ("futex_waitv", "futex_waitv"),
    ("io_uring_shared", "io_uring futex, one word"),
    ("futex", "futex"),
    ("eventfd", "eventfd"),
    ("signalfd", "RT signal + signalfd"),
    ("msg_ring", "io_uring MSG_RING"),
];

/// The measurement `name` of `mech` in a JSON report.
fn measured<'a>(doc: &'a serde_json::Value, name: &str, mech: &str) -> &'a serde_json::Value {
    doc["measurements"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == name && m["mechanism"] == mech)
        .unwrap_or_else(|| panic!("no `{name}` measurement for {mech}"))
}

/// Every message the real-time sender published reached the receiver or
/// is counted lost (the last one may be sent as the receiver stops).
fn assert_delivered(doc: &serde_json::Value, mech: &str) {
    let send = measured(doc, "send", mech);
    let del = measured(doc, "delivery", mech);
    let low = measured(doc, "low-priority delivery", mech);
    let sent = send["count"].as_u64().unwrap();
    let got = del["count"].as_u64().unwrap();
    let lost = del["errors"].as_u64().unwrap();
    assert!(sent > 0, "{mech}: nothing sent");
    assert!(got > 0, "{mech}: nothing delivered");
    assert!(
        got + lost <= sent && got + lost + 1 >= sent,
        "{mech}: sent {sent}, delivered {got}, counted lost {lost}"
    );
    assert!(
        low["count"].as_u64().unwrap() > 0,
        "{mech}: the low-priority subscribers received nothing"
    );
}

/// `deploy check --compare --json` for `duration` (under `wrap`): the
/// report, checked against the schema, and the mechanisms it ran.
fn compare_run(dir: &Path, cfg: &Path, duration: &str, wrap: &[&str]) -> serde_json::Value {
    let out = deploy(
        dir,
        cfg,
        &[
            "check",
            "--compare",
            "--duration",
            duration,
            "--json",
            "-q",
            "--no-verify",
        ],
        wrap,
    );
    let code = out.status.code();
    assert!(
        code == Some(0) || code == Some(1),
        "exit {code:?}: {}",
        stderr(&out)
    );
    let doc: serde_json::Value =
        serde_json::from_str(&stdout(&out)).expect("stdout is one JSON document");
    assert_valid(&doc);
    doc
}

/// The mechanisms a report ran, in order.
fn ran(doc: &serde_json::Value) -> Vec<&str> {
    doc["scenario"]["mechanisms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect()
}

#[test]
fn compare_runs_all_seven_mechanisms_and_delivers_every_message() {
    require_two_cpus();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let cfg = robot_yaml(dir.path(), |t| t);
    let doc = compare_run(dir.path(), &cfg, "3s", &[]);
    let notes: Vec<&str> = doc["notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    let ran = ran(&doc);
    for (mech, label) in MECHANISMS {
        if let Some(why) = notes
            .iter()
            .find(|n| n.starts_with(&format!("{label} not run:")))
        {
            // A kernel without the mechanism (e.g. no pidfd_getfd).
            eprintln!("skipped {mech}: {why}");
            continue;
        }
        assert!(ran.contains(&mech), "{mech} did not run: {notes:?}");
        assert!(
            !notes
                .iter()
                .any(|n| n.starts_with(&format!("{label} failed:"))),
            "{mech} failed: {notes:?}"
        );
        assert_delivered(&doc, mech);
    }
    assert_eq!(ran[0], "doorbell", "the runtime's mechanism decides");
    let shm = dir.path().join("dev/shm/rtdeploy/rtdeploy/check");
    let left: Vec<_> = std::fs::read_dir(&shm)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// On a kernel like JetPack 6's 5.15 (io_uring without futex waits, no
/// futex_waitv: the test profile makes this kernel look so), the check
/// runs the runtime's own backend there, the doorbell, first, and says
/// why the two others cannot run.
#[test]
fn compare_on_a_jetpack_kernel_runs_the_doorbell_first() {
    require_two_cpus();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let cfg = robot_yaml(dir.path(), |t| t);
    let jetpack6 = format!("{}=jetpack6", units::env::TEST_KERNEL_PROFILE);
    let doc = compare_run(dir.path(), &cfg, "2s", &["env", &jetpack6]);
    let ran = ran(&doc);
    assert_eq!(ran[0], "doorbell", "the runtime's backend here decides");
    assert!(
        !ran.contains(&"io_uring") && !ran.contains(&"futex_waitv"),
        "{ran:?}"
    );
    let notes = doc["notes"].to_string();
    for label in ["io_uring futex (armed) not run:", "futex_waitv not run:"] {
        assert!(notes.contains(label), "{label} missing from {notes}");
    }
    assert_eq!(
        doc["host"]["kernel_capabilities"]["wake_backend"],
        "doorbell"
    );
    assert_eq!(doc["host"]["kernel_capabilities"]["found_by"], "probe");
    assert_delivered(&doc, "doorbell");

    // The boot check runs the doorbell there too, rather than failing for
    // want of io_uring.
    let out = deploy(
        dir.path(),
        &cfg,
        &["check", "--boot", "--duration", "1s", "-q", "--no-verify"],
        &["env", &jetpack6],
    );
    let code = out.status.code();
    assert!(
        code == Some(0) || code == Some(1),
        "exit {code:?}: {}",
        stderr(&out)
    );
    let path = dir.path().join("var/lib/rtdeploy/boot-check.json");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("boot-check.json written"))
            .unwrap();
    assert_eq!(
        doc["scenario"]["mechanisms"],
        serde_json::json!(["doorbell"])
    );
    assert_delivered(&doc, "doorbell");
}

#[test]
fn eventfd_signalfd_and_msg_ring_run_alone_and_decide() {
    require_two_cpus();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let cfg = robot_yaml(dir.path(), |t| t);
    for mech in ["eventfd", "signalfd", "msg_ring"] {
        let out = deploy(
            dir.path(),
            &cfg,
            &[
                "check",
                "--mechanism",
                mech,
                "--duration",
                "1s",
                "--json",
                "-q",
                "--no-verify",
            ],
            &[],
        );
        let code = out.status.code();
        if code == Some(2) && stderr(&out).contains("cannot run here") {
            eprintln!("skipped {mech}: {}", stderr(&out));
            continue;
        }
        assert!(
            code == Some(0) || code == Some(1),
            "{mech}: exit {code:?}: {}",
            stderr(&out)
        );
        let doc: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
        assert_valid(&doc);
        assert_eq!(doc["scenario"]["mechanisms"], serde_json::json!([mech]));
        assert_delivered(&doc, mech);
        // Its budgets decide the verdict.
        let deciding: Vec<&serde_json::Value> = doc["budgets"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|b| b["mechanism"] == mech)
            .collect();
        assert!(!deciding.is_empty());
        assert!(deciding.iter().all(|b| b["informational"] == false));
    }
}

/// Whether we are root (then the unprivileged run needs setpriv).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

#[test]
fn without_sched_fifo_the_report_says_the_figures_are_not_real_time() {
    require_two_cpus();
    // No RLIMIT_RTPRIO (whatever this user's limits.conf gives), and as
    // root, nobody without capabilities: SCHED_FIFO is refused.
    let wrap: &[&str] = if is_root() {
        &[
            "prlimit",
            "--rtprio=0:0",
            "--",
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ]
    } else {
        &["prlimit", "--rtprio=0:0", "--"]
    };
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (_bin, exe) = common::deploy_anyone_may_run();
    let dir = tempfile::tempdir().unwrap();
    let cfg = robot_yaml(dir.path(), |t| t);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = deploy_from(
        &exe,
        dir.path(),
        &cfg,
        &["check", "--duration", "1s", "--json", "-q", "--no-verify"],
        wrap,
    );
    let code = out.status.code();
    assert!(
        code == Some(0) || code == Some(1),
        "exit {code:?}: {}",
        stderr(&out)
    );
    let doc: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_valid(&doc);
    assert_eq!(doc["realtime"]["sched_fifo"], false, "{doc:#}");
    let warning = doc["realtime"]["warning"]
        .as_str()
        .expect("a warning when SCHED_FIFO was refused");
    assert!(warning.contains("NOT real-time figures"), "{warning}");
    // And the human report says it too.
    let out = deploy_from(
        &exe,
        dir.path(),
        &cfg,
        &["check", "--duration", "400ms", "-q", "--no-verify"],
        wrap,
    );
    assert!(
        stdout(&out).contains("WARNING: SCHED_FIFO was refused"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn bad_arguments_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = robot_yaml(dir.path(), |t| t);
    for args in [
        &["check", "--mechanism", "carrier-pigeon"][..],
        &["check", "--duration", "0s"][..],
        &["check", "--compare", "--boot"][..],
    ] {
        let out = deploy(dir.path(), &cfg, args, &[]);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
    }
    // A missing robot.yaml is an error, not a failed budget.
    let out = deploy(
        dir.path(),
        &dir.path().join("nope.yaml"),
        &["check", "--duration", "1s"],
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
}

/// Another process of the group scribbles the waiter counts of the check's
/// channel to zero, over and over, while `deploy check --mechanism
/// io_uring` runs: publishers then skip their wakes. It zeroes the counts
/// of live publishers per wake class too, so that the receivers do not look
/// for the other class's messages either: only the loop's wake check is
/// left to find what no wake announced. Returns the run's JSON report.
fn check_with_waiters_scribbled(wake_check: Option<&str>) -> serde_json::Value {
    use std::os::unix::fs::FileExt;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let cfg = robot_yaml(dir.path(), |t| t);
    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(AtomicU64::new(0));
    let shm = dir.path().join("dev/shm/rtdeploy/rtdeploy/check");
    let scribbler = {
        let (stop, writes) = (stop.clone(), writes.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let files = std::fs::read_dir(&shm)
                    .map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>())
                    .unwrap_or_default();
                for f in files.iter().filter(|f| {
                    f.extension().is_some_and(|e| {
                        e == format!("v{}", controller::channel::LAYOUT_VERSION).as_str()
                    })
                }) {
                    if let Ok(file) = std::fs::OpenOptions::new().write(true).open(f) {
                        // The waiter counts, best-effort at 320 bytes into
                        // the header, real-time at 384; the publishers per
                        // class at 448 and 456.
                        for _ in 0..1000 {
                            for at in [320, 384, 448, 456] {
                                if file.write_all_at(&0u64.to_le_bytes(), at).is_ok() {
                                    writes.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }
                    }
                }
                std::thread::yield_now();
            }
        })
    };
    let env_arg = wake_check.map(|v| format!("{}={v}", units::env::WAKE_CHECK));
    let wrap: Vec<&str> = match &env_arg {
        Some(a) => vec!["env", a.as_str()],
        None => vec![],
    };
    let out = deploy(
        dir.path(),
        &cfg,
        // Not quiet: should it hang, the progress on stderr says where.
        &[
            "check",
            "--duration",
            "2s",
            "--mechanism",
            "io_uring",
            "--json",
            "--no-verify",
        ],
        &wrap,
    );
    stop.store(true, Ordering::SeqCst);
    scribbler.join().unwrap();
    assert!(
        writes.load(Ordering::Relaxed) > 0,
        "the scribbler never found the channel"
    );
    let code = out.status.code();
    assert!(
        code == Some(0) || code == Some(1),
        "exit {code:?}: {}",
        stderr(&out)
    );
    let doc: serde_json::Value =
        serde_json::from_str(&stdout(&out)).expect("stdout is one JSON document");
    assert_valid(&doc);
    doc
}

#[test]
fn lost_wakeups_heal_and_every_message_is_accounted_for() {
    require_two_cpus();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let doc = check_with_waiters_scribbled(None);
    let a = &doc["accounting"][0];
    assert_eq!(a["mechanism"], "io_uring", "{a}");
    assert_eq!(a["receiver_reached_end"], true, "{a}");
    assert_eq!(a["unaccounted"], 0, "{a}");
    assert!(a["sent"].as_u64().unwrap() > 0, "{a}");
    // The wakes the scribbler made publishers skip: the loop's own look
    // found those messages, and says how many.
    assert!(a["found_without_wake"].as_u64().unwrap() > 0, "{a}");
    assert!(
        !doc["failed"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f.as_str().unwrap().starts_with("delivery accounting")),
        "{doc}"
    );
}

#[test]
fn messages_whose_wakes_were_lost_fail_the_check_by_name() {
    require_two_cpus();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Without the loop's own look at the index, a lost wake is a message
    // the receiver never sees: the run must not pass.
    let doc = check_with_waiters_scribbled(Some("0"));
    let a = &doc["accounting"][0];
    assert_eq!(a["mechanism"], "io_uring", "{a}");
    let unaccounted = a["unaccounted"].as_u64().unwrap();
    assert!(unaccounted > 0, "{a}");
    // The receiver stopped at the first lost wake: what it did not see is
    // exactly what was sent and not delivered.
    assert_eq!(a["receiver_reached_end"], false, "{a}");
    assert_eq!(
        a["delivered"].as_u64().unwrap() + unaccounted,
        a["sent"].as_u64().unwrap(),
        "{a}"
    );
    assert!(!a["missing"].as_str().unwrap().is_empty(), "{a}");
    assert_eq!(doc["verdict"], "fail");
    assert!(
        doc["failed"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f == "delivery accounting (io_uring)"),
        "{doc}"
    );
}

/// `--log-compare`: the scenario without, then with the supervisor's
/// logger recording the check's channel; the logged phase is shown beside
/// the deciding one, and the notes state the logger's cost and what it
/// recorded.
#[test]
fn log_compare_runs_without_then_with_the_logger_and_states_the_cost() {
    require_two_cpus();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let out = deploy(
        dir.path(),
        &repo("examples/dev.yaml"),
        &[
            "--json",
            "-q",
            "check",
            "--duration",
            "2s",
            "--no-verify",
            "--log-compare",
        ],
        &[],
    );
    let code = out.status.code();
    assert!(
        code == Some(0) || code == Some(1),
        "exit {code:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_valid(&doc);
    let names: Vec<&str> = doc["measurements"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    for want in ["delivery", "send", "delivery (logged)", "send (logged)"] {
        assert!(names.contains(&want), "{want} in {names:?}");
    }
    let accounting = doc["accounting"].as_array().unwrap();
    assert_eq!(accounting.len(), 2);
    assert_eq!(accounting[1]["informational"], true);
    let notes: Vec<&str> = doc["notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert!(
        notes.iter().any(|n| n.starts_with("logger overhead (")
            && n.contains("not logged -> logged")
            && n.contains("p99.9")),
        "{notes:?}"
    );
    let logger = notes
        .iter()
        .find(|n| n.starts_with("logger: "))
        .unwrap_or_else(|| panic!("{notes:?}"));
    let logged: u64 = logger["logger: ".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(logged > 0, "{logger}");
    assert!(
        logger.contains("bytes/message") && logger.contains("per 100k messages"),
        "{logger}"
    );
    // The logger's files went with the run.
    let left: Vec<_> = std::fs::read_dir(dir.path().join("var/log/rtdeploy"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
}

/// `--rounds`: the mechanisms in interleaved rounds, the reference again
/// in every round (A/A), and the harness's ratios and publish-cost
/// difference in the report, every message of every run accounted for.
#[test]
fn rounds_interleave_the_mechanisms_and_report_ratios_with_their_floor() {
    require_two_cpus();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let cfg = robot_yaml(dir.path(), |t| t);
    let out = deploy(
        dir.path(),
        &cfg,
        &[
            "check",
            "--mechanisms",
            "doorbell,io_uring_shared",
            "--rounds",
            "2",
            "--duration",
            "4s",
            "--json",
            "-q",
            "--no-verify",
        ],
        &[],
    );
    let code = out.status.code();
    assert!(
        code == Some(0) || code == Some(1),
        "exit {code:?}: {}",
        stderr(&out)
    );
    let doc: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_valid(&doc);
    assert_eq!(ran(&doc), ["doorbell", "io_uring_shared"]);
    let runs: Vec<(String, Option<String>)> = doc["accounting"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            assert_eq!(a["unaccounted"], 0, "{a}");
            (
                a["mechanism"].as_str().unwrap().to_string(),
                a["run"].as_str().map(String::from),
            )
        })
        .collect();
    assert_eq!(
        runs,
        [
            ("doorbell".into(), None),
            ("io_uring_shared".into(), None),
            ("io_uring_shared".into(), Some("A/A".into()))
        ]
    );
    let r = &doc["ratios"][0];
    assert_eq!(
        (
            r["figure"].as_str(),
            r["numerator"].as_str(),
            r["denominator"].as_str()
        ),
        (
            Some("delivery p50"),
            Some("doorbell"),
            Some("io_uring_shared")
        )
    );
    assert_eq!(r["per_round"].as_array().unwrap().len(), 2, "{r}");
    assert!(r["aa"]["median"].as_f64().unwrap() > 0.0, "{r}");
    let d = &doc["differences"][0];
    assert_eq!(d["numerator"], "real-time");
    assert_eq!(d["denominator"], "best-effort");
    assert_eq!(d["per_round"].as_array().unwrap().len(), 2, "{d}");

    // Rounds need something to compare.
    let out = deploy(dir.path(), &cfg, &["check", "--rounds", "3", "-q"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("--rounds 3 needs mechanisms to compare"),
        "{}",
        stderr(&out)
    );
}

/// The census on this machine, for each of the runtime's backends: a
/// SCHED_FIFO talker and listener (the check's real-time pair) and
/// best-effort talkers and listeners (its low-priority processes) on one
/// channel, with two best-effort threads hammering the best-effort word.
/// Every futex system call of the robot's tasks is seen through tracefs
/// syscall events and its word keyed by file and offset: no word is
/// touched by a real-time and a best-effort thread both, while the
/// one-word reference, in the same run, shows its shared word (the census
/// finds what there is), and the positive control's PI boosts are
/// counted. Every real-time message reaches the real-time listener.
/// (io_uring arms are in no syscall event: the QEMU guest's kprobe on
/// futex_hash shows them.)
#[test]
#[ignore = "needs root: tracefs syscall events for the census"]
fn the_census_finds_no_word_shared_across_classes_on_any_backend() {
    require_two_cpus();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let cfg = robot_yaml(dir.path(), |t| t);
    let out = deploy(
        dir.path(),
        &cfg,
        &[
            "check",
            "--census",
            "--hammer",
            "2",
            "--mechanisms",
            "doorbell,io_uring,futex_waitv,io_uring_shared",
            "--duration",
            "4s",
            "--json",
            "-q",
            "--no-verify",
        ],
        &[],
    );
    let code = out.status.code();
    assert!(
        code == Some(0) || code == Some(1),
        "exit {code:?}: {}",
        stderr(&out)
    );
    let doc: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_valid(&doc);
    let c = &doc["census"];
    assert_eq!(c["enabled"], true, "{c}");
    assert_eq!(c["events_lost"], 0, "the census must see every event: {c}");
    let phase = |label: &str| -> &serde_json::Value {
        c["phases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["label"] == label)
            .unwrap_or_else(|| panic!("no census phase {label}: {c}"))
    };
    let control = phase("positive control: PI futex");
    assert!(
        control["counted_waits"].as_u64().unwrap() > 0,
        "the census missed the PI boosts of its positive control: {control}"
    );
    let shared = |p: &serde_json::Value| -> Vec<String> {
        p["words"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|w| {
                !w["real_time"].as_array().unwrap().is_empty()
                    && !w["best_effort"].as_array().unwrap().is_empty()
            })
            .map(|w| format!("{}+{}", w["file"], w["offset"]))
            .collect()
    };
    for mech in ["doorbell", "io_uring", "futex_waitv"] {
        let p = phase(mech);
        assert!(
            shared(p).is_empty(),
            "{mech}: words shared across classes: {p}"
        );
        assert_eq!(p["shared_words"], 0, "{mech}: {p}");
        assert_eq!(p["counted_waits"], 0, "{mech}: {p}");
        // Not vacuous: the real-time pair's own words were seen.
        let rt_words = p["words"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|w| !w["real_time"].as_array().unwrap().is_empty())
            .count();
        assert!(
            rt_words > 0,
            "{mech}: no word of the real-time pair seen: {p}"
        );
    }
    let reference = phase("io_uring_shared");
    let words = shared(reference);
    assert!(
        words.iter().any(
            |w| w.contains(&format!(".v{}", controller::channel::LAYOUT_VERSION))
                && w.ends_with("+256")
        ),
        "the reference's queue index, woken by both classes, was not found: {reference}"
    );
    for a in doc["accounting"].as_array().unwrap() {
        assert_eq!(a["unaccounted"], 0, "{a}");
        assert_eq!(a["receiver_reached_end"], true, "{a}");
    }
}
