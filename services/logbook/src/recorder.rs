//! The logger: two threads of the supervisor, pinned to the housekeeping
//! CPUs, that read the recorded channels and the supervisor's events and
//! write them to rotating MCAP files.
//!
//! It stays off the real-time path: the reading thread reads channels as a
//! fetcher (no subscriber entry, never armed, so no publisher ever pays a
//! wake for it, and no lock a publisher takes) every `log.poll`, copies
//! what it read into batches and hands them to the writing thread, which
//! compresses, writes, syncs and rotates. A disk that stalls (a sync
//! behind other writers) stalls only the writer: the reader goes on
//! reading while the batches in flight stay within `log.buffer`, and drops
//! batches beyond it. Whatever is lost, a message overwritten before the
//! reader read it or a batch dropped, is recorded as a gap on
//! `/rtdeploy/log/gaps` with its count, as is an event the supervisor could
//! not hand over (a bounded queue, never a blocked supervisor). A write that
//! fails (a full disk) stops the logger; the status says why.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use controller::{Channel, Subscriber};
use serde::{Deserialize, Serialize};
use units::cpu::CpuSet;
use units::error::Chain;

use crate::file::{
    ClockMap, LogFile, TopicSpec, EVENTS_TOPIC, GAPS_TOPIC, META_MAX_SIZE, META_TYPE,
    META_TYPE_ALIGN, META_TYPE_HASH, META_TYPE_MISMATCH, META_TYPE_SIZE, RAW_ENCODING,
    SENDERS_TOPIC, TIMING_ENCODING,
};
use crate::section::LogSection;

/// Events the supervisor may have queued for the logger at once; more
/// are dropped and counted as a gap of the events topic.
pub const EVENT_QUEUE: usize = 4096;
/// How often channels not open yet (a process's timing channel before it
/// starts) are looked for.
const REOPEN: Duration = Duration::from_secs(1);
/// Batches in flight from the reader to the writer, at most (their bytes
/// are bounded by `log.buffer` too).
const BATCHES: usize = 256;

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
    pub cpus: CpuSet,
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
    /// CPU time the logger's threads used (reading; compressing, writing).
    pub cpu_ns: u64,
    /// Batches the reader dropped because the writer was behind by
    /// `log.buffer` (their messages are gaps).
    pub batches_dropped: u64,
}

/// The running logger.
pub struct Recorder {
    sink: EventSink,
    status: Arc<Mutex<LogStatus>>,
    stop: Arc<AtomicBool>,
    reader: Option<JoinHandle<()>>,
    writer: Option<JoinHandle<()>>,
}

impl Recorder {
    /// Creates the directory and starts the threads.
    pub fn start(cfg: RecorderConfig) -> io::Result<Recorder> {
        std::fs::create_dir_all(&cfg.dir)?;
        let (tx, rx) = sync_channel(EVENT_QUEUE);
        let (btx, brx) = sync_channel(BATCHES);
        let dropped = Arc::new(AtomicU64::new(0));
        let status = Arc::new(Mutex::new(LogStatus {
            state: "recording".into(),
            dir: cfg.dir.clone(),
            ..LogStatus::default()
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared {
            status: status.clone(),
            in_flight: AtomicU64::new(0),
            writer_stopped: AtomicBool::new(false),
            reader_cpu: AtomicU64::new(0),
            writer_cpu: AtomicU64::new(0),
        });
        let mut w = Writer {
            cfg: cfg.clone(),
            rx: brx,
            shared: shared.clone(),
            specs: Vec::new(),
            file: None,
            last_pid: Vec::new(),
            seq: 0,
            json_seq: Default::default(),
            scratch: Vec::new(),
            sender_rec: String::new(),
            dirty: false,
        };
        let writer = std::thread::Builder::new()
            .name("rtd-log-write".into())
            .spawn(move || w.run())?;
        let mut r = Reader {
            cfg,
            events: rx,
            dropped: dropped.clone(),
            dropped_logged: 0,
            shared,
            stop: stop.clone(),
            subs: Vec::new(),
            out: Some(btx),
            batch: Batch::default(),
            carried: Vec::new(),
        };
        let reader = std::thread::Builder::new()
            .name("rtd-log-read".into())
            .spawn(move || r.run())?;
        Ok(Recorder {
            sink: EventSink { tx, dropped },
            status,
            stop,
            reader: Some(reader),
            writer: Some(writer),
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

    /// Stops the threads after the writer has written what was read and
    /// finished the file (index and summary).
    pub fn stop(mut self) -> LogStatus {
        self.join();
        self.status()
    }

    fn join(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in [self.reader.take(), self.writer.take()]
            .into_iter()
            .flatten()
        {
            let _ = t.join();
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.join();
    }
}

fn lock(m: &Mutex<LogStatus>) -> std::sync::MutexGuard<'_, LogStatus> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What both threads share.
struct Shared {
    status: Arc<Mutex<LogStatus>>,
    /// Bytes of batches handed to the writer and not written yet.
    in_flight: AtomicU64,
    /// The writer stopped (a write failed): the reader stops too.
    writer_stopped: AtomicBool,
    reader_cpu: AtomicU64,
    writer_cpu: AtomicU64,
}

impl Shared {
    fn note_cpu(&self, which: &AtomicU64) {
        which.store(thread_cpu_ns(), Ordering::Relaxed);
        let total =
            self.reader_cpu.load(Ordering::Relaxed) + self.writer_cpu.load(Ordering::Relaxed);
        lock(&self.status).cpu_ns = total;
    }
}

/// What the reader hands the writer: items whose bytes are in `data`.
#[derive(Default)]
struct Batch {
    items: Vec<Item>,
    data: Vec<u8>,
}

enum Item {
    /// A channel's spec (sent when it is opened, and again when its
    /// recorded type became known); `sub` indexes the reader's channels.
    Topic { sub: usize, spec: TopicSpec },
    Message {
        sub: usize,
        index: u64,
        send_ns: u64,
        pid: u32,
        at: usize,
        len: usize,
    },
    /// A JSON record on one of the logger's own topics.
    Json {
        topic: &'static str,
        send_ns: u64,
        at: usize,
        len: usize,
    },
}

impl Batch {
    fn json(&mut self, topic: &'static str, send_ns: u64, v: &serde_json::Value) {
        let at = self.data.len();
        let _ = serde_json::to_writer(&mut self.data, v);
        self.items.push(Item::Json {
            topic,
            send_ns,
            at,
            len: self.data.len() - at,
        });
    }
    fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

fn gap(channel: &str, from_index: u64, count: u64, reason: &str) -> serde_json::Value {
    serde_json::json!({
        "channel": channel,
        "from_index": from_index,
        "count": count,
        "reason": reason,
    })
}

struct Sub {
    name: String,
    reader: Subscriber,
    spec: TopicSpec,
    counts: ChannelCounts,
}

/// The reading thread.
struct Reader {
    cfg: RecorderConfig,
    events: Receiver<Event>,
    dropped: Arc<AtomicU64>,
    /// Dropped events already recorded as a gap.
    dropped_logged: u64,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    subs: Vec<Sub>,
    out: Option<SyncSender<Batch>>,
    batch: Batch,
    /// Gaps not in the file yet (of dropped batches, of the event
    /// queue), put in every batch until one goes through: (channel, first
    /// index, count, why).
    carried: Vec<(String, u64, u64, &'static str)>,
}

/// Pins the calling thread to the housekeeping CPUs and sets its nice
/// value; a refusal is the status's last problem.
fn place_thread(cfg: &RecorderConfig, status: &Mutex<LogStatus>) {
    if !cfg.cpus.is_empty() {
        if let Err(e) = units::sched::set_affinity(0, &cfg.cpus) {
            lock(status).last_problem =
                Some(format!("pinning to CPUs {}: {}", cfg.cpus, Chain(&e)));
        }
    }
    let nice = cfg.section.nice;
    if nice != 0 {
        if let Err(e) = rustix::process::setpriority_process(Some(rustix::thread::gettid()), nice) {
            let own = rustix::process::getpriority_process(None).unwrap_or(0);
            lock(status).last_problem = Some(format!(
                "nice {nice} for the logger's threads: {e} (lowering nice {own} to {nice} needs root, \
                 CAP_SYS_NICE or an RLIMIT_NICE of at least {}: the logger runs at nice {own})",
                20 - nice
            ));
        }
    }
}

impl Reader {
    fn run(&mut self) {
        place_thread(&self.cfg, &self.shared.status);
        let poll = self.cfg.section.poll.0;
        let mut next_open = Instant::now();
        loop {
            let stopping = self.stop.load(Ordering::Relaxed);
            if self.shared.writer_stopped.load(Ordering::Relaxed) {
                break;
            }
            let now = Instant::now();
            if now >= next_open {
                self.open_channels();
                next_open = now + REOPEN;
            }
            self.turn();
            self.hand_over(stopping);
            self.shared.note_cpu(&self.shared.reader_cpu);
            if stopping {
                break;
            }
            std::thread::sleep(poll);
        }
        // Dropping the sender ends the writer once it has written the rest.
        self.out = None;
    }

    /// Hands the batch to the writer; when the writer is behind by more
    /// than `log.buffer`, the batch is dropped and its messages become
    /// gaps. At the end (`last`) it waits for room instead.
    fn hand_over(&mut self, last: bool) {
        if self.batch.is_empty() {
            return;
        }
        let Some(out) = &self.out else { return };
        let b = std::mem::take(&mut self.batch);
        let bytes = b.data.len() as u64 + 64 * b.items.len() as u64;
        let limit = self.cfg.section.buffer.0;
        let room = self.shared.in_flight.load(Ordering::Relaxed) + bytes <= limit;
        let sent = if last {
            self.shared.in_flight.fetch_add(bytes, Ordering::Relaxed);
            out.send(b).map_err(|e| TrySendError::Disconnected(e.0))
        } else if room {
            self.shared.in_flight.fetch_add(bytes, Ordering::Relaxed);
            out.try_send(b)
        } else {
            Err(TrySendError::Full(b))
        };
        match sent {
            Ok(()) => self.carried.clear(),
            Err(TrySendError::Full(b)) | Err(TrySendError::Disconnected(b)) => {
                if room || last {
                    self.shared.in_flight.fetch_sub(bytes, Ordering::Relaxed);
                }
                self.drop_batch(b);
            }
        }
    }

    /// A batch the writer could not take: its messages are gaps (carried
    /// into the next batch), its events an events gap.
    fn drop_batch(&mut self, b: Batch) {
        let mut per: BTreeMap<usize, (u64, u64)> = BTreeMap::new();
        let mut events = 0u64;
        for it in &b.items {
            match it {
                Item::Message { sub, index, .. } => {
                    let e = per.entry(*sub).or_insert((*index, 0));
                    e.1 += 1;
                }
                Item::Json {
                    topic: EVENTS_TOPIC,
                    ..
                } => events += 1,
                Item::Json { .. } => {}
                // Specs are sent again with the next batch.
                Item::Topic { sub, .. } => {
                    if let Some(s) = self.subs.get_mut(*sub) {
                        s.spec.metadata.remove(SPEC_SENT);
                    }
                }
            }
        }
        for (sub, (from, n)) in per {
            let s = &mut self.subs[sub];
            s.counts.logged -= n;
            s.counts.gaps += n;
            self.carried.push((s.name.clone(), from, n, DISK_BEHIND));
        }
        if events > 0 {
            let first = lock(&self.shared.status).events_logged;
            self.carried
                .push((EVENTS_TOPIC.into(), first, events, DISK_BEHIND));
            lock(&self.shared.status).events_logged -= events;
            // Counted as dropped, and already recorded as a gap.
            self.dropped.fetch_add(events, Ordering::Relaxed);
            self.dropped_logged += events;
        }
        let mut st = lock(&self.shared.status);
        st.batches_dropped += 1;
        for s in &self.subs {
            st.channels.insert(s.name.clone(), s.counts.clone());
        }
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
                        lock(&self.shared.status).last_problem = Some(format!("{name}: {e}"));
                    }
                    continue;
                }
            };
            let (spec, problem) = topic_spec(&self.cfg.section, name, &ch);
            if let Some(p) = problem {
                lock(&self.shared.status).last_problem = Some(p);
            }
            // From the first message ever published (what the channel
            // still holds is recorded, what it no longer holds is a gap),
            // or from the next one.
            let reader = ch.reader_at(if self.cfg.from_oldest {
                0
            } else {
                ch.next_index()
            });
            self.subs.push(Sub {
                name: name.clone(),
                reader,
                spec,
                counts: ChannelCounts::default(),
            });
            lock(&self.shared.status)
                .channels
                .insert(name.clone(), ChannelCounts::default());
        }
    }

    /// Reads everything new of every channel and of the event queue into
    /// the batch.
    fn turn(&mut self) {
        let mut n = 0;
        while let Ok(ev) = self.events.try_recv() {
            let v = serde_json::to_value(&ev).unwrap_or_default();
            self.batch.json(EVENTS_TOPIC, ev.monotonic_ns, &v);
            n += 1;
            if n >= EVENT_QUEUE {
                break;
            }
        }
        let dropped = self.dropped.load(Ordering::Relaxed);
        if dropped > self.dropped_logged {
            self.carried.push((
                EVENTS_TOPIC.into(),
                self.dropped_logged,
                dropped - self.dropped_logged,
                "the supervisor's event queue was full",
            ));
            self.dropped_logged = dropped;
        }
        lock(&self.shared.status).events_logged += n as u64;
        let now = controller::Monotonic::now().as_nanos();
        for (ch, from, count, why) in &self.carried {
            self.batch
                .json(GAPS_TOPIC, now, &gap(ch, *from, *count, why));
        }
        for i in 0..self.subs.len() {
            self.read_channel(i);
        }
    }

    fn read_channel(&mut self, i: usize) {
        let s = &mut self.subs[i];
        let queue = s.reader.channel().geometry().queue_len;
        // Bounded: what the ring can hold, twice; the rest waits a turn.
        let budget = queue.saturating_mul(2).max(16);
        let mut done = 0u64;
        let mut fault = None;
        while done < budget && s.reader.has_new() {
            // The type a publisher bound after the logger opened the
            // channel (before it published): known by the first message.
            if !s.spec.metadata.contains_key(META_TYPE) {
                note_type(s.reader.channel(), &mut s.spec.metadata);
                if s.spec.metadata.contains_key(META_TYPE) {
                    s.spec.metadata.remove(SPEC_SENT); // the writer learns it
                }
            }
            if !s.spec.metadata.contains_key(SPEC_SENT) {
                s.spec.metadata.insert(SPEC_SENT.into(), String::new());
                let mut spec = s.spec.clone();
                spec.metadata.remove(SPEC_SENT);
                self.batch.items.push(Item::Topic { sub: i, spec });
            }
            let m = match s.reader.next_message() {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(e) => {
                    s.counts.faults += 1;
                    fault = Some(format!("{}: {e}", s.name));
                    break;
                }
            };
            done += 1;
            if m.lost_before > 0 {
                let from = m.index - m.lost_before;
                let why = if from == 0 && s.counts.logged == 0 && s.counts.gaps == 0 {
                    "published before the logger opened the channel, and overwritten since"
                } else {
                    "overwritten before the logger read them"
                };
                let g = gap(&s.name, from, m.lost_before, why);
                self.batch.json(GAPS_TOPIC, m.send_time_ns, &g);
                s.counts.gaps += m.lost_before;
            }
            let at = self.batch.data.len();
            self.batch.data.extend_from_slice(m.data);
            self.batch.items.push(Item::Message {
                sub: i,
                index: m.index,
                send_ns: m.send_time_ns,
                pid: m.sender_pid,
                at,
                len: m.data.len(),
            });
            // Counted as logged when read; a batch dropped later moves
            // its messages to the gaps.
            s.counts.logged += 1;
        }
        if done > 0 || fault.is_some() {
            let mut st = lock(&self.shared.status);
            st.channels.insert(s.name.clone(), s.counts.clone());
            if fault.is_some() {
                st.last_problem = fault;
            }
        }
    }
}

/// Why messages of a dropped batch are gaps.
const DISK_BEHIND: &str = "read, but the writer was behind by log.buffer (a slow disk)";

/// A marker in a reader's spec: the writer has it.
const SPEC_SENT: &str = "\u{0}sent";

/// The writing thread.
struct Writer {
    cfg: RecorderConfig,
    rx: Receiver<Batch>,
    shared: Arc<Shared>,
    /// The reader's channels, by index.
    specs: Vec<Option<TopicSpec>>,
    file: Option<LogFile>,
    /// The sender last recorded in the current file, per channel.
    last_pid: Vec<Option<u32>>,
    seq: u64,
    /// How many records of each JSON topic (events, gaps, senders) this
    /// logger wrote: the next one's sequence number, so `deploy log cat`
    /// numbers the supervisor's events in order.
    json_seq: std::collections::BTreeMap<&'static str, u32>,
    scratch: Vec<u8>,
    sender_rec: String,
    /// Something was written since the last flush.
    dirty: bool,
}

impl Writer {
    fn run(&mut self) {
        place_thread(&self.cfg, &self.shared.status);
        let flush = self.cfg.section.flush.0;
        let mut next_flush = Instant::now() + flush;
        self.prune_quota();
        loop {
            let wait = next_flush.saturating_duration_since(Instant::now());
            let (r, end) = match self.rx.recv_timeout(wait) {
                Ok(b) => {
                    let bytes = b.data.len() as u64 + 64 * b.items.len() as u64;
                    let r = self.write_batch(&b);
                    self.shared.in_flight.fetch_sub(bytes, Ordering::Relaxed);
                    (r, false)
                }
                Err(RecvTimeoutError::Timeout) => (Ok(()), false),
                Err(RecvTimeoutError::Disconnected) => (Ok(()), true),
            };
            let r = r.and_then(|()| {
                if Instant::now() >= next_flush {
                    next_flush = Instant::now() + flush;
                    self.flush_and_rotate()
                } else {
                    Ok(())
                }
            });
            self.shared.note_cpu(&self.shared.writer_cpu);
            if let Err(e) = r {
                self.fail(e);
                return;
            }
            if end {
                let r = match self.file.take() {
                    Some(f) => f.finish().map(|_| ()),
                    None => Ok(()),
                };
                self.shared.note_cpu(&self.shared.writer_cpu);
                let mut s = lock(&self.shared.status);
                s.file = None;
                s.state = match r {
                    Ok(()) => "stopped".into(),
                    Err(e) => format!("stopped: finishing the file failed: {e}"),
                };
                return;
            }
        }
    }

    /// Stops recording on a write error; the file is finished if it can
    /// be (a full disk usually cannot take the summary either).
    fn fail(&mut self, e: io::Error) {
        self.shared.writer_stopped.store(true, Ordering::Relaxed);
        let at = self.file.as_ref().map(|f| f.path().display().to_string());
        if let Some(f) = self.file.take() {
            let _ = f.finish();
        }
        let why = if e.kind() == io::ErrorKind::StorageFull {
            format!("disk full ({e})")
        } else {
            e.to_string()
        };
        let mut s = lock(&self.shared.status);
        s.file = None;
        s.state = match at {
            Some(p) => format!("stopped: {why}, writing {p}"),
            None => format!("stopped: {why}"),
        };
    }

    fn open_file(&mut self) -> io::Result<()> {
        if self.file.is_some() {
            return Ok(());
        }
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
        self.last_pid.iter_mut().for_each(|p| *p = None);
        let mut st = lock(&self.shared.status);
        st.file = Some(path);
        st.files_written += 1;
        drop(st);
        self.file = Some(f);
        Ok(())
    }

    fn write_batch(&mut self, b: &Batch) -> io::Result<()> {
        for it in &b.items {
            if let Item::Topic { sub, spec } = it {
                if self.specs.len() <= *sub {
                    self.specs.resize(*sub + 1, None);
                    self.last_pid.resize(*sub + 1, None);
                }
                self.specs[*sub] = Some(spec.clone());
                continue;
            }
            self.open_file()?;
            let f = self.file.as_mut().expect("opened");
            match *it {
                Item::Topic { .. } => {}
                Item::Json {
                    topic,
                    send_ns,
                    at,
                    len,
                } => {
                    f.add(&json_topic(topic))?;
                    let n = self.json_seq.entry(topic).or_insert(0);
                    let seq = *n;
                    *n = n.wrapping_add(1);
                    f.write(
                        topic,
                        seq,
                        send_ns,
                        &b.data[at..at + len],
                        &mut self.scratch,
                    )?;
                }
                Item::Message {
                    sub,
                    index,
                    send_ns,
                    pid,
                    at,
                    len,
                } => {
                    let Some(spec) = self.specs.get(sub).and_then(|s| s.as_ref()) else {
                        continue;
                    };
                    f.add(spec)?;
                    if self.last_pid[sub] != Some(pid) {
                        write_sender(
                            f,
                            &spec.topic,
                            index,
                            pid,
                            send_ns,
                            &mut self.sender_rec,
                            &mut self.scratch,
                        )?;
                        self.last_pid[sub] = Some(pid);
                    }
                    f.write(
                        &spec.topic,
                        index as u32,
                        send_ns,
                        &b.data[at..at + len],
                        &mut self.scratch,
                    )?;
                }
            }
            self.dirty = true;
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
        lock(&self.shared.status).bytes_written = written;
        if written >= sec.rotate_size.0 || age >= sec.rotate_age.as_nanos() {
            let f = self.file.take().expect("checked");
            f.finish()?;
            self.prune_quota();
        }
        Ok(())
    }

    /// Deletes the oldest files of the directory until what is left, and
    /// a file to come, fit the quota.
    fn prune_quota(&mut self) {
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
                    lock(&self.shared.status).last_problem =
                        Some(format!("quota: deleting {}: {e}", p.display()));
                    break;
                }
            }
        }
        lock(&self.shared.status).files_deleted += deleted;
    }
}

/// What the file says of channel `name` (its type, its size, how its
/// messages are encoded), as the logger records it, and the problem to
/// report when robot.yaml's `log.types` declares another type than the
/// channel records.
///
/// A declaration is trusted only when its layout hash is the one the
/// channel records (or the channel records none): a declaration that
/// names fields the channel's type does not have would make every
/// decoded message a lie, so the channel is then logged raw (still
/// replayable), and the file says why (`rtdeploy.type_mismatch`).
pub(crate) fn topic_spec(
    section: &LogSection,
    name: &str,
    ch: &Channel,
) -> (TopicSpec, Option<String>) {
    let mut metadata = BTreeMap::new();
    metadata.insert(
        META_MAX_SIZE.to_string(),
        ch.geometry().max_payload().to_string(),
    );
    note_type(ch, &mut metadata);
    let timing = name.starts_with("/rtdeploy/timing/");
    let mut layout = section.types.get(name).and_then(|d| d.layout().ok());
    let mut problem = None;
    if let (Some(l), Some((tn, _, _, hash))) = (&layout, ch.recorded_type()) {
        if l.hash != hash {
            let why = format!(
                "log.types.{name} declares {} (layout hash {:016x}), but the channel carries {tn} (layout hash {hash:016x}): logged raw, not decoded",
                l.schema_name(),
                l.hash
            );
            metadata.insert(META_TYPE_MISMATCH.to_string(), why.clone());
            problem = Some(why);
            layout = None;
        }
    }
    let spec = TopicSpec {
        topic: name.to_string(),
        layout,
        raw_encoding: if timing {
            TIMING_ENCODING
        } else {
            RAW_ENCODING
        },
        metadata,
    };
    (spec, problem)
}

/// Writes the record that says who sent `topic`'s messages from `index`
/// on (written when the sender changes; without serde: channels with
/// several publishers change sender often).
pub(crate) fn write_sender(
    f: &mut LogFile,
    topic: &str,
    index: u64,
    pid: u32,
    send_ns: u64,
    rec: &mut String,
    scratch: &mut Vec<u8>,
) -> io::Result<()> {
    use std::fmt::Write as _;
    rec.clear();
    let _ = write!(
        rec,
        "{{\"channel\":{},\"index\":{index},\"pid\":{pid}}}",
        serde_json::Value::from(topic)
    );
    f.add(&json_topic(SENDERS_TOPIC))?;
    f.write(SENDERS_TOPIC, 0, send_ns, rec.as_bytes(), scratch)
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

pub(crate) fn json_topic(topic: &str) -> TopicSpec {
    TopicSpec {
        topic: topic.into(),
        layout: None,
        raw_encoding: "json",
        metadata: BTreeMap::new(),
    }
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
