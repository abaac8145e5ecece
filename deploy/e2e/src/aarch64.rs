//! The aarch64 end-to-end test, along the real boot path: U-Boot runs the
//! boot-attempts script from the disk's FAT boot partition, which boots
//! the extlinux.conf `deploy image` wrote into the ext4 root filesystem
//! after it on a GPT disk: Debian's arm64 PREEMPT_RT kernel with its
//! APPEND line, the base's initrd starting QEMU's i6300esb watchdog;
//! systemd starts rtdeploy.service, and the host talks to the guest over
//! ssh as it would to a robot.
//!
//! Boots (QEMU virt machine, -cpu max, 4 CPUs, TCG):
//! 1. the image: command line, systemd unit (READY=1, watchdog), the CPU
//!    plan and `deploy verify`, the controllers on their planned policy,
//!    priority and CPUs on the doorbell backend, `deploy status`, a field
//!    update with `deploy update --host` over ssh (trial -> committed) and
//!    a crashing release that rolls back by itself; then a system update:
//!    release 4 isolates CPUs 1-3 and moves the talker from CPU 2 to CPU 1,
//!    `deploy update --reboot` installs it (a new extlinux.conf label made
//!    DEFAULT, its boots counted by U-Boot) and reboots the guest,
//! 2. which comes up with the new command line, the new plan applied and
//!    verified, the attempt counted, the watchdog held by the supervisor,
//!    and the trial committed; the runtime's unit, channel and event-loop
//!    suites, built for aarch64, run in the guest; then a system update
//!    that hangs its boot: release 5's command line names an `init=` that
//!    never starts user space, and `deploy update --reboot` installs it;
//! 3. U-Boot's script counts the attempt, the boot hangs, the watchdog the
//!    initrd started resets the machine, the script boots release 4's
//!    label, and the supervisor there rolls release 5 back, naming the
//!    attempt; the wake census on PREEMPT_RT runs in this boot;
//! 4. the fallback labels: autoboot interrupted at U-Boot's prompt, a
//!    label named: the base's original command line, and the image's own
//!    label kept by the system update: release 1's plan's line;
//! 5. bad input: a disk whose extlinux.conf names a kernel that is not
//!    there: the boot fails within its time limit with the console shown.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use deploy::cmd::plan::Plan;
use releases::fleet::Outcome as UpdateOutcome;
use releases::prune::ReleasesInfo;
use rootfs::extlinux;
use serde_json::Value;
use services::status::{ReleaseStatus, SupervisorStatus};

use crate::guest::{cut, missing_tokens, received, tail_lines, Console};
use crate::host::{self, X86_TRIPLE};
use crate::qemu::{side, Machine, Running, Step};
use crate::report::Report;
use crate::ssh::{free_port, Ssh};
use crate::{say, Env};

#[derive(clap::Args)]
pub struct Options {
    /// Seconds a boot may take to answer over ssh.
    #[arg(long, env = "E2E_BOOT_LIMIT", default_value_t = 600)]
    boot_limit: u64,
    /// A base directory laid out as scripts/e2e/arm64-base.sh makes it,
    /// used instead of building or finding one.
    #[arg(long, env = "E2E_ARM64_BASE")]
    base: Option<PathBuf>,
    /// Where scripts/build-aarch64.sh puts the aarch64 programs.
    #[arg(long, env = units::env::AARCH64_OUT)]
    aarch64_out: Option<PathBuf>,
    /// How long the census runs per mechanism.
    #[arg(long, env = "CENSUS_DURATION", default_value = "80s", value_parser = dur)]
    census_duration: units::duration::Dur,
}

/// A duration as robot.yaml writes one (`80s`, `1.5s`, `500ms`).
fn dur(text: &str) -> Result<units::duration::Dur, String> {
    units::duration::Dur::parse(text).map_err(|e| e.to_string())
}

pub fn run(env: &Env, o: &Options) -> u8 {
    crate::in_work_dir(env, "rtdeploy-e2e-arm64.", |work| {
        let mut t = Arm64 {
            env,
            o,
            outa: o
                .aarch64_out
                .clone()
                .unwrap_or_else(|| env.repo.join("target-aarch64")),
            work: work.to_path_buf(),
            r: Report::new("e2e-aarch64"),
            qemu: None,
            ssh: None,
            log1: work.join("serial-boot.log"),
            boot_id: String::new(),
        };
        let setup = t.all();
        if let Some(mut q) = t.qemu.take() {
            q.stop();
        }
        if let Err((what, why)) = &setup {
            t.r.fail(what, why, None);
        }
        let code = t.r.finish(show_console);
        if setup.is_err() {
            2.max(code)
        } else {
            code
        }
    })
}

/// The last 300 lines of a failing boot's serial console, and QEMU's own
/// output.
fn show_console(log: &Path) {
    let name = log.file_name().unwrap_or_default().to_string_lossy();
    println!("\n===== serial console {name} =====");
    println!("{}", host::tail(log, 300));
    println!("===== end of {name} =====");
    let q = host::tail(&side(log, "qemu"), 100);
    if !q.is_empty() {
        println!("===== qemu output =====\n{q}");
    }
}

/// A setup step that failed: what, and why. The run stops there.
type Setup<T> = Result<T, (String, String)>;

fn setup<T>(what: &str, r: Result<T, String>) -> Setup<T> {
    r.map_err(|e| (what.to_string(), e))
}

struct Arm64<'a> {
    env: &'a Env,
    o: &'a Options,
    outa: PathBuf,
    work: PathBuf,
    r: Report,
    qemu: Option<Running>,
    ssh: Option<Ssh>,
    log1: PathBuf,
    /// The running guest's boot id.
    boot_id: String,
}

/// What the plan and image steps made.
struct Made {
    deploy: PathBuf,
    base: PathBuf,
    plan: Plan,
    plan4: Plan,
    orig_append: String,
    image_default: String,
    image_append: String,
    disk: PathBuf,
    ssh_key: PathBuf,
}

impl Arm64<'_> {
    fn all(&mut self) -> Setup<()> {
        self.r.phase("host tools");
        for (tool, package) in [
            ("qemu-system-aarch64", "qemu-system-arm"),
            ("sfdisk", "fdisk"),
            ("ssh", "openssh-client"),
            ("debugfs", "e2fsprogs"),
            ("mke2fs", "e2fsprogs"),
            ("mkfs.vfat", "dosfstools"),
            ("mcopy", "mtools"),
        ] {
            if host::output(
                Command::new("sh")
                    .arg("-c")
                    .arg(format!("command -v {tool}")),
            )
            .is_err()
            {
                return Err((
                    format!("host tool {tool}"),
                    format!("missing: apt-get install {package}"),
                ));
            }
        }
        let m = self.prepare()?;
        self.boot1(&m)?;
        self.updates(&m);
        let rebooted = self.system_update(&m);
        if rebooted {
            self.boot2(&m);
            if self.hanging_update(&m) {
                self.census();
            }
        }
        self.power_off();
        self.fallback_labels(&m);
        self.bad_input(&m);
        Ok(())
    }

    fn prepare(&mut self) -> Setup<Made> {
        self.r.phase("aarch64 build (deploy, controllers, tests)");
        let mut c = Command::new("bash");
        c.arg(self.env.repo.join("scripts/build-aarch64.sh"))
            .arg("--tests")
            .env(units::env::AARCH64_OUT, &self.outa)
            .env(units::env::CACHE, &self.env.cache);
        let log = self.work.join("build-aarch64.log");
        setup("aarch64 build", host::run_logged(&mut c, &log))?;
        let last = host::tail(&log, 1);
        self.r.pass(format!(
            "deploy, talker, listener and the runtime's tests build for aarch64 ({})",
            last.split_once("] ").map_or(last.as_str(), |(_, s)| s)
        ));

        self.r.phase("host deploy (x86_64)");
        setup(
            "host deploy",
            host::cargo_static(
                &self.env.repo,
                &self.env.target_dir,
                &["-p", "deploy", "--bin", "deploy"],
                &self.work.join("build-host.log"),
            ),
        )?;
        let deploy = self.env.target_dir.join(X86_TRIPLE).join("release/deploy");

        self.r.phase("arm64 base (mmdebstrap, cached)");
        let base = match &self.o.base {
            Some(b) => b.clone(),
            None => {
                let mut c = Command::new("bash");
                c.arg(self.env.repo.join("scripts/e2e/arm64-base.sh"))
                    .env(units::env::CACHE, &self.env.cache);
                let out = setup("arm64 base root filesystem", host::output(&mut c))?;
                PathBuf::from(out.lines().last().unwrap_or("").trim())
            }
        };
        if !base.join(".complete").exists() {
            return Err((
                "arm64 base root filesystem".into(),
                format!("{} is not a complete base", base.display()),
            ));
        }
        let krel = std::fs::read_to_string(base.join("kernel-release")).unwrap_or_default();
        self.r.pass(format!(
            "Debian arm64 base with systemd, openssh-server and {} ({})",
            krel.trim(),
            host::size(&base.join("rootfs.tar"))
        ));

        self.r.phase("plan, keys, releases, image, disk");
        let w = &self.work;
        let key = w.join("key");
        let run = |what: &str, args: &[&dyn AsRef<std::ffi::OsStr>]| -> Setup<String> {
            let mut c = Command::new(&deploy);
            for a in args {
                c.arg(a);
            }
            setup(what, host::output(&mut c))
        };
        run("deploy keygen", &[&"-q", &"keygen", &"--out", &key])?;
        // The example, trusting the key the releases are signed with (its
        // update: section is last).
        let example = read(&self.env.repo.join("examples/qemu-aarch64.yaml"))?;
        let public = read(&side(&key, "pub"))?;
        let config = w.join("robot.yaml");
        let text = format!(
            "{example}  public_keys: [\"{}\"]\n",
            public.split_whitespace().collect::<String>()
        );
        write(&config, &text)?;
        run(
            "deploy config check",
            &[&"config", &"check", &"-c", &config],
        )?;
        let plan: Plan = setup(
            "deploy plan",
            run("deploy plan", &[&"plan", &"-c", &config, &"--json"])?.parse_json(),
        )?;
        let base_conf = setup(
            "the base's extlinux.conf",
            host::output(
                Command::new("tar")
                    .arg("-xOf")
                    .arg(base.join("rootfs.tar"))
                    .arg("./boot/extlinux/extlinux.conf"),
            ),
        )?;
        let orig_append = extlinux::default_of(&base_conf)
            .and_then(|l| extlinux::append_of(&base_conf, &l))
            .unwrap_or_default();

        // Releases 1 to 4: the aarch64 controllers; release 3's talker
        // exits at once. A bundle's release carries its robot.yaml.
        for (v, crash) in [(1, false), (2, false), (3, true), (4, false)] {
            let bin = w.join(format!("r{v}")).join("bin");
            let talker = bin.join("talker");
            let made = std::fs::create_dir_all(&bin)
                .and_then(|()| std::fs::copy(self.outa.join("listener"), bin.join("listener")))
                .and_then(|_| {
                    if crash {
                        use std::os::unix::fs::PermissionsExt as _;
                        let script = format!("#!/bin/sh\necho \"talker: release {v} crashes on purpose\" >&2\nexit 3\n");
                        std::fs::write(&talker, script)?;
                        std::fs::set_permissions(&talker, std::fs::Permissions::from_mode(0o755))
                    } else {
                        std::fs::copy(self.outa.join("talker"), &talker).map(|_| ())
                    }
                });
            setup(&format!("release {v}"), made.map_err(|e| e.to_string()))?;
        }
        // Release 4 is a system update: CPUs 1-3 isolated (a new kernel
        // command line) and the talker moved from CPU 2 to CPU 1.
        let changes = [
            ("  housekeeping: 0-1", "  housekeeping: 0"),
            ("  isolated: 2-3", "  isolated: 1-3"),
            ("      cpus: 0-1", "      cpus: 0"),
            ("    cpus: 2", "    cpus: 1"),
        ];
        let mut changed = 0;
        let text4: String = text
            .lines()
            .map(|l| match changes.iter().find(|(from, _)| *from == l) {
                Some((_, to)) => {
                    changed += 1;
                    format!("{to}\n")
                }
                None => format!("{l}\n"),
            })
            .collect();
        if changed != changes.len() {
            return Err((
                "release 4's robot.yaml".into(),
                format!(
                    "the example changed shape: {changed} of {} lines found",
                    changes.len()
                ),
            ));
        }
        let config4 = w.join("robot4.yaml");
        write(&config4, &text4)?;
        // Release 5: release 4 with a command line whose `init=` never
        // starts user space.
        let panic = "  cmdline: [panic=10]\n";
        if !text4.contains(panic) {
            return Err((
                "release 5's robot.yaml".into(),
                format!("the example changed shape: no `{}`", panic.trim()),
            ));
        }
        let config5 = w.join("robot5.yaml");
        write(
            &config5,
            &text4.replace(panic, &format!("  cmdline: [panic=10, init={HANG}]\n")),
        )?;
        setup("release 5", host::copy_tree(&w.join("r4"), &w.join("r5")))?;
        for v in [2, 3, 4, 5] {
            let c = match v {
                4 => &config4,
                5 => &config5,
                _ => &config,
            };
            let dir = w.join(format!("r{v}"));
            setup(
                "a release's robot.yaml",
                std::fs::copy(c, dir.join("robot.yaml"))
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
            )?;
            let bundle = w.join(format!("v{v}.bundle"));
            run(
                &format!("deploy bundle v{v}"),
                &[
                    &"-q",
                    &"bundle",
                    &"-c",
                    c,
                    &"--release",
                    &dir,
                    &"--version",
                    &v.to_string(),
                    &"--key",
                    &key,
                    &"--out",
                    &bundle,
                ],
            )?;
        }
        let plan4: Plan = setup(
            "deploy plan (release 4)",
            run(
                "deploy plan (release 4)",
                &[&"plan", &"-c", &config4, &"--json"],
            )?
            .parse_json(),
        )?;

        let img = w.join("root.ext4");
        let mut c = Command::new(&deploy);
        c.arg("image")
            .arg("-c")
            .arg(&config)
            .arg("--base")
            .arg(base.join("rootfs.tar"));
        c.arg("--release")
            .arg(w.join("r1"))
            .args(["--release-version", "1"]);
        c.arg("--deploy-binary").arg(self.outa.join("deploy"));
        c.args(["--format", "ext4", "--size", "1536MiB", "--out"])
            .arg(&img);
        setup(
            "deploy image --format ext4",
            host::run_logged(&mut c, &w.join("image.log")),
        )?;
        self.r.pass(format!(
            "deploy image --format ext4 on the arm64 base ({})",
            host::size(&img)
        ));
        // The extlinux.conf the image carries, read back with debugfs.
        let conf = host::output(
            Command::new("debugfs")
                .arg("-R")
                .arg("cat /boot/extlinux/extlinux.conf")
                .arg(&img),
        )
        .unwrap_or_default();
        let default = extlinux::default_of(&conf).unwrap_or_default();
        let image_append = extlinux::append_of(&conf, &default).unwrap_or_default();
        let missing = missing_tokens(&image_append, &plan.cmdline.line);
        self.r.assert(
            !default.is_empty() && missing.is_empty(),
            format!("the image's extlinux.conf: DEFAULT {default} carries the planned APPEND"),
            format!(
                "DEFAULT '{default}', missing: {} ({conf})",
                missing.join(" ")
            ),
            None,
        );
        self.r.check(
            "the image's extlinux.conf: label rtdeploy-original keeps the base's line",
            &orig_append,
            &extlinux::append_of(&conf, "rtdeploy-original").unwrap_or_default(),
            None,
        );
        let disk = w.join("disk.img");
        setup(
            "GPT disk",
            boot_disk(&img, &w.join("boot-partition"), &disk),
        )?;
        let _ = std::fs::remove_file(&img);
        self.r.pass(format!(
            "GPT disk: the boot partition made from the image's {}, the image as partition 2 ({})",
            releases::boot_attempts::PARTITION_TEMPLATE,
            host::size(&disk)
        ));
        let ssh_key = base.join("ssh/id_ed25519");
        {
            use std::os::unix::fs::PermissionsExt as _;
            let _ = std::fs::set_permissions(&ssh_key, std::fs::Permissions::from_mode(0o600));
        }
        Ok(Made {
            deploy,
            base,
            plan,
            plan4,
            orig_append,
            image_default: default,
            image_append,
            disk,
            ssh_key,
        })
    }

    fn ssh(&self) -> &Ssh {
        self.ssh.as_ref().expect("booted")
    }

    /// Until the guest answers over ssh (and, with `old`, has booted
    /// again: another boot id), QEMU exits, or the boot limit passes.
    fn wait_ssh(&mut self, old: Option<&str>) -> Result<String, String> {
        self.wait_ssh_within(old, self.o.boot_limit)
    }

    fn wait_ssh_within(&mut self, old: Option<&str>, limit: u64) -> Result<String, String> {
        let deadline = Instant::now() + Duration::from_secs(limit);
        while Instant::now() < deadline {
            if let Some(s) = self.qemu.as_mut().and_then(|q| q.exited()) {
                return Err(format!("QEMU exited ({s})"));
            }
            let serial = host::tail(&self.log1, 400);
            if let Some(l) = serial
                .lines()
                .find(|l| l.contains("initrd: cannot mount") || l.contains("Kernel panic"))
            {
                return Err(format!("the guest failed to boot: {l}"));
            }
            let r = self.ssh().run(15, "cat /proc/sys/kernel/random/boot_id");
            let id = r.text().to_string();
            if r.ok() && !id.is_empty() && Some(id.as_str()) != old {
                return Ok(id);
            }
            std::thread::sleep(Duration::from_secs(3));
        }
        Err(format!("no ssh within {limit} s"))
    }

    fn boot1(&mut self, m: &Made) -> Setup<()> {
        self.r
            .phase("boot 1: U-Boot -> extlinux -> kernel -> systemd");
        let port = setup("a free port", free_port().map_err(|e| e.to_string()))?;
        self.ssh = Some(Ssh {
            port,
            key: m.ssh_key.clone(),
        });
        let machine = Machine::Arm64 {
            bios: m.base.join("u-boot.bin"),
            disk: m.disk.clone(),
            ssh_port: Some(port),
        };
        self.qemu = Some(setup(
            "qemu-system-aarch64",
            machine.spawn(&self.log1).map_err(|e| e.to_string()),
        )?);
        let t = Instant::now();
        let id = match self.wait_ssh(None) {
            Ok(id) => id,
            Err(e) => {
                self.r.log_failed(&self.log1.clone());
                return Err((
                    "the guest boots from the disk and answers over ssh".into(),
                    e,
                ));
            }
        };
        self.boot_id = id;
        self.r.pass(format!(
            "U-Boot booted the disk, systemd came up, ssh answers ({:.1} s after power-on)",
            t.elapsed().as_secs_f64()
        ));

        self.r.phase("boot 1: assertions");
        let log = self.log1.clone();
        let log = Some(log.as_path());
        let serial = Console::read(&self.log1);
        match serial.lines().find(|l| l.contains("extlinux")) {
            Some(l) => self.r.pass(format!(
                "U-Boot read /boot/extlinux/extlinux.conf ({})",
                cut(l.trim(), 120)
            )),
            None => self.r.fail(
                "U-Boot read /boot/extlinux/extlinux.conf",
                "no sign of it on the console",
                log,
            ),
        }
        self.guest_cmdline(
            "every planned token, from extlinux.conf",
            &m.plan.cmdline.line,
        );
        let q = |cmd: &str| self.ssh().query(60, cmd).text().to_string();
        let (realtime, isolated, machine) = (
            q("cat /sys/kernel/realtime"),
            q("cat /sys/devices/system/cpu/isolated"),
            q("uname -m"),
        );
        self.r.check(
            "the kernel is PREEMPT_RT (/sys/kernel/realtime)",
            "1",
            &realtime,
            log,
        );
        self.r.check(
            "/sys/devices/system/cpu/isolated equals the plan",
            &m.plan.cpus.isolated.to_string(),
            &isolated,
            log,
        );
        self.r.check("uname -m", "aarch64", &machine, log);

        // systemd: the unit reached READY=1 (Type=notify: active, not
        // activating) and the watchdog is fed (its timestamp moves; no
        // restart).
        let unit = |s: &Self| {
            let text = s
                .ssh()
                .query(60, "systemctl show rtdeploy.service -p ActiveState -p SubState -p Type -p NRestarts -p WatchdogUSec -p WatchdogTimestampMonotonic")
                .stdout;
            text.lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<std::collections::BTreeMap<String, String>>()
        };
        let deadline = Instant::now() + Duration::from_secs(240);
        let mut st = unit(self);
        while st.get("ActiveState").map(String::as_str) != Some("active")
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_secs(3));
            st = unit(self);
        }
        let p = |st: &std::collections::BTreeMap<String, String>, k: &str| {
            st.get(k).cloned().unwrap_or_default()
        };
        let state = format!(
            "{}/{}/{}",
            p(&st, "ActiveState"),
            p(&st, "SubState"),
            p(&st, "Type")
        );
        if state == "active/running/notify" {
            self.r
                .pass("systemd: rtdeploy.service is active (Type=notify, READY=1 reached)");
        } else {
            let s = self
                .ssh()
                .query(60, "systemctl status --no-pager -n 30 rtdeploy.service")
                .stdout;
            self.r.fail(
                "systemd: rtdeploy.service is active (Type=notify, READY=1 reached)",
                format!("{st:?}; {s}"),
                log,
            );
        }
        let w1: Option<u64> = p(&st, "WatchdogTimestampMonotonic").parse().ok();
        std::thread::sleep(Duration::from_secs(12));
        let st2 = unit(self);
        let w2: Option<u64> = p(&st2, "WatchdogTimestampMonotonic").parse().ok();
        let fed = p(&st2, "WatchdogUSec") != "0"
            && matches!((w1, w2), (Some(a), Some(b)) if b > a)
            && p(&st2, "NRestarts") == "0"
            && p(&st2, "ActiveState") == "active";
        self.r.assert(
            fed,
            format!(
                "systemd: the watchdog is fed (WatchdogSec {}, last ping moved {w1:?} -> {w2:?} us, no restart)",
                p(&st2, "WatchdogUSec")
            ),
            format!("{st2:?} (before: {w1:?})"),
            log,
        );

        // The supervisor's work: plan applied, verify, processes,
        // messages, backend.
        let status = match self.wait_running(180) {
            Ok(s) => s,
            Err(e) => {
                self.r.fail(
                    "talker and listener run",
                    format!("deploy status: {e}"),
                    log,
                );
                return Ok(());
            }
        };
        crate::checks::cpu_plan_applied(&mut self.r, &status, log);
        self.plan_in_force(&m.plan, &status, "the image's");
        let mut got: Vec<String> = status
            .processes
            .iter()
            .map(|p| format!("{}={}", p.name, p.backend.as_deref().unwrap_or("none")))
            .collect();
        got.sort();
        self.r.check(
            "deploy status names each process's backend (real-time processes sleep on their doorbell)",
            "listener=doorbell talker=doorbell",
            &got.join(" "),
            log,
        );
        // The listener prints a count every 1000 messages; wait for one.
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut count = None;
        let mut logs = String::new();
        while Instant::now() < deadline {
            logs = self.ssh().query(60, "deploy logs listener").stdout;
            count = received(&logs);
            if count.is_some_and(|n| n >= 1000) {
                break;
            }
            std::thread::sleep(Duration::from_secs(3));
        }
        let backend = logs
            .lines()
            .rev()
            .find_map(|l| {
                l.find("backend ").map(|i| {
                    l[i..]
                        .split([',', ' ', ')'])
                        .take(2)
                        .collect::<Vec<_>>()
                        .join(" ")
                })
            })
            .unwrap_or_default();
        self.r.assert(
            count.is_some_and(|n| n >= 1000),
            format!(
                "the controllers exchanged at least 1000 messages ({}, {backend})",
                count.unwrap_or(0)
            ),
            format!("{count:?}: {}", tail_lines(&logs, 5)),
            log,
        );
        let bc = status.boot_check.as_str();
        self.r.assert(
            bc.starts_with("passed") || bc.starts_with("failed"),
            format!("the boot check ran ({bc})"),
            format!("boot_check='{bc}'"),
            log,
        );
        Ok(())
    }

    /// The guest's /proc/cmdline carries `planned` (`what` says which
    /// tokens).
    fn guest_cmdline(&mut self, what: &str, planned: &str) {
        let cmdline = self.ssh().query(60, "cat /proc/cmdline").text().to_string();
        let log = self.log1.clone();
        crate::checks::cmdline_carries(
            &mut self.r,
            &format!("/proc/cmdline carries {what} ({cmdline})"),
            &cmdline,
            planned,
            Some(&log),
        );
    }

    /// `deploy status` once both controllers run (at most `limit` s).
    fn wait_running(&self, limit: u64) -> Result<SupervisorStatus, String> {
        let deadline = Instant::now() + Duration::from_secs(limit);
        let mut last = Err("no answer".to_string());
        while Instant::now() < deadline {
            last = self.status();
            if let Ok(s) = &last {
                if s.processes.iter().filter(|p| p.state == "running").count() == 2 {
                    return last;
                }
            }
            std::thread::sleep(Duration::from_secs(3));
        }
        match last {
            Ok(s) => Err(format!(
                "not both running: {}",
                s.processes
                    .iter()
                    .map(|p| format!("{} {}", p.name, p.state))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            Err(e) => Err(e),
        }
    }

    fn status(&self) -> Result<SupervisorStatus, String> {
        let r = self.ssh().query(60, "deploy --json status");
        r.stdout
            .parse_json::<SupervisorStatus>()
            .map_err(|e| format!("{e} ({})", cut(r.stderr.trim(), 300)))
    }

    /// `deploy verify` exits 0 in the guest, and each process of `plan`
    /// runs with its policy, priority and CPUs as `status` read them back
    /// from the kernel.
    fn plan_in_force(&mut self, plan: &Plan, status: &SupervisorStatus, whose: &str) {
        let log = self.log1.clone();
        let log = Some(log.as_path());
        let v = self.ssh().query(60, "deploy verify 2>&1");
        self.r.assert(
            v.ok(),
            format!("deploy verify exits 0 in the guest against {whose} plan"),
            v.stdout.clone(),
            log,
        );
        crate::checks::processes_in_force(&mut self.r, plan, status, whose, log);
    }

    /// `deploy update --host` of a bundle over ssh.
    fn update(&self, deploy: &Path, bundle: &Path, reboot: bool) -> Result<UpdateOutcome, String> {
        let mut c = Command::new("timeout");
        c.args(["-k", "10", "600"])
            .arg(deploy)
            .args(["--json", "update"]);
        if reboot {
            c.arg("--reboot");
        }
        c.args(["--host", "root@127.0.0.1"]);
        for o in self.ssh().options() {
            c.arg("--ssh-option").arg(o);
        }
        c.arg(bundle);
        let out = c
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("deploy update: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let err = String::from_utf8_lossy(&out.stderr);
        #[derive(serde::Deserialize)]
        struct Fleet {
            robots: Vec<UpdateOutcome>,
        }
        text.parse_json::<Fleet>()
            .map_err(|e| format!("{e}; {}", tail_lines(&err, 20)))?
            .robots
            .into_iter()
            .next()
            .ok_or_else(|| format!("no robot in the answer; {}", tail_lines(&err, 20)))
    }

    /// The supervisor's release status once it has judged the trial of
    /// `version` (committed with it current, or rolled back from it), or
    /// the last one seen when `limit` s pass.
    fn release_verdict(&self, limit: u64, version: u32) -> Option<ReleaseStatus> {
        let deadline = Instant::now() + Duration::from_secs(limit);
        let mut last = None;
        let of = |name: &Option<String>| {
            name.as_deref()
                .and_then(|n| n.split('-').next())
                .map(str::to_string)
        };
        while Instant::now() < deadline {
            if let Ok(Some(r)) = self.status().map(|s| s.release) {
                let v = Some(version.to_string());
                let judged = (r.state == "committed" && of(&r.current) == v)
                    || (r.state == "rolled-back" && of(&r.other) == v);
                last = Some(r);
                if judged {
                    break;
                }
            }
            std::thread::sleep(Duration::from_secs(3));
        }
        last
    }

    /// deploy update installs the bundle in trial; the supervisor then
    /// judges it (health_window): `want` is the state it must reach,
    /// `committed` with `version` current, or `rolled-back` away from it.
    fn update_and_judge(&mut self, m: &Made, version: u32, want: &str, what: &str) {
        let log = self.log1.clone();
        let log = Some(log.as_path());
        let bundle = self.work.join(format!("v{version}.bundle"));
        let u = match self.update(&m.deploy, &bundle, false) {
            Ok(u) if u.ok && u.state.as_deref() == Some("trial") => u,
            Ok(u) => return self.r.fail(what, format!("deploy update: {u:?}"), log),
            Err(e) => return self.r.fail(what, format!("deploy update: {e}"), log),
        };
        let r = self.release_verdict(240, version);
        let Some(r) = r else {
            return self
                .r
                .fail(what, "the supervisor says nothing of its release", log);
        };
        let cur = r.current.clone().unwrap_or_default();
        let cur_v = cur.split('-').next().unwrap_or("").to_string();
        let ok = match want {
            "committed" => r.state == "committed" && cur_v == version.to_string(),
            _ => r.state == "rolled-back" && cur_v != version.to_string(),
        };
        self.r.assert(
            ok,
            format!(
                "{what} ({} sent in {} s; supervisor: {})",
                u.release.clone().unwrap_or_default(),
                u.seconds.floor(),
                cut(
                    &[
                        r.state.as_str(),
                        cur.as_str(),
                        r.detail.as_deref().unwrap_or("")
                    ]
                    .join(" "),
                    160
                )
            ),
            format!("the supervisor says: {r:?}"),
            log,
        );
    }

    fn releases(&self) -> Result<ReleasesInfo, String> {
        self.ssh()
            .query(60, "deploy --json releases")
            .stdout
            .parse_json()
    }

    fn updates(&mut self, m: &Made) {
        if self.ssh.is_none() {
            return;
        }
        self.r.phase("boot 1: deploy update over ssh");
        self.update_and_judge(
            m,
            2,
            "committed",
            "deploy update --host over ssh: release 2 installed, trial -> committed",
        );
        self.update_and_judge(m, 3, "rolled-back", "deploy update --host over ssh: release 3 crashes in its trial and rolls back by itself");
        let log = self.log1.clone();
        let log = Some(log.as_path());
        match self.releases() {
            Ok(rel) => {
                let cur = current_release(&rel);
                self.r.assert(
                    cur.starts_with("2-"),
                    format!(
                        "after the rollback release 2 is current again ({cur}, {:?})",
                        rel.state
                    ),
                    format!("deploy releases: current {cur}, {:?}", rel.state),
                    log,
                );
            }
            Err(e) => self
                .r
                .fail("after the rollback release 2 is current again", e, log),
        }
        if let Err(e) = self.wait_running(120) {
            self.r.fail(
                "talker and listener run release 2 after the rollback",
                e,
                log,
            );
        }
    }

    /// Release 4 through `deploy update --reboot`; whether the guest came
    /// back with another boot id.
    fn system_update(&mut self, m: &Made) -> bool {
        if self.ssh.is_none() {
            return false;
        }
        let log = self.log1.clone();
        let log = Some(log.as_path());
        self.r
            .phase("boot 1: system update to release 4, deploy update --reboot");
        let what = "deploy update --reboot: release 4 installed in trial as a system update, the guest asked to reboot";
        let t = Instant::now();
        match self.update(&m.deploy, &self.work.join("v4.bundle"), true) {
            Ok(u) if u.ok && u.state.as_deref() == Some("trial") && u.reboot && u.rebooted => self
                .r
                .pass(format!("{what} ({})", u.release.unwrap_or_default())),
            Ok(u) => self.r.fail(what, format!("{u:?}"), log),
            Err(e) => self.r.fail(what, e, log),
        }
        self.r.phase("boot 2: the reboot into release 4's plan");
        let old = self.boot_id.clone();
        match self.wait_ssh(Some(&old)) {
            Ok(id) => {
                self.r.pass(format!(
                    "the guest rebooted through U-Boot and answers over ssh ({:.1} s)",
                    t.elapsed().as_secs_f64()
                ));
                self.boot_id = id;
                true
            }
            Err(e) => {
                self.r.fail("the guest reboots", e, log);
                false
            }
        }
    }

    fn boot2(&mut self, m: &Made) {
        self.r
            .phase("boot 2: assertions, the runtime's tests in the guest");
        let log = self.log1.clone();
        let log = Some(log.as_path());
        // The boot loader took the new label: the new line is running.
        let conf = self
            .ssh()
            .query(60, "cat /boot/extlinux/extlinux.conf")
            .stdout;
        let default = extlinux::default_of(&conf).unwrap_or_default();
        let labels = extlinux::label_names(&conf);
        let want_labels = [
            m.image_default.clone(),
            "rtdeploy-original".into(),
            default.clone(),
        ];
        self.r.assert(
            default.starts_with("rtdeploy-release-4-")
                && labels == want_labels
                && extlinux::append_of(&conf, &m.image_default).as_deref() == Some(m.image_append.as_str()),
            format!(
                "extlinux.conf after the update: DEFAULT {default}, the image's {} (its line unchanged) and rtdeploy-original kept as fallbacks",
                m.image_default
            ),
            format!("DEFAULT '{default}', labels {labels:?} ({conf})"),
            log,
        );
        self.guest_cmdline("every token of release 4's plan", &m.plan4.cmdline.line);
        let isolated = self
            .ssh()
            .query(60, "cat /sys/devices/system/cpu/isolated")
            .text()
            .to_string();
        self.r.check(
            "/sys/devices/system/cpu/isolated equals release 4's plan",
            &m.plan4.cpus.isolated.to_string(),
            &isolated,
            log,
        );
        // The trial, judged after the reboot with the new plan in force.
        let r = self.release_verdict(300, 4);
        let committed = r.as_ref().is_some_and(|r| {
            r.state == "committed" && r.current.as_deref().is_some_and(|c| c.starts_with("4-"))
        });
        self.r.assert(
            committed,
            format!(
                "release 4's trial is judged after the reboot and committed ({})",
                cut(
                    r.as_ref().and_then(|r| r.detail.as_deref()).unwrap_or(""),
                    160
                )
            ),
            format!("the supervisor says: {r:?}"),
            log,
        );
        let status = match self.wait_running(240) {
            Ok(s) => Some(s),
            Err(e) => {
                self.r
                    .fail("after the reboot talker and listener run", e, log);
                self.status().ok()
            }
        };
        match (self.releases(), &status) {
            (Ok(rel), Some(st)) => {
                let cur = current_release(&rel);
                let state_committed = matches!(
                    rel.state,
                    Some(releases::state::ReleaseState::Committed { .. })
                );
                let running = st
                    .release
                    .as_ref()
                    .and_then(|r| r.current.clone())
                    .unwrap_or_default();
                self.r.assert(
                    cur.starts_with("4-") && state_committed && running.starts_with("4-"),
                    format!("after the reboot the committed release 4 runs ({cur})"),
                    format!(
                        "deploy releases: current {cur}, {:?}; status: {:?}",
                        rel.state, st.release
                    ),
                    log,
                );
            }
            (rel, _) => self.r.fail(
                "after the reboot the committed release 4 runs",
                format!("{:?}", rel.err()),
                log,
            ),
        }
        if let Some(st) = &status {
            self.plan_in_force(&m.plan4, st, "release 4's");
            // U-Boot's script counted the new label's boot, and the
            // supervisor holds the watchdog the initrd started.
            let b = st.release.as_ref().and_then(|r| r.boot_loader.as_ref());
            self.r.assert(
                b.is_some_and(|b| {
                    b.label.starts_with("rtdeploy-release-4-")
                        && b.attempts == 1
                        && b.limit == 1
                        && !b.fell_back
                }),
                format!(
                    "the boot loader counted release 4's label: boot attempt 1 of 1 ({})",
                    st.release
                        .as_ref()
                        .map(|r| r.describe())
                        .unwrap_or_default()
                ),
                format!("{b:?}"),
                log,
            );
            crate::checks::watchdog_armed(
                &mut self.r,
                &self.work.join("robot.yaml"),
                Some(st),
                "boot 2",
                log,
            );
        }
        let reboot = self
            .ssh()
            .query(
                60,
                "test -e /run/rtdeploy/reboot-required && echo present || echo absent",
            )
            .text()
            .to_string();
        self.r
            .check("the reboot request is gone", "absent", &reboot, log);
        let active = self
            .ssh()
            .query(60, "systemctl is-active rtdeploy.service")
            .text()
            .to_string();
        self.r.check(
            "after the reboot rtdeploy.service is active",
            "active",
            &active,
            log,
        );
        self.guest_tests();
    }

    /// Release 5 through `deploy update --reboot`: its command line's
    /// `init=` never starts user space. U-Boot's script counts the attempt
    /// (limit 1), the watchdog the initrd started resets the hung boot,
    /// the script then boots release 4's label, and the supervisor's start
    /// there rolls release 5 back, saying why. Whether the guest came back.
    fn hanging_update(&mut self, m: &Made) -> bool {
        let log1 = self.log1.clone();
        let log = Some(log1.as_path());
        self.r.phase(
            "boot 2: a system update that hangs its boot: release 5, deploy update --reboot",
        );
        let what = format!("deploy update --reboot: release 5 (init={HANG}, which never starts user space) installed in trial as a system update, the guest asked to reboot");
        let from = std::fs::metadata(&self.log1).map(|m| m.len()).unwrap_or(0);
        let t = Instant::now();
        let release5 = match self.update(&m.deploy, &self.work.join("v5.bundle"), true) {
            Ok(u) if u.ok && u.state.as_deref() == Some("trial") && u.reboot && u.rebooted => {
                let r = u.release.unwrap_or_default();
                self.r.pass(format!("{what} ({r})"));
                r
            }
            Ok(u) => {
                self.r.fail(what, format!("{u:?}"), log);
                return false;
            }
            Err(e) => {
                self.r.fail(what, e, log);
                return false;
            }
        };
        self.r
            .phase("boot 3: the hang, the watchdog's reset, release 4's label");
        let old = self.boot_id.clone();
        // The hung boot lasts the initrd's watchdog heartbeat; then a
        // whole boot.
        let limit = self.o.boot_limit + EARLY_WATCHDOG_S + 120;
        let back = self.wait_ssh_within(Some(&old), limit);
        let console = std::fs::read(&self.log1)
            .map(|b| String::from_utf8_lossy(b.get(from as usize..).unwrap_or(&[])).into_owned())
            .unwrap_or_default();
        match back {
            Ok(id) => {
                self.r.pass(format!(
                    "after the hung boot the guest comes back and answers over ssh ({:.0} s after the update began)",
                    t.elapsed().as_secs_f64()
                ));
                self.boot_id = id;
            }
            Err(e) => {
                self.r
                    .fail("after the hung boot the guest comes back", e, log);
                return false;
            }
        }
        // The console, in order: the attempt counted, the watchdog
        // started, the init that hangs, then (no panic, no reboot of the
        // kernel's) the script giving up and booting release 4's label.
        let label5 = format!("rtdeploy-release-{release5}");
        let steps = [
            format!("rtdeploy: boot attempt 1 of 1 of label {label5}"),
            "initrd: watchdog started".to_string(),
            format!("initrd: starting {HANG}"),
            "hang: an init that never starts user space".to_string(),
            format!("rtdeploy: label {label5} failed 1 boot attempts: booting label rtdeploy-release-4-"),
        ];
        let mut at = 0;
        let mut missing = None;
        let mut hang_at = 0;
        for (i, step) in steps.iter().enumerate() {
            match console[at..].find(step.as_str()) {
                Some(j) => {
                    at += j + step.len();
                    if i == 3 {
                        hang_at = at;
                    }
                }
                None => {
                    missing = Some(step.clone());
                    break;
                }
            }
        }
        let ended = console
            .get(hang_at..at)
            .unwrap_or("")
            .lines()
            .find(|l| l.contains("Kernel panic") || l.contains("reboot: Restarting"))
            .map(str::to_string);
        match (missing, ended) {
            (None, None) => self.r.pass(format!(
                "U-Boot counted release 5's attempt, its init hung, the watchdog reset the machine (no panic or reboot of the kernel's) and U-Boot booted release 4's label (timeout {EARLY_WATCHDOG_S} s from the initrd)"
            )),
            (Some(step), _) => self.r.fail(
                "the hung boot: attempt counted, watchdog reset, previous label",
                format!("the console never says `{step}`"),
                log,
            ),
            (None, Some(l)) => self.r.fail(
                "the hung boot: attempt counted, watchdog reset, previous label",
                format!("the kernel itself ended the hung boot: {l}"),
                log,
            ),
        }
        // The supervisor on release 4's label: release 5 rolled back, the
        // attempts named; release 4 committed and running.
        let r = self.release_verdict(300, 5);
        let want =
            format!("the boot loader gave up on label {label5} after 1 boot without a verdict");
        let ok = r.as_ref().is_some_and(|r| {
            r.state == "rolled-back"
                && r.current.as_deref().is_some_and(|c| c.starts_with("4-"))
                && r.other.as_deref() == Some(release5.as_str())
                && r.detail.as_deref().is_some_and(|d| d.contains(&want))
                && r.boot_loader.as_ref().is_some_and(|b| {
                    b.fell_back && b.attempts == 2 && b.limit == 1 && b.label == label5
                })
        });
        self.r.assert(
            ok,
            format!(
                "the supervisor rolls release 5 back, naming the failed attempt ({})",
                r.as_ref().map(|r| r.describe()).unwrap_or_default()
            ),
            format!("the supervisor says: {r:?}"),
            log,
        );
        let conf = self
            .ssh()
            .query(60, "cat /boot/extlinux/extlinux.conf")
            .stdout;
        let default = extlinux::default_of(&conf).unwrap_or_default();
        match (self.releases(), self.wait_running(240)) {
            (Ok(rel), Ok(st)) => {
                let cur = current_release(&rel);
                let committed = matches!(
                    rel.state,
                    Some(releases::state::ReleaseState::Committed { .. })
                );
                self.r.assert(
                    cur.starts_with("4-")
                        && committed
                        && default.starts_with("rtdeploy-release-4-")
                        && st.processes.iter().all(|p| p.state == "running"),
                    format!("release 4 is committed, DEFAULT again ({default}) and running"),
                    format!(
                        "deploy releases: current {cur}, {:?}; DEFAULT {default}",
                        rel.state
                    ),
                    log,
                );
                let table = self.ssh().query(60, "deploy status").stdout;
                self.r.assert(
                    table.lines().any(|l| {
                        l.starts_with("release: rolled back")
                            && l.contains(&format!("; boot loader: {want}"))
                    }),
                    "deploy status names the failed attempts on its release line",
                    tail_lines(&table, 20),
                    log,
                );
                // The boot history keeps it: this boot's record names the
                // fallback and the boot loader's count, and the watchdog
                // the initrd started before user space.
                let hist = self.ssh().query(60, "deploy check --history --json");
                let doc: Value = serde_json::from_str(&hist.stdout).unwrap_or(Value::Null);
                let last = doc["records"]
                    .as_array()
                    .and_then(|r| r.last())
                    .cloned()
                    .unwrap_or(Value::Null);
                let text = |v: &Value| v.as_str().unwrap_or("").to_string();
                self.r.assert(
                    text(&last["fallback"]).starts_with(&format!("{release5} rolled back to 4-"))
                        && text(&last["fallback"]).contains(&want)
                        && last["boot_loader"]["fell_back"] == Value::Bool(true)
                        && last["boot_loader"]["label"] == Value::String(label5.clone())
                        && text(&last["watchdog"]).contains("/dev/watchdog (i6300ESB timer): active"),
                    format!(
                        "the boot history keeps the fallback, the boot loader's count and the watchdog ({}; watchdog {})",
                        cut(&text(&last["fallback"]), 160),
                        text(&last["watchdog"])
                    ),
                    format!("the last record: {}", cut(&last.to_string(), 2000)),
                    log,
                );
                crate::checks::watchdog_armed(
                    &mut self.r,
                    &self.work.join("robot.yaml"),
                    Some(&st),
                    "boot 3",
                    log,
                );
            }
            (rel, st) => self.r.fail(
                "release 4 is committed, DEFAULT again and running",
                format!("{:?} {:?}", rel.err(), st.err()),
                log,
            ),
        }
        true
    }

    /// The runtime's suites, cross-built, run in the guest.
    fn guest_tests(&mut self) {
        let what = "the runtime's test suites pass in the aarch64 guest";
        let list = std::fs::read_to_string(self.outa.join("tests.txt")).unwrap_or_default();
        let suites: Vec<String> = list
            .lines()
            .filter(|l| {
                ["controller-", "channel-", "event_loop-"]
                    .iter()
                    .any(|p| l.starts_with(p))
            })
            .map(str::to_string)
            .collect();
        const DIR: &str = "/root/rtdeploy-tests";
        if suites.is_empty()
            || !self
                .ssh()
                .send_files(&self.outa.join("tests"), &suites, DIR)
                .ok()
        {
            return self.r.fail(what, "could not copy them in", None);
        }
        let (mut passed, mut failed, mut bad) = (0u64, 0u64, Vec::new());
        let mut all = String::new();
        for t in &suites {
            let out = self
                .ssh()
                .run(900, &format!("cd {DIR} && ./{t} --test-threads=1 2>&1"));
            all.push_str(&format!("== {t} (exit {})\n{}\n", out.status, out.stdout));
            let result = out
                .stdout
                .lines()
                .rfind(|l| l.starts_with("test result:"))
                .unwrap_or("")
                .to_string();
            let count = |word: &str| -> u64 {
                let w: Vec<&str> = result.split([' ', ';']).filter(|s| !s.is_empty()).collect();
                w.windows(2)
                    .find(|p| p[1] == word)
                    .and_then(|p| p[0].parse().ok())
                    .unwrap_or(0)
            };
            passed += count("passed");
            failed += count("failed");
            if !out.ok() {
                let fails: Vec<&str> = out
                    .stdout
                    .lines()
                    .filter(|l| l.starts_with("test ") && l.ends_with("FAILED"))
                    .take(5)
                    .collect();
                bad.push(format!("{t}(exit {}: {})", out.status, fails.join(" ")));
            }
            say(format!(
                "guest test {t}: exit {}, {}",
                out.status,
                if result.is_empty() {
                    "no result line"
                } else {
                    &result
                }
            ));
        }
        if bad.is_empty() && passed > 0 {
            self.r.pass(format!("{what} ({passed} tests: the controller crate's unit tests, channel and event_loop)"));
        } else {
            self.r.fail(
                what,
                format!("{passed} passed, {failed} failed: {}", bad.join(" ")),
                None,
            );
            for l in all
                .lines()
                .filter(|l| l.contains("FAILED") || l.contains("panicked"))
                .take(40)
            {
                println!("{l}");
            }
        }
    }

    /// The census on PREEMPT_RT (multi-threaded TCG: holders and waiters
    /// really overlap here, unlike the x86 guest's thread=single): the
    /// letter's scenario per mechanism, two best-effort threads hammering
    /// the best-effort word, the kprobe on futex_hash.
    fn census(&mut self) {
        self.r.phase("boot 3: the wake census on PREEMPT_RT");
        self.ssh().query(60, "deploy stop --all");
        let out = self.ssh().run(
            900,
            &format!(
                "deploy check --census --hammer 2 --mechanisms doorbell,io_uring,futex_waitv,io_uring_shared --duration {} --json -q --no-verify",
                self.o.census_duration
            ),
        );
        let doc: Value = serde_json::from_str(&out.stdout).unwrap_or(Value::Null);
        let census = &doc["census"];
        if !(out.status == 0 || out.status == 1) || census["enabled"] != Value::Bool(true) {
            return self.r.fail(
                "the census runs in the guest",
                format!(
                    "exit {}: {} {}",
                    out.status,
                    tail_lines(&out.stderr, 5),
                    census["reason"]
                ),
                None,
            );
        }
        println!(
            "census: {} events lost; buckets: {}",
            census["events_lost"],
            census["bucket_probe"].as_str().unwrap_or("none")
        );
        let phases = census["phases"].as_array().cloned().unwrap_or_default();
        for p in &phases {
            println!(
                "census {}: {} counted, words {} ({} shared); buckets {}",
                p["label"].as_str().unwrap_or("?"),
                p["counted_waits"],
                p["words"].as_array().map_or(0, Vec::len),
                p["shared_words"],
                p["buckets"]
            );
        }
        let phase = |label: &str| {
            phases
                .iter()
                .find(|p| p["label"] == label)
                .cloned()
                .unwrap_or(Value::Null)
        };
        self.r.check(
            "the census probes futex_hash in the guest (kprobes)",
            "futex_hash (kprobe: key on entry, bucket on return)",
            census["bucket_probe"].as_str().unwrap_or(""),
            None,
        );
        // Must be counted: the positive control (a best-effort holder of a
        // PI futex a FIFO waiter then locks) and the one-word reference.
        for (label, what) in [
            ("positive control: PI futex", "the census counts the positive control's PI boosts"),
            (
                "io_uring_shared",
                "the one-word reference under the hammer shows real-time waits on lower-priority holders",
            ),
        ] {
            let p = phase(label);
            let n = p["counted_waits"].as_u64().unwrap_or(0);
            self.r.assert(n > 0, format!("{what} ({n})"), cut(&p.to_string(), 400), None);
        }
        for m in ["doorbell", "io_uring", "futex_waitv"] {
            let p = phase(m);
            let shared = match &p["buckets"]["shared_same_word"] {
                Value::Null => "none".to_string(),
                v => v.to_string(),
            };
            let got = format!("{} {} {shared}", p["counted_waits"], p["shared_words"]);
            let what = format!("{m}: no counted wait, no word and no bucket shared with a best-effort task for the same word");
            if got == "0 0 0" {
                self.r.pass(format!("{what} ({got})"));
            } else {
                // The phase whole: which waits were counted, on what.
                self.r.fail(
                    what,
                    format!(
                        "expected '0 0 0', got '{got}': {}",
                        cut(&p.to_string(), 4000)
                    ),
                    None,
                );
            }
        }
    }

    fn power_off(&mut self) {
        let Some(mut q) = self.qemu.take() else {
            return;
        };
        self.r.phase("power off");
        if let Some(s) = self.ssh.as_ref() {
            s.run(20, "systemctl poweroff");
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        while q.exited().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_secs(1));
        }
        let off = q.exited().is_some();
        let log = self.log1.clone();
        self.r.assert(
            off,
            "the guest powers off",
            "QEMU still running after 120 s",
            Some(&log),
        );
        q.stop();
    }

    /// Autoboot interrupted at U-Boot's prompt, a label named: the kernel
    /// gets that label's line.
    fn fallback_labels(&mut self, m: &Made) {
        self.r.phase("boot 4: the fallback labels");
        let mut cases = vec![(
            "rtdeploy-original".to_string(),
            m.orig_append.clone(),
            "the fallback label rtdeploy-original boots the base's original command line"
                .to_string(),
        )];
        if !m.image_default.is_empty() {
            cases.push((
                m.image_default.clone(),
                m.image_append.clone(),
                format!(
                    "the label the system update kept ({}) boots the previous plan's command line",
                    m.image_default
                ),
            ));
        }
        let machine = Machine::Arm64 {
            bios: m.base.join("u-boot.bin"),
            disk: m.disk.clone(),
            ssh_port: None,
        };
        for (label, want, what) in cases {
            let log = self.work.join(format!("serial-fallback-{label}.log"));
            let set = format!("setenv pxe_label_override {label}\r");
            let steps = [
                Step::Expect("Hit any key to stop autoboot"),
                Step::Send(" "),
                Step::Expect("=> "),
                Step::Send(&set),
                Step::Expect("=> "),
                // The extlinux boot itself, as the boot-attempts script
                // runs it (`boot` runs the script first, which sets the
                // override of its own; trixie's U-Boot has bootstd and no
                // `sysboot`).
                Step::Send("bootmeth order extlinux; bootflow scan -lb\r"),
                Step::Until("Kernel command line: "),
            ];
            match machine.console(
                &log,
                Duration::from_secs(300),
                &steps,
                &["No more bootdevs", "Kernel panic"],
            ) {
                Ok(line) => {
                    let got = line
                        .split_once("Kernel command line: ")
                        .map_or("", |(_, l)| l)
                        .trim_end();
                    self.r.check(&what, &want, got, Some(&log));
                }
                Err(e) => self.r.fail(what, cut(&e, 2000), Some(&log)),
            }
        }
    }

    /// A disk whose extlinux.conf names a kernel that is not there: U-Boot
    /// says so and the boot fails within its limit.
    fn bad_input(&mut self, m: &Made) {
        self.r.phase("bad input: a kernel missing under /boot");
        let what = "a missing kernel fails the boot, with the console shown";
        let dir = self.work.join("bad");
        let made = (|| -> Result<PathBuf, String> {
            std::fs::create_dir_all(dir.join("boot/extlinux")).map_err(|e| e.to_string())?;
            write_plain(
                &dir.join("boot/extlinux/extlinux.conf"),
                &format!("TIMEOUT 30\nDEFAULT primary\nLABEL primary\n      LINUX /boot/Image\n      APPEND {}\n", m.orig_append),
            )?;
            let fs = self.work.join("bad.ext4");
            std::fs::File::create(&fs)
                .and_then(|f| f.set_len(40 << 20))
                .map_err(|e| e.to_string())?;
            host::output(
                Command::new("mke2fs")
                    .args(["-q", "-t", "ext4", "-d"])
                    .arg(&dir)
                    .arg(&fs),
            )?;
            let disk = self.work.join("bad.img");
            gpt_disk(
                &[Part {
                    img: &fs,
                    start: 2048,
                    kind: LINUX_TYPE,
                    name: "rootfs",
                }],
                &disk,
                false,
            )?;
            Ok(disk)
        })();
        let disk = match made {
            Ok(d) => d,
            Err(e) => {
                return self
                    .r
                    .fail(what, format!("could not make the disk: {e}"), None)
            }
        };
        let machine = Machine::Arm64 {
            bios: m.base.join("u-boot.bin"),
            disk,
            ssh_port: None,
        };
        let log = self.work.join("serial-bad.log");
        let t = Instant::now();
        match machine.console(
            &log,
            Duration::from_secs(120),
            &[Step::Until("Kernel command line: ")],
            &["No more bootdevs"],
        ) {
            Ok(_) => self.r.fail(what, "a kernel booted", Some(&log)),
            Err(e) => match e.lines().find(|l| l.contains("failure retrieving kernel")) {
                Some(said) => {
                    self.r.pass(format!(
                        "a missing kernel fails the boot in {:.1} s, with the console shown ({})",
                        t.elapsed().as_secs_f64(),
                        said.trim_start_matches("  | ")
                    ));
                    let text = std::fs::read_to_string(&log).unwrap_or_default();
                    if let Some(i) = text.find("Retrieving file") {
                        let rest = &text[i..];
                        let end = rest
                            .find("No more bootdevs")
                            .map_or(rest.len(), |e| e + "No more bootdevs".len());
                        println!("{}", &rest[..end]);
                    }
                }
                None => self.r.fail(
                    what,
                    format!(
                        "no 'failure retrieving kernel' from U-Boot: {}",
                        cut(&e, 3000)
                    ),
                    Some(&log),
                ),
            },
        }
    }
}

/// Where the base puts an init that never starts user space
/// (scripts/e2e/arm64-base.sh).
const HANG: &str = "/usr/lib/rtdeploy-e2e/hang";
/// The heartbeat the base's initrd starts the watchdog with
/// (scripts/e2e/arm64-base.sh, WATCHDOG_S).
const EARLY_WATCHDOG_S: u64 = 120;

/// The board's disk: the boot partition (FAT, 32 MiB at 1 MiB), made from
/// the files `deploy image` put in the image's
/// `/usr/lib/rtdeploy/boot-partition` (read out with debugfs into
/// `files`), then the image (ext4) as the root partition; both bootable,
/// so that U-Boot scans the boot partition first and runs its script.
fn boot_disk(fs: &Path, files: &Path, disk: &Path) -> Result<(), String> {
    const FAT_START: u64 = 2048;
    const FAT_SECTORS: u64 = 65536;
    const ROOT_START: u64 = FAT_START + FAT_SECTORS;
    let _ = std::fs::remove_dir_all(files);
    std::fs::create_dir_all(files).map_err(|e| format!("{}: {e}", files.display()))?;
    host::output(
        Command::new("debugfs")
            .arg("-R")
            .arg(format!(
                "rdump /{} {}",
                releases::boot_attempts::PARTITION_TEMPLATE,
                files.display()
            ))
            .arg(fs),
    )?;
    let part = files.join("boot-partition");
    if !part.join(releases::boot_attempts::SCRIPT_FILE).is_file() {
        return Err(format!(
            "the image has no {}/{}",
            releases::boot_attempts::PARTITION_TEMPLATE,
            releases::boot_attempts::SCRIPT_FILE
        ));
    }
    let fat = files.join("fat.img");
    host::output(
        Command::new("mkfs.vfat")
            .args(["-C", "-n", "RTBOOT"])
            .arg(&fat)
            .arg((FAT_SECTORS / 2).to_string()),
    )?;
    let mut c = Command::new("mcopy");
    c.args(["-s", "-i"]).arg(&fat);
    for e in std::fs::read_dir(&part).map_err(|e| format!("{}: {e}", part.display()))? {
        c.arg(e.map_err(|e| e.to_string())?.path());
    }
    c.arg("::/");
    host::output(&mut c)?;
    gpt_disk(
        &[
            Part {
                img: &fat,
                start: FAT_START,
                kind: FAT_TYPE,
                name: "rtboot",
            },
            Part {
                img: fs,
                start: ROOT_START,
                kind: LINUX_TYPE,
                name: "rootfs",
            },
        ],
        disk,
        true,
    )
}

fn sfdisk(disk: &Path, table: &str) -> Result<(), String> {
    let mut c = Command::new("sfdisk");
    c.arg("-q")
        .arg(disk)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().map_err(|e| format!("sfdisk: {e}"))?;
    {
        use std::io::Write as _;
        let mut i = child.stdin.take().expect("piped");
        i.write_all(table.as_bytes())
            .map_err(|e| format!("sfdisk: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("sfdisk: {e}"))?;
    if !out.status.success() {
        return Err(format!("sfdisk: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(())
}

/// GPT partition types: Microsoft basic data (FAT), Linux file system.
const FAT_TYPE: &str = "EBD0A0A2-B9E5-4433-87C0-68B6B72699C7";
const LINUX_TYPE: &str = "0FC63DAF-8483-4772-8E79-3D69D8477DE4";

/// One partition of a test disk: the file system image it holds, its
/// first sector, GPT type and name.
struct Part<'a> {
    img: &'a Path,
    start: u64,
    kind: &'a str,
    name: &'a str,
}

/// A GPT disk holding `parts` (in order, each as large as its image; all
/// BIOS-bootable when `bootable`, so that U-Boot scans them in order).
fn gpt_disk(parts: &[Part], disk: &Path, bootable: bool) -> Result<(), String> {
    let attrs = if bootable {
        ", attrs=LegacyBIOSBootable"
    } else {
        ""
    };
    let mut table = String::from("label: gpt\n");
    let mut end = 0;
    for p in parts {
        let bytes = std::fs::metadata(p.img)
            .map_err(|e| format!("{}: {e}", p.img.display()))?
            .len();
        table.push_str(&format!(
            "start={}, size={}, type={}, name={}{attrs}\n",
            p.start,
            bytes / 512,
            p.kind,
            p.name
        ));
        end = end.max(p.start * 512 + bytes);
    }
    // A megabyte after the last partition: GPT's backup table.
    std::fs::File::create(disk)
        .and_then(|f| f.set_len(end + 1048576))
        .map_err(|e| format!("{}: {e}", disk.display()))?;
    sfdisk(disk, &table)?;
    for p in parts {
        host::output(
            Command::new("dd")
                .arg(format!("if={}", p.img.display()))
                .arg(format!("of={}", disk.display()))
                .args([
                    "bs=4M",
                    "oflag=seek_bytes",
                    "conv=notrunc,sparse",
                    "status=none",
                ])
                .arg(format!("seek={}", p.start * 512)),
        )?;
    }
    Ok(())
}

fn read(p: &Path) -> Setup<String> {
    std::fs::read_to_string(p).map_err(|e| (p.display().to_string(), e.to_string()))
}

fn write(p: &Path, text: &str) -> Setup<()> {
    write_plain(p, text).map_err(|e| (p.display().to_string(), e))
}

fn write_plain(p: &Path, text: &str) -> Result<(), String> {
    std::fs::write(p, text).map_err(|e| format!("{}: {e}", p.display()))
}

/// The name of the release `deploy releases` lists as current (empty when
/// none is).
fn current_release(rel: &ReleasesInfo) -> String {
    rel.releases
        .iter()
        .find(|r| r.current)
        .map(|r| r.name.clone())
        .unwrap_or_default()
}

/// JSON text read as one of our types, with serde's line:column on error.
trait ParseJson {
    fn parse_json<T: serde::de::DeserializeOwned>(&self) -> Result<T, String>;
}

impl ParseJson for str {
    fn parse_json<T: serde::de::DeserializeOwned>(&self) -> Result<T, String> {
        serde_json::from_str(self.trim())
            .map_err(|e| format!("not the JSON expected ({e}): {}", cut(self.trim(), 300)))
    }
}

impl ParseJson for String {
    fn parse_json<T: serde::de::DeserializeOwned>(&self) -> Result<T, String> {
        self.as_str().parse_json()
    }
}
