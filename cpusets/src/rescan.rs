//! Interrupts and IRQ threads that appear after the plan was applied.
//!
//! Some drivers request their interrupt only when a device is used: the
//! Jetson CAN controller (mttcan) requests it in `open` under the interface
//! name (`can0`), so the IRQ and its `irq/N-can0` thread exist only while
//! the interface is up; USB hotplug and drivers loaded late do the same.
//! The supervisor applies the plan once at start; it then keeps an
//! [`IrqWatch`] and, on each scan, applies the plan again when something
//! appeared (apply changes only what differs, so what was placed stays).
//!
//! A scan reads `/proc/interrupts` and the `comm` of each process under
//! `/proc`: files the kernel generates on the reading CPU (a housekeeping
//! CPU, where the supervisor runs), with no interrupt sent to the isolated
//! ones. What a scan misses (something that comes and goes between two)
//! `deploy verify` still reports.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::Path;

use crate::model::live::{read_interrupts, sys_path, ModelReadError};

/// The most processes a scan looks at: a bound on the work a strange
/// `/proc` can ask for.
const MAX_TASKS: usize = 65_536;

/// The numbered interrupts (with their actions) and the IRQ threads seen
/// by one scan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IrqWatch {
    /// `(irq, actions as /proc/interrupts prints them)`.
    irqs: BTreeSet<(u32, String)>,
    /// `(pid, comm)` of the `irq/*` kernel threads.
    threads: BTreeSet<(u32, String)>,
}

/// What appeared since an earlier scan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Appeared {
    pub irqs: Vec<(u32, String)>,
    pub threads: Vec<(u32, String)>,
}

impl Appeared {
    pub fn is_empty(&self) -> bool {
        self.irqs.is_empty() && self.threads.is_empty()
    }

    /// `IRQ 300 (can1), thread irq/300-can1 (pid 4242)`.
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = self
            .irqs
            .iter()
            .map(|(n, a)| {
                if a.is_empty() {
                    format!("IRQ {n}")
                } else {
                    format!("IRQ {n} ({a})")
                }
            })
            .collect();
        parts.extend(
            self.threads
                .iter()
                .map(|(pid, comm)| format!("thread {comm} (pid {pid})")),
        );
        parts.join(", ")
    }
}

impl IrqWatch {
    /// Scans `/proc/interrupts` and the `irq/*` threads under `sysroot`.
    pub fn read(sysroot: &Path) -> Result<IrqWatch, ModelReadError> {
        let interrupts = read_interrupts(&sys_path(sysroot, "/proc/interrupts"))?;
        let irqs = interrupts
            .rows
            .iter()
            .filter_map(|r| r.irq.map(|n| (n, r.actions().join(", "))))
            .collect();
        let proc_dir = sys_path(sysroot, "/proc");
        let rd = fs::read_dir(&proc_dir).map_err(|err| ModelReadError::Io {
            path: proc_dir.clone(),
            err,
        })?;
        let mut threads = BTreeSet::new();
        for e in rd.filter_map(Result::ok).take(MAX_TASKS) {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let comm_path = e.path().join("comm");
            // A comm is at most 16 bytes; no more than 64 of whatever
            // stands there is read (units::bounded: no wait on a FIFO, no
            // device read to its end; more is an error).
            let comm = match units::bounded::Bound::pseudo(64)
                .read(&comm_path)
                .map_err(|e| e.into_io())
            {
                Ok(c) => c,
                // Gone since the listing (ESRCH for a dying task).
                Err(err)
                    if err.kind() == io::ErrorKind::NotFound || err.raw_os_error() == Some(3) =>
                {
                    continue
                }
                Err(err) => {
                    return Err(ModelReadError::Io {
                        path: comm_path,
                        err,
                    })
                }
            };
            let comm = String::from_utf8_lossy(&comm).trim_end().to_string();
            if comm.starts_with("irq/") {
                threads.insert((pid, comm));
            }
        }
        Ok(IrqWatch { irqs, threads })
    }

    /// The next scan after `self`: `/proc/interrupts` again, and the walk
    /// over every task's `comm` only when its interrupts or their actions
    /// changed. A threaded handler's `irq/N-name` thread is made when its
    /// action is installed (and goes with it), so unchanged interrupts mean
    /// unchanged threads; the walk is the costly part (one open and read
    /// per task), and the supervisor scans every `irqs.rescan`.
    pub fn rescan(&self, sysroot: &Path) -> Result<IrqWatch, ModelReadError> {
        let interrupts = read_interrupts(&sys_path(sysroot, "/proc/interrupts"))?;
        let irqs: BTreeSet<(u32, String)> = interrupts
            .rows
            .iter()
            .filter_map(|r| r.irq.map(|n| (n, r.actions().join(", "))))
            .collect();
        if irqs == self.irqs {
            return Ok(self.clone());
        }
        IrqWatch::read(sysroot)
    }

    /// What `now` has that `self` had not.
    pub fn appeared(&self, now: &IrqWatch) -> Appeared {
        Appeared {
            irqs: now.irqs.difference(&self.irqs).cloned().collect(),
            threads: now.threads.difference(&self.threads).cloned().collect(),
        }
    }

    /// How many interrupts and IRQ threads the scan saw.
    pub fn counts(&self) -> (usize, usize) {
        (self.irqs.len(), self.threads.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(interrupts: &str, threads: &[(u32, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir_all(d.path().join("proc")).unwrap();
        fs::write(d.path().join("proc/interrupts"), interrupts).unwrap();
        for (pid, comm) in threads {
            let p = d.path().join(format!("proc/{pid}"));
            fs::create_dir_all(&p).unwrap();
            fs::write(p.join("comm"), format!("{comm}\n")).unwrap();
        }
        d
    }

    const BEFORE: &str = "           CPU0       CPU1\n 14:         10          0     GICv3  64 Level     mmc0\nIPI0:      5      5       Rescheduling interrupts\n";

    #[test]
    fn a_can_interface_brought_up_shows_its_irq_and_thread() {
        let t = tree(BEFORE, &[(1, "systemd"), (90, "irq/14-mmc0")]);
        let before = IrqWatch::read(t.path()).unwrap();
        assert_eq!(before.counts(), (1, 1));
        assert!(before.appeared(&before).is_empty());

        let t2 = tree(
            &format!("{BEFORE} 19:          0          0     GICv3  72 Level     can0\n"),
            &[(1, "systemd"), (90, "irq/14-mmc0"), (4242, "irq/19-can0")],
        );
        let now = IrqWatch::read(t2.path()).unwrap();
        let a = before.appeared(&now);
        assert_eq!(a.irqs, [(19, "can0".to_string())]);
        assert_eq!(a.threads, [(4242, "irq/19-can0".to_string())]);
        assert_eq!(a.describe(), "IRQ 19 (can0), thread irq/19-can0 (pid 4242)");
        // Gone again: nothing appeared.
        assert!(now.appeared(&before).is_empty());
    }

    #[test]
    fn a_rescan_walks_the_tasks_only_when_the_interrupts_changed() {
        let t = tree(BEFORE, &[(1, "systemd"), (90, "irq/14-mmc0")]);
        let first = IrqWatch::read(t.path()).unwrap();
        // A task that appears with the interrupts unchanged is not looked
        // for: the walk is skipped (an IRQ thread comes with its action).
        fs::create_dir_all(t.path().join("proc/91")).unwrap();
        fs::write(t.path().join("proc/91/comm"), "irq/14-mmc0\n").unwrap();
        let same = first.rescan(t.path()).unwrap();
        assert_eq!(same, first);
        // An action added: the walk runs and finds the new thread.
        fs::write(
            t.path().join("proc/interrupts"),
            format!("{BEFORE} 19:          0          0     GICv3  72 Level     can0\n"),
        )
        .unwrap();
        fs::create_dir_all(t.path().join("proc/4242")).unwrap();
        fs::write(t.path().join("proc/4242/comm"), "irq/19-can0\n").unwrap();
        let next = first.rescan(t.path()).unwrap();
        let a = first.appeared(&next);
        assert_eq!(a.irqs, [(19, "can0".to_string())]);
        assert_eq!(
            a.threads,
            [
                (91, "irq/14-mmc0".to_string()),
                (4242, "irq/19-can0".to_string())
            ]
        );
    }
}
