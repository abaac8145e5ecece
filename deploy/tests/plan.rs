//! `deploy config check` and `deploy plan` on the bundled examples.

use std::path::PathBuf;
use std::process::Command;

fn example(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(name)
}

fn deploy(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_deploy"))
        .args(args)
        .output()
        .expect("run deploy")
}

/// `deploy plan --json` of `path`, which must succeed (`what` names the
/// case in the failure).
fn plan_json(path: &std::path::Path, what: &str) -> serde_json::Value {
    let out = deploy(&["plan", "--json", "-c", path.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("plan is one JSON document")
}

/// The plan's entry for channel `name`.
fn plan_channel<'a>(plan: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    plan["channels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap()
}

#[test]
fn examples_are_valid() {
    for name in ["orin-nano.yaml", "dev.yaml", "qemu.yaml"] {
        let path = example(name);
        let out = deploy(&["config", "check", "-c", path.to_str().unwrap()]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The value of `key=` among the tokens, or None.
fn token<'a>(tokens: &'a [serde_json::Value], key: &str) -> Option<&'a str> {
    tokens
        .iter()
        .filter_map(|t| t["token"].as_str())
        .find_map(|t| t.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
}

#[test]
fn plan_json_isolates_exactly_the_isolated_cpus() {
    for (name, isolated, housekeeping) in [
        ("orin-nano.yaml", "4-5", "0-3"),
        ("dev.yaml", "1", "0"),
        ("qemu.yaml", "2-3", "0-1"),
    ] {
        let plan = plan_json(&example(name), name);
        assert_eq!(plan["schema_version"], 1);
        assert_eq!(plan["cpus"]["isolated"], isolated);
        assert_eq!(plan["cpus"]["housekeeping"], housekeeping);
        let tokens = plan["cmdline"]["tokens"].as_array().expect("tokens");
        let isolcpus = token(tokens, "isolcpus").expect("isolcpus planned");
        // Flags first, then the CPU list, as the kernel parses it.
        assert_eq!(isolcpus.rsplit(',').next(), isolated.rsplit(',').next());
        assert!(isolcpus.starts_with("managed_irq,domain,"), "{isolcpus}");
        assert_eq!(isolcpus.trim_start_matches("managed_irq,domain,"), isolated);
        assert_eq!(token(tokens, "nohz_full"), Some(isolated));
        assert_eq!(token(tokens, "rcu_nocbs"), Some(isolated));
        assert_eq!(token(tokens, "irqaffinity"), Some(housekeeping));
        assert!(tokens
            .iter()
            .all(|t| !t["reason"].as_str().unwrap_or("").is_empty()));
        let line = plan["cmdline"]["line"].as_str().unwrap();
        assert!(line.contains(&format!("nohz_full={isolated}")), "{line}");
    }
}

#[test]
fn plan_places_processes_and_sizes_channels() {
    let path = example("orin-nano.yaml");
    let plan = plan_json(&path, "orin-nano.yaml");
    let procs = plan["processes"].as_array().unwrap();
    let motor = procs
        .iter()
        .find(|p| p["name"] == "motor_controller")
        .unwrap();
    assert_eq!(motor["policy"], "fifo");
    assert_eq!(motor["priority"], 90);
    assert_eq!(motor["cpus"], "5");
    assert_eq!(motor["restart"]["policy"], "always");
    assert_eq!(motor["restart"]["max_backoff"], "1s");
    assert_eq!(motor["stop_timeout"], "1s");
    // `after:` is honoured: imu_reader starts before motor_controller.
    let start = |n: &str| {
        procs.iter().find(|p| p["name"] == n).unwrap()["start"]
            .as_u64()
            .unwrap()
    };
    assert!(start("imu_reader") < start("motor_controller"));
    assert!(start("motor_controller") < start("state_estimator"));
    let planner = procs.iter().find(|p| p["name"] == "planner").unwrap();
    assert_eq!(
        planner["cpus"], "0-3",
        "non-real-time processes default to housekeeping CPUs"
    );
    let imu = plan_channel(&plan, "/imu/raw");
    // 1000/s x 100ms = 100 messages, plus headroom, to a power of two.
    assert_eq!(imu["queue_len"], 128);
    assert!(imu["shm_bytes"].as_u64().unwrap() >= 128 * imu["slot_bytes"].as_u64().unwrap());
}

#[test]
fn plan_human_output_shows_the_map_and_the_line() {
    let path = example("orin-nano.yaml");
    let out = deploy(&["plan", "-c", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("cluster 4-5      4:I 5:I"), "{text}");
    assert!(
        text.contains("isolcpus=managed_irq,domain,4-5 nohz_full=4-5"),
        "{text}"
    );
    assert!(text.contains("motor_controller fifo 90"), "{text}");
}

#[test]
fn invalid_config_stops_plan_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("robot.yaml");
    std::fs::write(
        &path,
        "robot: {name: x}\nboard: {model: generic, cpus: 2}\ncpus: {isolated: 0}\n",
    )
    .unwrap();
    let out = deploy(&["plan", "-c", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(":3:"), "{stderr}");
    assert!(stderr.contains("deploy: "), "{stderr}");
    assert!(out.stdout.is_empty());
}

#[test]
fn missing_config_is_an_error_naming_the_file() {
    let out = deploy(&["--prefix", "/nonexistent-prefix", "plan"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("/nonexistent-prefix/etc/rtdeploy/robot.yaml"),
        "{stderr}"
    );
}

/// examples/orin-nano.yaml with `kernel:` saying `decl` (and no partition
/// when the kernel cannot make one).
fn orin_on(dir: &std::path::Path, decl: &str, partition: &str) -> PathBuf {
    let text = std::fs::read_to_string(example("orin-nano.yaml")).unwrap();
    let text = text
        .replacen(
            "  partition: isolated\n",
            &format!("  partition: {partition}\n"),
            1,
        )
        .replacen("kernel:\n", &format!("kernel:\n  {decl}\n"), 1);
    let path = dir.join("robot.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn plan_names_the_backend_the_declared_kernel_gives() {
    let dir = tempfile::tempdir().unwrap();
    for (decl, partition, version, backend, source) in [
        (
            "l4t: R36.4.3",
            "none",
            "5.15.0",
            "doorbell",
            "kernel.l4t R36.4.3, JetPack 6",
        ),
        (
            "l4t: 35.6.0",
            "none",
            "5.10.0",
            "doorbell",
            "kernel.l4t R35.6.0, JetPack 5",
        ),
        (
            "version: 6.6.70",
            "none",
            "6.6.70",
            "futex_waitv",
            "kernel.version",
        ),
        (
            "version: 6.12.6-rt",
            "isolated",
            "6.12.6",
            "io_uring-futex",
            "kernel.version",
        ),
    ] {
        let path = orin_on(dir.path(), decl, partition);
        let plan = plan_json(&path, decl);
        let k = &plan["kernel"];
        assert_eq!(k["version"], version, "{decl}");
        assert_eq!(k["backend"], backend, "{decl}");
        assert_eq!(k["source"], source, "{decl}");
        assert_eq!(
            k["capabilities"]["io_uring_futex"],
            backend == "io_uring-futex",
            "{decl}"
        );
        let out = deploy(&["plan", "-c", path.to_str().unwrap()]);
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(
            text.contains(&format!(
                "kernel {version} ({source}): wake backend {backend}: "
            )),
            "{text}"
        );
    }
    // Not declared: the loops probe on the board.
    let out = deploy(&[
        "plan",
        "--json",
        "-c",
        example("orin-nano.yaml").to_str().unwrap(),
    ]);
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["kernel"]["backend"], serde_json::Value::Null);
    assert!(plan["kernel"]["reason"]
        .as_str()
        .unwrap()
        .contains("each event loop probes at start"));
}

/// The nvpmodel mode robot.yaml names is in the plan, with the CPUs it
/// keeps online (Orin Nano 8GB, nvpmodel_p3767_0003.conf of L4T R35: 15W
/// keeps all six).
#[test]
fn plan_shows_the_power_mode() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(example("orin-nano.yaml"))
        .unwrap()
        .replacen(
            "power:\n",
            "power:\n  nvpmodel: 15W\n  nvpmodel_conf: p3767_0003\n",
            1,
        );
    let path = dir.path().join("robot.yaml");
    std::fs::write(&path, text).unwrap();
    let out = deploy(&["plan", "-c", path.to_str().unwrap()]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("nvpmodel: mode 0 15W (nvpmodel_p3767_0003.conf, R35): CPUs 0-5 online"),
        "{text}"
    );
}

#[test]
fn plan_shows_what_a_channel_keeps_and_its_working_set() {
    // examples/orin-nano.yaml's trajectory channel as frames of 1 MiB in a
    // ring of 4: newest cycles through 4 + 1 slots, unread writes one.
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(example("orin-nano.yaml")).unwrap();
    let from = "    max_size: 16KiB\n    rate: 50\n    retention: 1s\n";
    assert!(text.contains(from));
    for (keep, slots) in [("newest", 5u64), ("unread", 1)] {
        let path = dir.path().join(format!("{keep}.yaml"));
        let to = format!(
            "    max_size: 1MiB\n    rate: 50\n    depth: 4\n    holds: 0\n    keep: {keep}\n"
        );
        std::fs::write(&path, text.replacen(from, &to, 1)).unwrap();
        let plan = plan_json(&path, keep);
        let ch = plan_channel(&plan, "/plan/trajectory");
        assert_eq!(ch["keep"], keep);
        let slot = ch["slot_bytes"].as_u64().unwrap();
        assert_eq!(
            ch["working_set_bytes"].as_u64().unwrap(),
            slots * slot,
            "{ch}"
        );
        let out = deploy(&["plan", "-c", path.to_str().unwrap()]);
        let text = String::from_utf8(out.stdout).unwrap();
        let line = format!("keep {keep}; working set");
        assert!(text.contains(&line), "{text}");
        assert_eq!(
            text.contains("(1 slot: the newest written again"),
            keep == "unread"
        );
    }
}
