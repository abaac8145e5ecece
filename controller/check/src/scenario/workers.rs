//! The worker processes a run starts (the loads, the timer threads, the
//! scenario's pair and peers, the census's positive control), and the run
//! that owns them: every worker is stopped and reaped when the run ends,
//! however it ends.

use super::*;

/// How long the real-time receiver of a phase may take to start.
pub(super) const RECEIVER_READY_WITHIN: Duration = Duration::from_secs(60);
/// How long a killed worker has to be gone. A process in an
/// uninterruptible wait (the I/O load's fsync behind a slow disk) dies only
/// when that wait ends: the check does not wait for it longer than this.
pub(super) const REAP_WITHIN: Duration = Duration::from_secs(5);

/// A started worker process; killed and reaped if dropped while running.
pub(super) struct Worker {
    pub(super) role: String,
    pub(super) child: Child,
    /// The receiver address cell it was given.
    pub(super) cell: Option<usize>,
    /// Killed, and still there after [`REAP_WITHIN`]: left to be reaped
    /// by init once deploy exits.
    pub(super) abandoned: bool,
}

impl Worker {
    /// Kills the worker and reaps it within [`REAP_WITHIN`]; one that
    /// outlasts that is left behind, with a line on stderr naming where it
    /// waits in the kernel.
    pub(super) fn kill_and_reap(&mut self) {
        if self.abandoned {
            return;
        }
        let _ = self.child.kill();
        let end = Instant::now() + REAP_WITHIN;
        loop {
            match self.child.try_wait() {
                Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(5)),
                Ok(None) => {
                    let pid = self.child.id();
                    // A kernel symbol's name (at most 512 bytes).
                    let wchan = units::bounded::Bound::pseudo(4096)
                        .read_lossy(Path::new(&format!("/proc/{pid}/wchan")))
                        .unwrap_or_default();
                    eprintln!(
                        "deploy check: the {} worker (pid {pid}) was still there {}s after SIGKILL (waiting in the kernel in `{}`); going on without it",
                        self.role,
                        REAP_WITHIN.as_secs(),
                        wchan.trim()
                    );
                    self.abandoned = true;
                    return;
                }
                _ => return,
            }
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill_and_reap();
        }
    }
}

/// Everything started for one run; dropping it stops and reaps the
/// workers and removes the run's files.
pub(super) struct Run<'a> {
    pub(super) env: &'a CheckEnv,
    pub(super) shared: Shared,
    pub(super) shared_path: PathBuf,
    pub(super) channel_name: String,
    pub(super) channel_path: PathBuf,
    pub(super) io_dir: Option<TempDir>,
    pub(super) loads: Vec<Worker>,
    pub(super) low: Vec<Option<Worker>>,
    pub(super) retired: Vec<Worker>,
    /// Per low slot: which of its two cells the next process gets.
    pub(super) low_flip: Vec<usize>,
    /// Publishes TAG_STOP after a stop word changes.
    pub(super) stopper: Publisher,
}

pub(super) fn cpu_list(cpus: &[usize]) -> String {
    cpus.iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

impl Run<'_> {
    /// Wakes every receiver so it looks at its stop word: a message on
    /// the channel (futex word) and a notification to every receiver
    /// waiting on an eventfd or signalfd.
    pub(super) fn poke(&mut self) {
        let _ = self.stopper.publish_value(&[TAG_STOP, 0u64]);
        for cell in self.shared.control().cells.iter() {
            if let Some((_, addr)) = cell.load() {
                // The engine is the receivers' parent: it may always
                // fetch their eventfd and signal them.
                if let Ok(n) = Notifier::connect(&addr) {
                    let _ = n.notify();
                }
            }
        }
    }

    /// Empties the cell of a worker that exited or is about to be reaped
    /// (a receiver killed before it emptied its cell), so no publisher
    /// signals a pid that could be reused.
    pub(super) fn release_cell(&self, w: &Worker) {
        if let Some(c) = w.cell {
            self.shared.control().cells[c].clear_pid(w.child.id());
        }
    }

    /// The cell for a new process in low slot `slot`: the one its
    /// previous process does not use. A process from two generations ago
    /// still holding it is stopped first.
    pub(super) fn low_cell(&mut self, slot: usize) -> usize {
        self.low_flip[slot] ^= 1;
        let c = 1 + 2 * slot + self.low_flip[slot];
        let (old, keep): (Vec<Worker>, Vec<Worker>) =
            self.retired.drain(..).partition(|w| w.cell == Some(c));
        self.retired = keep;
        for mut w in old {
            w.kill_and_reap();
            self.release_cell(&w);
        }
        c
    }

    pub(super) fn base_args(&self) -> Vec<String> {
        vec![
            format!("shared={}", self.shared_path.display()),
            format!("shm={}", shm_dir(&self.env.prefix).display()),
            format!("channel={}", self.channel_name),
            format!("proc={}", self.env.sysroot.join("proc").display()),
            format!("sys={}", self.env.sysroot.join("sys").display()),
        ]
    }

    pub(super) fn spawn(&self, role: &str, extra: &[String]) -> Result<Worker, CheckRunError> {
        let mut cmd = Command::new(&self.env.exe);
        cmd.env(units::env::CHECK_ENGINE, std::process::id().to_string());
        cmd.arg("__check-worker")
            .arg(role)
            .args(self.base_args())
            .args(extra);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let child = cmd.spawn().map_err(|source| CheckRunError::Spawn {
            role: role.into(),
            exe: self.env.exe.clone(),
            source,
        })?;
        let cell = extra
            .iter()
            .find_map(|a| a.strip_prefix("cell="))
            .and_then(|c| c.parse().ok())
            .filter(|&c: &usize| c < CELLS);
        Ok(Worker {
            role: role.into(),
            child,
            cell,
            abandoned: false,
        })
    }

    /// Fails when a worker that should still run has exited.
    pub(super) fn check_alive(w: &mut Worker) -> Result<(), CheckRunError> {
        if let Ok(Some(status)) = w.child.try_wait() {
            return Err(worker_failed(w, status.to_string()));
        }
        Ok(())
    }

    /// Reaps retired low-priority processes that exited; kills those that
    /// overstay.
    pub(super) fn reap_retired(&mut self, force: bool) {
        let ctl = self.shared.control();
        self.retired.retain_mut(|w| {
            let release = |w: &Worker| {
                if let Some(c) = w.cell {
                    ctl.cells[c].clear_pid(w.child.id());
                }
            };
            match w.child.try_wait() {
                Ok(Some(_)) => {
                    release(w);
                    false
                }
                _ if force => {
                    release(w);
                    w.kill_and_reap();
                    false
                }
                _ => true,
            }
        });
    }
}

pub(super) fn worker_failed(w: &mut Worker, status: String) -> CheckRunError {
    let mut stderr = String::new();
    // An abandoned worker holds its end of the pipe until it dies.
    if let Some(e) = w.child.stderr.take().filter(|_| !w.abandoned) {
        use std::io::Read;
        // What a worker says is kept to its first 64 KiB: a worker that
        // floods its stderr before dying must not fill the check's memory.
        let mut held = Vec::new();
        let _ = e.take(64 << 10).read_to_end(&mut held);
        stderr = String::from_utf8_lossy(&held).into_owned();
    }
    CheckRunError::Worker {
        role: w.role.clone(),
        status,
        stderr: stderr.trim().to_string(),
    }
}

/// Waits up to `timeout` for a worker to exit by itself, then kills it.
/// Returns an error when it exited unsuccessfully on its own.
pub(super) fn finish(mut w: Worker, timeout: Duration) -> Result<(), CheckRunError> {
    let end = Instant::now() + timeout;
    loop {
        match w.child.try_wait() {
            Ok(Some(s)) if s.success() => return Ok(()),
            Ok(Some(s)) => return Err(worker_failed(&mut w, s.to_string())),
            Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                w.kill_and_reap();
                return Ok(());
            }
        }
    }
}

impl Drop for Run<'_> {
    fn drop(&mut self) {
        let ctl = self.shared.control();
        ctl.stop_all.store(1, Ordering::SeqCst);
        ctl.rt_stop.store(1, Ordering::SeqCst);
        ctl.rt_recv_stop.store(1, Ordering::SeqCst);
        self.poke();
        let workers: Vec<Worker> = self
            .loads
            .drain(..)
            .chain(self.low.iter_mut().filter_map(|w| w.take()))
            .chain(self.retired.drain(..))
            .collect();
        for w in workers {
            let _ = finish(w, Duration::from_secs(2));
        }
        let _ = std::fs::remove_file(&self.shared_path);
        let _ = std::fs::remove_file(&self.channel_path);
    }
}

/// The census's positive control: a best-effort process on the
/// housekeeping CPUs holds a priority-inheritance futex about half the time
/// and a SCHED_FIFO process on `cpu` locks it every 5 ms, so that the
/// kernel boosts the holder: the census must count those waits (2 s).
pub(super) fn pi_control(
    run: &mut Run,
    cs: &crate::census::Census,
    inputs: &CheckInputs,
    hk: &str,
    cpu: usize,
) -> Result<(), CheckRunError> {
    let ctl = run.shared.control();
    ctl.rt_stop.store(0, Ordering::SeqCst);
    ctl.pi_word.store(0, Ordering::SeqCst);
    ctl.pi_cycles.store(0, Ordering::SeqCst);
    cs.phase("positive control: PI futex");
    let hold = run.spawn(
        "pi-hold",
        &[format!("cpu={hk}"), "hold_ns=4000000".to_string()],
    )?;
    let waiter = run.spawn(
        "rt-pi",
        &[
            format!("cpu={cpu}"),
            format!("priority={}", inputs.check.priority),
            "period_ns=5000000".to_string(),
        ],
    )?;
    // Until the waiter has found the lock held PI_CYCLES times (each a
    // FUTEX_LOCK_PI that boosts the holder; about half its locks, so
    // about 2 s at its 5 ms period), not for a fixed time nor a count of
    // its locks: under emulation either worker may take seconds to start,
    // and a waiter that runs before its holder finds the lock free every
    // time, which boosts nobody. The deadline ends a phase whose waiter
    // never gets there (the census then says what it saw).
    const PI_CYCLES: u64 = 200;
    let deadline = Instant::now() + Duration::from_secs(120);
    while run.shared.control().pi_cycles.load(Ordering::SeqCst) < PI_CYCLES
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    cs.end_phase();
    run.shared.control().rt_stop.store(1, Ordering::SeqCst);
    finish(waiter, Duration::from_secs(5))?;
    finish(hold, Duration::from_secs(5))?;
    run.shared.control().rt_stop.store(0, Ordering::SeqCst);
    Ok(())
}
