//! Jetson power modes: each board's nvpmodel modes against the CPUs a plan
//! uses, `nvpmodel` run by apply (a stand-in script that records how it was
//! called and asks for a reboot on standard input), and verify on a tree
//! whose planned CPUs are offline or whose mode differs.
//!
//! The modes and the CPUs each keeps online are written out below as
//! NVIDIA's nvpmodel configuration files give them (the files and commits
//! are cited in cpusets/src/power.rs), not read from the crate's table.

mod common;

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::LazyLock;
use std::time::Duration;

use common::*;
use cpusets::apply::{self, ApplyOptions, ApplyReport, Outcome, ThreadControl};
use cpusets::config::{
    BoardSection, CpusSection, IrqsSection, KernelSection, PartitionKind, PowerSection,
    SysctlSection,
};
use cpusets::plan::{self, FreqLock, Inventory};
use cpusets::power::{self, NvpmodelMode, NvpmodelTool};
use cpusets::verify::{self, Status, VerifyOptions};
use units::cpu::CpuSet;

/// (board, configuration, mode, id, CPUs online) for every mode of every
/// configuration file, from the `CPU_ONLINE CORE_n` lines of NVIDIA's
/// files.
const MODES: &[(&str, &str, &str, u32, &str)] = &[
    // nvpmodel_p3701_0000.conf (R36 and R35), AGX Orin 64GB / devkit.
    ("jetson-agx-orin-64", "p3701_0000", "MAXN", 0, "0-11"),
    ("jetson-agx-orin-64", "p3701_0000", "MODE_15W", 1, "0-3"),
    ("jetson-agx-orin-64", "p3701_0000", "MODE_30W", 2, "0-7"),
    ("jetson-agx-orin-64", "p3701_0000", "MODE_50W", 3, "0-11"),
    // nvpmodel_p3701_0004.conf (R36 and R35), AGX Orin 32GB.
    ("jetson-agx-orin-32", "p3701_0004", "MAXN", 0, "0-7"),
    ("jetson-agx-orin-32", "p3701_0004", "MODE_15W", 1, "0-3"),
    ("jetson-agx-orin-32", "p3701_0004", "MODE_30W", 2, "0-7"),
    ("jetson-agx-orin-32", "p3701_0004", "MODE_40W", 3, "0-7"),
    // nvpmodel_p3767_0000_super.conf (R36), Orin NX 16GB.
    (
        "jetson-orin-nx-16",
        "p3767_0000_super",
        "MAXN_SUPER",
        0,
        "0-7",
    ),
    ("jetson-orin-nx-16", "p3767_0000_super", "10W", 1, "0-3"),
    ("jetson-orin-nx-16", "p3767_0000_super", "15W", 2, "0-3"),
    ("jetson-orin-nx-16", "p3767_0000_super", "25W", 3, "0-7"),
    ("jetson-orin-nx-16", "p3767_0000_super", "40W", 4, "0-7"),
    // nvpmodel_p3767_0000.conf (R35).
    ("jetson-orin-nx-16", "p3767_0000", "MAXN", 0, "0-7"),
    ("jetson-orin-nx-16", "p3767_0000", "10W", 1, "0-3"),
    ("jetson-orin-nx-16", "p3767_0000", "15W", 2, "0-3"),
    ("jetson-orin-nx-16", "p3767_0000", "25W", 3, "0-7"),
    // nvpmodel_p3767_0001_super.conf (R36), Orin NX 8GB.
    (
        "jetson-orin-nx-8",
        "p3767_0001_super",
        "MAXN_SUPER",
        0,
        "0-5",
    ),
    ("jetson-orin-nx-8", "p3767_0001_super", "10W", 1, "0-3"),
    ("jetson-orin-nx-8", "p3767_0001_super", "15W", 2, "0-3"),
    ("jetson-orin-nx-8", "p3767_0001_super", "20W", 3, "0-5"),
    ("jetson-orin-nx-8", "p3767_0001_super", "40W", 4, "0-5"),
    // nvpmodel_p3767_0001.conf (R35).
    ("jetson-orin-nx-8", "p3767_0001", "MAXN", 0, "0-5"),
    ("jetson-orin-nx-8", "p3767_0001", "10W", 1, "0-3"),
    ("jetson-orin-nx-8", "p3767_0001", "15W", 2, "0-3"),
    ("jetson-orin-nx-8", "p3767_0001", "20W", 3, "0-5"),
    // nvpmodel_p3767_0003_super.conf (R36), Orin Nano 8GB.
    ("jetson-orin-nano", "p3767_0003_super", "15W", 0, "0-5"),
    ("jetson-orin-nano", "p3767_0003_super", "25W", 1, "0-5"),
    (
        "jetson-orin-nano",
        "p3767_0003_super",
        "MAXN_SUPER",
        2,
        "0-5",
    ),
    // nvpmodel_p3767_0003.conf (R35).
    ("jetson-orin-nano", "p3767_0003", "15W", 0, "0-5"),
    ("jetson-orin-nano", "p3767_0003", "7W", 1, "0-3"),
    // nvpmodel_p3767_0004_super.conf (R36), Orin Nano 4GB.
    ("jetson-orin-nano", "p3767_0004_super", "10W", 0, "0-5"),
    ("jetson-orin-nano", "p3767_0004_super", "25W", 1, "0-5"),
    (
        "jetson-orin-nano",
        "p3767_0004_super",
        "MAXN_SUPER",
        2,
        "0-5",
    ),
    // nvpmodel_p3767_0004.conf (R35).
    ("jetson-orin-nano", "p3767_0004", "10W", 0, "0-5"),
    ("jetson-orin-nano", "p3767_0004", "7W_AI", 1, "0-3"),
    ("jetson-orin-nano", "p3767_0004", "7W_CPU", 2, "0-3"),
];

/// `< PM_CONFIG DEFAULT=n >` of each file.
const DEFAULTS: &[(&str, u32)] = &[
    ("p3701_0000", 2),
    ("p3701_0004", 2),
    ("p3767_0000_super", 4),
    ("p3767_0000", 2),
    ("p3767_0001_super", 4),
    ("p3767_0001", 2),
    ("p3767_0003_super", 1),
    ("p3767_0003", 0),
    ("p3767_0004_super", 1),
    ("p3767_0004", 0),
];

fn cpus(s: &str) -> CpuSet {
    s.parse().unwrap()
}

fn power(mode: &str, conf: &str) -> PowerSection {
    PowerSection {
        nvpmodel: Some(NvpmodelMode::Name(mode.into())),
        nvpmodel_conf: Some(conf.into()),
        ..PowerSection::default()
    }
}

fn board(model: &str) -> BoardSection {
    BoardSection {
        model: model.into(),
        cpus: None,
        memory: None,
    }
}

/// The CPU count of a board, as NVIDIA's module data gives it.
fn cpu_count(model: &str) -> u32 {
    match model {
        "jetson-agx-orin-64" => 12,
        "jetson-agx-orin-32" | "jetson-orin-nx-16" => 8,
        _ => 6,
    }
}

/// Every mode by name and by id, with each CPU of the board isolated in
/// turn: config check accepts exactly the CPUs the mode keeps online, and
/// says which mode, which CPUs it keeps and which are in use when it
/// refuses; the plan holds the mode's CPUs.
#[test]
fn each_mode_keeps_the_cpus_nvidia_lists() {
    for &(model, conf, name, id, online) in MODES {
        let want = cpus(online);
        let b = board(model);
        for by in [NvpmodelMode::Name(name.into()), NvpmodelMode::Id(id)] {
            let p = PowerSection {
                nvpmodel: Some(by.clone()),
                ..power(name, conf)
            };
            let r = p.nvpmodel_mode(&b).unwrap().unwrap();
            assert_eq!((r.mode.id, r.mode.name), (id, name), "{model} {conf} {by}");
            assert_eq!(r.mode.online_cpus(), want, "{model} {conf} {name}");
        }
        let p = power(name, conf);
        for cpu in 1..cpu_count(model) {
            let uses = [("cpus.isolated".to_string(), CpuSet::from_iter([cpu]))];
            let mut out = Vec::new();
            p.validate_board(&b, &uses, &mut out);
            if want.contains(cpu) {
                assert!(out.is_empty(), "{model} {conf} {name} CPU {cpu}: {out:?}");
            } else {
                assert_eq!(out.len(), 1, "{model} {conf} {name} CPU {cpu}: {out:?}");
                let (field, msg) = &out[0];
                assert_eq!(field, "power.nvpmodel");
                for part in [
                    format!("`{name}` (id {id}) of nvpmodel_{conf}.conf"),
                    format!("keeps only CPUs {online} online"),
                    format!("the plan uses CPUs {cpu} (cpus.isolated {cpu})"),
                    format!("CPUs {cpu} would be offline"),
                ] {
                    assert!(
                        msg.contains(&part),
                        "{model} {conf} {name}: `{part}` not in {msg}"
                    );
                }
            }
            let sections = Sections {
                board: b.clone(),
                cpus: CpusSection {
                    housekeeping: Some(cpus("0")),
                    isolated: CpuSet::from_iter([cpu]),
                    nohz_full: true,
                    partition: PartitionKind::None,
                },
                kernel: KernelSection::default(),
                irqs: IrqsSection::default(),
                sysctl: SysctlSection::new(),
                power: p.clone(),
            };
            let rt = plan::plan(&sections.isolation(), &Inventory::default()).unwrap();
            let m = rt.power.nvpmodel.as_ref().unwrap();
            assert_eq!((m.id, &m.online), (id, &want), "{model} {conf} {name}");
            assert_eq!(rt.cpufreq.lock_cpus, want, "{model} {conf} {name}");
            assert_eq!(
                rt.warnings.iter().any(|w| w.contains("would be offline")),
                !want.contains(cpu),
                "{model} {conf} {name} CPU {cpu}: {:?}",
                rt.warnings
            );
        }
    }
}

#[test]
fn every_mode_of_each_file_is_listed_and_its_default_is_nvidias() {
    for &(conf, default) in DEFAULTS {
        let c = power::find_conf(conf).unwrap();
        assert_eq!(c.default_id, default, "{conf}");
        let listed: Vec<(u32, &str)> = MODES
            .iter()
            .filter(|m| m.1 == conf)
            .map(|m| (m.3, m.2))
            .collect();
        let table: Vec<(u32, &str)> = c.modes.iter().map(|m| (m.id, m.name)).collect();
        assert_eq!(table, listed, "{conf}");
    }
    assert_eq!(power::CONFS.len(), DEFAULTS.len());
}

/// The Orin NX 16GB's 15W mode, its default in R35, keeps the first
/// cluster only: a plan isolating the second cluster is refused, naming
/// every user of the offline CPUs and the modes that would do.
#[test]
fn the_default_nx_mode_refuses_the_second_cluster() {
    let p = power("15W", "p3767_0000");
    let uses = vec![
        ("cpus.isolated".to_string(), cpus("4-7")),
        ("processes[0] `imu`".to_string(), cpus("4-5")),
        ("irqs.threads[1].cpus".to_string(), cpus("1")),
    ];
    let mut out = Vec::new();
    p.validate_board(&board("jetson-orin-nx-16"), &uses, &mut out);
    assert_eq!(out.len(), 1, "{out:?}");
    let msg = &out[0].1;
    assert!(
        msg.contains("the plan uses CPUs 1,4-7 (cpus.isolated 4-7, processes[0] `imu` 4-5)"),
        "{msg}"
    );
    assert!(
        msg.contains("choose a mode that keeps them online: 0 MAXN, 3 25W"),
        "{msg}"
    );
}

#[test]
fn a_board_without_modes_and_unknown_modes_are_refused() {
    for model in ["generic", "qemu-x86_64"] {
        let p = PowerSection {
            nvpmodel: Some(NvpmodelMode::Name("15W".into())),
            ..PowerSection::default()
        };
        let b = BoardSection {
            model: model.into(),
            cpus: Some(4),
            memory: None,
        };
        let mut out = Vec::new();
        p.validate_board(&b, &[], &mut out);
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].0, "power.nvpmodel");
        assert!(
            out[0]
                .1
                .contains(&format!("board `{model}` has no nvpmodel power modes")),
            "{}",
            out[0].1
        );
    }
    let mut out = Vec::new();
    power("20W", "p3767_0003").validate_board(&board("jetson-orin-nano"), &[], &mut out);
    assert!(
        out[0]
            .1
            .contains("unknown nvpmodel mode `20W` for board `jetson-orin-nano` (expected one of: 0 15W, 1 7W in nvpmodel_p3767_0003.conf)"),
        "{out:?}"
    );
    let mut out = Vec::new();
    power("15W", "p3767_0000").validate_board(&board("jetson-orin-nano"), &[], &mut out);
    assert_eq!(out[0].0, "power.nvpmodel_conf");
    assert!(
        out[0].1.contains(
            "expected one of: p3767_0003_super, p3767_0003, p3767_0004_super, p3767_0004"
        ),
        "{out:?}"
    );
}

/// Without `nvpmodel_conf`, a name is enough where every file of the
/// board's modules means the same mode by it; where they differ the
/// module's file must be named.
#[test]
fn a_mode_that_differs_between_files_needs_the_file() {
    let p = |mode: &str| PowerSection {
        nvpmodel: Some(NvpmodelMode::Name(mode.into())),
        ..PowerSection::default()
    };
    let r = p("MODE_30W")
        .nvpmodel_mode(&board("jetson-agx-orin-32"))
        .unwrap()
        .unwrap();
    assert_eq!((r.conf.name, r.mode.id), ("p3701_0004", 2));
    let r = p("MAXN_SUPER")
        .nvpmodel_mode(&board("jetson-orin-nx-16"))
        .unwrap()
        .unwrap();
    assert_eq!(r.conf.name, "p3767_0000_super");
    let e = p("15W")
        .nvpmodel_mode(&board("jetson-orin-nx-16"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("nvpmodel mode `15W` is not the same"), "{e}");
    assert!(
        e.contains("p3767_0000_super: id 2 `15W`, CPUs 0-3 up to 1420800 kHz; p3767_0000: id 2 `15W`, CPUs 0-3 up to 1651200 kHz"),
        "{e}"
    );
    assert!(
        e.contains("set `power.nvpmodel_conf` to the module's: p3767_0000_super (L4T R36), p3767_0000 (L4T R35)"),
        "{e}"
    );
}

// --- nvpmodel itself -------------------------------------------------------

/// A stand-in for NVIDIA's nvpmodel, reached through a symbolic link in a
/// test's own directory, where it keeps its state: `mode` is what `-q`
/// prints, `on-set` what `-m` does (`reboot`: ask for one on standard
/// input as nvpmodel does for a mode that changes the online CPUs; `hang`:
/// never finish; `ok`: switch to `mode-after`), and it logs its arguments,
/// its standard input, and whether it leads its own process group and has
/// a terminal.
const FAKE_NVPMODEL: &str = r#"#!/bin/sh
dir=$(dirname "$0")
printf '%s\n' "$*" >> "$dir/args.log"
printf '%s\n' "$(readlink /proc/$$/fd/0)" >> "$dir/stdin.log"
read -r pid comm state ppid pgrp session tty rest < /proc/$$/stat
if [ "$pid" = "$pgrp" ]; then g=own-group; else g=shared-group; fi
if [ "$tty" = 0 ]; then t=no-tty; else t=tty; fi
echo "$g $t" >> "$dir/session.log"
case "$1" in
-q)
    cat "$dir/mode"
    ;;
-m)
    case "$(cat "$dir/on-set")" in
    reboot)
        echo "NVPM WARN: Reboot required for changing to this power mode: $2"
        echo "NVPM WARN: DO YOU WANT TO REBOOT NOW? enter YES/yes to confirm:"
        if read -r answer; then
            echo "answer: $answer" >> "$dir/answers.log"
        else
            echo "end of input" >> "$dir/answers.log"
        fi
        ;;
    hang)
        sleep 60
        ;;
    ok)
        cp "$dir/mode-after" "$dir/mode"
        ;;
    esac
    ;;
esac
"#;

/// The stand-in, written once before any test runs it: a file being
/// written while another thread forks cannot be executed (ETXTBSY), so
/// every test links to this one file instead of writing its own.
/// It goes in cargo's target temporary directory, or in `$TMPDIR` when
/// that is not writable (the tests run as an unprivileged user).
static FAKE: LazyLock<PathBuf> = LazyLock::new(|| {
    use std::os::unix::fs::PermissionsExt;
    let name = format!("fake-nvpmodel-{}.sh", std::process::id());
    let p = [
        Path::new(env!("CARGO_TARGET_TMPDIR")).to_path_buf(),
        std::env::temp_dir(),
    ]
    .into_iter()
    .map(|d| d.join(&name))
    .find(|p| fs::write(p, FAKE_NVPMODEL).is_ok())
    .expect("no writable directory for the stand-in nvpmodel");
    fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
    p
});

/// Puts the stand-in at `dir/nvpmodel` with its state files.
fn fake_nvpmodel(dir: &Path, mode: &str, on_set: &str) -> PathBuf {
    fs::create_dir_all(dir).unwrap();
    let link = dir.join("nvpmodel");
    symlink(&*FAKE, &link).unwrap();
    fs::write(dir.join("mode"), mode).unwrap();
    fs::write(dir.join("on-set"), on_set).unwrap();
    link
}

fn log(dir: &Path, name: &str) -> Vec<String> {
    fs::read_to_string(dir.join(name))
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect()
}

fn opts(tool: Option<PathBuf>, timeout: Duration, dry_run: bool) -> ApplyOptions {
    ApplyOptions {
        dry_run,
        threads: ThreadControl::FakeTree,
        nvpmodel: tool.map(|path| NvpmodelTool { path, timeout }),
    }
}

/// The Orin Nano example with `power.nvpmodel` set.
fn nano(mode: &str, conf: &str) -> Sections {
    let mut s = orin();
    s.power.nvpmodel = Some(NvpmodelMode::Name(mode.into()));
    s.power.nvpmodel_conf = Some(conf.into());
    s
}

/// Runs apply on another thread and fails the test, rather than hanging
/// it, when apply does not return.
fn apply_watched(plan: plan::RuntimePlan, root: &Path, o: ApplyOptions) -> ApplyReport {
    let (tx, rx) = mpsc::channel();
    let root = root.to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(apply::apply(&plan, &root, &o).unwrap());
    });
    rx.recv_timeout(Duration::from_secs(120))
        .expect("apply did not return: nvpmodel hung it")
}

fn nvpmodel_action(r: &ApplyReport) -> &apply::Action {
    r.actions
        .iter()
        .find(|a| a.item.starts_with("nvpmodel power mode"))
        .unwrap_or_else(|| panic!("no nvpmodel action:\n{}", r.render(true)))
}

/// A mode that switches CPUs off: nvpmodel asks for a reboot on standard
/// input, reads end-of-file from /dev/null, and apply reports "reboot
/// required" instead of waiting; the CPU clocks of the mode's CPUs are
/// pinned at its cap and the report says what it leaves alone.
#[test]
fn a_mode_that_switches_cpus_off_asks_for_a_reboot_and_never_waits() {
    let t = tree("orin-nano-5.15");
    let bin = tempfile::tempdir().unwrap();
    let tool = fake_nvpmodel(bin.path(), "NV Power Mode: 15W\n0\n", "reboot");
    let s = nano("7W", "p3767_0003");
    let rt = s.plan(t.path());
    assert_eq!(rt.cpufreq.lock_to, FreqLock::Khz { khz: 960_000 });
    let r = apply_watched(
        rt,
        t.path(),
        opts(Some(tool), Duration::from_secs(20), false),
    );
    assert_eq!(log(bin.path(), "args.log"), ["-q", "-m 1"]);
    assert_eq!(log(bin.path(), "stdin.log"), ["/dev/null", "/dev/null"]);
    assert_eq!(log(bin.path(), "answers.log"), ["end of input"]);
    assert!(log(bin.path(), "session.log")
        .iter()
        .all(|l| l == "own-group no-tty"));
    let a = nvpmodel_action(&r);
    assert_eq!((a.old.as_deref(), a.new.as_str()), (Some("0 15W"), "1 7W"));
    match &a.outcome {
        Outcome::RebootRequired { reason } => {
            assert!(
                reason.contains("mode 1 7W keeps CPUs 0-3 online, CPUs 0-5 are online"),
                "{reason}"
            );
            assert!(
                reason.contains("Reboot required for changing to this power mode: 1"),
                "{reason}"
            );
        }
        o => panic!("{o:?}"),
    }
    assert!(r.reboot_required());
    assert_eq!(r.summary().reboot_required, 1);
    let text = r.render(false);
    assert!(text.contains("1 reboot required"), "{text}");
    assert!(text.contains("leaves the EMC and GPU clocks"), "{text}");
    for cpu in 0..4 {
        let dir = format!("/sys/devices/system/cpu/cpu{cpu}/cpufreq");
        assert_eq!(read(t.path(), &format!("{dir}/scaling_max_freq")), "960000");
        assert_eq!(read(t.path(), &format!("{dir}/scaling_min_freq")), "960000");
    }
    // CPUs 4-5 stay as they were: the mode switches them off.
    assert_eq!(
        read(
            t.path(),
            "/sys/devices/system/cpu/cpu4/cpufreq/scaling_max_freq"
        ),
        "1510400"
    );
}

/// An nvpmodel that never finishes is stopped at the timeout and the mode
/// reported failed; apply goes on with the rest.
#[test]
fn an_nvpmodel_that_hangs_is_stopped() {
    let t = tree("orin-nano-5.15");
    let bin = tempfile::tempdir().unwrap();
    let tool = fake_nvpmodel(bin.path(), "NV Power Mode: 7W\n1\n", "hang");
    let rt = nano("15W", "p3767_0003").plan(t.path());
    assert_eq!(rt.cpufreq.lock_to, FreqLock::HardwareMax);
    let r = apply_watched(
        rt,
        t.path(),
        opts(Some(tool), Duration::from_secs(1), false),
    );
    assert_eq!(log(bin.path(), "args.log"), ["-q", "-m 0"]);
    match &nvpmodel_action(&r).outcome {
        Outcome::Failed { error } => assert!(
            error.contains("`nvpmodel -m 0` did not finish within 1 s and was stopped"),
            "{error}"
        ),
        o => panic!("{o:?}"),
    }
    // 15W sets no CPU cap: pinned at the CPU's own maximum.
    assert_eq!(
        read(
            t.path(),
            "/sys/devices/system/cpu/cpu5/cpufreq/scaling_min_freq"
        ),
        "1510400"
    );
    assert!(r.summary().changed > 10, "{}", r.render(false));
}

#[test]
fn a_mode_set_cleanly_is_checked_by_name_and_a_second_run_changes_nothing() {
    let t = tree("orin-nano-5.15");
    let bin = tempfile::tempdir().unwrap();
    let tool = fake_nvpmodel(bin.path(), "NV Power Mode: 7W\n1\n", "ok");
    fs::write(bin.path().join("mode-after"), "NV Power Mode: 15W\n0\n").unwrap();
    let rt = nano("15W", "p3767_0003").plan(t.path());
    let o = opts(Some(tool), Duration::from_secs(20), false);
    let r = apply_watched(rt.clone(), t.path(), o.clone());
    assert!(
        matches!(nvpmodel_action(&r).outcome, Outcome::Changed),
        "{}",
        r.render(true)
    );
    assert_eq!(log(bin.path(), "args.log"), ["-q", "-m 0", "-q"]);
    let again = apply_watched(rt, t.path(), o);
    assert!(matches!(
        nvpmodel_action(&again).outcome,
        Outcome::Unchanged
    ));
    assert_eq!(again.summary().changed, 0, "{}", again.render(true));
}

/// A board whose nvpmodel calls the mode by another name runs another
/// configuration file than robot.yaml names: refused, not set.
#[test]
fn a_mode_nvpmodel_names_otherwise_is_refused() {
    let t = tree("orin-nano-5.15");
    let bin = tempfile::tempdir().unwrap();
    let tool = fake_nvpmodel(bin.path(), "NV Power Mode: 7W\n1\n", "ok");
    let mut s = nano("7W_AI", "p3767_0004");
    s.cpus.isolated = cpus("2-3");
    s.irqs = IrqsSection::default();
    let r = apply_watched(
        s.plan(t.path()),
        t.path(),
        opts(Some(tool), Duration::from_secs(20), false),
    );
    match &nvpmodel_action(&r).outcome {
        Outcome::Failed { error } => assert!(
            error.contains("the board's nvpmodel calls mode 1 `7W`, robot.yaml's table (nvpmodel_p3767_0004.conf, L4T R35) calls it `7W_AI`"),
            "{error}"
        ),
        o => panic!("{o:?}"),
    }
    assert_eq!(log(bin.path(), "args.log"), ["-q"]);
}

#[test]
fn without_nvpmodel_the_mode_is_unsupported_and_a_dry_run_sets_nothing() {
    let t = tree("orin-nano-5.15");
    let rt = nano("7W", "p3767_0003").plan(t.path());
    let r = apply_watched(
        rt.clone(),
        t.path(),
        opts(None, Duration::from_secs(1), false),
    );
    match &nvpmodel_action(&r).outcome {
        Outcome::Unsupported { reason } => {
            assert!(reason.starts_with("no nvpmodel binary"), "{reason}")
        }
        o => panic!("{o:?}"),
    }
    assert!(r.failures().all(|f| !f.item.starts_with("nvpmodel")));

    let t = tree("orin-nano-5.15");
    let bin = tempfile::tempdir().unwrap();
    let tool = fake_nvpmodel(bin.path(), "NV Power Mode: 15W\n0\n", "reboot");
    let r = apply_watched(
        rt,
        t.path(),
        opts(Some(tool), Duration::from_secs(20), true),
    );
    assert!(matches!(nvpmodel_action(&r).outcome, Outcome::WouldChange));
    assert_eq!(log(bin.path(), "args.log"), ["-q"]);
    assert_eq!(
        read(
            t.path(),
            "/sys/devices/system/cpu/cpu0/cpufreq/scaling_max_freq"
        ),
        "1510400"
    );
}

/// Under a sysroot, only the sysroot's nvpmodel is used, never the host's.
#[test]
fn the_tool_is_found_under_the_sysroot() {
    let t = tempfile::tempdir().unwrap();
    assert_eq!(NvpmodelTool::find(t.path()), None);
    let link = fake_nvpmodel(&t.path().join("usr/sbin"), "", "ok");
    assert_eq!(
        NvpmodelTool::find(t.path()).map(|n| n.path),
        Some(link.clone())
    );
    assert_eq!(
        ApplyOptions::for_sysroot(t.path(), true)
            .nvpmodel
            .map(|n| n.path),
        Some(link)
    );
}

// --- verify ------------------------------------------------------------------

fn verify_opts(root: &Path) -> VerifyOptions {
    VerifyOptions {
        interrupts_after: Some(root.join("proc/interrupts.after")),
        allow_tasks: vec!["imu_reader".into(), "motor_controlle".into()],
        ..VerifyOptions::default()
    }
}

#[test]
fn verify_names_planned_cpus_that_are_offline() {
    let t = tree("orin-nano-5.15");
    let rt = orin().plan(t.path());
    let v = verify::verify(&rt, t.path(), &verify_opts(t.path())).unwrap();
    let c = v.check("cpus.online").unwrap();
    assert_eq!(c.status, Status::Ok, "{}", c.detail);
    assert!(v.check("power.nvpmodel").is_none());

    write(t.path(), "/sys/devices/system/cpu/online", "0-3\n");
    let v = verify::verify(&rt, t.path(), &verify_opts(t.path())).unwrap();
    let c = v.check("cpus.online").unwrap();
    assert_eq!(c.status, Status::Drift);
    assert_eq!(
        c.detail,
        "CPUs 4-5 the plan uses are offline (online: 0-3; the plan uses 0-5)"
    );
    assert!(!v.in_sync());
}

#[test]
fn verify_names_the_live_and_the_planned_mode() {
    let t = tree("orin-nano-5.15");
    let rt = nano("15W", "p3767_0003").plan(t.path());
    let mode_check = |root: &Path| {
        let v = verify::verify(&rt, root, &verify_opts(root)).unwrap();
        v.check("power.nvpmodel").unwrap().clone()
    };
    // Neither the status file nor a tool: nothing to read.
    assert_eq!(mode_check(t.path()).status, Status::Unsupported);
    // nvpmodel's own record.
    fs::create_dir_all(t.path().join("var/lib/nvpmodel")).unwrap();
    write(t.path(), power::STATUS_FILE, "pmode:0001\n");
    let c = mode_check(t.path());
    assert_eq!(c.status, Status::Drift);
    assert_eq!(
        c.detail,
        "nvpmodel mode 1 7W is set (/var/lib/nvpmodel/status), planned 0 15W (nvpmodel_p3767_0003.conf, L4T R35)"
    );
    write(t.path(), power::STATUS_FILE, "pmode:0000\n");
    assert_eq!(mode_check(t.path()).status, Status::Ok);
    // The mode is recorded but the CPUs are those of another: a reboot
    // is pending.
    write(t.path(), "/sys/devices/system/cpu/online", "0-3\n");
    let c = mode_check(t.path());
    assert_eq!(c.status, Status::Drift);
    assert!(
        c.detail
            .contains("but CPUs 0-3 are online, the mode keeps 0-5"),
        "{}",
        c.detail
    );
    // Without the status file, nvpmodel -q under the sysroot answers.
    write(t.path(), "/sys/devices/system/cpu/online", "0-5\n");
    fs::remove_file(t.path().join("var/lib/nvpmodel/status")).unwrap();
    let sbin = t.path().join("usr/sbin");
    fake_nvpmodel(&sbin, "NV Power Mode: 7W\n1\n", "ok");
    let c = mode_check(t.path());
    assert_eq!(c.status, Status::Drift);
    assert_eq!(
        c.detail,
        "nvpmodel mode 1 7W is set (nvpmodel -q), planned 0 15W (nvpmodel_p3767_0003.conf, L4T R35)"
    );
    assert_eq!(log(&sbin, "args.log"), ["-q"]);
}

/// The pinned clocks are checked against the mode's cap.
#[test]
fn verify_checks_the_clock_against_the_mode_cap() {
    let t = tree("orin-nano-5.15");
    let bin = tempfile::tempdir().unwrap();
    let tool = fake_nvpmodel(bin.path(), "NV Power Mode: 7W\n1\n", "ok");
    let mut s = nano("7W", "p3767_0003");
    s.cpus.isolated = cpus("2-3");
    s.irqs = IrqsSection::default();
    let rt = s.plan(t.path());
    apply_watched(
        rt.clone(),
        t.path(),
        opts(Some(tool), Duration::from_secs(20), false),
    );
    let v = verify::verify(&rt, t.path(), &verify_opts(t.path())).unwrap();
    assert_eq!(v.check("cpufreq.cpu3.locked").unwrap().status, Status::Ok);
    write(
        t.path(),
        "/sys/devices/system/cpu/cpu3/cpufreq/scaling_max_freq",
        "1510400\n",
    );
    write(
        t.path(),
        "/sys/devices/system/cpu/cpu3/cpufreq/scaling_min_freq",
        "1510400\n",
    );
    let v = verify::verify(&rt, t.path(), &verify_opts(t.path())).unwrap();
    let c = v.check("cpufreq.cpu3.locked").unwrap();
    assert_eq!(c.status, Status::Drift);
    assert_eq!(
        c.detail,
        "min = max = 1510400 kHz, the nvpmodel mode's cap is 960000 kHz"
    );
}
