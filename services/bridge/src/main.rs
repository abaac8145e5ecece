//! `rtdeploy-bridge`: the channels robot.yaml's `bridge:` section names,
//! carried to and from Zenoh. The supervisor runs it (process
//! `rtdeploy-bridge`, SCHED_OTHER on the housekeeping CPUs) with its plan
//! in `RTDEPLOY_BRIDGE_PLAN` (see `services::bridge`) and the channel
//! directory in `RTDEPLOY_SHM_DIR`.
//!
//! Outbound, each channel is read as a fetcher (no subscriber entry: a
//! publisher pays no wake for the bridge, and the bridge takes no lock a
//! real-time wakeup needs), polled every millisecond, and each new message
//! put on its key: `rtdeploy/<robot>/<channel>` with the header of
//! [`wire`] for other rtdeploy boards, or rmw_zenoh's key expression with
//! the CDR of its type and rmw_zenoh's attachment for ROS 2 nodes.
//!
//! Inbound, Zenoh's callback checks each message (its header or
//! attachment, its type's hash, its size, its age, the link's rate, the
//! bridge's memory) and publishes it into the channel as a best-effort
//! publisher; what fails a check is dropped, counted per reason, and said
//! once on stderr. A message from another rtdeploy board keeps its remote
//! queue index, send time (as the other board's and, with a clock
//! estimate, as this board's) and boot id: the bridge publishes them,
//! with the local index, on `/rtdeploy/bridge/remote<channel>`, which the
//! logger records like any channel.
//!
//! The bridges estimate their boards' clock offsets from their own
//! exchanges ([`clock`]) and report them, with every link's counts and
//! rates, the peers and the memory, on `/rtdeploy/bridge/status` (JSON)
//! twice a second, which `deploy status` shows.

mod clock;
mod reach;
mod wire;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use controller::channel::{Channel, ChannelGeometry, Publisher};
use messages::ros::{self, Attachment, CdrPlan, Endpoint, Qos};
use services::bridge::{
    BridgePlan, BridgeStatus, ClockStatus, Dropped, Link, LinkStatus, Mode, PLAN_ENV,
    STATUS_CHANNEL, STATUS_MAX,
};
use zenoh::Wait as _;

const PROC: &str = "/proc";
/// How often outbound channels are read.
const POLL: Duration = Duration::from_millis(1);
/// How often the status is published.
const STATUS_PERIOD: Duration = Duration::from_millis(500);
/// How often each remote board's clock is asked.
const CLOCK_PERIOD: Duration = Duration::from_secs(1);
/// The most messages read from one channel in one turn.
const TURN: usize = 4096;
/// The prefix of the remote-time records of inbound channels.
const REMOTE_PREFIX: &str = "/rtdeploy/bridge/remote";
/// A remote-time record's size.
const REMOTE_RECORD: usize = 48;

fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (t.tv_sec as u64).saturating_mul(1_000_000_000) + t.tv_nsec as u64
}

fn realtime_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Realtime);
    (t.tv_sec as u64).saturating_mul(1_000_000_000) + t.tv_nsec as u64
}

/// Why messages were dropped, per link.
#[derive(Default)]
struct Drops {
    /// Not a message: a bad header, attachment or CDR.
    garbage: AtomicU64,
    /// Another type (its layout or type hash).
    wrong_type: AtomicU64,
    /// Larger than the channel's `max_size`.
    size: AtomicU64,
    /// Over the link's `rate`.
    rate: AtomicU64,
    /// Older than the link's `ttl`.
    ttl: AtomicU64,
    /// The bridge was over its memory bound.
    memory: AtomicU64,
    /// Zenoh refused the put, or the channel the publish.
    failed: AtomicU64,
    /// Older than one already delivered from the same sender.
    stale: AtomicU64,
}

/// One link's counters.
#[derive(Default)]
struct Stats {
    sent: AtomicU64,
    received: AtomicU64,
    /// Messages the sender published that never came (gaps in its
    /// sequence), or that the channel overwrote before the bridge read
    /// them.
    lost: AtomicU64,
    drops: Drops,
}

/// What the bridge says once per link and reason.
struct Said(Mutex<BTreeSet<String>>);

impl Said {
    fn once(&self, what: String) {
        let mut s = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if s.len() < 1024 && s.insert(what.clone()) {
            eprintln!("rtdeploy-bridge: {what} (said once; counted in the status)");
        }
    }
}

/// Shared by every thread and callback.
struct Shared {
    robot: String,
    shm: PathBuf,
    boot_id: [u8; 16],
    memory_bound: u64,
    over_memory: AtomicBool,
    said: Said,
    /// Clock offsets of other boards, by robot name, with their boot ids.
    clocks: Mutex<BTreeMap<String, (clock::Offset, [u8; 16])>>,
}

fn clock_key(robot: &str) -> String {
    format!("rtdeploy-clock/{robot}")
}

/// A channel's name as the last part of a key (for a message).
fn name_of(link: &Link) -> &str {
    &link.channel
}

fn priority(p: u8) -> zenoh::qos::Priority {
    use zenoh::qos::Priority;
    match p {
        1 => Priority::RealTime,
        2 => Priority::InteractiveHigh,
        3 => Priority::InteractiveLow,
        4 => Priority::DataHigh,
        6 => Priority::DataLow,
        7 => Priority::Background,
        _ => Priority::Data,
    }
}

fn congestion(reliable: bool) -> zenoh::qos::CongestionControl {
    if reliable {
        zenoh::qos::CongestionControl::Block
    } else {
        zenoh::qos::CongestionControl::Drop
    }
}

/// The resident set, from /proc/self/statm.
fn rss_bytes() -> u64 {
    let text = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    pages.saturating_mul(rustix::param::page_size() as u64)
}

/// A link's ROS 2 type, ready to use.
struct RosLink {
    plan: CdrPlan,
    hash: String,
    dds_type: String,
}

fn ros_link(link: &Link) -> Result<Option<RosLink>, String> {
    let Some(t) = &link.ros2 else { return Ok(None) };
    let d = messages::Description::from_fields(&t.name, &t.fields).map_err(|e| e.to_string())?;
    let name = d.name.clone();
    let set = messages::Set::new(vec![d]).map_err(|e| e.to_string())?;
    let cdr = set.cdr_plan(&name).map_err(|e| e.to_string())?;
    let hash = set.ros_type_hash(&name).map_err(|e| e.to_string())?;
    let dds_type = set.dds_type_name(&name);
    if hash != t.hash || dds_type != t.dds_type {
        return Err(format!(
            "{}: the plan's type hash {} is not {hash} (a plan of another version?)",
            link.channel, t.hash
        ));
    }
    Ok(Some(RosLink {
        plan: cdr,
        hash,
        dds_type,
    }))
}

/// An outbound link.
struct Out {
    link: Link,
    ros: Option<RosLink>,
    reader: Option<controller::channel::Subscriber>,
    publisher: zenoh::pubsub::Publisher<'static>,
    gid: [u8; 16],
    seq: i64,
    stats: Arc<Stats>,
    buf: Vec<u8>,
}

impl Out {
    /// Sends what is new on the channel (at most [`TURN`]).
    fn turn(&mut self, sh: &Shared) {
        if self.reader.is_none() {
            match Channel::open(&sh.shm, &self.link.channel) {
                Ok(ch) => {
                    let next = ch.next_index();
                    self.reader = Some(ch.reader_at(next));
                }
                Err(_) => return, // not created yet: the next turn
            }
        }
        let Some(reader) = self.reader.as_mut() else {
            return;
        };
        let layout_hash = reader.channel().recorded_type().map_or(0, |(_, _, _, h)| h);
        for _ in 0..TURN {
            let m = match reader.next_message() {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(e) => {
                    sh.said
                        .once(format!("{}: reading the channel: {e}", self.link.channel));
                    self.stats.drops.failed.fetch_add(1, Ordering::Relaxed);
                    break;
                }
            };
            if m.lost_before > 0 {
                self.stats.lost.fetch_add(m.lost_before, Ordering::Relaxed);
            }
            let now = monotonic_ns();
            let age = now.saturating_sub(m.send_time_ns);
            if self.link.ttl_ns.is_some_and(|ttl| age > ttl) {
                self.stats.drops.ttl.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let send_real = realtime_ns().saturating_sub(age);
            let put = match &self.ros {
                Some(r) => {
                    if r.plan.encode(m.data, &mut self.buf).is_err() {
                        self.stats.drops.wrong_type.fetch_add(1, Ordering::Relaxed);
                        sh.said.once(format!(
                            "{}: a message of {} bytes is not its ROS 2 type's {}",
                            self.link.channel,
                            m.data.len(),
                            r.plan.size()
                        ));
                        continue;
                    }
                    self.seq += 1;
                    let att = Attachment {
                        sequence_number: self.seq,
                        source_timestamp: send_real as i64,
                        gid: self.gid,
                    };
                    self.publisher
                        .put(self.buf.as_slice())
                        .attachment(att.encode().to_vec())
                        .wait()
                }
                None => {
                    wire::Header {
                        index: m.index,
                        send_mono_ns: m.send_time_ns,
                        send_real_ns: send_real,
                        layout_hash,
                        boot_id: sh.boot_id,
                    }
                    .encode(m.data, &mut self.buf);
                    self.publisher.put(self.buf.as_slice()).wait()
                }
            };
            match put {
                Ok(()) => {
                    self.stats.sent.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    self.stats.drops.failed.fetch_add(1, Ordering::Relaxed);
                    sh.said.once(format!("{}: put: {e}", self.link.channel));
                }
            }
        }
    }
}

/// The token bucket of an inbound link's `rate`.
struct Bucket {
    rate: u64,
    tokens: u64,
    last: u64,
}

impl Bucket {
    fn take(&mut self, now: u64) -> bool {
        let refill =
            (now.saturating_sub(self.last) as u128 * self.rate as u128 / 1_000_000_000) as u64;
        if refill > 0 {
            self.tokens = (self.tokens + refill).min(self.rate.max(1));
            self.last = now;
        }
        if self.tokens == 0 {
            return false;
        }
        self.tokens -= 1;
        true
    }
}

/// An inbound link's state, behind the callback's lock.
struct InState {
    publisher: Option<Publisher>,
    remote: Option<Publisher>,
    bucket: Option<Bucket>,
    /// The last index delivered per sender (robot and boot, or GID).
    last: BTreeMap<Vec<u8>, u64>,
    buf: Vec<u8>,
}

struct In {
    link: Link,
    ros: Option<RosLink>,
    own_gid: [u8; 16],
    stats: Arc<Stats>,
    state: Mutex<InState>,
}

impl In {
    fn publisher<'a>(&self, st: &'a mut InState, sh: &Shared) -> Option<&'a mut Publisher> {
        if st.publisher.is_none() {
            match Channel::open(&sh.shm, &self.link.channel)
                .map_err(|e| e.to_string())
                .and_then(|ch| ch.publisher(Path::new(PROC)).map_err(|e| e.to_string()))
            {
                Ok(p) => st.publisher = Some(p),
                Err(e) => {
                    sh.said.once(format!(
                        "{}: cannot publish into it: {e}",
                        self.link.channel
                    ));
                    return None;
                }
            }
        }
        st.publisher.as_mut()
    }

    /// Checks one sample and delivers it.
    fn sample(&self, sh: &Shared, key: &str, payload: &[u8], attachment: Option<Vec<u8>>) {
        let ch = name_of(&self.link);
        let drop = |c: &AtomicU64| {
            c.fetch_add(1, Ordering::Relaxed);
        };
        if sh.over_memory.load(Ordering::Relaxed) {
            drop(&self.stats.drops.memory);
            sh.said.once(format!(
                "{ch}: over the bridge's memory bound: dropping what comes in"
            ));
            return;
        }
        let now = monotonic_ns();
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(b) = st.bucket.as_mut() {
            if !b.take(now) {
                drop(&self.stats.drops.rate);
                sh.said.once(format!(
                    "{ch}: more than {}/s comes in: the rest is dropped",
                    b.rate
                ));
                return;
            }
        }
        match &self.ros {
            Some(r) => self.ros_sample(sh, r, &mut st, key, payload, attachment),
            None => self.rtdeploy_sample(sh, &mut st, key, payload, now),
        }
    }

    fn ros_sample(
        &self,
        sh: &Shared,
        r: &RosLink,
        st: &mut InState,
        key: &str,
        payload: &[u8],
        attachment: Option<Vec<u8>>,
    ) {
        let ch = name_of(&self.link);
        let count = |c: &AtomicU64| {
            c.fetch_add(1, Ordering::Relaxed);
        };
        // The key's last chunk is the sender's type hash.
        let hash = key.rsplit('/').next().unwrap_or("");
        if hash != r.hash {
            count(&self.stats.drops.wrong_type);
            sh.said.once(format!(
                "{ch}: a ROS 2 message of type hash {hash} on {key}, not {} ({})",
                r.hash, r.dds_type
            ));
            return;
        }
        let att = match attachment.as_deref().map(Attachment::decode) {
            Some(Ok(a)) => a,
            Some(Err(e)) => {
                count(&self.stats.drops.garbage);
                sh.said
                    .once(format!("{ch}: a ROS 2 message with a bad attachment: {e}"));
                return;
            }
            None => {
                count(&self.stats.drops.garbage);
                sh.said.once(format!(
                    "{ch}: a ROS 2 message without rmw_zenoh's attachment"
                ));
                return;
            }
        };
        if att.gid == self.own_gid {
            return; // our own, outbound on the same key
        }
        if payload.len() > self.link.max_size as usize + 64 {
            count(&self.stats.drops.size);
            sh.said.once(format!(
                "{ch}: a message of {} bytes, larger than the channel's max_size {}",
                payload.len(),
                self.link.max_size
            ));
            return;
        }
        if let Some(ttl) = self.link.ttl_ns {
            let age = (realtime_ns() as i64).saturating_sub(att.source_timestamp);
            if age > ttl as i64 {
                count(&self.stats.drops.ttl);
                return;
            }
        }
        let mut buf = std::mem::take(&mut st.buf);
        buf.resize(r.plan.size(), 0);
        if let Err(e) = r.plan.decode(payload, &mut buf) {
            count(&self.stats.drops.garbage);
            sh.said.once(format!(
                "{ch}: a ROS 2 message that is not {}: {e}",
                r.dds_type
            ));
            st.buf = buf;
            return;
        }
        let sender = att.gid.to_vec();
        let seq = att.sequence_number.max(0) as u64;
        if !self.in_order(st, sender, seq) {
            st.buf = buf;
            return;
        }
        self.deliver(sh, st, &buf, None);
        st.buf = buf;
    }

    fn rtdeploy_sample(&self, sh: &Shared, st: &mut InState, key: &str, payload: &[u8], now: u64) {
        let ch = name_of(&self.link);
        let count = |c: &AtomicU64| {
            c.fetch_add(1, Ordering::Relaxed);
        };
        // rtdeploy/<robot>/<channel>: never our own.
        let robot = key.split('/').nth(1).unwrap_or("");
        if robot == sh.robot {
            return;
        }
        let (h, msg) = match wire::Header::decode(payload) {
            Ok(x) => x,
            Err(e) => {
                count(&self.stats.drops.garbage);
                sh.said.once(format!("{ch}: from {robot}: {e}"));
                return;
            }
        };
        if msg.len() as u64 > self.link.max_size {
            count(&self.stats.drops.size);
            sh.said.once(format!(
                "{ch}: from {robot}: a message of {} bytes, larger than the channel's max_size {}",
                msg.len(),
                self.link.max_size
            ));
            return;
        }
        let local_hash = st
            .publisher
            .as_ref()
            .and_then(|p| p.channel().recorded_type())
            .map_or(0, |(_, _, _, hash)| hash);
        if h.layout_hash != 0 && local_hash != 0 && h.layout_hash != local_hash {
            count(&self.stats.drops.wrong_type);
            sh.said.once(format!(
                "{ch}: from {robot}: layout hash {:016x}, but the channel here carries {local_hash:016x}",
                h.layout_hash
            ));
            return;
        }
        // Its send time here, from the clock estimate (none yet: the
        // wall clocks, which may differ).
        let local_send = {
            let clocks = sh.clocks.lock().unwrap_or_else(|p| p.into_inner());
            clocks
                .get(robot)
                .filter(|(_, boot)| *boot == h.boot_id)
                .and_then(|(o, _)| o.to_local(h.send_mono_ns))
        };
        if let Some(ttl) = self.link.ttl_ns {
            let age = match local_send {
                Some(t) => now.saturating_sub(t),
                None => realtime_ns().saturating_sub(h.send_real_ns),
            };
            if age > ttl {
                count(&self.stats.drops.ttl);
                return;
            }
        }
        let mut sender = robot.as_bytes().to_vec();
        sender.extend_from_slice(&h.boot_id);
        if !self.in_order(st, sender, h.index) {
            return;
        }
        // The remote record: local index (filled in by deliver), remote
        // index, remote send time, that time here (0: unknown), boot id.
        let mut rec = [0u8; REMOTE_RECORD];
        rec[8..16].copy_from_slice(&h.index.to_le_bytes());
        rec[16..24].copy_from_slice(&h.send_mono_ns.to_le_bytes());
        rec[24..32].copy_from_slice(&local_send.unwrap_or(0).to_le_bytes());
        rec[32..48].copy_from_slice(&h.boot_id);
        self.deliver(sh, st, msg, Some(rec));
    }

    /// Whether `seq` from `sender` is newer than the last delivered (a gap
    /// counts as lost; an older one is dropped as stale).
    fn in_order(&self, st: &mut InState, sender: Vec<u8>, seq: u64) -> bool {
        if st.last.len() > 1024 && !st.last.contains_key(&sender) {
            st.last.clear(); // bounded: a sender flood forgets the old ones
        }
        match st.last.get(&sender).copied() {
            Some(last) if seq <= last => {
                self.stats.drops.stale.fetch_add(1, Ordering::Relaxed);
                false
            }
            Some(last) => {
                self.stats.lost.fetch_add(seq - last - 1, Ordering::Relaxed);
                st.last.insert(sender, seq);
                true
            }
            None => {
                st.last.insert(sender, seq);
                true
            }
        }
    }

    fn deliver(&self, sh: &Shared, st: &mut InState, msg: &[u8], rec: Option<[u8; REMOTE_RECORD]>) {
        let ch = name_of(&self.link);
        let Some(p) = self.publisher(st, sh) else {
            self.stats.drops.failed.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let index = match p.publish(msg) {
            Ok(done) => done.index,
            Err(e) => {
                self.stats.drops.failed.fetch_add(1, Ordering::Relaxed);
                sh.said.once(format!("{ch}: publishing: {e}"));
                return;
            }
        };
        self.stats.received.fetch_add(1, Ordering::Relaxed);
        if let Some(mut rec) = rec {
            rec[0..8].copy_from_slice(&index.to_le_bytes());
            if st.remote.is_none() {
                let name = format!("{REMOTE_PREFIX}{ch}");
                let geom = ChannelGeometry::new(REMOTE_RECORD as u64, 1024, 1);
                match Channel::create(&sh.shm, &name, &geom, None, Path::new(PROC))
                    .map_err(|e| e.to_string())
                    .and_then(|(c, _)| c.publisher(Path::new(PROC)).map_err(|e| e.to_string()))
                {
                    Ok(p) => st.remote = Some(p),
                    Err(e) => sh.said.once(format!("{name}: {e}")),
                }
            }
            if let Some(r) = st.remote.as_mut() {
                let _ = r.publish(&rec);
            }
        }
    }
}

/// A GID for one of our endpoints: the first 16 bytes of the SHA-256 of
/// its liveliness token (rmw_zenoh hashes its tokens too, with another
/// hash: a GID only has to be unique).
fn gid_of(token: &str) -> [u8; 16] {
    use sha2::Digest as _;
    let d = sha2::Sha256::digest(token.as_bytes());
    let mut g = [0u8; 16];
    g.copy_from_slice(&d[..16]);
    g
}

fn session(plan: &BridgePlan) -> Result<zenoh::Session, String> {
    let mut c = zenoh::Config::default();
    let json = |v: &serde_json::Value| v.to_string();
    let mode = match plan.mode {
        Mode::Client => "client",
        Mode::Peer => "peer",
    };
    for (k, v) in [
        ("mode", json(&mode.into())),
        ("connect/endpoints", json(&plan.connect.clone().into())),
        ("listen/endpoints", json(&plan.listen.clone().into())),
        (
            "scouting/multicast/enabled",
            json(&plan.multicast_scouting.into()),
        ),
        // Up without the network: connects in the background, and again
        // after a loss, with no restart.
        ("connect/timeout_ms", "1000".into()),
        ("connect/exit_on_failure", "false".into()),
    ] {
        c.insert_json5(k, &v)
            .map_err(|e| format!("zenoh config {k}: {e}"))?;
    }
    zenoh::open(c)
        .wait()
        .map_err(|e| format!("opening the zenoh session: {e}"))
}

fn run() -> Result<(), String> {
    let text = std::env::var(PLAN_ENV)
        .map_err(|_| format!("{PLAN_ENV} is not set: the supervisor runs the bridge"))?;
    if text.len() > services::bridge::MAX_PLAN {
        return Err(format!(
            "{PLAN_ENV}: {} bytes, more than a plan takes",
            text.len()
        ));
    }
    let plan: BridgePlan = serde_json::from_str(&text).map_err(|e| format!("{PLAN_ENV}: {e}"))?;
    let shm = std::env::var_os(units::env::SHM_DIR)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(units::path::SHM_DIR));
    let sh = Arc::new(Shared {
        robot: plan.robot.clone(),
        shm: shm.clone(),
        boot_id: wire::boot_id(Path::new(PROC)),
        memory_bound: plan.memory,
        over_memory: AtomicBool::new(false),
        said: Said(Mutex::new(BTreeSet::new())),
        clocks: Mutex::new(BTreeMap::new()),
    });
    for link in &plan.links {
        ros_link(link)?;
    }
    let z = session(&plan)?;
    let zid = z.zid().to_string();
    eprintln!(
        "rtdeploy-bridge: robot {}, session {zid}, {} link(s), mode {:?}, connect {:?}, listen {:?}",
        plan.robot,
        plan.links.len(),
        plan.mode,
        plan.connect,
        plan.listen
    );

    // ROS 2: the node, then an endpoint per ROS 2 link.
    let mut tokens = Vec::new();
    let node_id = 0;
    let ros_links = plan.links.iter().filter(|l| l.ros2.is_some()).count();
    if ros_links > 0 {
        let t = ros::node_token(plan.domain_id, &zid, node_id, "", &plan.node);
        tokens.push(
            z.liveliness()
                .declare_token(t.clone())
                .wait()
                .map_err(|e| format!("liveliness token {t}: {e}"))?,
        );
    }

    let mut outs = Vec::new();
    let mut ins = Vec::new();
    let mut subscribers = Vec::new();
    let mut status_links = Vec::new();
    for (i, link) in plan.links.iter().enumerate() {
        let ros = ros_link(link)?;
        let entity = 10 + i as u32;
        let endpoint_token = |kind: Endpoint| {
            link.ros2.as_ref().map(|t| {
                ros::endpoint_token(
                    plan.domain_id,
                    &zid,
                    node_id,
                    entity
                        + if kind == Endpoint::Subscription {
                            1000
                        } else {
                            0
                        },
                    kind,
                    "",
                    &plan.node,
                    &link.channel,
                    &t.dds_type,
                    &t.hash,
                    Qos {
                        reliable: link.reliable,
                        depth: 10,
                    },
                )
            })
        };
        let stats = Arc::new(Stats::default());
        if link.direction.outbound() {
            let key = link.key(&plan.robot, plan.domain_id, true);
            let token = endpoint_token(Endpoint::Publisher);
            let gid = gid_of(token.as_deref().unwrap_or(&key));
            if let Some(t) = token {
                tokens.push(
                    z.liveliness()
                        .declare_token(t.clone())
                        .wait()
                        .map_err(|e| format!("liveliness token {t}: {e}"))?,
                );
            }
            let publisher = z
                .declare_publisher(key.clone())
                .priority(priority(link.priority))
                .congestion_control(congestion(link.reliable))
                .wait()
                .map_err(|e| format!("publisher on {key}: {e}"))?;
            status_links.push((link.clone(), "out", key.clone(), stats.clone()));
            outs.push(Out {
                link: link.clone(),
                ros: ros_link(link)?,
                reader: None,
                publisher,
                gid,
                seq: 0,
                stats: stats.clone(),
                buf: Vec::with_capacity(link.max_size as usize + 64),
            });
        }
        if link.direction.inbound() {
            let stats = Arc::new(Stats::default());
            let key = link.key(&plan.robot, plan.domain_id, false);
            let token = endpoint_token(Endpoint::Subscription);
            if let Some(t) = &token {
                tokens.push(
                    z.liveliness()
                        .declare_token(t.clone())
                        .wait()
                        .map_err(|e| format!("liveliness token {t}: {e}"))?,
                );
            }
            let own_gid = outs
                .iter()
                .find(|o: &&Out| o.link.channel == link.channel)
                .map_or([0u8; 16], |o| o.gid);
            let inbound = Arc::new(In {
                link: link.clone(),
                ros,
                own_gid,
                stats: stats.clone(),
                state: Mutex::new(InState {
                    publisher: None,
                    remote: None,
                    bucket: link.rate.map(|r| Bucket {
                        rate: r as u64,
                        tokens: r as u64,
                        last: monotonic_ns(),
                    }),
                    last: BTreeMap::new(),
                    buf: Vec::new(),
                }),
            });
            let (cb_in, cb_sh) = (inbound.clone(), sh.clone());
            let sub = z
                .declare_subscriber(key.clone())
                .callback(move |s: zenoh::sample::Sample| {
                    let payload = s.payload().to_bytes();
                    let att = s.attachment().map(|a| a.to_bytes().into_owned());
                    cb_in.sample(&cb_sh, s.key_expr().as_str(), &payload, att);
                })
                .wait()
                .map_err(|e| format!("subscriber on {key}: {e}"))?;
            subscribers.push(sub);
            status_links.push((link.clone(), "in", key, stats));
            ins.push(inbound);
        }
    }

    // This board's clock, for the other bridges.
    let clock_sh = sh.clone();
    let _clock_queryable = z
        .declare_queryable(clock_key(&plan.robot))
        .callback(move |q: zenoh::query::Query| {
            let mut b = monotonic_ns().to_le_bytes().to_vec();
            b.extend_from_slice(&clock_sh.boot_id);
            let _ = q.reply(q.key_expr().clone(), b).wait();
        })
        .wait()
        .map_err(|e| format!("clock queryable: {e}"))?;

    // The boards to estimate clocks of: the `from` of inbound links.
    let remotes: BTreeSet<String> = plan
        .links
        .iter()
        .filter(|l| l.direction.inbound() && l.ros2.is_none())
        .filter_map(|l| l.from.clone())
        .collect();
    {
        let (z2, sh2) = (z.clone(), sh.clone());
        std::thread::Builder::new()
            .name("bridge-clock".into())
            .spawn(move || loop {
                for r in &remotes {
                    let t0 = monotonic_ns();
                    let Ok(replies) = z2
                        .get(clock_key(r))
                        .timeout(Duration::from_millis(500))
                        .wait()
                    else {
                        continue;
                    };
                    while let Ok(reply) = replies.recv() {
                        let t1 = monotonic_ns();
                        let Ok(sample) = reply.result() else { continue };
                        let b = sample.payload().to_bytes();
                        if b.len() != 24 {
                            sh2.said.once(format!(
                                "clock of {r}: a reply of {} bytes, not 24",
                                b.len()
                            ));
                            continue;
                        }
                        let remote = u64::from_le_bytes(b[0..8].try_into().expect("8 bytes"));
                        let mut boot = [0u8; 16];
                        boot.copy_from_slice(&b[8..24]);
                        let mut clocks = sh2.clocks.lock().unwrap_or_else(|p| p.into_inner());
                        let e = clocks
                            .entry(r.clone())
                            .or_insert_with(|| (clock::Offset::default(), boot));
                        if e.1 != boot {
                            e.0.reset();
                            e.1 = boot;
                        }
                        e.0.add(clock::Sample { t0, remote, t1 });
                    }
                }
                std::thread::sleep(CLOCK_PERIOD);
            })
            .map_err(|e| format!("clock thread: {e}"))?;
    }

    // Outbound, on this thread's own.
    {
        let sh2 = sh.clone();
        std::thread::Builder::new()
            .name("bridge-out".into())
            .spawn(move || loop {
                for o in outs.iter_mut() {
                    o.turn(&sh2);
                }
                std::thread::sleep(POLL);
            })
            .map_err(|e| format!("outbound thread: {e}"))?;
    }

    // The status, on this thread.
    let (status_ch, _) = Channel::create(
        &shm,
        STATUS_CHANNEL,
        &ChannelGeometry::new(STATUS_MAX, 4, 1),
        None,
        Path::new(PROC),
    )
    .map_err(|e| format!("{STATUS_CHANNEL}: {e}"))?;
    let mut status_pub = status_ch
        .publisher(Path::new(PROC))
        .map_err(|e| format!("{STATUS_CHANNEL}: {e}"))?;
    let started = Instant::now();
    let mut prev: Vec<(u64, u64)> = vec![(0, 0); status_links.len()];
    let mut prev_t = Instant::now();
    let mut reach = reach::Reach::new();
    loop {
        std::thread::sleep(STATUS_PERIOD);
        let rss = rss_bytes();
        sh.over_memory
            .store(rss > sh.memory_bound, Ordering::Relaxed);
        let dt = prev_t.elapsed().as_secs_f64().max(1e-3);
        prev_t = Instant::now();
        let peers: Vec<String> = z.info().peers_zid().wait().map(|z| z.to_string()).collect();
        let routers: Vec<String> = z
            .info()
            .routers_zid()
            .wait()
            .map(|z| z.to_string())
            .collect();
        let uptime_s = started.elapsed().as_secs();
        for line in reach.look(uptime_s, peers.iter().chain(&routers).cloned()) {
            eprintln!("rtdeploy-bridge: {line}");
        }
        let links: Vec<LinkStatus> = status_links
            .iter()
            .zip(prev.iter_mut())
            .map(|((l, dir, key, s), p)| {
                let (sent, recv) = (
                    s.sent.load(Ordering::Relaxed),
                    s.received.load(Ordering::Relaxed),
                );
                let rate = ((sent - p.0) as f64 + (recv - p.1) as f64) / dt;
                *p = (sent, recv);
                let d = &s.drops;
                let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
                LinkStatus {
                    channel: l.channel.clone(),
                    direction: dir.to_string(),
                    key: key.clone(),
                    ros2: l.ros2.is_some(),
                    sent,
                    received: recv,
                    rate_hz: (rate * 10.0).round() / 10.0,
                    lost: n(&s.lost),
                    dropped: Dropped {
                        garbage: n(&d.garbage),
                        wrong_type: n(&d.wrong_type),
                        size: n(&d.size),
                        rate: n(&d.rate),
                        ttl: n(&d.ttl),
                        memory: n(&d.memory),
                        failed: n(&d.failed),
                        stale: n(&d.stale),
                    },
                }
            })
            .collect();
        let clocks: Vec<ClockStatus> = {
            let c = sh.clocks.lock().unwrap_or_else(|p| p.into_inner());
            c.iter()
                .filter_map(|(robot, (o, boot))| {
                    o.estimate().map(|e| ClockStatus {
                        robot: robot.clone(),
                        offset_ns: e.offset_ns,
                        rtt_ns: e.rtt_ns,
                        samples: e.samples,
                        boot_id: wire::boot_id_text(boot),
                    })
                })
                .collect()
        };
        let doc = BridgeStatus {
            robot: plan.robot.clone(),
            session: zid.clone(),
            mode: match plan.mode {
                Mode::Client => "client",
                Mode::Peer => "peer",
            }
            .into(),
            node: plan.node.clone(),
            domain_id: plan.domain_id,
            peers,
            routers,
            uptime_s,
            alone_s: reach.alone_s(uptime_s),
            disconnections: reach.disconnections,
            rss_bytes: rss,
            memory_bound: sh.memory_bound,
            over_memory: sh.over_memory.load(Ordering::Relaxed),
            links,
            clocks,
        };
        let mut text = serde_json::to_string(&doc).unwrap_or_default();
        if text.len() > STATUS_MAX as usize {
            text = serde_json::json!({"robot": plan.robot, "truncated": text.len()}).to_string();
        }
        if let Err(e) = status_pub.publish(text.as_bytes()) {
            sh.said.once(format!("{STATUS_CHANNEL}: {e}"));
        }
        let _ = (&tokens, &subscribers, &ins);
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rtdeploy-bridge: {e}");
            ExitCode::FAILURE
        }
    }
}
