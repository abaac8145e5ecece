//! The live tracer: an ftrace instance of our own on tracefs (the only
//! I/O of [`crate::trace`]).
//!
//! [`Tracer::start`] finds tracefs under the sysroot (`sys/kernel/tracing`,
//! mounted there when it is the real `/sys` and nothing is mounted),
//! removes instances that earlier runs left behind (their process is
//! gone: killed with SIGKILL, say), and creates
//! `instances/rtdeploy-<pid>`. An instance has its own buffers, events,
//! clock and CPU mask, so a tracer someone else runs (the top-level buffer
//! or another instance) is left alone. In it: the `mono` clock (the
//! runtime's CLOCK_MONOTONIC, so the message's send time and the trace
//! share a clock), per-CPU buffers on the sender's and receiver's CPUs
//! only (`tracing_cpumask`), overwrite mode, and the scheduler, interrupt,
//! hrtimer, io_uring completion and task-work events the kernel has
//! (those it lacks are listed, not fatal; without `sched_switch` and
//! `sched_wakeup` there is nothing to analyse and the tracer refuses).
//!
//! Dropping the [`Tracer`] turns tracing off and removes the instance
//! (retrying while a worker still holds its marker file open); a fatal
//! signal turns it off through [`Tracer::off_on_signal`], and the next
//! start removes what a SIGKILL left.
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

/// Events the tracer enables, `subsystem/event`; the first two are needed.
pub const EVENTS: &[&str] = &[
    "sched/sched_switch",
    "sched/sched_wakeup",
    "sched/sched_wakeup_new",
    "sched/sched_pi_setprio",
    "irq/irq_handler_entry",
    "irq/irq_handler_exit",
    "irq/softirq_entry",
    "irq/softirq_exit",
    "timer/hrtimer_expire_entry",
    "timer/hrtimer_expire_exit",
    "io_uring/io_uring_complete",
    // task work: io_uring's (DEFER_TASKRUN runs it as local work).
    "io_uring/io_uring_task_add",
    "io_uring/io_uring_task_work_run",
    "io_uring/io_uring_local_work_run",
    // lock waits (the futex hash bucket's among them): who waited, and
    // with sched_pi_setprio on PREEMPT_RT, who held it.
    "lock/contention_begin",
    "lock/contention_end",
];
const NEEDED: usize = 2;
/// Per-CPU buffer size asked for, in KiB.
pub const BUFFER_KB: u32 = 2048;
/// One CPU's text is read up to this many bytes (the newest are kept).
pub const MAX_CPU_TEXT: usize = 32 << 20;
/// Reading one CPU's text stops after this many bytes (a bound on time).
const MAX_READ: usize = 512 << 20;
/// Instance names: `rtdeploy-<pid>`.
const PREFIX: &str = "rtdeploy-";

/// Why tracing cannot run here (the check then runs without it).
#[derive(Debug, thiserror::Error)]
pub enum TraceSetupError {
    #[error("no tracefs at {path} ({why})")]
    NoTracefs { path: PathBuf, why: String },
    #[error("cannot mount tracefs on {path}")]
    Mount {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot create the ftrace instance {path}")]
    Instance {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the kernel has no {events} event (tracefs {path}): nothing to analyse without it")]
    NoEvent { events: String, path: PathBuf },
    #[error("cannot write `{value}` to {path}")]
    Write {
        path: PathBuf,
        value: String,
        source: std::io::Error,
    },
    #[error("no CPU to trace")]
    NoCpu,
}

/// Where tracefs is under `sys` (`<sysroot>/sys`), mounting it on the
/// real `/sys/kernel/tracing` when it is not mounted.
pub fn find_tracefs(sys: &Path) -> Result<PathBuf, TraceSetupError> {
    let root = sys.join("kernel/tracing");
    for cand in [root.clone(), sys.join("kernel/debug/tracing")] {
        match std::fs::metadata(cand.join("instances")) {
            Ok(m) if m.is_dir() => return Ok(cand),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                return Err(TraceSetupError::NoTracefs {
                    path: cand,
                    why: "no permission: tracing needs root".into(),
                })
            }
            _ => {}
        }
    }
    if !root.is_dir() {
        return Err(TraceSetupError::NoTracefs {
            path: root,
            why: "the kernel has no tracefs mount point (CONFIG_TRACING?)".into(),
        });
    }
    match std::fs::read_dir(&root) {
        Err(e) => {
            return Err(TraceSetupError::NoTracefs {
                path: root,
                why: format!("cannot read it: {e}"),
            })
        }
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(TraceSetupError::NoTracefs {
                    path: root,
                    why: "mounted, but it has no instances directory (a kernel before 3.10?)"
                        .into(),
                });
            }
        }
    }
    if sys != Path::new("/sys") {
        return Err(TraceSetupError::NoTracefs {
            path: root,
            why: "not mounted, and only the real /sys is mounted on".into(),
        });
    }
    mount_tracefs(&root)?;
    if root.join("instances").is_dir() {
        Ok(root)
    } else {
        Err(TraceSetupError::NoTracefs {
            path: root,
            why: "mounted, but it has no instances directory".into(),
        })
    }
}

fn mount_tracefs(at: &Path) -> Result<(), TraceSetupError> {
    use std::os::unix::ffi::OsStrExt;
    let merr = |source| TraceSetupError::Mount {
        path: at.into(),
        source,
    };
    let target = std::ffi::CString::new(at.as_os_str().as_bytes())
        .map_err(|e| merr(std::io::Error::other(e)))?;
    let fs = c"tracefs";
    // SAFETY: every pointer is a NUL-terminated string that outlives the
    // call; data is null, which tracefs accepts.
    let r = unsafe {
        libc::mount(
            fs.as_ptr(),
            target.as_ptr(),
            fs.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            std::ptr::null(),
        )
    };
    if r != 0 {
        return Err(merr(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Reads a small tracefs file (`current_tracer`, `tracing_on`: one short
/// line), at most 4 KiB, as text.
pub(crate) fn read_small(p: &Path) -> std::io::Result<String> {
    units::bounded::Bound::pseudo(4096)
        .read_text(p)
        .map_err(units::bounded::FileReadError::into_io)
}

/// Writes `value` to an existing tracefs file (never creates one).
fn write_file(p: &Path, value: &str) -> Result<(), TraceSetupError> {
    OpenOptions::new()
        .write(true)
        .open(p)
        .and_then(|mut f| f.write_all(value.as_bytes()))
        .map_err(|source| TraceSetupError::Write {
            path: p.into(),
            value: value.trim_end().into(),
            source,
        })
}

/// `tracing_cpumask` text for `cpus`: 32-bit hex groups, most
/// significant first, comma-separated (as the kernel prints it).
pub fn cpumask(cpus: &[usize]) -> String {
    let top = cpus.iter().copied().max().unwrap_or(0);
    let groups = top / 32 + 1;
    let mut words = vec![0u32; groups];
    for &c in cpus {
        words[c / 32] |= 1 << (c % 32);
    }
    words
        .iter()
        .rev()
        .map(|w| format!("{w:08x}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The instance a tracer of this process makes in the tracefs of `sys`
/// (mounted when missing): known before the tracer starts, so that the
/// processes a supervisor spawns can be told where to write.
pub fn instance_dir(sys: &Path) -> Result<PathBuf, TraceSetupError> {
    Ok(find_tracefs(sys)?
        .join("instances")
        .join(format!("{PREFIX}{}", std::process::id())))
}

/// Removes instances of earlier runs whose process is gone; returns their
/// names.
pub fn remove_stale(tracefs: &Path, proc_root: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(tracefs.join("instances")) else {
        return vec![];
    };
    let mut removed = vec![];
    for e in rd.filter_map(|e| e.ok()).take(4096) {
        let Ok(name) = e.file_name().into_string() else {
            continue;
        };
        // `rtdeploy-<pid>`, or `rtdeploy-<pid>-<what>` (the census's).
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|p| p.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !proc_root.join(pid.to_string()).exists() {
            let dir = e.path();
            let _ = write_file(&dir.join("tracing_on"), "0");
            if remove_instance(&dir) {
                removed.push(name);
            }
        }
    }
    removed
}

/// Removes an instance directory, waiting up to 2 s while a file of it
/// is still open (EBUSY: the workers of a killed run are still exiting).
fn remove_instance(dir: &Path) -> bool {
    for _ in 0..100 {
        match std::fs::remove_dir(dir) {
            Ok(()) => return true,
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(_) => return false,
        }
    }
    false
}

/// What [`configure_instance`] set up.
#[derive(Debug, Default)]
pub struct Configured {
    pub events: Vec<String>,
    pub missing: Vec<String>,
    pub notes: Vec<String>,
}

/// Sets up the instance `dir` (of tracefs `root`) for `cpus`: the mono
/// clock, the CPU mask, overwrite mode, the buffer size and the events
/// of [`EVENTS`] the kernel has. Refuses when one of the first two
/// (`sched_switch`, `sched_wakeup`) is missing.
pub fn configure_instance(
    dir: &Path,
    root: &Path,
    cpus: &[usize],
) -> Result<Configured, TraceSetupError> {
    let mut c = Configured::default();
    write_file(&dir.join("trace_clock"), "mono")?;
    write_file(&dir.join("tracing_cpumask"), &cpumask(cpus))?;
    write_file(&dir.join("options/overwrite"), "1")?;
    // A smaller buffer is better than none: the kernel may refuse.
    if let Err(e) = write_file(&dir.join("buffer_size_kb"), &BUFFER_KB.to_string()) {
        c.notes.push(format!(
            "buffer size left as it was: {}",
            units::error::Chain(&e)
        ));
    }
    for (i, ev) in EVENTS.iter().enumerate() {
        let p = dir.join("events").join(ev).join("enable");
        match write_file(&p, "1") {
            Ok(()) => c.events.push(ev.to_string()),
            Err(_) if i < NEEDED => {
                return Err(TraceSetupError::NoEvent {
                    events: ev.to_string(),
                    path: root.to_path_buf(),
                })
            }
            Err(e) => c.missing.push(if p.exists() {
                format!("{ev} ({})", units::error::Chain(&e))
            } else {
                format!("{ev} (not in this kernel)")
            }),
        }
    }
    Ok(c)
}

/// The fd of the running tracer's `tracing_on`, for the signal handler.
static SIGNAL_OFF_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn off_and_die(sig: libc::c_int) {
    // Relaxed: the fd was stored before the handler was installed.
    let fd = SIGNAL_OFF_FD.load(Ordering::Relaxed);
    // SAFETY: write, signal and raise are async-signal-safe; the buffer
    // is a static byte string; a stale fd only makes write fail.
    unsafe {
        if fd >= 0 {
            libc::write(fd, b"0".as_ptr().cast(), 1);
        }
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

/// A running instance; dropped: tracing off, instance removed.
#[derive(Debug)]
pub struct Tracer {
    root: PathBuf,
    dir: PathBuf,
    /// `tracing_on`, open for the life of the tracer (closed before the
    /// instance is removed: an open file keeps it busy).
    on: Option<File>,
    cpus: Vec<usize>,
    /// Events enabled, `subsystem/event`.
    pub events: Vec<String>,
    /// Events this kernel lacks (or refused), with the reason.
    pub missing: Vec<String>,
    /// What the start found worth saying (another tracer in use, stale
    /// instances removed).
    pub notes: Vec<String>,
}

impl Tracer {
    /// Sets up and starts an instance tracing `cpus`. `sys` and
    /// `proc_root` are `<sysroot>/sys` and `<sysroot>/proc`.
    pub fn start(sys: &Path, proc_root: &Path, cpus: &[usize]) -> Result<Tracer, TraceSetupError> {
        if cpus.is_empty() {
            return Err(TraceSetupError::NoCpu);
        }
        let root = find_tracefs(sys)?;
        let mut notes = vec![];
        let stale = remove_stale(&root, proc_root);
        if !stale.is_empty() {
            notes.push(format!(
                "removed ftrace instances left by earlier runs: {}",
                stale.join(", ")
            ));
        }
        if let Ok(t) = read_small(&root.join("current_tracer")) {
            let t = t.trim();
            if !t.is_empty() && t != "nop" {
                notes.push(format!(
                    "another tracer is in use ({} in {}): left alone, this run traces in an instance of its own",
                    t.chars().take(40).collect::<String>(),
                    root.display()
                ));
            }
        }
        let dir = root
            .join("instances")
            .join(format!("{PREFIX}{}", std::process::id()));
        // One of an earlier process with this pid (killed before it
        // removed it): stale by definition.
        if dir.is_dir() {
            let _ = write_file(&dir.join("tracing_on"), "0");
            remove_instance(&dir);
        }
        std::fs::create_dir(&dir).map_err(|source| TraceSetupError::Instance {
            path: dir.clone(),
            source,
        })?;
        let on = match OpenOptions::new().write(true).open(dir.join("tracing_on")) {
            Ok(f) => f,
            Err(source) => {
                let _ = std::fs::remove_dir(&dir);
                return Err(TraceSetupError::Instance { path: dir, source });
            }
        };
        // From here the guard removes the instance on every error.
        let mut t = Tracer {
            root,
            dir,
            on: Some(on),
            cpus: cpus.to_vec(),
            events: vec![],
            missing: vec![],
            notes,
        };
        t.off();
        t.configure()?;
        t.resume();
        Ok(t)
    }

    fn configure(&mut self) -> Result<(), TraceSetupError> {
        let c = configure_instance(&self.dir, &self.root, &self.cpus)?;
        self.events = c.events;
        self.missing = c.missing;
        self.notes.extend(c.notes);
        Ok(())
    }

    /// The instance directory (its `trace_marker` and `tracing_on` are
    /// what the workers open).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn cpus(&self) -> &[usize] {
        &self.cpus
    }

    /// Stops recording (the buffers keep what they hold).
    pub fn off(&self) {
        if let Some(mut f) = self.on.as_ref() {
            let _ = f.write_all(b"0");
        }
    }

    /// Clears the buffers and records again.
    pub fn resume(&self) {
        // Opening `trace` for writing with truncation clears every buffer.
        let _ = OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(self.dir.join("trace"));
        if let Some(mut f) = self.on.as_ref() {
            let _ = f.write_all(b"1");
        }
    }

    /// Each traced CPU's buffer text (`per_cpu/cpuN/trace`), at most
    /// [`MAX_CPU_TEXT`] bytes each, the newest kept.
    pub fn read_cpus(&self) -> Vec<(u32, String)> {
        self.cpus
            .iter()
            .map(|&c| {
                let p = self.dir.join(format!("per_cpu/cpu{c}/trace"));
                let text = read_newest(&p, MAX_CPU_TEXT)
                    .unwrap_or_else(|e| format!("# rtdeploy: cannot read {}: {e}\n", p.display()));
                (c as u32, text)
            })
            .collect()
    }

    /// Turns tracing off if the process gets SIGINT, SIGTERM or SIGHUP
    /// (then dies of it as it would have); the instance is removed by the
    /// next start. Call once the tracer is in place; [`Drop`] undoes it.
    pub fn off_on_signal(&self) {
        // Relaxed: stored before the handlers are installed below.
        let Some(on) = self.on.as_ref() else {
            return;
        };
        SIGNAL_OFF_FD.store(on.as_raw_fd(), Ordering::Relaxed);
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // SAFETY: installs a handler that makes only
            // async-signal-safe calls (see `off_and_die`); a signal the
            // process ignores stays ignored.
            unsafe {
                let old = libc::signal(sig, off_and_die as *const () as libc::sighandler_t);
                if old == libc::SIG_IGN {
                    libc::signal(sig, libc::SIG_IGN);
                }
            }
        }
    }
}

/// Reads `p` to its end, keeping at most `max` of the newest bytes (from
/// a line start); reads stop after [`MAX_READ`] bytes.
fn read_newest(p: &Path, max: usize) -> std::io::Result<String> {
    // Opened through units::bounded (no wait on a FIFO, a device refused);
    // read here, not by `read_tail`: the text of a trace buffer is
    // generated as it is read (its size says 0), its newest part is at the
    // end of [`MAX_READ`] bytes at most, and the cut is at a line start.
    let mut f = units::bounded::Bound::pseudo(MAX_READ as u64)
        .open(p)
        .map_err(units::bounded::FileReadError::into_io)?;
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 20);
    let mut chunk = vec![0u8; 1 << 16];
    let mut total = 0usize;
    loop {
        let n = f.read(&mut chunk)?;
        if n == 0 || total > MAX_READ {
            break;
        }
        total += n;
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > max + chunk.len() {
            let cut = buf.len() - max;
            let from = buf[cut..]
                .iter()
                .position(|&b| b == b'\n')
                .map_or(cut, |i| cut + i + 1);
            buf.drain(..from);
        }
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

impl Drop for Tracer {
    fn drop(&mut self) {
        // Relaxed: only the handler reads it.
        let fd = self.on.as_ref().map_or(-1, |f| f.as_raw_fd());
        if fd >= 0 && SIGNAL_OFF_FD.load(Ordering::Relaxed) == fd {
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                // SAFETY: restores the default disposition.
                unsafe { libc::signal(sig, libc::SIG_DFL) };
            }
            SIGNAL_OFF_FD.store(-1, Ordering::Relaxed);
        }
        self.off();
        for ev in &self.events {
            let _ = write_file(&self.dir.join("events").join(ev).join("enable"), "0");
        }
        self.on = None;
        // A worker that still holds the marker file open makes rmdir
        // fail with EBUSY until it exits.
        remove_instance(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpumasks_as_the_kernel_prints_them() {
        assert_eq!(cpumask(&[0, 1]), "00000003");
        assert_eq!(cpumask(&[4]), "00000010");
        assert_eq!(cpumask(&[1, 33]), "00000002,00000002");
    }

    #[test]
    fn a_tree_without_tracefs_says_so() {
        let d = tempfile::tempdir().unwrap();
        let e = find_tracefs(d.path()).unwrap_err().to_string();
        assert!(e.contains("no tracefs mount point"), "{e}");
        std::fs::create_dir_all(d.path().join("kernel/tracing")).unwrap();
        let e = find_tracefs(d.path()).unwrap_err().to_string();
        assert!(e.contains("not mounted"), "{e}");
    }

    #[test]
    fn stale_instances_of_dead_processes_are_removed() {
        let d = tempfile::tempdir().unwrap();
        let proc_root = d.path().join("proc");
        let inst = d.path().join("tracing/instances");
        for n in ["rtdeploy-4000000", "rtdeploy-77", "other", "rtdeploy-x"] {
            std::fs::create_dir_all(inst.join(n)).unwrap();
        }
        std::fs::create_dir_all(proc_root.join("77")).unwrap();
        let removed = remove_stale(&d.path().join("tracing"), &proc_root);
        assert_eq!(removed, ["rtdeploy-4000000"]);
        assert!(inst.join("rtdeploy-77").exists());
        assert!(inst.join("other").exists());
    }

    /// An instance directory as a kernel without io_uring and hrtimer
    /// events has it (files only, as tracefs shows them).
    fn fake_instance(events: &[&str]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for f in [
            "trace_clock",
            "tracing_cpumask",
            "buffer_size_kb",
            "options/overwrite",
        ] {
            let p = d.path().join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, "").unwrap();
        }
        for e in events {
            let p = d.path().join("events").join(e);
            std::fs::create_dir_all(&p).unwrap();
            std::fs::write(p.join("enable"), "0").unwrap();
        }
        d
    }

    #[test]
    fn events_the_kernel_lacks_are_listed_and_the_needed_ones_refused() {
        let d = fake_instance(&[
            "sched/sched_switch",
            "sched/sched_wakeup",
            "irq/irq_handler_entry",
            "irq/irq_handler_exit",
        ]);
        let c = configure_instance(d.path(), Path::new("/t"), &[1, 3]).unwrap();
        assert_eq!(c.events.len(), 4);
        assert_eq!(c.missing.len(), EVENTS.len() - 4);
        assert!(c
            .missing
            .contains(&"io_uring/io_uring_complete (not in this kernel)".to_string()));
        let read = |f: &str| std::fs::read_to_string(d.path().join(f)).unwrap();
        assert_eq!(read("trace_clock"), "mono");
        assert_eq!(read("tracing_cpumask"), "0000000a");
        assert_eq!(read("options/overwrite"), "1");
        assert_eq!(read("events/sched/sched_switch/enable"), "1");

        let d = fake_instance(&["sched/sched_switch"]);
        let e = configure_instance(d.path(), Path::new("/t"), &[1])
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "the kernel has no sched/sched_wakeup event (tracefs /t): nothing to analyse without it"
        );
        // No mono clock file: said, with the path.
        let d = tempfile::tempdir().unwrap();
        let e = configure_instance(d.path(), Path::new("/t"), &[1])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("cannot write `mono` to "), "{e}");
    }

    #[test]
    fn the_newest_text_is_kept() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t");
        let text: String = (0..100_000).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&p, &text).unwrap();
        let got = read_newest(&p, 1000).unwrap();
        assert!(got.len() <= 1000 + (1 << 16), "{}", got.len());
        assert!(got.starts_with("line "), "{}", &got[..20]);
        assert!(got.ends_with("line 99999\n"));
    }
}
