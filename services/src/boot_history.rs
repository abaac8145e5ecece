//! The boot checks kept over time: `var/lib/rtdeploy/boot-check-history.jsonl`,
//! one JSON object per line ([`BootRecord`]), oldest first, at most
//! `boot_check.history` lines. The supervisor's boot check appends to it
//! (read, append, keep the last N, write a temporary file, fsync, rename);
//! `deploy check --history` reads it and shows the trend ([`trend`]).
//!
//! The file lives on the robot's disk and may be damaged (a power cut on a
//! file system without data journaling, a hand edit): reading is bounded
//! ([`MAX_FILE_BYTES`], [`MAX_LINE_BYTES`], through [`units::bounded`]:
//! a FIFO or a device there is refused), a line that is not a record is
//! skipped with a note naming its line number, never an error (the first
//! [`MAX_NOTES`] of them, then their count), and a figure that cannot be
//! a boot check's ([`plausible_ns`]) is dropped with a note. Every
//! comparison of figures saturates: none wraps.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The most of the file read: the newest end of it. 1000 records
/// (`boot_check.history` at most) of a few hundred bytes fit well.
pub const MAX_FILE_BYTES: u64 = 4 << 20;

/// A longer line is not a record.
pub const MAX_LINE_BYTES: usize = 16 << 10;

/// Notes kept about skipped lines and dropped figures; the rest are
/// counted ([`History::skipped`]).
pub const MAX_NOTES: usize = 20;

/// The longest latency a boot check can report, in nanoseconds: a day. A
/// boot check holds the robot's start for its duration (seconds), so a
/// delivery later than this was not measured by one.
pub const MAX_PLAUSIBLE_NS: u64 = 86_400 * 1_000_000_000;

/// Strings kept per field, and failed budgets kept per record.
const MAX_TEXT: usize = 256;
const MAX_FAILED: usize = 16;
/// Bytes kept of a fallback's reason and of the watchdog's state.
const MAX_REASON: usize = 1024;

/// One boot check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootRecord {
    /// When it ran, seconds since the Unix epoch.
    pub unix_time: u64,
    /// `uname -r`.
    pub kernel: String,
    /// The release `opt/rtdeploy/current` named (absent without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<String>,
    /// `pass`, `fail`, or `error` (the check could not run).
    pub verdict: String,
    /// The real-time delivery's 99th percentile and longest, nanoseconds
    /// (absent when the check measured none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p99_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ns: Option<u64>,
    /// The budgets that failed, or why the check could not run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<String>,
    /// What the boot loader counted at this boot of a system update
    /// (`update.boot_attempts`): the attempt it was, or the fallback it
    /// booted (absent when no update was being counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_loader: Option<BootAttempt>,
    /// The fallback this boot is: the release rolled back at its start and
    /// why (absent on a boot that rolled nothing back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
    /// The hardware watchdog as the kernel showed it during the boot, before
    /// the supervisor took it (robot.yaml `watchdog:`; absent without one):
    /// running or not, with its timeout ([`crate::watchdog::at_boot`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watchdog: Option<String>,
    /// A Jetson's rootfs A/B slots at this boot: the one running, the
    /// retry counts, a slot the firmware gave up on
    /// ([`crate::rootfs_slots`]; absent without A/B).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs_slots: Option<String>,
}

/// A boot of a system update as the boot loader counted it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootAttempt {
    /// The update's boot loader label.
    pub label: String,
    /// Boots of that label started, this one included; `limit + 1` once the
    /// boot loader gave up on it.
    pub attempts: u8,
    pub limit: u8,
    /// The boot loader booted the previous label: the attempts ran out.
    pub fell_back: bool,
}

impl BootAttempt {
    /// `attempt 1 of 3 of label L`, or `gave up on label L after 3 boots`.
    pub fn describe(&self) -> String {
        if self.fell_back {
            format!(
                "gave up on label {} after {} boot(s) and booted the previous label",
                self.label, self.limit
            )
        } else {
            format!(
                "attempt {} of {} of label {}",
                self.attempts, self.limit, self.label
            )
        }
    }
}

impl From<&releases::boot_attempts::BootLoaderSaw> for BootAttempt {
    fn from(b: &releases::boot_attempts::BootLoaderSaw) -> BootAttempt {
        BootAttempt {
            label: b.label.clone(),
            attempts: b.attempts,
            limit: b.limit,
            fell_back: b.fell_back,
        }
    }
}

impl BootRecord {
    /// Cuts what came from outside to the sizes the file keeps.
    fn bounded(mut self) -> BootRecord {
        let cut = |s: &mut String| cut_to(s, MAX_TEXT);
        cut(&mut self.kernel);
        cut(&mut self.verdict);
        if let Some(r) = &mut self.release {
            cut(r);
        }
        if let Some(b) = &mut self.boot_loader {
            cut(&mut b.label);
        }
        for s in [
            &mut self.fallback,
            &mut self.watchdog,
            &mut self.rootfs_slots,
        ]
        .into_iter()
        .flatten()
        {
            cut_to(s, MAX_REASON);
        }
        self.failed.truncate(MAX_FAILED);
        self.failed.iter_mut().for_each(cut);
        self
    }

    /// Drops figures that cannot be a boot check's ([`plausible_ns`]);
    /// says why when it did.
    fn plausible(mut self) -> (BootRecord, Option<String>) {
        match plausible_ns(self.p99_ns, self.max_ns) {
            Ok(()) => (self, None),
            Err(why) => {
                self.p99_ns = None;
                self.max_ns = None;
                (self, Some(why.to_string()))
            }
        }
    }
}

/// Cuts `s` to at most `max` bytes, on a character boundary.
fn cut_to(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

/// Why a record's figures cannot be a boot check's ([`plausible_ns`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BootFiguresCheckError {
    #[error("{what} {ns} ns is longer than a day, which no boot check measures")]
    LongerThanADay { what: &'static str, ns: u64 },
    #[error("p99 {p99} ns is longer than its max {max} ns, which cannot be")]
    P99AboveMax { p99: u64, max: u64 },
}

/// Whether a record's p99 and longest can be a boot check's: each at most
/// [`MAX_PLAUSIBLE_NS`], and the 99th percentile no longer than the
/// longest. `Err` says which does not hold.
pub fn plausible_ns(p99: Option<u64>, max: Option<u64>) -> Result<(), BootFiguresCheckError> {
    for (what, v) in [("p99", p99), ("max", max)] {
        if let Some(v) = v.filter(|&v| v > MAX_PLAUSIBLE_NS) {
            return Err(BootFiguresCheckError::LongerThanADay { what, ns: v });
        }
    }
    if let (Some(p), Some(m)) = (p99, max) {
        if p > m {
            return Err(BootFiguresCheckError::P99AboveMax { p99: p, max: m });
        }
    }
    Ok(())
}

/// What [`read`] found: the records, oldest first, and what was skipped.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct History {
    pub records: Vec<BootRecord>,
    /// One line per skipped part of the file (the first [`MAX_NOTES`]).
    pub notes: Vec<String>,
    /// Lines skipped and records whose figures were dropped, all of them
    /// (`notes` lists the first).
    pub skipped: usize,
}

impl History {
    /// Notes a skipped line or dropped figure: the first [`MAX_NOTES`] in
    /// words, every one counted.
    fn skip(&mut self, note: String) {
        self.skipped += 1;
        if self.notes.len() < MAX_NOTES {
            self.notes.push(note);
        }
    }

    /// The notes to show: those kept, then how many more there were.
    pub fn shown_notes(&self) -> Vec<String> {
        let mut v = self.notes.clone();
        let listed = self.notes.iter().filter(|n| n.starts_with("line ")).count();
        let lines = self.skipped;
        if lines > listed {
            v.push(format!(
                "{} more line(s) skipped or figures dropped (the first {listed} are listed)",
                lines - listed
            ));
        }
        v
    }
}

/// Reading the history failed (a missing file is an empty history).
#[derive(Debug, thiserror::Error)]
#[error("cannot read the boot check history {}", path.display())]
pub struct BootHistoryReadError {
    pub path: PathBuf,
    pub source: std::io::Error,
}

/// Writing the history failed.
#[derive(Debug, thiserror::Error)]
pub enum BootHistoryWriteError {
    #[error(transparent)]
    Read(#[from] BootHistoryReadError),
    #[error("cannot write the boot check history {}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Parses the text of a history file: every line that is a record, notes
/// for the others.
pub fn parse(text: &[u8]) -> History {
    let mut h = History::default();
    for (i, line) in text.split(|&b| b == b'\n').enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let n = i + 1;
        if line.len() > MAX_LINE_BYTES {
            h.skip(format!(
                "line {n}: {} bytes, longer than a record can be ({MAX_LINE_BYTES}): skipped",
                line.len()
            ));
            continue;
        }
        match serde_json::from_slice::<BootRecord>(line) {
            Ok(r) => {
                let (r, why) = r.bounded().plausible();
                if let Some(why) = why {
                    h.skip(format!("line {n}: {why}: its figures are dropped"));
                }
                h.records.push(r);
            }
            Err(e) => h.skip(format!("line {n}: not a boot record ({e}): skipped")),
        }
    }
    h
}

/// Reads the history at `path`: at most its last [`MAX_FILE_BYTES`].
pub fn read(path: &Path) -> Result<History, BootHistoryReadError> {
    let err = |source| BootHistoryReadError {
        path: path.to_path_buf(),
        source,
    };
    let tail = match units::bounded::Bound::regular(MAX_FILE_BYTES).read_tail(path) {
        Ok(t) => t,
        Err(e) if e.is_not_found() => return Ok(History::default()),
        Err(e) => return Err(err(e.into_io())),
    };
    let buf = tail.bytes;
    let mut from = 0;
    if tail.skipped > 0 {
        // The first line read is likely the tail of one: start after it.
        from = buf
            .iter()
            .position(|&b| b == b'\n')
            .map_or(buf.len(), |p| p + 1);
    }
    let mut h = parse(&buf[from..]);
    if tail.skipped > 0 {
        h.notes.insert(
            0,
            format!(
                "the file is {} bytes: only its last {MAX_FILE_BYTES} were read (line numbers count from there)",
                tail.skipped + buf.len() as u64
            ),
        );
    }
    Ok(h)
}

/// Appends `record` to the history at `path`, keeping the last `keep`
/// records; the file is replaced atomically (temporary file in the same
/// directory, fsync, rename, fsync of the directory). Returns what the
/// read skipped of the old file (those lines are dropped): the notes and
/// their count.
pub fn append(
    path: &Path,
    record: BootRecord,
    keep: usize,
) -> Result<(Vec<String>, usize), BootHistoryWriteError> {
    let mut h = read(path)?;
    h.records.push(record.bounded().plausible().0);
    let keep = keep.max(1);
    if h.records.len() > keep {
        let drop = h.records.len() - keep;
        h.records.drain(..drop);
    }
    let mut text = Vec::new();
    for r in &h.records {
        serde_json::to_writer(&mut text, r).expect("records serialize");
        text.push(b'\n');
    }
    write_atomic(path, &text).map_err(|source| BootHistoryWriteError::Write {
        path: path.to_path_buf(),
        source,
    })?;
    Ok((h.notes, h.skipped))
}

/// Writes `bytes` to `path` via a temporary file beside it, fsync and
/// rename(2), then fsyncs the directory: a reader sees the old file or
/// the new one, also after a power cut.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .map_or("file".into(), |n| n.to_string_lossy());
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Consecutive boots with the same kernel and release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Era {
    pub kernel: String,
    pub release: Option<String>,
    /// Indexes into the records, first and last.
    pub first: usize,
    pub last: usize,
    /// Medians over the era's boots that measured.
    pub p99_ns: Option<u64>,
    pub max_ns: Option<u64>,
    pub failed: usize,
    pub boots: usize,
}

/// A change of kernel or release after which the boot checks got worse.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Regression {
    /// `release` or `kernel` or `kernel and release`.
    pub changed: String,
    pub from: String,
    pub to: String,
    /// The first boot of the new era (index into the records).
    pub at: usize,
    /// What got worse, one phrase each.
    pub worse: Vec<String>,
}

/// The trend: eras of kernel and release, and the changes that made it
/// worse.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Trend {
    pub eras: Vec<Era>,
    pub regressions: Vec<Regression>,
}

fn median(mut v: Vec<u64>) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    Some(v[(v.len() - 1) / 2])
}

/// A figure is worse when its median over the new era's boots rose by
/// more than a quarter and by more than 2 µs (smaller moves are the noise
/// of a few-second check).
fn rose(before: Option<u64>, after: Option<u64>) -> Option<(u64, u64)> {
    let (b, a) = (before?, after?);
    // Saturating: a figure near u64::MAX (a damaged file) must not wrap
    // into a small bound that a fall would pass.
    (a > b.saturating_add(b / 4) && a > b.saturating_add(2_000)).then_some((b, a))
}

/// Groups the records into eras and compares each era with the one before.
pub fn trend(records: &[BootRecord]) -> Trend {
    let mut eras: Vec<Era> = Vec::new();
    for (i, r) in records.iter().enumerate() {
        match eras.last_mut() {
            Some(e) if e.kernel == r.kernel && e.release == r.release => e.last = i,
            _ => eras.push(Era {
                kernel: r.kernel.clone(),
                release: r.release.clone(),
                first: i,
                last: i,
                p99_ns: None,
                max_ns: None,
                failed: 0,
                boots: 0,
            }),
        }
    }
    for e in &mut eras {
        let rs = &records[e.first..=e.last];
        e.boots = rs.len();
        e.failed = rs.iter().filter(|r| r.verdict != "pass").count();
        e.p99_ns = median(rs.iter().filter_map(|r| r.p99_ns).collect());
        e.max_ns = median(rs.iter().filter_map(|r| r.max_ns).collect());
    }
    let mut regressions = Vec::new();
    for w in eras.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        let mut worse = Vec::new();
        if let Some((x, y)) = rose(a.p99_ns, b.p99_ns) {
            worse.push(format!("p99 {} -> {}", fmt_us(x), fmt_us(y)));
        }
        if let Some((x, y)) = rose(a.max_ns, b.max_ns) {
            worse.push(format!("max {} -> {}", fmt_us(x), fmt_us(y)));
        }
        if a.failed == 0 && b.failed > 0 {
            worse.push(format!(
                "{} of {} boot(s) failed, none before",
                b.failed, b.boots
            ));
        }
        if worse.is_empty() {
            continue;
        }
        let rel = |r: &Option<String>| r.clone().unwrap_or_else(|| "(none)".into());
        let (changed, from, to) = match (a.kernel != b.kernel, a.release != b.release) {
            (true, true) => (
                "kernel and release",
                format!("{} / {}", a.kernel, rel(&a.release)),
                format!("{} / {}", b.kernel, rel(&b.release)),
            ),
            (true, false) => ("kernel", a.kernel.clone(), b.kernel.clone()),
            _ => ("release", rel(&a.release), rel(&b.release)),
        };
        regressions.push(Regression {
            changed: changed.into(),
            from,
            to,
            at: b.first,
            worse,
        });
    }
    Trend { eras, regressions }
}

/// Microseconds with one decimal.
pub fn fmt_us(ns: u64) -> String {
    format!("{:.1}us", ns as f64 / 1000.0)
}

/// `YYYY-MM-DD HH:MM:SS` UTC of a Unix time.
pub fn fmt_utc(unix: u64) -> String {
    let t = releases::utc::utc(unix);
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}",
        t.year, t.month, t.day, t.hour, t.minute, t.second
    )
}

/// The text `deploy check --history` prints.
pub fn render(h: &History) -> String {
    let mut out = String::new();
    for n in h.shown_notes() {
        out.push_str(&format!("note: {n}\n"));
    }
    if h.records.is_empty() {
        out.push_str("no boot check recorded yet\n");
        return out;
    }
    out.push_str(&format!(
        "{:<19}  {:<20} {:<24} {:<7} {:>9} {:>9}\n",
        "WHEN (UTC)", "RELEASE", "KERNEL", "VERDICT", "P99", "MAX"
    ));
    let t = trend(&h.records);
    for (i, r) in h.records.iter().enumerate() {
        if let Some(g) = t.regressions.iter().find(|g| g.at == i) {
            out.push_str(&format!(
                "-- worse after the {} changed ({} -> {}): {}\n",
                g.changed,
                g.from,
                g.to,
                g.worse.join(", ")
            ));
        }
        out.push_str(&format!(
            "{:<19}  {:<20} {:<24} {:<7} {:>9} {:>9}{}\n",
            fmt_utc(r.unix_time),
            r.release.as_deref().unwrap_or("-"),
            r.kernel,
            r.verdict,
            r.p99_ns.map_or("-".into(), fmt_us),
            r.max_ns.map_or("-".into(), fmt_us),
            if r.failed.is_empty() {
                String::new()
            } else {
                format!("  {}", r.failed.join(", "))
            }
        ));
        // Beneath the row: the boot loader's count and the fallback when
        // there was one, the watchdog when it is not as the boot before.
        let watchdog_changed = match i.checked_sub(1).map(|j| &h.records[j]) {
            Some(prev) => prev.watchdog != r.watchdog,
            None => true,
        };
        for (what, text) in [
            (
                "boot loader",
                r.boot_loader.as_ref().map(BootAttempt::describe),
            ),
            ("fell back", r.fallback.clone()),
            ("watchdog", r.watchdog.clone().filter(|_| watchdog_changed)),
            ("rootfs slots", r.rootfs_slots.clone()),
        ] {
            if let Some(t) = text {
                out.push_str(&format!("{:21}{what}: {t}\n", ""));
            }
        }
    }
    if t.regressions.is_empty() {
        out.push_str(&format!(
            "{} boot check(s); no kernel or release change made them worse\n",
            h.records.len()
        ));
    }
    if let Some(r) = h.records.iter().rev().find(|r| r.fallback.is_some()) {
        out.push_str(&format!(
            "last fallback: {}: {}\n",
            fmt_utc(r.unix_time),
            r.fallback.as_deref().unwrap_or_default()
        ));
    }
    for g in &t.regressions {
        out.push_str(&format!(
            "the {} {} made it worse than {}: {}\n",
            g.changed,
            g.to,
            g.from,
            g.worse.join(", ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(
        t: u64,
        kernel: &str,
        release: &str,
        verdict: &str,
        p99_us: u64,
        max_us: u64,
    ) -> BootRecord {
        BootRecord {
            unix_time: t,
            kernel: kernel.into(),
            release: Some(release.into()),
            verdict: verdict.into(),
            p99_ns: Some(p99_us * 1000),
            max_ns: Some(max_us * 1000),
            failed: if verdict == "fail" {
                vec!["check.budgets.delivery_max".into()]
            } else {
                vec![]
            },
            boot_loader: None,
            fallback: None,
            watchdog: None,
            rootfs_slots: None,
        }
    }

    #[test]
    fn a_boot_loaders_count_a_fallback_and_the_watchdog_are_kept_and_shown() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.jsonl");
        // A line of a history written before these fields still reads.
        std::fs::write(
            &path,
            "{\"unix_time\":100,\"kernel\":\"k\",\"release\":\"4-a\",\"verdict\":\"pass\"}\n",
        )
        .unwrap();
        let wd = "/dev/watchdog (i6300ESB timer): active, timeout 120s";
        let mut tried = rec(200, "k", "5-b", "pass", 10, 20);
        tried.boot_loader = Some(BootAttempt {
            label: "rtdeploy-release-5-b".into(),
            attempts: 1,
            limit: 1,
            fell_back: false,
        });
        tried.watchdog = Some(wd.into());
        let mut back = rec(300, "k", "4-a", "pass", 10, 20);
        back.boot_loader = Some(BootAttempt {
            attempts: 2,
            fell_back: true,
            ..tried.boot_loader.clone().unwrap()
        });
        back.fallback = Some(format!("5-b rolled back to 4-a: {}", "why ".repeat(400)));
        back.watchdog = Some(wd.into());
        back.rootfs_slots = Some(
            "running slot A; slot B unbootable: the firmware gave up on it after its retries and booted A".into(),
        );
        for r in [tried, back] {
            append(&path, r, 10).unwrap();
        }
        let h = read(&path).unwrap();
        assert!(h.notes.is_empty(), "{:?}", h.notes);
        assert_eq!(h.records.len(), 3);
        assert_eq!(h.records[0].boot_loader, None);
        // The reason is cut to what the file keeps.
        assert_eq!(h.records[2].fallback.as_ref().unwrap().len(), MAX_REASON);
        let text = render(&h);
        assert!(
            text.contains("boot loader: attempt 1 of 1 of label rtdeploy-release-5-b\n"),
            "{text}"
        );
        assert!(
            text.contains("boot loader: gave up on label rtdeploy-release-5-b after 1 boot(s) and booted the previous label\n"),
            "{text}"
        );
        assert!(
            text.contains("fell back: 5-b rolled back to 4-a: why why"),
            "{text}"
        );
        // The watchdog is said where it changed, not on every boot.
        assert_eq!(text.matches("watchdog: ").count(), 1, "{text}");
        assert!(
            text.contains(
                "rootfs slots: running slot A; slot B unbootable: the firmware gave up on it"
            ),
            "{text}"
        );
        assert!(
            text.contains("last fallback: 1970-01-01 00:05:00: 5-b rolled back to 4-a: why"),
            "{text}"
        );
        let none = render(&History {
            records: vec![rec(1, "k", "1", "pass", 1, 2)],
            notes: vec![],
            skipped: 0,
        });
        assert!(!none.contains("fallback"), "{none}");
    }

    #[test]
    fn append_keeps_the_last_n_and_replaces_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("var/lib/rtdeploy/boot-check-history.jsonl");
        for i in 0..5 {
            let (notes, _) =
                append(&path, rec(i, "6.1.0-rt", "1-aaaaaaaa", "pass", 10, 20), 3).unwrap();
            assert!(notes.is_empty(), "{notes:?}");
        }
        let h = read(&path).unwrap();
        assert_eq!(
            h.records.iter().map(|r| r.unix_time).collect::<Vec<_>>(),
            [2, 3, 4]
        );
        // No temporary file left beside it.
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn a_missing_file_is_an_empty_history() {
        let dir = tempfile::tempdir().unwrap();
        let h = read(&dir.path().join("none.jsonl")).unwrap();
        assert!(h.records.is_empty() && h.notes.is_empty());
        assert!(render(&h).contains("no boot check recorded yet"));
    }

    #[test]
    fn corrupt_lines_are_skipped_with_a_note_and_dropped_on_append() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.jsonl");
        let good = serde_json::to_string(&rec(1, "k", "r", "pass", 10, 20)).unwrap();
        let long = format!("{{\"kernel\":\"{}\"}}", "x".repeat(MAX_LINE_BYTES));
        let text = format!("{good}\n\0\0\0garbage\n{{\"unix_time\":-1}}\n\n{long}\n{good}");
        std::fs::write(&path, text).unwrap();
        let h = read(&path).unwrap();
        assert_eq!(h.records.len(), 2);
        assert_eq!(h.notes.len(), 3, "{:?}", h.notes);
        assert!(
            h.notes[0].starts_with("line 2: not a boot record"),
            "{}",
            h.notes[0]
        );
        assert!(h.notes[2].starts_with("line 5: "), "{}", h.notes[2]);
        let (notes, skipped) = append(&path, rec(2, "k", "r", "pass", 10, 20), 10).unwrap();
        assert_eq!((notes.len(), skipped), (3, 3));
        assert_eq!(
            read(&path).unwrap(),
            History {
                records: vec![
                    rec(1, "k", "r", "pass", 10, 20),
                    rec(1, "k", "r", "pass", 10, 20),
                    rec(2, "k", "r", "pass", 10, 20)
                ],
                notes: vec![],
                skipped: 0,
            }
        );
    }

    #[test]
    fn two_million_bad_lines_give_twenty_notes_and_a_count() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.jsonl");
        let good = serde_json::to_string(&rec(1, "k", "r", "pass", 10, 20)).unwrap();
        let mut text = "x\n".repeat(2_000_000);
        text.push_str(&good);
        std::fs::write(&path, text).unwrap();
        let h = read(&path).unwrap();
        assert_eq!(h.records.len(), 1);
        assert_eq!(h.notes.len(), MAX_NOTES);
        assert_eq!(h.skipped, 2_000_000);
        let shown = h.shown_notes();
        assert_eq!(shown.len(), MAX_NOTES + 1);
        assert_eq!(
            shown[MAX_NOTES],
            "1999980 more line(s) skipped or figures dropped (the first 20 are listed)"
        );
        let text = render(&h);
        assert!(text.len() < 8 << 10, "{} bytes of report", text.len());
    }

    #[test]
    fn figures_near_u64_max_neither_wrap_nor_count() {
        // A fall from near u64::MAX compared with wrapping arithmetic
        // passed for a rise (and panicked in a debug build).
        let near = u64::MAX - 10;
        assert_eq!(rose(Some(near), Some(100_000)), None);
        assert_eq!(rose(Some(near), Some(u64::MAX)), None);
        assert_eq!(rose(Some(10_000), Some(near)), Some((10_000, near)));
        // Read from a file, such figures cannot be a boot check's: dropped
        // with a note, so no era compares them.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.jsonl");
        let mut bad = rec(1, "k", "1", "pass", 10, 20);
        bad.p99_ns = Some(near);
        bad.max_ns = Some(u64::MAX);
        let mut upside_down = rec(2, "k", "1", "pass", 10, 20);
        upside_down.p99_ns = Some(30_000);
        let text = [bad, upside_down, rec(3, "k", "2", "pass", 10, 20)]
            .iter()
            .map(|r| serde_json::to_string(r).unwrap() + "\n")
            .collect::<String>();
        std::fs::write(&path, text).unwrap();
        let h = read(&path).unwrap();
        assert_eq!(h.records.len(), 3);
        assert_eq!((h.records[0].p99_ns, h.records[0].max_ns), (None, None));
        assert_eq!(h.records[1].p99_ns, None);
        assert_eq!(
            h.notes,
            [
                "line 1: p99 18446744073709551605 ns is longer than a day, which no boot check measures: its figures are dropped",
                "line 2: p99 30000 ns is longer than its max 20000 ns, which cannot be: its figures are dropped",
            ]
        );
        let t = trend(&h.records);
        assert!(t.regressions.is_empty(), "{t:#?}");
    }

    #[test]
    fn a_huge_file_is_read_from_its_end_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.jsonl");
        let good = serde_json::to_string(&rec(7, "k", "r", "pass", 10, 20)).unwrap();
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&vec![b'x'; MAX_FILE_BYTES as usize + 100])
            .unwrap();
        f.write_all(format!("\n{good}\n").as_bytes()).unwrap();
        drop(f);
        let h = read(&path).unwrap();
        assert_eq!(h.records.len(), 1);
        assert!(h.notes[0].contains("only its last"), "{:?}", h.notes);
    }

    #[test]
    fn oversized_fields_are_cut() {
        let mut r = rec(1, &"k".repeat(1000), "r", "fail", 1, 2);
        r.failed = vec!["é".repeat(500); 100];
        let r = r.bounded();
        assert_eq!(r.kernel.len(), MAX_TEXT);
        assert_eq!(r.failed.len(), MAX_FAILED);
        assert!(r.failed[0].len() <= MAX_TEXT);
    }

    #[test]
    fn the_release_that_made_it_worse_is_named() {
        let rs = vec![
            rec(100, "6.1.0-rt", "1-aaaaaaaa", "pass", 10, 20),
            rec(200, "6.1.0-rt", "1-aaaaaaaa", "pass", 11, 22),
            rec(300, "6.1.0-rt", "2-bbbbbbbb", "fail", 40, 90),
            rec(400, "6.1.0-rt", "2-bbbbbbbb", "fail", 42, 95),
            // A new kernel that changes nothing worth saying.
            rec(500, "6.1.1-rt", "2-bbbbbbbb", "fail", 41, 96),
        ];
        let t = trend(&rs);
        assert_eq!(t.eras.len(), 3);
        assert_eq!(t.regressions.len(), 1, "{t:#?}");
        let g = &t.regressions[0];
        assert_eq!(
            (g.changed.as_str(), g.from.as_str(), g.to.as_str(), g.at),
            ("release", "1-aaaaaaaa", "2-bbbbbbbb", 2)
        );
        assert_eq!(
            g.worse,
            [
                "p99 10.0us -> 40.0us",
                "max 20.0us -> 90.0us",
                "2 of 2 boot(s) failed, none before"
            ]
        );
        let text = render(&History {
            records: rs,
            notes: vec![],
            skipped: 0,
        });
        assert!(
            text.contains(
                "the release 2-bbbbbbbb made it worse than 1-aaaaaaaa: p99 10.0us -> 40.0us"
            ),
            "{text}"
        );
        assert!(text.contains("1970-01-01 00:05:00"), "{text}");
    }

    #[test]
    fn small_moves_and_improvements_are_not_regressions() {
        let rs = vec![
            rec(1, "a", "1", "pass", 10, 20),
            rec(2, "b", "1", "pass", 11, 21),
            rec(3, "b", "2", "pass", 5, 10),
        ];
        assert!(trend(&rs).regressions.is_empty());
        let rs = vec![
            rec(1, "a", "1", "pass", 10, 20),
            rec(2, "b", "1", "pass", 30, 21),
        ];
        let t = trend(&rs);
        assert_eq!(t.regressions[0].changed, "kernel");
        assert_eq!(t.regressions[0].worse, ["p99 10.0us -> 30.0us"]);
    }

    #[test]
    fn utc_dates() {
        assert_eq!(fmt_utc(0), "1970-01-01 00:00:00");
        assert_eq!(fmt_utc(951_782_400), "2000-02-29 00:00:00");
        assert_eq!(fmt_utc(1_796_170_306), "2026-12-02 00:11:46");
    }
}
