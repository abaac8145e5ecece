//! `deploy bench wake`: one-way wake latency between two processes, one
//! forked sender per mechanism, every mechanism side by side in
//! interleaved rounds, with the settings in force reported alongside.

use super::*;

/// Settings of the wake benchmark.
#[derive(Debug, Clone)]
pub struct WakeOptions {
    /// Samples per mechanism (after a short warm-up).
    pub samples: u32,
    /// The sender's period.
    pub period: Duration,
    pub mechanisms: Vec<Mechanism>,
    /// Mechanisms are measured in this many interleaved rounds, so slow
    /// drifts of the machine hit all of them alike.
    pub rounds: u32,
    /// CPUs for sender and receiver; `None` picks the last two allowed.
    pub sender_cpu: Option<usize>,
    pub receiver_cpu: Option<usize>,
    /// SCHED_FIFO priority for both; `None` keeps the current policy.
    pub priority: Option<u32>,
    /// Normally `/dev/cpu_dma_latency`.
    pub dma_latency: PathBuf,
    /// A directory for the benchmark's channel file (e.g. a temp dir under
    /// `<prefix>/dev/shm/rtdeploy`).
    pub shm_dir: PathBuf,
    /// Normally `/proc`.
    pub proc_root: PathBuf,
    /// A C++ receiver (`examples/cpp/wake_receiver.cpp`, built as
    /// `cpp-wake-receiver`): when given, its loop (rtdeploy.hpp over the C
    /// ABI) is an arm beside the Rust loop on the same backend (doorbell,
    /// the real-time class's), and the Rust arm is measured twice for the
    /// ratio's A/A floor.
    pub cpp_receiver: Option<PathBuf>,
    /// The bridge program (`rtdeploy-bridge`): when given, an arm of the
    /// Rust loop on the doorbell backend while two bridges forward its
    /// channel over Zenoh (see `bridge.rs`), beside the same loop without
    /// them and that a second time (the A/A floor).
    pub bridge: Option<PathBuf>,
}

impl WakeOptions {
    pub fn new(shm_dir: &Path) -> WakeOptions {
        WakeOptions {
            samples: 10_000,
            period: Duration::from_micros(200),
            mechanisms: Mechanism::ALL.to_vec(),
            rounds: 5,
            sender_cpu: None,
            receiver_cpu: None,
            priority: Some(80),
            dma_latency: PathBuf::from("/dev/cpu_dma_latency"),
            shm_dir: shm_dir.into(),
            proc_root: PathBuf::from("/proc"),
            cpp_receiver: None,
            bridge: None,
        }
    }
}

/// What was in force during a run.
#[derive(Debug, Clone, Serialize)]
pub struct BenchSettings {
    pub kernel: String,
    /// e.g. `SCHED_FIFO 80`, or why not.
    pub scheduling: String,
    pub sender_cpu: Option<usize>,
    pub receiver_cpu: Option<usize>,
    /// e.g. `held at 0us`, or why not.
    pub cpu_dma_latency: String,
    pub period_ns: u64,
    pub samples_per_mechanism: u32,
    pub rounds: u32,
}

/// Latency figures of one mechanism, nanoseconds.
#[derive(Debug, Clone, Serialize)]
pub struct LatencySummary {
    pub mechanism: String,
    pub count: u64,
    pub min_ns: u64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub max_ns: u64,
    pub over_100us: u64,
    pub over_1ms: u64,
    /// Wakes that found more than one send (the receiver was late by
    /// more than a period); each still counts once, from the newest stamp.
    pub coalesced: u64,
    /// Why the mechanism was not measured, if it was not.
    pub skipped: Option<String>,
}

impl LatencySummary {
    pub(super) fn from_samples(mechanism: &str, mut v: Vec<u64>, coalesced: u64) -> LatencySummary {
        v.sort_unstable();
        let q = |p: f64| -> u64 {
            if v.is_empty() {
                return 0;
            }
            let i = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
            v[i]
        };
        LatencySummary {
            mechanism: mechanism.into(),
            count: v.len() as u64,
            min_ns: v.first().copied().unwrap_or(0),
            p50_ns: q(0.5),
            p99_ns: q(0.99),
            p999_ns: q(0.999),
            max_ns: v.last().copied().unwrap_or(0),
            over_100us: v.iter().filter(|&&x| x > 100_000).count() as u64,
            over_1ms: v.iter().filter(|&&x| x > 1_000_000).count() as u64,
            coalesced,
            skipped: None,
        }
    }
    pub(super) fn skipped(mechanism: &str, why: String) -> LatencySummary {
        let mut s = LatencySummary::from_samples(mechanism, Vec::new(), 0);
        s.skipped = Some(why);
        s
    }
}

/// The wake benchmark's result.
#[derive(Debug, Clone, Serialize)]
pub struct WakeReport {
    pub settings: BenchSettings,
    pub results: Vec<LatencySummary>,
    /// Each mechanism's p50 over the one-word reference's (io_uring_shared),
    /// per round, with the reference's A/A floor (see [`crate::harness`]);
    /// empty when the reference did not run.
    pub ratios: Vec<crate::harness::Ratio>,
    /// The bridge's CPU time beside the pair (`--bridge`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bridge: Option<BridgeCost>,
}

/// What forwarding the pair's channel cost the forwarding bridge.
#[derive(Debug, Clone, Serialize)]
pub struct BridgeCost {
    /// Messages it sent over Zenoh, over every round.
    pub messages: u64,
    /// Its user and system CPU time meanwhile (10 ms ticks).
    pub cpu_ns: u64,
    /// Per 1000 messages.
    pub cpu_ns_per_1000: u64,
}

pub(super) fn us(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1000.0)
}

impl WakeReport {
    /// A text table (microseconds).
    pub fn table(&self) -> String {
        let s = &self.settings;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "wake latency, one way between processes: kernel {}, {}, sender CPU {}, receiver CPU {}, cpu_dma_latency {}, period {}us, {} samples per mechanism in {} interleaved rounds",
            s.kernel,
            s.scheduling,
            s.sender_cpu.map_or("any".into(), |c| c.to_string()),
            s.receiver_cpu.map_or("any".into(), |c| c.to_string()),
            s.cpu_dma_latency,
            s.period_ns / 1000,
            s.samples_per_mechanism,
            s.rounds
        );
        let _ = writeln!(
            out,
            "(io_uring futex (armed), futex_waitv and doorbell are this runtime's event loop on its io_uring-futex, futex_waitv and doorbell backends; futex is a bare FUTEX_WAIT/FUTEX_WAKE pair, the floor; microseconds)"
        );
        let _ = writeln!(
            out,
            "{:<22} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>8} {:>8} {:>9}",
            "mechanism",
            "count",
            "min",
            "p50",
            "p99",
            "p99.9",
            "max",
            ">100us",
            ">1ms",
            "coalesced"
        );
        for r in &self.results {
            let label = Mechanism::parse(&r.mechanism).map_or(r.mechanism.as_str(), |m| m.label());
            if let Some(why) = &r.skipped {
                let _ = writeln!(out, "{label:<22} skipped: {why}");
                continue;
            }
            let _ = writeln!(
                out,
                "{:<22} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>8} {:>8} {:>9}",
                label,
                r.count,
                us(r.min_ns),
                us(r.p50_ns),
                us(r.p99_ns),
                us(r.p999_ns),
                us(r.max_ns),
                r.over_100us,
                r.over_1ms,
                r.coalesced
            );
        }
        for r in &self.ratios {
            let _ = writeln!(out, "{}", r.line());
        }
        if let Some(b) = &self.bridge {
            let _ = writeln!(
                out,
                "bridge: {} messages forwarded over Zenoh, {:.1} ms of its CPU time ({:.1} ms per 1000 messages; /proc's 10 ms ticks)",
                b.messages,
                b.cpu_ns as f64 / 1e6,
                b.cpu_ns_per_1000 as f64 / 1e6
            );
        }
        out
    }
}

/// Shared between sender and receiver: an anonymous shared mapping.
#[repr(C)]
pub(super) struct Shared {
    /// The futex word of the raw futex mechanism (low 32 bits).
    pub(super) word: AtomicU64,
    /// Sends so far; send `k` (from 1) stamped `stamps[k % STAMPS]`.
    pub(super) seq: AtomicU64,
    /// Set by the receiver when it has all its samples.
    pub(super) done: AtomicU64,
    pub(super) _pad: AtomicU64,
    pub(super) stamps: [AtomicU64; STAMPS],
}

pub(super) const STAMPS: usize = 1024;
pub(super) const SHARED_BYTES: usize = 16384;
const _: () = assert!(std::mem::size_of::<Shared>() <= SHARED_BYTES);

impl Shared {
    /// Sender: stamps send `k` and publishes it.
    pub(super) fn stamp(&self, k: u64) {
        self.stamps[k as usize % STAMPS].store(monotonic_ns(), Ordering::Relaxed);
        // Release: the stamp is visible to a receiver that sees seq >= k.
        self.seq.store(k, Ordering::Release);
    }
}

/// Receiver side: every send is one sample, from its own stamp to the
/// wake that delivered it; sends found by a wake that also found a later
/// one count as coalesced (the receiver was late by over a period).
pub(super) struct Samples {
    pub(super) lat: Vec<u64>,
    pub(super) seen: u64,
    pub(super) coalesced: u64,
}

impl Samples {
    pub(super) fn take_upto(&mut self, shared: &Shared, now: u64, upto: u64) {
        while self.seen < upto {
            self.seen += 1;
            let t = shared.stamps[self.seen as usize % STAMPS].load(Ordering::Relaxed);
            if self.seen < upto {
                self.coalesced += 1;
            }
            self.lat.push(now.saturating_sub(t));
        }
    }
}

pub(super) struct SharedMap(*mut Shared);

impl SharedMap {
    pub(super) fn new() -> Result<SharedMap, BenchRunError> {
        // SAFETY: a fresh anonymous shared mapping; checked for failure.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                SHARED_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(sys_err("mmap"));
        }
        Ok(SharedMap(p as *mut Shared))
    }
    pub(super) fn get(&self) -> &Shared {
        // SAFETY: the mapping is SHARED_BYTES zeroed bytes (a valid Shared:
        // all atomics), page aligned, alive as long as `self`.
        unsafe { &*self.0 }
    }
}

impl Drop for SharedMap {
    fn drop(&mut self) {
        // SAFETY: unmaps what `new` mapped.
        unsafe { libc::munmap(self.0 as *mut libc::c_void, SHARED_BYTES) };
    }
}

pub(super) fn pick_cpus(opts: &WakeOptions) -> (Option<usize>, Option<usize>) {
    let cpus: Vec<usize> = rt::sched_state()
        .map(|s| s.cpus.iter().map(|c| c as usize).collect())
        .unwrap_or_default();
    let n = cpus.len();
    let s = opts
        .sender_cpu
        .or(if n >= 2 { Some(cpus[n - 2]) } else { None });
    let r = opts.receiver_cpu.or(cpus.last().copied());
    (s, r)
}

/// Measures one-way wake latency for each mechanism in `opts`.
pub fn wake(opts: &WakeOptions) -> Result<WakeReport, BenchRunError> {
    let (sender_cpu, receiver_cpu) = pick_cpus(opts);
    let _restore = SchedRestore(rt::sched_state().ok());
    let scheduling = match opts.priority {
        Some(p) => match set_fifo(p) {
            Ok(()) => format!("SCHED_FIFO {p}"),
            Err(e) => format!("SCHED_OTHER (SCHED_FIFO refused: {})", Chain(&e)),
        },
        None => "inherited policy".into(),
    };
    let fifo = scheduling.starts_with("SCHED_FIFO");
    if let Some(c) = receiver_cpu {
        let _ = pin_to(c);
    }
    let (_dma, dma_text) = hold_dma_latency(&opts.dma_latency);
    let p = probe();
    let settings = BenchSettings {
        kernel: p.kernel.clone(),
        scheduling,
        sender_cpu,
        receiver_cpu,
        cpu_dma_latency: dma_text,
        period_ns: opts.period.as_nanos() as u64,
        samples_per_mechanism: opts.samples,
        rounds: opts.rounds.max(1),
    };
    let child_sched = SenderSched {
        cpus: sender_cpu.and_then(|c| CpuSet::from_indices([c]).ok()),
        cpu: sender_cpu,
        fifo: if fifo { opts.priority } else { None },
    };
    let rounds = opts.rounds.max(1);
    let per_round = opts.samples.div_ceil(rounds);
    // The arms: every mechanism, and the one-word reference a second time
    // (the A/A floor) when it is measured; with a C++ receiver, the C++
    // loop on the doorbell backend, the Rust loop on it (added when not
    // asked for) and that a second time (the C++ ratio's A/A floor).
    let mut arms: Vec<(Mechanism, Extra, String)> = opts
        .mechanisms
        .iter()
        .map(|&m| (m, Extra::None, m.short().to_string()))
        .collect();
    let reference = arms.iter().position(|a| a.0 == Mechanism::IoUringShared);
    let reference_aa = reference.map(|r| {
        let m = arms[r].0;
        arms.push((m, Extra::None, format!("{} (A/A)", m.short())));
        arms.len() - 1
    });
    // The C++ loop and the bridge are measured against the Rust loop on
    // the doorbell backend (added when not asked for), and that a second
    // time for their floor.
    let doorbell = (opts.cpp_receiver.is_some() || opts.bridge.is_some()).then(|| {
        let rust = arms
            .iter()
            .position(|a| a.0 == Mechanism::Doorbell && a.1 == Extra::None)
            .unwrap_or_else(|| {
                arms.push((
                    Mechanism::Doorbell,
                    Extra::None,
                    Mechanism::Doorbell.short().into(),
                ));
                arms.len() - 1
            });
        let extra = |arms: &mut Vec<(Mechanism, Extra, String)>, e: Extra, name: &str| {
            arms.push((Mechanism::Doorbell, e, name.into()));
            arms.len() - 1
        };
        let cpp = opts
            .cpp_receiver
            .as_ref()
            .map(|_| extra(&mut arms, Extra::Cpp, CPP_ARM));
        let bridge = opts
            .bridge
            .as_ref()
            .map(|_| extra(&mut arms, Extra::Bridge, BRIDGE_ARM));
        arms.push((
            Mechanism::Doorbell,
            Extra::None,
            format!("{} (A/A)", Mechanism::Doorbell.short()),
        ));
        (rust, cpp, bridge, arms.len() - 1)
    });
    let mut all: Vec<(Vec<u64>, u64, Option<String>)> =
        arms.iter().map(|_| (Vec::new(), 0, None)).collect();
    let mut p50s: Vec<crate::harness::Arm> = arms
        .iter()
        .map(|a| crate::harness::Arm {
            name: a.2.clone(),
            rounds: vec![None; rounds as usize],
        })
        .collect();
    let mut p999s = p50s.clone();
    let mut bridge_cost = (0u64, 0u64);
    for round in 0..rounds as usize {
        for k in crate::harness::order(arms.len(), round) {
            let (m, extra, _) = arms[k];
            if all[k].2.is_some() {
                continue;
            }
            let skip = match m {
                Mechanism::IoUringFutex | Mechanism::IoUringShared if !p.io_uring_futex => {
                    p.io_uring_problem.clone()
                }
                Mechanism::FutexWaitv if !p.futex_waitv => {
                    Some("kernel lacks futex_waitv (5.16+)".into())
                }
                Mechanism::MsgRing => crate::notify::probe_msg_ring()
                    .err()
                    .map(|e| format!("no io_uring MSG_RING wake here (5.18+): {e}")),
                _ => None,
            };
            if let Some(why) = skip {
                all[k].2 = Some(why);
                continue;
            }
            let (v, coalesced) = match (extra, &opts.cpp_receiver, &opts.bridge) {
                (Extra::Cpp, Some(bin), _) => (run_cpp(bin, per_round, opts, &child_sched)?, 0),
                (Extra::Bridge, _, Some(bin)) => {
                    let (v, c, cost) = run_one(m, per_round, opts, &child_sched, Some(bin))?;
                    if let Some((cpu, sent)) = cost {
                        bridge_cost.0 += cpu;
                        bridge_cost.1 += sent;
                    }
                    (v, c)
                }
                _ => {
                    let (v, c, _) = run_one(m, per_round, opts, &child_sched, None)?;
                    (v, c)
                }
            };
            if !v.is_empty() {
                let l = LatencySummary::from_samples("", v.clone(), 0);
                p50s[k].rounds[round] = Some(l.p50_ns as f64);
                p999s[k].rounds[round] = Some(l.p999_ns as f64);
            }
            all[k].0.extend(v);
            all[k].1 += coalesced;
        }
    }
    let mut ratios = vec![];
    if let Some(r) = reference {
        let aa = reference_aa.map(|k| &p50s[k]);
        for (k, arm) in p50s.iter().enumerate().take(opts.mechanisms.len()) {
            if k != r {
                ratios.extend(crate::harness::Ratio::of("wake p50", arm, &p50s[r], aa));
            }
        }
    }
    if let Some((rust, cpp, bridge, aa)) = doorbell {
        if let Some(cpp) = cpp {
            ratios.extend(crate::harness::Ratio::of(
                "wake p50",
                &p50s[cpp],
                &p50s[rust],
                Some(&p50s[aa]),
            ));
        }
        if let Some(b) = bridge {
            for (figure, arms) in [("wake p50", &p50s), ("wake p99.9", &p999s)] {
                ratios.extend(crate::harness::Ratio::of(
                    figure,
                    &arms[b],
                    &arms[rust],
                    Some(&arms[aa]),
                ));
            }
        }
    }
    let results = all
        .into_iter()
        .zip(&p50s)
        .map(|((v, c, skip), arm)| match skip {
            Some(why) => LatencySummary::skipped(&arm.name, why),
            None => LatencySummary::from_samples(&arm.name, v, c),
        })
        .collect();
    Ok(WakeReport {
        settings,
        results,
        ratios,
        bridge: opts.bridge.as_ref().map(|_| BridgeCost {
            messages: bridge_cost.1,
            cpu_ns: bridge_cost.0,
            cpu_ns_per_1000: bridge_cost.0.saturating_mul(1000) / bridge_cost.1.max(1),
        }),
    })
}

/// What an arm runs beside the mechanism.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Extra {
    None,
    /// The C++ receiver instead of the Rust loop.
    Cpp,
    /// Two bridges forwarding the channel.
    Bridge,
}

/// The bridge arm's name in the report.
pub const BRIDGE_ARM: &str = "doorbell + bridge";

/// The C++ arm's name in the report.
pub const CPP_ARM: &str = "cpp (doorbell)";

/// How long the C++ receiver may take to say it watches.
const RECEIVER_READY: Duration = Duration::from_secs(10);

/// One round of the C++ arm: the channel and the forked sender as for
/// the Rust loop on the doorbell backend ([`run_one`]), the receiving loop
/// in `bin` (started with this thread's CPU and policy, and the
/// environment a real-time controller of robot.yaml gets), its latencies
/// read back from its output. Every wait on the receiver is bounded: a
/// receiver that hangs is killed and said.
fn run_cpp(
    bin: &Path,
    n: u32,
    opts: &WakeOptions,
    sched: &SenderSched,
) -> Result<Vec<u64>, BenchRunError> {
    use std::io::BufRead as _;
    use std::process::{Command, Stdio};
    let bad = |why: String| BenchRunError::Receiver {
        path: bin.to_path_buf(),
        why,
    };
    let map = SharedMap::new()?;
    let shared = map.get();
    let total = n + WARMUP;
    let dir = bench_dir(&opts.shm_dir)?;
    let geom = ChannelGeometry::new(64, 1024, 2);
    let ch = channel_for(dir.path(), "/bench/wake", &geom, &opts.proc_root)?;
    let (class, _) = Mechanism::Doorbell.classes();
    let mut publisher = publisher_for(&ch, dir.path(), &opts.proc_root, class)?;
    // The policy this thread runs, which the receiver inherits and its
    // loop checks against the one it is told robot.yaml gives it.
    let policy = match sched::get_attr(0) {
        Ok(a) if matches!(a.policy, Policy::Fifo | Policy::Rr) => units::env::SchedSpec {
            policy: a.policy,
            priority: a.priority,
        },
        _ => units::env::SchedSpec {
            policy: Policy::Other,
            priority: 0,
        },
    };
    use std::os::unix::process::CommandExt as _;
    let mut child = Command::new(bin)
        .args(["--channel", "/bench/wake", "--count"])
        .arg(total.to_string())
        .env(units::env::SHM_DIR, dir.path())
        .env(units::env::WAKE_CLASS, class.name())
        .env(units::env::SCHED, policy.to_string())
        .env(units::env::BACKEND, "doorbell")
        .env_remove(units::env::PROCESS)
        // Its own process group, so that a receiver that hangs is killed
        // with whatever it started (which would hold its output open).
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| bad(format!("cannot start it: {e}")))?;
    let out = child.stdout.take().expect("piped");
    let err = child.stderr.take().expect("piped");
    // Lines are read on their own thread, so that every wait below has a
    // deadline; at most one line of 64 bytes beyond the samples is kept.
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines() {
            let Ok(mut line) = line else { break };
            line.truncate(64);
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let stderr = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut std::io::Read::take(err, 4096), &mut s);
        s
    });
    // Ends the receiver (killed when it failed) and says how it ended
    // when that was not a success, with what it wrote on stderr.
    let end =
        |child: &mut std::process::Child, stderr: std::thread::JoinHandle<String>, why: String| {
            // SAFETY: kill(2) of the receiver's own process group (its pid,
            // made a group leader at spawn and not yet waited for).
            unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
            let _ = child.kill();
            let status = match child.wait() {
                Ok(s) if !s.success() => format!(" ({s})"),
                Ok(_) => String::new(),
                Err(e) => format!(" (wait: {e})"),
            };
            let said = stderr.join().unwrap_or_default();
            bad(format!("{why}{status}: {}", said.trim()))
        };
    match rx.recv_timeout(RECEIVER_READY) {
        Ok(l) if l == "ready doorbell 1" => {}
        Ok(l) if l.starts_with("ready ") => {
            return Err(end(
                &mut child,
                stderr,
                format!(
                    "its loop runs `{l}`, not the real-time class on the doorbell backend that the Rust arm does"
                ),
            ))
        }
        Ok(l) => return Err(end(&mut child, stderr, format!("expected `ready`, got {l:?}"))),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            return Err(end(
                &mut child,
                stderr,
                "it ended before saying `ready`".into(),
            ))
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            return Err(end(
                &mut child,
                stderr,
                format!("did not say `ready` within {RECEIVER_READY:?}"),
            ))
        }
    }
    let pid = fork_sender(shared, opts, sched, n, |i| {
        let _ = publisher.publish(&i.to_ne_bytes());
    })?;
    // The sender's period times the messages, four times over, and 10 s.
    let limit = opts.period.saturating_mul(total.saturating_mul(4)) + Duration::from_secs(10);
    let deadline = std::time::Instant::now() + limit;
    let mut lat = Vec::with_capacity(total as usize);
    let mut expected: Option<usize> = None;
    let mut failed = None;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => match (expected, l.strip_prefix("samples ")) {
                (None, Some(k)) => match k.parse::<usize>() {
                    Ok(k) if k <= total as usize => {
                        expected = Some(k);
                        if k == 0 {
                            break;
                        }
                    }
                    _ => {
                        failed = Some(format!("`{l}`: not a count of at most {total}"));
                        break;
                    }
                },
                (Some(k), None) => match l.parse::<u64>() {
                    Ok(v) => {
                        lat.push(v);
                        if lat.len() == k {
                            break;
                        }
                    }
                    Err(_) => {
                        failed = Some(format!("`{l}`: not a latency in ns"));
                        break;
                    }
                },
                _ => {
                    failed = Some(format!("unexpected line `{l}`"));
                    break;
                }
            },
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                failed = Some(format!("{} of its samples after {limit:?}", lat.len()));
                break;
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                failed = Some(format!("its output ended after {} samples", lat.len()));
                break;
            }
        }
    }
    shared.done.store(1, Ordering::Release);
    let sent = reap(pid, Mechanism::Doorbell);
    drop(rx);
    if let Some(why) = failed {
        let e = end(&mut child, stderr, why);
        let _ = reader.join();
        return Err(e);
    }
    let status = child.wait();
    let _ = reader.join();
    let said = stderr.join().unwrap_or_default();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => return Err(bad(format!("ended {s}: {}", said.trim()))),
        Err(e) => return Err(bad(format!("wait: {e}"))),
    }
    sent?;
    Ok(lat.into_iter().skip(WARMUP as usize).collect())
}

pub(super) struct SenderSched {
    /// Built before the fork: the child allocates nothing.
    pub(super) cpus: Option<CpuSet>,
    /// The sender's CPU (the bridges run there too).
    pub(super) cpu: Option<usize>,
    pub(super) fifo: Option<u32>,
}

pub(super) const WARMUP: u32 = 20;

/// Forks the sender: `send(i)` is called every period until the receiver
/// says done (or a generous cap passes). Only async-signal-safe work
/// happens in the child.
pub(super) fn fork_sender(
    shared: &Shared,
    opts: &WakeOptions,
    placement: &SenderSched,
    expected: u32,
    mut send: impl FnMut(u64),
) -> Result<libc::pid_t, BenchRunError> {
    let period = opts.period.as_nanos() as u64;
    // SAFETY: fork has no memory-safety preconditions; the child below
    // only uses syscalls, atomics on shared memory and `send` (which
    // only does the same), then _exit without running destructors.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(sys_err("fork"));
    }
    if pid > 0 {
        return Ok(pid);
    }
    // Child: units::sched makes its calls on its own stack and
    // allocates nothing.
    if let Some(cpus) = &placement.cpus {
        let _ = sched::set_affinity(0, cpus);
    }
    if let Some(p) = placement.fifo {
        let _ = set_fifo(p);
    }
    let cap = (expected as u64 + WARMUP as u64) * 4 + 5_000_000_000 / period.max(1);
    let mut next = monotonic_ns() + 2_000_000; // let the receiver go to sleep
    let mut i = 0u64;
    while shared.done.load(Ordering::Acquire) == 0 && i < cap {
        sleep_until(Monotonic::from_nanos(next));
        next += period;
        send(i);
        i += 1;
    }
    // SAFETY: ends the child without unwinding or running destructors of
    // state duplicated from the parent.
    unsafe { libc::_exit(0) }
}

pub(super) fn reap(pid: libc::pid_t, m: Mechanism) -> Result<(), BenchRunError> {
    let mut status = 0;
    // SAFETY: waits for our own child; `status` is valid.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        Ok(())
    } else {
        Err(BenchRunError::Child {
            mechanism: m.short(),
            status,
        })
    }
}

/// One arm's round: its latencies (after the warm-up), the wakes that
/// found more than one message, and the forwarding bridge's CPU time and
/// messages sent when bridges ran beside it.
pub(super) type OneRun = (Vec<u64>, u64, Option<(u64, u64)>);

pub(super) fn run_one(
    m: Mechanism,
    n: u32,
    opts: &WakeOptions,
    sched: &SenderSched,
    bridge: Option<&Path>,
) -> Result<OneRun, BenchRunError> {
    let map = SharedMap::new()?;
    let shared = map.get();
    let total = n + WARMUP;
    let mut smp = Samples {
        lat: Vec::with_capacity(total as usize + 64),
        seen: 0,
        coalesced: 0,
    };
    match m {
        Mechanism::IoUringFutex
        | Mechanism::FutexWaitv
        | Mechanism::Doorbell
        | Mechanism::IoUringShared => {
            let dir = bench_dir(&opts.shm_dir)?;
            let geom = ChannelGeometry::new(64, 1024, 2);
            let ch = channel_for(dir.path(), "/bench/wake", &geom, &opts.proc_root)?;
            // The real-time pair's class for the runtime's backends (its
            // own word or bell), one class for the one-word reference.
            let (class, _) = m.classes();
            let mut publisher = publisher_for(&ch, dir.path(), &opts.proc_root, class)?;
            let mut lp = EventLoop::new(LoopOptions {
                backend: m.backend(),
                proc_root: opts.proc_root.clone(),
                class,
                ..LoopOptions::default()
            })
            .map_err(BenchRunError::LoopCreate)?;
            // Every message counts, each from its own send time (a late
            // wake that finds several is charged for all of them).
            let samples = Rc::new(RefCell::new(Vec::with_capacity(total as usize)));
            let s2 = samples.clone();
            let mut got = 0u32;
            lp.watch_raw(&ch, move |ctx, msg| {
                s2.borrow_mut().push(ctx.latency().as_nanos() as u64);
                if msg.lost_before > 0 {
                    got += msg.lost_before as u32;
                }
                got += 1;
                if got >= total {
                    ctx.exit();
                }
            })
            .map_err(BenchRunError::LoopWatch)?;
            let bridges = match bridge {
                Some(bin) => Some(super::bridge::start(bin, dir.path(), opts, sched.cpu)?),
                None => None,
            };
            let pid = fork_sender(shared, opts, sched, n, |i| {
                let _ = publisher.publish(&i.to_ne_bytes());
            })?;
            let r = lp.run().map_err(BenchRunError::LoopRun);
            shared.done.store(1, Ordering::Release);
            reap(pid, m)?;
            r?;
            drop(lp);
            let cost = bridges.map(|b| b.finish(&opts.proc_root));
            let v = samples.borrow();
            return Ok((
                v.iter()
                    .take(total as usize)
                    .skip(WARMUP as usize)
                    .copied()
                    .collect(),
                0,
                cost,
            ));
        }
        Mechanism::Futex => {
            let pid = fork_sender(shared, opts, sched, n, |i| {
                shared.stamp(i + 1);
                shared.word.fetch_add(1, Ordering::SeqCst);
                let _ = futex::wake_all(&shared.word);
            })?;
            let mut seen_word = 0u64;
            while smp.lat.len() < total as usize {
                loop {
                    let w = shared.word.load(Ordering::SeqCst);
                    if w != seen_word {
                        seen_word = w;
                        break;
                    }
                    let _ = futex::wait(&shared.word, w as u32, Some(1_000_000_000));
                }
                let now = monotonic_ns();
                smp.take_upto(shared, now, shared.seq.load(Ordering::Acquire));
            }
            shared.done.store(1, Ordering::Release);
            reap(pid, m)?;
        }
        Mechanism::Eventfd | Mechanism::MsgRing => {
            let (waiter, what) = if m == Mechanism::Eventfd {
                (Waiter::eventfd(), "eventfd")
            } else {
                (Waiter::msg_ring(), "io_uring MSG_RING")
            };
            let waiter = waiter.map_err(|e| sys_err_from(what, e))?;
            let notifier = Notifier::connect(&waiter.address())
                .map_err(|e| sys_err_from("notifier connect", e))?;
            let pid = fork_sender(shared, opts, sched, n, |i| {
                shared.stamp(i + 1);
                let _ = notifier.notify();
            })?;
            while smp.lat.len() < total as usize {
                // The counter (eventfd) or the completions (MSG_RING):
                // the number of sends since the last wait.
                let r = waiter.wait();
                let now = monotonic_ns();
                let Ok(k) = r else { break };
                let upto = smp.seen + k;
                smp.take_upto(shared, now, upto);
            }
            shared.done.store(1, Ordering::Release);
            reap(pid, m)?;
        }
        Mechanism::Pipe => {
            let mut fds = [0i32; 2];
            // SAFETY: `fds` has room for two fds.
            if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
                return Err(sys_err("pipe2"));
            }
            // SAFETY: fresh fds we own.
            let (rfd, wfd) =
                unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
            let w = wfd.as_raw_fd();
            let pid = fork_sender(shared, opts, sched, n, |i| {
                shared.stamp(i + 1);
                let k = i + 1;
                // SAFETY: writes 8 bytes from a valid u64 to our pipe.
                unsafe { libc::write(w, &k as *const u64 as *const libc::c_void, 8) };
            })?;
            drop(wfd);
            while smp.lat.len() < total as usize {
                let mut k = 0u64;
                // SAFETY: reads 8 bytes into a valid u64.
                let r = unsafe {
                    libc::read(rfd.as_raw_fd(), &mut k as *mut u64 as *mut libc::c_void, 8)
                };
                let now = monotonic_ns();
                if r != 8 {
                    break;
                }
                // Later sends already in the pipe are read (and timed) on
                // the next reads: charge them as found by this wake.
                let upto = k.max(smp.seen + 1);
                smp.take_upto(shared, now, upto);
            }
            shared.done.store(1, Ordering::Release);
            // Closing the read end ends a sender blocked on a full pipe.
            drop(rfd);
            reap(pid, m)?;
        }
        Mechanism::Signalfd => {
            // Blocked in this thread only; the sender queues the signal at
            // this thread, so no other thread ever gets it.
            let waiter =
                Waiter::signal(libc::SIGRTMIN() + 1).map_err(|e| sys_err_from("signalfd", e))?;
            let notifier = Notifier::connect(&waiter.address())
                .map_err(|e| sys_err_from("signalfd connect", e))?;
            let pid = fork_sender(shared, opts, sched, n, |i| {
                shared.stamp(i + 1);
                let _ = notifier.notify();
            })?;
            while smp.lat.len() < total as usize {
                // RT signals queue one per send, in order.
                let r = waiter.wait();
                let now = monotonic_ns();
                let Ok(k) = r else { break };
                let upto = smp.seen + k;
                smp.take_upto(shared, now, upto);
            }
            shared.done.store(1, Ordering::Release);
            reap(pid, m)?;
            // Dropping the waiter discards signals still queued and
            // restores the mask.
            drop(waiter);
        }
    }
    let coalesced = smp.coalesced;
    let mut lat = smp.lat;
    lat.truncate(total as usize);
    let lat = lat.split_off((WARMUP as usize).min(lat.len()));
    Ok((lat, coalesced, None))
}
