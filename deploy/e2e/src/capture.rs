//! `e2e capture-fixture OUT`: boots Debian's PREEMPT_RT kernel under QEMU
//! (the x86 test's probe guest) and captures the /proc and /sys files
//! `deploy verify` reads into a directory laid out like / (OUT/proc/...,
//! OUT/sys/...), for tests that point `--sysroot` at it. Besides the tree,
//! OUT holds what the probe wrote beside it (`_second/`, `_capture/`: see
//! `scripts/e2e/probe-init.sh`), the serial console, the probe's own lines
//! and the kernel package's name.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use deploy::cmd::plan::Plan;

use crate::guest::Console;
use crate::host::{self, X86_TRIPLE};
use crate::qemu::{side, Machine};
use crate::{say, Env};

#[derive(clap::Args)]
pub struct Options {
    /// The directory to fill (must not exist, or be empty).
    out: PathBuf,
    /// The kernel command line's tokens; default: the plan of
    /// examples/qemu.yaml, as in the end-to-end test.
    tokens: Vec<String>,
    /// Seconds the boot may take.
    #[arg(long, env = "E2E_BOOT_LIMIT", default_value_t = 300)]
    boot_limit: u64,
}

pub fn run(env: &Env, o: &Options) -> u8 {
    match capture(env, o) {
        Ok(n) => {
            say(format!("fixture in {} ({n} files)", o.out.display()));
            0
        }
        Err(e) => {
            eprintln!("capture-fixture: {e}");
            1
        }
    }
}

fn capture(env: &Env, o: &Options) -> Result<usize, String> {
    if std::fs::read_dir(&o.out).is_ok_and(|mut d| d.next().is_some()) {
        return Err(format!("{} exists and is not empty", o.out.display()));
    }
    let work = env
        .work_dir("rtdeploy-fixture.")
        .map_err(|e| e.to_string())?;
    let w = work.path();
    let tokens = if o.tokens.is_empty() {
        host::cargo_static(
            &env.repo,
            &env.target_dir,
            &["-p", "deploy", "--bin", "deploy"],
            &w.join("build.log"),
        )?;
        let deploy = env.target_dir.join(X86_TRIPLE).join("release/deploy");
        let text = host::output(
            Command::new(deploy)
                .arg("plan")
                .arg("-c")
                .arg(env.repo.join("examples/qemu.yaml"))
                .arg("--json"),
        )?;
        let plan: Plan =
            serde_json::from_str(&text).map_err(|e| format!("the plan's JSON: {e}"))?;
        plan.cmdline.line
    } else {
        o.tokens.join(" ")
    };
    let mut fetch = Command::new("bash");
    fetch
        .arg(env.repo.join("scripts/fetch-rt-kernel.sh"))
        .env(units::env::CACHE, &env.cache);
    host::run_logged(&mut fetch, &w.join("fetch.log"))?;
    let kdir = env.cache.join("rt-kernel");
    let root = w.join("root");
    host::busybox_base(&root, &env.repo)?;
    std::fs::copy(
        env.repo.join("scripts/e2e/probe-init.sh"),
        root.join("init"),
    )
    .map_err(|e| format!("probe init: {e}"))?;
    std::fs::write(root.join("etc/e2e-capture"), "").map_err(|e| e.to_string())?;
    let cpio = w.join("probe.cpio.gz");
    host::cpio_gz(&root, &cpio)?;
    let append = format!("console=ttyS0 panic=-1 {tokens}");
    say(format!("booting with: {append}"));
    let log = w.join("serial.log");
    let machine = Machine::X86 {
        kernel: kdir.join("vmlinuz"),
        initrd: cpio,
        append,
        flood_tty1: false,
        reboots: false,
    };
    let outcome = machine
        .run(&log, Duration::from_secs(o.boot_limit), || {})
        .map_err(|e| format!("qemu-system-x86_64: {e}"))?;
    let serial = Console::read(&log);
    let out = Console::read(&side(&log, "hvc"));
    if !outcome.ok() || !out.has_line("E2E-FIXTURE-END") {
        eprintln!("{}\n{}", serial.text(), out.text());
        return Err(format!("the guest did not finish the capture ({outcome})"));
    }
    // The tar, base64 between the marker lines.
    let mut b64 = String::new();
    let mut probe_lines = String::new();
    let mut inside = false;
    for l in out.lines() {
        match l {
            "E2E-FIXTURE-BEGIN" | "E2E-FIXTURE-END" => {
                inside = l.ends_with("BEGIN");
                probe_lines.push_str(l);
                probe_lines.push('\n');
            }
            _ if inside => {
                if l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"+/=".contains(&b))
                {
                    b64.push_str(l);
                    b64.push('\n');
                }
            }
            _ => {
                probe_lines.push_str(l);
                probe_lines.push('\n');
            }
        }
    }
    std::fs::create_dir_all(o.out.join("_capture")).map_err(|e| e.to_string())?;
    let tgz = w.join("fixture.tgz");
    let mut dec = Command::new("base64")
        .arg("-d")
        .stdin(Stdio::piped())
        .stdout(std::fs::File::create(&tgz).map_err(|e| e.to_string())?)
        .spawn()
        .map_err(|e| format!("base64: {e}"))?;
    {
        use std::io::Write as _;
        let mut i = dec.stdin.take().expect("piped");
        i.write_all(b64.as_bytes())
            .map_err(|e| format!("base64: {e}"))?;
    }
    if !dec.wait().map_err(|e| e.to_string())?.success() {
        return Err("the capture's base64 does not decode".into());
    }
    host::output(
        Command::new("tar")
            .arg("-xzf")
            .arg(&tgz)
            .arg("-C")
            .arg(&o.out),
    )?;
    let cap = o.out.join("_capture");
    std::fs::write(cap.join("serial.log"), serial.text()).map_err(|e| e.to_string())?;
    std::fs::write(cap.join("probe-output.log"), probe_lines).map_err(|e| e.to_string())?;
    std::fs::copy(kdir.join("package"), cap.join("kernel-package")).map_err(|e| e.to_string())?;
    Ok(count_files(&o.out))
}

fn count_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => count_files(&e.path()),
            Ok(_) => 1,
            Err(_) => 0,
        })
        .sum()
}
