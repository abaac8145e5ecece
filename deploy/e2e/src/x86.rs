//! The x86_64 end-to-end test: an image built by `deploy image` boots
//! Debian's PREEMPT_RT kernel under QEMU (TCG, 4 CPUs, 1 GiB), the
//! supervisor runs as PID 1, and the guest's driver (`scripts/e2e/
//! driver.sh`) reports on a virtio console what is asserted here.
//!
//! Four boots:
//! 1. probe: a busybox initramfs with the plan's kernel command line; the
//!    kernel's own state (PREEMPT_RT, isolated CPUs, IRQ threads).
//! 2. image: `deploy image --format cpio.gz -c examples/qemu.yaml`, /init
//!    execs `deploy supervise` as PID 1 with the driver beside it; a device
//!    hot-added through the monitor, traced checks with planted
//!    interferers, a controller killed, an orderly shutdown.
//! 3. the same image with `RTDEPLOY_DENY_SYSCALLS=io_uring,futex_waitv`
//!    (a seccomp filter answering ENOSYS): the doorbell backend; the
//!    supervisor runs as a child of /init there, and the driver freezes it
//!    with SIGSTOP at the end: the hardware watchdog it fed (QEMU's
//!    i6300esb) resets the machine, which boots again.
//! 4. the same image on Debian bullseye's 5.10 PREEMPT_RT kernel (the
//!    JetPack 5 series): the runtime picks the doorbell by itself.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use deploy::cmd::plan::Plan;
use serde_json::Value;
use services::status::SupervisorStatus;
use units::cpu::CpuSet;

use crate::guest::{cut, head_lines, json_of, received, tail_lines, Console};
use crate::host::{self, X86_TRIPLE};
use crate::qemu::{self, side, Machine, Outcome};
use crate::report::Report;
use crate::{say, Env};

#[derive(clap::Args)]
pub struct Options {
    /// Seconds each boot may take.
    #[arg(long, env = "E2E_BOOT_LIMIT", default_value_t = 300)]
    boot_limit: u64,
    /// Boot 4, the image on a 5.10 PREEMPT_RT kernel (`E2E_OLD_KERNEL=0`
    /// leaves it out).
    #[arg(long, env = "E2E_OLD_KERNEL", default_value_t = 1)]
    old_kernel: u8,
    /// The source tree to build (default: this repository).
    #[arg(long, env = "E2E_SRC")]
    src: Option<PathBuf>,
}

pub fn run(env: &Env, o: &Options) -> u8 {
    crate::in_work_dir(env, "rtdeploy-e2e.", |work| {
        let mut t = X86 {
            env,
            src: o.src.clone().unwrap_or_else(|| env.repo.clone()),
            limit: Duration::from_secs(o.boot_limit),
            old_kernel: o.old_kernel != 0,
            work: work.to_path_buf(),
            r: Report::new("e2e-qemu"),
            plan: None,
        };
        let setup = t.all();
        let code = t.r.finish(show_consoles);
        match setup {
            Ok(()) => code,
            Err(e) => {
                say(e);
                2
            }
        }
    })
}

/// Prints a failing boot's consoles: serial (kernel, supervisor), virtio
/// (the test in the guest), QEMU's own output.
fn show_consoles(log: &Path) {
    let name = log.file_name().unwrap_or_default().to_string_lossy();
    println!("\n===== serial console {name} (kernel, supervisor) =====");
    println!("{}", Console::read(log).text());
    println!("===== end of {name} =====");
    println!("\n===== virtio console {name}.hvc (the test in the guest) =====");
    println!("{}", Console::read(&side(log, "hvc")).text());
    println!("===== end of {name}.hvc =====");
    let q = Console::read(&side(log, "qemu"));
    if !q.text().is_empty() {
        println!("===== qemu output =====\n{}", q.text());
    }
}

struct X86<'a> {
    env: &'a Env,
    src: PathBuf,
    limit: Duration,
    old_kernel: bool,
    work: PathBuf,
    r: Report,
    plan: Option<Plan>,
}

/// The example robot this test boots.
const CONFIG: &str = "examples/qemu.yaml";

/// A boot's files: its serial console and the driver's virtio console.
struct Boot {
    log: PathBuf,
    out: Console,
    outcome: Outcome,
}

impl X86<'_> {
    fn out_bin(&self) -> PathBuf {
        self.env.target_dir.join(X86_TRIPLE).join("release")
    }

    fn plan(&self) -> &Plan {
        self.plan.as_ref().expect("planned")
    }

    /// Every boot; an error is a setup failure (exit 2).
    fn all(&mut self) -> Result<(), String> {
        self.r.phase("host tools + kernel");
        let kernel = self.fetch_kernel(None)?;
        self.r.phase("build deploy + controllers (static)");
        let Some(deploy) = self.build() else {
            self.r.skip("every boot", "deploy did not build");
            return Ok(());
        };
        self.r.phase("plan");
        if !self.make_plan(&deploy) {
            self.r.skip("every boot", "no plan (deploy plan failed)");
            return Ok(());
        }
        self.r.phase("base rootfs + probe initramfs");
        let base = self.work.join("base");
        host::busybox_base(&base, &self.env.repo)?;
        let probe = self.work.join("probe-root");
        host::copy_tree(&base, &probe)?;
        std::fs::copy(
            self.env.repo.join("scripts/e2e/probe-init.sh"),
            probe.join("init"),
        )
        .map_err(|e| format!("probe init: {e}"))?;
        let probe_cpio = self.work.join("probe.cpio.gz");
        host::cpio_gz(&probe, &probe_cpio)?;
        self.probe_boot(&kernel, &probe_cpio)?;

        self.r.phase("deploy image --format cpio.gz");
        let Some(image) = self.image(&deploy, &base, &kernel)? else {
            self.r.end_phase();
            for a in SUPERVISED_ASSERTIONS {
                self.r.skip(a, "the image did not build");
            }
            return Ok(());
        };
        self.image_boot(&kernel, &image)?;

        self.r
            .phase("boot 3: image, io_uring + futex_waitv denied; supervisor frozen");
        let mut reset = WatchdogReset::default();
        let b = self.boot_with(
            &kernel,
            &image,
            "serial-deny.log",
            &format!(
                "{}=io_uring,futex_waitv e2e.freeze=1",
                units::env::DENY_SYSCALLS
            ),
            false,
            true,
            |log| reset.watch(log),
        )?;
        self.r.end_phase();
        let what = "io_uring and futex_waitv denied";
        let deny_status = self.backend_boot(&b, what, "doorbell");
        crate::checks::watchdog_armed(
            &mut self.r,
            &self.src.join(CONFIG),
            deny_status.as_ref(),
            "boot 3",
            Some(&b.log),
        );
        self.watchdog_reset(&b, &reset);
        if let Some(st) = deny_status {
            match st.startup.iter().find(|s| s.step == "syscall filter") {
                Some(s) if s.result == "ok" => self
                    .r
                    .pass(format!("{what}: the supervisor says so ({})", s.detail)),
                other => self.r.fail(
                    format!("{what}: the supervisor says so"),
                    format!("startup step: {other:?}"),
                    Some(&b.log),
                ),
            }
        }

        if !self.old_kernel {
            self.r.skip(
                "5.10 kernel: the runtime picks the doorbell backend by itself",
                "E2E_OLD_KERNEL=0",
            );
            return Ok(());
        }
        self.r.phase("5.10 kernel (bullseye)");
        let old = match self.fetch_kernel(Some("5.10")) {
            Ok(k) => k,
            Err(e) => {
                self.r.fail("5.10 kernel: fetched", e, None);
                return Ok(());
            }
        };
        self.r.phase("boot 4: image on 5.10-rt");
        let b = self.boot(&old, &image, "serial-5.10.log", "", false, |_| {})?;
        self.r.end_phase();
        let release = std::fs::read_to_string(old.with_file_name("release")).unwrap_or_default();
        self.r.check(
            &format!("5.10 kernel: it is {}, PREEMPT_RT", release.trim()),
            "1",
            b.out.value("realtime").unwrap_or(""),
            Some(&b.log),
        );
        if let Some(st) = self.backend_boot(&b, "5.10 kernel", "doorbell") {
            // The image's watchdog driver is built for 6.12: 5.10 refuses
            // it, and the supervisor runs without a watchdog, saying so.
            let w = st.watchdog.as_ref();
            self.r.assert(
                w.is_some_and(|w| w.state == "missing" && w.detail.contains("does not reset"))
                    && st.startup.iter().any(|s| s.step == "watchdog" && s.result == "failed"),
                "5.10 kernel: without a watchdog driver the supervisor runs and says the watchdog is missing",
                format!("{:?}", w),
                Some(&b.log),
            );
            // What the supervisor made of the plan on a kernel without
            // isolated partitions (said, not asserted: robot.yaml's
            // kernel: makes it an error before flashing).
            say(format!(
                "5.10 kernel: cpu plan step: {:?}",
                st.startup.iter().find(|s| s.step == "cpu plan")
            ));
        }
        Ok(())
    }

    /// `scripts/fetch-rt-kernel.sh` (cached by package): the kernel image.
    fn fetch_kernel(&self, series: Option<&str>) -> Result<PathBuf, String> {
        let mut c = Command::new("bash");
        c.arg(self.env.repo.join("scripts/fetch-rt-kernel.sh"))
            .env(units::env::CACHE, &self.env.cache);
        let dir = match series {
            Some(s) => {
                c.env(units::env::KERNEL_SERIES, s);
                self.env.cache.join(format!("rt-kernel-{s}"))
            }
            None => self.env.cache.join("rt-kernel"),
        };
        let log = self
            .work
            .join(format!("fetch-kernel{}.log", series.unwrap_or("")));
        host::run_logged(&mut c, &log)
            .map_err(|e| format!("scripts/fetch-rt-kernel.sh failed: {e}"))?;
        Ok(dir.join("vmlinuz"))
    }

    /// deploy and the controllers examples/qemu.yaml runs, static, in one
    /// cargo run so that the shared crates compile once.
    fn build(&mut self) -> Option<PathBuf> {
        let out = self.out_bin();
        let log = self.work.join("build.log");
        let built = host::cargo_static(
            &self.src,
            &self.env.target_dir,
            &[
                "-p",
                "deploy",
                "-p",
                "controller",
                "--bin",
                "deploy",
                "--example",
                "talker",
                "--example",
                "listener",
                "--example",
                "planted-spin",
            ],
            &log,
        );
        let deploy = out.join("deploy");
        let what = "deploy builds as a static x86_64 binary";
        if let Err(e) = built {
            self.r.fail(what, format!("cargo build failed: {e}"), None);
            return None;
        }
        match host::is_static(&deploy) {
            Ok(true) => self.r.pass(what),
            Ok(false) => self.r.fail(
                what,
                format!("{} has a program interpreter", deploy.display()),
                None,
            ),
            Err(e) => self.r.fail(what, e, None),
        }
        let examples =
            ["talker", "listener"].map(|e| host::is_static(&out.join("examples").join(e)));
        self.r.assert(
            examples.iter().all(|s| s == &Ok(true)),
            "example controllers talker and listener build statically",
            format!("{examples:?}"),
            None,
        );
        Some(deploy)
    }

    /// `deploy plan --json`: the kernel command line, the isolated CPUs
    /// and the IRQ-thread rules every boot is checked against.
    fn make_plan(&mut self, deploy: &Path) -> bool {
        let got = host::output(
            Command::new(deploy)
                .arg("plan")
                .arg("-c")
                .arg(self.src.join(CONFIG))
                .arg("--json"),
        )
        .and_then(|text| {
            serde_json::from_str::<Plan>(&text).map_err(|e| format!("the plan's JSON: {e}"))
        });
        match got {
            Ok(p) => {
                self.r.pass(format!(
                    "deploy plan -c {CONFIG} --json (cmdline: {})",
                    p.cmdline.line
                ));
                self.plan = Some(p);
                true
            }
            Err(e) => {
                self.r
                    .fail(format!("deploy plan -c {CONFIG} --json"), e, None);
                false
            }
        }
    }

    /// Boots `kernel` with `initrd` and the plan's command line plus
    /// `extra`, bounded by the boot limit; `during` is called while it
    /// runs.
    fn boot(
        &mut self,
        kernel: &Path,
        initrd: &Path,
        name: &str,
        extra: &str,
        flood: bool,
        during: impl FnMut(&Path),
    ) -> Result<Boot, String> {
        self.boot_with(kernel, initrd, name, extra, flood, false, during)
    }

    /// [`X86::boot`]; with `reboots`, a reset boots the guest again
    /// (`during` then stops QEMU).
    #[allow(clippy::too_many_arguments)]
    fn boot_with(
        &mut self,
        kernel: &Path,
        initrd: &Path,
        name: &str,
        extra: &str,
        flood: bool,
        reboots: bool,
        mut during: impl FnMut(&Path),
    ) -> Result<Boot, String> {
        let log = self.work.join(name);
        let append = format!(
            "console=ttyS0 panic=-1 {} {extra}",
            self.plan().cmdline.line
        )
        .trim()
        .to_string();
        let m = Machine::X86 {
            kernel: kernel.to_path_buf(),
            initrd: initrd.to_path_buf(),
            append,
            flood_tty1: flood,
            reboots,
        };
        let outcome = m
            .run(&log, self.limit, || during(&log))
            .map_err(|e| format!("qemu-system-x86_64: {e}"))?;
        let out = Console::read(&side(&log, "hvc"));
        Ok(Boot { log, out, outcome })
    }

    fn outcome(&mut self, b: &Boot, what: &str) {
        match b.outcome {
            Outcome::Exited(0) => {}
            Outcome::TimedOut => self.r.fail(
                format!("{what} finishes within {} s", self.limit.as_secs()),
                "time limit hit",
                Some(&b.log),
            ),
            o => self.r.fail(what, o.to_string(), Some(&b.log)),
        }
    }

    fn probe_boot(&mut self, kernel: &Path, initrd: &Path) -> Result<(), String> {
        self.r.phase("boot 1: kernel probe");
        let b = self.boot(kernel, initrd, "serial-probe.log", "", false, |_| {})?;
        self.r.end_phase();
        self.outcome(&b, "probe boot");
        self.r.assert(
            b.out.has_line("E2E end"),
            "probe guest ran to its end and powered off",
            "no 'E2E end' line on the console",
            Some(&b.log),
        );
        self.kernel_state(&b, "");
        // Before anything applies the plan every threaded handler runs
        // SCHED_FIFO 50, the PREEMPT_RT default.
        let threads = b.out.values("irqthread");
        if threads.is_empty() {
            self.r
                .fail("irq/* threads exist", "none listed", Some(&b.log));
        } else {
            let names: Vec<&str> = threads
                .iter()
                .filter_map(|t| t.split_whitespace().nth(1))
                .collect();
            self.r
                .pass(format!("irq/* threads exist: {}", names.join(" ")));
            let bad: Vec<&str> = threads
                .iter()
                .copied()
                .filter(|t| !t.ends_with("policy=1 prio=50"))
                .collect();
            self.r.assert(
                bad.is_empty(),
                "irq/* threads are SCHED_FIFO 50 (kernel default) before the plan is applied",
                bad.join(";"),
                Some(&b.log),
            );
        }
        Ok(())
    }

    /// PREEMPT_RT, the isolated CPUs and the command line, as the guest
    /// read them.
    fn kernel_state(&mut self, b: &Boot, prefix: &str) {
        let plan = self.plan.as_ref().expect("planned");
        let isolated = plan.cpus.isolated.to_string();
        let tokens = plan.cmdline.line.clone();
        self.r.check(
            &format!("{prefix}kernel is PREEMPT_RT (/sys/kernel/realtime)"),
            "1",
            b.out.value("realtime").unwrap_or(""),
            Some(&b.log),
        );
        self.r.check(
            &format!("{prefix}/sys/devices/system/cpu/isolated equals the plan"),
            &isolated,
            b.out.value("isolated").unwrap_or(""),
            Some(&b.log),
        );
        let cmdline = b.out.value("cmdline").unwrap_or("");
        crate::checks::cmdline_carries(
            &mut self.r,
            "/proc/cmdline carries every planned token",
            cmdline,
            &tokens,
            Some(&b.log),
        );
    }

    /// `deploy image --format cpio.gz`: the release (bin/talker,
    /// bin/listener, stripped), the test's own files in the base (/init
    /// execs the supervisor, the driver runs beside it).
    fn image(
        &mut self,
        deploy: &Path,
        base: &Path,
        kernel: &Path,
    ) -> Result<Option<PathBuf>, String> {
        let out = self.out_bin();
        let rel = self.work.join("release");
        let bin = self.work.join("bin");
        let tools = base.join("usr/lib/rtdeploy-e2e");
        for d in [rel.join("bin"), bin.clone(), tools.clone()] {
            std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
        }
        host::strip_copy(&out.join("examples/talker"), &rel.join("bin/talker"))?;
        host::strip_copy(&out.join("examples/listener"), &rel.join("bin/listener"))?;
        host::strip_copy(deploy, &bin.join("deploy"))?;
        let copy = |from: &str, to: &Path| {
            std::fs::copy(self.env.repo.join(from), to)
                .map(|_| ())
                .map_err(|e| format!("{from}: {e}"))
        };
        copy("scripts/e2e/supervised-init.sh", &base.join("init"))?;
        copy("scripts/e2e/driver.sh", &tools.join("driver.sh"))?;
        // The watchdog's driver and what it needs, built for the kernel
        // boots 2 and 3 run (scripts/fetch-rt-kernel.sh keeps them);
        // /init loads them.
        let wd = kernel.with_file_name("watchdog");
        let mods = tools.join("modules");
        std::fs::create_dir_all(&mods).map_err(|e| format!("{}: {e}", mods.display()))?;
        let order = std::fs::read_to_string(wd.join("order"))
            .map_err(|e| format!("{}: {e}", wd.join("order").display()))?;
        for m in order.split_whitespace().chain(["order"]) {
            std::fs::copy(wd.join(m), mods.join(m))
                .map_err(|e| format!("{}: {e}", wd.join(m).display()))?;
        }
        host::strip_copy(
            &out.join("examples/planted-spin"),
            &tools.join("planted-spin"),
        )?;
        let image = self.work.join("image.cpio.gz");
        let mut c = Command::new(deploy);
        c.arg("image")
            .arg("-c")
            .arg(self.src.join(CONFIG))
            .arg("--base")
            .arg(base)
            .arg("--release")
            .arg(&rel)
            .arg("--deploy-binary")
            .arg(bin.join("deploy"))
            .arg("--out")
            .arg(&image)
            .args(["--format", "cpio.gz"]);
        let what = format!("deploy image --format cpio.gz -c {CONFIG}");
        if let Err(e) = host::run_logged(&mut c, &self.work.join("image.log")) {
            self.r.fail(what, e, None);
            return Ok(None);
        }
        self.r.pass(format!("{what} ({})", host::size(&image)));
        // No extlinux.conf in the base: the image carries the planned line
        // in /etc/rtdeploy/cmdline.
        let cmdline = host::output(Command::new("sh").arg("-c").arg(format!(
            "zcat '{}' | cpio -i --quiet --to-stdout etc/rtdeploy/cmdline",
            image.display()
        )))
        .unwrap_or_else(|e| e);
        let want = self.plan().cmdline.line.clone();
        self.r.check(
            "the image's /etc/rtdeploy/cmdline is the planned line",
            &want,
            &cmdline.split_whitespace().collect::<Vec<_>>().join(" "),
            None,
        );
        Ok(Some(image))
    }

    fn image_boot(&mut self, kernel: &Path, image: &Path) -> Result<(), String> {
        self.r.phase("boot 2: image, supervisor as PID 1");
        // The host half of the hot-plug: when the guest says
        // hotplug-ready, a virtio-serial PCI device (its driver is built
        // into Debian's kernel) is added through the monitor.
        let mut monitor_reply: Option<String> = None;
        let mut ticks = 0u32;
        let b = self.boot(
            kernel,
            image,
            "serial-image.log",
            "e2e.hotplug=1 e2e.trace=1",
            true,
            |log| {
                ticks += 1;
                if monitor_reply.is_some() || ticks % 5 != 0 {
                    return;
                }
                if Console::read(&side(log, "hvc")).has_line_starting("E2E hotplug-ready") {
                    monitor_reply = Some(
                        qemu::monitor(log, "device_add virtio-serial-pci,id=hot0")
                            .unwrap_or_else(|e| format!("monitor: {e}")),
                    );
                }
            },
        )?;
        self.r.end_phase();
        let log = Some(b.log.as_path());
        self.outcome(&b, "image boot");
        self.kernel_state(&b, "image: ");
        self.r.assert(
            b.out.has_line_starting("E2E controllers-running"),
            "the supervisor starts talker and listener",
            "they were not both running within 240 s",
            log,
        );
        let status = b.out.block_json::<SupervisorStatus>("status-json");
        if let Ok(st) = &status {
            crate::checks::cpu_plan_applied(&mut self.r, st, log);
            self.processes_in_force(st, log);
        }
        let rules = self.plan().irqs.threads.clone();
        check_irq_threads(
            &mut self.r,
            &rules,
            &b.out.block("irqthreads"),
            "supervisor as PID 1 applies the plan: IRQ threads carry the planned priorities and CPUs",
            log,
        );
        self.hotplug(&b, monitor_reply.as_deref());
        self.traces(&b);

        match b.out.block_rc("verify") {
            Some(0) => self.r.pass("deploy verify exits 0 in the guest"),
            rc => self.r.fail(
                "deploy verify exits 0 in the guest",
                format!(
                    "exit {rc:?}: {}{}",
                    b.out.block("verify"),
                    head_lines(&b.out.block("verify-stderr"), 30)
                ),
                log,
            ),
        }
        match &status {
            Err(e) => self.r.fail(
                "deploy status --json in the guest",
                format!(
                    "{e}: {}",
                    head_lines(&b.out.block("status-json-stderr"), 20)
                ),
                log,
            ),
            Ok(st) => {
                self.r.pass("deploy status --json in the guest");
                self.boot_check(&b, st);
            }
        }
        self.messages(&b);
        if let Ok(st) = &status {
            check_status_backend(
                &mut self.r,
                st,
                "doorbell",
                "deploy status names each process's backend (real-time processes sleep on their doorbell)",
                log,
            );
        }
        crate::checks::watchdog_armed(
            &mut self.r,
            &self.src.join(CONFIG),
            status.as_ref().ok(),
            "boot 2",
            Some(&b.log),
        );
        // Fed all along: at the end of the driver's work (after the
        // traced checks, well past the timeout) it was fed more, and the
        // machine never reset (the orderly shutdown below).
        let later = b
            .out
            .block_json::<SupervisorStatus>("status-end-json")
            .ok()
            .and_then(|s| s.watchdog);
        let first = status.as_ref().ok().and_then(|s| s.watchdog.as_ref());
        self.r.assert(
            matches!((first, &later), (Some(a), Some(b)) if b.fed > a.fed && b.state == "armed"),
            format!(
                "boot 2: the supervisor kept feeding the watchdog (fed {} times, then {})",
                first.map_or(0, |w| w.fed),
                later.as_ref().map_or(0, |w| w.fed)
            ),
            format!("{first:?} then {later:?}"),
            Some(&b.log),
        );
        self.restart(&b);
        self.shutdown(&b);
        Ok(())
    }

    /// Frozen with SIGSTOP, the supervisor stops feeding the watchdog and
    /// the machine resets: the kernel starts again, with no panic, power
    /// off or reboot of the kernel's own between the freeze and the new
    /// start, no sooner than the timeout less a feeding period after the
    /// freeze.
    fn watchdog_reset(&mut self, b: &Boot, reset: &WatchdogReset) {
        let log = Some(b.log.as_path());
        let timeout = crate::checks::watchdog_timeout_s(&self.src.join(CONFIG));
        let what = "a supervisor frozen with SIGSTOP gets the machine reset by the watchdog";
        let Some(frozen) = reset.frozen else {
            self.r.fail(
                what,
                format!(
                    "the driver did not freeze the supervisor: {}",
                    tail_lines(b.out.text(), 5)
                ),
                log,
            );
            return;
        };
        let serial = Console::read(&b.log);
        let text = serial.text();
        let starts: Vec<usize> = text
            .match_indices("Linux version")
            .map(|(i, _)| i)
            .collect();
        let Some(&again) = starts.get(1) else {
            self.r.fail(what, "the kernel did not start again", log);
            return;
        };
        let before = &text[..again];
        let kernel_did = [
            "Kernel panic",
            "reboot: ",
            "Attempted to kill init",
            "sysrq: ",
        ]
        .into_iter()
        .find(|m| before.contains(m));
        let after = reset.reset.map(|r| r.saturating_duration_since(frozen));
        // The last feed was at most a quarter of the timeout before the
        // freeze.
        let least = Duration::from_secs(timeout) * 3 / 4;
        match (kernel_did, after) {
            (Some(m), _) => self.r.fail(
                what,
                format!("the kernel itself ended the boot (`{m}`) before it started again"),
                log,
            ),
            (None, Some(a)) if a + Duration::from_secs(2) >= least => self.r.pass(format!(
                "{what} ({:.0} s after the freeze, timeout {timeout} s; the kernel started again)",
                a.as_secs_f64()
            )),
            (None, a) => self.r.fail(
                what,
                format!(
                    "the machine reset {a:?} after the freeze, sooner than {least:?}: not the watchdog of a supervisor that fed it"
                ),
                log,
            ),
        }
    }

    /// Each process runs with the planned policy, priority and CPUs, as
    /// the kernel reports them (deploy status reads them back from /proc).
    fn processes_in_force(&mut self, st: &SupervisorStatus, log: Option<&Path>) {
        let plan = self.plan.as_ref().expect("planned");
        crate::checks::processes_in_force(&mut self.r, plan, st, "the planned", log);
    }

    /// The hot-added device: its IRQ threads appeared after start-up and
    /// the supervisor's scan placed them.
    fn hotplug(&mut self, b: &Boot, monitor_reply: Option<&str>) {
        let log = Some(b.log.as_path());
        let new: Vec<String> = b
            .out
            .value("hotplug-new")
            .unwrap_or("")
            .split_whitespace()
            .map(str::to_string)
            .collect();
        if new.is_empty() {
            self.r.fail(
                "a device hot-added through the QEMU monitor shows new IRQ threads",
                format!(
                    "{}; monitor: {}",
                    b.out
                        .value("hotplug-appeared")
                        .unwrap_or("no hotplug-appeared line"),
                    monitor_reply.unwrap_or("never asked")
                ),
                log,
            );
            return;
        }
        self.r.pass(format!(
            "a device hot-added through the QEMU monitor shows new IRQ threads ({})",
            new.join(" ")
        ));
        let lines: String = b
            .out
            .block("irqthreads-hotplug")
            .lines()
            .filter(|l| {
                l.split_whitespace()
                    .nth(1)
                    .is_some_and(|c| new.iter().any(|n| n == c))
            })
            .map(|l| format!("{l}\n"))
            .collect();
        let rules = self.plan().irqs.threads.clone();
        check_irq_threads(
            &mut self.r,
            &rules,
            &lines,
            "the running supervisor places the hot-added device's IRQ threads as robot.yaml says",
            log,
        );
        match b
            .out
            .block_json::<SupervisorStatus>("status-hotplug-json")
            .map(|s| s.irq_scan)
        {
            Ok(Some(scan)) if scan.result == "ok" => self.r.pass(format!(
                "deploy status says what the scan placed ({})",
                cut(&scan.detail, 160)
            )),
            other => self.r.fail(
                "deploy status says what the scan placed",
                format!("irq_scan: {other:?}"),
                log,
            ),
        }
    }

    /// Why was it late: a traced check with each planted interferer on the
    /// receiver's CPU (driver.sh) misses its budget, and a verdict names
    /// it; the supervisor tracing its running listener names it too.
    fn traces(&mut self, b: &Boot) {
        let log = Some(b.log.as_path());
        let cpu_text = b.out.value("trace-receiver-cpu").unwrap_or("?").to_string();
        let cpu: Option<u64> = cpu_text.parse().ok();
        const SPINNER: &str = "planted-spin (FIFO 90, pid ";
        self.trace_named(
            b,
            "trace-spin",
            SPINNER,
            &format!(
                "deploy check --trace in the guest: a verdict names the planted SCHED_FIFO spinner on the receiver's CPU {cpu_text}"
            ),
        );
        // The same run's timer phase (timer_max 5 ms): the timer on that CPU.
        let doc: Value = json_of(&b.out.block("trace-spin")).unwrap_or(Value::Null);
        let verdicts = |pick: &dyn Fn(&Value) -> bool| -> Vec<String> {
            doc["trace"]["verdicts"]
                .as_array()
                .map(|v| {
                    v.iter()
                        .filter(|x| pick(x))
                        .filter_map(|x| x["verdict"].as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        let timer = verdicts(&|v| cpu.is_some() && v["timer_cpu"].as_u64() == cpu);
        let what = format!("deploy check --trace in the guest: a timer verdict on CPU {cpu_text} names the planted spinner");
        match timer.iter().find(|v| v.contains(SPINNER)) {
            Some(named) => self.r.pass(format!(
                "{what} ({} timer miss(es) traced there; {})",
                timer.len(),
                cut(named, 200)
            )),
            None => {
                let per_cpu: Vec<String> = verdicts(&|v| !v["timer_cpu"].is_null())
                    .iter()
                    .take(8)
                    .map(|v| cut(v, 200))
                    .collect();
                self.r.fail(
                    what,
                    format!(
                        "{} timer wake(s) over {} ns; timer verdicts: {}",
                        doc["trace"]["timer_over_threshold"],
                        doc["trace"]["timer_miss_threshold_ns"],
                        per_cpu.join(" | ")
                    ),
                    None,
                );
            }
        }
        // The supervisor tracing its running processes (driver.sh: a
        // supervisor in a prefix whose listener on that CPU has a 5 ms
        // wakeup budget).
        let why = b
            .out
            .block_json::<SupervisorStatus>("trace-runtime")
            .ok()
            .and_then(|s| s.processes.into_iter().find(|p| p.name == "listener"))
            .and_then(|p| p.last_trace)
            .unwrap_or_default();
        let left = b
            .out
            .block("trace-runtime-instances")
            .lines()
            .filter(|l| l.starts_with("rtdeploy-"))
            .count();
        let what = format!(
            "the supervisor traces its running listener on CPU {cpu_text} and its status names the planted spinner"
        );
        if why.contains(SPINNER) && left == 0 {
            self.r.pass(format!("{what} ({})", cut(&why, 300)));
        } else {
            self.r.fail(
                what,
                format!(
                    "last_trace: {}; instances left after it stopped: {left}; supervisor: {}",
                    if why.is_empty() { "none" } else { &why },
                    tail_lines(&b.out.block("trace-runtime-log"), 8)
                ),
                None,
            );
        }
        // The serial port's IRQ thread, moved onto the receiver's CPU at
        // FIFO 95 and kept busy by input the host feeds without a pause.
        let thread = b
            .out
            .block("trace-irq-threads")
            .lines()
            .find(|l| {
                l.split_whitespace()
                    .nth(1)
                    .is_some_and(|c| c.contains("ttyS1"))
            })
            .map(|l| {
                l.split_whitespace()
                    .skip(1)
                    .take(4)
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        self.trace_named(
            b,
            "trace-irq",
            "ttyS1",
            &format!(
                "deploy check --trace in the guest: a verdict names the serial port's IRQ thread moved onto the receiver's CPU {cpu_text} ({}; {thread})",
                b.out.value("trace-irq-affinity").unwrap_or("")
            ),
        );
        let _ = log;
    }

    /// The check report of block `name` failed and a delivery verdict
    /// names `pattern`.
    fn trace_named(&mut self, b: &Boot, name: &str, pattern: &str, what: &str) {
        let log = Some(b.log.as_path());
        let doc: Value = match json_of(&b.out.block(name)) {
            Ok(d) => d,
            Err(e) => {
                return self.r.fail(
                    what,
                    format!(
                        "no JSON report ({e}; exit {:?}): {}",
                        b.out.block_rc(name),
                        head_lines(&b.out.block(&format!("{name}-stderr")), 20)
                    ),
                    log,
                )
            }
        };
        if doc["trace"]["enabled"] != Value::Bool(true) {
            return self.r.fail(
                what,
                format!(
                    "the check ran untraced: {}",
                    doc["trace"]["reason"].as_str().unwrap_or("no reason given")
                ),
                log,
            );
        }
        // The deliveries' verdicts (the timer phase's are asserted apart).
        let verdicts: Vec<&str> = doc["trace"]["verdicts"]
            .as_array()
            .map(|v| {
                v.iter()
                    .filter(|x| x["timer_cpu"].is_null())
                    .filter_map(|x| x["verdict"].as_str())
                    .collect()
            })
            .unwrap_or_default();
        let named = verdicts.iter().find(|v| v.contains(pattern));
        match named {
            Some(n) if doc["verdict"] == "fail" => self.r.pass(format!(
                "{what} ({} miss(es) traced; {})",
                verdicts.len(),
                cut(n, 400)
            )),
            _ => self.r.fail(
                what,
                format!(
                    "verdict {}, {} over the threshold; verdicts: {}",
                    doc["verdict"],
                    doc["trace"]["over_threshold"],
                    verdicts
                        .iter()
                        .take(8)
                        .copied()
                        .collect::<Vec<_>>()
                        .join(" | ")
                ),
                log,
            ),
        }
    }

    /// The supervisor's verdict is in deploy status; the figures are in
    /// the report it wrote, /var/lib/rtdeploy/boot-check.json.
    fn boot_check(&mut self, b: &Boot, st: &SupervisorStatus) {
        let log = Some(b.log.as_path());
        let what = "the boot check ran and its report has figures";
        let bc = st.boot_check.as_str();
        if bc.starts_with("skipped") {
            return self
                .r
                .skip(what, format!("the supervisor skipped it: {bc}"));
        }
        if !(bc.starts_with("passed") || bc.starts_with("failed")) {
            return self.r.fail(what, format!("boot_check='{bc}'"), log);
        }
        let report: Value = json_of(&b.out.block("boot-check")).unwrap_or(Value::Null);
        let figures: Vec<String> = report["measurements"]
            .as_array()
            .map(|ms| {
                ms.iter()
                    .filter(|m| m["count"].as_u64().unwrap_or(0) > 0)
                    .map(|m| {
                        format!(
                            "{} n={} p99 {}us max {}us",
                            m["name"].as_str().unwrap_or("?"),
                            m["count"],
                            m["p99_ns"].as_u64().unwrap_or(0) as f64 / 1000.0,
                            m["max_ns"].as_u64().unwrap_or(0) as f64 / 1000.0
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let judged = report["budgets"]
            .as_array()
            .map(|bs| bs.iter().filter(|b| !b["figure_ns"].is_null()).count())
            .unwrap_or(0);
        if !figures.is_empty() && judged > 0 {
            self.r.pass(format!(
                "{what} (status '{bc}', verdict {}, {judged} budgets judged: {})",
                report["verdict"].as_str().unwrap_or("?"),
                figures.join("; ")
            ));
        } else {
            self.r.fail(
                what,
                format!(
                    "status '{bc}'; boot-check.json: {}{}",
                    cut(&b.out.block("boot-check"), 600),
                    b.out.block("boot-check-stderr")
                ),
                log,
            );
        }
    }

    /// Messages and the wake backend, from the controllers' logs.
    fn messages(&mut self, b: &Boot) {
        let log = Some(b.log.as_path());
        let llog = b.out.block("listener-log");
        match received(&llog) {
            None => self.r.fail(
                "the example controllers exchanged at least 1000 messages",
                format!(
                    "no message count in the listener's log: {}",
                    head_lines(&llog, 20)
                ),
                log,
            ),
            Some(n) => self.r.assert(
                n >= 1000,
                format!("the example controllers exchanged at least 1000 messages ({n})"),
                format!("only {n}"),
                log,
            ),
        }
        let tlog = b.out.block("talker-log");
        const RT: &str = "backend doorbell, class real-time";
        self.r.assert(
            llog.contains(RT) && tlog.contains(RT),
            "the real-time controllers report the doorbell backend and the real-time wake class",
            format!("{llog}{tlog}")
                .lines()
                .filter(|l| l.to_lowercase().contains("backend"))
                .take(3)
                .collect::<Vec<_>>()
                .join(" | "),
            log,
        );
    }

    /// SIGKILL and a restart within the talker's largest backoff (from the
    /// plan), plus 3 s for software emulation and polling.
    fn restart(&mut self, b: &Boot) {
        let log = Some(b.log.as_path());
        let line = b.out.value("restart").unwrap_or("").to_string();
        let field = |k: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(k))
                .map(str::to_string)
        };
        let ms: Option<i64> = field("ms=").and_then(|v| v.parse().ok());
        let backoff = self
            .plan()
            .processes
            .iter()
            .find(|p| p.name == "talker")
            .map(|p| p.restart.max_backoff);
        let what = "a controller killed with SIGKILL runs again within its backoff";
        match (ms, backoff) {
            (Some(ms), Some(max)) if ms >= 0 => {
                let bound = max.0.as_millis() as i64 + 3000;
                self.r.assert(
                    ms <= bound,
                    format!("{what} ({ms} ms, max_backoff {max})"),
                    format!("{ms} ms, max_backoff {max}"),
                    log,
                );
            }
            (Some(ms), None) if ms >= 0 => {
                self.r
                    .fail(what, format!("{ms} ms; no talker in the plan"), log)
            }
            _ => self
                .r
                .fail(what, format!("not running again within 60 s ({line})"), log),
        }
        let new_pid: Option<i32> = field("new=").and_then(|v| v.parse().ok());
        let what = "deploy status shows the restarted controller";
        match (
            b.out
                .block_json::<SupervisorStatus>("status-after-kill-json"),
            new_pid,
        ) {
            (Ok(st), Some(pid)) => {
                let t = st.processes.iter().find(|p| p.name == "talker");
                let shown = t.map(|t| {
                    let pid = t.pid.map_or("none".to_string(), |p| p.to_string());
                    format!("state {}, pid {pid}, restarts {}", t.state, t.restarts)
                });
                self.r.assert(
                    t.is_some_and(|t| {
                        t.state == "running" && t.pid == Some(pid) && t.restarts >= 1
                    }),
                    format!("{what} ({})", shown.clone().unwrap_or_default()),
                    format!("{shown:?} (new pid {pid})"),
                    log,
                );
            }
            _ => self
                .r
                .fail(what, "no status after the kill, or no restart", log),
        }
    }

    /// Orderly shutdown: the driver sent SIGTERM to PID 1; the supervisor
    /// stops the controllers and powers off (QEMU exits 0 with
    /// -no-reboot); init must never die.
    fn shutdown(&mut self, b: &Boot) {
        let log = Some(b.log.as_path());
        let serial = Console::read(&b.log);
        let what = "shutdown is orderly";
        let died = serial
            .lines()
            .find(|l| l.contains("Attempted to kill init"));
        if let Some(l) = died {
            self.r.fail(what, format!("PID 1 exited: {l}"), log);
        } else if !b.out.has_line_starting("E2E driver-done") {
            self.r.fail(what, "the driver did not finish", log);
        } else if b.outcome.ok() && serial.text().contains("reboot: Power down") {
            self.r
                .pass("shutdown is orderly (SIGTERM to PID 1 -> processes stopped -> power off)");
        } else {
            self.r.fail(
                what,
                format!("no power-off after SIGTERM ({})", b.outcome),
                log,
            );
        }
    }

    /// The controllers of a boot of the image exchanged messages on
    /// `backend`, and deploy status says so; its status, for more checks.
    fn backend_boot(&mut self, b: &Boot, what: &str, backend: &str) -> Option<SupervisorStatus> {
        let log = Some(b.log.as_path());
        self.outcome(b, &format!("{what}: boot"));
        let llog = b.out.block("listener-log");
        let n = received(&llog);
        self.r.assert(
            n.is_some_and(|n| n >= 1000),
            format!(
                "{what}: the controllers exchanged at least 1000 messages ({})",
                n.unwrap_or(0)
            ),
            format!("{n:?}: {}", head_lines(&llog, 5)),
            log,
        );
        let both = format!("{llog}{}", b.out.block("talker-log"));
        self.r.assert(
            both.contains(&format!("backend {backend}")),
            format!("{what}: the controllers report the {backend} backend"),
            head_lines(
                &llog
                    .lines()
                    .filter(|l| l.contains("backend"))
                    .collect::<Vec<_>>()
                    .join("\n"),
                2,
            ),
            log,
        );
        match b.out.block_json::<SupervisorStatus>("status-json") {
            Ok(st) => {
                check_status_backend(
                    &mut self.r,
                    &st,
                    backend,
                    &format!("{what}: deploy status names the {backend} backend"),
                    log,
                );
                Some(st)
            }
            Err(e) => {
                self.r.fail(
                    format!("{what}: deploy status names the {backend} backend"),
                    e,
                    log,
                );
                None
            }
        }
    }
}

/// What the host sees of the freeze boot while it runs: when the driver
/// froze the supervisor, and when the kernel started a second time (QEMU
/// is then stopped through its monitor).
#[derive(Default)]
struct WatchdogReset {
    frozen: Option<std::time::Instant>,
    reset: Option<std::time::Instant>,
    ticks: u32,
}

impl WatchdogReset {
    fn watch(&mut self, log: &Path) {
        self.ticks += 1;
        if self.reset.is_some() || self.ticks % 3 != 0 {
            return;
        }
        if self.frozen.is_none() {
            if Console::read(&side(log, "hvc")).has_line_starting("E2E frozen") {
                self.frozen = Some(std::time::Instant::now());
            }
            return;
        }
        let serial = Console::read(log);
        if serial.text().matches("Linux version").count() >= 2 {
            self.reset = Some(std::time::Instant::now());
            let _ = qemu::monitor(log, "quit");
        }
    }
}

/// The assertions of boot 2, skipped (with why) when there is no image.
const SUPERVISED_ASSERTIONS: &[&str] = &[
    "the supervisor starts talker and listener",
    "the supervisor applied the CPU plan",
    "each process runs with the planned policy, priority and CPUs (read back from the kernel)",
    "supervisor as PID 1 applies the plan: IRQ threads carry the planned priorities and CPUs",
    "deploy verify exits 0 in the guest",
    "the boot check ran and its report has figures",
    "the example controllers exchanged at least 1000 messages",
    "the real-time controllers report the doorbell backend and the real-time wake class",
    "deploy status names each process's backend",
    "a controller killed with SIGKILL runs again within its backoff",
    "deploy status shows the restarted controller",
    "shutdown is orderly",
];

/// deploy status names `backend` for talker and listener.
fn check_status_backend(
    r: &mut Report,
    st: &SupervisorStatus,
    backend: &str,
    what: &str,
    log: Option<&Path>,
) {
    let mut got: Vec<String> = st
        .processes
        .iter()
        .filter(|p| p.name == "talker" || p.name == "listener")
        .map(|p| format!("{}={}", p.name, p.backend.as_deref().unwrap_or("none")))
        .collect();
    got.sort();
    r.check(
        what,
        &format!("listener={backend} talker={backend}"),
        &got.join(" "),
        log,
    );
}

/// Every IRQ thread listed (`pid comm policy=N prio=P cpus=LIST` per line)
/// carries the policy, priority and (when the rule gives them) CPUs of the
/// first plan rule whose glob matches its name.
fn check_irq_threads(
    r: &mut Report,
    rules: &[cpusets::config::ThreadRule],
    lines: &str,
    what: &str,
    log: Option<&Path>,
) {
    let mut bad = Vec::new();
    let mut n = 0;
    for l in lines.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        let [_, comm, policy, prio, rest @ ..] = w.as_slice() else {
            continue;
        };
        n += 1;
        let cpus = rest
            .first()
            .and_then(|c| c.strip_prefix("cpus="))
            .filter(|c| !c.is_empty());
        let Some(rule) = rules.iter().find(|r| {
            r.pattern
                .as_deref()
                .is_some_and(|p| cpusets::model::glob_match(p, comm))
        }) else {
            continue;
        };
        let want_policy = match rule.policy {
            cpusets::config::Policy::Other => 0,
            cpusets::config::Policy::Fifo => 1,
            cpusets::config::Policy::Rr => 2,
        };
        let cpus_ok = match (&rule.cpus, cpus) {
            (Some(want), Some(got)) => CpuSet::parse_list(got).is_ok_and(|g| &g == want),
            _ => true,
        };
        if *policy != format!("policy={want_policy}")
            || *prio != format!("prio={}", rule.priority.unwrap_or(0))
            || !cpus_ok
        {
            bad.push(format!(
                "{comm}({policy} {prio} cpus={}, planned {} {:?} cpus {:?})",
                cpus.unwrap_or("?"),
                rule.policy,
                rule.priority,
                rule.cpus.as_ref().map(|c| c.to_string())
            ));
        }
    }
    if n == 0 {
        r.fail(what, "no irq/* thread listed", log);
    } else if bad.is_empty() {
        r.pass(format!("{what} ({n} threads)"));
    } else {
        r.fail(what, bad.join(" "), log);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn irq_threads_are_held_to_the_first_rule_that_matches() {
        let rules: Vec<cpusets::config::ThreadRule> = serde_json::from_str(
            r#"[{"match": "irq/*-ttyS*", "policy": "fifo", "priority": 60, "cpus": "0-1"},
                {"match": "irq/*", "policy": "fifo", "priority": 50}]"#,
        )
        .unwrap();
        let mut r = Report::new("test");
        let good =
            "10 irq/4-ttyS0 policy=1 prio=60 cpus=0-1\n11 irq/9-acpi policy=1 prio=50 cpus=0-3\n";
        check_irq_threads(&mut r, &rules, good, "good", None);
        assert_eq!(r.failed(), 0);
        check_irq_threads(
            &mut r,
            &rules,
            "10 irq/4-ttyS0 policy=1 prio=60 cpus=2\n",
            "wrong cpus",
            None,
        );
        assert_eq!(r.failed(), 1);
        check_irq_threads(
            &mut r,
            &rules,
            "11 irq/9-acpi policy=1 prio=51 cpus=0\n",
            "wrong prio",
            None,
        );
        assert_eq!(r.failed(), 2);
        check_irq_threads(&mut r, &rules, "", "none listed", None);
        assert_eq!(r.failed(), 3);
    }
}
