//! `deploy sim`: the robot.yaml processes, the real example binaries, on
//! one virtual clock under the coordinator, as whoever runs the tests.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::DEPLOY;

/// Run by `a_turn_that_never_ends_is_killed_and_the_process_and_time_named`
/// under `deploy sim`: a loop whose timer handler, at 1.5 s of virtual
/// time, never returns. On its own (`--include-ignored`) it does nothing.
#[test]
#[ignore = "helper process: run by a_turn_that_never_ends_is_killed_and_the_process_and_time_named"]
fn hanging_helper() {
    if std::env::var(units::env::SIM).is_err() {
        return;
    }
    let opts = controller::event_loop::LoopOptions::from_env();
    let mut lp = controller::event_loop::EventLoop::new(opts).unwrap();
    let start = lp.now();
    lp.add_timer("hang", start + Duration::from_millis(500), None, |_| loop {
        std::thread::sleep(Duration::from_secs(1));
    });
    lp.run().unwrap();
}

fn sim(yaml: &Path, args: &[&str]) -> Output {
    Command::new("timeout")
        .args(["-s", "KILL", "120", DEPLOY, "-c"])
        .arg(yaml)
        .arg("sim")
        .args(args)
        .output()
        .unwrap()
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

fn yaml_of(prefix: &Path) -> std::path::PathBuf {
    prefix.join("etc/rtdeploy/robot.yaml")
}

#[test]
fn the_robot_runs_on_a_virtual_clock_and_the_same_seed_gives_the_same_run() {
    let robot = common::robot_with_examples("");
    let yaml = yaml_of(robot.path());
    let run = |seed: &str, keep: &Path| {
        let o = sim(
            &yaml,
            &[
                "--json",
                "--for",
                "5s",
                "--seed",
                seed,
                "--keep",
                keep.to_str().unwrap(),
            ],
        );
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let mut v = json(&o);
        let listener = std::fs::read_to_string(keep.join("out/listener.out")).unwrap();
        // What a wall clock or a directory decides, and nothing else.
        v.as_object_mut().unwrap().remove("wall_seconds");
        v.as_object_mut().unwrap().remove("dir");
        for p in v["processes"].as_array_mut().unwrap() {
            // CPU time is measured, not simulated.
            p.as_object_mut().unwrap().remove("output");
            p.as_object_mut().unwrap().remove("cpu_ns");
        }
        (v, listener)
    };
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let (a, la) = run("7", dirs[0].path());
    let (b, lb) = run("7", dirs[1].path());
    let (c, _) = run("8", dirs[2].path());
    assert_eq!(a, b, "the same seed, the same run");
    assert_eq!(la, lb);

    // Five seconds of a 1 kHz talker (its first deadline one period after
    // the start, its last at 6 s): 5000 messages, every
    // message received in order with no latency, both processes stopped
    // at the end and exiting 0.
    assert_eq!(a["start_ns"], 1_000_000_000u64);
    assert_eq!(a["end_ns"], 6_000_000_000u64);
    assert_eq!(a["failure"], serde_json::Value::Null);
    assert_eq!(a["idle"], false);
    let procs = a["processes"].as_array().unwrap();
    for p in procs {
        assert_eq!(p["state"], "running", "{p}");
        assert_eq!(p["exit"], "exit status: 0", "{p}");
    }
    // The talker's 5000 messages and its 5 timing reports (one a second).
    let talker = &procs[0];
    assert_eq!(talker["name"], "talker");
    let sent = talker["published"].as_u64().unwrap();
    assert_eq!(sent, 5005, "{talker}");
    assert!(
        la.contains(
            "listener: the loop ended after 5000 messages on /demo/ping (last seq 4999, lost 0)"
        ),
        "{la}"
    );
    // Another seed orders the turns due together differently (here the
    // turns each process took differ) and changes no message.
    let counts = |v: &serde_json::Value| -> Vec<(serde_json::Value, serde_json::Value)> {
        v["processes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p["published"].clone(), p["exit"].clone()))
            .collect()
    };
    assert_eq!(counts(&a), counts(&c));
    assert_ne!(a["processes"], c["processes"]);
    assert_eq!(a["instants"], c["instants"]);
}

#[test]
fn a_process_that_does_not_run_our_loop_is_refused_or_left_out_as_asked() {
    let extra = "  - name: plain\n    exec: /bin/sleep\n    args: [\"60\"]\n  - name: quitter\n    exec: /bin/true\n";
    let robot = common::robot_with_examples(extra);
    let yaml = yaml_of(robot.path());
    let o = sim(&yaml, &["--for", "1s", "--hello-timeout", "3s"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    for want in [
        "plain, quitter cannot be simulated",
        "plain: no hello within 3s of wall time",
        "quitter: it closed the simulation's link (or exited) without connecting",
        "--unsimulated leave-out",
    ] {
        assert!(err.contains(want), "{want}: {err}");
    }

    let o = sim(
        &yaml,
        &[
            "--json",
            "--for",
            "1s",
            "--hello-timeout",
            "3s",
            "--unsimulated",
            "leave-out",
        ],
    );
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v = json(&o);
    let states: Vec<(&str, &str)> = v["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["name"].as_str().unwrap(), p["state"].as_str().unwrap()))
        .collect();
    assert_eq!(
        states,
        [
            ("talker", "running"),
            ("listener", "running"),
            ("plain", "not simulated"),
            ("quitter", "not simulated")
        ]
    );

    let o = sim(
        &yaml,
        &[
            "--json",
            "--for",
            "1s",
            "--leave-out",
            "plain",
            "--leave-out",
            "quitter",
        ],
    );
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v = json(&o);
    assert_eq!(v["processes"][2]["state"], "left out");
    assert_eq!(
        v["processes"][2]["exit"],
        serde_json::Value::Null,
        "never started"
    );

    let o = sim(&yaml, &["--leave-out", "nobody"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr)
        .contains("--leave-out nobody: robot.yaml has no such process"));
}

#[test]
fn a_turn_that_never_ends_is_killed_and_the_process_and_time_named() {
    let exe = std::env::current_exe().unwrap();
    let extra = format!(
        "  - name: stuck\n    exec: {}\n    args: [--exact, hanging_helper, --ignored, --nocapture, --test-threads=1]\n",
        exe.display()
    );
    let robot = common::robot_with_examples(&extra);
    let yaml = yaml_of(robot.path());
    let o = sim(&yaml, &["--json", "--for", "5s", "--turn-timeout", "3s"]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v = json(&o);
    let failure = v["failure"].as_str().unwrap();
    assert!(
        failure.starts_with("stuck: its turn at virtual time 1.500000000 did not end within 3s of wall time (a handler that never returns?): killed"),
        "{failure}"
    );
    assert_eq!(v["end_ns"], 1_500_000_000u64);
    let stuck = &v["processes"][2];
    assert_eq!(stuck["state"], "failed");
    assert!(
        stuck["exit"].as_str().unwrap().contains("signal: 9"),
        "{stuck}"
    );
    // The others were stopped and exited as told.
    for p in &v["processes"].as_array().unwrap()[..2] {
        assert_eq!(p["state"], "running", "{p}");
        assert_eq!(p["exit"], "exit status: 0", "{p}");
    }
}

#[test]
fn the_log_of_a_simulated_run_is_the_same_bytes_for_the_same_seed() {
    let robot = common::robot_with_examples("");
    let yaml = yaml_of(robot.path());
    let dir = tempfile::tempdir().unwrap();
    let log = |name: &str| {
        let path = dir.path().join(name);
        let o = sim(
            &yaml,
            &[
                "-q",
                "--for",
                "3s",
                "--seed",
                "5",
                "--log",
                path.to_str().unwrap(),
            ],
        );
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            out.contains(
                "3006 messages on 3 channels, 0 lost, 2 events; log times are virtual times"
            ),
            "{out}"
        );
        path
    };
    let (a, b) = (log("a.mcap"), log("b.mcap"));
    assert!(
        std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(),
        "two runs with one seed wrote different bytes"
    );

    // Our reader: the talker's 3000 messages at their virtual times (log
    // time = virtual time: the clock mapping is fixed at 0), the timing
    // reports, the start events.
    let deploy = |args: &[&str]| -> serde_json::Value {
        let o = Command::new(DEPLOY).args(args).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let info = deploy(&["log", "info", "--json", a.to_str().unwrap()]);
    let ping = info["file"]["channels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["topic"] == "/demo/ping")
        .unwrap()
        .clone();
    assert_eq!(ping["messages"], 3000);
    assert_eq!(ping["first_log_time"], 1_001_000_000u64);
    assert_eq!(ping["last_log_time"], 4_000_000_000u64);
    // Pids are the processes' places in robot.yaml (talker 1, listener
    // 2), in the senders records and in the timing reports.
    let cat = deploy(&[
        "log",
        "cat",
        "--json",
        a.to_str().unwrap(),
        "--channels",
        "/rtdeploy/*",
    ]);
    let mut pids = std::collections::BTreeSet::new();
    for m in cat["messages"].as_array().unwrap() {
        let v = &m["value"];
        match m["channel"].as_str().unwrap() {
            "/rtdeploy/log/senders" => {
                pids.insert((
                    v["channel"].as_str().unwrap().to_string(),
                    v["pid"].as_u64().unwrap(),
                ));
            }
            "/rtdeploy/timing/talker" => assert_eq!(v["pid"], 1, "{v}"),
            "/rtdeploy/timing/listener" => assert_eq!(v["pid"], 2, "{v}"),
            "/rtdeploy/events" => {
                assert_eq!(v["kind"], "start");
                assert_eq!(v["monotonic_ns"], 1_000_000_000u64);
            }
            other => panic!("unexpected channel {other}"),
        }
    }
    assert_eq!(
        pids.into_iter().collect::<Vec<_>>(),
        [
            ("/demo/ping".to_string(), 1),
            ("/rtdeploy/timing/listener".to_string(), 2),
            ("/rtdeploy/timing/talker".to_string(), 1),
        ]
    );

    // An existing file is never overwritten.
    let o = sim(&yaml, &["--for", "1s", "--log", a.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot create the log"));
}

/// The example message's fields, so that the logs decode it.
const CHATTER_TYPE: &str = "log:
  types:
    /demo/ping:
      name: demo/Chatter
      fields: [uint64 seq, uint64 deadline_ns]
";

#[test]
fn log_diff_names_the_first_message_and_field_where_two_runs_differ() {
    let robot = common::robot_with_examples(CHATTER_TYPE);
    let yaml = yaml_of(robot.path());
    let dir = tempfile::tempdir().unwrap();
    let log = |yaml: &Path, name: &str, d: &str| {
        let path = dir.path().join(name);
        let o = sim(yaml, &["-q", "--for", d, "--log", path.to_str().unwrap()]);
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        path.to_str().unwrap().to_string()
    };
    let diff = |a: &str, b: &str, extra: &[&str]| -> Output {
        Command::new(DEPLOY)
            .args(["log", "diff", a, b])
            .args(extra)
            .output()
            .unwrap()
    };
    let a = log(&yaml, "a.mcap", "3s");
    let b = log(&yaml, "b.mcap", "3s");
    let o = diff(&a, &b, &[]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}");
    for want in [
        "compared 3000 messages on 1 channel (/demo/ping: 3000)",
        "left out: /rtdeploy/timing/* (timing reports",
        "left out: /rtdeploy/events",
        "the logs are the same on the channels compared",
    ] {
        assert!(out.contains(want), "{want}: {out}");
    }
    // The same seed: the timing reports are the same too, when asked for.
    let o = diff(&a, &b, &["--channels", "/rtdeploy/timing/*"]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );

    // A shorter run: B lacks the messages after its end.
    let c = log(&yaml, "c.mcap", "2s");
    let o = diff(&a, &c, &[]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("first difference: /demo/ping message 2000 (log time 3.001000000 in A, - in B): missing in B"),
        "{out}"
    );

    // A talker with another period (phased loops keep to multiples of
    // their period: 1.001 s is one of both): the second message's deadline
    // is the first to differ.
    let text = std::fs::read_to_string(&yaml).unwrap();
    let slower = text.replace("--period-us, \"1000\"", "--period-us, \"1001\"");
    assert_ne!(text, slower);
    let yaml2 = dir.path().join("slower.yaml");
    std::fs::write(&yaml2, slower).unwrap();
    let d = log(&yaml2, "d.mcap", "3s");
    let o = diff(&a, &d, &["--json"]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let first = &v["diff"]["first"];
    assert_eq!(first["channel"], "/demo/ping");
    assert_eq!(first["message"], 1);
    assert_eq!(first["what"], "field deadline_ns");
    assert_eq!(first["a"], 1_002_000_000u64);
    assert_eq!(first["b"], 1_002_001_000u64);

    // Garbage is an error (exit 2), not a difference.
    let junk = dir.path().join("junk.mcap");
    std::fs::write(&junk, b"not a log").unwrap();
    let o = diff(&a, junk.to_str().unwrap(), &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("junk.mcap"));
}

/// The text of a robot whose listener publishes a summary of what it
/// received every `summary_every` messages on /demo/summary (its further
/// arguments `listener_extra`), the talker every `period_us`; with the
/// types of both channels, so that logs decode them. The talker starts
/// once the listener reports, so that the listener sees every message.
fn summarising_yaml(summary_every: u32, period_us: u32, listener_extra: &str) -> String {
    let (talker, listener) = common::examples().unwrap_or_else(|why| panic!("{why}"));
    format!(
        "robot:
  name: summary
board:
  model: generic
  cpus: 2
cpus:
  housekeeping: 0
  isolated: 1
boot_check:
  enabled: false
channels:
  - name: /demo/ping
    max_size: 64
    rate: 1000
    retention: 1s
  - name: /demo/summary
    max_size: 64
    rate: 10
    retention: 10s
processes:
  - name: talker
    exec: {}
    args: [--channel, /demo/ping, --period-us, \"{period_us}\", --every, \"100000\"]
    publishes: [/demo/ping]
    after: [listener]
  - name: listener
    exec: {}
    args: [--channel, /demo/ping, --every, \"100000\", --summary, /demo/summary, --summary-every, \"{summary_every}\"{listener_extra}]
    subscribes: [/demo/ping]
    publishes: [/demo/summary]
{CHATTER_TYPE}    /demo/summary:
      name: demo/Summary
      fields: [uint64 count, uint64 seq_sum, uint64 last_seq, uint64 deadline_xor]
",
        talker.display(),
        listener.display()
    )
}

/// [`summarising_yaml`] written in `dir`.
fn summarising_robot(dir: &Path, summary_every: u32) -> std::path::PathBuf {
    let path = dir.join(format!("robot-{summary_every}.yaml"));
    std::fs::write(&path, summarising_yaml(summary_every, 1000, "")).unwrap();
    path
}

#[test]
fn a_recorded_run_replayed_through_the_listener_gives_the_same_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = summarising_robot(dir.path(), 100);
    let path = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    let run = |yaml: &Path, args: &[&str]| {
        let o = sim(yaml, args);
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let diff = |a: &str, b: &str| {
        Command::new(DEPLOY)
            .args(["log", "diff", a, b])
            .output()
            .unwrap()
    };
    // The recording: 2000 messages from the talker, 20 summaries.
    let (a, b, c) = (path("a.mcap"), path("b.mcap"), path("c.mcap"));
    run(&yaml, &["-q", "--for", "2s", "--log", &a]);

    // The talker's channel is replayed from the log while the talker is
    // left out; the listener's summaries are published anew, the log's
    // copies go to /original/demo/summary.
    let out = run(
        &yaml,
        &[
            "-q",
            "--for",
            "2s",
            "--leave-out",
            "talker",
            "--replay",
            &a,
            "--remap",
            "/demo/summary",
            "--log",
            &b,
        ],
    );
    assert!(
        out.contains("replayed: 2020 messages (/demo/ping: 2000, /demo/summary: 20)"),
        "{out}"
    );
    // The listener, given the recorded input, said what it said then, at
    // the same virtual times.
    let o = diff(&a, &b);
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{text}");
    assert!(
        text.contains("compared 2020 messages on 2 channels (/demo/ping: 2000, /demo/summary: 20)"),
        "{text}"
    );
    let info = Command::new(DEPLOY)
        .args(["log", "info", "--json", &b])
        .output()
        .unwrap();
    let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    let count = |topic: &str| {
        info["file"]["channels"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["topic"] == topic)
            .map(|c| c["messages"].clone())
    };
    assert_eq!(count("/original/demo/summary"), Some(serde_json::json!(20)));
    assert_eq!(count("/demo/summary"), Some(serde_json::json!(20)));

    // A listener that summarises every 99 messages instead (a changed
    // controller): the first summary it publishes differs, by field.
    let changed = summarising_robot(dir.path(), 99);
    run(
        &changed,
        &[
            "-q",
            "--for",
            "2s",
            "--leave-out",
            "talker",
            "--replay",
            &a,
            "--remap",
            "/demo/summary",
            "--log",
            &c,
        ],
    );
    let o = diff(&a, &c);
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{text}");
    assert!(
        text.contains("first difference: /demo/summary message 0 (log time 1.100000000 in A, 1.099000000 in B): field count: 100 in A, 99 in B"),
        "{text}"
    );

    // Replaying a channel a simulated process also publishes is refused,
    // naming both and the ways out; so is a --remap that matches nothing.
    let o = sim(&yaml, &["--for", "1s", "--replay", &a]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("channel /demo/ping is both replayed from the log and published by process talker: --remap /demo/ping (the log's copy goes to /original/demo/ping) or --leave-out talker"),
        "{err}"
    );
    let o = sim(&yaml, &["--for", "1s", "--replay", &a, "--remap", "/nope"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr)
        .contains("--remap /nope: no channel of robot.yaml matches"));
}

#[test]
fn a_supervised_run_replayed_through_the_listener_in_simulation_gives_its_output_again() {
    // The real run: talker and listener under the supervisor, its logger
    // recording /demo/ping and the listener's summaries.
    let prefix = tempfile::tempdir().unwrap();
    let p = prefix.path();
    std::fs::create_dir_all(p.join("etc/rtdeploy")).unwrap();
    let yaml = summarising_yaml(100, 2000, "") + "  poll: 5ms\n  flush: 200ms\n";
    std::fs::write(p.join("etc/rtdeploy/robot.yaml"), &yaml).unwrap();
    let mut sup = common::supervise(p);
    let st = common::wait_status(p, "the logger holding 8 summaries", |s| {
        s.logger.as_ref().is_some_and(|l| {
            l.channels
                .get("/demo/summary")
                .is_some_and(|c| c.logged >= 8)
        })
    });
    assert_eq!(st.logger.unwrap().state, "recording");
    let pid = sup.0.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let until = std::time::Instant::now() + Duration::from_secs(30);
    while sup.0.try_wait().unwrap().is_none() {
        assert!(
            std::time::Instant::now() < until,
            "the supervisor did not stop"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut files: Vec<_> = std::fs::read_dir(p.join("var/log/rtdeploy/mcap"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|f| f.extension().is_some_and(|e| e == "mcap"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let recorded = files.pop().unwrap();
    let recorded = recorded.to_str().unwrap();

    // The simulation: the talker left out, its messages replayed from the
    // log on the virtual clock; the listener's summaries published anew,
    // the recorded ones on /original/demo/summary.
    let dir = tempfile::tempdir().unwrap();
    let replay = |listener_extra: &str, name: &str| {
        let y = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&y, summarising_yaml(100, 2000, listener_extra)).unwrap();
        let out = dir.path().join(name);
        let o = sim(
            &y,
            &[
                "-q",
                "--for",
                "60s",
                "--leave-out",
                "talker",
                "--replay",
                recorded,
                "--remap",
                "/demo/summary",
                "--log",
                out.to_str().unwrap(),
            ],
        );
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        out.to_str().unwrap().to_string()
    };
    let diff = |b: &str| {
        Command::new(DEPLOY)
            .args([
                "log",
                "diff",
                recorded,
                b,
                "--payloads",
                "--channels",
                "/demo/summary",
            ])
            .output()
            .unwrap()
    };
    // The same listener: its summaries are the recorded ones (payloads:
    // the recording's times are the wall clock's, the replay's virtual).
    let same = replay("", "same.mcap");
    let o = diff(&same);
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{text}");
    assert!(
        text.contains("payloads only: log times not compared"),
        "{text}"
    );
    assert!(
        text.contains("the logs are the same on the channels compared"),
        "{text}"
    );
    // A listener with a bug planted in its output from the 250th message:
    // the third summary (at 300 messages) is the first to differ.
    let buggy = replay(", --planted-bug, \"250\"", "buggy.mcap");
    let o = diff(&buggy);
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{text}");
    assert!(
        text.contains("/demo/summary message 2 (")
            && text.contains("field seq_sum: 44850 in A, 44901 in B"),
        "{text}"
    );

    // The recording replayed into a robot that lacks one of its channels is
    // refused, naming it.
    let other = dir.path().join("other.yaml");
    let text = summarising_yaml(100, 2000, "");
    let cut = text.replace(
        "  - name: /demo/summary\n    max_size: 64\n    rate: 10\n    retention: 10s\n",
        "",
    );
    let cut = cut.replace(", --summary, /demo/summary, --summary-every, \"100\"", "");
    let cut = cut.replace("    publishes: [/demo/summary]\n", "");
    let cut = cut[..cut.find("    /demo/summary:").unwrap()].to_string();
    std::fs::write(&other, cut).unwrap();
    let o = sim(
        &other,
        &["--for", "1s", "--leave-out", "talker", "--replay", recorded],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains(
            "holds channels robot.yaml does not declare: /demo/summary (a log of another robot?)"
        ),
        "{err}"
    );
}

/// Run by `a_process_that_dies_is_restarted_on_the_virtual_clock_as_its_policy_says`
/// under `deploy sim`: a loop whose timer, 300 ms of virtual time after
/// the process starts, exits the process with status 3. On its own
/// (`--include-ignored`) it does nothing.
#[test]
#[ignore = "helper process: run by a_process_that_dies_is_restarted_on_the_virtual_clock_as_its_policy_says"]
fn dying_helper() {
    if std::env::var(units::env::SIM).is_err() {
        return;
    }
    let opts = controller::event_loop::LoopOptions::from_env();
    let mut lp = controller::event_loop::EventLoop::new(opts).unwrap();
    let start = lp.now();
    lp.add_timer("die", start + Duration::from_millis(300), None, |_| {
        std::process::exit(3)
    });
    lp.run().unwrap();
}

#[test]
fn a_process_that_dies_is_restarted_on_the_virtual_clock_as_its_policy_says() {
    let exe = std::env::current_exe().unwrap();
    let crasher = |policy: &str| {
        format!(
            "  - name: crasher\n    exec: {}\n    args: [--exact, dying_helper, --ignored, --nocapture, --test-threads=1]\n    restart: {{policy: {policy}, initial_backoff: 100ms, max_backoff: 1s, factor: 2, crash_loop_restarts: 2, crash_loop_window: 60s}}\n",
            exe.display()
        )
    };
    // Always: it dies at 1.3 s, is started again 100 ms later, dies 300 ms
    // after that, again after 200 ms, and the third death in the window is
    // a crash loop: failed. The others run on to the end.
    let robot = common::robot_with_examples(&crasher("always"));
    let yaml = yaml_of(robot.path());
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("crash.mcap");
    let o = sim(
        &yaml,
        &["--json", "--for", "5s", "--log", log.to_str().unwrap()],
    );
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v = json(&o);
    assert_eq!(
        v["failure"],
        serde_json::Value::Null,
        "the run went on: {v}"
    );
    assert_eq!(v["end_ns"], 6_000_000_000u64);
    let c = &v["processes"][2];
    assert_eq!(c["state"], "failed", "{c}");
    assert_eq!(c["restarts"], 2);
    assert_eq!(c["failed_exits"], 3);
    assert_eq!(
        c["history"],
        serde_json::json!([
            "it died in its turn at virtual time 1.300000000: exit 3",
            "started again at virtual time 1.400000000",
            "it died in its turn at virtual time 1.700000000: exit 3",
            "started again at virtual time 1.900000000",
            "it died in its turn at virtual time 2.200000000: exit 3",
        ]),
        "{c}"
    );
    assert!(c["detail"].as_str().unwrap().contains("crash loop"), "{c}");
    for p in &v["processes"].as_array().unwrap()[..2] {
        assert_eq!(p["state"], "running", "{p}");
        assert_eq!(p["exit"], "exit status: 0", "{p}");
    }
    // The log holds the deaths and restarts at their virtual times.
    let cat = Command::new(DEPLOY)
        .args([
            "log",
            "cat",
            "--json",
            log.to_str().unwrap(),
            "--channels",
            "/rtdeploy/events",
        ])
        .output()
        .unwrap();
    let cat: serde_json::Value = serde_json::from_slice(&cat.stdout).unwrap();
    let events: Vec<(String, u64)> = cat["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["value"]["process"] == "crasher")
        .map(|m| {
            (
                m["value"]["kind"].as_str().unwrap().to_string(),
                m["value"]["monotonic_ns"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        events,
        [
            ("start".to_string(), 1_000_000_000),
            ("exit".to_string(), 1_300_000_000),
            ("restart".to_string(), 1_400_000_000),
            ("exit".to_string(), 1_700_000_000),
            ("restart".to_string(), 1_900_000_000),
            ("exit".to_string(), 2_200_000_000),
        ]
    );

    // Never: it stays dead, the run goes on.
    let robot = common::robot_with_examples(&crasher("never"));
    let o = sim(&yaml_of(robot.path()), &["--json", "--for", "2s"]);
    assert_eq!(o.status.code(), Some(1));
    let v = json(&o);
    let c = &v["processes"][2];
    assert_eq!(c["state"], "dead", "{c}");
    assert_eq!(
        c["detail"], "it died in its turn at virtual time 1.300000000: exit 3",
        "{c}"
    );
    assert_eq!(v["processes"][1]["state"], "running");
}

/// Run by `charged_cpu_time_makes_a_busy_process_late_and_says_the_run_is_not_deterministic`
/// under `deploy sim`: a 10 ms phased loop whose handler uses 20 ms of
/// its thread's CPU time. On its own (`--include-ignored`) it does nothing.
#[test]
#[ignore = "helper process: run by charged_cpu_time_makes_a_busy_process_late_and_says_the_run_is_not_deterministic"]
fn busy_helper() {
    if std::env::var(units::env::SIM).is_err() {
        return;
    }
    // The thread's CPU time: the first field of its schedstat, in ns.
    let cpu = || {
        let text = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
        let ns: u64 = text.split_whitespace().next().unwrap().parse().unwrap();
        Duration::from_nanos(ns)
    };
    let opts = controller::event_loop::LoopOptions::from_env();
    let mut lp = controller::event_loop::EventLoop::new(opts).unwrap();
    lp.add_phased_loop(
        "busy",
        Duration::from_millis(10),
        Duration::ZERO,
        move |_| {
            let until = cpu() + Duration::from_millis(20);
            while cpu() < until {
                std::hint::spin_loop();
            }
        },
    );
    lp.run().unwrap();
}

#[test]
fn charged_cpu_time_makes_a_busy_process_late_and_says_the_run_is_not_deterministic() {
    let exe = std::env::current_exe().unwrap();
    let robot = common::robot_with_examples(&format!(
        "  - name: busy\n    exec: {}\n    args: [--exact, busy_helper, --ignored, --nocapture, --test-threads=1]\n",
        exe.display()
    ));
    let yaml = yaml_of(robot.path());
    let turns = |charge: bool| {
        let mut args = vec![
            "--json",
            "--for",
            "300ms",
            "--leave-out",
            "talker",
            "--leave-out",
            "listener",
        ];
        if charge {
            args.push("--charge-cpu");
        }
        let o = sim(&yaml, &args);
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let v = json(&o);
        assert_eq!(v["charge_cpu"], charge);
        let busy = &v["processes"][2];
        assert!(busy["cpu_ns"].as_u64().unwrap() >= 20_000_000, "{busy}");
        busy["turns"].as_u64().unwrap()
    };
    // Uncharged: a turn every 10 ms of virtual time, whatever the handler
    // costs (31 from 1.00 s to 1.30 s).
    let free = turns(false);
    assert!((30..=32).contains(&free), "{free}");
    // Charged: each turn keeps the process busy at least 20 ms, so the
    // loop runs every 20 ms at best (its phased loop skips what it
    // missed): 16 turns at most.
    let charged = turns(true);
    assert!(charged <= 16, "{charged} turns charged against {free}");
    let o = sim(
        &yaml,
        &[
            "--for",
            "100ms",
            "--leave-out",
            "talker",
            "--leave-out",
            "listener",
            "--charge-cpu",
        ],
    );
    assert!(String::from_utf8_lossy(&o.stdout)
        .contains("CPU time charged to the clock (--charge-cpu): this run is not deterministic"));
}

/// The README's first command gives `--bin-dir` relative to where it is
/// run, and the processes run in the run's own directory: relative paths
/// (`--bin-dir`, `--keep`) are resolved where `deploy` was started.
#[test]
fn relative_bin_dir_and_keep_are_resolved_where_deploy_runs() {
    let (talker, listener) = common::examples().unwrap_or_else(|why| panic!("{why}"));
    let robot = common::robot_with_examples("");
    let yaml = yaml_of(robot.path());
    let text = std::fs::read_to_string(&yaml)
        .unwrap()
        .replace(&talker.display().to_string(), "bin/talker")
        .replace(&listener.display().to_string(), "bin/listener");
    std::fs::write(&yaml, text).unwrap();
    let cwd = tempfile::tempdir().unwrap();
    std::fs::create_dir(cwd.path().join("bins")).unwrap();
    std::os::unix::fs::symlink(&talker, cwd.path().join("bins/talker")).unwrap();
    std::os::unix::fs::symlink(&listener, cwd.path().join("bins/listener")).unwrap();
    let o = Command::new("timeout")
        .args(["-s", "KILL", "120", DEPLOY, "-c"])
        .arg(&yaml)
        .args(["sim", "--json", "--for", "100ms", "--bin-dir", "bins"])
        .args(["--keep", "run"])
        .current_dir(cwd.path())
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v = json(&o);
    assert_eq!(v["processes"][0]["state"], "running", "{v}");
    assert!(
        v["processes"][0]["published"].as_u64().unwrap() >= 100,
        "{v}"
    );
    assert!(cwd.path().join("run/shm").is_dir());
}
