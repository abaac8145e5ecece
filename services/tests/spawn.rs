//! Spawning real processes: attributes read back from /proc, and failures
//! that come back with the step and the reason.

mod common;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use common::{has_cap, is_root, process};
use serde_json::json;
use services::accounts::Accounts;
use services::procfs;
use services::spawn::{prepare, spawn, Child, SpawnContext, Step};

fn ctx(prefix: &Path) -> SpawnContext {
    SpawnContext {
        prefix: prefix.to_path_buf(),
        accounts: Accounts::load(prefix).unwrap(),
        own_ids: (
            rustix::process::geteuid().as_raw(),
            rustix::process::getegid().as_raw(),
        ),
        rt_cgroup: None,
        housekeeping_cgroup: None,
        base_env: BTreeMap::from([("PATH".to_string(), "/usr/bin:/bin".to_string())]),
        deny: None,
    }
}

/// CAP_SYS_RESOURCE (bit 24) in the effective set.
fn has_cap_sys_resource() -> bool {
    has_cap(24)
}

fn one_cpu() -> units::cpu::CpuSet {
    let mut s = units::cpu::CpuSet::new();
    s.insert(0);
    s
}

/// Reads the child's output until it closes stdout.
fn output(c: &Child) -> String {
    rustix::fs::fcntl_setfl(&c.output, rustix::fs::OFlags::empty()).unwrap();
    let mut f = std::fs::File::from(c.output.try_clone().unwrap());
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    s
}

fn reap(c: &Child) -> Option<i32> {
    let (_, st) = rustix::process::waitpid(
        rustix::process::Pid::from_raw(c.pid),
        rustix::process::WaitOptions::empty(),
    )
    .unwrap()
    .unwrap();
    st.exit_status()
}

#[test]
fn args_env_and_working_dir_reach_the_process() {
    let prefix = common::prefix();
    let p = process(json!({
        "name": "echo", "exec": "/bin/sh",
        "args": ["-c", "pwd; echo \"$GREETING $RTDEPLOY_PROCESS\"; echo to-stderr >&2; exit 7"],
        "env": {"GREETING": "hello world"}, "working_dir": "/usr",
    }));
    let child = spawn(&prepare(&p, &one_cpu(), &ctx(prefix.path())).unwrap()).unwrap();
    assert_eq!(output(&child), "/usr\nhello world echo\nto-stderr\n");
    assert_eq!(reap(&child), Some(7));
}

/// Runs `f` on a thread of its own at nice `nice` (raising a nice value
/// needs no privilege) whose effective capabilities lack `drop`
/// (capabilities are per thread; a child forked from it inherits both).
fn on_thread<T: Send + 'static>(
    nice: Option<i32>,
    drop: rustix::thread::CapabilitySet,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    std::thread::spawn(move || {
        if let Some(n) = nice {
            rustix::process::setpriority_process(Some(rustix::thread::gettid()), n).unwrap();
        }
        let mut caps = rustix::thread::capabilities(None).unwrap();
        caps.effective.remove(drop);
        rustix::thread::set_capabilities(None, caps).unwrap();
        f()
    })
    .join()
    .unwrap()
}

fn kill_and_reap(child: &Child) {
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(child.pid).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    reap(child);
}

#[test]
#[ignore = "needs root: SCHED_FIFO, rlimits above the hard limit, setuid and setgid"]
fn attributes_in_force_read_back_from_proc() {
    assert!(is_root(), "run as root (cargo test -- --include-ignored)");
    let prefix = common::prefix();
    let p = process(json!({
        "name": "rt", "exec": "/bin/sleep", "args": ["30"],
        "policy": "fifo", "priority": 17, "cpus": "0", "user": "nobody", "group": "rtctl",
        "memlock": "64MiB", "rttime": "500ms",
    }));
    let child = spawn(&prepare(&p, &one_cpu(), &ctx(prefix.path())).unwrap()).unwrap();
    let f = procfs::in_force(Path::new("/proc"), child.pid).unwrap();
    assert_eq!(
        (f.policy.as_str(), f.priority, f.cpus.as_str()),
        ("fifo", 17, "0")
    );
    assert_eq!((f.uid, f.gid), (65534, 4242));
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", child.pid)).unwrap();
    let line = |name: &str| {
        limits
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    if has_cap_sys_resource() {
        assert!(child.warnings.is_empty(), "{:?}", child.warnings);
        assert!(
            line("Max realtime priority").ends_with("17 17"),
            "{}",
            line("Max realtime priority")
        );
        assert!(
            line("Max locked memory").contains("67108864 67108864"),
            "{}",
            line("Max locked memory")
        );
        assert!(
            line("Max realtime timeout").contains("500000 500000"),
            "{}",
            line("Max realtime timeout")
        );
    } else {
        // Root without CAP_SYS_RESOURCE (a container): hard limits cannot
        // be raised; each such rlimit comes back as a warning, the start
        // goes on, and limits at or below the hard limit are set.
        eprintln!("no CAP_SYS_RESOURCE: checking the rlimit warnings instead of the limits");
        for (step, limit) in [
            ("setrlimit RTPRIO 17", "Max realtime priority"),
            ("setrlimit MEMLOCK 67108864", "Max locked memory"),
            ("setrlimit RTTIME 500000us", "Max realtime timeout"),
        ] {
            let warned = child
                .warnings
                .iter()
                .any(|w| w.starts_with(&format!("{step} failed: Operation not permitted")));
            let set = line(limit).contains(step.rsplit(' ').next().unwrap().trim_end_matches("us"));
            assert!(
                warned != set,
                "{step}: warned {warned}, limit line `{}`, warnings {:?}",
                line(limit),
                child.warnings
            );
        }
    }
    let stat = procfs::read_stat(Path::new("/proc"), child.pid).unwrap();
    assert_eq!(
        stat.pgrp, child.pid,
        "the process leads its own process group"
    );
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(child.pid).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    reap(&child);
}

#[test]
fn a_raised_nice_applies_to_an_other_process() {
    let prefix = common::prefix();
    let c = ctx(prefix.path());
    let p = process(json!({"name": "bg", "exec": "/bin/sleep", "args": ["30"], "nice": 19}));
    let (child, inherited) = on_thread(None, rustix::thread::CapabilitySet::empty(), move || {
        let own = rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap();
        (spawn(&prepare(&p, &one_cpu(), &c).unwrap()).unwrap(), own)
    });
    let f = procfs::in_force(Path::new("/proc"), child.pid).unwrap();
    kill_and_reap(&child);
    assert_eq!(
        (f.policy.as_str(), f.nice, f.cpus.as_str()),
        ("other", 19, "0"),
        "asked for nice 19 from nice {inherited}"
    );
}

#[test]
#[ignore = "needs root: lowering a nice value needs CAP_SYS_NICE"]
fn a_lowered_nice_applies_with_cap_sys_nice() {
    let prefix = common::prefix();
    let c = ctx(prefix.path());
    let p = process(json!({"name": "bg", "exec": "/bin/sleep", "args": ["30"], "nice": 7}));
    let child = on_thread(
        Some(19),
        rustix::thread::CapabilitySet::empty(),
        move || spawn(&prepare(&p, &one_cpu(), &c).unwrap()).unwrap(),
    );
    let f = procfs::in_force(Path::new("/proc"), child.pid).unwrap();
    kill_and_reap(&child);
    assert_eq!((f.policy.as_str(), f.nice), ("other", 7));
}

#[test]
fn a_process_without_nice_keeps_the_nice_it_inherits() {
    // The supervisor started under `nice -n 19` (a shell, a unit with
    // Nice=19): a process robot.yaml gives no nice value starts at 19, and
    // is not refused for want of CAP_SYS_NICE to set nice 0.
    let prefix = common::prefix();
    let c = ctx(prefix.path());
    let p = process(json!({"name": "bg", "exec": "/bin/sleep", "args": ["30"]}));
    let result = on_thread(
        Some(19),
        rustix::thread::CapabilitySet::SYS_NICE,
        move || spawn(&prepare(&p, &one_cpu(), &c).unwrap()),
    );
    let child = result.unwrap();
    let f = procfs::in_force(Path::new("/proc"), child.pid).unwrap();
    kill_and_reap(&child);
    assert_eq!((f.policy.as_str(), f.nice), ("other", 19));
}

#[test]
fn a_refused_nice_names_the_privilege_it_needs() {
    // Lowering nice 19 to -20 needs CAP_SYS_NICE (dropped on the thread
    // that forks) or an RLIMIT_NICE of 40.
    let prefix = common::prefix();
    let c = ctx(prefix.path());
    let p = process(json!({"name": "bg", "exec": "/bin/sleep", "args": ["30"], "nice": -20}));
    let result = on_thread(
        Some(19),
        rustix::thread::CapabilitySet::SYS_NICE,
        move || spawn(&prepare(&p, &one_cpu(), &c).unwrap()),
    );
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nice);
    if limit.current.is_none_or(|l| l >= 40) {
        // This machine's RLIMIT_NICE allows it: the start must succeed.
        let child = result.unwrap();
        let f = procfs::in_force(Path::new("/proc"), child.pid).unwrap();
        kill_and_reap(&child);
        assert_eq!(f.nice, -20);
        return;
    }
    let err = result.unwrap_err().to_string();
    assert!(
        err.starts_with(
            "process `bg`: sched_setattr other nice -20 failed: Operation not permitted (os error 1); \
             nice -20 is below the supervisor's nice 19, and lowering it needs root, CAP_SYS_NICE or \
             an RLIMIT_NICE of at least 40"
        ),
        "{err}"
    );
    for how in [
        "LimitNICE=-20",
        "prlimit --nice=40",
        "not under `nice -n 19`",
    ] {
        assert!(err.contains(how), "{how}: {err}");
    }
}

#[test]
fn a_missing_executable_fails_with_its_path_and_reason() {
    let prefix = common::prefix();
    let p = process(json!({"name": "ghost", "exec": "bin/does_not_exist"}));
    let err = spawn(&prepare(&p, &one_cpu(), &ctx(prefix.path())).unwrap()).unwrap_err();
    let expected = format!(
        "process `ghost`: exec {}/opt/rtdeploy/current/bin/does_not_exist failed: No such file or directory (os error 2)",
        prefix.path().display()
    );
    assert_eq!(err.to_string(), expected);
    assert!(matches!(
        err,
        services::spawn::ProcessSpawnError::Child {
            step: Step::Exec,
            ..
        }
    ));
}

#[test]
fn an_unknown_user_fails_before_forking() {
    let prefix = common::prefix();
    let p = process(json!({"name": "who", "exec": "/bin/true", "user": "ghost"}));
    let err = prepare(&p, &one_cpu(), &ctx(prefix.path())).err().unwrap();
    assert_eq!(
        err.to_string(),
        format!(
            "process `who`: unknown user `ghost` (not in {}/etc/passwd)",
            prefix.path().display()
        )
    );
}

#[test]
fn a_failing_step_in_the_child_is_named() {
    let prefix = common::prefix();
    // CPU 1000 exists on no machine this runs on: sched_setaffinity fails
    // in the child with EINVAL, which no privilege changes: no hint.
    let mut cpus = units::cpu::CpuSet::new();
    cpus.insert(1000);
    let p = process(json!({"name": "far", "exec": "/bin/true"}));
    let err = spawn(&prepare(&p, &cpus, &ctx(prefix.path())).unwrap()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "process `far`: sched_setaffinity to CPUs 1000 failed: Invalid argument (os error 22)"
    );
}

#[test]
#[ignore = "needs root: changing to user nobody needs CAP_SETUID and CAP_SETGID"]
fn a_missing_working_directory_fails_at_chdir_after_the_ids_changed() {
    let prefix = common::prefix();
    let p = process(
        json!({"name": "cwd", "exec": "/bin/true", "working_dir": "/nonexistent/dir", "user": "nobody"}),
    );
    let err = spawn(&prepare(&p, &one_cpu(), &ctx(prefix.path())).unwrap()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "process `cwd`: chdir to /nonexistent/dir failed: No such file or directory (os error 2)"
    );
}

#[test]
fn a_refused_real_time_policy_names_the_privilege_it_needs() {
    // Without CAP_SYS_NICE and CAP_SYS_RESOURCE (dropped on the forking
    // thread, so this holds for root too), SCHED_FIFO 99 above the hard
    // RLIMIT_RTPRIO is refused: the rlimit the child cannot raise is a
    // warning, the sched_setattr after it fails the start.
    let prefix = common::prefix();
    let c = ctx(prefix.path());
    let p = process(json!({"name": "rt", "exec": "/bin/true", "policy": "fifo", "priority": 99}));
    let result = on_thread(
        None,
        rustix::thread::CapabilitySet::SYS_NICE | rustix::thread::CapabilitySet::SYS_RESOURCE,
        move || spawn(&prepare(&p, &one_cpu(), &c).unwrap()),
    );
    let hard = rustix::process::getrlimit(rustix::process::Resource::Rtprio).maximum;
    if hard.is_none_or(|h| h >= 99) {
        // This machine's limit allows it: the start must succeed.
        let child = result.unwrap();
        reap(&child);
        return;
    }
    let err = result.unwrap_err().to_string();
    assert!(
        err.starts_with(
            "process `rt`: sched_setattr fifo 99 failed: Operation not permitted (os error 1); \
             SCHED_FIFO 99 needs root, CAP_SYS_NICE or an RLIMIT_RTPRIO of at least 99"
        ),
        "{err}"
    );
    for how in [
        "LimitRTPRIO=99",
        "AmbientCapabilities=CAP_SYS_NICE",
        "prlimit --rtprio=99",
    ] {
        assert!(err.contains(how), "{how}: {err}");
    }
}

#[test]
fn a_refused_user_change_names_the_privilege_it_needs() {
    let prefix = common::prefix();
    let c = ctx(prefix.path());
    let p = process(json!({"name": "as", "exec": "/bin/true", "user": "nobody"}));
    let result = on_thread(
        None,
        rustix::thread::CapabilitySet::SETUID | rustix::thread::CapabilitySet::SETGID,
        move || spawn(&prepare(&p, &one_cpu(), &c).unwrap()),
    );
    if rustix::process::geteuid().as_raw() == 65534 {
        // Already nobody: nothing to change.
        reap(&result.unwrap());
        return;
    }
    let err = result.unwrap_err().to_string();
    assert!(
        err.contains("failed: Operation not permitted (os error 1); running a process as another user or group (uid 65534, gid 65534) needs root (CAP_SETUID and CAP_SETGID"),
        "{err}"
    );
}

/// A writable cgroup v2 hierarchy: the unified mount of a hybrid system,
/// or the cgroup2 root.
fn cgroup2_root() -> Option<std::path::PathBuf> {
    ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .iter()
        .map(std::path::PathBuf::from)
        .find(|p| p.join("cgroup.procs").exists() && p.join("cgroup.controllers").exists())
}

#[test]
#[ignore = "needs root: creating a cgroup in the cgroup v2 hierarchy"]
fn processes_join_their_cgroup() {
    let root = cgroup2_root().expect("a cgroup v2 hierarchy at /sys/fs/cgroup");
    let name = format!("rtdeploy-test-{}", std::process::id());
    let dir = root.join(&name);
    std::fs::create_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot create a cgroup under {}: {e}", root.display()));
    let prefix = common::prefix();
    let mut c = ctx(prefix.path());
    c.housekeeping_cgroup = Some(dir.join("cgroup.procs"));
    let p = process(json!({"name": "cg", "exec": "/bin/sleep", "args": ["30"]}));
    let child = spawn(&prepare(&p, &one_cpu(), &c).unwrap()).unwrap();
    let cgroups = std::fs::read_to_string(format!("/proc/{}/cgroup", child.pid)).unwrap();
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(child.pid).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    reap(&child);
    let _ = std::fs::remove_dir(&dir);
    assert!(
        cgroups
            .lines()
            .any(|l| l.starts_with("0::/") && l.ends_with(&format!("/{name}"))),
        "{cgroups}"
    );
}

#[test]
fn the_cgroup_is_found_where_the_cpu_plan_makes_it() {
    let sys = tempfile::tempdir().unwrap();
    assert_eq!(services::supervisor::find_cgroup(sys.path(), "rt"), None);
    let v1 = sys.path().join("fs/cgroup/cpuset/rtdeploy/rt");
    std::fs::create_dir_all(&v1).unwrap();
    std::fs::write(v1.join("cgroup.procs"), "").unwrap();
    assert_eq!(
        services::supervisor::find_cgroup(sys.path(), "rt"),
        Some(v1.join("cgroup.procs"))
    );
    let v2 = sys.path().join("fs/cgroup/rtdeploy/rt");
    std::fs::create_dir_all(&v2).unwrap();
    std::fs::write(v2.join("cgroup.procs"), "").unwrap();
    assert_eq!(
        services::supervisor::find_cgroup(sys.path(), "rt"),
        Some(v2.join("cgroup.procs"))
    );
    assert_eq!(
        services::supervisor::find_cgroup(sys.path(), "housekeeping"),
        None
    );
}
