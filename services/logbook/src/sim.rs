//! The logger of a simulation (`deploy sim --log`): the same file as the
//! supervisor's logger writes, written by the coordinator itself after
//! each virtual instant, so that the same run gives the same bytes.
//!
//! What makes two runs' files identical, and what is fixed or normalised
//! for it:
//!
//! - **When messages are read.** The supervisor's logger reads every
//!   `log.poll` of wall time on a thread of its own; here the coordinator
//!   reads after each virtual instant, when no process is running: every
//!   channel in name order, every message in index order, from the first
//!   one ever published.
//! - **Times.** Send times are virtual (the loops' clock); the file's
//!   clock mapping is fixed ([`SIM_CLOCK`]: log time = virtual time), so
//!   no wall-clock start time is in it.
//! - **The boot id** is [`SIM_BOOT_ID`], not the host's.
//! - **Pids.** A message's sender (a publisher's owner word), a timing
//!   report's `pid` and an event's process are recorded as the process's
//!   place in robot.yaml (1 for the first; 0 for a pid of no process of
//!   the run), never as the run's pids.
//! - **The file itself.** One file (no rotation), the MCAP header and
//!   library string fixed, zstd at a fixed level, chunks cut at the
//!   section's `chunk_size` by bytes written, never by time.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use controller::timing_report::RawReport;
use controller::{Channel, Subscriber};

use crate::file::{ClockMap, LogFile, TopicSpec, EVENTS_TOPIC, GAPS_TOPIC};
use crate::recorder::{json_topic, topic_spec, write_sender};
use crate::section::LogSection;

/// The clock mapping of a simulation's file: log times are virtual times.
pub const SIM_CLOCK: ClockMap = ClockMap {
    monotonic_ns: 0,
    realtime_ns: 0,
};
/// The boot id a simulation's file records.
pub const SIM_BOOT_ID: &str = "00000000-0000-0000-0000-000000000000";

struct Sub {
    name: String,
    reader: Subscriber,
    spec: TopicSpec,
    added: bool,
    last_pid: Option<u32>,
    messages: u64,
    gaps: u64,
}

/// A simulation's log, being written.
pub struct SimLog {
    file: LogFile,
    section: LogSection,
    shm_dir: PathBuf,
    /// Channels that may be recorded (the section's globs pick).
    channels: Vec<String>,
    subs: Vec<Sub>,
    /// A process's pid to its place in robot.yaml.
    pids: BTreeMap<u32, u32>,
    events: u32,
    gap_records: u32,
    scratch: Vec<u8>,
    /// The message being recorded (a copy: its timing report pid is
    /// rewritten).
    msg: Vec<u8>,
    rec: String,
}

/// What a simulation's log holds.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SimLogSummary {
    pub path: PathBuf,
    /// Messages per channel, and messages lost (overwritten before the
    /// instant ended: more published in one instant than the ring holds).
    pub channels: BTreeMap<String, (u64, u64)>,
    pub events: u32,
}

impl SimLog {
    /// Creates `path` (it must not exist) for `channels`, of which the
    /// section's globs pick those to record.
    pub fn create(
        path: &Path,
        section: &LogSection,
        shm_dir: &Path,
        mut channels: Vec<String>,
    ) -> io::Result<SimLog> {
        channels.sort();
        channels.dedup();
        let file = LogFile::create(path, section.chunk_size.0, SIM_BOOT_ID, SIM_CLOCK)?;
        Ok(SimLog {
            file,
            section: section.clone(),
            shm_dir: shm_dir.to_path_buf(),
            channels,
            subs: Vec::new(),
            pids: BTreeMap::new(),
            events: 0,
            gap_records: 0,
            scratch: Vec::new(),
            msg: Vec::new(),
            rec: String::new(),
        })
    }

    /// Records `pid` as the process at `place` in robot.yaml (from 1).
    pub fn name_pid(&mut self, pid: u32, place: u32) {
        self.pids.insert(pid, place);
    }

    /// Opens the channels that exist now and are not open yet, in name
    /// order.
    pub fn open_channels(&mut self) {
        for name in &self.channels {
            if !self.section.records(name) || self.subs.iter().any(|s| &s.name == name) {
                continue;
            }
            let Ok(ch) = Channel::open(&self.shm_dir, name) else {
                continue;
            };
            // A declaration that is not the channel's type is said in the
            // file's metadata; the run goes on.
            let (spec, _) = topic_spec(&self.section, name, &ch);
            self.subs.push(Sub {
                name: name.clone(),
                reader: ch.reader_at(0),
                spec,
                added: false,
                last_pid: None,
                messages: 0,
                gaps: 0,
            });
        }
        self.subs.sort_by(|a, b| a.name.cmp(&b.name));
    }

    /// An event of the run (a process started, left out, failed, ended)
    /// at virtual time `at_ns`, as the supervisor's events are recorded
    /// (its message names no pid).
    pub fn event(
        &mut self,
        at_ns: u64,
        kind: &'static str,
        process: Option<&str>,
        message: &str,
    ) -> io::Result<()> {
        let v = serde_json::json!({
            "kind": kind,
            "process": process,
            "message": message,
            "monotonic_ns": at_ns,
        });
        let bytes = serde_json::to_vec(&v).map_err(io::Error::other)?;
        self.file.add(&json_topic(EVENTS_TOPIC))?;
        self.file
            .write(EVENTS_TOPIC, self.events, at_ns, &bytes, &mut self.scratch)?;
        self.events = self.events.wrapping_add(1);
        Ok(())
    }

    /// Writes every message published since the last call, channel by
    /// channel in name order.
    pub fn record(&mut self) -> io::Result<()> {
        for i in 0..self.subs.len() {
            self.record_channel(i)?;
        }
        Ok(())
    }

    fn record_channel(&mut self, i: usize) -> io::Result<()> {
        loop {
            let s = &mut self.subs[i];
            let m = match s.reader.next_message() {
                Ok(Some(m)) => m,
                Ok(None) => return Ok(()),
                Err(e) => {
                    // A message that is not one (a corrupted slot): said
                    // on the gaps topic, and the channel read on.
                    let g = serde_json::json!({
                        "channel": s.name,
                        "from_index": s.reader.next_index(),
                        "count": 0,
                        "reason": format!("unreadable: {e}"),
                    });
                    return self.gap(0, &g);
                }
            };
            let (index, send_ns, lost) = (m.index, m.send_time_ns, m.lost_before);
            let pid = self.pids.get(&m.sender_pid).copied().unwrap_or(0);
            self.msg.clear();
            self.msg.extend_from_slice(m.data);
            let s = &mut self.subs[i];
            if lost > 0 {
                s.gaps += lost;
                let g = serde_json::json!({
                    "channel": s.name,
                    "from_index": index - lost,
                    "count": lost,
                    "reason": "overwritten within one virtual instant",
                });
                self.gap(send_ns, &g)?;
            }
            let s = &mut self.subs[i];
            if s.spec.raw_encoding == crate::file::TIMING_ENCODING {
                normalise_report_pid(&mut self.msg, &self.pids);
            }
            if !s.added {
                self.file.add(&s.spec)?;
                s.added = true;
            }
            if s.last_pid != Some(pid) {
                write_sender(
                    &mut self.file,
                    &s.name,
                    index,
                    pid,
                    send_ns,
                    &mut self.rec,
                    &mut self.scratch,
                )?;
                s.last_pid = Some(pid);
            }
            self.file
                .write(&s.name, index as u32, send_ns, &self.msg, &mut self.scratch)?;
            s.messages += 1;
        }
    }

    fn gap(&mut self, at_ns: u64, g: &serde_json::Value) -> io::Result<()> {
        let bytes = serde_json::to_vec(g).map_err(io::Error::other)?;
        self.file.add(&json_topic(GAPS_TOPIC))?;
        self.file.write(
            GAPS_TOPIC,
            self.gap_records,
            at_ns,
            &bytes,
            &mut self.scratch,
        )?;
        self.gap_records = self.gap_records.wrapping_add(1);
        Ok(())
    }

    /// Finishes the file (index and summary).
    pub fn finish(self) -> io::Result<SimLogSummary> {
        let channels = self
            .subs
            .iter()
            .map(|s| (s.name.clone(), (s.messages, s.gaps)))
            .collect();
        let events = self.events;
        let path = self.file.finish()?;
        Ok(SimLogSummary {
            path,
            channels,
            events,
        })
    }
}

/// A timing report's `pid` field, replaced by the process's place.
fn normalise_report_pid(data: &mut [u8], pids: &BTreeMap<u32, u32>) {
    let at = std::mem::offset_of!(RawReport, pid);
    let Some(field) = data.get_mut(at..at + 8) else {
        return;
    };
    let mut b = [0u8; 8];
    b.copy_from_slice(field);
    let pid = u64::from_ne_bytes(b);
    let place = u32::try_from(pid)
        .ok()
        .and_then(|p| pids.get(&p).copied())
        .unwrap_or(0);
    field.copy_from_slice(&u64::from(place).to_ne_bytes());
}
