//! Malformed and inconsistent robot descriptions, each run through the real
//! `deploy config check`: exit 2, the line of the offending field, the field
//! path and what is wrong, and never a panic.
//!
//! Each case is a whole file; the line marked `#!` is where the error must
//! be reported.

use std::path::Path;
use std::process::Command;

const BASE: &str = "\
robot:
  name: t
board:
  model: generic
  cpus: 4
cpus:
  housekeeping: 0-1
  isolated: 2-3
channels:
  - name: /a
    max_size: 64
    rate: 1000
processes:
  - name: p
    exec: bin/p
    policy: fifo
    priority: 50
    memlock: 64MiB
    publishes: [/a]
";

struct Case {
    name: &'static str,
    yaml: String,
    /// The field path the message must name ("" when the error is about
    /// the file, not a field).
    field: &'static str,
    /// A piece of the message saying what is wrong or what is accepted.
    says: &'static str,
}

/// BASE with `old` replaced by `new` (which carries the `#!` marker).
fn edit(old: &str, new: &str) -> String {
    assert!(BASE.contains(old), "BASE has no `{old}`");
    BASE.replacen(old, new, 1)
}

/// BASE with `extra` appended (which carries the `#!` marker).
fn add(extra: &str) -> String {
    format!("{BASE}{extra}")
}

fn cases() -> Vec<Case> {
    let c = |name, yaml: String, field, says| Case {
        name,
        yaml,
        field,
        says,
    };
    vec![
        c("yaml syntax", edit("  name: t\n", "  name: t: u  #!\n"), "", "not valid YAML"),
        c("unknown section", add("robto: {}  #!\n"), "robto", "unknown section `robto`"),
        c("missing section", BASE.replacen("robot:\n  name: t\nboard:\n", "board:  #!\n", 1), "robot", "missing section `robot`"),
        c("unknown field", edit("  name: t\n", "  name: t\n  nmae: x  #!\n"), "robot.nmae", "unknown field `nmae`"),
        c("robot name", edit("  name: t\n", "  name: My Robot  #!\n"), "robot.name", "not a valid robot name"),
        c("unknown board", edit("  model: generic\n", "  model: jetson-orin  #!\n"), "board.model", "expected one of: jetson-orin-nano"),
        c("generic without cpus", edit("  model: generic\n  cpus: 4\n", "  model: generic  #!\n"), "board.model", "needs `cpus:`"),
        c("fixed board with cpus", edit("  model: generic\n  cpus: 4\n", "  model: jetson-orin-nano\n  cpus: 4  #!\n"), "board.cpus", "has 6 CPUs"),
        c("cpu0 isolated", edit("  housekeeping: 0-1\n  isolated: 2-3\n", "  housekeeping: 1\n  isolated: 0,2-3  #!\n"), "cpus.isolated", "CPU 0 cannot be isolated"),
        c("overlap", edit("  housekeeping: 0-1\n", "  housekeeping: 0-2  #!\n"), "cpus.housekeeping", "both housekeeping and isolated"),
        c("beyond board", edit("  isolated: 2-3\n", "  isolated: 2-7  #!\n"), "cpus.isolated", "do not exist on board"),
        c("bad cpu list", edit("  isolated: 2-3\n", "  isolated: 2-x  #!\n"), "cpus.isolated", "not a CPU number"),
        c("backwards range", edit("  isolated: 2-3\n", "  isolated: 3-2  #!\n"), "cpus.isolated", "runs backwards"),
        c("nothing isolated", edit("  isolated: 2-3\n", "  isolated: \"\"  #!\n"), "cpus.isolated", "no CPU is isolated"),
        c("housekeeping without cpu0", edit("  housekeeping: 0-1\n", "  housekeeping: 1  #!\n"), "cpus.housekeeping", "CPU 0 must be a housekeeping CPU"),
        c("planned kernel key", add("kernel:\n  cmdline: [isolcpus=3]  #!\n"), "kernel.cmdline[0]", "planned from `cpus:`"),
        c("kernel token with space", add("kernel:\n  cmdline: [\"quiet splash\"]  #!\n"), "kernel.cmdline[0]", "not one command line token"),
        c("irq thread priority 0", add("irqs:\n  threads:\n    - match: \"irq/*\"\n      policy: fifo\n      priority: 0  #!\n"), "irqs.threads[0].priority", "expected 1 to 99"),
        c("irq thread policy", add("irqs:\n  threads:\n    - match: \"irq/*\"\n      policy: fifa  #!\n      priority: 50\n"), "irqs.threads[0].policy", "unknown variant `fifa`"),
        c("irq thread without match", add("irqs:\n  threads:\n    - policy: fifo  #!\n      priority: 50\n"), "irqs.threads[0]", "missing field `match`"),
        c("override with irq and name", add("irqs:\n  overrides:\n    - irq: 5  #!\n      name: eth0\n      cpus: 0\n"), "irqs.overrides[0]", "exactly one of `irq`"),
        c("unclosed glob", add("irqs:\n  overrides:\n    - name: \"eth[0\"  #!\n      cpus: 0\n"), "irqs.overrides[0].name", "unclosed `[`"),
        c("feeds unknown process", add("irqs:\n  threads:\n    - match: \"irq/*\"\n      policy: fifo\n      priority: 50\n      feeds: [ghost]  #!\n"), "irqs.threads[0].feeds[0]", "no process `ghost`"),
        c("override beyond board", add("irqs:\n  overrides:\n    - irq: 9\n      cpus: 0-8  #!\n"), "irqs.overrides[0].cpus", "do not exist"),
        c("sysctl name", add("sysctl:\n  kernel..x: 1  #!\n"), "sysctl.kernel..x", "not a sysctl name"),
        c("governor", add("power:\n  governor: turbo  #!\n"), "power.governor", "unknown governor `turbo`"),
        c("dma latency", add("power:\n  cpu_dma_latency: fast  #!\n"), "power.cpu_dma_latency", "whole microseconds"),
        c("channel name", edit("  - name: /a\n", "  - name: a  #!\n"), "channels[0].name", "not a channel name"),
        c("duplicate channel", edit("    rate: 1000\n", "    rate: 1000\n  - name: /a  #!\n    max_size: 8\n    rate: 10\n"), "channels[1].name", "already defined"),
        c("rate zero", edit("    rate: 1000\n", "    rate: 0  #!\n"), "channels[0].rate", "rate 0"),
        c("negative rate", edit("    rate: 1000\n", "    rate: -5  #!\n"), "channels[0].rate", "-5"),
        c("message too big", edit("    max_size: 64\n", "    max_size: 64MiB  #!\n"), "channels[0].max_size", "out of range"),
        c("retention without unit", edit("    rate: 1000\n", "    rate: 1000\n    retention: 100  #!\n"), "channels[0].retention", "no unit"),
        c("queue too long", edit("    rate: 1000\n", "    rate: 4000000\n    retention: 10s  #!\n"), "channels[0].retention", "slots"),
        c("reserved channel", edit("  - name: /a\n", "  - name: /rtdeploy/timing/x  #!\n").replace("[/a]", "[/rtdeploy/timing/x]"), "channels[0].name", "keeps for its timing reports"),
        c("channel unknown field", edit("    max_size: 64\n", "    sise: 64  #!\n    max_size: 64\n"), "channels[0].sise", "unknown field `sise`"),
        c("channels not a list", edit("channels:\n  - name: /a\n    max_size: 64\n    rate: 1000\n", "channels:\n  name: /a  #!\n").replace("    publishes: [/a]\n", ""), "channels", "must be a list"),
        c("priority too high", edit("    priority: 50\n", "    priority: 120  #!\n"), "processes[0].priority", "expected 1 to 99"),
        c("fifo without priority", edit("  - name: p\n", "  - name: p  #!\n").replace("    priority: 50\n", ""), "processes[0].priority", "needs a priority"),
        c("other with priority", edit("    policy: fifo\n    priority: 50\n", "    policy: other\n    priority: 10  #!\n"), "processes[0].priority", "takes no priority"),
        c("policy typo", edit("    policy: fifo\n", "    policy: FIFO  #!\n"), "processes[0].policy", "expected one of `fifo`, `rr`, `other`"),
        c("rt on housekeeping", edit("    memlock: 64MiB\n", "    memlock: 64MiB\n    cpus: 1-2  #!\n"), "processes[0].cpus", "non-isolated CPUs 1"),
        c("process beyond board", edit("    memlock: 64MiB\n", "    memlock: 64MiB\n    cpus: 9  #!\n"), "processes[0].cpus", "do not exist"),
        c("publishes unknown", edit("    publishes: [/a]\n", "    publishes: [/b]  #!\n"), "processes[0].publishes[0]", "no channel `/b`"),
        c("subscribes unknown", add("    subscribes:\n      - /a\n      - /c  #!\n"), "processes[0].subscribes[1]", "no channel `/c`"),
        c("duplicate process", add("  - name: p  #!\n    exec: bin/q\n"), "processes[1].name", "already defined"),
        c("after unknown", add("    after: [ghost]  #!\n"), "processes[0].after[0]", "no process `ghost`"),
        c("after cycle", add("    after: [q]\n  - name: q\n    exec: bin/q\n    after: [p]\n").replace("    after: [q]\n", "    after: [q]  #!\n"), "processes[0].after", "cycle"),
        c("restart policy", add("    restart: {policy: sometimes}  #!\n"), "processes[0].restart.policy", "expected one of `always`, `on-failure`, `never`"),
        c("backoff order", add("    restart:\n      initial_backoff: 5s\n      max_backoff: 1s  #!\n"), "processes[0].restart.max_backoff", "below initial_backoff"),
        c("nice range", edit("    policy: fifo\n    priority: 50\n", "    policy: other\n    nice: 30  #!\n").replace("    memlock: 64MiB\n", ""), "processes[0].nice", "expected -20 to 19"),
        c("memlock", edit("    memlock: 64MiB\n", "    memlock: lots  #!\n"), "processes[0].memlock", "or `unlimited`"),
        c("exec escapes", edit("    exec: bin/p\n", "    exec: ../evil  #!\n"), "processes[0].exec", "leaves the release directory"),
        c("process name", edit("  - name: p\n", "  - name: Imu  #!\n"), "processes[0].name", "not a valid process name"),
        c("process field typo", add("    prio: 3  #!\n"), "processes[0].prio", "unknown field `prio`"),
        c("zero budget", add("    budgets: {wakeup: 0us}  #!\n"), "processes[0].budgets.wakeup", "expected a positive duration"),
        c("stop timeout unit", add("    stop_timeout: 5  #!\n"), "processes[0].stop_timeout", "no unit"),
        c("duration unit", add("    stop_timeout: 5 parsecs  #!\n"), "processes[0].stop_timeout", "unknown unit"),
        c("burst above rt", add("check:\n  priority: 50\n  bursts: {priority: 60}  #!\n"), "check.bursts.priority", "must be below the real-time priority"),
        c("boot check on_failure", add("boot_check:\n  on_failure: panic  #!\n"), "boot_check.on_failure", "expected `refuse` or `degrade`"),
        c("update keep", add("update:\n  keep: 1  #!\n"), "update.keep", "nothing to roll back to"),
        c("public key", add("update:\n  public_keys: [\"not-a-key\"]  #!\n"), "update.public_keys[0]", "not an ed25519 public key"),
        c("duplicate key", edit("  cpus: 4\n", "  cpus: 4\n  cpus: 6  #!\n"), "", "duplicate key `cpus`"),
        c("not a mapping", "- robot  #!\n".into(), "", "must be a mapping of sections"),
        c("empty file", "#!\n".into(), "", "empty"),
        c("cpus wrong type", edit("  isolated: 2-3\n", "  isolated: [2, 3]  #!\n"), "cpus.isolated", "CPU list"),
    ]
}

fn deploy(config: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_deploy"))
        .args(["config", "check", "-c"])
        .arg(config)
        .output()
        .expect("run deploy")
}

#[test]
fn base_is_valid() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("robot.yaml");
    std::fs::write(&path, BASE).unwrap();
    let out = deploy(&path);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn every_malformed_config_is_refused_with_its_place() {
    let dir = tempfile::tempdir().unwrap();
    let cases = cases();
    assert!(cases.len() >= 40, "only {} cases", cases.len());
    let mut failures = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let line = case
            .yaml
            .lines()
            .position(|l| l.contains("#!"))
            .unwrap_or_else(|| panic!("case `{}` has no #! marker", case.name))
            + 1;
        let path = dir.path().join(format!("case{i}.yaml"));
        std::fs::write(&path, &case.yaml).unwrap();
        let out = deploy(&path);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let want_place = format!("{}:{line}:", path.display());
        let error_line = stderr
            .lines()
            .find(|l| l.starts_with(&want_place) && l.contains(": error: "));
        let ok = out.status.code() == Some(2)
            && error_line.is_some_and(|l| {
                (case.field.is_empty() || l.contains(&format!(": {}: ", case.field)))
                    && l.contains(case.says)
            });
        if !ok {
            failures.push(format!(
                "case `{}`: exit {:?}, wanted an error at line {line} naming `{}` and saying `{}`; got:\n{stderr}",
                case.name,
                out.status.code(),
                case.field,
                case.says
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn every_error_is_reported_at_once() {
    let yaml = BASE
        .replace("  isolated: 2-3\n", "  isolated: 0,2-3\n")
        .replace("    rate: 1000\n", "    rate: 0\n")
        .replace("    priority: 50\n", "    priority: 300\n")
        + "update:\n  keep: 1\n";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("robot.yaml");
    std::fs::write(&path, yaml).unwrap();
    let out = deploy(&path);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    for field in [
        "cpus.isolated",
        "cpus.housekeeping",
        "channels[0].rate",
        "processes[0].priority",
        "update.keep",
    ] {
        assert!(
            stderr.contains(&format!(": error: {field}: ")),
            "no error for {field} in:\n{stderr}"
        );
    }
    assert!(stderr.contains("5 errors"), "{stderr}");
}

#[test]
fn bad_elements_of_a_list_are_each_reported() {
    let yaml = BASE.replace(
        "    publishes: [/a]\n",
        "    publishes: [/a]\n  - name: q\n    exec: bin/q\n    policy: fifo\n    priority: 500\n  - name: r\n    exec: 5\n    policy: nope\n",
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("robot.yaml");
    std::fs::write(&path, yaml).unwrap();
    let out = deploy(&path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    // The unparsable element and the invalid one are both reported.
    assert!(
        stderr.contains(": error: processes[2].policy: unknown variant `nope`"),
        "{stderr}"
    );
    assert!(
        stderr.contains(": error: processes[1].priority: priority 500 is out of range"),
        "{stderr}"
    );
}

#[test]
fn warnings_do_not_fail() {
    let yaml = add("  - name: bg\n    exec: bin/bg\n    cpus: 0-2\n");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("robot.yaml");
    std::fs::write(&path, yaml).unwrap();
    let out = deploy(&path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains(
            ": warning: processes[1].cpus: non-real-time process `bg` runs on isolated CPUs 2"
        ),
        "{stderr}"
    );
}

#[test]
fn json_report_lists_diagnostics() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("robot.yaml");
    std::fs::write(&path, BASE.replace("    rate: 1000\n", "    rate: 0\n")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_deploy"))
        .args(["--json", "config", "check", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let doc: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("one JSON document on stdout");
    assert_eq!(doc["schema_version"], 1);
    assert_eq!(doc["valid"], false);
    assert_eq!(doc["diagnostics"][0]["field"], "channels[0].rate");
    assert_eq!(doc["diagnostics"][0]["line"], 12);
}
