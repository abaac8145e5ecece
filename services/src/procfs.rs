//! What the kernel says a process runs with: `/proc/<pid>/stat` and
//! `/proc/<pid>/status`, parsed (pure) and read (under a caller-supplied
//! proc root).

use std::path::{Path, PathBuf};

use serde::Serialize;
use units::cpu::{CpuSet, CpuSetParseError};

/// Why a process's proc files could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ProcReadError {
    #[error("cannot read {}: {err}", path.display())]
    Read { path: PathBuf, err: std::io::Error },
    #[error("cannot parse {}: {err}", path.display())]
    Parse { path: PathBuf, err: ProcParseError },
}

/// Why the text of `/proc/<pid>/stat` or `/proc/<pid>/status` did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProcParseError {
    #[error("no `(` before the command name")]
    NoCommandStart,
    #[error("no `)` after the command name")]
    NoCommandEnd,
    #[error("pid `{0}` is not a number")]
    Pid(String),
    #[error("field {0} missing")]
    MissingField(usize),
    #[error("field {field} `{text}` is not a number")]
    NotANumber { field: usize, text: String },
    #[error("Cpus_allowed_list: {0}")]
    CpusAllowed(CpuSetParseError),
    #[error("no Cpus_allowed_list line")]
    NoCpusAllowed,
}

/// The fields of `/proc/<pid>/stat` the supervisor uses (see proc(5)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    pub pid: i32,
    pub comm: String,
    /// `R`, `S`, `D`, `Z`, ...
    pub state: char,
    pub ppid: i32,
    pub pgrp: i32,
    /// Clock ticks in user and kernel mode.
    pub utime: u64,
    pub stime: u64,
    pub nice: i64,
    /// Clock ticks after boot.
    pub starttime: u64,
    pub rt_priority: u32,
    /// `SCHED_*` number.
    pub policy: u32,
}

/// Parses `/proc/<pid>/stat`. The command name may contain spaces and
/// parentheses, so fields are counted from the last `)`.
pub fn parse_stat(text: &str) -> Result<Stat, ProcParseError> {
    let open = text.find('(').ok_or(ProcParseError::NoCommandStart)?;
    let close = text.rfind(')').ok_or(ProcParseError::NoCommandEnd)?;
    let pid = text[..open].trim();
    let pid = pid
        .parse()
        .map_err(|_| ProcParseError::Pid(pid.to_string()))?;
    let comm = text[open + 1..close].to_string();
    let rest: Vec<&str> = text[close + 1..].split_whitespace().collect();
    let state = rest.first().ok_or(ProcParseError::MissingField(3))?;
    Ok(Stat {
        pid,
        comm,
        state: state.chars().next().unwrap_or('?'),
        ppid: stat_field(&rest, 4)?,
        pgrp: stat_field(&rest, 5)?,
        utime: stat_field(&rest, 14)?,
        stime: stat_field(&rest, 15)?,
        nice: stat_field(&rest, 19)?,
        starttime: stat_field(&rest, 22)?,
        rt_priority: stat_field::<u64>(&rest, 40)? as u32,
        policy: stat_field::<u64>(&rest, 41)? as u32,
    })
}

/// Field `n` of a stat line (numbered from 1 as in proc(5)), given the
/// fields after the command name (`rest[0]` is field 3, the state).
fn stat_field<T: std::str::FromStr>(rest: &[&str], n: usize) -> Result<T, ProcParseError> {
    let text = rest.get(n - 3).ok_or(ProcParseError::MissingField(n))?;
    text.parse().map_err(|_| ProcParseError::NotANumber {
        field: n,
        text: text.to_string(),
    })
}

/// The fields of `/proc/<pid>/status` the supervisor uses.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Status {
    pub cpus_allowed: CpuSet,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// Parses `/proc/<pid>/status`; a `Cpus_allowed_list` line is required.
pub fn parse_status(text: &str) -> Result<Status, ProcParseError> {
    let mut s = Status::default();
    let mut seen_cpus = false;
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match key {
            "Cpus_allowed_list" => {
                s.cpus_allowed = CpuSet::parse_list(value).map_err(ProcParseError::CpusAllowed)?;
                seen_cpus = true;
            }
            "Uid" => {
                s.uid = value
                    .split_whitespace()
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(u32::MAX)
            }
            "Gid" => {
                s.gid = value
                    .split_whitespace()
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(u32::MAX)
            }
            "Groups" => {
                s.groups = value
                    .split_whitespace()
                    .filter_map(|v| v.parse().ok())
                    .collect()
            }
            _ => {}
        }
    }
    if !seen_cpus {
        return Err(ProcParseError::NoCpusAllowed);
    }
    Ok(s)
}

/// The scheduling attributes in force, as the kernel reports them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InForce {
    /// `fifo`, `rr`, `other`, `batch`, `idle`, `deadline`.
    pub policy: String,
    pub priority: u32,
    pub nice: i64,
    /// The CPU list, kernel form.
    pub cpus: String,
    pub uid: u32,
    pub gid: u32,
}

/// The name of a `SCHED_*` number.
pub fn policy_name(policy: u32) -> &'static str {
    match policy {
        0 => "other",
        1 => "fifo",
        2 => "rr",
        3 => "batch",
        5 => "idle",
        6 => "deadline",
        _ => "unknown",
    }
}

/// The most read of a process's `stat` or `status` (a few hundred bytes).
pub const MAX_PROC_FILE: u64 = 64 << 10;

fn read(path: PathBuf) -> Result<String, ProcReadError> {
    units::bounded::Bound::pseudo(MAX_PROC_FILE)
        .read_lossy(&path)
        .map_err(|e| ProcReadError::Read {
            path,
            err: e.into_io(),
        })
}

/// Reads and parses `<proc>/<pid>/stat`.
pub fn read_stat(proc_root: &Path, pid: i32) -> Result<Stat, ProcReadError> {
    let path = proc_root.join(pid.to_string()).join("stat");
    let text = read(path.clone())?;
    parse_stat(&text).map_err(|err| ProcReadError::Parse { path, err })
}

/// Reads and parses `<proc>/<pid>/status`.
pub fn read_status(proc_root: &Path, pid: i32) -> Result<Status, ProcReadError> {
    let path = proc_root.join(pid.to_string()).join("status");
    let text = read(path.clone())?;
    parse_status(&text).map_err(|err| ProcReadError::Parse { path, err })
}

/// Policy, priority, nice, CPUs and ids of a live process.
pub fn in_force(proc_root: &Path, pid: i32) -> Result<InForce, ProcReadError> {
    let stat = read_stat(proc_root, pid)?;
    let status = read_status(proc_root, pid)?;
    Ok(InForce {
        policy: policy_name(stat.policy).to_string(),
        priority: stat.rt_priority,
        nice: stat.nice,
        cpus: status.cpus_allowed.to_string(),
        uid: status.uid,
        gid: status.gid,
    })
}

/// Every pid in `<proc>` whose parent is `ppid`.
pub fn children_of(proc_root: &Path, ppid: i32) -> Vec<Stat> {
    let Ok(dir) = std::fs::read_dir(proc_root) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| read_stat(proc_root, pid).ok())
        .filter(|s| s.ppid == ppid)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Captured from a SCHED_FIFO 50 process on a 6.x kernel.
    const STAT: &str = "4242 (imu (reader)) S 1 4242 4242 0 -1 4194560 100 0 0 0 12 34 0 0 -51 0 1 0 987654 2211840 200 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 50 1 0 0 0 0 0 0 0 0 0 0 0\n";

    #[test]
    fn parses_stat_with_odd_comm() {
        let s = parse_stat(STAT).unwrap();
        assert_eq!(s.pid, 4242);
        assert_eq!(s.comm, "imu (reader)");
        assert_eq!(s.state, 'S');
        assert_eq!((s.ppid, s.pgrp), (1, 4242));
        assert_eq!((s.utime, s.stime), (12, 34));
        assert_eq!(s.nice, 0);
        assert_eq!(s.starttime, 987654);
        assert_eq!((s.rt_priority, s.policy), (50, 1));
        assert!(parse_stat("12 (x) S 1").is_err());
    }

    #[test]
    fn parses_status() {
        let s = parse_status("Name:\tx\nUid:\t1000\t1000\t1000\t1000\nGid:\t900\t900\t900\t900\nGroups:\t900 27 \nCpus_allowed_list:\t2-3\n").unwrap();
        assert_eq!(s.cpus_allowed.to_string(), "2-3");
        assert_eq!((s.uid, s.gid), (1000, 900));
        assert_eq!(s.groups, vec![900, 27]);
        assert!(parse_status("Name:\tx\n").is_err());
    }

    #[test]
    fn reads_own_process() {
        let me = std::process::id() as i32;
        let f = in_force(Path::new("/proc"), me).unwrap();
        assert!(!f.cpus.is_empty());
        assert_eq!(read_stat(Path::new("/proc"), me).unwrap().pid, me);
    }

    #[test]
    fn parse_errors_name_what_is_wrong() {
        assert_eq!(
            parse_stat("12 (x) S 1"),
            Err(ProcParseError::MissingField(5))
        );
        assert_eq!(
            parse_stat("x (y) S 1 2").unwrap_err().to_string(),
            "pid `x` is not a number"
        );
        assert_eq!(
            parse_stat("12 (y) S one 2").unwrap_err().to_string(),
            "field 4 `one` is not a number"
        );
        assert_eq!(
            parse_stat("12 y) S").unwrap_err(),
            ProcParseError::NoCommandStart
        );
        assert_eq!(
            parse_status("Name:\tx\n").unwrap_err().to_string(),
            "no Cpus_allowed_list line"
        );
        assert!(parse_status("Cpus_allowed_list:\t3-1\n")
            .unwrap_err()
            .to_string()
            .starts_with("Cpus_allowed_list: "));
    }

    #[test]
    fn a_read_error_says_its_cause_once() {
        let dir = tempfile::tempdir().unwrap();
        let e = read_stat(dir.path(), 1).unwrap_err();
        assert!(e.to_string().ends_with("(os error 2)"), "{e}");
        assert!(std::error::Error::source(&e).is_none(), "{e}");
    }
}
