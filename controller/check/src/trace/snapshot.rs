//! A saved miss: the raw per-CPU text of the buffer with a header that
//! says which message it is about, beside its trace-event JSON; reading
//! one back (`deploy trace show`), and keeping at most N of them.
//!
//! The text file is what the kernel printed, per CPU, after a header:
//!
//! ```text
//! # rtdeploy trace v1
//! # rtdeploy context {"mechanism":"io_uring","seq":41,...}
//! # rtdeploy cpu 1
//! # tracer: nop
//!          rt-send-900     [001] d..2.   99.999990: sched_switch: ...
//! ```
//!
//! so that any tool that reads ftrace text reads it too (the header lines
//! are comments to it).

use std::path::{Path, PathBuf};

use super::analyse::{analyse, Analysis, MissContext};
use super::chrome::trace_events;
use super::model::{line_ts, parse, Parsed};

/// The first line of a saved trace.
pub const MAGIC: &str = "# rtdeploy trace v1";
const CONTEXT: &str = "# rtdeploy context ";
const CPU: &str = "# rtdeploy cpu ";
/// A saved trace larger than this is refused.
pub const MAX_FILE: u64 = 64 << 20;
/// The context line is at most this long.
const MAX_CONTEXT: usize = 1 << 20;

/// Why a saved trace cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceLoadError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is larger than {max} bytes")]
    TooLarge { path: PathBuf, max: u64 },
    #[error("{path} is not a saved rtdeploy trace (its first line is not `{MAGIC}`)")]
    NotATrace { path: PathBuf },
    #[error("{path}: no `{CONTEXT}` line (the message the trace is about)")]
    NoContext { path: PathBuf },
    #[error("{path}:{line}: bad context")]
    BadContext {
        path: PathBuf,
        line: usize,
        source: serde_json::Error,
    },
    #[error("{path}:{line}: `{text}` is not a CPU number")]
    BadCpu {
        path: PathBuf,
        line: usize,
        text: String,
    },
}

/// Why a snapshot could not be saved.
#[derive(Debug, thiserror::Error)]
pub enum TraceSaveError {
    #[error("cannot create {path}")]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// One miss: its context and each CPU's buffer text.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub context: MissContext,
    pub cpus: Vec<(u32, String)>,
}

impl Snapshot {
    /// The saved text (header and per-CPU text).
    pub fn to_text(&self) -> String {
        let mut o = String::new();
        o.push_str(MAGIC);
        o.push('\n');
        o.push_str(CONTEXT);
        o.push_str(&serde_json::to_string(&self.context).unwrap_or_default());
        o.push('\n');
        for (cpu, text) in &self.cpus {
            o.push_str(&format!("{CPU}{cpu}\n"));
            o.push_str(text);
            if !text.ends_with('\n') {
                o.push('\n');
            }
        }
        o
    }

    /// Reads the saved text back; `path` is for the messages.
    pub fn from_text(path: &Path, text: &str) -> Result<Snapshot, TraceLoadError> {
        let mut lines = text.split('\n');
        if lines.next().map(|l| l.trim_end()) != Some(MAGIC) {
            return Err(TraceLoadError::NotATrace { path: path.into() });
        }
        let mut context = None;
        let mut cpus: Vec<(u32, String)> = vec![];
        for (i, line) in lines.enumerate() {
            let n = i + 2;
            if let Some(c) = line.strip_prefix(CONTEXT) {
                if c.len() > MAX_CONTEXT {
                    return Err(TraceLoadError::BadContext {
                        path: path.into(),
                        line: n,
                        source: serde::de::Error::custom("longer than 1 MiB"),
                    });
                }
                context = Some(serde_json::from_str::<MissContext>(c).map_err(|source| {
                    TraceLoadError::BadContext {
                        path: path.into(),
                        line: n,
                        source,
                    }
                })?);
            } else if let Some(c) = line.strip_prefix(CPU) {
                let cpu = c.trim().parse().map_err(|_| TraceLoadError::BadCpu {
                    path: path.into(),
                    line: n,
                    text: c.chars().take(40).collect(),
                })?;
                cpus.push((cpu, String::new()));
            } else if let Some((_, t)) = cpus.last_mut() {
                t.push_str(line);
                t.push('\n');
            }
        }
        let context = context.ok_or_else(|| TraceLoadError::NoContext { path: path.into() })?;
        Ok(Snapshot { context, cpus })
    }

    /// Every CPU's events, parsed.
    pub fn parsed(&self) -> Parsed {
        let mut all = Parsed::default();
        for (_, text) in &self.cpus {
            let p = parse(text);
            all.events.extend(p.events);
            all.skipped += p.skipped;
        }
        all
    }

    pub fn analyse(&self) -> (Analysis, Parsed) {
        let p = self.parsed();
        let mut a = analyse(&p.events, &self.context);
        if p.skipped > 0 {
            a.limits.push(format!(
                "{} lines of the trace were not events and were skipped",
                p.skipped
            ));
        }
        (a, p)
    }
}

/// Keeps the comment lines of `text` and its event lines from `from_ns`
/// to `to_ns` (the window with some context around it); lines without a
/// timestamp go.
pub fn trim(text: &str, from_ns: u64, to_ns: u64) -> String {
    let mut out = String::with_capacity(text.len().min(1 << 20));
    for line in text.lines() {
        let keep = if line.trim_start().starts_with('#') {
            true
        } else {
            line_ts(line).is_some_and(|t| t >= from_ns && t <= to_ns)
        };
        if keep {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The files of one saved miss.
#[derive(Debug, Clone)]
pub struct Saved {
    pub text: PathBuf,
    pub json: PathBuf,
}

/// Saves `snap` in `dir` as `miss-<unix ms>-<mechanism>-seq<seq>.txt` and
/// `.json`, then removes the oldest beyond `keep`.
pub fn save(
    dir: &Path,
    snap: &Snapshot,
    a: &Analysis,
    parsed: &Parsed,
    keep: usize,
) -> Result<Saved, TraceSaveError> {
    std::fs::create_dir_all(dir).map_err(|source| TraceSaveError::Dir {
        path: dir.into(),
        source,
    })?;
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let mech: String = snap
        .context
        .mechanism
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .take(16)
        .collect();
    let stem = format!("miss-{ms:013}-{mech}-seq{}", snap.context.seq);
    let text = dir.join(format!("{stem}.txt"));
    let json = dir.join(format!("{stem}.json"));
    let doc = trace_events(&parsed.events, a);
    let write = |p: &Path, bytes: &[u8]| {
        std::fs::write(p, bytes).map_err(|source| TraceSaveError::Write {
            path: p.into(),
            source,
        })
    };
    write(&text, snap.to_text().as_bytes())?;
    let mut j = serde_json::to_vec(&doc).unwrap_or_default();
    j.push(b'\n');
    write(&json, &j)?;
    rotate(dir, keep.max(1));
    Ok(Saved { text, json })
}

/// Removes the oldest saved misses in `dir` beyond `keep` (by name, which
/// starts with the time), of each kind: timer wakes (`-timer-seq`) and
/// deliveries count apart, so a run's many late messages do not remove
/// what its timer phase found.
pub fn rotate(dir: &Path, keep: usize) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut stems: Vec<String> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with("miss-") && n.ends_with(".txt"))
        .map(|n| n.trim_end_matches(".txt").to_string())
        .take(100_000)
        .collect();
    stems.sort();
    let (timers, deliveries): (Vec<String>, Vec<String>) =
        stems.into_iter().partition(|s| s.contains("-timer-seq"));
    for group in [timers, deliveries] {
        let excess = group.len().saturating_sub(keep);
        for s in &group[..excess] {
            let _ = std::fs::remove_file(dir.join(format!("{s}.txt")));
            let _ = std::fs::remove_file(dir.join(format!("{s}.json")));
        }
    }
}

/// Reads at most `max` bytes of `path`: an error when it holds more.
pub fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>, TraceLoadError> {
    let rerr = |source| TraceLoadError::Read {
        path: path.into(),
        source,
    };
    // units::bounded: a FIFO or a device is refused, not waited on.
    units::bounded::Bound::regular(max)
        .following_links()
        .read(path)
        .map_err(|e| match e {
            units::bounded::FileReadError::TooLarge { .. } => TraceLoadError::TooLarge {
                path: path.into(),
                max,
            },
            e => rerr(e.into_io()),
        })
}

/// Loads a saved miss (its `.txt`, or its `.json` when the `.txt` is
/// beside it) and analyses it again.
pub fn load(path: &Path) -> Result<(Snapshot, Analysis), TraceLoadError> {
    let text_path = if path.extension().is_some_and(|e| e == "json") {
        path.with_extension("txt")
    } else {
        path.to_path_buf()
    };
    let bytes = read_bounded(&text_path, MAX_FILE)?;
    let text = String::from_utf8_lossy(&bytes);
    let snap = Snapshot::from_text(&text_path, &text)?;
    let (a, _) = snap.analyse();
    Ok((snap, a))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::analyse::MissKind;

    fn snap() -> Snapshot {
        Snapshot {
            context: MissContext {
                kind: Default::default(),
                mechanism: "io_uring".into(),
                seq: 3,
                send_ns: 100_000_000_000,
                handler_ns: 100_000_500_000,
                budget_ns: 100_000,
                sender_pid: 900,
                sender_cpu: 1,
                receiver_pid: 901,
                receiver_cpu: 1,
                policies: [(777, "FIFO".to_string())].into_iter().collect(),
                complete_since_ns: None,
            },
            cpus: vec![(
                1,
                "# tracer: nop\n         rt-send-900     [001] d..2.  100.000001: sched_switch: prev_comm=rt-send prev_pid=900 prev_prio=19 prev_state=R+ ==> next_comm=spin next_pid=777 next_prio=18\n          spin-777     [001] d..2.  100.000490: sched_switch: prev_comm=spin prev_pid=777 prev_prio=18 prev_state=S ==> next_comm=rt-recv next_pid=901 next_prio=19\n".into(),
            )],
        }
    }

    #[test]
    fn saved_and_shown_again_gives_the_same_verdict() {
        let dir = tempfile::tempdir().unwrap();
        let s = snap();
        let (a, p) = s.analyse();
        assert!(
            a.verdict.contains("spin (FIFO 81, pid 777) ran"),
            "{}",
            a.verdict
        );
        let saved = save(dir.path(), &s, &a, &p, 2).unwrap();
        let (back, a2) = load(&saved.text).unwrap();
        assert_eq!(back.context, s.context);
        assert_eq!(a2.verdict, a.verdict);
        let (_, a3) = load(&saved.json).unwrap();
        assert_eq!(a3.verdict, a.verdict);
        let doc: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&saved.json).unwrap()).unwrap();
        assert!(doc["traceEvents"].as_array().unwrap().len() > 3);
    }

    #[test]
    fn at_most_keep_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let s = snap();
        let (a, p) = s.analyse();
        for seq in 0..5 {
            let mut s = s.clone();
            s.context.seq = seq;
            save(dir.path(), &s, &a, &p, 3).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let names = |ext: &str| {
            let mut v: Vec<String> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|n| n.ends_with(ext))
                .collect();
            v.sort();
            v
        };
        let all = names("");
        assert_eq!(all.len(), 6, "{all:?}");
        assert!(all[0].ends_with("-seq2.json"), "{all:?}");
        // Timer misses are kept apart: two of them stay however many
        // deliveries follow, and the deliveries keep their three.
        for (kind, mech, seq) in [
            (MissKind::Timer, "timer", 10),
            (MissKind::Timer, "timer", 11),
            (MissKind::Delivery, "io_uring", 12),
            (MissKind::Delivery, "io_uring", 13),
        ] {
            let mut s = s.clone();
            s.context.kind = kind;
            s.context.mechanism = mech.into();
            s.context.seq = seq;
            save(dir.path(), &s, &a, &p, 3).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let names = names(".txt");
        let seqs: Vec<&str> = names
            .iter()
            .map(|n| &n[n.rfind("-seq").unwrap() + 4..n.len() - 4])
            .collect();
        assert_eq!(seqs, ["4", "10", "11", "12", "13"], "{names:?}");
        assert!(names[1].contains("-timer-seq10"), "{names:?}");
    }

    #[test]
    fn corrupt_saved_traces_are_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.txt");
        std::fs::write(&p, "not a trace\n").unwrap();
        let e = load(&p).unwrap_err().to_string();
        assert!(e.contains("is not a saved rtdeploy trace"), "{e}");
        std::fs::write(&p, format!("{MAGIC}\n# rtdeploy cpu 1\n")).unwrap();
        assert!(matches!(load(&p), Err(TraceLoadError::NoContext { .. })));
        std::fs::write(&p, format!("{MAGIC}\n{CONTEXT}{{\"seq\": \n")).unwrap();
        let e = load(&p).unwrap_err();
        assert!(e.to_string().ends_with("x.txt:2: bad context"), "{e}");
        std::fs::write(&p, format!("{MAGIC}\n# rtdeploy cpu one\n")).unwrap();
        assert!(matches!(
            load(&p),
            Err(TraceLoadError::BadCpu { line: 2, .. })
        ));
        let e = load(&dir.path().join("none.txt")).unwrap_err();
        assert!(matches!(e, TraceLoadError::Read { .. }));
        // Garbage event lines: analysed, counted as skipped.
        let mut text = snap().to_text();
        text.push_str("\u{fffd}\u{fffd} [[[ 1.2: x\n");
        std::fs::write(&p, text).unwrap();
        let (_, a) = load(&p).unwrap();
        assert!(
            a.limits.iter().any(|l| l.contains("1 lines")),
            "{:?}",
            a.limits
        );
    }

    #[test]
    fn trimming_keeps_the_window_and_the_comments() {
        let text = "# tracer: nop\n  a-1 [001] .... 99.000000: sched_switch: x\n  a-1 [001] .... 100.000000: tracing_mark_write: rtdeploy send seq=1 t=1\n  a-1 [001] .... 101.000000: sched_switch: x\ngarbage\n";
        let t = trim(text, 99_500_000_000, 100_500_000_000);
        assert_eq!(
            t,
            "# tracer: nop\n  a-1 [001] .... 100.000000: tracing_mark_write: rtdeploy send seq=1 t=1\n"
        );
    }

    #[test]
    fn reads_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("big.txt");
        std::fs::write(&p, vec![b'x'; 100]).unwrap();
        assert!(matches!(
            read_bounded(&p, 99),
            Err(TraceLoadError::TooLarge { max: 99, .. })
        ));
        assert_eq!(read_bounded(&p, 100).unwrap().len(), 100);
    }
}
