//! Readiness, liveness and budgets from real timing reports: the helper
//! below runs the controller crate's event loop (a phased loop whose
//! handler takes a set time) and publishes its reports the way every
//! controller does, from the environment the supervisor gives it.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{config, process, start};
use serde_json::json;

/// Run by the supervisor in the test below: waits for `$GATE`, then runs
/// an event loop (10 ms phased loop, handler busy for `$HANDLER_US`) until
/// `$STOP` exists, then stays alive without reporting.
/// On its own (`--include-ignored`) it does nothing.
#[test]
#[ignore = "helper process: run by timing_reports_drive_readiness_budgets_and_liveness"]
fn reporter_helper() {
    let Ok(gate) = std::env::var("GATE") else {
        return;
    };
    let gate = PathBuf::from(gate);
    let stop = PathBuf::from(std::env::var("STOP").unwrap());
    let handler = Duration::from_micros(std::env::var("HANDLER_US").unwrap().parse().unwrap());
    while !gate.exists() {
        std::thread::sleep(Duration::from_millis(10));
    }
    let opts = controller::event_loop::LoopOptions::from_env();
    assert!(
        opts.timing.is_some(),
        "{} and {} are set",
        units::env::SHM_DIR,
        units::env::PROCESS
    );
    let mut lp = controller::event_loop::EventLoop::new(opts).unwrap();
    lp.add_phased_loop(
        "tick",
        Duration::from_millis(10),
        Duration::ZERO,
        move |ctx| {
            let t = Instant::now();
            while t.elapsed() < handler {
                std::hint::spin_loop();
            }
            if stop.exists() {
                ctx.exit();
            }
        },
    );
    lp.run().unwrap();
    println!("loop stopped");
    std::thread::sleep(Duration::from_secs(600));
}

fn helper(
    name: &str,
    dir: &Path,
    handler_us: u32,
    budget: &str,
) -> services::config::ProcessConfig {
    process(json!({
        "name": name,
        "exec": std::env::current_exe().unwrap().to_str().unwrap(),
        "args": ["--exact", "reporter_helper", "--ignored", "--nocapture", "--test-threads=1"],
        "env": {
            "GATE": dir.join(format!("{name}.gate")).to_str().unwrap(),
            "STOP": dir.join(format!("{name}.stop")).to_str().unwrap(),
            "HANDLER_US": handler_us.to_string(),
        },
        "budgets": {"handler": budget},
        "stop_timeout": "1s",
    }))
}

#[test]
fn timing_reports_drive_readiness_budgets_and_liveness() {
    let gates = tempfile::tempdir().unwrap();
    let fast = helper("fast", gates.path(), 0, "50ms");
    let slow = helper("slow", gates.path(), 2000, "100us");
    let dependent = process(
        json!({"name": "dependent", "exec": "/bin/sleep", "args": ["60"], "after": ["fast"]}),
    );
    let sup = start(config(vec![fast, slow, dependent], None), None);

    // Running but not reporting: `dependent` waits for `fast`'s first report.
    let s = sup.wait_for("fast and slow running", |s| {
        s.processes[..2].iter().all(|p| p.state == "running")
    });
    assert_eq!(s.processes[2].state, "waiting");
    assert_eq!(
        s.processes[2].reason.as_deref(),
        Some("waiting for fast (no timing report yet)")
    );
    assert_eq!(s.processes[0].budget, "waiting for the first timing report");

    std::fs::write(gates.path().join("fast.gate"), "").unwrap();
    std::fs::write(gates.path().join("slow.gate"), "").unwrap();
    let s = sup.wait_for("dependent running", |s| s.processes[2].state == "running");
    let fast = &s.processes[0];
    assert!(
        fast.wakeup_max_us.is_some() && fast.wakeup_p99_us.is_some(),
        "{fast:?}"
    );
    assert!(sup
        .log("fast")
        .contains("[rtdeploy] first timing report: ready"));

    // A handler of 2 ms against a 100 us budget: every report is over.
    let s = sup.wait_for("slow over budget", |s| {
        s.processes[1].over_budget_reports >= 2
    });
    let slow = &s.processes[1];
    assert!(slow.degraded);
    assert!(slow.budget.starts_with("over: "), "{slow:?}");
    assert!(slow.budget.contains("tick handler max "), "{slow:?}");
    assert!(sup
        .log("slow")
        .contains("over budget (#1): tick handler max "));
    assert_eq!(s.processes[0].over_budget_reports, 0);
    assert!(!s.processes[0].degraded);
    assert_eq!(s.processes[0].budget, "ok");

    // `fast` stops reporting but keeps running: unhealthy after 3 periods.
    std::fs::write(gates.path().join("fast.stop"), "").unwrap();
    sup.wait_log("fast", "loop stopped");
    let s = sup.wait_for("fast unhealthy", |s| {
        s.processes[0].budget.starts_with("unhealthy")
    });
    assert_eq!(s.processes[0].state, "running");
    assert!(
        s.processes[0]
            .budget
            .starts_with("unhealthy: no timing report for "),
        "{:?}",
        s.processes[0]
    );
    sup.stop_all();
}
