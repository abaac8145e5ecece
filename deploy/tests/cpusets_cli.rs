//! `deploy apply` and `deploy verify` run as the real binary against fake
//! /proc and /sys trees copied from the captured fixtures in
//! cpusets/fixtures (every on-robot path under a temporary --prefix).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dst);
        } else if e.file_name() != ".keep" {
            fs::copy(e.path(), &dst).unwrap();
        }
    }
}

/// A copy of a fixture tree, and a prefix for on-robot state.
fn tree(fixture: &str) -> (tempfile::TempDir, tempfile::TempDir) {
    let t = tempfile::tempdir().unwrap();
    copy_dir(&repo().join("cpusets/fixtures").join(fixture), t.path());
    (t, tempfile::tempdir().unwrap())
}

/// The files the kernel creates in new cgroup directories, which `mkdir`
/// in a temporary directory does not.
fn cgroup_dirs(root: &Path, mount: &str, files: &[(&str, &str)]) {
    for dir in ["rtdeploy", "rtdeploy/rt", "rtdeploy/housekeeping"] {
        let d = root.join(mount).join(dir);
        fs::create_dir_all(&d).unwrap();
        for (f, v) in files {
            fs::write(d.join(f), v).unwrap();
        }
    }
}

fn deploy(sysroot: &Path, prefix: &Path, yaml: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_deploy"))
        .arg("--sysroot")
        .arg(sysroot)
        .arg("--prefix")
        .arg(prefix)
        .arg("-c")
        .arg(repo().join("examples").join(yaml))
        .args(args)
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn snapshot(root: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((p.clone(), fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn apply_dry_run_prints_every_write_and_changes_nothing() {
    let (t, p) = tree("host-6.18");
    let before = snapshot(t.path());
    let o = deploy(t.path(), p.path(), "dev.yaml", &["apply", "--dry-run"]);
    let out = stdout(&o);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.contains("would write /proc/sys/kernel/sched_rt_runtime_us  950000 -> -1"),
        "{out}"
    );
    assert!(
        out.contains("would write /proc/irq/26/smp_affinity_list  0-1 -> 0  [irq 26 ttyS0]"),
        "{out}"
    );
    assert!(
        out.contains("would write /sys/devices/virtual/workqueue/cpumask  3 -> 1"),
        "{out}"
    );
    assert!(
        out.contains("would write /proc/51/status  1 -> 0  [thread 51 irq/25-ACPI:Ged cpus]"),
        "{out}"
    );
    assert!(out.contains("dry run: 0 changed"), "{out}");
    assert_eq!(snapshot(t.path()), before);
    assert!(!p
        .path()
        .join("var/lib/rtdeploy/cpusets-apply.json")
        .exists());
}

#[test]
fn apply_twice_changes_nothing_the_second_time() {
    let (t, p) = tree("host-6.18");
    cgroup_dirs(
        t.path(),
        "sys/fs/cgroup/cpuset",
        &[
            ("cpuset.cpus", ""),
            ("cpuset.mems", ""),
            ("cpuset.cpu_exclusive", "0"),
            ("cpuset.sched_load_balance", "1"),
        ],
    );
    let o = deploy(t.path(), p.path(), "dev.yaml", &["apply"]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stdout(&o).contains("changed     /proc/sys/kernel/sched_rt_runtime_us  950000 -> -1"));
    assert!(p
        .path()
        .join("var/lib/rtdeploy/cpusets-apply.json")
        .exists());
    let o = deploy(t.path(), p.path(), "dev.yaml", &["--json", "apply"]);
    assert_eq!(o.status.code(), Some(0));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["schema_version"], 1);
    let actions = doc["apply"]["actions"].as_array().unwrap();
    assert!(actions.len() > 30);
    for a in actions {
        assert_eq!(a["outcome"], "unchanged", "{a}");
    }
    assert_eq!(doc["plan"]["cpus"]["isolated"], "1");
}

#[test]
fn verify_with_drift_exits_1_and_names_each_item() {
    let (t, p) = tree("orin-nano-5.15");
    let after = t.path().join("proc/interrupts.after");
    let o = deploy(
        t.path(),
        p.path(),
        "orin-nano.yaml",
        &[
            "--json",
            "verify",
            "--interrupts-after",
            after.to_str().unwrap(),
        ],
    );
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["in_sync"], false);
    let drifted: Vec<&str> = doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == "drift")
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    for id in [
        "irq.14",
        "irq.17",
        "sysctl.kernel.sched_rt_runtime_us",
        "workqueue.cpumask",
        "cgroup.rt.partition",
        "cpufreq.cpu5.locked",
    ] {
        assert!(drifted.contains(&id), "{id} missing from {drifted:?}");
    }
    assert!(
        !drifted.contains(&"cmdline.isolcpus"),
        "the fixture booted with the planned line"
    );

    // Text output names them too, with a fix.
    let o = deploy(
        t.path(),
        p.path(),
        "orin-nano.yaml",
        &["verify", "--interrupts-after", after.to_str().unwrap()],
    );
    let out = stdout(&o);
    assert!(out.contains("DRIFT       irq.14                             mmc0: affinity 0-5 effective 0, planned 0-3"), "{out}");
    assert!(out.contains("fix: run `deploy apply`"), "{out}");
}

#[test]
fn verify_after_apply_is_in_sync_on_the_orin_tree() {
    let (t, p) = tree("orin-nano-5.15");
    cgroup_dirs(
        t.path(),
        "sys/fs/cgroup",
        &[
            ("cgroup.subtree_control", ""),
            ("cpuset.cpus", ""),
            ("cpuset.cpus.partition", "member"),
            ("cpuset.cpus.exclusive", ""),
        ],
    );
    let o = deploy(t.path(), p.path(), "orin-nano.yaml", &["apply"]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    // The kernel's part: effective affinity follows the new affinity.
    for e in fs::read_dir(t.path().join("proc/irq")).unwrap() {
        let d = e.unwrap().path();
        if let Ok(list) = fs::read_to_string(d.join("smp_affinity_list")) {
            let first = list.trim().split([',', '-']).next().unwrap().to_string();
            fs::write(d.join("effective_affinity_list"), first).unwrap();
        }
    }
    let after = t.path().join("proc/interrupts.after");
    let o = deploy(
        t.path(),
        p.path(),
        "orin-nano.yaml",
        &["verify", "--interrupts-after", after.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stdout(&o).contains("in sync:"), "{}", stdout(&o));
}

#[test]
fn verify_without_a_proc_tree_is_an_error() {
    let empty = tempfile::tempdir().unwrap();
    let p = tempfile::tempdir().unwrap();
    let o = deploy(
        empty.path(),
        p.path(),
        "dev.yaml",
        &["verify", "--window-ms", "0"],
    );
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    let want = format!(
        "cannot read {}/sys/devices/system/cpu/online: No such file or directory",
        empty.path().display()
    );
    assert!(err.starts_with("deploy: ") && err.contains(&want), "{err}");
    assert_eq!(
        err.matches("No such file").count(),
        1,
        "the cause is said once: {err}"
    );
}
