//! One QEMU runner for both guests: the x86_64 machine (PREEMPT_RT kernel
//! and initramfs given to QEMU) and the aarch64 `virt` machine (U-Boot as
//! firmware booting a disk), each under TCG, without KVM. Every run has a
//! time limit; at the limit the whole QEMU process group is stopped.

use std::fs::File;
use std::io::{Read as _, Write as _};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

/// A machine to boot.
#[derive(Debug, Clone)]
pub enum Machine {
    /// `qemu-system-x86_64`: 4 CPUs, 1 GiB, single-threaded TCG (with one
    /// host thread per vCPU the guest kernel's live code patching, int3
    /// on static keys, sometimes oopsed on a busy host, and two host cores
    /// gain little from four threads), `-no-reboot` (unless `reboots`) so
    /// that the guest's power-off or panic ends the run, and QEMU's
    /// i6300esb watchdog resetting the machine when it runs out. The
    /// guest's test lines go to a virtio console (`<log>.hvc`), so nothing
    /// interleaves with them; the virtio-serial PCI device also gives the
    /// guest MSI interrupts.
    X86 {
        kernel: PathBuf,
        initrd: PathBuf,
        append: String,
        /// The second serial port fed input without a pause (a port whose
        /// receive interrupts never stop while the guest has it open).
        flood_tty1: bool,
        /// A reset boots the guest again (no `-no-reboot`): the run that
        /// sees the watchdog reset the machine, and stops QEMU itself.
        reboots: bool,
    },
    /// `qemu-system-aarch64 -M virt`: 4 CPUs, 2 GiB, multi-threaded TCG,
    /// U-Boot as `-bios` finding everything on the disk (no `-kernel`,
    /// no `-append`), with an ssh port forwarded when `ssh_port` is given,
    /// and QEMU's i6300esb watchdog resetting the machine when it runs
    /// out (a reset boots U-Boot again).
    Arm64 {
        bios: PathBuf,
        disk: PathBuf,
        ssh_port: Option<u16>,
    },
}

/// How a bounded run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// QEMU exited with this status.
    Exited(i32),
    /// The time limit hit; QEMU was stopped.
    TimedOut,
}

impl Outcome {
    pub fn ok(self) -> bool {
        self == Outcome::Exited(0)
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Exited(c) => write!(f, "qemu exited with {c}"),
            Outcome::TimedOut => write!(f, "time limit hit"),
        }
    }
}

/// Where a run's consoles go: the serial console in `log`, the x86 guest's
/// virtio console in `log.hvc`, its second serial port in `log.tty1`,
/// QEMU's own output in `log.qemu`, its monitor at `log.mon`.
pub fn side(log: &Path, ext: &str) -> PathBuf {
    let mut s = log.as_os_str().to_owned();
    s.push(".");
    s.push(ext);
    PathBuf::from(s)
}

impl Machine {
    /// The QEMU command line; `serial` is the first serial port's `-serial`
    /// argument (`file:<log>` or `stdio`).
    fn command(&self, log: &Path, serial: &str) -> Command {
        let mut c = match self {
            Machine::X86 {
                kernel,
                initrd,
                append,
                flood_tty1,
                reboots,
            } => {
                let mut c = Command::new("qemu-system-x86_64");
                c.args([
                    "-accel",
                    "tcg,thread=single",
                    "-cpu",
                    "max",
                    "-smp",
                    "4",
                    "-m",
                    "1G",
                ]);
                c.args(["-nographic", "-nic", "none"]);
                if !*reboots {
                    c.arg("-no-reboot");
                }
                // The hardware watchdog (Intel 6300ESB, a PCI device; its
                // driver is a module of Debian's kernel, which the image's
                // /init loads): when it runs out, QEMU resets the machine.
                c.args(["-device", "i6300esb", "-action", "watchdog=reset"]);
                c.arg("-monitor").arg(format!(
                    "unix:{},server=on,wait=off",
                    side(log, "mon").display()
                ));
                c.args(["-device", "virtio-serial-pci"]);
                c.arg("-chardev")
                    .arg(format!("file,id=e2e,path={}", side(log, "hvc").display()));
                c.args(["-device", "virtconsole,chardev=e2e"]);
                c.args(["-serial", serial]);
                if *flood_tty1 {
                    c.arg("-chardev")
                        .arg(format!("pipe,id=tty1,path={}", side(log, "pipe").display()));
                    c.args(["-serial", "chardev:tty1"]);
                } else {
                    c.arg("-serial")
                        .arg(format!("file:{}", side(log, "tty1").display()));
                }
                c.arg("-kernel").arg(kernel).arg("-initrd").arg(initrd);
                c.arg("-append").arg(append);
                c
            }
            Machine::Arm64 {
                bios,
                disk,
                ssh_port,
            } => {
                let mut c = Command::new("qemu-system-aarch64");
                c.args([
                    "-M",
                    "virt",
                    "-cpu",
                    "max,pauth-impdef=on",
                    "-smp",
                    "4",
                    "-m",
                    "2G",
                ]);
                c.arg("-bios").arg(bios);
                c.args(["-display", "none", "-monitor", "none"]);
                c.arg("-drive")
                    .arg(format!("if=none,id=hd0,file={},format=raw", disk.display()));
                c.args(["-device", "virtio-blk-pci,drive=hd0"]);
                // The hardware watchdog the base's initrd starts and the
                // supervisor feeds: when it runs out, QEMU resets the
                // machine and U-Boot boots again.
                c.args(["-device", "i6300esb", "-action", "watchdog=reset"]);
                match ssh_port {
                    Some(p) => {
                        c.arg("-netdev")
                            .arg(format!("user,id=n0,hostfwd=tcp:127.0.0.1:{p}-:22"));
                        c.args(["-device", "virtio-net-pci,netdev=n0"]);
                    }
                    None => {
                        c.args(["-nic", "none"]);
                    }
                }
                c.args(["-serial", serial]);
                c
            }
        };
        // Its own group: stopped as a whole at a time limit.
        c.process_group(0);
        c
    }

    /// Boots and waits for QEMU to exit, at most `limit`; `during` is
    /// called about five times a second while it runs (to act on what the
    /// guest printed so far).
    pub fn run(
        &self,
        log: &Path,
        limit: Duration,
        mut during: impl FnMut(),
    ) -> std::io::Result<Outcome> {
        File::create(log)?;
        File::create(side(log, "hvc"))?;
        let flood = match self {
            Machine::X86 {
                flood_tty1: true, ..
            } => Some(Flood::start(log)?),
            _ => None,
        };
        let mut cmd = self.command(log, &format!("file:{}", log.display()));
        to_files(&mut cmd, log)?;
        let mut running = Running::spawn(cmd)?;
        let out = running.wait(limit, &mut during);
        drop(running);
        if let Some(f) = flood {
            f.stop();
        }
        // A kernel whose virtio console is a module (Debian's 5.10) has no
        // /dev/hvc0 in an image without modules: the guest's test lines
        // then go to the second serial port.
        let hvc = side(log, "hvc");
        if std::fs::metadata(&hvc)
            .map(|m| m.len() == 0)
            .unwrap_or(true)
        {
            let _ = std::fs::copy(side(log, "tty1"), &hvc);
        }
        out
    }

    /// Boots in the background, the serial console going to `log`.
    pub fn spawn(&self, log: &Path) -> std::io::Result<Running> {
        File::create(log)?;
        let mut cmd = self.command(log, &format!("file:{}", log.display()));
        to_files(&mut cmd, log)?;
        Running::spawn(cmd)
    }

    /// Boots with the serial console on QEMU's standard input and output
    /// and drives it as a person at the console would (`steps`, in order),
    /// everything it printed going to `log`. Stops QEMU when the steps are
    /// done or one fails; at most `limit` in all.
    pub fn console(
        &self,
        log: &Path,
        limit: Duration,
        steps: &[Step],
        fail_on: &[&str],
    ) -> Result<String, String> {
        let err = |e: std::io::Error| format!("{}: {e}", log.display());
        let mut out = File::create(log).map_err(err)?;
        let mut cmd = self.command(log, "stdio");
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(File::create(side(log, "qemu")).map_err(err)?);
        let mut running = Running::spawn(cmd).map_err(err)?;
        let mut stdin = running.child.stdin.take().expect("piped");
        let mut stdout = running.child.stdout.take().expect("piped");
        let (tx, rx) = mpsc::channel::<Vec<u8>>();
        thread::spawn(move || {
            let mut buf = [0u8; 65536];
            loop {
                match stdout.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if tx.send(buf[..n].to_vec()).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        let deadline = Instant::now() + limit;
        let mut text = String::new();
        let mut pos = 0;
        let mut result = Ok(String::new());
        'steps: for step in steps {
            let (want, until) = match step {
                Step::Send(s) => {
                    if let Err(e) = stdin.write_all(s.as_bytes()).and_then(|()| stdin.flush()) {
                        result = Err(format!("typing {s:?}: {e}"));
                        break;
                    }
                    continue;
                }
                Step::Expect(w) => (*w, false),
                Step::Until(w) => (*w, true),
            };
            loop {
                if let Some(at) = text[pos..].find(want) {
                    let start = pos + at;
                    pos = start + want.len();
                    if until {
                        // The whole line, once it has ended.
                        let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
                        loop {
                            if let Some(end) = text[start..].find('\n') {
                                result = Ok(text[line_start..start + end].to_string());
                                break 'steps;
                            }
                            if !receive(&rx, deadline, &mut text, &mut out) {
                                result = Ok(text[line_start..].to_string());
                                break 'steps;
                            }
                        }
                    }
                    continue 'steps;
                }
                if let Some(bad) = fail_on.iter().find(|f| text.contains(**f)) {
                    result = Err(format!("the console said {bad:?}"));
                    break 'steps;
                }
                if Instant::now() >= deadline {
                    result = Err(format!(
                        "time limit ({} s) waiting for {want:?}",
                        limit.as_secs()
                    ));
                    break 'steps;
                }
                if !receive(&rx, deadline, &mut text, &mut out) && Instant::now() < deadline {
                    result = Err(format!(
                        "QEMU exited, or printed over 16 MiB, before {want:?}"
                    ));
                    break 'steps;
                }
            }
        }
        drop(stdin);
        drop(running);
        result.map_err(|why| {
            let tail: Vec<&str> = text.lines().rev().take(60).collect();
            let mut s = format!("{why}; the console's last lines:");
            for l in tail.into_iter().rev() {
                s.push_str("\n  | ");
                s.push_str(l);
            }
            s
        })
    }
}

/// QEMU's standard input closed, its output (both streams) to `log.qemu`.
fn to_files(cmd: &mut Command, log: &Path) -> std::io::Result<()> {
    let out = File::create(side(log, "qemu"))?;
    cmd.stdin(Stdio::null())
        .stderr(out.try_clone()?)
        .stdout(out);
    Ok(())
}

/// Takes what the console printed next (at most a second), into `text` and
/// the log; false when QEMU's output ended.
fn receive(
    rx: &mpsc::Receiver<Vec<u8>>,
    deadline: Instant,
    text: &mut String,
    out: &mut File,
) -> bool {
    let wait = deadline
        .saturating_duration_since(Instant::now())
        .min(Duration::from_secs(1));
    match rx.recv_timeout(wait) {
        Ok(chunk) => {
            let s = String::from_utf8_lossy(&chunk).replace('\r', "");
            let _ = out.write_all(s.as_bytes());
            text.push_str(&s);
            // Bounded: a console that talks without end is cut off.
            text.len() < MAX_CONSOLE_TEXT
        }
        Err(mpsc::RecvTimeoutError::Timeout) => true,
        Err(mpsc::RecvTimeoutError::Disconnected) => false,
    }
}

/// The most a driven console may print before it is stopped.
const MAX_CONSOLE_TEXT: usize = 16 << 20;

/// One step at a console.
#[derive(Debug, Clone, Copy)]
pub enum Step<'a> {
    /// Wait for this text after the previous match.
    Expect(&'a str),
    /// Type this (`\r` is Enter).
    Send(&'a str),
    /// Wait for this text; the line it is on is the result, and QEMU stops.
    Until(&'a str),
}

/// A QEMU running; stopped (its whole process group) when dropped.
pub struct Running {
    child: Child,
}

impl Running {
    fn spawn(mut cmd: Command) -> std::io::Result<Running> {
        Ok(Running {
            child: cmd.spawn()?,
        })
    }

    /// Its exit status, once it has exited.
    pub fn exited(&mut self) -> Option<i32> {
        match self.child.try_wait() {
            Ok(Some(s)) => Some(s.code().unwrap_or(-1)),
            Ok(None) => None,
            Err(_) => Some(-1),
        }
    }

    /// Waits for it to exit, at most `limit`, calling `during` about five
    /// times a second; stops it at the limit.
    pub fn wait(&mut self, limit: Duration, during: &mut dyn FnMut()) -> std::io::Result<Outcome> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(s) = self.child.try_wait()? {
                return Ok(Outcome::Exited(s.code().unwrap_or(-1)));
            }
            if Instant::now() >= deadline {
                self.stop();
                return Ok(Outcome::TimedOut);
            }
            during();
            thread::sleep(Duration::from_millis(200));
        }
    }

    /// Stops the group: SIGTERM, then SIGKILL after 10 s.
    pub fn stop(&mut self) {
        if self.exited().is_some() {
            return;
        }
        let Some(pgid) = rustix::process::Pid::from_raw(self.child.id() as i32) else {
            return;
        };
        let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::TERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.exited().is_some() {
                return;
            }
            thread::sleep(Duration::from_millis(100));
        }
        let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
        let _ = self.child.wait();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The flooded second serial port of the x86 machine: QEMU's pipe
/// character device reads `<log>.pipe.in` (fed here without a pause, never
/// blocking: a full pipe is retried) and writes `<log>.pipe.out` (copied
/// to `<log>.tty1`).
struct Flood {
    done: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Flood {
    fn start(log: &Path) -> std::io::Result<Flood> {
        use rustix::fs::{Mode, OFlags};
        let pin = side(log, "pipe.in");
        let pout = side(log, "pipe.out");
        for p in [&pin, &pout] {
            let _ = std::fs::remove_file(p);
            rustix::fs::mknodat(
                rustix::fs::CWD,
                p,
                rustix::fs::FileType::Fifo,
                Mode::from_raw_mode(0o600),
                0,
            )?;
        }
        let done = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        let d = done.clone();
        threads.push(thread::spawn(move || {
            let line = b"rtdeploy e2e: receive interrupts on the second serial port\n".repeat(64);
            // Opening for writing without a reader fails (ENXIO): retry
            // until QEMU has opened its end.
            let fd = loop {
                if d.load(Ordering::Relaxed) {
                    return;
                }
                match rustix::fs::open(
                    &pin,
                    OFlags::WRONLY | OFlags::NONBLOCK | OFlags::CLOEXEC,
                    Mode::empty(),
                ) {
                    Ok(fd) => break fd,
                    Err(_) => thread::sleep(Duration::from_millis(50)),
                }
            };
            while !d.load(Ordering::Relaxed) {
                match rustix::io::write(&fd, &line) {
                    Ok(_) => {}
                    Err(rustix::io::Errno::AGAIN) => thread::sleep(Duration::from_millis(5)),
                    Err(_) => return,
                }
            }
        }));
        let d = done.clone();
        let tty1 = side(log, "tty1");
        threads.push(thread::spawn(move || {
            let Ok(mut out) = File::create(&tty1) else {
                return;
            };
            let Ok(fd) = rustix::fs::open(
                &pout,
                OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC,
                Mode::empty(),
            ) else {
                return;
            };
            let mut buf = [0u8; 65536];
            loop {
                match rustix::io::read(&fd, &mut buf) {
                    Ok(n) if n > 0 => {
                        let _ = out.write_all(&buf[..n]);
                    }
                    // Nothing to read (no writer yet, or it closed): look
                    // again until the run is over.
                    Ok(_) | Err(rustix::io::Errno::AGAIN) => {
                        if d.load(Ordering::Relaxed) {
                            return;
                        }
                        thread::sleep(Duration::from_millis(20));
                    }
                    Err(_) => return,
                }
            }
        }));
        Ok(Flood { done, threads })
    }

    fn stop(self) {
        self.done.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Sends one HMP command to the monitor of the x86 machine writing `log`
/// and returns its reply (bounded: 10 s, 64 KiB).
pub fn monitor(log: &Path, command: &str) -> std::io::Result<String> {
    use std::os::unix::net::UnixStream;
    let mut s = UnixStream::connect(side(log, "mon"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.set_write_timeout(Some(Duration::from_secs(10)))?;
    let mut buf = vec![0u8; 65536];
    thread::sleep(Duration::from_millis(500));
    let _ = s.read(&mut buf)?; // the banner and prompt
    s.write_all(format!("{command}\n").as_bytes())?;
    thread::sleep(Duration::from_secs(1));
    let n = s.read(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}
