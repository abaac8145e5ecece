//! The logger: a thread of the supervisor that reads the recorded channels
//! and the supervisor's events and writes them to rotating MCAP files.
//!
//! It stays off the real-time path: it reads channels as a fetcher (no
//! subscriber entry, never armed, so no publisher ever pays a wake for
//! it, and no lock a publisher takes), polls them every `log.poll` from a
//! thread pinned to the housekeeping CPUs, and compresses and syncs there.
//! A message overwritten before the logger read it is recorded as a gap
//! on `/rtdeploy/log/gaps` with its count, as is an event the supervisor
//! could not hand over (a bounded queue, never a blocked supervisor). A
//! write that fails (a full disk) stops the logger; the status says why.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use controller::{Channel, Subscriber};
use serde::{Deserialize, Serialize};

use crate::file::{
    ClockMap, LogFile, TopicSpec, EVENTS_TOPIC, GAPS_TOPIC, META_MAX_SIZE, META_TYPE,
    META_TYPE_ALIGN, META_TYPE_HASH, META_TYPE_SIZE, RAW_ENCODING, SENDERS_TOPIC, TIMING_ENCODING,
};
use crate::section::LogSection;

/// Events the supervisor may have queued for the logger at once; more
/// are dropped and counted as a gap of the events topic.
pub const EVENT_QUEUE: usize = 4096;
/// How often channels not open yet (a process's timing channel before it
/// starts) are looked for.
const REOPEN: Duration = Duration::from_secs(1);

/// What the logger is given.
#[derive(Debug, Clone)]
pub struct RecorderConfig {
    pub section: LogSection,
    /// Where files go (the section's `dir` under the prefix).
    pub dir: PathBuf,
    pub shm_dir: PathBuf,
    /// Channels that may be recorded (robot.yaml's channels and the
    /// processes' timing channels); the section's globs pick among them.
    pub channels: Vec<String>,
    /// `/proc/sys/kernel/random/boot_id`, recorded with the clock mapping.
    pub boot_id: String,
    /// Housekeeping CPUs to pin the logger's thread to (none: inherit).
    pub cpus: Vec<usize>,
    /// Read each channel from its first message (what the channel no
    /// longer holds is a gap), as the supervisor's logger does on the
    /// channels it just created; else from the next message published.
    pub from_oldest: bool,
}

/// One supervisor event.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// `start`, `exit`, `restart`, `crash_loop`, `budget`, `boot_check`,
    /// `trial`, `commit`, `rollback`, `supervisor`.
    pub kind: &'static str,
    pub process: Option<String>,
    pub message: String,
    pub monotonic_ns: u64,
}

/// Hands events to the logger without ever blocking.
#[derive(Debug, Clone)]
pub struct EventSink {
    tx: SyncSender<Event>,
    dropped: Arc<AtomicU64>,
}

impl EventSink {
    pub fn send(&self, kind: &'static str, process: Option<&str>, message: &str) {
        let ev = Event {
            kind,
            process: process.map(str::to_string),
            message: message.to_string(),
            monotonic_ns: controller::Monotonic::now().as_nanos(),
        };
        match self.tx.try_send(ev) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Per channel counts.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ChannelCounts {
    pub logged: u64,
    /// Messages overwritten before the logger read them (recorded as gaps).
    pub gaps: u64,
    pub faults: u64,
}

/// What `deploy status` shows of the logger.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LogStatus {
    /// `recording`, or `stopped: WHY`.
    pub state: String,
    pub dir: PathBuf,
    pub file: Option<PathBuf>,
    pub files_written: u64,
    pub bytes_written: u64,
    pub files_deleted: u64,
    pub events_logged: u64,
    pub events_dropped: u64,
    pub channels: BTreeMap<String, ChannelCounts>,
    /// The last problem that did not stop the logger (a channel fault, a
    /// file the quota could not delete).
    pub last_problem: Option<String>,
    /// CPU time the logger's thread used (reading, compressing, writing).
    pub cpu_ns: u64,
}

/// The running logger.
pub struct Recorder {
    sink: EventSink,
    status: Arc<Mutex<LogStatus>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Recorder {
    /// Creates the directory and starts the thread.
    pub fn start(cfg: RecorderConfig) -> io::Result<Recorder> {
        std::fs::create_dir_all(&cfg.dir)?;
        let (tx, rx) = sync_channel(EVENT_QUEUE);
        let dropped = Arc::new(AtomicU64::new(0));
        let status = Arc::new(Mutex::new(LogStatus {
            state: "recording".into(),
            dir: cfg.dir.clone(),
            ..LogStatus::default()
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let mut w = Worker {
            cfg,
            rx,
            dropped: dropped.clone(),
            dropped_logged: 0,
            status: status.clone(),
            stop: stop.clone(),
            subs: Vec::new(),
            file: None,
            seq: 0,
            scratch: Vec::new(),
            dirty: false,
        };
        let thread = std::thread::Builder::new()
            .name("rtd-logger".into())
            .spawn(move || w.run())?;
        Ok(Recorder {
            sink: EventSink { tx, dropped },
            status,
            stop,
            thread: Some(thread),
        })
    }

    pub fn sink(&self) -> EventSink {
        self.sink.clone()
    }

    pub fn status(&self) -> LogStatus {
        let mut s = lock(&self.status).clone();
        s.events_dropped = self.sink.dropped.load(Ordering::Relaxed);
        s
    }

    /// Stops the thread after it has written what it holds and finished
    /// the file (index and summary).
    pub fn stop(mut self) -> LogStatus {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.status()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn lock(m: &Mutex<LogStatus>) -> std::sync::MutexGuard<'_, LogStatus> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct Sub {
    name: String,
    reader: Subscriber,
    spec: TopicSpec,
    /// The sender last recorded in the current file.
    last_pid: Option<u32>,
    counts: ChannelCounts,
}

struct Worker {
    cfg: RecorderConfig,
    rx: Receiver<Event>,
    dropped: Arc<AtomicU64>,
    /// Dropped events already recorded as a gap.
    dropped_logged: u64,
    status: Arc<Mutex<LogStatus>>,
    stop: Arc<AtomicBool>,
    subs: Vec<Sub>,
    file: Option<LogFile>,
    seq: u64,
    scratch: Vec<u8>,
    /// Something was written since the last flush.
    dirty: bool,
}

impl Worker {
    fn run(&mut self) {
        if !self.cfg.cpus.is_empty() {
            if let Err(e) = controller::rt::pin_cpus(&self.cfg.cpus) {
                lock(&self.status).last_problem =
                    Some(format!("pinning to CPUs {:?}: {e}", self.cfg.cpus));
            }
        }
        let nice = self.cfg.section.nice;
        if nice != 0 {
            if let Err(e) =
                rustix::process::setpriority_process(Some(rustix::thread::gettid()), nice)
            {
                lock(&self.status).last_problem =
                    Some(format!("nice {nice} for the logger thread: {e}"));
            }
        }
        let poll = self.cfg.section.poll.0;
        let flush = self.cfg.section.flush.0;
        let mut next_open = Instant::now();
        let mut next_flush = Instant::now() + flush;
        self.prune_quota(None);
        loop {
            let stopping = self.stop.load(Ordering::Relaxed);
            let now = Instant::now();
            if now >= next_open {
                self.open_channels();
                next_open = now + REOPEN;
            }
            let mut r = self.turn();
            if r.is_ok() && (now >= next_flush || stopping) {
                next_flush = now + flush;
                r = self.flush_and_rotate();
            }
            if let Err(e) = r {
                self.fail(e);
                return;
            }
            if stopping {
                let r = match self.file.take() {
                    Some(f) => f.finish().map(|_| ()),
                    None => Ok(()),
                };
                let mut s = lock(&self.status);
                s.file = None;
                s.state = match r {
                    Ok(()) => "stopped".into(),
                    Err(e) => format!("stopped: finishing the file failed: {e}"),
                };
                return;
            }
            std::thread::sleep(poll);
        }
    }

    /// Stops recording on a write error; the file is finished if it can
    /// be (a full disk usually cannot take the summary either).
    fn fail(&mut self, e: io::Error) {
        let at = self.file.as_ref().map(|f| f.path().display().to_string());
        if let Some(f) = self.file.take() {
            let _ = f.finish();
        }
        let why = if e.kind() == io::ErrorKind::StorageFull {
            format!("disk full ({e})")
        } else {
            e.to_string()
        };
        let mut s = lock(&self.status);
        s.file = None;
        s.state = match at {
            Some(p) => format!("stopped: {why}, writing {p}"),
            None => format!("stopped: {why}"),
        };
    }

    fn open_channels(&mut self) {
        for name in &self.cfg.channels {
            if !self.cfg.section.records(name) || self.subs.iter().any(|s| &s.name == name) {
                continue;
            }
            let ch = match Channel::open(&self.cfg.shm_dir, name) {
                Ok(ch) => ch,
                Err(e) => {
                    if !matches!(&e, controller::channel::ChannelOpenError::NotFound { .. }) {
                        lock(&self.status).last_problem = Some(format!("{name}: {e}"));
                    }
                    continue;
                }
            };
            let mut metadata = BTreeMap::new();
            metadata.insert(
                META_MAX_SIZE.to_string(),
                ch.geometry().max_payload().to_string(),
            );
            note_type(&ch, &mut metadata);
            let timing = name.starts_with("/rtdeploy/timing/");
            let layout = self
                .cfg
                .section
                .types
                .get(name)
                .and_then(|d| d.layout().ok());
            let spec = TopicSpec {
                topic: name.clone(),
                layout,
                raw_encoding: if timing {
                    TIMING_ENCODING
                } else {
                    RAW_ENCODING
                },
                metadata,
            };
            // From the first message ever published: what the channel
            // still holds is recorded, what it no longer holds is a gap.
            let reader = ch.reader_at(if self.cfg.from_oldest {
                0
            } else {
                ch.next_index()
            });
            self.subs.push(Sub {
                name: name.clone(),
                reader,
                spec,
                last_pid: None,
                counts: ChannelCounts::default(),
            });
            lock(&self.status)
                .channels
                .insert(name.clone(), ChannelCounts::default());
        }
    }

    fn file(&mut self) -> io::Result<&mut LogFile> {
        if self.file.is_none() {
            let clock = ClockMap::now();
            let path = self.cfg.dir.join(format!(
                "{}-{:04}.mcap",
                utc_stamp(clock.realtime_ns),
                self.seq
            ));
            self.seq += 1;
            let f = LogFile::create(
                &path,
                self.cfg.section.chunk_size.0,
                &self.cfg.boot_id,
                clock,
            )?;
            for s in &mut self.subs {
                s.last_pid = None;
            }
            let mut st = lock(&self.status);
            st.file = Some(path);
            st.files_written += 1;
            drop(st);
            self.file = Some(f);
        }
        Ok(self.file.as_mut().expect("opened above"))
    }

    /// Reads everything new of every channel and event queue.
    fn turn(&mut self) -> io::Result<()> {
        let mut events = Vec::new();
        while let Ok(ev) = self.rx.try_recv() {
            events.push(ev);
            if events.len() >= EVENT_QUEUE {
                break;
            }
        }
        let dropped = self.dropped.load(Ordering::Relaxed);
        if !events.is_empty() || dropped > self.dropped_logged {
            self.file()?;
            let f = self.file.as_mut().expect("opened");
            f.add(&json_topic(EVENTS_TOPIC))?;
            for ev in &events {
                let data = serde_json::to_vec(ev).unwrap_or_default();
                f.write(EVENTS_TOPIC, 0, ev.monotonic_ns, &data, &mut self.scratch)?;
            }
            if dropped > self.dropped_logged {
                let gap = serde_json::json!({
                    "channel": EVENTS_TOPIC,
                    "from_index": self.dropped_logged,
                    "count": dropped - self.dropped_logged,
                    "reason": "the supervisor's event queue was full",
                });
                write_json(f, GAPS_TOPIC, &gap, &mut self.scratch)?;
                self.dropped_logged = dropped;
            }
            let mut st = lock(&self.status);
            st.events_logged += events.len() as u64;
            self.dirty = true;
        }
        for i in 0..self.subs.len() {
            self.read_channel(i)?;
        }
        lock(&self.status).cpu_ns = thread_cpu_ns();
        Ok(())
    }

    fn read_channel(&mut self, i: usize) -> io::Result<()> {
        let queue = self.subs[i].reader.channel().geometry().queue_len;
        // Bounded: what the ring can hold, twice; the rest waits a turn.
        let budget = queue.saturating_mul(2).max(16);
        let mut done = 0u64;
        while done < budget {
            if !self.subs[i].reader.has_new() {
                break;
            }
            if self.file.is_none() {
                self.file()?;
            }
            let (f, s, scratch) = (
                self.file.as_mut().expect("opened"),
                &mut self.subs[i],
                &mut self.scratch,
            );
            // The type a publisher bound after the logger opened the
            // channel (before it published): known by the first message.
            if !s.spec.metadata.contains_key(META_TYPE) {
                note_type(s.reader.channel(), &mut s.spec.metadata);
            }
            let m = match s.reader.next_message() {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(e) => {
                    s.counts.faults += 1;
                    let msg = format!("{}: {e}", s.name);
                    lock(&self.status).last_problem = Some(msg);
                    break;
                }
            };
            done += 1;
            f.add(&s.spec)?;
            if m.lost_before > 0 {
                let from = m.index - m.lost_before;
                let gap = serde_json::json!({
                    "channel": s.name,
                    "from_index": from,
                    "count": m.lost_before,
                    "reason": if from == 0 && s.counts.logged == 0 {
                        "published before the logger opened the channel, and overwritten since"
                    } else {
                        "overwritten before the logger read them"
                    },
                });
                let t = m.send_time_ns;
                f.add(&json_topic(GAPS_TOPIC))?;
                let data = serde_json::to_vec(&gap).unwrap_or_default();
                f.write(GAPS_TOPIC, 0, t, &data, scratch)?;
                s.counts.gaps += m.lost_before;
            }
            if s.last_pid != Some(m.sender_pid) {
                let rec = serde_json::json!({
                    "channel": s.name,
                    "index": m.index,
                    "pid": m.sender_pid,
                });
                f.add(&json_topic(SENDERS_TOPIC))?;
                let data = serde_json::to_vec(&rec).unwrap_or_default();
                f.write(SENDERS_TOPIC, 0, m.send_time_ns, &data, scratch)?;
                s.last_pid = Some(m.sender_pid);
            }
            f.write(&s.name, m.index as u32, m.send_time_ns, m.data, scratch)?;
            s.counts.logged += 1;
            self.dirty = true;
        }
        let s = &self.subs[i];
        if done > 0 || s.counts.faults > 0 {
            lock(&self.status)
                .channels
                .insert(s.name.clone(), s.counts.clone());
        }
        Ok(())
    }

    fn flush_and_rotate(&mut self) -> io::Result<()> {
        let sec = &self.cfg.section;
        let Some(f) = self.file.as_mut() else {
            return Ok(());
        };
        if self.dirty {
            f.flush()?;
            f.sync()?;
            self.dirty = false;
        }
        let age = controller::Monotonic::now()
            .as_nanos()
            .saturating_sub(f.opened_mono);
        let written = f.written();
        lock(&self.status).bytes_written = written;
        if written >= sec.rotate_size.0 || age >= sec.rotate_age.as_nanos() {
            let f = self.file.take().expect("checked");
            let done = f.finish()?;
            self.prune_quota(Some(&done));
        }
        Ok(())
    }

    /// Deletes the oldest files of the directory until what is left, and
    /// a file to come, fit the quota.
    fn prune_quota(&mut self, _just_done: Option<&Path>) {
        let sec = &self.cfg.section;
        let current = self.file.as_ref().map(|f| f.path().to_path_buf());
        let mut files = list_files(&self.cfg.dir);
        files.retain(|(p, _)| Some(p) != current.as_ref());
        let mut total: u64 = files.iter().map(|(_, n)| n).sum();
        let allowed = sec.quota.0.saturating_sub(sec.rotate_size.0);
        let mut deleted = 0;
        for (p, n) in &files {
            if total <= allowed {
                break;
            }
            match std::fs::remove_file(p) {
                Ok(()) => {
                    total -= n;
                    deleted += 1;
                }
                Err(e) => {
                    lock(&self.status).last_problem =
                        Some(format!("quota: deleting {}: {e}", p.display()));
                    break;
                }
            }
        }
        lock(&self.status).files_deleted += deleted;
    }
}

/// CPU time of the calling thread.
fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    (t.tv_sec as u64).saturating_mul(1_000_000_000) + t.tv_nsec as u64
}

/// The channel's recorded message type, as channel metadata.
fn note_type(ch: &Channel, metadata: &mut BTreeMap<String, String>) {
    if let Some((tn, size, align, hash)) = ch.recorded_type() {
        metadata.insert(META_TYPE.into(), tn.to_string());
        metadata.insert(META_TYPE_SIZE.into(), size.to_string());
        metadata.insert(META_TYPE_ALIGN.into(), align.to_string());
        metadata.insert(META_TYPE_HASH.into(), format!("{hash:016x}"));
    }
}

fn json_topic(topic: &str) -> TopicSpec {
    TopicSpec {
        topic: topic.into(),
        layout: None,
        raw_encoding: "json",
        metadata: BTreeMap::new(),
    }
}

fn write_json(
    f: &mut LogFile,
    topic: &str,
    v: &serde_json::Value,
    scratch: &mut Vec<u8>,
) -> io::Result<()> {
    f.add(&json_topic(topic))?;
    let data = serde_json::to_vec(v).unwrap_or_default();
    f.write(
        topic,
        0,
        controller::Monotonic::now().as_nanos(),
        &data,
        scratch,
    )
}

/// The `.mcap` files of a directory with their sizes, oldest (by name:
/// names start with the UTC time) first.
pub fn list_files(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut v: Vec<(PathBuf, u64)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let p = e.path();
            let md = e.metadata().ok()?;
            (md.is_file() && p.extension().is_some_and(|x| x == "mcap")).then_some((p, md.len()))
        })
        .collect();
    v.sort();
    v
}

/// `YYYYmmddTHHMMSSZ` of nanoseconds since the epoch.
pub fn utc_stamp(ns: u64) -> String {
    let secs = ns / 1_000_000_000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil(days as i64);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
fn civil(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_stamps() {
        assert_eq!(utc_stamp(0), "19700101T000000Z");
        assert_eq!(
            utc_stamp(1_764_633_600 * 1_000_000_000 + 3_723 * 1_000_000_000),
            "20251202T010203Z"
        );
        assert_eq!(utc_stamp(951_782_400 * 1_000_000_000), "20000229T000000Z");
    }
}
