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
        "irq.67",
        "irq.301",
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
    assert!(out.contains("DRIFT       irq.67                             mmc0: affinity 0-5 effective 0, planned 0-3"), "{out}");
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

/// Kills the supervisor when the test ends, however it ends.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `deploy supervise` on the fake tree `sysroot` with `yaml` as robot.yaml.
fn supervise(sysroot: &Path, prefix: &Path, yaml: &str) -> Killed {
    let cfg = prefix.join("robot.yaml");
    fs::write(&cfg, yaml).unwrap();
    Killed(
        Command::new(env!("CARGO_BIN_EXE_deploy"))
            .arg("-q")
            .arg("--sysroot")
            .arg(sysroot)
            .arg("--prefix")
            .arg(prefix)
            .arg("-c")
            .arg(&cfg)
            .arg("supervise")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// Waits (20 s at most) until the supervisor under `prefix` answers and
/// `f` holds.
fn wait_status(
    prefix: &Path,
    what: &str,
    f: &dyn Fn(&services::status::SupervisorStatus) -> bool,
) -> services::status::SupervisorStatus {
    let status = || {
        services::control::request(
            &services::control::socket_path(prefix),
            &services::control::Request::Status,
        )
        .ok()
        .and_then(|r| r.status)
    };
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        if let Some(s) = status() {
            if f(&s) {
                return s;
            }
        }
        assert!(
            std::time::Instant::now() < until,
            "timed out waiting for {what}: {:#?}",
            status()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A supervisor on a fresh Orin tree (cgroup v2) with a rule for can1's
/// IRQ thread (FIFO 92 on CPU 5) and `irqs.rescan: RESCAN`: the tree, the
/// prefix and the running supervisor.
fn canbot(rescan: &str) -> (tempfile::TempDir, tempfile::TempDir, Killed) {
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
    let sup = supervise(
        t.path(),
        p.path(),
        &format!("robot:\n  name: canbot\nboard:\n  model: jetson-orin-nano\ncpus:\n  housekeeping: 0-3\n  isolated: 4-5\nirqs:\n  default_affinity: 0-3\n  rescan: {rescan}\n  threads:\n    - match: \"irq/*-can1\"\n      policy: fifo\n      priority: 92\n      cpus: 5\nboot_check:\n  enabled: false\nprocesses:\n  - name: idle\n    exec: /bin/sleep\n    args: [\"600\"]\n"),
    );
    (t, p, sup)
}

/// can1 comes up in a fake Orin tree: IRQ 300 and its thread, as the
/// kernel would show them before anyone placed them (every CPU,
/// SCHED_FIFO 50). Returns the IRQ's /proc/irq directory and the thread's
/// /proc directory.
fn bring_up_can1(root: &Path) -> (PathBuf, PathBuf) {
    let irq = root.join("proc/irq/300");
    fs::create_dir_all(irq.join("can1")).unwrap();
    fs::write(irq.join("smp_affinity_list"), "0-5\n").unwrap();
    fs::write(irq.join("smp_affinity"), "3f\n").unwrap();
    fs::write(irq.join("effective_affinity_list"), "0\n").unwrap();
    fs::write(irq.join("effective_affinity"), "01\n").unwrap();
    // The new thread's stat and status are another IRQ thread's of the
    // tree, renamed.
    let (pid, comm) = fs::read_dir(root.join("proc"))
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let comm = fs::read_to_string(e.path().join("comm")).ok()?;
            comm.starts_with("irq/")
                .then(|| (pid, comm.trim().to_string()))
        })
        .min()
        .expect("an IRQ thread in the tree");
    let thread = root.join("proc/4300");
    fs::create_dir_all(&thread).unwrap();
    let stat = fs::read_to_string(root.join(format!("proc/{pid}/stat")))
        .unwrap()
        .replacen(&format!("{pid} ({comm})"), "4300 (irq/300-can1)", 1);
    let status_text = fs::read_to_string(root.join(format!("proc/{pid}/status")))
        .unwrap()
        .replace(&comm, "irq/300-can1")
        .replace(&format!("\t{pid}\n"), "\t4300\n");
    fs::write(thread.join("status"), status_text).unwrap();
    fs::write(thread.join("comm"), "irq/300-can1\n").unwrap();
    fs::write(thread.join("stat"), stat).unwrap();
    let mut interrupts = fs::read_to_string(root.join("proc/interrupts")).unwrap();
    interrupts.push_str(" 300:          0          0          0          0          0          0     GICv3  99 Level     can1\n");
    fs::write(root.join("proc/interrupts"), interrupts).unwrap();
    (irq, thread)
}

/// An interrupt and its IRQ thread that appear while the supervisor runs
/// (a CAN interface brought up: mttcan requests its IRQ in `open`, under
/// the interface name) are placed by the next scan as robot.yaml says: the
/// IRQ on the default affinity, the thread at its rule's policy, priority
/// and CPU.
#[test]
fn the_supervisor_places_an_irq_that_appears_after_it_started() {
    let (t, p, _sup) = canbot("50ms");
    let wait = |what: &str, f: &dyn Fn(&services::status::SupervisorStatus) -> bool| {
        wait_status(p.path(), what, f)
    };
    let s = wait("start-up", &|s| !s.startup.is_empty());
    assert!(
        s.irq_scan.is_none(),
        "nothing appeared yet: {:?}",
        s.irq_scan
    );

    let (irq, thread) = bring_up_can1(t.path());

    let s = wait("the scan to place can1", &|s| s.irq_scan.is_some());
    let scan = s.irq_scan.unwrap();
    assert_eq!(scan.step, "irq scan");
    assert!(
        scan.detail
            .starts_with("placed IRQ 300 (can1), thread irq/300-can1 (pid 4300): "),
        "{scan:?}"
    );
    assert_eq!(
        fs::read_to_string(irq.join("smp_affinity_list"))
            .unwrap()
            .trim(),
        "0-3"
    );
    let stat = fs::read_to_string(thread.join("stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
    // rt_priority and policy: fields 40 and 41 of stat (38 and 39 after
    // the comm).
    assert_eq!((fields[37], fields[38]), ("92", "1"), "{stat}");
    let status_text = fs::read_to_string(thread.join("status")).unwrap();
    assert!(
        status_text.contains("Cpus_allowed_list:\t5\n"),
        "{status_text}"
    );
}

/// With a scan period far longer than the test waits, the kernel's own
/// device event (root asks the kernel to send one for `lo`) brings the
/// scan forward: the IRQ that appeared is placed within seconds, and the
/// scan's status says it ran early and why.
#[test]
#[ignore = "needs root: writing /sys/class/net/lo/uevent makes the kernel send a uevent"]
fn a_kernel_event_brings_the_irq_scan_forward() {
    let uevent = "/sys/class/net/lo/uevent";
    if let Err(e) = fs::OpenOptions::new().write(true).open(uevent) {
        panic!("cannot make the kernel send a uevent ({uevent}: {e})");
    }
    let (t, p, _sup) = canbot("1h");
    wait_status(p.path(), "start-up", &|s| !s.startup.is_empty());
    let (irq, _) = bring_up_can1(t.path());
    std::thread::sleep(std::time::Duration::from_millis(300));
    let s = services::control::request(
        &services::control::socket_path(p.path()),
        &services::control::Request::Status,
    )
    .unwrap()
    .status
    .unwrap();
    assert!(
        s.irq_scan.is_none(),
        "no event yet, no scan: {:?}",
        s.irq_scan
    );

    fs::write(uevent, "change").unwrap();
    let s = wait_status(p.path(), "an early scan to place can1", &|s| {
        s.irq_scan.is_some()
    });
    let scan = s.irq_scan.unwrap();
    assert!(
        scan.detail
            .starts_with("placed IRQ 300 (can1), thread irq/300-can1 (pid 4300): "),
        "{scan:?}"
    );
    assert!(
        scan.detail.contains("(scanned early after uevent "),
        "{scan:?}"
    );
    assert_eq!(
        fs::read_to_string(irq.join("smp_affinity_list"))
            .unwrap()
            .trim(),
        "0-3"
    );
}

/// A power mode that switched off an isolated CPU (CPU 5 offline, as the
/// Orin Nano's 7 W mode leaves it) fails the supervisor's boot check
/// before any timing is measured, naming the CPU.
#[test]
fn the_boot_check_fails_when_a_planned_cpu_is_offline() {
    let (t, p) = tree("orin-nano-5.15");
    fs::write(t.path().join("sys/devices/system/cpu/online"), "0-4\n").unwrap();
    let _sup = supervise(
        t.path(),
        p.path(),
        "robot:\n  name: offbot\nboard:\n  model: jetson-orin-nano\ncpus:\n  housekeeping: 0-3\n  isolated: 4-5\n  partition: none\nboot_check:\n  enabled: true\n  duration: 1s\n  on_failure: degrade\nprocesses:\n  - name: idle\n    exec: /bin/sleep\n    args: [\"600\"]\n",
    );
    let s = wait_status(p.path(), "the boot check", &|s| {
        !s.boot_check.is_empty() && !s.startup.is_empty()
    });
    assert!(
        s.boot_check
            .starts_with("failed: the board is not as planned: cpus.online: "),
        "{}",
        s.boot_check
    );
    assert!(s.boot_check.contains('5'), "{}", s.boot_check);
}
