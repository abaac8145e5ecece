//! The run's surroundings: its unique names (and their removal), what the
//! machine permits (SCHED_FIFO, `/dev/cpu_dma_latency`), and the notes
//! that say what was not as asked.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use serde::Serialize;

use controller::rt::{self, DmaLatencyHold};
use units::sched::{self, Policy, SchedAttr};

use crate::role::Names;
use crate::settings::Settings;

/// Where shared memory lives.
const SHM: &str = "/dev/shm";
/// Our channels' directory of run `<pid>`: `/dev/shm/rtdeploy-peers-<pid>`.
const OURS_DIR_PREFIX: &str = "rtdeploy-peers-";
/// iceoryx2's file prefix of run `<pid>`: `rtdpeers<pid>_`.
const IOX_PREFIX: &str = "rtdpeers";
/// iceoryx2's root path of run `<pid>`: `/tmp/rtdeploy-peers-<pid>/`.
const IOX_ROOT_PARENT: &str = "/tmp";

/// What the run found and holds.
#[derive(Debug, Serialize)]
pub struct Host {
    pub kernel: String,
    /// CPUs this process may use.
    pub allowed_cpus: Vec<usize>,
    /// The SCHED_FIFO priority the sides get (`None`: SCHED_OTHER).
    pub priority: Option<u32>,
    /// `/dev/cpu_dma_latency` held at 0 during the run.
    pub cpu_dma_latency_held: bool,
    /// What differs from what was asked, and what a run left.
    pub notes: Vec<String>,
    /// Per measured CPU, the share of its time the hypervisor gave to
    /// others during the run (steal, from /proc/stat), in percent.
    pub steal_percent: Vec<(usize, f64)>,
    /// /proc/loadavg's 1-minute figure at the start and at the end: the
    /// other work on the machine.
    pub load_average: (f64, f64),
    #[serde(skip)]
    stat_start: Vec<(usize, CpuTimes)>,
    #[serde(skip)]
    pub names: Names,
    #[serde(skip)]
    _dma: Option<DmaLatencyHold>,
}

fn names_of(pid: u32) -> Names {
    Names {
        ours_dir: Path::new(SHM).join(format!("{OURS_DIR_PREFIX}{pid}")),
        iox_prefix: format!("{IOX_PREFIX}{pid}_"),
        iox_root: format!("{IOX_ROOT_PARENT}/{OURS_DIR_PREFIX}{pid}/"),
    }
}

/// The CPUs this process may run on.
pub fn allowed_cpus() -> Result<Vec<usize>> {
    Ok(rt::sched_state()
        .context("reading this process's CPU affinity")?
        .cpus
        .iter()
        .map(|c| c as usize)
        .collect())
}

/// The pid a leftover of an earlier run is named after, if `name` is one.
fn leftover_pid(name: &str) -> Option<u32> {
    let digits = name
        .strip_prefix(OURS_DIR_PREFIX)
        .or_else(|| name.strip_prefix(IOX_PREFIX))?;
    let end = digits
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    let rest = &digits[end..];
    if end == 0 || !(rest.is_empty() || rest.starts_with('_')) {
        return None;
    }
    digits[..end].parse().ok()
}

/// Removes what runs whose process is gone left in `dir` (a run killed
/// before its own cleanup); returns how many entries.
fn sweep(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = leftover_pid(&name) else {
            continue;
        };
        if Path::new("/proc").join(pid.to_string()).exists() {
            continue;
        }
        if remove(&e.path()) {
            removed += 1;
        }
    }
    removed
}

fn remove(path: &Path) -> bool {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path).is_ok(),
        Ok(_) => std::fs::remove_file(path).is_ok(),
        Err(_) => false,
    }
}

impl Host {
    /// Names the run, sweeps what killed runs left, probes SCHED_FIFO and
    /// holds `/dev/cpu_dma_latency` at 0 where permitted.
    pub fn prepare(s: &Settings) -> Result<Host> {
        let mut notes = Vec::new();
        let swept = sweep(Path::new(SHM)) + sweep(Path::new(IOX_ROOT_PARENT));
        if swept > 0 {
            notes.push(format!(
                "removed {swept} leftovers of earlier runs that were killed before their cleanup"
            ));
        }
        let names = names_of(std::process::id());
        std::fs::create_dir_all(&names.ours_dir)
            .with_context(|| format!("creating {}", names.ours_dir.display()))?;
        let priority = match s.priority {
            None => None,
            Some(p) => match sched::set_attr(0, &SchedAttr::new(Policy::Fifo, p)) {
                Ok(()) => {
                    // The parent itself only waits: back to SCHED_OTHER.
                    sched::set_attr(0, &SchedAttr::new(Policy::Other, 0))
                        .context("returning to SCHED_OTHER")?;
                    Some(p)
                }
                Err(e) => {
                    notes.push(format!(
                        "SCHED_FIFO {p} is not permitted here ({}): every side runs SCHED_OTHER",
                        units::error::Chain(&e)
                    ));
                    None
                }
            },
        };
        let dma = match DmaLatencyHold::hold(Path::new("/dev/cpu_dma_latency"), 0) {
            Ok(h) => Some(h),
            Err(e) => {
                notes.push(format!(
                    "/dev/cpu_dma_latency not held ({}): idle states may add wake latency to both sides",
                    units::error::Chain(&e)
                ));
                None
            }
        };
        let cpus = [s.sender_cpu, s.receiver_cpu];
        let stat_start = cpus
            .iter()
            .filter_map(|&c| cpu_times(c).map(|t| (c, t)))
            .collect();
        Ok(Host {
            steal_percent: Vec::new(),
            load_average: (load_average(), 0.0),
            stat_start,
            kernel: controller::kernel::release(),
            allowed_cpus: allowed_cpus()?,
            priority,
            cpu_dma_latency_held: dma.is_some(),
            notes,
            names,
            _dma: dma,
        })
    }

    /// Takes the end of run figures (steal, load) and removes the run's
    /// files ([`Host::clean`]).
    pub fn conclude(&mut self) {
        self.load_average.1 = load_average();
        for (cpu, start) in &self.stat_start {
            if let Some(end) = cpu_times(*cpu) {
                let total = end.total.saturating_sub(start.total);
                if total > 0 {
                    let steal = end.steal.saturating_sub(start.steal);
                    self.steal_percent
                        .push((*cpu, 100.0 * steal as f64 / total as f64));
                }
            }
        }
        if self.steal_percent.iter().any(|&(_, p)| p >= 0.5) {
            let each: Vec<String> = self
                .steal_percent
                .iter()
                .map(|(c, p)| format!("CPU {c} {p:.1}%"))
                .collect();
            self.notes.push(format!(
                "the hypervisor gave {} of the run's time to others (steal): a side whose vCPU it pauses waits for it",
                each.join(", ")
            ));
        }
        self.clean();
    }

    /// Removes the run's files: our channel directory, iceoryx2's root
    /// path and its shared memory (by prefix); what iceoryx2 had left
    /// after its processes ended is said in a note.
    pub fn clean(&mut self) {
        let left = self.remove_files();
        if let Some(first) = left.first() {
            self.notes.push(format!(
                "removed {} files iceoryx2 left after its processes ended (e.g. {})",
                left.len(),
                first.display()
            ));
        }
    }

    /// [`Host::clean`]'s removals; returns the iceoryx2 entries found.
    fn remove_files(&self) -> Vec<PathBuf> {
        let _ = std::fs::remove_dir_all(&self.names.ours_dir);
        let mut left = Vec::new();
        let root = PathBuf::from(self.names.iox_root.trim_end_matches('/'));
        if root.exists() {
            left.extend(walk_files(&root));
            let _ = std::fs::remove_dir_all(&root);
        }
        if let Ok(entries) = std::fs::read_dir(SHM) {
            for e in entries.flatten() {
                if e.file_name()
                    .to_string_lossy()
                    .starts_with(&self.names.iox_prefix)
                {
                    left.push(e.path());
                    remove(&e.path());
                }
            }
        }
        left
    }
}

/// A CPU's times from /proc/stat, in ticks.
#[derive(Debug, Clone, Copy)]
struct CpuTimes {
    total: u64,
    steal: u64,
}

/// `cpuN`'s line of /proc/stat (user nice system idle iowait irq softirq
/// steal ...).
fn cpu_times(cpu: usize) -> Option<CpuTimes> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    parse_cpu_times(&text, cpu)
}

fn parse_cpu_times(stat: &str, cpu: usize) -> Option<CpuTimes> {
    let want = format!("cpu{cpu}");
    let line = stat
        .lines()
        .find(|l| l.split_whitespace().next() == Some(want.as_str()))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    (v.len() == 8).then(|| CpuTimes {
        total: v.iter().sum(),
        steal: v[7],
    })
}

/// /proc/loadavg's 1-minute figure (0 when unreadable).
fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// Every file under `dir`.
fn walk_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(e.path()),
                Ok(_) => out.push(e.path()),
                Err(_) => {}
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leftovers_are_recognised_by_their_run_s_pid() {
        assert_eq!(leftover_pid("rtdeploy-peers-1234"), Some(1234));
        assert_eq!(leftover_pid("rtdpeers1234_iox2_abc.data"), Some(1234));
        assert_eq!(leftover_pid("rtdpeers1234x"), None);
        assert_eq!(leftover_pid("rtdeploy-peers-"), None);
        assert_eq!(leftover_pid("rtdeploy"), None);
        assert_eq!(leftover_pid("iox2_something"), None);
    }

    #[test]
    fn a_dead_run_s_leftovers_are_swept_and_a_live_one_s_kept() {
        let dir = tempfile_dir();
        // pid 0x7fffffff: no such process.
        let dead = dir.join("rtdpeers2147483647_svc.data");
        let live = dir.join(format!("rtdpeers{}_svc.data", std::process::id()));
        let other = dir.join("somebody-else");
        for p in [&dead, &live, &other] {
            std::fs::write(p, b"x").unwrap();
        }
        assert_eq!(sweep(&dir), 1);
        assert!(!dead.exists() && live.exists() && other.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn steal_is_the_eighth_field_of_a_cpu_s_line() {
        let stat =
            "cpu  9 9 9 9 9 9 9 9 0 0\ncpu0 10 1 5 80 2 0 1 3 0 0\ncpu1 1 2 3 4 5 6 7 8 0 0\n";
        let t = parse_cpu_times(stat, 0).unwrap();
        assert_eq!((t.total, t.steal), (102, 3));
        assert_eq!(parse_cpu_times(stat, 1).unwrap().steal, 8);
        assert!(parse_cpu_times(stat, 2).is_none());
    }

    fn tempfile_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("peers-test-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
