//! The boot checks kept over time: three supervised boots from three
//! releases land in the history, bounded by `boot_check.history`, and
//! `deploy check --history` names the release that made latency worse.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{supervise, Spinner, DEPLOY};
use services::control::{self, Request};

fn prefix_with(boot_check: &str) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("rtdeploy-history-")
        .tempdir()
        .unwrap();
    std::fs::create_dir_all(dir.path().join("etc/rtdeploy")).unwrap();
    let yaml = format!(
        "robot:\n  name: histbot\nboard:\n  model: generic\n  cpus: 2\ncpus:\n  housekeeping: 0\n  isolated: 1\ncheck:\n  budgets:\n    delivery_max: 50ms\n{boot_check}processes:\n  - name: bg\n    exec: /bin/sleep\n    args: [\"600\"]\n"
    );
    std::fs::write(dir.path().join("etc/rtdeploy/robot.yaml"), yaml).unwrap();
    dir
}

/// Points `opt/rtdeploy/current` at `releases/<name>` (the way install
/// does, by renaming a new link over it).
fn switch_release(prefix: &Path, name: &str) {
    let opt = prefix.join("opt/rtdeploy");
    std::fs::create_dir_all(opt.join("releases").join(name)).unwrap();
    let tmp = opt.join("current.new");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(format!("releases/{name}"), &tmp).unwrap();
    std::fs::rename(&tmp, opt.join("current")).unwrap();
}

/// Starts the supervisor, waits (watchdog 60 s) until its boot check is
/// over, stops it with SIGTERM; returns the boot check's status line.
fn boot(prefix: &Path) -> String {
    let mut sup = supervise(prefix);
    let until = Instant::now() + Duration::from_secs(60);
    let line = loop {
        if let Ok(r) = control::request(&control::socket_path(prefix), &Request::Status) {
            let s = r.status.expect("a status");
            if s.boot_check.starts_with("passed") || s.boot_check.starts_with("failed") {
                break s.boot_check;
            }
        }
        assert!(Instant::now() < until, "the boot check did not end");
        std::thread::sleep(Duration::from_millis(50));
    };
    let kill = Command::new("kill")
        .args(["-TERM", &sup.0.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let until = Instant::now() + Duration::from_secs(20);
    while sup.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < until, "the supervisor did not stop");
        std::thread::sleep(Duration::from_millis(20));
    }
    line
}

fn history_json(prefix: &Path) -> (Option<i32>, serde_json::Value) {
    let out = Command::new(DEPLOY)
        .args([
            "--prefix",
            prefix.to_str().unwrap(),
            "--json",
            "check",
            "--history",
        ])
        .output()
        .unwrap();
    let doc = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), doc)
}

#[test]
fn three_supervised_boots_are_kept_with_kernel_release_and_time() {
    // As a user the checks cannot run (their workers need SCHED_FIFO):
    // each boot is kept as an error, which is what the history records.
    assert!(
        Path::new("/sys/devices/system/cpu/cpu1").exists(),
        "the boot check needs CPU 1 (isolated in this robot.yaml)"
    );
    // Two kept: the first of three boots is dropped.
    let prefix = prefix_with("boot_check:\n  duration: 1s\n  on_failure: degrade\n  history: 2\n");
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut lines = Vec::new();
    for name in ["1-aaaaaaaa", "2-bbbbbbbb", "3-cccccccc"] {
        switch_release(prefix.path(), name);
        lines.push(boot(prefix.path()));
    }
    eprintln!("boot checks: {lines:#?}");
    let (code, doc) = history_json(prefix.path());
    let records = doc["records"].as_array().unwrap();
    assert_eq!(records.len(), 2, "{doc:#}");
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    for (r, release) in records.iter().zip(["2-bbbbbbbb", "3-cccccccc"]) {
        assert_eq!(r["release"], release, "{doc:#}");
        assert_eq!(r["kernel"], kernel.trim(), "{doc:#}");
        assert!(r["unix_time"].as_u64().unwrap() >= before, "{doc:#}");
        let verdict = r["verdict"].as_str().unwrap();
        assert!(["pass", "fail", "error"].contains(&verdict), "{doc:#}");
        if verdict != "error" {
            assert!(r["p99_ns"].as_u64().unwrap() <= r["max_ns"].as_u64().unwrap());
        }
    }
    // The status line said which verdict each boot had; the exit status
    // follows the latest.
    let last = records[1]["verdict"].as_str().unwrap();
    assert_eq!(code, Some(if last == "pass" { 0 } else { 1 }), "{doc:#}");
    assert_eq!(lines[2].starts_with("passed"), last == "pass", "{lines:?}");
    assert!(doc["notes"].as_array().unwrap().is_empty(), "{doc:#}");
}

/// Three real supervised boots, each a real boot check: releases 1 and
/// 2 on a quiet isolated CPU, release 3 with a busy SCHED_FIFO 99 task
/// there (10 ms of every 14). The history names release 3 as the one that
/// made latency worse than release 2, from the measured figures.
#[test]
#[ignore = "needs root: the boot check's SCHED_FIFO workers and a SCHED_FIFO 99 task on CPU 1"]
fn three_boots_where_the_third_release_made_latency_worse() {
    assert!(
        Path::new("/sys/devices/system/cpu/cpu1").exists(),
        "the boot check needs CPU 1 (isolated in this robot.yaml)"
    );
    // The check's sender and receiver share CPU 1 here, so only a message
    // in flight when a busy spell begins waits it out (about one spell in
    // twenty): 3 s hold some 200 spells.
    let prefix = prefix_with("boot_check:\n  duration: 3s\n  on_failure: degrade\n  history: 5\n");
    let mut lines = Vec::new();
    for name in ["1-aaaaaaaa", "2-bbbbbbbb"] {
        switch_release(prefix.path(), name);
        lines.push(boot(prefix.path()));
    }
    switch_release(prefix.path(), "3-cccccccc");
    let spinner = Spinner::start(1, 99, Duration::from_millis(10), Duration::from_millis(14));
    lines.push(boot(prefix.path()));
    spinner.finish().unwrap();
    eprintln!("boot checks: {lines:#?}");

    let (_, doc) = history_json(prefix.path());
    let records = doc["records"].as_array().unwrap();
    assert_eq!(records.len(), 3, "{doc:#}");
    let p99 = |i: usize| records[i]["p99_ns"].as_u64().unwrap_or(0);
    let max = |i: usize| records[i]["max_ns"].as_u64().unwrap_or(0);
    eprintln!(
        "p99 {} {} {} ns, max {} {} {} ns",
        p99(0),
        p99(1),
        p99(2),
        max(0),
        max(1),
        max(2)
    );
    // A 10 ms busy task at a higher priority on the receiver's CPU puts
    // the worst delivery of a 2 s check at milliseconds.
    assert!(max(2) >= 5_000_000, "{doc:#}");
    let regressions = doc["trend"]["regressions"].as_array().unwrap();
    let last = regressions.last().unwrap_or_else(|| panic!("{doc:#}"));
    assert_eq!(last["changed"], "release", "{doc:#}");
    assert_eq!(last["to"], "3-cccccccc", "{doc:#}");
    assert_eq!(last["from"], "2-bbbbbbbb", "{doc:#}");
    assert!(
        last["worse"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap().starts_with("max ")),
        "{doc:#}"
    );
}

#[test]
fn the_history_names_the_release_that_made_it_worse_and_skips_damage() {
    let prefix = prefix_with("");
    let path = prefix
        .path()
        .join("var/lib/rtdeploy/boot-check-history.jsonl");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let rec = |t: u64, release: &str, verdict: &str, p99: u64, max: u64| {
        format!(
            "{{\"unix_time\":{t},\"kernel\":\"6.12.0-rt\",\"release\":\"{release}\",\"verdict\":\"{verdict}\",\"p99_ns\":{p99},\"max_ns\":{max}}}\n"
        )
    };
    let text = [
        rec(1_790_000_000, "1-aaaaaaaa", "pass", 12_000, 30_000),
        "{\"unix_time\": \u{0}\u{1} truncated by a power cut\n".to_string(),
        rec(1_790_086_400, "1-aaaaaaaa", "pass", 13_000, 31_000),
        rec(1_790_172_800, "2-bbbbbbbb", "fail", 55_000, 180_000),
    ]
    .concat();
    std::fs::write(&path, text).unwrap();
    let out = Command::new(DEPLOY)
        .args([
            "--prefix",
            prefix.path().to_str().unwrap(),
            "check",
            "--history",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.starts_with("note: line 2: not a boot record"),
        "{stdout}"
    );
    assert!(
        stdout.contains("the release 2-bbbbbbbb made it worse than 1-aaaaaaaa: p99 12.0us -> 55.0us, max 30.0us -> 180.0us, 1 of 1 boot(s) failed, none before"),
        "{stdout}"
    );
    let rows: Vec<&str> = stdout.lines().filter(|l| l.starts_with("2026-")).collect();
    assert_eq!(rows.len(), 3, "{stdout}");
    assert!(
        rows[2].split_whitespace().eq([
            "2026-09-23",
            "14:13:20",
            "2-bbbbbbbb",
            "6.12.0-rt",
            "fail",
            "55.0us",
            "180.0us"
        ]),
        "{}",
        rows[2]
    );
}
