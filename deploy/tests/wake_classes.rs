//! Wake classes from robot.yaml: which processes are real-time for their
//! channels, what `deploy plan` shows of it, and what `config check` warns
//! about.

use std::path::Path;

use controller::WakeClass;

/// A two-CPU robot: housekeeping 0, isolated 1, with `extra` appended
/// to its processes and `irqs` as its `irqs:` section.
fn robot(irqs: &str, processes: &str) -> String {
    format!(
        r#"robot: {{name: classes}}
board: {{model: generic, cpus: 4}}
cpus: {{housekeeping: 0-1, isolated: 2-3}}
{irqs}
channels:
  - {{name: /c, max_size: 64, rate: 1000, retention: 50ms, budget: 500us}}
processes:
{processes}
"#
    )
}

fn classes(text: &str) -> Vec<(String, WakeClass, String)> {
    let loaded = services::robot::load_str(Path::new("robot.yaml"), text.to_string())
        .unwrap_or_else(|e| panic!("{e:#}"));
    loaded
        .robot
        .wake_classes()
        .into_iter()
        .map(|c| (c.process, c.class, c.reason))
        .collect()
}

const PAIR: &str = r#"  - {name: talker, exec: bin/t, policy: fifo, priority: 80, cpus: 2, memlock: 1MiB, publishes: [/c]}
  - {name: listener, exec: bin/l, policy: fifo, priority: 80, cpus: 3, memlock: 1MiB, subscribes: [/c]}
"#;

#[test]
fn real_time_only_above_everything_on_its_isolated_cpus() {
    let c = classes(&robot("", PAIR));
    assert!(c.iter().all(|c| c.1 == WakeClass::RealTime), "{c:?}");
    assert!(c[0].2.contains("isolated CPUs 2"), "{c:?}");

    // An IRQ thread placed above it on its CPU makes it best-effort.
    let irqs =
        "irqs:\n  threads:\n    - {match: \"irq/*-can0\", policy: fifo, priority: 90, cpus: 3}";
    let c = classes(&robot(irqs, PAIR));
    assert_eq!(c[0].1, WakeClass::RealTime, "{c:?}");
    assert_eq!(c[1].1, WakeClass::BestEffort, "{c:?}");
    assert!(
        c[1].2
            .contains("not above IRQ threads `irq/*-can0` (fifo 90)"),
        "{c:?}"
    );

    // ktimers/N raised to the process's priority: not above it.
    let irqs = "irqs:\n  kthreads:\n    - {match: \"ktimers/*\", policy: fifo, priority: 80}";
    let c = classes(&robot(irqs, PAIR));
    assert!(c.iter().all(|c| c.1 == WakeClass::BestEffort), "{c:?}");
    assert!(c[0].2.contains("ktimers/2 (fifo 80)"), "{c:?}");

    // Another process above it on the same CPU; an equal one is not.
    let procs = format!(
        "{PAIR}  - {{name: hi, exec: bin/h, policy: fifo, priority: 85, cpus: 2, memlock: 1MiB}}\n  - {{name: same, exec: bin/s, policy: fifo, priority: 80, cpus: 3, memlock: 1MiB}}\n"
    );
    let c = classes(&robot("", &procs));
    assert_eq!(c[0].1, WakeClass::BestEffort, "{c:?}");
    assert!(c[0].2.contains("below process `hi` (fifo 85)"), "{c:?}");
    assert_eq!(c[1].1, WakeClass::RealTime, "{c:?}");
    assert_eq!(c[2].1, WakeClass::RealTime, "{c:?}");

    // FIFO on housekeeping CPUs, and SCHED_OTHER: best-effort.
    let procs = r#"  - {name: low, exec: bin/l, policy: fifo, priority: 30, cpus: 0, allow_housekeeping: true, memlock: 1MiB, publishes: [/c]}
  - {name: tool, exec: bin/x, subscribes: [/c]}
"#;
    let c = classes(&robot("", procs));
    assert_eq!(
        (c[0].1, c[1].1),
        (WakeClass::BestEffort, WakeClass::BestEffort)
    );
    assert!(c[0].2.contains("not all isolated"), "{c:?}");
    assert_eq!(c[1].2, "policy other");
}

fn deploy(dir: &Path, text: &str, args: &[&str]) -> std::process::Output {
    let path = dir.join("robot.yaml");
    std::fs::write(&path, text).unwrap();
    let mut all = vec!["-c", path.to_str().unwrap()];
    all.extend_from_slice(args);
    std::process::Command::new(env!("CARGO_BIN_EXE_deploy"))
        .args(all)
        .output()
        .unwrap()
}

#[test]
fn plan_shows_the_classes_and_config_check_warns_where_the_bound_exceeds_a_budget() {
    let dir = tempfile::tempdir().unwrap();
    let procs = format!("{PAIR}  - {{name: tool, exec: bin/x, publishes: [/c]}}\n");
    let text = robot("", &procs);
    let out = deploy(dir.path(), &text, &["--json", "plan"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ch = &plan["channels"][0];
    assert_eq!(ch["classes"]["publishers"]["real-time"][0], "talker");
    assert_eq!(ch["classes"]["publishers"]["best-effort"][0], "tool");
    assert_eq!(ch["classes"]["subscribers"]["real-time"][0], "listener");
    assert_eq!(ch["crosses_classes"], true);
    assert_eq!(ch["cross_class_latency"], "2ms");
    assert_eq!(plan["processes"][0]["wake_class"], "real-time");
    let out = deploy(dir.path(), &text, &["plan"]);
    let text_plan = String::from_utf8_lossy(&out.stdout);
    assert!(
        text_plan.contains("pub real-time talker; best-effort tool -> sub real-time listener"),
        "{text_plan}"
    );
    assert!(
        text_plan.contains("across classes within 2ms: subscribers look every 1ms"),
        "{text_plan}"
    );

    // The listener's budget (the channel's 500us) is shorter than the
    // 2ms a best-effort message may take: a warning naming both.
    let out = deploy(dir.path(), &text, &["config", "check"]);
    assert_eq!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("channels[0].cross_class_latency")
            && err.contains("real-time process `listener` subscribes to `/c`, where best-effort process `tool` publishes")
            && err.contains("up to 2ms late")
            && err.contains("beyond its budget 500us"),
        "{err}"
    );
    // A bound within the budget: no warning.
    let within = text.replace(
        "budget: 500us}",
        "budget: 500us, cross_class_latency: 400us}",
    );
    let out = deploy(dir.path(), &within, &["config", "check"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("cross_class_latency"), "{err}");
    // Out of range, and the supervisor's variables in a process's env.
    let bad = text.replace(
        "budget: 500us}",
        "budget: 500us, cross_class_latency: 50us}",
    );
    let out = deploy(dir.path(), &bad, &["config", "check"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cross-class latency 50us is out of range (expected 100us to 10s)"),
        "{err}"
    );
    let bad = text.replace(
        "exec: bin/x,",
        "exec: bin/x, env: {RTDEPLOY_WAKE_CLASS: real-time},",
    );
    let out = deploy(dir.path(), &bad, &["config", "check"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("processes[2].env.RTDEPLOY_WAKE_CLASS")
            && err.contains("set by the supervisor"),
        "{err}"
    );
}
