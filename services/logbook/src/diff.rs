//! Where two logs first differ (`deploy log diff A B`): channel by
//! channel, message by message in each channel's order, by log time and
//! payload, and in a payload the first field that differs (decoded as
//! `deploy log cat` decodes it).
//!
//! Both files are streamed ([`read::scan_file`]): the first on a thread
//! of its own, the second here, each channel's messages matched in order
//! whatever order the files interleave the channels in. What is held is
//! the messages one file is ahead of the other by, bounded by
//! [`DiffOptions::max_held`]; beyond it the comparison stops and says so.
//!
//! Left out unless asked for by `--channels`: the timing reports
//! (`/rtdeploy/timing/*`: latencies and counts per report window depend
//! on the machine, and in a simulation on the turn order) and the
//! logger's own records (`/rtdeploy/events`, `/rtdeploy/log/*`: the
//! supervisor's events and who sent what, with pids), and a replay's
//! copies of the channels it remapped (`/original/*`: the recording's own
//! messages, to set beside the new ones). The report says which were left
//! out and why.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::mpsc::{sync_channel, Receiver};

use serde::Serialize;

use crate::read::{self, ChannelInfo, Flow, ReadError};
use crate::section::glob;

/// How to compare.
#[derive(Debug, Clone)]
pub struct DiffOptions {
    /// Globs of the channels to compare (empty: every channel but the
    /// timing reports and the logger's own).
    pub channels: Vec<String>,
    /// Bytes of messages one file may be ahead of the other by.
    pub max_held: usize,
    /// Compare payloads only, not log times (a recording on the wall
    /// clock against its replay on a virtual one).
    pub payloads_only: bool,
}

impl Default for DiffOptions {
    fn default() -> Self {
        DiffOptions {
            channels: Vec::new(),
            max_held: 64 << 20,
            payloads_only: false,
        }
    }
}

/// Channels left out by default, and why.
pub const LEFT_OUT: [(&str, &str); 4] = [
    (
        "/rtdeploy/timing/*",
        "timing reports: their latencies and per-window counts depend on the machine and the turn order",
    ),
    ("/rtdeploy/events", "the supervisor's events, with pids"),
    ("/rtdeploy/log/*", "the logger's own records of gaps and senders, with pids"),
    (
        "/original/*",
        "a replay's copies of the channels it remapped, the recording's own messages",
    ),
];

/// The first difference.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Difference {
    pub channel: String,
    /// The message's place in its channel in the files (from 0).
    pub message: u64,
    pub log_time_a: Option<u64>,
    pub log_time_b: Option<u64>,
    /// What differs: `log time`, `field <path>`, `bytes`, `missing in A`,
    /// `missing in B`, `encoding` or `schema`.
    pub what: String,
    /// The differing values, as decoded (or the lengths of raw payloads).
    pub a: Option<serde_json::Value>,
    pub b: Option<serde_json::Value>,
}

/// What a comparison found.
#[derive(Debug, Clone, Serialize)]
pub struct DiffReport {
    /// Messages compared (and equal) per channel.
    pub compared: BTreeMap<String, u64>,
    /// Channel globs left out, with why (none when `--channels` chose).
    pub left_out: Vec<(String, String)>,
    pub first: Option<Difference>,
}

/// Comparing could not be done.
#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    #[error("reading {}", path.display())]
    Read {
        path: std::path::PathBuf,
        #[source]
        source: ReadError,
    },
    #[error("the files are more than {0} bytes apart in some channel's messages (they interleave the channels too differently): compare fewer channels with --channels")]
    TooFarApart(usize),
}

/// A message of A, owned.
struct Held {
    log_time: u64,
    data: Vec<u8>,
}

/// What the thread reading A sends.
enum FromA {
    /// The first message of a channel: how the file describes it.
    Channel(String, Box<ChannelInfo>),
    Message(String, Held),
}

/// Which channels are compared.
fn takes(opts: &DiffOptions, topic: &str) -> bool {
    if opts.channels.is_empty() {
        !LEFT_OUT.iter().any(|(g, _)| glob(g, topic))
    } else {
        opts.channels.iter().any(|g| glob(g, topic))
    }
}

struct Side {
    pending: BTreeMap<String, VecDeque<Held>>,
    infos: BTreeMap<String, Box<ChannelInfo>>,
    ended: bool,
}

struct State<'o> {
    opts: &'o DiffOptions,
    rx: Receiver<FromA>,
    a: Side,
    /// Messages of B waiting for A's.
    b_pending: BTreeMap<String, VecDeque<Held>>,
    b_infos: BTreeMap<String, Box<ChannelInfo>>,
    held: usize,
    compared: BTreeMap<String, u64>,
    first: Option<Difference>,
}

/// Compares the logs at `a` and `b` (see the module's documentation).
pub fn diff(a: &Path, b: &Path, opts: &DiffOptions) -> Result<DiffReport, DiffError> {
    let (tx, rx) = sync_channel::<FromA>(256);
    let a_path = a.to_path_buf();
    let a_opts = opts.clone();
    let reader = std::thread::Builder::new()
        .name("rtd-log-diff".into())
        .spawn(move || {
            let mut seen = std::collections::BTreeSet::new();
            read::scan_file(&a_path, |m| {
                let topic = &m.channel.topic;
                if !takes(&a_opts, topic) {
                    return Flow::Go;
                }
                if seen.insert(topic.clone())
                    && tx
                        .send(FromA::Channel(topic.clone(), Box::new(m.channel.clone())))
                        .is_err()
                {
                    return Flow::Stop;
                }
                let held = Held {
                    log_time: m.log_time,
                    data: m.data.to_vec(),
                };
                match tx.send(FromA::Message(topic.clone(), held)) {
                    Ok(()) => Flow::Go,
                    Err(_) => Flow::Stop,
                }
            })
        })
        .map_err(|e| DiffError::Read {
            path: a.to_path_buf(),
            source: ReadError::Io {
                path: a.to_path_buf(),
                source: e,
            },
        })?;
    let mut st = State {
        opts,
        rx,
        a: Side {
            pending: BTreeMap::new(),
            infos: BTreeMap::new(),
            ended: false,
        },
        b_pending: BTreeMap::new(),
        b_infos: BTreeMap::new(),
        held: 0,
        compared: BTreeMap::new(),
        first: None,
    };
    let mut too_far = false;
    let b_scan = read::scan_file(b, |m| {
        let topic = &m.channel.topic;
        if !takes(opts, topic) {
            return Flow::Go;
        }
        if !st.b_infos.contains_key(topic) {
            st.b_infos
                .insert(topic.clone(), Box::new(m.channel.clone()));
        }
        st.held += m.data.len();
        st.b_pending
            .entry(topic.clone())
            .or_default()
            .push_back(Held {
                log_time: m.log_time,
                data: m.data.to_vec(),
            });
        match st.settle(topic) {
            Ok(()) if st.first.is_none() => Flow::Go,
            Ok(()) => Flow::Stop,
            Err(()) => {
                too_far = true;
                Flow::Stop
            }
        }
    });
    // B is read (or stopped): what A still has.
    if st.first.is_none() && !too_far {
        while !st.a.ended {
            if st.pull_a().is_err() {
                too_far = true;
                break;
            }
        }
        if !too_far {
            st.finish();
        }
    }
    let State {
        rx,
        compared,
        first,
        ..
    } = st;
    drop(rx);
    let a_scan = reader.join().unwrap_or_else(|_| {
        Err(ReadError::Io {
            path: a.to_path_buf(),
            source: std::io::Error::other("the thread reading it panicked"),
        })
    });
    a_scan.map_err(|source| DiffError::Read {
        path: a.to_path_buf(),
        source,
    })?;
    b_scan.map_err(|source| DiffError::Read {
        path: b.to_path_buf(),
        source,
    })?;
    if too_far {
        return Err(DiffError::TooFarApart(opts.max_held));
    }
    let left_out = if opts.channels.is_empty() {
        LEFT_OUT
            .iter()
            .map(|(g, why)| (g.to_string(), why.to_string()))
            .collect()
    } else {
        Vec::new()
    };
    Ok(DiffReport {
        compared,
        left_out,
        first,
    })
}

impl State<'_> {
    /// Takes the next item from A's thread; `Err` when A is too far
    /// ahead.
    fn pull_a(&mut self) -> Result<(), ()> {
        match self.rx.recv() {
            Err(_) => self.a.ended = true,
            Ok(FromA::Channel(topic, info)) => {
                self.a.infos.insert(topic, info);
            }
            Ok(FromA::Message(topic, m)) => {
                self.held += m.data.len();
                self.a.pending.entry(topic).or_default().push_back(m);
            }
        }
        if self.held > self.opts.max_held {
            return Err(());
        }
        Ok(())
    }

    /// Compares what B holds of `topic` with A's messages of it, reading A
    /// as far as needed.
    fn settle(&mut self, topic: &str) -> Result<(), ()> {
        while self.first.is_none() && self.b_pending.get(topic).is_some_and(|q| !q.is_empty()) {
            let have_a = self.a.pending.get(topic).is_some_and(|q| !q.is_empty());
            if !have_a {
                if self.a.ended {
                    // B has a message A does not.
                    let b = self.b_pending.get_mut(topic).and_then(|q| q.pop_front());
                    let n = self.compared.get(topic).copied().unwrap_or(0);
                    self.first = Some(Difference {
                        channel: topic.to_string(),
                        message: n,
                        log_time_a: None,
                        log_time_b: b.map(|m| m.log_time),
                        what: "missing in A".into(),
                        a: None,
                        b: None,
                    });
                    return Ok(());
                }
                self.pull_a()?;
                continue;
            }
            let a = self.a.pending.get_mut(topic).and_then(|q| q.pop_front());
            let b = self.b_pending.get_mut(topic).and_then(|q| q.pop_front());
            let (Some(a), Some(b)) = (a, b) else { break };
            self.held = self.held.saturating_sub(a.data.len() + b.data.len());
            let n = self.compared.entry(topic.to_string()).or_insert(0);
            if let Some(d) = compare(
                topic,
                *n,
                &a,
                &b,
                self.a.infos.get(topic).map(|i| &**i),
                self.b_infos.get(topic).map(|i| &**i),
                self.opts.payloads_only,
            ) {
                self.first = Some(d);
                return Ok(());
            }
            *n += 1;
        }
        Ok(())
    }

    /// Both files read: a message one holds and the other does not is the
    /// first difference (the earliest by log time).
    fn finish(&mut self) {
        let mut extra: Option<Difference> = None;
        let mut consider = |d: Difference| {
            let t = d.log_time_a.or(d.log_time_b).unwrap_or(u64::MAX);
            let better = extra
                .as_ref()
                .is_none_or(|e| t < e.log_time_a.or(e.log_time_b).unwrap_or(u64::MAX));
            if better {
                extra = Some(d);
            }
        };
        for (topic, q) in &self.a.pending {
            if let Some(m) = q.front() {
                consider(Difference {
                    channel: topic.clone(),
                    message: self.compared.get(topic).copied().unwrap_or(0),
                    log_time_a: Some(m.log_time),
                    log_time_b: None,
                    what: "missing in B".into(),
                    a: None,
                    b: None,
                });
            }
        }
        for (topic, q) in &self.b_pending {
            if let Some(m) = q.front() {
                consider(Difference {
                    channel: topic.clone(),
                    message: self.compared.get(topic).copied().unwrap_or(0),
                    log_time_a: None,
                    log_time_b: Some(m.log_time),
                    what: "missing in A".into(),
                    a: None,
                    b: None,
                });
            }
        }
        if self.first.is_none() {
            self.first = extra;
        }
    }
}

/// How two messages of one channel differ, if they do.
fn compare(
    topic: &str,
    n: u64,
    a: &Held,
    b: &Held,
    ia: Option<&ChannelInfo>,
    ib: Option<&ChannelInfo>,
    payloads_only: bool,
) -> Option<Difference> {
    let d = |what: String, va, vb| Difference {
        channel: topic.to_string(),
        message: n,
        log_time_a: Some(a.log_time),
        log_time_b: Some(b.log_time),
        what,
        a: va,
        b: vb,
    };
    if let (Some(ia), Some(ib)) = (ia, ib) {
        if n == 0 && ia.message_encoding != ib.message_encoding {
            let v = |i: &ChannelInfo| Some(serde_json::Value::from(i.message_encoding.clone()));
            return Some(d("encoding".into(), v(ia), v(ib)));
        }
        if n == 0 && ia.schema_data != ib.schema_data {
            let v = |i: &ChannelInfo| Some(serde_json::Value::from(i.schema_name.clone()));
            return Some(d("schema".into(), v(ia), v(ib)));
        }
    }
    if a.data != b.data {
        let decoded = ia
            .zip(ib)
            .and_then(|(ia, ib)| Some((ia.decode(&a.data)?, ib.decode(&b.data)?)));
        return Some(match decoded {
            Some((va, vb)) => match first_field(&va, &vb, String::new()) {
                Some((path, x, y)) => d(format!("field {path}"), Some(x), Some(y)),
                // Decoded alike, bytes not (padding): the bytes.
                None => bytes_differ(&a.data, &b.data, d),
            },
            None => bytes_differ(&a.data, &b.data, d),
        });
    }
    if a.log_time != b.log_time && !payloads_only {
        return Some(d("log time".into(), None, None));
    }
    None
}

fn bytes_differ(
    a: &[u8],
    b: &[u8],
    d: impl Fn(String, Option<serde_json::Value>, Option<serde_json::Value>) -> Difference,
) -> Difference {
    let at = a
        .iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .unwrap_or(a.len().min(b.len()));
    d(
        format!("bytes from offset {at}"),
        Some(serde_json::json!({"bytes": a.len()})),
        Some(serde_json::json!({"bytes": b.len()})),
    )
}

/// The first field (in document order) where `a` and `b` differ: its path
/// (`seq`, `pose.x`, `ranges[3]`) and both values.
fn first_field(
    a: &serde_json::Value,
    b: &serde_json::Value,
    path: String,
) -> Option<(String, serde_json::Value, serde_json::Value)> {
    use serde_json::Value;
    let here = |p: &str| {
        if p.is_empty() {
            "(the message)".to_string()
        } else {
            p.to_string()
        }
    };
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, va) in x {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match y.get(k) {
                    Some(vb) => {
                        if let Some(f) = first_field(va, vb, p) {
                            return Some(f);
                        }
                    }
                    None => return Some((p, va.clone(), Value::Null)),
                }
            }
            y.iter().find(|(k, _)| !x.contains_key(*k)).map(|(k, vb)| {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                (p, Value::Null, vb.clone())
            })
        }
        (Value::Array(x), Value::Array(y)) => {
            for (i, (va, vb)) in x.iter().zip(y).enumerate() {
                if let Some(f) = first_field(va, vb, format!("{path}[{i}]")) {
                    return Some(f);
                }
            }
            (x.len() != y.len()).then(|| {
                (
                    format!("{} length", here(&path)),
                    Value::from(x.len()),
                    Value::from(y.len()),
                )
            })
        }
        _ => (a != b).then(|| (here(&path), a.clone(), b.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_first_differing_field_is_named_by_its_path() {
        let a = json!({"seq": 3, "pose": {"x": 1.0, "y": 2.0}, "r": [1, 2, 3]});
        let same = first_field(&a, &a.clone(), String::new());
        assert_eq!(same, None);
        let b = json!({"seq": 3, "pose": {"x": 1.0, "y": 2.5}, "r": [1, 2, 3]});
        assert_eq!(
            first_field(&a, &b, String::new()),
            Some(("pose.y".into(), json!(2.0), json!(2.5)))
        );
        let c = json!({"seq": 3, "pose": {"x": 1.0, "y": 2.0}, "r": [1, 9]});
        assert_eq!(
            first_field(&a, &c, String::new()),
            Some(("r[1]".into(), json!(2), json!(9)))
        );
        let d = json!({"seq": 3, "pose": {"x": 1.0, "y": 2.0}, "r": [1, 2]});
        assert_eq!(
            first_field(&a, &d, String::new()),
            Some(("r length".into(), json!(3), json!(2)))
        );
        assert_eq!(
            first_field(&json!(1), &json!(2), String::new()),
            Some(("(the message)".into(), json!(1), json!(2)))
        );
    }

    #[test]
    fn the_default_leaves_out_timing_reports_and_the_loggers_own_records() {
        let o = DiffOptions::default();
        for t in [
            "/rtdeploy/timing/imu",
            "/rtdeploy/events",
            "/rtdeploy/log/gaps",
        ] {
            assert!(!takes(&o, t), "{t}");
        }
        assert!(takes(&o, "/demo/ping"));
        let o = DiffOptions {
            channels: vec!["/rtdeploy/timing/*".into()],
            ..DiffOptions::default()
        };
        assert!(takes(&o, "/rtdeploy/timing/imu"));
        assert!(!takes(&o, "/demo/ping"));
    }
}
