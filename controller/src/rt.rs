//! Real-time process setup: locked and prefaulted memory, an allocation
//! trap for real-time sections, the `RLIMIT_RTTIME` guard, a check that
//! the process runs with the scheduling policy, priority and CPUs it was
//! given (read back from the kernel, not assumed), and a held
//! `/dev/cpu_dma_latency` request.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::fs::File;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use units::cpu::CpuSet;
use units::sched::{self, AffinityGetError, SchedGetError};

/// Memory setup failed.
#[derive(Debug, thiserror::Error)]
pub enum RtSetupError {
    #[error("mlockall(MCL_CURRENT | MCL_FUTURE) failed: {0} (raise RLIMIT_MEMLOCK, `memlock:` in robot.yaml, or run with CAP_IPC_LOCK)")]
    Mlock(io::Error),
    #[error("the locked-memory limit is {limit_kib} KiB and the program's own mappings lock {locked_kib} KiB: {wanted_kib} KiB of stack and heap more would leave no room for its channels; memory left unlocked (raise RLIMIT_MEMLOCK, `memlock:` in robot.yaml)")]
    NoRoom {
        limit_kib: u64,
        locked_kib: u64,
        wanted_kib: u64,
    },
    #[error("setrlimit(RLIMIT_RTTIME, soft {soft_us}us, hard {hard_us}us) failed")]
    RtTime {
        soft_us: u64,
        hard_us: u64,
        source: io::Error,
    },
}

/// Locks all current and future memory (`mlockall`), then prefaults
/// `stack_bytes` of stack and `heap_bytes` of heap so the real-time path
/// takes no page fault. The heap is kept: glibc is told never to trim it or
/// serve large blocks with mmap.
///
/// Under a locked-memory limit (and without CAP_IPC_LOCK, which lifts
/// it), the stack and heap asked for must fit
/// beside what the program's own mappings lock, with an eighth of the
/// limit left for its channels and ring: otherwise the memory is unlocked
/// again and
/// [`RtSetupError::NoRoom`] says the figures (a heap prefault past the
/// limit would fail, and the allocation failure abort the process).
pub fn lock_and_prefault(stack_bytes: usize, heap_bytes: usize) -> Result<(), RtSetupError> {
    // What is mapped now, locked first without MCL_FUTURE, so that reading
    // how much that is (an allocation) cannot itself hit the limit.
    // SAFETY: mlockall has no memory-safety preconditions.
    if unsafe { libc::mlockall(libc::MCL_CURRENT) } != 0 {
        return Err(RtSetupError::Mlock(io::Error::last_os_error()));
    }
    if let (Some(limit), Some((locked, false))) = (memlock_limit(), locked_bytes()) {
        let wanted = (stack_bytes as u64).saturating_add(heap_bytes as u64);
        // An eighth of the limit kept for the channels and the ring.
        if locked.saturating_add(wanted).saturating_add(limit / 8) > limit {
            // SAFETY: munlockall has no memory-safety preconditions.
            unsafe { libc::munlockall() };
            return Err(RtSetupError::NoRoom {
                limit_kib: limit >> 10,
                locked_kib: locked >> 10,
                wanted_kib: wanted >> 10,
            });
        }
    }
    // SAFETY: as above.
    if unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) } != 0 {
        let e = io::Error::last_os_error();
        // SAFETY: as above.
        unsafe { libc::munlockall() };
        return Err(RtSetupError::Mlock(e));
    }
    prefault_stack(stack_bytes);
    prefault_heap(heap_bytes);
    Ok(())
}

/// This process's locked memory (`VmLck` of `/proc/self/status`), bytes,
/// and whether it holds CAP_IPC_LOCK (then no limit applies to it).
fn locked_bytes() -> Option<(u64, bool)> {
    const CAP_IPC_LOCK: u32 = 14;
    let text = units::bounded::Bound::pseudo(64 << 10)
        .read_lossy(Path::new("/proc/self/status"))
        .ok()?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
    };
    let kib: u64 = field("VmLck:")?.strip_suffix("kB")?.trim().parse().ok()?;
    let caps = u64::from_str_radix(field("CapEff:")?, 16).ok()?;
    Some((kib << 10, caps & (1 << CAP_IPC_LOCK) != 0))
}

/// This process's soft RLIMIT_MEMLOCK in bytes, `None` when unlimited
/// (or unknown): what `lock_and_prefault` and every later mapping must fit
/// in together.
pub fn memlock_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit for the call to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0
        || lim.rlim_cur == libc::RLIM_INFINITY
    {
        return None;
    }
    Some(lim.rlim_cur)
}

/// Touches `bytes` of stack below the current frame.
pub fn prefault_stack(bytes: usize) {
    #[inline(never)]
    fn touch(left: usize) {
        let mut page = [0u8; 4096];
        // Volatile: the writes must happen although nothing reads them.
        for i in (0..page.len()).step_by(256) {
            // SAFETY: `i` is in bounds of the local array.
            unsafe { std::ptr::write_volatile(page.as_mut_ptr().add(i), 1) };
        }
        std::hint::black_box(&page);
        if left > page.len() {
            touch(left - page.len());
        }
    }
    touch(bytes);
}

/// Grows the heap by `bytes`, touches every page, and frees it back to
/// the allocator (not to the kernel).
pub fn prefault_heap(bytes: usize) {
    // SAFETY: mallopt only sets glibc tunables.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        libc::mallopt(libc::M_MMAP_MAX, 0);
    }
    let mut v = vec![0u8; bytes];
    for i in (0..v.len()).step_by(4096) {
        // SAFETY: `i` is in bounds.
        unsafe { std::ptr::write_volatile(v.as_mut_ptr().add(i), 1) };
    }
    std::hint::black_box(&mut v);
}

/// Sets `RLIMIT_RTTIME`: a real-time thread that runs `soft` without
/// blocking gets SIGXCPU, `hard` gets it killed.
pub fn set_rttime_limit(soft: Duration, hard: Duration) -> Result<(), RtSetupError> {
    let soft_us = soft.as_micros() as u64;
    let hard_us = hard.as_micros().max(soft.as_micros()) as u64;
    let lim = libc::rlimit {
        rlim_cur: soft_us as libc::rlim_t,
        rlim_max: hard_us as libc::rlim_t,
    };
    // SAFETY: `lim` is a valid rlimit for the call.
    if unsafe { libc::setrlimit(libc::RLIMIT_RTTIME, &lim) } != 0 {
        return Err(RtSetupError::RtTime {
            soft_us,
            hard_us,
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// The current `RLIMIT_RTTIME` (soft, hard) in microseconds; `None` is
/// unlimited.
#[allow(clippy::unnecessary_cast)] // rlim_t is u64 on the 64-bit targets, not on all
pub fn rttime_limit() -> (Option<u64>, Option<u64>) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit.
    unsafe { libc::getrlimit(libc::RLIMIT_RTTIME, &mut lim) };
    let f = |v: libc::rlim_t| (v != libc::RLIM_INFINITY).then_some(v as u64);
    (f(lim.rlim_cur), f(lim.rlim_max))
}

/// The scheduling policy robot.yaml gives a process ([`SchedExpectation`],
/// [`crate::wake::Attach`]); setting and reading a thread's policy and
/// CPUs is [`units::sched`]'s.
pub use units::sched::Policy;

/// What the calling thread runs with, read from the kernel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchedState {
    /// `None`: a policy none of [`Policy`] names.
    pub policy: Option<Policy>,
    pub priority: u32,
    pub cpus: CpuSet,
}

/// The calling thread's scheduling state could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SchedStateError {
    #[error(transparent)]
    Sched(#[from] SchedGetError),
    #[error(transparent)]
    Cpus(#[from] AffinityGetError),
}

/// Reads the calling thread's policy, priority and CPU affinity.
pub fn sched_state() -> Result<SchedState, SchedStateError> {
    let (policy, priority) = match sched::get_attr(0) {
        Ok(a) => (Some(a.policy), a.priority),
        Err(SchedGetError::UnknownPolicy { .. }) => (None, 0),
        Err(e) => return Err(e.into()),
    };
    Ok(SchedState {
        policy,
        priority,
        cpus: sched::get_affinity(0)?,
    })
}

/// What robot.yaml gives a process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchedExpectation {
    pub policy: Policy,
    pub priority: u32,
    /// Empty: any CPUs.
    pub cpus: CpuSet,
}

/// The process runs with other settings than robot.yaml gives it.
#[derive(Debug, thiserror::Error)]
pub enum RtCheckError {
    #[error("cannot read the scheduling state: {0}")]
    Read(SchedStateError),
    #[error("process runs with {}; expected {}", describe(.found), describe_expect(.expected))]
    Mismatch {
        found: SchedState,
        expected: SchedExpectation,
    },
}

fn describe(s: &SchedState) -> String {
    format!(
        "policy {:?} priority {} on CPUs {}",
        s.policy, s.priority, s.cpus
    )
}
fn describe_expect(s: &SchedExpectation) -> String {
    format!(
        "policy {:?} priority {} on CPUs {}",
        s.policy, s.priority, s.cpus
    )
}

/// Checks the calling thread against `expected`, reading everything back
/// from the kernel.
pub fn check_sched(expected: &SchedExpectation) -> Result<SchedState, RtCheckError> {
    let found = sched_state().map_err(RtCheckError::Read)?;
    let ok = found.policy == Some(expected.policy)
        && found.priority == expected.priority
        && (expected.cpus.is_empty() || found.cpus == expected.cpus);
    if ok {
        Ok(found)
    } else {
        Err(RtCheckError::Mismatch {
            found,
            expected: expected.clone(),
        })
    }
}

/// What the allocation trap does on this thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocTrap {
    /// Allocations pass through unseen.
    Off,
    /// Allocations pass through and are counted ([`allocations`]).
    Count,
    /// An allocation prints one line to stderr and aborts the process.
    Abort,
}

thread_local! {
    // const-initialised Cells need no destructor: accessing them never
    // allocates, which matters inside a global allocator.
    static TRAP: Cell<u8> = const { Cell::new(0) };
    static COUNT: Cell<u64> = const { Cell::new(0) };
}

/// Sets this thread's trap mode; returns the previous one.
pub fn set_alloc_trap(mode: AllocTrap) -> AllocTrap {
    let raw = match mode {
        AllocTrap::Off => 0,
        AllocTrap::Count => 1,
        AllocTrap::Abort => 2,
    };
    match TRAP.with(|t| t.replace(raw)) {
        1 => AllocTrap::Count,
        2 => AllocTrap::Abort,
        _ => AllocTrap::Off,
    }
}

/// Allocations (and reallocations) this thread made while its trap was in
/// `Count` mode.
pub fn allocations() -> u64 {
    COUNT.with(|c| c.get())
}

/// What the trap does for one allocation made by another allocator than
/// [`TrapAlloc`] (C's `malloc` interposed for C and C++ controllers, see
/// the C interface's `rtdeploy_malloc_trap.c`): counted or aborted as this
/// thread's mode says. Allocates nothing.
pub fn note_allocation() {
    on_alloc();
}

/// Sets a trap mode for a scope and restores the previous one on drop.
pub struct AllocTrapGuard(AllocTrap);

impl AllocTrapGuard {
    pub fn new(mode: AllocTrap) -> Self {
        AllocTrapGuard(set_alloc_trap(mode))
    }
}

impl Drop for AllocTrapGuard {
    fn drop(&mut self) {
        set_alloc_trap(self.0);
    }
}

/// A global allocator wrapper that traps allocations on threads that ask
/// for it. Opt in from a controller binary:
///
/// ```no_run
/// #[global_allocator]
/// static ALLOC: controller::rt::TrapAlloc<std::alloc::System> =
///     controller::rt::TrapAlloc(std::alloc::System);
/// # fn main() {}
/// ```
pub struct TrapAlloc<A>(pub A);

#[inline]
fn on_alloc() {
    // try_with: during thread teardown the TLS may be gone; then pass.
    let mode = TRAP.try_with(|t| t.get()).unwrap_or(0);
    match mode {
        1 => {
            let _ = COUNT.try_with(|c| c.set(c.get() + 1));
        }
        2 => {
            let msg = b"rtdeploy: heap allocation in a real-time section (allocation trap set to abort)\n";
            // SAFETY: writes a static buffer to fd 2; async-signal-safe and
            // allocation-free.
            unsafe { libc::write(2, msg.as_ptr() as *const libc::c_void, msg.len()) };
            std::process::abort();
        }
        _ => {}
    }
}

// SAFETY: every method forwards to the wrapped allocator with the same
// arguments and returns its result unchanged; the trap only counts or
// aborts before forwarding, and neither allocates.
unsafe impl<A: GlobalAlloc> GlobalAlloc for TrapAlloc<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        on_alloc();
        // SAFETY: the caller upholds `alloc`'s contract; forwarded as is.
        unsafe { self.0.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        on_alloc();
        // SAFETY: as above.
        unsafe { self.0.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { self.0.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        on_alloc();
        // SAFETY: as above.
        unsafe { self.0.realloc(ptr, layout, new_size) }
    }
}

/// A request to the kernel's PM QoS interface that no CPU take longer than
/// `value_us` to leave an idle state, held while this value lives: the
/// kernel drops the request when the file is closed
/// ([PM QoS](https://docs.kernel.org/power/pm_qos_interface.html)). The
/// supervisor holds `power.cpu_dma_latency` for its lifetime, the check
/// and the benchmarks hold one while they measure, and a controller may
/// hold its own.
#[derive(Debug)]
pub struct DmaLatencyHold {
    _file: File,
    path: PathBuf,
    value_us: u32,
}

/// A `/dev/cpu_dma_latency` request could not be made.
#[derive(Debug, thiserror::Error)]
pub enum DmaLatencyHoldError {
    #[error("cannot open {path}")]
    Open { path: PathBuf, source: io::Error },
    #[error("cannot write {value_us}us to {path}")]
    Write {
        path: PathBuf,
        value_us: u32,
        source: io::Error,
    },
}

impl DmaLatencyHold {
    /// Opens `path` (`<dev root>/cpu_dma_latency`, normally
    /// `/dev/cpu_dma_latency`; never created) and writes `value_us` as
    /// the binary `s32` the interface takes; values beyond `i32::MAX` are
    /// held as `i32::MAX`.
    pub fn hold(path: &Path, value_us: u32) -> Result<DmaLatencyHold, DmaLatencyHoldError> {
        let value_us = value_us.min(i32::MAX as u32);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(|source| DmaLatencyHoldError::Open {
                path: path.into(),
                source,
            })?;
        file.write_all(&(value_us as i32).to_ne_bytes())
            .map_err(|source| DmaLatencyHoldError::Write {
                path: path.into(),
                value_us,
                source,
            })?;
        Ok(DmaLatencyHold {
            _file: file,
            path: path.into(),
            value_us,
        })
    }

    /// The value held, in microseconds.
    pub fn value_us(&self) -> u32 {
        self.value_us
    }

    /// The file the request is held on.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The first `cgroup.procs` that exists among the places the CPU plan
/// creates the `rtdeploy/<leaf>` cgroup (`rt` or `housekeeping`): the
/// cgroup2 root, the hybrid `unified` mount, the cpuset v1 hierarchy, all
/// under `sys_root` (`/sys` on a robot).
pub fn find_cgroup(sys_root: &Path, leaf: &str) -> Option<PathBuf> {
    ["fs/cgroup", "fs/cgroup/unified", "fs/cgroup/cpuset"]
        .iter()
        .map(|base| {
            sys_root
                .join(base)
                .join("rtdeploy")
                .join(leaf)
                .join("cgroup.procs")
        })
        .find(|p| p.exists())
}

/// The CPUs a cgroup may use, from the cpuset file beside its
/// `cgroup.procs`: v2's `cpuset.cpus.effective`, else `cpuset.cpus`, else
/// v1's `cpuset.effective_cpus`.
fn cgroup_cpus(procs: &Path) -> Option<CpuSet> {
    let dir = procs.parent()?;
    [
        "cpuset.cpus.effective",
        "cpuset.cpus",
        "cpuset.effective_cpus",
    ]
    .iter()
    // units::bounded: a CPU list of 4096 CPUs is well under 64 KiB; a FIFO
    // is refused, not waited on.
    .filter_map(|f| {
        units::bounded::Bound::pseudo(64 << 10)
            .read_lossy(&dir.join(f))
            .ok()
    })
    .find(|t| !t.trim().is_empty())
    .and_then(|t| CpuSet::parse_list(&t).ok())
}

/// Moves the calling process into the rtdeploy cgroup (`rt`, then
/// `housekeeping`) whose CPUs hold every one of `cpus`, when the CPU plan
/// made one. Once an isolated partition takes CPUs away from the root
/// cgroup, a process left there cannot be pinned to them
/// (`sched_setaffinity` fails with EINVAL), so a process that is about to
/// pin itself to isolated CPUs joins their cgroup first. Returns the
/// `cgroup.procs` joined, or `None` when no such cgroup exists.
pub fn join_cgroup_holding(sys_root: &Path, cpus: &CpuSet) -> io::Result<Option<PathBuf>> {
    for leaf in ["rt", "housekeeping"] {
        let Some(procs) = find_cgroup(sys_root, leaf) else {
            continue;
        };
        let Some(allowed) = cgroup_cpus(&procs) else {
            continue;
        };
        if cpus.is_subset(&allowed) {
            // "0" names the writing process (cgroups(7)).
            std::fs::write(&procs, "0")?;
            return Ok(Some(procs));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    #[test]
    fn joins_the_cgroup_whose_cpus_hold_the_request() {
        let sys = tempfile::tempdir().unwrap();
        assert_eq!(find_cgroup(sys.path(), "rt"), None);
        let cpus = |list| CpuSet::parse_list(list).unwrap();
        assert_eq!(join_cgroup_holding(sys.path(), &cpus("2")).unwrap(), None);
        for (leaf, cpus) in [("rt", "2-3\n"), ("housekeeping", "0-1\n")] {
            let dir = sys.path().join("fs/cgroup/rtdeploy").join(leaf);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("cgroup.procs"), "").unwrap();
            std::fs::write(dir.join("cpuset.cpus.effective"), cpus).unwrap();
        }
        let rt = sys.path().join("fs/cgroup/rtdeploy/rt/cgroup.procs");
        let hk = sys
            .path()
            .join("fs/cgroup/rtdeploy/housekeeping/cgroup.procs");
        assert_eq!(
            join_cgroup_holding(sys.path(), &cpus("3")).unwrap(),
            Some(rt.clone())
        );
        assert_eq!(std::fs::read_to_string(&rt).unwrap(), "0");
        assert_eq!(
            join_cgroup_holding(sys.path(), &cpus("0,1")).unwrap(),
            Some(hk)
        );
        // CPUs split across both cgroups: neither holds them all.
        assert_eq!(join_cgroup_holding(sys.path(), &cpus("1,2")).unwrap(), None);
        assert_eq!(
            CpuSet::parse_list("0-2,5")
                .unwrap()
                .iter()
                .collect::<Vec<_>>(),
            vec![0, 1, 2, 5]
        );
    }

    use super::*;

    #[test]
    fn sched_state_reads_back_affinity() {
        let s = sched_state().unwrap();
        assert!(!s.cpus.is_empty());
        // Whatever we run with now passes a check that expects exactly it.
        let exp = SchedExpectation {
            policy: s.policy.unwrap(),
            priority: s.priority,
            cpus: s.cpus.clone(),
        };
        check_sched(&exp).unwrap();
        let wrong = SchedExpectation {
            priority: s.priority + 1,
            ..exp
        };
        let e = check_sched(&wrong).unwrap_err().to_string();
        assert!(e.contains("expected policy"), "{e}");
    }

    #[test]
    fn pinning_is_read_back_in_a_thread() {
        let cpus = sched_state().unwrap().cpus;
        let first: CpuSet = cpus.iter().take(1).collect();
        std::thread::spawn(move || {
            sched::set_affinity(0, &first).unwrap();
            assert_eq!(sched_state().unwrap().cpus, first);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn rttime_limit_is_set_and_read_back() {
        let before = rttime_limit();
        set_rttime_limit(Duration::from_millis(500), Duration::from_secs(1)).unwrap();
        assert_eq!(rttime_limit(), (Some(500_000), Some(1_000_000)));
        // Restoring a higher hard limit needs CAP_SYS_RESOURCE; best effort.
        let lim = libc::rlimit {
            rlim_cur: before.0.map_or(libc::RLIM_INFINITY, |v| v as libc::rlim_t),
            rlim_max: before.1.map_or(libc::RLIM_INFINITY, |v| v as libc::rlim_t),
        };
        // SAFETY: `lim` is valid for the call.
        unsafe { libc::setrlimit(libc::RLIMIT_RTTIME, &lim) };
    }

    #[test]
    fn dma_latency_is_written_as_an_s32_and_refused_without_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cpu_dma_latency");
        let e = DmaLatencyHold::hold(&path, 0).unwrap_err();
        assert!(matches!(e, DmaLatencyHoldError::Open { .. }), "{e:?}");
        assert_eq!(e.to_string(), format!("cannot open {}", path.display()));
        assert!(!path.exists(), "the device file is never created");
        std::fs::write(&path, b"").unwrap();
        let h = DmaLatencyHold::hold(&path, 20).unwrap();
        assert_eq!((h.value_us(), h.path()), (20, path.as_path()));
        assert_eq!(std::fs::read(&path).unwrap(), 20i32.to_ne_bytes());
        drop(h);
        let h = DmaLatencyHold::hold(&path, u32::MAX).unwrap();
        assert_eq!(h.value_us(), i32::MAX as u32);
    }

    #[test]
    fn prefault_runs() {
        prefault_stack(64 << 10);
        prefault_heap(1 << 20);
    }
}
