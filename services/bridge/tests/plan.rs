//! The bridge program against plans it must refuse: none, garbage, one
//! too large, one of a type whose hash the plan misstates. Each ends it
//! at once (exit 1) with the reason, before it opens a network session.

use std::process::Command;

const BRIDGE: &str = env!("CARGO_BIN_EXE_rtdeploy-bridge");

fn run(plan: Option<&str>) -> (Option<i32>, String) {
    let mut c = Command::new(BRIDGE);
    c.env_remove("RTDEPLOY_BRIDGE_PLAN");
    if let Some(p) = plan {
        c.env("RTDEPLOY_BRIDGE_PLAN", p);
    }
    let o = c.output().unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn a_plan_that_is_missing_or_not_one_is_refused_with_why() {
    let (code, err) = run(None);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("RTDEPLOY_BRIDGE_PLAN is not set"), "{err}");
    let (code, err) = run(Some("{\"robot\": 3"));
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("RTDEPLOY_BRIDGE_PLAN: "), "{err}");
    let big = "x".repeat(100 << 10);
    let (code, err) = run(Some(&big));
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("more than a plan takes"), "{err}");
}

#[test]
fn a_plan_whose_type_hash_is_not_its_types_is_refused() {
    let plan = serde_json::json!({
        "robot": "r", "mode": "peer", "connect": [], "listen": ["tcp/127.0.0.1:0"],
        "multicast_scouting": false, "domain_id": 0, "node": "r", "memory": 67108864,
        "links": [{
            "channel": "/demo/chatter", "max_size": 64, "direction": "out",
            "ros2": {"name": "demo/Chatter", "fields": ["uint64 seq", "uint64 deadline_ns"],
                     "dds_type": "demo::msg::dds_::Chatter_", "hash": "RIHS01_00"},
            "from": null, "reliable": false, "priority": 5, "ttl_ns": null, "rate": null
        }]
    });
    let (code, err) = run(Some(&plan.to_string()));
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("the plan's type hash RIHS01_00 is not RIHS01_"),
        "{err}"
    );
}
